use std::net::SocketAddr;
use std::sync::Arc;

use async_graphql::http::GraphiQLSource;
use async_graphql::{Data, ErrorExtensions};
use axum::body::Bytes;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{ConnectInfo, Extension, FromRequest, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use serde_json::json;

use super::server::ConnectionSlot;
use super::websocket;
use crate::actor::Actor;
use crate::app::AppState;
use crate::error::{AppError, shorten_message};
use crate::graphql::schema::attach_request_data;

pub async fn graphiql() -> Html<String> {
    Html(
        GraphiQLSource::build()
            .title("Pulse GraphiQL")
            .endpoint("/graphql")
            .subscription_endpoint("/graphql/ws")
            .finish(),
    )
}

/// A transport-level failure, in the shape GraphQL clients already parse.
fn transport_error(status: StatusCode, error: AppError) -> Response {
    let error = error.extend();
    let body = json!({ "errors": [{ "message": error.message, "extensions": error.extensions }] });
    (status, axum::Json(body)).into_response()
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
fn malformed(status: StatusCode, mut message: String) -> Response {
    shorten_message(&mut message);
    transport_error(
        status,
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
    let user_agent = headers
        .get(header::USER_AGENT)
        .and_then(|value| value.to_str().ok())
        .map(|agent| agent.chars().take(512).collect());
    Ok(Actor {
        user,
        client_ip: state.proxies.client_ip(peer, headers),
        user_agent,
    })
}

pub async fn execute(
    State(state): State<Arc<AppState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    request: Request,
) -> Response {
    // The clock runs from the end of the headers, so a client trickling its body in holds the
    // connection for at most this long.
    let body = tokio::time::timeout(state.body_timeout, Bytes::from_request(request, &())).await;
    let body = match body {
        Err(_) => {
            let mut response = transport_error(
                StatusCode::REQUEST_TIMEOUT,
                AppError::BodyTimeout(state.body_timeout),
            );
            // The rest of the body may still be on its way; the connection cannot serve another request.
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return response;
        }
        Ok(Ok(body)) => body,
        Ok(Err(rejection)) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            let message = format!("request body is larger than {} bytes", state.max_body_bytes);
            return malformed(StatusCode::PAYLOAD_TOO_LARGE, message);
        }
        Ok(Err(rejection)) => {
            let message = format!("cannot read the request body: {rejection}");
            return malformed(rejection.status(), message);
        }
    };
    let mut request = match serde_json::from_slice::<async_graphql::Request>(&body) {
        Ok(request) if request.query.trim().is_empty() => {
            return malformed(
                StatusCode::BAD_REQUEST,
                "the request has no `query`".to_owned(),
            );
        }
        Ok(request) => request,
        Err(_) if body.first() == Some(&b'[') => {
            let message = "batched requests are not supported; send one operation per request";
            return malformed(StatusCode::BAD_REQUEST, message.to_owned());
        }
        Err(err) => {
            let message = format!("the body is not a GraphQL request in JSON: {err}");
            return malformed(StatusCode::BAD_REQUEST, message);
        }
    };
    let caller = match bearer(&headers).and_then(|token| actor(&state, peer, &headers, token)) {
        Ok(caller) => caller,
        Err(err) => return transport_error(StatusCode::UNAUTHORIZED, err),
    };
    attach_request_data(&state.services, &mut request.data, caller);
    let response = state.schema.execute(request).await;
    axum::Json(response).into_response()
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
        Err(err) => return transport_error(StatusCode::UNAUTHORIZED, err),
    };
    upgrade
        .protocols([protocol.sec_websocket_protocol()])
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
