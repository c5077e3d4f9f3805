//! `rotate-password NAME [--password-stdin]`: a new password for the instance's user, with no
//! pod restarted. The plugin writes the new password (drawn from the operating system's CSPRNG,
//! or read from stdin) into the instance's password Secret (spec.passwordSecret, or the
//! generated `NAME-auth`); the operator adds it on every pod, moves replication to it, and
//! removes the old one once every pod accepts the new one. With `--wait` (the default) the
//! plugin waits until `status.passwordRotation` says Complete for the Secret version it wrote.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use valkey_core::api::names::ObjectNames;
use valkey_core::api::{RotationPhase, Valkey, defaults};
use valkey_core::desired;

use crate::cli::{GlobalArgs, RotatePasswordArgs};
use crate::error::Problem;
use crate::output;
use crate::session::{FIELD_MANAGER, Session};
use crate::terminal;

const POLL: Duration = Duration::from_millis(500);

pub async fn run(args: RotatePasswordArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let password = if args.password_stdin {
        terminal::read_password()?
    } else {
        desired::generate_password()?
    };
    let session = Session::connect(global).await?;
    let valkey = session.get_valkey(&args.name).await?;
    let (secret, key) = password_secret(&valkey, &args.name);
    let secrets = session.api::<Secret>();
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    let data = BTreeMap::from([(key.clone(), ByteString(password.into_bytes()))]);
    let patch = json!({"data": data});
    let result = secrets.patch(&secret, &params, &Patch::Merge(&patch)).await;
    let written = match result {
        Err(kube::Error::Api(e)) if e.code == 404 => {
            return Err(Problem::new(format!(
                "the password Secret {secret} of {} does not exist",
                args.name
            ))
            .hint(if valkey.spec.password_secret.is_some() {
                format!(
                    "spec.passwordSecret names {secret}: create it (key {key:?}) or point spec.passwordSecret at the Secret that holds the password"
                )
            } else {
                "the operator creates it when it first reconciles the instance: is the operator running? `kubectl valkey version` shows it".to_owned()
            })
            .into());
        }
        other => {
            session
                .check(other, session.call::<Secret>("patch").name(&secret))
                .await?
        }
    };
    let version = written.metadata.resource_version.clone();
    eprintln!("wrote a new password into Secret {secret} (key {key:?})");
    if !args.wait {
        return output::print(&format!(
            "{}: the operator moves every pod to the new password; `kubectl valkey status {}` shows the rotation",
            args.name, args.name
        ));
    }
    let started = Instant::now();
    let deadline = started + args.timeout;
    let mut last_message = String::new();
    loop {
        let valkey = session.get_valkey(&args.name).await?;
        let rotation = valkey
            .status
            .as_ref()
            .and_then(|s| s.password_rotation.as_ref());
        if let Some(r) = rotation {
            let ours = version.is_some() && r.secret_resource_version == version;
            if ours && r.phase == RotationPhase::Complete {
                return output::print(&format!(
                    "{}: every pod accepts only the new password (took {}s, no pod restarted by the rotation)",
                    args.name,
                    started.elapsed().as_secs()
                ));
            }
            if ours && !r.message.is_empty() && r.message != last_message {
                eprintln!("{}", r.message);
                last_message = r.message.clone();
            }
        }
        if Instant::now() > deadline {
            return Err(Problem::new(format!(
                "the rotation of {}'s password did not complete within {:?}{}",
                args.name,
                args.timeout,
                if last_message.is_empty() {
                    String::new()
                } else {
                    format!(" ({last_message})")
                }
            ))
            .hint(format!(
                "the new password is in Secret {secret} and the operator goes on with the rotation; `kubectl valkey status {}` shows it",
                args.name
            ))
            .into());
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The Secret and key holding the instance's password.
fn password_secret(valkey: &Valkey, name: &str) -> (String, String) {
    match &valkey.spec.password_secret {
        Some(s) => (s.name.clone(), s.key.clone()),
        None => (
            ObjectNames::new(name).generated_secret(),
            defaults::PASSWORD_KEY.to_owned(),
        ),
    }
}
