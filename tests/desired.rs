//! The pure builders against reviewed YAML fixtures, and the properties a user would notice.
//!
//! Each directory under tests/fixtures/desired/ is a scenario: `input.yaml` (a Valkey and the facts
//! the operator observed) and one expected file per object (absent when the object is not built).
//! After a deliberate change, regenerate them with `UPDATE_FIXTURES=1 cargo test --test desired`
//! and review the diff before committing it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use valkey_core::api::Valkey;
use valkey_core::api::defaults;
use valkey_core::api::names::{self, labels};
use valkey_core::desired::{
    self, BuildError, CONFIG_HASH_ANNOTATION, Desired, Facts, PRIMARY_KEY, VALKEY_CONF_KEY,
};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/desired");

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Input {
    facts: InputFacts,
    valkey: Valkey,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct InputFacts {
    #[serde(default)]
    primary: Option<String>,
    password: String,
    #[serde(default)]
    new_password: bool,
    operator_password: String,
    #[serde(default)]
    new_operator_password: bool,
    #[serde(default)]
    initialized: bool,
    #[serde(default)]
    metrics_password: String,
    #[serde(default)]
    new_metrics_password: bool,
    #[serde(default)]
    old_password: Option<String>,
    #[serde(default)]
    rotation_started: Option<String>,
}

struct Scenario {
    name: String,
    dir: PathBuf,
    valkey: Valkey,
    facts: Facts,
}

fn scenarios() -> Vec<Scenario> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(FIXTURES)
        .expect("reading tests/fixtures/desired")
        .map(|entry| entry.expect("listing tests/fixtures/desired").path())
        .filter(|path| path.join("input.yaml").is_file())
        .collect();
    dirs.sort();
    assert!(!dirs.is_empty(), "no scenarios under {FIXTURES}");
    dirs.into_iter().map(|dir| scenario(&dir)).collect()
}

fn scenario(dir: &Path) -> Scenario {
    let path = dir.join("input.yaml");
    let text = std::fs::read_to_string(&path).expect("reading input.yaml");
    let input: Input =
        yaml_serde::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()));
    Scenario {
        name: dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        dir: dir.to_owned(),
        valkey: input.valkey,
        facts: Facts {
            primary: input.facts.primary,
            old_password: input.facts.old_password,
            rotation_started: input.facts.rotation_started,
            password: input.facts.password,
            new_password: input.facts.new_password,
            operator_password: input.facts.operator_password,
            new_operator_password: input.facts.new_operator_password,
            initialized: input.facts.initialized,
            metrics_password: input.facts.metrics_password,
            new_metrics_password: input.facts.new_metrics_password,
        },
    }
}

fn named(name: &str) -> Scenario {
    scenario(&Path::new(FIXTURES).join(name))
}

fn to_value(object: impl Serialize) -> Value {
    serde_json::to_value(object).expect("objects serialize")
}

fn updating() -> bool {
    std::env::var("UPDATE_FIXTURES").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Compares one built object of every scenario with `<scenario>/<file>`, or rewrites the file.
fn check_fixtures(
    file: &str,
    build: impl Fn(&Valkey, &Facts) -> Result<Option<Value>, BuildError>,
) {
    let mut failures = Vec::new();
    for s in scenarios() {
        let path = s.dir.join(file);
        let actual = build(&s.valkey, &s.facts)
            .unwrap_or_else(|e| panic!("{}: building {file} failed: {e}", s.name));
        if updating() {
            write_fixture(&path, actual.as_ref());
            continue;
        }
        let expected = read_fixture(&path);
        let difference = match (&expected, &actual) {
            (None, None) => None,
            (Some(_), None) => Some("expected the object, but none was built".to_owned()),
            (None, Some(_)) => Some("built an object, but no expected file exists".to_owned()),
            (Some(e), Some(a)) => first_difference("", e, a),
        };
        if let Some(d) = difference {
            failures.push(format!("{}/{file}: {d}", s.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{}\n(after a deliberate change: UPDATE_FIXTURES=1 cargo test --test desired, then review the diff)",
        failures.join("\n")
    );
}

fn read_fixture(path: &Path) -> Option<Value> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(yaml_serde::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display())))
}

fn write_fixture(path: &Path, object: Option<&Value>) {
    match object {
        Some(object) => {
            let yaml = yaml_serde::to_string(object).expect("objects serialize to YAML");
            std::fs::write(path, yaml).expect("writing a fixture");
        }
        None => {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The path and values of the first place two values differ, for a readable failure.
fn first_difference(path: &str, expected: &Value, actual: &Value) -> Option<String> {
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            let keys: BTreeSet<&String> = e.keys().chain(a.keys()).collect();
            keys.into_iter().find_map(|k| {
                let here = format!("{path}.{k}");
                match (e.get(k), a.get(k)) {
                    (Some(e), Some(a)) => first_difference(&here, e, a),
                    (Some(e), None) => Some(format!("{here}: missing (expected {e})")),
                    (None, Some(a)) => Some(format!("{here}: unexpected {a}")),
                    (None, None) => None,
                }
            })
        }
        (Value::Array(e), Value::Array(a)) if e.len() == a.len() => e
            .iter()
            .zip(a)
            .enumerate()
            .find_map(|(i, (e, a))| first_difference(&format!("{path}[{i}]"), e, a)),
        _ if expected == actual => None,
        _ => Some(format!("{path}: expected {expected}, got {actual}")),
    }
}

fn some<T: Serialize>(object: T) -> Option<Value> {
    Some(to_value(object))
}

// ---------------------------------------------------------------------------------------------
// Fixtures, one test per builder.

#[test]
fn generated_secret_fixtures() {
    check_fixtures("generated-secret.yaml", |v, f| {
        Ok(desired::objects(v, f)?.generated_secret.map(to_value))
    });
}

#[test]
fn operator_secret_fixtures() {
    check_fixtures("operator-secret.yaml", |v, f| {
        Ok(desired::objects(v, f)?.operator_secret.map(to_value))
    });
}

/// spec.networkPolicy, with the operator in its shipped namespace. `full` has no metrics, so
/// its metricsNamespaceSelector opens nothing; `metrics` picks clients in other namespaces.
#[test]
fn network_policy_fixtures() {
    check_fixtures("network-policy.yaml", |v, _| {
        Ok(desired::network_policy(v, "valkey-operator-system")?.map(to_value))
    });
}

#[test]
fn acl_secret_fixtures() {
    check_fixtures("acl-secret.yaml", |v, f| {
        Ok(some(desired::acl_secret(v, f)?))
    });
}

/// The Secret's auth.conf in clear text beside the (base64) Secret, so a reviewer can read it.
#[test]
fn auth_conf_fixtures() {
    check_fixtures("auth.conf.yaml", |v, f| {
        Ok(Some(Value::String(auth_conf(&desired::acl_secret(v, f)?))))
    });
}

#[test]
fn config_map_fixtures() {
    check_fixtures("configmap.yaml", |v, f| {
        Ok(some(desired::config_map(v, f)?))
    });
}

#[test]
fn statefulset_fixtures() {
    check_fixtures("statefulset.yaml", |v, f| {
        Ok(some(desired::statefulset(v, f)?))
    });
}

#[test]
fn read_write_service_fixtures() {
    check_fixtures("service.yaml", |v, _| {
        Ok(some(desired::read_write_service(v)?))
    });
}

#[test]
fn read_only_service_fixtures() {
    check_fixtures("service-replicas.yaml", |v, _| {
        Ok(some(desired::read_only_service(v)?))
    });
}

#[test]
fn headless_service_fixtures() {
    check_fixtures("service-headless.yaml", |v, _| {
        Ok(some(desired::headless_service(v)?))
    });
}

#[test]
fn pod_disruption_budget_fixtures() {
    check_fixtures("pdb.yaml", |v, _| {
        Ok(desired::pod_disruption_budget(v)?.map(to_value))
    });
}

#[test]
fn metrics_secret_fixtures() {
    check_fixtures("metrics-secret.yaml", |v, f| {
        Ok(desired::objects(v, f)?.metrics_secret.map(to_value))
    });
}

#[test]
fn metrics_service_fixtures() {
    check_fixtures("service-metrics.yaml", |v, _| {
        Ok(desired::metrics_service(v)?.map(to_value))
    });
}

#[test]
fn service_monitor_fixtures() {
    check_fixtures("servicemonitor.yaml", |v, _| {
        Ok(desired::service_monitor(v)?.map(to_value))
    });
}

/// `desired` is exactly the builders, so the fixtures above cover it.
#[test]
fn desired_is_the_builders() {
    for s in scenarios() {
        let (v, f) = (&s.valkey, &s.facts);
        let d = desired::objects(v, f).unwrap();
        let pairs = [
            (
                to_value(&d.acl_secret),
                to_value(desired::acl_secret(v, f).unwrap()),
            ),
            (
                to_value(&d.config_map),
                to_value(desired::config_map(v, f).unwrap()),
            ),
            (
                to_value(&d.statefulset),
                to_value(desired::statefulset(v, f).unwrap()),
            ),
            (
                to_value(&d.read_write_service),
                to_value(desired::read_write_service(v).unwrap()),
            ),
            (
                to_value(&d.read_only_service),
                to_value(desired::read_only_service(v).unwrap()),
            ),
            (
                to_value(&d.headless_service),
                to_value(desired::headless_service(v).unwrap()),
            ),
            (
                to_value(&d.pod_disruption_budget),
                to_value(desired::pod_disruption_budget(v).unwrap()),
            ),
            (
                to_value(&d.metrics_service),
                to_value(desired::metrics_service(v).unwrap()),
            ),
            (
                to_value(&d.service_monitor),
                to_value(desired::service_monitor(v).unwrap()),
            ),
        ];
        for (from_desired, from_builder) in pairs {
            assert_eq!(from_desired, from_builder, "{}", s.name);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers over built objects.

fn auth_conf(secret: &k8s_openapi::api::core::v1::Secret) -> String {
    let data = secret.data.as_ref().expect("the ACL Secret has data");
    let bytes = &data
        .get("auth.conf")
        .expect("the ACL Secret has auth.conf")
        .0;
    String::from_utf8(bytes.clone()).expect("auth.conf is UTF-8")
}

fn valkey_conf(d: &Desired) -> &str {
    d.config_map
        .data
        .as_ref()
        .and_then(|data| data.get(VALKEY_CONF_KEY))
        .expect("the ConfigMap has valkey.conf")
}

fn config_hash(d: &Desired) -> String {
    d.statefulset
        .spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(CONFIG_HASH_ANNOTATION))
        .cloned()
        .expect("the pod template carries the config hash")
}

fn pod_spec(d: &Desired) -> &PodSpec {
    d.statefulset.spec.template.spec.as_ref().expect("pod spec")
}

fn containers(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
}

fn with_spec(s: &Scenario, change: impl FnOnce(&mut Valkey)) -> Valkey {
    let mut valkey = s.valkey.clone();
    change(&mut valkey);
    valkey
}

// ---------------------------------------------------------------------------------------------
// Properties.

#[test]
fn a_config_change_changes_the_hash() {
    let s = named("standalone");
    let before = config_hash(&desired::objects(&s.valkey, &s.facts).unwrap());
    let valkey = with_spec(&s, |v| {
        v.spec
            .config
            .insert("maxmemory-policy".into(), "allkeys-lru".into());
    });
    let after = config_hash(&desired::objects(&valkey, &s.facts).unwrap());
    assert_ne!(before, after);
    assert_eq!(after.len(), 64, "sha256 in hex: {after}");
    let memory = with_spec(&s, |v| v.spec.resource.memory = "1Gi".into());
    assert_ne!(
        before,
        config_hash(&desired::objects(&memory, &s.facts).unwrap())
    );
}

/// The instance user's password is rotated live: a new one (or a rotation in progress) leaves
/// the pod template alone, so no pod rolls; the operator's password still rolls them.
#[test]
fn a_password_change_rolls_no_pod() {
    let s = named("standalone");
    let before = desired::objects(&s.valkey, &s.facts).unwrap();
    for facts in [
        Facts {
            password: "another-password".into(),
            ..s.facts.clone()
        },
        Facts {
            password: "another-password".into(),
            old_password: Some(s.facts.password.clone()),
            rotation_started: Some("2026-12-01T10:00:00Z".into()),
            ..s.facts.clone()
        },
    ] {
        let after = desired::objects(&s.valkey, &facts).unwrap();
        assert_eq!(to_value(&before.statefulset), to_value(&after.statefulset));
        assert_ne!(
            auth_conf(&before.acl_secret),
            auth_conf(&after.acl_secret),
            "auth.conf, read by pods that start later, has the new password"
        );
    }
    let operator = Facts {
        operator_password: "another-operator-password".into(),
        ..s.facts.clone()
    };
    assert_ne!(
        config_hash(&before),
        config_hash(&desired::objects(&s.valkey, &operator).unwrap())
    );
}

/// While a rotation runs, the user holds both passwords, replication logs in with the old one
/// (which every pod accepts until the end), the `password` and `old-password` files hold them,
/// and the ACL Secret records the start.
#[test]
fn a_rotation_in_progress_keeps_both_passwords() {
    let s = named("replicated");
    let facts = Facts {
        password: "new-pw".into(),
        old_password: Some("old-pw".into()),
        rotation_started: Some("2026-12-01T10:00:00Z".into()),
        ..s.facts.clone()
    };
    let d = desired::objects(&s.valkey, &facts).unwrap();
    let conf = auth_conf(&d.acl_secret);
    let user = &s.valkey.spec.user;
    assert!(
        conf.contains(&format!(
            r#"user {user} on ">old-pw" ">new-pw" ~* &* +@all"#
        )),
        "{conf}"
    );
    assert!(conf.contains("masterauth \"old-pw\"\n"), "{conf}");
    let data = d.acl_secret.data.as_ref().unwrap();
    assert_eq!(data[desired::PASSWORD_KEY].0, b"new-pw");
    assert_eq!(data[desired::OLD_PASSWORD_KEY].0, b"old-pw");
    assert_eq!(
        d.acl_secret.metadata.annotations.as_ref().unwrap()[names::ROTATION_STARTED_ANNOTATION],
        "2026-12-01T10:00:00Z"
    );
    let steady = desired::objects(&s.valkey, &s.facts).unwrap();
    assert!(steady.acl_secret.metadata.annotations.is_none());
    let data = steady.acl_secret.data.as_ref().unwrap();
    assert_eq!(data[desired::PASSWORD_KEY].0, s.facts.password.as_bytes());
    assert!(data[desired::OLD_PASSWORD_KEY].0.is_empty());
}

#[test]
fn a_primary_change_rolls_no_pod() {
    let s = named("replicated");
    let on = |primary: &str| {
        let facts = Facts {
            primary: Some(primary.into()),
            ..s.facts.clone()
        };
        desired::objects(&s.valkey, &facts).unwrap()
    };
    let (first, second) = (on("cache-0"), on("cache-2"));
    assert_eq!(to_value(&first.statefulset), to_value(&second.statefulset));
    let primary = |d: &Desired| d.config_map.data.as_ref().unwrap()[PRIMARY_KEY].clone();
    assert_eq!(primary(&first), "cache-0");
    assert_eq!(primary(&second), "cache-2");
}

#[test]
fn the_primary_defaults_to_pod_zero() {
    let s = named("standalone");
    let d = desired::objects(&s.valkey, &s.facts).unwrap();
    assert_eq!(d.config_map.data.as_ref().unwrap()[PRIMARY_KEY], "cache-0");
}

/// The passwords may only be in their Secrets: not in the ConfigMap, the StatefulSet (command,
/// args, probes, env), the Services, the ServiceMonitor or the PDB.
#[test]
fn the_password_stays_in_its_secrets() {
    let password = "Zebra-0451-unmistakable-secret";
    let operator_password = "Okapi-7788-operator-secret";
    let metrics_password = "Quokka-3141-metrics-secret";
    for s in scenarios() {
        let facts = Facts {
            password: password.into(),
            new_password: true,
            operator_password: operator_password.into(),
            new_operator_password: true,
            metrics_password: metrics_password.into(),
            new_metrics_password: true,
            ..s.facts.clone()
        };
        let d = desired::objects(&s.valkey, &facts).unwrap();
        let public = [
            ("configmap", to_value(&d.config_map)),
            ("statefulset", to_value(&d.statefulset)),
            ("service", to_value(&d.read_write_service)),
            ("service-replicas", to_value(&d.read_only_service)),
            ("service-headless", to_value(&d.headless_service)),
            ("pdb", to_value(&d.pod_disruption_budget)),
        ];
        let public = public
            .into_iter()
            .chain([
                ("service-metrics", to_value(&d.metrics_service)),
                ("servicemonitor", to_value(&d.service_monitor)),
            ])
            .collect::<Vec<_>>();
        for (what, object) in public {
            for secret in [password, operator_password, metrics_password] {
                assert!(
                    !object.to_string().contains(secret),
                    "{}: a password is in the {what}",
                    s.name
                );
            }
        }
        for c in containers(pod_spec(&d)) {
            let argv = c.command.iter().chain(c.args.iter()).flatten();
            let probes = [&c.readiness_probe, &c.liveness_probe, &c.startup_probe];
            let probe_argv = probes
                .into_iter()
                .flatten()
                .filter_map(|p| p.exec.as_ref()?.command.as_ref())
                .flatten();
            for arg in argv.chain(probe_argv) {
                assert!(
                    !arg.contains(password),
                    "{}: password in argv {arg:?}",
                    s.name
                );
            }
            for env in c.env.iter().flatten() {
                // Literal values only for what is no secret (the exporter's address, user, port).
                let literal = env.value.as_deref().unwrap_or_default();
                for secret in [password, operator_password, metrics_password] {
                    assert!(
                        !literal.contains(secret),
                        "{}: env {} holds a password",
                        s.name,
                        env.name
                    );
                }
                assert!(
                    env.value.is_none()
                        || !env.name.contains("PASSWORD") && !env.name.contains("AUTH"),
                    "{}: env {} has a literal value",
                    s.name,
                    env.name
                );
            }
        }
        assert!(auth_conf(&d.acl_secret).contains(password));
        assert!(auth_conf(&d.acl_secret).contains(operator_password));
        let operator = d
            .operator_secret
            .expect("a new operator password gets its Secret");
        assert_eq!(
            operator.data.unwrap()["password"].0,
            operator_password.as_bytes()
        );
    }
}

#[test]
fn the_password_reaches_the_cli_through_the_environment() {
    let secret_of = |name: &str| {
        let s = named(name);
        let d = desired::objects(&s.valkey, &s.facts).unwrap();
        let c = &pod_spec(&d).containers[0];
        let env = c.env.clone().unwrap_or_default();
        ["VALKEYCLI_AUTH", "REDISCLI_AUTH"].map(|var| {
            let e = env.iter().find(|e| e.name == var).expect(var);
            let r = e
                .value_from
                .as_ref()
                .unwrap()
                .secret_key_ref
                .as_ref()
                .unwrap();
            (r.name.clone(), r.key.clone())
        })
    };
    let generated = ("cache-auth".to_owned(), "password".to_owned());
    assert_eq!(secret_of("standalone"), [generated.clone(), generated]);
    let own = ("cache-credentials".to_owned(), "valkey-password".to_owned());
    assert_eq!(secret_of("full"), [own.clone(), own]);
}

#[test]
fn the_pdb_exists_only_with_replicas() {
    let s = named("standalone");
    for replicas in 0..=5 {
        let valkey = with_spec(&s, |v| v.spec.replicas = replicas);
        let pdb = desired::pod_disruption_budget(&valkey).unwrap();
        assert_eq!(pdb.is_some(), replicas > 1, "replicas {replicas}");
        if let Some(pdb) = pdb {
            let spec = pdb.spec.unwrap();
            assert_eq!(to_value(spec.max_unavailable), json!(1));
        }
    }
}

#[test]
fn the_password_secret_is_generated_only_when_needed() {
    let s = named("standalone");
    let generated = |valkey: &Valkey, new_password: bool| {
        let facts = Facts {
            new_password,
            ..s.facts.clone()
        };
        desired::objects(valkey, &facts).unwrap().generated_secret
    };
    let secret = generated(&s.valkey, true).expect("a new password gets its Secret");
    assert_eq!(secret.metadata.name.as_deref(), Some("cache-auth"));
    let data = secret.data.unwrap();
    assert_eq!(data["password"].0, s.facts.password.as_bytes());
    assert!(
        generated(&s.valkey, false).is_none(),
        "an existing Secret is left alone"
    );
    let own = named("full");
    assert!(
        generated(&own.valkey, true).is_none(),
        "spec.passwordSecret is the user's"
    );
}

#[test]
fn generated_passwords_are_long_random_and_plain() {
    let a = desired::generate_password().unwrap();
    let b = desired::generate_password().unwrap();
    assert_ne!(a, b);
    assert_eq!(a.len(), 43, "32 bytes in unpadded base64: {a}");
    assert!(
        a.bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'),
        "{a}"
    );
    assert_eq!(
        desired::password_from_bytes(&[0xff; 32]),
        "_".repeat(42) + "8"
    );
}

/// `restricted` Pod Security Standard (which includes `baseline`), field by field.
fn restricted_violations(pod: &PodSpec) -> Vec<String> {
    let mut v = Vec::new();
    let psc = pod.security_context.clone().unwrap_or_default();
    for (host, set) in [
        ("hostNetwork", pod.host_network),
        ("hostPID", pod.host_pid),
        ("hostIPC", pod.host_ipc),
    ] {
        if set == Some(true) {
            v.push(format!("{host} is set"));
        }
    }
    const ALLOWED_VOLUMES: [&str; 8] = [
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    ];
    for volume in pod.volumes.iter().flatten() {
        let value = to_value(volume);
        let kinds: Vec<_> = value
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| *k != "name")
            .collect();
        if kinds.iter().any(|k| !ALLOWED_VOLUMES.contains(&k.as_str())) {
            v.push(format!("volume {} is of type {kinds:?}", volume.name));
        }
    }
    if psc.run_as_user == Some(0) {
        v.push("pod runAsUser 0".into());
    }
    if psc.sysctls.is_some_and(|s| !s.is_empty()) {
        v.push("pod sets sysctls".into());
    }
    let pod_seccomp = psc.seccomp_profile.as_ref().map(|p| p.type_.clone());
    for c in containers(pod) {
        let sc = c.security_context.clone().unwrap_or_default();
        let name = &c.name;
        if sc.privileged == Some(true) {
            v.push(format!("{name}: privileged"));
        }
        if sc.allow_privilege_escalation != Some(false) {
            v.push(format!("{name}: allowPrivilegeEscalation is not false"));
        }
        if sc.run_as_non_root.or(psc.run_as_non_root) != Some(true) {
            v.push(format!("{name}: runAsNonRoot is not true"));
        }
        if sc.run_as_user == Some(0) {
            v.push(format!("{name}: runAsUser 0"));
        }
        let seccomp = sc.seccomp_profile.map(|p| p.type_).or(pod_seccomp.clone());
        if !matches!(seccomp.as_deref(), Some("RuntimeDefault" | "Localhost")) {
            v.push(format!("{name}: seccompProfile is {seccomp:?}"));
        }
        let caps = sc.capabilities.unwrap_or_default();
        if !caps.drop.unwrap_or_default().iter().any(|d| d == "ALL") {
            v.push(format!("{name}: capabilities do not drop ALL"));
        }
        if caps
            .add
            .unwrap_or_default()
            .iter()
            .any(|a| a != "NET_BIND_SERVICE")
        {
            v.push(format!("{name}: adds capabilities"));
        }
        if c.ports.iter().flatten().any(|p| p.host_port.is_some()) {
            v.push(format!("{name}: hostPort"));
        }
        if sc.proc_mount.is_some_and(|p| p != "Default") {
            v.push(format!("{name}: procMount"));
        }
    }
    v
}

#[test]
fn pods_pass_the_restricted_pod_security_standard() {
    for s in scenarios() {
        let d = desired::objects(&s.valkey, &s.facts).unwrap();
        let pod = pod_spec(&d);
        assert_eq!(
            restricted_violations(pod),
            Vec::<String>::new(),
            "{}",
            s.name
        );
        // Beyond the standard: what the brief asks of every pod.
        assert_eq!(
            pod.automount_service_account_token,
            Some(false),
            "{}",
            s.name
        );
        let c = &pod.containers[0];
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.read_only_root_filesystem, Some(true), "{}", s.name);
        let psc = pod.security_context.as_ref().unwrap();
        assert_eq!(
            (psc.run_as_user, psc.run_as_group, psc.fs_group),
            (Some(999), Some(999), Some(999))
        );
    }
}

#[test]
fn the_role_label_is_left_to_the_operator() {
    for s in scenarios() {
        let d = desired::objects(&s.valkey, &s.facts).unwrap();
        let template_labels = d
            .statefulset
            .spec
            .template
            .metadata
            .unwrap()
            .labels
            .unwrap();
        assert!(!template_labels.contains_key(labels::ROLE), "{}", s.name);
        assert_eq!(template_labels[labels::COMPONENT], "server");
        let selector = |svc: &k8s_openapi::api::core::v1::Service| {
            svc.spec.as_ref().unwrap().selector.clone().unwrap()
        };
        assert_eq!(selector(&d.read_write_service)[labels::ROLE], "primary");
        assert_eq!(selector(&d.read_only_service)[labels::ROLE], "replica");
        assert!(!selector(&d.headless_service).contains_key(labels::ROLE));
    }
}

#[test]
fn every_object_is_owned_and_labelled() {
    for s in scenarios() {
        let facts = Facts {
            new_password: true,
            ..s.facts.clone()
        };
        let d = desired::objects(&s.valkey, &facts).unwrap();
        let metas = [
            d.generated_secret.map(|o| o.metadata),
            Some(d.acl_secret.metadata),
            Some(d.config_map.metadata),
            Some(d.statefulset.metadata),
            Some(d.read_write_service.metadata),
            Some(d.read_only_service.metadata),
            Some(d.headless_service.metadata),
            d.pod_disruption_budget.map(|o| o.metadata),
        ];
        for meta in metas.into_iter().flatten() {
            let what = format!("{}: {:?}", s.name, meta.name);
            assert_eq!(meta.namespace.as_deref(), Some("ns"), "{what}");
            let l = meta.labels.unwrap();
            assert_eq!(l[labels::NAME], "valkey", "{what}");
            assert_eq!(l[labels::INSTANCE], "cache", "{what}");
            assert_eq!(l[labels::MANAGED_BY], "valkey-operator", "{what}");
            let owners = meta.owner_references.unwrap();
            assert_eq!(owners.len(), 1, "{what}");
            let o = &owners[0];
            assert_eq!(
                (o.kind.as_str(), o.name.as_str()),
                ("Valkey", "cache"),
                "{what}"
            );
            assert_eq!(o.uid, s.valkey.metadata.uid.clone().unwrap(), "{what}");
            assert_eq!(
                (o.controller, o.block_owner_deletion),
                (Some(true), Some(true))
            );
        }
    }
}

#[test]
fn maxmemory_is_three_quarters_of_the_memory_limit_unless_set() {
    let s = named("standalone");
    let d = desired::objects(&s.valkey, &s.facts).unwrap();
    // 256Mi * 75%
    assert!(
        valkey_conf(&d).contains("\nmaxmemory 201326592\n"),
        "{}",
        valkey_conf(&d)
    );
    let full = named("full");
    let d = desired::objects(&full.valkey, &full.facts).unwrap();
    let lines: Vec<_> = valkey_conf(&d)
        .lines()
        .filter(|l| l.starts_with("maxmemory "))
        .collect();
    assert_eq!(lines, ["maxmemory 700mb"]);
}

#[test]
fn spec_config_overrides_the_operator_defaults_once() {
    let s = named("no-volume");
    let d = desired::objects(&s.valkey, &s.facts).unwrap();
    let saves: Vec<_> = valkey_conf(&d)
        .lines()
        .filter(|l| l.starts_with("save "))
        .collect();
    assert_eq!(saves, ["save 900 1"]);
    let empty = with_spec(&s, |v| {
        v.spec
            .config
            .insert("notify-keyspace-events".into(), String::new());
    });
    let d = desired::objects(&empty, &s.facts).unwrap();
    assert!(valkey_conf(&d).contains("\nnotify-keyspace-events \"\"\n"));
}

#[test]
fn persistence_follows_the_volume() {
    let s = named("standalone");
    let with = valkey_conf(&desired::objects(&s.valkey, &s.facts).unwrap()).to_owned();
    assert!(with.contains("\nappendonly yes\n"), "{with}");
    assert!(with.contains("\nappendfsync everysec\n"), "{with}");
    assert!(!with.contains("\nsave "), "{with}");
    let s = named("no-volume");
    let plain = with_spec(&s, |v| v.spec.config.clear());
    let conf =
        desired::config_map(&plain, &s.facts).unwrap().data.unwrap()[VALKEY_CONF_KEY].clone();
    // On an emptyDir too: a container restart inside the pod keeps the emptyDir.
    assert!(conf.contains("\nappendonly yes\n"), "{conf}");
    assert!(!conf.contains("\nsave "), "{conf}");
}

#[test]
fn objects_need_an_owner() {
    let s = named("standalone");
    for (field, valkey) in [
        ("uid", with_spec(&s, |v| v.metadata.uid = None)),
        ("namespace", with_spec(&s, |v| v.metadata.namespace = None)),
        ("name", with_spec(&s, |v| v.metadata.name = None)),
    ] {
        match desired::objects(&valkey, &s.facts) {
            Err(BuildError::MissingMetadata { field: f, .. }) => assert_eq!(f, field),
            Err(e) => panic!("missing {field}: unexpected error {e}"),
            Ok(_) => panic!("missing {field}: built anyway"),
        }
    }
}

#[test]
fn bad_facts_and_bypassed_validation_are_errors() {
    let s = named("standalone");
    let empty = Facts {
        password: String::new(),
        ..s.facts.clone()
    };
    assert!(matches!(
        desired::objects(&s.valkey, &empty),
        Err(BuildError::EmptyPassword(_))
    ));
    for primary in ["other-0", "cache-", "cache-x", "cache-0; rm -rf /", "cache"] {
        let facts = Facts {
            primary: Some(primary.into()),
            ..s.facts.clone()
        };
        assert!(
            matches!(
                desired::objects(&s.valkey, &facts),
                Err(BuildError::InvalidPrimary { .. })
            ),
            "{primary}"
        );
    }
    for (key, value) in [
        ("requirepass", "x"),
        ("maxmemory-policy", "allkeys-lru\nrequirepass x"),
        ("Bad Key", "x"),
        ("save", "\"\""),
    ] {
        let valkey = with_spec(&s, |v| {
            v.spec.config.insert(key.into(), value.into());
        });
        assert!(
            matches!(
                desired::objects(&valkey, &s.facts),
                Err(BuildError::InvalidConfig { .. })
            ),
            "{key}: {value:?}"
        );
    }
    let memory = with_spec(&s, |v| v.spec.resource.memory = "lots".into());
    assert!(matches!(
        desired::objects(&memory, &s.facts),
        Err(BuildError::InvalidMemory(_))
    ));
}

#[test]
fn facts_never_print_the_password() {
    let s = named("standalone");
    let printed = format!("{:?}", s.facts);
    assert!(!printed.contains(&s.facts.password), "{printed}");
}

/// A scale-down never removes the primary's pod before the role has moved: the StatefulSet keeps
/// pods up to the primary's ordinal, and follows spec.replicas once another pod is primary.
#[test]
fn a_scale_down_keeps_the_primary_pod_until_the_role_has_moved() {
    let s = named("replicated");
    let mut valkey = s.valkey.clone();
    valkey.spec.replicas = 1;
    let mut facts = s.facts.clone();
    facts.primary = Some("cache-1".into());
    let replicas = |valkey: &Valkey, facts: &Facts| {
        desired::statefulset(valkey, facts)
            .expect("a StatefulSet")
            .spec
            .replicas
    };
    assert_eq!(
        replicas(&valkey, &facts),
        Some(2),
        "cache-1 is kept while primary"
    );
    facts.primary = Some("cache-0".into());
    assert_eq!(
        replicas(&valkey, &facts),
        Some(1),
        "handed over: down to spec.replicas"
    );
    valkey.spec.replicas = 0;
    facts.primary = Some("cache-1".into());
    assert_eq!(replicas(&valkey, &facts), Some(0), "stopping keeps no pod");
}

// ---------------------------------------------------------------------------------------------
// Metrics (spec.metrics).

fn metrics_container(d: &Desired) -> Option<&Container> {
    pod_spec(d)
        .containers
        .iter()
        .find(|c| c.name == desired::METRICS_CONTAINER)
}

#[test]
fn metrics_off_builds_no_sidecar_service_monitor_or_user() {
    for name in ["standalone", "replicated", "full"] {
        let s = named(name);
        let d = desired::objects(&s.valkey, &s.facts).unwrap();
        assert!(metrics_container(&d).is_none(), "{name}");
        assert_eq!(pod_spec(&d).containers.len(), 1, "{name}");
        assert!(
            d.metrics_service.is_none() && d.service_monitor.is_none(),
            "{name}"
        );
        assert!(d.metrics_secret.is_none(), "{name}");
        assert!(
            !auth_conf(&d.acl_secret).contains(names::METRICS_USER),
            "{name}"
        );
    }
}

/// The sidecar passes the restricted Pod Security Standard on its own, gets its password from
/// its own Secret through the environment and scrapes the pod's own server.
#[test]
fn the_metrics_sidecar_is_restricted_and_reads_its_password_from_its_secret() {
    let s = named("metrics");
    let d = desired::objects(&s.valkey, &s.facts).unwrap();
    let c = metrics_container(&d).expect("the metrics sidecar");
    assert_eq!(c.image.as_deref(), Some(defaults::METRICS_IMAGE));
    let sc = c.security_context.as_ref().expect("a security context");
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(
        sc.capabilities.as_ref().and_then(|c| c.drop.clone()),
        Some(vec!["ALL".to_owned()])
    );
    assert_eq!(
        sc.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
        Some("RuntimeDefault")
    );
    assert!(c.command.is_none() && c.args.is_none(), "no argv at all");
    let env = |name: &str| {
        c.env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .unwrap_or_else(|| panic!("env {name}"))
    };
    let password = env("REDIS_PASSWORD");
    assert!(password.value.is_none());
    let from = password
        .value_from
        .as_ref()
        .and_then(|v| v.secret_key_ref.as_ref())
        .expect("REDIS_PASSWORD from a Secret");
    assert_eq!(from.name, "cache-metrics-auth");
    assert_eq!(from.key, desired::METRICS_PASSWORD_KEY);
    assert_eq!(
        env("REDIS_USER").value.as_deref(),
        Some(names::METRICS_USER)
    );
    assert_eq!(
        env("REDIS_ADDR").value.as_deref(),
        Some("redis://localhost:6379")
    );
    let port = &c.ports.as_ref().expect("ports")[0];
    assert_eq!(
        (port.name.as_deref(), port.container_port),
        (Some("metrics"), 9121)
    );
    let readiness = c.readiness_probe.as_ref().and_then(|p| p.http_get.as_ref());
    assert_eq!(
        readiness.map(|h| h.port.clone()),
        Some(IntOrString::String("metrics".into()))
    );
    let requests = c
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .expect("requests");
    assert_eq!(requests["cpu"].0, defaults::METRICS_CPU);
    assert_eq!(requests["memory"].0, defaults::METRICS_MEMORY);
    // kubectl without -c still means valkey.
    let annotations = d.statefulset.spec.template.metadata.as_ref().unwrap();
    assert_eq!(
        annotations.annotations.as_ref().unwrap()["kubectl.kubernetes.io/default-container"],
        desired::CONTAINER
    );
}

/// The exporter's own ACL user may run exactly the statistics commands, touches no key, and
/// cannot read the configuration (CONFIG GET would hand out masterauth).
#[test]
fn the_metrics_user_may_only_read_statistics() {
    let s = named("metrics");
    let d = desired::objects(&s.valkey, &s.facts).unwrap();
    let conf = auth_conf(&d.acl_secret);
    let line = conf
        .lines()
        .find(|l| l.starts_with(&format!("user {} ", names::METRICS_USER)))
        .expect("the metrics user");
    assert!(line.contains("\">fixture-metrics-password\""), "{line}");
    assert!(line.contains(" resetkeys resetchannels -@all "), "{line}");
    let granted: Vec<&str> = line
        .split(' ')
        .filter_map(|w| w.strip_prefix('+'))
        .collect();
    assert_eq!(granted, desired::METRICS_COMMANDS);
    assert!(!granted.iter().any(|c| c.starts_with("config")), "{line}");
    assert!(
        !line.contains('~') && !line.contains('&'),
        "no key or channel: {line}"
    );
    let secret = d
        .metrics_secret
        .expect("a new metrics password gets its Secret");
    assert_eq!(secret.metadata.name.as_deref(), Some("cache-metrics-auth"));
    assert_eq!(
        secret.data.unwrap()[desired::METRICS_PASSWORD_KEY].0,
        b"fixture-metrics-password"
    );
}

#[test]
fn metrics_need_a_password_for_their_user() {
    let s = named("metrics");
    let facts = Facts {
        metrics_password: String::new(),
        ..s.facts.clone()
    };
    assert!(matches!(
        desired::objects(&s.valkey, &facts),
        Err(BuildError::EmptyPassword(_))
    ));
}

/// Turning metrics on or off changes the pod template (the pods roll once), and changes the
/// config hash only through auth.conf's metrics user.
#[test]
fn turning_metrics_on_changes_the_pod_template() {
    let s = named("metrics");
    let on = desired::objects(&s.valkey, &s.facts).unwrap();
    let off_valkey = with_spec(&s, |v| v.spec.metrics = Default::default());
    let off = desired::objects(&off_valkey, &s.facts).unwrap();
    assert_ne!(
        to_value(&on.statefulset.spec.template),
        to_value(&off.statefulset.spec.template)
    );
    assert_ne!(config_hash(&on), config_hash(&off));
    // The interval of the ServiceMonitor is no business of the pods.
    let slower = with_spec(&s, |v| {
        v.spec.metrics.service_monitor.interval = "1m".into()
    });
    let slower = desired::objects(&slower, &s.facts).unwrap();
    assert_eq!(to_value(&on.statefulset), to_value(&slower.statefulset));
}

/// The metrics Service selects every pod of the instance (not only the primary), and the
/// ServiceMonitor selects the metrics Service and its port by name.
#[test]
fn the_service_monitor_selects_the_metrics_service() {
    let s = named("metrics");
    let d = desired::objects(&s.valkey, &s.facts).unwrap();
    let service = d.metrics_service.expect("the metrics Service");
    let spec = service.spec.as_ref().unwrap();
    let pod_labels = d
        .statefulset
        .spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap();
    let selector = spec.selector.clone().unwrap();
    assert!(!selector.contains_key(labels::ROLE), "every pod, any role");
    assert!(selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));
    assert_eq!(
        spec.ports.as_ref().unwrap()[0].name.as_deref(),
        Some("metrics")
    );
    let monitor = d.service_monitor.expect("the ServiceMonitor");
    assert_eq!(monitor.metadata.name.as_deref(), Some("cache-metrics"));
    let service_labels = service.metadata.labels.clone().unwrap();
    let wanted = monitor.spec.selector.match_labels.clone().unwrap();
    assert!(wanted.iter().all(|(k, v)| service_labels.get(k) == Some(v)));
    // The other Services of the instance are not selected (no duplicate scrapes).
    for other in [
        &d.read_write_service,
        &d.read_only_service,
        &d.headless_service,
    ] {
        let labels = other.metadata.labels.clone().unwrap();
        assert!(!wanted.iter().all(|(k, v)| labels.get(k) == Some(v)));
    }
    assert_eq!(monitor.spec.endpoints[0].port.as_deref(), Some("metrics"));
    assert_eq!(monitor.spec.endpoints[0].interval.as_deref(), Some("15s"));
    // Without the ServiceMonitor asked for, only the Service.
    let no_monitor = with_spec(&s, |v| v.spec.metrics.service_monitor.enabled = false);
    let d = desired::objects(&no_monitor, &s.facts).unwrap();
    assert!(d.metrics_service.is_some() && d.service_monitor.is_none());
}
