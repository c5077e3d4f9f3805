//! Live password rotation, the acting part (the decision is [`crate::rotation`]): read the
//! record from the ACL Secret, and while a rotation runs, carry its steps out on every pod, as
//! the instance's own user (the operator's ACL user may not change ACLs), logging in with the
//! new password or, where a pod does not know it yet, a recorded older one.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::{Api, ResourceExt};
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use super::Error;
use super::failover::POD_TIMEOUT;
use crate::api::names::{ObjectNames, ROTATION_STARTED_ANNOTATION};
use crate::api::{PasswordRotation, RotationPhase, Valkey};
use crate::desired::{OLD_PASSWORD_KEY, PASSWORD_KEY, PORT};
use crate::replication::{Conn, Target};
use crate::rotation::{self, Plan, Record};

/// How soon to look again while pods still lack a step.
const RETRY: Duration = Duration::from_secs(5);

/// What this reconcile decided and did.
pub struct Step {
    /// For the builders: the old password to keep, and the start to record (both `None` when
    /// no rotation runs, or it just completed).
    pub old_password: Option<String>,
    pub started: Option<String>,
    /// For the status.
    pub status: PasswordRotation,
    pub requeue_after: Option<Duration>,
}

/// The record in the live ACL Secret (`None` when there is none, or it has no `password`).
pub async fn record(secrets: &Api<Secret>, valkey: &Valkey) -> Result<Option<Record>, Error> {
    let name = ObjectNames::new(&valkey.name_any()).acl_secret();
    let Some(secret) = secrets.get_opt(&name).await? else {
        return Ok(None);
    };
    let key = |key: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
    };
    let Some(password) = key(PASSWORD_KEY) else {
        return Ok(None);
    };
    let started = secret
        .annotations()
        .get(ROTATION_STARTED_ANNOTATION)
        .cloned();
    Ok(Some(Record::parse(
        &password,
        key(OLD_PASSWORD_KEY).as_deref(),
        started.as_deref(),
    )))
}

/// Decides, and while a rotation runs carries its due steps out on `pods` (the instance's pods),
/// the primary first.
pub async fn run(
    valkey: &Valkey,
    record: Option<&Record>,
    password: &str,
    secret_resource_version: Option<String>,
    pods: &[Pod],
    primary: Option<&str>,
) -> Step {
    let now = Timestamp::now();
    let plan = rotation::plan(record, password, now);
    let previous = valkey
        .status
        .as_ref()
        .and_then(|s| s.password_rotation.clone());
    if !plan.rotating() {
        return Step {
            old_password: None,
            started: None,
            status: PasswordRotation {
                phase: RotationPhase::Complete,
                secret_resource_version,
                started_at: previous.as_ref().and_then(|p| p.started_at.clone()),
                completed_at: previous.and_then(|p| p.completed_at),
                message: String::new(),
            },
            requeue_after: None,
        };
    }
    let mut ordered: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    ordered.sort_by_key(|p| Some(p.name_any().as_str()) != primary);
    let user = &valkey.spec.user;
    let mut missing = Vec::new();
    let mut done = 0usize;
    for pod in &ordered {
        match on_pod(pod, user, &plan).await {
            Ok(()) => done += 1,
            Err(why) => {
                warn!(pod = %pod.name_any(), error = %why, "password rotation: a step failed on this pod; retrying");
                missing.push(pod.name_any());
            }
        }
    }
    let expected = usize::try_from(valkey.spec.replicas).unwrap_or(0);
    let all = missing.is_empty() && done >= expected;
    let (old, started) = plan.after(all);
    let completed = plan.remove_others && all;
    let started_at = plan.started.map(Time);
    let message = if completed {
        String::new()
    } else if !missing.is_empty() || done < expected {
        format!(
            "{done} of {expected} pods took the new password; waiting for {}",
            if missing.is_empty() {
                "the missing pods to run".to_owned()
            } else {
                missing.join(", ")
            }
        )
    } else {
        let left = rotation::until_removal(&plan, now).unwrap_or_default();
        format!(
            "every pod accepts the new password; the old one is removed in {}s, once every pod's mounted password file is current",
            left.as_secs()
        )
    };
    if completed {
        info!("password rotation complete: every pod accepts only the new password");
    }
    // Once every pod took the new password, nothing is due before the grace has passed.
    let requeue_after = (!completed).then(|| match rotation::until_removal(&plan, now) {
        Some(left) if all => left.max(Duration::from_secs(1)),
        _ => RETRY,
    });
    Step {
        old_password: old,
        started: started.map(|t| t.to_string()),
        status: PasswordRotation {
            phase: if completed {
                RotationPhase::Complete
            } else {
                RotationPhase::Rotating
            },
            secret_resource_version,
            started_at,
            completed_at: if completed {
                Some(Time(now))
            } else {
                previous.and_then(|p| p.completed_at)
            },
            message,
        },
        requeue_after,
    }
}

/// The due steps on one pod; `Err` says why not (never with a password).
async fn on_pod(pod: &Pod, user: &str, plan: &Plan) -> Result<(), String> {
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .ok_or("no pod IP yet")?;
    let port = u16::try_from(PORT).unwrap_or(6379);
    let Some(new) = plan.logins.first() else {
        return Err("no password".to_owned());
    };
    let mut conn = None;
    let mut refused = Vec::new();
    for (i, password) in plan.logins.iter().enumerate() {
        let target = Target {
            host: ip.clone(),
            port,
            user: user.to_owned(),
            password: password.clone(),
            timeout: POD_TIMEOUT,
        };
        match Conn::open(&target).await {
            Ok(c) => {
                conn = Some(c);
                break;
            }
            Err(e) => refused.push(format!(
                "{} password: {e}",
                if i == 0 { "the new" } else { "an older" }
            )),
        }
    }
    let conn = conn.ok_or_else(|| format!("cannot log in: {}", refused.join("; ")))?;
    conn.acl_add_password(user, new)
        .await
        .map_err(|e| e.to_string())?;
    conn.set_masterauth(new).await.map_err(|e| e.to_string())?;
    if plan.remove_others {
        let keep = sha256_hex(new);
        for hash in conn
            .acl_password_hashes(user)
            .await
            .map_err(|e| e.to_string())?
        {
            if !hash.eq_ignore_ascii_case(&keep) {
                conn.acl_remove_password_hash(user, &hash)
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
    }
    Ok(())
}

/// Valkey's own password hash (what `ACL GETUSER` lists and `!<hash>` removes).
pub fn sha256_hex(password: &str) -> String {
    use std::fmt::Write as _;
    Sha256::digest(password.as_bytes())
        .iter()
        .fold(String::new(), |mut hex, b| {
            let _ = write!(hex, "{b:02x}");
            hex
        })
}
