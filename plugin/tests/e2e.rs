//! End to end through kubectl's own plugin discovery: the cluster's kubectl runs `kubectl valkey`
//! with only this plugin (and its completion link) first on PATH, against the local control plane.
//! No operator runs in these namespaces: the tests check what the plugin writes and reads, and
//! play the operator's part (writing status) where a command waits for it.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kube::config::Kubeconfig;
use secrecy::ExposeSecret;
use serde_json::{Value, json};
use support::cluster::TestNamespace;
use support::plugin::{self, ok, run};
use valkey_core::api::{ReclaimPolicy, Valkey};

#[test]
fn kubectl_discovers_the_plugin_and_its_version() {
    plugin::install();
    let listed = run(plugin::kubectl(&["plugin", "list"]), None);
    assert!(
        listed.stdout.contains("kubectl-valkey"),
        "kubectl plugin list: {} {}",
        listed.stdout,
        listed.stderr
    );
    let version = ok(&["version"], None);
    assert!(
        version.stdout.contains(&format!(
            "Plugin version:     v{}",
            env!("CARGO_PKG_VERSION")
        )),
        "{}",
        version.stdout
    );
    assert!(
        version.stdout.contains("Operator version:"),
        "{}",
        version.stdout
    );
    assert!(
        version.stdout.contains("Kubernetes version: v1."),
        "{}",
        version.stdout
    );
    let json = ok(&["version", "-o", "json"], None);
    let parsed: Value = serde_json::from_str(&json.stdout).expect("version -o json is JSON");
    assert_eq!(parsed["operator"]["namespace"], "valkey-operator-system");
}

#[test]
fn help_version_and_completion_need_no_cluster() {
    for args in [
        &["--help"][..],
        &["create", "--help"],
        &["version", "--client"],
        &["completion", "bash"],
        &["completion", "zsh"],
        &["completion", "fish"],
        &["completion", "powershell"],
    ] {
        let mut command = plugin::kubectl_valkey(args);
        command.env("KUBECONFIG", "/nonexistent/kubeconfig");
        let outcome = run(command, None);
        assert_eq!(outcome.code, 0, "{args:?}: {}", outcome.stderr);
        assert!(!outcome.stdout.is_empty(), "{args:?} printed nothing");
    }
    let mut version = plugin::kubectl_valkey(&["version"]);
    version.env("KUBECONFIG", "/nonexistent/kubeconfig");
    let version = run(version, None);
    assert_eq!(version.code, 0, "{version:?}");
    assert!(version.stdout.starts_with("Plugin version:"), "{version:?}");
    assert!(
        version.stderr.contains("cluster: not reachable"),
        "{version:?}"
    );

    let mut manifests = plugin::kubectl_valkey(&["install", "--dry-run", "-o", "yaml"]);
    manifests.env("KUBECONFIG", "/nonexistent/kubeconfig");
    let manifests = run(manifests, None);
    assert_eq!(manifests.code, 0, "{manifests:?}");
    let kinds: Vec<String> = manifests
        .stdout
        .split("\n---\n")
        .map(|doc| yaml_serde::from_str::<Value>(doc).expect("each document is YAML"))
        .filter_map(|doc| doc["kind"].as_str().map(str::to_owned))
        .collect();
    for kind in [
        "Namespace",
        "CustomResourceDefinition",
        "ClusterRole",
        "Deployment",
    ] {
        assert!(kinds.iter().any(|k| k == kind), "{kind} in {kinds:?}");
    }

    let mut help = plugin::kubectl_valkey(&["logs", "--help"]);
    help.env("KUBECONFIG", "/nonexistent/kubeconfig");
    let help = run(help, None);
    assert!(
        help.stdout.contains("Usage: kubectl valkey logs"),
        "{}",
        help.stdout
    );
    assert!(help.stdout.contains("Examples:"), "{}", help.stdout);
}

#[tokio::test]
async fn create_list_status_scale_and_delete() {
    plugin::install();
    let ns = TestNamespace::new("plugin-e2e", &[]).await;
    let n = ns.name.as_str();
    let valkeys: Api<Valkey> = ns.api();

    // --dry-run=client prints the object with the API's defaults and creates nothing.
    let dry = ok(
        &[
            "create",
            "cache",
            "-n",
            n,
            "--replicas",
            "3",
            "--dry-run=client",
            "-o",
            "yaml",
        ],
        None,
    );
    let printed: Valkey = yaml_serde::from_str(&dry.stdout).expect("dry run prints a Valkey");
    assert_eq!(printed.spec.replicas, 3);
    assert_eq!(printed.spec.volume.storage, "1Gi");
    assert_eq!(printed.metadata.namespace.as_deref(), Some(n));
    let dry_json = ok(
        &["create", "cache", "-n", n, "--dry-run=client", "-o", "json"],
        None,
    );
    let _: Valkey = serde_json::from_str(&dry_json.stdout).expect("-o json prints a Valkey");
    assert!(
        !printed.spec.metrics.enabled,
        "metrics are off unless asked for"
    );
    let dry_metrics = ok(
        &[
            "create",
            "cache",
            "-n",
            n,
            "--metrics",
            "--service-monitor",
            "--dry-run=client",
            "-o",
            "json",
        ],
        None,
    );
    let metrics: Valkey =
        serde_json::from_str(&dry_metrics.stdout).expect("-o json prints a Valkey");
    assert!(metrics.spec.metrics.enabled && metrics.spec.metrics.service_monitor.enabled);
    ok(&["create", "cache", "-n", n, "--dry-run=server"], None);
    assert!(
        valkeys.get_opt("cache").await.expect("get").is_none(),
        "dry runs create nothing"
    );

    // The real thing, the password from stdin.
    let created = ok(
        &[
            "create",
            "cache",
            "-n",
            n,
            "--replicas",
            "3",
            "--admin-user",
            "admin",
            "--storage",
            "2Gi",
            "--storage-class",
            "kwok-volume",
            "--cpu",
            "250m",
            "--memory",
            "512Mi",
            "--config",
            "maxmemory-policy=allkeys-lru",
            "--config",
            "save=900 1",
            "--password-stdin",
        ],
        Some("s3cret-from-stdin\n"),
    );
    assert!(
        created
            .stdout
            .contains("valkey.database.kuberly.io/cache created"),
        "{}",
        created.stdout
    );
    let cache = valkeys.get("cache").await.expect("the Valkey exists");
    let spec = &cache.spec;
    assert_eq!(spec.replicas, 3);
    assert_eq!(spec.user, "admin");
    assert_eq!(spec.volume.storage, "2Gi");
    assert_eq!(
        spec.volume.storage_class_name.as_deref(),
        Some("kwok-volume")
    );
    assert_eq!(spec.volume.reclaim_policy, ReclaimPolicy::Retain);
    assert_eq!(spec.resource.cpu, "250m");
    assert_eq!(spec.resource.memory, "512Mi");
    assert_eq!(
        spec.config,
        BTreeMap::from([
            ("maxmemory-policy".to_owned(), "allkeys-lru".to_owned()),
            ("save".to_owned(), "900 1".to_owned()),
        ])
    );
    let reference = spec
        .password_secret
        .as_ref()
        .expect("spec.passwordSecret is set");
    assert_eq!(
        (reference.name.as_str(), reference.key.as_str()),
        ("cache-auth", "password")
    );
    let secret = ns
        .api::<Secret>()
        .get("cache-auth")
        .await
        .expect("the password Secret");
    let stored = secret
        .data
        .as_ref()
        .and_then(|d| d.get("password"))
        .map(|b| b.0.clone());
    assert_eq!(
        stored.as_deref(),
        Some(&b"s3cret-from-stdin"[..]),
        "one trailing newline is dropped"
    );
    let owners = secret.metadata.owner_references.unwrap_or_default();
    assert_eq!(
        owners.first().map(|o| o.uid.as_str()),
        cache.metadata.uid.as_deref()
    );

    // An existing Secret, no volume.
    ok(
        &[
            "create",
            "sessions",
            "-n",
            n,
            "--password-secret",
            "mine",
            "--password-key",
            "pw",
            "--no-volume",
        ],
        None,
    );
    let sessions = valkeys.get("sessions").await.expect("the second Valkey");
    assert!(!sessions.spec.volume.enabled);
    let reference = sessions.spec.password_secret.expect("spec.passwordSecret");
    assert_eq!(
        (reference.name.as_str(), reference.key.as_str()),
        ("mine", "pw")
    );

    // list, in every format.
    let list = ok(&["list", "-n", n], None);
    assert!(list.stdout.starts_with("NAME"), "{}", list.stdout);
    assert!(
        list.stdout.contains("cache") && list.stdout.contains("sessions"),
        "{}",
        list.stdout
    );
    let rows: Vec<Value> = serde_json::from_str(&ok(&["list", "-n", n, "-o", "json"], None).stdout)
        .expect("list -o json is a JSON array");
    let names: Vec<&str> = rows.iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(names, ["cache", "sessions"]);
    let all = ok(&["list", "-A"], None);
    assert!(all.stdout.starts_with("NAMESPACE"), "{}", all.stdout);
    assert!(all.stdout.contains(n), "{}", all.stdout);

    // status shows the events regarding the instance and its pods, not those of another
    // instance whose name merely starts the same.
    let events: Api<k8s_openapi::api::events::v1::Event> = ns.api();
    for (kind, name, note) in [
        ("Valkey", "cache", "about the instance"),
        ("Pod", "cache-1", "about a pod"),
        ("Valkey", "cache-old", "about another instance"),
        ("Pod", "cache-old-0", "about another instance's pod"),
    ] {
        let event = json!({
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"generateName": "e2e-"},
            "eventTime": "2026-12-01T00:00:00.000000Z",
            "reportingController": "e2e.kuberly.io/test",
            "reportingInstance": "e2e",
            "action": "Testing",
            "reason": "Testing",
            "type": "Normal",
            "note": note,
            "regarding": {"kind": kind, "name": name, "namespace": n},
        });
        events
            .create(
                &PostParams::default(),
                &serde_json::from_value(event).unwrap(),
            )
            .await
            .expect("creating an event");
    }
    let report: Value =
        serde_json::from_str(&ok(&["status", "cache", "-n", n, "-o", "json"], None).stdout)
            .expect("status -o json is JSON");
    let notes: Vec<&str> = report["events"]
        .as_array()
        .expect("events is an array")
        .iter()
        .filter_map(|e| e["message"].as_str())
        .collect();
    assert!(notes.contains(&"about the instance"), "{report}");
    assert!(notes.contains(&"about a pod"), "{report}");
    assert!(!notes.iter().any(|m| m.contains("another")), "{report}");

    // status, as a table and as JSON.
    let table = ok(&["status", "cache", "-n", n], None);
    assert!(
        table
            .stdout
            .contains(&format!("Valkey cache in namespace {n}")),
        "{}",
        table.stdout
    );
    assert!(table.stdout.contains("Pods"), "{}", table.stdout);
    let report: Value =
        serde_json::from_str(&ok(&["status", "cache", "-n", n, "-o", "json"], None).stdout)
            .expect("status -o json is JSON");
    assert_eq!(report["name"], "cache");
    assert_eq!(report["replicas"], 3);
    assert_eq!(
        report["endpoints"]["readWrite"],
        format!("cache.{n}.svc:6379")
    );
    assert!(report["pods"].is_array() && report["events"].is_array());
    let _: Value =
        yaml_serde::from_str(&ok(&["status", "cache", "-n", n, "-o", "yaml"], None).stdout)
            .expect("status -o yaml is YAML");

    // scale through the scale subresource.
    let scaled = ok(&["scale", "cache", "-n", n, "--replicas", "2"], None);
    assert!(scaled.stdout.contains("scaled to 2"), "{}", scaled.stdout);
    assert_eq!(valkeys.get("cache").await.expect("get").spec.replicas, 2);

    // delete --delete-data removes the instance's volumes, and only those.
    let claims: Api<PersistentVolumeClaim> = ns.api();
    for claim in ["data-cache-0", "data-cache-1", "data-cachet-0"] {
        claims
            .create(&PostParams::default(), &volume_claim(claim))
            .await
            .expect("creating a claim");
    }
    let deleted = ok(
        &["delete", "cache", "-n", n, "--yes", "--delete-data"],
        None,
    );
    assert!(
        deleted
            .stdout
            .contains("valkey.database.kuberly.io/cache deleted"),
        "{}",
        deleted.stdout
    );
    assert!(
        deleted
            .stdout
            .contains("persistentvolumeclaim/data-cache-1 deleted"),
        "{}",
        deleted.stdout
    );
    assert!(gone(&valkeys, "cache").await, "the Valkey is deleted");
    for claim in ["data-cache-0", "data-cache-1"] {
        let left = claims.get_opt(claim).await.expect("get claim");
        assert!(
            left.is_none_or(|c| c.metadata.deletion_timestamp.is_some()),
            "{claim} is being deleted"
        );
    }
    let other = claims.get_opt("data-cachet-0").await.expect("get claim");
    assert!(
        other.is_some_and(|c| c.metadata.deletion_timestamp.is_none()),
        "another instance's volume stays"
    );

    ok(&["delete", "sessions", "-n", n, "--yes"], None);
    assert!(gone(&valkeys, "sessions").await);
    let empty = run(plugin::kubectl_valkey(&["list", "-n", n]), None);
    assert_eq!(empty.code, 0);
    assert!(empty.stdout.is_empty());
    assert!(
        empty.stderr.contains("No Valkey instances found"),
        "{}",
        empty.stderr
    );
}

#[tokio::test]
async fn create_wait_shows_progress_until_running() {
    plugin::install();
    let ns = TestNamespace::new("plugin-wait", &[]).await;
    let valkeys: Api<Valkey> = ns.api();
    let mut command = plugin::kubectl_valkey(&[
        "create",
        "waited",
        "-n",
        &ns.name,
        "--wait",
        "--timeout",
        "60s",
    ]);
    command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = command.spawn().expect("starting create --wait");

    // Play the operator: Creating, then Running, for the current generation.
    let created = wait_for(&valkeys, "waited").await;
    let generation = created.metadata.generation.unwrap_or(1);
    for (phase, ready) in [("Creating", 0), ("Running", 1)] {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let status = json!({"status": {"status": phase, "readyReplicas": ready, "primary": "waited-0", "observedGeneration": generation}});
        valkeys
            .patch_status("waited", &PatchParams::default(), &Patch::Merge(status))
            .await
            .expect("writing the status");
    }
    let output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("joining")
        .expect("create --wait ends");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("waited: Creating, 0/1 pods ready"),
        "{stderr}"
    );
    assert!(
        stderr.contains("waited: Running, 1/1 pods ready"),
        "{stderr}"
    );
}

#[tokio::test]
async fn create_wait_reports_the_status_error() {
    plugin::install();
    let ns = TestNamespace::new("plugin-fail", &[]).await;
    let valkeys: Api<Valkey> = ns.api();
    let mut command = plugin::kubectl_valkey(&[
        "create",
        "broken",
        "-n",
        &ns.name,
        "--wait",
        "--timeout",
        "60s",
    ]);
    command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = command.spawn().expect("starting create --wait");
    let created = wait_for(&valkeys, "broken").await;
    let status = json!({"status": {"status": "Failed", "error": "image valkey/valkey:9.1.2 cannot be pulled", "observedGeneration": created.metadata.generation}});
    valkeys
        .patch_status("broken", &PatchParams::default(), &Patch::Merge(status))
        .await
        .expect("writing the status");
    let output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("joining")
        .expect("create --wait ends");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("error: Valkey broken failed: image valkey/valkey:9.1.2 cannot be pulled"),
        "{stderr}"
    );
}

#[tokio::test]
async fn kubectl_completes_through_the_completion_link() {
    plugin::install();
    let ns = TestNamespace::new("plugin-complete", &[]).await;
    ok(&["create", "completed", "-n", &ns.name], None);
    let subcommands = run(plugin::kubectl(&["__complete", "valkey", ""]), None);
    for name in ["create", "status", "logs", "connect"] {
        assert!(
            subcommands.stdout.lines().any(|l| l.starts_with(name)),
            "{name}: {}",
            subcommands.stdout
        );
    }
    assert!(subcommands.stdout.contains(":4"), "{}", subcommands.stdout);
    let instances = run(
        plugin::kubectl(&["__complete", "valkey", "status", "-n", &ns.name, "comp"]),
        None,
    );
    assert!(
        instances.stdout.lines().any(|l| l == "completed"),
        "{}\n{}",
        instances.stdout,
        instances.stderr
    );
    let flags = run(
        plugin::kubectl(&["__complete", "valkey", "logs", "completed", "--fol"]),
        None,
    );
    assert!(
        flags.stdout.lines().any(|l| l.starts_with("--follow")),
        "{}",
        flags.stdout
    );
}

/// KUBECONFIG as kubectl reads it: several files merged (a missing one skipped), the current
/// context from one file and the context itself from another, an exec credential plugin for the
/// user, and the context's namespace as the default.
#[tokio::test]
async fn kubeconfig_files_exec_credentials_and_the_context_namespace() {
    plugin::install();
    let ns = TestNamespace::new("plugin-kubeconfig", &[]).await;
    ok(&["create", "found-by-context", "-n", &ns.name], None);

    let admin =
        Kubeconfig::read_from(support::cluster::kubeconfig_path()).expect("the admin kubeconfig");
    let cluster = admin
        .clusters
        .first()
        .and_then(|c| c.cluster.clone())
        .expect("a cluster");
    let user = admin
        .auth_infos
        .first()
        .and_then(|u| u.auth_info.clone())
        .expect("a user");
    let pem = |data: Option<&String>| -> String {
        let data = data.expect("inline certificate data");
        String::from_utf8(STANDARD.decode(data).expect("base64")).expect("PEM text")
    };
    let certificate = pem(user.client_certificate_data.as_ref());
    let key = user
        .client_key_data
        .as_ref()
        .map(|k| k.expose_secret().to_owned());
    let key = pem(key.as_ref());

    let dir = tempfile::tempdir().expect("a temp dir");
    let credential = json!({
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"clientCertificateData": certificate, "clientKeyData": key},
    });
    std::fs::write(dir.path().join("credential.json"), credential.to_string()).expect("writing");
    let plugin_path = dir.path().join("credential-plugin");
    std::fs::write(
        &plugin_path,
        format!(
            "#!/bin/sh\ncat '{}'\n",
            dir.path().join("credential.json").display()
        ),
    )
    .expect("writing the credential plugin");
    std::fs::set_permissions(
        &plugin_path,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let contexts = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "local", "cluster": {
            "server": cluster.server,
            "certificate-authority-data": cluster.certificate_authority_data,
        }}],
        "users": [{"name": "exec-user", "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": plugin_path,
            "interactiveMode": "Never",
        }}}],
        "contexts": [{"name": "team", "context": {"cluster": "local", "user": "exec-user", "namespace": ns.name}}],
    });
    let current = json!({"apiVersion": "v1", "kind": "Config", "current-context": "team"});
    std::fs::write(dir.path().join("contexts.yaml"), contexts.to_string()).expect("writing");
    std::fs::write(dir.path().join("current.yaml"), current.to_string()).expect("writing");
    let kubeconfig = format!(
        "{}:{}:{}",
        dir.path().join("current.yaml").display(),
        dir.path().join("missing.yaml").display(),
        dir.path().join("contexts.yaml").display()
    );

    let mut list = plugin::kubectl_valkey(&["list"]);
    list.env("KUBECONFIG", &kubeconfig);
    let list = run(list, None);
    assert_eq!(list.code, 0, "{list:?}");
    assert!(list.stdout.contains("found-by-context"), "{list:?}");
    let mut direct = std::process::Command::new(plugin::bin());
    direct
        .args(["status", "found-by-context", "-o", "json"])
        .env("KUBECONFIG", &kubeconfig);
    let status = run(direct, None);
    assert_eq!(status.code, 0, "{status:?}");
}

/// On a terminal, delete asks; only "y" deletes.
#[tokio::test]
async fn delete_asks_on_a_terminal() {
    plugin::install();
    let ns = TestNamespace::new("plugin-confirm", &[]).await;
    let valkeys: Api<Valkey> = ns.api();
    ok(&["create", "asked", "-n", &ns.name], None);
    for (answer, deleted) in [("n", false), ("y", true)] {
        let line = format!(
            "{} valkey -n {} delete asked",
            plugin::kubectl_bin().display(),
            ns.name
        );
        let mut script = std::process::Command::new("script");
        script
            .args(["-qefc", &line, "/dev/null"])
            .env("PATH", plugin::path_env())
            .env("KUBECONFIG", support::cluster::kubeconfig_path());
        let outcome = run(script, Some(&format!("{answer}\n")));
        assert!(
            outcome.stdout.contains("Delete Valkey asked in namespace"),
            "{outcome:?}"
        );
        assert_eq!(outcome.code, if deleted { 0 } else { 1 }, "{outcome:?}");
        if deleted {
            assert!(gone(&valkeys, "asked").await, "answer {answer}");
        } else {
            assert!(
                valkeys.get_opt("asked").await.expect("get").is_some(),
                "answer {answer}"
            );
        }
    }
}

/// `delete --delete-data` by someone who may delete Valkeys but not list volumes deletes
/// nothing and says why, rather than deleting the instance and reporting "no volumes".
#[tokio::test]
async fn delete_data_without_the_right_to_list_volumes_deletes_nothing() {
    plugin::install();
    let ns = TestNamespace::new("plugin-nolist", &[]).await;
    let valkeys: Api<Valkey> = ns.api();
    ok(&["create", "kept", "-n", &ns.name], None);
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "valkeys-only"},
        "rules": [{"apiGroups": ["database.kuberly.io"], "resources": ["valkeys"],
                   "verbs": ["get", "list", "delete"]}],
    });
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "valkeys-only"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "valkeys-only"},
        "subjects": [{"kind": "User", "name": "valkeys-only", "apiGroup": "rbac.authorization.k8s.io"}],
    });
    let roles: Api<k8s_openapi::api::rbac::v1::Role> = ns.api();
    roles
        .create(
            &PostParams::default(),
            &serde_json::from_value(role).unwrap(),
        )
        .await
        .expect("creating the role");
    let bindings: Api<k8s_openapi::api::rbac::v1::RoleBinding> = ns.api();
    bindings
        .create(
            &PostParams::default(),
            &serde_json::from_value(binding).unwrap(),
        )
        .await
        .expect("creating the binding");

    let outcome = run(
        plugin::kubectl_valkey(&[
            "delete",
            "kept",
            "-n",
            &ns.name,
            "--delete-data",
            "--yes",
            "--as",
            "valkeys-only",
        ]),
        None,
    );
    assert_eq!(outcome.code, 1, "{outcome:?}");
    assert!(
        outcome.stderr.contains("--delete-data") && outcome.stderr.contains("nothing was deleted"),
        "{outcome:?}"
    );
    assert!(
        valkeys.get_opt("kept").await.expect("get").is_some(),
        "the Valkey must still exist"
    );
}

fn volume_claim(name: &str) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .expect("a claim")
}

/// Whether the Valkey is gone within 30 s (finalizers of a running operator may hold it briefly).
async fn gone(api: &Api<Valkey>, name: &str) -> bool {
    for _ in 0..150 {
        if api.get_opt(name).await.expect("get").is_none() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

async fn wait_for(api: &Api<Valkey>, name: &str) -> Valkey {
    for _ in 0..300 {
        if let Some(v) = api.get_opt(name).await.expect("get") {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{name} was not created within 30s");
}
