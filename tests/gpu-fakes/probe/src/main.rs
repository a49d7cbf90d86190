//! `gpu-probe MODE STEP…`: reaches the CUDA driver the way the CUDA runtime does, then runs
//! the steps (see `api.rs`). Modes:
//! - `dlopen` — `dlopen("libcuda.so.1")` + `dlsym` of each versioned name;
//! - `procaddr` — `dlsym` only `cuGetProcAddress_v2`, then every entry point through it by base
//!   name at CUDA version 12000 (as CUDA ≥ 12 runtimes do);
//! - `procaddr-v1` — the same through the 4-argument `cuGetProcAddress` at version 11080;
//!
//! In the `procaddr` modes the legacy steps' entry points are looked up at version 3000 (before
//! `_v2`), as a binary built against CUDA < 3.2 gets them.
//! - `nvml` — no CUDA at all (NVML steps only, as nvidia-smi).

mod api;

use std::ffi::{c_int, c_void};

use api::{Cuda, dlopen, dlsym, fail};

type GetProcV2 = unsafe extern "C" fn(
    *const std::ffi::c_char,
    *mut *mut c_void,
    c_int,
    u64,
    *mut c_int,
) -> c_int;
type GetProcV1 =
    unsafe extern "C" fn(*const std::ffi::c_char, *mut *mut c_void, c_int, u64) -> c_int;

/// The CUDA version the legacy entry points are looked up at: before 3.2 (3020) brought `_v2`.
const LEGACY_VERSION: c_int = 3000;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((mode, steps)) = args.split_first() else {
        fail("usage: gpu-probe dlopen|procaddr|procaddr-v1|nvml STEP…");
    };
    if mode == "nvml" {
        api::run_nvml_only(steps);
        return;
    }
    let lib = dlopen(c"libcuda.so.1");
    let cuda = match mode.as_str() {
        "dlopen" => Cuda::resolve(&|name| dlsym(lib, name), false, &|name| dlsym(lib, name)),
        "procaddr" => {
            let p = dlsym(lib, c"cuGetProcAddress_v2");
            if p.is_null() {
                fail("no cuGetProcAddress_v2");
            }
            // SAFETY: cuGetProcAddress_v2's C signature.
            let get: GetProcV2 = unsafe { std::mem::transmute(p) };
            let at = |version: c_int| {
                move |name: &std::ffi::CStr| {
                    let mut f = std::ptr::null_mut();
                    let mut status = 0;
                    // SAFETY: valid name and out-pointers.
                    let rc = unsafe { get(name.as_ptr(), &mut f, version, 0, &mut status) };
                    if rc != 0 { std::ptr::null_mut() } else { f }
                }
            };
            Cuda::resolve(&at(12000), true, &at(LEGACY_VERSION))
        }
        "procaddr-v1" => {
            let p = dlsym(lib, c"cuGetProcAddress");
            if p.is_null() {
                fail("no cuGetProcAddress");
            }
            // SAFETY: cuGetProcAddress's C signature.
            let get: GetProcV1 = unsafe { std::mem::transmute(p) };
            let at = |version: c_int| {
                move |name: &std::ffi::CStr| {
                    let mut f = std::ptr::null_mut();
                    // SAFETY: valid name and out-pointer.
                    let rc = unsafe { get(name.as_ptr(), &mut f, version, 0) };
                    if rc != 0 { std::ptr::null_mut() } else { f }
                }
            };
            Cuda::resolve(&at(11080), true, &at(LEGACY_VERSION))
        }
        other => fail(&format!("unknown mode {other:?}")),
    };
    api::run(&cuda, steps);
}
