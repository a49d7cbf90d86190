//! The runtime-level modes, for runtimes without NRI: `gpushare runtime` (an OCI runtime
//! wrapper) and `gpushare hook` (OCI hooks) on one side, the agent's local API and its
//! registry resync from runc's state on the other.

pub mod api;
pub mod client;
pub mod hook;
pub mod oci;
pub mod pending;
pub mod resync;
pub mod wrapper;
