//! What every answer must look like: JSON in GraphQL's response shape, every error coded, and no
//! more errors than a client can use.

use serde_json::Value;

/// Longest excerpt of a request or response printed with a failure.
pub const EXCERPT: usize = 600;

/// A response listing more errors than this grows with the document (one error per unknown field,
/// say) instead of being capped.
pub const MAX_ERRORS: usize = 100;

/// What is wrong with an answer: the failure kind and a description.
#[derive(Debug)]
pub struct Problem {
    pub kind: &'static str,
    pub detail: String,
}

impl Problem {
    fn new(kind: &'static str, detail: String) -> Self {
        Self { kind, detail }
    }
}

/// The error codes of a GraphQL response (`data` alone: none), or what is wrong with it.
pub fn graphql_response(value: &Value) -> Result<Vec<String>, Problem> {
    let shape = |detail: String| Problem::new("not a GraphQL response", detail);
    let Some(object) = value.as_object() else {
        return Err(shape(format!("not a JSON object: {}", excerpt_json(value))));
    };
    let Some(errors) = object.get("errors") else {
        return if object.contains_key("data") {
            Ok(Vec::new())
        } else {
            Err(shape(format!(
                "neither data nor errors: {}",
                excerpt_json(value)
            )))
        };
    };
    let Some(errors) = errors.as_array() else {
        return Err(shape(format!(
            "errors is not a list: {}",
            excerpt_json(value)
        )));
    };
    if errors.len() > MAX_ERRORS {
        return Err(Problem::new(
            "error flood",
            format!(
                "{} errors in one response, more than {MAX_ERRORS}; first: {}",
                errors.len(),
                excerpt_json(&errors[0])
            ),
        ));
    }
    errors.iter().map(error_code).collect()
}

/// The `extensions.code` of one error object.
pub fn error_code(error: &Value) -> Result<String, Problem> {
    error
        .pointer("/extensions/code")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| {
            Problem::new(
                "uncoded error",
                format!("an error without extensions.code: {}", excerpt_json(error)),
            )
        })
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

    fn kind(value: Value) -> &'static str {
        graphql_response(&value).expect_err("a problem").kind
    }

    #[test]
    fn coded_errors_and_plain_data_pass() {
        let coded =
            json!({ "errors": [{ "message": "no", "extensions": { "code": "BAD_USER_INPUT" } }] });
        assert_eq!(graphql_response(&coded).unwrap(), vec!["BAD_USER_INPUT"]);
        let data = json!({ "data": { "viewer": null } });
        assert!(graphql_response(&data).unwrap().is_empty());
    }

    #[test]
    fn an_uncoded_error_a_flood_of_errors_or_another_shape_is_a_failure() {
        let uncoded = json!({ "data": null, "errors": [{ "message": "boom" }] });
        assert_eq!(kind(uncoded), "uncoded error");
        let error = json!({ "message": "dup", "extensions": { "code": "BAD_USER_INPUT" } });
        assert_eq!(
            kind(json!({ "errors": vec![error; MAX_ERRORS + 1] })),
            "error flood"
        );
        assert_eq!(kind(json!({ "unexpected": 1 })), "not a GraphQL response");
        assert_eq!(kind(json!({ "errors": "no" })), "not a GraphQL response");
    }
}
