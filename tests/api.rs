//! The Valkey API without a cluster: the generated CRD, its defaults, and every CEL rule
//! evaluated client-side (the same rules the API server runs; tests/api_server.rs runs them there).

mod support;

use serde_json::json;
use support::cases::{self, valkey_object};
use valkey_core::api::validation::{Violation, violations};
use valkey_core::api::{ReclaimPolicy, Valkey, crd_yaml, defaults};

fn fields(v: &[Violation]) -> Vec<String> {
    v.iter().map(ToString::to_string).collect()
}

#[test]
fn manifests_crd_is_the_generated_crd() {
    let generated = crd_yaml().expect("CRD serializes");
    // kubectl apply -k manifests/ and the Helm chart's crds/ install the same generated CRD.
    for file in [
        "manifests/crd.yaml",
        "charts/valkey-operator/crds/valkeys.database.kuberly.io.yaml",
    ] {
        let committed =
            std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file))
                .unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(
            committed == generated,
            "{file} is stale: regenerate it with `make manifests`"
        );
    }
}

#[test]
fn crd_names_and_subresources() {
    let crd: serde_json::Value = yaml_serde::from_str(&crd_yaml().unwrap()).unwrap();
    assert_eq!(crd["metadata"]["name"], "valkeys.database.kuberly.io");
    assert_eq!(crd["spec"]["names"]["kind"], "Valkey");
    assert_eq!(crd["spec"]["names"]["shortNames"], json!(["vk"]));
    assert_eq!(crd["spec"]["scope"], "Namespaced");
    let version = &crd["spec"]["versions"][0];
    assert_eq!(version["name"], "v1alpha1");
    assert_eq!(version["subresources"]["status"], json!({}));
    assert_eq!(
        version["subresources"]["scale"]["specReplicasPath"],
        ".spec.replicas"
    );
    assert_eq!(
        version["subresources"]["scale"]["statusReplicasPath"],
        ".status.readyReplicas"
    );
    let columns: Vec<_> = version["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_owned())
        .collect();
    for wanted in [
        "Image",
        "CPU",
        "Memory",
        "Status",
        "Error",
        "Has volume",
        "Volume size",
        "Replicas",
        "Ready replicas",
        "Last reconcile",
        "Primary",
        "Age",
    ] {
        assert!(
            columns.iter().any(|c| c == wanted),
            "missing print column {wanted}: {columns:?}"
        );
    }
}

#[test]
fn an_empty_spec_takes_the_documented_defaults() {
    let valkey: Valkey = serde_json::from_value(valkey_object("cache", json!({}))).unwrap();
    let spec = &valkey.spec;
    assert_eq!(spec.image, defaults::IMAGE);
    assert_eq!(spec.replicas, 1);
    assert_eq!(spec.user, "default");
    assert!(spec.password_secret.is_none());
    assert!(spec.volume.enabled);
    assert_eq!(spec.volume.storage, "1Gi");
    assert_eq!(spec.volume.reclaim_policy, ReclaimPolicy::Retain);
    assert_eq!(spec.resource.cpu, defaults::CPU);
    assert_eq!(spec.resource.memory, defaults::MEMORY);
    assert_eq!(spec.failover_delay, "3s");
    assert_eq!(spec.failover_delay(), std::time::Duration::from_secs(3));
    assert_eq!(spec.fencing.min_replicas_to_write, 1);
    assert_eq!(spec.fencing.max_lag_seconds, 10);
}

#[test]
fn failover_delay_reads_as_a_duration_and_bad_values_as_the_default() {
    use std::time::Duration;
    for (text, want) in [
        ("0s", Duration::ZERO),
        ("500ms", Duration::from_millis(500)),
        ("1m30s", Duration::from_secs(90)),
        ("10m", Duration::from_secs(600)),
        // Refused by the CRD; should one get through, the default, never "no delay".
        ("11m", Duration::from_secs(3)),
        ("3", Duration::from_secs(3)),
        ("", Duration::from_secs(3)),
        ("1h", Duration::from_secs(3)),
    ] {
        let mut valkey: Valkey = serde_json::from_value(valkey_object("cache", json!({}))).unwrap();
        valkey.spec.failover_delay = text.into();
        assert_eq!(valkey.spec.failover_delay(), want, "{text:?}");
    }
}

#[test]
fn fencing_never_asks_for_more_replicas_than_the_instance_has() {
    let spec = |replicas: i32, min: i32| {
        let v: Valkey = serde_json::from_value(valkey_object(
            "cache",
            json!({"replicas": replicas, "fencing": {"minReplicasToWrite": min}}),
        ))
        .unwrap();
        v.spec.min_replicas_to_write()
    };
    assert_eq!(spec(1, 1), 0, "a standalone primary has nobody to wait for");
    assert_eq!(spec(0, 1), 0);
    assert_eq!(spec(2, 1), 1);
    assert_eq!(spec(2, 3), 1);
    assert_eq!(spec(5, 2), 2);
    assert_eq!(spec(3, 0), 0);
}

#[test]
fn the_crd_schema_carries_the_same_defaults() {
    let crd: serde_json::Value = yaml_serde::from_str(&crd_yaml().unwrap()).unwrap();
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    assert_eq!(spec["image"]["default"], defaults::IMAGE);
    assert_eq!(spec["replicas"]["default"], 1);
    assert_eq!(spec["user"]["default"], defaults::USER);
    assert_eq!(spec["volume"]["default"]["storage"], defaults::STORAGE);
    assert_eq!(spec["volume"]["default"]["enabled"], true);
    assert_eq!(spec["volume"]["default"]["reclaimPolicy"], "Retain");
    assert_eq!(spec["resource"]["default"]["memory"], defaults::MEMORY);
}

#[test]
fn every_local_rule_rejects_its_case_and_names_the_field() {
    let all = cases::load();
    let local: Vec<_> = all.iter().filter(|c| c.local).collect();
    assert!(local.len() >= 20, "only {} local cases", local.len());
    for case in local {
        let found = violations(&case.object(), case.old_object().as_ref());
        assert!(
            found.iter().any(|v| v.to_string().contains(&case.field)),
            "{}: expected a violation naming {}, got {:?}",
            case.case,
            case.field,
            fields(&found)
        );
    }
}

#[test]
fn accepted_specs_pass_every_rule() {
    let accepted = [
        json!({}),
        json!({"replicas": 0}),
        json!({"replicas": 5}),
        json!({"user": "app.writer_1"}),
        json!({"resource": {"cpu": "1", "memory": "1.5Gi", "storage": "512Mi"}}),
        json!({"volume": {"enabled": false}}),
        json!({"passwordSecret": {"name": "team.auth-1", "key": "redis_password"}}),
        json!({"config": {"maxmemory-policy": "allkeys-lru", "save": "", "notify-keyspace-events": "Ex"}}),
        json!({"image": "registry.example.com:5000/valkey/valkey@sha256:0123456789abcdef"}),
        json!({"failoverDelay": "0s"}),
        json!({"failoverDelay": "500ms"}),
        json!({"failoverDelay": "1m30s"}),
        json!({"failoverDelay": "10m"}),
        json!({"fencing": {"minReplicasToWrite": 0, "maxLagSeconds": 60}}),
    ];
    for spec in accepted {
        let found = violations(&valkey_object("cache", spec.clone()), None);
        assert!(found.is_empty(), "{spec} was refused: {:?}", fields(&found));
    }
}

#[test]
fn accepted_updates_pass_transition_rules() {
    let updates = [
        (
            json!({"volume": {"storage": "1Gi"}}),
            json!({"volume": {"storage": "2Gi"}}),
        ),
        (
            json!({"volume": {"storage": "1Gi"}}),
            json!({"volume": {"storage": "1024Mi"}}),
        ),
        (
            json!({"volume": {"storageClassName": "fast"}}),
            json!({"volume": {"storageClassName": "fast", "storage": "3Gi"}}),
        ),
        (json!({"replicas": 3}), json!({"replicas": 0})),
    ];
    for (old, new) in updates {
        let found = violations(
            &valkey_object("cache", new.clone()),
            Some(&valkey_object("cache", old.clone())),
        );
        assert!(
            found.is_empty(),
            "{old} -> {new} was refused: {:?}",
            fields(&found)
        );
    }
}

#[test]
fn config_errors_name_the_offending_directives() {
    let found = violations(
        &valkey_object(
            "cache",
            json!({"config": {"port": "1", "dir": "/tmp", "maxmemory": "1gb"}}),
        ),
        None,
    );
    let text = fields(&found).join("\n");
    assert!(text.contains("must not set"), "{text}");
    assert!(text.contains("port") && text.contains("dir"), "{text}");
    assert!(!text.contains("maxmemory"), "{text}");
}

#[test]
fn documented_examples_are_valid() {
    let examples = cases::examples();
    assert!(examples.len() >= 3);
    for (file, object) in examples {
        let typed: Result<Valkey, _> = serde_json::from_value(object.clone());
        assert!(
            typed.is_ok(),
            "{file} does not parse as a Valkey: {:?}",
            typed.err()
        );
        let found = violations(&object, None);
        assert!(found.is_empty(), "{file}: {:?}", fields(&found));
    }
}

#[test]
fn pod_ordinals_are_read_one_way_only() {
    use valkey_core::api::names::{claim_ordinal, pod_ordinal};
    assert_eq!(pod_ordinal("cache", "cache-0"), Some(0));
    assert_eq!(pod_ordinal("cache", "cache-4"), Some(4));
    assert_eq!(pod_ordinal("my-cache", "my-cache-12"), Some(12));
    for not_a_pod in [
        "cache-+1",
        "cache--1",
        "cache-01",
        "cache-",
        "cache-1a",
        "cache-1234567890",
        "cache0",
        "other-0",
        "cache-acl",
    ] {
        assert_eq!(pod_ordinal("cache", not_a_pod), None, "{not_a_pod}");
    }
    // A pod of another instance whose name extends this one's is not this one's.
    assert_eq!(pod_ordinal("cache", "cache-x-0"), None);
    assert_eq!(claim_ordinal("cache", "data-cache-3"), Some(3));
    assert_eq!(claim_ordinal("my-cache", "data-my-cache-0"), Some(0));
    assert_eq!(claim_ordinal("cache", "data-my-cache-0"), None);
    assert_eq!(claim_ordinal("cache", "data-cache-+3"), None);
}

#[test]
fn the_crd_bounds_come_from_the_api_constants() {
    let crd = crd_yaml().unwrap();
    assert!(crd.contains(&format!("self <= {}", defaults::MAX_REPLICAS)));
    assert!(crd.contains(&format!(
        "size(self.metadata.name) <= {}",
        defaults::MAX_NAME_LENGTH
    )));
}
