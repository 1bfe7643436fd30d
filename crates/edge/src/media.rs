//! The media types of GraphQL over HTTP: which one a client accepts, and the status codes each
//! one's answers carry.
//!
//! `application/graphql-response+json` is the spec's own type: a request that never executed (it
//! did not parse or validate, its variables did not coerce) is a 4xx without a `data` entry, so
//! proxies and clients can tell it from an answer. `application/json` is what clients sent before
//! the spec: every GraphQL answer is a 200 there.
//!
//! A request error's status comes from its first error's `extensions.code`: `METHOD_NOT_ALLOWED`
//! is a 405 (with `Allow: POST`) in either type; in the spec's type, a code the server names as its
//! own failure gets the status the server gives it (a 503 for a backend that is down, say), and any
//! other code is a 400.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;

/// How a request arrived over HTTP; requests without one (in the request's data) came over a
/// websocket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HttpMethod {
    Get,
    Post,
}

/// In the data of a request carried by a long-lived HTTP response (Server-Sent Events or a
/// multipart response), which can carry a subscription.
#[derive(Clone, Copy, Debug)]
pub struct Streamed;

/// The code of a request the transport cannot carry (a mutation over GET): a 405.
pub const METHOD_NOT_ALLOWED: &str = "METHOD_NOT_ALLOWED";

/// The spec's own media type.
pub const GRAPHQL_RESPONSE_JSON: &str = "application/graphql-response+json";
/// The media type clients used before the spec.
pub const JSON: &str = "application/json";
/// Server-Sent Events.
pub const EVENT_STREAM: &str = "text/event-stream";

/// A media type a GraphQL answer goes out in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MediaType {
    GraphqlResponseJson,
    Json,
}

impl MediaType {
    fn content_type(self) -> HeaderValue {
        match self {
            Self::GraphqlResponseJson => {
                HeaderValue::from_static("application/graphql-response+json; charset=utf-8")
            }
            Self::Json => HeaderValue::from_static(JSON),
        }
    }
}

/// What the client's `Accept` header lets this endpoint answer with.
#[derive(Debug, PartialEq, Eq)]
pub enum Accepted {
    Graphql(MediaType),
    /// A browser that wants a page: GraphiQL.
    Html,
    /// Server-Sent Events (`text/event-stream`).
    EventStream,
    /// Apollo's multipart subscriptions (`multipart/mixed;subscriptionSpec="1.0"`).
    Multipart,
    /// Nothing this endpoint produces.
    Nothing,
}

/// The client's preferred type by quality. On a tie between a stream and a JSON type, the one the
/// client lists first: general clients (urql, GraphiQL) list the streams after JSON as a fallback
/// they can also read, and expect JSON for a query, while a client that opens subscriptions over
/// HTTP lists its stream first (Apollo) or alone (graphql-sse). Other ties go to a stream (SSE,
/// then multipart), the spec's type, then JSON, then HTML (only where `html` says the endpoint has
/// a page to show). No `Accept` header, `*/*` or `application/*` mean
/// `application/json`, as the spec asks while clients move over. `multipart/mixed` counts only
/// with `subscriptionSpec=1.0`: with `deferSpec` alone it asks for incremental delivery, which
/// this endpoint does not do.
pub fn negotiate(headers: &HeaderMap, html: bool) -> Accepted {
    let Some(accept) = headers
        .get(header::ACCEPT)
        .and_then(|value| value.to_str().ok())
    else {
        return Accepted::Graphql(MediaType::Json);
    };
    let mut best: Option<(f32, u8, Accepted)> = None;
    let is_stream =
        |accepted: &Accepted| matches!(accepted, Accepted::EventStream | Accepted::Multipart);
    for range in accept.split(',') {
        let mut parts = range.split(';');
        let essence = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
        let parameters: Vec<(&str, &str)> = parts
            .filter_map(|parameter| parameter.split_once('='))
            .map(|(name, value)| (name.trim(), value.trim().trim_matches('"')))
            .collect();
        let parameter = |wanted: &str| {
            parameters
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case(wanted))
                .map(|(_, value)| *value)
        };
        let quality = parameter("q").map_or(Some(1.0), |value| value.parse::<f32>().ok());
        let Some(quality) = quality.filter(|quality| *quality > 0.0) else {
            continue;
        };
        let (rank, accepted) = match essence.as_str() {
            EVENT_STREAM => (5, Accepted::EventStream),
            "multipart/mixed" if parameter("subscriptionSpec") == Some("1.0") => {
                (4, Accepted::Multipart)
            }
            GRAPHQL_RESPONSE_JSON => (3, Accepted::Graphql(MediaType::GraphqlResponseJson)),
            JSON => (2, Accepted::Graphql(MediaType::Json)),
            "application/*" | "*/*" => (1, Accepted::Graphql(MediaType::Json)),
            "text/html" if html => (0, Accepted::Html),
            _ => continue,
        };
        let better = best.as_ref().is_none_or(|(q, r, earlier)| {
            if quality != *q {
                quality > *q
            } else if is_stream(&accepted) != is_stream(earlier) {
                false
            } else {
                rank > *r
            }
        });
        if better {
            best = Some((quality, rank, accepted));
        }
    }
    best.map_or(Accepted::Nothing, |(_, _, accepted)| accepted)
}

/// A response of `status` with a JSON `body` labelled as `media`.
pub fn json_response(status: StatusCode, media: MediaType, body: String) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, media.content_type());
    response
}

/// Whether the response is to a request that never executed: no data, and no error at a field.
fn is_request_error(response: &async_graphql::Response) -> bool {
    response.data == async_graphql::Value::Null
        && !response.errors.is_empty()
        && response.errors.iter().all(|error| error.path.is_empty())
}

fn first_code(response: &async_graphql::Response) -> Option<&str> {
    let extensions = response.errors.first()?.extensions.as_ref()?;
    match extensions.get("code")? {
        async_graphql::Value::String(code) => Some(code),
        _ => None,
    }
}

/// The HTTP answer to an executed (or refused) GraphQL request. `server_failure` gives the status
/// of the codes that are the server's failure, not the client's mistake (`None` for the others).
pub fn answer(
    response: async_graphql::Response,
    media: MediaType,
    method: HttpMethod,
    server_failure: impl Fn(&str) -> Option<StatusCode>,
) -> Response {
    let request_error = is_request_error(&response);
    let code = if request_error {
        first_code(&response)
    } else {
        None
    };
    let status = match (code, media) {
        (Some(METHOD_NOT_ALLOWED), _) => StatusCode::METHOD_NOT_ALLOWED,
        (Some(code), MediaType::GraphqlResponseJson) => {
            server_failure(code).unwrap_or(StatusCode::BAD_REQUEST)
        }
        _ => StatusCode::OK,
    };
    let cache_control = (method == HttpMethod::Get && response.errors.is_empty())
        .then(|| response.cache_control.value())
        .flatten();
    let body = if request_error && media == MediaType::GraphqlResponseJson {
        let mut body = serde_json::Map::new();
        body.insert("errors".into(), serde_json::json!(response.errors));
        if !response.extensions.is_empty() {
            body.insert("extensions".into(), serde_json::json!(response.extensions));
        }
        serde_json::Value::Object(body).to_string()
    } else {
        serde_json::to_string(&response).expect("a GraphQL response serializes")
    };
    let mut answer = json_response(status, media, body);
    if status == StatusCode::METHOD_NOT_ALLOWED {
        answer
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
    }
    if let Some(value) = cache_control.and_then(|value| HeaderValue::from_str(&value).ok()) {
        answer.headers_mut().insert(header::CACHE_CONTROL, value);
    }
    answer
}

#[cfg(test)]
mod tests {
    use async_graphql::{ErrorExtensionValues, Pos, ServerError};

    use super::*;

    fn request_error(code: &str) -> async_graphql::Response {
        let mut error = ServerError::new("refused", Some(Pos { line: 1, column: 1 }));
        let mut extensions = ErrorExtensionValues::default();
        extensions.set("code", code);
        error.extensions = Some(extensions);
        async_graphql::Response::from_errors(vec![error])
    }

    fn server_failure(code: &str) -> Option<StatusCode> {
        (code == "DOWN").then_some(StatusCode::SERVICE_UNAVAILABLE)
    }

    async fn answered(
        response: async_graphql::Response,
        media: MediaType,
        method: HttpMethod,
    ) -> (StatusCode, HeaderMap, serde_json::Value) {
        let answer = answer(response, media, method, server_failure);
        let (parts, body) = answer.into_parts();
        let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        let body = serde_json::from_slice(&body).unwrap();
        (parts.status, parts.headers, body)
    }

    #[tokio::test]
    async fn a_request_error_is_a_4xx_without_data_in_the_specs_type_and_a_200_in_json() {
        use MediaType::*;
        let (status, headers, body) = answered(
            request_error("BAD_USER_INPUT"),
            GraphqlResponseJson,
            HttpMethod::Post,
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(
            headers[header::CONTENT_TYPE],
            "application/graphql-response+json; charset=utf-8"
        );
        assert!(body.get("data").is_none(), "{body}");
        assert_eq!(body["errors"][0]["extensions"]["code"], "BAD_USER_INPUT");

        let (status, headers, body) =
            answered(request_error("BAD_USER_INPUT"), Json, HttpMethod::Post).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers[header::CONTENT_TYPE], JSON);
        assert_eq!(body["data"], serde_json::Value::Null);
    }

    #[tokio::test]
    async fn the_servers_own_failures_get_its_status_and_a_mutation_over_get_a_405_in_either_type()
    {
        use MediaType::*;
        let (status, ..) =
            answered(request_error("DOWN"), GraphqlResponseJson, HttpMethod::Post).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        let (status, ..) = answered(request_error("DOWN"), Json, HttpMethod::Post).await;
        assert_eq!(status, StatusCode::OK);
        for media in [GraphqlResponseJson, Json] {
            let (status, headers, _) =
                answered(request_error(METHOD_NOT_ALLOWED), media, HttpMethod::Get).await;
            assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
            assert_eq!(headers[header::ALLOW], "POST");
        }
    }

    #[tokio::test]
    async fn an_error_at_a_field_is_an_answer_not_a_request_error() {
        let mut response = request_error("DOWN");
        response.errors[0].path = vec![async_graphql::PathSegment::Field("article".into())];
        let (status, _, body) =
            answered(response, MediaType::GraphqlResponseJson, HttpMethod::Post).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["data"], serde_json::Value::Null);
    }

    #[tokio::test]
    async fn only_a_successful_get_carries_the_responses_cache_control() {
        let cached = || {
            let mut response = async_graphql::Response::new(async_graphql::Value::Null);
            response.cache_control = async_graphql::CacheControl {
                public: true,
                max_age: 60,
            };
            response
        };
        let (_, headers, _) = answered(cached(), MediaType::Json, HttpMethod::Get).await;
        assert_eq!(headers[header::CACHE_CONTROL], "max-age=60");
        let (_, headers, _) = answered(cached(), MediaType::Json, HttpMethod::Post).await;
        assert!(headers.get(header::CACHE_CONTROL).is_none());
    }

    fn accepting(accept: Option<&str>, html: bool) -> Accepted {
        let mut headers = HeaderMap::new();
        if let Some(accept) = accept {
            headers.insert(header::ACCEPT, HeaderValue::from_str(accept).unwrap());
        }
        negotiate(&headers, html)
    }

    #[test]
    fn the_preferred_type_wins_by_quality_then_by_the_specs_order() {
        use Accepted::*;
        use MediaType::*;
        assert_eq!(accepting(None, true), Graphql(Json));
        assert_eq!(accepting(Some("*/*"), true), Graphql(Json));
        assert_eq!(
            accepting(
                Some("application/json, application/graphql-response+json"),
                false
            ),
            Graphql(GraphqlResponseJson)
        );
        assert_eq!(
            accepting(
                Some("application/graphql-response+json;q=0.5, application/json"),
                false
            ),
            Graphql(Json)
        );
        let browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";
        assert_eq!(accepting(Some(browser), true), Html);
        assert_eq!(accepting(Some(browser), false), Graphql(Json));
        assert_eq!(accepting(Some("text/html"), false), Nothing);
        assert_eq!(accepting(Some("application/json;q=0"), false), Nothing);
        assert_eq!(accepting(Some("application/xml"), false), Nothing);
    }

    #[test]
    fn a_stream_is_answered_only_to_a_client_that_names_one() {
        use Accepted::*;
        assert_eq!(accepting(Some("text/event-stream"), false), EventStream);
        let apollo = r#"multipart/mixed;boundary="graphql";subscriptionSpec=1.0,application/json"#;
        assert_eq!(accepting(Some(apollo), false), Multipart);
        let quoted = r#"multipart/mixed; subscriptionSpec="1.0", application/json"#;
        assert_eq!(accepting(Some(quoted), false), Multipart);
        let deferred = "multipart/mixed;deferSpec=20220824,application/json";
        assert_eq!(accepting(Some(deferred), false), Graphql(MediaType::Json));
        assert_eq!(
            accepting(Some("text/event-stream;q=0.5, application/json"), false),
            Graphql(MediaType::Json)
        );
        assert_eq!(accepting(Some("*/*"), false), Graphql(MediaType::Json));
    }

    #[test]
    fn a_client_listing_json_before_the_streams_gets_json() {
        use Accepted::*;
        // urql's default: streams as a fallback it can read, after JSON.
        let urql = "application/graphql-response+json, application/graphql+json, application/json, text/event-stream, multipart/mixed;subscriptionSpec=1.0";
        assert_eq!(
            accepting(Some(urql), false),
            Graphql(MediaType::GraphqlResponseJson)
        );
        let apollo_subscription = r#"multipart/mixed;boundary="graphql";subscriptionSpec=1.0,application/graphql-response+json,application/json;q=0.9"#;
        assert_eq!(accepting(Some(apollo_subscription), false), Multipart);
        assert_eq!(
            accepting(Some("text/event-stream, application/json"), false),
            EventStream
        );
        assert_eq!(
            accepting(Some("application/json;q=0.5, text/event-stream"), false),
            EventStream
        );
    }
}
