//! Wires the library's reconcile to a kube-runtime Controller: the Valkeys, the children it
//! owns (watched by label, so the cache holds only what the operator manages), their pods, and
//! the metadata of password Secrets users point at (so a new or rotated password acts at once).
//!
//! Every watch is a `health::resilient` stream: it recovers on its own (fresh list, own backoff)
//! and reports to `Health`, so no watch error ever reaches the Controller, whose one backoff
//! shared by all trigger streams would otherwise stall every watch for up to 30 s per error (after
//! an API server restart: minutes of deafness, see issue 14).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Controller, Error as ControllerError};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tracing::{Instrument, debug, info, info_span, warn};
use valkey_core::api::Valkey;
use valkey_core::api::names::{self, labels};
use valkey_core::reconcile::{self, Error};

use crate::health::{self, Health};
use crate::metrics::Metrics;
use crate::primary_ping;

/// A healthy instance is looked at again after this long even without any event: a safety net,
/// not how drift is noticed (owned-object watches do that).
const RESYNC: Duration = Duration::from_secs(30 * 60);
const BACKOFF_BASE: Duration = Duration::from_secs(2);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

#[derive(Clone)]
pub struct Options {
    /// Watch only this namespace; all namespaces when absent.
    pub namespace: Option<String>,
    pub concurrency: u16,
    pub controller_name: String,
    pub instance: Option<String>,
    /// Where the operator's pods run (spec.networkPolicy lets them in).
    pub operator_namespace: String,
}

struct State {
    context: reconcile::Context,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    /// Consecutive failures per instance, for exponential backoff.
    failures: Mutex<HashMap<ObjectRef<Valkey>, u32>>,
}

/// A resilient watcher (see health.rs) named `watch` in logs and metrics.
fn resilient_watch<K>(
    name: &'static str,
    api: Api<K>,
    config: watcher::Config,
    health: &Arc<Health>,
) -> impl futures::Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    health::resilient(name, health.clone(), move || {
        watcher::watcher(api.clone(), config.clone())
    })
}

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Runs until `shutdown` resolves; publishes the Valkey cache for the metrics endpoint.
pub async fn run(
    client: Client,
    options: Options,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    store_tx: watch::Sender<Option<Store<Valkey>>>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let ns = options.namespace.as_deref();
    let managed = watcher::Config::default().labels(&names::managed_selector());
    let (store, writer) = reflector::store::<Valkey>();
    let valkeys = resilient_watch(
        "valkeys",
        api::<Valkey>(&client, ns),
        watcher::Config::default().any_semantic(),
        &health,
    )
    .reflect(writer)
    .applied_objects();
    let controller = Controller::for_stream(valkeys, store.clone());
    let _ = store_tx.send(Some(store.clone()));

    let referencing = store.clone();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: options.controller_name.clone(),
            instance: options.instance.clone(),
        },
    );
    let memory = Arc::new(reconcile::failover::Memory::default());
    let (trigger_tx, trigger_rx) = tokio::sync::mpsc::channel(1024);
    let (pinger_stop_tx, pinger_stop_rx) = watch::channel(false);
    let pinger = tokio::spawn(primary_ping::run(memory.clone(), trigger_tx, async move {
        let mut rx = pinger_stop_rx;
        let _ = rx.wait_for(|s| *s).await;
    }));
    let triggers = futures::stream::unfold(trigger_rx, |mut rx| async move {
        rx.recv().await.map(|r| (r, rx))
    });
    let state = Arc::new(State {
        context: reconcile::Context {
            client: client.clone(),
            recorder,
            memory,
            operator_namespace: options.operator_namespace.clone(),
        },
        metrics,
        health: health.clone(),
        failures: Mutex::new(HashMap::new()),
    });

    // Owned children: metadata only (owner references and labels are all that is needed).
    controller
        .owns_stream(
            resilient_watch(
                "statefulsets",
                api::<PartialObjectMeta<StatefulSet>>(&client, ns),
                managed.clone(),
                &health,
            )
            .touched_objects(),
        )
        .owns_stream(
            resilient_watch(
                "services",
                api::<PartialObjectMeta<Service>>(&client, ns),
                managed.clone(),
                &health,
            )
            .touched_objects(),
        )
        .owns_stream(
            resilient_watch(
                "configmaps",
                api::<PartialObjectMeta<ConfigMap>>(&client, ns),
                managed.clone(),
                &health,
            )
            .touched_objects(),
        )
        .owns_stream(
            resilient_watch(
                "secrets",
                api::<PartialObjectMeta<Secret>>(&client, ns),
                managed.clone(),
                &health,
            )
            .touched_objects(),
        )
        .owns_stream(
            resilient_watch(
                "poddisruptionbudgets",
                api::<PartialObjectMeta<PodDisruptionBudget>>(&client, ns),
                managed.clone(),
                &health,
            )
            .touched_objects(),
        )
        .watches_stream(
            resilient_watch("pods", api::<Pod>(&client, ns), managed, &health).touched_objects(),
            |pod| {
                let instance = pod.labels().get(labels::INSTANCE)?;
                Some(ObjectRef::new(instance).within(&pod.namespace()?))
            },
        )
        // Metadata only: the operator never caches other Secrets' contents.
        .watches_stream(
            resilient_watch(
                "password-secrets",
                api::<PartialObjectMeta<Secret>>(&client, ns),
                watcher::Config::default(),
                &health,
            )
            .touched_objects(),
            move |secret| {
                users_of_secret(
                    &referencing,
                    &secret.name_any(),
                    secret.namespace().as_deref(),
                )
            },
        )
        // primary_ping's word: a primary stopped (or resumed) answering.
        .reconcile_on(triggers)
        .with_config(kube::runtime::controller::Config::default().concurrency(options.concurrency))
        .graceful_shutdown_on(shutdown)
        .run(reconcile_one, error_policy, state)
        .for_each(|result| async move {
            match result {
                Ok(_) => {}
                // Already logged by reconcile_one.
                Err(e @ ControllerError::ReconcilerFailed(..)) => debug!(error = %e, "controller"),
                Err(e) => warn!(error = %e, "controller"),
            }
        })
        .await;
    health.watches_stopped();
    let _ = pinger_stop_tx.send(true);
    let _ = pinger.await;
    info!("controller stopped");
}

/// The Valkeys whose spec.passwordSecret names this Secret.
fn users_of_secret(
    store: &Store<Valkey>,
    name: &str,
    namespace: Option<&str>,
) -> Vec<ObjectRef<Valkey>> {
    store
        .state()
        .iter()
        .filter(|v| v.namespace().as_deref() == namespace)
        .filter(|v| {
            v.spec
                .password_secret
                .as_ref()
                .is_some_and(|r| r.name == name)
        })
        .map(|v| ObjectRef::from_obj(v.as_ref()))
        .collect()
}

async fn reconcile_one(valkey: Arc<Valkey>, state: Arc<State>) -> Result<Action, Error> {
    let span = info_span!("reconcile", valkey = %valkey.name_any(), namespace = valkey.namespace().unwrap_or_default());
    let started = Instant::now();
    let result = reconcile::reconcile(&valkey, &state.context)
        .instrument(span.clone())
        .await;
    state
        .metrics
        .reconciled(started.elapsed(), result.as_ref().err().map(Error::reason));
    if let Ok(Some((reason, took))) = result.as_ref().map(|r| r.failover.as_ref()) {
        state.metrics.failed_over(reason, *took);
    }
    let _entered = span.enter();
    match result {
        Ok(report) => {
            if let Ok(mut failures) = state.failures.lock() {
                failures.remove(&ObjectRef::from_obj(valkey.as_ref()));
            }
            if !report.changes.is_empty() {
                info!(phase = %report.phase, changes = report.changes.len(), "reconciled");
            }
            Ok(Action::requeue(report.requeue_after.unwrap_or(RESYNC)))
        }
        Err(e) => {
            // During an outage every instance fails the same way; health.rs says it once.
            if state.health.in_outage() {
                debug!(error = %e, "reconcile failed during an outage of the API server");
            } else {
                warn!(error = %e, "reconcile failed");
            }
            Err(e)
        }
    }
}

/// Retries a failed instance with exponential backoff (2 s, 4 s, ... up to 5 min), except an
/// invalid spec: only a change of the Valkey can fix that, and its event reconciles it again.
fn error_policy(valkey: Arc<Valkey>, error: &Error, state: Arc<State>) -> Action {
    if matches!(error, Error::Build(_)) {
        return Action::await_change();
    }
    let attempts = state
        .failures
        .lock()
        .map(|mut f| {
            let n = f.entry(ObjectRef::from_obj(valkey.as_ref())).or_insert(0);
            *n = n.saturating_add(1);
            *n
        })
        .unwrap_or(1);
    let delay =
        BACKOFF_BASE.saturating_mul(2u32.saturating_pow(attempts.saturating_sub(1).min(16)));
    Action::requeue(delay.min(BACKOFF_MAX))
}
