//! The pod template of the StatefulSet: the valkey container, its probes, volumes, scheduling
//! and a security context that passes the `restricted` Pod Security Standard.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, ConfigMapProjection, Container, ContainerPort, EmptyDirVolumeSource,
    EnvVar, EnvVarSource, ExecAction, KeyToPath, ObjectFieldSelector, PodAffinityTerm,
    PodAntiAffinity, PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ProjectedVolumeSource,
    ResourceRequirements, SeccompProfile, SecretKeySelector, SecretProjection, SecurityContext,
    Volume, VolumeMount, VolumeProjection, WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::conf::{
    self, AUTH_CONF_KEY, AUTH_CONF_PATH, CLI_SH_KEY, CONFIG_DIR, DATA_DIR, INITIALIZED_KEY,
    MIN_REPLICAS_KEY, OLD_PASSWORD_KEY, OLD_PASSWORD_PATH, PASSWORD_KEY, PASSWORD_PATH, PORT,
    PRIMARY_KEY, START_SH_KEY, VALKEY_CONF_KEY,
};
use super::instance::Instance;
use super::statefulset::{CONTAINER, PORT_NAME};
use super::{BuildError, CONFIG_HASH_ANNOTATION, Facts, metrics};
use crate::api::defaults;
use crate::api::names::{DATA_VOLUME, RESTARTED_AT_ANNOTATION, labels};
use kube::ResourceExt;

/// Which container kubectl picks when none is named.
const DEFAULT_CONTAINER_ANNOTATION: &str = "kubectl.kubernetes.io/default-container";
/// uid and gid of the `valkey` user in the official image, which owns /data there.
pub const VALKEY_UID: i64 = 999;
/// Seconds between SIGTERM and SIGKILL: valkey flushes the AOF and closes clients on SIGTERM,
/// which can outlast the 30 s default under load.
const TERMINATION_GRACE_SECONDS: i64 = 60;
const CONFIG_VOLUME: &str = "config";
const TMP_VOLUME: &str = "tmp";
const COMPONENT: &str = "server";
/// Env var the start script compares with the `primary` key.
const POD_NAME_ENV: &str = "POD_NAME";

pub(crate) fn template(instance: &Instance, facts: &Facts) -> Result<PodTemplateSpec, BuildError> {
    let hash = config_hash(instance, facts)?;
    let spec = &instance.valkey.spec;
    let mut annotations = BTreeMap::from([(CONFIG_HASH_ANNOTATION.to_owned(), hash)]);
    if let Some(at) = instance.valkey.annotations().get(RESTARTED_AT_ANNOTATION) {
        annotations.insert(RESTARTED_AT_ANNOTATION.to_owned(), at.clone());
    }
    let mut containers = vec![container(instance)];
    if spec.metrics.enabled {
        containers.push(metrics::container(instance));
        // `kubectl logs`, `exec` and `cp` without -c mean the valkey container, as before.
        annotations.insert(
            DEFAULT_CONTAINER_ANNOTATION.to_owned(),
            CONTAINER.to_owned(),
        );
    }
    Ok(PodTemplateSpec {
        metadata: Some(ObjectMeta {
            // No role label here: the operator sets it on each pod, and a template change
            // would roll every pod.
            labels: Some(pod_labels(instance)),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            containers,
            volumes: Some(volumes(instance)),
            security_context: Some(pod_security_context()),
            // Valkey never talks to the API server.
            automount_service_account_token: Some(false),
            // Every Service of the namespace as env vars is noise at best, a startup cost at worst.
            enable_service_links: Some(false),
            termination_grace_period_seconds: Some(TERMINATION_GRACE_SECONDS),
            affinity: Some(spec.affinity.clone().unwrap_or_else(|| spread(instance))),
            node_selector: spec.node_selector.clone(),
            tolerations: spec.tolerations.clone(),
            ..PodSpec::default()
        }),
    })
}

fn config_hash(instance: &Instance, facts: &Facts) -> Result<String, BuildError> {
    Ok(conf::config_hash(
        &conf::valkey_conf(instance)?,
        &conf::start_sh(instance),
        // The instance user's password is rotated live (see reconcile::rotation): a placeholder
        // keeps it out of the hash, so a new password rolls no pod.
        &conf::auth_conf(
            instance,
            "",
            None,
            &facts.operator_password,
            &facts.metrics_password,
        ),
    ))
}

fn pod_labels(instance: &Instance) -> BTreeMap<String, String> {
    let mut pod_labels = instance.labels();
    pod_labels.insert(labels::COMPONENT.to_owned(), COMPONENT.to_owned());
    pod_labels
}

/// The default affinity: prefer one pod per node, so one node failure takes one pod; only a
/// preference, so a small cluster still runs every replica.
fn spread(instance: &Instance) -> Affinity {
    Affinity {
        pod_anti_affinity: Some(PodAntiAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![
                WeightedPodAffinityTerm {
                    weight: 100,
                    pod_affinity_term: PodAffinityTerm {
                        label_selector: Some(instance.selector()),
                        topology_key: "kubernetes.io/hostname".to_owned(),
                        ..PodAffinityTerm::default()
                    },
                },
            ]),
            ..PodAntiAffinity::default()
        }),
        ..Affinity::default()
    }
}

fn container(instance: &Instance) -> Container {
    let spec = &instance.valkey.spec;
    Container {
        name: CONTAINER.to_owned(),
        image: Some(spec.image.clone()),
        command: Some(vec![
            "sh".to_owned(),
            format!("{CONFIG_DIR}/{START_SH_KEY}"),
        ]),
        ports: Some(vec![ContainerPort {
            name: Some(PORT_NAME.to_owned()),
            container_port: PORT,
            protocol: Some("TCP".to_owned()),
            ..ContainerPort::default()
        }]),
        env: Some(env(instance)),
        resources: Some(resources(instance)),
        readiness_probe: Some(readiness_probe(&spec.user)),
        liveness_probe: Some(liveness_probe(&spec.user)),
        security_context: Some(container_security_context()),
        volume_mounts: Some(volume_mounts()),
        // A container that dies with nothing in /dev/termination-log (valkey-server never
        // writes it) gets the tail of its log there, so the operator can say why it crashed
        // without reading logs. valkey-server logs no password; the one exception (a config
        // error quoting a line of auth.conf) is withheld by status::pods.
        termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
        ..Container::default()
    }
}

/// The password reaches valkey-cli through the environment (both names, so valkey-cli and
/// redis-cli pick it up) and never through argv, where any process listing would show it.
fn env(instance: &Instance) -> Vec<EnvVar> {
    let (secret, key) = password_secret(instance);
    let password = |name: &str| EnvVar {
        name: name.to_owned(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.clone(),
                key: key.clone(),
                optional: Some(false),
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    };
    vec![
        EnvVar {
            name: POD_NAME_ENV.to_owned(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "metadata.name".to_owned(),
                    ..ObjectFieldSelector::default()
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        },
        password("VALKEYCLI_AUTH"),
        password("REDISCLI_AUTH"),
    ]
}

/// The Secret and key holding the password: the user's, or the generated one.
fn password_secret(instance: &Instance) -> (String, String) {
    match &instance.valkey.spec.password_secret {
        Some(secret) => (secret.name.clone(), secret.key.clone()),
        None => (
            instance.names.generated_secret(),
            defaults::PASSWORD_KEY.to_owned(),
        ),
    }
}

/// Requests as asked; the memory limit equals the request (going over it is an OOM kill either
/// way, and maxmemory is derived from it). No CPU limit: throttling a single-threaded server
/// only adds latency.
fn resources(instance: &Instance) -> ResourceRequirements {
    let resource = &instance.valkey.spec.resource;
    let quantity = |q: &str| Quantity(q.to_owned());
    let mut requests = BTreeMap::from([
        ("cpu".to_owned(), quantity(&resource.cpu)),
        ("memory".to_owned(), quantity(&resource.memory)),
    ]);
    if let Some(storage) = &resource.storage {
        requests.insert("ephemeral-storage".to_owned(), quantity(storage));
    }
    ResourceRequirements {
        limits: Some(BTreeMap::from([(
            "memory".to_owned(),
            quantity(&resource.memory),
        )])),
        requests: Some(requests),
        ..ResourceRequirements::default()
    }
}

/// Ready once an authenticated PING answers PONG (so a wrong password shows as not ready). The
/// probes log in through cli.sh, with the password of auth/password (or auth/old-password): those
/// files follow a password rotation, the container's environment does not.
fn readiness_probe(user: &str) -> Probe {
    Probe {
        initial_delay_seconds: Some(5),
        period_seconds: Some(5),
        timeout_seconds: Some(3),
        failure_threshold: Some(3),
        ..cli_probe(
            "readiness",
            &format!(
                r#"test "$(sh {CONFIG_DIR}/{CLI_SH_KEY} -h 127.0.0.1 -p {PORT} ping)" = PONG"#
            ),
            user,
        )
    }
}

/// Alive while the server answers at all: loading a large dataset (LOADING), running a long
/// script (BUSY) or waiting for its primary (MASTERDOWN) must not get it killed and restarted.
fn liveness_probe(user: &str) -> Probe {
    Probe {
        initial_delay_seconds: Some(30),
        period_seconds: Some(10),
        timeout_seconds: Some(5),
        failure_threshold: Some(6),
        ..cli_probe(
            "liveness",
            &format!(
                r#"case "$(sh {CONFIG_DIR}/{CLI_SH_KEY} -h 127.0.0.1 -p {PORT} ping 2>&1)" in *PONG*|*LOADING*|*BUSY*|*MASTERDOWN*) exit 0 ;; esac; exit 1"#
            ),
            user,
        )
    }
}

/// `sh -c SCRIPT NAME USER`: the user is `$1`, an argument rather than text in the script, so
/// no user name can change what the script does.
fn cli_probe(name: &str, script: &str, user: &str) -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(["sh", "-c", script, name, user].map(str::to_owned).to_vec()),
        }),
        ..Probe::default()
    }
}

fn pod_security_context() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(VALKEY_UID),
        run_as_group: Some(VALKEY_UID),
        // Volumes (the data claim, the config files) become group-accessible to valkey.
        fs_group: Some(VALKEY_UID),
        // Skips re-chowning a large data volume at every start once its ownership is right.
        fs_group_change_policy: Some("OnRootMismatch".to_owned()),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_owned(),
            ..SeccompProfile::default()
        }),
        ..PodSecurityContext::default()
    }
}

pub(super) fn container_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_owned()]),
            ..Capabilities::default()
        }),
        // valkey writes only to /data (and tools to /tmp), both volumes.
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        ..SecurityContext::default()
    }
}

fn volume_mounts() -> Vec<VolumeMount> {
    let mount = |name: &str, path: &str, read_only: bool| VolumeMount {
        name: name.to_owned(),
        mount_path: path.to_owned(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    };
    vec![
        mount(CONFIG_VOLUME, CONFIG_DIR, true),
        mount(DATA_VOLUME, DATA_DIR, false),
        mount(TMP_VOLUME, "/tmp", false),
    ]
}

fn volumes(instance: &Instance) -> Vec<Volume> {
    let mut volumes = vec![config_volume(instance), empty_dir(TMP_VOLUME)];
    if !instance.valkey.spec.volume.enabled {
        volumes.push(empty_dir(DATA_VOLUME));
    }
    volumes
}

/// One projected volume for the ConfigMap and the ACL Secret: a Secret mounted inside a
/// ConfigMap mount would need a mount point in a read-only volume, and subPath mounts never see
/// updates (the start script must read the current `primary` after a failover).
fn config_volume(instance: &Instance) -> Volume {
    let item = |key: &str, path: &str| KeyToPath {
        key: key.to_owned(),
        path: path.to_owned(),
        ..KeyToPath::default()
    };
    let config_map = ConfigMapProjection {
        name: instance.names.config_map(),
        items: Some(
            [
                VALKEY_CONF_KEY,
                START_SH_KEY,
                CLI_SH_KEY,
                PRIMARY_KEY,
                INITIALIZED_KEY,
                MIN_REPLICAS_KEY,
            ]
            .map(|key| item(key, key))
            .to_vec(),
        ),
        optional: Some(false),
    };
    let secret = SecretProjection {
        name: instance.names.acl_secret(),
        items: Some(vec![
            item(AUTH_CONF_KEY, AUTH_CONF_PATH),
            item(PASSWORD_KEY, PASSWORD_PATH),
            item(OLD_PASSWORD_KEY, OLD_PASSWORD_PATH),
        ]),
        optional: Some(false),
    };
    Volume {
        name: CONFIG_VOLUME.to_owned(),
        projected: Some(ProjectedVolumeSource {
            // Owner root, group valkey (fsGroup): readable by valkey, by nobody else.
            default_mode: Some(0o440),
            sources: Some(vec![
                VolumeProjection {
                    config_map: Some(config_map),
                    ..VolumeProjection::default()
                },
                VolumeProjection {
                    secret: Some(secret),
                    ..VolumeProjection::default()
                },
            ]),
            ..ProjectedVolumeSource::default()
        }),
        ..Volume::default()
    }
}

fn empty_dir(name: &str) -> Volume {
    Volume {
        name: name.to_owned(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    }
}
