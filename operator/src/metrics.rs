//! Prometheus metrics: reconciles, errors, durations, instances by status (counted from the
//! controller's cache at scrape time, so it can never drift from what the operator sees), and the
//! health of the operator's watches (restarts, and how long each has been broken, read from
//! `health::Health` at scrape time).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use kube::runtime::reflector::Store;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use valkey_core::api::Valkey;

use crate::health::Health;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabels {
    pub status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchLabels {
    pub watch: &'static str,
}

pub struct Metrics {
    registry: Registry,
    reconciles: Family<ResultLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    duration: Histogram,
    instances: Family<StatusLabels, Gauge>,
    leader: Gauge,
    watch_restarts: Family<WatchLabels, Counter>,
    watch_broken: Family<WatchLabels, Gauge<f64, AtomicU64>>,
    failovers: Family<ReasonLabels, Counter>,
    failover_duration: Histogram,
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::with_prefix("valkey_operator");
        let reconciles = Family::<ResultLabels, Counter>::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        let duration = Histogram::new(exponential_buckets(0.005, 2.0, 12));
        let instances = Family::<StatusLabels, Gauge>::default();
        let leader = Gauge::default();
        let watch_restarts = Family::<WatchLabels, Counter>::default();
        let watch_broken = Family::<WatchLabels, Gauge<f64, AtomicU64>>::default();
        let failovers = Family::<ReasonLabels, Counter>::default();
        // 10 ms .. about 20 s.
        let failover_duration = Histogram::new(exponential_buckets(0.01, 2.0, 12));
        registry.register(
            "reconciles",
            "Reconciles of Valkey instances, by result",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Failed reconciles, by reason",
            errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "How long one reconcile takes",
            duration.clone(),
        );
        registry.register(
            "instances",
            "Valkey instances, by status",
            instances.clone(),
        );
        registry.register(
            "leader",
            "1 while this process holds the leader Lease",
            leader.clone(),
        );
        registry.register(
            "watch_restarts",
            "Watches started again (with a fresh list) after an error, by watch",
            watch_restarts.clone(),
        );
        registry.register(
            "watch_broken_seconds",
            "How long each watch of the running controller has been failing (0 while it works)",
            watch_broken.clone(),
        );
        registry.register(
            "failovers",
            "Moves of the primary role (failovers and planned switchovers), by reason",
            failovers.clone(),
        );
        registry.register(
            "failover_duration_seconds",
            "From the decision to promote to the new primary recorded, labelled and followed",
            failover_duration.clone(),
        );
        Arc::new(Self {
            registry,
            reconciles,
            errors,
            duration,
            instances,
            leader,
            watch_restarts,
            watch_broken,
            failovers,
            failover_duration,
        })
    }

    pub fn reconciled(&self, elapsed: Duration, error: Option<&'static str>) {
        self.duration.observe(elapsed.as_secs_f64());
        let result = if error.is_some() { "error" } else { "success" };
        self.reconciles
            .get_or_create(&ResultLabels { result })
            .inc();
        if let Some(reason) = error {
            self.errors.get_or_create(&ErrorLabels { reason }).inc();
        }
    }

    pub fn failed_over(&self, reason: &str, took: Duration) {
        self.failovers
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
        self.failover_duration.observe(took.as_secs_f64());
    }

    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    pub fn watch_restarted(&self, watch: &'static str) {
        self.watch_restarts
            .get_or_create(&WatchLabels { watch })
            .inc();
    }

    /// The text exposition, with the instance gauge refreshed from `store` when there is one and
    /// the watch gauge from `health`.
    pub fn render(&self, store: Option<&Store<Valkey>>, health: &Health) -> String {
        self.watch_broken.clear();
        for (watch, broken_for) in health.report() {
            self.watch_broken
                .get_or_create(&WatchLabels { watch })
                .set(broken_for.as_secs_f64());
        }
        if let Some(store) = store {
            self.instances.clear();
            for valkey in store.state() {
                let status = valkey
                    .status
                    .as_ref()
                    .and_then(|s| s.status)
                    .map_or("Unknown".to_owned(), |p| p.to_string());
                self.instances.get_or_create(&StatusLabels { status }).inc();
            }
        }
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}
