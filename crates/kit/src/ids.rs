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

use pulse_runtime::error::{AppError, AppResult};

/// A type a global id can name: the GraphQL type's name, which the id carries. Each domain declares
/// its own (`pub const POLL: NodeType = NodeType::named("Poll");`); the app lists them all for
/// `node(id:)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeType(&'static str);

impl NodeType {
    pub const fn named(name: &'static str) -> Self {
        Self(name)
    }

    pub fn name(self) -> &'static str {
        self.0
    }
}

pub fn encode(node_type: NodeType, id: i64) -> ID {
    ID(URL_SAFE_NO_PAD.encode(format!("{}:{id}", node_type.name())))
}

/// A global id's type, when it is one of `types`, and its row id; `None` for a well-formed id of
/// another type. Malformed ids are the caller's mistake: `BAD_USER_INPUT`.
pub fn decode_among(
    id: &ID,
    types: &[NodeType],
    field: &'static str,
) -> AppResult<Option<(NodeType, i64)>> {
    let malformed = || AppError::bad_input(field, "malformed id");
    if id.len() > 64 {
        return Err(malformed());
    }
    let bytes = ANY_PADDING.decode(id.as_bytes()).map_err(|_| malformed())?;
    let text = std::str::from_utf8(&bytes).map_err(|_| malformed())?;
    let (name, raw) = text.split_once(':').ok_or_else(malformed)?;
    let row_id = raw
        .parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(malformed)?;
    Ok(types
        .iter()
        .find(|node_type| node_type.name() == name)
        .map(|node_type| (*node_type, row_id)))
}

/// A global id that must be of `expected` type.
pub fn decode(id: &ID, expected: NodeType, field: &'static str) -> AppResult<i64> {
    match decode_among(id, &[expected], field)? {
        Some((_, row_id)) => Ok(row_id),
        None => Err(AppError::bad_input(
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

    const ARTICLE: NodeType = NodeType::named("Article");
    const USER: NodeType = NodeType::named("User");

    #[test]
    fn ids_round_trip() {
        let id = encode(ARTICLE, 42);
        assert_eq!(decode(&id, ARTICLE, "id").unwrap(), 42);
        assert_eq!(
            decode_among(&id, &[USER, ARTICLE], "id").unwrap(),
            Some((ARTICLE, 42))
        );
    }

    #[test]
    fn an_id_of_another_type_is_refused() {
        let id = encode(USER, 7);
        let err = decode(&id, ARTICLE, "articleId").unwrap_err();
        assert_eq!(err.code(), "BAD_USER_INPUT");
        assert_eq!(err.to_string(), "not an Article id");
        let article = encode(ARTICLE, 7);
        let err = decode(&article, USER, "userId").unwrap_err();
        assert_eq!(err.to_string(), "not a User id");
    }

    #[test]
    fn padded_and_unpadded_base64_name_the_same_id() {
        // btoa("Article:10"). Type names and digits encode alike in both alphabets (no `+` or
        // `/`), so padding is the only difference a hand-built id has.
        let padded = ID("QXJ0aWNsZToxMA==".into());
        assert_eq!(decode(&padded, ARTICLE, "id").unwrap(), 10);
        for row in [1, 10, 255, 4_000_000_000] {
            let standard =
                base64::engine::general_purpose::STANDARD.encode(format!("Article:{row}"));
            let id = ID(standard.clone());
            assert_eq!(decode(&id, ARTICLE, "id").unwrap(), row, "{standard}");
            assert_eq!(decode(&encode(ARTICLE, row), ARTICLE, "id").unwrap(), row);
        }
    }

    #[test]
    fn garbage_is_bad_input() {
        for raw in ["", "!!!", "QXJ0aWNsZTo", "QXJ0aWNsZTotMQ"] {
            assert!(
                decode_among(&ID(raw.into()), &[ARTICLE], "id").is_err(),
                "{raw} was accepted"
            );
        }
    }

    #[test]
    fn a_well_formed_id_of_a_type_not_asked_for_is_none_among_them_and_refused_alone() {
        // "foo:1"
        let foreign = ID("Zm9vOjE".into());
        assert_eq!(
            decode_among(&foreign, &[USER, ARTICLE], "id").unwrap(),
            None
        );
        let err = decode(&foreign, ARTICLE, "id").unwrap_err();
        assert_eq!(err.to_string(), "not an Article id");
    }
}
