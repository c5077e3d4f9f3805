//! Observe, decide, act: the failover step of a reconcile.
//!
//! Observe: every pod of the instance is asked `INFO replication` directly (pod IP, port 6379)
//! as the operator's own ACL user, its node is looked up, and what the operator remembers
//! (since when a pod has been silent, whether a replica ever synced, whether the primary had
//! data) is added. Decide: [`failover::decide`], pure. Act, in the order that never leaves two
//! primaries behind the read-write Service: the role label off the old primary, `REPLICAOF NO
//! ONE` on the candidate, then (in the rest of the reconcile) the ConfigMap key `primary` and
//! the role label on the candidate, then the other pods pointed at it.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::future::join_all;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use tracing::{debug, info, warn};

use super::rollout::Revisions;
use super::{Context, Error, pod_gone_or_replaced};
use crate::api::names::{self, FIELD_MANAGER, SWITCHOVER_ANNOTATION, labels, roles};
use crate::api::{LastFailover, Valkey};
use crate::desired::{PORT, pod_host};
use crate::failover::{self, Action, Fact, Observation, PodObservation, Reason, Replication};
use crate::replication::{Conn, Info, Role, Target};
use crate::rollout::{self, Step};
use crate::status;

/// Bound on connecting to a pod and on each of its answers.
pub const POD_TIMEOUT: Duration = Duration::from_secs(1);
/// How long Valkey's `FAILOVER` may pause writers while the target catches up.
pub const SWITCHOVER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the writes of a primary that still answers are held while a replica takes over: an
/// upper bound, the clients are killed as soon as the new primary is followed.
const QUIESCE_PAUSE: Duration = Duration::from_secs(10);
/// How long the candidate may take to catch up with a paused primary before it is promoted anyway.
const QUIESCE_CATCH_UP: Duration = Duration::from_secs(2);
/// How soon a rolling update looks again at a restarted replica that is Ready but not yet in
/// sync (its catching up changes nothing the operator watches).
const ROLLOUT_SYNC_POLL: Duration = Duration::from_secs(1);

/// What the operator remembers between reconciles (and shares with its health loop): per pod,
/// since when it has been silent, whether it ever completed a sync, how many keys it held; per
/// instance, how to reach its primary.
#[derive(Default)]
pub struct Memory {
    pods: Mutex<HashMap<(String, String), PodMemory>>,
    primaries: Mutex<HashMap<(String, String), PrimaryTarget>>,
    /// Pods that did not answer the last reconcile, by (namespace, instance): the health loop
    /// asks them too, so one coming back (an old primary after a hang) is repointed at once.
    silent: Mutex<HashMap<(String, String), Vec<PrimaryTarget>>>,
}

#[derive(Clone, Debug, Default)]
struct PodMemory {
    uid: String,
    silent_since: Option<Instant>,
    synced: bool,
    keys: Option<u64>,
}

/// The primary of one instance, for the health loop's PING.
#[derive(Clone)]
pub struct PrimaryTarget {
    pub pod: String,
    pub uid: String,
    pub target: Target,
}

impl fmt::Debug for PrimaryTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrimaryTarget")
            .field("pod", &self.pod)
            .field("uid", &self.uid)
            .field("target", &self.target)
            .finish()
    }
}

impl Memory {
    fn with_pod<T>(
        &self,
        namespace: &str,
        pod: &str,
        uid: &str,
        f: impl FnOnce(&mut PodMemory) -> T,
    ) -> T {
        let mut pods = self.pods.lock().unwrap_or_else(|p| p.into_inner());
        let entry = pods
            .entry((namespace.to_owned(), pod.to_owned()))
            .or_default();
        if entry.uid != uid {
            // Another pod of the same name: it remembers nothing of its namesake.
            *entry = PodMemory {
                uid: uid.to_owned(),
                ..PodMemory::default()
            };
        }
        f(entry)
    }

    /// The pod answered: it is not silent; remember whether it synced and its keys.
    fn answered(&self, namespace: &str, pod: &str, uid: &str, info: &Info) -> PodMemory {
        self.with_pod(namespace, pod, uid, |m| {
            m.silent_since = None;
            m.synced |= info.has_synced();
            m.keys = Some(info.keys);
            m.clone()
        })
    }

    /// The pod did not answer at `now`: how long it has been silent.
    fn silent(&self, namespace: &str, pod: &str, uid: &str, now: Instant) -> PodMemory {
        self.with_pod(namespace, pod, uid, |m| {
            m.silent_since.get_or_insert(now);
            m.clone()
        })
    }

    /// The health loop's verdict on a primary: answered or not, at `now`. Returns whether this
    /// changes what the operator knew (it stopped or resumed answering), so a reconcile should
    /// look; a primary that stays silent triggers nothing more (the reconcile that saw it
    /// first looks again once failoverDelay is up).
    pub fn ping_result(
        &self,
        namespace: &str,
        target: &PrimaryTarget,
        answered: bool,
        now: Instant,
    ) -> bool {
        self.with_pod(namespace, &target.pod, &target.uid, |m| {
            match (answered, m.silent_since) {
                (true, Some(_)) => {
                    m.silent_since = None;
                    true
                }
                (false, None) => {
                    m.silent_since = Some(now);
                    true
                }
                (true, None) | (false, Some(_)) => false,
            }
        })
    }

    /// Every instance's primary, for the health loop.
    pub fn primaries(&self) -> Vec<((String, String), PrimaryTarget)> {
        self.primaries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    fn set_primary(&self, namespace: &str, instance: &str, target: Option<PrimaryTarget>) {
        let mut primaries = self.primaries.lock().unwrap_or_else(|p| p.into_inner());
        let key = (namespace.to_owned(), instance.to_owned());
        match target {
            Some(t) => primaries.insert(key, t),
            None => primaries.remove(&key),
        };
    }

    /// Every silent pod, by instance, for the health loop.
    pub fn silent_pods(&self) -> Vec<((String, String), PrimaryTarget)> {
        self.silent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .flat_map(|(k, v)| v.iter().map(move |t| (k.clone(), t.clone())))
            .collect()
    }

    /// A silent pod answered the health loop: the reconcile it triggers takes it from here.
    pub fn answered_again(&self, namespace: &str, instance: &str, pod: &str) {
        let mut silent = self.silent.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = silent.get_mut(&(namespace.to_owned(), instance.to_owned())) {
            v.retain(|t| t.pod != pod);
        }
    }

    fn set_silent(&self, namespace: &str, instance: &str, targets: Vec<PrimaryTarget>) {
        let mut silent = self.silent.lock().unwrap_or_else(|p| p.into_inner());
        let key = (namespace.to_owned(), instance.to_owned());
        if targets.is_empty() {
            silent.remove(&key);
        } else {
            silent.insert(key, targets);
        }
    }

    /// Forgets an instance (deleted, or stopped).
    pub fn forget(&self, namespace: &str, instance: &str) {
        self.set_primary(namespace, instance, None);
        self.set_silent(namespace, instance, Vec::new());
        let mut pods = self.pods.lock().unwrap_or_else(|p| p.into_inner());
        pods.retain(|(ns, pod), _| ns != namespace || names::pod_ordinal(instance, pod).is_none());
    }
}

/// What the failover step found and did.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The primary to record (the ConfigMap key, the role labels): the old one, or the
    /// promoted pod.
    pub primary: String,
    /// The recorded primary answers as a primary (`None`: the operator could not ask it).
    pub primary_answers: Option<bool>,
    /// A move of the primary role that this reconcile made.
    pub failover: Option<LastFailover>,
    /// Events to publish: (warning?, reason, note).
    pub events: Vec<(bool, &'static str, String)>,
    /// Look again after this long (a failing primary within failoverDelay).
    pub requeue_after: Option<Duration>,
    /// A fact in words for the status (no candidate, ...).
    pub fact: Option<String>,
    /// The switchover annotation was handled and must be removed.
    pub switchover_done: bool,
    /// The pod the rolling update restarts next (`rollout::next_step`), once the StatefulSet
    /// is applied.
    pub restart: Option<String>,
    /// The primary answers as one and a replica has synced from it: from now on the instance's
    /// data lives on, and the boot guard is armed.
    replica_synced: bool,
    /// Connections to the pods that answered, by pod name, with their IPs.
    conns: HashMap<String, (Conn, String)>,
    /// Pods to point at the primary once it is recorded and labelled.
    repoint: Vec<String>,
    /// Old primaries to fence (clients killed) once repointed.
    fence: Vec<String>,
    started: Option<Instant>,
}

impl Outcome {
    /// `to` is the primary now: every other pod that answered (the old primary included)
    /// follows it by its DNS name, and the move is recorded.
    fn moved(&mut self, from: Option<String>, to: &str, reason: Reason, started: Instant) {
        self.primary = to.to_owned();
        self.primary_answers = Some(true);
        self.repoint = self.conns.keys().filter(|p| *p != to).cloned().collect();
        self.started = Some(started);
        self.failover = Some(move_record(from, to, reason));
    }

    /// Whether the instance has run with a primary and a synced replica (the boot guard's fact).
    pub fn initialized(&self) -> bool {
        self.primary_answers == Some(true) && self.replica_synced
    }
}

/// Runs observe and decide, and the first half of the action (before the ConfigMap and labels).
pub async fn run(
    ctx: &Context,
    valkey: &Valkey,
    namespace: &str,
    pods: &[Pod],
    revisions: &Revisions<'_>,
    recorded: &str,
    operator_password: &str,
) -> Result<Outcome, Error> {
    let instance = valkey.name_any();
    let mut outcome = Outcome {
        primary: recorded.to_owned(),
        ..Outcome::default()
    };
    let (observation, conns) = observe(
        ctx,
        valkey,
        namespace,
        pods,
        revisions,
        recorded,
        operator_password,
    )
    .await;
    outcome.conns = conns;
    outcome.primary_answers = observation
        .pods
        .iter()
        .find(|p| p.name == recorded && p.reachable)
        .and_then(|p| p.replication.as_ref())
        .map(|r| r.role == failover::Role::Primary);
    outcome.replica_synced = observation.pods.iter().any(|p| {
        p.name != recorded
            && p.reachable
            && p.replication
                .as_ref()
                .is_some_and(|r| r.role == failover::Role::Replica && r.synced)
    });
    let action = failover::decide(&observation);
    debug!(valkey = %instance, ?action, "failover decision");
    match action {
        Action::Nothing => roll(ctx, namespace, pods, &mut outcome, &observation).await?,
        Action::Report(fact) => report(&mut outcome, valkey, &observation, fact),
        Action::Repoint { pods, primary } => {
            // A second primary (an old one back, or one promoted by an operator that died
            // before recording it) drops its clients once it follows.
            outcome.fence = observation
                .pods
                .iter()
                .filter(|p| pods.contains(&p.name))
                .filter(|p| {
                    p.replication
                        .as_ref()
                        .is_some_and(|r| r.role == failover::Role::Primary)
                })
                .map(|p| p.name.clone())
                .collect();
            for stray in &outcome.fence {
                let note = format!(
                    "{stray} answered as a primary, but {primary} is the recorded one: {stray} now follows {primary} and its clients were disconnected"
                );
                warn!("{note}");
                outcome.events.push((true, "StrayPrimaryRepointed", note));
            }
            outcome.repoint = pods;
        }
        Action::Promote {
            from,
            candidate,
            reason,
        } => {
            promote(ctx, namespace, pods, &mut outcome, from, &candidate, reason).await?;
        }
        Action::Switchover { from, to } => {
            outcome.switchover_done = observation.switchover.is_some();
            let reason = Reason::Switchover;
            switchover(ctx, namespace, pods, &mut outcome, &from, &to, reason).await?;
        }
    }
    if outcome.failover.is_none()
        && let Some(record) = untold_move(valkey, Some(recorded))
    {
        let note = format!(
            "{} is the primary (was {}): recorded by an operator that stopped before telling it",
            record.to,
            record.from.as_deref().unwrap_or("unknown")
        );
        info!("{note}");
        outcome.events.push((false, "PrimaryPromoted", note));
        outcome.failover = Some(record);
    }
    if observation.switchover.is_some() && outcome.failover.is_none() {
        outcome.switchover_done = true;
    }
    // The health loop PINGs the primary as recorded now.
    let target = pods
        .iter()
        .find(|p| p.name_any() == outcome.primary && p.metadata.deletion_timestamp.is_none())
        .and_then(|p| {
            let ip = p.status.as_ref()?.pod_ip.clone()?;
            Some(PrimaryTarget {
                pod: outcome.primary.clone(),
                uid: p.metadata.uid.clone().unwrap_or_default(),
                target: Target::operator(ip, port(), operator_password, POD_TIMEOUT),
            })
        });
    ctx.memory.set_primary(namespace, &instance, target);
    let silent = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.name_any() != outcome.primary && !outcome.conns.contains_key(&p.name_any()))
        .filter_map(|p| {
            let ip = p.status.as_ref()?.pod_ip.clone()?;
            Some(PrimaryTarget {
                pod: p.name_any(),
                uid: p.metadata.uid.clone().unwrap_or_default(),
                target: Target::operator(ip, port(), operator_password, POD_TIMEOUT),
            })
        })
        .collect();
    ctx.memory.set_silent(namespace, &instance, silent);
    Ok(outcome)
}

fn port() -> u16 {
    u16::try_from(PORT).unwrap_or(6379)
}

fn report(outcome: &mut Outcome, valkey: &Valkey, observation: &Observation, fact: Fact) {
    let recorded = observation.recorded_primary.clone().unwrap_or_default();
    match fact {
        Fact::Waiting { reason, remaining } => {
            info!(primary = %recorded, %reason, ?remaining, "the primary is failing; waiting for failoverDelay");
            // A little past the delay, so the next look finds it elapsed.
            outcome.requeue_after = Some(remaining + Duration::from_millis(100));
        }
        Fact::NoCandidate { reason } => {
            let note = format!(
                "the primary {recorded} has failed ({reason}) but no replica can take over: none answers the operator, in sync, with the data"
            );
            // A new instance whose replicas have not synced yet has nothing to fail over to,
            // and nothing to tell.
            let ever_synced = observation
                .pods
                .iter()
                .any(|p| p.name != recorded && p.replication.as_ref().is_some_and(|r| r.synced));
            if !ever_synced && !observation.primary_had_data {
                return;
            }
            // Every pod going at once (the StatefulSet deleted, the namespace going): nothing
            // failed that a replica could take over from; the StatefulSet brings them back.
            let all_going = observation
                .pods
                .iter()
                .all(|p| p.name == recorded || p.terminating);
            if all_going && matches!(reason, Reason::PodTerminating | Reason::PodDeleted) {
                return;
            }
            // Told once (the status keeps saying it), not at every look.
            let told = valkey
                .status
                .as_ref()
                .is_some_and(|s| s.conditions.iter().any(|c| c.message.contains(&note)));
            if !told {
                warn!("{note}");
                outcome
                    .events
                    .push((true, "NoFailoverCandidate", note.clone()));
            }
            outcome.fact = Some(note);
            // Pod events bring it back here when a replica returns; this is a safety net.
            outcome.requeue_after = Some(Duration::from_secs(30));
        }
        Fact::SwitchoverRefused { why } => {
            let note = format!("switchover refused: {why}");
            warn!("{note}");
            outcome.events.push((true, "SwitchoverRefused", note));
        }
        Fact::HandoverPending { why } => {
            // Usually a replica still syncing; pod events bring the reconcile back sooner.
            info!("{why}");
            outcome.fact = Some(why);
            outcome.requeue_after = Some(Duration::from_secs(2));
        }
    }
}

/// Step 1 and 2 of a failover: the role label off the old primary, `REPLICAOF NO ONE` on the
/// candidate.
async fn promote(
    ctx: &Context,
    namespace: &str,
    pods: &[Pod],
    outcome: &mut Outcome,
    from: Option<String>,
    candidate: &str,
    reason: Reason,
) -> Result<(), Error> {
    let started = Instant::now();
    let note = format!(
        "primary {} failed ({reason}); promoting {candidate}",
        from.as_deref().unwrap_or("unknown")
    );
    info!("{note}");
    // A primary deleted on purpose (a rollout, a drain, kubectl delete) is routine; a primary
    // that failed is worth a Warning.
    let warning = !matches!(reason, Reason::PodDeleted | Reason::PodTerminating);
    outcome.events.push((warning, "FailoverStarted", note));
    let pod_api = Api::<Pod>::namespaced(ctx.client.clone(), namespace);
    if let Some(old) = from
        .as_deref()
        .and_then(|f| pods.iter().find(|p| p.name_any() == f))
    {
        set_role(&pod_api, old, roles::REPLICA).await?;
    }
    let Some((conn, _)) = outcome.conns.get(candidate) else {
        // Decided from an answer, so it answered a moment ago.
        return Err(Error::Failover(format!(
            "the candidate {candidate} did not answer the operator any more"
        )));
    };
    if let Some((old, _)) = from.as_deref().and_then(|f| outcome.conns.get(f)) {
        quiesce(old, conn, candidate).await;
    }
    conn.promote()
        .await
        .map_err(|e| Error::Failover(format!("REPLICAOF NO ONE on {candidate} failed: {e}")))?;
    outcome.fence.extend(from.clone());
    outcome.moved(from, candidate, reason, started);
    Ok(())
}

/// A move of the primary role recorded in the ConfigMap (`recorded`) but never told: the
/// status's last move (or, before any, pod 0, where every instance starts) names another pod.
/// That is an operator that stopped between the ConfigMap and the status and events; the next
/// reconcile tells it. A record pointing outside `spec.replicas` (scaled away) is no such move.
pub fn untold_move(valkey: &Valkey, recorded: Option<&str>) -> Option<LastFailover> {
    let instance = valkey.name_any();
    let in_range =
        |p: &str| names::pod_ordinal(&instance, p).is_some_and(|o| o < valkey.spec.replicas);
    let recorded = recorded.filter(|p| in_range(p))?;
    let told = valkey
        .status
        .as_ref()
        .and_then(|s| s.last_failover.as_ref())
        .map(|f| f.to.clone())
        .filter(|p| in_range(p))
        .unwrap_or_else(|| names::ObjectNames::new(&instance).pod(0));
    (told != recorded).then(|| move_record(Some(told), recorded, Reason::Resumed))
}

/// The record of a move of the primary role made now (its duration is filled in by `finish`).
fn move_record(from: Option<String>, to: &str, reason: Reason) -> LastFailover {
    LastFailover {
        from,
        to: to.to_owned(),
        reason: reason.as_str().to_owned(),
        time: Time(k8s_openapi::jiff::Timestamp::now()),
        duration: String::new(),
    }
}

/// A primary that still answers (its pod being deleted, a rollout) still acknowledges writes,
/// and its other replicas still receive them: promoting meanwhile would lose those writes when
/// the replicas follow the new primary. So its writers are paused first (the pause ends when
/// `finish` kills its clients, or after [`QUIESCE_PAUSE`]) and the candidate is let catch up
/// with what it has, for at most [`QUIESCE_CATCH_UP`]. A primary that cannot be paused (it is
/// shutting down) takes no more writes anyway.
async fn quiesce(old: &Conn, candidate: &Conn, name: &str) {
    if let Err(e) = old.pause_writes(QUIESCE_PAUSE).await {
        debug!(error = %e, "the old primary could not be paused");
        return;
    }
    let Ok(target) = old.info().await.map(|i| i.offset) else {
        return;
    };
    let deadline = Instant::now() + QUIESCE_CATCH_UP;
    loop {
        match candidate.info().await {
            Ok(info) if info.offset >= target => return,
            _ if Instant::now() >= deadline => {
                warn!(candidate = %name, offset = target, "the candidate did not catch up with the paused primary in time; promoting it anyway");
                return;
            }
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// A planned switchover: Valkey's own `FAILOVER TO` on the primary, then (once the target
/// answers as primary) the same recording as a failover.
async fn switchover(
    ctx: &Context,
    namespace: &str,
    pods: &[Pod],
    outcome: &mut Outcome,
    from: &str,
    to: &str,
    reason: Reason,
) -> Result<(), Error> {
    let started = Instant::now();
    let (Some((primary, _)), Some((target, target_ip))) =
        (outcome.conns.get(from), outcome.conns.get(to))
    else {
        return Err(Error::Failover(format!(
            "switchover {from} -> {to}: a pod stopped answering"
        )));
    };
    let note = match reason {
        Reason::Rollout => format!(
            "planned switchover from {from} to {to}: the rolling update restarts the primary's pod last"
        ),
        _ => format!("planned switchover from {from} to {to}"),
    };
    info!("{note}");
    outcome.events.push((false, "FailoverStarted", note));
    // The primary names its replicas by IP, so FAILOVER TO takes the target's IP.
    match primary
        .failover_to(target_ip, port(), SWITCHOVER_TIMEOUT)
        .await
        .map_err(|e| Error::Failover(format!("FAILOVER on {from} failed: {e}")))?
    {
        crate::replication::FailoverStarted::Started => {}
        crate::replication::FailoverStarted::Refused(why) => {
            let note = format!("switchover refused by {from}: {why}");
            warn!("{note}");
            outcome.events.push((true, "SwitchoverRefused", note));
            return Ok(());
        }
    }
    // Valkey swaps the roles once the target caught up (writers are paused meanwhile).
    let deadline = Instant::now() + SWITCHOVER_TIMEOUT + Duration::from_secs(2);
    loop {
        if let Ok(info) = target.info().await
            && info.role == Some(Role::Primary)
        {
            break;
        }
        if Instant::now() > deadline {
            let note = format!(
                "switchover from {from} to {to} did not complete within {SWITCHOVER_TIMEOUT:?}; {from} stays the primary"
            );
            warn!("{note}");
            outcome.events.push((true, "SwitchoverFailed", note));
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pod_api = Api::<Pod>::namespaced(ctx.client.clone(), namespace);
    if let Some(old) = pods.iter().find(|p| p.name_any() == from) {
        set_role(&pod_api, old, roles::REPLICA).await?;
    }
    outcome.moved(Some(from.to_owned()), to, reason, started);
    Ok(())
}

/// The failover decision found nothing to do: the rolling update, if one is under way, takes
/// its next step (a restart is carried out after the StatefulSet is applied).
async fn roll(
    ctx: &Context,
    namespace: &str,
    pods: &[Pod],
    outcome: &mut Outcome,
    observation: &Observation,
) -> Result<(), Error> {
    match rollout::next_step(observation) {
        Step::Done => {}
        Step::Wait { why } => debug!(%why, "rolling update waits"),
        Step::WaitForSync { pod } => {
            debug!(%pod, "rolling update waits for the pod to catch up with the primary");
            outcome.requeue_after = Some(ROLLOUT_SYNC_POLL);
        }
        Step::Restart { pod } => outcome.restart = Some(pod),
        Step::HandOver { from, to } => {
            switchover(ctx, namespace, pods, outcome, &from, &to, Reason::Rollout).await?;
        }
    }
    Ok(())
}

/// After the ConfigMap and the role labels: point the other pods at the primary, fence the old
/// primary's clients, and finish the record (its duration, the PrimaryPromoted event).
pub async fn finish(valkey: &Valkey, namespace: &str, outcome: &mut Outcome) {
    let host = pod_host(&valkey.name_any(), namespace, &outcome.primary);
    for pod in std::mem::take(&mut outcome.repoint) {
        let Some((conn, _)) = outcome.conns.get(&pod) else {
            continue;
        };
        match conn.replicate_from(&host, port()).await {
            Ok(()) => info!(%pod, primary = %outcome.primary, "pointed at the primary"),
            Err(e) => warn!(%pod, error = %e, "could not point the pod at the primary"),
        }
        if outcome.fence.contains(&pod) {
            // Its clients may still hold connections that a restart would not have dropped.
            match conn.kill_normal_clients().await {
                Ok(n) => info!(%pod, clients = n, "closed the old primary's client connections"),
                Err(e) => warn!(%pod, error = %e, "could not close the old primary's clients"),
            }
        }
    }
    if let (Some(record), Some(started)) = (outcome.failover.as_mut(), outcome.started) {
        let took = started.elapsed();
        record.duration = format!("{}ms", took.as_millis());
        let note = format!(
            "{} is the primary ({}, was {}) after {}",
            record.to,
            record.reason,
            record.from.as_deref().unwrap_or("unknown"),
            record.duration
        );
        info!("{note}");
        outcome.events.push((false, "PrimaryPromoted", note));
    }
}

/// Whether the failover took `took` to finish, for metrics.
pub fn took(outcome: &Outcome) -> Option<Duration> {
    outcome.started.map(|s| s.elapsed())
}

async fn set_role(pods: &Api<Pod>, pod: &Pod, role: &str) -> Result<(), Error> {
    if pod.labels().get(labels::ROLE).map(String::as_str) == Some(role) {
        return Ok(());
    }
    let patch = json!({"metadata": {"uid": pod.metadata.uid, "labels": {labels::ROLE: role}}});
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    match pods
        .patch(&pod.name_any(), &params, &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if pod_gone_or_replaced(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Everything the decision needs, and a connection to every pod that answered.
async fn observe(
    ctx: &Context,
    valkey: &Valkey,
    namespace: &str,
    pods: &[Pod],
    revisions: &Revisions<'_>,
    recorded: &str,
    operator_password: &str,
) -> (Observation, HashMap<String, (Conn, String)>) {
    let now = Instant::now();
    let instance = valkey.name_any();
    let nodes = node_facts(ctx, pods).await;
    // Terminating pods are asked too: never a candidate, but a primary being deleted may still
    // take writes until it is quiesced (see `quiesce`), and it is repointed and fenced after.
    let asked = join_all(pods.iter().map(|pod| async move {
        let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone())?;
        let target = Target::operator(ip.clone(), port(), operator_password, POD_TIMEOUT);
        let conn = Conn::open(&target).await.ok()?;
        let info = conn.info().await.ok()?;
        Some((conn, ip, info))
    }))
    .await;
    let mut conns = HashMap::new();
    let mut observed = Vec::new();
    let mut primary_had_data = false;
    for (pod, asked) in pods.iter().zip(asked) {
        let name = pod.name_any();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let Some(ordinal) = names::pod_ordinal(&instance, &name) else {
            continue;
        };
        let (node_ready, node_unreachable) = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .and_then(|n| nodes.get(n).copied())
            .unwrap_or((None, false));
        // The valkey container's readiness, not the pod's: a failing metrics sidecar makes the
        // pod NotReady, which is no reason to move the primary.
        let ready = status::valkey_ready(pod);
        let (memory, replication) = match &asked {
            Some((_, _, info)) => {
                let memory = ctx.memory.answered(namespace, &name, &uid, info);
                (memory, Some(replication(info)))
            }
            None => (ctx.memory.silent(namespace, &name, &uid, now), None),
        };
        if name == recorded {
            primary_had_data = memory.keys.is_some_and(|k| k > 0);
        }
        let silent_for = memory
            .silent_since
            .map(|s| now.saturating_duration_since(s))
            .unwrap_or_default();
        let not_ready_for = if ready {
            Duration::ZERO
        } else {
            not_ready_for(pod)
        };
        let synced = memory.synced;
        observed.push(PodObservation {
            name: name.clone(),
            ordinal,
            terminating: pod.metadata.deletion_timestamp.is_some(),
            node_ready,
            node_unreachable,
            ready,
            reachable: asked.is_some(),
            failing_for: silent_for.max(not_ready_for),
            replication: replication.map(|r| Replication { synced, ..r }),
            outdated: revisions.outdated(pod),
        });
        if let Some((conn, ip, _)) = asked {
            conns.insert(name, (conn, ip));
        }
    }
    let switchover = match valkey.annotations().get(SWITCHOVER_ANNOTATION) {
        // The controller's cache may still hold a request already acted on (its removal not
        // seen yet): only the API server's current copy counts, or a switchover would run twice.
        Some(_) => Api::<Valkey>::namespaced(ctx.client.clone(), namespace)
            .get_opt(&instance)
            .await
            .ok()
            .flatten()
            .and_then(|fresh| fresh.annotations().get(SWITCHOVER_ANNOTATION).cloned())
            .map(|to| failover::Switchover {
                to: Some(to.trim().to_owned()).filter(|t| !t.is_empty()),
            }),
        None => None,
    };
    (
        Observation {
            replicas: valkey.spec.replicas,
            failover_delay: valkey.spec.failover_delay(),
            recorded_primary: Some(recorded.to_owned()),
            pods: observed,
            switchover,
            primary_had_data,
            template_pending: revisions.pending(),
        },
        conns,
    )
}

fn replication(info: &Info) -> Replication {
    Replication {
        role: match info.role {
            Some(Role::Replica) => failover::Role::Replica,
            _ => failover::Role::Primary,
        },
        primary_host: info.primary_host.clone(),
        link_up: info.link_up,
        synced: info.has_synced(),
        offset: info.offset,
        keys: info.keys,
    }
}

/// How long the pod's Ready condition has been False (from its transition time), counting
/// only readiness lost by a running server: a container that has not been Ready since it
/// (re)started is starting, and only its silence towards the operator counts.
fn not_ready_for(pod: &Pod) -> Duration {
    let status = pod.status.as_ref();
    let since = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready" && c.status != "True"))
        .and_then(|c| c.last_transition_time.as_ref());
    let Some(since) = since else {
        return Duration::ZERO;
    };
    let started = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == crate::desired::CONTAINER))
        .and_then(|c| c.state.as_ref()?.running.as_ref()?.started_at.as_ref());
    match started {
        Some(started) if started.0 >= since.0 => return Duration::ZERO,
        // Not running at all: the kubelet's word is all there is.
        _ => {}
    }
    let now = k8s_openapi::jiff::Timestamp::now();
    let elapsed = now.duration_since(since.0);
    Duration::try_from(elapsed).unwrap_or_default()
}

/// Per node of the pods: (Ready, tainted unreachable). A node the operator cannot read is
/// unknown, never "failed".
async fn node_facts(ctx: &Context, pods: &[Pod]) -> HashMap<String, (Option<bool>, bool)> {
    let mut names: Vec<String> = pods
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    names.sort();
    names.dedup();
    let api = Api::<Node>::all(ctx.client.clone());
    let got = join_all(names.iter().map(|n| api.get_opt(n))).await;
    names
        .into_iter()
        .zip(got)
        .filter_map(|(name, node)| {
            let node = match node {
                Ok(Some(node)) => node,
                Ok(None) => return Some((name, (Some(false), false))),
                Err(e) => {
                    debug!(node = %name, error = %e, "cannot read the node");
                    return None;
                }
            };
            let ready = node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
                .map(|c| c.status == "True");
            let unreachable = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|ts| ts.iter().any(|t| t.key == "node.kubernetes.io/unreachable"));
            Some((name, (ready, unreachable)))
        })
        .collect()
}

/// Keeps the fencing of the running primary in line with the spec, lowered to the replicas
/// that can acknowledge its writes (reachable, following it): a two-pod instance that just
/// failed over keeps taking writes while its other pod is away. A primary the operator cannot
/// reach keeps whatever it has, so a primary cut off from everyone stays fenced.
pub async fn fence(valkey: &Valkey, outcome: &Outcome) {
    let Some((conn, _)) = outcome.conns.get(&outcome.primary) else {
        return;
    };
    let followers = outcome
        .conns
        .keys()
        .filter(|p| p.as_str() != outcome.primary)
        .filter(|p| {
            names::pod_ordinal(&valkey.name_any(), p).is_some_and(|o| o < valkey.spec.replicas)
        })
        .count();
    let want = valkey
        .spec
        .min_replicas_to_write()
        .min(i32::try_from(followers).unwrap_or(i32::MAX))
        .to_string();
    match conn.config_get("min-replicas-to-write").await {
        Ok(Some(have)) if have == want => {}
        Ok(_) => match conn.config_set("min-replicas-to-write", &want).await {
            Ok(()) => {
                info!(primary = %outcome.primary, min_replicas_to_write = %want, "fencing set")
            }
            Err(e) => warn!(primary = %outcome.primary, error = %e, "could not set fencing"),
        },
        Err(e) => debug!(primary = %outcome.primary, error = %e, "could not read fencing"),
    }
}

#[cfg(test)]
mod tests {
    use super::untold_move;
    use crate::api::Valkey;

    fn valkey(replicas: i32, last_to: Option<&str>) -> Valkey {
        let mut v: Valkey = serde_json::from_value(serde_json::json!({
            "apiVersion": "database.kuberly.io/v1alpha1", "kind": "Valkey",
            "metadata": {"name": "cache", "namespace": "ns"},
            "spec": {"replicas": replicas},
        }))
        .expect("a Valkey");
        if let Some(to) = last_to {
            v.status = Some(
                serde_json::from_value(serde_json::json!({
                    "lastFailover": {"from": "cache-9", "to": to, "reason": "PodDeleted",
                        "time": "2026-12-01T00:00:00Z", "duration": "100ms"},
                }))
                .expect("a status"),
            );
        }
        v
    }

    #[test]
    fn a_recorded_primary_nobody_told_is_told_once() {
        // Never moved: pod 0 is where every instance starts.
        assert!(untold_move(&valkey(3, None), Some("cache-0")).is_none());
        // Moved to cache-1 by an operator that stopped before telling.
        let told = untold_move(&valkey(3, None), Some("cache-1")).expect("a move to tell");
        assert_eq!(
            (told.from.as_deref(), told.to.as_str()),
            (Some("cache-0"), "cache-1")
        );
        assert_eq!(told.reason, "Resumed");
        // Told already.
        assert!(untold_move(&valkey(3, Some("cache-1")), Some("cache-1")).is_none());
        // Moved again after a told move.
        let again = untold_move(&valkey(3, Some("cache-1")), Some("cache-2")).expect("a move");
        assert_eq!(again.from.as_deref(), Some("cache-1"));
        // A record outside spec.replicas (scaled away) is no move; nor is a told pod scaled away.
        assert!(untold_move(&valkey(1, None), Some("cache-2")).is_none());
        assert!(untold_move(&valkey(1, Some("cache-2")), Some("cache-0")).is_none());
    }
}
