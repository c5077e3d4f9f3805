//! Wires the library's reconcile to a kube-runtime Controller: the Valkeys, the children it
//! owns (watched by label, so the cache holds only what the operator manages), their pods, and
//! the metadata of password Secrets users point at (so a new or rotated password acts at once).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tracing::{Instrument, info, info_span, warn};
use valkey_core::api::Valkey;
use valkey_core::api::names::{self, labels};
use valkey_core::reconcile::{self, Error};

use crate::health;
use crate::metrics::Metrics;

/// A healthy instance is looked at again after this long even without any event: a safety net,
/// not how drift is noticed (owned-object watches do that).
const RESYNC: Duration = Duration::from_secs(30 * 60);
const BACKOFF_BASE: Duration = Duration::from_secs(2);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

pub struct Options {
    /// Watch only this namespace; all namespaces when absent.
    pub namespace: Option<String>,
    pub concurrency: u16,
    pub controller_name: String,
    pub instance: Option<String>,
}

struct State {
    context: reconcile::Context,
    metrics: Arc<Metrics>,
    /// Consecutive failures per instance, for exponential backoff.
    failures: Mutex<HashMap<ObjectRef<Valkey>, u32>>,
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
    store_tx: watch::Sender<Option<Store<Valkey>>>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let ns = options.namespace.as_deref();
    let managed = watcher::Config::default().labels(&names::managed_selector());
    let controller = Controller::new(
        api::<Valkey>(&client, ns),
        watcher::Config::default().any_semantic(),
    );
    let store = controller.store();
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
    let (health_stop_tx, health_stop_rx) = watch::channel(false);
    let health = tokio::spawn(health::run(memory.clone(), trigger_tx, async move {
        let mut rx = health_stop_rx;
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
        },
        metrics,
        failures: Mutex::new(HashMap::new()),
    });

    controller
        .owns(api::<StatefulSet>(&client, ns), managed.clone())
        .owns(api::<Service>(&client, ns), managed.clone())
        .owns(api::<ConfigMap>(&client, ns), managed.clone())
        .owns(api::<Secret>(&client, ns), managed.clone())
        .owns(api::<PodDisruptionBudget>(&client, ns), managed.clone())
        .watches(api::<Pod>(&client, ns), managed, |pod| {
            let instance = pod.labels().get(labels::INSTANCE)?;
            Some(ObjectRef::new(instance).within(&pod.namespace()?))
        })
        // Metadata only: the operator never caches other Secrets' contents.
        .watches(
            api::<PartialObjectMeta<Secret>>(&client, ns),
            watcher::Config::default(),
            move |secret| {
                users_of_secret(
                    &referencing,
                    &secret.name_any(),
                    secret.namespace().as_deref(),
                )
            },
        )
        // The health loop's word: a primary stopped (or resumed) answering.
        .reconcile_on(triggers)
        .with_config(kube::runtime::controller::Config::default().concurrency(options.concurrency))
        .graceful_shutdown_on(shutdown)
        .run(reconcile_one, error_policy, state)
        .for_each(|result| async move {
            if let Err(e) = result {
                warn!(error = %e, "controller");
            }
        })
        .await;
    let _ = health_stop_tx.send(true);
    let _ = health.await;
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
            warn!(error = %e, "reconcile failed");
            Err(e)
        }
    }
}

/// Retries a failed instance with exponential backoff (2 s, 4 s, ... up to 5 min).
fn error_policy(valkey: Arc<Valkey>, _error: &Error, state: Arc<State>) -> Action {
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
