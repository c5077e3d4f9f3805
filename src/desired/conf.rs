//! The files valkey-server reads: valkey.conf (no secrets, in the ConfigMap), auth.conf (the
//! ACL and replication credentials, in an operator-owned Secret) and the start script.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use sha2::{Digest, Sha256};

use super::instance::Instance;
use super::{BuildError, quantity};
use crate::api::names::{METRICS_USER, OPERATOR_USER};
use crate::api::{OPERATOR_OWNED_CONFIG_KEYS, ValkeySpec, directives};

pub const PORT: i32 = 6379;
/// Where the projected config volume (ConfigMap and ACL Secret) is mounted.
pub const CONFIG_DIR: &str = "/etc/valkey";
pub const DATA_DIR: &str = "/data";
pub const VALKEY_CONF_KEY: &str = "valkey.conf";
pub const START_SH_KEY: &str = "start.sh";
/// ConfigMap key holding the name of the pod that starts as primary.
pub const PRIMARY_KEY: &str = "primary";
/// ConfigMap key saying (`true`) that the instance has run with a primary and replicas before,
/// so its data lives on: a primary that finds its data directory empty then refuses to start
/// (the boot guard) instead of serving, and replicating, an empty dataset.
pub const INITIALIZED_KEY: &str = "initialized";
/// ConfigMap key holding the `min-replicas-to-write` every pod starts with (spec.fencing,
/// 0 for a standalone instance). A key of its own, read at start, so scaling does not roll the
/// pods; the operator sets the running primary's value live.
pub const MIN_REPLICAS_KEY: &str = "min-replicas-to-write";
/// Files in the data directory that hold a dataset (the AOF directory, an RDB snapshot).
pub const DATA_FILES: &[&str] = &["appendonlydir", "dump.rdb"];
pub const AUTH_CONF_KEY: &str = "auth.conf";
/// auth.conf's path relative to [`CONFIG_DIR`].
pub const AUTH_CONF_PATH: &str = "auth/auth.conf";
/// Key of the ACL Secret holding the instance user's password (the new one while a rotation
/// runs): what the probes and `kubectl valkey cli` log in with (through [`CLI_SH_KEY`]), and,
/// with [`OLD_PASSWORD_KEY`], the operator's record of a password rotation in progress.
pub const PASSWORD_KEY: &str = "password";
/// [`PASSWORD_KEY`]'s path relative to [`CONFIG_DIR`].
pub const PASSWORD_PATH: &str = "auth/password";
/// Key of the ACL Secret holding, while a password rotation runs, the password the pods ran
/// with before it (empty otherwise: a projected key must exist).
pub const OLD_PASSWORD_KEY: &str = "old-password";
/// [`OLD_PASSWORD_KEY`]'s path relative to [`CONFIG_DIR`].
pub const OLD_PASSWORD_PATH: &str = "auth/old-password";
/// ConfigMap key of the script that runs valkey-cli as the instance's user with a password the
/// server accepts (from [`PASSWORD_PATH`] or [`OLD_PASSWORD_PATH`], which follow a rotation
/// without a restart, unlike the container's environment).
pub const CLI_SH_KEY: &str = "cli.sh";

/// Share of the memory limit given to the dataset (`maxmemory`), in percent.
///
/// `maxmemory` only bounds the dataset; the container also holds allocator fragmentation,
/// client and replication buffers, the replication backlog, and copy-on-write pages while a
/// forked child writes a snapshot, an AOF rewrite or a full sync. Going over the limit gets the
/// pod OOM-killed (losing data without a volume), so a quarter is kept as headroom.
pub const MAXMEMORY_PERCENT: u128 = 75;

/// valkey.conf for the instance.
pub(crate) fn valkey_conf(instance: &Instance) -> Result<String, BuildError> {
    let spec = &instance.valkey.spec;
    check_user_config(&spec.config)?;
    if directives::checks_image(&spec.image) {
        let problems = directives::check(&spec.config);
        if !problems.is_empty() {
            return Err(BuildError::RefusedConfig { problems });
        }
    }
    let mut settings = default_settings(spec)?;
    settings.extend(spec.config.clone());

    let mut conf = format!(
        "# valkey.conf of Valkey {}/{}, rendered by valkey-operator: set spec.config instead of editing it.\n",
        instance.namespace, instance.name
    );
    // Auth is always on (auth.conf), so protected mode never gets in the way of remote clients;
    // it stays on as a safety net should the default user ever lose its password.
    for (key, value) in [
        ("port", PORT.to_string()),
        ("bind", "* -::*".to_owned()),
        ("protected-mode", "yes".to_owned()),
        ("dir", DATA_DIR.to_owned()),
        ("include", format!("{CONFIG_DIR}/{AUTH_CONF_PATH}")),
    ] {
        conf.push_str(&directive(key, &value));
    }
    for (key, value) in &settings {
        conf.push_str(&directive(key, value));
    }
    Ok(conf)
}

/// Directives the operator picks but `spec.config` may override (one line per key, no repeats).
fn default_settings(spec: &ValkeySpec) -> Result<BTreeMap<String, String>, BuildError> {
    let mut settings = BTreeMap::new();
    let mut set = |key: &str, value: &str| settings.insert(key.to_owned(), value.to_owned());
    // On an emptyDir too: a container restart inside the same pod keeps the emptyDir, and so
    // comes back with its data instead of empty.
    set("appendonly", "yes");
    set("appendfsync", "everysec");
    // Fencing: how recent a replica's acknowledgement must be to count towards
    // min-replicas-to-write (which start.sh passes and the operator sets live).
    set(
        "min-replicas-max-lag",
        &spec.fencing.max_lag_seconds.clamp(1, 60).to_string(),
    );
    set("replica-serve-stale-data", "yes");
    set("replica-read-only", "yes");
    set("maxmemory", &maxmemory(&spec.resource.memory)?.to_string());
    Ok(settings)
}

fn maxmemory(memory: &str) -> Result<u128, BuildError> {
    let limit = quantity::bytes(memory).ok_or_else(|| BuildError::InvalidMemory(memory.into()))?;
    // 0 would mean "no limit", the opposite of a tiny one.
    Ok((limit * MAXMEMORY_PERCENT / 100).max(1))
}

/// The CRD refuses these already; checking again keeps a line break or an operator-owned
/// directive out of valkey.conf even if the CRD's rules were bypassed (e.g. an old CRD).
fn check_user_config(config: &BTreeMap<String, String>) -> Result<(), BuildError> {
    for (key, value) in config {
        let invalid = |reason| BuildError::InvalidConfig {
            key: key.clone(),
            reason,
        };
        let key_ok = key.len() <= 64
            && key.starts_with(|c: char| c.is_ascii_lowercase())
            && key
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !key_ok {
            return Err(invalid(
                "not a valkey.conf directive name (lowercase letters, digits and '-')",
            ));
        }
        if OPERATOR_OWNED_CONFIG_KEYS.contains(&key.as_str()) {
            return Err(invalid(
                "the operator manages this directive; remove it from spec.config",
            ));
        }
        if value
            .chars()
            .any(|c| c.is_control() || matches!(c, '"' | '\'' | '\\'))
        {
            return Err(invalid(
                "values must be plain words: no quotes, backslashes or control characters",
            ));
        }
    }
    Ok(())
}

/// `key value`, or `key ""` for an empty value (valkey reads a bare `key` as a syntax error).
fn directive(key: &str, value: &str) -> String {
    if value.trim().is_empty() {
        format!("{key} \"\"\n")
    } else {
        format!("{key} {value}\n")
    }
}

/// auth.conf: the ACL and the credentials replicas use towards the primary.
///
/// While a password rotation is in progress (`old_password`), the user holds both passwords and
/// replication authenticates with the old one, which every pod accepts until the operator
/// removes it at the end; the operator moves the running pods to the new one live.
pub(crate) fn auth_conf(
    instance: &Instance,
    password: &str,
    old_password: Option<&str>,
    operator_password: &str,
    metrics_password: &str,
) -> String {
    let user = &instance.valkey.spec.user;
    let mut conf = format!(
        "# ACL of Valkey {}/{}, rendered by valkey-operator from its password Secret.\n",
        instance.namespace, instance.name
    );
    let passwords: String = old_password
        .into_iter()
        .chain([password])
        .map(|p| format!(" {}", quote(format!(">{p}").as_bytes())))
        .collect();
    if user != "default" {
        // `resetpass` also drops `nopass`: the default user could not log in even if switched on.
        conf.push_str("user default off resetpass -@all\n");
    }
    conf.push_str(&format!("user {user} on{passwords} ~* &* +@all\n"));
    conf.push_str(&operator_user(operator_password));
    if instance.valkey.spec.metrics.enabled {
        conf.push_str(&metrics_user(metrics_password));
    }
    // Every pod may be a replica, so each carries the credentials to sync from the primary.
    conf.push_str(&format!("masteruser {}\n", quote(user.as_bytes())));
    let masterauth = old_password.unwrap_or(password);
    conf.push_str(&format!("masterauth {}\n", quote(masterauth.as_bytes())));
    conf
}

/// The [`CLI_SH_KEY`] script: `sh cli.sh [ARGS]` runs `valkey-cli --user <spec.user> [ARGS]`
/// with the password of [`PASSWORD_PATH`], or of [`OLD_PASSWORD_PATH`] when this server does not
/// accept that one yet (a rotation in progress). The password goes through the environment,
/// never argv.
pub(crate) fn cli_sh(instance: &Instance) -> String {
    let user = shell_quote(&instance.valkey.spec.user);
    format!(
        r#"# valkey-cli as the instance's user, rendered by valkey-operator.
user={user}
p=$(cat {CONFIG_DIR}/{PASSWORD_PATH})
old=$(cat {CONFIG_DIR}/{OLD_PASSWORD_PATH} 2>/dev/null || true)
if [ -n "$old" ]; then
  case "$(VALKEYCLI_AUTH=$p REDISCLI_AUTH=$p valkey-cli -h 127.0.0.1 -p {PORT} --user "$user" ping 2>&1)" in
    *WRONGPASS*|*NOAUTH*) p=$old ;;
  esac
fi
VALKEYCLI_AUTH=$p REDISCLI_AUTH=$p exec valkey-cli --user "$user" "$@"
"#
    )
}

/// `text` as one single-quoted shell word.
fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r#"'\''"#))
}

/// What the operator may run, and why; no key and no channel:
/// - `ping`: the health check of each primary, about once a second;
/// - `info`: role, replication offsets, link status and key counts (`INFO replication`,
///   `INFO keyspace`);
/// - `replicaof`: promote a replica (`REPLICAOF NO ONE`) and point the others at it;
/// - `failover`: planned switchover (`FAILOVER TO host port TIMEOUT ms`);
/// - `config|get`, `config|set`: fencing (`min-replicas-to-write`) on the running primary;
/// - `client|kill`: drop the clients of a demoted primary (`CLIENT KILL TYPE normal`);
/// - `client|pause`: hold the writes of a primary that still answers while a replica takes over
///   (`CLIENT PAUSE ms WRITE`), so it acknowledges nothing the new primary lacks.
pub const OPERATOR_COMMANDS: &[&str] = &[
    "ping",
    "info",
    "replicaof",
    "failover",
    "config|get",
    "config|set",
    "client|kill",
    "client|pause",
];

/// The operator's own ACL user ([`OPERATOR_USER`]): only [`OPERATOR_COMMANDS`].
fn operator_user(password: &str) -> String {
    let commands: String = OPERATOR_COMMANDS.iter().map(|c| format!(" +{c}")).collect();
    format!(
        "user {OPERATOR_USER} on {} resetkeys resetchannels -@all{commands}\n",
        quote(format!(">{password}").as_bytes())
    )
}

/// What the metrics exporter (spec.metrics) may run, and why; no key and no channel. The
/// exporter has a user of its own rather than the instance's password: it needs no data, and a
/// sidecar holding the admin password would widen who can read and write every key.
/// - `ping`, `info`: `INFO ALL` is where nearly every metric comes from (role, replication
///   offsets and lag, connected replicas, memory, clients, keyspace, command stats);
/// - `client|setname`: names its connection `redis_exporter` in `CLIENT LIST`;
/// - `latency|latest`, `latency|histogram`: the latency metrics;
/// - `slowlog|len`: the slow log's length (not `slowlog|get`: entries carry command arguments,
///   i.e. data).
///
/// Not `config|get`: `CONFIG GET *` would hand out masterauth, the instance's password. The
/// sidecar tells the exporter to skip it (REDIS_EXPORTER_CONFIG_COMMAND=-), so the
/// `redis_config_*` series are absent; `redis_memory_max_bytes` (from INFO) remains.
pub const METRICS_COMMANDS: &[&str] = &[
    "ping",
    "info",
    "client|setname",
    "latency|latest",
    "latency|histogram",
    "slowlog|len",
];

/// The exporter's ACL user ([`METRICS_USER`]): only [`METRICS_COMMANDS`].
fn metrics_user(password: &str) -> String {
    let commands: String = METRICS_COMMANDS.iter().map(|c| format!(" +{c}")).collect();
    format!(
        "user {METRICS_USER} on {} resetkeys resetchannels -@all{commands}\n",
        quote(format!(">{password}").as_bytes())
    )
}

/// One double-quoted argument that valkey's config parser (sdssplitargs) reads back as exactly
/// `bytes`: anything but printable ASCII, `"` and `\` is written as `\xHH`, so no password can
/// end the line, the argument or the quoted string.
pub(crate) fn quote(bytes: &[u8]) -> String {
    let mut quoted = String::with_capacity(bytes.len() + 2);
    quoted.push('"');
    for &byte in bytes {
        match byte {
            b'"' | b'\\' => {
                quoted.push('\\');
                quoted.push(char::from(byte));
            }
            b' '..=b'~' => quoted.push(char::from(byte)),
            _ => {
                let _ = write!(quoted, "\\x{byte:02x}");
            }
        }
    }
    quoted.push('"');
    quoted
}

/// The container's entrypoint. The pod decides at every start whether it is the primary, from
/// the ConfigMap's `primary` key: the operator changes that key on failover without rolling the
/// pods, so a restarted former primary comes back as a replica of the new one.
///
/// The boot guard: the primary of an instance that has run before (`initialized`) refuses to
/// start when its data directory holds no dataset (an emptyDir of a new pod, a lost volume):
/// serving it would make the replicas sync the empty dataset and lose every copy. It exits
/// instead; the operator sees the primary fail and promotes a replica that holds the data.
pub(crate) fn start_sh(instance: &Instance) -> String {
    let headless = instance.names.headless_service();
    let namespace = instance.namespace;
    let data_files = DATA_FILES
        .iter()
        .map(|f| format!("[ ! -e {DATA_DIR}/{f} ]"))
        .collect::<Vec<_>>()
        .join(" && ");
    format!(
        r#"# Entrypoint of the valkey container, rendered by valkey-operator.
set -eu
: "${{POD_NAME:?POD_NAME must name this pod}}"
primary=$(cat {CONFIG_DIR}/{PRIMARY_KEY} 2>/dev/null || true)
if [ -z "$primary" ]; then
  # Starting as a primary without knowing the real one could split the data in two.
  echo "no primary pod named in {CONFIG_DIR}/{PRIMARY_KEY}; refusing to start" >&2
  exit 1
fi
min_replicas=$(cat {CONFIG_DIR}/{MIN_REPLICAS_KEY} 2>/dev/null || true)
case "$min_replicas" in ''|*[!0-9]*) min_replicas=0 ;; esac
if [ "$primary" = "$POD_NAME" ]; then
  initialized=$(cat {CONFIG_DIR}/{INITIALIZED_KEY} 2>/dev/null || true)
  if [ "$initialized" = true ] && {data_files}; then
    echo "refusing to start as the primary with no data in {DATA_DIR}: this instance has run before, so its data is on a replica, which the operator promotes" >&2
    exit 1
  fi
  exec valkey-server {CONFIG_DIR}/{VALKEY_CONF_KEY} --min-replicas-to-write "$min_replicas"
fi
exec valkey-server {CONFIG_DIR}/{VALKEY_CONF_KEY} --min-replicas-to-write "$min_replicas" --replicaof "$primary.{headless}.{namespace}.svc" {PORT}
"#
    )
}

/// The stable DNS name of `pod`, through the headless Service: what replicas are pointed at.
/// No cluster domain: `<pod>.<headless>.<namespace>.svc` resolves through the pod's DNS search
/// path (`svc.<domain>`, `<domain>`) whatever the cluster's domain is.
pub fn pod_host(instance: &str, namespace: &str, pod: &str) -> String {
    let headless = crate::api::names::ObjectNames::new(instance).headless_service();
    format!("{pod}.{headless}.{namespace}.svc")
}

/// sha256 (hex) over everything a running valkey-server read at start, so a change of any of
/// them rolls the pods. The caller renders auth.conf with a placeholder for the instance user's
/// password: the operator rotates that one live, without a restart. The `primary` key is left
/// out: failover must not restart every pod.
pub(crate) fn config_hash(valkey_conf: &str, start_sh: &str, auth_conf: &str) -> String {
    let mut hasher = Sha256::new();
    for (name, content) in [
        (VALKEY_CONF_KEY, valkey_conf),
        (START_SH_KEY, start_sh),
        (AUTH_CONF_KEY, auth_conf),
    ] {
        // Length-prefixed, so moving text from one file to the next changes the hash too.
        hasher.update(name.as_bytes());
        hasher.update((content.len() as u64).to_le_bytes());
        hasher.update(content.as_bytes());
    }
    hasher.finalize().iter().fold(String::new(), |mut hex, b| {
        let _ = write!(hex, "{b:02x}");
        hex
    })
}

#[cfg(test)]
mod tests {
    use super::quote;

    #[test]
    fn quote_escapes_everything_the_parser_could_misread() {
        assert_eq!(quote(b"plain"), r#""plain""#);
        assert_eq!(quote(b"a b#c"), r#""a b#c""#);
        assert_eq!(quote(b"q\"b\\"), r#""q\"b\\""#);
        assert_eq!(quote(b"\n\r\t\0\x7f\xff"), r#""\x0a\x0d\x09\x00\x7f\xff""#);
    }
}
