//! A spin lock that `fork` handlers can hold across `fork`: the in-container limiter's
//! allocation table (and the fake driver's, in tests) sits behind one, so a child forked while
//! another thread allocates finds it unlocked (a `Mutex` would stay locked in the child).

use std::cell::UnsafeCell;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

/// `T` behind a spin lock whose lock and unlock are separate calls, for `pthread_atfork`'s
/// prepare / parent / child handlers.
pub struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: `value` is only touched while `locked` is held.
unsafe impl<T: Send> Sync for SpinLock<T> {}

impl<T> SpinLock<T> {
    pub const fn new(value: T) -> SpinLock<T> {
        SpinLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Waits for the lock (yielding) and takes it; pair with [`SpinLock::unlock`].
    pub fn lock(&self) {
        while self
            .locked
            .compare_exchange_weak(false, true, Acquire, Relaxed)
            .is_err()
        {
            std::thread::yield_now();
        }
    }

    /// Releases the lock taken by [`SpinLock::lock`].
    pub fn unlock(&self) {
        self.locked.store(false, Release);
    }

    /// Runs `f` on the value with the lock held.
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        self.lock();
        // SAFETY: the lock is held, so this is the only reference to the value.
        let r = f(unsafe { &mut *self.value.get() });
        self.unlock();
        r
    }

    /// The value, while the caller holds the lock (a `fork` child handler after prepare took it).
    ///
    /// # Safety
    /// The caller holds the lock and no other reference to the value is live.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn locked_value(&self) -> &mut T {
        // SAFETY: the caller's promise.
        unsafe { &mut *self.value.get() }
    }
}

#[cfg(test)]
mod tests {
    use super::SpinLock;
    use std::sync::Arc;

    #[test]
    fn with_is_exclusive_across_threads() {
        let lock = Arc::new(SpinLock::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let lock = lock.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        lock.with(|n| *n += 1);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(lock.with(|n| *n), 40_000);
    }

    #[test]
    fn lock_and_unlock_bracket_a_locked_value() {
        let lock = SpinLock::new(vec![1, 2]);
        lock.lock();
        // SAFETY: the lock is held and no other reference is live.
        unsafe { lock.locked_value() }.clear();
        lock.unlock();
        assert!(lock.with(|v| v.is_empty()));
    }
}
