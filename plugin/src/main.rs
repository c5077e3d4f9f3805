//! `kubectl-valkey`, also run as `kubectl_complete-valkey` for kubectl's shell completion.

fn main() {
    let code = kubectl_valkey::run(std::env::args_os().collect());
    std::process::exit(code);
}
