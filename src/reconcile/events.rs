//! The story of each Valkey in Kubernetes events: what was created, updated, scaled, deleted,
//! and every failure. Messages name objects, never their contents.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use tracing::warn;

use super::{Context, Error};
use crate::api::{Valkey, ValkeyStatus};
use crate::apply::{Applied, Outcome};
use crate::status::conditions;

/// One object the reconcile changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub kind: &'static str,
    pub name: String,
    pub outcome: Outcome,
    /// For a StatefulSet whose replicas changed: from and to.
    pub scaled: Option<(i32, i32)>,
}

impl Change {
    pub fn named(kind: &'static str, name: &str, outcome: Outcome) -> Self {
        Self {
            kind,
            name: name.to_owned(),
            outcome,
            scaled: None,
        }
    }

    pub fn scaled<K: Resource>(object: &K, from: i32, to: i32) -> Self {
        Self {
            scaled: Some((from, to)),
            ..Self::of("Scale", object, Outcome::Updated)
        }
    }

    pub fn of<K: Resource>(kind: &'static str, object: &K, outcome: Outcome) -> Self {
        Self::named(kind, &object.name_any(), outcome)
    }

    pub fn applied<K: Resource>(kind: &'static str, applied: Applied<K>) -> Self {
        Self::of(kind, &applied.object, applied.outcome)
    }
}

fn reason(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Created => "Created",
        Outcome::Updated => "Updated",
        Outcome::Deleted => "Deleted",
        Outcome::Unchanged => "Unchanged",
    }
}

/// Publishes one event per kind of change (so a new instance gets one "Created" event listing
/// its objects, not seven), plus a Warning for a failure.
pub async fn publish(ctx: &Context, valkey: &Valkey, changes: &[Change], error: Option<&Error>) {
    // kube's Recorder folds events with the same reason about the same object into one series
    // that keeps the FIRST note ("scaled from 3 to 1 pods" would still be all a user sees after
    // scaling to 0 and back). Naming the version of the Valkey the reconcile acted on keeps what
    // was done for different specs apart, while a failure repeating against one version still
    // counts up a single event.
    let reference = ObjectReference {
        resource_version: valkey.resource_version(),
        ..valkey.object_ref(&())
    };
    let mut events = Vec::new();
    for outcome in [Outcome::Created, Outcome::Updated, Outcome::Deleted] {
        let objects: Vec<String> = changes
            .iter()
            .filter(|c| c.outcome == outcome && c.kind != "Pod" && c.scaled.is_none())
            .map(|c| format!("{} {}", c.kind, c.name))
            .collect();
        if !objects.is_empty() {
            events.push(event(
                EventType::Normal,
                reason(outcome),
                objects.join(", "),
            ));
        }
    }
    for (from, to) in changes.iter().filter_map(|c| c.scaled) {
        events.push(event(
            EventType::Normal,
            "Scaled",
            format!("scaled from {from} to {to} pods"),
        ));
    }
    let relabelled: Vec<&str> = changes
        .iter()
        .filter(|c| c.kind == "Pod" && c.outcome == Outcome::Updated)
        .map(|c| c.name.as_str())
        .collect();
    if !relabelled.is_empty() {
        events.push(event(
            EventType::Normal,
            "RolesAssigned",
            format!("replication roles set on {}", relabelled.join(", ")),
        ));
    }
    if let Some(e) = error {
        events.push(event(EventType::Warning, e.reason(), e.to_string()));
    }
    for ev in events {
        if let Err(e) = ctx.recorder.publish(&ev, &reference).await {
            warn!(error = %e, valkey = %valkey.name_any(), "could not publish an event");
        }
    }
}

/// A Warning naming why pods do not run (the Ready condition's reason and status.error), when
/// the status says something new about them: the event series counts repeats, and a healed
/// instance clears the error (no event for that; the status says it).
pub async fn pod_problems(ctx: &Context, valkey: &Valkey, status: &ValkeyStatus) {
    if status.error.is_empty() {
        return;
    }
    let previous = valkey.status.as_ref().map(|s| s.error.as_str());
    if previous == Some(status.error.as_str()) {
        return;
    }
    let Some(reason) = status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::READY)
        .map(|c| c.reason.clone())
    else {
        return;
    };
    let reference = valkey.object_ref(&());
    let ev = event(EventType::Warning, &reason, status.error.clone());
    if let Err(e) = ctx.recorder.publish(&ev, &reference).await {
        warn!(error = %e, valkey = %valkey.name_any(), "could not publish an event");
    }
}

fn event(type_: EventType, reason: &str, note: String) -> Event {
    Event {
        type_,
        reason: reason.to_owned(),
        note: Some(truncate(note)),
        action: "Reconcile".to_owned(),
        secondary: None,
    }
}

/// Event notes are limited to 1 kB.
fn truncate(mut note: String) -> String {
    if note.len() > 1000 {
        let mut end = 1000;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
        note.push('…');
    }
    note
}

/// Publishes what the failover step told: FailoverStarted, PrimaryPromoted, and Warnings for a
/// failover that cannot happen or a refused switchover.
pub async fn failover(ctx: &Context, valkey: &Valkey, told: &[(bool, &'static str, String)]) {
    if told.is_empty() {
        return;
    }
    let reference = ObjectReference {
        resource_version: valkey.resource_version(),
        ..valkey.object_ref(&())
    };
    for (warning, reason, note) in told {
        let type_ = if *warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        let mut ev = event(type_, reason, note.clone());
        ev.action = "Failover".to_owned();
        if let Err(e) = ctx.recorder.publish(&ev, &reference).await {
            warn!(error = %e, valkey = %valkey.name_any(), "could not publish an event");
        }
    }
}
