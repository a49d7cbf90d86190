//! The command layer: one module per subcommand, each owning its flags (clap), its async
//! runtime, its logging and `anyhow`. Everything below it (`node`, `scheduler`, `throttle`,
//! `gpushare_core`, …) returns typed errors.

pub mod guardian;
pub mod inspect;
pub mod logging;
pub mod node;
pub mod run;
pub mod scheduler;
pub mod simulate;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "gpushare",
    version,
    about = "Shared-GPU scheduling for Kubernetes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the node agent: the containerd/CRI-O NRI plugin.
    Node(node::NodeArgs),
    /// Print the node's GPU capacity as the device plugin advertises it.
    Capacity(node::NodeArgs),
    /// (Started by `gpushare node`.) Thaw the listed cgroups once the agent is gone.
    Guardian(guardian::GuardianArgs),
    /// Replay a cluster trace through the placement policies and report GPU fragmentation.
    Simulate(simulate::SimulateArgs),
    /// Show GPU allocation per node and GPU (like `kubectl inspect cgpu`).
    Inspect(inspect::InspectArgs),
    /// The kube-scheduler extender: filter, prioritize and bind GPU-sharing pods.
    Scheduler(scheduler::SchedulerArgs),
    /// Run one command under a GPU quota on this machine, without Kubernetes.
    Run(run::RunArgs),
    /// An OCI runtime wrapper (containerd's runc BinaryName, podman --runtime) for runtimes
    /// without NRI: every argument is runc's.
    #[command(disable_help_flag = true)]
    Runtime {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// An OCI hook (podman's hooks.d, for runtimes without NRI): `precreate` writes the
    /// agent's decision into the spec on stdin (to stdout); `poststart` and `poststop` tell
    /// the agent, reading the state on stdin.
    Hook {
        #[arg(value_enum)]
        stage: crate::runtime::hook::Stage,
    },
}

/// The `gpushare` binary.
pub fn main() -> anyhow::Result<()> {
    // A pre-installed NRI plugin is started by the runtime with no arguments, an empty
    // environment and its socket on the fd named by NRI_PLUGIN_SOCKET.
    if let Ok(fd) = std::env::var("NRI_PLUGIN_SOCKET")
        && std::env::args().len() == 1
    {
        return node::run_preinstalled(&fd);
    }
    // Linked as `gpushare-runtime`: the runtime wrapper, every argument runc's.
    let mut argv = std::env::args_os();
    if let Some(argv0) = argv.next()
        && crate::runtime::wrapper::invoked_as_wrapper(&argv0)
    {
        std::process::exit(crate::runtime::wrapper::run(argv.collect()));
    }
    match Cli::parse().command {
        Command::Node(args) => node::run(&args),
        Command::Capacity(args) => node::capacity(&args),
        Command::Guardian(args) => guardian::run(&args),
        Command::Simulate(args) => simulate::run(&args),
        Command::Inspect(args) => inspect::run(&args),
        Command::Scheduler(args) => scheduler::run(&args),
        Command::Run(args) => run::run(&args),
        Command::Runtime { args } => std::process::exit(crate::runtime::wrapper::run(args)),
        Command::Hook { stage } => std::process::exit(crate::runtime::hook::run(stage)),
    }
}

/// The node agent's runtime: two workers are plenty for its sockets and timers.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
