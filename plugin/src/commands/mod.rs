//! One module per subcommand.

mod connect;
mod create;
mod delete;
mod failover;
mod install;
mod list;
mod logs;
mod report;
mod restart;
mod rotate;
mod scale;
mod status;
mod version;
mod wait;

pub use connect::choose_pod;
pub use create::desired;

use clap::CommandFactory;

use crate::cli::{Cli, Command};

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let global = &cli.global;
    match cli.command {
        Command::Create(args) => create::run(args, global).await,
        Command::List(args) => list::run(args, global).await,
        Command::Status(args) => status::run(args, global).await,
        Command::Logs(args) => logs::run(args, global).await,
        Command::Cli(args) => connect::run(args, global).await,
        Command::Delete(args) => delete::run(args, global).await,
        Command::Scale(args) => scale::run(args, global).await,
        Command::Failover(args) => failover::run(args, global).await,
        Command::Install(args) => install::run(args, global).await,
        Command::Report(args) => report::run(args, global).await,
        Command::Restart(args) => restart::run(args, global).await,
        Command::RotatePassword(args) => rotate::run(args, global).await,
        Command::Completion(args) => {
            let mut command = Cli::command();
            clap_complete::generate(
                args.shell,
                &mut command,
                "kubectl-valkey",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Command::Version(args) => version::run(args, global).await,
    }
}
