//! The throttling controller: holds each GPU container to its compute and memory quota from
//! outside the container, on its cgroup, in a closed loop.
//!
//! - [`cgroup`]: freeze/thaw and CPU accounting on cgroup v1 and v2 (injectable root);
//! - [`pidmap`]: host PID → container through `/proc/PID/cgroup`;
//! - [`control`]: the per-GPU control law (pure);

pub mod cgroup;
pub mod control;
pub mod pidmap;
