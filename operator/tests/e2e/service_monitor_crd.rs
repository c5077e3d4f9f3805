//! The Prometheus operator's ServiceMonitor CRD (the real one, from its release, which
//! `hack/cluster build` puts beside the cluster's binaries), installed and removed by the tests
//! that need it. Cluster-wide: only test binaries of their own use it (metrics.rs, rbac.rs), so
//! the other e2e tests never see it come and go.

use std::path::PathBuf;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::conditions;
use kube::runtime::wait::await_condition;

use crate::harness::{TIMEOUT, eventually};
use crate::support::cluster;

pub const SERVICE_MONITOR_CRD: &str = "servicemonitors.monitoring.coreos.com";

/// The ServiceMonitor CRD file `hack/cluster build` put beside the binaries.
pub fn service_monitor_crd_file() -> PathBuf {
    let file = PathBuf::from(cluster::tools_path())
        .join("crds/monitoring.coreos.com_servicemonitors.yaml");
    assert!(
        file.is_file(),
        "{} is missing: run `hack/cluster build`",
        file.display()
    );
    file
}

/// Removes the ServiceMonitor CRD (and so every ServiceMonitor) when dropped, pass or fail.
pub struct CrdGuard;

impl Drop for CrdGuard {
    fn drop(&mut self) {
        cluster::clean_up_with_admin(|client| async move {
            let _ = Api::<CustomResourceDefinition>::all(client)
                .delete(SERVICE_MONITOR_CRD, &DeleteParams::default())
                .await;
        });
    }
}

pub async fn crd_absent(client: &kube::Client) {
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    let _ = crds
        .delete(SERVICE_MONITOR_CRD, &DeleteParams::default())
        .await;
    eventually("the ServiceMonitor CRD to be gone", TIMEOUT, || async {
        match crds.get_opt(SERVICE_MONITOR_CRD).await {
            Ok(None) => Ok(()),
            Ok(Some(_)) => Err("still there".to_owned()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
}

pub async fn install_crd(client: &kube::Client) {
    let text = std::fs::read_to_string(service_monitor_crd_file()).expect("reading the CRD file");
    let crd: CustomResourceDefinition = yaml_serde::from_str(&text).expect("parsing the CRD file");
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    crds.create(&PostParams::default(), &crd)
        .await
        .expect("creating the ServiceMonitor CRD");
    let established = await_condition(crds, SERVICE_MONITOR_CRD, conditions::is_crd_established());
    tokio::time::timeout(TIMEOUT, established)
        .await
        .expect("the ServiceMonitor CRD is established")
        .expect("watching the CRD");
}
