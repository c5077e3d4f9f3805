//! `list`: the instances of the namespace, or of every namespace.

use jiff::Timestamp;
use kube::Api;
use kube::api::ListParams;
use valkey_core::api::Valkey;

use crate::cli::{ColorChoice, GlobalArgs, ListArgs, ViewFormat};
use crate::diagnose::Call;
use crate::output;
use crate::render;
use crate::session::Session;
use crate::view::{self, InstanceRow};

pub async fn run(args: ListArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let session = Session::connect(global).await?;
    let rows = instances(&session, args.all_namespaces).await?;
    show(
        &rows,
        args.all_namespaces,
        args.output,
        global.color,
        &session.namespace,
    )
}

/// The instances, sorted by namespace and name.
pub async fn instances(
    session: &Session,
    all_namespaces: bool,
) -> anyhow::Result<Vec<InstanceRow>> {
    let (api, call) = if all_namespaces {
        (
            Api::<Valkey>::all(session.client.clone()),
            Call::new::<Valkey>("list").all_namespaces(),
        )
    } else {
        (session.valkeys(), session.call::<Valkey>("list"))
    };
    let list = session
        .check(api.list(&ListParams::default()).await, call)
        .await?;
    let mut rows: Vec<InstanceRow> = list.items.iter().map(view::instance_row).collect();
    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    Ok(rows)
}

pub fn show(
    rows: &[InstanceRow],
    all_namespaces: bool,
    format: ViewFormat,
    color: ColorChoice,
    namespace: &str,
) -> anyhow::Result<()> {
    match format {
        ViewFormat::Json => output::print(&output::to_json(&rows)?),
        ViewFormat::Yaml => output::print(output::to_yaml(&rows)?.trim_end()),
        ViewFormat::Table if rows.is_empty() => {
            if all_namespaces {
                eprintln!("No Valkey instances found in any namespace.");
            } else {
                eprintln!("No Valkey instances found in namespace {namespace}.");
            }
            Ok(())
        }
        ViewFormat::Table => {
            let style = output::style(color);
            output::print(&render::instances(
                rows,
                all_namespaces,
                Timestamp::now(),
                style,
            ))
        }
    }
}
