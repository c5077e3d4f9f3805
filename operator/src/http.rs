//! /metrics, /healthz and /readyz.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use crate::health;
use crate::metrics::Metrics;

/// What the endpoints report on, shared with the controller.
#[derive(Clone)]
pub struct Health {
    pub metrics: Arc<Metrics>,
    /// Readiness: the API server answered and the watches work (see health.rs). Liveness
    /// (/healthz) is about the process only.
    pub health: Arc<health::Health>,
}

pub async fn serve(
    addr: SocketAddr,
    health: Health,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(health);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr}"))?;
    tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .context("HTTP server")
}

async fn readyz(State(health): State<Health>) -> (StatusCode, &'static str) {
    match health.health.ready() {
        Ok(()) => (StatusCode::OK, "ok"),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason),
    }
}

async fn metrics(State(health): State<Health>) -> axum::response::Response {
    use axum::response::IntoResponse;
    match health.metrics.render() {
        Ok(body) => (
            [(
                axum::http::header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(error) => {
            tracing::error!(%error, "encoding the metrics failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "encoding the metrics failed; see the operator's log",
            )
                .into_response()
        }
    }
}
