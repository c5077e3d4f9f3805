//! Whether the operator can see the cluster: every watch it holds reports here, /readyz and the
//! leader loop ask here, /metrics reads from here at scrape time (metrics.rs).
//!
//! A watch is *broken* from its first error until it has listed again; `WATCH_BROKEN_BOUND` is how
//! long that may last before the process counts as unhealthy (/readyz fails and a leader steps
//! down, see main.rs). One warning is logged when an outage begins (the first watch that breaks
//! while all were fine) and one info line when every watch has listed again; the retries in
//! between log at debug level only.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use backon::BackoffBuilder;
use futures::{Stream, StreamExt};
use kube::runtime::watcher;
use tracing::{debug, info, warn};

/// How long a watch may stay broken before the process is unhealthy: /readyz fails and the leader
/// stops reconciling and gives its Lease up. Shorter than the Lease's grace (main.rs), so this
/// process has stopped before a standby can see the Lease expire.
pub const WATCH_BROKEN_BOUND: Duration = Duration::from_secs(8);

/// Delay before re-listing a failed watch: doubles from the first to the last, with jitter, and
/// starts over once the watch has listed again. The cap bounds how long a watch stays deaf after
/// the API server answers again.
const RETRY_FIRST: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WatchState {
    /// Started, not listed yet.
    Starting,
    Healthy,
    /// Failing since then.
    Broken(Instant),
}

#[derive(Default)]
struct Inner {
    /// The API server answered this process at least once.
    reached: bool,
    /// Since when the API server has not answered the probe (main.rs), if it does not.
    unreachable: Option<Instant>,
    /// Set when the leader gave up because of broken watches; cleared when the API server
    /// answers again (`api_answered`).
    lost: bool,
    watches: BTreeMap<&'static str, WatchState>,
    /// After a step-down: the outage is over only once the next controller's watches listed.
    awaiting_watches: bool,
    /// When the current outage began (first watch broken while none was), until every watch has
    /// listed again. Survives a controller restart, so that one outage logs one warning.
    outage: Option<Instant>,
    /// Restarts of each watch since the process started (a counter: never cleared, not even when
    /// the controller and its watches stop).
    restarts: BTreeMap<&'static str, u64>,
}

impl Inner {
    fn begin_outage(&mut self, now: Instant, what: &'static str, error: &dyn Display) {
        if self.outage.is_some() {
            debug!(watch = what, %error, "failing during an ongoing outage");
            return;
        }
        self.outage = Some(now);
        warn!(
            watch = what,
            %error,
            bound_seconds = WATCH_BROKEN_BOUND.as_secs(),
            "lost the API server; retrying with backoff (each watch re-lists) until it answers"
        );
    }

    /// Logs the end of the outage once the API server answers and every watch has listed.
    fn end_outage_if_over(&mut self) {
        let all_listed = self.watches.values().all(|s| *s == WatchState::Healthy);
        if all_listed
            && !self.awaiting_watches
            && self.unreachable.is_none()
            && let Some(began) = self.outage.take()
        {
            info!(
                watches = self.watches.len(),
                outage_seconds = format!("{:.1}", began.elapsed().as_secs_f64()),
                "the API server answers and every watch has listed again"
            );
        }
    }
}

#[derive(Default)]
pub struct Health {
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("broken_for", &self.broken_for())
            .finish_non_exhaustive()
    }
}

impl Health {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding this lock cannot leave the map half-updated in a harmful way.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The API server answered the probe.
    pub fn api_answered(&self) {
        let mut inner = self.lock();
        inner.reached = true;
        inner.lost = false;
        if let Some(since) = inner.unreachable.take() {
            debug!(unreachable_for = ?since.elapsed(), "the API server answers again");
        }
        inner.end_outage_if_over();
    }

    /// The API server did not answer the probe.
    pub fn api_failed(&self, error: &dyn Display) {
        let mut inner = self.lock();
        let now = Instant::now();
        if inner.unreachable.is_some() {
            debug!(%error, "the API server still does not answer");
            return;
        }
        inner.unreachable = Some(now);
        inner.begin_outage(now, "api-server", error);
    }

    /// The leader gave up because its watches stayed broken; not ready until the API server
    /// answers again.
    pub fn stepped_down(&self) {
        let mut inner = self.lock();
        inner.lost = true;
        // The controller's watches are gone; the next controller registers its own. The outage
        // stays open until those have listed.
        inner.watches.clear();
        inner.awaiting_watches = true;
    }

    /// The controller stopped (shutdown, lost Lease): its watches no longer count.
    pub fn watches_stopped(&self) {
        self.lock().watches.clear();
    }

    fn started(&self, watch: &'static str) {
        let mut inner = self.lock();
        inner.watches.insert(watch, WatchState::Starting);
        inner.awaiting_watches = false;
    }

    fn failed(&self, watch: &'static str, error: &dyn Display) {
        let mut inner = self.lock();
        *inner.restarts.entry(watch).or_default() += 1;
        let now = Instant::now();
        let previous = inner.watches.insert(watch, WatchState::Broken(now));
        if let Some(WatchState::Broken(since)) = previous {
            inner.watches.insert(watch, WatchState::Broken(since));
            debug!(watch, %error, broken_for = ?since.elapsed(), "watch still failing; retrying");
            return;
        }
        inner.begin_outage(now, watch, error);
    }

    fn listed(&self, watch: &'static str) {
        let mut inner = self.lock();
        let previous = inner.watches.insert(watch, WatchState::Healthy);
        if previous == Some(WatchState::Healthy) {
            return;
        }
        if let Some(WatchState::Broken(since)) = previous {
            debug!(watch, broken_for = ?since.elapsed(), "watch listed again");
        }
        inner.end_outage_if_over();
    }

    /// Whether an outage is going on (a watch broken or the API server silent, since the warning
    /// and until the recovery line).
    pub fn in_outage(&self) -> bool {
        self.lock().outage.is_some()
    }

    /// The longest time any watch has been broken, or the API server has not answered.
    pub fn broken_for(&self) -> Duration {
        let now = Instant::now();
        let inner = self.lock();
        inner
            .watches
            .values()
            .filter_map(|s| match s {
                WatchState::Broken(since) => Some(*since),
                _ => None,
            })
            .chain(inner.unreachable)
            .map(|since| now.saturating_duration_since(since))
            .max()
            .unwrap_or_default()
    }

    /// Whether a watch has been broken, or the API server unreachable, for longer than
    /// `WATCH_BROKEN_BOUND`.
    pub fn unhealthy(&self) -> bool {
        self.broken_for() > WATCH_BROKEN_BOUND
    }

    /// /readyz: the API server answered, no watch has been broken longer than the bound, and the
    /// process is not waiting for the API server after giving up its leadership.
    pub fn ready(&self) -> Result<(), &'static str> {
        let (reached, lost) = {
            let inner = self.lock();
            (inner.reached, inner.lost)
        };
        if !reached {
            return Err("not connected to the API server yet");
        }
        if lost {
            return Err("lost the API server; waiting for it to answer again");
        }
        if self.unhealthy() {
            return Err("the API server or a watch on it has been failing for too long");
        }
        Ok(())
    }

    /// How often each watch has been started again after an error, since the process started.
    pub fn restarts(&self) -> Vec<(&'static str, u64)> {
        self.lock()
            .restarts
            .iter()
            .map(|(watch, n)| (*watch, *n))
            .collect()
    }

    /// How long each watch of the running controller has been broken (zero when it is not).
    pub fn report(&self) -> Vec<(&'static str, Duration)> {
        let now = Instant::now();
        self.lock()
            .watches
            .iter()
            .map(|(watch, state)| {
                let broken_for = match state {
                    WatchState::Broken(since) => now.saturating_duration_since(*since),
                    _ => Duration::ZERO,
                };
                (*watch, broken_for)
            })
            .collect()
    }
}

type EventStream<K> = Pin<Box<dyn Stream<Item = watcher::Result<watcher::Event<K>>> + Send>>;

/// A watch that never gives up and never passes an error on: `start` makes a fresh
/// `kube::runtime::watcher` (which lists, then watches); on any error the watcher is dropped and,
/// after a backoff, started again, so it always resumes with a fresh list, whether its
/// resourceVersion expired (410 Gone) or the connection broke. Errors go to `health` (and the
/// log, once per outage) instead of downstream, where kube-runtime's Controller would apply one
/// backoff shared by all its watches and stop polling every one of them while it sleeps.
pub fn resilient<K, S>(
    watch: &'static str,
    health: Arc<Health>,
    start: impl Fn() -> S + Send + 'static,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send
where
    K: Send + 'static,
    S: Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
{
    health.started(watch);
    let fresh = move || -> EventStream<K> { start().boxed() };
    let stream = fresh();
    futures::stream::unfold(
        (stream, fresh, health, retry_delays()),
        move |(mut stream, fresh, health, mut delays)| async move {
            loop {
                match stream.next().await {
                    Some(Ok(event)) => {
                        // Init comes before the list request: no proof that the server answers.
                        if !matches!(event, watcher::Event::Init) {
                            health.listed(watch);
                            delays = retry_delays();
                        }
                        return Some((Ok(event), (stream, fresh, health, delays)));
                    }
                    Some(Err(error)) => {
                        health.failed(watch, &error);
                        let delay = delays.next().unwrap_or(RETRY_MAX);
                        tokio::time::sleep(delay).await;
                        stream = fresh();
                    }
                    // kube's watcher never ends; if one did, start it again.
                    None => {
                        tokio::time::sleep(RETRY_FIRST).await;
                        stream = fresh();
                    }
                }
            }
        },
    )
}

fn retry_delays() -> impl Iterator<Item = Duration> + Send {
    backon::ExponentialBuilder::default()
        .with_min_delay(RETRY_FIRST)
        .with_max_delay(RETRY_MAX)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::watcher::Event;

    use super::*;
    use crate::metrics::Metrics;

    fn config_map(name: &str) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.to_owned());
        cm
    }

    #[tokio::test]
    async fn an_error_restarts_the_watcher_with_a_fresh_list_and_never_reaches_the_consumer() {
        let health = Health::new();
        health.api_answered();
        let starts = Arc::new(AtomicUsize::new(0));
        let counted = starts.clone();
        let stream = resilient("configmaps", health.clone(), move || {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            let events: Vec<watcher::Result<Event<ConfigMap>>> = if n < 2 {
                // Like kube's watcher when the API server is gone: Init, then the list fails.
                vec![Ok(Event::Init), Err(watcher::Error::NoResourceVersion)]
            } else {
                vec![
                    Ok(Event::Init),
                    Ok(Event::InitApply(config_map("a"))),
                    Ok(Event::InitDone),
                ]
            };
            futures::stream::iter(events).chain(futures::stream::pending())
        });
        let mut stream = std::pin::pin!(stream);
        let mut seen = Vec::new();
        for _ in 0..3 {
            let event = stream.next().await.expect("the stream never ends");
            seen.push(
                event
                    .map(|e| e.to_string())
                    .unwrap_or_else(|e| e.to_string()),
            );
        }
        assert_eq!(seen, ["Init", "Init", "Init"]);
        assert!(
            health.broken_for() > Duration::ZERO,
            "broken until it lists"
        );
        for _ in 0..2 {
            let event = stream.next().await.expect("the stream never ends");
            seen.push(
                event
                    .map(|e| e.to_string())
                    .unwrap_or_else(|e| e.to_string()),
            );
        }
        assert_eq!(seen, ["Init", "Init", "Init", "InitApply(a)", "InitDone"]);
        assert_eq!(
            starts.load(Ordering::SeqCst),
            3,
            "started again after each error"
        );
        assert_eq!(health.broken_for(), Duration::ZERO, "listed again");
        assert!(health.ready().is_ok());
    }

    #[test]
    fn a_watch_is_broken_from_its_first_error_until_it_lists() {
        let health = Health::new();
        let (_store_tx, store) = tokio::sync::watch::channel(None);
        let metrics = Metrics::new(health.clone(), store);
        health.api_answered();
        health.started("pods");
        health.started("services");
        assert_eq!(health.broken_for(), Duration::ZERO);
        health.failed("pods", &"connection refused");
        std::thread::sleep(Duration::from_millis(20));
        health.failed("pods", &"connection refused");
        let broken = health.broken_for();
        assert!(broken >= Duration::from_millis(20), "{broken:?}");
        assert!(health.ready().is_ok(), "within the bound");
        health.listed("pods");
        assert_eq!(health.broken_for(), Duration::ZERO);
        let text = metrics.render().expect("the metrics encode");
        assert!(
            text.contains("valkey_operator_watch_restarts_total{watch=\"pods\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("valkey_operator_watch_broken_seconds{watch=\"services\"} 0"),
            "{text}"
        );
    }

    #[test]
    fn not_ready_before_the_api_answers_and_after_stepping_down() {
        let health = Health::new();
        assert!(health.ready().is_err());
        health.api_answered();
        assert!(health.ready().is_ok());
        health.stepped_down();
        assert!(health.ready().is_err());
        health.api_answered();
        assert!(health.ready().is_ok());
    }
}
