//! The shipped RBAC (manifests/clusterrole.yaml, manifests/role.yaml) grants exactly what the
//! operator uses. The local API server audits every request of the operator's ServiceAccount
//! (hack/cluster-manifests/audit-policy.yaml); this test drives one operator through a life that
//! needs each granted permission (create, replicate, switch over, grow the volume, scale down,
//! fail on a missing Secret, a ServiceMonitor and a NetworkPolicy made and removed, delete), then reads the audit log: a (verb, resource) the roles
//! grant that no request used fails the test, and so does any request of the ServiceAccount the
//! API server refused (403) while the test ran. (Only what was logged since the test began
//! counts, so an experiment with the roles on a long-lived dev cluster cannot fail later runs.)
//!
//!   cargo test -p valkey-operator --test rbac

#[path = "e2e/harness.rs"]
#[allow(dead_code)]
mod harness;
#[path = "e2e/observe.rs"]
#[allow(dead_code)]
mod observe;
#[path = "e2e/service_monitor_crd.rs"]
mod service_monitor_crd;
#[path = "../../tests/support/mod.rs"]
mod support;

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde::Deserialize;
use serde_json::json;
use valkey_core::api::Valkey;
use valkey_core::api::names::{ObjectNames, RESTARTED_AT_ANNOTATION, SWITCHOVER_ANNOTATION};

use harness::{Env, TIMEOUT, eventually};
use observe::*;
use service_monitor_crd::{CrdGuard, crd_absent, install_crd};
use valkey_core::desired::ServiceMonitor;

/// What a rule grants or a request used: (API group, resource[/subresource], verb).
type Permission = (String, String, String);

/// Granted but never requested, by design: the API server checks this one itself when the
/// operator creates a child whose ownerReference has blockOwnerDeletion (the
/// OwnerReferencesPermissionEnforcement admission plugin, on in the local API server), so it
/// never appears as a request; a refusal would show as a 403 on that create.
const CHECKED_BY_ADMISSION: [(&str, &str, &str); 1] =
    [("database.kuberly.io", "valkeys/finalizers", "update")];

#[derive(Deserialize)]
struct Role {
    rules: Vec<Rule>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Rule {
    api_groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
}

/// Every (group, resource, verb) the shipped roles grant.
fn granted() -> BTreeSet<Permission> {
    let manifests = support::cluster::repo_root().join("manifests");
    let mut granted = BTreeSet::new();
    for file in ["clusterrole.yaml", "role.yaml"] {
        let text = std::fs::read_to_string(manifests.join(file))
            .unwrap_or_else(|e| panic!("reading manifests/{file}: {e}"));
        let role: Role =
            yaml_serde::from_str(&text).unwrap_or_else(|e| panic!("parsing manifests/{file}: {e}"));
        for rule in role.rules {
            for group in &rule.api_groups {
                for resource in &rule.resources {
                    for verb in &rule.verbs {
                        assert!(
                            group != "*" && resource != "*" && verb != "*",
                            "manifests/{file} grants a wildcard"
                        );
                        granted.insert((group.clone(), resource.clone(), verb.clone()));
                    }
                }
            }
        }
    }
    granted
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AuditEvent {
    verb: String,
    #[serde(default)]
    object_ref: Option<ObjectRef>,
    #[serde(default)]
    response_status: Option<ResponseStatus>,
    #[serde(default)]
    request_u_r_i: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ObjectRef {
    #[serde(default)]
    api_group: String,
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: String,
}

#[derive(Deserialize)]
struct ResponseStatus {
    #[serde(default)]
    code: u16,
}

fn read_audit_log() -> String {
    let path = support::cluster::audit_log_path();
    std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "reading the API server's audit log {}: {e} (hack/cluster up creates it)",
            path.display()
        )
    })
}

/// The audited requests of the operator's ServiceAccount after the first `skip` bytes of the
/// log: what they used, and those the API server refused (with their URI).
fn audited(skip: usize) -> (BTreeSet<Permission>, Vec<String>) {
    let text = read_audit_log();
    let text = text.get(skip..).unwrap_or_default();
    let mut used = BTreeSet::new();
    let mut refused = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let event: AuditEvent = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("an audit line that is not an audit event ({e}): {line}"));
        let Some(object) = event.object_ref else {
            continue; // discovery and /version: no resource, no RBAC rule
        };
        let resource = if object.subresource.is_empty() {
            object.resource
        } else {
            format!("{}/{}", object.resource, object.subresource)
        };
        let code = event.response_status.map_or(0, |s| s.code);
        let permission = (object.api_group, resource, event.verb);
        if code == 403 {
            refused.push(format!("{permission:?} {}", event.request_u_r_i));
            continue;
        }
        // A server-side apply that creates its object is a PATCH answered 201, for which the API
        // server also authorizes `create`.
        if permission.2 == "patch" && code == 201 {
            used.insert((
                permission.0.clone(),
                permission.1.clone(),
                "create".to_owned(),
            ));
        }
        used.insert(permission);
    }
    (used, refused)
}

fn merge(value: serde_json::Value) -> Patch<serde_json::Value> {
    Patch::Merge(value)
}

/// One instance through the life that needs each permission: its children applied and watched,
/// pods labelled, status and events written, nodes read, a switchover (the request annotation
/// removed), a rolling restart (pods deleted one at a time), a volume growth (the class read, claims patched, the StatefulSet replaced), a scale
/// down to one pod (the PDB deleted), and its deletion.
async fn live_through_every_permission(env: &Env) {
    let name = "rbac";
    let names = ObjectNames::new(name);
    create(
        env,
        name,
        json!({"replicas": 2, "volume": {"storage": "1Gi", "reclaimPolicy": "Delete"}}),
    )
    .await;
    let running = wait_running(env, name, 2).await;
    let primary = running
        .status
        .and_then(|s| s.primary)
        .expect("a Running instance names its primary");
    let replica = (0..2)
        .map(|i| names.pod(i))
        .find(|p| *p != primary)
        .expect("two pods, one of them a replica");

    let valkeys = env.api::<Valkey>();
    // Right after Running the replica may not have synced yet: the request is then refused (and
    // removed); ask again, as a user would.
    eventually("a switchover to the replica", TIMEOUT, || async {
        let v = valkeys.get(name).await.map_err(|e| e.to_string())?;
        if v.status.as_ref().and_then(|s| s.primary.as_deref()) == Some(replica.as_str()) {
            return Ok(());
        }
        let pending = v
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(SWITCHOVER_ANNOTATION));
        if !pending {
            valkeys
                .patch(
                    name,
                    &PatchParams::default(),
                    &merge(json!({"metadata": {"annotations": {SWITCHOVER_ANNOTATION: replica}}})),
                )
                .await
                .map_err(|e| format!("asking for a switchover: {e}"))?;
        }
        Err(format!(
            "primary still {:?}",
            v.status.and_then(|s| s.primary)
        ))
    })
    .await;

    // A rolling restart: the operator deletes each pod itself (the StatefulSet is OnDelete).
    let at = "2026-12-01T00:00:00Z";
    valkeys
        .patch(
            name,
            &PatchParams::default(),
            &merge(json!({"metadata": {"annotations": {RESTARTED_AT_ANNOTATION: at}}})),
        )
        .await
        .expect("asking for a restart");
    let pods = env.api::<Pod>();
    eventually("both pods restarted", TIMEOUT, || async {
        let list = pods
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let restarted = list
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                p.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(RESTARTED_AT_ANNOTATION))
                    .map(String::as_str)
                    == Some(at)
            })
            .count();
        (restarted == 2)
            .then_some(())
            .ok_or(format!("{restarted} of 2 pods restarted"))
    })
    .await;
    wait_running(env, name, 2).await;

    valkeys
        .patch(
            name,
            &PatchParams::default(),
            &merge(json!({"spec": {"volume": {"storage": "2Gi"}}})),
        )
        .await
        .expect("growing the volume");
    let statefulsets = env.api::<StatefulSet>();
    eventually(
        "the StatefulSet replaced with 2Gi claims",
        TIMEOUT,
        || async {
            let sts = statefulsets
                .get(&names.statefulset())
                .await
                .map_err(|e| e.to_string())?;
            let size = sts
                .spec
                .volume_claim_templates
                .and_then(|t| t.into_iter().next())
                .and_then(|c| c.spec?.resources?.requests?.get("storage").cloned());
            (size.as_ref().map(|q| q.0.as_str()) == Some("2Gi"))
                .then_some(())
                .ok_or(format!("claim template asks {size:?}"))
        },
    )
    .await;
    wait_running(env, name, 2).await;

    valkeys
        .patch(
            name,
            &PatchParams::default(),
            &merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .expect("scaling to one pod");
    let pdbs = env.api::<PodDisruptionBudget>();
    eventually("the PDB of a single pod removed", TIMEOUT, || async {
        match pdbs
            .get_opt(&names.pod_disruption_budget())
            .await
            .map_err(|e| e.to_string())?
        {
            None => Ok(()),
            Some(_) => Err("the PDB is still there".to_owned()),
        }
    })
    .await;
    wait_running(env, name, 1).await;

    valkeys
        .delete(name, &DeleteParams::default())
        .await
        .expect("deleting the Valkey");
    eventually("the Valkey gone", TIMEOUT, || async {
        match valkeys.get_opt(name).await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(_) => Err("still there".to_owned()),
        }
    })
    .await;
}

/// A Valkey whose password Secret does not exist: the operator says so again on every retry, and
/// kube's event recorder folds the repeats into one Event it patches.
async fn fail_repeatedly(env: &Env) {
    let name = "rbac-nopass";
    create(
        env,
        name,
        json!({"replicas": 1, "passwordSecret": {"name": "nowhere", "key": "pw"}}),
    )
    .await;
    let events = env.api::<k8s_openapi::api::events::v1::Event>();
    eventually(
        "the missing Secret reported twice (one Event, patched)",
        TIMEOUT,
        || async {
            let list = events
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?;
            let repeated = list.items.iter().any(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                    && e.series.as_ref().is_some_and(|s| s.count >= 2)
            });
            repeated.then_some(()).ok_or_else(|| {
                let lines: Vec<_> = list.items.iter().map(event_line).collect();
                format!("events {lines:?}")
            })
        },
    )
    .await;
}

/// With the Prometheus operator's CRD installed, spec.metrics.serviceMonitor makes the operator
/// apply a ServiceMonitor, and turning it off makes it delete it.
async fn monitor_then_stop(env: &Env) {
    let name = "rbac-mon";
    let monitor = ObjectNames::new(name).service_monitor();
    create(
        env,
        name,
        json!({"replicas": 1, "metrics": {"enabled": true, "serviceMonitor": {"enabled": true}}}),
    )
    .await;
    let monitors = env.api::<ServiceMonitor>();
    eventually("the ServiceMonitor made", TIMEOUT, || async {
        match monitors
            .get_opt(&monitor)
            .await
            .map_err(|e| e.to_string())?
        {
            Some(_) => Ok(()),
            None => Err("no ServiceMonitor yet".to_owned()),
        }
    })
    .await;
    env.api::<Valkey>()
        .patch(
            name,
            &PatchParams::default(),
            &merge(json!({"spec": {"metrics": {"enabled": false, "serviceMonitor": {"enabled": false}}}})),
        )
        .await
        .expect("turning metrics off");
    eventually("the ServiceMonitor removed", TIMEOUT, || async {
        match monitors
            .get_opt(&monitor)
            .await
            .map_err(|e| e.to_string())?
        {
            None => Ok(()),
            Some(_) => Err("the ServiceMonitor is still there".to_owned()),
        }
    })
    .await;
}

/// spec.networkPolicy makes the operator apply a NetworkPolicy, and turning it off makes it
/// delete it.
async fn network_policy_then_stop(env: &Env) {
    let name = "rbac-netpol";
    create(
        env,
        name,
        json!({"replicas": 1, "networkPolicy": {"enabled": true}}),
    )
    .await;
    let policies = env.api::<NetworkPolicy>();
    let policy = ObjectNames::new(name).network_policy();
    let present = |want: bool| {
        let (policies, policy) = (policies.clone(), policy.clone());
        async move {
            let live = policies.get_opt(&policy).await.map_err(|e| e.to_string())?;
            (live.is_some() == want)
                .then_some(())
                .ok_or_else(|| format!("NetworkPolicy there: {}", live.is_some()))
        }
    };
    eventually("the NetworkPolicy made", TIMEOUT, || present(true)).await;
    env.api::<Valkey>()
        .patch(
            name,
            &PatchParams::default(),
            &merge(json!({"spec": {"networkPolicy": {"enabled": false}}})),
        )
        .await
        .expect("turning the NetworkPolicy off");
    eventually("the NetworkPolicy removed", TIMEOUT, || present(false)).await;
}

#[tokio::test]
async fn the_shipped_rbac_grants_exactly_what_the_operator_uses() {
    let admin = support::cluster::admin_client().await;
    let _crd = CrdGuard;
    crd_absent(&admin).await;
    install_crd(&admin).await;
    let mut env = Env::new("rbac").await;
    let logged_before = read_audit_log().len();
    let _operator = env.start_leader().await;
    fail_repeatedly(&env).await;
    monitor_then_stop(&env).await;
    network_policy_then_stop(&env).await;
    live_through_every_permission(&env).await;

    let granted = granted();
    let (used, refused) = audited(logged_before);
    assert!(
        refused.is_empty(),
        "the API server refused requests of the operator (a permission missing from manifests/): {refused:#?}"
    );
    let exempt: BTreeSet<Permission> = CHECKED_BY_ADMISSION
        .iter()
        .map(|(g, r, v)| (g.to_string(), r.to_string(), v.to_string()))
        .collect();
    let unused: Vec<_> = granted
        .difference(&used)
        .filter(|p| !exempt.contains(*p))
        .collect();
    assert!(
        unused.is_empty(),
        "manifests/ grant permissions the operator never used (remove them, or say why they are \
         needed): {unused:#?}\nused: {used:#?}"
    );
    let ungranted: Vec<_> = used.difference(&granted).collect();
    assert!(
        ungranted.is_empty(),
        "requests succeeded that the roles do not grant (another binding?): {ungranted:#?}"
    );
}
