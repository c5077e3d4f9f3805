//! spec.metrics end to end, on real pods: the redis_exporter sidecar of each pod of a replicated
//! instance, scraped from the host (pod IPs and the metrics Service's ClusterIP are reachable
//! from it), shows the Valkey it watches; the ServiceMonitor is created once the Prometheus
//! operator's CRD (the real one, from its release, in the cluster's cache) is installed, and
//! the status says why there is none before; turning metrics off removes it all.
//!
//! A test binary of its own: it installs and removes a cluster-wide CRD, which the other e2e
//! tests must not see come and go.
//!
//!   cargo test -p valkey-operator --test metrics

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

use std::net::SocketAddr;

use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use valkey_core::api::Valkey;
use valkey_core::api::defaults::METRICS_PORT;
use valkey_core::api::names::ObjectNames;
use valkey_core::desired::{METRICS_CONTAINER, ServiceMonitor};
use valkey_core::status::is_ready;

use harness::{Env, TIMEOUT, eventually, http_get, metric};
use observe::*;
use service_monitor_crd::{CrdGuard, crd_absent, install_crd};
use support::cluster;

/// The ServiceMonitor condition of the Valkey, once it is `status` with `reason`.
async fn wait_monitor_condition(env: &Env, name: &str, status: &str, reason: &str) -> String {
    let condition = |v: &Valkey| {
        v.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "ServiceMonitor"))
            .cloned()
    };
    let v = wait_for(
        env,
        name,
        &format!("ServiceMonitor condition {status} {reason}"),
        TIMEOUT,
        |v| {
            let c = condition(v).ok_or("no ServiceMonitor condition")?;
            if c.status == status && c.reason == reason {
                Ok(())
            } else {
                Err(format!(
                    "ServiceMonitor condition {} {}: {}",
                    c.status, c.reason, c.message
                ))
            }
        },
    )
    .await;
    condition(&v).map(|c| c.message).unwrap_or_default()
}

/// Scrapes `ip`:9121/metrics until the exporter reports the server up.
async fn scrape(ip: &str) -> String {
    let addr: SocketAddr = format!("{ip}:{METRICS_PORT}").parse().expect("an address");
    eventually(&format!("metrics of {addr}"), TIMEOUT, || async {
        let body = http_get(addr, "/metrics").await?;
        match metric(&body, "redis_up") {
            Some(1.0) => Ok(body),
            other => Err(format!("redis_up {other:?}")),
        }
    })
    .await
}

/// The samples of a labelled metric family: (labels text, value).
fn samples<'a>(body: &'a str, name: &str) -> Vec<(&'a str, f64)> {
    body.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix('{')?;
            let (labels, value) = rest.split_once("} ")?;
            Some((labels, value.trim().parse().ok()?))
        })
        .collect()
}

fn role_of(body: &str) -> Option<&str> {
    samples(body, "redis_instance_info")
        .into_iter()
        .find_map(|(labels, _)| labels.split(',').find_map(|l| l.strip_prefix("role=\"")))
        .map(|r| r.trim_end_matches('"'))
}

#[tokio::test]
async fn the_exporter_of_each_pod_shows_its_valkey_and_the_service_monitor_follows_its_crd() {
    let admin = cluster::admin_client().await;
    let _guard = CrdGuard;
    crd_absent(&admin).await;
    let mut env = Env::new("e2e-metrics").await;
    let operator = env.start_leader().await;
    let name = "vk";
    let names = ObjectNames::new(name);
    create(
        &env,
        name,
        json!({
            "replicas": 3,
            "metrics": {"enabled": true, "serviceMonitor": {"enabled": true, "interval": "15s"}},
        }),
    )
    .await;
    wait_running(&env, name, 3).await;

    // No ServiceMonitor API: the status says so (and the reconcile did not fail over it).
    let why = wait_monitor_condition(&env, name, "False", "ServiceMonitorAPIMissing").await;
    assert!(why.contains("monitoring.coreos.com/v1"), "{why}");
    let valkey = get(&env, name).await;
    let reconciled = valkey
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Reconciled"))
        .expect("a Reconciled condition");
    assert_eq!(reconciled.status, "True", "{reconciled:?}");

    // The pods: a metrics sidecar each, and no password in any command line.
    let passwords = [
        secret_value(&env, &names.generated_secret(), "password").await,
        secret_value(&env, &names.metrics_secret(), "password").await,
        secret_value(&env, &names.operator_secret(), "password").await,
    ];
    let pods = pods(&env, name).await;
    assert_eq!(pods.len(), 3);
    for (pod_name, pod) in &pods {
        let spec = pod.spec.as_ref().expect("a pod spec");
        assert!(
            spec.containers.iter().any(|c| c.name == METRICS_CONTAINER),
            "{pod_name} has no metrics container"
        );
        let text = serde_json::to_string(spec).expect("the pod spec serializes");
        for password in &passwords {
            assert!(
                !text.contains(password.as_str()),
                "{pod_name}: a password in its spec"
            );
        }
        let metrics = spec
            .containers
            .iter()
            .find(|c| c.name == METRICS_CONTAINER)
            .unwrap();
        assert!(metrics.command.is_none() && metrics.args.is_none());
    }

    // Each pod's exporter, scraped at the pod IP.
    let primary = names.pod(0);
    for (pod_name, pod) in &pods {
        let ip = pod_ip(pod).expect("a pod IP");
        let body = scrape(&ip).await;
        let used = metric(&body, "redis_memory_used_bytes").unwrap_or_default();
        assert!(used > 0.0, "{pod_name}: redis_memory_used_bytes {used}");
        if *pod_name == primary {
            assert_eq!(role_of(&body), Some("master"), "{pod_name}");
            // Until both replicas are online (a new replica waits for the first snapshot).
            let replicas = eventually("2 connected replicas, online", TIMEOUT, || async {
                let body = scrape(&ip).await;
                let offsets = samples(&body, "redis_connected_slave_offset_bytes");
                let online = offsets
                    .iter()
                    .filter(|(l, o)| l.contains("slave_state=\"online\"") && *o > 0.0)
                    .count();
                match metric(&body, "redis_connected_slaves") {
                    Some(n) if n == 2.0 && online == 2 => Ok(body),
                    other => Err(format!("redis_connected_slaves {other:?}, {offsets:?}")),
                }
            })
            .await;
            // Each replica's lag and offset, as the primary sees them.
            assert_eq!(
                samples(&replicas, "redis_connected_slave_lag_seconds").len(),
                2
            );
            let offsets = samples(&replicas, "redis_connected_slave_offset_bytes");
            assert_eq!(offsets.len(), 2, "{offsets:?}");
            assert!(offsets.iter().all(|(_, o)| *o > 0.0), "{offsets:?}");
        } else {
            assert_eq!(role_of(&body), Some("slave"), "{pod_name}");
            let link = samples(&body, "redis_master_link_up");
            assert_eq!(link.len(), 1, "{pod_name}: {link:?}");
            assert_eq!(link[0].1, 1.0, "{pod_name}: {link:?}");
            let offset = samples(&body, "redis_slave_repl_offset");
            assert!(
                offset.len() == 1 && offset[0].1 > 0.0,
                "{pod_name}: redis_slave_repl_offset {offset:?}"
            );
            assert!(
                samples(&body, "redis_master_last_io_seconds_ago").len() == 1,
                "{pod_name}: no redis_master_last_io_seconds_ago"
            );
        }
    }

    // The metrics Service: every pod behind it, and its ClusterIP answers.
    let service = env
        .api::<Service>()
        .get(&names.metrics_service())
        .await
        .expect("the metrics Service");
    owned_and_labelled("Service", &service.metadata, &get(&env, name).await)
        .unwrap_or_else(|e| panic!("{e}"));
    let ips: std::collections::BTreeSet<String> = pods.values().filter_map(pod_ip).collect();
    eventually("every pod behind the metrics Service", TIMEOUT, || async {
        let addresses = endpoint_addresses(&env, &names.metrics_service()).await;
        if addresses == ips {
            Ok(())
        } else {
            Err(format!("{addresses:?}, want {ips:?}"))
        }
    })
    .await;
    let cluster_ip = service
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.clone())
        .expect("a ClusterIP");
    let through_service = scrape(&cluster_ip).await;
    assert!(role_of(&through_service).is_some());

    // The real ServiceMonitor CRD installed: the next reconcile creates the ServiceMonitor.
    install_crd(&admin).await;
    let touch = json!({"metadata": {"annotations": {"e2e/touch": "crd-installed"}}});
    env.api::<Valkey>()
        .patch(name, &PatchParams::default(), &Patch::Merge(&touch))
        .await
        .expect("touching the Valkey");
    wait_monitor_condition(&env, name, "True", "Created").await;
    let monitors = Api::<ServiceMonitor>::namespaced(env.client(), &env.ns.name);
    let monitor = monitors
        .get(&names.service_monitor())
        .await
        .expect("the ServiceMonitor");
    owned_and_labelled("ServiceMonitor", &monitor.metadata, &get(&env, name).await)
        .unwrap_or_else(|e| panic!("{e}"));
    let wanted = monitor
        .spec
        .selector
        .match_labels
        .clone()
        .unwrap_or_default();
    let labels = service.metadata.labels.clone().unwrap_or_default();
    assert!(
        !wanted.is_empty() && wanted.iter().all(|(k, v)| labels.get(k) == Some(v)),
        "the ServiceMonitor selects {wanted:?}, the metrics Service has {labels:?}"
    );
    let selected = env
        .api::<Service>()
        .list(
            &kube::api::ListParams::default().labels(
                &wanted
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        )
        .await
        .expect("listing Services")
        .items;
    assert_eq!(
        selected.iter().map(|s| s.name_any()).collect::<Vec<_>>(),
        [names.metrics_service()],
        "exactly the metrics Service"
    );
    let endpoint = &monitor.spec.endpoints[0];
    assert_eq!(endpoint.port.as_deref(), Some("metrics"));
    assert_eq!(endpoint.interval.as_deref(), Some("15s"));
    let service_ports: Vec<_> = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|p| p.name)
        .collect();
    assert!(service_ports.contains(&"metrics".to_owned()));
    assert_eq!(
        monitor
            .spec
            .namespace_selector
            .as_ref()
            .map(|n| n.match_names.clone()),
        Some(vec![env.ns.name.clone()])
    );

    // Metrics off: the ServiceMonitor and the Service go, and the pods roll without the sidecar.
    env.api::<Valkey>()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"metrics": {"enabled": false, "serviceMonitor": {"enabled": false}}}})),
        )
        .await
        .expect("turning metrics off");
    eventually(
        "the ServiceMonitor and metrics Service to go",
        TIMEOUT,
        || async {
            let monitor = monitors
                .get_opt(&names.service_monitor())
                .await
                .map_err(|e| e.to_string())?;
            let service = env
                .api::<Service>()
                .get_opt(&names.metrics_service())
                .await
                .map_err(|e| e.to_string())?;
            match (monitor, service) {
                (None, None) => Ok(()),
                (m, s) => Err(format!(
                    "ServiceMonitor {}, Service {}",
                    m.is_some(),
                    s.is_some()
                )),
            }
        },
    )
    .await;
    eventually("the pods without the sidecar", TIMEOUT * 4, || async {
        let pods = observe::pods(&env, name).await;
        let without = |p: &Pod| {
            p.spec
                .as_ref()
                .is_some_and(|s| s.containers.iter().all(|c| c.name != METRICS_CONTAINER))
        };
        let ready = pods.values().filter(|p| without(p) && is_ready(p)).count();
        if ready == 3 {
            Ok(())
        } else {
            Err(format!("{ready} of 3 rolled and ready"))
        }
    })
    .await;
    wait_running(&env, name, 3).await;
    let valkey = get(&env, name).await;
    assert!(
        !valkey
            .status
            .as_ref()
            .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "ServiceMonitor")),
        "no ServiceMonitor condition once none is wanted"
    );
    // The metrics user's Secret stays (owned by the Valkey), so turning metrics on again keeps
    // its password.
    env.api::<Secret>()
        .get(&names.metrics_secret())
        .await
        .expect("the metrics Secret stays");
    assert_secret_not_leaked(&env, &passwords[1], &[("operator", operator.log_text())]).await;
}
