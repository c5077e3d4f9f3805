//! The decision: observations in, one action out.
//!
//! The primary has failed when its pod is gone or terminating, its node is NotReady or
//! unreachable, or it has been NotReady or silent towards the operator for at least
//! `failoverDelay`, or it answers but no longer as a primary, while a replica answers. The
//! candidate is the answering replica with the greatest replication offset that has completed
//! a sync; a replica that never synced, or whose dataset is empty while the old primary had
//! data, is never promoted; ties go to the lowest ordinal. A pod the operator cannot reach is a
//! fact to report, never a reason to act on its own. A scale-down that would remove the
//! primary's pod first hands the role over (a planned switchover) to a pod that stays.

use std::time::Duration;

use serde::Deserialize;

/// What the operator saw of one instance, at one moment.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Observation {
    /// `spec.replicas`.
    pub replicas: i32,
    /// `spec.failoverDelay`.
    #[serde(default, with = "millis")]
    pub failover_delay: Duration,
    /// The pod recorded as primary (the ConfigMap key `primary`): the only one the read-write
    /// Service may select.
    pub recorded_primary: Option<String>,
    /// The instance's pods that exist (StatefulSet ordinals below `replicas` and above).
    #[serde(default)]
    pub pods: Vec<PodObservation>,
    /// A planned switchover was asked for.
    #[serde(default)]
    pub switchover: Option<Switchover>,
    /// The recorded primary's dataset had keys when last seen (so an empty replica is no
    /// candidate).
    #[serde(default)]
    pub primary_had_data: bool,
    /// The StatefulSet has not yet seen its newest spec, so which pods run an old pod template
    /// is not known (see `rollout`).
    #[serde(default)]
    pub template_pending: bool,
}

/// A planned switchover: to the named pod, or to the best replica.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Switchover {
    #[serde(default)]
    pub to: Option<String>,
}

/// One pod as the operator saw it.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodObservation {
    pub name: String,
    /// StatefulSet ordinal.
    pub ordinal: i32,
    /// Has a deletion timestamp.
    #[serde(default)]
    pub terminating: bool,
    /// Its node is Ready (`None` when not scheduled or unknown).
    #[serde(default)]
    pub node_ready: Option<bool>,
    /// Its node carries the `node.kubernetes.io/unreachable` taint.
    #[serde(default)]
    pub node_unreachable: bool,
    /// The kubelet says Ready.
    #[serde(default)]
    pub ready: bool,
    /// Answered the operator's last PING / INFO.
    #[serde(default)]
    pub reachable: bool,
    /// How long it has been NotReady or silent without a break (zero while healthy).
    #[serde(default, with = "millis")]
    pub failing_for: Duration,
    /// INFO replication, when it answered.
    #[serde(default)]
    pub replication: Option<Replication>,
    /// Runs an older pod template than the StatefulSet's newest (a rolling update will restart
    /// it, see `rollout`).
    #[serde(default)]
    pub outdated: bool,
}

/// What a pod's `INFO replication` (and `INFO keyspace`) said.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Replication {
    pub role: Role,
    /// `master_host` of a replica.
    #[serde(default)]
    pub primary_host: Option<String>,
    /// `master_link_status:up`.
    #[serde(default)]
    pub link_up: bool,
    /// Has completed a sync with a primary since it started (the operator remembers having seen
    /// its link up, or its offset shows it received a replication stream).
    #[serde(default)]
    pub synced: bool,
    /// `slave_repl_offset` of a replica, `master_repl_offset` of a primary.
    #[serde(default)]
    pub offset: i64,
    /// Keys in its dataset.
    #[serde(default)]
    pub keys: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    #[default]
    Primary,
    Replica,
}

/// Why the primary role moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize)]
pub enum Reason {
    /// The primary's pod does not exist.
    PodDeleted,
    /// The primary's pod is being deleted.
    PodTerminating,
    /// The primary's node is NotReady.
    NodeNotReady,
    /// The primary's node is tainted unreachable.
    NodeUnreachable,
    /// The kubelet has said NotReady for `failoverDelay`.
    PodNotReady,
    /// The primary has not answered the operator for `failoverDelay`.
    Unreachable,
    /// The recorded primary answers as a replica.
    NotPrimary,
    /// A planned switchover was asked for.
    Switchover,
    /// A rolling update hands the role over before it restarts the primary's pod.
    Rollout,
    /// Recorded by an operator that stopped before it could tell (status, events): told by the
    /// next one.
    Resumed,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::PodDeleted => "PodDeleted",
            Reason::PodTerminating => "PodTerminating",
            Reason::NodeNotReady => "NodeNotReady",
            Reason::NodeUnreachable => "NodeUnreachable",
            Reason::PodNotReady => "PodNotReady",
            Reason::Unreachable => "Unreachable",
            Reason::NotPrimary => "NotPrimary",
            Reason::Switchover => "Switchover",
            Reason::Rollout => "Rollout",
            Reason::Resumed => "Resumed",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A fact worth telling (status, events, logs) that asks for no action.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", tag = "fact")]
pub enum Fact {
    /// The primary is failing but not yet for `failoverDelay`: look again after `remaining`.
    Waiting {
        reason: Reason,
        #[serde(with = "millis")]
        remaining: Duration,
    },
    /// The primary has failed and no replica can take over.
    NoCandidate { reason: Reason },
    /// A switchover was asked for, but the primary is not healthy or the target cannot take over.
    SwitchoverRefused { why: String },
    /// A scale-down would remove the primary's pod, and no pod that stays can take over yet.
    HandoverPending { why: String },
}

/// What the operator does next.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", tag = "action")]
pub enum Action {
    /// All is as recorded.
    Nothing,
    /// Make `candidate` the primary, in the order that never leaves two primaries behind the
    /// read-write Service.
    Promote {
        from: Option<String>,
        candidate: String,
        reason: Reason,
    },
    /// Point these pods (replicas following someone else, or an old primary back again) at the
    /// recorded primary.
    Repoint { pods: Vec<String>, primary: String },
    /// Hand the primary role over with Valkey's `FAILOVER TO`.
    Switchover { from: String, to: String },
    /// Tell, do not act.
    Report(Fact),
}

/// The one action the observation calls for.
pub fn decide(obs: &Observation) -> Action {
    let recorded_pod = obs
        .recorded_primary
        .as_deref()
        .and_then(|r| obs.pods.iter().find(|p| p.name == r));
    // A scale-down would remove the primary's pod (the StatefulSet keeps it until then).
    let leaving = recorded_pod.is_some_and(|p| p.ordinal >= obs.replicas);
    if obs.replicas <= 1 && !leaving {
        // A standalone instance has nobody to hand over to; the StatefulSet restarts its pod.
        return match &obs.switchover {
            Some(_) => Action::Report(Fact::SwitchoverRefused {
                why: "a standalone instance (spec.replicas: 1) has no replica to hand over to"
                    .into(),
            }),
            None => Action::Nothing,
        };
    }
    let Some(recorded) = obs.recorded_primary.as_deref() else {
        return Action::Nothing;
    };
    let primary = obs.pods.iter().find(|p| p.name == recorded);
    match failure(obs, primary) {
        Failure::Failed(reason) => match candidate(obs, recorded, None) {
            Some(c) => Action::Promote {
                from: Some(recorded.to_owned()),
                candidate: c.name.clone(),
                reason,
            },
            None => Action::Report(Fact::NoCandidate { reason }),
        },
        Failure::Waiting(reason, remaining) => {
            if obs.switchover.is_some() {
                return Action::Report(Fact::SwitchoverRefused {
                    why: format!("the primary {recorded} is not healthy ({reason})"),
                });
            }
            Action::Report(Fact::Waiting { reason, remaining })
        }
        Failure::Healthy => {
            if leaving {
                return hand_over_before_scale_down(obs, recorded);
            }
            if let Some(target) = &obs.switchover {
                return switchover(obs, recorded, target.to.as_deref());
            }
            let strays = strays(obs, recorded);
            if strays.is_empty() {
                Action::Nothing
            } else {
                Action::Repoint {
                    pods: strays,
                    primary: recorded.to_owned(),
                }
            }
        }
    }
}

enum Failure {
    Healthy,
    Waiting(Reason, Duration),
    Failed(Reason),
}

fn failure(obs: &Observation, primary: Option<&PodObservation>) -> Failure {
    let Some(p) = primary else {
        return Failure::Failed(Reason::PodDeleted);
    };
    if p.terminating {
        return Failure::Failed(Reason::PodTerminating);
    }
    if p.node_unreachable {
        return Failure::Failed(Reason::NodeUnreachable);
    }
    if p.node_ready == Some(false) {
        return Failure::Failed(Reason::NodeNotReady);
    }
    if let Some(r) = &p.replication
        && p.reachable
        && r.role == Role::Replica
    {
        // Someone demoted it (or it restarted as a replica): no pod takes writes.
        return Failure::Failed(Reason::NotPrimary);
    }
    let reason = if !p.reachable {
        Reason::Unreachable
    } else if !p.ready {
        Reason::PodNotReady
    } else {
        return Failure::Healthy;
    };
    if p.failing_for >= obs.failover_delay {
        Failure::Failed(reason)
    } else {
        Failure::Waiting(reason, obs.failover_delay - p.failing_for)
    }
}

/// Whether `pod` may become the primary now: it exists on a healthy node, answers, has
/// completed a sync, and holds data if the old primary did. It answers as a replica, or as a
/// primary already (the operator promoted it and stopped before it recorded so).
pub fn is_candidate(obs: &Observation, pod: &PodObservation) -> bool {
    let Some(r) = &pod.replication else {
        return false;
    };
    !pod.terminating
        && !pod.node_unreachable
        && pod.node_ready != Some(false)
        && pod.reachable
        && pod.ordinal < obs.replicas
        && r.synced
        && !(obs.primary_had_data && r.keys == 0)
}

/// The best candidate other than `primary` (and `only`, when given, must be it): the greatest
/// offset, then the lowest ordinal.
fn candidate<'a>(
    obs: &'a Observation,
    primary: &str,
    only: Option<&str>,
) -> Option<&'a PodObservation> {
    best_candidate(
        obs.pods
            .iter()
            .filter(|p| p.name != primary && only.is_none_or(|o| o == p.name))
            .filter(|p| is_candidate(obs, p))
            .filter(|p| {
                only.is_none()
                    || p.replication
                        .as_ref()
                        .is_some_and(|r| r.role == Role::Replica)
            }),
    )
}

/// Of these candidates, the one to take over: the greatest offset, then the lowest ordinal.
pub fn best_candidate<'a>(
    candidates: impl Iterator<Item = &'a PodObservation>,
) -> Option<&'a PodObservation> {
    candidates.max_by(|a, b| {
        let offset = |p: &PodObservation| p.replication.as_ref().map_or(0, |r| r.offset);
        offset(a)
            .cmp(&offset(b))
            .then_with(|| b.ordinal.cmp(&a.ordinal))
    })
}

fn switchover(obs: &Observation, primary: &str, target: Option<&str>) -> Action {
    if target == Some(primary) {
        return Action::Report(Fact::SwitchoverRefused {
            why: format!("{primary} is already the primary"),
        });
    }
    match candidate(obs, primary, target) {
        Some(c) => Action::Switchover {
            from: primary.to_owned(),
            to: c.name.clone(),
        },
        None => Action::Report(Fact::SwitchoverRefused {
            why: match target {
                Some(t) => format!(
                    "{t} cannot take over: it must be a pod of the instance that answers as a replica in sync"
                ),
                None => "no replica answers in sync".into(),
            },
        }),
    }
}

/// The primary's pod is beyond `spec.replicas`: a planned switchover to the best pod that stays,
/// or, while none answers in sync, the scale-down waits.
fn hand_over_before_scale_down(obs: &Observation, primary: &str) -> Action {
    match candidate(obs, primary, None) {
        Some(c) => Action::Switchover {
            from: primary.to_owned(),
            to: c.name.clone(),
        },
        None => Action::Report(Fact::HandoverPending {
            why: format!(
                "the scale-down to {} pods waits: the primary {primary} goes last, once a pod that stays answers as a replica in sync",
                obs.replicas
            ),
        }),
    }
}

/// Reachable pods that do not follow the recorded primary: a replica of another host, or a
/// second primary (an old primary back, or a pod started before the ConfigMap said otherwise).
fn strays(obs: &Observation, primary: &str) -> Vec<String> {
    obs.pods
        .iter()
        .filter(|p| p.name != primary && p.reachable && !p.terminating)
        .filter(|p| match &p.replication {
            Some(r) => match r.role {
                Role::Primary => true,
                Role::Replica => !r
                    .primary_host
                    .as_deref()
                    .is_some_and(|h| follows(h, primary)),
            },
            None => false,
        })
        .map(|p| p.name.clone())
        .collect()
}

/// Whether `host` (a replica's `master_host`) names the pod `primary`: its stable DNS name
/// `<pod>.<headless>...` or the bare pod name.
fn follows(host: &str, primary: &str) -> bool {
    host == primary
        || host
            .strip_prefix(primary)
            .is_some_and(|rest| rest.starts_with('.'))
}

/// Durations in fixtures as milliseconds.
mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}
