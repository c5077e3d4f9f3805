//! Status computation from YAML fixtures (tests/fixtures/status): each file is what the operator
//! observed and the status a user must then see.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::Deserialize;
use serde_json::{Value, json};
use valkey_core::api::{Phase, Valkey};
use valkey_core::status::{self, Observed};

#[derive(Deserialize)]
struct Case {
    valkey: Value,
    statefulset: Option<Value>,
    pods: Vec<PodFixture>,
    primary: Option<String>,
    error: Option<String>,
    #[serde(default, rename = "errorReason")]
    error_reason: Option<String>,
    #[serde(default, rename = "errorTransient")]
    error_transient: bool,
    expect: Expect,
}

#[derive(Deserialize)]
struct PodFixture {
    name: String,
    #[serde(default)]
    ready: bool,
    /// A whole pod status as the kubelet writes it, instead of `ready`.
    #[serde(default)]
    status: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Expect {
    status: Phase,
    ready_replicas: i32,
    primary: Option<String>,
    #[serde(default)]
    error: String,
    conditions: std::collections::BTreeMap<String, String>,
    /// Condition reasons that must be these (others are not checked).
    #[serde(default)]
    reasons: std::collections::BTreeMap<String, String>,
}

fn valkey(v: &Value) -> Valkey {
    let mut object = json!({
        "apiVersion": "database.kuberly.io/v1alpha1",
        "kind": "Valkey",
        "metadata": {"name": "cache", "namespace": "team-a", "generation": 4, "uid": "0b0c"},
    });
    object["spec"] = v["spec"].clone();
    object["status"] = v.get("status").cloned().unwrap_or(Value::Null);
    serde_json::from_value(object).expect("a Valkey fixture")
}

fn statefulset(v: &Value) -> StatefulSet {
    serde_json::from_value(json!({
        "metadata": {"name": "cache", "generation": v["generation"]},
        "status": {
            "replicas": 0,
            "observedGeneration": v["observedGeneration"],
            "currentRevision": v["currentRevision"],
            "updateRevision": v["updateRevision"],
            "updatedReplicas": v["updatedReplicas"],
        },
    }))
    .expect("a StatefulSet fixture")
}

fn pod(p: &PodFixture) -> Pod {
    let ready = json!({"conditions": [{"type": "Ready", "status": if p.ready { "True" } else { "False" }}]});
    serde_json::from_value(json!({
        "metadata": {"name": p.name},
        "spec": {"containers": [{"name": "valkey", "image": "valkey/valkey:9.1.2",
            "resources": {"limits": {"memory": "16Mi"}}}]},
        "status": p.status.clone().unwrap_or(ready),
    }))
    .expect("a Pod fixture")
}

fn now() -> Time {
    Time("2026-11-30T12:00:00Z".parse().expect("a timestamp"))
}

#[test]
fn status_fixtures() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/status");
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).expect("the status fixtures") {
        let path = entry.expect("a fixture").path();
        let name = path.display().to_string();
        let case: Case =
            yaml_serde::from_str(&std::fs::read_to_string(&path).expect("readable")).expect(&name);
        let valkey = valkey(&case.valkey);
        let sts = case.statefulset.as_ref().map(statefulset);
        let pods: Vec<Pod> = case.pods.iter().map(pod).collect();
        let observed = Observed {
            statefulset: sts.as_ref(),
            pods: &pods,
            primary: case.primary.clone(),
            error: case.error.clone(),
            error_reason: case.error_reason.clone().map(|r| &*r.leak()),
            error_transient: case.error_transient,
            claims: &[],
            changed: false,
            ..Observed::default()
        };
        let got = status::compute(&valkey, &observed, &now());
        assert_eq!(got.status, Some(case.expect.status), "{name}: phase");
        assert_eq!(
            got.ready_replicas, case.expect.ready_replicas,
            "{name}: readyReplicas"
        );
        assert_eq!(got.primary, case.expect.primary, "{name}: primary");
        assert_eq!(got.error, case.expect.error, "{name}: error");
        assert_eq!(
            got.observed_generation,
            Some(4),
            "{name}: observedGeneration"
        );
        assert_eq!(
            got.selector.as_deref(),
            Some("app.kubernetes.io/name=valkey,app.kubernetes.io/instance=cache")
        );
        let conditions: std::collections::BTreeMap<_, _> = got
            .conditions
            .iter()
            .map(|c| (c.type_.clone(), c.status.clone()))
            .collect();
        assert_eq!(conditions, case.expect.conditions, "{name}: conditions");
        for (kind, reason) in &case.expect.reasons {
            let got = got
                .conditions
                .iter()
                .find(|c| &c.type_ == kind)
                .map(|c| c.reason.as_str());
            assert_eq!(got, Some(reason.as_str()), "{name}: reason of {kind}");
        }
        seen += 1;
    }
    assert!(seen >= 8, "only {seen} fixtures");
}

#[test]
fn an_unchanged_status_is_not_rewritten_and_keeps_its_transition_times() {
    let v = valkey(&json!({"spec": {"replicas": 1}}));
    let sts = statefulset(
        &json!({"generation": 1, "observedGeneration": 1, "currentRevision": "a", "updateRevision": "a", "updatedReplicas": 1}),
    );
    let pods = vec![pod(&PodFixture {
        name: "cache-0".into(),
        ready: true,
        status: None,
    })];
    let observed = Observed {
        statefulset: Some(&sts),
        pods: &pods,
        primary: Some("cache-0".into()),
        error: None,
        error_reason: None,
        claims: &[],
        changed: true,
        ..Observed::default()
    };
    let first = status::compute(&v, &observed, &now());
    assert!(status::differs(None, &first));

    let mut stored = v.clone();
    stored.status = Some(first.clone());
    let later = Time("2026-11-30T13:00:00Z".parse().unwrap());
    let idle = Observed {
        changed: false,
        ..observed.clone()
    };
    let second = status::compute(&stored, &idle, &later);
    assert!(
        !status::differs(Some(&first), &second),
        "an idle reconcile must not write status"
    );
    assert_eq!(
        second.last_reconcile_at, first.last_reconcile_at,
        "lastReconcileAt moves only on change"
    );
    assert_eq!(
        second.conditions[0].last_transition_time,
        first.conditions[0].last_transition_time
    );

    let changed = status::compute(&stored, &observed, &later);
    assert_eq!(changed.last_reconcile_at, Some(later));
}

#[test]
fn the_recorded_primary_stays_put_until_the_operator_moves_it() {
    let mut v = valkey(&json!({"spec": {"replicas": 3}, "status": {"primary": "cache-2"}}));
    assert_eq!(
        status::recorded_primary(&v, None).as_deref(),
        Some("cache-2")
    );
    // The ConfigMap key (what pods read at start) wins over the status.
    assert_eq!(
        status::recorded_primary(&v, Some("cache-1")).as_deref(),
        Some("cache-1")
    );
    v.spec.replicas = 2;
    // Scaled down below the primary: it stays recorded (its pod is kept) until the operator has
    // handed the role over; the status alone names no pod that is going away.
    assert_eq!(
        status::recorded_primary(&v, Some("cache-2")).as_deref(),
        Some("cache-2")
    );
    assert_eq!(
        status::recorded_primary(&v, None).as_deref(),
        Some("cache-0")
    );
    v.spec.replicas = 0;
    assert_eq!(status::recorded_primary(&v, Some("cache-1")), None);
    let fresh = valkey(&json!({"spec": {"replicas": 1}}));
    assert_eq!(
        status::recorded_primary(&fresh, None).as_deref(),
        Some("cache-0")
    );
}

/// The ServiceMonitor condition: only while one is asked for; False with the reason while its
/// API is missing, True once created; a reconcile that stopped before that step keeps what the
/// last one said.
#[test]
fn the_service_monitor_condition_says_why_there_is_none() {
    use valkey_core::status::Monitoring;
    let spec = |monitor: bool| json!({"spec": {"replicas": 1, "metrics": {"enabled": true, "serviceMonitor": {"enabled": monitor}}}});
    let condition = |s: &valkey_core::api::ValkeyStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == "ServiceMonitor")
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    };
    let wanted = valkey(&spec(true));
    let missing = Observed {
        monitoring: Some(Monitoring::api_missing("cache-metrics")),
        ..Observed::default()
    };
    let first = status::compute(&wanted, &missing, &now());
    let (state, reason, message) = condition(&first).expect("a ServiceMonitor condition");
    assert_eq!(
        (state.as_str(), reason.as_str()),
        ("False", "ServiceMonitorAPIMissing")
    );
    assert!(message.contains("monitoring.coreos.com/v1"), "{message}");
    assert!(first.error.is_empty(), "no error: {}", first.error);
    assert_ne!(first.status, Some(Phase::Failed));

    // A reconcile that failed earlier: the last word stays.
    let mut stored = wanted.clone();
    stored.status = Some(first.clone());
    let unknown = status::compute(&stored, &Observed::default(), &now());
    assert_eq!(condition(&unknown), condition(&first));

    let created = Observed {
        monitoring: Some(Monitoring::created("cache-metrics")),
        ..Observed::default()
    };
    let second = status::compute(&stored, &created, &now());
    let (state, reason, _) = condition(&second).expect("a ServiceMonitor condition");
    assert_eq!((state.as_str(), reason.as_str()), ("True", "Created"));
    let mut stored = stored.clone();
    stored.status = Some(second);
    assert!(status::had_service_monitor(&stored));

    // No longer asked for: no condition.
    let mut off = valkey(&spec(false));
    off.status = stored.status.clone();
    assert_eq!(
        condition(&status::compute(&off, &Observed::default(), &now())),
        None
    );
}

/// A pod NotReady only because its metrics sidecar is not ready still has a ready Valkey (the
/// failover looks at this, so a crashing exporter never moves the primary); a NotReady valkey
/// container, or a NotReady pod without another culprit, is not.
#[test]
fn a_failing_sidecar_leaves_the_valkey_container_ready() {
    let pod = |valkey: bool, metrics: Option<bool>, pod_ready: bool| -> Pod {
        let mut statuses = vec![
            json!({"name": "valkey", "image": "", "imageID": "", "ready": valkey, "restartCount": 0}),
        ];
        if let Some(m) = metrics {
            statuses.push(json!({"name": "metrics", "image": "", "imageID": "", "ready": m, "restartCount": 3}));
        }
        let ready = if pod_ready { "True" } else { "False" };
        serde_json::from_value(json!({
            "metadata": {"name": "cache-0"},
            "status": {
                "conditions": [{"type": "Ready", "status": ready}],
                "containerStatuses": statuses,
            },
        }))
        .expect("a pod")
    };
    assert!(status::valkey_ready(&pod(true, Some(true), true)));
    assert!(
        status::valkey_ready(&pod(true, Some(false), false)),
        "only the sidecar fails"
    );
    assert!(
        !status::is_ready(&pod(true, Some(false), false)),
        "the pod is NotReady"
    );
    assert!(!status::valkey_ready(&pod(false, Some(false), false)));
    assert!(!status::valkey_ready(&pod(false, Some(true), false)));
    // No other culprit (e.g. a test marking the pod NotReady): NotReady.
    assert!(!status::valkey_ready(&pod(true, None, false)));
    assert!(!status::valkey_ready(&pod(true, Some(true), false)));
}
