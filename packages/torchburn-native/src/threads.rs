//! The worker pool every parallel kernel runs on.
//!
//! Kernels here are short (tens of microseconds is common), so what matters is how fast idle workers
//! pick up the next one. A pool whose workers sleep on a futex as soon as they are idle (rayon's) costs
//! a wake-up on each side of every call, tens of microseconds on a virtual machine, which is more than a
//! whole elementwise kernel. So, like OpenMP runtimes do, workers here spin for a while after each job
//! before they park, and the calling thread works on its own job instead of waiting for the pool.
//!
//! When the process already runs PyTorch on GNU OpenMP (its Linux wheels do, and MKL shares that
//! runtime), the Python side hands over `GOMP_parallel` and jobs run on PyTorch's own OpenMP team
//! instead: two pools on the same cores would each spin while the other needs the core, and eager
//! code interleaved with compiled regions (graph breaks, benchmarks) would pay for it both ways.
//!
//! One job runs at a time. A second caller (another Python thread, or a kernel already running inside
//! a job that asks for parallelism again) does not queue: it runs its tasks serially on its own thread.
//! That keeps nesting and concurrent calls deadlock-free with no scheduler.

use std::cell::Cell;
use std::ffi::{c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering::SeqCst};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long an idle worker spins before it parks.
const SPIN: Duration = Duration::from_micros(1000);

/// A job: `n` tasks, claimed one by one from `next`.
struct Job<'a> {
    task: &'a (dyn Fn(usize) + Sync),
    n: usize,
    next: AtomicUsize,
    finished: AtomicUsize,
    panicked: AtomicBool,
}

impl Job<'_> {
    /// Claims and runs tasks until none is left.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, SeqCst);
            if i >= self.n {
                return;
            }
            if catch_unwind(AssertUnwindSafe(|| (self.task)(i))).is_err() {
                self.panicked.store(true, SeqCst);
            }
            self.finished.fetch_add(1, SeqCst);
        }
    }
}

struct Pool {
    workers: usize,
    /// the running job, erased to `'static`: a submitter clears it and waits for `active == 0` before
    /// its job leaves the stack
    job: AtomicPtr<Job<'static>>,
    /// bumped once per job so that spinning workers notice one
    epoch: AtomicUsize,
    /// workers that may be holding a pointer to the current job
    active: AtomicUsize,
    submit: Mutex<()>,
    parked: Mutex<usize>,
    wake: Condvar,
}

static POOL: OnceLock<Pool> = OnceLock::new();
static REQUESTED: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static IN_WORKER: Cell<bool> = const { Cell::new(false) };
    /// Set by [`on_own_pool`]: this thread's jobs skip the shared OpenMP team.
    static OWN_POOL_HERE: Cell<bool> = const { Cell::new(false) };
}

/// The `GOMP_parallel` this thread's jobs go to, or 0 for the module's own pool.
fn gomp_here() -> usize {
    if OWN_POOL_HERE.with(|c| c.get()) {
        0
    } else {
        GOMP_PARALLEL.load(SeqCst)
    }
}

/// Runs `f` with this thread's parallel jobs on the module's own pool even where PyTorch's OpenMP
/// team is shared: for a run of many short jobs with no PyTorch work between them (an LLM decode
/// step: over a hundred jobs of tens of microseconds), where launching the team for each job costs
/// about as much as the job. The pool's workers spin between those jobs and park soon after; PyTorch's
/// team is idle meanwhile, so the two do not fight over the cores.
pub fn on_own_pool<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            OWN_POOL_HERE.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(OWN_POOL_HERE.with(|c| c.replace(true)));
    f()
}

/// `GOMP_parallel(fn, data, num_threads, flags)`, libgomp's entry point for `#pragma omp parallel`.
type GompParallel = unsafe extern "C" fn(extern "C" fn(*mut c_void), *mut c_void, c_uint, c_uint);

/// Address of the process's `GOMP_parallel`, or 0 to use this module's own pool.
static GOMP_PARALLEL: AtomicUsize = AtomicUsize::new(0);

/// Sets the number of threads (the caller plus workers); only takes effect before the first parallel job.
pub fn init(threads: usize) -> usize {
    let _ = REQUESTED.compare_exchange(0, threads.max(1), SeqCst, SeqCst);
    current()
}

/// Runs later jobs on the OpenMP team behind `gomp_parallel` (the address of `GOMP_parallel` in a
/// libgomp already loaded in this process).
///
/// # Safety
/// `gomp_parallel` must be the address of libgomp's `GOMP_parallel`, loaded for the life of the process.
pub unsafe fn share_openmp(gomp_parallel: usize) {
    GOMP_PARALLEL.store(gomp_parallel, SeqCst);
}

/// Which pool runs parallel jobs: "openmp" (shared with PyTorch) or "own".
pub fn pool_kind() -> &'static str {
    if GOMP_PARALLEL.load(SeqCst) != 0 {
        "openmp"
    } else {
        "own"
    }
}

/// Threads a parallel job runs on, the calling thread included.
pub fn current() -> usize {
    if gomp_here() != 0 {
        return requested();
    }
    pool().workers + 1
}

fn requested() -> usize {
    match REQUESTED.load(SeqCst) {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

/// The body every OpenMP thread runs: claim tasks of the job until none is left.
extern "C" fn omp_body(job: *mut c_void) {
    // SAFETY: `parallel_for` passes a live `Job` and GOMP_parallel returns only after every thread
    // has left this function
    let job = unsafe { &*(job as *const Job<'_>) };
    let outer = IN_WORKER.with(|w| w.replace(true));
    job.work();
    IN_WORKER.with(|w| w.set(outer));
}

fn pool() -> &'static Pool {
    POOL.get_or_init(|| {
        let workers = requested() - 1;
        for i in 0..workers {
            std::thread::Builder::new()
                .name(format!("torchburn-{i}"))
                .spawn(worker_loop)
                .expect("spawning a torchburn worker thread");
        }
        Pool {
            workers,
            job: AtomicPtr::new(std::ptr::null_mut()),
            epoch: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            submit: Mutex::new(()),
            parked: Mutex::new(0),
            wake: Condvar::new(),
        }
    })
}

fn worker_loop() {
    IN_WORKER.with(|w| w.set(true));
    let pool = pool();
    let mut seen = pool.epoch.load(SeqCst);
    loop {
        // spin, then park until a new epoch
        let start = Instant::now();
        let mut spins = 0u32;
        while pool.epoch.load(SeqCst) == seen {
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) && start.elapsed() > SPIN {
                let mut parked = pool.parked.lock().unwrap_or_else(|e| e.into_inner());
                *parked += 1;
                while pool.epoch.load(SeqCst) == seen {
                    parked = pool.wake.wait(parked).unwrap_or_else(|e| e.into_inner());
                }
                *parked -= 1;
                break;
            }
        }
        seen = pool.epoch.load(SeqCst);
        pool.active.fetch_add(1, SeqCst);
        let job = pool.job.load(SeqCst);
        if !job.is_null() {
            // SAFETY: the submitter keeps the job alive until `active` drops back to zero
            unsafe { (*job).work() };
        }
        pool.active.fetch_sub(1, SeqCst);
    }
}

/// Runs `task(i)` for every `i < n`, spread over the pool; returns when all have finished.
/// Tasks must be independent. A panic in a task is re-raised here once every task has run.
pub fn parallel_for(n: usize, task: impl Fn(usize) + Sync) {
    if n == 0 {
        return;
    }
    let serial = || (0..n).for_each(&task);
    if n == 1 || IN_WORKER.with(|w| w.get()) {
        return serial();
    }
    let new_job = || Job {
        task: &task,
        n,
        next: AtomicUsize::new(0),
        finished: AtomicUsize::new(0),
        panicked: AtomicBool::new(false),
    };
    let gomp = gomp_here();
    if gomp != 0 {
        let team = requested().min(n);
        if team <= 1 {
            return serial();
        }
        let job = new_job();
        // SAFETY: `share_openmp` promised a libgomp `GOMP_parallel`; it returns after the team's
        // implicit barrier, so `job` outlives every use
        unsafe {
            let parallel: GompParallel = std::mem::transmute(gomp);
            parallel(
                omp_body,
                &job as *const Job<'_> as *mut c_void,
                team as c_uint,
                0,
            );
        }
        if job.panicked.load(SeqCst) {
            panic!("a parallel kernel task panicked");
        }
        return;
    }
    let pool = pool();
    if pool.workers == 0 {
        return serial();
    }
    let Ok(_guard) = pool.submit.try_lock() else {
        // the pool is busy with another caller's job (or this thread's, one level up)
        return serial();
    };
    let job = new_job();
    // SAFETY: erasing the lifetime is sound because the pointer is cleared and every worker that could
    // have read it has left (`active == 0`) before `job` goes out of scope below.
    let erased = &job as *const Job<'_> as *mut Job<'static>;
    pool.job.store(erased, SeqCst);
    pool.epoch.fetch_add(1, SeqCst);
    if *pool.parked.lock().unwrap_or_else(|e| e.into_inner()) > 0 {
        pool.wake.notify_all();
    }
    IN_WORKER.with(|w| w.set(true));
    job.work();
    IN_WORKER.with(|w| w.set(false));
    while job.finished.load(SeqCst) < n {
        std::hint::spin_loop();
    }
    pool.job.store(std::ptr::null_mut(), SeqCst);
    while pool.active.load(SeqCst) > 0 {
        std::hint::spin_loop();
    }
    if job.panicked.load(SeqCst) {
        panic!("a parallel kernel task panicked");
    }
}

/// A raw pointer that may cross to worker threads; users guarantee disjoint access.
pub struct SendPtr<T>(pub *mut T);
impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}
// SAFETY: only used to hand disjoint parts of one buffer to parallel tasks
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// A method, so closures capture the whole (Sync) wrapper rather than the raw pointer field.
    pub fn get(self) -> *mut T {
        self.0
    }
}

/// `f(chunk_index, chunk)` for consecutive chunks of `data` of `chunk` elements (the last may be short),
/// in parallel.
pub fn par_chunks_mut<T: Send>(data: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let chunk = chunk.max(1);
    let len = data.len();
    let base = SendPtr(data.as_mut_ptr());
    parallel_for(len.div_ceil(chunk), |i| {
        let lo = i * chunk;
        let hi = (lo + chunk).min(len);
        // SAFETY: chunks are disjoint ranges inside `data`, which the caller borrows mutably for the call
        let part = unsafe { std::slice::from_raw_parts_mut(base.get().add(lo), hi - lo) };
        f(i, part)
    });
}

/// As [`par_chunks_mut`], but a task takes at least `min_len` consecutive chunks (cheap chunks amortize
/// the claim).
pub fn par_chunks_mut_min<T: Send>(
    data: &mut [T],
    chunk: usize,
    min_len: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    let chunk = chunk.max(1);
    let group = min_len.max(1);
    par_chunks_mut(data, chunk * group, |t, part| {
        for (j, c) in part.chunks_mut(chunk).enumerate() {
            f(t * group + j, c)
        }
    });
}

/// Runs `f(state, item)` for every item, in parallel; each participating thread makes one `state` with
/// `init` (scratch buffers) and claims items until none is left.
pub fn par_each_init<I: Send, S>(
    items: Vec<I>,
    init: impl Fn() -> S + Sync,
    f: impl Fn(&mut S, I) + Sync,
) {
    let n = items.len();
    let slots: Vec<std::cell::UnsafeCell<Option<I>>> = items
        .into_iter()
        .map(|i| std::cell::UnsafeCell::new(Some(i)))
        .collect();
    let slots = SyncSlots(&slots);
    let next = AtomicUsize::new(0);
    parallel_for(current().min(n), |_| {
        let mut state = init();
        loop {
            let i = next.fetch_add(1, SeqCst);
            if i >= n {
                return;
            }
            // SAFETY: the counter hands each index to exactly one thread
            let item = unsafe { slots.take(i) };
            if let Some(item) = item {
                f(&mut state, item)
            }
        }
    });
}

/// Runs `f(item)` for every item, in parallel.
pub fn par_each<I: Send>(items: Vec<I>, f: impl Fn(I) + Sync) {
    par_each_init(items, || (), |_, item| f(item));
}

struct SyncSlots<'a, I>(&'a [std::cell::UnsafeCell<Option<I>>]);
// SAFETY: each slot is taken by exactly one thread (see `par_each_init`)
unsafe impl<I: Send> Sync for SyncSlots<'_, I> {}

impl<I> SyncSlots<'_, I> {
    /// # Safety
    /// No two threads may take the same index.
    unsafe fn take(&self, i: usize) -> Option<I> {
        (*self.0[i].get()).take()
    }
}

/// Splits `0..n` into about `tasks` contiguous ranges of at least `min_len` and runs `f(lo, hi)` on each.
pub fn par_ranges(n: usize, min_len: usize, f: impl Fn(usize, usize) + Sync) {
    if n == 0 {
        return;
    }
    let want = current() * 4;
    let per = n.div_ceil(want).max(min_len.max(1));
    let count = n.div_ceil(per);
    parallel_for(count, |t| f(t * per, ((t + 1) * per).min(n)));
}

/// [`par_ranges`] over `0..n` in whole steps of `step` (the last range may end short at `n`), so
/// that no range splits a group of `step` items that a kernel computes together.
pub fn par_steps(n: usize, step: usize, f: impl Fn(usize, usize) + Sync) {
    let step = step.max(1);
    par_ranges(n.div_ceil(step), 1, |lo, hi| {
        f(lo * step, (hi * step).min(n))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once() {
        let hits: Vec<AtomicUsize> = (0..1000).map(|_| AtomicUsize::new(0)).collect();
        for _ in 0..50 {
            parallel_for(hits.len(), |i| {
                hits[i].fetch_add(1, SeqCst);
            });
        }
        assert!(hits.iter().all(|h| h.load(SeqCst) == 50));
    }

    #[test]
    fn nested_and_concurrent_jobs_complete() {
        let total = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    parallel_for(8, |_| parallel_for(8, |_| _ = total.fetch_add(1, SeqCst)));
                });
            }
        });
        assert_eq!(total.load(SeqCst), 4 * 64);
    }

    #[test]
    fn each_item_is_consumed_once() {
        let sum = AtomicUsize::new(0);
        par_each_init(
            (1..=100).collect(),
            || 0usize,
            |_, i: usize| _ = sum.fetch_add(i, SeqCst),
        );
        assert_eq!(sum.load(SeqCst), 5050);
        let mut v = vec![0u8; 77];
        par_chunks_mut_min(&mut v, 3, 4, |c, part| part.fill((c % 7) as u8 + 1));
        assert!(v
            .iter()
            .enumerate()
            .all(|(i, &x)| x == ((i / 3) % 7) as u8 + 1));
    }

    #[test]
    fn chunks_cover_the_slice() {
        let mut v = vec![0usize; 1003];
        par_chunks_mut(&mut v, 100, |c, part| {
            part.iter_mut().for_each(|x| *x = c + 1)
        });
        for (i, x) in v.iter().enumerate() {
            assert_eq!(*x, i / 100 + 1);
        }
    }

    #[test]
    fn a_panicking_task_is_reported_not_hung_on() {
        let r = std::panic::catch_unwind(|| parallel_for(16, |i| assert!(i != 7, "task 7")));
        assert!(r.is_err());
        // the pool still works afterwards
        let n = AtomicUsize::new(0);
        parallel_for(16, |_| _ = n.fetch_add(1, SeqCst));
        assert_eq!(n.load(SeqCst), 16);
    }
}
