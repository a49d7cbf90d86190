//! One way to reach the API server for every subcommand: `--kubeconfig FILE`, else
//! `$KUBECONFIG`, else `~/.kube/config`, else the in-cluster service account.

use std::path::{Path, PathBuf};

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum KubeClientError {
    #[error("cannot read kubeconfig {path}: {source}")]
    Read {
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("kubeconfig {path}: {source}")]
    Config {
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("no Kubernetes configuration (set --kubeconfig or KUBECONFIG): {0}")]
    Infer(#[from] kube::config::InferConfigError),
    #[error("cannot build the Kubernetes client: {0}")]
    Client(#[from] kube::Error),
}

/// A client for `kubeconfig` (or the usual fallbacks when `None`).
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, KubeClientError> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|source| {
                KubeClientError::Read {
                    path: path.to_path_buf(),
                    source,
                }
            })?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(|source| KubeClientError::Config {
                    path: path.to_path_buf(),
                    source,
                })?
        }
        None => kube::Config::infer().await?,
    };
    Ok(kube::Client::try_from(config)?)
}
