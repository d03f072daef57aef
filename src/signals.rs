//! Signals and the library's threads: a host's signal handler never interrupts the library's
//! Redis I/O (issue 26, "a signal never breaks a clean stop").
//!
//! Why: every connection of the library has a read and a write timeout (`SO_RCVTIMEO`,
//! `SO_SNDTIMEO`), and a blocking socket call with a timeout is never restarted after a signal
//! handler ran, even one installed with `SA_RESTART` (Linux signal(7), "Interruption of system
//! calls and library functions by signal handlers"). It fails with `EINTR`, the driver reports
//! `Interrupted system call`, and a request already sent has an unknown outcome: a stop, a
//! leave or a heartbeat fails for nothing. So:
//!
//! - every thread the library starts ([`spawn`]) blocks the asynchronous signals for its whole
//!   life, so the kernel delivers a process-directed signal (`kill`, Ctrl-C, a supervisor's
//!   SIGTERM) to one of the host's threads, where the host's handler runs;
//! - a library call on a host thread blocks them for its duration (`Masked`, taken by the
//!   connection layer around every call, connect and pipeline): a signal sent to that thread
//!   meanwhile stays pending, and its handler runs as soon as the call returns. Nothing is
//!   lost and no read is cut short.
//!
//! Synchronous signals (`SIGSEGV`, `SIGBUS`, `SIGFPE`, `SIGILL`, `SIGTRAP`, `SIGSYS`,
//! `SIGABRT`) are never blocked: they report a fault of the thread itself. `SIGKILL` and
//! `SIGSTOP` cannot be blocked. The cost on a host thread is two `rt_sigprocmask` system calls
//! per library call (well under a microsecond); none on the library's own threads or in a call
//! nested inside another. On other platforms than Unix this module does nothing.

use std::io;
use std::thread::{Builder, JoinHandle};

/// Spawns a thread with the asynchronous signals blocked for its whole life: how the library
/// starts each of its own threads (heartbeat, lease, reaper), and how a wrapper of the library
/// should start the threads that run library work (the C API's callback thread does).
///
/// The new thread inherits the mask at its creation (the calling thread blocks the signals
/// around the spawn and restores its own mask afterwards), so no signal can reach it in the
/// moment before it would block them itself.
///
/// # Errors
/// The error of [`Builder::spawn`] (the system cannot create a thread).
pub fn spawn<F, T>(builder: Builder, f: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let _masked = Masked::new();
    builder.spawn(move || {
        imp::mark_masked_for_life();
        f()
    })
}

/// Blocks the asynchronous signals on the calling thread until dropped, then restores the
/// thread's own mask. Nests: only the outermost guard of a thread calls the system.
#[must_use = "the signals are blocked only while the guard lives"]
pub(crate) struct Masked(imp::Saved);

impl Masked {
    pub(crate) fn new() -> Masked {
        Masked(imp::block())
    }
}

impl Drop for Masked {
    fn drop(&mut self) {
        imp::restore(&self.0);
    }
}

impl std::fmt::Debug for Masked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Masked")
    }
}

#[cfg(unix)]
mod imp {
    use std::cell::Cell;
    use std::mem::MaybeUninit;

    thread_local! {
        /// Guards alive on this thread; `u32::MAX` on a thread started by `spawn` (masked for
        /// life: no guard ever calls the system there).
        static DEPTH: Cell<u32> = const { Cell::new(0) };
    }

    /// The mask to restore, when this guard was the outermost one.
    pub(super) struct Saved(Option<libc::sigset_t>);

    /// Every signal but the synchronous ones.
    fn asynchronous() -> libc::sigset_t {
        let mut set = MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: sigfillset initializes the set it is given; sigdelset only reads and writes
        // that initialized set; the signal numbers are valid constants.
        unsafe {
            libc::sigfillset(set.as_mut_ptr());
            let mut set = set.assume_init();
            for sig in [
                libc::SIGSEGV,
                libc::SIGBUS,
                libc::SIGFPE,
                libc::SIGILL,
                libc::SIGTRAP,
                libc::SIGSYS,
                libc::SIGABRT,
            ] {
                libc::sigdelset(&mut set, sig);
            }
            set
        }
    }

    pub(super) fn block() -> Saved {
        let outermost = DEPTH.with(|d| {
            let n = d.get();
            d.set(n.saturating_add(1));
            n == 0
        });
        if !outermost {
            return Saved(None);
        }
        let set = asynchronous();
        let mut old = MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: both pointers are valid for the call; pthread_sigmask fills `old` when it
        // returns 0 (it cannot fail with a valid `how` and set).
        let ok = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, old.as_mut_ptr()) == 0 };
        // SAFETY: initialized by the successful call above.
        Saved(ok.then(|| unsafe { old.assume_init() }))
    }

    pub(super) fn restore(saved: &Saved) {
        DEPTH.with(|d| {
            let n = d.get();
            if n != u32::MAX {
                d.set(n.saturating_sub(1));
            }
        });
        if let Some(old) = &saved.0 {
            // SAFETY: `old` is the mask pthread_sigmask returned for this thread.
            unsafe {
                libc::pthread_sigmask(libc::SIG_SETMASK, old, std::ptr::null_mut());
            }
        }
    }

    pub(super) fn mark_masked_for_life() {
        DEPTH.with(|d| d.set(u32::MAX));
    }
}

#[cfg(not(unix))]
mod imp {
    pub(super) struct Saved;
    pub(super) fn block() -> Saved {
        Saved
    }
    pub(super) fn restore(_: &Saved) {}
    pub(super) fn mark_masked_for_life() {}
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The `SigBlk` mask of the calling thread, from /proc.
    fn blocked_now() -> u64 {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status"))
            .expect("read the thread's status");
        let line = status
            .lines()
            .find_map(|l| l.strip_prefix("SigBlk:"))
            .expect("a SigBlk line");
        u64::from_str_radix(line.trim(), 16).expect("a hex mask")
    }

    fn bit(sig: libc::c_int) -> u64 {
        1 << (sig - 1)
    }

    #[test]
    fn a_guard_blocks_the_asynchronous_signals_and_restores_the_mask() {
        std::thread::spawn(|| {
            let before = blocked_now();
            assert_eq!(
                before & bit(libc::SIGTERM),
                0,
                "a fresh thread blocks nothing"
            );
            {
                let _outer = Masked::new();
                let _inner = Masked::new();
                let now = blocked_now();
                for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGUSR1, libc::SIGCHLD] {
                    assert_ne!(now & bit(sig), 0, "signal {sig} blocked in a call");
                }
                for sig in [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE] {
                    assert_eq!(now & bit(sig), 0, "synchronous signal {sig} never blocked");
                }
            }
            assert_eq!(blocked_now(), before, "the thread's own mask is back");
        })
        .join()
        .expect("the test thread");
    }

    #[test]
    fn a_spawned_thread_blocks_them_for_life_and_the_spawner_gets_its_mask_back() {
        let before = blocked_now();
        let inside = spawn(Builder::new(), || {
            {
                let _g = Masked::new();
            }
            blocked_now()
        })
        .expect("spawn")
        .join()
        .expect("join");
        assert_ne!(inside & bit(libc::SIGTERM), 0);
        assert_ne!(inside & bit(libc::SIGINT), 0);
        assert_eq!(blocked_now(), before);
    }
}
