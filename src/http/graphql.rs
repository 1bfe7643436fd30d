use std::net::SocketAddr;
use std::sync::Arc;

use async_graphql::{Data, ErrorExtensions};
use axum::body::Bytes;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{ConnectInfo, Extension, FromRequest, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use pulse_edge::media::{self, Accepted, HttpMethod, MediaType};
use pulse_edge::pipeline::shorten_message;
use serde::Deserialize;
use serde_json::json;

use super::assets;
use super::server::ConnectionSlot;
use super::websocket;
use crate::actor::Actor;
use crate::app::AppState;
use crate::error::AppError;
use crate::graphql::schema::attach_request_data;

/// A transport-level failure, in the shape GraphQL clients already parse.
fn transport_error(status: StatusCode, media: MediaType, error: AppError) -> Response {
    let error = error.extend();
    let body = json!({ "errors": [{ "message": error.message, "extensions": error.extensions }] });
    media::json_response(status, media, body.to_string())
}

/// The bearer token of an `Authorization` header, if any. A header that is present but malformed is
/// an authentication failure, not anonymity.
fn bearer(headers: &HeaderMap) -> Result<Option<&str>, AppError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    let value = value
        .to_str()
        .map_err(|_| AppError::Unauthenticated("invalid token"))?;
    bearer_token(value).map(Some)
}

/// The token of an `Authorization` value of the form `Bearer <token>`.
fn bearer_token(value: &str) -> Result<&str, AppError> {
    match value.split_once(' ') {
        Some((scheme, token))
            if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() =>
        {
            Ok(token.trim())
        }
        _ => Err(AppError::Unauthenticated(
            "expected `Authorization: Bearer <token>`",
        )),
    }
}

/// A body that is not a request this endpoint serves. The JSON parser's message can quote the body.
fn malformed(status: StatusCode, media: MediaType, mut message: String) -> Response {
    shorten_message(&mut message);
    transport_error(
        status,
        media,
        AppError::BadUserInput {
            message,
            field: None,
        },
    )
}

fn actor(
    state: &AppState,
    peer: SocketAddr,
    headers: &HeaderMap,
    token: Option<&str>,
) -> Result<Actor, AppError> {
    let user = token.map(|token| state.tokens.verify(token)).transpose()?;
    let user_agent = state
        .proxies
        .user_agent(peer, headers)
        .map(|agent| agent.chars().take(512).collect());
    Ok(Actor {
        user,
        client_ip: state.proxies.client_ip(peer, headers),
        user_agent,
    })
}

/// The body of a POST, read within the body timeout and the size limit.
async fn read_body(
    state: &AppState,
    request: Request,
    media: MediaType,
) -> Result<Bytes, Response> {
    let declared_length = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
    // The clock runs from the end of the headers, so a client trickling its body in holds the
    // connection for at most this long.
    let body = tokio::time::timeout(state.body_timeout, Bytes::from_request(request, &())).await;
    match body {
        Err(_) => {
            let mut response = transport_error(
                StatusCode::REQUEST_TIMEOUT,
                media,
                AppError::BodyTimeout(state.body_timeout),
            );
            // The rest of the body may still be on its way; the connection cannot serve another request.
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            Err(response)
        }
        Ok(Ok(body)) => Ok(body),
        Ok(Err(rejection)) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            let limit = state.max_body_bytes;
            let message = match declared_length {
                Some(length) => {
                    format!("request body of {length} bytes exceeds the limit of {limit} bytes")
                }
                None => format!("request body exceeds the limit of {limit} bytes"),
            };
            Err(malformed(StatusCode::PAYLOAD_TOO_LARGE, media, message))
        }
        Ok(Err(rejection)) => {
            let message = format!("cannot read the request body: {rejection}");
            Err(malformed(rejection.status(), media, message))
        }
    }
}

/// A POST must say its body is JSON: GraphQL over HTTP requires `application/json`, and refusing the
/// rest keeps browsers from sending queries as "simple" cross-site requests without a preflight.
fn check_content_type(headers: &HeaderMap) -> Result<(), String> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok());
    let Some(content_type) = content_type else {
        return Err("a POST needs `Content-Type: application/json`".to_owned());
    };
    let mut parts = content_type.split(';');
    let essence = parts.next().unwrap_or_default().trim();
    let charset_ok = parts.all(|parameter| match parameter.split_once('=') {
        Some((name, value)) if name.trim().eq_ignore_ascii_case("charset") => {
            value.trim().trim_matches('"').eq_ignore_ascii_case("utf-8")
        }
        _ => true,
    });
    if essence.eq_ignore_ascii_case("application/json") && charset_ok {
        return Ok(());
    }
    Err(format!(
        "unsupported Content-Type `{content_type}`; send `application/json` (UTF-8)"
    ))
}

pub async fn post(
    State(state): State<Arc<AppState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    request: Request,
) -> Response {
    let media = match media::negotiate(&headers, false) {
        Accepted::Graphql(media) => media,
        Accepted::Html | Accepted::Nothing => return not_acceptable(),
    };
    if let Err(message) = check_content_type(&headers) {
        return malformed(StatusCode::UNSUPPORTED_MEDIA_TYPE, media, message);
    }
    let body = match read_body(&state, request, media).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let request = match serde_json::from_slice::<async_graphql::Request>(&body) {
        Ok(request)
            if request.query.trim().is_empty()
                && !request.extensions.contains_key("persistedQuery") =>
        {
            return malformed(
                StatusCode::BAD_REQUEST,
                media,
                "the request has no `query`".to_owned(),
            );
        }
        Ok(request) => request,
        Err(_) if body.first() == Some(&b'[') => {
            let message = "batched requests are not supported; send one operation per request";
            return malformed(StatusCode::BAD_REQUEST, media, message.to_owned());
        }
        Err(err) => {
            let message = format!("the body is not a GraphQL request in JSON: {err}");
            return malformed(StatusCode::BAD_REQUEST, media, message);
        }
    };
    respond(&state, peer, &headers, request, HttpMethod::Post, media).await
}

/// The parameters of a GraphQL request sent with GET, as the GraphQL over HTTP spec names them.
#[derive(Deserialize)]
struct GetParameters {
    query: Option<String>,
    #[serde(rename = "operationName")]
    operation_name: Option<String>,
    variables: Option<String>,
    extensions: Option<String>,
}

/// A query over GET: what CDNs and browser caches can keep. A browser asking for HTML with no
/// query gets GraphiQL.
pub async fn get(
    State(state): State<Arc<AppState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    let accepted = media::negotiate(&headers, true);
    let query = Query::<GetParameters>::try_from_uri(&uri);
    let asks_nothing =
        matches!(&query, Ok(Query(p)) if p.query.is_none() && p.extensions.is_none());
    let media = match accepted {
        Accepted::Html if asks_nothing => return assets::graphiql(&headers),
        // A GET URL with a query opened in a browser: the answer is what it asked for.
        Accepted::Html => MediaType::Json,
        Accepted::Graphql(media) => media,
        Accepted::Nothing => return not_acceptable(),
    };
    let parameters = match query {
        Ok(Query(parameters)) => parameters,
        Err(rejection) => {
            let message = format!("the URL's parameters are not a GraphQL request: {rejection}");
            return malformed(StatusCode::BAD_REQUEST, media, message);
        }
    };
    if asks_nothing {
        let message =
            "the request has no `query` parameter (open /graphql in a browser for GraphiQL)";
        return malformed(StatusCode::BAD_REQUEST, media, message.to_owned());
    }
    let mut request = async_graphql::Request::new(parameters.query.unwrap_or_default());
    if let Some(name) = parameters.operation_name.filter(|name| !name.is_empty()) {
        request = request.operation_name(name);
    }
    if let Some(variables) = parameters.variables.filter(|v| !v.is_empty()) {
        match json_object(&variables) {
            Some(variables) => {
                request = request.variables(async_graphql::Variables::from_json(variables));
            }
            None => {
                let message = "`variables` must be a JSON object".to_owned();
                return malformed(StatusCode::BAD_REQUEST, media, message);
            }
        }
    }
    if let Some(extensions) = parameters.extensions.filter(|e| !e.is_empty()) {
        let extensions = json_object(&extensions).and_then(|extensions| match extensions {
            serde_json::Value::Object(map) => Some(map),
            _ => None,
        });
        let Some(extensions) = extensions else {
            let message = "`extensions` must be a JSON object".to_owned();
            return malformed(StatusCode::BAD_REQUEST, media, message);
        };
        for (name, value) in extensions {
            if let Ok(value) = async_graphql::Value::from_json(value) {
                request.extensions.insert(name, value);
            }
        }
    }
    respond(&state, peer, &headers, request, HttpMethod::Get, media).await
}

/// A URL parameter holding a JSON object (or null).
fn json_object(text: &str) -> Option<serde_json::Value> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(value @ (serde_json::Value::Object(_) | serde_json::Value::Null)) => Some(value),
        _ => None,
    }
}

fn not_acceptable() -> Response {
    let message = format!(
        "the Accept header allows no type this endpoint answers in; accept `{}` or `{}`",
        media::GRAPHQL_RESPONSE_JSON,
        media::JSON
    );
    malformed(StatusCode::NOT_ACCEPTABLE, MediaType::Json, message)
}

/// The status of a request refused by a failure of ours, in the spec's media type: the codes
/// `AppError` gives what is not the client's to fix.
fn server_failure(code: &str) -> Option<StatusCode> {
    match code {
        "UNAVAILABLE" => Some(StatusCode::SERVICE_UNAVAILABLE),
        "INTERNAL" => Some(StatusCode::INTERNAL_SERVER_ERROR),
        _ => None,
    }
}

async fn respond(
    state: &AppState,
    peer: SocketAddr,
    headers: &HeaderMap,
    mut request: async_graphql::Request,
    method: HttpMethod,
    media: MediaType,
) -> Response {
    let caller = match bearer(headers).and_then(|token| actor(state, peer, headers, token)) {
        Ok(caller) => caller,
        Err(err) => return transport_error(StatusCode::UNAUTHORIZED, media, err),
    };
    let signed_in = caller.user.is_some();
    attach_request_data(&state.services, &mut request.data, caller);
    request.data.insert(method);
    let response = state.schema.execute(request).await;
    let mut answer = media::answer(response, media, method, server_failure);
    if method == HttpMethod::Get {
        let headers = answer.headers_mut();
        // Answers differ by who asks and in what type; a cache must not hand one to the other.
        headers.insert(
            header::VARY,
            HeaderValue::from_static("Accept, Authorization"),
        );
        if signed_in {
            headers.insert(
                header::CACHE_CONTROL,
                HeaderValue::from_static("private, no-store"),
            );
        }
    }
    answer
}

/// The token a websocket client sends in its `connection_init` payload: `{"token": "…"}`, or the
/// header style `{"Authorization": "Bearer …"}` that some clients use.
fn init_payload_token(payload: &serde_json::Value) -> Result<Option<String>, AppError> {
    if let Some(token) = payload.get("token").or_else(|| payload.get("authToken")) {
        return token
            .as_str()
            .map(|token| Some(token.to_owned()))
            .ok_or(AppError::Unauthenticated("invalid token"));
    }
    let header = payload
        .get("Authorization")
        .or_else(|| payload.get("authorization"));
    let Some(header) = header else {
        return Ok(None);
    };
    let header = header
        .as_str()
        .ok_or(AppError::Unauthenticated("invalid token"))?;
    bearer_token(header).map(|token| Some(token.to_owned()))
}

const WEBSOCKET_READ_BUFFER: usize = 4 * 1024;
const WEBSOCKET_WRITE_BUFFER: usize = 8 * 1024;

pub async fn websocket(
    State(state): State<Arc<AppState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(slot): Extension<ConnectionSlot>,
    headers: HeaderMap,
    upgrade: WebSocketUpgrade,
) -> Response {
    let Some(protocol) = websocket::protocol(&headers) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let header_token = match bearer(&headers) {
        Ok(token) => token.map(str::to_owned),
        Err(err) => return transport_error(StatusCode::UNAUTHORIZED, MediaType::Json, err),
    };
    upgrade
        .protocols([protocol.sec_websocket_protocol()])
        // tungstenite reserves a socket's whole read buffer up front (128 KiB by default, most of
        // what an idle subscriber cost: 146 KiB each at 10,000 in the bench). What a client sends
        // is small (connection_init, subscribe, pong), and a larger message still grows it.
        .read_buffer_size(WEBSOCKET_READ_BUFFER)
        // Messages out are written through once this much is buffered (128 KiB by default); a
        // snapshot is a few hundred bytes, so a small buffer still batches a burst.
        .write_buffer_size(WEBSOCKET_WRITE_BUFFER)
        .on_upgrade(move |socket| async move {
            let _open = slot.websocket();
            let schema = state.schema.clone();
            let (init_timeout, shutdown) = (state.ws_init_timeout, state.shutdown.clone());
            websocket::serve(
                socket,
                protocol,
                schema,
                init_timeout,
                shutdown,
                move |payload| async move {
                    let token = match init_payload_token(&payload).map_err(|err| err.extend())? {
                        Some(token) => Some(token),
                        None => header_token,
                    };
                    let caller = actor(&state, peer, &headers, token.as_deref())
                        .map_err(|err| err.extend())?;
                    let mut data = Data::default();
                    attach_request_data(&state.services, &mut data, caller);
                    Ok(data)
                },
            )
            .await
        })
}
