//! The NVML wrappers: `nvmlDeviceGetMemoryInfo` and `_v2` report the container's quota as the
//! device's total, the container's usage as used, and quota − usage as free (saturating: a
//! container over its quota shows 0 free, never 17 TB).
//!
//! An NVML handle is matched to the limits file by UUID (`nvmlDeviceGetUUID`), falling back to
//! its NVML index as a position in the file.

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::real::{Lib, RealSym};
use crate::state::{self, Limiter, UNKNOWN_DEVICE_REPORTED, limiter, report_once};

pub type NvmlReturn = c_int;
pub type NvmlDevice = *mut c_void;

pub const NVML_SUCCESS: NvmlReturn = 0;
pub const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
/// What the views return when the limiter has no usable limits or region.
pub const NVML_ERROR_NO_PERMISSION: NvmlReturn = 4;
pub const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
pub const NVML_ERROR_FUNCTION_NOT_FOUND: NvmlReturn = 13;

pub(crate) static R_NVML_MEMORY_INFO: RealSym = RealSym::new(Lib::Nvml, c"nvmlDeviceGetMemoryInfo");
pub(crate) static R_NVML_MEMORY_INFO_V2: RealSym =
    RealSym::new(Lib::Nvml, c"nvmlDeviceGetMemoryInfo_v2");
static R_NVML_UUID: RealSym = RealSym::new(Lib::Nvml, c"nvmlDeviceGetUUID");
static R_NVML_INDEX: RealSym = RealSym::new(Lib::Nvml, c"nvmlDeviceGetIndex");

macro_rules! call_real {
    ($sym:expr, fn($($ty:ty),*), $($arg:expr),*) => {{
        // SAFETY: the type spelled here is the documented C signature of the symbol.
        match unsafe { $sym.get::<unsafe extern "C" fn($($ty),*) -> NvmlReturn>() } {
            // SAFETY: forwarding arguments to the real NVML function.
            Some(f) => unsafe { f($($arg),*) },
            None => NVML_ERROR_FUNCTION_NOT_FOUND,
        }
    }};
}

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Default)]
pub struct NvmlMemory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Default)]
pub struct NvmlMemoryV2 {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

fn device_pos(lim: &Limiter, device: NvmlDevice) -> Result<usize, NvmlReturn> {
    let mut buf = [0 as c_char; 96];
    let rc = call_real!(
        R_NVML_UUID,
        fn(NvmlDevice, *mut c_char, c_uint),
        device,
        buf.as_mut_ptr(),
        buf.len() as c_uint
    );
    if rc == NVML_SUCCESS {
        buf[buf.len() - 1] = 0;
        // SAFETY: buf is NUL-terminated (forced above).
        let uuid = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
        if let Some(pos) = uuid
            .to_str()
            .ok()
            .and_then(|u| lim.limits().position_of_uuid(u))
        {
            return Ok(pos);
        }
    }
    let mut index: c_uint = 0;
    let rc = call_real!(
        R_NVML_INDEX,
        fn(NvmlDevice, *mut c_uint),
        device,
        &mut index
    );
    if rc == NVML_SUCCESS && state::valid_pos(lim, index as usize) {
        return Ok(index as usize);
    }
    report_once(
        &UNKNOWN_DEVICE_REPORTED,
        "an NVML device is not in the container's limits; its memory view is refused",
    );
    Err(NVML_ERROR_NOT_FOUND)
}

/// (total, used, free) of the container's view, given the device's real total and free.
fn view(lim: &Limiter, pos: usize, real_total: u64, real_free: u64) -> (u64, u64, u64) {
    let total = lim.limit(pos).min(real_total);
    let used = lim.used(pos);
    (total, used, total.saturating_sub(used).min(real_free))
}

/// The container's view of `device`: `query` runs the real function and gives back what it
/// carries besides (`extra`) with the device's real total and free. Returns `(extra, total,
/// used, free)`, or the NVML status to return.
fn container_view<T>(
    device: NvmlDevice,
    query: impl FnOnce() -> Result<(T, u64, u64), NvmlReturn>,
) -> Result<(T, u64, u64, u64), NvmlReturn> {
    let Some(lim) = limiter() else {
        return Err(NVML_ERROR_NO_PERMISSION);
    };
    let (extra, real_total, real_free) = query()?;
    let pos = device_pos(lim, device)?;
    let (total, used, free) = view(lim, pos, real_total, real_free);
    Ok((extra, total, used, free))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: NvmlDevice,
    memory: *mut NvmlMemory,
) -> NvmlReturn {
    if memory.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let viewed = container_view(device, || {
        let mut real = NvmlMemory::default();
        let rc = call_real!(
            R_NVML_MEMORY_INFO,
            fn(NvmlDevice, *mut NvmlMemory),
            device,
            &mut real
        );
        if rc != NVML_SUCCESS {
            return Err(rc);
        }
        Ok(((), real.total, real.free))
    });
    let ((), total, used, free) = match viewed {
        Ok(v) => v,
        Err(rc) => return rc,
    };
    // SAFETY: memory is non-null (checked) and points at the caller's nvmlMemory_t.
    unsafe { memory.write(NvmlMemory { total, free, used }) };
    NVML_SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: NvmlDevice,
    memory: *mut NvmlMemoryV2,
) -> NvmlReturn {
    if memory.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let viewed = container_view(device, || {
        // SAFETY: memory is non-null; the caller sets its version field before the call.
        let version = unsafe { (*memory).version };
        let mut real = NvmlMemoryV2 {
            version,
            ..Default::default()
        };
        let rc = call_real!(
            R_NVML_MEMORY_INFO_V2,
            fn(NvmlDevice, *mut NvmlMemoryV2),
            device,
            &mut real
        );
        if rc != NVML_SUCCESS {
            return Err(rc);
        }
        Ok((version, real.total, real.free))
    });
    let (version, total, used, free) = match viewed {
        Ok(v) => v,
        Err(rc) => return rc,
    };
    // SAFETY: memory is non-null (checked) and points at the caller's nvmlMemory_v2_t.
    unsafe {
        memory.write(NvmlMemoryV2 {
            version,
            total,
            reserved: 0,
            free,
            used,
        })
    };
    NVML_SUCCESS
}
