//! A fake NVML (`libnvidia-ml.so.1`) for testing the limiter without a GPU: one device of
//! 15 GiB of which [`USED`] is taken by "other" processes, so a test can tell the limiter's
//! view (the quota, the container's usage) from the device's. Calls before `nvmlInit` return
//! `NVML_ERROR_UNINITIALIZED`, like the real library.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::SeqCst;

type NvmlReturn = c_int;

pub const TOTAL: u64 = 15 << 30;
/// Device memory in use by processes outside the container: 300 MiB.
pub const USED: u64 = 300 << 20;
/// Same GPU as the fake driver's.
pub const UUID: &str = "GPU-11111111-2222-3333-4444-555555555555";

const SUCCESS: NvmlReturn = 0;
const UNINITIALIZED: NvmlReturn = 1;
const INVALID_ARGUMENT: NvmlReturn = 2;
const INSUFFICIENT_SIZE: NvmlReturn = 7;

static INIT: AtomicBool = AtomicBool::new(false);
static DEVICE: u8 = 0;

fn device() -> *mut c_void {
    &DEVICE as *const u8 as *mut c_void
}

fn check(dev: *mut c_void) -> Result<(), NvmlReturn> {
    if !INIT.load(SeqCst) {
        return Err(UNINITIALIZED);
    }
    if dev != device() {
        return Err(INVALID_ARGUMENT);
    }
    Ok(())
}

/// Writes `value` to the caller's out-parameter: `INVALID_ARGUMENT` when it is null.
fn write_out<T>(p: *mut T, value: T) -> NvmlReturn {
    if p.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: checked non-null.
    unsafe { p.write(value) };
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> NvmlReturn {
    INIT.store(true, SeqCst);
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit() -> NvmlReturn {
    nvmlInit_v2()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> NvmlReturn {
    INIT.store(false, SeqCst);
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> NvmlReturn {
    if !INIT.load(SeqCst) {
        return UNINITIALIZED;
    }
    write_out(count, 1)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    dev: *mut *mut c_void,
) -> NvmlReturn {
    if !INIT.load(SeqCst) {
        return UNINITIALIZED;
    }
    if index != 0 {
        return INVALID_ARGUMENT;
    }
    write_out(dev, device())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(dev: *mut c_void, index: *mut c_uint) -> NvmlReturn {
    if let Err(rc) = check(dev) {
        return rc;
    }
    write_out(index, 0)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    dev: *mut c_void,
    uuid: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    if let Err(rc) = check(dev) {
        return rc;
    }
    if uuid.is_null() {
        return INVALID_ARGUMENT;
    }
    if (length as usize) < UUID.len() + 1 {
        return INSUFFICIENT_SIZE;
    }
    // SAFETY: uuid has room for the UUID and its NUL (checked above).
    unsafe {
        std::ptr::copy_nonoverlapping(UUID.as_ptr().cast(), uuid, UUID.len());
        uuid.add(UUID.len()).write(0);
    }
    SUCCESS
}

/// `nvmlMemory_t`.
#[repr(C)]
pub struct Memory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct MemoryV2 {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    dev: *mut c_void,
    memory: *mut Memory,
) -> NvmlReturn {
    if let Err(rc) = check(dev) {
        return rc;
    }
    write_out(
        memory,
        Memory {
            total: TOTAL,
            free: TOTAL - USED,
            used: USED,
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    dev: *mut c_void,
    memory: *mut MemoryV2,
) -> NvmlReturn {
    if let Err(rc) = check(dev) {
        return rc;
    }
    if memory.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: checked non-null; the caller set the version field.
    unsafe {
        let version = (*memory).version;
        memory.write(MemoryV2 {
            version,
            total: TOTAL,
            reserved: 5 << 20,
            free: TOTAL - USED - (5 << 20),
            used: USED,
        })
    };
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(_rc: NvmlReturn) -> *const c_char {
    c"fake nvml error".as_ptr()
}
