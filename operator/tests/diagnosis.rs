//! A Valkey that cannot start says so (issue 15), end to end: the `valkey-operator` binary under
//! the shipped RBAC (the e2e harness), the real scheduler and, for the causes only a kubelet
//! produces (crash loop, OOM kill, image pull), real nodes. Each test creates the broken
//! instance, waits (within a generous bound) for the status error, the reason on the Ready
//! condition and `kubectl valkey status` to name the cause, then fixes the spec and sees the
//! instance heal.
//!
//!   cargo test -p valkey-operator --test diagnosis
//!
//! The plugin is the binary Cargo built beside the test binary, run as a user runs it.

#[path = "e2e/harness.rs"]
#[allow(dead_code)]
mod harness;
#[path = "e2e/observe.rs"]
#[allow(dead_code)]
mod observe;
#[path = "../../tests/support/mod.rs"]
mod support;

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use valkey_core::api::{Phase, Valkey};

use harness::{Env, TIMEOUT, plugin_bin};
use observe::*;

/// The KWOK nodes' taint: the API-only scenarios below run their pods there, so they work with
/// or without real nodes (`VALKEY_OPERATOR_REAL_NODES=0`).
fn on_kwok() -> serde_json::Value {
    json!([{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}])
}

/// Causes that need a kubelet to back off, restart and report take longer than API-only ones.
const KUBELET_TIMEOUT: Duration = Duration::from_secs(180);

/// `kubectl valkey status NAME` in the test's namespace, as the cluster's admin: stdout.
fn plugin_status(env: &Env, name: &str) -> String {
    let out = Command::new(plugin_bin())
        .args(["status", name, "-n", &env.ns.name, "--color", "never"])
        .env("KUBECONFIG", support::cluster::kubeconfig_path())
        .output()
        .expect("running kubectl-valkey");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ready_reason(v: &Valkey) -> Option<String> {
    v.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.reason.clone())
}

/// Waits until the status error contains every one of `words` and the Ready condition's reason
/// is `reason`; then until `kubectl valkey status` shows the reason too. Returns the Valkey.
async fn wait_cause(
    env: &Env,
    name: &str,
    reason: &str,
    words: &[&str],
    timeout: Duration,
) -> Valkey {
    let v = wait_for(
        env,
        name,
        &format!("the status to say {reason}"),
        timeout,
        |v| {
            let s = v.status.as_ref().ok_or("no status")?;
            if ready_reason(v).as_deref() != Some(reason) {
                return Err(format!("Ready reason {:?}", ready_reason(v)));
            }
            match words.iter().find(|w| !s.error.contains(*w)) {
                Some(w) => Err(format!("{w:?} not in the error")),
                None => Ok(()),
            }
        },
    )
    .await;
    harness::eventually(
        &format!("kubectl valkey status to name {reason}"),
        TIMEOUT,
        || async {
            let text = plugin_status(env, name);
            (text.contains(reason) && words.iter().all(|w| text.contains(w)))
                .then_some(())
                .ok_or(text)
        },
    )
    .await;
    v
}

async fn patch_spec(env: &Env, name: &str, spec: serde_json::Value) {
    env.api::<Valkey>()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": spec })),
        )
        .await
        .unwrap_or_else(|e| panic!("patching Valkey {name}: {e}"));
}

async fn warning_with_reason(env: &Env, v: &Valkey, reason: &str) {
    wait_event(env, v, &format!("a Warning {reason}"), |e| {
        e.type_.as_deref() == Some("Warning") && e.reason.as_deref() == Some(reason)
    })
    .await;
}

#[tokio::test]
async fn an_unknown_directive_is_refused_before_any_pod_and_heals_once_removed() {
    let mut env = Env::new("diag-directive").await;
    let _operator = env.start_leader().await;
    let name = "typo";
    create(
        &env,
        name,
        json!({"replicas": 1, "volume": {"enabled": false}, "tolerations": on_kwok(),
            "config": {"nonexistent-directive": "yes"}}),
    )
    .await;
    let v = wait_cause(
        &env,
        name,
        "UnknownDirective",
        &[
            "spec.config.nonexistent-directive",
            "valkey-server 9.1.2 has no directive",
        ],
        TIMEOUT,
    )
    .await;
    assert_eq!(
        v.status.as_ref().and_then(|s| s.status),
        Some(Phase::Failed)
    );
    warning_with_reason(&env, &v, "UnknownDirective").await;
    assert!(
        env.api::<StatefulSet>()
            .get_opt(name)
            .await
            .unwrap()
            .is_none(),
        "nothing is applied for a spec valkey-server would refuse"
    );

    // Removing the key (a merge patch with null) heals it.
    patch_spec(
        &env,
        name,
        json!({"config": {"nonexistent-directive": null, "maxmemory-policy": "allkeys-lru"}}),
    )
    .await;
    wait_running(&env, name, 1).await;
}

#[tokio::test]
async fn a_bad_value_on_a_running_instance_keeps_its_pods_and_says_why() {
    let mut env = Env::new("diag-value").await;
    let _operator = env.start_leader().await;
    let name = "value";
    create(
        &env,
        name,
        json!({"replicas": 1, "volume": {"enabled": false}}),
    )
    .await;
    wait_running(&env, name, 1).await;
    let before = pods(&env, name).await;

    patch_spec(&env, name, json!({"config": {"maxmemory-policy": "lru"}})).await;
    wait_cause(
        &env,
        name,
        "InvalidConfigValue",
        &["spec.config.maxmemory-policy", "\"lru\" is not one of"],
        TIMEOUT,
    )
    .await;
    let after = pods(&env, name).await;
    let uid = |m: &std::collections::BTreeMap<String, k8s_openapi::api::core::v1::Pod>| {
        m.values()
            .map(|p| p.metadata.uid.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(uid(&before), uid(&after), "the running pod is left alone");

    patch_spec(
        &env,
        name,
        json!({"config": {"maxmemory-policy": "allkeys-lru"}}),
    )
    .await;
    wait_running(&env, name, 1).await;
}

#[tokio::test]
async fn a_node_selector_matching_no_node_is_unschedulable_until_fixed() {
    let mut env = Env::new("diag-sched").await;
    let _operator = env.start_leader().await;
    let name = "nowhere";
    create(
        &env,
        name,
        json!({"replicas": 1, "volume": {"enabled": false}, "tolerations": on_kwok(),
            "nodeSelector": {"disk": "no-such-disk"}}),
    )
    .await;
    let v = wait_cause(
        &env,
        name,
        "Unschedulable",
        &[
            "pod nowhere-0 cannot be scheduled",
            "node affinity/selector",
        ],
        TIMEOUT,
    )
    .await;
    warning_with_reason(&env, &v, "Unschedulable").await;

    patch_spec(&env, name, json!({"nodeSelector": null})).await;
    // The StatefulSet only replaces a pending pod once it is gone; a stuck Pending pod of the
    // old revision is deleted by the StatefulSet controller when the template changes.
    wait_for(&env, name, "healed", KUBELET_TIMEOUT, |v| running(v, 1)).await;
}

/// Healed: Running, and the error gone from the status.
async fn wait_healed(env: &Env, name: &str) {
    wait_for(
        env,
        name,
        "healed, the error cleared",
        KUBELET_TIMEOUT,
        |v| {
            running(v, 1)?;
            match v.status.as_ref().map(|s| s.error.as_str()) {
                Some("") => Ok(()),
                other => Err(format!("error still {other:?}")),
            }
        },
    )
    .await;
}

/// On a real node: `save` has its own parser, so the directive table lets any word through and
/// valkey-server judges it; it refuses "bogus" and exits at start, again and again.
#[tokio::test]
async fn a_server_that_exits_at_start_is_crash_looping_with_its_log_until_fixed() {
    let mut env = Env::new("diag-crash").await;
    let _operator = env.start_leader().await;
    let name = "crash";
    create(
        &env,
        name,
        json!({"replicas": 1, "volume": {"enabled": false}, "config": {"save": "bogus"}}),
    )
    .await;
    let v = wait_cause(
        &env,
        name,
        "PodCrashLooping",
        &["pod crash-0 keeps crashing", "last log lines:", "save"],
        KUBELET_TIMEOUT,
    )
    .await;
    warning_with_reason(&env, &v, "PodCrashLooping").await;
    // Between two crashes the container runs for a moment and nothing is blamed yet; the
    // section is there again once it is down.
    harness::eventually("kubectl valkey status to say why", TIMEOUT, || async {
        let text = plugin_status(&env, name);
        text.contains("Why pods are not running")
            .then_some(())
            .ok_or(text)
    })
    .await;

    patch_spec(&env, name, json!({"config": {"save": null}})).await;
    wait_healed(&env, name).await;
}

/// On a real node: an image no registry serves (this machine has no registry access at all).
#[tokio::test]
async fn an_image_that_cannot_be_pulled_is_named_until_fixed() {
    let mut env = Env::new("diag-image").await;
    let _operator = env.start_leader().await;
    let name = "pull";
    let image = "valkey/valkey:0.0.0-no-such-tag";
    create(
        &env,
        name,
        json!({"replicas": 1, "volume": {"enabled": false}, "image": image}),
    )
    .await;
    let v = wait_cause(
        &env,
        name,
        "ImagePullFailed",
        &[
            &format!("pod pull-0 cannot pull image {image}"),
            "fix spec.image",
        ],
        KUBELET_TIMEOUT,
    )
    .await;
    warning_with_reason(&env, &v, "ImagePullFailed").await;

    patch_spec(&env, name, json!({"image": null})).await;
    wait_healed(&env, name).await;
}

/// A claim of a StorageClass that does not exist yet stays unbound: the pod waits for its volume.
/// Creating the class (served by the local cluster's provisioner) heals the instance.
#[tokio::test]
async fn a_volume_that_does_not_bind_is_named_until_its_class_exists() {
    let mut env = Env::new("diag-volume").await;
    let _operator = env.start_leader().await;
    let name = "unbound";
    let class = format!("later-{}", env.ns.name);
    create(
        &env,
        name,
        json!({"replicas": 1, "volume": {"storage": "1Gi", "storageClassName": class}}),
    )
    .await;
    let v = wait_cause(
        &env,
        name,
        "VolumeNotReady",
        &["pod unbound-0 waits for its volume", "data-unbound-0"],
        KUBELET_TIMEOUT,
    )
    .await;
    warning_with_reason(&env, &v, "VolumeNotReady").await;

    let classes: kube::Api<k8s_openapi::api::storage::v1::StorageClass> =
        kube::Api::all(env.client());
    classes
        .create(
            &kube::api::PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": class},
                "provisioner": "kwok.x-k8s.io/volume",
                "volumeBindingMode": "WaitForFirstConsumer",
                "reclaimPolicy": "Delete",
            }))
            .expect("a StorageClass"),
        )
        .await
        .expect("creating the StorageClass");
    wait_healed(&env, name).await;
    let _ = classes
        .delete(&class, &kube::api::DeleteParams::default())
        .await;
}

/// `kubectl valkey report NAME`: a new directory with the Valkey, its children, events, status,
/// each pod's log tail and INFO, and the versions; no password anywhere in it.
#[tokio::test]
async fn report_writes_a_support_bundle_without_any_secret_value() {
    let mut env = Env::new("diag-report").await;
    let _operator = env.start_leader().await;
    let name = "rep";
    create(&env, name, json!({"replicas": 2})).await;
    let running = wait_running(&env, name, 2).await;
    let primary = running
        .status
        .and_then(|s| s.primary)
        .expect("a Running instance names its primary");
    let names = valkey_core::api::names::ObjectNames::new(name);
    let password = secret_value(&env, &names.generated_secret(), "password").await;
    let operator_password = secret_value(&env, &names.operator_secret(), "password").await;

    let dir = env.dir.join("report");
    let run = |dir: &std::path::Path| {
        Command::new(plugin_bin())
            .args(["report", name, "-n", &env.ns.name, "--output-dir"])
            .arg(dir)
            .env("KUBECONFIG", support::cluster::kubeconfig_path())
            .output()
            .expect("running kubectl-valkey report")
    };
    let out = run(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "report failed: {stderr}");
    assert!(stderr.contains("written to"), "{stderr}");
    let read = |file: &str| {
        std::fs::read_to_string(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e} ({stderr})"))
    };
    assert!(read("valkey.yaml").contains("kind: Valkey"));
    assert!(read("statefulset.yaml").contains("kind: StatefulSet"));
    assert!(read("services.yaml").contains(&names.read_write_service()));
    assert!(read("secrets.yaml").contains(&names.generated_secret()));
    assert!(
        read("status.txt").contains("Running"),
        "{}",
        read("status.txt")
    );
    assert!(read("versions.txt").contains("Plugin version"));
    let primary_info = read(&format!("info/{primary}.txt"));
    assert!(primary_info.contains("role:master"), "{primary_info}");
    assert!(
        primary_info.contains("connected_slaves:1"),
        "{primary_info}"
    );
    let replica = (0..2)
        .map(|i| names.pod(i))
        .find(|p| *p != primary)
        .expect("a replica");
    assert!(read(&format!("info/{replica}.txt")).contains("role:slave"));
    assert!(
        !read(&format!("logs/{primary}.log")).trim().is_empty(),
        "the primary logged"
    );
    assert!(!dir.join("errors.txt").exists(), "{}", read("errors.txt"));

    // No secret value in any file.
    let mut files = vec![dir.clone()];
    let mut checked = 0;
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(
                std::fs::read_dir(&path)
                    .expect("listing")
                    .map(|e| e.expect("entry").path()),
            );
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("reading a report file");
        for secret in [&password, &operator_password] {
            assert!(
                !text.contains(secret.as_str()),
                "{} holds a password",
                path.display()
            );
        }
        checked += 1;
    }
    assert!(checked >= 12, "only {checked} files");

    // An existing directory is never written into.
    let again = run(&dir);
    assert!(!again.status.success());
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(stderr.contains("--output-dir"), "{stderr}");
}
