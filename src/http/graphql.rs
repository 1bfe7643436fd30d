//! Pulse's side of the GraphQL endpoint (the endpoint itself is `pulse_edge::http`): who acts on
//! each request, from its bearer token and its client address, and GraphiQL for browsers.

use std::net::SocketAddr;
use std::sync::Arc;

use async_graphql::{Data, ErrorExtensions};
use axum::Router;
use axum::extract::ConnectInfo;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use pulse_edge::http::{
    Admitted, Endpoint, Refusal, RequestHook, Settings, SocketAdmission, StreamAdmission,
};
use pulse_edge::websocket::CredentialsExpire;
use pulse_kit::actor::Actor;

use super::assets;
use super::server::ConnectionSlot;
use crate::app::AppState;
use crate::error::AppError;
use crate::graphql::schema::attach_request_data;

/// A request whose credentials do not check out: a 401, whatever the media type.
fn unauthenticated(error: AppError) -> Refusal {
    Refusal {
        status: StatusCode::UNAUTHORIZED,
        error: error.extend(),
    }
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

fn actor(state: &AppState, peer: SocketAddr, headers: &HeaderMap, user: Option<i64>) -> Actor {
    let user_agent = state
        .proxies
        .user_agent(peer, headers)
        .map(|agent| agent.chars().take(512).collect());
    Actor {
        user,
        client_ip: state.proxies.client_ip(peer, headers),
        user_agent,
    }
}

/// The direct peer of a request, which the accept loop puts in every request's extensions.
fn peer(head: &Parts) -> Result<SocketAddr, Refusal> {
    let peer = head.extensions.get::<ConnectInfo<SocketAddr>>();
    peer.map(|ConnectInfo(peer)| *peer).ok_or_else(|| Refusal {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        error: AppError::Internal("a request without its peer's address".to_owned()).extend(),
    })
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

/// Pulse's side of each GraphQL request: who acts (a verified token, else the client's address
/// behind trusted proxies) and the loaders its resolvers share.
struct Callers(Arc<AppState>);

#[async_trait::async_trait]
impl RequestHook for Callers {
    async fn http(&self, head: &Parts) -> Result<Admitted, Refusal> {
        let peer = peer(head)?;
        let verified = bearer(&head.headers)
            .and_then(|token| {
                token
                    .map(|token| self.0.tokens.verify_until(token))
                    .transpose()
            })
            .map_err(unauthenticated)?;
        let caller = actor(&self.0, peer, &head.headers, verified.map(|(user, _)| user));
        let private = caller.user.is_some();
        let mut data = Data::default();
        // A stream's operations that read the viewer end when the token does.
        if let Some((_, expires)) = verified {
            data.insert(CredentialsExpire(expires));
        }
        attach_request_data(&mut data, caller);
        Ok(Admitted { data, private })
    }

    /// A stream counts under `PULSE_MAX_SOCKETS_PER_IP` as a websocket does: each holds a
    /// connection for as long as it lasts.
    async fn stream(&self, head: &Parts) -> Result<StreamAdmission, Refusal> {
        let admitted = self.http(head).await?;
        let peer = peer(head)?;
        let sockets = &self.0.sockets_per_ip;
        let place = sockets
            .take(self.0.proxies.client_ip(peer, &head.headers))
            .ok_or_else(|| too_many_sockets(sockets.cap()))?;
        Ok(StreamAdmission {
            data: admitted.data,
            held: Box::new(place),
        })
    }

    fn websocket(&self, head: &Parts) -> Result<SocketAdmission, Refusal> {
        let peer = peer(head)?;
        let header_token = bearer(&head.headers)
            .map_err(unauthenticated)?
            .map(str::to_owned);
        let sockets = &self.0.sockets_per_ip;
        let place = sockets
            .take(self.0.proxies.client_ip(peer, &head.headers))
            .ok_or_else(|| too_many_sockets(sockets.cap()))?;
        let slot = head.extensions.get::<ConnectionSlot>().cloned();
        let (state, headers) = (self.0.clone(), head.headers.clone());
        let admission = SocketAdmission::new(move |payload| async move {
            let token = match init_payload_token(&payload).map_err(|err| err.extend())? {
                Some(token) => Some(token),
                None => header_token,
            };
            let verified = token
                .map(|token| state.tokens.verify_until(&token))
                .transpose()
                .map_err(|err| err.extend())?;
            let mut data = Data::default();
            if let Some((_, expires)) = verified {
                data.insert(CredentialsExpire(expires));
            }
            let caller = actor(&state, peer, &headers, verified.map(|(user, _)| user));
            attach_request_data(&mut data, caller);
            Ok(data)
        });
        // The place is taken now, so that upgrades racing each other cannot pass the cap together,
        // and given back with the socket, or with the admission if the upgrade fails.
        Ok(admission.holding(move || (place, slot.map(ConnectionSlot::websocket))))
    }
}

/// An upgrade or a stream past `PULSE_MAX_SOCKETS_PER_IP`: refused before it becomes a socket or
/// a stream, so that the client gets a status and a code it can act on instead of a connection
/// closed at once.
fn too_many_sockets(cap: u32) -> Refusal {
    let message =
        format!("this address already holds {cap} websockets and event streams, the most it may");
    Refusal {
        status: StatusCode::TOO_MANY_REQUESTS,
        error: async_graphql::Error::new(message)
            .extend_with(|_, extensions| extensions.set("code", "RATE_LIMITED")),
    }
}

/// The GraphQL endpoint at `path` and its websocket at `websocket_path`, as Pulse serves them.
pub fn routes(state: Arc<AppState>, path: &str, websocket_path: &str) -> Router<Arc<AppState>> {
    let settings = Settings {
        max_body_bytes: state.max_body_bytes,
        body_timeout: state.body_timeout,
        websocket: state.websocket.clone(),
        shutdown: state.shutdown.clone(),
        server_failure,
    };
    Endpoint::new(state.schema.clone(), Callers(state), settings)
        .page("GraphiQL", assets::graphiql)
        .routes(path, websocket_path)
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
