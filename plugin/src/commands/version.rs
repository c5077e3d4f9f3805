//! `version`: the plugin's version, and (when the cluster answers) the operator's and the API
//! server's. Never fails because of the cluster: the plugin's version is always worth printing.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use serde::Serialize;

use crate::cli::{GlobalArgs, VersionArgs};
use crate::diagnose::Call;
use crate::session::{self, Session};
use crate::{manifests, output};

/// How long `version` waits for the cluster when no --request-timeout is given.
const DEFAULT_WAIT: Duration = Duration::from_secs(5);

#[derive(Serialize, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct Versions {
    plugin: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    operator: Option<Operator>,
    #[serde(skip_serializing_if = "Option::is_none")]
    kubernetes: Option<String>,
}

#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
struct Operator {
    version: String,
    image: String,
    namespace: String,
    ready_replicas: i32,
    replicas: i32,
}

pub async fn run(args: VersionArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let mut versions = Versions {
        plugin: format!("v{}", env!("CARGO_PKG_VERSION")),
        ..Versions::default()
    };
    if !args.client {
        match Session::connect(global).await {
            Ok(session) => cluster_versions(&session, global, &mut versions).await,
            Err(err) => eprintln!("cluster: not reachable: {err:#}"),
        }
    }
    match args.output {
        Some(format) => output::print_object(&versions, format),
        None => output::print(&text(&versions)),
    }
}

/// What `version` prints, for the support bundle of `report`.
pub(crate) async fn text_for(session: &Session, global: &GlobalArgs) -> String {
    let mut versions = Versions {
        plugin: format!("v{}", env!("CARGO_PKG_VERSION")),
        ..Versions::default()
    };
    cluster_versions(session, global, &mut versions).await;
    text(&versions) + "\n"
}

fn text(versions: &Versions) -> String {
    let mut lines = vec![format!("Plugin version:     {}", versions.plugin)];
    if let Some(op) = &versions.operator {
        lines.push(format!(
            "Operator version:   {} (image {}, {}/{} ready in namespace {})",
            op.version, op.image, op.ready_replicas, op.replicas, op.namespace
        ));
    }
    if let Some(k) = &versions.kubernetes {
        lines.push(format!("Kubernetes version: {k}"));
    }
    lines.join("\n")
}

async fn cluster_versions(session: &Session, global: &GlobalArgs, versions: &mut Versions) {
    let limit = global
        .request_timeout
        .filter(|t| !t.is_zero())
        .unwrap_or(DEFAULT_WAIT);
    match session::within(limit, session.client.apiserver_version()).await {
        Some(Ok(info)) => versions.kubernetes = Some(info.git_version),
        Some(Err(err)) => {
            let err = session
                .explain(err, Call::dynamic("get", "", "version"))
                .await;
            eprintln!("cluster: not reachable: {err:#}");
            return;
        }
        None => {
            eprintln!(
                "cluster: no answer from {} within {limit:?}",
                session.target.server
            );
            return;
        }
    }
    let Some((namespace, name)) = manifests::operator_deployment() else {
        return;
    };
    let api: Api<Deployment> = Api::namespaced(session.client.clone(), &namespace);
    match session::within(limit, api.get_opt(&name)).await {
        Some(Ok(Some(deployment))) => versions.operator = Some(operator(&deployment, &namespace)),
        Some(Ok(None)) => eprintln!(
            "operator: not installed (no Deployment {name} in namespace {namespace}); `kubectl valkey install` installs it"
        ),
        Some(Err(err)) => {
            let call = Call::new::<Deployment>("get")
                .namespace(Some(&namespace))
                .name(&name);
            eprintln!("operator: unknown: {:#}", session.explain(err, call).await);
        }
        None => eprintln!("operator: unknown: no answer within {limit:?}"),
    }
}

fn operator(deployment: &Deployment, namespace: &str) -> Operator {
    let image = deployment
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default();
    let status = deployment.status.as_ref();
    Operator {
        version: image_tag(&image).unwrap_or("unknown").to_owned(),
        ready_replicas: status.and_then(|s| s.ready_replicas).unwrap_or_default(),
        replicas: deployment.spec.replicas.unwrap_or(1),
        namespace: namespace.to_owned(),
        image,
    }
}

/// The tag of an image reference (not a registry port, not a digest).
fn image_tag(image: &str) -> Option<&str> {
    let name = image.split('@').next()?;
    let last = name.rsplit('/').next()?;
    last.split_once(':').map(|(_, tag)| tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_read_from_image_references() {
        assert_eq!(
            image_tag("ghcr.io/kuberly/valkey-operator:v0.1.0"),
            Some("v0.1.0")
        );
        assert_eq!(image_tag("localhost:5000/op:1.2"), Some("1.2"));
        assert_eq!(image_tag("localhost:5000/op"), None);
        assert_eq!(image_tag("op@sha256:abc"), None);
    }
}
