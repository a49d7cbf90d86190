//! The registry rebuilt from the runtime's own state at the agent's start, for the
//! runtime-level modes (no NRI Synchronize there): every container runc lists under the
//! configured roots, read from its bundle's `config.json` as the wrapper left it, handed to
//! the same `synchronize` the NRI path uses — accounted, checked for its adjustment (a GPU
//! container without one is killed) and put on the books.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;

use super::oci::{self, BundleSpec};
use crate::node::Node;
use crate::nri::api::nri_api::{ContainerState as NriState, SynchronizeRequest};
use crate::nri::service::Handler;

/// One entry of `runc list --format json`.
#[derive(Debug, Clone, Deserialize)]
pub struct Listed {
    pub id: String,
    #[serde(default)]
    pub pid: u32,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub bundle: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum ResyncError {
    #[error("cannot run {} list for root {}: {source}", runc.display(), root.display())]
    Run {
        runc: PathBuf,
        root: PathBuf,
        source: std::io::Error,
    },
    #[error("{} list for root {} failed: {stderr}", runc.display(), root.display())]
    Failed {
        runc: PathBuf,
        root: PathBuf,
        stderr: String,
    },
    #[error("{} list for root {} printed what is not its JSON: {reason}", runc.display(), root.display())]
    Parse {
        runc: PathBuf,
        root: PathBuf,
        reason: String,
    },
    #[error("{0}")]
    Synchronize(String),
}

/// The containers runc knows under `root` (a root that does not exist yet has none).
pub fn list(runc: &Path, root: &Path) -> Result<Vec<Listed>, ResyncError> {
    if !root.exists() {
        return Ok(Vec::new());
    }
    let out = Command::new(runc)
        .arg("--root")
        .arg(root)
        .args(["list", "--format", "json"])
        .output()
        .map_err(|source| ResyncError::Run {
            runc: runc.into(),
            root: root.into(),
            source,
        })?;
    if !out.status.success() {
        return Err(ResyncError::Failed {
            runc: runc.into(),
            root: root.into(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    let text = String::from_utf8_lossy(&out.stdout);
    // runc prints `null` for an empty root.
    let listed: Option<Vec<Listed>> =
        serde_json::from_str(text.trim()).map_err(|e| ResyncError::Parse {
            runc: runc.into(),
            root: root.into(),
            reason: e.to_string(),
        })?;
    Ok(listed.unwrap_or_default())
}

/// Rebuilds the node's registry from `roots`; returns how many containers were read.
pub fn resync(node: &Node, runc: &Path, roots: &[PathBuf]) -> Result<usize, ResyncError> {
    let mut req = SynchronizeRequest::default();
    for root in roots {
        for c in list(runc, root)? {
            let state = match c.status.as_str() {
                "created" => NriState::CONTAINER_CREATED,
                "running" | "paused" => NriState::CONTAINER_RUNNING,
                _ => NriState::CONTAINER_STOPPED,
            };
            let b = match BundleSpec::load(&c.bundle) {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!(container = %c.id, error = %e, "resync: cannot read its spec; skipped");
                    continue;
                }
            };
            // A pod's pause container carries the pod's annotations, and is never a GPU
            // container (the wrapper passes it through).
            if b.is_sandbox() {
                continue;
            }
            let (pod, ctr) = oci::describe(&c.id, &b, state, c.pid);
            if !req.pods.iter().any(|p| p.id == pod.id) {
                req.pods.push(pod);
            }
            req.containers.push(ctr);
        }
    }
    let n = req.containers.len();
    node.synchronize(&req)
        .map_err(|e| ResyncError::Synchronize(e.message))?;
    Ok(n)
}
