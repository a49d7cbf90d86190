//! A fake CUDA driver (`libcuda.so.1`) for testing the limiter without a GPU: one device of
//! [`TOTAL`] bytes, allocations counted in process memory, just the entry points the limiter
//! interposes plus what a program needs to get there (`cuInit`, `cuDeviceGet`,
//! `cuCtxCreate_v2`, `cuCtxGetDevice`, `cuDeviceGetUuid`, the context calls). Like the real
//! driver it refuses calls before `cuInit` (`CUDA_ERROR_NOT_INITIALIZED`) or without a context
//! (`CUDA_ERROR_INVALID_CONTEXT`), frees a context's allocations with it (`cuCtxDestroy_v2`,
//! the primary context's reset or last release; not the stream-ordered and VMM ones, which no
//! context owns), and `cuGetProcAddress` picks versioned variants itself (`_v2` from 3020 and
//! the legacy 32-bit entry point below, `cuCtxDestroy_v2` from 4000, the primary context's
//! release and reset `_v2` from 11000, `cuStreamBeginCapture_v2` from 10010, `cuGraphAddNode_v2`
//! from 12030, `_ptsz` with the per-thread flag, `cuGetProcAddress_v2`
//! from 12000). Legacy allocations get addresses below 4 GiB (a
//! `CUdeviceptr_v1` is 32 bits); the legacy views saturate at 4 GiB − 1. Stream-ordered
//! allocations come from pools (device 0's default pool, `cuDeviceSetMemPool`,
//! `cuMemPoolCreate`) that keep what is freed back to them until a synchronization
//! (`cuCtxSynchronize`, `cuStreamSynchronize`) trims them to their release threshold, a
//! `cuMemPoolTrimTo`, or their destruction. A stream can be captured into a graph
//! (`cuStreamBeginCapture`); graphs get memory nodes from captured stream-ordered allocations
//! and frees, `cuGraphAddMemAllocNode`/`cuGraphAddMemFreeNode` or `cuGraphAddNode`(`_v2`), and
//! take device memory for
//! them when launched (or uploaded) from device 0's graph allocator, which keeps it until
//! `cuDeviceGraphMemTrim` (`cuDeviceGetGraphMemAttribute` says how much it holds).
//! `gpushareFakeCudaUsedBytes` tells a test what the "driver" holds;
//! `gpushareFakeCudaSetAllocDelayUs` keeps every allocation inside the driver for a while and
//! `gpushareFakeCudaAllocsInFlight` says how many are (for forking mid-allocation). Its own
//! state survives `fork` at any instant (every lock of its tables is held across it).

#![allow(non_snake_case, clippy::missing_safety_doc)]

use gpushare_core::spin::SpinLock;
use std::collections::BTreeMap;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicBool, AtomicU64};

type CuResult = c_int;

/// The simulated GPU: 15 GiB.
pub const TOTAL: u64 = 15 << 30;
/// Its UUID as NVML prints it: `GPU-11111111-2222-3333-4444-555555555555`.
pub const UUID: [u8; 16] = [
    0x11, 0x11, 0x11, 0x11, 0x22, 0x22, 0x33, 0x33, 0x44, 0x44, 0x55, 0x55, 0x55, 0x55, 0x55, 0x55,
];

const SUCCESS: CuResult = 0;
const INVALID_VALUE: CuResult = 1;
const OUT_OF_MEMORY: CuResult = 2;
const NOT_INITIALIZED: CuResult = 3;
const INVALID_DEVICE: CuResult = 101;
const INVALID_CONTEXT: CuResult = 201;
const NOT_FOUND: CuResult = 500;

static INIT: AtomicBool = AtomicBool::new(false);
/// The current context (one for the whole process here; 0: none).
static CURRENT: AtomicU64 = AtomicU64::new(0);
/// The next context `cuCtxCreate` makes.
static NEXT_CTX: AtomicU64 = AtomicU64::new(0xc0);
/// Device 0's primary context, and how many references it has (active while any).
const PRIMARY: u64 = 0xb0;
static PRIMARY_REFS: AtomicU64 = AtomicU64::new(0);
static USED: AtomicU64 = AtomicU64::new(0);
static NEXT: AtomicU64 = AtomicU64::new(0x7f00_0000_0000);
/// Where the legacy (32-bit `CUdeviceptr_v1`) allocations are placed: below 4 GiB.
static NEXT_V1: AtomicU64 = AtomicU64::new(0x1000_0000);
/// The allocation table, behind a spin lock that `fork` handlers hold across `fork`, so a child
/// forked while another thread allocates finds it unlocked (a `Mutex` would stay locked).
/// Handle → (size, owning context or 0: the stream-ordered and VMM allocations, freed only by
/// their own free).
static ALLOCS: SpinLock<BTreeMap<u64, (u64, u64)>> = SpinLock::new(BTreeMap::new());
/// Stream-ordered memory pools by handle. A pool keeps the memory its allocations gave back
/// (`reserved` − `used`) until a synchronization trims it to its release threshold, a
/// `cuMemPoolTrimTo`, or its destruction, as the real driver does. Device 0's default pool is
/// made at `cuInit`.
static POOLS: SpinLock<BTreeMap<u64, Pool>> = SpinLock::new(BTreeMap::new());
/// Stream-ordered allocations: address → (size, pool).
static POOL_ALLOCS: SpinLock<BTreeMap<u64, (u64, u64)>> = SpinLock::new(BTreeMap::new());
/// Device 0's default pool, and the pool `cuMemAllocAsync` takes from (`cuDeviceSetMemPool`).
const DEFAULT_POOL: u64 = 0xd0;
static CURRENT_POOL: AtomicU64 = AtomicU64::new(DEFAULT_POOL);
static NEXT_POOL: AtomicU64 = AtomicU64::new(0xd1);

#[derive(Default)]
struct Pool {
    reserved: u64,
    used: u64,
    threshold: u64,
    /// Destroyed with allocations outstanding: it goes when the last is freed.
    destroyed: bool,
}

/// `CUmemPool_attribute` values this fake knows.
const POOL_ATTR_RELEASE_THRESHOLD: c_int = 4;
const POOL_ATTR_RESERVED_MEM_CURRENT: c_int = 5;
const POOL_ATTR_USED_MEM_CURRENT: c_int = 7;

/// Test knob: how long each allocation stays inside the driver (µs), and how many are there.
static ALLOC_DELAY_US: AtomicU64 = AtomicU64::new(0);
static IN_FLIGHT: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" {
    fn pthread_atfork(
        prepare: Option<extern "C" fn()>,
        parent: Option<extern "C" fn()>,
        child: Option<extern "C" fn()>,
    ) -> c_int;
}

static FORK_HANDLERS: AtomicBool = AtomicBool::new(false);

fn register_fork_handlers() {
    if FORK_HANDLERS.swap(true, SeqCst) {
        return;
    }
    // Every lock of the fake, so that a child forked while another thread holds one finds it
    // free (no code here holds two at once, so the order cannot deadlock).
    extern "C" fn prepare() {
        ALLOCS.lock();
        POOLS.lock();
        POOL_ALLOCS.lock();
        VMM.lock();
        CAPTURES.lock();
        GRAPHS.lock();
        EXECS.lock();
        GRAPH_MEM.lock();
    }
    extern "C" fn after() {
        GRAPH_MEM.unlock();
        EXECS.unlock();
        GRAPHS.unlock();
        CAPTURES.unlock();
        VMM.unlock();
        POOL_ALLOCS.unlock();
        POOLS.unlock();
        ALLOCS.unlock();
    }
    // SAFETY: registers functions that live as long as the process.
    unsafe {
        pthread_atfork(Some(prepare), Some(after), Some(after));
    }
}

/// Test knob: every allocation waits `us` microseconds inside the driver from now on.
#[unsafe(no_mangle)]
pub extern "C" fn gpushareFakeCudaSetAllocDelayUs(us: u64) {
    ALLOC_DELAY_US.store(us, SeqCst);
}

/// Allocations inside the driver right now.
#[unsafe(no_mangle)]
pub extern "C" fn gpushareFakeCudaAllocsInFlight() -> u64 {
    IN_FLIGHT.load(SeqCst)
}

fn ready() -> Result<(), CuResult> {
    if !INIT.load(SeqCst) {
        return Err(NOT_INITIALIZED);
    }
    if CURRENT.load(SeqCst) == 0 {
        return Err(INVALID_CONTEXT);
    }
    Ok(())
}

/// An allocation the current context owns (freed with it).
fn alloc(size: u64) -> Result<u64, CuResult> {
    alloc_at(&NEXT, u64::MAX, size, CURRENT.load(SeqCst))
}

/// An allocation no context owns (stream-ordered: its pool's; VMM: the process's).
fn alloc_unowned(size: u64) -> Result<u64, CuResult> {
    alloc_at(&NEXT, u64::MAX, size, 0)
}

/// A legacy allocation: its address fits a 32-bit `CUdeviceptr_v1`.
fn alloc_v1(size: u64) -> Result<u32, CuResult> {
    alloc_at(&NEXT_V1, u64::from(u32::MAX), size, CURRENT.load(SeqCst)).map(|p| p as u32)
}

/// Takes `size` bytes of the GPU at the next 2 MiB-aligned address of `next`, refusing an
/// address range past `end`; `ctx` owns it (0: none).
fn alloc_at(next: &AtomicU64, end: u64, size: u64, ctx: u64) -> Result<u64, CuResult> {
    IN_FLIGHT.fetch_add(1, SeqCst);
    let delay = ALLOC_DELAY_US.load(SeqCst);
    if delay > 0 {
        std::thread::sleep(std::time::Duration::from_micros(delay));
    }
    let r = take(next, end, size, ctx);
    IN_FLIGHT.fetch_sub(1, SeqCst);
    r
}

fn take(next: &AtomicU64, end: u64, size: u64, ctx: u64) -> Result<u64, CuResult> {
    ready()?;
    if size == 0 {
        return Err(INVALID_VALUE);
    }
    if USED
        .fetch_update(SeqCst, SeqCst, |u| {
            u.checked_add(size).filter(|&n| n <= TOTAL)
        })
        .is_err()
    {
        return Err(OUT_OF_MEMORY);
    }
    let span = size.div_ceil(1 << 21) << 21;
    let handle = next.fetch_add(span, SeqCst);
    if handle.checked_add(span).is_none_or(|e| e > end) {
        USED.fetch_sub(size, SeqCst);
        return Err(OUT_OF_MEMORY);
    }
    ALLOCS.with(|m| m.insert(handle, (size, ctx)));
    Ok(handle)
}

fn free(handle: u64) -> CuResult {
    if let Err(rc) = ready() {
        return rc;
    }
    match ALLOCS.with(|m| m.remove(&handle)) {
        Some((size, _)) => {
            USED.fetch_sub(size, SeqCst);
            SUCCESS
        }
        None => INVALID_VALUE,
    }
}

/// Frees everything context `ctx` owns, and makes no context current if it was.
fn context_gone(ctx: u64) {
    let freed: u64 = ALLOCS.with(|m| {
        let mut freed = 0;
        m.retain(|_, &mut (size, owner)| {
            if owner == ctx {
                freed += size;
            }
            owner != ctx
        });
        freed
    });
    USED.fetch_sub(freed, SeqCst);
    let _ = CURRENT.compare_exchange(ctx, 0, SeqCst, SeqCst);
}

fn out<T>(p: *mut T, r: Result<T, CuResult>) -> CuResult {
    match r {
        Ok(v) if !p.is_null() => {
            // SAFETY: p is non-null and points at the caller's out-parameter.
            unsafe { p.write(v) };
            SUCCESS
        }
        Ok(_) => INVALID_VALUE,
        Err(rc) => rc,
    }
}

/// `NOT_INITIALIZED` before `cuInit`, `INVALID_DEVICE` for any device but 0.
fn device_ready(dev: c_int) -> Result<(), CuResult> {
    if !INIT.load(SeqCst) {
        return Err(NOT_INITIALIZED);
    }
    if dev != 0 {
        return Err(INVALID_DEVICE);
    }
    Ok(())
}

/// A device query: `NOT_INITIALIZED` before `cuInit`, `INVALID_DEVICE` for any device but 0,
/// else `value` written to `p`.
fn on_device<T>(p: *mut T, dev: c_int, value: T) -> CuResult {
    if !INIT.load(SeqCst) {
        return NOT_INITIALIZED;
    }
    out(
        p,
        if dev == 0 {
            Ok(value)
        } else {
            Err(INVALID_DEVICE)
        },
    )
}

#[unsafe(no_mangle)]
pub extern "C" fn gpushareFakeCudaUsedBytes() -> u64 {
    USED.load(SeqCst)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(_flags: c_uint) -> CuResult {
    register_fork_handlers();
    POOLS.with(|m| {
        m.entry(DEFAULT_POOL).or_default();
    });
    INIT.store(true, SeqCst);
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(dev: *mut c_int, ordinal: c_int) -> CuResult {
    on_device(dev, ordinal, 0)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CuResult {
    if !INIT.load(SeqCst) {
        return NOT_INITIALIZED;
    }
    out(count, Ok(1))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(
    ctx: *mut *mut c_void,
    _flags: c_uint,
    dev: c_int,
) -> CuResult {
    if !INIT.load(SeqCst) {
        return NOT_INITIALIZED;
    }
    if dev != 0 {
        return INVALID_DEVICE;
    }
    let c = NEXT_CTX.fetch_add(1, SeqCst);
    CURRENT.store(c, SeqCst);
    out(ctx, Ok(std::ptr::without_provenance_mut(c as usize)))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDestroy_v2(ctx: *mut c_void) -> CuResult {
    destroy_ctx(ctx)
}

/// The pre-4.0 `cuCtxDestroy`: the same here. (Not a call to the exported `cuCtxDestroy_v2`,
/// which a preloaded library would interpose.)
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDestroy(ctx: *mut c_void) -> CuResult {
    destroy_ctx(ctx)
}

fn destroy_ctx(ctx: *mut c_void) -> CuResult {
    let c = ctx as u64;
    if !INIT.load(SeqCst) {
        return NOT_INITIALIZED;
    }
    if c < 0xc0 || c >= NEXT_CTX.load(SeqCst) {
        return INVALID_CONTEXT;
    }
    context_gone(c);
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut *mut c_void) -> CuResult {
    if !INIT.load(SeqCst) {
        return NOT_INITIALIZED;
    }
    out(
        ctx,
        Ok(std::ptr::without_provenance_mut(
            CURRENT.load(SeqCst) as usize
        )),
    )
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCurrent(ctx: *mut c_void) -> CuResult {
    if !INIT.load(SeqCst) {
        return NOT_INITIALIZED;
    }
    CURRENT.store(ctx as u64, SeqCst);
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut *mut c_void, dev: c_int) -> CuResult {
    let rc = on_device(ctx, dev, std::ptr::without_provenance_mut(PRIMARY as usize));
    if rc == SUCCESS {
        PRIMARY_REFS.fetch_add(1, SeqCst);
    }
    rc
}

/// One reference fewer; the last one destroys the context (and frees what it owns).
#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: c_int) -> CuResult {
    if let Err(rc) = device_ready(dev) {
        return rc;
    }
    match PRIMARY_REFS.fetch_update(SeqCst, SeqCst, |r| r.checked_sub(1)) {
        Ok(1) => {
            context_gone(PRIMARY);
            SUCCESS
        }
        Ok(_) => SUCCESS,
        Err(_) => INVALID_CONTEXT,
    }
}

/// Frees what the primary context owns; it stays retained (and current, if it was).
#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxReset_v2(dev: c_int) -> CuResult {
    if let Err(rc) = device_ready(dev) {
        return rc;
    }
    let current = CURRENT.load(SeqCst);
    context_gone(PRIMARY);
    if current == PRIMARY {
        CURRENT.store(PRIMARY, SeqCst);
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: c_int,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CuResult {
    let rc = on_device(flags, dev, 0);
    if rc != SUCCESS {
        return rc;
    }
    out(active, Ok(c_int::from(PRIMARY_REFS.load(SeqCst) > 0)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut c_int) -> CuResult {
    out(dev, ready().map(|_| 0))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: c_int) -> CuResult {
    on_device(uuid, dev, UUID)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: c_int) -> CuResult {
    // SAFETY: same contract.
    unsafe { cuDeviceGetUuid(uuid, dev) }
}

/// The device-pointer allocations: each takes `size` bytes by `$how` and writes the pointer to
/// `dptr`; the arguments after the size (flags, stream, pool) make no difference here.
macro_rules! device_ptr_allocs {
    ($($name:ident($($arg:ident: $ty:ty),*) by $how:ident;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(dptr: *mut u64, size: usize $(, $arg: $ty)*) -> CuResult {
            out(dptr, $how(size as u64))
        }
    )*};
}

device_ptr_allocs! {
    cuMemAlloc_v2() by alloc;
    cuMemAllocManaged(_flags: c_uint) by alloc;
}

/// `cuMemAllocAsync` and its per-thread-stream twin: from the current pool, or a memory node
/// of the graph a captured stream builds.
macro_rules! async_allocs {
    ($($name:ident),*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(dptr: *mut u64, size: usize, stream: *mut c_void) -> CuResult {
            out(dptr, alloc_on(stream, size as u64, CURRENT_POOL.load(SeqCst)))
        }
    )*};
}

async_allocs!(cuMemAllocAsync, cuMemAllocAsync_ptsz);

/// A stream-ordered allocation on `stream`: a memory node of the graph it is captured into,
/// else from `pool`.
fn alloc_on(stream: *mut c_void, size: u64, pool: u64) -> Result<u64, CuResult> {
    ready()?;
    match CAPTURES.with(|m| m.get(&(stream as u64)).copied()) {
        Some(graph) => graph_alloc_node(graph, size),
        None => alloc_from_pool(pool, size),
    }
}

/// A stream-ordered allocation from `pool`: taken from what the pool keeps, the pool growing by
/// what that lacks.
fn alloc_from_pool(pool: u64, size: u64) -> Result<u64, CuResult> {
    ready()?;
    if size == 0 || pool == 0 {
        return Err(INVALID_VALUE);
    }
    POOLS.with(|m| {
        let p = m
            .get_mut(&pool)
            .filter(|p| !p.destroyed)
            .ok_or(INVALID_VALUE)?;
        let grow = size.saturating_sub(p.reserved - p.used);
        if USED
            .fetch_update(SeqCst, SeqCst, |u| {
                u.checked_add(grow).filter(|&n| n <= TOTAL)
            })
            .is_err()
        {
            return Err(OUT_OF_MEMORY);
        }
        p.reserved += grow;
        p.used += size;
        Ok(())
    })?;
    let handle = NEXT.fetch_add(size.div_ceil(1 << 21) << 21, SeqCst);
    POOL_ALLOCS.with(|m| m.insert(handle, (size, pool)));
    Ok(handle)
}

/// `cuMemAllocFromPoolAsync` and its per-thread-stream twin.
macro_rules! from_pool_allocs {
    ($($name:ident),*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            dptr: *mut u64,
            size: usize,
            pool: *mut c_void,
            stream: *mut c_void,
        ) -> CuResult {
            out(dptr, alloc_on(stream, size as u64, pool as u64))
        }
    )*};
}

from_pool_allocs!(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz);

/// A stream-ordered allocation's free: its memory goes back to its pool, which keeps it (a
/// destroyed pool lets it go).
fn pool_free(handle: u64) -> Option<CuResult> {
    let (size, pool) = POOL_ALLOCS.with(|m| m.remove(&handle))?;
    POOLS.with(|m| {
        let Some(p) = m.get_mut(&pool) else {
            return;
        };
        p.used -= size;
        if p.destroyed {
            USED.fetch_sub(p.reserved - p.used, SeqCst);
            p.reserved = p.used;
            if p.used == 0 {
                m.remove(&pool);
            }
        }
    });
    Some(SUCCESS)
}

/// Each pool keeps at most what is in use or `keep(pool)`, whichever is more.
fn trim_pools(only: Option<u64>, keep: impl Fn(&Pool) -> u64) {
    POOLS.with(|m| {
        for (&h, p) in m.iter_mut() {
            if only.is_some_and(|o| o != h) {
                continue;
            }
            let target = p.used.max(keep(p)).min(p.reserved);
            USED.fetch_sub(p.reserved - target, SeqCst);
            p.reserved = target;
        }
    });
}

/// A synchronization: every pool is trimmed to its release threshold.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> CuResult {
    synchronize()
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamSynchronize(_stream: *mut c_void) -> CuResult {
    synchronize()
}

fn synchronize() -> CuResult {
    if let Err(rc) = ready() {
        return rc;
    }
    trim_pools(None, |p| p.threshold);
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemPoolTrimTo(pool: *mut c_void, min_bytes: usize) -> CuResult {
    if let Err(rc) = ready() {
        return rc;
    }
    let pool = pool as u64;
    if !POOLS.with(|m| m.contains_key(&pool)) {
        return INVALID_VALUE;
    }
    trim_pools(Some(pool), |_| min_bytes as u64);
    SUCCESS
}

/// Ignores the properties: every pool is device 0's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolCreate(pool: *mut u64, props: *const c_void) -> CuResult {
    if let Err(rc) = ready() {
        return rc;
    }
    if props.is_null() {
        return INVALID_VALUE;
    }
    let h = NEXT_POOL.fetch_add(1, SeqCst);
    POOLS.with(|m| m.insert(h, Pool::default()));
    out(pool, Ok(h))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemPoolDestroy(pool: *mut c_void) -> CuResult {
    if let Err(rc) = ready() {
        return rc;
    }
    let pool = pool as u64;
    if pool == DEFAULT_POOL {
        return INVALID_VALUE;
    }
    let _ = CURRENT_POOL.compare_exchange(pool, DEFAULT_POOL, SeqCst, SeqCst);
    POOLS.with(|m| {
        let Some(p) = m.get_mut(&pool).filter(|p| !p.destroyed) else {
            return INVALID_VALUE;
        };
        USED.fetch_sub(p.reserved - p.used, SeqCst);
        p.reserved = p.used;
        p.destroyed = true;
        if p.used == 0 {
            m.remove(&pool);
        }
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: *mut c_void,
    attr: c_int,
    value: *const u64,
) -> CuResult {
    if value.is_null() {
        return INVALID_VALUE;
    }
    let pool = pool as u64;
    POOLS.with(|m| {
        let Some(p) = m.get_mut(&pool).filter(|p| !p.destroyed) else {
            return INVALID_VALUE;
        };
        if attr == POOL_ATTR_RELEASE_THRESHOLD {
            // SAFETY: checked non-null; the threshold is a cuuint64_t.
            p.threshold = unsafe { value.read() };
        }
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: *mut c_void,
    attr: c_int,
    value: *mut u64,
) -> CuResult {
    let pool = pool as u64;
    let read = POOLS.with(|m| {
        let p = m.get(&pool).ok_or(INVALID_VALUE)?;
        Ok(match attr {
            POOL_ATTR_RELEASE_THRESHOLD => p.threshold,
            POOL_ATTR_RESERVED_MEM_CURRENT => p.reserved,
            POOL_ATTR_USED_MEM_CURRENT => p.used,
            _ => 0,
        })
    });
    out(value, read)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(pool: *mut u64, dev: c_int) -> CuResult {
    on_device(pool, dev, DEFAULT_POOL)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut u64, dev: c_int) -> CuResult {
    on_device(pool, dev, CURRENT_POOL.load(SeqCst))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceSetMemPool(dev: c_int, pool: *mut c_void) -> CuResult {
    if let Err(rc) = device_ready(dev) {
        return rc;
    }
    let pool = pool as u64;
    if !POOLS.with(|m| m.get(&pool).is_some_and(|p| !p.destroyed)) {
        return INVALID_VALUE;
    }
    CURRENT_POOL.store(pool, SeqCst);
    SUCCESS
}

/// Rows are padded to 512 bytes, as drivers do.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut u64,
    pitch: *mut usize,
    width: usize,
    height: usize,
    _element: c_uint,
) -> CuResult {
    if pitch.is_null() {
        return INVALID_VALUE;
    }
    let p = width.div_ceil(512) * 512;
    let rc = out(dptr, alloc((p * height) as u64));
    if rc == SUCCESS {
        // SAFETY: checked non-null.
        unsafe { pitch.write(p) };
    }
    rc
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree_v2(dptr: u64) -> CuResult {
    if ready().is_ok()
        && let Some(rc) = pool_free(dptr).or_else(|| graph_free(dptr))
    {
        return rc;
    }
    free(dptr)
}

/// Legacy (pre-3.2) `cuMemAlloc`: `unsigned int` size, 32-bit pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc(dptr: *mut u32, size: c_uint) -> CuResult {
    out(dptr, alloc_v1(u64::from(size)))
}

/// Legacy `cuMemAllocPitch`: 32-bit pointer, pitch and sizes; rows padded to 512 bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch(
    dptr: *mut u32,
    pitch: *mut c_uint,
    width: c_uint,
    height: c_uint,
    _element: c_uint,
) -> CuResult {
    if pitch.is_null() {
        return INVALID_VALUE;
    }
    let p = width.div_ceil(512) * 512;
    let rc = out(dptr, alloc_v1(u64::from(p) * u64::from(height)));
    if rc == SUCCESS {
        // SAFETY: checked non-null.
        unsafe { pitch.write(p) };
    }
    rc
}

/// Legacy `cuMemFree`: a 32-bit pointer.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree(dptr: u32) -> CuResult {
    free(u64::from(dptr))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeAsync(dptr: u64, stream: *mut c_void) -> CuResult {
    free_async(dptr, stream)
}

/// The exported entry points call each other only through functions like this one: a
/// preloaded library interposes the exported names. On a captured stream, a free node of its
/// graph.
fn free_async(dptr: u64, stream: *mut c_void) -> CuResult {
    if let Err(rc) = ready() {
        return rc;
    }
    if let Some(graph) = CAPTURES.with(|m| m.get(&(stream as u64)).copied()) {
        return graph_free_node(graph, dptr);
    }
    pool_free(dptr)
        .or_else(|| graph_free(dptr))
        .unwrap_or(INVALID_VALUE)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeAsync_ptsz(dptr: u64, stream: *mut c_void) -> CuResult {
    free_async(dptr, stream)
}

/// Graphs by handle: their memory nodes. A graph's allocations get addresses when the nodes
/// are made and device memory only when it is launched (or uploaded): from device 0's graph
/// allocator, which keeps what it took (for the next launches) until `cuDeviceGraphMemTrim`.
static GRAPHS: SpinLock<BTreeMap<u64, Graph>> = SpinLock::new(BTreeMap::new());
/// Instantiated graphs: their graph's memory nodes as at instantiation.
static EXECS: SpinLock<BTreeMap<u64, Graph>> = SpinLock::new(BTreeMap::new());
/// Streams being captured, and the graph each builds.
static CAPTURES: SpinLock<BTreeMap<u64, u64>> = SpinLock::new(BTreeMap::new());
/// Device 0's graph allocator.
static GRAPH_MEM: SpinLock<GraphMem> = SpinLock::new(GraphMem {
    reserved: 0,
    live: BTreeMap::new(),
});
static NEXT_GRAPH: AtomicU64 = AtomicU64::new(0x9000);
/// Graph allocations' addresses.
static NEXT_GRAPH_VA: AtomicU64 = AtomicU64::new(0x5000_0000_0000);

#[derive(Clone, Default)]
struct Graph {
    /// Allocation nodes: address, size.
    allocs: Vec<(u64, u64)>,
    /// Free nodes: addresses.
    frees: Vec<u64>,
}

struct GraphMem {
    /// What it holds from the device (counted in `USED`).
    reserved: u64,
    /// Launched graphs' allocations not freed in their graph: address → size, until freed.
    live: BTreeMap<u64, u64>,
}

/// `CUgraphMem_attribute` values.
const GRAPH_ATTR_USED_MEM_CURRENT: c_int = 0;
const GRAPH_ATTR_RESERVED_MEM_CURRENT: c_int = 2;

/// `CUDA_MEM_ALLOC_NODE_PARAMS_v1`: the pool properties (88 bytes), access descriptors, size,
/// and the address the driver writes.
#[repr(C)]
pub struct MemAllocNodeParams {
    pub pool_props: [u8; 88],
    pub access_descs: *const c_void,
    pub access_desc_count: usize,
    pub bytesize: usize,
    pub dptr: u64,
}

fn graph_alloc_node(graph: u64, size: u64) -> Result<u64, CuResult> {
    if size == 0 {
        return Err(INVALID_VALUE);
    }
    let va = NEXT_GRAPH_VA.fetch_add(size.div_ceil(1 << 21) << 21, SeqCst);
    GRAPHS.with(|m| {
        m.get_mut(&graph)
            .map(|g| g.allocs.push((va, size)))
            .ok_or(INVALID_VALUE)
    })?;
    Ok(va)
}

fn graph_free_node(graph: u64, dptr: u64) -> CuResult {
    GRAPHS.with(|m| match m.get_mut(&graph) {
        Some(g) => {
            g.frees.push(dptr);
            SUCCESS
        }
        None => INVALID_VALUE,
    })
}

/// A launched graph's allocation freed outside it: back to the graph allocator, which keeps it.
fn graph_free(dptr: u64) -> Option<CuResult> {
    GRAPH_MEM.with(|g| g.live.remove(&dptr)).map(|_| SUCCESS)
}

/// A launch (or upload) of `exec`: the graph allocator grows to hold what is live and every
/// allocation of the graph at once; those the graph does not free stay live after it.
fn graph_run(exec: u64, launch: bool) -> CuResult {
    if let Err(rc) = ready() {
        return rc;
    }
    let Some(nodes) = EXECS.with(|m| m.get(&exec).cloned()) else {
        return INVALID_VALUE;
    };
    GRAPH_MEM.with(|g| {
        if nodes.allocs.iter().any(|(va, _)| g.live.contains_key(va)) {
            return INVALID_VALUE; // launched again before its allocations were freed
        }
        let need = g.live.values().sum::<u64>() + nodes.allocs.iter().map(|a| a.1).sum::<u64>();
        let grow = need.saturating_sub(g.reserved);
        if USED
            .fetch_update(SeqCst, SeqCst, |u| {
                u.checked_add(grow).filter(|&n| n <= TOTAL)
            })
            .is_err()
        {
            return OUT_OF_MEMORY;
        }
        g.reserved += grow;
        if launch {
            for &(va, size) in &nodes.allocs {
                if !nodes.frees.contains(&va) {
                    g.live.insert(va, size);
                }
            }
        }
        SUCCESS
    })
}

/// Streams are handles only here (work runs at once).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut u64, _flags: c_uint) -> CuResult {
    out(stream, ready().map(|()| NEXT_GRAPH.fetch_add(1, SeqCst)))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamBeginCapture(stream: *mut c_void) -> CuResult {
    begin_capture(stream)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamBeginCapture_v2(stream: *mut c_void, _mode: c_int) -> CuResult {
    begin_capture(stream)
}

fn begin_capture(stream: *mut c_void) -> CuResult {
    if let Err(rc) = ready() {
        return rc;
    }
    let graph = NEXT_GRAPH.fetch_add(1, SeqCst);
    GRAPHS.with(|m| m.insert(graph, Graph::default()));
    let fresh = CAPTURES.with(|m| m.insert(stream as u64, graph).is_none());
    if fresh { SUCCESS } else { INVALID_VALUE }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamIsCapturing(stream: *mut c_void, status: *mut c_int) -> CuResult {
    let capturing = CAPTURES.with(|m| m.contains_key(&(stream as u64)));
    out(status, ready().map(|()| c_int::from(capturing)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamEndCapture(stream: *mut c_void, graph: *mut u64) -> CuResult {
    out(
        graph,
        ready().and_then(|()| {
            CAPTURES
                .with(|m| m.remove(&(stream as u64)))
                .ok_or(INVALID_VALUE)
        }),
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphCreate(graph: *mut u64, _flags: c_uint) -> CuResult {
    out(
        graph,
        ready().map(|()| {
            let g = NEXT_GRAPH.fetch_add(1, SeqCst);
            GRAPHS.with(|m| m.insert(g, Graph::default()));
            g
        }),
    )
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphDestroy(graph: u64) -> CuResult {
    match GRAPHS.with(|m| m.remove(&graph)) {
        Some(_) => SUCCESS,
        None => INVALID_VALUE,
    }
}

/// Ignores the pool properties (device 0's) and the dependencies.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    node: *mut u64,
    graph: u64,
    _deps: *const u64,
    _ndeps: usize,
    params: *mut MemAllocNodeParams,
) -> CuResult {
    if params.is_null() {
        return INVALID_VALUE;
    }
    if let Err(rc) = ready() {
        return rc;
    }
    // SAFETY: checked non-null; the caller's parameters.
    alloc_node_out(node, graph, unsafe { &mut *params })
}

/// An allocation node of `params.bytesize` in `graph`: its address written to `params.dptr`
/// and `node`.
fn alloc_node_out(node: *mut u64, graph: u64, params: &mut MemAllocNodeParams) -> CuResult {
    match graph_alloc_node(graph, params.bytesize as u64) {
        Ok(va) => {
            params.dptr = va;
            out(node, Ok(va))
        }
        Err(rc) => rc,
    }
}

/// A free node of `dptr` in `graph`, written to `node`.
fn free_node_out(node: *mut u64, graph: u64, dptr: u64) -> CuResult {
    match graph_free_node(graph, dptr) {
        SUCCESS => out(node, Ok(dptr | 1)),
        rc => rc,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemFreeNode(
    node: *mut u64,
    graph: u64,
    _deps: *const u64,
    _ndeps: usize,
    dptr: u64,
) -> CuResult {
    match ready() {
        Ok(()) => free_node_out(node, graph, dptr),
        Err(rc) => rc,
    }
}

/// The generic `cuGraphAddNode` (and `_v2`, with edge data): memory nodes only here. Its
/// `CUgraphNodeParams` has the node's type first and its parameters at byte 16.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddNode(
    node: *mut u64,
    graph: u64,
    _deps: *const u64,
    _ndeps: usize,
    params: *mut c_void,
) -> CuResult {
    // SAFETY: the caller's parameters, or null.
    unsafe { add_node(node, graph, params) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddNode_v2(
    node: *mut u64,
    graph: u64,
    _deps: *const u64,
    _edges: *const c_void,
    _ndeps: usize,
    params: *mut c_void,
) -> CuResult {
    // SAFETY: the caller's parameters, or null.
    unsafe { add_node(node, graph, params) }
}

/// # Safety
/// `params` is null or a valid `CUgraphNodeParams`.
unsafe fn add_node(node: *mut u64, graph: u64, params: *mut c_void) -> CuResult {
    if params.is_null() {
        return INVALID_VALUE;
    }
    if let Err(rc) = ready() {
        return rc;
    }
    // SAFETY: a valid `CUgraphNodeParams`: its type, its parameters at byte 16.
    let (node_type, body) = unsafe { (*(params as *const c_int), params.cast::<u8>().add(16)) };
    match node_type {
        // SAFETY: an allocation node's parameters.
        GRAPH_NODE_TYPE_MEM_ALLOC => alloc_node_out(node, graph, unsafe {
            &mut *body.cast::<MemAllocNodeParams>()
        }),
        // SAFETY: a free node's parameters: its address.
        GRAPH_NODE_TYPE_MEM_FREE => free_node_out(node, graph, unsafe { *body.cast::<u64>() }),
        _ => INVALID_VALUE,
    }
}

/// `CU_GRAPH_NODE_TYPE_MEM_ALLOC`, `CU_GRAPH_NODE_TYPE_MEM_FREE`.
const GRAPH_NODE_TYPE_MEM_ALLOC: c_int = 10;
const GRAPH_NODE_TYPE_MEM_FREE: c_int = 11;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut u64,
    graph: u64,
    _flags: u64,
) -> CuResult {
    out(
        exec,
        ready().and_then(|()| {
            let nodes = GRAPHS
                .with(|m| m.get(&graph).cloned())
                .ok_or(INVALID_VALUE)?;
            let e = NEXT_GRAPH.fetch_add(1, SeqCst);
            EXECS.with(|m| m.insert(e, nodes));
            Ok(e)
        }),
    )
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphLaunch(exec: u64, _stream: *mut c_void) -> CuResult {
    graph_run(exec, true)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphLaunch_ptsz(exec: u64, _stream: *mut c_void) -> CuResult {
    graph_run(exec, true)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphUpload(exec: u64, _stream: *mut c_void) -> CuResult {
    graph_run(exec, false)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphExecDestroy(exec: u64) -> CuResult {
    match EXECS.with(|m| m.remove(&exec)) {
        Some(_) => SUCCESS,
        None => INVALID_VALUE,
    }
}

/// The graph allocator lets go of what no live allocation uses.
#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceGraphMemTrim(dev: c_int) -> CuResult {
    if let Err(rc) = device_ready(dev) {
        return rc;
    }
    GRAPH_MEM.with(|g| {
        let target = g.live.values().sum::<u64>();
        USED.fetch_sub(g.reserved - target, SeqCst);
        g.reserved = target;
    });
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetGraphMemAttribute(
    dev: c_int,
    attr: c_int,
    value: *mut u64,
) -> CuResult {
    let (reserved, live) = GRAPH_MEM.with(|g| (g.reserved, g.live.values().sum::<u64>()));
    let v = match attr {
        GRAPH_ATTR_USED_MEM_CURRENT => live,
        GRAPH_ATTR_RESERVED_MEM_CURRENT => reserved,
        _ => return INVALID_VALUE,
    };
    on_device(value, dev, v)
}

/// VMM: device-located handles take device memory; host-located ones take none here.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const [c_uint; 4],
    _flags: u64,
) -> CuResult {
    if prop.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: prop is non-null and points at a CUmemAllocationProp (its head is 4 u32).
    let [_, _, location_type, location_id] = unsafe { prop.read_unaligned() };
    if location_type == 1 && location_id != 0 {
        return INVALID_DEVICE;
    }
    let h = if location_type == 1 {
        alloc_unowned(size as u64)
    } else {
        ready().map(|()| {
            let h = NEXT.fetch_add(1 << 21, SeqCst);
            ALLOCS.with(|m| m.insert(h, (0, 0)));
            h
        })
    };
    if let Ok(h) = h {
        VMM.with(|v| v.handles.insert(h, (1, 0)));
    }
    out(handle, h)
}

/// The VMM handles' holders and the mappings: an allocation's memory is freed when its last
/// reference (`cuMemCreate`'s, each `cuMemRetainAllocationHandle`'s) is released and its last
/// mapping unmapped, whichever comes last.
struct Vmm {
    /// Handle → (references, mappings).
    handles: BTreeMap<u64, (u32, u32)>,
    /// Address → (size, handle).
    mappings: BTreeMap<u64, (u64, u64)>,
}

static VMM: SpinLock<Vmm> = SpinLock::new(Vmm {
    handles: BTreeMap::new(),
    mappings: BTreeMap::new(),
});

/// Frees `handle`'s memory if nothing holds it any more.
fn vmm_settle(v: &mut Vmm, handle: u64) {
    if v.handles.get(&handle) == Some(&(0, 0)) {
        v.handles.remove(&handle);
        free(handle);
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemRelease(handle: u64) -> CuResult {
    if let Err(rc) = ready() {
        return rc;
    }
    VMM.with(|v| match v.handles.get_mut(&handle) {
        Some((refs, _)) if *refs > 0 => {
            *refs -= 1;
            vmm_settle(v, handle);
            SUCCESS
        }
        _ => INVALID_VALUE,
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemMap(
    ptr: u64,
    size: usize,
    _offset: usize,
    handle: u64,
    _flags: u64,
) -> CuResult {
    if let Err(rc) = ready() {
        return rc;
    }
    VMM.with(|v| {
        let taken = v
            .mappings
            .range(..ptr.saturating_add(size as u64))
            .next_back();
        if size == 0 || taken.is_some_and(|(&va, &(s, _))| va + s > ptr) {
            return INVALID_VALUE;
        }
        match v.handles.get_mut(&handle) {
            Some((refs, maps)) if *refs > 0 => {
                *maps += 1;
                v.mappings.insert(ptr, (size as u64, handle));
                SUCCESS
            }
            _ => INVALID_VALUE,
        }
    })
}

/// Unmaps every mapping that starts in `[ptr, ptr + size)` (the driver unmaps whole mappings
/// only).
#[unsafe(no_mangle)]
pub extern "C" fn cuMemUnmap(ptr: u64, size: usize) -> CuResult {
    if let Err(rc) = ready() {
        return rc;
    }
    VMM.with(|v| {
        let vas: Vec<u64> = v
            .mappings
            .range(ptr..ptr.saturating_add(size as u64))
            .map(|(&va, _)| va)
            .collect();
        if vas.is_empty() {
            return INVALID_VALUE;
        }
        for va in vas {
            let (_, h) = v.mappings.remove(&va).expect("listed");
            if let Some((_, maps)) = v.handles.get_mut(&h) {
                *maps -= 1;
            }
            vmm_settle(v, h);
        }
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut u64,
    addr: *mut c_void,
) -> CuResult {
    if let Err(rc) = ready() {
        return rc;
    }
    let a = addr as u64;
    let found = VMM.with(|v| {
        let (&va, &(size, h)) = v.mappings.range(..=a).next_back()?;
        if a >= va + size {
            return None;
        }
        v.handles.get_mut(&h)?.0 += 1;
        Some(h)
    });
    out(handle, found.ok_or(INVALID_VALUE))
}

fn array_size(width: usize, height: usize, depth: usize, format: c_uint, channels: c_uint) -> u64 {
    let elem = match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        _ => 4,
    };
    (width.max(1) * height.max(1) * depth.max(1)) as u64 * elem * u64::from(channels.max(1))
}

/// A mipmapped array's levels: each halves width, height and (unless the array is layered or a
/// cubemap, whose depth counts layers) depth, down to 1; the level count is clamped to
/// `1 + floor(log2(largest extent))`.
fn mipmapped_size(
    w: usize,
    h: usize,
    d: usize,
    format: c_uint,
    channels: c_uint,
    flags: c_uint,
    levels: c_uint,
) -> u64 {
    let largest = w.max(h).max(d).max(1);
    let most = usize::BITS - largest.leading_zeros();
    let layered = flags & (0x01 | 0x04) != 0;
    (0..levels.clamp(1, most))
        .map(|l| {
            let depth = if layered { d } else { (d >> l).max(1) };
            array_size((w >> l).max(1), (h >> l).max(1), depth, format, channels)
        })
        .sum()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(array: *mut u64, desc: *const [usize; 3]) -> CuResult {
    if desc.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: desc points at a CUDA_ARRAY_DESCRIPTOR: width, height, then format and channels
    // packed as two u32 in the third word.
    let [w, h, fc] = unsafe { desc.read() };
    let (format, channels) = (fc as u32, (fc >> 32) as u32);
    out(array, alloc(array_size(w, h, 1, format, channels)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(array: *mut u64, desc: *const [usize; 5]) -> CuResult {
    if desc.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: desc points at a CUDA_ARRAY3D_DESCRIPTOR: width, height, depth, format and
    // channels (two u32), flags.
    let [w, h, d, fc, _] = unsafe { desc.read() };
    out(
        array,
        alloc(array_size(w, h, d, fc as u32, (fc >> 32) as u32)),
    )
}

/// Legacy `cuArrayCreate`: a `CUDA_ARRAY_DESCRIPTOR_v1` (four u32: width, height, format,
/// channels).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate(array: *mut u64, desc: *const [u32; 4]) -> CuResult {
    if desc.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: desc points at a CUDA_ARRAY_DESCRIPTOR_v1.
    let [w, h, format, channels] = unsafe { desc.read() };
    out(
        array,
        alloc(array_size(w as usize, h as usize, 1, format, channels)),
    )
}

/// Legacy `cuArray3DCreate`: a `CUDA_ARRAY3D_DESCRIPTOR_v1` (six u32: width, height, depth,
/// format, channels, flags).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate(array: *mut u64, desc: *const [u32; 6]) -> CuResult {
    if desc.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: desc points at a CUDA_ARRAY3D_DESCRIPTOR_v1.
    let [w, h, d, format, channels, _] = unsafe { desc.read() };
    let size = array_size(w as usize, h as usize, d as usize, format, channels);
    out(array, alloc(size))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuArrayDestroy(array: u64) -> CuResult {
    free(array)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    handle: *mut u64,
    desc: *const [usize; 5],
    levels: c_uint,
) -> CuResult {
    if desc.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: desc points at a CUDA_ARRAY3D_DESCRIPTOR: width, height, depth, format and
    // channels (two u32), flags.
    let [w, h, d, fc, flags] = unsafe { desc.read() };
    let (format, channels) = (fc as u32, (fc >> 32) as u32);
    let size = mipmapped_size(w, h, d, format, channels, flags as u32, levels);
    out(handle, alloc(size))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMipmappedArrayDestroy(handle: u64) -> CuResult {
    free(handle)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CuResult {
    if let Err(rc) = ready() {
        return rc;
    }
    if free.is_null() || total.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: both checked non-null.
    unsafe {
        free.write((TOTAL - USED.load(SeqCst)) as usize);
        total.write(TOTAL as usize);
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: c_int) -> CuResult {
    on_device(bytes, dev, TOTAL as usize)
}

/// The legacy views' `unsigned int`: this fake saturates at 4 GiB − 1 (15 GiB does not fit).
fn u32_sat(bytes: u64) -> u32 {
    u32::try_from(bytes).unwrap_or(u32::MAX)
}

/// Legacy `cuMemGetInfo`: `unsigned int` out-parameters.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo(free: *mut u32, total: *mut u32) -> CuResult {
    if let Err(rc) = ready() {
        return rc;
    }
    if free.is_null() || total.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: both checked non-null.
    unsafe {
        free.write(u32_sat(TOTAL - USED.load(SeqCst)));
        total.write(u32_sat(TOTAL));
    }
    SUCCESS
}

/// Legacy `cuDeviceTotalMem`: an `unsigned int` out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem(bytes: *mut u32, dev: c_int) -> CuResult {
    on_device(bytes, dev, u32_sat(TOTAL))
}

/// The exported entry point for an exact (already versioned) name, as the real driver's
/// internal table would give it.
fn entry(name: &[u8]) -> Option<*mut c_void> {
    Some(match name {
        b"cuInit" => cuInit as *mut c_void,
        b"cuDeviceGet" => cuDeviceGet as *mut c_void,
        b"cuDeviceGetCount" => cuDeviceGetCount as *mut c_void,
        b"cuCtxCreate_v2" => cuCtxCreate_v2 as *mut c_void,
        b"cuCtxDestroy_v2" => cuCtxDestroy_v2 as *mut c_void,
        b"cuCtxDestroy" => cuCtxDestroy as *mut c_void,
        b"cuCtxGetCurrent" => cuCtxGetCurrent as *mut c_void,
        b"cuCtxSetCurrent" => cuCtxSetCurrent as *mut c_void,
        b"cuDevicePrimaryCtxRetain" => cuDevicePrimaryCtxRetain as *mut c_void,
        b"cuDevicePrimaryCtxRelease_v2" => cuDevicePrimaryCtxRelease_v2 as *mut c_void,
        b"cuDevicePrimaryCtxReset_v2" => cuDevicePrimaryCtxReset_v2 as *mut c_void,
        b"cuDevicePrimaryCtxGetState" => cuDevicePrimaryCtxGetState as *mut c_void,
        b"cuCtxGetDevice" => cuCtxGetDevice as *mut c_void,
        b"cuDeviceGetUuid" => cuDeviceGetUuid as *mut c_void,
        b"cuDeviceGetUuid_v2" => cuDeviceGetUuid_v2 as *mut c_void,
        b"cuMemAlloc_v2" => cuMemAlloc_v2 as *mut c_void,
        b"cuMemAllocManaged" => cuMemAllocManaged as *mut c_void,
        b"cuMemAllocAsync" => cuMemAllocAsync as *mut c_void,
        b"cuMemAllocAsync_ptsz" => cuMemAllocAsync_ptsz as *mut c_void,
        b"cuMemAllocFromPoolAsync" => cuMemAllocFromPoolAsync as *mut c_void,
        b"cuMemAllocFromPoolAsync_ptsz" => cuMemAllocFromPoolAsync_ptsz as *mut c_void,
        b"cuMemAllocPitch_v2" => cuMemAllocPitch_v2 as *mut c_void,
        b"cuCtxSynchronize" => cuCtxSynchronize as *mut c_void,
        b"cuStreamSynchronize" => cuStreamSynchronize as *mut c_void,
        b"cuMemPoolTrimTo" => cuMemPoolTrimTo as *mut c_void,
        b"cuMemPoolCreate" => cuMemPoolCreate as *mut c_void,
        b"cuMemPoolDestroy" => cuMemPoolDestroy as *mut c_void,
        b"cuMemPoolSetAttribute" => cuMemPoolSetAttribute as *mut c_void,
        b"cuMemPoolGetAttribute" => cuMemPoolGetAttribute as *mut c_void,
        b"cuDeviceGetDefaultMemPool" => cuDeviceGetDefaultMemPool as *mut c_void,
        b"cuDeviceGetMemPool" => cuDeviceGetMemPool as *mut c_void,
        b"cuDeviceSetMemPool" => cuDeviceSetMemPool as *mut c_void,
        b"cuMemFree_v2" => cuMemFree_v2 as *mut c_void,
        b"cuMemFreeAsync" => cuMemFreeAsync as *mut c_void,
        b"cuMemFreeAsync_ptsz" => cuMemFreeAsync_ptsz as *mut c_void,
        b"cuStreamCreate" => cuStreamCreate as *mut c_void,
        b"cuStreamBeginCapture" => cuStreamBeginCapture as *mut c_void,
        b"cuStreamBeginCapture_v2" => cuStreamBeginCapture_v2 as *mut c_void,
        b"cuStreamIsCapturing" => cuStreamIsCapturing as *mut c_void,
        b"cuStreamEndCapture" => cuStreamEndCapture as *mut c_void,
        b"cuGraphCreate" => cuGraphCreate as *mut c_void,
        b"cuGraphDestroy" => cuGraphDestroy as *mut c_void,
        b"cuGraphAddMemAllocNode" => cuGraphAddMemAllocNode as *mut c_void,
        b"cuGraphAddMemFreeNode" => cuGraphAddMemFreeNode as *mut c_void,
        b"cuGraphAddNode" => cuGraphAddNode as *mut c_void,
        b"cuGraphAddNode_v2" => cuGraphAddNode_v2 as *mut c_void,
        b"cuGraphInstantiateWithFlags" => cuGraphInstantiateWithFlags as *mut c_void,
        b"cuGraphLaunch" => cuGraphLaunch as *mut c_void,
        b"cuGraphLaunch_ptsz" => cuGraphLaunch_ptsz as *mut c_void,
        b"cuGraphUpload" => cuGraphUpload as *mut c_void,
        b"cuGraphExecDestroy" => cuGraphExecDestroy as *mut c_void,
        b"cuDeviceGraphMemTrim" => cuDeviceGraphMemTrim as *mut c_void,
        b"cuDeviceGetGraphMemAttribute" => cuDeviceGetGraphMemAttribute as *mut c_void,
        b"cuMemCreate" => cuMemCreate as *mut c_void,
        b"cuMemRelease" => cuMemRelease as *mut c_void,
        b"cuMemMap" => cuMemMap as *mut c_void,
        b"cuMemUnmap" => cuMemUnmap as *mut c_void,
        b"cuMemRetainAllocationHandle" => cuMemRetainAllocationHandle as *mut c_void,
        b"cuArrayCreate_v2" => cuArrayCreate_v2 as *mut c_void,
        b"cuArray3DCreate_v2" => cuArray3DCreate_v2 as *mut c_void,
        b"cuArrayDestroy" => cuArrayDestroy as *mut c_void,
        b"cuMipmappedArrayCreate" => cuMipmappedArrayCreate as *mut c_void,
        b"cuMipmappedArrayDestroy" => cuMipmappedArrayDestroy as *mut c_void,
        b"cuMemGetInfo_v2" => cuMemGetInfo_v2 as *mut c_void,
        b"cuDeviceTotalMem_v2" => cuDeviceTotalMem_v2 as *mut c_void,
        b"cuMemAlloc" => cuMemAlloc as *mut c_void,
        b"cuMemAllocPitch" => cuMemAllocPitch as *mut c_void,
        b"cuMemFree" => cuMemFree as *mut c_void,
        b"cuArrayCreate" => cuArrayCreate as *mut c_void,
        b"cuArray3DCreate" => cuArray3DCreate as *mut c_void,
        b"cuMemGetInfo" => cuMemGetInfo as *mut c_void,
        b"cuDeviceTotalMem" => cuDeviceTotalMem as *mut c_void,
        b"cuGetProcAddress" => cuGetProcAddress as *mut c_void,
        b"cuGetProcAddress_v2" => cuGetProcAddress_v2 as *mut c_void,
        _ => return None,
    })
}

/// Names whose `_v2` variant came later, and the version it came with (earlier versions get the
/// first variant, which this driver has only for `cuStreamBeginCapture` and `cuGraphAddNode`).
const V2_FROM_LATER: &[(&[u8], c_int)] = &[
    (b"cuCtxDestroy", 4000),
    (b"cuDevicePrimaryCtxRelease", 11000),
    (b"cuDevicePrimaryCtxReset", 11000),
    (b"cuStreamBeginCapture", 10010),
    (b"cuGraphAddNode", 12030),
];

/// Names that have a `_v2` variant from CUDA 3.2 (3020).
const V2_FROM_3020: &[&[u8]] = &[
    b"cuCtxCreate",
    b"cuMemAlloc",
    b"cuMemAllocPitch",
    b"cuMemFree",
    b"cuArrayCreate",
    b"cuArray3DCreate",
    b"cuMemGetInfo",
    b"cuDeviceTotalMem",
];

fn proc_address(symbol: *const c_char, version: c_int, flags: u64) -> Option<*mut c_void> {
    if symbol.is_null() {
        return None;
    }
    // SAFETY: symbol is the caller's NUL-terminated name.
    let base = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    let mut name = base.to_vec();
    if let Some(from) = V2_FROM_LATER
        .iter()
        .find_map(|&(n, from)| (n == base).then_some(from))
    {
        if version >= from {
            name.extend_from_slice(b"_v2");
        }
    } else if V2_FROM_3020.contains(&base) {
        if version < 3020 {
            return entry(base); // the legacy (32-bit) entry point, where simulated
        }
        name.extend_from_slice(b"_v2");
    } else if base == b"cuGetProcAddress" && version >= 12000 {
        name.extend_from_slice(b"_v2");
    } else if flags & 2 != 0 {
        let mut ptsz = name.clone();
        ptsz.extend_from_slice(b"_ptsz");
        if let Some(p) = entry(&ptsz) {
            return Some(p);
        }
    }
    entry(&name)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CuResult {
    if pfn.is_null() {
        return INVALID_VALUE;
    }
    let found = proc_address(symbol, cuda_version, flags);
    // SAFETY: checked non-null.
    unsafe { pfn.write(found.unwrap_or(std::ptr::null_mut())) };
    if found.is_some() { SUCCESS } else { NOT_FOUND }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    symbol_status: *mut c_int,
) -> CuResult {
    // SAFETY: same contract.
    let rc = unsafe { cuGetProcAddress(symbol, pfn, cuda_version, flags) };
    if !symbol_status.is_null() {
        // SAFETY: checked non-null. 0 = found, 1 = symbol not found.
        unsafe { symbol_status.write(if rc == SUCCESS { 0 } else { 1 }) };
    }
    rc
}
