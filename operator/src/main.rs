//! `valkey-operator`: runs Valkey instances on Kubernetes.

mod controller;
mod health;
mod http;
mod metrics;
mod telemetry;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::watch;
use tracing::{info, warn};
use valkey_core::api::Valkey;

#[derive(Parser, Debug)]
#[command(name = "valkey-operator", version, about = "Kubernetes operator for Valkey", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the controller (in-cluster, or from $KUBECONFIG / ~/.kube/config).
    Run(RunArgs),
    /// Print the Valkey CustomResourceDefinition as YAML (what manifests/crd.yaml holds).
    Crd,
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Log format.
    #[arg(
        long,
        value_enum,
        default_value = "plain",
        env = "VALKEY_OPERATOR_LOG_FORMAT"
    )]
    log_format: telemetry::LogFormat,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(
        long,
        default_value = "0.0.0.0:8080",
        env = "VALKEY_OPERATOR_HTTP_ADDR"
    )]
    http_addr: SocketAddr,
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "VALKEY_OPERATOR_WATCH_NAMESPACE")]
    watch_namespace: Option<String>,
    /// Instances reconciled at the same time.
    #[arg(long, default_value_t = 8)]
    concurrency: u16,
    /// Run without a leader Lease (only when a single process can ever run).
    #[arg(long)]
    no_leader_election: bool,
    /// Name of the leader Lease.
    #[arg(long, default_value = "valkey-operator")]
    lease_name: String,
    /// Namespace of the leader Lease (default: this pod's namespace, else the kubeconfig's).
    #[arg(long, env = "POD_NAMESPACE")]
    lease_namespace: Option<String>,
    /// This process's identity in the Lease and in events (default: the pod or host name).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => print_crd(),
        Command::Run(args) => {
            telemetry::init(args.log_format);
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?
                .block_on(run(args))
        }
    }
}

fn print_crd() -> anyhow::Result<()> {
    let yaml = valkey_core::api::crd_yaml().context("serializing the Valkey CRD")?;
    std::io::stdout()
        .write_all(yaml.as_bytes())
        .context("writing the CRD to stdout")
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let client = Client::try_default()
        .await
        .context("connecting to Kubernetes (in-cluster config, or KUBECONFIG)")?;
    let identity = args.identity.clone().unwrap_or_else(default_identity);
    info!(version = env!("CARGO_PKG_VERSION"), %identity, "starting valkey-operator");

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    tokio::spawn(forward_signals(shutdown_tx));
    let metrics = metrics::Metrics::new();
    let ready = Arc::new(AtomicBool::new(false));
    let (store_tx, store_rx) = watch::channel(None);
    let health = http::Health {
        metrics: metrics.clone(),
        ready: ready.clone(),
        store: store_rx,
    };
    let server = tokio::spawn(http::serve(
        args.http_addr,
        health,
        wait_for(shutdown_rx.clone()),
    ));

    client
        .apiserver_version()
        .await
        .context("reaching the Kubernetes API server")?;
    ready.store(true, Ordering::Relaxed);

    let options = controller::Options {
        namespace: args.watch_namespace.clone(),
        concurrency: args.concurrency,
        controller_name: "valkey-operator".into(),
        instance: Some(identity.clone()),
    };
    let outcome = if args.no_leader_election {
        metrics.set_leader(true);
        controller::run(
            client.clone(),
            options,
            metrics.clone(),
            store_tx,
            wait_for(shutdown_rx.clone()),
        )
        .await;
        Ok(())
    } else {
        lead_then_run(
            client,
            &args,
            identity,
            options,
            metrics.clone(),
            store_tx,
            shutdown_rx.clone(),
        )
        .await
    };
    server.abort();
    outcome
}

/// Waits for the leader Lease, then runs the controller until shutdown. Losing the Lease while
/// running ends the process with an error, so that no two leaders ever reconcile at once.
async fn lead_then_run(
    client: Client,
    args: &RunArgs,
    identity: String,
    options: controller::Options,
    metrics: Arc<metrics::Metrics>,
    store_tx: watch::Sender<Option<kube::runtime::reflector::Store<Valkey>>>,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let namespace = args
        .lease_namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let manager = LeaseManagerBuilder::new(client.clone(), &args.lease_name)
        .with_namespace(&namespace)
        .with_identity(&identity)
        .with_duration(15)
        .with_grace(5)
        .build()
        .await
        .with_context(|| {
            format!(
                "setting up the leader Lease {namespace}/{}",
                args.lease_name
            )
        })?;
    let (mut leader, lease_task) = manager.watch().await;
    info!(lease = %args.lease_name, %namespace, "waiting to become the leader");
    loop {
        if *leader.borrow_and_update() {
            break;
        }
        tokio::select! {
            changed = leader.changed() => changed.context("the leader election task stopped")?,
            _ = shutdown.wait_for(|s| *s) => {
                drop(leader);
                let _ = lease_task.await;
                return Ok(());
            }
        }
    }
    info!("became the leader");
    metrics.set_leader(true);
    let (lost_tx, mut lost_rx) = watch::channel(false);
    let mut watch_leader = leader.clone();
    let stop_shutdown = shutdown.clone();
    let stop = async move {
        let mut stop_shutdown = stop_shutdown;
        tokio::select! {
            _ = stop_shutdown.wait_for(|s| *s) => {}
            _ = watch_leader.wait_for(|l| !*l) => { let _ = lost_tx.send(true); }
        }
    };
    controller::run(client, options, metrics.clone(), store_tx, stop).await;
    metrics.set_leader(false);
    drop(leader);
    if let Ok(Err(e)) = lease_task.await {
        warn!(error = %e, "releasing the leader Lease");
    }
    if *lost_rx.borrow_and_update() {
        bail!("lost the leader Lease; exiting so that a fresh process can compete for it");
    }
    Ok(())
}

fn default_identity() -> String {
    let host = std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty());
    let host = host.or_else(|| {
        std::fs::read_to_string("/etc/hostname")
            .ok()
            .map(|h| h.trim().to_owned())
    });
    format!(
        "{}-{}",
        host.unwrap_or_else(|| "valkey-operator".into()),
        std::process::id()
    )
}

async fn wait_for(mut shutdown: watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}

/// SIGTERM (kubelet) or Ctrl-C: stop taking work, finish what runs, release the Lease.
async fn forward_signals(tx: watch::Sender<bool>) {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    warn!(error = %e, "cannot listen for SIGTERM");
                    let _ = ctrl_c.await;
                    let _ = tx.send(true);
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    info!("shutting down");
    let _ = tx.send(true);
}
