//! The limiter's state: the container's limits (read once), the shared accounting region
//! (mapped once), this process's slot in it, and this process's table of what it allocated.
//!
//! Nothing here blocks on another process: a slot is claimed by one compare-and-swap, counted
//! with atomic adds, and a dead process's slot is freed by whoever notices (owner word back to
//! 0). Loading never blocks on another thread either (racing loaders each build a state and
//! the first to publish wins), so a `fork` at any instant cannot leave a child waiting on a
//! parent's thread. The only lock is process-local (the allocation table) and `pthread_atfork`
//! handlers keep it consistent across `fork`: the child starts with an empty table and no slot.
//! A child made without those handlers (glibc's `_Fork`, a raw `clone`) keeps naming its
//! parent's slot: what it allocates is counted there (over-counting the parent until it exits),
//! and its exit leaves the slot alone.

use std::collections::BTreeMap;
use std::ptr::null_mut;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize};

use gpushare_core::limiter::{
    LimitsFile, MAX_GPUS, OwnerWord, REGION_SIZE, REGION_SLOTS, REGION_SLOTS_OFFSET, RegionHeader,
    RegionSlot,
};
use gpushare_core::procstat;
use gpushare_core::spin::SpinLock;

/// The container's limits and the mapped region, valid for the life of the process.
pub(crate) struct Limiter {
    limits: LimitsFile,
    /// Base of the `REGION_SIZE`-byte shared mapping (never unmapped once published).
    region: *const u8,
}

// SAFETY: the region pointer refers to a MAP_SHARED mapping that lives as long as the process
// and is only accessed through atomics.
unsafe impl Sync for Limiter {}
// SAFETY: as above.
unsafe impl Send for Limiter {}

type Loaded = Result<Limiter, String>;

static LOADED: AtomicPtr<Loaded> = AtomicPtr::new(null_mut());
static CONFIG_REPORTED: AtomicBool = AtomicBool::new(false);

/// The limiter, loading it on first use; on failure, says why on stderr once.
pub(crate) fn limiter() -> Option<&'static Limiter> {
    let mut p = LOADED.load(Acquire);
    if p.is_null() {
        let fresh = Box::into_raw(Box::new(load()));
        match LOADED.compare_exchange(null_mut(), fresh, AcqRel, Acquire) {
            Ok(_) => p = fresh,
            Err(winner) => {
                // SAFETY: fresh came from Box::into_raw above and was never published.
                let lost = unsafe { Box::from_raw(fresh) };
                if let Ok(l) = *lost {
                    l.unmap();
                }
                p = winner;
            }
        }
    }
    // SAFETY: p was published once and is never freed.
    match unsafe { &*p } {
        Ok(l) => Some(l),
        Err(msg) => {
            report_once(&CONFIG_REPORTED, msg);
            None
        }
    }
}

/// The limiter if it loaded, without loading it or reporting (free paths).
pub(crate) fn loaded_limiter() -> Option<&'static Limiter> {
    let p = LOADED.load(Acquire);
    if p.is_null() {
        return None;
    }
    // SAFETY: p was published once and is never freed.
    unsafe { &*p }.as_ref().ok()
}

/// Writes `gpushare limiter: MSG` to stderr the first time `flag` is raised.
pub(crate) fn report_once(flag: &AtomicBool, msg: &str) {
    if flag.swap(true, Relaxed) {
        return;
    }
    let line = format!("gpushare limiter: {msg}\n");
    // SAFETY: writes the bytes of a live String to fd 2; a short or failed write is ignored.
    unsafe {
        libc::write(2, line.as_ptr().cast(), line.len());
    }
}

struct Paths {
    limits: std::path::PathBuf,
    region: std::path::PathBuf,
}

#[cfg(not(feature = "test-paths"))]
fn paths() -> Paths {
    use gpushare_core::limiter::{LIMITS_PATH, REGION_PATH};
    Paths {
        limits: LIMITS_PATH.into(),
        region: REGION_PATH.into(),
    }
}

/// Test builds only (never shipped): paths from `GPUSHARE_LIMITER_TEST_{LIMITS,REGION}`.
#[cfg(feature = "test-paths")]
fn paths() -> Paths {
    use gpushare_core::limiter::{LIMITS_PATH, REGION_PATH};
    let var = |name: &str, default: &str| {
        std::env::var_os(name)
            .map(Into::into)
            .unwrap_or_else(|| default.into())
    };
    Paths {
        limits: var("GPUSHARE_LIMITER_TEST_LIMITS", LIMITS_PATH),
        region: var("GPUSHARE_LIMITER_TEST_REGION", REGION_PATH),
    }
}

fn load() -> Loaded {
    register_fork_handlers();
    let paths = paths();
    let text = read_small(&paths.limits)
        .map_err(|e| format!("cannot read limits {}: {e}", paths.limits.display()))?;
    let limits = LimitsFile::parse(&text).map_err(|e| {
        format!(
            "limits {} refused, GPU memory calls fail: {e}",
            paths.limits.display()
        )
    })?;
    let region = map_region(&paths.region)
        .map_err(|e| format!("region {} unusable: {e}", paths.region.display()))?;
    let limiter = Limiter { limits, region };
    if let Err(e) = limiter.header().check(REGION_SIZE) {
        limiter.unmap();
        return Err(format!("region {} unusable: {e}", paths.region.display()));
    }
    limiter.free_slots_of_an_earlier_image();
    Ok(limiter)
}

fn read_small(path: &std::path::Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(1 << 20)
        .read_to_string(&mut text)?;
    Ok(text)
}

fn map_region(path: &std::path::Path) -> Result<*const u8, String> {
    use std::os::fd::AsRawFd;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| e.to_string())?;
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    if len < REGION_SIZE as u64 {
        return Err(format!("{len} bytes, expected at least {REGION_SIZE}"));
    }
    // SAFETY: maps REGION_SIZE bytes of a file at least that long; the mapping outlives the fd.
    let p = unsafe {
        libc::mmap(
            null_mut(),
            REGION_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(format!("mmap: {}", std::io::Error::last_os_error()));
    }
    Ok(p as *const u8)
}

/// This process's slot index (`NO_SLOT` until claimed) and owner word.
const NO_SLOT: usize = usize::MAX;
static MY_SLOT: AtomicUsize = AtomicUsize::new(NO_SLOT);
static MY_OWNER: AtomicU64 = AtomicU64::new(OwnerWord::FREE);
static SLOTS_REPORTED: AtomicBool = AtomicBool::new(false);

impl Limiter {
    fn unmap(&self) {
        // SAFETY: region is a REGION_SIZE mapping from map_region that nothing else references
        // (called only on a state that was never published).
        unsafe {
            libc::munmap(self.region as *mut libc::c_void, REGION_SIZE);
        }
    }

    fn header(&self) -> &RegionHeader {
        // SAFETY: the mapping is REGION_SIZE bytes, page-aligned, and starts with the header.
        unsafe { &*(self.region as *const RegionHeader) }
    }

    fn slots(&self) -> &[RegionSlot] {
        // SAFETY: the header was checked: REGION_SLOTS slots of the build's layout follow at
        // REGION_SLOTS_OFFSET (64-aligned) within the mapping; all fields are atomics.
        unsafe {
            std::slice::from_raw_parts(
                self.region.add(REGION_SLOTS_OFFSET) as *const RegionSlot,
                REGION_SLOTS,
            )
        }
    }

    pub(crate) fn limits(&self) -> &LimitsFile {
        &self.limits
    }

    /// The quota of the GPU at `pos` in the limits file.
    pub(crate) fn limit(&self, pos: usize) -> u64 {
        self.limits.gpus[pos].memory_limit_bytes
    }

    /// Bytes the container's live (or not yet reclaimed) processes hold on GPU `pos`.
    fn sum_used(&self, pos: usize) -> u64 {
        let mut sum = 0u64;
        for slot in self.slots() {
            let owner = OwnerWord(slot.owner.load(SeqCst));
            if owner.0 == OwnerWord::FREE || owner.is_claiming() {
                continue;
            }
            sum = sum.saturating_add(slot.used[pos].load(SeqCst));
        }
        sum
    }

    /// The container's usage of GPU `pos` after freeing dead processes' slots (views).
    pub(crate) fn used(&self, pos: usize) -> u64 {
        self.reclaim_dead();
        self.sum_used(pos)
    }

    /// Counts `bytes` on GPU `pos` for this process if the container stays within its quota.
    pub(crate) fn reserve(&self, pos: usize, bytes: u64) -> bool {
        let limit = self.limit(pos);
        if bytes > limit {
            return false;
        }
        let Some(slot) = self.my_slot() else {
            return false;
        };
        let counter = &slot.used[pos];
        counter.fetch_add(bytes, SeqCst);
        // Add first, then check: two racing processes may both be refused, never both admitted.
        if self.sum_used(pos) <= limit {
            return true;
        }
        if self.reclaim_dead() > 0 && self.sum_used(pos) <= limit {
            return true;
        }
        sub_saturating(counter, bytes);
        false
    }

    /// Counts `bytes` on GPU `pos` for this process whatever the quota (memory the driver
    /// already holds for it).
    pub(crate) fn charge(&self, pos: usize, bytes: u64) {
        if let Some(slot) = self.my_slot() {
            slot.used[pos].fetch_add(bytes, SeqCst);
        }
    }

    /// Gives back `bytes` this process counted on GPU `pos`.
    pub(crate) fn release(&self, pos: usize, bytes: u64) {
        let idx = MY_SLOT.load(Acquire);
        if idx < REGION_SLOTS {
            sub_saturating(&self.slots()[idx].used[pos], bytes);
        }
    }

    fn my_slot(&self) -> Option<&RegionSlot> {
        let idx = MY_SLOT.load(Acquire);
        if idx < REGION_SLOTS {
            return Some(&self.slots()[idx]);
        }
        // Claim under the table lock so two threads of one process claim one slot.
        TABLE.with(|_| {
            let idx = MY_SLOT.load(Acquire);
            if idx < REGION_SLOTS {
                return Some(&self.slots()[idx]);
            }
            let me = own_owner_word()?;
            for attempt in 0..2 {
                if attempt == 1 && self.reclaim_dead() == 0 {
                    break;
                }
                for (i, slot) in self.slots().iter().enumerate() {
                    if slot
                        .owner
                        .compare_exchange(OwnerWord::FREE, me.claiming().0, SeqCst, SeqCst)
                        .is_ok()
                    {
                        for used in &slot.used {
                            used.store(0, SeqCst);
                        }
                        slot.owner.store(me.0, SeqCst);
                        MY_OWNER.store(me.0, Release);
                        MY_SLOT.store(i, Release);
                        register_exit_handler();
                        return Some(slot);
                    }
                }
            }
            report_once(
                &SLOTS_REPORTED,
                &format!("all {REGION_SLOTS} accounting slots are held by live processes; GPU allocations refused"),
            );
            None
        })
    }

    /// At load (once per image, before any thread of it claims a slot): a slot this process
    /// already owns was claimed by the image it had before an `exec` (same PID and start
    /// time, so it never looks dead). That image's GPU memory went with its address space
    /// and descriptors: its counts are stale, and the slot is freed.
    fn free_slots_of_an_earlier_image(&self) {
        let Some(me) = own_owner_word() else {
            return;
        };
        for slot in self.slots() {
            let owner = slot.owner.load(SeqCst);
            if owner != OwnerWord::FREE && OwnerWord(owner).settled().0 == me.0 {
                let _ = slot
                    .owner
                    .compare_exchange(owner, OwnerWord::FREE, SeqCst, SeqCst);
            }
        }
    }

    /// Frees the slots of processes that are gone; returns how many.
    fn reclaim_dead(&self) -> usize {
        let me = MY_OWNER.load(Acquire);
        let mut freed = 0;
        for slot in self.slots() {
            let owner = slot.owner.load(SeqCst);
            if owner == OwnerWord::FREE || OwnerWord(owner).settled().0 == me {
                continue;
            }
            if is_dead(OwnerWord(owner))
                && slot
                    .owner
                    .compare_exchange(owner, OwnerWord::FREE, SeqCst, SeqCst)
                    .is_ok()
            {
                freed += 1;
            }
        }
        freed
    }

    /// This process's exit: its counts go with it. Only the process that claimed the slot
    /// frees it: a child forked without the atfork handlers (glibc's `_Fork`, a raw `clone`)
    /// still names its parent's slot and must leave it alone.
    fn release_slot(&self) {
        let me = MY_OWNER.load(Acquire);
        // SAFETY: getpid has no preconditions.
        if OwnerWord(me).pid() != unsafe { libc::getpid() } as u32 {
            return;
        }
        let idx = MY_SLOT.swap(NO_SLOT, AcqRel);
        if idx >= REGION_SLOTS {
            return;
        }
        let slot = &self.slots()[idx];
        for used in &slot.used {
            used.store(0, SeqCst);
        }
        let _ = slot
            .owner
            .compare_exchange(me, OwnerWord::FREE, SeqCst, SeqCst);
    }
}

fn sub_saturating(counter: &AtomicU64, bytes: u64) {
    let _ = counter.fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(bytes)));
}

fn own_owner_word() -> Option<OwnerWord> {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    Some(OwnerWord::new(pid, procstat::start_time(&stat)?))
}

/// Whether the process that owns a slot is gone: no such pid, a zombie, or the pid now
/// belongs to a process that started at another time.
fn is_dead(owner: OwnerWord) -> bool {
    let pid = owner.pid();
    if pid == 0 || pid > i32::MAX as u32 {
        return true;
    }
    // SAFETY: signal 0 only checks for existence and permission.
    if unsafe { libc::kill(pid as libc::pid_t, 0) } == -1
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    {
        return true;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            procstat::state(&stat) == Some('Z')
                || procstat::start_time(&stat).is_some_and(|t| !owner.same_start(t))
        }
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// What a process allocated, keyed by kind and driver handle.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub(crate) enum Kind {
    DevicePtr,
    VmmHandle,
    Array,
    MipmappedArray,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Counted {
    pub(crate) pos: usize,
    pub(crate) bytes: u64,
    /// The context that owns the allocation (the driver frees it with the context: destroyed,
    /// its primary context reset or released for good); 0: none (stream-ordered and VMM
    /// allocations, or the context was unknown), freed only by its own free or the exit.
    pub(crate) ctx: u64,
    /// A VMM handle's holders: its references (`cuMemCreate`'s, each
    /// `cuMemRetainAllocationHandle`) and its mappings (`cuMemMap`). The driver frees its
    /// memory when the last goes, not at a `cuMemRelease` while it is mapped. 1 for the others.
    pub(crate) holders: u32,
    /// The stream-ordered pool it came from (0: none, or not booked).
    pub(crate) pool: u64,
}

impl Counted {
    pub(crate) fn new(pos: usize, bytes: u64, ctx: u64) -> Counted {
        Counted {
            pos,
            bytes,
            ctx,
            holders: 1,
            pool: 0,
        }
    }
}

/// A stream-ordered memory pool the process allocated from. The driver keeps the memory its
/// allocations give back (up to the pool's release threshold, until a synchronization or a
/// trim), so the pool is counted at what it holds: its live allocations (`live`, each also in
/// `counted`) and what it keeps beyond them (`kept`), as last seen through the driver's
/// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` and raised by each free in between.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PoolBook {
    pub(crate) pos: usize,
    pub(crate) live: u64,
    pub(crate) kept: u64,
    /// Bumped at each allocation and free from the pool: a reading of the driver's reserve
    /// taken before one of them is not applied (it may miss what that changed).
    pub(crate) generation: u64,
    /// A device's graph allocator only: what free nodes gave back that the allocator may not
    /// hold yet (it takes that memory when their graph is launched). `kept` is never read
    /// below it; it ends at a launch after which the allocator holds at least as much beyond
    /// the live nodes (which graph the free nodes were in is not known).
    pub(crate) pending: u64,
}

/// What the process holds: its allocations by kind and driver handle, and its VMM mappings by
/// address (size, handle).
pub(crate) struct Books {
    pub(crate) counted: BTreeMap<(Kind, u64), Counted>,
    pub(crate) mappings: BTreeMap<u64, (u64, u64)>,
    pub(crate) pools: BTreeMap<u64, PoolBook>,
}

/// The process's books behind a spin lock that `fork` handlers hold across fork.
pub(crate) struct Table(SpinLock<Books>);

pub(crate) static TABLE: Table = Table(SpinLock::new(Books {
    counted: BTreeMap::new(),
    mappings: BTreeMap::new(),
    pools: BTreeMap::new(),
}));

impl Table {
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut Books) -> R) -> R {
        self.0.with(|m| {
            #[cfg(feature = "test-paths")]
            test_hooks::hold_table();
            f(m)
        })
    }
}

/// Test build only (never shipped): lets a test fork while another thread holds the
/// allocation table's lock — a window too short to hit by chance.
#[cfg(feature = "test-paths")]
mod test_hooks {
    use std::sync::atomic::AtomicU64;
    use std::sync::atomic::Ordering::SeqCst;

    static STALL_US: AtomicU64 = AtomicU64::new(0);
    static HOLDERS: AtomicU64 = AtomicU64::new(0);

    /// Called with the lock held: stays there for the stall a test asked for.
    pub(super) fn hold_table() {
        let us = STALL_US.load(SeqCst);
        if us > 0 {
            HOLDERS.fetch_add(1, SeqCst);
            std::thread::sleep(std::time::Duration::from_micros(us));
            HOLDERS.fetch_sub(1, SeqCst);
        }
    }

    /// Every hold of the table's lock lasts `us` microseconds from now on (0: no stall).
    #[unsafe(no_mangle)]
    pub extern "C" fn gpushareLimiterTestStallTableUs(us: u64) {
        STALL_US.store(us, SeqCst);
    }

    /// Whether a thread is stalled holding the table's lock now.
    #[unsafe(no_mangle)]
    pub extern "C" fn gpushareLimiterTestTableHeld() -> u64 {
        HOLDERS.load(SeqCst)
    }
}

/// Records an allocation; a stale entry under the same handle (the driver reused an address
/// whose free we did not see) is given back first.
pub(crate) fn record(lim: &Limiter, kind: Kind, key: u64, counted: Counted) {
    if let Some(old) = TABLE.with(|b| b.counted.insert((kind, key), counted)) {
        lim.release(old.pos, old.bytes);
    }
}

/// Forgets an allocation, returning what it counted (None for a pointer we never counted).
pub(crate) fn forget(kind: Kind, key: u64) -> Option<Counted> {
    TABLE.with(|b| b.counted.remove(&(kind, key)))
}

/// A VMM handle we count gains a holder: a retained reference, or (`mapping`: address, size)
/// a mapping. A mapping recorded at the same address before (its unmap unseen) lets go of its
/// handle first.
pub(crate) fn vmm_hold(lim: &Limiter, handle: u64, mapping: Option<(u64, u64)>) {
    let freed = TABLE.with(|b| {
        let c = b.counted.get_mut(&(Kind::VmmHandle, handle))?;
        c.holders = c.holders.saturating_add(1);
        let (va, size) = mapping?;
        let (_, old) = b.mappings.insert(va, (size, handle))?;
        let_go(b, old)
    });
    if let Some(c) = freed {
        lim.release(c.pos, c.bytes);
    }
}

/// One holder of `handle` fewer; its count when that was the last (removed from the books).
fn let_go(b: &mut Books, handle: u64) -> Option<Counted> {
    let key = (Kind::VmmHandle, handle);
    let c = b.counted.get_mut(&key)?;
    c.holders = c.holders.saturating_sub(1);
    if c.holders == 0 {
        b.counted.remove(&key)
    } else {
        None
    }
}

/// What a `cuMemRelease` took from the books before the driver's answer.
pub(crate) enum Released {
    /// Not a handle we count.
    Unknown,
    /// Its last holder: the count, to give back if the driver releases it.
    Last(Counted),
    /// It stays held (mapped, or retained again).
    Held,
}

/// Takes one holder of `handle` before its release is passed on (so no other thread can see
/// the handle reused while it is still in the books).
pub(crate) fn vmm_release(handle: u64) -> Released {
    TABLE.with(|b| {
        if !b.counted.contains_key(&(Kind::VmmHandle, handle)) {
            return Released::Unknown;
        }
        match let_go(b, handle) {
            Some(c) => Released::Last(c),
            None => Released::Held,
        }
    })
}

/// The release failed: the holder [`vmm_release`] took is put back.
pub(crate) fn vmm_release_failed(lim: &Limiter, handle: u64, taken: Released) {
    match taken {
        Released::Unknown => {}
        Released::Last(c) => record(lim, Kind::VmmHandle, handle, c),
        Released::Held => {
            TABLE.with(|b| {
                if let Some(c) = b.counted.get_mut(&(Kind::VmmHandle, handle)) {
                    c.holders = c.holders.saturating_add(1);
                }
            });
        }
    }
}

/// Takes the mappings recorded in `[va, va + size)` out of the books before their unmap is
/// passed on (their handles keep their holders until [`vmm_unmapped`]).
pub(crate) fn vmm_take_mappings(va: u64, size: u64) -> Vec<(u64, u64, u64)> {
    TABLE.with(|b| {
        let vas: Vec<u64> = b
            .mappings
            .range(va..va.saturating_add(size.max(1)))
            .map(|(&v, _)| v)
            .collect();
        vas.into_iter()
            .filter_map(|v| b.mappings.remove(&v).map(|(s, h)| (v, s, h)))
            .collect()
    })
}

/// The unmap succeeded: each taken mapping's handle loses that holder (given back when it was
/// the last); failed: the mappings go back into the books.
pub(crate) fn vmm_unmapped(lim: &Limiter, taken: Vec<(u64, u64, u64)>, ok: bool) {
    let freed: Vec<Counted> = TABLE.with(|b| {
        if ok {
            taken.iter().filter_map(|&(_, _, h)| let_go(b, h)).collect()
        } else {
            for (v, s, h) in taken {
                b.mappings.insert(v, (s, h));
            }
            Vec::new()
        }
    });
    for c in freed {
        lim.release(c.pos, c.bytes);
    }
}

/// Up to `bytes` of what `pool` keeps on GPU `pos`, taken for an allocation from it (already
/// counted, so not reserved again): how much.
pub(crate) fn pool_take_kept(pool: u64, pos: usize, bytes: u64) -> u64 {
    if pool == 0 {
        return 0;
    }
    TABLE.with(|b| {
        let Some(p) = b.pools.get_mut(&pool).filter(|p| p.pos == pos) else {
            return 0;
        };
        let took = p.kept.min(bytes);
        p.kept -= took;
        p.pending = p.pending.saturating_sub(took);
        p.generation += 1;
        took
    })
}

/// The allocation [`pool_take_kept`] took for failed: what it took is kept again.
pub(crate) fn pool_untake_kept(pool: u64, took: u64) {
    if took > 0 {
        TABLE.with(|b| {
            if let Some(p) = b.pools.get_mut(&pool) {
                p.kept += took;
                p.generation += 1;
            }
        });
    }
}

/// Records a stream-ordered allocation from `pool` (0: not booked by pool).
pub(crate) fn record_pooled(lim: &Limiter, key: u64, counted: Counted) {
    if counted.pool != 0 {
        TABLE.with(|b| {
            let p = book(b, counted.pool, counted.pos);
            if p.pos == counted.pos {
                p.live += counted.bytes;
                p.generation += 1;
            }
        });
    }
    record(lim, Kind::DevicePtr, key, counted);
}

/// Books `pool` on GPU `pos` if it is not booked (what the driver says it holds is then
/// counted at the next reading).
pub(crate) fn pool_book(pool: u64, pos: usize) {
    TABLE.with(|b| {
        book(b, pool, pos);
    });
}

/// `pool`'s book, made for GPU `pos` if there is none.
fn book(b: &mut Books, pool: u64, pos: usize) -> &mut PoolBook {
    b.pools.entry(pool).or_insert(PoolBook {
        pos,
        ..PoolBook::default()
    })
}

/// A pool allocation was freed: its memory goes back to its pool, which keeps it (still
/// counted) until the driver says it let it go; `pending` (a graph's free node): also until a
/// launch after which the graph allocator holds as much ([`PoolBook::pending`]). Given back at
/// once if the pool is not booked.
pub(crate) fn pool_freed(lim: &Limiter, c: Counted, pending: bool) {
    let booked = TABLE.with(|b| {
        let Some(p) = b.pools.get_mut(&c.pool).filter(|p| p.pos == c.pos) else {
            return false;
        };
        p.live = p.live.saturating_sub(c.bytes);
        p.kept += c.bytes;
        if pending {
            p.pending += c.bytes;
        }
        p.generation += 1;
        true
    });
    if !booked {
        lim.release(c.pos, c.bytes);
    }
}

/// The pools in the books with their generations, to read the driver's reserve of each.
pub(crate) fn pools() -> Vec<(u64, u64)> {
    TABLE.with(|b| b.pools.iter().map(|(&h, p)| (h, p.generation)).collect())
}

/// `pool`'s generation, if it is booked.
pub(crate) fn pool_generation(pool: u64) -> Option<u64> {
    TABLE.with(|b| b.pools.get(&pool).map(|p| p.generation))
}

/// The driver holds `reserved` bytes in `pool` (read at `generation`, after a graph's launch
/// if `launched`): what it keeps beyond its live allocations is counted at that, or at what is
/// pending (see [`PoolBook::pending`]). Returns the bytes given back.
pub(crate) fn pool_reserved(
    lim: &Limiter,
    pool: u64,
    generation: u64,
    reserved: u64,
    launched: bool,
) -> u64 {
    let change = TABLE.with(|b| {
        let p = b
            .pools
            .get_mut(&pool)
            .filter(|p| p.generation == generation)?;
        let held = reserved.saturating_sub(p.live);
        if launched && held >= p.pending {
            p.pending = 0;
        }
        let kept = held.max(p.pending);
        let old = std::mem::replace(&mut p.kept, kept);
        Some((p.pos, old, kept))
    });
    match change {
        Some((pos, old, kept)) if old > kept => {
            lim.release(pos, old - kept);
            old - kept
        }
        Some((pos, old, kept)) if kept > old => {
            // Memory the driver already holds: counted even past the quota, so that further
            // allocations are refused.
            lim.charge(pos, kept - old);
            0
        }
        _ => 0,
    }
}

/// `pool` was destroyed: what it kept is given back; its live allocations stay counted until
/// freed (the driver releases the pool when the last is).
pub(crate) fn pool_destroyed(lim: &Limiter, pool: u64) {
    if let Some(p) = TABLE.with(|b| b.pools.remove(&pool)) {
        lim.release(p.pos, p.kept);
    }
}

/// Gives back every allocation context `ctx` owned (the driver freed them with it).
pub(crate) fn forget_context(lim: &Limiter, ctx: u64) {
    if ctx == 0 {
        return;
    }
    let mut gone = Vec::new();
    TABLE.with(|b| {
        b.counted.retain(|_, c| {
            if c.ctx == ctx {
                gone.push(*c);
            }
            c.ctx != ctx
        })
    });
    for c in gone {
        lim.release(c.pos, c.bytes);
    }
}

static FORK_HANDLERS: AtomicBool = AtomicBool::new(false);

fn register_fork_handlers() {
    if FORK_HANDLERS.swap(true, AcqRel) {
        return;
    }
    extern "C" fn prepare() {
        TABLE.0.lock();
    }
    extern "C" fn parent() {
        TABLE.0.unlock();
    }
    extern "C" fn child() {
        // The child has none of the parent's GPU memory and no slot of its own yet.
        // SAFETY: the lock is held (prepare) and the child is single-threaded.
        let books = unsafe { TABLE.0.locked_value() };
        books.counted.clear();
        books.mappings.clear();
        books.pools.clear();
        MY_SLOT.store(NO_SLOT, Release);
        MY_OWNER.store(OwnerWord::FREE, Release);
        TABLE.0.unlock();
    }
    // SAFETY: registers three functions that live as long as the process (never unloaded).
    unsafe {
        libc::pthread_atfork(Some(prepare), Some(parent), Some(child));
    }
}

static EXIT_HANDLER: AtomicBool = AtomicBool::new(false);

fn register_exit_handler() {
    if EXIT_HANDLER.swap(true, AcqRel) {
        return;
    }
    extern "C" fn at_exit() {
        if let Some(l) = loaded_limiter() {
            l.release_slot();
        }
    }
    // SAFETY: registers a function that lives as long as the process.
    unsafe {
        libc::atexit(at_exit);
    }
}

/// Reports that a device is not in the limits file (once).
pub(crate) static UNKNOWN_DEVICE_REPORTED: AtomicBool = AtomicBool::new(false);

/// Bounds a GPU position from the limits file (a region slot has `MAX_GPUS` counters).
pub(crate) fn valid_pos(lim: &Limiter, pos: usize) -> bool {
    pos < lim.limits().gpus.len() && pos < MAX_GPUS
}
