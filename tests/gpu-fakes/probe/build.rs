//! `gpu-probe-linked` is linked with `-lcuda` like an application built against the CUDA
//! driver: its DT_NEEDED names `libcuda.so.1`. The library it links against at build time is a
//! stub compiled here (every entry point it calls, empty); at run time the loader finds the
//! fake (or real) driver through `LD_LIBRARY_PATH`.
use std::path::PathBuf;
use std::process::Command;

const SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDeviceGet",
    "cuCtxCreate_v2",
    "cuMemAlloc_v2",
    "cuMemAllocManaged",
    "cuMemAllocAsync",
    "cuMemAllocFromPoolAsync",
    "cuMemAllocPitch_v2",
    "cuMemFree_v2",
    "cuMemFreeAsync",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemRetainAllocationHandle",
    "cuCtxDestroy_v2",
    "cuCtxSetCurrent",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuDevicePrimaryCtxReset_v2",
    "cuArrayCreate_v2",
    "cuArray3DCreate_v2",
    "cuArrayDestroy",
    "cuMemGetInfo_v2",
    "cuDeviceTotalMem_v2",
    "cuGetProcAddress",
    "cuMipmappedArrayCreate",
    "cuMipmappedArrayDestroy",
    "cuMemAlloc",
    "cuMemAllocPitch",
    "cuMemFree",
    "cuArrayCreate",
    "cuArray3DCreate",
    "cuMemGetInfo",
    "cuDeviceTotalMem",
    "cuCtxDestroy",
    "cuMemPoolCreate",
    "cuMemPoolDestroy",
    "cuMemPoolSetAttribute",
    "cuMemPoolTrimTo",
    "cuDeviceGetDefaultMemPool",
    "cuCtxSynchronize",
    "cuStreamCreate",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuGraphCreate",
    "cuGraphAddMemAllocNode",
    "cuGraphAddMemFreeNode",
    "cuGraphAddNode",
    "cuGraphAddNode_v2",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphExecDestroy",
    "cuDeviceGraphMemTrim",
    "cuDeviceGetGraphMemAttribute",
];

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let src = out.join("cuda_stub.c");
    let body: String = SYMBOLS
        .iter()
        .map(|s| format!("int {s}(void) {{ return 999; }}\n"))
        .collect();
    std::fs::write(&src, body).expect("write stub source");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o"])
        .arg(out.join("libcuda.so"))
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("running {cc} to build the libcuda link stub: {e}"));
    assert!(
        status.success(),
        "{cc} failed to build the libcuda link stub"
    );
    println!(
        "cargo:rustc-link-arg-bin=gpu-probe-linked=-L{}",
        out.display()
    );
    println!("cargo:rustc-link-arg-bin=gpu-probe-linked=-lcuda");
    println!("cargo:rerun-if-changed=build.rs");
}
