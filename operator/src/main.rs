//! `valkey-operator`: runs Valkey instances on Kubernetes.

use std::io::Write;

use anyhow::Context;
use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "valkey-operator", version, about = "Kubernetes operator for Valkey", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the Valkey CustomResourceDefinition as YAML (what manifests/crd.yaml holds).
    Crd,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => print_crd(),
    }
}

fn print_crd() -> anyhow::Result<()> {
    let yaml = valkey_operator::api::crd_yaml().context("serializing the Valkey CRD")?;
    std::io::stdout()
        .write_all(yaml.as_bytes())
        .context("writing the CRD to stdout")
}
