//! One way to reach the API server for every subcommand: `--kubeconfig FILE`, else
//! `$KUBECONFIG`, else the in-cluster service account, else `~/.kube/config`.

use std::path::Path;

use anyhow::Context as _;

/// A client for `kubeconfig` (or the usual fallbacks when `None`).
pub async fn client(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .with_context(|| format!("kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("no Kubernetes configuration (set --kubeconfig or KUBECONFIG)")?,
    };
    kube::Client::try_from(config).context("cannot build the Kubernetes client")
}
