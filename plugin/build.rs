//! Embeds the operator's install manifests in the order manifests/kustomization.yaml lists them,
//! so `kubectl valkey install` applies exactly what `kubectl apply -k manifests/` would, and the
//! list of files is kept in one place.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::{env, fs};

fn main() {
    let manifests = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default())
        .join("../manifests")
        .canonicalize()
        .unwrap_or_else(|e| fail(&format!("cannot find ../manifests: {e}")));
    let kustomization = manifests.join("kustomization.yaml");
    println!("cargo:rerun-if-changed={}", kustomization.display());
    let text = fs::read_to_string(&kustomization)
        .unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", kustomization.display())));

    let mut out =
        String::from("/// The install manifests, in kustomization order: (file name, YAML).\n");
    out.push_str("pub const MANIFESTS: &[(&str, &str)] = &[\n");
    for file in resources(&text) {
        let path = manifests.join(&file);
        if !path.is_file() {
            fail(&format!(
                "kustomization.yaml lists {file}, which does not exist"
            ));
        }
        println!("cargo:rerun-if-changed={}", path.display());
        let _ = writeln!(
            out,
            "    ({file:?}, include_str!({:?})),",
            path.display().to_string()
        );
    }
    out.push_str("];\n");

    let dest = Path::new(&env::var_os("OUT_DIR").unwrap_or_default()).join("manifests.rs");
    fs::write(&dest, out)
        .unwrap_or_else(|e| fail(&format!("cannot write {}: {e}", dest.display())));
}

/// The entries of the top-level `resources:` list. A line-based reading is enough for the flat
/// list kustomization.yaml holds, and keeps the build script free of dependencies.
fn resources(text: &str) -> Vec<String> {
    let mut in_resources = false;
    let mut files = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if !line.starts_with(' ') && !line.starts_with('-') {
            in_resources = trimmed == "resources:";
            continue;
        }
        if in_resources && let Some(item) = trimmed.strip_prefix("- ") {
            files.push(item.trim().trim_matches(['"', '\'']).to_owned());
        }
    }
    if files.is_empty() {
        fail("manifests/kustomization.yaml lists no resources");
    }
    files
}

fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    std::process::exit(1);
}
