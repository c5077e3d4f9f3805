//! `status [NAME]`: one instance in detail, or the instances of the namespace.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::events::v1::Event;
use std::collections::BTreeSet;

use kube::ResourceExt;
use kube::api::ListParams;
use valkey_core::api::Valkey;
use valkey_core::api::names::{self, ObjectNames};

use super::list;
use crate::cli::{GlobalArgs, StatusArgs, ViewFormat};
use crate::output;
use crate::render;
use crate::session::Session;
use crate::view;

pub async fn run(args: StatusArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let session = Session::connect(global).await?;
    let Some(name) = args.name else {
        let rows = list::instances(&session, args.all_namespaces).await?;
        return list::show(
            &rows,
            args.all_namespaces,
            args.output,
            global.color,
            &session.namespace,
        );
    };
    let valkey = session.get_valkey(&name).await?;
    let (pods, claims) = futures::join!(pods(&session, &name), claims(&session, &name));
    let events = events(&session, &event_subjects(&valkey, &pods)).await;
    let report = view::instance_report(&valkey, &pods, &claims, &events);
    match args.output {
        ViewFormat::Json => output::print(&output::to_json(&report)?),
        ViewFormat::Yaml => output::print(output::to_yaml(&report)?.trim_end()),
        ViewFormat::Table => {
            let style = output::style(global.color);
            output::print(render::report(&report, Timestamp::now(), style).trim_end())
        }
    }
}

/// The instance's pods. The report is still useful without them, so a failure is a warning.
async fn pods(session: &Session, name: &str) -> Vec<Pod> {
    match session.instance_pods(name).await {
        Ok(pods) => pods,
        Err(err) => {
            eprintln!("warning: pods not shown: {err:#}");
            Vec::new()
        }
    }
}

/// The instance's volume claims. They only tell an unbound volume from other scheduling
/// failures (the scheduler's message says it too), so without them nothing is lost but that.
async fn claims(session: &Session, name: &str) -> Vec<PersistentVolumeClaim> {
    let params = ListParams::default().labels(&names::instance_selector(name));
    match session.api::<PersistentVolumeClaim>().list(&params).await {
        Ok(list) => list.items,
        Err(_) => Vec::new(),
    }
}

/// The names events about the instance can be regarding: the instance's own name (the Valkey,
/// its StatefulSet, PodDisruptionBudget and read-write Service share it), its pods and their
/// volume claims.
pub(crate) fn event_subjects(valkey: &Valkey, pods: &[Pod]) -> Vec<String> {
    let instance = valkey.name_any();
    let names = ObjectNames::new(&instance);
    let ordinals = (0..valkey.spec.replicas).chain(
        pods.iter()
            .filter_map(|p| names::pod_ordinal(&instance, &p.name_any())),
    );
    let mut subjects = BTreeSet::from([instance.clone()]);
    for ordinal in ordinals {
        subjects.insert(names.pod(ordinal));
        subjects.insert(names.volume_claim(ordinal));
    }
    subjects.into_iter().collect()
}

/// The events regarding `subjects`, one field-selected list each (the API server filters, so a
/// namespace with thousands of events costs no more than one with a few).
pub(crate) async fn events(session: &Session, subjects: &[String]) -> Vec<Event> {
    let api = session.api::<Event>();
    let lists = subjects.iter().map(|name| {
        let params = ListParams::default().fields(&format!("regarding.name={name}"));
        let api = api.clone();
        async move { api.list(&params).await }
    });
    let mut events = Vec::new();
    for result in futures::future::join_all(lists).await {
        match session.check(result, session.call::<Event>("list")).await {
            Ok(list) => events.extend(list.items),
            Err(err) => {
                eprintln!("warning: events not shown: {err:#}");
                return Vec::new();
            }
        }
    }
    events
}
