//! `report NAME`: a support bundle in a new directory, in the spirit of CloudNativePG's
//! `kubectl cnpg report`: the Valkey, its children, events, each pod's log tail and `INFO`, the
//! rendered status and the versions. No secret value goes in: Secrets are written as their
//! metadata and key names only, and the pods' passwords stay in the pods (valkey-cli logs in
//! through the pod's cli.sh, as `kubectl valkey cli` does).
//!
//! What cannot be collected (no right to read logs, a pod not running) is listed in `errors.txt`
//! and on stderr; the report is still written.

use std::path::{Path, PathBuf};

use anyhow::Context;
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{AttachParams, ListParams, LogParams};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::AsyncReadExt;
use valkey_core::api::Valkey;
use valkey_core::api::names;
use valkey_core::desired::CONTAINER;

use super::status;
use crate::cli::{GlobalArgs, ReportArgs};
use crate::session::Session;
use crate::{output, render, view};

pub async fn run(args: ReportArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let session = Session::connect(global).await?;
    let valkey = session.get_valkey(&args.name).await?;
    let dir = args
        .output_dir
        .clone()
        .unwrap_or_else(|| default_dir(&args.name));
    std::fs::create_dir(&dir).with_context(|| {
        format!(
            "creating the report directory {}: choose another with --output-dir (an existing one is never written into)",
            dir.display()
        )
    })?;
    let mut report = Report {
        dir: dir.clone(),
        errors: Vec::new(),
    };
    report.write_yaml("valkey.yaml", &without_managed_fields(valkey.clone()));
    let pods = match session.instance_pods(&args.name).await {
        Ok(pods) => pods,
        Err(err) => {
            report.failed("pods", &err);
            Vec::new()
        }
    };
    collect_children(&session, &args.name, &pods, &mut report).await;
    let claims = report
        .list::<PersistentVolumeClaim>(&session, &args.name)
        .await;
    report.write_yaml("volumes.yaml", &claims);
    let events = status::events(&session, &status::event_subjects(&valkey, &pods)).await;
    report.write_yaml("events.yaml", &events);
    let instance = view::instance_report(&valkey, &pods, &claims, &events);
    let style = output::style(crate::cli::ColorChoice::Never);
    report.write_text(
        "status.txt",
        &render::report(&instance, Timestamp::now(), style),
    );
    for pod in &pods {
        collect_pod(&session, &valkey, pod, args.log_lines, &mut report).await;
    }
    report.write_text(
        "versions.txt",
        &super::version::text_for(&session, global).await,
    );
    let files = report.finish()?;
    eprintln!(
        "report of {}/{} written to {} ({files} files; Secret values left out)",
        session.namespace,
        args.name,
        dir.display()
    );
    Ok(())
}

fn default_dir(name: &str) -> PathBuf {
    let stamp = Timestamp::now().strftime("%Y%m%dT%H%M%SZ").to_string();
    PathBuf::from(format!("valkey-report-{name}-{stamp}"))
}

/// The StatefulSet, Services, ConfigMap, PDB, pods, and the Secrets without their values.
async fn collect_children(session: &Session, name: &str, pods: &[Pod], report: &mut Report) {
    let statefulsets = report.list::<StatefulSet>(session, name).await;
    report.write_yaml("statefulset.yaml", &statefulsets);
    let services = report.list::<Service>(session, name).await;
    report.write_yaml("services.yaml", &services);
    let config_maps = report.list::<ConfigMap>(session, name).await;
    report.write_yaml("configmap.yaml", &config_maps);
    let pdbs = report.list::<PodDisruptionBudget>(session, name).await;
    report.write_yaml("pdb.yaml", &pdbs);
    let pods: Vec<_> = pods.iter().cloned().map(without_managed_fields).collect();
    report.write_yaml("pods.yaml", &pods);
    let secrets: Vec<_> = report
        .list::<Secret>(session, name)
        .await
        .into_iter()
        .map(secret_outline)
        .collect();
    report.write_yaml("secrets.yaml", &secrets);
}

/// A Secret as its metadata and the names of its keys: never a value.
#[derive(Serialize)]
struct SecretOutline {
    name: String,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    kind: Option<String>,
    keys: Vec<String>,
    labels: std::collections::BTreeMap<String, String>,
}

fn secret_outline(secret: Secret) -> SecretOutline {
    SecretOutline {
        name: secret.name_any(),
        kind: secret.type_.clone(),
        keys: secret
            .data
            .iter()
            .flat_map(|d| d.keys().cloned())
            .chain(secret.string_data.iter().flat_map(|d| d.keys().cloned()))
            .collect(),
        labels: secret.labels().clone(),
    }
}

/// A pod's log tail (and the previous container's, after a restart) and its `INFO`.
async fn collect_pod(
    session: &Session,
    valkey: &Valkey,
    pod: &Pod,
    lines: i64,
    report: &mut Report,
) {
    let name = pod.name_any();
    let pods: Api<Pod> = session.api();
    let restarted = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.iter().find(|c| c.name == CONTAINER))
        .is_some_and(|c| c.restart_count > 0);
    for previous in [false, true] {
        if previous && !restarted {
            continue;
        }
        let params = LogParams {
            container: Some(CONTAINER.to_owned()),
            tail_lines: Some(lines),
            timestamps: true,
            previous,
            ..LogParams::default()
        };
        let file = format!("logs/{name}{}.log", if previous { ".previous" } else { "" });
        match pods.logs(&name, &params).await {
            Ok(text) => report.write_text(&file, &text),
            Err(err) => report.failed(&file, &err),
        }
    }
    let file = format!("info/{name}.txt");
    match info(session, valkey, &name).await {
        Ok(text) => report.write_text(&file, &text),
        Err(err) => report.failed(&file, &err),
    }
}

/// `INFO` of one pod through the exec API, as `kubectl valkey cli NAME --pod POD INFO` runs it.
async fn info(session: &Session, valkey: &Valkey, pod: &str) -> anyhow::Result<String> {
    let api: Api<Pod> = Api::namespaced(session.streaming_client()?, &session.namespace);
    let command = super::connect::cli_command(&valkey.spec.user, &["INFO".to_owned()]);
    let params = AttachParams::default()
        .stdout(true)
        .stderr(false)
        .stdin(false);
    let mut process = api
        .exec(pod, command, &params)
        .await
        .with_context(|| format!("exec valkey-cli INFO in {pod}"))?;
    let mut text = String::new();
    if let Some(mut stdout) = process.stdout() {
        stdout
            .read_to_string(&mut text)
            .await
            .with_context(|| format!("reading INFO of {pod}"))?;
    }
    process
        .join()
        .await
        .with_context(|| format!("exec in {pod}"))?;
    Ok(text.replace("\r\n", "\n"))
}

fn without_managed_fields<K: Resource>(mut object: K) -> K {
    object.meta_mut().managed_fields = None;
    object
}

/// The directory being written, and what could not be collected.
struct Report {
    dir: PathBuf,
    errors: Vec<String>,
}

impl Report {
    /// The instance's objects of one kind, by its instance label.
    async fn list<K>(&mut self, session: &Session, instance: &str) -> Vec<K>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        let params = ListParams::default().labels(&names::instance_selector(instance));
        let result = session.api::<K>().list(&params).await;
        match session.check(result, session.call::<K>("list")).await {
            Ok(list) => list.items.into_iter().map(without_managed_fields).collect(),
            Err(err) => {
                self.failed(&K::plural(&()), &err);
                Vec::new()
            }
        }
    }

    fn failed(&mut self, what: &str, err: &dyn std::fmt::Display) {
        eprintln!("warning: {what} not in the report: {err:#}");
        self.errors.push(format!("{what}: {err:#}"));
    }

    fn write_yaml<T: Serialize>(&mut self, file: &str, value: &T) {
        match output::to_yaml(value) {
            Ok(text) => self.write_text(file, &text),
            Err(err) => self.failed(file, &err),
        }
    }

    fn write_text(&mut self, file: &str, text: &str) {
        let path = self.dir.join(file);
        let written = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&path, text));
        if let Err(err) = written {
            self.failed(file, &err);
        }
    }

    /// Writes errors.txt when something was missed; the number of files written.
    fn finish(mut self) -> anyhow::Result<usize> {
        if !self.errors.is_empty() {
            let text = self.errors.join("\n") + "\n";
            self.write_text("errors.txt", &text);
        }
        count_files(&self.dir)
    }
}

fn count_files(dir: &Path) -> anyhow::Result<usize> {
    let mut count = 0;
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            count += count_files(&entry.path())?;
        } else {
            count += 1;
        }
    }
    Ok(count)
}
