//! `gpu-probe-linked STEP…`: an application linked against the driver (`-lcuda`, DT_NEEDED
//! `libcuda.so.1`); its calls bind to the driver's symbols at load time, so only symbol
//! interposition (the preloaded limiter) can see them. Steps as in `api.rs`.

// Shared with gpu-probe, which also uses the resolvers and the NVML-only runner.
#[allow(dead_code)]
#[path = "../api.rs"]
mod api;

use std::ffi::{c_int, c_uint, c_void};

use api::{
    AllocationProp, Array3dDesc, Array3dDescV1, ArrayDesc, ArrayDescV1, CuResult, Cuda,
    GraphNodeParams, Graphs, Legacy, MemAllocNodeParams, PoolProps, Pools,
};

unsafe extern "C" {
    fn cuInit(flags: c_uint) -> CuResult;
    fn cuDeviceGet(dev: *mut c_int, ordinal: c_int) -> CuResult;
    fn cuCtxCreate_v2(ctx: *mut *mut c_void, flags: c_uint, dev: c_int) -> CuResult;
    fn cuCtxDestroy_v2(ctx: *mut c_void) -> CuResult;
    fn cuCtxSetCurrent(ctx: *mut c_void) -> CuResult;
    fn cuDevicePrimaryCtxRetain(ctx: *mut *mut c_void, dev: c_int) -> CuResult;
    fn cuDevicePrimaryCtxRelease_v2(dev: c_int) -> CuResult;
    fn cuDevicePrimaryCtxReset_v2(dev: c_int) -> CuResult;
    fn cuMemAlloc_v2(dptr: *mut u64, bytes: usize) -> CuResult;
    fn cuMemAllocManaged(dptr: *mut u64, bytes: usize, flags: c_uint) -> CuResult;
    fn cuMemAllocAsync(dptr: *mut u64, bytes: usize, stream: *mut c_void) -> CuResult;
    fn cuMemAllocFromPoolAsync(
        dptr: *mut u64,
        bytes: usize,
        pool: *mut c_void,
        stream: *mut c_void,
    ) -> CuResult;
    fn cuMemAllocPitch_v2(
        dptr: *mut u64,
        pitch: *mut usize,
        w: usize,
        h: usize,
        elem: c_uint,
    ) -> CuResult;
    fn cuMemFree_v2(dptr: u64) -> CuResult;
    fn cuMemFreeAsync(dptr: u64, stream: *mut c_void) -> CuResult;
    fn cuMemCreate(
        handle: *mut u64,
        size: usize,
        prop: *const AllocationProp,
        flags: u64,
    ) -> CuResult;
    fn cuMemRelease(handle: u64) -> CuResult;
    fn cuMemMap(ptr: u64, size: usize, offset: usize, handle: u64, flags: u64) -> CuResult;
    fn cuMemUnmap(ptr: u64, size: usize) -> CuResult;
    fn cuMemRetainAllocationHandle(handle: *mut u64, addr: *mut c_void) -> CuResult;
    fn cuArrayCreate_v2(array: *mut u64, desc: *const ArrayDesc) -> CuResult;
    fn cuArray3DCreate_v2(array: *mut u64, desc: *const Array3dDesc) -> CuResult;
    fn cuArrayDestroy(array: u64) -> CuResult;
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CuResult;
    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: c_int) -> CuResult;
    fn cuMipmappedArrayCreate(
        handle: *mut u64,
        desc: *const Array3dDesc,
        levels: c_uint,
    ) -> CuResult;
    fn cuMipmappedArrayDestroy(handle: u64) -> CuResult;
    fn cuMemPoolCreate(pool: *mut *mut c_void, props: *const PoolProps) -> CuResult;
    fn cuMemPoolDestroy(pool: *mut c_void) -> CuResult;
    fn cuMemPoolSetAttribute(pool: *mut c_void, attr: c_int, value: *const u64) -> CuResult;
    fn cuMemPoolTrimTo(pool: *mut c_void, min_bytes: usize) -> CuResult;
    fn cuDeviceGetDefaultMemPool(pool: *mut *mut c_void, dev: c_int) -> CuResult;
    fn cuCtxSynchronize() -> CuResult;
    fn cuStreamCreate(stream: *mut *mut c_void, flags: c_uint) -> CuResult;
    fn cuStreamBeginCapture_v2(stream: *mut c_void, mode: c_int) -> CuResult;
    fn cuStreamEndCapture(stream: *mut c_void, graph: *mut *mut c_void) -> CuResult;
    fn cuGraphCreate(graph: *mut *mut c_void, flags: c_uint) -> CuResult;
    fn cuGraphAddMemAllocNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        ndeps: usize,
        params: *mut MemAllocNodeParams,
    ) -> CuResult;
    fn cuGraphAddMemFreeNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        ndeps: usize,
        dptr: u64,
    ) -> CuResult;
    fn cuGraphAddNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        ndeps: usize,
        params: *mut GraphNodeParams,
    ) -> CuResult;
    fn cuGraphAddNode_v2(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        edges: *const c_void,
        ndeps: usize,
        params: *mut GraphNodeParams,
    ) -> CuResult;
    fn cuGraphInstantiateWithFlags(
        exec: *mut *mut c_void,
        graph: *mut c_void,
        flags: u64,
    ) -> CuResult;
    fn cuGraphLaunch(exec: *mut c_void, stream: *mut c_void) -> CuResult;
    fn cuGraphExecDestroy(exec: *mut c_void) -> CuResult;
    fn cuDeviceGraphMemTrim(dev: c_int) -> CuResult;
    fn cuDeviceGetGraphMemAttribute(dev: c_int, attr: c_int, value: *mut u64) -> CuResult;
    // The legacy (pre-3.2) entry points, as a binary built against CUDA < 3.2 links them.
    fn cuMemAlloc(dptr: *mut u32, bytes: c_uint) -> CuResult;
    fn cuMemAllocPitch(
        dptr: *mut u32,
        pitch: *mut c_uint,
        w: c_uint,
        h: c_uint,
        elem: c_uint,
    ) -> CuResult;
    fn cuMemFree(dptr: u32) -> CuResult;
    fn cuCtxDestroy(ctx: *mut c_void) -> CuResult;
    fn cuArrayCreate(array: *mut u64, desc: *const ArrayDescV1) -> CuResult;
    fn cuArray3DCreate(array: *mut u64, desc: *const Array3dDescV1) -> CuResult;
    fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CuResult;
    fn cuDeviceTotalMem(bytes: *mut c_uint, dev: c_int) -> CuResult;
}

fn main() {
    let cuda = Cuda {
        init: cuInit,
        device_get: cuDeviceGet,
        ctx_create: cuCtxCreate_v2,
        ctx_destroy: cuCtxDestroy_v2,
        ctx_set_current: cuCtxSetCurrent,
        primary_retain: cuDevicePrimaryCtxRetain,
        primary_release: cuDevicePrimaryCtxRelease_v2,
        primary_reset: cuDevicePrimaryCtxReset_v2,
        alloc: cuMemAlloc_v2,
        alloc_managed: cuMemAllocManaged,
        alloc_async: cuMemAllocAsync,
        alloc_from_pool: cuMemAllocFromPoolAsync,
        alloc_pitch: cuMemAllocPitch_v2,
        free: cuMemFree_v2,
        free_async: cuMemFreeAsync,
        mem_create: cuMemCreate,
        mem_release: cuMemRelease,
        mem_map: cuMemMap,
        mem_unmap: cuMemUnmap,
        mem_retain: cuMemRetainAllocationHandle,
        array_create: cuArrayCreate_v2,
        array3d_create: cuArray3DCreate_v2,
        array_destroy: cuArrayDestroy,
        get_info: cuMemGetInfo_v2,
        total_mem: cuDeviceTotalMem_v2,
        mipmap_create: cuMipmappedArrayCreate,
        mipmap_destroy: cuMipmappedArrayDestroy,
        pools: Pools {
            create: cuMemPoolCreate,
            destroy: cuMemPoolDestroy,
            set_attribute: cuMemPoolSetAttribute,
            trim_to: cuMemPoolTrimTo,
            default_pool: cuDeviceGetDefaultMemPool,
            ctx_synchronize: cuCtxSynchronize,
        },
        graphs: Graphs {
            stream_create: cuStreamCreate,
            begin_capture: cuStreamBeginCapture_v2,
            end_capture: cuStreamEndCapture,
            create: cuGraphCreate,
            add_alloc_node: cuGraphAddMemAllocNode,
            add_free_node: cuGraphAddMemFreeNode,
            add_node: Some(cuGraphAddNode),
            add_node_v2: Some(cuGraphAddNode_v2),
            instantiate: cuGraphInstantiateWithFlags,
            launch: cuGraphLaunch,
            exec_destroy: cuGraphExecDestroy,
            mem_trim: cuDeviceGraphMemTrim,
            mem_attribute: cuDeviceGetGraphMemAttribute,
        },
        legacy: Some(Legacy {
            alloc: cuMemAlloc,
            alloc_pitch: cuMemAllocPitch,
            free: cuMemFree,
            array_create: cuArrayCreate,
            array3d_create: cuArray3DCreate,
            get_info: cuMemGetInfo,
            total_mem: cuDeviceTotalMem,
            ctx_destroy: cuCtxDestroy,
        }),
    };
    let steps: Vec<String> = std::env::args().skip(1).collect();
    api::run(&cuda, &steps);
}
