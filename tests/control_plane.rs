//! The local cluster is a real one: pods run on real nodes (kubelet, containerd, runc) from the
//! Valkey image the CRD defaults to; exec and logs go through the API server to the container;
//! probes really run and decide the Service's endpoints; a killed server is restarted; a
//! StatefulSet spreads over the nodes and replicates over headless DNS names (CoreDNS); the host
//! reaches a ClusterIP (kube-proxy); a claim's data outlives its pod; nothing leaves the machine
//! through the cluster's ranges; the restricted Pod Security Standard is enforced.
//! (Stopping a node is tested in tests/node_loss.rs, alone, because it disturbs every pod on it.)

mod support;

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use futures::{AsyncBufReadExt, TryStreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use kube::api::{Api, AttachParams, DeleteParams, ListParams, LogParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use serde_json::json;
use support::cluster::{TestNamespace, cluster_env};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const RESTRICTED: (&str, &str) = ("pod-security.kubernetes.io/enforce", "restricted");
const VALKEY_IMAGE: &str = valkey_core::api::defaults::IMAGE;
/// A TEST-NET-2 address (RFC 5737): nothing answers there, and no packet may try.
const OUTSIDE: &str = "198.51.100.7";

/// A container of the Valkey image that passes the restricted standard, running `command`.
fn valkey_container(command: serde_json::Value) -> serde_json::Value {
    json!({
        "name": "valkey",
        "image": VALKEY_IMAGE,
        "command": command,
        "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": true},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    })
}

fn restricted_pod_spec(container: serde_json::Value) -> serde_json::Value {
    json!({
        "securityContext": {"runAsNonRoot": true, "runAsUser": 999, "runAsGroup": 999, "fsGroup": 999, "seccompProfile": {"type": "RuntimeDefault"}},
        "terminationGracePeriodSeconds": 2,
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
    })
}

/// A valkey-server pod with an exec readiness probe (`valkey-cli ping`, and no /tmp/notready).
fn valkey_pod(name: &str) -> Pod {
    let mut container = valkey_container(json!(["valkey-server", "--protected-mode", "no"]));
    container["readinessProbe"] = json!({
        "exec": {"command": ["sh", "-c", "test ! -e /tmp/notready && test \"$(valkey-cli -h 127.0.0.1 ping)\" = PONG"]},
        "periodSeconds": 1,
        "failureThreshold": 1,
    });
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": restricted_pod_spec(container),
    }))
    .expect("a pod")
}

async fn create_ready(ns: &TestNamespace, pod: &Pod) -> Pod {
    let pods: Api<Pod> = ns.api();
    pods.create(&PostParams::default(), pod)
        .await
        .expect("pod created");
    wait_ready(ns, &pod.name_any()).await
}

async fn wait_ready(ns: &TestNamespace, name: &str) -> Pod {
    let pods: Api<Pod> = ns.api();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok(pod) = pods.get(name).await
            && is_ready(&pod)
        {
            return pod;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} is not Ready within 90s: {:?}",
            pods.get(name).await.ok().and_then(|p| p.status)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn is_ready(pod: &Pod) -> bool {
    valkey_core::status::is_ready(pod)
}

fn pod_ip(pod: &Pod) -> IpAddr {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .and_then(|ip| ip.parse().ok())
        .expect("a pod IP")
}

/// `PING` over plain TCP from this process (the host), or why it failed.
async fn ping(addr: SocketAddr) -> Result<(), String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| e.to_string())?;
        stream
            .write_all(b"PING\r\n")
            .await
            .map_err(|e| e.to_string())?;
        let mut buf = [0u8; 7];
        stream
            .read_exact(&mut buf)
            .await
            .map_err(|e| e.to_string())?;
        if &buf == b"+PONG\r\n" {
            Ok(())
        } else {
            Err(format!("answer {:?}", String::from_utf8_lossy(&buf)))
        }
    };
    tokio::time::timeout(Duration::from_secs(3), exchange)
        .await
        .map_err(|_| "timed out".to_owned())?
}

/// Runs a command in a pod's container: (stdout, exit code).
async fn exec(ns: &TestNamespace, pod: &str, command: &[&str]) -> (String, i32) {
    let pods: Api<Pod> = ns.api();
    let params = AttachParams::default().stdout(true).stderr(false);
    let mut attached = pods
        .exec(pod, command.to_vec(), &params)
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
    let code = match status.status.as_deref() {
        Some("Success") => 0,
        _ => status
            .details
            .and_then(|d| d.causes)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.reason.as_deref() == Some("ExitCode"))
            .and_then(|c| c.message)
            .and_then(|m| m.parse().ok())
            .unwrap_or(-1),
    };
    (out, code)
}

#[tokio::test]
async fn a_pod_runs_the_valkey_image_on_a_real_node_and_exec_reaches_its_container() {
    let ns = TestNamespace::new("cp-exec", &[RESTRICTED]).await;
    let pod = create_ready(&ns, &valkey_pod("vk")).await;
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    let nodes: Api<Node> = Api::all(ns.client.clone());
    let labels = nodes
        .get(node.as_deref().expect("scheduled"))
        .await
        .expect("the node")
        .labels()
        .clone();
    assert_eq!(
        labels.get("type").map(String::as_str),
        Some("real"),
        "an untolerating pod lands on a real node, not on {node:?}"
    );

    // PID 1 of the container is valkey-server (not a host process), running as valkey.
    let (cmdline, code) = exec(
        &ns,
        "vk",
        &["sh", "-c", "tr '\\0' ' ' </proc/1/cmdline; id -u"],
    )
    .await;
    assert_eq!(code, 0);
    assert!(cmdline.starts_with("valkey-server"), "PID 1: {cmdline:?}");
    assert!(cmdline.trim_end().ends_with("999"), "{cmdline:?}");
    let (pong, _) = exec(&ns, "vk", &["valkey-cli", "-h", "127.0.0.1", "ping"]).await;
    assert_eq!(pong.trim(), "PONG");
    let (_, code) = exec(&ns, "vk", &["sh", "-c", "exit 3"]).await;
    assert_eq!(code, 3, "the exit code reaches the client");
    // The host reaches the pod IP.
    ping(SocketAddr::new(pod_ip(&pod), 6379))
        .await
        .expect("host -> pod IP");
}

#[tokio::test]
async fn logs_are_read_and_followed() {
    let ns = TestNamespace::new("cp-logs", &[RESTRICTED]).await;
    let talker: Pod = serde_json::from_value(json!({
        "metadata": {"name": "talker"},
        "spec": restricted_pod_spec(valkey_container(json!(["sh", "-c", "echo first line; sleep 3; echo appended later; exec sleep 3600"]))),
    }))
    .expect("a pod");
    ns.api::<Pod>()
        .create(&PostParams::default(), &talker)
        .await
        .expect("created");
    let running = await_condition(ns.api::<Pod>(), "talker", conditions::is_pod_running());
    tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("running within 60s")
        .expect("watching");
    let pods: Api<Pod> = ns.api();
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
    let next = tokio::time::timeout(Duration::from_secs(15), lines.try_next())
        .await
        .expect("the later line arrives while following")
        .expect("read");
    assert_eq!(next.as_deref(), Some("appended later"));
    let all = pods
        .logs("talker", &LogParams::default())
        .await
        .expect("logs");
    assert_eq!(all, "first line\nappended later\n");
}

#[tokio::test]
async fn a_failing_readiness_probe_takes_the_pod_out_of_its_service() {
    let ns = TestNamespace::new("cp-probe", &[RESTRICTED]).await;
    create_ready(&ns, &valkey_pod("vk")).await;
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "vk"},
        "spec": {"selector": {"app": "vk"}, "ports": [{"port": 6379}]},
    }))
    .expect("a service");
    ns.api::<Service>()
        .create(&PostParams::default(), &service)
        .await
        .expect("service");
    let slices: Api<EndpointSlice> = ns.api();
    let endpoint_ready = || async {
        slices
            .list(&ListParams::default().labels("kubernetes.io/service-name=vk"))
            .await
            .ok()
            .and_then(|l| {
                l.items
                    .into_iter()
                    .flat_map(|s| s.endpoints.unwrap_or_default())
                    .next()
                    .and_then(|e| e.conditions?.ready)
            })
    };
    let wait_for = |want: bool| async move {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while endpoint_ready().await != Some(want) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the endpoint is not ready={want} within 30s"
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    };
    wait_for(true).await;

    exec(&ns, "vk", &["touch", "/tmp/notready"]).await;
    wait_for(false).await;
    let pod = ns.api::<Pod>().get("vk").await.expect("pod");
    assert!(!is_ready(&pod), "the pod is NotReady");

    exec(&ns, "vk", &["rm", "/tmp/notready"]).await;
    wait_for(true).await;
}

/// The host pid of a container's main process: the process whose cgroup names the pod.
fn host_pid(pod: &Pod, exe_name: &str) -> Option<i32> {
    let uid = pod.uid()?;
    let underscored = uid.replace('-', "_");
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let cgroup = std::fs::read_to_string(entry.path().join("cgroup")).ok()?;
            let comm = std::fs::read_to_string(entry.path().join("comm")).ok()?;
            ((cgroup.contains(&uid) || cgroup.contains(&underscored)) && comm.trim() == exe_name)
                .then_some(pid)
        })
}

#[tokio::test]
async fn killing_valkey_server_makes_the_kubelet_restart_it() {
    let ns = TestNamespace::new("cp-kill", &[RESTRICTED]).await;
    let pod = create_ready(&ns, &valkey_pod("vk")).await;
    let pid = host_pid(&pod, "valkey-server").expect("valkey-server runs on this machine");
    // SIGKILL from the host, as the OOM killer would.
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let pods: Api<Pod> = ns.api();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let restarted = loop {
        let pod = pods.get("vk").await.expect("pod");
        let container = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first().cloned())
            .expect("a container status");
        if container.restart_count == 1 && container.ready {
            break container;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not restarted and Ready within 60s: {container:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let exit = restarted
        .last_state
        .and_then(|s| s.terminated)
        .map(|t| t.exit_code);
    assert_eq!(exit, Some(137), "the last state is the SIGKILL");
    assert_ne!(host_pid(&pod, "valkey-server"), Some(pid), "a new process");
}

/// A StatefulSet of valkey-server: pod 0 is the primary, the others replicate from it by its
/// headless DNS name; every pod has a claim; one pod per node (required anti-affinity).
fn valkey_statefulset(ns: &str) -> StatefulSet {
    let script = format!(
        "if [ \"$HOSTNAME\" = vk-0 ]; then exec valkey-server --protected-mode no --appendonly yes --dir /data; fi; \
         exec valkey-server --protected-mode no --appendonly yes --dir /data --replicaof vk-0.vk.{ns}.svc.cluster.local 6379"
    );
    let mut container = valkey_container(json!(["sh", "-c", script]));
    container["volumeMounts"] =
        json!([{"name": "tmp", "mountPath": "/tmp"}, {"name": "data", "mountPath": "/data"}]);
    container["readinessProbe"] = json!({
        "exec": {"command": ["sh", "-c", "valkey-cli -h 127.0.0.1 ping | grep -q PONG"]},
        "periodSeconds": 1,
    });
    let mut spec = restricted_pod_spec(container);
    spec["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "vk"}}}
    ]}});
    serde_json::from_value(json!({
        "metadata": {"name": "vk"},
        "spec": {
            "replicas": 3,
            "serviceName": "vk",
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "vk"}},
            "template": {"metadata": {"labels": {"app": "vk"}}, "spec": spec},
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
            }],
        },
    }))
    .expect("a StatefulSet")
}

async fn create_services(ns: &TestNamespace) -> Service {
    let services: Api<Service> = ns.api();
    for svc in [
        json!({"metadata": {"name": "vk"}, "spec": {"clusterIP": "None", "publishNotReadyAddresses": true, "selector": {"app": "vk"}, "ports": [{"port": 6379}]}}),
        json!({"metadata": {"name": "vk-primary"}, "spec": {"selector": {"statefulset.kubernetes.io/pod-name": "vk-0"}, "ports": [{"port": 6379}]}}),
    ] {
        let svc: Service = serde_json::from_value(svc).expect("a service");
        services
            .create(&PostParams::default(), &svc)
            .await
            .expect("service");
    }
    services.get("vk-primary").await.expect("the service")
}

async fn all_ready(ns: &TestNamespace, n: usize) -> Vec<Pod> {
    let pods: Api<Pod> = ns.api();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let ready: Vec<Pod> = pods
            .list(&ListParams::default().labels("app=vk"))
            .await
            .expect("pods")
            .items
            .into_iter()
            .filter(is_ready)
            .collect();
        if ready.len() == n {
            return ready;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {n} pods Ready after 120s",
            ready.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn a_statefulset_spreads_over_the_real_nodes_replicates_over_dns_and_keeps_its_data() {
    let ns = TestNamespace::new("cp-sts", &[RESTRICTED]).await;
    let primary = create_services(&ns).await;
    ns.api::<StatefulSet>()
        .create(&PostParams::default(), &valkey_statefulset(&ns.name))
        .await
        .expect("created");
    let ready = all_ready(&ns, 3).await;
    let nodes: BTreeSet<String> = ready
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    assert_eq!(nodes.len(), 3, "one pod per node: {nodes:?}");
    assert!(
        nodes.iter().all(|n| n.starts_with("real-node-")),
        "{nodes:?}"
    );

    // Both replicas found vk-0 through CoreDNS and completed their sync.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (info, _) = exec(&ns, "vk-0", &["valkey-cli", "info", "replication"]).await;
        let online = info.matches("state=online").count();
        if online == 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "replicas not online after 60s: {info}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The host reaches the primary's ClusterIP (kube-proxy), and writes there reach a replica.
    let cluster_ip: IpAddr = primary
        .spec
        .and_then(|s| s.cluster_ip)
        .and_then(|ip| ip.parse().ok())
        .expect("a ClusterIP");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while let Err(e) = ping(SocketAddr::new(cluster_ip, 6379)).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "host -> ClusterIP {cluster_ip}: {e}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let (ok, _) = exec(&ns, "vk-0", &["valkey-cli", "set", "kept", "across-pods"]).await;
    assert_eq!(ok.trim(), "OK");
    let (_, code) = exec(&ns, "vk-0", &["valkey-cli", "wait", "2", "5000"]).await;
    assert_eq!(code, 0);
    // WAIT's answer is a count, not a promise (its exit code is 0 either way), and an exec can
    // fail on its own: the replica is read until it has the key, for a bounded time.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let (value, _) = exec(&ns, "vk-1", &["valkey-cli", "get", "kept"]).await;
        if value.trim() == "across-pods" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not replicated to vk-1 after 15 s: {value:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // The claim outlives the pod: vk-0 comes back with the key from its append-only file.
    let old_uid = ready
        .iter()
        .find(|p| p.name_any() == "vk-0")
        .and_then(|p| p.uid());
    ns.api::<Pod>()
        .delete("vk-0", &DeleteParams::default())
        .await
        .expect("deleted");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok(pod) = ns.api::<Pod>().get("vk-0").await
            && pod.uid() != old_uid
            && is_ready(&pod)
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "vk-0 not back within 90s"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let (value, _) = exec(&ns, "vk-0", &["valkey-cli", "get", "kept"]).await;
    assert_eq!(value.trim(), "across-pods", "the data survived the pod");
}

/// The address `third.fourth` inside a /16 range.
fn address_in(cidr: &str, third: u8, fourth: u8) -> IpAddr {
    let base = cidr.split('/').next().expect("a CIDR");
    let octets: Vec<&str> = base.split('.').collect();
    format!("{}.{}.{third}.{fourth}", octets[0], octets[1])
        .parse()
        .expect("an address")
}

#[tokio::test]
async fn nothing_leaves_the_machine_through_the_cluster_ranges() {
    let ns = TestNamespace::new("cp-net", &[RESTRICTED]).await;
    let pod = create_ready(&ns, &valkey_pod("vk")).await;

    // A pod can reach neither an outside address nor the host's kubelet port.
    let node_ip = pod
        .status
        .as_ref()
        .and_then(|s| s.host_ip.clone())
        .expect("a host IP");
    for (target, what) in [
        (format!("{OUTSIDE} 80"), "an outside address"),
        (format!("{node_ip} 10250"), "the kubelet"),
    ] {
        let (_, code) = exec(
            &ns,
            "vk",
            &["sh", "-c", &format!("nc -w 2 {target} </dev/null")],
        )
        .await;
        assert_ne!(code, 0, "a pod reached {what} ({target})");
    }

    // The host: an address of each range that nothing owns is not routed off the machine, and
    // a connection to it fails instead of going out through the default route.
    let ranges = [
        "VALKEY_OPERATOR_POD_CIDR",
        "VALKEY_OPERATOR_SERVICE_CIDR",
        "VALKEY_OPERATOR_KWOK_POD_CIDR",
    ]
    .map(|name| cluster_env(name).unwrap_or_else(|| panic!("hack/cluster env exports {name}")));
    let default_dev = route_dev(OUTSIDE);
    for cidr in &ranges {
        let addr = address_in(cidr, 250, 7);
        let dev = route_dev(&addr.to_string());
        assert!(
            dev.is_none() || dev != default_dev,
            "{addr} ({cidr}) is routed like the outside ({dev:?})"
        );
        let connect = tokio::time::timeout(
            Duration::from_secs(5),
            tokio::net::TcpStream::connect(SocketAddr::new(addr, 80)),
        )
        .await;
        assert!(
            !matches!(connect, Ok(Ok(_))),
            "the host connected to {addr} ({cidr})"
        );
    }
}

/// The device `ip route get` picks for an address, or None when it has no route.
fn route_dev(addr: &str) -> Option<String> {
    let out = std::process::Command::new("ip")
        .args(["route", "get", addr])
        .output()
        .expect("ip route get");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut words = text.split_whitespace();
    words.find(|w| *w == "dev")?;
    words.next().map(str::to_owned)
}

#[tokio::test]
async fn a_pod_breaking_the_restricted_standard_is_refused() {
    let ns = TestNamespace::new("cp-pss", &[RESTRICTED]).await;
    let privileged: Pod = serde_json::from_value(json!({
        "metadata": {"name": "privileged"},
        "spec": {"containers": [{"name": "app", "image": VALKEY_IMAGE, "securityContext": {"privileged": true}}]},
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
    create_ready(&ns, &valkey_pod("compliant")).await;
}
