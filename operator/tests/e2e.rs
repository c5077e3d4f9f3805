//! End to end: the `valkey-operator` binary, run as its own process under the ServiceAccount and
//! RBAC of manifests/, against the local cluster (hack/cluster: a real kube-apiserver,
//! kube-controller-manager and scheduler, real nodes where the Valkey pods run). Each test has its
//! own namespace (restricted Pod Security), its own operator(s) and leader Lease; operator logs
//! are under target/tmp/e2e/<namespace>/ and printed when a test fails.
//!
//!   cargo test -p valkey-operator --test e2e

#[path = "e2e/harness.rs"]
mod harness;
#[path = "e2e/observe.rs"]
mod observe;
#[path = "../../tests/support/mod.rs"]
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, watcher};
use kube::{Api, ResourceExt};
use serde_json::json;
use valkey_core::api::names::{ObjectNames, labels, roles};
use valkey_core::api::{Phase, Valkey};
use valkey_core::desired::{CONFIG_HASH_ANNOTATION, VALKEY_CONF_KEY};

use harness::{Env, TIMEOUT, eventually};
use observe::*;

fn merge(spec: serde_json::Value) -> Patch<serde_json::Value> {
    Patch::Merge(json!({ "spec": spec }))
}

fn uids(pods: &BTreeMap<String, Pod>) -> BTreeMap<String, String> {
    pods.iter()
        .map(|(n, p)| (n.clone(), p.uid().unwrap_or_default()))
        .collect()
}

fn template_hash(sts: &StatefulSet) -> Option<String> {
    sts.spec
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(CONFIG_HASH_ANNOTATION)
        .cloned()
}

/// Waits until every pod of the instance is a new one (not in `old`), runs the StatefulSet's
/// update revision and is Ready; returns them.
async fn wait_rolled(
    env: &Env,
    name: &str,
    replicas: usize,
    old: &BTreeMap<String, String>,
) -> BTreeMap<String, Pod> {
    let sts_api = env.api::<StatefulSet>();
    eventually(
        &format!("the pods of {name} to roll"),
        TIMEOUT * 2,
        || async {
            let sts = sts_api.get(name).await.map_err(|e| e.to_string())?;
            let update = sts
                .status
                .as_ref()
                .and_then(|s| s.update_revision.clone())
                .ok_or("no update revision")?;
            let pods = pods(env, name).await;
            if pods.len() != replicas {
                return Err(format!("{} pods", pods.len()));
            }
            for (pod_name, pod) in &pods {
                if old.get(pod_name) == pod.uid().as_ref() {
                    return Err(format!("{pod_name} is still the old pod"));
                }
                let revision = pod.labels().get("controller-revision-hash");
                if revision != Some(&update) {
                    return Err(format!("{pod_name} runs {revision:?}, not {update}"));
                }
                if !valkey_core::status::is_ready(pod) {
                    return Err(format!("{pod_name} is not Ready"));
                }
            }
            Ok(pods)
        },
    )
    .await
}

/// Follows `status.primary` of an instance until stopped: the primaries it named, in order,
/// each once per stretch (so two entries are one move of the role).
struct PrimaryLog {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Vec<String>>,
}

impl PrimaryLog {
    fn start(env: &Env, name: &str) -> Self {
        let api = env.api::<Valkey>();
        let name = name.to_owned();
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut seen: Vec<String> = Vec::new();
            loop {
                if let Ok(Some(v)) = api.get_opt(&name).await
                    && let Some(primary) = v.status.and_then(|s| s.primary)
                    && seen.last() != Some(&primary)
                {
                    seen.push(primary);
                }
                tokio::select! {
                    _ = &mut stopped => return seen,
                    () = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
            }
        });
        Self { stop, task }
    }

    async fn stop(self) -> Vec<String> {
        let _ = self.stop.send(());
        self.task.await.expect("the primary log")
    }
}

/// A rollout of a replicated instance moved the primary role exactly once, last, by a planned
/// switchover recorded as such.
fn assert_moved_once_by_the_rollout(valkey: &Valkey, primaries: &[String]) {
    assert_eq!(
        primaries.len(),
        2,
        "the primary role moved once during the rollout: {primaries:?}"
    );
    let last = valkey
        .status
        .as_ref()
        .and_then(|s| s.last_failover.as_ref())
        .expect("status.lastFailover");
    assert_eq!(last.reason, "Rollout", "{last:?}");
    assert_eq!(
        last.from.as_deref(),
        Some(primaries[0].as_str()),
        "{last:?}"
    );
    assert_eq!(last.to, primaries[1], "{last:?}");
}

/// Scenario 1: a replicated instance (docs/examples/replicated.yaml) gets every object it needs,
/// owned and labelled; its pods become Ready and get their roles; the status says Running; the
/// read-write Service reaches the primary only; events tell the story; the password leaks nowhere.
#[tokio::test]
async fn a_replicated_instance_gets_its_objects_roles_endpoints_status_and_events() {
    let mut env = Env::new("e2e-create").await;
    let operator = env.start_leader().await;
    let example = std::fs::read_to_string(
        support::cluster::repo_root().join("docs/examples/replicated.yaml"),
    )
    .expect("reading docs/examples/replicated.yaml");
    let mut valkey: Valkey = yaml_serde::from_str(&example).expect("parsing the example");
    assert_eq!(valkey.spec.replicas, 3, "the example has 3 replicas");
    let name = valkey.name_any();
    valkey.metadata.namespace = Some(env.ns.name.clone());
    env.api::<Valkey>()
        .create(&PostParams::default(), &valkey)
        .await
        .expect("creating the example");

    let valkey = wait_running(&env, &name, 3).await;
    let status = valkey.status.clone().expect("a status");
    assert_eq!(
        status.primary.as_deref(),
        Some(format!("{name}-0").as_str())
    );
    assert_eq!(status.observed_generation, valkey.metadata.generation);
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("a Ready condition");
    assert_eq!(ready.status, "True", "{ready:?}");
    assert_eq!(ready.observed_generation, valkey.metadata.generation);

    // Every child exists, owned by the Valkey and labelled as the instance's.
    let names = ObjectNames::new(&name);
    let mut checked = Vec::new();
    for secret in [names.generated_secret(), names.acl_secret()] {
        let s = env.api::<Secret>().get(&secret).await.expect(&secret);
        checked.push(owned_and_labelled("Secret", &s.metadata, &valkey));
    }
    let cm = env
        .api::<ConfigMap>()
        .get(&names.config_map())
        .await
        .expect("the ConfigMap");
    checked.push(owned_and_labelled("ConfigMap", &cm.metadata, &valkey));
    let sts = env
        .api::<StatefulSet>()
        .get(&names.statefulset())
        .await
        .expect("the StatefulSet");
    checked.push(owned_and_labelled("StatefulSet", &sts.metadata, &valkey));
    assert_eq!(sts.spec.replicas, Some(3));
    for service in [
        names.read_write_service(),
        names.read_only_service(),
        names.headless_service(),
    ] {
        let s = env.api::<Service>().get(&service).await.expect(&service);
        checked.push(owned_and_labelled("Service", &s.metadata, &valkey));
    }
    let pdb = env
        .api::<PodDisruptionBudget>()
        .get(&names.pod_disruption_budget())
        .await
        .expect("the PodDisruptionBudget");
    checked.push(owned_and_labelled(
        "PodDisruptionBudget",
        &pdb.metadata,
        &valkey,
    ));
    let problems: Vec<String> = checked.into_iter().filter_map(Result::err).collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    // Roles: pod 0 is the primary, the others replicas.
    let pods = pods(&env, &name).await;
    assert_eq!(
        pods.keys().cloned().collect::<Vec<_>>(),
        [0, 1, 2].map(|i| names.pod(i)).to_vec()
    );
    for (pod_name, pod) in &pods {
        let expected = if *pod_name == names.pod(0) {
            roles::PRIMARY
        } else {
            roles::REPLICA
        };
        assert_eq!(
            pod.labels().get(labels::ROLE).map(String::as_str),
            Some(expected),
            "role of {pod_name}"
        );
    }

    // The read-write Service reaches the primary only; the read-only one the replicas.
    let ip = |n: i32| pod_ip(&pods[&names.pod(n)]).expect("a pod IP");
    let primary_ips = BTreeSet::from([ip(0)]);
    let replica_ips = BTreeSet::from([ip(1), ip(2)]);
    for (service, expected) in [
        (names.read_write_service(), primary_ips),
        (names.read_only_service(), replica_ips),
    ] {
        eventually(
            &format!("the endpoints of Service {service}"),
            TIMEOUT,
            || async {
                let got = endpoint_addresses(&env, &service).await;
                (got == expected)
                    .then_some(())
                    .ok_or(format!("{got:?}, want {expected:?}"))
            },
        )
        .await;
    }

    // A Normal event from the operator tells what it created.
    let created = wait_event(&env, &valkey, "Normal Created", |e| {
        e.type_.as_deref() == Some("Normal") && e.reason.as_deref() == Some("Created")
    })
    .await;
    let note = created.note.clone().unwrap_or_default();
    assert!(
        note.contains(&format!("StatefulSet {name}")),
        "the Created event names the StatefulSet: {note}"
    );
    assert_eq!(
        created.reporting_instance.as_deref(),
        Some(operator.identity.as_str())
    );

    // The generated password is in its Secret and nowhere else.
    let password = secret_value(&env, &names.generated_secret(), "password").await;
    assert!(password.len() >= 16, "a strong password");
    let cm_text = serde_json::to_string(&cm.data).expect("serializing the ConfigMap");
    let sts_text = serde_json::to_string(&sts).expect("serializing the StatefulSet");
    assert_secret_not_leaked(
        &env,
        &password,
        &[
            ("the operator's log", operator.log_text()),
            ("the ConfigMap", cm_text),
            ("the StatefulSet", sts_text),
        ],
    )
    .await;
    assert_no_warnings(&env, &valkey).await;
}

/// Scenario 2: changing the memory, then the config, rolls the pods each time and the status
/// returns to Running for the new generation.
#[tokio::test]
async fn memory_and_config_changes_roll_the_pods() {
    let mut env = Env::new("e2e-roll").await;
    let _operator = env.start_leader().await;
    let name = "roll";
    create(
        &env,
        name,
        json!({"replicas": 3, "resource": {"memory": "256Mi"}}),
    )
    .await;
    wait_running(&env, name, 3).await;
    let sts_api = env.api::<StatefulSet>();
    let before = pods(&env, name).await;
    let first_hash = template_hash(&sts_api.get(name).await.unwrap()).expect("a config hash");

    // Memory: the pods are replaced by pods with the new request and limit.
    let primaries = PrimaryLog::start(&env, name);
    env.api::<Valkey>()
        .patch(
            name,
            &PatchParams::default(),
            &merge(json!({"resource": {"memory": "384Mi"}})),
        )
        .await
        .expect("changing the memory");
    let rolled = wait_rolled(&env, name, 3, &uids(&before)).await;
    for (pod_name, pod) in &rolled {
        let resources = pod.spec.as_ref().unwrap().containers[0]
            .resources
            .clone()
            .unwrap_or_default();
        let memory = |m: Option<BTreeMap<_, _>>| m.and_then(|m| m.get("memory").cloned());
        assert_eq!(
            memory(resources.requests).map(|q| q.0),
            Some("384Mi".to_owned()),
            "{pod_name}"
        );
        assert_eq!(
            memory(resources.limits).map(|q| q.0),
            Some("384Mi".to_owned()),
            "{pod_name}"
        );
    }
    let valkey = wait_running(&env, name, 3).await;
    assert_moved_once_by_the_rollout(&valkey, &primaries.stop().await);

    // Config: the ConfigMap gets the directive, the config hash changes, the pods roll again.
    let primaries = PrimaryLog::start(&env, name);
    env.api::<Valkey>()
        .patch(
            name,
            &PatchParams::default(),
            &merge(json!({"config": {"maxmemory-policy": "allkeys-lru"}})),
        )
        .await
        .expect("changing the config");
    let again = wait_rolled(&env, name, 3, &uids(&rolled)).await;
    let sts = sts_api.get(name).await.unwrap();
    let second_hash = template_hash(&sts).expect("a config hash");
    assert_ne!(first_hash, second_hash, "the config hash changed");
    for (pod_name, pod) in &again {
        assert_eq!(
            pod.annotations().get(CONFIG_HASH_ANNOTATION),
            Some(&second_hash),
            "{pod_name} runs the new config"
        );
    }
    let conf = env
        .api::<ConfigMap>()
        .get(&ObjectNames::new(name).config_map())
        .await
        .unwrap()
        .data
        .unwrap_or_default()
        .remove(VALKEY_CONF_KEY)
        .unwrap_or_default();
    assert!(
        conf.lines().any(
            |l| l.split_whitespace().collect::<Vec<_>>() == ["maxmemory-policy", "allkeys-lru"]
        ),
        "valkey.conf has the directive:\n{conf}"
    );
    let valkey = wait_running(&env, name, 3).await;
    assert_moved_once_by_the_rollout(&valkey, &primaries.stop().await);
    assert_no_warnings(&env, &valkey).await;
}

/// `kubectl valkey restart`: every pod is replaced, one at a time, the replicas first; the
/// primary role is handed over once, and the old primary's pod restarts last.
#[tokio::test]
async fn a_restart_through_the_plugin_restarts_every_pod_the_primary_last() {
    let mut env = Env::new("e2e-restart").await;
    let _operator = env.start_leader().await;
    let name = "restart";
    create(&env, name, json!({"replicas": 3})).await;
    let running = wait_running(&env, name, 3).await;
    let old_primary = running
        .status
        .and_then(|s| s.primary)
        .expect("a Running instance names its primary");
    let before = uids(&pods(&env, name).await);

    let primaries = PrimaryLog::start(&env, name);
    // Async: the primary log runs on this test's runtime meanwhile.
    let out = tokio::process::Command::new(harness::plugin_bin())
        .args(["restart", name, "-n", &env.ns.name, "--timeout", "5m"])
        .env("KUBECONFIG", support::cluster::kubeconfig_path())
        .output()
        .await
        .expect("running kubectl-valkey restart");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "restart failed: {stdout}{stderr}");
    assert!(stdout.contains("restarted 3 pods"), "{stdout}");
    let valkey = wait_running(&env, name, 3).await;
    assert_moved_once_by_the_rollout(&valkey, &primaries.stop().await);

    let after = pods(&env, name).await;
    for (pod_name, pod) in &after {
        assert_ne!(
            before.get(pod_name),
            pod.uid().as_ref(),
            "{pod_name} was not restarted"
        );
    }
    // The old primary's pod is the newest: it restarted after the role had moved.
    let created = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let newest = after
        .iter()
        .max_by_key(|(_, p)| created(p))
        .map(|(n, _)| n.clone());
    assert_eq!(newest.as_deref(), Some(old_primary.as_str()), "{stderr}");
    assert_no_warnings(&env, &valkey).await;

    // An instance that does not exist: a clear error.
    let out = std::process::Command::new(harness::plugin_bin())
        .args(["restart", "no-such-instance", "-n", &env.ns.name])
        .env("KUBECONFIG", support::cluster::kubeconfig_path())
        .output()
        .expect("running kubectl-valkey restart");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not found"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Scenario 3: scaling 3 -> 1 -> 0 -> 2 through the scale subresource (`kubectl scale`).
#[tokio::test]
async fn scaling_to_one_zero_and_back_keeps_status_pdb_and_volumes_right() {
    let mut env = Env::new("e2e-scale").await;
    let _operator = env.start_leader().await;
    let name = "scale";
    let names = ObjectNames::new(name);
    create(&env, name, json!({"replicas": 3})).await;
    let valkey = wait_running(&env, name, 3).await;
    let pdbs = env.api::<PodDisruptionBudget>();
    let pvcs = env.api::<PersistentVolumeClaim>();
    assert!(pdbs.get_opt(name).await.unwrap().is_some(), "a PDB at 3");
    let claims_before = claim_uids(&pvcs, name).await;
    assert_eq!(claims_before.len(), 3, "{claims_before:?}");

    let scale = |n: i32| {
        let api = env.api::<Valkey>();
        async move {
            api.patch_scale(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": n}})),
            )
            .await
            .unwrap_or_else(|e| panic!("scaling to {n}: {e}"));
        }
    };

    // 3 -> 1: a standalone primary, no PDB.
    scale(1).await;
    let one = wait_running(&env, name, 1).await;
    assert_eq!(
        one.status.as_ref().unwrap().primary.as_deref(),
        Some(names.pod(0).as_str())
    );
    eventually("2 pods gone", TIMEOUT, || async {
        let left = pods(&env, name).await;
        (left.len() == 1)
            .then_some(())
            .ok_or(format!("pods {:?}", left.keys()))
    })
    .await;
    eventually("the PDB gone at 1 replica", TIMEOUT, || async {
        match pdbs.get_opt(name).await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    // 1 -> 0: Stopped, no pod, every volume kept.
    scale(0).await;
    wait_for(&env, name, "Stopped", TIMEOUT, |v| {
        let s = v.status.as_ref().ok_or("no status")?;
        (s.status == Some(Phase::Stopped)
            && s.ready_replicas == 0
            && s.primary.is_none()
            && s.observed_generation == v.metadata.generation)
            .then_some(())
            .ok_or_else(|| "not Stopped with 0 ready and no primary".to_owned())
    })
    .await;
    eventually("no pod left", TIMEOUT, || async {
        let left = pods(&env, name).await;
        left.is_empty()
            .then_some(())
            .ok_or(format!("pods {:?}", left.keys()))
    })
    .await;
    assert_eq!(
        claim_uids(&pvcs, name).await,
        claims_before,
        "stopping keeps every volume"
    );

    // 0 -> 2: Running again on the same volumes, with a PDB.
    scale(2).await;
    wait_running(&env, name, 2).await;
    eventually("the PDB back at 2 replicas", TIMEOUT, || async {
        match pdbs.get_opt(name).await {
            Ok(Some(_)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let claims_after = claim_uids(&pvcs, name).await;
    for i in 0..2 {
        let claim = names.volume_claim(i);
        assert_eq!(
            claims_after.get(&claim),
            claims_before.get(&claim),
            "pod {i} is back on its own volume"
        );
    }

    for (from, to) in [(3, 1), (1, 0), (0, 2)] {
        let note = format!("scaled from {from} to {to} pods");
        wait_event(&env, &valkey, &format!("Scaled: {note}"), |e| {
            e.reason.as_deref() == Some("Scaled") && e.note.as_deref() == Some(note.as_str())
        })
        .await;
    }
    // Scaling down relabels no terminating pod (which would fail once the pod is gone).
    assert_no_warnings(&env, &valkey).await;
}

async fn claim_uids(pvcs: &Api<PersistentVolumeClaim>, name: &str) -> BTreeMap<String, String> {
    pvcs.list(
        &kube::api::ListParams::default().labels(&valkey_core::api::names::instance_selector(name)),
    )
    .await
    .expect("listing PVCs")
    .items
    .into_iter()
    .filter(|c| c.metadata.deletion_timestamp.is_none())
    .map(|c| (c.name_any(), c.uid().unwrap_or_default()))
    .collect()
}

/// Scenario 4: deleting the read-write Service, then the StatefulSet: the operator notices (it
/// watches what it owns) and recreates both under the same names.
#[tokio::test]
async fn deleted_children_are_recreated() {
    let mut env = Env::new("e2e-heal").await;
    let _operator = env.start_leader().await;
    let name = "heal";
    create(&env, name, json!({"replicas": 2})).await;
    let valkey = wait_running(&env, name, 2).await;

    let services = env.api::<Service>();
    let old = services.get(name).await.expect("the read-write Service");
    services
        .delete(name, &DeleteParams::default())
        .await
        .expect("deleting the Service");
    let new = eventually("the read-write Service to come back", TIMEOUT, || async {
        match services.get_opt(name).await {
            Ok(Some(s)) if s.uid() != old.uid() => Ok(s),
            other => Err(format!("{:?}", other.map(|s| s.map(|s| s.uid())))),
        }
    })
    .await;
    owned_and_labelled("Service", &new.metadata, &valkey).unwrap();
    assert_eq!(
        new.spec.and_then(|s| s.selector),
        old.spec.and_then(|s| s.selector),
        "the same selector"
    );
    let primary_ip = pod_ip(&pods(&env, name).await[&format!("{name}-0")]).unwrap();
    eventually("the new Service to reach the primary", TIMEOUT, || async {
        let got = endpoint_addresses(&env, name).await;
        (got == BTreeSet::from([primary_ip.clone()]))
            .then_some(())
            .ok_or(format!("{got:?}"))
    })
    .await;

    let statefulsets = env.api::<StatefulSet>();
    let old = statefulsets.get(name).await.expect("the StatefulSet");
    statefulsets
        .delete(name, &DeleteParams::default())
        .await
        .expect("deleting the StatefulSet");
    let new = eventually("the StatefulSet to come back", TIMEOUT, || async {
        match statefulsets.get_opt(name).await {
            Ok(Some(s)) if s.uid() != old.uid() => Ok(s),
            other => Err(format!("{:?}", other.map(|s| s.map(|s| s.uid())))),
        }
    })
    .await;
    owned_and_labelled("StatefulSet", &new.metadata, &valkey).unwrap();
    wait_running(&env, name, 2).await;
    eventually(
        "the pods to belong to the new StatefulSet",
        TIMEOUT,
        || async {
            let pods = pods(&env, name).await;
            let owned_by_new = |p: &Pod| {
                p.owner_references()
                    .iter()
                    .any(|o| Some(&o.uid) == new.uid().as_ref())
            };
            (pods.len() == 2 && pods.values().all(owned_by_new))
                .then_some(())
                .ok_or(format!("pods {:?}", pods.keys()))
        },
    )
    .await;
    assert_no_warnings(&env, &valkey).await;
}

/// Scenario 5: spec.passwordSecret naming a missing Secret fails with an error naming it;
/// creating the Secret heals the instance, the same operator process still running.
#[tokio::test]
async fn a_missing_password_secret_fails_in_words_then_heals_once_created() {
    let mut env = Env::new("e2e-secret").await;
    let mut operator = env.start_leader().await;
    let name = "byo";
    let secret_name = "byo-password";
    create(
        &env,
        name,
        json!({"replicas": 1, "passwordSecret": {"name": secret_name, "key": "pw"}}),
    )
    .await;
    let failed = wait_for(&env, name, "Failed naming the Secret", TIMEOUT, |v| {
        let s = v.status.as_ref().ok_or("no status")?;
        (s.status == Some(Phase::Failed) && s.error.contains(secret_name))
            .then_some(())
            .ok_or_else(|| "not Failed with the Secret named".to_owned())
    })
    .await;
    let ready = failed
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .cloned()
        .expect("a Ready condition");
    assert_eq!(ready.status, "False", "{ready:?}");
    wait_event(&env, &failed, "a Warning naming the Secret", |e| {
        e.type_.as_deref() == Some("Warning")
            && e.note.as_deref().is_some_and(|n| n.contains(secret_name))
    })
    .await;
    assert!(
        env.api::<Secret>()
            .get_opt(&ObjectNames::new(name).generated_secret())
            .await
            .unwrap()
            .is_none(),
        "no password is generated when the user names a Secret"
    );

    let password = "e2e-user-supplied-password-3f9c1a";
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": secret_name},
        "stringData": {"pw": password},
    }))
    .unwrap();
    env.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .expect("creating the password Secret");
    wait_running(&env, name, 1).await;
    assert!(operator.running(), "the same operator process healed it");
    assert_secret_not_leaked(
        &env,
        password,
        &[("the operator's log", operator.log_text())],
    )
    .await;
}

/// spec.networkPolicy: the NetworkPolicy appears with the peers the spec asks for (the
/// instance's pods, the operator's pods in the operator's namespace, the chosen clients; the
/// exporter port from the chosen namespaces), follows a change, and goes when turned off. The
/// local cluster enforces no NetworkPolicy: this checks the object, not the traffic.
#[tokio::test]
async fn a_network_policy_follows_spec_network_policy() {
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    let mut env = Env::new("e2e-netpol").await;
    let _operator = env.start_leader().await;
    let name = "fenced";
    create(
        &env,
        name,
        json!({
            "replicas": 1,
            "metrics": {"enabled": true},
            "networkPolicy": {
                "enabled": true,
                "clientSelector": {"matchLabels": {"role": "client"}},
                "metricsNamespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
            },
        }),
    )
    .await;
    let policies = env.api::<NetworkPolicy>();
    let policy_name = ObjectNames::new(name).network_policy();
    let spec_of = |p: &NetworkPolicy| serde_json::to_value(&p.spec).unwrap_or_default();
    let live = eventually("the NetworkPolicy", TIMEOUT, || async {
        policies
            .get_opt(&policy_name)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "no NetworkPolicy yet".to_owned())
    })
    .await;
    let valkey = get(&env, name).await;
    owned_and_labelled("NetworkPolicy", &live.metadata, &valkey).unwrap();
    let spec = spec_of(&live);
    let instance = json!({"matchLabels": {"app.kubernetes.io/instance": name, "app.kubernetes.io/name": "valkey"}});
    assert_eq!(spec["podSelector"], instance, "{spec}");
    assert_eq!(spec["policyTypes"], json!(["Ingress"]), "{spec}");
    assert_eq!(
        spec["ingress"][0],
        json!({
            "from": [
                {"podSelector": instance},
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": harness::OPERATOR_NAMESPACE}},
                    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "valkey-operator"}},
                },
                {"podSelector": {"matchLabels": {"role": "client"}}},
            ],
            "ports": [{"port": 6379, "protocol": "TCP"}],
        }),
        "{spec}"
    );
    assert_eq!(
        spec["ingress"][1],
        json!({
            "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
            "ports": [{"port": 9121, "protocol": "TCP"}],
        }),
        "{spec}"
    );
    // Metrics off: the exporter port's rule goes with them.
    env.api::<Valkey>()
        .patch(
            name,
            &PatchParams::default(),
            &merge(json!({"metrics": {"enabled": false}})),
        )
        .await
        .expect("turning metrics off");
    eventually("the exporter rule to go", TIMEOUT, || async {
        let live = policies
            .get(&policy_name)
            .await
            .map_err(|e| e.to_string())?;
        let rules = spec_of(&live)["ingress"].as_array().map_or(0, Vec::len);
        (rules == 1)
            .then_some(())
            .ok_or_else(|| format!("{rules} ingress rules"))
    })
    .await;
    env.api::<Valkey>()
        .patch(
            name,
            &PatchParams::default(),
            &merge(json!({"networkPolicy": {"enabled": false}})),
        )
        .await
        .expect("turning the NetworkPolicy off");
    eventually("the NetworkPolicy to go", TIMEOUT, || async {
        match policies
            .get_opt(&policy_name)
            .await
            .map_err(|e| e.to_string())?
        {
            None => Ok(()),
            Some(_) => Err("still there".to_owned()),
        }
    })
    .await;
}

/// Scenario 6: deleting a Valkey keeps its volumes with reclaimPolicy Retain (the default) and
/// removes them with Delete.
#[tokio::test]
async fn deleting_keeps_volumes_with_retain_and_removes_them_with_delete() {
    let mut env = Env::new("e2e-reclaim").await;
    let _operator = env.start_leader().await;
    create(&env, "keep", json!({"replicas": 2})).await;
    create(
        &env,
        "drop",
        json!({"replicas": 2, "volume": {"reclaimPolicy": "Delete"}}),
    )
    .await;
    wait_running(&env, "keep", 2).await;
    wait_running(&env, "drop", 2).await;
    let pvcs = env.api::<PersistentVolumeClaim>();
    let kept = claim_uids(&pvcs, "keep").await;
    let expected: BTreeSet<String> = (0..2)
        .map(|i| ObjectNames::new("keep").volume_claim(i))
        .collect();
    assert_eq!(kept.keys().cloned().collect::<BTreeSet<_>>(), expected);
    assert_eq!(claim_uids(&pvcs, "drop").await.len(), 2);

    for name in ["keep", "drop"] {
        env.api::<Valkey>()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("deleting {name}: {e}"));
    }
    // Everything of both goes: StatefulSet, pods, Services, ConfigMap, Secrets, PDB.
    for name in ["keep", "drop"] {
        eventually(&format!("the objects of {name} gone"), TIMEOUT, || async {
            let left = instance_objects(&env, name).await;
            let pods = pods(&env, name).await;
            (left.is_empty() && pods.is_empty())
                .then_some(())
                .ok_or(format!("left: {left:?}, pods {:?}", pods.keys()))
        })
        .await;
    }
    eventually("the volumes of drop removed", TIMEOUT, || async {
        let left = names_of(&pvcs, |c| c.name_any().starts_with("data-drop-")).await;
        left.is_empty().then_some(()).ok_or(format!("{left:?}"))
    })
    .await;
    assert_eq!(
        claim_uids(&pvcs, "keep").await,
        kept,
        "the volumes of keep are kept (and not terminating)"
    );
}

/// The operator-made objects of an instance in the namespace, as "Kind/name" (by instance
/// label; pods and volumes aside).
async fn instance_objects(env: &Env, name: &str) -> Vec<String> {
    let selector = valkey_core::api::names::instance_selector(name);
    let lp = kube::api::ListParams::default().labels(&selector);
    let mut found = Vec::new();
    macro_rules! collect {
        ($kind:ty, $label:expr) => {
            for o in env.api::<$kind>().list(&lp).await.expect("listing").items {
                found.push(format!("{}/{}", $label, o.name_any()));
            }
        };
    }
    collect!(Secret, "Secret");
    collect!(ConfigMap, "ConfigMap");
    collect!(StatefulSet, "StatefulSet");
    collect!(Service, "Service");
    collect!(PodDisruptionBudget, "PodDisruptionBudget");
    found.sort();
    found
}

/// Scenario 7: the operator is killed (SIGKILL) right after a Valkey is created, before it
/// runs; a new process (the same Lease, once it expires) finishes the work, with exactly one of
/// each object and nothing orphaned.
#[tokio::test]
async fn a_killed_operator_is_replaced_and_leaves_no_duplicate_or_orphan() {
    let mut env = Env::new("e2e-crash").await;
    let mut first = env.start_leader().await;
    let name = "crash";
    // Kill it the moment its first write (the generated password's Secret) shows up: in the
    // middle of its first reconcile, long before the pods can be Ready.
    let first_write = watcher(
        env.api::<Secret>(),
        watcher::Config::default().fields(&format!(
            "metadata.name={}",
            ObjectNames::new(name).generated_secret()
        )),
    );
    let mut first_write = std::pin::pin!(first_write);
    create(&env, name, json!({"replicas": 3})).await;
    tokio::time::timeout(TIMEOUT, async {
        while let Some(event) = first_write.next().await {
            if let Ok(watcher::Event::Apply(_) | watcher::Event::InitApply(_)) = event {
                return;
            }
        }
    })
    .await
    .expect("the operator's first write within 60s");
    first.kill();
    let at_kill = get(&env, name).await;
    assert_ne!(
        at_kill.status.as_ref().and_then(|s| s.status),
        Some(Phase::Running),
        "killed before Running"
    );

    let second = env.start_operator().await;
    // The dead leader's Lease must expire first (15 s).
    second.wait_leader(TIMEOUT).await;
    assert_eq!(env.lease_holder().await, Some(second.identity.clone()));
    let valkey = wait_running(&env, name, 3).await;

    let names = ObjectNames::new(name);
    let mut expected = vec![
        format!("ConfigMap/{}", names.config_map()),
        format!("PodDisruptionBudget/{}", names.pod_disruption_budget()),
        format!("Secret/{}", names.acl_secret()),
        format!("Secret/{}", names.generated_secret()),
        format!("Secret/{}", names.operator_secret()),
        format!("Service/{}", names.read_write_service()),
        format!("Service/{}", names.headless_service()),
        format!("Service/{}", names.read_only_service()),
        format!("StatefulSet/{}", names.statefulset()),
    ];
    expected.sort();
    assert_eq!(instance_objects(&env, name).await, expected);
    // Nothing else in the namespace either (kube-root-ca.crt is every namespace's).
    let everything = namespace_objects(&env).await;
    assert_eq!(everything, expected, "every object of the namespace");
    for (kind, meta) in owned_metadata(&env).await {
        owned_and_labelled(&kind, &meta, &valkey).unwrap();
    }
    let pods = pods(&env, name).await;
    assert_eq!(pods.len(), 3, "{:?}", pods.keys());
    let primaries = pods
        .values()
        .filter(|p| p.labels().get(labels::ROLE).map(String::as_str) == Some(roles::PRIMARY))
        .count();
    assert_eq!(primaries, 1, "exactly one primary");
    assert_no_warnings(&env, &valkey).await;
}

/// Every Secret, ConfigMap, StatefulSet, Service and PDB of the namespace as "Kind/name", whatever
/// its labels.
async fn namespace_objects(env: &Env) -> Vec<String> {
    let mut found: Vec<String> = owned_metadata(env)
        .await
        .into_iter()
        .map(|(kind, meta)| format!("{kind}/{}", meta.name.unwrap_or_default()))
        .collect();
    found.sort();
    found
}

async fn owned_metadata(
    env: &Env,
) -> Vec<(
    String,
    k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
)> {
    let lp = kube::api::ListParams::default();
    let mut found = Vec::new();
    macro_rules! collect {
        ($kind:ty, $label:expr) => {
            for o in env.api::<$kind>().list(&lp).await.expect("listing").items {
                found.push(($label.to_owned(), o.metadata));
            }
        };
    }
    collect!(Secret, "Secret");
    collect!(ConfigMap, "ConfigMap");
    collect!(StatefulSet, "StatefulSet");
    collect!(Service, "Service");
    collect!(PodDisruptionBudget, "PodDisruptionBudget");
    found.retain(|(kind, meta)| {
        !(kind == "ConfigMap" && meta.name.as_deref() == Some("kube-root-ca.crt"))
    });
    found
}

/// Scenario 8: two operators on one Lease: exactly one leads (its metric says 1, the other's
/// 0, the Lease names it) and only it reconciles; killed, the other takes over and reconciles
/// new work.
#[tokio::test]
async fn two_operators_elect_one_leader_and_the_standby_takes_over() {
    let mut env = Env::new("e2e-leader").await;
    let a = env.start_operator().await;
    let b = env.start_operator().await;
    let a_leads = eventually("exactly one leader", TIMEOUT, || async {
        let la = a.leader().await?;
        let lb = b.leader().await?;
        let holder = env.lease_holder().await;
        match (la, lb) {
            (true, false) if holder.as_deref() == Some(a.identity.as_str()) => Ok(true),
            (false, true) if holder.as_deref() == Some(b.identity.as_str()) => Ok(false),
            other => Err(format!("leader gauges {other:?}, Lease holder {holder:?}")),
        }
    })
    .await;
    let (mut leader, standby) = if a_leads { (a, b) } else { (b, a) };

    create(&env, "first", json!({"replicas": 1})).await;
    let first = wait_running(&env, "first", 1).await;
    let by_leader = wait_event(&env, &first, "Created", |e| {
        e.reason.as_deref() == Some("Created")
    })
    .await;
    assert_eq!(
        by_leader.reporting_instance.as_deref(),
        Some(leader.identity.as_str()),
        "the leader reconciled"
    );
    let reported_by = |events: Vec<k8s_openapi::api::events::v1::Event>| -> BTreeSet<String> {
        events
            .into_iter()
            .filter_map(|e| e.reporting_instance)
            .collect()
    };
    assert_eq!(
        reported_by(operator_events(&env, &first).await),
        BTreeSet::from([leader.identity.clone()]),
        "only the leader wrote events"
    );
    assert!(!standby.leader().await.unwrap(), "the standby still waits");

    leader.kill();
    standby.wait_leader(TIMEOUT).await;
    assert_eq!(env.lease_holder().await, Some(standby.identity.clone()));
    create(&env, "second", json!({"replicas": 1})).await;
    let second = wait_running(&env, "second", 1).await;
    let by_new_leader = wait_event(&env, &second, "Created", |e| {
        e.reason.as_deref() == Some("Created")
    })
    .await;
    assert_eq!(
        by_new_leader.reporting_instance.as_deref(),
        Some(standby.identity.as_str())
    );
}

/// Scenario 9: once Running, the operator leaves the Valkey and its children alone: no write
/// for 20 s, even though a pod event makes it look at the instance again in that time (the long
/// measurement is bench/operator.sh).
#[tokio::test]
async fn an_idle_operator_writes_nothing() {
    let mut env = Env::new("e2e-idle").await;
    let operator = env.start_leader().await;
    let name = "idle";
    create(&env, name, json!({"replicas": 3})).await;
    wait_running(&env, name, 3).await;
    // Let the StatefulSet controller finish its own status updates first.
    let sts_api = env.api::<StatefulSet>();
    eventually("the StatefulSet to settle", TIMEOUT, || async {
        let sts = sts_api.get(name).await.map_err(|e| e.to_string())?;
        let s = sts.status.clone().unwrap_or_default();
        (s.observed_generation == sts.metadata.generation
            && s.ready_replicas == Some(3)
            && s.available_replicas == Some(3)
            && s.current_revision == s.update_revision)
            .then_some(())
            .ok_or(format!("{s:?}"))
    })
    .await;
    // And the operator its one settling write: the boot guard is armed (ConfigMap key
    // `initialized`) once it has seen a replica synced from the primary.
    let names = ObjectNames::new(name);
    eventually("the boot guard armed", TIMEOUT, || async {
        let cm = env
            .api::<ConfigMap>()
            .get(&names.config_map())
            .await
            .map_err(|e| e.to_string())?;
        (cm.data
            .unwrap_or_default()
            .get("initialized")
            .map(String::as_str)
            == Some("true"))
        .then_some(())
        .ok_or("not yet".to_owned())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let reconciles = || async {
        let metrics = operator.metrics().await?;
        Ok::<_, String>(harness::metric_sum(
            &metrics,
            "valkey_operator_reconciles_total",
        ))
    };
    let started = std::time::Instant::now();
    let before = versions(&env, name).await;
    let reconciled_before = reconciles().await.expect("the operator's metrics");
    // A foreign change to a pod (an annotation of ours) makes the operator reconcile the
    // instance; finding everything in order, it must write nothing.
    let poked = format!("{name}-1");
    env.api::<Pod>()
        .patch(
            &poked,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"e2e.kuberly.io/poke": "1"}}})),
        )
        .await
        .expect("annotating a pod");
    eventually("a reconcile after the poke", TIMEOUT, || async {
        let now = reconciles().await?;
        (now > reconciled_before)
            .then_some(())
            .ok_or(format!("{now} reconciles"))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(20).saturating_sub(started.elapsed())).await;
    let after = versions(&env, name).await;
    let changed: Vec<String> = after
        .iter()
        .filter(|(k, v)| before.get(*k) != Some(v))
        .map(|(k, _)| k.clone())
        .chain(before.keys().filter(|k| !after.contains_key(*k)).cloned())
        .filter(|k| *k != format!("Pod/{poked}"))
        .collect();
    assert!(
        changed.is_empty(),
        "written while idle: {changed:?} (of {})",
        before.len()
    );
}

/// resourceVersion of the Valkey, each child, each pod and each of the operator's events.
async fn versions(env: &Env, name: &str) -> BTreeMap<String, String> {
    let mut versions = BTreeMap::new();
    let valkey = get(env, name).await;
    versions.insert(
        format!("Valkey/{name}"),
        valkey.resource_version().unwrap_or_default(),
    );
    for (kind, meta) in owned_metadata(env).await {
        versions.insert(
            format!("{kind}/{}", meta.name.unwrap_or_default()),
            meta.resource_version.unwrap_or_default(),
        );
    }
    for (pod_name, pod) in pods(env, name).await {
        versions.insert(
            format!("Pod/{pod_name}"),
            pod.resource_version().unwrap_or_default(),
        );
    }
    for e in operator_events(env, &valkey).await {
        versions.insert(
            format!("Event/{}", e.name_any()),
            e.resource_version().unwrap_or_default(),
        );
    }
    versions
}

#[tokio::test]
async fn growing_the_volume_resizes_every_claim_and_keeps_the_pods() {
    let mut env = Env::new("e2e-grow").await;
    let _operator = env.start_leader().await;
    let name = "grow";
    create(
        &env,
        name,
        json!({"replicas": 2, "volume": {"storage": "1Gi"}}),
    )
    .await;
    wait_running(&env, name, 2).await;
    let pod_uids = uids(&pods(&env, name).await);
    let pvcs = env.api::<PersistentVolumeClaim>();
    let claims_before = claim_uids(&pvcs, name).await;

    env.api::<Valkey>()
        .patch(
            name,
            &PatchParams::default(),
            &merge(json!({"volume": {"storage": "3Gi"}})),
        )
        .await
        .expect("growing spec.volume.storage is allowed");

    let requested = |c: &PersistentVolumeClaim| {
        c.spec
            .as_ref()?
            .resources
            .as_ref()?
            .requests
            .as_ref()?
            .get("storage")
            .map(|q| q.0.clone())
    };
    eventually("every claim asks for 3Gi", TIMEOUT, || async {
        let claims = pvcs
            .list(
                &kube::api::ListParams::default()
                    .labels(&valkey_core::api::names::instance_selector(name)),
            )
            .await
            .map_err(|e| e.to_string())?;
        let sizes: Vec<_> = claims.items.iter().map(requested).collect();
        (sizes.len() == 2 && sizes.iter().all(|s| s.as_deref() == Some("3Gi")))
            .then_some(())
            .ok_or(format!("claim sizes {sizes:?}"))
    })
    .await;
    eventually(
        "the StatefulSet's claim template says 3Gi",
        TIMEOUT,
        || async {
            let sts = env
                .api::<StatefulSet>()
                .get(name)
                .await
                .map_err(|e| e.to_string())?;
            let template = sts.spec.volume_claim_templates.unwrap_or_default();
            let size = template.first().and_then(|t| {
                t.spec
                    .as_ref()?
                    .resources
                    .as_ref()?
                    .requests
                    .as_ref()?
                    .get("storage")
                    .cloned()
            });
            (size.map(|q| q.0).as_deref() == Some("3Gi"))
                .then_some(())
                .ok_or("old template".to_owned())
        },
    )
    .await;
    wait_running(&env, name, 2).await;
    assert_eq!(
        uids(&pods(&env, name).await),
        pod_uids,
        "the pods kept running through the resize"
    );
    assert_eq!(
        claim_uids(&pvcs, name).await,
        claims_before,
        "the same volumes, grown"
    );
    let valkey = get(&env, name).await;
    assert_no_warnings(&env, &valkey).await;
}

/// What the spec no longer says leaves the StatefulSet too: a toleration and an
/// ephemeral-storage request taken out of the spec are removed, not kept forever.
#[tokio::test]
async fn fields_removed_from_the_spec_leave_the_statefulset() {
    let mut env = Env::new("e2e-drift").await;
    let _operator = env.start_leader().await;
    let name = "drift";
    let toleration =
        json!({"key": "example.com/dedicated", "operator": "Exists", "effect": "NoSchedule"});
    create(
        &env,
        name,
        json!({"replicas": 1, "resource": {"storage": "1Gi"}, "tolerations": [toleration]}),
    )
    .await;
    let sts_api = env.api::<StatefulSet>();
    let template = |sts: &StatefulSet| {
        let pod = sts.spec.template.spec.clone()?;
        let requests = pod
            .containers
            .first()?
            .resources
            .clone()?
            .requests
            .unwrap_or_default();
        let tolerates = pod
            .tolerations
            .unwrap_or_default()
            .iter()
            .any(|t| t.key.as_deref() == Some("example.com/dedicated"));
        Some((requests.contains_key("ephemeral-storage"), tolerates))
    };
    eventually(
        "the StatefulSet with the toleration and the request",
        TIMEOUT,
        || async {
            let sts = sts_api.get_opt(name).await.map_err(|e| e.to_string())?;
            match sts.as_ref().and_then(template) {
                Some((true, true)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;

    env.api::<Valkey>()
        .patch(
            name,
            &PatchParams::default(),
            &merge(json!({"resource": {"storage": null}, "tolerations": null})),
        )
        .await
        .expect("removing the toleration and the request");
    eventually("both gone from the StatefulSet", TIMEOUT, || async {
        let sts = sts_api.get(name).await.map_err(|e| e.to_string())?;
        match template(&sts) {
            Some((false, false)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// A growth the StorageClass cannot carry out is refused in the status before any claim is
/// touched, and can be taken back: spec.volume.storage may return to the size the volumes have.
#[tokio::test]
async fn a_growth_the_storage_class_refuses_is_reported_and_can_be_taken_back() {
    let mut env = Env::new("e2e-noexpand").await;
    let _operator = env.start_leader().await;
    let class = format!("fixed-{}", env.ns.name);
    let classes: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(env.client());
    classes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": class},
                // Served by the local cluster's fake provisioner, but not expandable.
                "provisioner": "kwok.x-k8s.io/volume",
                "volumeBindingMode": "WaitForFirstConsumer",
                "reclaimPolicy": "Delete",
            }))
            .unwrap(),
        )
        .await
        .expect("creating a StorageClass without allowVolumeExpansion");
    let name = "fixed";
    create(
        &env,
        name,
        json!({"replicas": 1, "volume": {"storage": "1Gi", "storageClassName": class}}),
    )
    .await;
    let running = wait_running(&env, name, 1).await;
    assert_eq!(
        running
            .status
            .as_ref()
            .and_then(|s| s.volume_storage.as_deref()),
        Some("1Gi"),
        "status.volumeStorage says what the volumes are"
    );

    let valkeys = env.api::<Valkey>();
    valkeys
        .patch(
            name,
            &PatchParams::default(),
            &merge(json!({"volume": {"storage": "2Gi"}})),
        )
        .await
        .expect("growing is allowed by the API");
    wait_for(&env, name, "the refusal in status", TIMEOUT, |v| {
        let status = v.status.as_ref().ok_or("no status")?;
        (status.status == Some(Phase::Failed)
            && status.error.contains("does not allow volume expansion")
            && status.error.contains(&class)
            && status.error.contains("back to 1Gi"))
        .then_some(())
        .ok_or_else(|| "not refused yet".to_owned())
    })
    .await;
    let claim = env
        .api::<PersistentVolumeClaim>()
        .get(&ObjectNames::new(name).volume_claim(0))
        .await
        .expect("the claim");
    let requested = claim
        .spec
        .and_then(|s| s.resources)
        .and_then(|r| r.requests)
        .and_then(|r| r.get("storage").cloned())
        .map(|q| q.0);
    assert_eq!(requested.as_deref(), Some("1Gi"), "no claim was touched");

    // While the reconcile fails, routing still works (roles are set before anything else): the
    // primary's pod deleted comes back with its role label, behind the read-write Service.
    let names = ObjectNames::new(name);
    let pods = env.api::<Pod>();
    let old_uid = pods.get(&names.pod(0)).await.expect("the pod").metadata.uid;
    pods.delete(&names.pod(0), &DeleteParams::default())
        .await
        .expect("deleting the primary's pod");
    eventually(
        "the recreated pod labelled primary, behind the read-write Service",
        TIMEOUT,
        || async {
            let pod = pods
                .get_opt(&names.pod(0))
                .await
                .map_err(|e| e.to_string())?
                .filter(|p| p.metadata.uid != old_uid)
                .ok_or("not recreated yet")?;
            let role = pod.labels().get(labels::ROLE).cloned();
            if role.as_deref() != Some(roles::PRIMARY) {
                return Err(format!("role label {role:?}"));
            }
            let ip = pod.status.and_then(|s| s.pod_ip).ok_or("no IP yet")?;
            let eps = endpoint_addresses(&env, &names.read_write_service()).await;
            (eps == BTreeSet::from([ip]))
                .then_some(())
                .ok_or(format!("endpoints {eps:?}"))
        },
    )
    .await;

    // Below what the volumes are is still refused; back to it is accepted, and heals.
    let shrink = valkeys
        .patch(
            name,
            &PatchParams::default(),
            &merge(json!({"volume": {"storage": "512Mi"}})),
        )
        .await;
    assert!(
        shrink.is_err(),
        "shrinking below status.volumeStorage is refused"
    );
    valkeys
        .patch(
            name,
            &PatchParams::default(),
            &merge(json!({"volume": {"storage": "1Gi"}})),
        )
        .await
        .expect("going back to the size the volumes have is allowed");
    wait_running(&env, name, 1).await;
    let _ = classes.delete(&class, &DeleteParams::default()).await;
}

/// A loopback TCP proxy to the API server that the test can cut: while cut, open connections are
/// closed and new ones are refused at once, as for a process partitioned from the API server.
struct Cuttable {
    addr: std::net::SocketAddr,
    cut: tokio::sync::watch::Sender<bool>,
}

impl Cuttable {
    async fn to(upstream: String) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the proxy");
        let addr = listener.local_addr().expect("the proxy's address");
        let (cut, _) = tokio::sync::watch::channel(false);
        let cut_rx = cut.subscribe();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if *cut_rx.borrow() {
                    continue; // dropped: the connection is closed
                }
                let mut cut_rx = cut_rx.clone();
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(&upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut_rx.wait_for(|c| *c) => {}
                    }
                });
            }
        });
        Self { addr, cut }
    }

    fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

/// Scenario 10 (issue 14): leadership follows health. The leader reaches the API server through a
/// proxy; the proxy is cut (the leader is partitioned, the standby is not): within the operator's
/// bound (8 s) the leader's /readyz fails and it stops leading; the standby takes the Lease once
/// it expires and acts on a change; the cut-off process keeps running and, once it reaches the API
/// server again, is ready and waits as the standby.
#[tokio::test]
async fn a_leader_cut_off_from_the_api_server_steps_down_and_the_standby_takes_over() {
    let mut env = Env::new("e2e-partition").await;
    let text = std::fs::read_to_string(&env.kubeconfig).expect("reading the operator kubeconfig");
    let server = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .map(|s| s.trim_matches(|c| c == '"' || c == '\''))
        .expect("a server in the kubeconfig")
        .to_owned();
    let upstream = server
        .strip_prefix("https://")
        .expect("an https server")
        .to_owned();
    let proxy = Cuttable::to(upstream).await;
    let via_proxy = env.dir.join("operator-via-proxy.kubeconfig");
    std::fs::write(
        &via_proxy,
        text.replace(&server, &format!("https://{}", proxy.addr)),
    )
    .expect("writing the proxied kubeconfig");

    let mut leader = env.start_operator_with(&via_proxy).await;
    leader.wait_leader(TIMEOUT).await;
    let standby = env.start_operator().await;
    let name = "part";
    create(&env, name, json!({"replicas": 1})).await;
    wait_running(&env, name, 1).await;
    assert!(!standby.leader().await.unwrap(), "the standby waits");

    proxy.set_cut(true);
    let cut = std::time::Instant::now();
    eventually("the cut-off leader's /readyz to fail", TIMEOUT, || async {
        match leader.ready().await {
            Ok(()) => Err("still ready".to_owned()),
            Err(e) => Ok(e),
        }
    })
    .await;
    eventually("the cut-off leader to stop leading", TIMEOUT, || async {
        match leader.leader().await? {
            false => Ok(()),
            true => Err("valkey_operator_leader is 1".into()),
        }
    })
    .await;
    let stepped_down = cut.elapsed();
    assert!(
        stepped_down < Duration::from_secs(20),
        "stepped down after {stepped_down:?}"
    );
    standby.wait_leader(TIMEOUT).await;
    assert_eq!(
        env.lease_holder().await.as_deref(),
        Some(standby.identity.as_str())
    );
    env.api::<Valkey>()
        .patch(
            name,
            &PatchParams::default(),
            &merge(json!({"resource": {"memory": "320Mi"}})),
        )
        .await
        .expect("changing the memory");
    let statefulsets = env.api::<StatefulSet>();
    eventually("the new leader to act on the change", TIMEOUT, || async {
        let sts = statefulsets.get(name).await.map_err(|e| e.to_string())?;
        let memory = sts.spec.template.spec.as_ref().and_then(|p| {
            p.containers
                .first()?
                .resources
                .as_ref()?
                .limits
                .as_ref()?
                .get("memory")
                .cloned()
        });
        (memory.as_ref().map(|q| q.0.as_str()) == Some("320Mi"))
            .then_some(())
            .ok_or(format!("memory limit {memory:?}"))
    })
    .await;
    assert!(leader.running(), "the cut-off operator keeps running");

    proxy.set_cut(false);
    eventually(
        "the reconnected operator's /readyz to pass",
        TIMEOUT,
        || leader.ready(),
    )
    .await;
    assert!(
        !leader.leader().await.unwrap(),
        "the reconnected operator waits as the standby"
    );
    assert_eq!(
        env.lease_holder().await.as_deref(),
        Some(standby.identity.as_str())
    );
}

/// The primary pod deleted: the operator promotes a replica, records it (ConfigMap key,
/// labels, status.lastFailover, events), the read-write Service follows it, and the recreated
/// pod rejoins as a replica. Then a planned switchover through the annotation
/// `kubectl valkey failover` sets hands the role back, and the annotation goes.
#[tokio::test]
async fn a_deleted_primary_is_replaced_and_a_switchover_hands_the_role_over() {
    use valkey_core::api::names::SWITCHOVER_ANNOTATION;
    use valkey_core::desired::PRIMARY_KEY;
    let mut env = Env::new("e2e-failover").await;
    let _operator = env.start_leader().await;
    let name = "fo";
    create(
        &env,
        name,
        json!({"replicas": 3, "volume": {"enabled": false}}),
    )
    .await;
    let valkey = wait_running(&env, name, 3).await;
    let old = valkey.status.and_then(|s| s.primary).expect("a primary");
    // Wait until a replica has synced (the operator only promotes one that has).
    let names = ObjectNames::new(name);
    eventually(
        "the instance to have run (boot guard armed)",
        TIMEOUT,
        || async {
            let cm = env
                .api::<ConfigMap>()
                .get(&names.config_map())
                .await
                .map_err(|e| e.to_string())?;
            let data = cm.data.unwrap_or_default();
            (data.get("initialized").map(String::as_str) == Some("true"))
                .then_some(())
                .ok_or(format!("{data:?}"))
        },
    )
    .await;
    let old_uid = pods(&env, name).await[&old].uid().unwrap_or_default();
    env.api::<Pod>()
        .delete(&old, &DeleteParams::default())
        .await
        .expect("deleting the primary pod");

    let valkey = eventually("a replica promoted", TIMEOUT, || async {
        let v = get(&env, name).await;
        let record = v.status.as_ref().and_then(|s| s.last_failover.clone());
        match record {
            Some(r) if r.from.as_deref() == Some(old.as_str()) && r.to != old => Ok(v),
            _ => Err(describe(&v)),
        }
    })
    .await;
    let record = valkey
        .status
        .as_ref()
        .and_then(|s| s.last_failover.clone())
        .expect("status.lastFailover");
    assert!(
        ["PodTerminating", "PodDeleted"].contains(&record.reason.as_str()),
        "{record:?}"
    );
    let new = record.to.clone();
    let cm = env
        .api::<ConfigMap>()
        .get(&names.config_map())
        .await
        .unwrap();
    assert_eq!(cm.data.unwrap_or_default()[PRIMARY_KEY], new);
    eventually(
        "the read-write Service on the new primary only",
        TIMEOUT,
        || async {
            let all = pods(&env, name).await;
            let ip = all.get(&new).and_then(pod_ip).ok_or("no IP")?;
            let eps = endpoint_addresses(&env, &names.read_write_service()).await;
            let role = all[&new].labels().get(labels::ROLE).cloned();
            (eps == BTreeSet::from([ip.clone()]) && role.as_deref() == Some(roles::PRIMARY))
                .then_some(())
                .ok_or(format!(
                    "endpoints {eps:?}, {new} at {ip} labelled {role:?}"
                ))
        },
    )
    .await;
    let v = get(&env, name).await;
    wait_event(&env, &v, "PrimaryPromoted", |e| {
        e.reason.as_deref() == Some("PrimaryPromoted")
            && e.note.as_deref().is_some_and(|n| n.contains(&new))
    })
    .await;
    // The recreated pod comes back as a replica of the new primary, and all are Running.
    let v = wait_running(&env, name, 3).await;
    assert_eq!(v.status.and_then(|s| s.primary), Some(new.clone()));
    let all = pods(&env, name).await;
    assert_ne!(all[&old].uid().unwrap_or_default(), old_uid, "a new pod");
    assert_eq!(
        all[&old].labels().get(labels::ROLE).map(String::as_str),
        Some(roles::REPLICA)
    );

    // A planned switchover back to the old pod, as `kubectl valkey failover --to` asks. Ready
    // does not mean synced: while the recreated pod still syncs, the operator refuses (and
    // removes the request); it is asked again then, as a user would after the refusal.
    let ask = || async {
        env.api::<Valkey>()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {SWITCHOVER_ANNOTATION: old}}})),
            )
            .await
            .expect("asking for a switchover");
    };
    ask().await;
    let v = eventually(
        "the switchover done and the request removed",
        TIMEOUT,
        || async {
            let v = get(&env, name).await;
            let record = v.status.as_ref().and_then(|s| s.last_failover.clone());
            let pending = v.annotations().contains_key(SWITCHOVER_ANNOTATION);
            match record {
                Some(r) if r.reason == "Switchover" && r.to == old && !pending => Ok(v),
                _ if !pending => {
                    ask().await;
                    Err(format!("refused, asked again: {}", describe(&v)))
                }
                _ => Err(describe(&v)),
            }
        },
    )
    .await;
    assert_eq!(
        v.status
            .as_ref()
            .and_then(|s| s.last_failover.as_ref())
            .and_then(|r| r.from.clone()),
        Some(new.clone())
    );
    eventually(
        "the read-write Service on the old pod again",
        TIMEOUT,
        || async {
            let all = pods(&env, name).await;
            let ip = all.get(&old).and_then(pod_ip).ok_or("no IP")?;
            let eps = endpoint_addresses(&env, &names.read_write_service()).await;
            (eps == BTreeSet::from([ip]))
                .then_some(())
                .ok_or(format!("{eps:?}"))
        },
    )
    .await;
}
