//! `scale NAME --replicas N`, through the scale subresource (what `kubectl scale` and
//! autoscalers use), so it needs only the `valkeys/scale` right.

use kube::api::{Patch, PatchParams};
use serde_json::json;
use valkey_core::api::validation;
use valkey_core::api::{Valkey, ValkeySpec};

use crate::cli::{GlobalArgs, ScaleArgs};
use crate::error::UsageError;
use crate::output;
use crate::session::{FIELD_MANAGER, Session};

pub async fn run(args: ScaleArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    check(&args.name, args.replicas)?;
    let session = Session::connect(global).await?;
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    let patch = Patch::Merge(json!({"spec": {"replicas": args.replicas}}));
    let result = session
        .valkeys()
        .patch_scale(&args.name, &params, &patch)
        .await;
    let call = session
        .call::<Valkey>("patch")
        .subresource("scale")
        .name(&args.name);
    session.check(result, call).await?;
    output::print(&format!(
        "valkey.database.kuberly.io/{} scaled to {} replicas",
        args.name, args.replicas
    ))
}

/// The replica count (and the name) checked by the CRD's own rules, before any request.
fn check(name: &str, replicas: i32) -> Result<(), UsageError> {
    let spec: ValkeySpec = serde_json::from_value(json!({"replicas": replicas}))
        .map_err(|e| UsageError::new(format!("invalid --replicas: {e}")))?;
    let violations = validation::validate(&Valkey::new(name, spec), None);
    if violations.is_empty() {
        return Ok(());
    }
    let messages: Vec<String> = violations.iter().map(ToString::to_string).collect();
    Err(UsageError::new(messages.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_out_of_range_are_refused_locally() {
        assert!(check("cache", 3).is_ok());
        assert!(check("cache", 0).is_ok());
        let err = check("cache", 9)
            .err()
            .map(|e| e.message)
            .unwrap_or_default();
        assert!(
            err.contains("spec.replicas must be between 0 and 5"),
            "{err}"
        );
        assert!(check("cache", -1).is_err());
    }
}
