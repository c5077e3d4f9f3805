//! The Valkey API on a real kube-apiserver (the local control plane): the manifests install, the
//! examples apply, and every invalid object of tests/fixtures/validation-cases.yaml is refused
//! with a message that names its field.

mod support;

use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Api, Resource};
use serde_json::json;
use support::cases::{self, valkey_object};
use support::cluster::{self, TestNamespace, install_manifests};
use valkey_core::api::Valkey;

const MANAGER: &str = "api-server-test";

fn valkeys(ns: &TestNamespace) -> Api<DynamicObject> {
    Api::namespaced_with(
        ns.client.clone(),
        &ns.name,
        &ApiResource::erase::<Valkey>(&()),
    )
}

async fn apply(
    api: &Api<DynamicObject>,
    object: &serde_json::Value,
) -> Result<DynamicObject, kube::Error> {
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    api.patch(
        &name,
        &PatchParams::apply(MANAGER).validation_strict(),
        &Patch::Apply(object),
    )
    .await
}

/// `kubectl apply -f -` (client-side, strict field validation: what users run) in `ns`.
fn kubectl_apply(ns: &TestNamespace, object: &serde_json::Value) -> Result<(), String> {
    use std::io::Write;
    let mut child = cluster::kubectl()
        .args(["apply", "--validate=strict", "-n", &ns.name, "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running kubectl");
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(object.to_string().as_bytes())
            .expect("writing to kubectl");
    }
    let out = child.wait_with_output().expect("kubectl finished");
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[tokio::test]
async fn manifests_install_and_invalid_objects_are_refused_with_the_field_named() {
    install_manifests().await;
    let ns = TestNamespace::new("api", &[]).await;
    let api = valkeys(&ns);
    let all = cases::load();
    assert!(all.len() >= 25, "only {} cases", all.len());
    let mut failures = Vec::new();
    for case in &all {
        if let Some(old) = case.old_object()
            && let Err(e) = kubectl_apply(&ns, &old)
        {
            failures.push(format!("{}: the old object was refused: {e}", case.case));
            continue;
        }
        match kubectl_apply(&ns, &case.object()) {
            Ok(()) => failures.push(format!("{}: accepted", case.case)),
            Err(message) if !message.contains(&case.field) => failures.push(format!(
                "{}: message does not name {}: {message}",
                case.case, case.field
            )),
            Err(_) => {}
        }
        let _ = api.delete(&case.name, &Default::default()).await;
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
}

#[tokio::test]
async fn examples_apply_and_defaults_are_filled_in_by_the_server() {
    install_manifests().await;
    let ns = TestNamespace::new("examples", &[]).await;
    let api = valkeys(&ns);
    for (file, object) in cases::examples() {
        let applied = apply(&api, &object).await;
        assert!(applied.is_ok(), "{file} was refused: {:?}", applied.err());
    }
    let typed: Api<Valkey> = ns.api();
    let minimal = typed
        .get("cache")
        .await
        .expect("the minimal example exists");
    assert_eq!(minimal.spec.replicas, 1);
    assert_eq!(minimal.spec.volume.storage, "1Gi");
    assert_eq!(minimal.spec.image, valkey_core::api::defaults::IMAGE);
}

#[tokio::test]
async fn scaling_through_the_scale_subresource_obeys_the_replica_rule() {
    install_manifests().await;
    let ns = TestNamespace::new("scale", &[]).await;
    let api = valkeys(&ns);
    apply(&api, &valkey_object("cache", json!({"replicas": 1})))
        .await
        .expect("created");
    let typed: Api<Valkey> = ns.api();
    let patch = |n: i32| Patch::Merge(json!({"spec": {"replicas": n}}));
    typed
        .patch_scale("cache", &PatchParams::default(), &patch(3))
        .await
        .expect("scaling to 3 is allowed");
    assert_eq!(typed.get("cache").await.unwrap().spec.replicas, 3);
    let refused = typed
        .patch_scale("cache", &PatchParams::default(), &patch(9))
        .await;
    match refused {
        Err(kube::Error::Api(status)) => assert!(
            status.message.contains("spec.replicas"),
            "{}",
            status.message
        ),
        other => panic!("scaling to 9 was not refused: {other:?}"),
    }
    assert_eq!(Valkey::plural(&()), "valkeys");
}

#[tokio::test]
async fn a_config_map_over_the_size_limit_is_refused() {
    install_manifests().await;
    let ns = TestNamespace::new("limits", &[]).await;
    let config: serde_json::Map<_, _> = (0..65).map(|i| (format!("key-{i}"), json!("1"))).collect();
    let refused = apply(
        &valkeys(&ns),
        &valkey_object("cache", json!({"config": config})),
    )
    .await;
    match refused {
        Err(kube::Error::Api(status)) => {
            assert!(status.message.contains("spec.config"), "{}", status.message)
        }
        other => panic!("65 config entries were not refused: {other:?}"),
    }
}
