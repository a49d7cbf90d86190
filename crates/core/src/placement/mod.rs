//! GPU placement: which node and which GPUs a pod gets. Pure (no IO); used by the scheduler
//! extender and by `gpushare simulate`.
//!
//! - [`model`] — nodes (GPUs, the `ack.node.gpu.schedule` / `ack.node.gpu.placement` labels)
//!   and requests;
//! - [`state`] — per-node free resources, updated incrementally, and the feasibility rules;
//! - [`reject`] — why a pod does not fit, per node and for the cluster;
//! - [`policy`] — the policies (`gpushare`, `fgd`, `bestfit`, `binpack`, `spread`);
//! - [`engine`] — the decision loop over a cluster.

pub mod engine;
pub mod fgd;
pub mod frag;
pub mod gpushare;
pub mod model;
pub mod policy;
pub mod reject;
pub mod state;
pub mod workload;

pub use engine::{Engine, PlacedGpu, Placement, RequestKey, Scorer};
pub use model::{
    GpuDemand, GpuPlacement, GpuSpec, InvalidRequest, NodeSpec, Request, ScheduleMode,
};
pub use policy::{Choice, POLICIES, PlacementPolicy, UnknownPolicy, by_name};
pub use reject::{Reject, Unschedulable, Why};
pub use state::{GpuSet, GpuState, NodeState};
pub use workload::{Shape, ShapeLearner, Workload};
