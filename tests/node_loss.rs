//! `hack/cluster node stop` makes a real node die as a machine does: the Node goes NotReady and
//! its pods stop answering; `node start` heals both. A test binary of its own, because a stopped
//! node would break any test whose pods run there.

mod support;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use serde_json::json;
use support::cluster::{TestNamespace, hack_cluster};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const RESTRICTED: (&str, &str) = ("pod-security.kubernetes.io/enforce", "restricted");

async fn answers_ping(addr: SocketAddr) -> bool {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        stream.write_all(b"PING\r\n").await.ok()?;
        let mut buf = [0u8; 7];
        stream.read_exact(&mut buf).await.ok()?;
        (&buf == b"+PONG\r\n").then_some(())
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), exchange).await,
        Ok(Some(()))
    )
}

fn node_ready(node: &Node) -> Option<bool> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status == "True")
}

async fn wait_until<F, Fut>(what: &str, seconds: u64, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} within {seconds}s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Starts the node again when the test ends, whatever happened.
struct Restart(String);
impl Drop for Restart {
    fn drop(&mut self) {
        let _ = std::process::Command::new(support::cluster::repo_root().join("hack/cluster"))
            .args(["node", "start", &self.0])
            .status();
    }
}

#[tokio::test]
async fn a_stopped_node_goes_not_ready_and_unreachable_and_heals_when_started() {
    let ns = TestNamespace::new("node-loss", &[RESTRICTED]).await;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "vk"},
        "spec": {
            "securityContext": {"runAsNonRoot": true, "runAsUser": 999, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "valkey",
                "image": valkey_core::api::defaults::IMAGE,
                "command": ["valkey-server", "--protected-mode", "no"],
                "readinessProbe": {"exec": {"command": ["valkey-cli", "ping"]}, "periodSeconds": 1},
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }))
    .expect("a pod");
    let pods: Api<Pod> = ns.api();
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("created");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    let ip: IpAddr = loop {
        if let Ok(pod) = pods.get("vk").await
            && valkey_core::status::is_ready(&pod)
            && let Some(ip) = pod
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.as_deref())
                .and_then(|s| s.parse().ok())
        {
            break ip;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the pod is Ready within 90s"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let addr = SocketAddr::new(ip, 6379);
    assert!(answers_ping(addr).await, "the pod answers before the stop");
    let node = pods
        .get("vk")
        .await
        .expect("pod")
        .spec
        .and_then(|s| s.node_name)
        .expect("scheduled");
    let nodes: Api<Node> = Api::all(ns.client.clone());

    hack_cluster(&["node", "stop", &node]);
    let _restart = Restart(node.clone());
    assert!(
        !answers_ping(addr).await,
        "the pod still answers on a stopped node"
    );
    wait_until("the node is NotReady", 90, || {
        let nodes = nodes.clone();
        let node = node.clone();
        async move { nodes.get(&node).await.ok().as_ref().and_then(node_ready) == Some(false) }
    })
    .await;
    assert!(!answers_ping(addr).await, "still unreachable");

    hack_cluster(&["node", "start", &node]);
    let n = nodes.get(&node).await.expect("the node");
    assert_eq!(
        node_ready(&n),
        Some(true),
        "{} is Ready again",
        n.name_any()
    );
    wait_until("the pod answers again", 60, || answers_ping(addr)).await;
}
