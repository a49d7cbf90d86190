//! `gpushare scheduler`: the kube-scheduler extender (filter, prioritize, bind), served by
//! `scheduler::serve`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

use crate::config::LogConfig;
use gpushare_core::placement::{POLICIES, UnknownPolicy};
use gpushare_core::request::{MemoryUnit, ResourceNames};

#[derive(Args, Debug, Clone)]
pub struct SchedulerArgs {
    /// Address of the extender's HTTP endpoint (filter, prioritize, bind, healthz, metrics).
    #[arg(long, default_value = "127.0.0.1:39999")]
    pub listen: SocketAddr,
    /// Kubeconfig (default: $KUBECONFIG, ~/.kube/config, in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Node-ranking policy: gpushare, fgd, bestfit, binpack, spread. The GPU inside a node
    /// follows the node's `ack.node.gpu.placement` label when set.
    #[arg(long, default_value = "gpushare")]
    pub policy: String,
    /// Filter answers only the N fitting nodes the policy ranks best. 1 (default):
    /// kube-scheduler places the pod on the policy's choice without scoring or calling
    /// prioritize; 0: every fitting node, ranked again by kube-scheduler's score plugins
    /// plus the extender's prioritize.
    #[arg(long, default_value_t = 1)]
    pub filter_best: usize,
    /// Seconds an assumed allocation is held when its pod is never seen bound.
    #[arg(long, default_value_t = 300)]
    pub assume_ttl_secs: u64,
    /// Unit of the memory resource: GiB or MiB.
    #[arg(long, default_value = "GiB", value_parser = clap::value_parser!(MemoryUnit))]
    pub memory_unit: MemoryUnit,
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// Serving certificate (PEM) of the extender's HTTPS endpoint.
    #[arg(long, requires_all = ["tls_key", "client_ca"])]
    pub tls_cert: Option<PathBuf>,
    /// Key (PEM) of the serving certificate.
    #[arg(long, requires_all = ["tls_cert", "client_ca"])]
    pub tls_key: Option<PathBuf>,
    /// CA (PEM) whose client certificates may call the extender: kube-scheduler's extender
    /// `tlsConfig.certFile` must be signed by it. Use a CA of its own for this.
    #[arg(long, requires_all = ["tls_cert", "tls_key"])]
    pub client_ca: Option<PathBuf>,
    /// Serve plain HTTP without authentication (a loopback `--listen` only; tests and
    /// benchmarks): anyone who can connect can have pods bound.
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key", "client_ca"])]
    pub insecure_http: bool,
    /// Only pods with this `schedulerName` are bound (repeat for several profiles).
    #[arg(long = "scheduler-name", default_values_t = [String::from("default-scheduler"), String::from("gpushare-scheduler")])]
    pub scheduler_names: Vec<String>,
}

pub fn run(args: &SchedulerArgs) -> anyhow::Result<()> {
    super::logging::init(&LogConfig {
        level: args.log_level.clone(),
        ..Default::default()
    })?;
    if !POLICIES.contains(&args.policy.as_str()) {
        return Err(UnknownPolicy(args.policy.clone()).into());
    }
    let tls = match (&args.tls_cert, &args.tls_key, &args.client_ca) {
        (Some(cert), Some(key), Some(ca)) => Some(crate::http::mtls_config(cert, key, ca)?),
        _ if args.insecure_http => {
            if !args.listen.ip().is_loopback() {
                anyhow::bail!(
                    "--insecure-http serves without authentication and is allowed on a loopback --listen only, not {}",
                    args.listen
                );
            }
            tracing::warn!(listen = %args.listen, "serving plain HTTP without authentication (--insecure-http)");
            None
        }
        _ => anyhow::bail!(
            "the extender binds pods with the scheduler's identity, so it authenticates its callers: pass --tls-cert, --tls-key and --client-ca (kube-scheduler's extender tlsConfig presents a client certificate signed by that CA), or --insecure-http on a loopback --listen for a test setup"
        ),
    };
    let settings = crate::scheduler::Settings {
        policy: args.policy.clone(),
        names: ResourceNames {
            memory_unit: args.memory_unit,
            ..Default::default()
        },
        assume_ttl: Duration::from_secs(args.assume_ttl_secs),
        scheduler_names: args.scheduler_names.clone(),
        filter_best: args.filter_best,
        tls,
    };
    // One thread serves it all: kube-scheduler asks filter one pod at a time, and the
    // placement state is behind one lock, so more workers only add cross-thread wake-ups
    // (17 % less extender CPU per pod bound on the KWOK bench, BENCHMARKS.md 2026-12-06).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    rt.block_on(async {
        let client = crate::kubeclient::client(args.kubeconfig.as_deref()).await?;
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        tracing::info!(listen = %args.listen, policy = %args.policy, "gpushare scheduler extender serving");
        crate::scheduler::serve(client, listener, settings, super::shutdown_signal())
            .await
            .context("extender server")
    })
}
