//! `--wait`: follows the instance's status (a watch, not polling) until it runs, fails, or the
//! time is up, printing each change of progress on stderr.

use std::time::Duration;

use anyhow::Context;
use futures::{StreamExt, TryStreamExt};
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use valkey_core::api::{Phase, Valkey};

use crate::error::Problem;
use crate::session::Session;
use crate::{duration, manifests};

/// Where an instance stands, as far as waiting for it is concerned.
#[derive(Debug, PartialEq, Eq)]
pub enum Progress {
    /// The operator has not reported on the current spec yet.
    NotObserved,
    Waiting(String),
    Done(String),
    Failed(String),
}

impl Progress {
    pub fn of(valkey: &Valkey) -> Self {
        let Some(status) = valkey.status.as_ref() else {
            return Self::NotObserved;
        };
        let current = match (status.observed_generation, valkey.metadata.generation) {
            (Some(observed), Some(generation)) => observed >= generation,
            _ => false,
        };
        let Some(phase) = status.status.filter(|_| current) else {
            return Self::NotObserved;
        };
        let pods = format!(
            "{}/{} pods ready",
            status.ready_replicas, valkey.spec.replicas
        );
        match phase {
            Phase::Running => Self::Done(format!("Running, {pods}")),
            Phase::Stopped => Self::Done("Stopped (replicas is 0)".to_owned()),
            Phase::Failed => Self::Failed(if status.error.is_empty() {
                "Failed".to_owned()
            } else {
                status.error.clone()
            }),
            other => Self::Waiting(format!("{other}, {pods}")),
        }
    }

    fn line(&self) -> String {
        match self {
            Self::NotObserved => "waiting for the operator to report a status".to_owned(),
            Self::Waiting(text) | Self::Done(text) => text.clone(),
            Self::Failed(error) => format!("Failed: {error}"),
        }
    }
}

pub async fn until_running(session: &Session, name: &str, timeout: Duration) -> anyhow::Result<()> {
    let api: Api<Valkey> = Api::namespaced(session.streaming_client()?, &session.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = watcher(api, config).applied_objects().boxed();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = Progress::NotObserved;
    let mut printed = String::new();
    loop {
        let next = match tokio::time::timeout_at(deadline, stream.try_next()).await {
            Ok(next) => next.with_context(|| format!("watching the Valkey {name}"))?,
            Err(_) => return Err(timed_out(name, &last, timeout).into()),
        };
        let Some(valkey) = next else {
            return Err(Problem::new(format!("the watch of Valkey {name} ended")).into());
        };
        let progress = Progress::of(&valkey);
        let line = progress.line();
        if line != printed {
            eprintln!("{name}: {line}");
            printed = line;
        }
        match progress {
            Progress::Done(_) => return Ok(()),
            Progress::Failed(error) => {
                return Err(Problem::new(format!("Valkey {name} failed: {error}"))
                    .hint(format!(
                        "`kubectl valkey status {name}` shows its pods and events"
                    ))
                    .into());
            }
            other => last = other,
        }
    }
}

fn timed_out(name: &str, last: &Progress, timeout: Duration) -> Problem {
    let problem = Problem::new(format!(
        "Valkey {name} is not running after {}: {}",
        duration::format(timeout),
        last.line()
    ));
    if *last == Progress::NotObserved {
        let operator = match manifests::operator_deployment() {
            Some((namespace, deployment)) => {
                format!("kubectl get deployment {deployment} -n {namespace}")
            }
            None => "kubectl valkey version".to_owned(),
        };
        problem.hint(format!(
            "the operator never reported on it: is it installed and running? ({operator}); `kubectl valkey install` installs it"
        ))
    } else {
        problem.hint(format!(
            "`kubectl valkey status {name}` shows its pods and events; --timeout waits longer"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use valkey_core::api::{ValkeySpec, ValkeyStatus};

    fn valkey(generation: i64, status: Option<ValkeyStatus>) -> Valkey {
        let spec: ValkeySpec = serde_json::from_value(serde_json::json!({"replicas": 3}))
            .unwrap_or_else(|e| panic!("{e}"));
        let mut v = Valkey::new("cache", spec);
        v.metadata.generation = Some(generation);
        v.status = status;
        v
    }

    fn status(phase: Phase, observed: i64, ready: i32, error: &str) -> Option<ValkeyStatus> {
        Some(ValkeyStatus {
            status: Some(phase),
            ready_replicas: ready,
            observed_generation: Some(observed),
            error: error.into(),
            ..ValkeyStatus::default()
        })
    }

    #[test]
    fn only_a_status_of_the_current_generation_counts() {
        assert_eq!(Progress::of(&valkey(1, None)), Progress::NotObserved);
        assert_eq!(
            Progress::of(&valkey(2, status(Phase::Running, 1, 3, ""))),
            Progress::NotObserved
        );
        assert_eq!(
            Progress::of(&valkey(2, status(Phase::Creating, 2, 1, ""))),
            Progress::Waiting("Creating, 1/3 pods ready".into())
        );
        assert_eq!(
            Progress::of(&valkey(2, status(Phase::Running, 2, 3, ""))),
            Progress::Done("Running, 3/3 pods ready".into())
        );
        assert_eq!(
            Progress::of(&valkey(2, status(Phase::Failed, 2, 0, "no such image"))),
            Progress::Failed("no such image".into())
        );
    }
}
