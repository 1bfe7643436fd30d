//! HTTP transport: the GraphQL endpoint, GraphiQL, websockets, health and metrics.

mod assets;
pub mod client_ip;
mod graphql;
mod ops;
pub mod server;
pub mod sockets_per_ip;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderValue, Method, header};
use axum::routing::get;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::trace::TraceLayer;

pub use client_ip::TrustedProxies;
pub use pulse_edge::{groups, websocket};

use crate::app::AppState;

/// Where GraphQL subscriptions are served, over a websocket.
pub const WEBSOCKET_PATH: &str = "/graphql/ws";

pub fn router(state: AppState, cors: CorsLayer) -> Router {
    let max_body_bytes = state.max_body_bytes;
    let state = Arc::new(state);
    Router::new()
        .route("/", get(assets::app))
        .route("/assets/{*path}", get(assets::asset))
        .merge(graphql::routes(state.clone(), "/graphql", WEBSOCKET_PATH))
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(cors)
        .layer(TraceLayer::new_for_http().make_span_with(request_span))
        .layer(CatchPanicLayer::custom(ops::panic_response))
        .with_state(state)
}

/// CORS for the configured origins. Tokens travel in the Authorization header, never in cookies, so
/// credentials are not allowed and even `*` lets no site act with a visitor's ambient session.
pub fn cors(origins: &[String]) -> anyhow::Result<CorsLayer> {
    let layer = CorsLayer::new()
        // PUT and DELETE, and the token header, are graphql-sse's single-connection mode.
        .allow_methods([Method::GET, Method::POST, Method::PUT, Method::DELETE])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            header::HeaderName::from_static(pulse_edge::stream::TOKEN_HEADER),
        ])
        .max_age(Duration::from_secs(3600));
    if origins.iter().any(|origin| origin == "*") {
        return Ok(layer.allow_origin(AllowOrigin::any()));
    }
    let origins = origins
        .iter()
        .map(|origin| {
            HeaderValue::from_str(origin.trim_end_matches('/')).map_err(|_| {
                anyhow::anyhow!("PULSE_CORS_ORIGINS: `{origin}` is not a valid origin")
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(layer.allow_origin(AllowOrigin::list(origins)))
}

/// One span per request; the query string is left out (it may carry tokens), as is the client IP.
fn request_span(request: &axum::http::Request<axum::body::Body>) -> tracing::Span {
    tracing::info_span!("http", method = %request.method(), path = %request.uri().path())
}

/// How long readiness probes wait for each dependency.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
