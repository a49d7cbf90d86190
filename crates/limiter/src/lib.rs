//! gpushare's in-container limiter: loaded through `/etc/ld.so.preload` into every
//! dynamically linked process of a GPU container, it interposes the CUDA driver API and NVML
//! so that the container sees its memory quota as its GPU's memory and cannot allocate past
//! it. Limits come from the read-only file the agent writes ([`gpushare_core::limiter`]);
//! the processes of one container share one quota through the agent-created region.
//!
//! - [`cuda`] — allocation paths (mipmapped arrays and the pre-3.2 legacy entry points
//!   included) counted and refused over quota; `cuMemGetInfo`/`_v2`,
//!   `cuDeviceTotalMem`/`_v2`; `cuGetProcAddress`/`_v2` hand back our wrappers;
//! - [`nvml`] — `nvmlDeviceGetMemoryInfo`/`_v2`;
//! - [`dl`] — `dlsym`, for programs that `dlopen` the driver;
//! - `state` — limits, region, slots, the allocation table;
//! - `real` — the real functions behind the wrappers.
//!
//! Inert until a process calls an interposed function: nothing runs at load time, and
//! `dlsym` forwards every other name untouched. Hot paths (allocation, free) are an atomic
//! add, a scan of the region's slot counters and a process-local table update: no getenv,
//! no file reads, no logging. A missing or bad limits file or region makes the counted calls
//! fail (`CUDA_ERROR_NOT_PERMITTED`, `NVML_ERROR_NO_PERMISSION`) with one stderr line.

// The exported functions are C ABI entry points: their safety contract is the CUDA / NVML
// API's, and their names are the driver's.
#![allow(clippy::missing_safety_doc, non_snake_case)]

pub mod cuda;
pub mod dl;
pub mod nvml;
mod real;
mod state;
