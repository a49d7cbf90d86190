//! gpushare: shared-GPU scheduling for Kubernetes. See README.md and DESIGN notes there.

pub mod backoff;
pub mod cmd;
pub mod config;
pub mod deviceplugin;
pub mod gpu;
pub mod http;
pub mod inspect;
pub mod kubeclient;
pub mod kubeobjects;
pub mod metrics;
pub mod node;
pub mod nri;
pub mod registry;
pub mod run;
pub mod runtime;
pub mod scheduler;
pub mod simulate;
pub mod status;
pub mod throttle;
