//! The CUDA driver API wrappers: every allocation path counted against the container's quota
//! and refused over it with `CUDA_ERROR_OUT_OF_MEMORY` before the driver is called; the
//! memory views report the quota as the GPU's total.
//!
//! Which GPU an allocation lands on: the current context's device (`cuCtxGetDevice`), or the
//! location a VMM allocation names. A CUDA device is matched to the limits file by UUID
//! (`cuDeviceGetUuid`), falling back to its ordinal as a position in the file.
//!
//! The pre-3.2 entry points that old binaries still link (`cuMemAlloc`, `cuMemAllocPitch`,
//! `cuMemFree`, `cuArrayCreate`, `cuArray3DCreate`, `cuMemGetInfo`, `cuDeviceTotalMem`: 32-bit
//! sizes and `CUdeviceptr_v1`) are wrapped like their `_v2` successors and share their counts;
//! their views saturate at 4 GiB − 1.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::AtomicU8;
use std::sync::atomic::Ordering::{Acquire, Release};

use gpushare_core::limiter::format_gpu_uuid;

use crate::real::{Lib, RealSym};
use crate::state::{self, Counted, Kind, Limiter, UNKNOWN_DEVICE_REPORTED, limiter, report_once};

pub type CuResult = c_int;
pub type CuDevicePtr = u64;
/// `CUdeviceptr_v1`: the 32-bit device pointer of the pre-3.2 entry points.
pub type CuDevicePtrV1 = c_uint;
pub type CuDevice = c_int;
pub type CuStream = *mut c_void;
pub type CuMemPool = *mut c_void;
pub type CuArray = *mut c_void;
pub type CuMipmappedArray = *mut c_void;
pub type CuMemHandle = u64;

pub const CUDA_SUCCESS: CuResult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CuResult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CuResult = 2;
pub const CUDA_ERROR_INVALID_DEVICE: CuResult = 101;
pub const CUDA_ERROR_NOT_FOUND: CuResult = 500;
/// What every counted call returns when the limiter has no usable limits or region.
pub const CUDA_ERROR_NOT_PERMITTED: CuResult = 800;

/// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`: the memory a pool holds from the device.
const POOL_ATTR_RESERVED_MEM_CURRENT: c_int = 5;

/// `CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`: the memory a device's graph allocator holds.
const GRAPH_ATTR_RESERVED_MEM_CURRENT: c_int = 2;

/// Device `dev`'s graph allocator (the memory of graphs' allocation nodes), booked like a pool
/// under this key: never a pool's handle, which is an address.
const GRAPH_KEY_BASE: u64 = 0xffff_fffe_0000_0000;

fn graph_key(dev: CuDevice) -> u64 {
    GRAPH_KEY_BASE | u64::from(dev as u32)
}

/// The device whose graph allocator `key` books, if it books one.
fn graph_device(key: u64) -> Option<CuDevice> {
    (key & !0xffff_ffff == GRAPH_KEY_BASE).then_some(key as u32 as CuDevice)
}

/// `CU_MEM_LOCATION_TYPE_DEVICE`.
const LOCATION_DEVICE: c_uint = 1;

macro_rules! real {
    ($static:ident, $name:literal) => {
        pub(crate) static $static: RealSym = RealSym::new(Lib::Cuda, $name);
    };
}

real!(R_CTX_GET_DEVICE, c"cuCtxGetDevice");
real!(R_CTX_GET_CURRENT, c"cuCtxGetCurrent");
real!(R_CTX_DESTROY, c"cuCtxDestroy_v2");
real!(R_CTX_DESTROY_V1, c"cuCtxDestroy");
real!(R_PRIMARY_CTX_RETAIN, c"cuDevicePrimaryCtxRetain");
real!(R_PRIMARY_CTX_RELEASE, c"cuDevicePrimaryCtxRelease_v2");
real!(R_PRIMARY_CTX_RELEASE_V1, c"cuDevicePrimaryCtxRelease");
real!(R_PRIMARY_CTX_RESET, c"cuDevicePrimaryCtxReset_v2");
real!(R_PRIMARY_CTX_RESET_V1, c"cuDevicePrimaryCtxReset");
real!(R_PRIMARY_CTX_GET_STATE, c"cuDevicePrimaryCtxGetState");
real!(R_DEVICE_GET_UUID_V2, c"cuDeviceGetUuid_v2");
real!(R_DEVICE_GET_UUID, c"cuDeviceGetUuid");
real!(R_MEM_ALLOC, c"cuMemAlloc_v2");
real!(R_MEM_ALLOC_PITCH, c"cuMemAllocPitch_v2");
real!(R_MEM_ALLOC_MANAGED, c"cuMemAllocManaged");
real!(R_MEM_ALLOC_ASYNC, c"cuMemAllocAsync");
real!(R_MEM_ALLOC_ASYNC_PTSZ, c"cuMemAllocAsync_ptsz");
real!(R_MEM_ALLOC_FROM_POOL_ASYNC, c"cuMemAllocFromPoolAsync");
real!(
    R_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ,
    c"cuMemAllocFromPoolAsync_ptsz"
);
real!(R_MEM_FREE, c"cuMemFree_v2");
real!(R_MEM_POOL_GET_ATTRIBUTE, c"cuMemPoolGetAttribute");
real!(R_MEM_POOL_TRIM_TO, c"cuMemPoolTrimTo");
real!(R_MEM_POOL_DESTROY, c"cuMemPoolDestroy");
real!(R_DEVICE_GET_MEM_POOL, c"cuDeviceGetMemPool");
real!(R_STREAM_IS_CAPTURING, c"cuStreamIsCapturing");
real!(
    R_DEVICE_GET_GRAPH_MEM_ATTRIBUTE,
    c"cuDeviceGetGraphMemAttribute"
);
real!(R_DEVICE_GRAPH_MEM_TRIM, c"cuDeviceGraphMemTrim");
real!(R_GRAPH_ADD_MEM_ALLOC_NODE, c"cuGraphAddMemAllocNode");
real!(R_GRAPH_ADD_MEM_FREE_NODE, c"cuGraphAddMemFreeNode");
real!(R_GRAPH_ADD_NODE, c"cuGraphAddNode");
real!(R_GRAPH_ADD_NODE_V2, c"cuGraphAddNode_v2");
real!(
    R_GRAPH_INSTANTIATE_WITH_PARAMS,
    c"cuGraphInstantiateWithParams"
);
real!(
    R_GRAPH_INSTANTIATE_WITH_PARAMS_PTSZ,
    c"cuGraphInstantiateWithParams_ptsz"
);
real!(R_GRAPH_LAUNCH, c"cuGraphLaunch");
real!(R_GRAPH_LAUNCH_PTSZ, c"cuGraphLaunch_ptsz");
real!(R_GRAPH_UPLOAD, c"cuGraphUpload");
real!(R_GRAPH_UPLOAD_PTSZ, c"cuGraphUpload_ptsz");
real!(R_GRAPH_EXEC_DESTROY, c"cuGraphExecDestroy");
real!(R_MEM_FREE_ASYNC, c"cuMemFreeAsync");
real!(R_MEM_FREE_ASYNC_PTSZ, c"cuMemFreeAsync_ptsz");
real!(R_MEM_CREATE, c"cuMemCreate");
real!(R_MEM_RELEASE, c"cuMemRelease");
real!(R_MEM_MAP, c"cuMemMap");
real!(R_MEM_UNMAP, c"cuMemUnmap");
real!(
    R_MEM_RETAIN_ALLOCATION_HANDLE,
    c"cuMemRetainAllocationHandle"
);
real!(R_ARRAY_CREATE, c"cuArrayCreate_v2");
real!(R_ARRAY_3D_CREATE, c"cuArray3DCreate_v2");
real!(R_ARRAY_DESTROY, c"cuArrayDestroy");
real!(R_MIPMAPPED_ARRAY_CREATE, c"cuMipmappedArrayCreate");
real!(R_MIPMAPPED_ARRAY_DESTROY, c"cuMipmappedArrayDestroy");
real!(R_MEM_GET_INFO, c"cuMemGetInfo_v2");
real!(R_DEVICE_TOTAL_MEM, c"cuDeviceTotalMem_v2");
// The pre-3.2 entry points (`unsigned int` sizes, 32-bit `CUdeviceptr_v1`) that drivers still
// export for binaries built against them; `cuArrayDestroy` has only the one version.
real!(R_MEM_ALLOC_V1, c"cuMemAlloc");
real!(R_MEM_ALLOC_PITCH_V1, c"cuMemAllocPitch");
real!(R_MEM_FREE_V1, c"cuMemFree");
real!(R_ARRAY_CREATE_V1, c"cuArrayCreate");
real!(R_ARRAY_3D_CREATE_V1, c"cuArray3DCreate");
real!(R_MEM_GET_INFO_V1, c"cuMemGetInfo");
real!(R_DEVICE_TOTAL_MEM_V1, c"cuDeviceTotalMem");
real!(R_GET_PROC_ADDRESS, c"cuGetProcAddress");
real!(R_GET_PROC_ADDRESS_V2, c"cuGetProcAddress_v2");

/// Calls the real function or returns `CUDA_ERROR_NOT_FOUND` if the driver lacks it.
macro_rules! call_real {
    ($sym:expr, fn($($ty:ty),* $(,)?), $($arg:expr),*) => {{
        // SAFETY: the type spelled here is the documented C signature of the symbol.
        match unsafe { $sym.get::<unsafe extern "C" fn($($ty),*) -> CuResult>() } {
            // SAFETY: forwarding the caller's arguments to the real driver function.
            Some(f) => unsafe { f($($arg),*) },
            None => CUDA_ERROR_NOT_FOUND,
        }
    }};
}

/// Cache: CUDA ordinal → position in the limits file + 1 (0 = not yet looked up).
const MAX_ORDINALS: usize = 64;
static ORDINAL_POS: [AtomicU8; MAX_ORDINALS] = [const { AtomicU8::new(0) }; MAX_ORDINALS];
const NOT_LIMITED: u8 = u8::MAX;

/// The limits-file position of CUDA device `dev`.
fn device_pos(lim: &Limiter, dev: CuDevice) -> Result<usize, CuResult> {
    let cached = usize::try_from(dev)
        .ok()
        .filter(|&d| d < MAX_ORDINALS)
        .map(|d| &ORDINAL_POS[d]);
    if let Some(c) = cached {
        match c.load(Acquire) {
            0 => {}
            NOT_LIMITED => return Err(unknown_device(dev)),
            p => return Ok(usize::from(p - 1)),
        }
    }
    let mut uuid = [0u8; 16];
    let mut rc = call_real!(
        R_DEVICE_GET_UUID_V2,
        fn(*mut u8, CuDevice),
        uuid.as_mut_ptr(),
        dev
    );
    if rc != CUDA_SUCCESS {
        rc = call_real!(
            R_DEVICE_GET_UUID,
            fn(*mut u8, CuDevice),
            uuid.as_mut_ptr(),
            dev
        );
    }
    let by_uuid = (rc == CUDA_SUCCESS)
        .then(|| lim.limits().position_of_uuid(&format_gpu_uuid(&uuid)))
        .flatten();
    let pos = by_uuid.or_else(|| {
        usize::try_from(dev)
            .ok()
            .filter(|&d| state::valid_pos(lim, d))
    });
    if let Some(c) = cached {
        c.store(pos.map_or(NOT_LIMITED, |p| p as u8 + 1), Release);
    }
    pos.ok_or_else(|| unknown_device(dev))
}

fn unknown_device(dev: CuDevice) -> CuResult {
    report_once(
        &UNKNOWN_DEVICE_REPORTED,
        &format!("CUDA device {dev} is not in the container's limits; its allocations are refused"),
    );
    CUDA_ERROR_INVALID_DEVICE
}

/// The current context's device.
fn current_device() -> Result<CuDevice, CuResult> {
    let mut dev: CuDevice = 0;
    let rc = call_real!(R_CTX_GET_DEVICE, fn(*mut CuDevice), &mut dev);
    if rc != CUDA_SUCCESS {
        return Err(rc);
    }
    Ok(dev)
}

/// The current context's device and its limits-file position.
fn current_device_pos(lim: &Limiter) -> Result<(CuDevice, usize), CuResult> {
    let dev = current_device()?;
    Ok((dev, device_pos(lim, dev)?))
}

/// The limits-file position of the current context's device.
fn current_pos(lim: &Limiter) -> Result<usize, CuResult> {
    current_device_pos(lim).map(|(_, pos)| pos)
}

/// Who frees an allocation besides its own free.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// The current context: destroyed (or a primary context reset), it frees what it holds.
    Context,
    /// Nobody: a stream-ordered allocation (its pool's), a VMM handle (the process's).
    Own,
}

/// The current context, 0 if there is none or the driver cannot say.
fn current_ctx() -> u64 {
    let mut ctx: *mut c_void = std::ptr::null_mut();
    let rc = call_real!(R_CTX_GET_CURRENT, fn(*mut *mut c_void), &mut ctx);
    if rc == CUDA_SUCCESS { ctx as u64 } else { 0 }
}

/// What `owner` means for an allocation made now: the context to record.
fn owner_ctx(owner: Owner) -> u64 {
    match owner {
        Owner::Context => current_ctx(),
        Owner::Own => 0,
    }
}

/// Counts `bytes` on GPU `pos` if the quota has room, after reading again what the pools keep
/// when it has not (a synchronization may have let the driver release it).
fn reserve(lim: &Limiter, pos: usize, bytes: u64) -> bool {
    lim.reserve(pos, bytes) || (read_pools(lim) > 0 && lim.reserve(pos, bytes))
}

/// Reads what the driver holds in each booked pool and counts that; the bytes given back.
fn read_pools(lim: &Limiter) -> u64 {
    state::pools()
        .into_iter()
        .map(|(pool, generation)| read_pool(lim, pool, generation, false))
        .sum()
}

/// Reads what the driver holds in `pool` (as of `generation`; after a graph's launch if
/// `launched`) and counts that: a pool's reserve, or a device's graph allocator's.
fn read_pool(lim: &Limiter, pool: u64, generation: u64, launched: bool) -> u64 {
    let mut reserved = 0u64;
    let rc = match graph_device(pool) {
        Some(dev) => call_real!(
            R_DEVICE_GET_GRAPH_MEM_ATTRIBUTE,
            fn(CuDevice, c_int, *mut u64),
            dev,
            GRAPH_ATTR_RESERVED_MEM_CURRENT,
            &mut reserved
        ),
        None => call_real!(
            R_MEM_POOL_GET_ATTRIBUTE,
            fn(CuMemPool, c_int, *mut u64),
            pool as CuMemPool,
            POOL_ATTR_RESERVED_MEM_CURRENT,
            &mut reserved
        ),
    };
    if rc != CUDA_SUCCESS {
        return 0;
    }
    state::pool_reserved(lim, pool, generation, reserved, launched)
}

/// [`read_pool`] at the pool's current generation, if it is booked.
fn read_pool_now(lim: &Limiter, pool: u64) {
    if let Some(generation) = state::pool_generation(pool) {
        read_pool(lim, pool, generation, false);
    }
}

/// Counts `bytes` on a GPU, runs the real allocation, records the handle it produced (and the
/// context that owns it, per `owner`).
fn counted_alloc(
    kind: Kind,
    owner: Owner,
    pos: impl FnOnce(&Limiter) -> Result<usize, CuResult>,
    bytes: u64,
    alloc: impl FnOnce() -> CuResult,
    handle: impl FnOnce() -> u64,
) -> CuResult {
    let Some(lim) = limiter() else {
        return CUDA_ERROR_NOT_PERMITTED;
    };
    let pos = match pos(lim) {
        Ok(p) => p,
        Err(rc) => return rc,
    };
    if !reserve(lim, pos, bytes) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let rc = alloc();
    if rc != CUDA_SUCCESS {
        lim.release(pos, bytes);
        return rc;
    }
    let ctx = owner_ctx(owner);
    state::record(lim, kind, handle(), Counted::new(pos, bytes, ctx));
    CUDA_SUCCESS
}

/// Runs the real free and gives back what the handle counted (nothing for one we never
/// counted: the count stays right whatever the program frees).
fn counted_free(kind: Kind, key: u64, free: impl FnOnce() -> CuResult) -> CuResult {
    free_counted(kind, key, || false, free)
}

/// [`counted_free`]; `node` (asked only of a graph's allocation): the free is a graph's free
/// node (captured, or added by hand), whose memory the graph allocator takes when the graph
/// is launched (see `PoolBook::pending`).
fn free_counted(
    kind: Kind,
    key: u64,
    node: impl FnOnce() -> bool,
    free: impl FnOnce() -> CuResult,
) -> CuResult {
    let taken = state::forget(kind, key);
    let rc = free();
    if let (Some(c), Some(lim)) = (taken, state::loaded_limiter()) {
        if rc == CUDA_SUCCESS && c.pool != 0 {
            state::pool_freed(lim, c, graph_device(c.pool).is_some() && node());
            read_pool_now(lim, c.pool);
        } else if rc == CUDA_SUCCESS {
            lim.release(c.pos, c.bytes);
        } else {
            state::record(lim, kind, key, c);
        }
    }
    rc
}

/// A device-pointer allocation of `bytesize` bytes by `forward` (the real call): passed through
/// uncounted when the out-pointer is null or nothing is asked for (the driver answers those),
/// else counted on the current context's device.
fn alloc_device_ptr(
    dptr: *mut CuDevicePtr,
    bytesize: usize,
    owner: Owner,
    forward: impl FnOnce() -> CuResult,
) -> CuResult {
    if dptr.is_null() || bytesize == 0 {
        return forward();
    }
    counted_alloc(
        Kind::DevicePtr,
        owner,
        current_pos,
        bytesize as u64,
        forward,
        // SAFETY: dptr is non-null and the driver wrote it on success.
        || unsafe { *dptr },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CuDevicePtr, bytesize: usize) -> CuResult {
    alloc_device_ptr(dptr, bytesize, Owner::Context, || {
        call_real!(R_MEM_ALLOC, fn(*mut CuDevicePtr, usize), dptr, bytesize)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CuDevicePtr,
    bytesize: usize,
    flags: c_uint,
) -> CuResult {
    alloc_device_ptr(dptr, bytesize, Owner::Context, || {
        call_real!(
            R_MEM_ALLOC_MANAGED,
            fn(*mut CuDevicePtr, usize, c_uint),
            dptr,
            bytesize,
            flags
        )
    })
}

/// `CU_STREAM_CAPTURE_STATUS_NONE`.
const CAPTURE_STATUS_NONE: c_int = 0;

/// Whether `stream` is being captured into a graph (its stream-ordered allocations then become
/// graph nodes, which take memory from the device's graph allocator when the graph is launched,
/// not from a pool). Not capturing if the driver cannot say.
fn capturing(stream: CuStream) -> bool {
    let mut status = CAPTURE_STATUS_NONE;
    let rc = call_real!(
        R_STREAM_IS_CAPTURING,
        fn(CuStream, *mut c_int),
        stream,
        &mut status
    );
    rc == CUDA_SUCCESS && status != CAPTURE_STATUS_NONE
}

/// The pool `cuMemAllocAsync` takes from: device `dev`'s current pool (0 if the driver cannot
/// say).
fn current_pool(dev: CuDevice) -> u64 {
    let mut pool: CuMemPool = std::ptr::null_mut();
    let rc = call_real!(
        R_DEVICE_GET_MEM_POOL,
        fn(*mut CuMemPool, CuDevice),
        &mut pool,
        dev
    );
    if rc == CUDA_SUCCESS { pool as u64 } else { 0 }
}

/// Whether the driver says what its graph allocators hold (CUDA 11.4+, with graph memory
/// nodes themselves).
fn graph_memory_readable() -> bool {
    !R_DEVICE_GET_GRAPH_MEM_ATTRIBUTE.addr().is_null()
}

/// A stream-ordered allocation from `pool` (given the current context's device; 0: unknown) by
/// `forward`; on a captured stream, a graph's allocation node, booked under the device's graph
/// allocator instead (see [`counted_pooled`]).
fn alloc_pooled(
    dptr: *mut CuDevicePtr,
    bytesize: usize,
    stream: CuStream,
    pool: impl FnOnce(CuDevice) -> u64,
    forward: impl FnOnce() -> CuResult,
) -> CuResult {
    if dptr.is_null() || bytesize == 0 {
        return forward();
    }
    let captured = capturing(stream);
    if captured && !graph_memory_readable() {
        // A graph node on a driver that cannot say what graphs hold: a plain count until freed.
        return alloc_device_ptr(dptr, bytesize, Owner::Own, forward);
    }
    let Some(lim) = limiter() else {
        return CUDA_ERROR_NOT_PERMITTED;
    };
    let (dev, pos) = match current_device_pos(lim) {
        Ok(p) => p,
        Err(rc) => return rc,
    };
    let pool = if captured { graph_key(dev) } else { pool(dev) };
    // SAFETY: dptr is non-null and the driver wrote it on success.
    counted_pooled(lim, pos, pool, bytesize as u64, forward, || unsafe {
        *dptr
    })
}

/// Counts `bytes` from `pool` on GPU `pos` (a stream-ordered pool, or a device's graph
/// allocator), runs the real allocation, records the address `written` reads. What the pool
/// keeps of earlier frees may serve it: that much is counted already and not reserved again.
/// After the call, the pool is counted at what the driver says it holds (more, if it grew by
/// more than the allocation). A graph allocator holds nothing for a node until its graph is
/// launched: the node stays counted at its size (what the launch will take) until freed, and
/// the allocator at what it holds beyond its booked nodes.
fn counted_pooled(
    lim: &Limiter,
    pos: usize,
    pool: u64,
    bytes: u64,
    forward: impl FnOnce() -> CuResult,
    written: impl FnOnce() -> CuDevicePtr,
) -> CuResult {
    let took = state::pool_take_kept(pool, pos, bytes);
    if !reserve(lim, pos, bytes - took) {
        state::pool_untake_kept(pool, took);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let rc = forward();
    if rc != CUDA_SUCCESS {
        lim.release(pos, bytes - took);
        state::pool_untake_kept(pool, took);
        return rc;
    }
    let counted = state::Counted {
        pool,
        ..Counted::new(pos, bytes, 0)
    };
    state::record_pooled(lim, written(), counted);
    read_pool_now(lim, pool);
    CUDA_SUCCESS
}

fn alloc_async(
    sym: &RealSym,
    dptr: *mut CuDevicePtr,
    bytesize: usize,
    stream: CuStream,
) -> CuResult {
    alloc_pooled(dptr, bytesize, stream, current_pool, || {
        call_real!(
            sym,
            fn(*mut CuDevicePtr, usize, CuStream),
            dptr,
            bytesize,
            stream
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CuDevicePtr,
    bytesize: usize,
    stream: CuStream,
) -> CuResult {
    alloc_async(&R_MEM_ALLOC_ASYNC, dptr, bytesize, stream)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CuDevicePtr,
    bytesize: usize,
    stream: CuStream,
) -> CuResult {
    alloc_async(&R_MEM_ALLOC_ASYNC_PTSZ, dptr, bytesize, stream)
}

fn alloc_from_pool(
    sym: &RealSym,
    dptr: *mut CuDevicePtr,
    bytesize: usize,
    pool: CuMemPool,
    stream: CuStream,
) -> CuResult {
    alloc_pooled(
        dptr,
        bytesize,
        stream,
        |_| pool as u64,
        || {
            call_real!(
                sym,
                fn(*mut CuDevicePtr, usize, CuMemPool, CuStream),
                dptr,
                bytesize,
                pool,
                stream
            )
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CuDevicePtr,
    bytesize: usize,
    pool: CuMemPool,
    stream: CuStream,
) -> CuResult {
    alloc_from_pool(&R_MEM_ALLOC_FROM_POOL_ASYNC, dptr, bytesize, pool, stream)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CuDevicePtr,
    bytesize: usize,
    pool: CuMemPool,
    stream: CuStream,
) -> CuResult {
    alloc_from_pool(
        &R_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ,
        dptr,
        bytesize,
        pool,
        stream,
    )
}

/// A trim lets the driver release what the pool keeps: counted at what it holds after.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: CuMemPool, min_bytes_to_keep: usize) -> CuResult {
    let rc = call_real!(
        R_MEM_POOL_TRIM_TO,
        fn(CuMemPool, usize),
        pool,
        min_bytes_to_keep
    );
    if rc == CUDA_SUCCESS
        && let Some(lim) = state::loaded_limiter()
    {
        read_pool_now(lim, pool as u64);
    }
    rc
}

/// A destroyed pool's kept memory is released; its live allocations stay counted until freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CuMemPool) -> CuResult {
    let rc = call_real!(R_MEM_POOL_DESTROY, fn(CuMemPool), pool);
    if rc == CUDA_SUCCESS
        && let Some(lim) = state::loaded_limiter()
    {
        state::pool_destroyed(lim, pool as u64);
    }
    rc
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS_v1`: the pool properties (their location read, 88 bytes in
/// all), the access descriptors, the size, and the address the driver writes.
#[repr(C)]
pub struct MemAllocNodeParams {
    alloc_type: c_uint,
    handle_types: c_uint,
    location_type: c_uint,
    location_id: c_int,
    pool_props_rest: [u8; 72],
    access_descs: *const c_void,
    access_desc_count: usize,
    bytesize: usize,
    dptr: CuDevicePtr,
}

/// A graph's allocation node made by hand: counted like a captured stream's allocation, on the
/// device its properties name (passed through uncounted for any other location).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    node: *mut *mut c_void,
    graph: *mut c_void,
    deps: *const *mut c_void,
    ndeps: usize,
    params: *mut MemAllocNodeParams,
) -> CuResult {
    let forward = || {
        call_real!(
            R_GRAPH_ADD_MEM_ALLOC_NODE,
            fn(*mut *mut c_void, *mut c_void, *const *mut c_void, usize, *mut MemAllocNodeParams),
            node,
            graph,
            deps,
            ndeps,
            params
        )
    };
    alloc_node(params, forward)
}

/// An allocation node with `params` made by `forward`: counted like a captured stream's
/// allocation, on the device its properties name (passed through uncounted for any other
/// location).
fn alloc_node(params: *mut MemAllocNodeParams, forward: impl FnOnce() -> CuResult) -> CuResult {
    // SAFETY: the caller's parameters, or null (the driver answers that).
    let Some(p) = (unsafe { params.as_ref() }) else {
        return forward();
    };
    if p.bytesize == 0 || p.location_type != LOCATION_DEVICE {
        return forward();
    }
    let Some(lim) = limiter() else {
        return CUDA_ERROR_NOT_PERMITTED;
    };
    let dev = p.location_id;
    let pos = match device_pos(lim, dev) {
        Ok(p) => p,
        Err(rc) => return rc,
    };
    let bytes = p.bytesize as u64;
    // SAFETY: params is non-null and the driver wrote the address on success.
    counted_pooled(lim, pos, graph_key(dev), bytes, forward, || unsafe {
        (*params).dptr
    })
}

/// A graph's free node: what the allocation counted goes back to its graph allocator, which
/// takes it at the graph's launch and keeps it: counted until then, and then at what the
/// allocator holds.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemFreeNode(
    node: *mut *mut c_void,
    graph: *mut c_void,
    deps: *const *mut c_void,
    ndeps: usize,
    dptr: CuDevicePtr,
) -> CuResult {
    free_counted(
        Kind::DevicePtr,
        dptr,
        || true,
        || {
            call_real!(
                R_GRAPH_ADD_MEM_FREE_NODE,
                fn(*mut *mut c_void, *mut c_void, *const *mut c_void, usize, CuDevicePtr),
                node,
                graph,
                deps,
                ndeps,
                dptr
            )
        },
    )
}

/// `CU_GRAPH_NODE_TYPE_MEM_ALLOC` and `CU_GRAPH_NODE_TYPE_MEM_FREE`.
const NODE_TYPE_MEM_ALLOC: c_int = 10;
const NODE_TYPE_MEM_FREE: c_int = 11;

/// Where a `CUgraphNodeParams`'s parameters start, after its type and three reserved ints: an
/// allocation node's `CUDA_MEM_ALLOC_NODE_PARAMS_v2` (laid out as v1), a free node's address.
const NODE_PARAMS_OFFSET: usize = 16;

/// A node made by the generic `cuGraphAddNode` (`params`: its `CUgraphNodeParams`): a memory
/// node is counted as `cuGraphAddMemAllocNode`'s and `cuGraphAddMemFreeNode`'s are.
fn generic_node(params: *mut c_void, forward: impl FnOnce() -> CuResult) -> CuResult {
    if params.is_null() {
        return forward();
    }
    // SAFETY: a non-null `CUgraphNodeParams` of the caller: its type first, its parameters at
    // NODE_PARAMS_OFFSET (within the struct's 256 bytes).
    let (node_type, body) = unsafe {
        (
            *(params as *const c_int),
            params.cast::<u8>().add(NODE_PARAMS_OFFSET),
        )
    };
    match node_type {
        NODE_TYPE_MEM_ALLOC => alloc_node(body.cast(), forward),
        NODE_TYPE_MEM_FREE => {
            // SAFETY: a free node's parameters are its address.
            let dptr = unsafe { *body.cast::<CuDevicePtr>() };
            free_counted(Kind::DevicePtr, dptr, || true, forward)
        }
        _ => forward(),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddNode(
    node: *mut *mut c_void,
    graph: *mut c_void,
    deps: *const *mut c_void,
    ndeps: usize,
    params: *mut c_void,
) -> CuResult {
    generic_node(params, || {
        call_real!(
            R_GRAPH_ADD_NODE,
            fn(*mut *mut c_void, *mut c_void, *const *mut c_void, usize, *mut c_void),
            node,
            graph,
            deps,
            ndeps,
            params
        )
    })
}

/// `cuGraphAddNode` with edge data (CUDA 12.3).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddNode_v2(
    node: *mut *mut c_void,
    graph: *mut c_void,
    deps: *const *mut c_void,
    edges: *const c_void,
    ndeps: usize,
    params: *mut c_void,
) -> CuResult {
    generic_node(params, || {
        call_real!(
            R_GRAPH_ADD_NODE_V2,
            fn(
                *mut *mut c_void,
                *mut c_void,
                *const *mut c_void,
                *const c_void,
                usize,
                *mut c_void,
            ),
            node,
            graph,
            deps,
            edges,
            ndeps,
            params
        )
    })
}

/// Whether a call is a graph's launch (or upload), which may end the free nodes' pending
/// counts.
#[derive(PartialEq)]
enum Launch {
    Yes,
    No,
}

/// Runs `forward` (a call after which a graph allocator may hold more or less: a launch, an
/// upload, an instantiation that uploads, an executable graph's destruction, a trim) and
/// counts what each device's graph allocator holds then; the current device's is booked
/// first if it was not (a graph's memory made where we did not see it is counted too).
fn graph_memory_changes(launch: Launch, forward: impl FnOnce() -> CuResult) -> CuResult {
    let rc = forward();
    if let Some(lim) = state::loaded_limiter()
        && graph_memory_readable()
    {
        if let Ok((dev, pos)) = current_device_pos(lim) {
            state::pool_book(graph_key(dev), pos);
        }
        for (pool, generation) in state::pools() {
            if graph_device(pool).is_some() {
                read_pool(
                    lim,
                    pool,
                    generation,
                    launch == Launch::Yes && rc == CUDA_SUCCESS,
                );
            }
        }
    }
    rc
}

/// The entry points after which a graph allocator may hold more or less: each runs the real
/// call through [`graph_memory_changes`].
macro_rules! graph_memory_calls {
    ($($name:ident($($arg:ident: $ty:ty),*) by $real:ident, launch: $launch:ident;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CuResult {
            graph_memory_changes(Launch::$launch, || call_real!($real, fn($($ty),*), $($arg),*))
        }
    )*};
}

graph_memory_calls! {
    cuGraphLaunch(exec: *mut c_void, stream: CuStream) by R_GRAPH_LAUNCH, launch: Yes;
    cuGraphLaunch_ptsz(exec: *mut c_void, stream: CuStream) by R_GRAPH_LAUNCH_PTSZ, launch: Yes;
    cuGraphUpload(exec: *mut c_void, stream: CuStream) by R_GRAPH_UPLOAD, launch: Yes;
    cuGraphUpload_ptsz(exec: *mut c_void, stream: CuStream) by R_GRAPH_UPLOAD_PTSZ, launch: Yes;
    cuGraphInstantiateWithParams(exec: *mut *mut c_void, graph: *mut c_void, params: *mut c_void)
        by R_GRAPH_INSTANTIATE_WITH_PARAMS, launch: No;
    cuGraphInstantiateWithParams_ptsz(
        exec: *mut *mut c_void,
        graph: *mut c_void,
        params: *mut c_void
    ) by R_GRAPH_INSTANTIATE_WITH_PARAMS_PTSZ, launch: No;
    cuGraphExecDestroy(exec: *mut c_void) by R_GRAPH_EXEC_DESTROY, launch: No;
    cuDeviceGraphMemTrim(dev: CuDevice) by R_DEVICE_GRAPH_MEM_TRIM, launch: No;
}

/// Pitched allocation: the driver picks the pitch, so the estimate (width × height) is counted
/// first and corrected to pitch × height after the call. `written` reads the pointer and pitch
/// the driver wrote; `undo` frees the allocation when the correction does not fit the quota.
fn alloc_pitched(
    estimate: u64,
    height: u64,
    forward: impl FnOnce() -> CuResult,
    written: impl FnOnce() -> (CuDevicePtr, u64),
    undo: impl FnOnce(CuDevicePtr),
) -> CuResult {
    let Some(lim) = limiter() else {
        return CUDA_ERROR_NOT_PERMITTED;
    };
    let pos = match current_pos(lim) {
        Ok(p) => p,
        Err(rc) => return rc,
    };
    if !reserve(lim, pos, estimate) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let rc = forward();
    if rc != CUDA_SUCCESS {
        lim.release(pos, estimate);
        return rc;
    }
    let (ptr, pitch) = written();
    let actual = pitch.saturating_mul(height);
    if actual > estimate && !reserve(lim, pos, actual - estimate) {
        lim.release(pos, estimate);
        undo(ptr);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if actual < estimate {
        lim.release(pos, estimate - actual);
    }
    state::record(
        lim,
        Kind::DevicePtr,
        ptr,
        Counted::new(pos, actual.max(1), current_ctx()),
    );
    CUDA_SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CuDevicePtr,
    pitch: *mut usize,
    width_bytes: usize,
    height: usize,
    element_size: c_uint,
) -> CuResult {
    let forward = || {
        call_real!(
            R_MEM_ALLOC_PITCH,
            fn(*mut CuDevicePtr, *mut usize, usize, usize, c_uint),
            dptr,
            pitch,
            width_bytes,
            height,
            element_size
        )
    };
    let Some(estimate) = width_bytes.checked_mul(height).filter(|&b| b > 0) else {
        return forward();
    };
    if dptr.is_null() || pitch.is_null() {
        return forward();
    }
    alloc_pitched(
        estimate as u64,
        height as u64,
        forward,
        // SAFETY: both out-pointers are non-null and written by the driver on success.
        || unsafe { (*dptr, *pitch as u64) },
        |ptr| {
            call_real!(R_MEM_FREE, fn(CuDevicePtr), ptr);
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CuDevicePtr) -> CuResult {
    counted_free(Kind::DevicePtr, dptr, || {
        call_real!(R_MEM_FREE, fn(CuDevicePtr), dptr)
    })
}

/// Legacy `cuMemAlloc` (`CUdeviceptr_v1 *`, `unsigned int` size). Its pointer is counted under
/// its zero-extended value, so either `cuMemFree` or `cuMemFree_v2` gives it back.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc(dptr: *mut CuDevicePtrV1, bytesize: c_uint) -> CuResult {
    let forward = || {
        call_real!(
            R_MEM_ALLOC_V1,
            fn(*mut CuDevicePtrV1, c_uint),
            dptr,
            bytesize
        )
    };
    if dptr.is_null() || bytesize == 0 {
        return forward();
    }
    counted_alloc(
        Kind::DevicePtr,
        Owner::Context,
        current_pos,
        u64::from(bytesize),
        forward,
        // SAFETY: dptr is non-null and the driver wrote it on success.
        || u64::from(unsafe { *dptr }),
    )
}

/// Legacy `cuMemAllocPitch` (32-bit pointer, pitch and sizes).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch(
    dptr: *mut CuDevicePtrV1,
    pitch: *mut c_uint,
    width_bytes: c_uint,
    height: c_uint,
    element_size: c_uint,
) -> CuResult {
    let forward = || {
        call_real!(
            R_MEM_ALLOC_PITCH_V1,
            fn(*mut CuDevicePtrV1, *mut c_uint, c_uint, c_uint, c_uint),
            dptr,
            pitch,
            width_bytes,
            height,
            element_size
        )
    };
    let estimate = u64::from(width_bytes) * u64::from(height);
    if estimate == 0 || dptr.is_null() || pitch.is_null() {
        return forward();
    }
    alloc_pitched(
        estimate,
        u64::from(height),
        forward,
        // SAFETY: both out-pointers are non-null and written by the driver on success.
        || unsafe { (u64::from(*dptr), u64::from(*pitch)) },
        |ptr| {
            call_real!(R_MEM_FREE_V1, fn(CuDevicePtrV1), ptr as CuDevicePtrV1);
        },
    )
}

/// Legacy `cuMemFree` (32-bit pointer).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree(dptr: CuDevicePtrV1) -> CuResult {
    counted_free(Kind::DevicePtr, u64::from(dptr), || {
        call_real!(R_MEM_FREE_V1, fn(CuDevicePtrV1), dptr)
    })
}

/// On a captured stream, a free node of the graph.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CuDevicePtr, stream: CuStream) -> CuResult {
    free_counted(
        Kind::DevicePtr,
        dptr,
        || capturing(stream),
        || call_real!(R_MEM_FREE_ASYNC, fn(CuDevicePtr, CuStream), dptr, stream),
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: CuDevicePtr, stream: CuStream) -> CuResult {
    free_counted(
        Kind::DevicePtr,
        dptr,
        || capturing(stream),
        || {
            call_real!(
                R_MEM_FREE_ASYNC_PTSZ,
                fn(CuDevicePtr, CuStream),
                dptr,
                stream
            )
        },
    )
}

/// The head of `CUmemAllocationProp` that we read: type, handle types, location.
#[repr(C)]
struct AllocationPropHead {
    kind: c_uint,
    handle_types: c_uint,
    location_type: c_uint,
    location_id: c_int,
}

/// VMM physical allocation: counted only when located on a device (host and host-NUMA
/// locations are not GPU memory).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CuMemHandle,
    size: usize,
    prop: *const c_void,
    flags: u64,
) -> CuResult {
    let forward = || {
        call_real!(
            R_MEM_CREATE,
            fn(*mut CuMemHandle, usize, *const c_void, u64),
            handle,
            size,
            prop,
            flags
        )
    };
    if handle.is_null() || prop.is_null() || size == 0 {
        return forward();
    }
    // SAFETY: prop is non-null and points at a CUmemAllocationProp, whose first four fields
    // are AllocationPropHead's (reads unaligned to tolerate any caller).
    let head = unsafe { std::ptr::read_unaligned(prop as *const AllocationPropHead) };
    if head.location_type != LOCATION_DEVICE {
        return forward();
    }
    counted_alloc(
        Kind::VmmHandle,
        Owner::Own,
        |lim| device_pos(lim, head.location_id),
        size as u64,
        forward,
        // SAFETY: handle is non-null and written by the driver on success.
        || unsafe { *handle },
    )
}

// A VMM allocation's memory is freed when its last holder goes: its references (`cuMemCreate`'s,
// each `cuMemRetainAllocationHandle`'s, dropped by `cuMemRelease`) and its mappings (`cuMemMap`,
// dropped by `cuMemUnmap`). Its count goes with the last of them, so a handle released while
// still mapped stays counted until unmapped.

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRelease(handle: CuMemHandle) -> CuResult {
    let taken = state::vmm_release(handle);
    let rc = call_real!(R_MEM_RELEASE, fn(CuMemHandle), handle);
    let Some(lim) = state::loaded_limiter() else {
        return rc;
    };
    match taken {
        state::Released::Last(c) if rc == CUDA_SUCCESS => lim.release(c.pos, c.bytes),
        taken if rc != CUDA_SUCCESS => state::vmm_release_failed(lim, handle, taken),
        _ => {}
    }
    rc
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemMap(
    ptr: CuDevicePtr,
    size: usize,
    offset: usize,
    handle: CuMemHandle,
    flags: u64,
) -> CuResult {
    let rc = call_real!(
        R_MEM_MAP,
        fn(CuDevicePtr, usize, usize, CuMemHandle, u64),
        ptr,
        size,
        offset,
        handle,
        flags
    );
    if rc == CUDA_SUCCESS
        && let Some(lim) = state::loaded_limiter()
    {
        state::vmm_hold(lim, handle, Some((ptr, size as u64)));
    }
    rc
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemUnmap(ptr: CuDevicePtr, size: usize) -> CuResult {
    let taken = state::vmm_take_mappings(ptr, size as u64);
    let rc = call_real!(R_MEM_UNMAP, fn(CuDevicePtr, usize), ptr, size);
    if let Some(lim) = state::loaded_limiter() {
        state::vmm_unmapped(lim, taken, rc == CUDA_SUCCESS);
    }
    rc
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut CuMemHandle,
    addr: *mut c_void,
) -> CuResult {
    let rc = call_real!(
        R_MEM_RETAIN_ALLOCATION_HANDLE,
        fn(*mut CuMemHandle, *mut c_void),
        handle,
        addr
    );
    if rc == CUDA_SUCCESS
        && !handle.is_null()
        && let Some(lim) = state::loaded_limiter()
    {
        // SAFETY: handle is non-null and the driver wrote it on success.
        state::vmm_hold(lim, unsafe { *handle }, None);
    }
    rc
}

// --- contexts: what the driver frees with them ------------------------------------------------
//
// Destroying a context frees every allocation made in it; so does resetting a device's primary
// context (`cudaDeviceReset` does) or releasing its last reference. Their counts are given back
// once the driver says it did so (the call succeeded; for a release, the primary context is no
// longer active), never on the caller's word: a failed call, or a release that leaves the
// context active, keeps every count.

/// The primary context each CUDA ordinal's `cuDevicePrimaryCtxRetain` returned (0: not seen).
static PRIMARY_CTX: [std::sync::atomic::AtomicU64; MAX_ORDINALS] =
    [const { std::sync::atomic::AtomicU64::new(0) }; MAX_ORDINALS];

fn primary_slot(dev: CuDevice) -> Option<&'static std::sync::atomic::AtomicU64> {
    usize::try_from(dev)
        .ok()
        .filter(|&d| d < MAX_ORDINALS)
        .map(|d| &PRIMARY_CTX[d])
}

/// Gives back what context `ctx` owned.
fn context_freed(ctx: u64) {
    if let Some(lim) = state::loaded_limiter() {
        state::forget_context(lim, ctx);
    }
}

/// The primary context of `dev` has freed its allocations: gives back their counts.
fn primary_freed(dev: CuDevice) {
    if let Some(slot) = primary_slot(dev) {
        context_freed(slot.load(Acquire));
    }
}

/// Whether `dev`'s primary context is still active (true when the driver cannot say).
fn primary_active(dev: CuDevice) -> bool {
    let (mut flags, mut active): (c_uint, c_int) = (0, 1);
    let rc = call_real!(
        R_PRIMARY_CTX_GET_STATE,
        fn(CuDevice, *mut c_uint, *mut c_int),
        dev,
        &mut flags,
        &mut active
    );
    rc != CUDA_SUCCESS || active != 0
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(
    ctx: *mut *mut c_void,
    dev: CuDevice,
) -> CuResult {
    let rc = call_real!(
        R_PRIMARY_CTX_RETAIN,
        fn(*mut *mut c_void, CuDevice),
        ctx,
        dev
    );
    if rc == CUDA_SUCCESS
        && !ctx.is_null()
        && let Some(slot) = primary_slot(dev)
    {
        // SAFETY: ctx is non-null and the driver wrote it on success.
        slot.store(unsafe { *ctx } as u64, Release);
    }
    rc
}

fn primary_release(sym: &RealSym, dev: CuDevice) -> CuResult {
    let rc = call_real!(sym, fn(CuDevice), dev);
    if rc == CUDA_SUCCESS && !primary_active(dev) {
        primary_freed(dev);
    }
    rc
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CuDevice) -> CuResult {
    primary_release(&R_PRIMARY_CTX_RELEASE, dev)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease(dev: CuDevice) -> CuResult {
    primary_release(&R_PRIMARY_CTX_RELEASE_V1, dev)
}

fn primary_reset(sym: &RealSym, dev: CuDevice) -> CuResult {
    let rc = call_real!(sym, fn(CuDevice), dev);
    if rc == CUDA_SUCCESS {
        primary_freed(dev);
    }
    rc
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CuDevice) -> CuResult {
    primary_reset(&R_PRIMARY_CTX_RESET, dev)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset(dev: CuDevice) -> CuResult {
    primary_reset(&R_PRIMARY_CTX_RESET_V1, dev)
}

fn ctx_destroy(sym: &RealSym, ctx: *mut c_void) -> CuResult {
    let rc = call_real!(sym, fn(*mut c_void), ctx);
    if rc == CUDA_SUCCESS {
        context_freed(ctx as u64);
    }
    rc
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: *mut c_void) -> CuResult {
    ctx_destroy(&R_CTX_DESTROY, ctx)
}

/// The pre-4.0 `cuCtxDestroy` that binaries built against CUDA < 4.0 still link: it frees the
/// context's allocations as `_v2` does.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxDestroy(ctx: *mut c_void) -> CuResult {
    ctx_destroy(&R_CTX_DESTROY_V1, ctx)
}

/// `CUDA_ARRAY_DESCRIPTOR`.
#[repr(C)]
pub struct ArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: c_uint,
    pub num_channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
pub struct Array3dDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_uint,
    pub num_channels: c_uint,
    pub flags: c_uint,
}

/// `CUDA_ARRAY_DESCRIPTOR_v1` (legacy `cuArrayCreate`).
#[repr(C)]
pub struct ArrayDescriptorV1 {
    pub width: c_uint,
    pub height: c_uint,
    pub format: c_uint,
    pub num_channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR_v1` (legacy `cuArray3DCreate`).
#[repr(C)]
pub struct Array3dDescriptorV1 {
    pub width: c_uint,
    pub height: c_uint,
    pub depth: c_uint,
    pub format: c_uint,
    pub num_channels: c_uint,
    pub flags: c_uint,
}

/// `CUDA_ARRAY3D_LAYERED`: depth counts layers.
const ARRAY3D_LAYERED: c_uint = 0x01;
/// `CUDA_ARRAY3D_CUBEMAP`: depth counts faces (6, or 6 × layers).
const ARRAY3D_CUBEMAP: c_uint = 0x04;

/// Bytes per element of a `CUarray_format` with `channels` channels. The `…X1/X2/X4` formats
/// name their channel count and count at least that many. Formats we do not know
/// (block-compressed, YUV, newer ones) count 4 bytes a channel: an estimate; the driver's own
/// padding is not visible to us.
fn element_bytes(format: c_uint, channels: c_uint) -> u64 {
    let (size, named) = match format {
        0x01 | 0x08 => (1, 1),        // UNSIGNED_INT8, SIGNED_INT8
        0x02 | 0x09 | 0x10 => (2, 1), // UNSIGNED_INT16, SIGNED_INT16, HALF
        0xc0 | 0xc6 => (1, 1),        // UNORM_INT8X1, SNORM_INT8X1
        0xc1 | 0xc7 => (1, 2),        // UNORM_INT8X2, SNORM_INT8X2
        0xc2 | 0xc8 => (1, 4),        // UNORM_INT8X4, SNORM_INT8X4
        0xc3 | 0xc9 => (2, 1),        // UNORM_INT16X1, SNORM_INT16X1
        0xc4 | 0xca => (2, 2),        // UNORM_INT16X2, SNORM_INT16X2
        0xc5 | 0xcb => (2, 4),        // UNORM_INT16X4, SNORM_INT16X4
        _ => (4, 1),                  // UNSIGNED_INT32, SIGNED_INT32, FLOAT, others
    };
    size * u64::from(channels.max(named))
}

/// A `width × height × depth` array (a zero height or depth is one row or slice).
fn array_bytes(width: u64, height: u64, depth: u64, format: c_uint, channels: c_uint) -> u64 {
    width
        .saturating_mul(height.max(1))
        .saturating_mul(depth.max(1))
        .saturating_mul(element_bytes(format, channels))
}

/// Every level of a mipmapped array: level `l` is `max(1, extent >> l)` in width, height and
/// (for a 3D array) depth; a layered or cubemap array keeps its depth at every level, since
/// depth counts its layers (faces) there. The level count is clamped as the driver clamps it,
/// to `[1, 1 + floor(log2(max(width, height, depth)))]`.
fn mipmapped_bytes(d: &Array3dDescriptor, levels: c_uint) -> u64 {
    let (w, h, depth) = (d.width as u64, d.height as u64, d.depth as u64);
    let most = u64::BITS - w.max(h).max(depth).max(1).leading_zeros();
    let layers = d.flags & (ARRAY3D_LAYERED | ARRAY3D_CUBEMAP) != 0;
    (0..levels.clamp(1, most)).fold(0u64, |sum, l| {
        let level = |extent: u64| (extent >> l).max(1);
        let level_depth = if layers { depth } else { level(depth) };
        sum.saturating_add(array_bytes(
            level(w),
            level(h),
            level_depth,
            d.format,
            d.num_channels,
        ))
    })
}

/// An array allocation of `bytes` (None: no descriptor) on the current context's device, keyed
/// by the handle the driver writes to `handle`; passed through uncounted when either pointer
/// is null (the driver answers those).
fn alloc_array(
    kind: Kind,
    handle: *mut *mut c_void,
    bytes: Option<u64>,
    forward: impl FnOnce() -> CuResult,
) -> CuResult {
    let Some(bytes) = bytes.filter(|_| !handle.is_null()) else {
        return forward();
    };
    counted_alloc(kind, Owner::Context, current_pos, bytes, forward, || {
        // SAFETY: handle is non-null and written by the driver on success.
        unsafe { *handle as u64 }
    })
}

/// The descriptor's size, None for a null descriptor.
fn desc_bytes<D>(desc: *const D, bytes: impl FnOnce(&D) -> u64) -> Option<u64> {
    // SAFETY: a non-null descriptor points at the caller's descriptor of this type.
    unsafe { desc.as_ref() }.map(bytes)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(
    array: *mut CuArray,
    desc: *const ArrayDescriptor,
) -> CuResult {
    let bytes = desc_bytes(desc, |d| {
        array_bytes(d.width as u64, d.height as u64, 1, d.format, d.num_channels)
    });
    alloc_array(Kind::Array, array, bytes, || {
        call_real!(
            R_ARRAY_CREATE,
            fn(*mut CuArray, *const ArrayDescriptor),
            array,
            desc
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    array: *mut CuArray,
    desc: *const Array3dDescriptor,
) -> CuResult {
    let bytes = desc_bytes(desc, |d| {
        let (w, h, depth) = (d.width as u64, d.height as u64, d.depth as u64);
        array_bytes(w, h, depth, d.format, d.num_channels)
    });
    alloc_array(Kind::Array, array, bytes, || {
        call_real!(
            R_ARRAY_3D_CREATE,
            fn(*mut CuArray, *const Array3dDescriptor),
            array,
            desc
        )
    })
}

/// Legacy `cuArrayCreate` (`CUDA_ARRAY_DESCRIPTOR_v1`: 32-bit extents).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate(
    array: *mut CuArray,
    desc: *const ArrayDescriptorV1,
) -> CuResult {
    let bytes = desc_bytes(desc, |d| {
        let (w, h) = (u64::from(d.width), u64::from(d.height));
        array_bytes(w, h, 1, d.format, d.num_channels)
    });
    alloc_array(Kind::Array, array, bytes, || {
        call_real!(
            R_ARRAY_CREATE_V1,
            fn(*mut CuArray, *const ArrayDescriptorV1),
            array,
            desc
        )
    })
}

/// Legacy `cuArray3DCreate` (`CUDA_ARRAY3D_DESCRIPTOR_v1`: 32-bit extents).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate(
    array: *mut CuArray,
    desc: *const Array3dDescriptorV1,
) -> CuResult {
    let bytes = desc_bytes(desc, |d| {
        let (w, h, depth) = (u64::from(d.width), u64::from(d.height), u64::from(d.depth));
        array_bytes(w, h, depth, d.format, d.num_channels)
    });
    alloc_array(Kind::Array, array, bytes, || {
        call_real!(
            R_ARRAY_3D_CREATE_V1,
            fn(*mut CuArray, *const Array3dDescriptorV1),
            array,
            desc
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayDestroy(array: CuArray) -> CuResult {
    counted_free(Kind::Array, array as u64, || {
        call_real!(R_ARRAY_DESTROY, fn(CuArray), array)
    })
}

/// Mipmapped array: all its levels counted ([`mipmapped_bytes`]).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    handle: *mut CuMipmappedArray,
    desc: *const Array3dDescriptor,
    levels: c_uint,
) -> CuResult {
    let bytes = desc_bytes(desc, |d| mipmapped_bytes(d, levels));
    alloc_array(Kind::MipmappedArray, handle, bytes, || {
        call_real!(
            R_MIPMAPPED_ARRAY_CREATE,
            fn(*mut CuMipmappedArray, *const Array3dDescriptor, c_uint),
            handle,
            desc,
            levels
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(handle: CuMipmappedArray) -> CuResult {
    counted_free(Kind::MipmappedArray, handle as u64, || {
        call_real!(R_MIPMAPPED_ARRAY_DESTROY, fn(CuMipmappedArray), handle)
    })
}

/// The view of the current context's device as (free, total): total = the quota (never more
/// than the device has), free = quota − container usage (saturating; never more than the
/// device has free).
fn view_info() -> Result<(u64, u64), CuResult> {
    let lim = limiter().ok_or(CUDA_ERROR_NOT_PERMITTED)?;
    let pos = current_pos(lim)?;
    read_pools(lim);
    let (mut real_free, mut real_total) = (0usize, 0usize);
    let rc = call_real!(
        R_MEM_GET_INFO,
        fn(*mut usize, *mut usize),
        &mut real_free,
        &mut real_total
    );
    if rc != CUDA_SUCCESS {
        return Err(rc);
    }
    let limit = lim.limit(pos).min(real_total as u64);
    let left = limit.saturating_sub(lim.used(pos)).min(real_free as u64);
    Ok((left, limit))
}

/// The view of device `dev`'s total: its quota, never more than the device has.
fn view_total(dev: CuDevice) -> Result<u64, CuResult> {
    let lim = limiter().ok_or(CUDA_ERROR_NOT_PERMITTED)?;
    let mut real_total = 0usize;
    let rc = call_real!(
        R_DEVICE_TOTAL_MEM,
        fn(*mut usize, CuDevice),
        &mut real_total,
        dev
    );
    if rc != CUDA_SUCCESS {
        return Err(rc);
    }
    let pos = device_pos(lim, dev)?;
    Ok(lim.limit(pos).min(real_total as u64))
}

/// A byte count for a legacy `unsigned int` out-parameter: saturated at 4 GiB − 1 rather than
/// wrapped (a wrapped total could read less than what is in use).
fn saturate_u32(bytes: u64) -> c_uint {
    c_uint::try_from(bytes).unwrap_or(c_uint::MAX)
}

/// Writes the memory view (`view_info`) through `free` and `total`, each as `conv` makes it
/// fit the caller's type.
///
/// # Safety
/// Non-null pointers must be valid for writes of `T`.
unsafe fn put_info<T>(free: *mut T, total: *mut T, conv: fn(u64) -> T) -> CuResult {
    if free.is_null() || total.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    match view_info() {
        Ok((left, limit)) => {
            // SAFETY: both out-pointers were checked non-null; the caller vouches for them.
            unsafe {
                *total = conv(limit);
                *free = conv(left);
            }
            CUDA_SUCCESS
        }
        Err(rc) => rc,
    }
}

/// Writes the view of device `dev`'s total (`view_total`) through `bytes`, as `conv` makes it
/// fit the caller's type.
///
/// # Safety
/// A non-null `bytes` must be valid for writes of `T`.
unsafe fn put_total<T>(bytes: *mut T, dev: CuDevice, conv: fn(u64) -> T) -> CuResult {
    if bytes.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    match view_total(dev) {
        Ok(total) => {
            // SAFETY: checked non-null; the caller vouches for it.
            unsafe { *bytes = conv(total) };
            CUDA_SUCCESS
        }
        Err(rc) => rc,
    }
}

fn as_usize(bytes: u64) -> usize {
    bytes as usize
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CuResult {
    // SAFETY: the driver API's contract: valid out-pointers or null.
    unsafe { put_info(free, total, as_usize) }
}

/// Legacy `cuMemGetInfo` (`unsigned int` out-parameters): the same view, saturated. The real
/// figures come from the driver's `cuMemGetInfo_v2`, which cannot wrap.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CuResult {
    // SAFETY: as above.
    unsafe { put_info(free, total, saturate_u32) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CuDevice) -> CuResult {
    // SAFETY: as above.
    unsafe { put_total(bytes, dev, as_usize) }
}

/// Legacy `cuDeviceTotalMem` (`unsigned int` out-parameter): the same view, saturated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CuDevice) -> CuResult {
    // SAFETY: as above.
    unsafe { put_total(bytes, dev, saturate_u32) }
}

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
const PER_THREAD_DEFAULT_STREAM: u64 = 1 << 1;

/// Replaces what the real `cuGetProcAddress` found with our wrapper of the same function.
///
/// The match is by address: whichever versioned variant the driver chose for the requested
/// name, version and flags (`cuMemAlloc` below 3020 → the legacy `cuMemAlloc`, at 3020+ →
/// `cuMemAlloc_v2`, `_ptsz` variants,
/// `cuGetProcAddress` at 12000+ → `_v2`), the wrapper handed back is the one for that exact
/// variant, so the caller's ABI is kept. A driver that hands back an address we do not know
/// keeps its own answer, except for the names below resolved by version.
fn interpose_proc(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) {
    if symbol.is_null() || pfn.is_null() {
        return;
    }
    // SAFETY: pfn is non-null; the driver just wrote it.
    let found = unsafe { *pfn };
    if found.is_null() {
        return;
    }
    // SAFETY: symbol is the caller's NUL-terminated name (the driver accepted it).
    let requested = unsafe { std::ffi::CStr::from_ptr(symbol) }.to_bytes();
    let hooks = crate::dl::cuda_hooks();
    for crate::dl::Hook(real, wrapper) in hooks {
        let name = real.name().to_bytes();
        if name.starts_with(requested) && real.addr() == found {
            // SAFETY: pfn is non-null.
            unsafe { *pfn = *wrapper };
            return;
        }
    }
    // The driver answered with an address we do not know: choose the variant by version.
    let v2_from = match requested {
        b"cuGetProcAddress" => 12000,
        b"cuDevicePrimaryCtxRelease" | b"cuDevicePrimaryCtxReset" => 11000,
        b"cuCtxDestroy" => 4000,
        b"cuGraphAddNode" => 12030,
        _ => 3020,
    };
    let order: [Option<&[u8]>; 3] = [
        (flags & PER_THREAD_DEFAULT_STREAM != 0).then_some(b"_ptsz"),
        (version >= v2_from).then_some(b"_v2"),
        Some(b""),
    ];
    for suffix in order.into_iter().flatten() {
        let hit = hooks.iter().find(|crate::dl::Hook(real, _)| {
            real.name().to_bytes().strip_prefix(requested) == Some(suffix)
        });
        if let Some(crate::dl::Hook(_, wrapper)) = hit {
            // SAFETY: pfn is non-null.
            unsafe { *pfn = *wrapper };
            return;
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CuResult {
    let rc = call_real!(
        R_GET_PROC_ADDRESS,
        fn(*const c_char, *mut *mut c_void, c_int, u64),
        symbol,
        pfn,
        version,
        flags
    );
    if rc == CUDA_SUCCESS {
        interpose_proc(symbol, pfn, version, flags);
    }
    rc
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CuResult {
    let rc = call_real!(
        R_GET_PROC_ADDRESS_V2,
        fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int),
        symbol,
        pfn,
        version,
        flags,
        status
    );
    if rc == CUDA_SUCCESS {
        interpose_proc(symbol, pfn, version, flags);
    }
    rc
}
