//! Logs through `tracing`: human-readable by default, JSON (one object per line) for log
//! pipelines. The level comes from RUST_LOG (default: `DEFAULT_FILTER`).

use std::io::IsTerminal;

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum LogFormat {
    Plain,
    Json,
}

/// Info, without kube-rs's own line for every failed request and watch retry: the operator logs
/// those itself, once per outage (health.rs) and once per failed reconcile.
pub const DEFAULT_FILTER: &str = "info,kube_client=off,kube_runtime::watcher=off";

pub fn init(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Plain => builder.init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
    }
}
