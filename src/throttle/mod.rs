//! The throttling controller: holds each GPU container to its compute and memory quota from
//! outside the container, on its cgroup, in a closed loop.
//!
//! - [`cgroup`]: every cgroupfs write — freeze/thaw, moving processes, the throttled child —
//!   and CPU accounting, on cgroup v1 and v2 (injectable root);
//! - [`pidmap`]: host PID → container through `/proc/PID/cgroup`;
//! - the per-GPU control law itself is pure and lives in `gpushare_core::control`;
//! - [`source`]: sample sources (sim; NVML);
//! - [`freezer`]: what the controller freezes per container: the cgroup freezer, or (for
//!   `gpushare run` where no freezer is writable) `SIGSTOP`/`SIGCONT` of its processes;
//! - [`controller`]: the thread that samples, plans and freezes/thaws;
//! - [`guardian`]: thaws everything when the agent dies, SIGKILL included;
//! - `fixture`: fakes and helpers shared by the unit and real-cgroup tests.

pub mod cgroup;
pub mod controller;
#[doc(hidden)]
pub mod fixture;
pub mod freezer;
pub mod guardian;
pub mod pidmap;
pub mod source;
