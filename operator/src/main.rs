//! `valkey-operator`: runs Valkey instances on Kubernetes.

mod controller;
mod health;
mod http;
mod metrics;
mod primary_ping;
mod telemetry;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::watch;
use tracing::{debug, info, warn};
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
    /// Namespace of the leader Lease, and the one spec.networkPolicy lets the operator's pods in
    /// from (default: this pod's namespace, else the kubeconfig's).
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
    let health = health::Health::new();
    let (store_tx, store_rx) = watch::channel(None);
    let metrics = metrics::Metrics::new(health.clone(), store_rx);
    let endpoints = http::Health {
        metrics: metrics.clone(),
        health: health.clone(),
    };
    let server = tokio::spawn(http::serve(
        args.http_addr,
        endpoints,
        wait_for(shutdown_rx.clone()),
    ));

    client
        .apiserver_version()
        .await
        .context("reaching the Kubernetes API server")?;
    health.api_answered();
    let probe = tokio::spawn(probe_api_server(client.clone(), health.clone()));

    let options = controller::Options {
        namespace: args.watch_namespace.clone(),
        concurrency: args.concurrency,
        controller_name: "valkey-operator".into(),
        instance: Some(identity.clone()),
        operator_namespace: args
            .lease_namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_owned()),
    };
    let outcome = if args.no_leader_election {
        metrics.set_leader(true);
        controller::run(
            client.clone(),
            options,
            metrics.clone(),
            health.clone(),
            store_tx,
            wait_for(shutdown_rx.clone()),
        )
        .await;
        Ok(())
    } else {
        let leading = Leading {
            client,
            args: &args,
            identity,
            options,
            metrics: metrics.clone(),
            health,
            store_tx,
        };
        leading.run(shutdown_rx.clone()).await
    };
    probe.abort();
    server.abort();
    outcome
}

/// How often, and with what timeout, the process asks the API server for /version: the signal of
/// whether it can reach the API server at all, besides its watches.
const PROBE_EVERY: Duration = Duration::from_secs(1);
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

async fn probe_api_server(client: kube::Client, health: Arc<health::Health>) {
    loop {
        match tokio::time::timeout(PROBE_TIMEOUT, client.apiserver_version()).await {
            Ok(Ok(_)) => health.api_answered(),
            Ok(Err(e)) => health.api_failed(&e),
            Err(_) => health.api_failed(&format_args!("no answer within {PROBE_TIMEOUT:?}")),
        }
        tokio::time::sleep(PROBE_EVERY).await;
    }
}

/// The leader Lease: valid this long after each renewal, renewed this long before it expires.
const LEASE_SECONDS: u64 = 15;
const LEASE_GRACE_SECONDS: u64 = 5;
/// How often the leader looks at its health (health.rs: `Health::unhealthy`).
const HEALTH_TICK: Duration = Duration::from_millis(250);
/// Once told to stop, running reconciles get this long to finish; then they are cancelled.
const STOP_GRACE: Duration = Duration::from_secs(2);
/// Releasing the Lease is best effort: the API server may be the thing that is gone.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    Shutdown,
    LostLease,
    Unhealthy,
}

/// Everything the leader loop needs.
struct Leading<'a> {
    client: Client,
    args: &'a RunArgs,
    identity: String,
    options: controller::Options,
    metrics: Arc<metrics::Metrics>,
    health: Arc<health::Health>,
    store_tx: watch::Sender<Option<kube::runtime::reflector::Store<Valkey>>>,
}

impl Leading<'_> {
    /// Competes for the Lease and runs the controller while leading. Leadership follows health:
    /// when the watches stay broken or the API server stays unreachable for longer than
    /// `health::WATCH_BROKEN_BOUND`, the controller stops and the Lease is released (or, when
    /// the API server cannot be told, simply not renewed), so a standby can take over; once the
    /// API server answers again this process competes again. Losing the Lease to another process
    /// while running ends the process with an error, so that no two leaders ever reconcile at
    /// once.
    async fn run(self, mut shutdown: watch::Receiver<bool>) -> anyhow::Result<()> {
        loop {
            match self.lead_once(&mut shutdown).await? {
                Stop::Shutdown => return Ok(()),
                Stop::LostLease => {
                    bail!(
                        "lost the leader Lease; exiting so that a fresh process can compete for it"
                    )
                }
                Stop::Unhealthy => continue,
            }
        }
    }

    async fn lead_once(&self, shutdown: &mut watch::Receiver<bool>) -> anyhow::Result<Stop> {
        let namespace = self
            .args
            .lease_namespace
            .clone()
            .unwrap_or_else(|| self.client.default_namespace().to_owned());
        let lease_name = &self.args.lease_name;
        // After a step-down: wait for the API server to answer before competing again.
        loop {
            if self.health.ready().is_ok() {
                break;
            }
            tokio::select! {
                _ = tokio::time::sleep(HEALTH_TICK) => {}
                _ = shutdown.wait_for(|s| *s) => return Ok(Stop::Shutdown),
            }
        }
        let mut failed_before = false;
        let manager = loop {
            let built = LeaseManagerBuilder::new(self.client.clone(), lease_name)
                .with_namespace(&namespace)
                .with_identity(&self.identity)
                .with_duration(LEASE_SECONDS)
                .with_grace(LEASE_GRACE_SECONDS)
                .build()
                .await;
            match built {
                Ok(manager) => break manager,
                Err(e) if failed_before => {
                    debug!(error = %e, lease = %lease_name, %namespace, "setting up the leader Lease; retrying");
                }
                Err(e) => {
                    warn!(error = %e, lease = %lease_name, %namespace, "setting up the leader Lease; retrying every second");
                    failed_before = true;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(PROBE_EVERY) => {}
                _ = shutdown.wait_for(|s| *s) => return Ok(Stop::Shutdown),
            }
        };
        let (mut leader, lease_task) = manager.watch().await;
        info!(lease = %lease_name, %namespace, "waiting to become the leader");
        loop {
            if *leader.borrow_and_update() {
                break;
            }
            tokio::select! {
                changed = leader.changed() => changed.context("the leader election task stopped")?,
                _ = shutdown.wait_for(|s| *s) => {
                    drop(leader);
                    release(lease_task).await;
                    return Ok(Stop::Shutdown);
                }
            }
        }
        info!("became the leader");
        self.metrics.set_leader(true);

        // Decide when to stop: shutdown, the Lease taken by another process, or bad health.
        let (stop_tx, stop_rx) = watch::channel(None::<Stop>);
        let decide = {
            let mut shutdown = shutdown.clone();
            let mut leader = leader.clone();
            let health = self.health.clone();
            tokio::spawn(async move {
                let unhealthy = async {
                    loop {
                        tokio::time::sleep(HEALTH_TICK).await;
                        if health.unhealthy() {
                            return;
                        }
                    }
                };
                let reason = tokio::select! {
                    _ = shutdown.wait_for(|s| *s) => Stop::Shutdown,
                    _ = leader.wait_for(|l| !*l) => Stop::LostLease,
                    _ = unhealthy => Stop::Unhealthy,
                };
                let _ = stop_tx.send(Some(reason));
            })
        };
        let graceful = {
            let mut stop = stop_rx.clone();
            async move {
                let _ = stop.wait_for(Option::is_some).await;
            }
        };
        let controller = controller::run(
            self.client.clone(),
            self.options.clone(),
            self.metrics.clone(),
            self.health.clone(),
            self.store_tx.clone(),
            graceful,
        );
        let mut deadline = stop_rx.clone();
        tokio::select! {
            () = controller => {}
            () = async {
                let _ = deadline.wait_for(Option::is_some).await;
                tokio::time::sleep(STOP_GRACE).await;
            } => {
                warn!(grace = ?STOP_GRACE, "running reconciles did not finish in time; cancelled them");
                self.health.watches_stopped();
            }
        }
        decide.abort();
        let reason = (*stop_rx.borrow()).unwrap_or(Stop::Shutdown);
        self.metrics.set_leader(false);
        if reason == Stop::Unhealthy {
            warn!(
                bound_seconds = health::WATCH_BROKEN_BOUND.as_secs(),
                "cannot see the cluster for longer than the bound: stopped reconciling and giving the leader Lease up until the API server answers again"
            );
            self.health.stepped_down();
        }
        drop(leader);
        release(lease_task).await;
        Ok(reason)
    }
}

/// Ends the Lease task (which releases the Lease), waiting at most `RELEASE_TIMEOUT`.
async fn release(
    lease_task: tokio::task::JoinHandle<
        kube_lease_manager::Result<kube_lease_manager::LeaseManager>,
    >,
) {
    let abort = lease_task.abort_handle();
    match tokio::time::timeout(RELEASE_TIMEOUT, lease_task).await {
        Ok(Ok(Ok(_))) => {}
        Ok(Ok(Err(e))) => warn!(error = %e, "releasing the leader Lease"),
        Ok(Err(e)) => warn!(error = %e, "the leader Lease task failed"),
        Err(_) => {
            abort.abort();
            warn!(timeout = ?RELEASE_TIMEOUT, "could not release the leader Lease in time; it expires on its own");
        }
    }
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
