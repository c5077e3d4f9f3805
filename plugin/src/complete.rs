//! Shell completion through kubectl (1.26+): for `kubectl valkey ...<TAB>`, kubectl runs
//! `kubectl_complete-valkey` from PATH with the words after `valkey` (the last one being the word
//! to complete) and expects one candidate per line (`value<TAB>description` allowed), then a
//! `:<directive>` line (Cobra's ShellCompDirective). The plugin answers when invoked under that
//! name, e.g. through a symlink. Subcommands and flags come from the clap definition; instance,
//! namespace and pod names from the cluster when it answers quickly, contexts from the kubeconfig.

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use clap::{Command, CommandFactory};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Api;
use kube::api::ListParams;
use valkey_core::api::names;

use crate::cli::{Cli, GlobalArgs};
use crate::kubeconfig;
use crate::session::Session;

/// The executable name kubectl looks for.
pub const COMPLETER: &str = "kubectl_complete-valkey";

/// Cobra's ShellCompDirectiveDefault: the shell may fall back to file names.
pub const FILES: u32 = 0;
/// Cobra's ShellCompDirectiveNoFileComp.
pub const NO_FILES: u32 = 4;

/// How long completion waits for the cluster before offering nothing.
const CLUSTER_WAIT: Duration = Duration::from_secs(2);

/// Subcommands whose first argument names an existing instance.
const TAKES_INSTANCE: &[&str] = &["status", "logs", "cli", "delete", "scale"];

pub fn invoked_for_completion(args: &[OsString]) -> bool {
    args.first()
        .and_then(|a| Path::new(a).file_stem())
        .is_some_and(|stem| stem == COMPLETER)
}

/// Names completion may need from the cluster or the kubeconfig.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Need {
    Instances,
    Namespaces,
    Pods(String),
    Contexts,
    Clusters,
    Users,
}

pub fn main(args: &[OsString]) -> i32 {
    let words: Vec<String> = args
        .iter()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let lookup = |need: Need, global: &GlobalArgs| lookup(need, global);
    let (candidates, directive) = candidates(&words, &lookup);
    let mut out = String::new();
    for candidate in candidates {
        out.push_str(&candidate);
        out.push('\n');
    }
    out.push_str(&format!(":{directive}\n"));
    print!("{out}");
    0
}

/// The candidates for the last of `words`, and the directive for the shell.
pub fn candidates(
    words: &[String],
    lookup: &dyn Fn(Need, &GlobalArgs) -> Vec<String>,
) -> (Vec<String>, u32) {
    let (current, before) = match words.split_last() {
        Some((current, before)) => (current.as_str(), before),
        None => ("", &[][..]),
    };
    let mut root = Cli::command();
    root.build();
    let line = Line::read(&root, before);
    let command = line
        .subcommand
        .as_deref()
        .and_then(|s| root.find_subcommand(s))
        .unwrap_or(&root);
    let global = line.global.clone();

    if let Some((flag, prefix)) = current
        .split_once('=')
        .filter(|_| current.starts_with("--"))
    {
        let values = flag_values(command, flag, &line, &global, lookup);
        return with_prefix(values, &format!("{flag}="), prefix);
    }
    if let Some(flag) = &line.pending_flag {
        if flag_id(command, flag).as_deref() == Some("kubeconfig") {
            return (Vec::new(), FILES);
        }
        let values = flag_values(command, flag, &line, &global, lookup);
        return (starting_with(values, current), NO_FILES);
    }
    if line.after_dashdash {
        return (Vec::new(), NO_FILES);
    }
    if current.starts_with('-') {
        return (starting_with(flags(command), current), NO_FILES);
    }
    if line.subcommand.is_none() {
        return (starting_with(subcommands(&root), current), NO_FILES);
    }
    // `command` is the subcommand under its canonical name (`connect` is `cli`).
    let values = match (command.get_name(), line.positionals.len()) {
        (name, 0) if TAKES_INSTANCE.contains(&name) => lookup(Need::Instances, &global),
        ("completion", 0) => positional_values(command),
        _ => Vec::new(),
    };
    (starting_with(values, current), NO_FILES)
}

/// What the words before the one being completed say.
#[derive(Default, Debug)]
struct Line {
    subcommand: Option<String>,
    positionals: Vec<String>,
    /// The last word is a flag that still needs its value.
    pending_flag: Option<String>,
    after_dashdash: bool,
    global: GlobalArgs,
}

impl Line {
    fn read(root: &Command, words: &[String]) -> Self {
        let mut line = Line::default();
        let mut iter = words.iter().peekable();
        while let Some(word) = iter.next() {
            if line.after_dashdash {
                continue;
            }
            if word == "--" {
                line.after_dashdash = true;
                continue;
            }
            let command = line
                .subcommand
                .as_deref()
                .and_then(|s| root.find_subcommand(s))
                .unwrap_or(root);
            if word.starts_with('-') && word.len() > 1 {
                let (flag, inline) = match word.split_once('=') {
                    Some((flag, value)) => (flag, Some(value.to_owned())),
                    None => (word.as_str(), None),
                };
                if !takes_value(command, flag) {
                    continue;
                }
                let value = match inline {
                    Some(value) => Some(value),
                    None => iter.next().cloned(),
                };
                match value {
                    Some(value) => line.set_global(command, flag, value),
                    None => line.pending_flag = Some(flag.to_owned()),
                }
                continue;
            }
            match &line.subcommand {
                None => {
                    line.subcommand = root.find_subcommand(word).map(|c| c.get_name().to_owned());
                }
                Some(_) => line.positionals.push(word.clone()),
            }
        }
        line
    }

    fn set_global(&mut self, command: &Command, flag: &str, value: String) {
        let global = &mut self.global;
        match flag_id(command, flag).as_deref() {
            Some("namespace") => global.namespace = Some(value),
            Some("context") => global.context = Some(value),
            Some("cluster") => global.cluster = Some(value),
            Some("user") => global.user = Some(value),
            Some("kubeconfig") => global.kubeconfig = Some(value.into()),
            Some("as_user") => global.as_user = Some(value),
            _ => {}
        }
    }
}

fn find_flag<'a>(command: &'a Command, flag: &str) -> Option<&'a clap::Arg> {
    command.get_arguments().find(|arg| {
        if let Some(long) = flag.strip_prefix("--") {
            arg.get_long() == Some(long)
                || arg
                    .get_all_aliases()
                    .is_some_and(|aliases| aliases.contains(&long))
        } else {
            let mut chars = flag.chars().skip(1);
            let short = chars.next();
            short.is_some() && chars.next().is_none() && arg.get_short() == short
        }
    })
}

fn flag_id(command: &Command, flag: &str) -> Option<String> {
    find_flag(command, flag).map(|a| a.get_id().as_str().to_owned())
}

fn takes_value(command: &Command, flag: &str) -> bool {
    find_flag(command, flag).is_some_and(|arg| {
        arg.get_action().takes_values() && arg.get_num_args().is_none_or(|n| n.min_values() > 0)
    })
}

fn flag_values(
    command: &Command,
    flag: &str,
    line: &Line,
    global: &GlobalArgs,
    lookup: &dyn Fn(Need, &GlobalArgs) -> Vec<String>,
) -> Vec<String> {
    let Some(arg) = find_flag(command, flag) else {
        return Vec::new();
    };
    let possible: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| v.get_name().to_owned())
        .collect();
    if !possible.is_empty() {
        return possible;
    }
    match arg.get_id().as_str() {
        "namespace" => lookup(Need::Namespaces, global),
        "context" => lookup(Need::Contexts, global),
        "cluster" => lookup(Need::Clusters, global),
        "user" => lookup(Need::Users, global),
        "pod" => match line.positionals.first() {
            Some(instance) => lookup(Need::Pods(instance.clone()), global),
            None => Vec::new(),
        },
        _ => Vec::new(),
    }
}

fn positional_values(command: &Command) -> Vec<String> {
    command
        .get_positionals()
        .next()
        .map(|arg| {
            arg.get_possible_values()
                .iter()
                .map(|v| v.get_name().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn subcommands(root: &Command) -> Vec<String> {
    root.get_subcommands()
        .filter(|c| !c.is_hide_set() && c.get_name() != "help")
        .flat_map(|c| {
            let about = one_line(c.get_about());
            std::iter::once(c.get_name().to_owned())
                .chain(c.get_visible_aliases().map(str::to_owned))
                .map(move |name| format!("{name}\t{about}"))
        })
        .collect()
}

fn flags(command: &Command) -> Vec<String> {
    command
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !a.is_positional())
        .flat_map(|a| {
            let about = one_line(a.get_help());
            let long = a.get_long().map(|l| format!("--{l}\t{about}"));
            let short = a.get_short().map(|s| format!("-{s}\t{about}"));
            long.into_iter().chain(short)
        })
        .collect()
}

fn one_line(text: Option<&clap::builder::StyledStr>) -> String {
    text.map(|t| t.to_string().lines().next().unwrap_or_default().to_owned())
        .unwrap_or_default()
}

/// Candidates (before any tab-separated description) that start with `prefix`.
fn starting_with(values: Vec<String>, prefix: &str) -> Vec<String> {
    values
        .into_iter()
        .filter(|v| v.split('\t').next().unwrap_or_default().starts_with(prefix))
        .collect()
}

fn with_prefix(values: Vec<String>, flag: &str, prefix: &str) -> (Vec<String>, u32) {
    let values = starting_with(values, prefix)
        .into_iter()
        .map(|v| format!("{flag}{v}"))
        .collect();
    (values, NO_FILES)
}

/// Looks names up: kubeconfig entries from the file, the rest from the cluster within
/// [`CLUSTER_WAIT`]; anything that fails yields no names (completion must stay silent).
fn lookup(need: Need, global: &GlobalArgs) -> Vec<String> {
    match need {
        Need::Contexts | Need::Clusters | Need::Users => kubeconfig_names(&need, global),
        _ => {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return Vec::new();
            };
            let names = runtime.block_on(async {
                tokio::time::timeout(CLUSTER_WAIT, cluster_names(need, global))
                    .await
                    .unwrap_or_default()
            });
            runtime.shutdown_background();
            names
        }
    }
}

fn kubeconfig_names(need: &Need, global: &GlobalArgs) -> Vec<String> {
    let Ok((Some(config), _)) = kubeconfig::load(global) else {
        return Vec::new();
    };
    match need {
        Need::Contexts => config.contexts.iter().map(|c| c.name.clone()).collect(),
        Need::Clusters => config.clusters.iter().map(|c| c.name.clone()).collect(),
        Need::Users => config.auth_infos.iter().map(|c| c.name.clone()).collect(),
        _ => Vec::new(),
    }
}

async fn cluster_names(need: Need, global: &GlobalArgs) -> Vec<String> {
    let mut global = global.clone();
    global.request_timeout = Some(CLUSTER_WAIT);
    let Ok(session) = Session::connect(&global).await else {
        return Vec::new();
    };
    let names = match need {
        Need::Instances => session
            .valkeys()
            .list_metadata(&ListParams::default())
            .await
            .map(|l| {
                l.items
                    .into_iter()
                    .filter_map(|v| v.metadata.name)
                    .collect()
            }),
        Need::Namespaces => Api::<Namespace>::all(session.client.clone())
            .list_metadata(&ListParams::default())
            .await
            .map(|l| {
                l.items
                    .into_iter()
                    .filter_map(|n| n.metadata.name)
                    .collect()
            }),
        Need::Pods(instance) => session
            .api::<Pod>()
            .list_metadata(&ListParams::default().labels(&names::instance_selector(&instance)))
            .await
            .map(|l| {
                l.items
                    .into_iter()
                    .filter_map(|p| p.metadata.name)
                    .collect()
            }),
        _ => Ok(Vec::new()),
    };
    names.unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn complete(line: &str) -> (Vec<String>, u32) {
        let mut words: Vec<String> = line.split(' ').map(str::to_owned).collect();
        if line.is_empty() {
            words = vec![String::new()];
        }
        let lookup = |need: Need, global: &GlobalArgs| match need {
            Need::Instances => vec![format!(
                "cache-in-{}",
                global.namespace.clone().unwrap_or_else(|| "default".into())
            )],
            Need::Namespaces => vec!["default".into(), "team-a".into()],
            Need::Pods(instance) => vec![format!("{instance}-0"), format!("{instance}-1")],
            _ => vec!["ctx".into()],
        };
        let (values, directive) = candidates(&words, &lookup);
        let values = values
            .into_iter()
            .map(|v| v.split('\t').next().unwrap_or_default().to_owned())
            .collect();
        (values, directive)
    }

    #[test]
    fn subcommands_complete_first() {
        let (values, directive) = complete("");
        for name in [
            "create", "list", "status", "logs", "cli", "connect", "delete", "scale",
        ] {
            assert!(values.contains(&name.to_owned()), "{name} in {values:?}");
        }
        assert_eq!(directive, NO_FILES);
        assert_eq!(complete("st").0, ["status"]);
    }

    #[test]
    fn instance_names_come_from_the_namespace_given() {
        assert_eq!(complete("status ").0, ["cache-in-default"]);
        assert_eq!(complete("-n team-a logs ").0, ["cache-in-team-a"]);
        assert_eq!(complete("cli --namespace=team-a c").0, ["cache-in-team-a"]);
        assert!(complete("status cache ").0.is_empty());
        assert!(complete("create ").0.is_empty());
    }

    #[test]
    fn flag_values_and_flags() {
        assert_eq!(complete("status -o ").0, ["table", "json", "yaml"]);
        assert_eq!(complete("list --output=j").0, ["--output=json"]);
        assert_eq!(complete("-n t").0, ["team-a"]);
        assert_eq!(complete("logs cache --pod ").0, ["cache-0", "cache-1"]);
        assert_eq!(
            complete("completion ").0,
            ["bash", "elvish", "fish", "powershell", "zsh"]
        );
        let flags = complete("create cache --pa").0;
        assert_eq!(
            flags,
            ["--password-stdin", "--password-secret", "--password-key"]
        );
        assert!(complete("logs --").0.contains(&"--follow".to_owned()));
        assert!(complete("logs --").0.contains(&"--namespace".to_owned()));
        assert_eq!(complete("--kubeconfig ").1, FILES);
        assert!(complete("cli cache -- G").0.is_empty());
    }
}
