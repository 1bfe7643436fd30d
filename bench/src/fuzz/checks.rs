//! What every answer must look like: JSON in GraphQL's response shape, and every error coded.

use serde_json::Value;

/// Longest excerpt of a request or response printed with a failure.
pub const EXCERPT: usize = 600;

/// A response listing more errors than this grows with the document (one error per duplicate
/// directive, say) instead of being capped.
pub const MAX_ERRORS: usize = 100;

/// The error codes of a GraphQL response (`data` alone: none), or what is wrong with it.
pub fn graphql_response(value: &Value) -> Result<Vec<String>, String> {
    let Some(object) = value.as_object() else {
        return Err(format!("not a JSON object: {}", excerpt_json(value)));
    };
    let Some(errors) = object.get("errors") else {
        return if object.contains_key("data") {
            Ok(Vec::new())
        } else {
            Err(format!("neither data nor errors: {}", excerpt_json(value)))
        };
    };
    let Some(errors) = errors.as_array() else {
        return Err(format!("errors is not a list: {}", excerpt_json(value)));
    };
    if errors.len() > MAX_ERRORS {
        return Err(format!(
            "{} errors in one response, more than {MAX_ERRORS}; first: {}",
            errors.len(),
            excerpt_json(&errors[0])
        ));
    }
    errors.iter().map(error_code).collect()
}

/// The `extensions.code` of one error object.
pub fn error_code(error: &Value) -> Result<String, String> {
    error
        .pointer("/extensions/code")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| format!("an error without extensions.code: {}", excerpt_json(error)))
}

/// A label for the summary: the first error code, or `data`.
pub fn label(codes: &[String]) -> &str {
    codes.first().map_or("data", String::as_str)
}

pub fn excerpt_json(value: &Value) -> String {
    excerpt(&value.to_string())
}

/// At most [`EXCERPT`] characters of `text`, saying how much was left out.
pub fn excerpt(text: &str) -> String {
    let total = text.chars().count();
    if total <= EXCERPT {
        return text.to_owned();
    }
    let head: String = text.chars().take(EXCERPT).collect();
    format!("{head}… ({} more characters)", total - EXCERPT)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_uncoded_error_or_an_error_flood_is_a_failure() {
        let uncoded = json!({ "data": null, "errors": [{ "message": "boom" }] });
        assert!(graphql_response(&uncoded).is_err());
        let coded =
            json!({ "errors": [{ "message": "no", "extensions": { "code": "BAD_USER_INPUT" } }] });
        assert_eq!(graphql_response(&coded).unwrap(), vec!["BAD_USER_INPUT"]);
        assert!(
            graphql_response(&json!({ "data": { "viewer": null } }))
                .unwrap()
                .is_empty()
        );
        assert!(graphql_response(&json!({ "unexpected": 1 })).is_err());
        assert!(graphql_response(&json!({ "errors": "no" })).is_err());
        let error = json!({ "message": "dup", "extensions": { "code": "BAD_USER_INPUT" } });
        let flood = json!({ "errors": vec![error; MAX_ERRORS + 1] });
        assert!(graphql_response(&flood).is_err());
    }
}
