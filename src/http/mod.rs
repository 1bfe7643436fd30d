//! HTTP transport: the GraphQL endpoint, GraphiQL, websockets, health and metrics.

pub mod client_ip;
mod graphql;
mod ops;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::get;
use sea_orm::DatabaseConnection;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::TraceLayer;

pub use client_ip::TrustedProxies;

use crate::accounts::TokenSigner;
use crate::graphql::{PulseSchema, Services};
use crate::redis::Redis;

/// What the HTTP handlers share.
#[derive(Clone)]
pub struct HttpState {
    pub schema: PulseSchema,
    pub services: Services,
    pub tokens: Arc<TokenSigner>,
    pub proxies: TrustedProxies,
    pub db: DatabaseConnection,
    pub redis: Redis,
    pub metrics: metrics_exporter_prometheus::PrometheusHandle,
    pub max_body_bytes: usize,
}

pub fn router(state: HttpState) -> Router {
    let max_body_bytes = state.max_body_bytes;
    Router::new()
        .route("/graphql", get(graphql::graphiql).post(graphql::execute))
        .route("/graphql/ws", get(graphql::websocket))
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(TraceLayer::new_for_http().make_span_with(request_span))
        .layer(CatchPanicLayer::custom(ops::panic_response))
        .with_state(state)
}

/// One span per request; the query string is left out (it may carry tokens), as is the client IP.
fn request_span(request: &axum::http::Request<axum::body::Body>) -> tracing::Span {
    tracing::info_span!("http", method = %request.method(), path = %request.uri().path())
}

/// How long readiness probes wait for each dependency.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
