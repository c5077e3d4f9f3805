//! Prometheus metrics: reconciles, errors, durations and failovers (counted as they happen), and,
//! computed at scrape time by a prometheus-client `Collector`, the instances by status (from the
//! controller's cache, so they can never drift from what the operator sees) and the health of the
//! operator's watches (restarts, and how long each has been broken, from `health::Health`). A
//! scrape only reads: two scrapes at once cannot see each other's half-built families.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::reflector::Store;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::sync::watch;
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
    leader: Gauge,
    failovers: Family<ReasonLabels, Counter>,
    failover_duration: Histogram,
}

impl Metrics {
    /// `health` and `store` (the controller's Valkey cache, once this process leads) are read at
    /// every scrape.
    pub fn new(health: Arc<Health>, store: watch::Receiver<Option<Store<Valkey>>>) -> Arc<Self> {
        let mut registry = Registry::with_prefix("valkey_operator");
        let reconciles = Family::<ResultLabels, Counter>::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        let duration = Histogram::new(exponential_buckets(0.005, 2.0, 12));
        let leader = Gauge::default();
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
            "leader",
            "1 while this process holds the leader Lease",
            leader.clone(),
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
        registry.register_collector(Box::new(ScrapeTime { health, store }));
        Arc::new(Self {
            registry,
            reconciles,
            errors,
            duration,
            leader,
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

    /// The text exposition (OpenMetrics). An error means a metric could not be encoded; the caller
    /// answers 500 rather than an empty or truncated page.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// The metrics computed from the operator's state at each scrape.
struct ScrapeTime {
    health: Arc<Health>,
    store: watch::Receiver<Option<Store<Valkey>>>,
}

impl std::fmt::Debug for ScrapeTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScrapeTime")
            .field("health", &self.health)
            .finish_non_exhaustive()
    }
}

impl ScrapeTime {
    /// Instances by status; `None` while this process does not lead (it has no cache then, and
    /// reporting zero instances would be a lie).
    fn instances(&self) -> Option<BTreeMap<String, i64>> {
        let store = self.store.borrow().clone()?;
        let mut by_status = BTreeMap::new();
        for valkey in store.state() {
            let status = valkey
                .status
                .as_ref()
                .and_then(|s| s.status)
                .map_or("Unknown".to_owned(), |p| p.to_string());
            *by_status.entry(status).or_default() += 1;
        }
        Some(by_status)
    }
}

impl Collector for ScrapeTime {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if let Some(instances) = self.instances() {
            let mut family = encoder.encode_descriptor(
                "instances",
                "Valkey instances, by status",
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for (status, count) in instances {
                ConstGauge::new(count).encode(family.encode_family(&StatusLabels { status })?)?;
            }
        }
        let restarts = self.health.restarts();
        if !restarts.is_empty() {
            let mut family = encoder.encode_descriptor(
                "watch_restarts",
                "Watches started again (with a fresh list) after an error, by watch",
                None,
                prometheus_client::metrics::MetricType::Counter,
            )?;
            for (watch, count) in restarts {
                ConstCounter::new(count).encode(family.encode_family(&WatchLabels { watch })?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "watch_broken_seconds",
            "How long each watch of the running controller has been failing (0 while it works)",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (watch, broken_for) in self.health.report() {
            ConstGauge::new(broken_for.as_secs_f64())
                .encode(family.encode_family(&WatchLabels { watch })?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::{reflector, watcher};
    use valkey_core::api::{Phase, ValkeyStatus};

    use super::*;

    fn valkey(name: &str, phase: Phase) -> Valkey {
        let mut valkey: Valkey = serde_json::from_value(serde_json::json!({
            "apiVersion": "database.kuberly.io/v1alpha1", "kind": "Valkey",
            "metadata": {"name": name, "namespace": "default"}, "spec": {},
        }))
        .expect("a Valkey");
        valkey.status = Some(ValkeyStatus {
            status: Some(phase),
            ..ValkeyStatus::default()
        });
        valkey
    }

    #[test]
    fn instances_are_counted_from_the_cache_and_concurrent_scrapes_each_see_all_of_them() {
        let (reader, mut writer) = reflector::store();
        for (name, phase) in [
            ("a", Phase::Running),
            ("b", Phase::Running),
            ("c", Phase::Failed),
        ] {
            writer.apply_watcher_event(&watcher::Event::Apply(valkey(name, phase)));
        }
        let (_store_tx, store) = watch::channel(Some(reader));
        let metrics = Metrics::new(Health::new(), store);

        // Each scrape computes its own families: none can observe another's half-built one (the
        // clear-and-rebuild of shared gauges this replaced could show a scrape no instances).
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..200 {
                        let text = metrics.render().expect("the metrics encode");
                        assert!(
                            text.contains("valkey_operator_instances{status=\"Running\"} 2")
                                && text.contains("valkey_operator_instances{status=\"Failed\"} 1"),
                            "{text}"
                        );
                    }
                });
            }
        });
    }

    #[test]
    fn a_process_that_does_not_lead_reports_no_instance_count() {
        let (_store_tx, store) = watch::channel(None);
        let metrics = Metrics::new(Health::new(), store);
        let text = metrics.render().expect("the metrics encode");
        assert!(!text.contains("valkey_operator_instances"), "{text}");
        assert!(text.contains("valkey_operator_leader 0"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
