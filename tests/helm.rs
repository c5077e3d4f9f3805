//! The Helm chart (charts/valkey-operator) and the monitoring files (docs/monitoring), proven with
//! the real tools the local control plane's cache builds (hack/cluster build: helm, promtool,
//! grafana-dashboard-check):
//!
//! - `helm lint --strict` is clean, with the defaults and with every optional object on;
//! - `helm template` with the default values renders the objects of `kubectl kustomize
//!   manifests/` (parsed, order-insensitive), but the Namespace, which Helm leaves to
//!   `--create-namespace`; the chart's version, appVersion and default image follow the release;
//! - values change the objects as values.yaml says (watch namespace, replicas and leader election,
//!   log format, image, resources, placement, metrics Service, ServiceMonitor, PrometheusRule,
//!   dashboard ConfigMap), and settings that do not go together fail with the fix;
//! - promtool checks the alert rules (the file and the PrometheusRule the chart renders) and runs
//!   their unit tests (tests/fixtures/monitoring); the dashboard passes Grafana's own schema;
//! - on the local cluster's real nodes, `helm install` runs the operator image of `make image`
//!   (loaded with `hack/cluster load-image`), which reconciles a Valkey to Running; `helm upgrade`
//!   with a changed value rolls the operator; `helm uninstall` removes it and leaves the CRD.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::cluster::{self, TestNamespace};
use support::commands::{describe, objects_by_key, run, stdout};

const VERSION: &str = env!("CARGO_PKG_VERSION");
const CHART: &str = "charts/valkey-operator";
const RULES: &str = "docs/monitoring/valkey-operator.rules.yaml";
const DASHBOARD: &str = "docs/monitoring/valkey.json";
const RULE_TESTS: &str = "tests/fixtures/monitoring/valkey-operator.rules.test.yaml";
/// The namespace of manifests/ (manifests/namespace.yaml).
const MANIFESTS_NAMESPACE: &str = "valkey-operator-system";

fn root() -> PathBuf {
    cluster::repo_root()
}

/// The cache's bin dir with helm, promtool and grafana-dashboard-check, built once per test
/// binary (`hack/cluster build` returns at once when they are there).
fn tools() -> &'static str {
    static TOOLS: OnceLock<String> = OnceLock::new();
    TOOLS.get_or_init(|| {
        cluster::run_hack_cluster(&["build"]);
        let bin = cluster::tools_path();
        for tool in ["helm", "promtool", "grafana-dashboard-check", "kubectl"] {
            assert!(
                Path::new(&bin).join(tool).is_file(),
                "hack/cluster build left no {tool} in {bin}"
            );
        }
        bin
    })
}

fn tool(name: &str) -> Command {
    let mut cmd = Command::new(Path::new(tools()).join(name));
    cmd.current_dir(root());
    cmd
}

/// Where this test binary keeps its files: one directory per process under target/helm-test.
fn work_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| support::commands::run_dir("helm-test"))
        .clone()
}

/// helm with its own config, cache and data dirs (nothing of the user's ~/.config/helm), and the
/// cluster's kubeconfig.
fn helm() -> Command {
    let home = work_dir().join("helm-home");
    let mut cmd = tool("helm");
    cmd.env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env("KUBECONFIG", cluster::kubeconfig_path());
    cmd
}

/// `helm template` of the chart as release `valkey-operator` in `namespace`, with `--set`s.
fn try_template(namespace: &str, sets: &[&str]) -> Output {
    let mut cmd = helm();
    cmd.args(["template", "valkey-operator", CHART, "--include-crds"])
        .args(["--namespace", namespace]);
    for set in sets {
        cmd.args(["--set", set]);
    }
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run `{}`: {e}", describe(&cmd)))
}

fn template(sets: &[&str]) -> BTreeMap<String, Value> {
    template_in(MANIFESTS_NAMESPACE, sets)
}

fn template_in(namespace: &str, sets: &[&str]) -> BTreeMap<String, Value> {
    let out = try_template(namespace, sets);
    assert!(
        out.status.success(),
        "helm template {sets:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    objects_by_key(&stdout(&out), &format!("helm template {sets:?}"))
}

/// The one object of `kind` (panics when there are none or several).
fn one<'a>(objects: &'a BTreeMap<String, Value>, kind: &str) -> &'a Value {
    let found: Vec<&Value> = objects.values().filter(|o| o["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "expected one {kind}, got {}", found.len());
    found[0]
}

fn kinds(objects: &BTreeMap<String, Value>) -> BTreeSet<String> {
    objects
        .values()
        .map(|o| o["kind"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn container(objects: &BTreeMap<String, Value>) -> &Value {
    &one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
}

fn args(objects: &BTreeMap<String, Value>) -> Vec<String> {
    container(objects)["args"]
        .as_array()
        .expect("the container has args")
        .iter()
        .map(|a| a.as_str().expect("a string").to_owned())
        .collect()
}

fn yaml_file(path: &str) -> Value {
    let text = fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    yaml_serde::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

// ------------------------------------------------------------------------------- the chart

#[test]
fn the_chart_follows_the_release() {
    let chart = yaml_file(&format!("{CHART}/Chart.yaml"));
    assert_eq!(chart["name"], "valkey-operator");
    assert_eq!(
        chart["version"], VERSION,
        "Chart.yaml's version is not the workspace version of Cargo.toml"
    );
    assert_eq!(
        chart["appVersion"],
        format!("v{VERSION}"),
        "Chart.yaml's appVersion is not the release tag"
    );
    // The default image is the one `make image` tags (and manifests/ run).
    let deployment = yaml_file("manifests/deployment.yaml");
    let manifests_image = &deployment["spec"]["template"]["spec"]["containers"][0]["image"];
    assert_eq!(container(&template(&[]))["image"], *manifests_image);
    let image_ref = stdout(&run(Command::new(root().join("hack/image.sh")).arg("ref")));
    assert_eq!(manifests_image, image_ref.trim());
}

#[test]
fn helm_lint_is_clean() {
    for sets in [
        vec![],
        vec![
            "metrics.serviceMonitor.enabled=true",
            "monitoring.prometheusRule.enabled=true",
            "monitoring.dashboards.enabled=true",
            "replicas=2",
            "watchNamespace=shop",
            "nodeSelector.disk=ssd",
        ],
        vec![
            "leaderElection.enabled=false",
            "metrics.service.enabled=false",
        ],
    ] {
        let mut cmd = helm();
        cmd.args(["lint", "--strict", CHART]);
        for set in &sets {
            cmd.args(["--set", set]);
        }
        let out = run(&mut cmd);
        let text = stdout(&out);
        assert!(
            text.contains("1 chart(s) linted, 0 chart(s) failed"),
            "helm lint {sets:?}:\n{text}"
        );
        assert!(
            !text.contains("[WARNING]") && !text.contains("[ERROR]"),
            "helm lint {sets:?} is not clean:\n{text}"
        );
    }
}

#[test]
fn default_values_render_the_objects_of_kustomize() {
    let from_helm = template(&[]);
    let kustomized = run(cluster::kubectl()
        .arg("kustomize")
        .arg(root().join("manifests")));
    let mut from_kustomize = objects_by_key(&stdout(&kustomized), "kubectl kustomize manifests/");
    // The one intentional difference: Helm installs into a namespace it is given
    // (`--namespace NS --create-namespace`) and does not own it.
    let namespace = from_kustomize
        .remove(&format!("v1/Namespace//{MANIFESTS_NAMESPACE}"))
        .expect("manifests/ create the operator's namespace");
    assert_eq!(namespace["kind"], "Namespace");
    assert_eq!(
        from_helm.keys().collect::<Vec<_>>(),
        from_kustomize.keys().collect::<Vec<_>>(),
        "helm template and kubectl kustomize render different objects"
    );
    for (key, object) in &from_kustomize {
        assert_eq!(
            &from_helm[key], object,
            "{key} differs between helm template and kubectl kustomize manifests/"
        );
    }
}

#[test]
fn the_release_namespace_is_the_operators_namespace() {
    let objects = template_in("ops", &[]);
    for object in objects.values() {
        let kind = object["kind"].as_str().unwrap_or_default();
        let cluster_scoped = matches!(
            kind,
            "ClusterRole" | "ClusterRoleBinding" | "CustomResourceDefinition"
        );
        assert_eq!(
            object["metadata"]["namespace"].as_str(),
            (!cluster_scoped).then_some("ops"),
            "{kind} {}",
            object["metadata"]["name"]
        );
    }
    let binding = one(&objects, "ClusterRoleBinding");
    assert_eq!(binding["subjects"][0]["namespace"], "ops");
    // A release of another name names its objects after it (two releases do not collide).
    let out = run(helm().args(["template", "ops", CHART, "--namespace", "ops"]));
    let named = objects_by_key(&stdout(&out), "helm template ops");
    assert_eq!(
        one(&named, "ClusterRole")["metadata"]["name"],
        "ops-valkey-operator"
    );
    assert_eq!(
        one(&named, "ClusterRoleBinding")["roleRef"]["name"],
        "ops-valkey-operator"
    );
    assert_eq!(
        one(&named, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"],
        "ops-valkey-operator"
    );
}

#[test]
fn values_change_the_objects_as_documented() {
    let defaults = template(&[]);
    assert_eq!(args(&defaults), ["run", "--log-format=json"]);
    assert_eq!(one(&defaults, "Deployment")["spec"]["replicas"], 1);
    for kind in ["Role", "RoleBinding", "Service"] {
        assert!(kinds(&defaults).contains(kind), "no {kind} by default");
    }
    for kind in ["ServiceMonitor", "PrometheusRule", "ConfigMap"] {
        assert!(!kinds(&defaults).contains(kind), "{kind} by default");
    }

    // The watch namespace and the log format are the operator's flags.
    let objects = template(&["watchNamespace=shop", "logFormat=plain"]);
    assert_eq!(
        args(&objects),
        ["run", "--log-format=plain", "--watch-namespace=shop"]
    );

    // More replicas are standbys behind the leader Lease: leader election stays on.
    let objects = template(&["replicas=3"]);
    assert_eq!(one(&objects, "Deployment")["spec"]["replicas"], 3);
    assert!(!args(&objects).contains(&"--no-leader-election".to_owned()));
    assert!(kinds(&objects).contains("Role"));

    // Without leader election: one process, never two at once, and no Lease rights.
    let objects = template(&["leaderElection.enabled=false"]);
    assert_eq!(
        args(&objects),
        ["run", "--log-format=json", "--no-leader-election"]
    );
    assert_eq!(
        one(&objects, "Deployment")["spec"]["strategy"]["type"],
        "Recreate"
    );
    assert!(!kinds(&objects).contains("Role") && !kinds(&objects).contains("RoleBinding"));
    let refused = try_template(
        MANIFESTS_NAMESPACE,
        &["leaderElection.enabled=false", "replicas=2"],
    );
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        message.contains("replicas is 2 but leaderElection.enabled is false"),
        "{message}"
    );

    // Bad values are refused by values.schema.json, naming the field.
    let refused = try_template(MANIFESTS_NAMESPACE, &["logFormat=xml"]);
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(message.contains("logFormat"), "{message}");
    let refused = try_template(MANIFESTS_NAMESPACE, &["replicas=0"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("replicas"));

    // Image, resources and placement.
    let objects = template(&[
        "image.repository=registry.example/valkey-operator",
        "image.tag=v9.9.9",
        "image.pullPolicy=Always",
        "resources.limits.memory=512Mi",
        "nodeSelector.disk=ssd",
        "tolerations[0].key=dedicated",
        "tolerations[0].operator=Exists",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=zone",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
    ]);
    let c = container(&objects);
    assert_eq!(c["image"], "registry.example/valkey-operator:v9.9.9");
    assert_eq!(c["imagePullPolicy"], "Always");
    assert_eq!(c["resources"]["limits"]["memory"], "512Mi");
    assert_eq!(c["resources"]["requests"]["cpu"], "50m");
    let pod = &one(&objects, "Deployment")["spec"]["template"]["spec"];
    assert_eq!(pod["nodeSelector"]["disk"], "ssd");
    assert_eq!(pod["tolerations"][0]["key"], "dedicated");
    assert_eq!(
        pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchExpressions"][0]["key"],
        "zone"
    );

    // The metrics Service off; the ServiceMonitor needs it.
    let objects = template(&["metrics.service.enabled=false"]);
    assert!(!kinds(&objects).contains("Service"));
    let refused = try_template(
        MANIFESTS_NAMESPACE,
        &[
            "metrics.service.enabled=false",
            "metrics.serviceMonitor.enabled=true",
        ],
    );
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr)
            .contains("metrics.serviceMonitor.enabled needs metrics.service.enabled")
    );
}

#[test]
fn the_service_monitor_scrapes_the_operators_metrics_service() {
    let objects = template(&[
        "metrics.serviceMonitor.enabled=true",
        "metrics.serviceMonitor.labels.release=prometheus",
        "metrics.serviceMonitor.interval=15s",
    ]);
    let monitor = one(&objects, "ServiceMonitor");
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(monitor["metadata"]["labels"]["release"], "prometheus");
    let service = one(&objects, "Service");
    // It selects the metrics Service (its labels, its namespace) and scrapes its port's /metrics.
    let selector = monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels");
    for (key, value) in selector {
        assert_eq!(&service["metadata"]["labels"][key], value, "label {key}");
    }
    assert_eq!(
        monitor["spec"]["namespaceSelector"]["matchNames"][0],
        service["metadata"]["namespace"]
    );
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["port"], service["spec"]["ports"][0]["name"]);
    assert_eq!(endpoint["path"], "/metrics");
    assert_eq!(endpoint["interval"], "15s");
    // That port is the container's, where /metrics is served (operator/src/http.rs).
    let port = &container(&objects)["ports"][0];
    assert_eq!(service["spec"]["ports"][0]["targetPort"], port["name"]);
    assert_eq!(port["containerPort"], 8080);
}

#[test]
fn the_chart_ships_the_rules_and_the_dashboard_of_docs_monitoring() {
    // The chart's copies are the files of docs/monitoring, byte for byte.
    for (doc, copy) in [
        (
            RULES,
            format!("{CHART}/monitoring/valkey-operator.rules.yaml"),
        ),
        (DASHBOARD, format!("{CHART}/monitoring/valkey.json")),
    ] {
        assert!(
            fs::read(root().join(doc)).ok() == fs::read(root().join(&copy)).ok(),
            "{copy} differs from {doc}: copy it"
        );
    }
    let objects = template(&[
        "monitoring.prometheusRule.enabled=true",
        "monitoring.prometheusRule.labels.release=prometheus",
        "monitoring.dashboards.enabled=true",
        "monitoring.dashboards.namespace=grafana",
    ]);
    let rule = one(&objects, "PrometheusRule");
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["metadata"]["labels"]["release"], "prometheus");
    assert_eq!(rule["spec"], yaml_file(RULES));
    let dashboards = one(&objects, "ConfigMap");
    assert_eq!(dashboards["metadata"]["namespace"], "grafana");
    assert_eq!(dashboards["metadata"]["labels"]["grafana_dashboard"], "1");
    let json = fs::read_to_string(root().join(DASHBOARD)).expect("the dashboard");
    assert_eq!(
        dashboards["data"]["valkey.json"].as_str(),
        Some(json.trim_end())
    );
}

// ---------------------------------------------------------------------------- the monitoring

/// The operator's metric names, as operator/src/metrics.rs registers them (prefix valkey_operator,
/// counters with _total, histograms with their series).
fn operator_metric_names() -> BTreeSet<String> {
    let source = fs::read_to_string(root().join("operator/src/metrics.rs")).expect("metrics.rs");
    let mut names = BTreeSet::new();
    let mut rest = source.as_str();
    while let Some(at) = rest.find("registry.register(") {
        rest = &rest[at + "registry.register(".len()..];
        let name = rest.split('"').nth(1).expect("a registered name");
        let call = rest.split(");").next().unwrap_or_default();
        let base = format!("valkey_operator_{name}");
        if call.contains("reconciles.clone()")
            || call.contains("errors.clone()")
            || call.contains("watch_restarts.clone()")
            || call.contains("failovers.clone()")
        {
            names.insert(format!("{base}_total"));
        } else if call.contains("duration.clone()") {
            for suffix in ["_bucket", "_sum", "_count"] {
                names.insert(format!("{base}{suffix}"));
            }
        } else {
            names.insert(base);
        }
    }
    assert!(
        names.contains("valkey_operator_failovers_total"),
        "{names:?}"
    );
    names
}

/// redis_exporter's series the rules and the dashboard may use (its standard names).
const EXPORTER_METRICS: &[&str] = &[
    "redis_up",
    "redis_instance_info",
    "redis_connected_slaves",
    "redis_connected_clients",
    "redis_memory_used_bytes",
    "redis_memory_max_bytes",
    "redis_master_repl_offset",
    "redis_slave_repl_offset",
    "redis_connected_slave_offset_bytes",
    "redis_commands_processed_total",
    "redis_keyspace_hits_total",
    "redis_keyspace_misses_total",
];

/// The metric names a PromQL expression reads (identifiers followed by `{`, `[` or standing as a
/// selector), without functions, keywords and label names.
fn metrics_in(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut chars = expr.char_indices().peekable();
    let mut in_braces = 0;
    let mut in_quotes = false;
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => in_quotes = !in_quotes,
            '{' if !in_quotes => in_braces += 1,
            '}' if !in_quotes => in_braces -= 1,
            c if !in_quotes && in_braces == 0 && (c.is_ascii_alphabetic() || c == '_') => {
                let mut end = i + c.len_utf8();
                while let Some(&(j, d)) = chars.peek() {
                    if d.is_ascii_alphanumeric() || d == '_' || d == ':' {
                        end = j + d.len_utf8();
                        chars.next();
                    } else {
                        break;
                    }
                }
                let word = &expr[i..end];
                if word.starts_with("redis_") || word.starts_with("valkey_operator_") {
                    names.insert(word.to_owned());
                }
            }
            _ => {}
        }
    }
    names
}

fn known_metric(name: &str, operator: &BTreeSet<String>) -> bool {
    EXPORTER_METRICS.contains(&name) || operator.contains(name)
}

#[test]
fn promtool_checks_and_tests_the_alert_rules() {
    // The plain rule file, as Prometheus loads it.
    let out = run(tool("promtool").args(["check", "rules", RULES]));
    let text = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    let rules = yaml_file(RULES);
    let alerts: Vec<&str> = rules["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .map(|r| r["alert"].as_str().expect("only alerting rules"))
        .collect();
    assert!(
        text.contains(&format!("SUCCESS: {} rules found", alerts.len())),
        "{text}"
    );
    // Every alert an SRE was promised is there.
    for alert in [
        "ValkeyInstanceDown",
        "ValkeyServerDown",
        "ValkeyNoPrimary",
        "ValkeyReplicaLagHigh",
        "ValkeyMemoryNearMaxmemory",
        "ValkeyFailover",
        "ValkeyOperatorReconcileErrors",
    ] {
        assert!(alerts.contains(&alert), "no alert {alert}");
    }

    // The unit tests on synthetic series; each alert is exercised by one.
    let out = run(tool("promtool").args(["test", "rules", RULE_TESTS]));
    let text = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("SUCCESS"), "{text}");
    let tests = fs::read_to_string(root().join(RULE_TESTS)).expect("the rule tests");
    for alert in &alerts {
        if *alert == "ValkeyOperatorNoLeader" {
            continue; // a plain threshold on a gauge
        }
        assert!(
            tests.contains(&format!("alertname: {alert}\n")),
            "no promtool test exercises {alert}"
        );
    }

    // The PrometheusRule the chart renders holds rules promtool accepts too.
    let objects = template(&["monitoring.prometheusRule.enabled=true"]);
    let spec = &one(&objects, "PrometheusRule")["spec"];
    let file = work_dir().join("rendered.rules.yaml");
    fs::write(&file, yaml_serde::to_string(spec).expect("YAML")).expect("writing the rules");
    let out = run(tool("promtool").arg("check").arg("rules").arg(&file));
    let text = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    assert!(
        text.contains(&format!("SUCCESS: {} rules found", alerts.len())),
        "{text}"
    );

    // Only series that exist: redis_exporter's and the operator's own.
    let operator = operator_metric_names();
    for rule in rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
    {
        let expr = rule["expr"].as_str().expect("an expr");
        let used = metrics_in(expr);
        assert!(!used.is_empty(), "{}: reads no metric", rule["alert"]);
        for name in used {
            assert!(
                known_metric(&name, &operator),
                "{} reads {name}, which neither redis_exporter nor the operator exports",
                rule["alert"]
            );
        }
    }
}

#[test]
fn promtool_fails_a_rule_test_that_does_not_hold() {
    // The unit tests can fail: an expectation the rules do not meet is reported.
    let tests = fs::read_to_string(root().join(RULE_TESTS)).expect("the rule tests");
    let broken = tests
        .replacen("severity: critical", "severity: page", 1)
        .replace(
            "../../../docs/monitoring/",
            &format!("{}/docs/monitoring/", root().display()),
        );
    let file = work_dir().join("broken.rules.test.yaml");
    fs::write(&file, broken).expect("writing the broken test");
    let out = tool("promtool")
        .arg("test")
        .arg("rules")
        .arg(&file)
        .stdin(Stdio::null())
        .output()
        .expect("running promtool");
    assert!(!out.status.success());
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("FAILED") && text.contains("severity=\"page\""),
        "{text}"
    );
}

#[test]
fn the_dashboard_passes_grafanas_schema_and_shows_what_it_promises() {
    // Grafana's dashboard schema (grafana-foundation-sdk's strict decoding).
    let out = run(tool("grafana-dashboard-check").arg(DASHBOARD));
    assert!(stdout(&out).contains(": ok"), "{}", stdout(&out));

    // The check is strict: a field Grafana does not know is refused.
    let mut dashboard: Value =
        serde_json::from_str(&fs::read_to_string(root().join(DASHBOARD)).expect("the dashboard"))
            .expect("the dashboard is JSON");
    let mut broken = dashboard.clone();
    broken["panels"][0]["options"]["colourMode"] = "value".into();
    let file = work_dir().join("broken-dashboard.json");
    fs::write(&file, broken.to_string()).expect("writing the broken dashboard");
    let out = tool("grafana-dashboard-check")
        .arg(&file)
        .stdin(Stdio::null())
        .output()
        .expect("running grafana-dashboard-check");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("unexpected field 'colourMode'"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // One instance at a time: the data source, namespace and instance are template variables.
    let variables: Vec<String> = dashboard["templating"]["list"]
        .as_array()
        .expect("template variables")
        .iter()
        .map(|v| v["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(variables, ["datasource", "namespace", "instance"]);

    // The panels promised, each querying existing series through the chosen data source; the
    // exporter's series of the chosen instance only.
    let operator = operator_metric_names();
    let panels = dashboard["panels"].as_array_mut().expect("panels");
    let titles: Vec<String> = panels
        .iter()
        .map(|p| p["title"].as_str().unwrap_or_default().to_owned())
        .collect();
    for want in [
        "Role",
        "Memory",
        "Operations per second",
        "Hit ratio",
        "Connected clients",
        "Connected replicas",
        "Replication lag",
        "Failovers (operator)",
    ] {
        assert!(
            titles.iter().any(|t| t == want),
            "no panel {want}: {titles:?}"
        );
    }
    for panel in panels.iter() {
        let title = &panel["title"];
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        for target in panel["targets"].as_array().expect("targets") {
            assert_eq!(target["datasource"]["uid"], "${datasource}", "{title}");
            let expr = target["expr"].as_str().expect("a PromQL expr");
            let used = metrics_in(expr);
            assert!(!used.is_empty(), "{title} reads no metric");
            for name in &used {
                assert!(known_metric(name, &operator), "{title} reads {name}");
            }
            // Every exporter selector is narrowed to the chosen instance.
            let selectors = expr.matches("redis_").count();
            let narrowed = expr
                .matches(r#"{namespace="$namespace", app_kubernetes_io_instance="$instance""#)
                .count();
            assert_eq!(
                selectors, narrowed,
                "{title}: an exporter series not narrowed to the instance: {expr}"
            );
            if expr.contains("rate(") && !expr.contains("increase(") {
                assert!(expr.contains("[$__rate_interval]"), "{title}: {expr}");
            }
        }
    }
}

// --------------------------------------------------------------- on the local cluster's nodes

/// `helm uninstall` of the release if the test ends early, so that its cluster-scoped objects
/// (ClusterRole, ClusterRoleBinding) do not outlive it.
struct Release {
    name: String,
    namespace: String,
    installed: bool,
}

impl Drop for Release {
    fn drop(&mut self) {
        if self.installed {
            let _ = helm()
                .args(["uninstall", &self.name, "--namespace", &self.namespace])
                .args(["--ignore-not-found", "--wait", "--timeout", "60s"])
                .stdin(Stdio::null())
                .output();
        }
    }
}

/// The operator image of `make image` (hack/image.sh), re-tagged `<tag>-helm-test` for the real
/// nodes: the image `make image` tags is the one manifests/deployment.yaml runs, and loading it
/// would start the Deployment that other tests apply with `kubectl apply -k manifests/` (and that
/// operator, watching every namespace, would reconcile their Valkeys).
fn operator_image_for_nodes() -> (String, PathBuf) {
    let out = work_dir().join("image");
    let _ = fs::remove_dir_all(&out);
    let started = Instant::now();
    run(Command::new(root().join("hack/image.sh"))
        .arg("--out")
        .arg(&out)
        .stderr(Stdio::inherit()));
    eprintln!("hack/image.sh took {:.0?}", started.elapsed());
    let reference = format!(
        "{}-helm-test",
        stdout(&run(Command::new(root().join("hack/image.sh")).arg("ref"))).trim()
    );
    // The layout's index.json names the image (annotations that ctr import reads); the
    // manifests and blobs are addressed by digest and stay as they are.
    let layout = out.join("image");
    let index_path = layout.join("index.json");
    let mut index: Value =
        serde_json::from_str(&fs::read_to_string(&index_path).expect("index.json"))
            .expect("index.json is JSON");
    let (_, tag) = reference.rsplit_once(':').expect("repository:tag");
    for manifest in index["manifests"].as_array_mut().expect("manifests") {
        let annotations = manifest["annotations"]
            .as_object_mut()
            .expect("the manifest's annotations");
        annotations.insert("io.containerd.image.name".into(), reference.clone().into());
        annotations.insert("org.opencontainers.image.ref.name".into(), tag.into());
    }
    fs::write(&index_path, index.to_string()).expect("writing index.json");
    let archive = out.join("valkey-operator-helm-test.oci.tar");
    run(Command::new("tar")
        .arg("-cf")
        .arg(&archive)
        .arg("-C")
        .arg(&layout)
        .arg("."));
    (reference, archive)
}

fn kubectl_json(args: &[&str]) -> Value {
    let out = run(cluster::kubectl().args(args).args(["-o", "json"]));
    serde_json::from_slice(&out.stdout).expect("kubectl prints JSON")
}

/// What to look at when the operator's pods do not come up.
fn diagnose(namespace: &str) -> String {
    let mut report = String::new();
    for args in [
        vec!["-n", namespace, "get", "pods,events", "-o", "wide"],
        vec!["-n", namespace, "describe", "pods"],
        vec![
            "-n",
            namespace,
            "logs",
            "-l",
            "app.kubernetes.io/name=valkey-operator",
            "--tail=50",
        ],
    ] {
        if let Ok(out) = cluster::kubectl().args(&args).output() {
            report.push_str(&format!(
                "--- kubectl {}\n{}{}\n",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    report
}

fn helm_checked(namespace: &str, cmd: &mut Command) -> Output {
    let what = describe(cmd);
    let out = cmd.stdin(Stdio::null()).output().expect("running helm");
    assert!(
        out.status.success(),
        "`{what}` failed: {}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        diagnose(namespace)
    );
    out
}

/// Polls `check` every 500 ms until it gives a value, for at most `timeout`.
async fn eventually<T>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match check() {
            Ok(v) => return v,
            Err(last) if Instant::now() >= deadline => {
                panic!("timed out after {timeout:?} waiting for {what}; last: {last}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

fn operator_pods(namespace: &str) -> Vec<Value> {
    kubectl_json(&[
        "-n",
        namespace,
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=valkey-operator",
    ])["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_installs_upgrades_and_uninstalls_the_operator_on_real_nodes() {
    tools();
    cluster::ensure_up();
    let (image, archive) = operator_image_for_nodes();
    cluster::run_hack_cluster(&["load-image", archive.to_str().expect("a UTF-8 path")]);
    let (repository, tag) = image.rsplit_once(':').expect("repository:tag");

    // The release's namespace enforces the restricted Pod Security Standard, as
    // manifests/namespace.yaml does; the Valkey lives there too and is the only one it watches.
    let ns = TestNamespace::new(
        "helm",
        &[
            ("pod-security.kubernetes.io/enforce", "restricted"),
            ("pod-security.kubernetes.io/enforce-version", "latest"),
        ],
    )
    .await;
    let mut release = Release {
        name: format!("valkey-operator-{}", ns.name),
        namespace: ns.name.clone(),
        installed: false,
    };
    let repository_set = format!("image.repository={repository}");
    let tag_set = format!("image.tag={tag}");
    let watch_set = format!("watchNamespace={}", ns.name);
    release.installed = true;
    let started = Instant::now();
    helm_checked(
        &ns.name,
        helm()
            .args(["install", &release.name, CHART, "--namespace", &ns.name])
            .args([
                "--set",
                &repository_set,
                "--set",
                &tag_set,
                "--set",
                &watch_set,
            ])
            .args(["--wait", "--timeout", "180s"]),
    );
    eprintln!("helm install --wait took {:.0?}", started.elapsed());

    // The operator runs on a real node, from the loaded image, ready.
    let pods = operator_pods(&ns.name);
    assert_eq!(pods.len(), 1, "{}", diagnose(&ns.name));
    let first_pod = pods[0]["metadata"]["name"].as_str().unwrap().to_owned();
    assert!(
        pods[0]["spec"]["nodeName"]
            .as_str()
            .is_some_and(|n| n.starts_with("real-node-")),
        "the operator runs on a real node: {}",
        pods[0]["spec"]["nodeName"]
    );
    assert_eq!(pods[0]["spec"]["containers"][0]["image"], image);

    // The CRD is installed (Helm's crds/ when it was missing; left as it is when present).
    run(cluster::kubectl().args(["get", "crd", "valkeys.database.kuberly.io"]));

    // It reconciles a Valkey (docs/examples/minimal.yaml) to Running.
    run(cluster::kubectl()
        .args(["-n", &ns.name, "apply", "-f"])
        .arg(root().join("docs/examples/minimal.yaml")));
    let valkey_phase = || {
        let v = kubectl_json(&["-n", &ns.name, "get", "valkey", "cache"]);
        let phase = v["status"]["status"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if phase == "Running" {
            Ok(())
        } else {
            Err(format!("status {phase:?}: {}", v["status"]))
        }
    };
    eventually(
        "the Valkey to be Running",
        Duration::from_secs(180),
        valkey_phase,
    )
    .await;
    // The operator in the pod is the one that did it: it holds the leader Lease of its namespace.
    let lease = kubectl_json(&["-n", &ns.name, "get", "lease", "valkey-operator"]);
    assert_eq!(lease["spec"]["holderIdentity"], first_pod.as_str());

    // helm upgrade with a changed value rolls the operator: a new pod with the new flag, which
    // takes over the Lease.
    let started = Instant::now();
    helm_checked(
        &ns.name,
        helm()
            .args(["upgrade", &release.name, CHART, "--namespace", &ns.name])
            .args(["--reuse-values", "--set", "logFormat=plain"])
            .args(["--wait", "--timeout", "180s"]),
    );
    eprintln!("helm upgrade --wait took {:.0?}", started.elapsed());
    let new_pod = eventually(
        "the old operator pod to be gone",
        Duration::from_secs(60),
        || {
            let pods = operator_pods(&ns.name);
            let names: Vec<&str> = pods
                .iter()
                .filter_map(|p| p["metadata"]["name"].as_str())
                .collect();
            match names.as_slice() {
                [one] if *one != first_pod => Ok(pods[0].clone()),
                _ => Err(format!("pods {names:?}")),
            }
        },
    )
    .await;
    let new_name = new_pod["metadata"]["name"].as_str().unwrap().to_owned();
    assert!(
        new_pod["spec"]["containers"][0]["args"]
            .as_array()
            .expect("args")
            .iter()
            .any(|a| a == "--log-format=plain"),
        "{}",
        new_pod["spec"]["containers"][0]["args"]
    );
    eventually(
        "the new operator pod to lead",
        Duration::from_secs(60),
        || {
            let lease = kubectl_json(&["-n", &ns.name, "get", "lease", "valkey-operator"]);
            (lease["spec"]["holderIdentity"] == new_name.as_str())
                .then_some(())
                .ok_or_else(|| format!("holder {}", lease["spec"]["holderIdentity"]))
        },
    )
    .await;
    let history = stdout(&run(helm().args([
        "history",
        &release.name,
        "--namespace",
        &ns.name,
        "-o",
        "json",
    ])));
    let history: Value = serde_json::from_str(&history).expect("helm history JSON");
    assert_eq!(history.as_array().map(Vec::len), Some(2), "{history}");
    // Its plain log lines (not JSON) say it reconciles.
    let logs = stdout(&run(
        cluster::kubectl().args(["-n", &ns.name, "logs", &new_name])
    ));
    assert!(
        logs.lines()
            .any(|l| !l.trim_start().starts_with('{') && l.contains("valkey-operator")),
        "{logs}"
    );
    eventually(
        "the Valkey to stay Running",
        Duration::from_secs(60),
        valkey_phase,
    )
    .await;

    // helm uninstall removes the operator and its RBAC; the CRD (and so the Valkey) stays.
    helm_checked(
        &ns.name,
        helm()
            .args(["uninstall", &release.name, "--namespace", &ns.name])
            .args(["--wait", "--timeout", "120s"]),
    );
    release.installed = false;
    for (kind, namespaced) in [
        ("deployment", true),
        ("serviceaccount", true),
        ("service", true),
        ("role", true),
        ("rolebinding", true),
        ("clusterrole", false),
        ("clusterrolebinding", false),
    ] {
        let mut cmd = cluster::kubectl();
        if namespaced {
            cmd.args(["-n", &ns.name]);
        }
        let listed = kubectl_json_of(cmd.args([
            "get",
            kind,
            "-l",
            "app.kubernetes.io/name=valkey-operator",
        ]));
        let left: Vec<&str> = listed["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|i| i["metadata"]["name"].as_str())
                    .filter(|n| n.starts_with(&release.name))
                    .collect()
            })
            .unwrap_or_default();
        assert!(left.is_empty(), "helm uninstall left {kind} {left:?}");
    }
    run(cluster::kubectl().args(["get", "crd", "valkeys.database.kuberly.io"]));
    run(cluster::kubectl().args(["-n", &ns.name, "get", "valkey", "cache"]));
}

fn kubectl_json_of(cmd: &mut Command) -> Value {
    let out = run(cmd.args(["-o", "json"]));
    serde_json::from_slice(&out.stdout).expect("kubectl prints JSON")
}
