//! Operational endpoints: liveness, readiness, metrics, and the answer to a panic.

use std::any::Any;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::PROBE_TIMEOUT;
use crate::app::AppState;

/// Alive: the process serves HTTP. Says nothing about dependencies (that is `/readyz`).
pub async fn healthz() -> &'static str {
    "ok"
}

/// Ready: SQL can take a write and Redis answers, each within the probe timeout.
pub async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    let (sql, redis) = tokio::join!(
        tokio::time::timeout(PROBE_TIMEOUT, crate::db::probe_writable(&state.db)),
        tokio::time::timeout(PROBE_TIMEOUT, state.redis.ping()),
    );
    let sql_ok = matches!(sql, Ok(Ok(())));
    let redis_ok = matches!(redis, Ok(Ok(())));
    let status = if sql_ok && redis_ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = json!({
        "status": if status == StatusCode::OK { "ready" } else { "unavailable" },
        "sql": if sql_ok { "ok" } else { "unreachable" },
        "redis": if redis_ok { "ok" } else { "unreachable" },
    });
    (status, axum::Json(body)).into_response()
}

pub async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    (
        [("content-type", "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
}

pub fn panic_response(_: Box<dyn Any + Send + 'static>) -> Response {
    tracing::error!("a request handler panicked");
    let body = json!({ "errors": [{ "message": "internal error", "extensions": { "code": "INTERNAL" } }] });
    (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(body)).into_response()
}
