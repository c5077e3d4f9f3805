//! Live password rotation on the real pods of the local cluster's real nodes (hack/cluster with
//! VALKEY_OPERATOR_REAL_NODES >= 3): a 3-pod Valkey, the operator as its own process under the
//! shipped RBAC (the e2e harness), a writer through the read-write Service (chaos/traffic.rs),
//! and `kubectl valkey rotate-password`. Proves: the client that switches to the new password
//! once the read-write Service accepts it has zero failed writes, and the one on the old
//! password had none until then; no pod restarted (uids and restartCounts unchanged); every
//! replica keeps `master_link_status:up`; every pod accepts the new password and refuses the
//! old one at the end; `kubectl valkey cli` logs in on the primary and a replica; an operator
//! killed mid-rotation leaves it to the next one (the record is the ACL Secret); a pod deleted
//! afterwards comes back with the new password and replicates; no password in the operator's
//! log, events or status.
//!
//! Ignored by plain `cargo test` (real nodes, about 3 minutes):
//!
//!   cargo build -p kubectl-valkey
//!   cargo test -p valkey-operator --test rotation -- --ignored
//!
//! The figures (`rotation figures: {...}`) are printed; the writers' logs (one JSON line per
//! attempt) are under target/tmp/e2e/<namespace>/.

#[path = "e2e/harness.rs"]
#[allow(dead_code)]
mod harness;
#[path = "chaos/instance.rs"]
#[allow(dead_code)]
mod instance;
#[path = "e2e/observe.rs"]
#[allow(dead_code)]
mod observe;
#[path = "../../tests/support/mod.rs"]
mod support;
#[path = "chaos/traffic.rs"]
#[allow(dead_code)]
mod traffic;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::DeleteParams;
use serde_json::json;
use valkey_core::api::names::ObjectNames;
use valkey_core::api::{Phase, RotationPhase, defaults};
use valkey_core::desired::PORT;

use harness::{Env, eventually};
use instance::Instance;
use support::cluster;
use traffic::{Attempt, Clock, Target, Writer, WriterConfig};

const NAME: &str = "rotate";
const PODS: usize = 3;

/// (uid, restarts of every container) per pod.
fn identities(pods: &BTreeMap<String, Pod>) -> BTreeMap<String, (String, i32)> {
    pods.iter()
        .map(|(name, pod)| {
            let restarts = pod
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .map(|cs| cs.iter().map(|c| c.restart_count).sum())
                .unwrap_or(0);
            (name.clone(), (pod.uid().unwrap_or_default(), restarts))
        })
        .collect()
}

/// Logs in to `target` within 2 s: `Ok` when accepted, else the server's (or the network's) word.
async fn login(target: &Target) -> Result<(), String> {
    target.connect(Duration::from_secs(2)).await.map(|_| ())
}

/// A login refused by the server (the redis crate's words for WRONGPASS), not a network error.
fn refused_as_wrong_password(result: &Result<(), String>) -> bool {
    matches!(result, Err(e) if e.contains("WRONGPASS")
        || e.contains("invalid username-password")
        || e.contains("AuthenticationFailed"))
}

/// Every pod accepts `new` and refuses `old` (as a wrong password, not a network error).
async fn every_pod_has_only(
    env: &Env,
    instance: &Instance,
    new: &Target,
    old: &Target,
) -> Result<(), String> {
    for (name, pod) in instance.pods(env).await {
        let ip = observe::pod_ip(&pod).ok_or(format!("{name} has no IP"))?;
        let port = PORT as u16;
        login(&new.at(&ip, port))
            .await
            .map_err(|e| format!("{name} refuses the new password: {e}"))?;
        let old_login = login(&old.at(&ip, port)).await;
        if !refused_as_wrong_password(&old_login) {
            return Err(format!(
                "{name} does not refuse the old password as wrong: {old_login:?}"
            ));
        }
    }
    Ok(())
}

fn failures(attempts: &[Attempt]) -> Vec<&Attempt> {
    attempts.iter().filter(|a| a.errored()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real nodes: cargo test -p valkey-operator --test rotation -- --ignored"]
async fn a_password_rotation_restarts_no_pod_and_keeps_replication() {
    let mut env = Env::new("rotation").await;
    let mut operator = env.start_leader().await;
    observe::create(&env, NAME, json!({"replicas": PODS})).await;
    observe::wait_for(
        &env,
        NAME,
        "Running with every pod ready",
        Duration::from_secs(300),
        |v| {
            let s = v.status.as_ref().ok_or("no status")?;
            match (s.status, s.ready_replicas) {
                (Some(Phase::Running), ready) if ready == PODS as i32 => Ok(()),
                _ => Err("not yet".to_owned()),
            }
        },
    )
    .await;
    let instance = Instance::new(&env, NAME, PODS).await;
    eventually("the instance to settle", Duration::from_secs(60), || {
        instance.settled(&env, None)
    })
    .await;
    let before = identities(&instance.pods(&env).await);
    let old_password = instance.auth.password.clone();
    let old_auth = instance.auth.clone();
    let read_write = instance
        .read_write(&env)
        .await
        .expect("the read-write Service");
    // kube-proxy's rules for a new Service may lag its endpoints.
    eventually(
        "the read-write Service to take connections",
        Duration::from_secs(30),
        || login(&read_write),
    )
    .await;
    let clock = Clock::new();
    let writer_config = |target: Target, prefix: &str| WriterConfig {
        log: Some(env.dir.join(format!("writer-{prefix}.jsonl"))),
        ..WriterConfig::new(target, prefix)
    };
    let old_writer = Writer::start(writer_config(read_write.clone(), "old"), clock);
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The rotation, through the plugin, which waits for it (in the background).
    let started = clock.now();
    let bin = harness::plugin_bin();
    let namespace = env.ns.name.clone();
    let plugin = tokio::task::spawn_blocking(move || {
        Command::new(bin)
            .args(["rotate-password", NAME, "-n", &namespace, "--timeout", "5m"])
            .env("KUBECONFIG", cluster::kubeconfig_path())
            .output()
    });
    let secret = ObjectNames::new(NAME).generated_secret();
    let new_password = eventually(
        "the Secret to hold a new password",
        Duration::from_secs(30),
        || async {
            let value = observe::secret_value(&env, &secret, defaults::PASSWORD_KEY).await;
            if value == old_password {
                Err("still the old one".to_owned())
            } else {
                Ok(value)
            }
        },
    )
    .await;
    let new_auth = Target {
        password: new_password.clone(),
        ..old_auth.clone()
    };
    let new_read_write = Target {
        password: new_password.clone(),
        ..read_write.clone()
    };
    // The client switches once the read-write Service takes the new password.
    eventually(
        "the read-write Service to accept the new password",
        Duration::from_secs(60),
        || login(&new_read_write),
    )
    .await;
    let switched = clock.now();
    let new_writer = Writer::start(writer_config(new_read_write.clone(), "new"), clock);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let old_attempts = old_writer.stop().await;

    // An operator killed mid-rotation: the next one finishes it from the ACL Secret's record.
    let rotating = observe::get(&env, NAME).await;
    let phase = rotating
        .status
        .as_ref()
        .and_then(|s| s.password_rotation.as_ref())
        .map(|r| r.phase);
    assert_eq!(
        phase,
        Some(RotationPhase::Rotating),
        "the old password is kept for the file-sync grace: the rotation runs"
    );
    let first_log = operator.log_text();
    operator.kill();
    operator = env.start_leader().await;

    let out = plugin
        .await
        .expect("joining the plugin")
        .expect("running kubectl-valkey");
    let done = clock.now();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "rotate-password failed: {text}");
    assert!(
        !text.contains(&new_password),
        "the plugin printed the password"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let new_attempts = new_writer.stop().await;

    // The writers.
    let old_failed = failures(&old_attempts);
    assert!(
        old_failed.is_empty(),
        "the client on the old password failed before it switched: {:?}",
        old_failed.first()
    );
    let new_failed = failures(&new_attempts);
    assert!(
        new_failed.is_empty(),
        "{} of {} writes with the new password failed, first: {:?}",
        new_failed.len(),
        new_attempts.len(),
        new_failed.first()
    );
    let acked = new_attempts.iter().filter(|a| a.acked()).count();
    assert!(
        acked > 100,
        "only {acked} acknowledged writes with the new password"
    );
    let unacked = new_attempts.iter().filter(|a| !a.acked()).count()
        + old_attempts.iter().filter(|a| !a.acked()).count();

    // The pods: none restarted, replication up, only the new password.
    let after = identities(&instance.pods(&env).await);
    assert_eq!(before, after, "a pod was replaced or restarted");
    // The instance as new clients see it: through the new password only.
    let probe = Instance {
        name: instance.name.clone(),
        replicas: instance.replicas,
        auth: new_auth.clone(),
    };
    let settled = eventually("the instance to settle", Duration::from_secs(30), || {
        probe.settled(&env, None)
    })
    .await;
    let valkey = observe::get(&env, NAME).await;
    let rotation = valkey
        .status
        .as_ref()
        .and_then(|s| s.password_rotation.clone())
        .expect("status.passwordRotation");
    assert_eq!(rotation.phase, RotationPhase::Complete);
    eventually(
        "every pod to accept only the new password",
        Duration::from_secs(10),
        || every_pod_has_only(&env, &probe, &new_auth, &old_auth),
    )
    .await;
    let old_through_service = login(&read_write).await;
    assert!(
        refused_as_wrong_password(&old_through_service),
        "the read-write Service takes the old password: {old_through_service:?}"
    );

    // `kubectl valkey cli` logs in with the new password (the pod's mounted files, not the
    // container's environment, which still holds the old one).
    for args in [vec!["--replica"], vec![]] {
        let bin = harness::plugin_bin();
        let namespace = env.ns.name.clone();
        let out = tokio::task::spawn_blocking(move || {
            let mut command = Command::new(bin);
            command.args(["cli", NAME, "-n", &namespace]);
            command.args(args);
            command
                .args(["--", "PING"])
                .env("KUBECONFIG", cluster::kubeconfig_path())
                .output()
        })
        .await
        .expect("joining the plugin")
        .expect("running kubectl-valkey");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success() && text.trim() == "PONG",
            "kubectl valkey cli after the rotation: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // A pod deleted after the rotation comes back with the new password and replicates.
    let replica = after
        .keys()
        .find(|p| **p != settled.primary)
        .cloned()
        .expect("a replica");
    let old_uid = after[&replica].0.clone();
    env.api::<Pod>()
        .delete(&replica, &DeleteParams::default())
        .await
        .expect("deleting a replica");
    eventually(
        "the deleted replica to come back and replicate",
        Duration::from_secs(180),
        || async {
            let pods = probe.pods(&env).await;
            let pod = pods.get(&replica).ok_or("not recreated yet")?;
            if pod.uid().as_deref() == Some(old_uid.as_str()) {
                return Err("the old pod is still there".to_owned());
            }
            probe.settled(&env, None).await.map(|_| ())
        },
    )
    .await;
    eventually(
        "every pod, the recreated one too, to accept only the new password",
        Duration::from_secs(10),
        || every_pod_has_only(&env, &probe, &new_auth, &old_auth),
    )
    .await;

    let figures = json!({
        "rotation_seconds": done - started,
        "switch_after_seconds": switched - started,
        "writes_old_password": old_attempts.len(),
        "failed_old_password": old_failed.len(),
        "writes_new_password": new_attempts.len(),
        "failed_new_password": new_failed.len(),
        "unacknowledged": unacked,
        "pods_restarted": 0,
    });
    println!("rotation figures: {figures}");
    let logs = [
        ("the first operator's log", first_log),
        ("the second operator's log", operator.log_text()),
    ];
    observe::assert_secret_not_leaked(&env, &old_password, &logs).await;
    observe::assert_secret_not_leaked(&env, &new_password, &logs).await;
}
