//! Finding and reading the kubeconfig as kubectl does: `--kubeconfig`, else every file of
//! `KUBECONFIG` merged (missing ones skipped), else `~/.kube/config`, else the in-cluster service
//! account. Reading files is not connecting: `create --dry-run=client` uses this for the namespace.

use std::fmt;
use std::path::{Path, PathBuf};

use kube::config::{Kubeconfig, KubeconfigError};

use crate::cli::GlobalArgs;
use crate::error::Problem;

/// Where the kubeconfig came from, for messages.
#[derive(Clone, Debug)]
pub enum Source {
    Flag(PathBuf),
    Env(Vec<PathBuf>),
    Home(PathBuf),
    InCluster,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Flag(path) => write!(f, "{} (--kubeconfig)", path.display()),
            Source::Env(paths) => write!(f, "{} (KUBECONFIG)", join_paths(paths)),
            Source::Home(path) => write!(f, "{}", path.display()),
            Source::InCluster => f.write_str("the in-cluster service account"),
        }
    }
}

fn join_paths(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(":")
}

/// The kubeconfig to use, or `None` for the in-cluster service account.
pub fn load(global: &GlobalArgs) -> Result<(Option<Kubeconfig>, Source), Problem> {
    if let Some(path) = &global.kubeconfig {
        if !path.exists() {
            return Err(Problem::new(format!(
                "the kubeconfig {} does not exist",
                path.display()
            ))
            .hint("pass an existing file to --kubeconfig, or leave the flag out to use $KUBECONFIG or ~/.kube/config"));
        }
        let source = Source::Flag(path.clone());
        return read(path, &source).map(|k| (Some(k), source));
    }
    if let Some(value) = std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty()) {
        let listed: Vec<PathBuf> = std::env::split_paths(&value)
            .filter(|p| !p.as_os_str().is_empty())
            .collect();
        // Like kubectl, files of the list that do not exist are skipped.
        let present: Vec<PathBuf> = listed.iter().filter(|p| p.exists()).cloned().collect();
        if present.is_empty() {
            return Err(Problem::new(format!(
                "none of the files in KUBECONFIG exist: {}",
                join_paths(&listed)
            ))
            .hint("set KUBECONFIG to your kubeconfig file(s), separated by ':', or pass --kubeconfig PATH"));
        }
        let source = Source::Env(present.clone());
        let mut merged = Kubeconfig::default();
        for path in &present {
            let next = read(path, &source)?;
            merged = merged.merge(next).map_err(|e| {
                Problem::new(format!("cannot merge the files of KUBECONFIG: {e}"))
                    .hint("every file must be a kubeconfig (kind: Config, apiVersion: v1)")
            })?;
        }
        return Ok((Some(merged), source));
    }
    if let Some(path) = home_kubeconfig().filter(|p| p.exists()) {
        let source = Source::Home(path.clone());
        return read(&path, &source).map(|k| (Some(k), source));
    }
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
        return Ok((None, Source::InCluster));
    }
    Err(Problem::new("no kubeconfig found: KUBECONFIG is not set and ~/.kube/config does not exist").hint(
        "point KUBECONFIG (or --kubeconfig) at the kubeconfig of your cluster, or create ~/.kube/config\n\
         (your cloud's CLI writes one, e.g. `aws eks update-kubeconfig` or `gcloud container clusters get-credentials`)",
    ))
}

fn home_kubeconfig() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").or_else(|| std::env::var_os("USERPROFILE"))?;
    Some(PathBuf::from(home).join(".kube").join("config"))
}

fn read(path: &Path, source: &Source) -> Result<Kubeconfig, Problem> {
    Kubeconfig::read_from(path).map_err(|e| match e {
        KubeconfigError::ReadConfig(io, _) => {
            Problem::new(format!("cannot read the kubeconfig {}: {io}", path.display()))
                .hint("check the file's permissions, or point --kubeconfig / KUBECONFIG at another file")
        }
        other => Problem::new(format!(
            "the kubeconfig {} is not valid: {other}",
            path.display()
        ))
        .hint(format!(
            "fix the file (kubectl config view shows how kubectl reads it) or use another one; it was found through {source}"
        )),
    })
}

/// The context the flags select, by name.
pub fn context_name(kubeconfig: &Kubeconfig, global: &GlobalArgs) -> Option<String> {
    global
        .context
        .clone()
        .or_else(|| kubeconfig.current_context.clone())
        .filter(|c| !c.is_empty())
}

/// The namespace of the selected context, if it names one.
pub fn context_namespace(kubeconfig: &Kubeconfig, global: &GlobalArgs) -> Option<String> {
    let name = context_name(kubeconfig, global)?;
    kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == name)
        .and_then(|c| c.context.as_ref())
        .and_then(|c| c.namespace.clone())
        .filter(|ns| !ns.is_empty())
}

/// The namespace commands work in when the cluster need not be contacted: `-n`, else the
/// context's, else none (the printed object then has no namespace, like `kubectl create
/// --dry-run=client` without a kubeconfig).
pub fn offline_namespace(global: &GlobalArgs) -> Option<String> {
    if let Some(ns) = &global.namespace {
        return Some(ns.clone());
    }
    match load(global) {
        Ok((Some(kubeconfig), _)) => {
            Some(context_namespace(&kubeconfig, global).unwrap_or_else(|| "default".to_owned()))
        }
        _ => None,
    }
}

/// Explains why the kubeconfig does not yield a cluster to talk to.
pub fn explain(err: &KubeconfigError, kubeconfig: &Kubeconfig, source: &Source) -> Problem {
    let contexts = names(kubeconfig.contexts.iter().map(|c| c.name.as_str()));
    let clusters = names(kubeconfig.clusters.iter().map(|c| c.name.as_str()));
    match err {
        KubeconfigError::CurrentContextNotSet if kubeconfig.contexts.is_empty() => Problem::new(format!(
            "the kubeconfig {source} defines no context: it is empty or not a kubeconfig"
        ))
        .hint("point --kubeconfig / KUBECONFIG at the kubeconfig of your cluster"),
        KubeconfigError::CurrentContextNotSet => Problem::new(format!(
            "the kubeconfig {source} has no current context"
        ))
        .hint(format!(
            "pass --context NAME or run `kubectl config use-context NAME`; contexts: {contexts}"
        )),
        KubeconfigError::LoadContext(name) => Problem::new(format!(
            "the context {name:?} is not in the kubeconfig {source}"
        ))
        .hint(format!("contexts: {contexts}")),
        KubeconfigError::LoadClusterOfContext(name) => Problem::new(format!(
            "the cluster {name:?} is not in the kubeconfig {source}"
        ))
        .hint(format!("clusters: {clusters}")),
        KubeconfigError::MissingClusterUrl => Problem::new(format!(
            "the selected cluster of the kubeconfig {source} has no server URL"
        ))
        .hint("add clusters[].cluster.server, e.g. https://203.0.113.10:6443"),
        other => Problem::new(format!("cannot use the kubeconfig {source}: {other}"))
            .hint("fix the file (kubectl config view shows how kubectl reads it) or select another context"),
    }
}

fn names<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.collect();
    if names.is_empty() {
        "(none)".to_owned()
    } else {
        names.join(", ")
    }
}
