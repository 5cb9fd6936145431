//! Compiling a plugin at a lower CPU priority than running tasks.
//!
//! A first start compiles the Python and JavaScript interpreters for about a
//! minute on every core. Tasks due meanwhile must not wait for that: the
//! threads that compile get a nice value of 10, so the scheduler prefers the
//! threads that claim and run tasks, and compiles take what is left.

// `setpriority` is a plain libc call on the calling thread (on Linux the nice
// value is per thread); it reads and writes no memory of ours.
#![allow(unsafe_code)]

use hourglass_task::sync::LockExt;

/// Nice value of compiling threads.
pub(super) const COMPILE_NICE: libc::c_int = 10;

/// Lowers the calling thread's CPU priority for good (use it on threads that only compile).
pub(crate) fn lower_this_thread() {
    // SAFETY: setpriority takes plain integers; PRIO_PROCESS with this thread's id affects only it.
    let tid = unsafe { libc::gettid() };
    // SAFETY: as above.
    let status = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, COMPILE_NICE) };
    if status != 0 {
        tracing::debug!("cannot lower the priority of a compile thread: {}", std::io::Error::last_os_error());
    }
}

/// Makes the shared thread pool that wasmtime compiles on run at low
/// priority; once per process (a pool built before stays as it is).
pub(crate) fn lower_compile_pool() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let built = rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("hourglass-compile-{i}"))
            .start_handler(|_| lower_this_thread())
            .build_global();
        if let Err(e) = built {
            tracing::debug!("compile threads keep their priority: {e}");
        }
    });
}

/// Runs `f` on a new thread of low priority and waits for it (on this
/// thread, at its priority, when no thread can be started).
pub(crate) fn at_low_priority<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    let work = std::sync::Mutex::new(Some(f));
    let take = || work.lock_unpoisoned().take();
    let spawned = std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("hourglass-compile".into())
            .spawn_scoped(scope, || {
                lower_this_thread();
                take().map(|f| f())
            })
            .ok()
            .map(|handle| handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
    });
    match spawned.flatten() {
        Some(done) => done,
        None => take().map(|f| f()).expect("the work ran once"),
    }
}
