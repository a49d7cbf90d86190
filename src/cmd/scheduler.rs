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
    #[command(flatten)]
    pub resources: ResourceNameArgs,
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

/// The extended-resource names GPU pods ask for: the node agent's `[resources]`, and
/// kube-scheduler's `managedResources` for the extender. The same three everywhere.
#[derive(Args, Debug, Clone)]
pub struct ResourceNameArgs {
    /// Name of the GPU-memory resource.
    #[arg(long, default_value = "aliyun.com/gpu-mem", value_parser = extended_resource_name)]
    pub memory_resource: String,
    /// Name of the compute (percent of one GPU) resource.
    #[arg(long, default_value = "aliyun.com/gpu-core.percentage", value_parser = extended_resource_name)]
    pub core_resource: String,
    /// Name of the whole-GPU count resource.
    #[arg(long, default_value = "aliyun.com/gpu-count", value_parser = extended_resource_name)]
    pub count_resource: String,
}

impl ResourceNameArgs {
    /// The names with `memory_unit`; an error names two flags given the same resource.
    pub fn names(&self, memory_unit: MemoryUnit) -> anyhow::Result<ResourceNames> {
        let (m, c, n) = (
            &self.memory_resource,
            &self.core_resource,
            &self.count_resource,
        );
        for (a, b, x, y) in [
            ("--memory-resource", "--core-resource", m, c),
            ("--memory-resource", "--count-resource", m, n),
            ("--core-resource", "--count-resource", c, n),
        ] {
            if x == y {
                anyhow::bail!("{a} and {b} are both {x:?}: the three resources need three names");
            }
        }
        Ok(ResourceNames {
            memory: m.clone(),
            core: c.clone(),
            count: n.clone(),
            memory_unit,
        })
    }
}

/// An extended resource name as Kubernetes accepts one: `DOMAIN/NAME`, the domain a DNS
/// subdomain outside `kubernetes.io`, the name 1–63 characters of letters, digits, `-`, `_`
/// and `.` that begin and end with a letter or digit.
pub fn extended_resource_name(s: &str) -> Result<String, String> {
    let Some((domain, name)) = s.split_once('/') else {
        return Err(format!("{s:?} is not DOMAIN/NAME"));
    };
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if domain.len() > 253 || !domain.split('.').all(label_ok) {
        return Err(format!("{s:?}: {domain:?} is not a DNS subdomain"));
    }
    if domain == "kubernetes.io" || domain.ends_with(".kubernetes.io") {
        return Err(format!("{s:?}: the kubernetes.io domain is reserved"));
    }
    let alnum = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_alphanumeric());
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && alnum(name.bytes().next())
        && alnum(name.bytes().last());
    if !name_ok {
        return Err(format!(
            "{s:?}: {name:?} must be 1-63 letters, digits, '-', '_' or '.', beginning and ending with a letter or digit"
        ));
    }
    Ok(s.to_string())
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
        names: args.resources.names(args.memory_unit)?,
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: SchedulerArgs,
    }

    #[test]
    fn resource_names_are_taken_and_checked() {
        let parse = |extra: &[&str]| {
            Cli::try_parse_from(["scheduler"].iter().chain(extra))
                .map(|c| c.args)
                .map_err(|e| e.to_string())
        };
        let d = parse(&[]).unwrap();
        assert_eq!(
            d.resources.names(d.memory_unit).unwrap(),
            ResourceNames::default()
        );
        let c = parse(&[
            "--memory-resource=example.com/vgpu-memory",
            "--core-resource",
            "example.com/vgpu-cores",
            "--count-resource=example.com/vgpu",
            "--memory-unit=MiB",
        ])
        .unwrap();
        let n = c.resources.names(c.memory_unit).unwrap();
        assert_eq!(
            (
                n.memory.as_str(),
                n.core.as_str(),
                n.count.as_str(),
                n.memory_unit
            ),
            (
                "example.com/vgpu-memory",
                "example.com/vgpu-cores",
                "example.com/vgpu",
                MemoryUnit::MiB
            )
        );
        for (bad, why) in [
            ("gpu-mem", "is not DOMAIN/NAME"),
            ("Example.com/gpu", "is not a DNS subdomain"),
            ("example.com/-gpu", "must be 1-63"),
            ("example.com/", "must be 1-63"),
            ("example.com/a/b", "must be 1-63"),
            ("node.kubernetes.io/gpu", "reserved"),
        ] {
            let e = parse(&["--memory-resource", bad]).unwrap_err();
            assert!(
                e.contains("--memory-resource") && e.contains(why),
                "{bad}: {e}"
            );
        }
        let same = parse(&["--core-resource=aliyun.com/gpu-mem"]).unwrap();
        let e = same
            .resources
            .names(same.memory_unit)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--memory-resource and --core-resource are both"),
            "{e}"
        );
    }
}
