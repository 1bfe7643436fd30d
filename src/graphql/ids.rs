//! Global opaque ids: `base64url("Article:42")`. Clients treat them as opaque; the type prefix lets
//! `node(id:)` resolve any of them and stops an id of one type being used for another.
//!
//! Ids are written without padding and read with or without it: a client that builds one by hand
//! with the browser's `btoa("Article:42")` gets padded base64, and means the same id.

use async_graphql::ID;
use base64::Engine as _;
use base64::alphabet;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};

/// Reads URL-safe base64 with or without its padding.
const ANY_PADDING: GeneralPurpose = GeneralPurpose::new(
    &alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

use crate::error::{AppError, AppResult};
pub use crate::services::NodeType;

pub fn encode(node_type: NodeType, id: i64) -> ID {
    ID(URL_SAFE_NO_PAD.encode(format!("{}:{id}", node_type.name())))
}

/// Any global id: its type and row id. Malformed ids are the caller's mistake: `BAD_USER_INPUT`.
pub fn decode_any(id: &ID, field: &'static str) -> AppResult<(NodeType, i64)> {
    let malformed = || AppError::bad_input(field, "malformed id");
    if id.len() > 64 {
        return Err(malformed());
    }
    let bytes = ANY_PADDING.decode(id.as_bytes()).map_err(|_| malformed())?;
    let text = std::str::from_utf8(&bytes).map_err(|_| malformed())?;
    let (name, raw) = text.split_once(':').ok_or_else(malformed)?;
    let node_type = NodeType::from_name(name).ok_or_else(malformed)?;
    let row_id = raw
        .parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(malformed)?;
    Ok((node_type, row_id))
}

/// A global id that must be of `expected` type.
pub fn decode(id: &ID, expected: NodeType, field: &'static str) -> AppResult<i64> {
    match decode_any(id, field)? {
        (node_type, row_id) if node_type == expected => Ok(row_id),
        _ => Err(AppError::bad_input(
            field,
            format!("not {} id", with_article(expected.name())),
        )),
    }
}

/// "an Article", "a User": the indefinite article a type name takes, by its sound (type names
/// starting with U say "you").
fn with_article(name: &str) -> String {
    let article = match name.chars().next() {
        Some('A' | 'E' | 'I' | 'O') => "an",
        _ => "a",
    };
    format!("{article} {name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        let id = encode(NodeType::Article, 42);
        assert_eq!(decode(&id, NodeType::Article, "id").unwrap(), 42);
        assert_eq!(decode_any(&id, "id").unwrap(), (NodeType::Article, 42));
    }

    #[test]
    fn an_id_of_another_type_is_refused() {
        let id = encode(NodeType::User, 7);
        let err = decode(&id, NodeType::Article, "articleId").unwrap_err();
        assert_eq!(err.code(), "BAD_USER_INPUT");
        assert_eq!(err.to_string(), "not an Article id");
        let article = encode(NodeType::Article, 7);
        let err = decode(&article, NodeType::User, "userId").unwrap_err();
        assert_eq!(err.to_string(), "not a User id");
    }

    #[test]
    fn padded_and_unpadded_base64_name_the_same_id() {
        // btoa("Article:10"). Type names and digits encode alike in both alphabets (no `+` or
        // `/`), so padding is the only difference a hand-built id has.
        let padded = ID("QXJ0aWNsZToxMA==".into());
        assert_eq!(decode(&padded, NodeType::Article, "id").unwrap(), 10);
        for row in [1, 10, 255, 4_000_000_000] {
            let standard =
                base64::engine::general_purpose::STANDARD.encode(format!("Article:{row}"));
            let id = ID(standard.clone());
            assert_eq!(
                decode(&id, NodeType::Article, "id").unwrap(),
                row,
                "{standard}"
            );
            assert_eq!(
                decode(&encode(NodeType::Article, row), NodeType::Article, "id").unwrap(),
                row
            );
        }
    }

    #[test]
    fn garbage_is_bad_input() {
        for raw in ["", "!!!", "QXJ0aWNsZTo", "QXJ0aWNsZTotMQ", "Zm9vOjE"] {
            assert!(
                decode_any(&ID(raw.into()), "id").is_err(),
                "{raw} was accepted"
            );
        }
    }
}
