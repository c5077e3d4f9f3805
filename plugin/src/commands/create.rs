//! `create NAME`: builds the Valkey from the flags, checks it with the CRD's own rules, and
//! creates it (with the password Secret when the password comes from stdin).

use std::collections::BTreeMap;

use anyhow::Context;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Resource};
use serde_json::{Map, Value, json};
use valkey_core::api::names::{self, ObjectNames};
use valkey_core::api::{ReclaimPolicy, Valkey, ValkeySpec, defaults};
use valkey_core::api::{directives, validation};

use super::wait;
use crate::cli::{CreateArgs, DryRun, GlobalArgs, ObjectFormat, ReclaimPolicyArg};
use crate::error::{Problem, UsageError};
use crate::output;
use crate::session::{FIELD_MANAGER, Session};
use crate::{kubeconfig, terminal};

pub async fn run(args: CreateArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let mut valkey = desired(&args)?;
    let dry_run = args.dry_run.unwrap_or(DryRun::None);
    if dry_run == DryRun::Client {
        valkey.metadata.namespace = kubeconfig::offline_namespace(global);
        if args.password_stdin {
            eprintln!(
                "(dry run: the password would be read from stdin into the Secret {}; it is not read now)",
                ObjectNames::new(&args.name).generated_secret()
            );
        }
        return output::print_object(&valkey, args.output.unwrap_or(ObjectFormat::Yaml));
    }
    let password = match args.password_stdin {
        true => Some(terminal::read_password()?),
        false => None,
    };
    let session = Session::connect(global).await?;
    valkey.metadata.namespace = Some(session.namespace.clone());
    let server_dry_run = dry_run == DryRun::Server;
    let created = create(&session, &valkey, password.as_deref(), server_dry_run).await?;
    match args.output {
        Some(format) => output::print_object(&created, format)?,
        None => {
            let suffix = if server_dry_run {
                " (server dry run)"
            } else {
                ""
            };
            if password.is_some() {
                output::print(&format!(
                    "secret/{} created{suffix}",
                    ObjectNames::new(&args.name).generated_secret()
                ))?;
            }
            output::print(&format!(
                "valkey.database.kuberly.io/{} created{suffix}",
                args.name
            ))?;
        }
    }
    if args.wait && !server_dry_run {
        wait::until_running(&session, &args.name, args.timeout).await?;
    }
    Ok(())
}

/// The Valkey the flags describe, with the API's defaults filled in, checked against the CRD's
/// rules. A violation is a usage error: nothing is sent to the cluster.
pub fn desired(args: &CreateArgs) -> Result<Valkey, UsageError> {
    let spec = spec_json(args)?;
    let spec: ValkeySpec = serde_json::from_value(Value::Object(spec))
        .map_err(|e| UsageError::new(format!("invalid flags: {e}")))?;
    let valkey = Valkey::new(&args.name, spec);
    let violations = validation::validate(&valkey, None);
    if violations.is_empty() {
        return refused_config(&valkey).map(|()| valkey);
    }
    let messages: Vec<String> = violations.iter().map(ToString::to_string).collect();
    let flags: Vec<&str> = violations
        .iter()
        .filter_map(|v| flag_of(&v.field, &v.message))
        .collect();
    let mut err = UsageError::new(format!(
        "the Valkey {:?} would be refused: {}",
        args.name,
        messages.join("; ")
    ));
    if !flags.is_empty() {
        err = err.hint(format!("fix {}", flags.join(", ")));
    }
    Err(err)
}

/// `--config` entries the image's valkey-server would refuse at boot (the operator refuses them
/// too, but only after the Valkey exists). Only checked for images of the directive table's
/// release; see `valkey_core::api::directives`.
fn refused_config(valkey: &Valkey) -> Result<(), UsageError> {
    if !directives::checks_image(&valkey.spec.image) {
        return Ok(());
    }
    let problems = directives::check(&valkey.spec.config);
    if problems.is_empty() {
        return Ok(());
    }
    let messages: Vec<String> = problems.iter().map(ToString::to_string).collect();
    Err(UsageError::new(format!(
        "the Valkey {:?} would not start: {}",
        valkey.metadata.name.as_deref().unwrap_or_default(),
        messages.join("; ")
    ))
    .hint(format!(
        "fix --config (directives of valkey-server {}, the release of {})",
        directives::table().version,
        defaults::IMAGE
    )))
}

/// The flag that sets a field named in a violation (the root rule names metadata.name).
fn flag_of(field: &str, message: &str) -> Option<&'static str> {
    let field = if field.is_empty() { message } else { field };
    let table = [
        ("metadata.name", "NAME"),
        ("spec.replicas", "--replicas"),
        ("spec.image", "--image"),
        ("spec.user", "--admin-user"),
        ("spec.passwordSecret.name", "--password-secret"),
        ("spec.passwordSecret.key", "--password-key"),
        ("spec.volume.storageClassName", "--storage-class"),
        ("spec.volume.storage", "--storage"),
        ("spec.resource.cpu", "--cpu"),
        ("spec.resource.memory", "--memory"),
        ("spec.config", "--config"),
    ];
    table
        .iter()
        .find(|(path, _)| field.starts_with(path))
        .map(|(_, flag)| *flag)
}

fn spec_json(args: &CreateArgs) -> Result<Map<String, Value>, UsageError> {
    let mut spec = Map::new();
    let mut set = |key: &str, value: Option<Value>| {
        if let Some(value) = value {
            spec.insert(key.to_owned(), value);
        }
    };
    set("image", args.image.clone().map(Value::from));
    set("replicas", args.replicas.map(Value::from));
    set("user", args.admin_user.clone().map(Value::from));
    set("passwordSecret", password_secret(args));
    set("volume", Some(volume(args)));
    let mut resource = Map::new();
    if let Some(cpu) = &args.cpu {
        resource.insert("cpu".into(), cpu.clone().into());
    }
    if let Some(memory) = &args.memory {
        resource.insert("memory".into(), memory.clone().into());
    }
    if !resource.is_empty() {
        spec.insert("resource".into(), Value::Object(resource));
    }
    if args.metrics {
        spec.insert(
            "metrics".into(),
            json!({"enabled": true, "serviceMonitor": {"enabled": args.service_monitor}}),
        );
    }
    let config = config(&args.config)?;
    if !config.is_empty() {
        spec.insert("config".into(), json!(config));
    }
    Ok(spec)
}

fn password_secret(args: &CreateArgs) -> Option<Value> {
    if args.password_stdin {
        return Some(json!({
            "name": ObjectNames::new(&args.name).generated_secret(),
            "key": defaults::PASSWORD_KEY,
        }));
    }
    let name = args.password_secret.as_ref()?;
    let key = args
        .password_key
        .as_deref()
        .unwrap_or(defaults::PASSWORD_KEY);
    Some(json!({"name": name, "key": key}))
}

fn volume(args: &CreateArgs) -> Value {
    let mut volume = Map::new();
    volume.insert("enabled".into(), Value::Bool(!args.no_volume));
    if let Some(storage) = &args.storage {
        volume.insert("storage".into(), storage.clone().into());
    }
    if let Some(class) = &args.storage_class {
        volume.insert("storageClassName".into(), class.clone().into());
    }
    if let Some(policy) = args.reclaim_policy {
        let policy = match policy {
            ReclaimPolicyArg::Retain => ReclaimPolicy::Retain,
            ReclaimPolicyArg::Delete => ReclaimPolicy::Delete,
        };
        volume.insert("reclaimPolicy".into(), policy.as_str().into());
    }
    Value::Object(volume)
}

fn config(pairs: &[(String, String)]) -> Result<BTreeMap<String, String>, UsageError> {
    let mut config = BTreeMap::new();
    for (key, value) in pairs {
        if config.insert(key.clone(), value.clone()).is_some() {
            return Err(UsageError::new(format!(
                "--config {key} is given more than once"
            ))
            .hint("give each directive once; a value with spaces is one argument, e.g. --config 'save=900 1 300 10'"));
        }
    }
    Ok(config)
}

/// Creates the Valkey and, with a password, its Secret first (so the operator never sees a
/// reference to a missing Secret), owned by the Valkey once it exists.
async fn create(
    session: &Session,
    valkey: &Valkey,
    password: Option<&str>,
    dry_run: bool,
) -> anyhow::Result<Valkey> {
    let name = valkey.metadata.name.as_deref().unwrap_or_default();
    ensure_absent(session, name).await?;
    let secrets: Api<Secret> = session.api();
    let secret = match password {
        Some(password) => Some(create_secret(session, name, password, dry_run).await?),
        None => None,
    };
    let params = PostParams {
        dry_run,
        field_manager: Some(FIELD_MANAGER.to_owned()),
    };
    let created = match session.valkeys().create(&params, valkey).await {
        Ok(created) => created,
        Err(err) => {
            if let Some(secret) = secret.as_ref().filter(|_| !dry_run) {
                // Leave nothing behind that the next attempt would trip over.
                let secret_name = secret.metadata.name.as_deref().unwrap_or_default();
                let _ = secrets.delete(secret_name, &DeleteParams::default()).await;
            }
            return Err(session
                .explain(err, session.call::<Valkey>("create").name(name))
                .await);
        }
    };
    if let Some(secret) = secret.filter(|_| !dry_run) {
        own(session, &secret, &created).await?;
    }
    Ok(created)
}

async fn ensure_absent(session: &Session, name: &str) -> anyhow::Result<()> {
    let found = session.valkeys().get_opt(name).await;
    let found = session
        .check(found, session.call::<Valkey>("get").name(name))
        .await?;
    match found {
        None => Ok(()),
        Some(_) => Err(Problem::new(format!(
            "Valkey {name:?} already exists in namespace {:?}",
            session.namespace
        ))
        .hint(format!(
            "see it with `kubectl valkey status {name}`; choose another name, or delete it first"
        ))
        .into()),
    }
}

async fn create_secret(
    session: &Session,
    instance: &str,
    password: &str,
    dry_run: bool,
) -> anyhow::Result<Secret> {
    let name = ObjectNames::new(instance).generated_secret();
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(session.namespace.clone()),
            // Not managed-by valkey-operator: the operator must never take it for one of its own.
            labels: Some(BTreeMap::from([
                (names::labels::NAME.to_owned(), names::APP_NAME.to_owned()),
                (names::labels::INSTANCE.to_owned(), instance.to_owned()),
                (
                    names::labels::MANAGED_BY.to_owned(),
                    FIELD_MANAGER.to_owned(),
                ),
            ])),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".to_owned()),
        data: Some(BTreeMap::from([(
            defaults::PASSWORD_KEY.to_owned(),
            ByteString(password.as_bytes().to_vec()),
        )])),
        ..Secret::default()
    };
    let params = PostParams {
        dry_run,
        field_manager: Some(FIELD_MANAGER.to_owned()),
    };
    match session.api::<Secret>().create(&params, &secret).await {
        Ok(created) => Ok(created),
        Err(kube::Error::Api(status)) if status.code == 409 => Err(Problem::new(format!(
            "the Secret {name} already exists in namespace {:?}, so --password-stdin cannot store the password there",
            session.namespace
        ))
        .hint(format!(
            "use the password it holds with --password-secret {name} (instead of --password-stdin), or delete it first: kubectl delete secret {name} -n {}",
            session.namespace
        ))
        .into()),
        Err(err) => Err(session
            .explain(err, session.call::<Secret>("create").name(&name))
            .await),
    }
}

/// Makes the Valkey the owner of the password Secret, so deleting the instance deletes it too.
async fn own(session: &Session, secret: &Secret, owner: &Valkey) -> anyhow::Result<()> {
    let name = secret.metadata.name.as_deref().unwrap_or_default();
    let reference = OwnerReference {
        api_version: Valkey::api_version(&()).into_owned(),
        kind: Valkey::kind(&()).into_owned(),
        name: owner.metadata.name.clone().unwrap_or_default(),
        uid: owner.metadata.uid.clone().unwrap_or_default(),
        ..OwnerReference::default()
    };
    let patch = json!({"metadata": {"ownerReferences": [reference]}});
    let result = session
        .api::<Secret>()
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await;
    session
        .check(result, session.call::<Secret>("patch").name(name))
        .await
        .with_context(|| format!("the Valkey was created, but its Secret {name} is not owned by it and will stay after the Valkey is deleted"))?;
    Ok(())
}
