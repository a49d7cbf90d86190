//! gpushare's contract and decisions, pure (serde and thiserror only; no IO, no async, no
//! filesystem): what the node agent, the scheduler extender, `gpushare simulate` and the
//! in-container limiter all agree on.
//!
//! - [`inventory`] — the GPUs of a node ([`inventory::GpuInfo`]), their device nodes as a
//!   container sees them, the simulated inventory, the capacity the device plugin advertises;
//! - [`request`] — the request contract (pod limits, the device plugin's grant, the
//!   scheduler's `gpushare.io/assignment`, the node's `gpushare.io/gpus`), parsed and
//!   validated in one place;
//! - [`adjust`] — what a GPU container gets: device nodes, environment, mounts;
//! - [`placement`] — which node and GPUs a pod gets (the scheduler and `simulate`);
//! - [`control`] — the throttle control law (per-GPU run windows from quotas and samples);
//! - [`limiter`] — the in-container limiter contract: container paths, the limits file, the
//!   shared accounting region layout;
//! - [`echo`], [`json`], [`rfc3339`], [`procstat`] — reading outside input: how an error shows
//!   an outside value (cut), JSON with field paths and no duplicate keys, RFC 3339 date-times,
//!   the fields of a `/proc/PID/stat` line;
//! - [`spin`] — a fork-safe spin lock (the limiter's allocation table).

pub mod adjust;
pub mod control;
pub mod echo;
pub mod inventory;
pub mod json;
pub mod limiter;
pub mod placement;
pub mod procstat;
pub mod request;
pub mod rfc3339;
pub mod spin;
