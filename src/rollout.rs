//! Rolling updates driven by the operator: which pod restarts next.
//!
//! The StatefulSet's own rolling update replaces pods from the highest ordinal down, whatever
//! their role: with the primary on a high ordinal, the role moves once when the primary's pod
//! is deleted and often again when the pod it moved to is replaced next. So the StatefulSet
//! uses the `OnDelete` strategy and the operator restarts the pods itself, one at a time, from
//! the same observation the failover decision uses: the replicas first (a broken one before a
//! healthy one, the highest ordinal first), each only once every pod already updated is Ready
//! and in sync, then a planned switchover to an updated replica in sync, then the old primary.
//! The role moves exactly once per rollout, and never to a pod that is about to restart.
//!
//! Pure: no clock, no I/O; unit-tested from YAML fixtures (tests/rollout.rs).

use serde::Deserialize;

use crate::failover::{Observation, PodObservation, Role, best_candidate, is_candidate};

/// The next step of a rolling update.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", tag = "step")]
pub enum Step {
    /// Every pod runs the StatefulSet's newest pod template.
    Done,
    /// A pod is starting or stopping: its own events bring the next look.
    Wait { why: String },
    /// An updated replica is Ready but has not caught up with the primary yet: look again soon
    /// (nothing in the cluster changes when it has).
    WaitForSync { pod: String },
    /// Delete this pod; the StatefulSet recreates it from the newest template.
    Restart { pod: String },
    /// Only the primary runs the old template: hand its role to `to` first (a planned
    /// switchover), then it restarts as a replica.
    HandOver { from: String, to: String },
}

/// The one step a rolling update takes now. Called only when the failover decision found
/// nothing to do (the primary healthy, no stray), so a rollout never races a failover.
pub fn next_step(obs: &Observation) -> Step {
    if obs.template_pending {
        // Its status event brings the next look.
        return Step::Wait {
            why: "the StatefulSet has not yet seen its newest pod template".into(),
        };
    }
    let Some(primary) = obs.recorded_primary.as_deref() else {
        return Step::Done;
    };
    // Pods beyond spec.replicas are going away (a scale-down); they are not updated.
    let staying: Vec<&PodObservation> = obs
        .pods
        .iter()
        .filter(|p| p.ordinal < obs.replicas)
        .collect();
    if !staying.iter().any(|p| p.outdated) {
        return Step::Done;
    }
    if let Some(p) = staying.iter().find(|p| p.terminating) {
        return Step::Wait {
            why: format!("{} is being replaced", p.name),
        };
    }
    if staying.len() < usize::try_from(obs.replicas).unwrap_or(0) {
        return Step::Wait {
            why: format!(
                "{} of {} pods exist; the StatefulSet creates the others",
                staying.len(),
                obs.replicas
            ),
        };
    }
    let replicas = || staying.iter().filter(|p| p.name != primary);
    // An outdated replica that does not serve (not Ready, silent, not in sync) loses nothing by
    // restarting, and the new template may be what it needs; waiting for it could wait forever.
    if let Some(p) = highest(replicas().filter(|p| p.outdated && !serves(p))) {
        return Step::Restart {
            pod: p.name.clone(),
        };
    }
    if let Some(p) = staying.iter().find(|p| !p.outdated && !p.ready) {
        return Step::Wait {
            why: format!("{} is not Ready yet", p.name),
        };
    }
    if let Some(p) = replicas().find(|p| !p.outdated && !serves(p)) {
        return Step::WaitForSync {
            pod: p.name.clone(),
        };
    }
    if let Some(p) = highest(replicas().filter(|p| p.outdated)) {
        return Step::Restart {
            pod: p.name.clone(),
        };
    }
    // Only the primary is left.
    if obs.replicas <= 1 {
        return Step::Restart {
            pod: primary.to_owned(),
        };
    }
    let updated = replicas()
        .copied()
        .filter(|p| !p.outdated && is_candidate(obs, p));
    match best_candidate(updated) {
        Some(to) => Step::HandOver {
            from: primary.to_owned(),
            to: to.name.clone(),
        },
        None => Step::Wait {
            why: format!("no updated replica can take over from the primary {primary} yet"),
        },
    }
}

/// A replica that answers the operator, is Ready and follows its primary with the link up.
fn serves(pod: &PodObservation) -> bool {
    pod.ready
        && pod.reachable
        && pod
            .replication
            .as_ref()
            .is_some_and(|r| r.role == Role::Replica && r.link_up)
}

fn highest<'a>(pods: impl Iterator<Item = &'a &'a PodObservation>) -> Option<&'a PodObservation> {
    pods.max_by_key(|p| p.ordinal).copied()
}
