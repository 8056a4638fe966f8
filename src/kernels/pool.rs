//! The kernels' thread pool: the calling thread plus `num_threads() - 1` workers that run the
//! parallel loops of the threaded wrappers (matrix products, `quantize_rows`, attention).
//!
//! A forward step makes hundreds of short parallel calls (a decode step of the default model
//! about 150, each some microseconds to some tens of microseconds). A general pool's fork/join
//! costs a hand-off each (a futex wake, a steal); here the workers spin for a short while
//! ([`SPIN`]) after each job, so the next one reaches them through one cache line, and only
//! then sleep on a condition variable (an idle server burns no CPU). On a machine with more
//! runnable threads than cores they notice (a yield that gives the core away) and sleep at once
//! instead (see [`wait_for_epoch`]). The caller takes part.
//! Tasks are split into one contiguous range per thread (a matrix product's threads each
//! stream their own run of rows, which the prefetchers follow); a thread that is done takes
//! tasks from the back of the others' ranges, so one that the operating system delays simply
//! runs fewer of them. A task's work never depends on which thread runs it, so results do not
//! depend on the thread count.
//!
//! One job runs at a time. A caller that finds the pool busy (another thread's job, or a task
//! that itself calls a threaded kernel) runs its tasks in place, one after another, with the
//! same results. A panic in a task is caught, the job's other tasks still run (no thread keeps
//! borrowing the caller's data), and the first panic resumes on the calling thread.

use std::any::Any;
use std::cell::{Cell, UnsafeCell};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock, TryLockError};
use std::time::{Duration, Instant};

/// How long an idle worker spins for the next job before it sleeps, unless
/// `EDGE_LLM_SPIN_US` says otherwise.
const SPIN: Duration = Duration::from_micros(100);

fn spin_window() -> Duration {
    static WINDOW: OnceLock<Duration> = OnceLock::new();
    *WINDOW.get_or_init(|| {
        std::env::var("EDGE_LLM_SPIN_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(SPIN, Duration::from_micros)
    })
}

/// `state`'s layout: the job's epoch in the high 32 bits, `CLOSED` once the caller has seen
/// every task handed out (no worker may join after that), the workers inside the job below.
const EPOCH_SHIFT: u32 = 32;
const CLOSED: u64 = 1 << 31;
const ACTIVE_MASK: u64 = CLOSED - 1;

/// The job being run: a task function over the indices in `Shared::ranges`, borrowed from the
/// caller's stack.
#[derive(Clone, Copy)]
struct Job {
    task: *const (dyn Fn(usize) + Sync),
}

struct Shared {
    /// Epoch, CLOSED and the count of workers inside the current job (see the constants).
    state: AtomicU64,
    /// Each thread's range of task indices still to run, `[front, back)` packed as
    /// `back << 32 | front`: the owner takes from the front, the others from the back.
    ranges: Box<[Range]>,
    /// Written by the caller before it publishes a new epoch, read by workers that joined it.
    job: UnsafeCell<Job>,
    /// The first panic of the current job's tasks.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// Workers asleep (or about to be) on `wake`; a caller wakes them only when non-zero.
    sleepers: AtomicUsize,
    sleep_lock: Mutex<()>,
    wake: Condvar,
    /// Set while the caller sleeps on `done` for the workers still inside its job (on a
    /// machine with more runnable threads than cores); the last worker out wakes it.
    caller_sleeps: AtomicBool,
    done_lock: Mutex<()>,
    done: Condvar,
}

// SAFETY: `job` is written only by the one caller holding `Pool::submit`, while no worker is
// inside a job (the previous job was closed and its workers counted out), and read only by
// workers that joined the epoch it was published with (the Release/Acquire pair on `state`).
// The task it points to is `Sync`.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// The pool: `n_threads - 1` workers and the lock that makes one caller at a time its owner.
struct Pool {
    n_threads: usize,
    shared: &'static Shared,
    submit: Mutex<()>,
}

static POOL: OnceLock<Pool> = OnceLock::new();

thread_local! {
    /// Set on the pool's workers and inside [`serial`]: threaded kernels run in place.
    static IN_PLACE: Cell<bool> = const { Cell::new(false) };
}

/// Sets the kernels' thread count (the calling thread included); an error if the pool already
/// runs with another count. Without a call, the pool starts on first use with rayon's global
/// thread count.
pub fn init_threads(n: usize) -> Result<(), String> {
    let n = n.max(1);
    let pool = POOL.get_or_init(|| Pool::new(n));
    if pool.n_threads != n {
        return Err(format!(
            "the compute pool already runs {} threads, not {n}",
            pool.n_threads
        ));
    }
    Ok(())
}

/// The kernels' thread count, the calling thread included.
pub fn num_threads() -> usize {
    pool().n_threads
}

fn pool() -> &'static Pool {
    POOL.get_or_init(|| Pool::new(rayon::current_num_threads()))
}

/// Runs `f` with every threaded kernel it calls on this thread running in place (one thread:
/// what single-thread benchmarks measure).
pub fn serial<R>(f: impl FnOnce() -> R) -> R {
    let was = IN_PLACE.with(|s| s.replace(true));
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            IN_PLACE.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(was);
    f()
}

/// A buffer's raw pointer, shared by the tasks of one job that each write their own disjoint part
/// of it (a row, a range of columns, an item's output).
///
/// SAFETY of the Send/Sync impls: the caller gives every task a part no other task touches, and
/// keeps the buffer borrowed mutably, unread and alive until `for_each_task` returns.
#[derive(Clone, Copy)]
pub(crate) struct SharedMut<T>(pub(crate) *mut T);

unsafe impl<T> Send for SharedMut<T> {}
unsafe impl<T> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    /// A method, not a field access, so closures capture the whole (Sync) wrapper.
    pub(crate) fn ptr(self) -> *mut T {
        self.0
    }
}

/// Runs `task(i)` for every `i` in `[0, n_tasks)`, each exactly once, on the pool's threads and
/// this one; returns when all have ended. A panic in a task resumes here once every task ended.
pub fn for_each_task(n_tasks: usize, task: &(dyn Fn(usize) + Sync)) {
    pool().for_each_task(n_tasks, task)
}

/// Every task on this thread, in order; as in the pool, a panic does not stop the others and
/// the first one resumes at the end.
fn run_in_place(n_tasks: usize, task: &(dyn Fn(usize) + Sync)) {
    let mut first = None;
    for i in 0..n_tasks {
        if let Err(p) = panic::catch_unwind(AssertUnwindSafe(|| task(i))) {
            first.get_or_insert(p);
        }
    }
    if let Some(p) = first {
        panic::resume_unwind(p);
    }
}

impl Pool {
    /// [`for_each_task`] on this pool.
    fn for_each_task(&self, n_tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        let in_place = n_tasks <= 1 || n_tasks > u32::MAX as usize || self.n_threads == 1;
        if in_place || IN_PLACE.with(Cell::get) {
            return run_in_place(n_tasks, task);
        }
        let owner = match self.submit.try_lock() {
            Ok(owner) => owner,
            // (Never poisoned: a task's panic resumes only once the lock is released.)
            Err(TryLockError::Poisoned(owner)) => owner.into_inner(),
            // Another caller's job is running (or this is one of its tasks): the same tasks here.
            Err(TryLockError::WouldBlock) => return run_in_place(n_tasks, task),
        };
        let first_panic = self.run(n_tasks, task);
        drop(owner);
        if let Some(p) = first_panic {
            panic::resume_unwind(p);
        }
    }

    fn new(n_threads: usize) -> Pool {
        let n_threads = n_threads.max(1);
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            state: AtomicU64::new(0),
            ranges: (0..n_threads).map(|_| Range::default()).collect(),
            job: UnsafeCell::new(Job { task: &|_| {} }),
            panic: Mutex::new(None),
            sleepers: AtomicUsize::new(0),
            sleep_lock: Mutex::new(()),
            wake: Condvar::new(),
            caller_sleeps: AtomicBool::new(false),
            done_lock: Mutex::new(()),
            done: Condvar::new(),
        }));
        for i in 1..n_threads {
            std::thread::Builder::new()
                .name(format!("edge-llm-kernels-{i}"))
                .spawn(move || worker(shared, i))
                .expect("starting a kernel thread");
        }
        Pool {
            n_threads,
            shared,
            submit: Mutex::new(()),
        }
    }

    /// Runs a job as its one caller (the `submit` lock held); returns its first panic.
    fn run(&self, n_tasks: usize, task: &(dyn Fn(usize) + Sync)) -> Option<Box<dyn Any + Send>> {
        let s = self.shared;
        // SAFETY: the lifetime is erased only for the duration of this call: the job is closed
        // and every worker that joined it has left before `run` returns (below).
        let task: *const (dyn Fn(usize) + Sync + 'static) = unsafe { std::mem::transmute(task) };
        let epoch = (s.state.load(Ordering::Relaxed) >> EPOCH_SHIFT).wrapping_add(1);
        // SAFETY: no worker is inside a job (the last one was closed and emptied), so none reads
        // `job` now; a worker reads it only after joining the epoch published below.
        unsafe { *s.job.get() = Job { task } };
        let n_threads = s.ranges.len();
        for (k, range) in s.ranges.iter().enumerate() {
            let (front, back) = (k * n_tasks / n_threads, (k + 1) * n_tasks / n_threads);
            range
                .0
                .store((back as u64) << 32 | front as u64, Ordering::Relaxed);
        }
        s.state.store(epoch << EPOCH_SHIFT, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = s.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        // This thread's share (a panic is held until the workers are out of the job).
        run_tasks(s, 0, task);
        // Close the job to latecomers, then wait for those inside to finish their tasks.
        let mut spins = 0u32;
        let mut state = s.state.fetch_or(CLOSED, Ordering::AcqRel);
        while state & ACTIVE_MASK != 0 {
            spins += 1;
            if spins < 1 << 11 {
                std::hint::spin_loop();
            } else if !yield_gave_way() {
                // (A quiet machine: the worker is running its last task.)
            } else {
                // The worker inside lost its core to another thread: sleep until it is out
                // rather than take time slices it needs.
                wait_for_workers(s);
            }
            state = s.state.load(Ordering::Acquire);
        }
        s.panic.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// One thread's range of task indices, on a cache line of its own.
#[derive(Default)]
#[repr(align(64))]
struct Range(AtomicU64);

impl Range {
    /// Takes the first (`front`) or the last task index left, if any.
    fn take(&self, front: bool) -> Option<usize> {
        let mut r = self.0.load(Ordering::Relaxed);
        loop {
            let (lo, hi) = (r & 0xffff_ffff, r >> 32);
            if lo >= hi {
                return None;
            }
            let (taken, new) = if front {
                (lo, r + 1)
            } else {
                (hi - 1, r - (1 << 32))
            };
            match self
                .0
                .compare_exchange_weak(r, new, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some(taken as usize),
                Err(now) => r = now,
            }
        }
    }
}

/// Runs thread `me`'s range from its front, then the other ranges' tasks from their backs,
/// until none are left. A task that panics does not stop the others; the job's first panic is
/// kept for the caller.
fn run_tasks(s: &Shared, me: usize, task: *const (dyn Fn(usize) + Sync)) {
    let n = s.ranges.len();
    let run = |i: usize| {
        // SAFETY: the caller keeps the task alive until every thread inside the job has left.
        if let Err(p) = panic::catch_unwind(AssertUnwindSafe(|| unsafe { (*task)(i) })) {
            let mut first = s.panic.lock().unwrap_or_else(|e| e.into_inner());
            first.get_or_insert(p);
        }
    };
    while let Some(i) = s.ranges[me].take(true) {
        run(i);
    }
    for k in 1..n {
        let other = &s.ranges[(me + k) % n];
        while let Some(i) = other.take(false) {
            run(i);
        }
    }
}

/// A worker: waits for each new epoch (spinning a while, then asleep), joins the job unless
/// the caller has already closed it, runs tasks, leaves.
fn worker(s: &'static Shared, me: usize) {
    IN_PLACE.with(|f| f.set(true));
    let mut seen = s.state.load(Ordering::Acquire) >> EPOCH_SHIFT;
    loop {
        let state = wait_for_epoch(s, seen);
        seen = state >> EPOCH_SHIFT;
        if !join(s, state) {
            continue;
        }
        // SAFETY: joined the epoch `job` was published with; the caller does not touch `job`
        // again until this worker has left (the count in `state`).
        let job = unsafe { *s.job.get() };
        run_tasks(s, me, job.task);
        let before = s.state.fetch_sub(1, Ordering::SeqCst);
        if before & ACTIVE_MASK == 1 && s.caller_sleeps.load(Ordering::SeqCst) {
            let _guard = s.done_lock.lock().unwrap_or_else(|e| e.into_inner());
            s.done.notify_one();
        }
    }
}

/// Yields this thread's core; whether another thread took it meanwhile (the yield returned
/// late: more threads want to run than there are cores).
fn yield_gave_way() -> bool {
    let before = Instant::now();
    std::thread::yield_now();
    before.elapsed() >= YIELD_GAVE_WAY
}

/// The caller's sleep until no worker is inside its (closed) job.
fn wait_for_workers(s: &Shared) {
    let mut guard = s.done_lock.lock().unwrap_or_else(|e| e.into_inner());
    s.caller_sleeps.store(true, Ordering::SeqCst);
    // The last worker out sees the flag (and notifies under the lock) or this sees its exit.
    while s.state.load(Ordering::SeqCst) & ACTIVE_MASK != 0 {
        guard = s.done.wait(guard).unwrap_or_else(|e| e.into_inner());
    }
    s.caller_sleeps.store(false, Ordering::SeqCst);
}

/// Counts this worker into the job of `state` (its epoch, not closed); false if it was closed
/// or replaced meanwhile.
fn join(s: &Shared, mut state: u64) -> bool {
    let epoch = state >> EPOCH_SHIFT;
    loop {
        if state & CLOSED != 0 || state >> EPOCH_SHIFT != epoch {
            return false;
        }
        match s
            .state
            .compare_exchange_weak(state, state + 1, Ordering::Acquire, Ordering::Relaxed)
        {
            Ok(_) => return true,
            Err(now) => state = now,
        }
    }
}

/// How long a waiting worker spins before it starts offering its core to other threads
/// (`sched_yield`): longer than most gaps between a decode step's jobs.
const YIELD_AFTER: Duration = Duration::from_micros(20);

/// A yield that returns later than this gave the core to another thread: more threads want to
/// run than there are cores.
const YIELD_GAVE_WAY: Duration = Duration::from_micros(20);

/// The state once its epoch differs from `seen`: spins for the spin window, then sleeps on
/// `wake`.
///
/// Past [`YIELD_AFTER`] the worker yields every 64 spins. On a quiet
/// machine a yield returns at once (a system call, well under the gap between jobs), so the
/// worker still sees the next job within a microsecond or so. On a machine loaded beyond its
/// cores (other programs, other engines) the yield hands the core to a thread that wants it,
/// and when it returns late ([`YIELD_GAVE_WAY`]) the worker stops spinning and sleeps: a worker
/// spinning there only takes time slices from the step's thread, which would then run the job's
/// tasks alone anyway (a late worker finds them taken), and a sleeping one is woken by the
/// next job in a few microseconds.
fn wait_for_epoch(s: &Shared, seen: u64) -> u64 {
    let (start, window) = (Instant::now(), spin_window());
    let mut spins = 0u32;
    loop {
        let state = s.state.load(Ordering::Acquire);
        if state >> EPOCH_SHIFT != seen {
            return state;
        }
        std::hint::spin_loop();
        spins += 1;
        if spins.is_multiple_of(64) {
            let waited = start.elapsed();
            if waited >= window {
                break;
            }
            if waited >= YIELD_AFTER && yield_gave_way() {
                break;
            }
        }
    }
    let mut guard = s.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
    s.sleepers.fetch_add(1, Ordering::SeqCst);
    let state = loop {
        let state = s.state.load(Ordering::SeqCst);
        if state >> EPOCH_SHIFT != seen {
            break state;
        }
        guard = s.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
    };
    s.sleepers.fetch_sub(1, Ordering::SeqCst);
    state
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    fn run_counts(pool: &Pool, n_tasks: usize) -> Vec<u32> {
        let counts: Vec<AtomicU32> = (0..n_tasks).map(|_| AtomicU32::new(0)).collect();
        pool.for_each_task(n_tasks, &|i| {
            counts[i].fetch_add(1, Ordering::Relaxed);
        });
        counts.into_iter().map(AtomicU32::into_inner).collect()
    }

    #[test]
    fn every_task_runs_once_whatever_the_thread_count() {
        for n_threads in [1, 2, 3, 5] {
            let pool = Pool::new(n_threads);
            for n in [0, 1, 2, 3, 7, 64, 1000] {
                for _ in 0..50 {
                    assert!(run_counts(&pool, n).iter().all(|&c| c == 1), "{n} tasks");
                }
                // A result that depends on every task: the same on any number of threads.
                let sums: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
                pool.for_each_task(n, &|i| {
                    sums[i].store((i as u64).pow(2) + 1, Ordering::Relaxed);
                });
                let total: u64 = sums.iter().map(|a| a.load(Ordering::Relaxed)).sum();
                assert_eq!(total, (0..n as u64).map(|i| i * i + 1).sum::<u64>());
            }
            serial(|| assert!(run_counts(&pool, 100).iter().all(|&c| c == 1)));
        }
    }

    #[test]
    fn nested_and_concurrent_callers_run_in_place() {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    for _ in 0..200 {
                        let total = AtomicUsize::new(0);
                        for_each_task(10, &|i| {
                            // A task calling a threaded kernel: its tasks run in place.
                            let inner = AtomicUsize::new(0);
                            for_each_task(5, &|j| {
                                inner.fetch_add(j, Ordering::Relaxed);
                            });
                            total.fetch_add(i * 100 + inner.into_inner(), Ordering::Relaxed);
                        });
                        assert_eq!(total.into_inner(), 4500 + 10 * 10);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }

    #[test]
    fn a_panicking_task_resumes_on_the_caller() {
        let pool = Pool::new(2);
        for bad in [0, 5, 99] {
            let ran = AtomicUsize::new(0);
            let r = panic::catch_unwind(AssertUnwindSafe(|| {
                pool.for_each_task(100, &|i| {
                    ran.fetch_add(1, Ordering::Relaxed);
                    assert!(i != bad, "task {i} fails");
                })
            }));
            let msg = r.expect_err("the panic reaches the caller");
            let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
            assert_eq!(msg, format!("task {bad} fails"));
            // Every task was handed out (the others were not abandoned), and the pool still works.
            assert_eq!(ran.into_inner(), 100);
            // Not left poisoned (which would make every later job run in place).
            assert!(!pool.submit.is_poisoned());
            assert!(run_counts(&pool, 50).iter().all(|&c| c == 1));
        }
    }

    #[test]
    fn idle_workers_sleep_after_the_spin_window() {
        let pool = Pool::new(3);
        assert!(run_counts(&pool, 64).iter().all(|&c| c == 1));
        // An idle pool burns no CPU: every worker ends up on the condition variable.
        let started = Instant::now();
        while pool.shared.sleepers.load(Ordering::SeqCst) < 2 {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "workers still spinning"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn jobs_stay_right_with_more_runnable_threads_than_cores() {
        // Busy threads beyond the cores: yields give way, workers and the caller sleep.
        let stop = AtomicBool::new(false);
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        std::thread::scope(|scope| {
            for _ in 0..2 * cores {
                scope.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                });
            }
            let pool = Pool::new(3);
            for round in 0..200 {
                let counts: Vec<AtomicU32> = (0..16).map(|_| AtomicU32::new(0)).collect();
                pool.for_each_task(16, &|i| {
                    if round % 20 == 0 && i % 5 == 0 {
                        // A task long enough for its thread to lose the core.
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    counts[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
            }
            stop.store(true, Ordering::Relaxed);
        });
    }

    #[test]
    fn a_sleeping_pool_wakes() {
        std::thread::sleep(SPIN * 20);
        assert!(run_counts(pool(), 16).iter().all(|&c| c == 1));
    }
}
