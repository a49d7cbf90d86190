//! Finding the real functions behind our wrappers: glibc's `dlsym`, and each driver entry point
//! in the real `libcuda.so.1` / `libnvidia-ml.so.1`.
//!
//! Driver symbols are looked up in the library's own handle (`dlopen(soname, RTLD_NOLOAD)`),
//! not only with `RTLD_NEXT`: the CUDA runtime and nvidia-smi `dlopen` the driver
//! `RTLD_LOCAL`, so it is not in the global scope `RTLD_NEXT` searches. Every lookup is done
//! once and cached in an atomic; a missing symbol is cached as missing.

use std::ffi::{CStr, c_char, c_void};
use std::ptr::{null_mut, without_provenance_mut};
use std::sync::atomic::AtomicPtr;
use std::sync::atomic::Ordering::{Acquire, Release};

pub(crate) type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// glibc's `dlsym`, once resolved; the x86-64 `dlsym` trampoline jumps through it, so it is
/// never null after [`real_dlsym`] returned.
pub(crate) static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

#[cfg(target_arch = "x86_64")]
const DLSYM_BASE_VERSION: &CStr = c"GLIBC_2.2.5";
#[cfg(target_arch = "aarch64")]
const DLSYM_BASE_VERSION: &CStr = c"GLIBC_2.17";
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const DLSYM_BASE_VERSION: &CStr = c"GLIBC_2.0";

/// Stands in for `dlsym` if glibc's cannot be found (not a glibc process): finds nothing.
unsafe extern "C" fn no_dlsym(_handle: *mut c_void, _symbol: *const c_char) -> *mut c_void {
    null_mut()
}

/// glibc's `dlsym` (the next definition after ours). No allocation, no locks of ours.
pub(crate) fn real_dlsym() -> DlsymFn {
    let mut p = REAL_DLSYM.load(Acquire);
    if p.is_null() {
        for version in [DLSYM_BASE_VERSION, c"GLIBC_2.34"] {
            // SAFETY: both strings are NUL-terminated literals; dlvsym only reads them.
            p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
            if !p.is_null() {
                break;
            }
        }
        if p.is_null() {
            p = no_dlsym as *mut c_void;
        }
        // Racing threads store the same value.
        REAL_DLSYM.store(p, Release);
    }
    // SAFETY: p is glibc's dlsym or no_dlsym, both with DlsymFn's signature.
    unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p) }
}

/// The driver library a symbol lives in.
#[derive(Clone, Copy)]
pub(crate) enum Lib {
    Cuda,
    Nvml,
}

static CUDA_HANDLE: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
static NVML_HANDLE: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

impl Lib {
    fn soname(self) -> &'static CStr {
        match self {
            Lib::Cuda => c"libcuda.so.1",
            Lib::Nvml => c"libnvidia-ml.so.1",
        }
    }

    fn cache(self) -> &'static AtomicPtr<c_void> {
        match self {
            Lib::Cuda => &CUDA_HANDLE,
            Lib::Nvml => &NVML_HANDLE,
        }
    }

    /// The real library's handle: the copy the program loaded, else loaded now (a program
    /// only reaches our wrappers through a lookup that found the library).
    fn handle(self) -> *mut c_void {
        let cache = self.cache();
        let mut h = cache.load(Acquire);
        if h.is_null() {
            let name = self.soname().as_ptr();
            // SAFETY: name is a NUL-terminated literal; the handle is never closed.
            h = unsafe { libc::dlopen(name, libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
            if h.is_null() {
                // SAFETY: as above.
                h = unsafe { libc::dlopen(name, libc::RTLD_LAZY) };
            }
            if !h.is_null() {
                cache.store(h, Release);
            }
        }
        h
    }
}

fn missing() -> *mut c_void {
    without_provenance_mut(1)
}

/// One real driver entry point, resolved on first use.
pub(crate) struct RealSym {
    lib: Lib,
    name: &'static CStr,
    addr: AtomicPtr<c_void>,
}

impl RealSym {
    pub(crate) const fn new(lib: Lib, name: &'static CStr) -> RealSym {
        RealSym {
            lib,
            name,
            addr: AtomicPtr::new(null_mut()),
        }
    }

    pub(crate) fn name(&self) -> &'static CStr {
        self.name
    }

    /// The real function's address, or null if the driver does not have it.
    pub(crate) fn addr(&self) -> *mut c_void {
        let p = self.addr.load(Acquire);
        if p == missing() {
            return null_mut();
        }
        if !p.is_null() {
            return p;
        }
        let dlsym = real_dlsym();
        let handle = self.lib.handle();
        let mut found = null_mut();
        if !handle.is_null() {
            // SAFETY: handle came from dlopen; name is NUL-terminated.
            found = unsafe { dlsym(handle, self.name.as_ptr()) };
        }
        if found.is_null() {
            // SAFETY: RTLD_NEXT from this library; name is NUL-terminated.
            found = unsafe { dlsym(libc::RTLD_NEXT, self.name.as_ptr()) };
        }
        self.addr
            .store(if found.is_null() { missing() } else { found }, Release);
        found
    }

    /// The real function as `F`.
    ///
    /// # Safety
    /// `F` must be an `unsafe extern "C" fn` type matching the symbol's C signature.
    pub(crate) unsafe fn get<F: Copy>(&self) -> Option<F> {
        const { assert!(size_of::<F>() == size_of::<*mut c_void>()) };
        let p = self.addr();
        if p.is_null() {
            None
        } else {
            // SAFETY: the caller promises F is this symbol's function pointer type; the size
            // check above makes the copy well-formed.
            Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
        }
    }
}
