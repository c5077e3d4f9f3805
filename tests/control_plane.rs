//! The local control plane is a real one: a StatefulSet gets Running, Ready pods spread over the
//! fake nodes; exec runs a command and returns its output and exit code through the API server;
//! logs are read and followed; the restricted Pod Security Standard is enforced.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use futures::{AsyncBufReadExt, StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{
    AttachParams, DynamicObject, ListParams, LogParams, Patch, PatchParams, PostParams,
};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::cluster::TestNamespace;
use tokio::io::AsyncReadExt;

const RESTRICTED: (&str, &str) = ("pod-security.kubernetes.io/enforce", "restricted");

/// A pod spec that passes the restricted Pod Security Standard.
fn restricted_pod_spec() -> serde_json::Value {
    json!({
        "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "app",
            "image": "registry.example/app:1",
            "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
        }],
    })
}

async fn pod_running(ns: &TestNamespace, name: &str) -> Pod {
    let pods: Api<Pod> = ns.api();
    let running = await_condition(pods.clone(), name, conditions::is_pod_running());
    tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("the pod runs within 60s")
        .expect("watching the pod");
    pods.get(name).await.expect("the pod")
}

#[tokio::test]
async fn a_statefulset_gets_running_ready_pods_spread_over_fake_nodes() {
    let ns = TestNamespace::new("cp-sts", &[RESTRICTED]).await;
    let mut pod_spec = restricted_pod_spec();
    pod_spec["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "web"}}}
    ]}});
    let sts: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 3,
            "serviceName": "web",
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": pod_spec,
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
            }],
        },
    }))
    .expect("a StatefulSet");
    let api: Api<StatefulSet> = ns.api();
    api.create(&PostParams::default(), &sts)
        .await
        .expect("created");

    let pods: Api<Pod> = ns.api();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    let ready = loop {
        let list = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .expect("pods");
        let ready: Vec<Pod> = list.items.into_iter().filter(is_ready).collect();
        if ready.len() == 3 {
            break ready;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of 3 pods Ready after 90s",
            ready.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let nodes: BTreeSet<String> = ready
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    assert_eq!(
        nodes.len(),
        3,
        "pods not spread over the fake nodes: {nodes:?}"
    );
    for pod in &ready {
        let status = pod.status.as_ref().expect("a pod status");
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert!(status.pod_ip.is_some(), "{} has no pod IP", pod.name_any());
    }
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> = ns.api();
    let bound = claims
        .list(&ListParams::default())
        .await
        .expect("claims")
        .items
        .iter()
        .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
        .count();
    assert_eq!(bound, 3, "every pod's volume claim is Bound");
}

fn is_ready(pod: &Pod) -> bool {
    valkey_core::status::is_ready(pod)
}

async fn plain_pod(ns: &TestNamespace, name: &str) -> Pod {
    let pod: Pod =
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": restricted_pod_spec()}))
            .unwrap();
    ns.api::<Pod>()
        .create(&PostParams::default(), &pod)
        .await
        .expect("pod created");
    pod_running(ns, name).await
}

#[tokio::test]
async fn exec_runs_a_command_in_a_fake_pod_and_returns_output_and_exit_code() {
    let ns = TestNamespace::new("cp-exec", &[RESTRICTED]).await;
    plain_pod(&ns, "shell").await;
    let pods: Api<Pod> = ns.api();
    let params = AttachParams::default().stdout(true).stderr(false);

    let mut attached = pods
        .exec("shell", ["sh", "-c", "echo hello-from-$((6*7))"], &params)
        .await
        .expect("exec");
    let mut out = String::new();
    attached
        .stdout()
        .expect("stdout")
        .read_to_string(&mut out)
        .await
        .expect("reading stdout");
    let status = attached
        .take_status()
        .expect("a status channel")
        .await
        .expect("a status");
    assert_eq!(out.trim(), "hello-from-42");
    assert_eq!(status.status.as_deref(), Some("Success"));

    let mut attached = pods
        .exec("shell", ["sh", "-c", "exit 3"], &params)
        .await
        .expect("exec");
    let status = attached
        .take_status()
        .expect("a status channel")
        .await
        .expect("a status");
    assert_eq!(status.status.as_deref(), Some("Failure"));
    let code = status
        .details
        .and_then(|d| d.causes)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.reason.as_deref() == Some("ExitCode"))
        .and_then(|c| c.message);
    assert_eq!(
        code.as_deref(),
        Some("3"),
        "the exit code reaches the client"
    );
}

#[tokio::test]
async fn logs_are_read_and_followed() {
    let ns = TestNamespace::new("cp-logs", &[RESTRICTED]).await;
    plain_pod(&ns, "talker").await;
    let file = tempfile_path(&ns.name);
    std::fs::write(&file, "2026-11-30T10:00:00Z stdout F first line\n").expect("log file");
    let logs = json!({
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Logs",
        "metadata": {"name": "talker"},
        "spec": {"logs": [{"logsFile": file, "follow": true}]},
    });
    let gvk = GroupVersionKind::gvk("kwok.x-k8s.io", "v1alpha1", "Logs");
    let kwok_logs: Api<DynamicObject> = Api::namespaced_with(
        ns.client.clone(),
        &ns.name,
        &ApiResource::from_gvk_with_plural(&gvk, "logs"),
    );
    kwok_logs
        .patch(
            "talker",
            &PatchParams::apply("control-plane-test"),
            &Patch::Apply(&logs),
        )
        .await
        .expect("a Logs object");

    let pods: Api<Pod> = ns.api();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let text = pods
            .logs("talker", &LogParams::default())
            .await
            .unwrap_or_default();
        if text.contains("first line") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "logs never showed the file: {text:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    let follow = LogParams {
        follow: true,
        ..Default::default()
    };
    let mut lines = pods
        .log_stream("talker", &follow)
        .await
        .expect("a log stream")
        .lines();
    let first = tokio::time::timeout(Duration::from_secs(10), lines.try_next())
        .await
        .expect("a line")
        .expect("read");
    assert_eq!(first.as_deref(), Some("first line"));
    let appended = "2026-11-30T10:00:05Z stdout F appended later\n";
    std::fs::OpenOptions::new()
        .append(true)
        .open(&file)
        .and_then(|mut f| std::io::Write::write_all(&mut f, appended.as_bytes()))
        .expect("append");
    let next = tokio::time::timeout(Duration::from_secs(15), lines.next())
        .await
        .expect("the appended line arrives while following");
    assert_eq!(
        next.transpose().expect("read").as_deref(),
        Some("appended later")
    );
    let _ = std::fs::remove_file(file);
}

fn tempfile_path(ns: &str) -> String {
    std::env::temp_dir()
        .join(format!("{ns}-talker.log"))
        .display()
        .to_string()
}

#[tokio::test]
async fn a_pod_breaking_the_restricted_standard_is_refused() {
    let ns = TestNamespace::new("cp-pss", &[RESTRICTED]).await;
    let privileged: Pod = serde_json::from_value(json!({
        "metadata": {"name": "privileged"},
        "spec": {"containers": [{"name": "app", "image": "registry.example/app:1", "securityContext": {"privileged": true}}]},
    }))
    .unwrap();
    match ns
        .api::<Pod>()
        .create(&PostParams::default(), &privileged)
        .await
    {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403, "{}", status.message);
            assert!(
                status.message.contains("violates PodSecurity \"restricted"),
                "{}",
                status.message
            );
        }
        other => panic!("a privileged pod was admitted: {other:?}"),
    }
    // The same namespace admits a pod that follows the standard.
    plain_pod(&ns, "compliant").await;
}
