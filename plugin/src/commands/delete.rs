//! `delete NAME`: deletes the instance (the operator's children go with it by owner reference)
//! and, with `--delete-data`, its volumes. Asks first unless `--yes`.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{DeleteParams, ListParams};
use valkey_core::api::{ReclaimPolicy, Valkey};

use crate::cli::{DeleteArgs, GlobalArgs};
use crate::error::{Problem, UsageError};
use crate::output;
use crate::session::Session;
use crate::terminal;
use valkey_core::api::names::claim_ordinal;

pub async fn run(args: DeleteArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    // Decided before any request: a script without --yes must fail the same way every time.
    if !args.yes && !terminal::interactive() {
        return Err(UsageError::new(format!(
            "refusing to delete Valkey {} without confirmation: stdin is not a terminal",
            args.name
        ))
        .hint(format!(
            "pass --yes to delete it: kubectl valkey delete {} --yes",
            args.name
        ))
        .into());
    }
    let session = Session::connect(global).await?;
    let valkey = session.get_valkey(&args.name).await?;
    let claims = volume_claims(&session, &args.name, args.delete_data).await?;
    if !args.yes && !terminal::confirm(&question(&session, &valkey, &args, &claims))? {
        return Err(Problem::new("not deleted").into());
    }
    let result = session
        .valkeys()
        .delete(&args.name, &DeleteParams::background())
        .await;
    session
        .check(result, session.call::<Valkey>("delete").name(&args.name))
        .await?;
    output::print(&format!("valkey.database.kuberly.io/{} deleted", args.name))?;
    if args.delete_data {
        delete_claims(&session, &claims).await?;
    } else if !claims.is_empty() && valkey.spec.volume.reclaim_policy == ReclaimPolicy::Retain {
        eprintln!(
            "its volumes are kept ({}); a new Valkey {} picks them up again, or delete them with --delete-data",
            claims.join(", "),
            args.name
        );
    }
    Ok(())
}

/// The instance's data volumes (`data-NAME-<ordinal>`), by name. With `--delete-data` a claim
/// list that fails is an error: "no volumes" would be a lie, and the data would silently stay.
/// Without it the list only informs the question, so a refusal leaves it empty.
async fn volume_claims(
    session: &Session,
    instance: &str,
    delete_data: bool,
) -> anyhow::Result<Vec<String>> {
    let result = session
        .api::<PersistentVolumeClaim>()
        .list_metadata(&ListParams::default())
        .await;
    let items = match result {
        Ok(list) => list.items,
        Err(err) if delete_data => {
            let call = session.call::<PersistentVolumeClaim>("list");
            return Err(session.explain(err, call).await.context(
                "cannot find the volumes --delete-data would delete; nothing was deleted",
            ));
        }
        Err(_) => Vec::new(),
    };
    let mut claims: Vec<(i32, String)> = items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .filter_map(|name| claim_ordinal(instance, &name).map(|o| (o, name)))
        .collect();
    claims.sort();
    Ok(claims.into_iter().map(|(_, name)| name).collect())
}

fn question(session: &Session, valkey: &Valkey, args: &DeleteArgs, claims: &[String]) -> String {
    let base = format!(
        "Delete Valkey {} in namespace {} ({} pods)",
        args.name, session.namespace, valkey.spec.replicas
    );
    match (args.delete_data, claims.is_empty()) {
        (true, false) => format!(
            "{base} and its volumes {}? The data cannot be recovered.",
            claims.join(", ")
        ),
        (true, true) => format!("{base}? It has no volumes to delete."),
        (false, _) => format!("{base}?"),
    }
}

async fn delete_claims(session: &Session, claims: &[String]) -> anyhow::Result<()> {
    let api = session.api::<PersistentVolumeClaim>();
    for claim in claims {
        let result = api.delete(claim, &DeleteParams::background()).await;
        match result {
            Ok(_) => output::print(&format!("persistentvolumeclaim/{claim} deleted"))?,
            Err(kube::Error::Api(status)) if status.is_not_found() => {}
            Err(err) => {
                let call = session.call::<PersistentVolumeClaim>("delete").name(claim);
                return Err(session.explain(err, call).await);
            }
        }
    }
    Ok(())
}
