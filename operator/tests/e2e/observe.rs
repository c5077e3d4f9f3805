//! What a user looks at: Valkeys and their status, their children, pods, endpoints and events.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use valkey_core::api::names::{self, APP_NAME, MANAGED_BY, labels};
use valkey_core::api::{Phase, Valkey};

use crate::harness::{Env, TIMEOUT, eventually};

pub fn valkey(name: &str, spec: Value) -> Valkey {
    serde_json::from_value(json!({
        "apiVersion": "database.kuberly.io/v1alpha1",
        "kind": "Valkey",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("a Valkey object")
}

pub async fn create(env: &Env, name: &str, spec: Value) -> Valkey {
    env.api::<Valkey>()
        .create(&PostParams::default(), &valkey(name, spec))
        .await
        .unwrap_or_else(|e| panic!("creating Valkey {name}: {e}"))
}

pub async fn get(env: &Env, name: &str) -> Valkey {
    env.api::<Valkey>()
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("reading Valkey {name}: {e}"))
}

/// Short description of a Valkey's status, for failure messages.
pub fn describe(v: &Valkey) -> String {
    match &v.status {
        None => format!("no status (generation {:?})", v.metadata.generation),
        Some(s) => format!(
            "status {:?}, ready {}, primary {:?}, observedGeneration {:?} (generation {:?}), error {:?}",
            s.status,
            s.ready_replicas,
            s.primary,
            s.observed_generation,
            v.metadata.generation,
            s.error
        ),
    }
}

/// Waits until the Valkey's status satisfies `check`, which says what is still missing.
pub async fn wait_for(
    env: &Env,
    name: &str,
    what: &str,
    timeout: Duration,
    check: impl Fn(&Valkey) -> Result<(), String>,
) -> Valkey {
    let api = env.api::<Valkey>();
    eventually(&format!("Valkey {name}: {what}"), timeout, || {
        let api = api.clone();
        let check = &check;
        async move {
            let v = api.get(name).await.map_err(|e| e.to_string())?;
            check(&v).map_err(|e| format!("{e} ({})", describe(&v)))?;
            Ok(v)
        }
    })
    .await
}

/// Running with `replicas` ready, for the current generation, without an error.
pub async fn wait_running(env: &Env, name: &str, replicas: i32) -> Valkey {
    wait_for(
        env,
        name,
        &format!("Running with {replicas} ready replicas"),
        TIMEOUT,
        |v| running(v, replicas),
    )
    .await
}

pub fn running(v: &Valkey, replicas: i32) -> Result<(), String> {
    let s = v.status.as_ref().ok_or("no status")?;
    if s.status != Some(Phase::Running) {
        return Err("not Running".into());
    }
    if s.ready_replicas != replicas {
        return Err(format!("readyReplicas is not {replicas}"));
    }
    if s.observed_generation != v.metadata.generation {
        return Err("observedGeneration is not the generation".into());
    }
    if !s.error.is_empty() {
        return Err("status.error is set".into());
    }
    Ok(())
}

/// The instance's pods, by name.
pub async fn pods(env: &Env, name: &str) -> BTreeMap<String, Pod> {
    env.api::<Pod>()
        .list(&ListParams::default().labels(&names::instance_selector(name)))
        .await
        .expect("listing pods")
        .items
        .into_iter()
        .map(|p| (p.name_any(), p))
        .collect()
}

pub fn pod_ip(pod: &Pod) -> Option<String> {
    pod.status.as_ref()?.pod_ip.clone()
}

/// The ready addresses of a Service, from its EndpointSlices.
pub async fn endpoint_addresses(env: &Env, service: &str) -> BTreeSet<String> {
    env.api::<EndpointSlice>()
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={service}")))
        .await
        .expect("listing EndpointSlices")
        .items
        .into_iter()
        .flat_map(|s| s.endpoints.unwrap_or_default())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
        .flat_map(|e| e.addresses)
        .collect()
}

/// Every event in the namespace (events.k8s.io/v1 shows those written through core/v1 too).
pub async fn events(env: &Env) -> Vec<Event> {
    env.api::<Event>()
        .list(&ListParams::default())
        .await
        .expect("listing events")
        .items
}

/// The operator's events about the Valkey `valkey`.
pub async fn operator_events(env: &Env, valkey: &Valkey) -> Vec<Event> {
    events(env)
        .await
        .into_iter()
        .filter(|e| e.reporting_controller.as_deref() == Some("valkey-operator"))
        .filter(|e| e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == valkey.uid().as_deref())
        .collect()
}

pub fn event_line(e: &Event) -> String {
    format!(
        "{} {} {:?} ({})",
        e.type_.as_deref().unwrap_or("?"),
        e.reason.as_deref().unwrap_or("?"),
        e.note.as_deref().unwrap_or(""),
        e.reporting_instance.as_deref().unwrap_or("?"),
    )
}

/// Waits for an event of the operator about `valkey` that `matches`.
pub async fn wait_event(
    env: &Env,
    valkey: &Valkey,
    what: &str,
    matches: impl Fn(&Event) -> bool,
) -> Event {
    eventually(&format!("an event: {what}"), TIMEOUT, || async {
        let all = operator_events(env, valkey).await;
        all.iter().find(|e| matches(e)).cloned().ok_or_else(|| {
            format!(
                "events so far: [{}]",
                all.iter().map(event_line).collect::<Vec<_>>().join("; ")
            )
        })
    })
    .await
}

/// The checks every child of a Valkey must pass: owned by it (as its controller) and labelled.
pub fn owned_and_labelled(kind: &str, meta: &ObjectMeta, owner: &Valkey) -> Result<(), String> {
    let name = meta.name.as_deref().unwrap_or("?");
    let owner_uid = owner.uid().unwrap_or_default();
    let owned = meta
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == owner_uid && o.kind == "Valkey" && o.controller == Some(true));
    if !owned {
        return Err(format!(
            "{kind} {name} has no controller ownerReference to Valkey {} ({owner_uid}): {:?}",
            owner.name_any(),
            meta.owner_references
        ));
    }
    let labels = meta.labels.clone().unwrap_or_default();
    for (key, value) in [
        (labels::NAME, APP_NAME.to_owned()),
        (labels::INSTANCE, owner.name_any()),
        (labels::MANAGED_BY, MANAGED_BY.to_owned()),
    ] {
        if labels.get(key) != Some(&value) {
            return Err(format!(
                "{kind} {name} lacks the label {key}={value}: {labels:?}"
            ));
        }
    }
    Ok(())
}

/// The password of a Secret key, as text.
pub async fn secret_value(env: &Env, secret: &str, key: &str) -> String {
    let secret = env
        .api::<Secret>()
        .get(secret)
        .await
        .unwrap_or_else(|e| panic!("reading Secret {secret}: {e}"));
    let bytes = secret
        .data
        .and_then(|d| d.get(key).cloned())
        .unwrap_or_else(|| panic!("Secret has no key {key}"));
    String::from_utf8(bytes.0).expect("the password is text")
}

/// Panics if `secret` appears in the operator's log, in any event of the namespace or in the
/// status of any Valkey.
pub async fn assert_secret_not_leaked(env: &Env, secret: &str, logs: &[(&str, String)]) {
    assert!(secret.len() >= 12, "the secret is too short to grep for");
    for (what, text) in logs {
        assert!(!text.is_empty(), "{what} is empty");
        assert!(!text.contains(secret), "the password appears in {what}");
    }
    for e in events(env).await {
        let text = serde_json::to_string(&e).expect("serializing an event");
        assert!(
            !text.contains(secret),
            "the password appears in event {}",
            event_line(&e)
        );
    }
    for v in env
        .api::<Valkey>()
        .list(&ListParams::default())
        .await
        .expect("listing Valkeys")
    {
        let text = serde_json::to_string(&v).expect("serializing a Valkey");
        assert!(
            !text.contains(secret),
            "the password appears in Valkey {}",
            v.name_any()
        );
    }
}

/// Lists an API and keeps what satisfies `keep`, by name.
pub async fn names_of<K>(api: &Api<K>, keep: impl Fn(&K) -> bool) -> BTreeSet<String>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list(&ListParams::default())
        .await
        .expect("listing objects")
        .items
        .into_iter()
        .filter(|o| keep(o))
        .map(|o| o.name_any())
        .collect()
}

/// Panics if the operator published a Warning about `valkey` (a failed reconcile).
pub async fn assert_no_warnings(env: &Env, valkey: &Valkey) {
    let warnings: Vec<String> = operator_events(env, valkey)
        .await
        .iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .map(event_line)
        .collect();
    assert!(
        warnings.is_empty(),
        "Warnings about Valkey {}: {warnings:#?}",
        valkey.name_any()
    );
}
