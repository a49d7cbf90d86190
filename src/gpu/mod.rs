//! The node's GPUs as the agent finds them: device-node discovery, the simulated backend's
//! device nodes, NVML. The inventory types themselves live in `gpushare_core::inventory`.

pub mod devices;
pub mod nvml;
pub mod sim;
