//! `install`: applies the embedded manifests with server-side apply, in kustomization order, then
//! waits until the API server serves the Valkey resource.

use std::time::Duration;

use anyhow::Context;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::{self, Scope};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, CustomResourceExt};
use serde_json::{Value, json};
use valkey_core::api::Valkey;

use crate::cli::{DryRun, GlobalArgs, InstallArgs, ObjectFormat};
use crate::diagnose::Call;
use crate::error::Problem;
use crate::session::{FIELD_MANAGER, Session};
use crate::{duration, manifests, output};

pub async fn run(args: InstallArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let dry_run = args.dry_run.unwrap_or(DryRun::None);
    if dry_run == DryRun::Client {
        return match args.output.unwrap_or(ObjectFormat::Yaml) {
            ObjectFormat::Yaml => output::print(&manifests::yaml()),
            ObjectFormat::Json => {
                let list =
                    json!({"apiVersion": "v1", "kind": "List", "items": manifests::objects()?});
                output::print(&output::to_json(&list)?)
            }
        };
    }
    let session = Session::connect(global).await?;
    let server_dry_run = dry_run == DryRun::Server;
    for object in manifests::objects()? {
        let applied = apply(&session, &object, server_dry_run).await?;
        match args.output {
            Some(format) => output::print_object(&applied, format)?,
            None => output::print(&format!(
                "{} serverside-applied{}",
                reference(&object),
                if server_dry_run {
                    " (server dry run)"
                } else {
                    ""
                }
            ))?,
        }
    }
    if !server_dry_run {
        wait_for_crd(&session, args.timeout).await?;
    }
    Ok(())
}

/// `kind.group/name`, as kubectl prints applied objects.
fn reference(object: &Value) -> String {
    let kind = object["kind"].as_str().unwrap_or_default().to_lowercase();
    let group = object["apiVersion"]
        .as_str()
        .and_then(|v| v.split_once('/'))
        .map(|(group, _)| format!(".{group}"))
        .unwrap_or_default();
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    format!("{kind}{group}/{name}")
}

async fn apply(session: &Session, object: &Value, dry_run: bool) -> anyhow::Result<DynamicObject> {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let found = discovery::pinned_kind(&session.client, &gvk).await;
    let (resource, capabilities) = match found {
        Ok(found) => found,
        Err(err) => {
            let call = Call::dynamic("get", group, &kind.to_lowercase());
            return Err(session.explain(err, call).await)
                .with_context(|| format!("finding the API of {kind} {api_version}"));
        }
    };
    let namespace = object["metadata"]["namespace"].as_str();
    let api: Api<DynamicObject> = match (capabilities.scope, namespace) {
        (Scope::Namespaced, Some(ns)) => {
            Api::namespaced_with(session.client.clone(), ns, &resource)
        }
        (Scope::Namespaced, None) => {
            Api::namespaced_with(session.client.clone(), &session.namespace, &resource)
        }
        (Scope::Cluster, _) => Api::all_with(session.client.clone(), &resource),
    };
    let mut params = PatchParams::apply(FIELD_MANAGER).force();
    params.dry_run = dry_run;
    let result = api.patch(name, &params, &Patch::Apply(object)).await;
    let call = Call::dynamic("patch", &resource.group, &resource.plural)
        .namespace(namespace)
        .name(name);
    session.check(result, call).await
}

/// Waits until the Valkey CRD is Established (watched, not polled) and discovery serves the
/// resource, so a `create` right after works.
async fn wait_for_crd(session: &Session, timeout: Duration) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(session.client.clone());
    let name = Valkey::crd_name();
    let deadline = tokio::time::Instant::now() + timeout;
    let established = await_condition(crds, name, conditions::is_crd_established());
    match tokio::time::timeout_at(deadline, established).await {
        Err(_elapsed) => return Err(not_established(name, timeout)),
        Ok(Err(err)) => {
            return Err(anyhow::Error::new(err)
                .context(format!("cannot watch the CRD {name} while waiting for it")));
        }
        Ok(Ok(_)) => {}
    }
    // Discovery can lag the Established condition by a moment, and it cannot be watched.
    while !session.valkey_api_installed().await {
        if tokio::time::Instant::now() >= deadline {
            return Err(not_established(name, timeout));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    match manifests::operator_deployment() {
        Some((namespace, deployment)) => eprintln!(
            "the Valkey API ({name}) is served; the operator runs as Deployment {deployment} in namespace {namespace}"
        ),
        None => eprintln!("the Valkey API ({name}) is served"),
    }
    Ok(())
}

fn not_established(name: &str, timeout: Duration) -> anyhow::Error {
    Problem::new(format!(
        "the CRD {name} is not established after {}",
        duration::format(timeout)
    ))
    .hint(format!(
        "kubectl get crd {name} -o yaml shows its conditions"
    ))
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_read_like_kubectl() {
        let crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": "valkeys.database.kuberly.io"}});
        assert_eq!(
            reference(&crd),
            "customresourcedefinition.apiextensions.k8s.io/valkeys.database.kuberly.io"
        );
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}});
        assert_eq!(reference(&ns), "namespace/x");
    }
}
