//! The driver API as the probes call it, and the step language the tests drive them with.
//!
//! Each command-line argument after the mode is a step; each step prints one line
//! (`<step> rc=<code> …`) so the tests can assert on exact values:
//! `init`, `info`, `devtotal`, `alloc:MiB`, `managed:MiB`, `async:MiB`, `pool:MiB`,
//! `pitch:WIDTH_BYTES:HEIGHT`, `vmm:MiB`, `vmm-host:MiB`, `array:W:H`, `array3d:W:H:D`,
//! `mipmap:W:H:D:LEVELS[:FLAGS]` (float, one channel), the legacy pre-3.2 entry points
//! `alloc32:MiB`, `pitch32:WIDTH_BYTES:HEIGHT`, `array32:W:H`, `array3d32:W:H:D`, `info32`,
//! `devtotal32`, `free:N` (the N-th successful allocation, with its matching free),
//! `free-bogus`, `info-null`, `devtotal-null`, `driver-used`, `nvml`, `nvml-v2`, `nvml-null`,
//! `map:N:MiB` / `unmap:N:MiB` (VMM allocation N at an address of its own), `retain:N` (the
//! handle mapped there, retained: a new allocation number),
//! `pool-new` (a pool of its own for `pool:MiB`, which else takes from device 0's default
//! pool), `pool-destroy`,
//! `threshold:MiB` (the release threshold of that pool, else of device 0's default pool),
//! `trim:MiB` (`cuMemPoolTrimTo` of the same), `sync` (`cuCtxSynchronize`),
//! `capture` / `capture-end` (the probe's own stream captured into a graph),
//! `stream-async:MiB` (`cuMemAllocAsync` on that stream; its `free:N` is `cuMemFreeAsync` on it),
//! `graph-new` (an empty graph), `graph-alloc:MiB` (an allocation node of that graph; its
//! `free:N` adds a free node), `graph-node-alloc:MiB` / `graph-node-alloc2:MiB` (the same
//! through the generic `cuGraphAddNode` / `cuGraphAddNode_v2`; its free node through
//! `cuGraphAddNode`), `graph-launch` (instantiates the graph the first time, then
//! launches it on the stream), `graph-launches:N` (N launches, then `cuCtxSynchronize`: the
//! time per launch), `graph-exec-destroy`, `graph-trim` (`cuDeviceGraphMemTrim`),
//! `graph-reserved` (what device 0's graph allocator holds, as the driver says),
//! `ctx-destroy` (destroys `init`'s context and makes a new one current), `ctx-destroy-v1` (the
//! same through the pre-4.0 `cuCtxDestroy`), `primary` (retains
//! device 0's primary context and makes it current), `primary-release`, `primary-reset`,
//! `smi`, `ready`, `wait` (blocks until a line or EOF on stdin), `sleep:MS`,
//! `fork:STEP/STEP/…` (a child runs those steps, its lines prefixed `child `, and exits; the
//! parent waits at most 5 s), `rawfork:STEP/…` (the same through glibc's `_Fork`, which runs no
//! atfork handlers), `fork-race:N` (forks while another thread allocates; fake driver only).

// Function pointers come from dlsym/cuGetProcAddress as void*; each transmute's target is
// the field or binding it initialises.
#![allow(clippy::missing_transmute_annotations)]

use std::ffi::{CStr, c_int, c_uint, c_void};
use std::io::{BufRead, Write};

pub type CuResult = c_int;
pub type Resolve<'a> = &'a dyn Fn(&CStr) -> *mut c_void;

/// The CUDA driver entry points the probes use.
#[derive(Clone, Copy)]
pub struct Cuda {
    pub init: unsafe extern "C" fn(c_uint) -> CuResult,
    pub device_get: unsafe extern "C" fn(*mut c_int, c_int) -> CuResult,
    pub ctx_create: unsafe extern "C" fn(*mut *mut c_void, c_uint, c_int) -> CuResult,
    pub ctx_destroy: unsafe extern "C" fn(*mut c_void) -> CuResult,
    pub ctx_set_current: unsafe extern "C" fn(*mut c_void) -> CuResult,
    pub primary_retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> CuResult,
    pub primary_release: unsafe extern "C" fn(c_int) -> CuResult,
    pub primary_reset: unsafe extern "C" fn(c_int) -> CuResult,
    pub alloc: unsafe extern "C" fn(*mut u64, usize) -> CuResult,
    pub alloc_managed: unsafe extern "C" fn(*mut u64, usize, c_uint) -> CuResult,
    pub alloc_async: unsafe extern "C" fn(*mut u64, usize, *mut c_void) -> CuResult,
    pub alloc_from_pool:
        unsafe extern "C" fn(*mut u64, usize, *mut c_void, *mut c_void) -> CuResult,
    pub alloc_pitch: unsafe extern "C" fn(*mut u64, *mut usize, usize, usize, c_uint) -> CuResult,
    pub free: unsafe extern "C" fn(u64) -> CuResult,
    pub free_async: unsafe extern "C" fn(u64, *mut c_void) -> CuResult,
    pub mem_create: unsafe extern "C" fn(*mut u64, usize, *const AllocationProp, u64) -> CuResult,
    pub mem_release: unsafe extern "C" fn(u64) -> CuResult,
    pub mem_map: unsafe extern "C" fn(u64, usize, usize, u64, u64) -> CuResult,
    pub mem_unmap: unsafe extern "C" fn(u64, usize) -> CuResult,
    pub mem_retain: unsafe extern "C" fn(*mut u64, *mut c_void) -> CuResult,
    pub array_create: unsafe extern "C" fn(*mut u64, *const ArrayDesc) -> CuResult,
    pub array3d_create: unsafe extern "C" fn(*mut u64, *const Array3dDesc) -> CuResult,
    pub array_destroy: unsafe extern "C" fn(u64) -> CuResult,
    pub get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> CuResult,
    pub total_mem: unsafe extern "C" fn(*mut usize, c_int) -> CuResult,
    pub mipmap_create: unsafe extern "C" fn(*mut u64, *const Array3dDesc, c_uint) -> CuResult,
    pub mipmap_destroy: unsafe extern "C" fn(u64) -> CuResult,
    pub pools: Pools,
    pub graphs: Graphs,
    /// The pre-3.2 entry points, if the driver has them all.
    pub legacy: Option<Legacy>,
}

/// The entry point `name` through `resolve`, as the function type its use asks for; the probe
/// fails if the driver lacks it.
macro_rules! required {
    ($resolve:expr, $name:expr) => {{
        let name: &CStr = $name;
        let p = $resolve(name);
        if p.is_null() {
            fail(&format!("cannot resolve {name:?}"));
        }
        // SAFETY: the symbol's C signature is the field's type.
        unsafe { std::mem::transmute::<*mut c_void, _>(p) }
    }};
}

/// The entry point `name` through `resolve` as `F`, None if the driver lacks it.
///
/// # Safety
/// `F` is the symbol's C function type.
unsafe fn optional<F: Copy>(resolve: Resolve, name: &CStr) -> Option<F> {
    let p = resolve(name);
    // SAFETY: the caller vouches for F; p is a non-null function address.
    (!p.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

/// The stream-ordered pool entry points (one version each).
#[derive(Clone, Copy)]
pub struct Pools {
    pub create: unsafe extern "C" fn(*mut *mut c_void, *const PoolProps) -> CuResult,
    pub destroy: unsafe extern "C" fn(*mut c_void) -> CuResult,
    pub set_attribute: unsafe extern "C" fn(*mut c_void, c_int, *const u64) -> CuResult,
    pub trim_to: unsafe extern "C" fn(*mut c_void, usize) -> CuResult,
    pub default_pool: unsafe extern "C" fn(*mut *mut c_void, c_int) -> CuResult,
    pub ctx_synchronize: unsafe extern "C" fn() -> CuResult,
}

impl Pools {
    /// Resolves each by name through `resolve` (the names have no versions).
    pub fn resolve(resolve: Resolve) -> Pools {
        Pools {
            create: required!(resolve, c"cuMemPoolCreate"),
            destroy: required!(resolve, c"cuMemPoolDestroy"),
            set_attribute: required!(resolve, c"cuMemPoolSetAttribute"),
            trim_to: required!(resolve, c"cuMemPoolTrimTo"),
            default_pool: required!(resolve, c"cuDeviceGetDefaultMemPool"),
            ctx_synchronize: required!(resolve, c"cuCtxSynchronize"),
        }
    }
}

/// Streams, their capture into graphs, and graphs' memory nodes.
#[derive(Clone, Copy)]
pub struct Graphs {
    pub stream_create: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> CuResult,
    pub begin_capture: unsafe extern "C" fn(*mut c_void, c_int) -> CuResult,
    pub end_capture: unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> CuResult,
    pub create: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> CuResult,
    pub add_alloc_node: unsafe extern "C" fn(
        *mut *mut c_void,
        *mut c_void,
        *const *mut c_void,
        usize,
        *mut MemAllocNodeParams,
    ) -> CuResult,
    pub add_free_node: unsafe extern "C" fn(
        *mut *mut c_void,
        *mut c_void,
        *const *mut c_void,
        usize,
        u64,
    ) -> CuResult,
    /// `cuGraphAddNode` (CUDA 12.2) and `cuGraphAddNode_v2` (12.3), if the driver has them.
    pub add_node: Option<AddNode>,
    pub add_node_v2: Option<AddNodeV2>,
    pub instantiate: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, u64) -> CuResult,
    pub launch: unsafe extern "C" fn(*mut c_void, *mut c_void) -> CuResult,
    pub exec_destroy: unsafe extern "C" fn(*mut c_void) -> CuResult,
    pub mem_trim: unsafe extern "C" fn(c_int) -> CuResult,
    /// `cuDeviceGetGraphMemAttribute`: what the graph allocator holds, as the driver says.
    pub mem_attribute: unsafe extern "C" fn(c_int, c_int, *mut u64) -> CuResult,
}

impl Graphs {
    /// Resolves each by name through `resolve`; `versioned`: base names (the resolver picks
    /// `cuStreamBeginCapture_v2`), else that one by its exact name.
    pub fn resolve(resolve: Resolve, versioned: bool) -> Graphs {
        Graphs {
            stream_create: required!(resolve, c"cuStreamCreate"),
            begin_capture: required!(
                resolve,
                if versioned {
                    c"cuStreamBeginCapture"
                } else {
                    c"cuStreamBeginCapture_v2"
                }
            ),
            end_capture: required!(resolve, c"cuStreamEndCapture"),
            create: required!(resolve, c"cuGraphCreate"),
            add_alloc_node: required!(resolve, c"cuGraphAddMemAllocNode"),
            add_free_node: required!(resolve, c"cuGraphAddMemFreeNode"),
            // SAFETY: the symbols' C signatures are the fields' types.
            add_node: unsafe { optional(resolve, c"cuGraphAddNode") },
            add_node_v2: unsafe { optional(resolve, c"cuGraphAddNode_v2") },
            instantiate: required!(resolve, c"cuGraphInstantiateWithFlags"),
            launch: required!(resolve, c"cuGraphLaunch"),
            exec_destroy: required!(resolve, c"cuGraphExecDestroy"),
            mem_trim: required!(resolve, c"cuDeviceGraphMemTrim"),
            mem_attribute: required!(resolve, c"cuDeviceGetGraphMemAttribute"),
        }
    }
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS_v1`: pool properties, access descriptors, size, address.
#[repr(C)]
pub struct MemAllocNodeParams {
    pub pool_props: PoolProps,
    pub access_descs: *const c_void,
    pub access_desc_count: usize,
    pub bytesize: usize,
    pub dptr: u64,
}

pub type AddNode = unsafe extern "C" fn(
    *mut *mut c_void,
    *mut c_void,
    *const *mut c_void,
    usize,
    *mut GraphNodeParams,
) -> CuResult;
/// Edge data before the count.
pub type AddNodeV2 = unsafe extern "C" fn(
    *mut *mut c_void,
    *mut c_void,
    *const *mut c_void,
    *const c_void,
    usize,
    *mut GraphNodeParams,
) -> CuResult;

/// `CUgraphNodeParams` (256 bytes): the node's type, then its parameters (an allocation
/// node's `CUDA_MEM_ALLOC_NODE_PARAMS_v2`, a free node's address) from byte 16.
#[repr(C)]
pub struct GraphNodeParams {
    pub node_type: c_int,
    pub reserved0: [c_int; 3],
    pub body: [u64; 29],
    pub reserved2: i64,
}

/// `CU_GRAPH_NODE_TYPE_MEM_ALLOC`, `CU_GRAPH_NODE_TYPE_MEM_FREE`.
const NODE_TYPE_MEM_ALLOC: c_int = 10;
const NODE_TYPE_MEM_FREE: c_int = 11;

/// The legacy (pre-3.2) entry points: `unsigned int` sizes, 32-bit `CUdeviceptr_v1`.
#[derive(Clone, Copy)]
pub struct Legacy {
    pub alloc: unsafe extern "C" fn(*mut u32, c_uint) -> CuResult,
    pub alloc_pitch:
        unsafe extern "C" fn(*mut u32, *mut c_uint, c_uint, c_uint, c_uint) -> CuResult,
    pub free: unsafe extern "C" fn(u32) -> CuResult,
    pub array_create: unsafe extern "C" fn(*mut u64, *const ArrayDescV1) -> CuResult,
    pub array3d_create: unsafe extern "C" fn(*mut u64, *const Array3dDescV1) -> CuResult,
    pub get_info: unsafe extern "C" fn(*mut c_uint, *mut c_uint) -> CuResult,
    pub total_mem: unsafe extern "C" fn(*mut c_uint, c_int) -> CuResult,
    /// The pre-4.0 `cuCtxDestroy`.
    pub ctx_destroy: unsafe extern "C" fn(*mut c_void) -> CuResult,
}

/// `CUmemAllocationProp`.
#[repr(C)]
#[derive(Default)]
pub struct AllocationProp {
    pub kind: c_uint,
    pub handle_types: c_uint,
    pub location_type: c_uint,
    pub location_id: c_int,
    pub win32_metadata: usize,
    pub flags: [u8; 8],
}

/// `CUmemPoolProps` (88 bytes): pinned device memory on device 0, the rest zero.
#[repr(C)]
pub struct PoolProps {
    pub alloc_type: c_uint,
    pub handle_types: c_uint,
    pub location_type: c_uint,
    pub location_id: c_int,
    pub rest: [u8; 72],
}

/// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`.
const POOL_ATTR_RELEASE_THRESHOLD: c_int = 4;

/// `CUDA_ARRAY_DESCRIPTOR`.
#[repr(C)]
pub struct ArrayDesc {
    pub width: usize,
    pub height: usize,
    pub format: c_uint,
    pub channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
pub struct Array3dDesc {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_uint,
    pub channels: c_uint,
    pub flags: c_uint,
}

/// `CUDA_ARRAY_DESCRIPTOR_v1`.
#[repr(C)]
pub struct ArrayDescV1 {
    pub width: c_uint,
    pub height: c_uint,
    pub format: c_uint,
    pub channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR_v1`.
#[repr(C)]
pub struct Array3dDescV1 {
    pub width: c_uint,
    pub height: c_uint,
    pub depth: c_uint,
    pub format: c_uint,
    pub channels: c_uint,
    pub flags: c_uint,
}

macro_rules! resolve_all {
    ($resolve:expr, $versioned:expr, legacy = $legacy:expr, $($field:ident = $name:literal),* $(,)?) => {{
        Cuda {
            legacy: $legacy,
            pools: Pools::resolve($resolve),
            graphs: Graphs::resolve($resolve, $versioned),
            $($field: required!($resolve, $name)),*
        }
    }};
}

impl Legacy {
    /// The legacy entry points by name through `resolve` (`dlsym`, or `cuGetProcAddress` at a
    /// version before 3020), None if any is missing.
    pub fn resolve(resolve: Resolve) -> Option<Legacy> {
        macro_rules! get {
            ($name:literal) => {{
                let p = resolve($name);
                if p.is_null() {
                    return None;
                }
                // SAFETY: the symbol's C signature is the field's type.
                unsafe { std::mem::transmute::<*mut c_void, _>(p) }
            }};
        }
        Some(Legacy {
            alloc: get!(c"cuMemAlloc"),
            alloc_pitch: get!(c"cuMemAllocPitch"),
            free: get!(c"cuMemFree"),
            array_create: get!(c"cuArrayCreate"),
            array3d_create: get!(c"cuArray3DCreate"),
            get_info: get!(c"cuMemGetInfo"),
            total_mem: get!(c"cuDeviceTotalMem"),
            ctx_destroy: get!(c"cuCtxDestroy"),
        })
    }
}

impl Cuda {
    /// Resolves every entry point by its base name through `resolve` (`dlsym` or
    /// `cuGetProcAddress`), which picks the versioned variant; the legacy ones through
    /// `legacy`.
    pub fn resolve(resolve: Resolve, versioned: bool, legacy: Resolve) -> Cuda {
        let legacy = Legacy::resolve(legacy);
        if versioned {
            resolve_all!(
                resolve,
                versioned,
                legacy = legacy,
                init = c"cuInit",
                device_get = c"cuDeviceGet",
                ctx_create = c"cuCtxCreate",
                ctx_destroy = c"cuCtxDestroy",
                ctx_set_current = c"cuCtxSetCurrent",
                primary_retain = c"cuDevicePrimaryCtxRetain",
                primary_release = c"cuDevicePrimaryCtxRelease",
                primary_reset = c"cuDevicePrimaryCtxReset",
                alloc = c"cuMemAlloc",
                alloc_managed = c"cuMemAllocManaged",
                alloc_async = c"cuMemAllocAsync",
                alloc_from_pool = c"cuMemAllocFromPoolAsync",
                alloc_pitch = c"cuMemAllocPitch",
                free = c"cuMemFree",
                free_async = c"cuMemFreeAsync",
                mem_create = c"cuMemCreate",
                mem_release = c"cuMemRelease",
                mem_map = c"cuMemMap",
                mem_unmap = c"cuMemUnmap",
                mem_retain = c"cuMemRetainAllocationHandle",
                array_create = c"cuArrayCreate",
                array3d_create = c"cuArray3DCreate",
                array_destroy = c"cuArrayDestroy",
                get_info = c"cuMemGetInfo",
                total_mem = c"cuDeviceTotalMem",
                mipmap_create = c"cuMipmappedArrayCreate",
                mipmap_destroy = c"cuMipmappedArrayDestroy",
            )
        } else {
            resolve_all!(
                resolve,
                versioned,
                legacy = legacy,
                init = c"cuInit",
                device_get = c"cuDeviceGet",
                ctx_create = c"cuCtxCreate_v2",
                ctx_destroy = c"cuCtxDestroy_v2",
                ctx_set_current = c"cuCtxSetCurrent",
                primary_retain = c"cuDevicePrimaryCtxRetain",
                primary_release = c"cuDevicePrimaryCtxRelease_v2",
                primary_reset = c"cuDevicePrimaryCtxReset_v2",
                alloc = c"cuMemAlloc_v2",
                alloc_managed = c"cuMemAllocManaged",
                alloc_async = c"cuMemAllocAsync",
                alloc_from_pool = c"cuMemAllocFromPoolAsync",
                alloc_pitch = c"cuMemAllocPitch_v2",
                free = c"cuMemFree_v2",
                free_async = c"cuMemFreeAsync",
                mem_create = c"cuMemCreate",
                mem_release = c"cuMemRelease",
                mem_map = c"cuMemMap",
                mem_unmap = c"cuMemUnmap",
                mem_retain = c"cuMemRetainAllocationHandle",
                array_create = c"cuArrayCreate_v2",
                array3d_create = c"cuArray3DCreate_v2",
                array_destroy = c"cuArrayDestroy",
                get_info = c"cuMemGetInfo_v2",
                total_mem = c"cuDeviceTotalMem_v2",
                mipmap_create = c"cuMipmappedArrayCreate",
                mipmap_destroy = c"cuMipmappedArrayDestroy",
            )
        }
    }
}

pub fn fail(msg: &str) -> ! {
    eprintln!("gpu-probe: {msg}");
    std::process::exit(100)
}

/// `dlopen(name, RTLD_NOW | RTLD_LOCAL)` as the CUDA runtime and nvidia-smi do.
pub fn dlopen(name: &CStr) -> *mut c_void {
    // SAFETY: name is NUL-terminated.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        fail(&format!("dlopen {name:?} failed"));
    }
    h
}

pub fn dlsym(handle: *mut c_void, name: &CStr) -> *mut c_void {
    // SAFETY: handle from dlopen, name NUL-terminated.
    unsafe { libc::dlsym(handle, name.as_ptr()) }
}

#[derive(Clone, Copy)]
enum Held {
    Ptr(u64),
    Async(u64),
    /// A stream-ordered allocation on the probe's stream (a graph's node while captured).
    OnStream(u64),
    /// A graph's allocation node made by hand (freed by a free node).
    Node(u64),
    /// The same through the generic `cuGraphAddNode`.
    GenericNode(u64),
    Vmm(u64),
    Array(u64),
    Mipmap(u64),
    Ptr32(u32),
}

const MIB: usize = 1 << 20;

/// A 3D descriptor of one-channel floats, its width, height and depth the step's next fields.
fn float_3d<'a>(parts: &mut impl Iterator<Item = &'a str>) -> Array3dDesc {
    Array3dDesc {
        width: num(parts.next()),
        height: num(parts.next()),
        depth: num(parts.next()),
        format: 0x20,
        channels: 1,
        flags: 0,
    }
}

fn num(s: Option<&str>) -> usize {
    s.and_then(|v| v.parse().ok())
        .unwrap_or_else(|| fail(&format!("bad number {s:?}")))
}

/// Where `map:I` maps VMM allocation I (a range of its own for each I).
fn vmm_address(i: usize) -> u64 {
    0x6000_0000_0000 + ((i as u64) << 36)
}

/// The pool `pool-new` created (0: none).
static POOL: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The pool the pool steps act on: `pool-new`'s, else device 0's default pool.
fn step_pool(cuda: &Cuda) -> *mut c_void {
    let p = POOL.load(std::sync::atomic::Ordering::Relaxed);
    if p != 0 {
        return std::ptr::without_provenance_mut(p);
    }
    let mut pool = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    let rc = unsafe { (cuda.pools.default_pool)(&mut pool, 0) };
    if rc != 0 {
        fail(&format!("cuDeviceGetDefaultMemPool rc={rc}"));
    }
    pool
}

/// The stream the graph steps capture (made at the first), the graph they build, and its
/// executable graph (0: none yet).
static STREAM: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static GRAPH: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static EXEC: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn handle(h: &std::sync::atomic::AtomicUsize) -> *mut c_void {
    std::ptr::without_provenance_mut(h.load(std::sync::atomic::Ordering::Relaxed))
}

fn set_handle(h: &std::sync::atomic::AtomicUsize, p: *mut c_void) {
    h.store(p as usize, std::sync::atomic::Ordering::Relaxed);
}

/// `cuGraphAddNode`, or the probe fails.
fn add_node(cuda: &Cuda) -> AddNode {
    cuda.graphs
        .add_node
        .unwrap_or_else(|| fail("the driver has no cuGraphAddNode (CUDA 12.2)"))
}

/// An allocation node's parameters: `bytes` of device 0's memory.
fn device0_alloc_node(bytes: usize) -> MemAllocNodeParams {
    MemAllocNodeParams {
        pool_props: PoolProps {
            alloc_type: 1,
            handle_types: 0,
            location_type: 1,
            location_id: 0,
            rest: [0; 72],
        },
        access_descs: std::ptr::null(),
        access_desc_count: 0,
        bytesize: bytes,
        dptr: 0,
    }
}

/// Instantiates the graph the steps built, unless its executable graph exists: the rc.
fn step_exec(cuda: &Cuda) -> CuResult {
    if !handle(&EXEC).is_null() {
        return 0;
    }
    let mut e = std::ptr::null_mut();
    // SAFETY: the graph the steps built and a valid out-pointer.
    let rc = unsafe { (cuda.graphs.instantiate)(&mut e, handle(&GRAPH), 0) };
    set_handle(&EXEC, e);
    rc
}

/// The probe's stream, made on first use.
fn step_stream(cuda: &Cuda) -> *mut c_void {
    if handle(&STREAM).is_null() {
        let mut s = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        let rc = unsafe { (cuda.graphs.stream_create)(&mut s, 0) };
        if rc != 0 {
            fail(&format!("cuStreamCreate rc={rc}"));
        }
        set_handle(&STREAM, s);
    }
    handle(&STREAM)
}

/// The context `init` (or `ctx-destroy`) created.
static CTX: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many of the process's arguments come before its steps (for `exec`).
static ARGS_BEFORE_STEPS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Runs the steps, printing one line each.
pub fn run(cuda: &Cuda, steps: &[String]) {
    ARGS_BEFORE_STEPS.store(
        std::env::args().count().saturating_sub(steps.len()),
        std::sync::atomic::Ordering::Relaxed,
    );
    run_steps(cuda, steps, &mut Vec::new(), "");
}

/// Runs the steps with what is `held` so far, each line after `prefix`.
fn run_steps(cuda: &Cuda, steps: &[String], held: &mut Vec<Held>, prefix: &str) {
    let mut out = std::io::stdout();
    for step in steps {
        let mut parts = step.split(':');
        let op = parts.next().unwrap_or_default();
        let line = match op {
            "init" => {
                let mut dev = 0;
                let mut ctx = std::ptr::null_mut();
                // SAFETY: valid out-pointers.
                let rc = unsafe {
                    let mut rc = (cuda.init)(0);
                    if rc == 0 {
                        rc = (cuda.device_get)(&mut dev, 0);
                    }
                    if rc == 0 {
                        rc = (cuda.ctx_create)(&mut ctx, 0, dev);
                    }
                    rc
                };
                CTX.store(ctx as usize, std::sync::atomic::Ordering::Relaxed);
                format!("init rc={rc}")
            }
            "ctx-destroy" | "ctx-destroy-v1" => {
                let destroy = if op == "ctx-destroy" {
                    cuda.ctx_destroy
                } else {
                    legacy(cuda).ctx_destroy
                };
                let old = CTX.load(std::sync::atomic::Ordering::Relaxed);
                let mut ctx = std::ptr::null_mut();
                // SAFETY: the context `init` made; a valid out-pointer.
                let (rc, new) = unsafe {
                    (
                        destroy(std::ptr::without_provenance_mut(old)),
                        (cuda.ctx_create)(&mut ctx, 0, 0),
                    )
                };
                CTX.store(ctx as usize, std::sync::atomic::Ordering::Relaxed);
                format!("{op} rc={rc} new={new}")
            }
            "primary" => {
                let mut ctx = std::ptr::null_mut();
                // SAFETY: a valid out-pointer; the context the driver returned.
                let rc = unsafe {
                    let mut rc = (cuda.primary_retain)(&mut ctx, 0);
                    if rc == 0 {
                        rc = (cuda.ctx_set_current)(ctx);
                    }
                    rc
                };
                format!("primary rc={rc}")
            }
            "primary-release" => {
                // SAFETY: plain device ordinal.
                let rc = unsafe { (cuda.primary_release)(0) };
                format!("primary-release rc={rc}")
            }
            "primary-reset" => {
                // SAFETY: plain device ordinal.
                let rc = unsafe { (cuda.primary_reset)(0) };
                format!("primary-reset rc={rc}")
            }
            "info" => {
                let (mut free, mut total) = (0, 0);
                // SAFETY: valid out-pointers.
                let rc = unsafe { (cuda.get_info)(&mut free, &mut total) };
                if rc != 0 {
                    format!("info rc={rc}")
                } else {
                    format!(
                        "info rc=0 free_mib={} total_mib={}",
                        free / MIB,
                        total / MIB
                    )
                }
            }
            "info-null" => {
                let mut total = 0;
                // SAFETY: deliberately NULL `free`; the API must refuse it.
                let rc = unsafe { (cuda.get_info)(std::ptr::null_mut(), &mut total) };
                format!("info-null rc={rc}")
            }
            "devtotal" => {
                let mut total = 0;
                // SAFETY: valid out-pointer.
                let rc = unsafe { (cuda.total_mem)(&mut total, 0) };
                if rc != 0 {
                    format!("devtotal rc={rc}")
                } else {
                    format!("devtotal rc=0 total_mib={}", total / MIB)
                }
            }
            "devtotal-null" => {
                // SAFETY: deliberately NULL; the API must refuse it.
                let rc = unsafe { (cuda.total_mem)(std::ptr::null_mut(), 0) };
                format!("devtotal-null rc={rc}")
            }
            "alloc" | "managed" | "async" | "pool" => {
                let bytes = num(parts.next()) * MIB;
                let mut p = 0u64;
                // SAFETY: valid out-pointer; null streams and pool are the defaults.
                let rc = unsafe {
                    match op {
                        "alloc" => (cuda.alloc)(&mut p, bytes),
                        "managed" => (cuda.alloc_managed)(&mut p, bytes, 1),
                        "async" => (cuda.alloc_async)(&mut p, bytes, std::ptr::null_mut()),
                        _ => (cuda.alloc_from_pool)(
                            &mut p,
                            bytes,
                            step_pool(cuda),
                            std::ptr::null_mut(),
                        ),
                    }
                };
                hold(
                    held,
                    rc,
                    if matches!(op, "async" | "pool") {
                        Held::Async(p)
                    } else {
                        Held::Ptr(p)
                    },
                    op,
                )
            }
            "pool-new" => {
                let props = PoolProps {
                    alloc_type: 1,
                    handle_types: 0,
                    location_type: 1,
                    location_id: 0,
                    rest: [0; 72],
                };
                let mut pool = std::ptr::null_mut();
                // SAFETY: a valid out-pointer and properties.
                let rc = unsafe { (cuda.pools.create)(&mut pool, &props) };
                POOL.store(pool as usize, std::sync::atomic::Ordering::Relaxed);
                format!("pool-new rc={rc}")
            }
            "pool-destroy" => {
                let pool = POOL.swap(0, std::sync::atomic::Ordering::Relaxed);
                // SAFETY: the pool `pool-new` made.
                let rc = unsafe { (cuda.pools.destroy)(std::ptr::without_provenance_mut(pool)) };
                format!("pool-destroy rc={rc}")
            }
            "threshold" => {
                let bytes = (num(parts.next()) * MIB) as u64;
                // SAFETY: a pool handle and a pointer to the cuuint64_t value.
                let rc = unsafe {
                    (cuda.pools.set_attribute)(step_pool(cuda), POOL_ATTR_RELEASE_THRESHOLD, &bytes)
                };
                format!("threshold rc={rc}")
            }
            "trim" => {
                let bytes = num(parts.next()) * MIB;
                // SAFETY: a pool handle.
                let rc = unsafe { (cuda.pools.trim_to)(step_pool(cuda), bytes) };
                format!("trim rc={rc}")
            }
            "sync" => {
                // SAFETY: no arguments.
                let rc = unsafe { (cuda.pools.ctx_synchronize)() };
                format!("sync rc={rc}")
            }
            "capture" => {
                // SAFETY: the probe's stream; CU_STREAM_CAPTURE_MODE_GLOBAL.
                let rc = unsafe { (cuda.graphs.begin_capture)(step_stream(cuda), 0) };
                format!("capture rc={rc}")
            }
            "capture-end" => {
                let mut g = std::ptr::null_mut();
                // SAFETY: the probe's stream and a valid out-pointer.
                let rc = unsafe { (cuda.graphs.end_capture)(step_stream(cuda), &mut g) };
                set_handle(&GRAPH, g);
                format!("capture-end rc={rc}")
            }
            "graph-new" => {
                let mut g = std::ptr::null_mut();
                // SAFETY: a valid out-pointer.
                let rc = unsafe { (cuda.graphs.create)(&mut g, 0) };
                set_handle(&GRAPH, g);
                format!("graph-new rc={rc}")
            }
            "stream-async" => {
                let bytes = num(parts.next()) * MIB;
                let mut p = 0u64;
                // SAFETY: a valid out-pointer and the probe's stream.
                let rc = unsafe { (cuda.alloc_async)(&mut p, bytes, step_stream(cuda)) };
                hold(held, rc, Held::OnStream(p), op)
            }
            "graph-alloc" => {
                let mut params = device0_alloc_node(num(parts.next()) * MIB);
                let mut node = std::ptr::null_mut();
                // SAFETY: the graph `graph-new` made, no dependencies, valid parameters.
                let rc = unsafe {
                    (cuda.graphs.add_alloc_node)(
                        &mut node,
                        handle(&GRAPH),
                        std::ptr::null(),
                        0,
                        &mut params,
                    )
                };
                hold(held, rc, Held::Node(params.dptr), op)
            }
            "graph-node-alloc" | "graph-node-alloc2" => {
                let mut params = GraphNodeParams {
                    node_type: NODE_TYPE_MEM_ALLOC,
                    reserved0: [0; 3],
                    body: [0; 29],
                    reserved2: 0,
                };
                // SAFETY: the allocation node's parameters fit the union (120 of 232 bytes).
                let alloc = unsafe { &mut *params.body.as_mut_ptr().cast::<MemAllocNodeParams>() };
                *alloc = device0_alloc_node(num(parts.next()) * MIB);
                let mut node = std::ptr::null_mut();
                // SAFETY: the graph `graph-new` made, no dependencies, valid parameters.
                let rc = unsafe {
                    let graph = handle(&GRAPH);
                    if op == "graph-node-alloc" {
                        add_node(cuda)(&mut node, graph, std::ptr::null(), 0, &mut params)
                    } else {
                        let add = cuda.graphs.add_node_v2.unwrap_or_else(|| {
                            fail("the driver has no cuGraphAddNode_v2 (CUDA 12.3)")
                        });
                        let (deps, edges) = (std::ptr::null(), std::ptr::null());
                        add(&mut node, graph, deps, edges, 0, &mut params)
                    }
                };
                // SAFETY: as above; the driver wrote the address.
                let dptr = unsafe { (*params.body.as_ptr().cast::<MemAllocNodeParams>()).dptr };
                hold(held, rc, Held::GenericNode(dptr), op)
            }
            "graph-launch" => {
                let mut rc = step_exec(cuda);
                if rc == 0 {
                    // SAFETY: the executable graph and the probe's stream.
                    rc = unsafe { (cuda.graphs.launch)(handle(&EXEC), step_stream(cuda)) };
                }
                format!("graph-launch rc={rc}")
            }
            "graph-launches" => {
                let n = num(parts.next()).max(1);
                let mut rc = step_exec(cuda);
                let (exec, stream) = (handle(&EXEC), step_stream(cuda));
                // SAFETY: as `graph-launch`, `n` times; then the stream is synchronized.
                let took = unsafe {
                    let t0 = std::time::Instant::now();
                    for _ in 0..n {
                        if rc != 0 {
                            break;
                        }
                        rc = (cuda.graphs.launch)(exec, stream);
                    }
                    if rc == 0 {
                        rc = (cuda.pools.ctx_synchronize)();
                    }
                    t0.elapsed()
                };
                format!(
                    "graph-launches rc={rc} us_per_launch={:.2}",
                    took.as_secs_f64() * 1e6 / n as f64
                )
            }
            "graph-exec-destroy" => {
                // SAFETY: the executable graph `graph-launch` made.
                let rc = unsafe { (cuda.graphs.exec_destroy)(handle(&EXEC)) };
                set_handle(&EXEC, std::ptr::null_mut());
                format!("graph-exec-destroy rc={rc}")
            }
            "graph-reserved" => {
                let mut bytes = 0u64;
                // SAFETY: device 0, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, a valid out-pointer.
                let rc = unsafe { (cuda.graphs.mem_attribute)(0, 2, &mut bytes) };
                format!("graph-reserved rc={rc} mib={}", bytes / MIB as u64)
            }
            "graph-trim" => {
                // SAFETY: a plain device ordinal.
                let rc = unsafe { (cuda.graphs.mem_trim)(0) };
                format!("graph-trim rc={rc}")
            }
            "pitch" => {
                let (w, h) = (num(parts.next()), num(parts.next()));
                let (mut p, mut pitch) = (0u64, 0usize);
                // SAFETY: valid out-pointers.
                let rc = unsafe { (cuda.alloc_pitch)(&mut p, &mut pitch, w, h, 4) };
                format!("{} pitch={pitch}", hold(held, rc, Held::Ptr(p), op))
            }
            "vmm" | "vmm-host" => {
                let bytes = num(parts.next()) * MIB;
                let prop = AllocationProp {
                    kind: 1,
                    location_type: if op == "vmm" { 1 } else { 2 },
                    ..Default::default()
                };
                let mut h = 0u64;
                // SAFETY: valid out-pointer and property struct.
                let rc = unsafe { (cuda.mem_create)(&mut h, bytes, &prop, 0) };
                hold(held, rc, Held::Vmm(h), op)
            }
            "map" | "unmap" => {
                let i = num(parts.next());
                let bytes = num(parts.next()) * MIB;
                let Some(&Held::Vmm(h)) = held.get(i) else {
                    fail(&format!("allocation {i} is not a VMM handle"));
                };
                // SAFETY: plain values; the handle the driver gave us.
                let rc = unsafe {
                    if op == "map" {
                        (cuda.mem_map)(vmm_address(i), bytes, 0, h, 0)
                    } else {
                        (cuda.mem_unmap)(vmm_address(i), bytes)
                    }
                };
                format!("{op} rc={rc}")
            }
            "retain" => {
                let i = num(parts.next());
                let mut h = 0u64;
                // SAFETY: a valid out-pointer; the address `map:I` mapped.
                let rc = unsafe {
                    (cuda.mem_retain)(
                        &mut h,
                        std::ptr::without_provenance_mut(vmm_address(i) as usize),
                    )
                };
                hold(held, rc, Held::Vmm(h), op)
            }
            "array" => {
                let d = ArrayDesc {
                    width: num(parts.next()),
                    height: num(parts.next()),
                    format: 0x20,
                    channels: 1,
                };
                let mut a = 0u64;
                // SAFETY: valid out-pointer and descriptor.
                let rc = unsafe { (cuda.array_create)(&mut a, &d) };
                hold(held, rc, Held::Array(a), op)
            }
            "array3d" => {
                let d = float_3d(&mut parts);
                let mut a = 0u64;
                // SAFETY: valid out-pointer and descriptor.
                let rc = unsafe { (cuda.array3d_create)(&mut a, &d) };
                hold(held, rc, Held::Array(a), op)
            }
            "mipmap" => {
                let d = float_3d(&mut parts);
                let levels = num(parts.next()) as c_uint;
                let d = Array3dDesc {
                    flags: parts.next().map_or(0, |f| num(Some(f)) as c_uint),
                    ..d
                };
                let mut m = 0u64;
                // SAFETY: valid out-pointer and descriptor.
                let rc = unsafe { (cuda.mipmap_create)(&mut m, &d, levels) };
                hold(held, rc, Held::Mipmap(m), op)
            }
            "alloc32" => {
                let legacy = legacy(cuda);
                let mut p = 0u32;
                // SAFETY: valid out-pointer.
                let rc = unsafe { (legacy.alloc)(&mut p, (num(parts.next()) * MIB) as c_uint) };
                hold(held, rc, Held::Ptr32(p), op)
            }
            "pitch32" => {
                let legacy = legacy(cuda);
                let (w, h) = (num(parts.next()) as c_uint, num(parts.next()) as c_uint);
                let (mut p, mut pitch) = (0u32, 0 as c_uint);
                // SAFETY: valid out-pointers.
                let rc = unsafe { (legacy.alloc_pitch)(&mut p, &mut pitch, w, h, 4) };
                format!("{} pitch={pitch}", hold(held, rc, Held::Ptr32(p), op))
            }
            "array32" => {
                let d = ArrayDescV1 {
                    width: num(parts.next()) as c_uint,
                    height: num(parts.next()) as c_uint,
                    format: 0x20,
                    channels: 1,
                };
                let mut a = 0u64;
                // SAFETY: valid out-pointer and descriptor.
                let rc = unsafe { (legacy(cuda).array_create)(&mut a, &d) };
                hold(held, rc, Held::Array(a), op)
            }
            "array3d32" => {
                let d = Array3dDescV1 {
                    width: num(parts.next()) as c_uint,
                    height: num(parts.next()) as c_uint,
                    depth: num(parts.next()) as c_uint,
                    format: 0x20,
                    channels: 1,
                    flags: 0,
                };
                let mut a = 0u64;
                // SAFETY: valid out-pointer and descriptor.
                let rc = unsafe { (legacy(cuda).array3d_create)(&mut a, &d) };
                hold(held, rc, Held::Array(a), op)
            }
            "info32" => {
                let (mut free, mut total) = (0 as c_uint, 0 as c_uint);
                // SAFETY: valid out-pointers.
                let rc = unsafe { (legacy(cuda).get_info)(&mut free, &mut total) };
                if rc != 0 {
                    format!("info32 rc={rc}")
                } else {
                    format!(
                        "info32 rc=0 free_mib={} total_mib={}",
                        free as usize / MIB,
                        total as usize / MIB
                    )
                }
            }
            "devtotal32" => {
                let mut total = 0 as c_uint;
                // SAFETY: valid out-pointer.
                let rc = unsafe { (legacy(cuda).total_mem)(&mut total, 0) };
                if rc != 0 {
                    format!("devtotal32 rc={rc}")
                } else {
                    format!("devtotal32 rc=0 total_mib={}", total as usize / MIB)
                }
            }
            "free" => {
                let i = num(parts.next());
                let h = *held
                    .get(i)
                    .unwrap_or_else(|| fail(&format!("no allocation {i}")));
                // SAFETY: handles the driver gave us.
                let rc = unsafe {
                    match h {
                        Held::Ptr(p) => (cuda.free)(p),
                        Held::Async(p) => (cuda.free_async)(p, std::ptr::null_mut()),
                        Held::OnStream(p) => (cuda.free_async)(p, step_stream(cuda)),
                        Held::GenericNode(p) => {
                            let mut params = GraphNodeParams {
                                node_type: NODE_TYPE_MEM_FREE,
                                reserved0: [0; 3],
                                body: [0; 29],
                                reserved2: 0,
                            };
                            params.body[0] = p;
                            let mut node = std::ptr::null_mut();
                            add_node(cuda)(
                                &mut node,
                                handle(&GRAPH),
                                std::ptr::null(),
                                0,
                                &mut params,
                            )
                        }
                        Held::Node(p) => {
                            let mut node = std::ptr::null_mut();
                            (cuda.graphs.add_free_node)(
                                &mut node,
                                handle(&GRAPH),
                                std::ptr::null(),
                                0,
                                p,
                            )
                        }
                        Held::Vmm(v) => (cuda.mem_release)(v),
                        Held::Array(a) => (cuda.array_destroy)(a),
                        Held::Mipmap(m) => (cuda.mipmap_destroy)(m),
                        Held::Ptr32(p) => (legacy(cuda).free)(p),
                    }
                };
                format!("free rc={rc}")
            }
            "free-bogus" => {
                // SAFETY: a pointer nobody allocated: the driver must refuse it, the limiter
                // must not count it.
                let rc = unsafe { (cuda.free)(0xdead_0000) };
                format!("free-bogus rc={rc}")
            }
            "driver-used" => {
                let h = dlopen(c"libcuda.so.1");
                let f = dlsym(h, c"gpushareFakeCudaUsedBytes");
                if f.is_null() {
                    fail("the driver is not the fake (no gpushareFakeCudaUsedBytes)");
                }
                // SAFETY: the fake's counter accessor: fn() -> u64.
                let used =
                    unsafe { std::mem::transmute::<*mut c_void, extern "C" fn() -> u64>(f)() };
                format!("driver-used mib={}", used / MIB as u64)
            }
            "nvml" | "nvml-v2" | "nvml-null" | "smi" => nvml(op),
            "fork" | "rawfork" => {
                // The child's steps: everything after the first ':', separated by '/'.
                let child: Vec<String> = step
                    .split_once(':')
                    .map(|(_, rest)| rest.split('/').map(str::to_string).collect())
                    .unwrap_or_default();
                let _ = out.flush();
                let pid = if op == "fork" {
                    // SAFETY: the probe is single-threaded here; the child runs steps and exits.
                    unsafe { libc::fork() }
                } else {
                    raw_fork()
                };
                match pid {
                    -1 => format!("{op} rc=-1"),
                    0 => {
                        run_steps(cuda, &child, held, "child ");
                        let _ = out.flush();
                        // SAFETY: exit runs the atexit handlers (the limiter's), as a child's
                        // normal exit does.
                        unsafe { libc::exit(0) }
                    }
                    pid => match wait_bounded(pid, CHILD_LIMIT) {
                        Some(status) => format!("{op} rc=0 status={status}"),
                        None => format!("{op} rc=timeout"),
                    },
                }
            }
            "exec" => {
                // `exec:STEPS`: the probe again in this process (same PID and start time),
                // running STEPS (after the ':', separated by '/').
                use std::os::unix::process::CommandExt;
                let steps: Vec<String> = step
                    .split_once(':')
                    .map(|(_, rest)| rest.split('/').map(str::to_string).collect())
                    .unwrap_or_default();
                let args: Vec<String> = std::env::args()
                    .take(ARGS_BEFORE_STEPS.load(std::sync::atomic::Ordering::Relaxed))
                    .collect();
                let _ = out.flush();
                let err = std::process::Command::new("/proc/self/exe")
                    .arg0(&args[0])
                    .args(&args[1..])
                    .args(&steps)
                    .exec();
                format!("exec rc=-1 {err}")
            }
            "fork-race" => fork_race(cuda, num(parts.next())),
            "ready" => "ready".to_string(),
            "wait" => {
                let mut line = String::new();
                let _ = std::io::stdin().lock().read_line(&mut line);
                "waited".to_string()
            }
            "sleep" => {
                std::thread::sleep(std::time::Duration::from_millis(num(parts.next()) as u64));
                "slept".to_string()
            }
            other => fail(&format!("unknown step {other:?}")),
        };
        let _ = writeln!(out, "{prefix}{line}");
        let _ = out.flush();
    }
}

/// Runs NVML-only steps (no CUDA driver loaded), as nvidia-smi does.
pub fn run_nvml_only(steps: &[String]) {
    for step in steps {
        let line = match step.as_str() {
            "nvml" | "nvml-v2" | "nvml-null" | "smi" => nvml(step),
            other => fail(&format!("step {other:?} needs a CUDA mode")),
        };
        println!("{line}");
    }
}

/// How long a forked child may take.
const CHILD_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Waits up to `limit` for child `pid`: its exit status (128 + signal if killed), or None after
/// killing it (SIGKILL) at the limit.
fn wait_bounded(pid: libc::pid_t, limit: std::time::Duration) -> Option<c_int> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let mut status = 0;
        // SAFETY: waits for our own child without blocking.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return Some(if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            });
        }
        if r < 0 {
            return Some(-1);
        }
        if std::time::Instant::now() >= deadline {
            // SAFETY: kills and reaps our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// glibc's `_Fork` (2.34+): a fork that runs no `pthread_atfork` handlers, as a raw `clone`
/// does.
fn raw_fork() -> libc::pid_t {
    // SAFETY: looks up a NUL-terminated name in the global scope.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"_Fork".as_ptr()) };
    if f.is_null() {
        fail("this glibc has no _Fork (2.34+)");
    }
    // SAFETY: _Fork's C signature: pid_t _Fork(void).
    let f: unsafe extern "C" fn() -> libc::pid_t = unsafe { std::mem::transmute(f) };
    // SAFETY: the probe is single-threaded here; the child runs steps and exits.
    unsafe { f() }
}

/// A test knob pair: `set(µs)` makes something stall that long, `busy()` says whether a thread
/// is inside that stall now.
type Knob = (extern "C" fn(u64), extern "C" fn() -> u64);

fn knob(handle: *mut c_void, set: &CStr, busy: &CStr) -> Knob {
    let (s, b) = (dlsym(handle, set), dlsym(handle, busy));
    if s.is_null() || b.is_null() {
        fail(&format!(
            "fork-race needs {set:?} and {busy:?} (the fake driver, the limiter's test build)"
        ));
    }
    // SAFETY: the knobs' C signatures: void(uint64_t) and uint64_t(void).
    unsafe {
        (
            std::mem::transmute::<*mut c_void, extern "C" fn(u64)>(s),
            std::mem::transmute::<*mut c_void, extern "C" fn() -> u64>(b),
        )
    }
}

/// `fork-race:N`: a thread allocates and frees 1 MiB in a loop while the main thread forks N
/// times, in turn: once that thread is inside the driver's allocation (the fake driver holds
/// each 300 µs), once it holds the limiter's allocation-table lock (the limiter's test build
/// holds it 300 µs), and at an arbitrary point of a flat-out loop. Each child must allocate
/// and free 1 MiB within [`CHILD_LIMIT`]; the first that does not ends the race. Needs the
/// fake driver and the limiter's test build.
fn fork_race(cuda: &Cuda, forks: usize) -> String {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let driver = knob(
        dlopen(c"libcuda.so.1"),
        c"gpushareFakeCudaSetAllocDelayUs",
        c"gpushareFakeCudaAllocsInFlight",
    );
    let table = knob(
        libc::RTLD_DEFAULT,
        c"gpushareLimiterTestStallTableUs",
        c"gpushareLimiterTestTableHeld",
    );
    static STOP: AtomicBool = AtomicBool::new(false);
    STOP.store(false, SeqCst);
    let (alloc, free) = (cuda.alloc, cuda.free);
    let worker = std::thread::spawn(move || {
        let mut rounds = 0u64;
        while !STOP.load(SeqCst) {
            let mut p = 0;
            // SAFETY: valid out-pointer; frees what it got.
            unsafe {
                if alloc(&mut p, MIB) == 0 {
                    free(p);
                }
            }
            rounds += 1;
        }
        rounds
    });
    let (mut ok, mut hung, mut failed) = (0, 0, 0);
    // Forks that found the thread inside the driver / holding the table's lock.
    let mut inside = [0usize; 2];
    for i in 0..forks {
        // Which stall this fork waits for: 0 the driver's, 1 the table's, 2 none.
        let kind = i % 3;
        for (k, (set, _)) in [driver, table].into_iter().enumerate() {
            set(if k == kind { 300 } else { 0 });
        }
        let busy = [driver, table].get(kind).map(|&(_, busy)| busy);
        if let Some(busy) = busy {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
            while busy() == 0 && std::time::Instant::now() < deadline {
                std::thread::yield_now();
            }
        }
        let was_inside = busy.is_some_and(|busy| busy() > 0);
        // SAFETY: the child only allocates, frees and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let mut p = 0;
            // SAFETY: valid out-pointer.
            let mut rc = unsafe { alloc(&mut p, MIB) };
            if rc == 0 {
                // SAFETY: the pointer just allocated.
                rc = unsafe { free(p) };
            }
            // SAFETY: ends the child, running its atexit handlers.
            unsafe { libc::exit(if rc == 0 { 0 } else { 1 }) }
        }
        match (pid, wait_bounded(pid, CHILD_LIMIT)) {
            (-1, _) => failed += 1,
            (_, Some(0)) => {
                ok += 1;
                if was_inside {
                    inside[kind] += 1;
                }
            }
            (_, Some(_)) => failed += 1,
            (_, None) => {
                hung += 1;
                break; // one is enough; each costs CHILD_LIMIT
            }
        }
    }
    STOP.store(true, SeqCst);
    let rounds = worker.join().unwrap_or(0);
    (driver.0)(0);
    (table.0)(0);
    format!(
        "fork-race forks={forks} ok={ok} hung={hung} failed={failed} in_driver={} in_table={} \
         worker_ran={}",
        inside[0] > 0,
        inside[1] > 0,
        rounds > 0
    )
}

fn legacy(cuda: &Cuda) -> Legacy {
    cuda.legacy
        .unwrap_or_else(|| fail("the driver lacks the legacy (pre-3.2) entry points"))
}

fn hold(held: &mut Vec<Held>, rc: CuResult, h: Held, op: &str) -> String {
    if rc == 0 {
        held.push(h);
        format!("{op} rc=0 id={}", held.len() - 1)
    } else {
        format!("{op} rc={rc}")
    }
}

type NvmlFn<T> = unsafe extern "C" fn(*mut c_void, *mut T) -> c_int;

#[repr(C)]
#[derive(Default)]
struct NvmlMemory {
    total: u64,
    free: u64,
    used: u64,
}

#[repr(C)]
#[derive(Default)]
struct NvmlMemoryV2 {
    version: c_uint,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

/// NVML as nvidia-smi reaches it: `dlopen("libnvidia-ml.so.1")` and `dlsym`.
fn nvml(op: &str) -> String {
    let h = dlopen(c"libnvidia-ml.so.1");
    let sym = |name: &CStr| {
        let p = dlsym(h, name);
        if p.is_null() {
            fail(&format!("cannot resolve {name:?}"));
        }
        p
    };
    // SAFETY: each symbol's C signature is the type it is transmuted to.
    unsafe {
        let init: unsafe extern "C" fn() -> c_int = std::mem::transmute(sym(c"nvmlInit_v2"));
        let by_index: unsafe extern "C" fn(c_uint, *mut *mut c_void) -> c_int =
            std::mem::transmute(sym(c"nvmlDeviceGetHandleByIndex_v2"));
        let shutdown: unsafe extern "C" fn() -> c_int = std::mem::transmute(sym(c"nvmlShutdown"));
        let mut dev = std::ptr::null_mut();
        let mut rc = init();
        if rc == 0 {
            rc = by_index(0, &mut dev);
        }
        if rc != 0 {
            return format!("{op} rc={rc}");
        }
        let line = match op {
            "nvml-null" => {
                let f: NvmlFn<NvmlMemory> = std::mem::transmute(sym(c"nvmlDeviceGetMemoryInfo"));
                let rc = f(dev, std::ptr::null_mut());
                let f2: NvmlFn<NvmlMemoryV2> =
                    std::mem::transmute(sym(c"nvmlDeviceGetMemoryInfo_v2"));
                let rc2 = f2(dev, std::ptr::null_mut());
                format!("nvml-null rc={rc} rc_v2={rc2}")
            }
            "nvml-v2" => {
                let f: NvmlFn<NvmlMemoryV2> =
                    std::mem::transmute(sym(c"nvmlDeviceGetMemoryInfo_v2"));
                let mut m = NvmlMemoryV2 {
                    version: (size_of::<NvmlMemoryV2>() as c_uint) | (2 << 24),
                    ..Default::default()
                };
                let rc = f(dev, &mut m);
                if rc != 0 {
                    return format!("nvml-v2 rc={rc}");
                }
                format!(
                    "nvml-v2 rc={rc} total_mib={} used_mib={} free_mib={}",
                    m.total >> 20,
                    m.used >> 20,
                    m.free >> 20
                )
            }
            _ => {
                let f: NvmlFn<NvmlMemory> = std::mem::transmute(sym(c"nvmlDeviceGetMemoryInfo"));
                let mut m = NvmlMemory::default();
                let rc = f(dev, &mut m);
                if rc != 0 {
                    format!("{op} rc={rc}")
                } else if op == "smi" {
                    // What `nvidia-smi --query-gpu=memory.total,memory.used --format=csv` prints.
                    format!(
                        "memory.total [MiB], memory.used [MiB]\n{} MiB, {} MiB",
                        m.total >> 20,
                        m.used >> 20
                    )
                } else {
                    format!(
                        "{op} rc={rc} total_mib={} used_mib={} free_mib={}",
                        m.total >> 20,
                        m.used >> 20,
                        m.free >> 20
                    )
                }
            }
        };
        shutdown();
        line
    }
}
