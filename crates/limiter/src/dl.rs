//! `dlsym` interposition: programs that `dlopen` the driver (the CUDA runtime, nvidia-smi)
//! and resolve entry points with `dlsym(handle, name)` get our wrapper for every name we
//! interpose, whatever the handle, as long as the real lookup finds the name (so a probe for
//! a symbol the driver lacks still fails).
//!
//! The path is allocation- and lock-free (only glibc's own loader lock, inside the real
//! `dlsym`): Rust's std and the loader may call `dlsym` during start-up. A per-thread guard
//! sends a nested call straight to glibc.
//!
//! On x86-64 the exported `dlsym` is a small trampoline that tail-jumps to glibc's for every
//! name we do not interpose, so glibc sees the program's return address: `dlsym(RTLD_NEXT, …)`
//! keeps meaning "after the caller", which a plain wrapper would change to "after the limiter"
//! (breaking other interposers that chain with `RTLD_NEXT`).

use std::cell::Cell;
use std::ffi::{CStr, c_char, c_void};

use crate::cuda::*;
use crate::nvml::*;
use crate::real::{RealSym, real_dlsym};

/// A driver entry point we interpose: the real symbol and our wrapper.
pub(crate) struct Hook(pub(crate) &'static RealSym, pub(crate) *mut c_void);

// SAFETY: the pointers are addresses of functions in this library, immutable.
unsafe impl Sync for Hook {}

macro_rules! hooks {
    ($($real:ident => $wrapper:ident),* $(,)?) => {
        [$(Hook(&$real, $wrapper as *mut c_void)),*]
    };
}

static CUDA_HOOKS: [Hook; 52] = hooks![
    R_MEM_ALLOC => cuMemAlloc_v2,
    R_MEM_ALLOC_PITCH => cuMemAllocPitch_v2,
    R_MEM_ALLOC_MANAGED => cuMemAllocManaged,
    R_MEM_ALLOC_ASYNC => cuMemAllocAsync,
    R_MEM_ALLOC_ASYNC_PTSZ => cuMemAllocAsync_ptsz,
    R_MEM_ALLOC_FROM_POOL_ASYNC => cuMemAllocFromPoolAsync,
    R_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ => cuMemAllocFromPoolAsync_ptsz,
    R_MEM_FREE => cuMemFree_v2,
    R_MEM_FREE_ASYNC => cuMemFreeAsync,
    R_MEM_FREE_ASYNC_PTSZ => cuMemFreeAsync_ptsz,
    R_MEM_POOL_TRIM_TO => cuMemPoolTrimTo,
    R_MEM_POOL_DESTROY => cuMemPoolDestroy,
    R_GRAPH_ADD_MEM_ALLOC_NODE => cuGraphAddMemAllocNode,
    R_GRAPH_ADD_MEM_FREE_NODE => cuGraphAddMemFreeNode,
    R_GRAPH_ADD_NODE => cuGraphAddNode,
    R_GRAPH_ADD_NODE_V2 => cuGraphAddNode_v2,
    R_GRAPH_LAUNCH => cuGraphLaunch,
    R_GRAPH_LAUNCH_PTSZ => cuGraphLaunch_ptsz,
    R_GRAPH_UPLOAD => cuGraphUpload,
    R_GRAPH_UPLOAD_PTSZ => cuGraphUpload_ptsz,
    R_GRAPH_INSTANTIATE_WITH_PARAMS => cuGraphInstantiateWithParams,
    R_GRAPH_INSTANTIATE_WITH_PARAMS_PTSZ => cuGraphInstantiateWithParams_ptsz,
    R_GRAPH_EXEC_DESTROY => cuGraphExecDestroy,
    R_DEVICE_GRAPH_MEM_TRIM => cuDeviceGraphMemTrim,
    R_MEM_CREATE => cuMemCreate,
    R_MEM_RELEASE => cuMemRelease,
    R_MEM_MAP => cuMemMap,
    R_MEM_UNMAP => cuMemUnmap,
    R_MEM_RETAIN_ALLOCATION_HANDLE => cuMemRetainAllocationHandle,
    R_ARRAY_CREATE => cuArrayCreate_v2,
    R_ARRAY_3D_CREATE => cuArray3DCreate_v2,
    R_ARRAY_DESTROY => cuArrayDestroy,
    R_MIPMAPPED_ARRAY_CREATE => cuMipmappedArrayCreate,
    R_MIPMAPPED_ARRAY_DESTROY => cuMipmappedArrayDestroy,
    R_MEM_GET_INFO => cuMemGetInfo_v2,
    R_DEVICE_TOTAL_MEM => cuDeviceTotalMem_v2,
    R_MEM_ALLOC_V1 => cuMemAlloc,
    R_MEM_ALLOC_PITCH_V1 => cuMemAllocPitch,
    R_MEM_FREE_V1 => cuMemFree,
    R_ARRAY_CREATE_V1 => cuArrayCreate,
    R_ARRAY_3D_CREATE_V1 => cuArray3DCreate,
    R_MEM_GET_INFO_V1 => cuMemGetInfo,
    R_DEVICE_TOTAL_MEM_V1 => cuDeviceTotalMem,
    R_CTX_DESTROY => cuCtxDestroy_v2,
    R_CTX_DESTROY_V1 => cuCtxDestroy,
    R_PRIMARY_CTX_RETAIN => cuDevicePrimaryCtxRetain,
    R_PRIMARY_CTX_RELEASE => cuDevicePrimaryCtxRelease_v2,
    R_PRIMARY_CTX_RELEASE_V1 => cuDevicePrimaryCtxRelease,
    R_PRIMARY_CTX_RESET => cuDevicePrimaryCtxReset_v2,
    R_PRIMARY_CTX_RESET_V1 => cuDevicePrimaryCtxReset,
    R_GET_PROC_ADDRESS => cuGetProcAddress,
    R_GET_PROC_ADDRESS_V2 => cuGetProcAddress_v2,
];

static NVML_HOOKS: [Hook; 2] = hooks![
    R_NVML_MEMORY_INFO => nvmlDeviceGetMemoryInfo,
    R_NVML_MEMORY_INFO_V2 => nvmlDeviceGetMemoryInfo_v2,
];

/// The CUDA entry points we interpose (for `cuGetProcAddress`).
pub(crate) fn cuda_hooks() -> &'static [Hook] {
    &CUDA_HOOKS
}

/// Our wrapper for `name`, if we interpose it. Compares bytes only (no allocation).
pub(crate) fn wrapper_for(name: &[u8]) -> Option<*mut c_void> {
    let table: &[Hook] = if name.starts_with(b"cu") {
        &CUDA_HOOKS
    } else if name.starts_with(b"nvml") {
        &NVML_HOOKS
    } else {
        return None;
    };
    table
        .iter()
        .find(|Hook(real, _)| real.name().to_bytes() == name)
        .map(|Hook(_, wrapper)| *wrapper)
}

thread_local! {
    /// Set while this thread is inside our dlsym lookup (const-initialised, no destructor:
    /// plain TLS, no allocation on first use).
    static IN_LOOKUP: Cell<bool> = const { Cell::new(false) };
}

/// Our answer for `dlsym(handle, symbol)`: the wrapper if we interpose the name and the real
/// lookup finds it, else null (the caller then asks glibc). Always leaves `REAL_DLSYM` set.
extern "C" fn dlsym_lookup(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let real = real_dlsym();
    if symbol.is_null() || IN_LOOKUP.get() {
        return std::ptr::null_mut();
    }
    // SAFETY: symbol is the caller's non-null NUL-terminated name (dlsym's contract).
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    let Some(wrapper) = wrapper_for(name) else {
        return std::ptr::null_mut();
    };
    IN_LOOKUP.set(true);
    // SAFETY: forwarding the caller's arguments to glibc's dlsym.
    let found = unsafe { real(handle, symbol) };
    IN_LOOKUP.set(false);
    if found.is_null() {
        std::ptr::null_mut()
    } else {
        wrapper
    }
}

/// `dlsym`: our wrapper for interposed names, else a tail jump to glibc's `dlsym` with the
/// caller's return address intact.
#[cfg(target_arch = "x86_64")]
#[unsafe(no_mangle)]
#[unsafe(naked)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // Entry: rsp = 8 mod 16. Two pushes + 8 keep the call aligned; rdi/rsi are restored for the
    // tail jump, so glibc gets the original arguments and return address.
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {lookup}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jnz 2f",
        "jmp qword ptr [rip + {real}]",
        "2:",
        "ret",
        lookup = sym dlsym_lookup,
        real = sym crate::real::REAL_DLSYM,
    )
}

/// `dlsym` on other architectures: the same answers; `RTLD_NEXT` is relative to the limiter.
#[cfg(not(target_arch = "x86_64"))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let ours = dlsym_lookup(handle, symbol);
    if !ours.is_null() {
        return ours;
    }
    // SAFETY: forwarding the caller's arguments to glibc's dlsym.
    unsafe { real_dlsym()(handle, symbol) }
}
