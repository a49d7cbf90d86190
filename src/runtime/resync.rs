//! The registry rebuilt from the runtime's own state at the agent's start, for the
//! runtime-level modes (no NRI Synchronize there): every container runc lists under the
//! configured roots, read from its bundle's `config.json` as the wrapper or the precreate
//! hook left it (under the hook's handle when it has one), handed to the same `synchronize`
//! the NRI path uses — accounted, checked for its adjustment (a GPU container without one is
//! killed) and put on the books.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde::Deserialize;

use super::api;
use super::oci::{self, BundleSpec};
use super::pending::Pending;
use crate::node::Node;
use crate::nri::api::nri_api::{ContainerState as NriState, PodSandbox, SynchronizeRequest};
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

/// The id a container is on the agent's books under: the precreate hook's handle when it has
/// one (podman's hooks.d; runc's id was not known then), else runc's. A handle that is not a
/// valid id is not used (it would name the agent's files).
pub fn registry_id(runc_id: &str, b: &BundleSpec) -> String {
    match oci::handle(b) {
        Some(h) if api::check_id(&h).is_ok() => h,
        Some(h) => {
            tracing::warn!(container = %runc_id, handle = %gpushare_core::echo::Echo::new(&h), "resync: invalid handle; runc's id used");
            runc_id.to_string()
        }
        None => runc_id.to_string(),
    }
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
            let id = registry_id(&c.id, &b);
            let (pod, ctr) = oci::describe(&id, &b, state, c.pid);
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

/// Releases the precreate hook's containers that have not started within the grace period
/// and that runc does not have under `roots` (their creation failed after the hook; see
/// `pending`). Returns their ids.
pub fn sweep(
    node: &Node,
    pending: &Pending,
    runc: &Path,
    roots: &[PathBuf],
    now: Instant,
) -> Result<Vec<String>, ResyncError> {
    let due = pending.due(now);
    if due.is_empty() {
        return Ok(Vec::new());
    }
    let mut present = HashSet::new();
    for root in roots {
        for c in list(runc, root)? {
            present.insert(match BundleSpec::load(&c.bundle) {
                Ok(b) => registry_id(&c.id, &b),
                Err(_) => c.id,
            });
        }
    }
    let released = pending.unclaimed(&due, &present);
    for id in &released {
        tracing::warn!(%id, grace = ?pending.grace(), "admitted by the precreate hook, never created by the runtime: released");
        node.remove_container(&PodSandbox::default(), &api::by_id(id));
        pending.settled(id);
    }
    Ok(released)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bundle(annotations: serde_json::Value) -> BundleSpec {
        let json =
            json!({"ociVersion": "1.0.2", "root": {"path": "rootfs"}, "annotations": annotations});
        BundleSpec::parse("config.json".into(), &serde_json::to_vec(&json).unwrap()).unwrap()
    }

    #[test]
    fn the_hooks_containers_are_on_the_books_under_their_handle() {
        let b = bundle(json!({"gpushare.io/handle": "hook-0a"}));
        assert_eq!(registry_id("4f2c", &b), "hook-0a");
        assert_eq!(registry_id("4f2c", &bundle(json!({}))), "4f2c");
        let b = bundle(json!({"gpushare.io/handle": "../../etc"}));
        assert_eq!(registry_id("4f2c", &b), "4f2c", "never a path");
    }
}
