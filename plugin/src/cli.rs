//! The command line: every subcommand, flag and example, as clap derive types. Parsing never
//! touches the network, so `--help`, `version --client` and `completion` work without a cluster.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use clap_complete::Shell;

use crate::duration;

/// How the plugin is invoked by kubectl; used in usage lines and messages.
pub const DISPLAY_NAME: &str = "kubectl valkey";

const ABOUT: &str =
    "Create, inspect, connect to and delete Valkey instances run by valkey-operator";

const LONG_ABOUT: &str = "\
Create, inspect, connect to and delete Valkey instances run by valkey-operator.

Data goes to stdout, diagnostics to stderr. Every command that talks to the cluster uses the
kubeconfig the way kubectl does: --kubeconfig, else $KUBECONFIG (several files are merged),
else ~/.kube/config; the namespace of the context unless -n is given.";

const EXIT_CODES: &str = "\
Exit codes:
  0    success
  1    the operation failed (API error, instance not found, not allowed, timed out, ...)
  2    usage error: bad flags or arguments, or input the Valkey API would refuse
  N    `cli NAME -- ARGS`: the exit code of valkey-cli

Run `kubectl valkey COMMAND --help` for the examples of each command.";

#[derive(Parser, Debug)]
#[command(
    name = "kubectl-valkey",
    bin_name = DISPLAY_NAME,
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_help = EXIT_CODES,
    propagate_version = true,
    max_term_width = 100
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,

    #[command(subcommand)]
    pub command: Command,
}

/// Flags kubectl users expect, accepted before or after the subcommand.
#[derive(Args, Debug, Clone, Default)]
pub struct GlobalArgs {
    /// Path to the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)
    #[arg(
        long,
        global = true,
        value_name = "PATH",
        help_heading = "Global options"
    )]
    pub kubeconfig: Option<std::path::PathBuf>,

    /// The kubeconfig context to use
    #[arg(
        long,
        global = true,
        value_name = "NAME",
        help_heading = "Global options"
    )]
    pub context: Option<String>,

    /// The kubeconfig cluster to use
    #[arg(
        long,
        global = true,
        value_name = "NAME",
        help_heading = "Global options"
    )]
    pub cluster: Option<String>,

    /// The kubeconfig user to use
    #[arg(
        long,
        global = true,
        value_name = "NAME",
        help_heading = "Global options"
    )]
    pub user: Option<String>,

    /// Namespace of the instance (default: the context's namespace, else "default")
    #[arg(
        short,
        long,
        global = true,
        value_name = "NAMESPACE",
        help_heading = "Global options"
    )]
    pub namespace: Option<String>,

    /// User to impersonate for the operation
    #[arg(
        long = "as",
        global = true,
        value_name = "USER",
        help_heading = "Global options"
    )]
    pub as_user: Option<String>,

    /// Group to impersonate (repeatable)
    #[arg(
        long = "as-group",
        global = true,
        value_name = "GROUP",
        help_heading = "Global options"
    )]
    pub as_group: Vec<String>,

    /// How long to wait for an answer of the API server, e.g. 10s or 1m; 0 waits forever
    #[arg(
        long,
        global = true,
        value_name = "DURATION",
        value_parser = duration::parse,
        help_heading = "Global options"
    )]
    pub request_timeout: Option<Duration>,

    /// When to colour tables
    #[arg(
        long,
        global = true,
        value_enum,
        default_value_t = ColorChoice::Auto,
        value_name = "WHEN",
        help_heading = "Global options"
    )]
    pub color: ColorChoice,

    /// Log what the plugin does to stderr (-v requests, -vv everything)
    #[arg(short, long, global = true, action = clap::ArgAction::Count, help_heading = "Global options")]
    pub verbose: u8,
}

#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ColorChoice {
    /// Colour when stdout is a terminal, NO_COLOR is unset and TERM is not "dumb"
    #[default]
    Auto,
    /// Always colour, e.g. for `| less -R`
    Always,
    /// Never colour
    Never,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create a Valkey instance
    #[command(after_help = CREATE_EXAMPLES)]
    Create(CreateArgs),

    /// List the Valkey instances of the namespace (or of every namespace with -A)
    #[command(after_help = LIST_EXAMPLES)]
    List(ListArgs),

    /// Show an instance: status, endpoints, pods, conditions and recent events
    #[command(after_help = STATUS_EXAMPLES)]
    Status(StatusArgs),

    /// Print the logs of every pod of an instance, each line prefixed with its pod
    #[command(after_help = LOGS_EXAMPLES)]
    Logs(LogsArgs),

    /// Run valkey-cli in a pod of the instance (the primary unless told otherwise)
    #[command(visible_alias = "connect", after_help = CLI_EXAMPLES)]
    Cli(CliArgs),

    /// Delete an instance (and, with --delete-data, its volumes)
    #[command(after_help = DELETE_EXAMPLES)]
    Delete(DeleteArgs),

    /// Change the number of pods of an instance
    #[command(after_help = SCALE_EXAMPLES)]
    Scale(ScaleArgs),

    /// Hand the primary role to a replica (planned switchover through the operator) and wait
    #[command(after_help = FAILOVER_EXAMPLES)]
    Failover(FailoverArgs),

    /// Restart every pod of an instance through the operator, the primary last, and wait
    #[command(after_help = RESTART_EXAMPLES)]
    Restart(RestartArgs),
    /// Give the instance's user a new password, with no pod restarted, and wait until every pod
    /// accepts only the new one
    #[command(after_help = ROTATE_PASSWORD_EXAMPLES)]
    RotatePassword(RotatePasswordArgs),

    /// Write a support bundle of an instance to a new directory (no Secret values)
    #[command(after_help = REPORT_EXAMPLES)]
    Report(ReportArgs),

    /// Install the operator: its CRD, RBAC and Deployment (the manifests are in the plugin)
    #[command(after_help = INSTALL_EXAMPLES)]
    Install(InstallArgs),

    /// Print a shell completion script
    #[command(after_help = COMPLETION_EXAMPLES)]
    Completion(CompletionArgs),

    /// Print the plugin's version, and the operator's when the cluster is reachable
    #[command(after_help = VERSION_EXAMPLES)]
    Version(VersionArgs),
}

const RESTART_EXAMPLES: &str = "\
Examples:
  # Restart every pod, one at a time, and wait until all run again
  kubectl valkey restart cache

  # Only ask; follow with `kubectl valkey status cache`
  kubectl valkey restart cache --wait=false

The plugin sets the annotation database.kuberly.io/restartedAt on the Valkey; the operator copies
it onto the pod template and restarts the pods itself: the replicas first, one at a time, each
once the previous one is Ready and in sync with the primary, then a planned switchover to an
updated replica, then the old primary. The primary role moves once. A single-pod instance is
unavailable while its pod restarts.";

const REPORT_EXAMPLES: &str = "\
Examples:
  # The Valkey, its objects, events, status, each pod's log tail and INFO, and the versions,
  # in ./valkey-report-cache-<time>/ (Secrets as names and keys only, never their values)
  kubectl valkey report cache

  # Into a directory of your choice (it must not exist yet), with longer log tails
  kubectl valkey report cache --output-dir /tmp/cache-report --log-lines 2000

  # Then share it
  tar czf cache-report.tgz -C /tmp cache-report
";

const CREATE_EXAMPLES: &str = "\
Examples:
  # A standalone instance with a 1Gi volume and a password generated by the operator
  kubectl valkey create cache

  # A primary and two replicas, admin user, password read from stdin, wait until it runs
  printf '%s' \"$PASSWORD\" | kubectl valkey create orders --replicas 3 --admin-user admin \\
      --password-stdin --wait

  # Use a password you keep in a Secret (key \"password\" unless --password-key says otherwise)
  kubectl valkey create orders --password-secret orders-creds

  # No volume (data lost when a pod restarts), more memory, a valkey.conf directive
  kubectl valkey create scratch --no-volume --memory 1Gi --config maxmemory-policy=allkeys-lru

  # Print the resource instead of creating it
  kubectl valkey create cache --replicas 3 --dry-run=client -o yaml

The password never goes on the command line: there is no --password flag. With --password-stdin
the plugin stores it in the Secret NAME-auth (key \"password\"), which the Valkey references in
spec.passwordSecret and which is deleted with the instance.";

const LIST_EXAMPLES: &str = "\
Examples:
  kubectl valkey list
  kubectl valkey list -n team-a
  kubectl valkey list -A -o json";

const STATUS_EXAMPLES: &str = "\
Examples:
  # One instance: status, endpoints, pods, conditions, recent events
  kubectl valkey status cache

  # Every instance of the namespace, or of every namespace
  kubectl valkey status
  kubectl valkey status -A

  # For scripts
  kubectl valkey status cache -o json";

const LOGS_EXAMPLES: &str = "\
Examples:
  # All pods, merged in time order
  kubectl valkey logs cache

  # Follow, including pods that start later; the last 20 lines of each pod first
  kubectl valkey logs cache -f --tail 20

  # One pod, the last hour, with timestamps
  kubectl valkey logs cache --pod cache-1 --since 1h --timestamps";

const CLI_EXAMPLES: &str = "\
Examples:
  # An interactive valkey-cli on the primary
  kubectl valkey cli cache

  # On a replica, or on a given pod
  kubectl valkey connect cache --replica
  kubectl valkey cli cache --pod cache-2

  # One command; the exit code is valkey-cli's
  kubectl valkey cli cache -- SET greeting hello
  kubectl valkey cli cache -- GET greeting

  # Commands from a file
  kubectl valkey cli cache < commands.txt

valkey-cli runs as `valkey-cli --user <spec.user> [ARGS]` inside the pod, through the pod's
/etc/valkey/cli.sh, which takes the password from the files the operator mounts (they follow a
password rotation) and passes it in the environment: it never appears on a command line.";

const DELETE_EXAMPLES: &str = "\
Examples:
  # Asks for confirmation on a terminal
  kubectl valkey delete cache

  # In scripts: --yes is required when stdin is not a terminal
  kubectl valkey delete cache --yes

  # Also delete the volumes (data-cache-0, ...): the data is gone for good
  kubectl valkey delete cache --delete-data --yes";

const SCALE_EXAMPLES: &str = "\
Examples:
  # One primary and two replicas
  kubectl valkey scale cache --replicas 3

  # Stop the instance, keeping its data
  kubectl valkey scale cache --replicas 0";

const FAILOVER_EXAMPLES: &str = "\
Examples:
  # Hand over to the replica that is most up to date
  kubectl valkey failover cache

  # Hand over to a given pod
  kubectl valkey failover cache --to cache-2

The operator runs Valkey's own FAILOVER TO on the primary: writes pause while the replica catches
up (at most 5 s), the roles swap, then the read-write Service follows the new primary. The
command asks the operator through the annotation database.kuberly.io/switchover and waits for
the outcome (status.lastFailover, or a SwitchoverRefused event saying why not).";

const ROTATE_PASSWORD_EXAMPLES: &str = "\
Examples:
  # A new random password (256 bits from the operating system's CSPRNG)
  kubectl valkey rotate-password cache

  # A password of your own, from stdin
  printf '%s' \"$NEW_PASSWORD\" | kubectl valkey rotate-password cache --password-stdin

  # Write the password and return; `kubectl valkey status cache` shows the rotation
  kubectl valkey rotate-password cache --wait=false

The plugin writes the password into the instance's password Secret (spec.passwordSecret, or
NAME-auth); the password never goes on a command line, and the plugin does not print it: read it
from the Secret. The operator then rotates without restarting any pod: it adds the new password
to the ACL user on every pod (the old one keeps working), moves replication to it, and about
100 s later (once the kubelets have refreshed the password files mounted in the pods) removes
the old one. Clients must switch to the new password before then. Changing the Secret by other
means (kubectl, an external secret manager) starts the same rotation.";

const INSTALL_EXAMPLES: &str = "\
Examples:
  # Install or upgrade the operator (server-side apply; needs cluster-admin rights)
  kubectl valkey install

  # Print the manifests instead
  kubectl valkey install --dry-run -o yaml > valkey-operator.yaml";

const COMPLETION_EXAMPLES: &str = "\
Examples:
  # `kubectl valkey <TAB>` (kubectl 1.26+): a kubectl_complete-valkey executable on PATH
  ln -s \"$(command -v kubectl-valkey)\" \"$(dirname \"$(command -v kubectl-valkey)\")/kubectl_complete-valkey\"

  # `kubectl-valkey <TAB>` when the binary is called directly
  source <(kubectl valkey completion bash)
  kubectl valkey completion zsh > \"${fpath[1]}/_kubectl-valkey\"
  kubectl valkey completion fish > ~/.config/fish/completions/kubectl-valkey.fish
  kubectl valkey completion powershell | Out-String | Invoke-Expression";

const VERSION_EXAMPLES: &str = "\
Examples:
  kubectl valkey version
  kubectl valkey version --client
  kubectl valkey version -o json";

#[derive(Args, Debug)]
pub struct CreateArgs {
    /// Name of the instance (lowercase letters, digits and '-', at most 40)
    pub name: String,

    /// Container image of valkey-server
    #[arg(long, value_name = "IMAGE")]
    pub image: Option<String>,

    /// Number of pods: 1 standalone, 2 to 5 a primary and replicas, 0 stopped
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub replicas: Option<i32>,

    /// The ACL user that gets full rights (default: "default")
    #[arg(long, value_name = "USER")]
    pub admin_user: Option<String>,

    /// Read the password from stdin and keep it in the Secret NAME-auth
    #[arg(long, conflicts_with = "password_secret")]
    pub password_stdin: bool,

    /// Use the password in this existing Secret
    #[arg(long, value_name = "SECRET")]
    pub password_secret: Option<String>,

    /// Key of the password in --password-secret
    #[arg(long, value_name = "KEY", requires = "password_secret")]
    pub password_key: Option<String>,

    /// Size of each pod's volume, e.g. 1Gi
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    pub storage: Option<String>,

    /// No volume: pods use an emptyDir and lose their data when they restart
    #[arg(long, conflicts_with_all = ["storage", "storage_class", "reclaim_policy"])]
    pub no_volume: bool,

    /// StorageClass of the volumes (default: the cluster's default class)
    #[arg(long, value_name = "CLASS")]
    pub storage_class: Option<String>,

    /// What happens to the volumes when the instance is deleted
    #[arg(long, value_enum, value_name = "POLICY")]
    pub reclaim_policy: Option<ReclaimPolicyArg>,

    /// CPU request, e.g. 250m
    #[arg(long, value_name = "CPU", allow_hyphen_values = true)]
    pub cpu: Option<String>,

    /// Memory request and limit, e.g. 512Mi
    #[arg(long, value_name = "MEMORY", allow_hyphen_values = true)]
    pub memory: Option<String>,

    /// Run the Prometheus exporter sidecar (redis_exporter, port 9121) in every pod, with the
    /// metrics Service <NAME>-metrics
    #[arg(long)]
    pub metrics: bool,

    /// Also create a ServiceMonitor for the Prometheus operator (where its CRD is installed)
    #[arg(long, requires = "metrics")]
    pub service_monitor: bool,

    /// A valkey.conf directive, e.g. maxmemory-policy=allkeys-lru (repeatable)
    #[arg(long = "config", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub config: Vec<(String, String)>,

    /// Wait until the instance runs, showing its progress
    #[arg(long)]
    pub wait: bool,

    /// How long --wait waits, e.g. 90s or 5m
    #[arg(long, value_name = "DURATION", value_parser = duration::parse, default_value = "5m")]
    pub timeout: Duration,

    /// Only print the object (client) or have the API server check it without saving it (server)
    #[arg(
        long,
        value_enum,
        value_name = "MODE",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "client"
    )]
    pub dry_run: Option<DryRun>,

    /// Print the resulting object in this format
    #[arg(short, long, value_enum, value_name = "FORMAT")]
    pub output: Option<ObjectFormat>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReclaimPolicyArg {
    /// Keep the volumes; a new instance of the same name picks them up
    Retain,
    /// Delete the volumes with the instance
    Delete,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DryRun {
    /// Nothing is sent to the cluster
    Client,
    /// The API server validates and defaults the objects but stores nothing
    Server,
    /// Not a dry run
    None,
}

/// Output of commands that print Kubernetes objects.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectFormat {
    Yaml,
    Json,
}

/// Output of commands that show tables.
#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ViewFormat {
    #[default]
    Table,
    Json,
    Yaml,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    /// List the instances of every namespace
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,

    /// Output format
    #[arg(short, long, value_enum, default_value_t = ViewFormat::Table, value_name = "FORMAT")]
    pub output: ViewFormat,
}

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// The instance
    pub name: String,

    /// Directory to create for the report (default: valkey-report-NAME-<UTC time>); never an
    /// existing one
    #[arg(short = 'd', long, value_name = "DIR")]
    pub output_dir: Option<std::path::PathBuf>,

    /// Lines of each pod's log to include (and of the previous container's, after a restart)
    #[arg(long, value_name = "N", default_value_t = 500, value_parser = clap::value_parser!(i64).range(1..))]
    pub log_lines: i64,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The instance; without it, every instance of the namespace
    pub name: Option<String>,

    /// Every namespace (without NAME)
    #[arg(short = 'A', long, conflicts_with = "name")]
    pub all_namespaces: bool,

    /// Output format
    #[arg(short, long, value_enum, default_value_t = ViewFormat::Table, value_name = "FORMAT")]
    pub output: ViewFormat,
}

#[derive(Args, Debug)]
pub struct LogsArgs {
    /// The instance
    pub name: String,

    /// Keep streaming, and pick up pods that start later
    #[arg(short, long)]
    pub follow: bool,

    /// Lines of recent log of each pod to show; -1 shows all
    #[arg(long, value_name = "N", default_value_t = -1, allow_negative_numbers = true)]
    pub tail: i64,

    /// Only logs newer than this, e.g. 10m or 2h
    #[arg(long, value_name = "DURATION", value_parser = duration::parse)]
    pub since: Option<Duration>,

    /// Prefix each line with its timestamp (RFC 3339)
    #[arg(long)]
    pub timestamps: bool,

    /// Only this pod of the instance
    #[arg(long, value_name = "POD")]
    pub pod: Option<String>,
}

#[derive(Args, Debug)]
pub struct CliArgs {
    /// The instance
    pub name: String,

    /// Connect to a replica instead of the primary
    #[arg(long, conflicts_with = "pod")]
    pub replica: bool,

    /// Connect to this pod of the instance
    #[arg(long, value_name = "POD")]
    pub pod: Option<String>,

    /// Arguments of valkey-cli, after `--`; without them valkey-cli is interactive
    #[arg(last = true, value_name = "ARGS")]
    pub args: Vec<String>,
}

#[derive(Args, Debug)]
pub struct DeleteArgs {
    /// The instance
    pub name: String,

    /// Also delete the instance's volumes (PersistentVolumeClaims data-NAME-0, ...)
    #[arg(long)]
    pub delete_data: bool,

    /// Do not ask for confirmation
    #[arg(short, long)]
    pub yes: bool,
}

#[derive(Args, Debug)]
pub struct ScaleArgs {
    /// The instance
    pub name: String,

    /// The new number of pods (0 to 5; 0 stops the instance and keeps its data)
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub replicas: i32,
}

#[derive(Args, Debug)]
pub struct FailoverArgs {
    /// The instance
    pub name: String,

    /// The pod to hand over to (default: the replica most up to date)
    #[arg(long, value_name = "POD")]
    pub to: Option<String>,

    /// How long to wait for the operator
    #[arg(long, value_name = "DURATION", value_parser = duration::parse, default_value = "60s")]
    pub timeout: Duration,
}

#[derive(Args, Debug)]
pub struct RestartArgs {
    /// The instance
    pub name: String,

    /// Wait until every pod runs again (--wait=false: return once asked)
    #[arg(
        long,
        value_name = "BOOL",
        default_value_t = true,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub wait: bool,

    /// How long to wait for every pod to restart
    #[arg(long, value_name = "DURATION", value_parser = duration::parse, default_value = "10m")]
    pub timeout: Duration,
}

#[derive(Args, Debug)]
pub struct RotatePasswordArgs {
    /// The instance
    pub name: String,

    /// Read the new password from stdin (typed without echo on a terminal) instead of
    /// generating one
    #[arg(long)]
    pub password_stdin: bool,

    /// Wait until every pod accepts only the new password (--wait=false: return once written)
    #[arg(
        long,
        value_name = "BOOL",
        default_value_t = true,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub wait: bool,

    /// How long to wait for the rotation
    #[arg(long, value_name = "DURATION", value_parser = duration::parse, default_value = "5m")]
    pub timeout: Duration,
}

#[derive(Args, Debug)]
pub struct InstallArgs {
    /// Only print the manifests (client), or have the API server check them (server)
    #[arg(
        long,
        value_enum,
        value_name = "MODE",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "client"
    )]
    pub dry_run: Option<DryRun>,

    /// Format of the printed manifests
    #[arg(short, long, value_enum, value_name = "FORMAT")]
    pub output: Option<ObjectFormat>,

    /// How long to wait for the CRD to be served after applying
    #[arg(long, value_name = "DURATION", value_parser = duration::parse, default_value = "60s")]
    pub timeout: Duration,
}

#[derive(Args, Debug)]
pub struct CompletionArgs {
    /// The shell
    #[arg(value_enum)]
    pub shell: Shell,
}

#[derive(Args, Debug)]
pub struct VersionArgs {
    /// Only the plugin's version; do not contact the cluster
    #[arg(long)]
    pub client: bool,

    /// Output format
    #[arg(short, long, value_enum, value_name = "FORMAT")]
    pub output: Option<ObjectFormat>,
}

/// `key=value`, as `--config` takes it. The value may be empty or contain '='.
fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!(
            "expected KEY=VALUE (a valkey.conf directive), e.g. maxmemory-policy=allkeys-lru; got {s:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn key_values_split_at_the_first_equals_sign() {
        assert_eq!(
            parse_key_value("save=900 1"),
            Ok(("save".into(), "900 1".into()))
        );
        assert_eq!(parse_key_value("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert!(parse_key_value("novalue").is_err());
        assert!(parse_key_value("=x").is_err());
    }

    #[test]
    fn global_flags_are_accepted_after_the_subcommand() {
        let cli = Cli::try_parse_from([
            "kubectl-valkey",
            "status",
            "cache",
            "-n",
            "team-a",
            "--context",
            "prod",
        ])
        .map_err(|e| e.to_string());
        let cli = cli
            .as_ref()
            .map(|c| (&c.global.namespace, &c.global.context));
        assert_eq!(
            cli,
            Ok((&Some("team-a".to_owned()), &Some("prod".to_owned())))
        );
    }
}
