//! SIGINT, SIGTERM and the other signals that would end the process, handled on one thread
//! of their own (`sfu-signals`).
//!
//! [`install`] runs first in `main`, before any other thread exists: it blocks the signals
//! below on the main thread, every thread started later inherits that mask, and the `sfu-signals`
//! thread takes them synchronously with `sigwait`. So a stop request never runs a handler on
//! a thread that is waiting for Redis: such a read has a timeout, is never restarted after a
//! handler, and would fail with `EINTR`, failing the clean stop it belongs to (issue 26: a
//! burst of SIGTERMs left index entries and a live heartbeat token behind). The library's own
//! threads block every asynchronous signal anyway (`sfu_redis::signals`). Child processes do
//! not inherit the mask (the standard library clears it before `exec`).
//!
//! What a signal does. SIGINT, SIGTERM and SIGHUP (the terminal went away) are stop requests:
//! - the first one, when a command asked for it ([`signal_channel`]), disconnects that
//!   channel: the command stops cleanly (a node releases its heartbeat and lease, or leaves);
//! - the first one, when no command asked, does what it does by default: the process ends by
//!   that signal (`status`, `fsck`, `doctor` and `reap` are simply interrupted);
//! - a repeat within [`REPEAT_WINDOW`] of the first is the same request delivered twice
//!   (`timeout(1)` and supervisors that signal the whole process group) and is ignored;
//! - a later one exits at once with 130, without clean-up (a stuck clean-up can be cut short:
//!   what it leaves is reaped once the instance is seen dead).
//!
//! SIGUSR1, SIGUSR2 and SIGALRM mean nothing to the CLI: a command that asked for stop
//! requests (`node`, `demo`) logs and ignores them, where by default each would have ended the
//! process with no clean stop (a log-rotation tool's SIGUSR1 left a live heartbeat token and
//! the lease); other commands end by them as before. SIGQUIT keeps its default (a core dump
//! for debugging), SIGPIPE stays ignored (Rust's runtime).

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender, TryRecvError};
use nix::sys::signal::{self, SigHandler, SigSet, Signal};

use crate::Failure;

/// How soon after the first SIGINT/SIGTERM a repeat is taken as the same stop request.
pub(crate) const REPEAT_WINDOW: Duration = Duration::from_secs(1);

#[derive(Default)]
struct State {
    /// The channel of the command that asked for stop requests.
    subscriber: Option<Sender<()>>,
    /// A command asked for stop requests (so the meaningless signals are ignored).
    asked: bool,
    /// When the first stop request arrived.
    first: Option<Instant>,
}

static STATE: Mutex<State> = Mutex::new(State {
    subscriber: None,
    asked: false,
    first: None,
});

/// Stop requests.
const STOP: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];
/// Signals that mean nothing to the CLI.
const IGNORED: [Signal; 3] = [Signal::SIGUSR1, Signal::SIGUSR2, Signal::SIGALRM];

fn state() -> MutexGuard<'static, State> {
    STATE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn handled() -> SigSet {
    STOP.into_iter().chain(IGNORED).collect()
}

/// Blocks the handled signals on the calling (main) thread and starts the thread that waits
/// for them. Call it before any other thread starts.
///
/// # Errors
/// A runtime failure when the mask cannot be set or the thread cannot start (then nothing is
/// blocked: the signals keep their default action).
pub(crate) fn install() -> Result<(), Failure> {
    let set = handled();
    set.thread_block()
        .map_err(|e| Failure::runtime(format!("cannot block SIGINT/SIGTERM: {e}")))?;
    let spawned = std::thread::Builder::new()
        .name("sfu-signals".into())
        .spawn(move || loop {
            match set.wait() {
                Ok(sig) => on_signal(sig),
                Err(e) => {
                    log::error!("waiting for SIGINT/SIGTERM failed: {e}; they end the process");
                    let _ = set.thread_unblock();
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        let _ = handled().thread_unblock();
        return Err(Failure::runtime(format!(
            "cannot start the SIGINT/SIGTERM thread: {e}"
        )));
    }
    Ok(())
}

fn on_signal(sig: Signal) {
    let mut s = state();
    if IGNORED.contains(&sig) {
        if s.asked {
            log::info!("{sig} ignored (SIGINT, SIGTERM or SIGHUP stop sfu-redis)");
            return;
        }
        drop(s);
        return default_action(sig);
    }
    match s.first {
        None => {
            s.first = Some(Instant::now());
            if s.subscriber.take().is_none() {
                drop(s);
                default_action(sig);
            }
        }
        Some(first) if first.elapsed() < REPEAT_WINDOW => {}
        Some(_) => {
            eprintln!("sfu-redis: second signal; exiting without cleanup");
            std::process::exit(130);
        }
    }
}

/// Ends the process by `sig`, as if no one had blocked it.
fn default_action(sig: Signal) {
    // SAFETY: restoring the default disposition installs no handler code.
    let _ = unsafe { signal::signal(sig, SigHandler::SigDfl) };
    let _ = SigSet::from(sig).thread_unblock();
    let _ = signal::raise(sig);
    // Not reached when the default action ends the process.
    std::process::exit(128 + sig as i32);
}

/// A receiver that reports "disconnected" once SIGINT, SIGTERM or SIGHUP arrives (at once
/// when one already did). From then on the process no longer ends by the first signal: the command
/// stops by itself when it sees the channel disconnected.
pub(crate) fn signal_channel() -> Result<Receiver<()>, Failure> {
    let (tx, rx) = bounded::<()>(0);
    let mut s = state();
    s.asked = true;
    if s.first.is_none() {
        s.subscriber = Some(tx);
    }
    Ok(rx)
}

/// True once [`signal_channel`]'s signal arrived.
pub(crate) fn signalled(rx: &Receiver<()>) -> bool {
    matches!(rx.try_recv(), Err(TryRecvError::Disconnected))
}
