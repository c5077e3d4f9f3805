//! Why a pod of the instance does not become ready, in words, from what Kubernetes records on the
//! pod itself and its volume claim. Pure: no client, no clock.
//!
//! Sources: the pod's status (container `state`/`lastState`, `restartCount`, the `PodScheduled`
//! condition), its spec (image, memory limit) and the status of its PersistentVolumeClaim.
//! Events are not read (the operator may not list them), so a volume that is bound but fails to
//! mount shows as a pod waiting in ContainerCreating without a cause here; `kubectl valkey
//! status` lists the pod's events (FailedMount) beside it.
//!
//! The last lines of a crashed container's log come from `lastState.terminated.message`: the
//! valkey container has `terminationMessagePolicy: FallbackToLogsOnError`, so the kubelet copies
//! the tail of the log there. valkey-server does not log passwords, with one exception kept out
//! here: a FATAL CONFIG FILE ERROR quotes the offending line, and a line of auth.conf (`user`,
//! `masterauth`, ...) carries the password, so such a quote is replaced by a placeholder.

use k8s_openapi::api::core::v1::{ContainerStatus, PersistentVolumeClaim, Pod};
use serde::Serialize;

use crate::desired::METRICS_CONTAINER;

/// What keeps a pod from running, from who is at fault's point of view.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Cause {
    /// No node fits: resources, nodeSelector, affinity, taints.
    Unschedulable,
    /// The pod's volume claim is not bound to a volume.
    VolumeNotReady,
    /// The image cannot be pulled: wrong name or tag, no access, registry down.
    ImagePullFailed,
    /// The container ran out of its memory limit and was killed.
    OomKilled,
    /// The container exits again and again; its last words say why.
    CrashLooping,
    /// The kubelet cannot create or start the container (e.g. a missing Secret key).
    ContainerCannotStart,
}

impl Cause {
    /// The CamelCase reason of conditions and events.
    pub fn reason(self) -> &'static str {
        match self {
            Cause::Unschedulable => "Unschedulable",
            Cause::VolumeNotReady => "VolumeNotReady",
            Cause::ImagePullFailed => "ImagePullFailed",
            Cause::OomKilled => "OOMKilled",
            Cause::CrashLooping => "PodCrashLooping",
            Cause::ContainerCannotStart => "ContainerCannotStart",
        }
    }
}

/// One pod that cannot run, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodProblem {
    pub pod: String,
    pub cause: Cause,
    /// One line: what happened and what to change.
    pub message: String,
    /// Restarts of the pod's containers.
    pub restarts: i32,
}

/// Lines of a crashed container's log kept in a message.
pub const LOG_LINES: usize = 4;
/// Longest excerpt of a log or a kubelet message, in bytes.
const MAX_EXCERPT: usize = 600;
const WITHHELD: &str = "(a line of auth.conf, withheld: it holds the password)";

/// The problems of every pod that is not ready, in the order of `pods`.
pub fn diagnose_all(pods: &[Pod], claims: &[PersistentVolumeClaim]) -> Vec<PodProblem> {
    pods.iter().filter_map(|p| diagnose(p, claims)).collect()
}

/// Why `pod` does not run, if it is not ready and Kubernetes says why. `claims` are the
/// instance's volume claims (any order; may be empty).
pub fn diagnose(pod: &Pod, claims: &[PersistentVolumeClaim]) -> Option<PodProblem> {
    if pod.metadata.deletion_timestamp.is_some() || super::is_ready(pod) {
        return None;
    }
    let name = pod.metadata.name.clone().unwrap_or_default();
    let status = pod.status.as_ref()?;
    let containers = status.container_statuses.as_deref().unwrap_or_default();
    let restarts = containers.iter().map(|c| c.restart_count).sum();
    let problem = |cause, message| PodProblem {
        pod: name.clone(),
        cause,
        message,
        restarts,
    };

    let unschedulable = status.conditions.iter().flatten().find(|c| {
        c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")
    });
    if let Some(condition) = unschedulable {
        let scheduler = excerpt(condition.message.as_deref().unwrap_or_default());
        let scheduler = scheduler.trim_end_matches('.');
        let claim = pending_claim(pod, claims);
        if claim.is_some() || scheduler.contains("unbound immediate PersistentVolumeClaims") {
            let claim = claim
                .map(|c| format!("PersistentVolumeClaim {c}"))
                .unwrap_or_else(|| "its PersistentVolumeClaim".into());
            return Some(problem(
                Cause::VolumeNotReady,
                format!(
                    "pod {name} waits for its volume: {claim} is not bound to a volume (scheduler: {scheduler}); check spec.volume.storageClassName and the cluster's storage provisioner"
                ),
            ));
        }
        return Some(problem(
            Cause::Unschedulable,
            format!(
                "pod {name} cannot be scheduled: {scheduler}; check spec.nodeSelector, spec.tolerations, spec.affinity and spec.resource against the nodes"
            ),
        ));
    }
    containers
        .iter()
        .filter_map(|c| container_problem(&name, pod, c, restarts))
        .min_by_key(|(cause, _)| priority(*cause))
        .map(|(cause, message)| problem(cause, message))
}

fn priority(cause: Cause) -> u8 {
    match cause {
        Cause::Unschedulable | Cause::VolumeNotReady => 0,
        Cause::ImagePullFailed => 1,
        Cause::ContainerCannotStart => 2,
        Cause::OomKilled => 3,
        Cause::CrashLooping => 4,
    }
}

fn container_problem(
    pod_name: &str,
    pod: &Pod,
    container: &ContainerStatus,
    restarts: i32,
) -> Option<(Cause, String)> {
    let state = container.state.as_ref();
    let waiting = state.and_then(|s| s.waiting.as_ref());
    let waiting_reason = waiting
        .and_then(|w| w.reason.as_deref())
        .unwrap_or_default();
    let waiting_message = waiting
        .and_then(|w| w.message.as_deref())
        .map(excerpt)
        .unwrap_or_default();
    let image = spec_image(pod, &container.name).unwrap_or(&container.image);
    match waiting_reason {
        "ErrImagePull"
        | "ImagePullBackOff"
        | "InvalidImageName"
        | "ErrImageNeverPull"
        | "RegistryUnavailable" => {
            let detail = if waiting_message.is_empty() {
                String::new()
            } else {
                format!(": {waiting_message}")
            };
            return Some((
                Cause::ImagePullFailed,
                format!(
                    "pod {pod_name} cannot pull image {image} ({waiting_reason}){detail}; fix {} or the registry access",
                    image_field(&container.name)
                ),
            ));
        }
        "CreateContainerConfigError" | "CreateContainerError" | "RunContainerError" => {
            return Some((
                Cause::ContainerCannotStart,
                format!(
                    "pod {pod_name}: container {} cannot start ({waiting_reason}): {waiting_message}",
                    container.name
                ),
            ));
        }
        _ => {}
    }
    // The termination that matters: the current one if the container is down, else the last.
    let terminated = state.and_then(|s| s.terminated.as_ref()).or_else(|| {
        container
            .last_state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
    });
    let crash_looping = waiting_reason == "CrashLoopBackOff";
    let Some(terminated) = terminated else {
        return crash_looping.then(|| {
            (
                Cause::CrashLooping,
                format!(
                    "pod {pod_name} keeps crashing: container {} restarted {restarts} times",
                    container.name
                ),
            )
        });
    };
    if terminated.reason.as_deref() == Some("OOMKilled")
        && (crash_looping || restarts > 0 || state.is_some_and(|s| s.terminated.is_some()))
    {
        let limit = memory_limit(pod, &container.name).unwrap_or("none");
        if container.name == METRICS_CONTAINER {
            return Some((
                Cause::OomKilled,
                format!(
                    "pod {pod_name}: the metrics exporter was killed for running out of memory (limit {limit}, from spec.metrics.resources.memory; restarted {restarts} times); raise spec.metrics.resources.memory"
                ),
            ));
        }
        return Some((
            Cause::OomKilled,
            format!(
                "pod {pod_name}: valkey-server was killed for running out of memory (limit {limit}, from spec.resource.memory; restarted {restarts} times); raise spec.resource.memory or lower the dataset (spec.config maxmemory-policy)"
            ),
        ));
    }
    let failed_now = state
        .and_then(|s| s.terminated.as_ref())
        .is_some_and(|t| t.exit_code != 0);
    if !crash_looping && !failed_now {
        // Running again (and not yet ready), or starting: nothing to blame yet.
        return None;
    }
    let reason = terminated.reason.as_deref().unwrap_or("Error");
    let mut message = format!(
        "pod {pod_name} keeps crashing: container {} exited with code {} ({reason}), restarted {restarts} times",
        container.name, terminated.exit_code
    );
    let log = last_lines(terminated.message.as_deref().unwrap_or_default());
    if !log.is_empty() {
        message.push_str(&format!("; last log lines: {log}"));
    }
    Some((Cause::CrashLooping, message))
}

/// The spec field that sets a container's image: the metrics sidecar has its own.
fn image_field(container: &str) -> &'static str {
    if container == METRICS_CONTAINER {
        "spec.metrics.image"
    } else {
        "spec.image"
    }
}

/// The last [`LOG_LINES`] non-empty lines, joined with " | ", without a quoted auth.conf line.
pub fn last_lines(log: &str) -> String {
    let lines: Vec<&str> = log
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.trim().is_empty())
        .collect();
    let start = lines.len().saturating_sub(LOG_LINES);
    let kept: Vec<&str> = lines[start..]
        .iter()
        .map(|l| if quotes_auth_line(l) { WITHHELD } else { l })
        .collect();
    excerpt(&kept.join(" | "))
}

/// A config-error quote (`>>> 'user admin on ">…"'`) of a line that holds credentials.
fn quotes_auth_line(line: &str) -> bool {
    let Some(quoted) = line.trim_start().strip_prefix(">>> '") else {
        return false;
    };
    let directive = quoted.split_whitespace().next().unwrap_or_default();
    ["user", "masterauth", "primaryauth", "requirepass"]
        .iter()
        .any(|d| directive.eq_ignore_ascii_case(d))
}

/// At most [`MAX_EXCERPT`] bytes, on a character boundary, on one line.
fn excerpt(text: &str) -> String {
    let one_line: String = text
        .trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if one_line.len() <= MAX_EXCERPT {
        return one_line;
    }
    let mut end = MAX_EXCERPT;
    while !one_line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &one_line[..end])
}

fn spec_image<'a>(pod: &'a Pod, container: &str) -> Option<&'a str> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == container)?
        .image
        .as_deref()
}

fn memory_limit<'a>(pod: &'a Pod, container: &str) -> Option<&'a str> {
    let c = pod
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == container)?;
    Some(
        c.resources
            .as_ref()?
            .limits
            .as_ref()?
            .get("memory")?
            .0
            .as_str(),
    )
}

/// The pod's claim that is not Bound (or not there at all), if the pod uses one.
fn pending_claim(pod: &Pod, claims: &[PersistentVolumeClaim]) -> Option<String> {
    let volumes = pod.spec.as_ref()?.volumes.as_deref().unwrap_or_default();
    volumes
        .iter()
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| c.claim_name.clone())
        .find(|name| {
            // A claim not among `claims` is unknown here, not pending.
            claims
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(name.as_str()))
                .is_some_and(|c| {
                    c.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound")
                })
        })
}
