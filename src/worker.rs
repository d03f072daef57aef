//! One way to run a periodic worker (heartbeat, lease, reaper): a loop that waits until the
//! instant its step asked for, or until shutdown, whichever comes first.
//!
//! - Stop signal: the node drops the shutdown `Sender`; the loop's `select!` on the receiver
//!   wakes at once (crossbeam's "dropping the Sender is the stop signal").
//! - Crash flag: a node that simulated a crash stops its workers without any cleanup; the loop
//!   checks the flag after every wait.
//! - Schedule: deadlines are `Instant`s, never tick counts (`crossbeam_channel::tick` merges
//!   missed ticks, so counting them drifts); [`every`] and [`catch_up`] compute the next one.
//! - Retries: capped, jittered exponential backoff (`conn::Backoff`), reset after a success.

use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, TryRecvError};

use crate::conn::Backoff;

/// A periodic worker's loop.
pub(crate) struct Periodic<'a> {
    shutdown: &'a Receiver<()>,
    crashed: &'a dyn Fn() -> bool,
    backoff: Backoff,
}

/// What a step knows and how it schedules its next run.
pub(crate) struct Run<'a> {
    /// The instant this run was scheduled for (it started at or after it).
    pub scheduled: Instant,
    backoff: &'a mut Backoff,
}

impl Run<'_> {
    /// After a success: the backoff starts over; the next run is at `at`.
    pub(crate) fn ok(&mut self, at: Instant) -> Instant {
        self.backoff.reset();
        at
    }

    /// After a failure: the next run is after the next backoff delay (doubling, capped,
    /// jittered).
    pub(crate) fn retry(&mut self) -> Instant {
        Instant::now() + self.backoff.next_delay()
    }
}

impl<'a> Periodic<'a> {
    /// A loop stopped by `shutdown` (its `Sender` dropped) or by `crashed()`, retrying with
    /// `backoff`.
    pub(crate) fn new(
        shutdown: &'a Receiver<()>,
        crashed: &'a dyn Fn() -> bool,
        backoff: Backoff,
    ) -> Self {
        Periodic {
            shutdown,
            crashed,
            backoff,
        }
    }

    /// Runs `step` first at `first`, then at each instant it returns, until shutdown or a
    /// crash. A step never runs after either was seen.
    pub(crate) fn run(mut self, first: Instant, mut step: impl FnMut(&mut Run<'_>) -> Instant) {
        let mut next = first;
        loop {
            select! {
                recv(self.shutdown) -> _ => break,
                default(next.saturating_duration_since(Instant::now())) => {}
            }
            // `select!` may time out just as the shutdown arrives: check both again.
            if (self.crashed)() || stopping(self.shutdown) {
                break;
            }
            let mut run = Run {
                scheduled: next,
                backoff: &mut self.backoff,
            };
            next = step(&mut run);
        }
    }
}

/// True once the shutdown channel is closed.
pub(crate) fn stopping(shutdown: &Receiver<()>) -> bool {
    matches!(shutdown.try_recv(), Err(TryRecvError::Disconnected))
}

/// The run after one scheduled at `scheduled`, every `interval`; runs missed meanwhile are
/// skipped (the next one is a full `interval` after now).
pub(crate) fn every(scheduled: Instant, interval: Duration) -> Instant {
    let next = scheduled + interval;
    let now = Instant::now();
    if next <= now {
        now + interval
    } else {
        next
    }
}

/// The run after one scheduled at `scheduled`, every `interval`; when that time has passed
/// (the step took longer than `interval`), one run at once, and the schedule goes on from it:
/// what the `crossbeam_channel::tick` ticker the reaper used before delivered after a late
/// tick (one tick at once, the next a full interval after it).
pub(crate) fn catch_up(scheduled: Instant, interval: Duration) -> Instant {
    let next = scheduled + interval;
    let now = Instant::now();
    if next > now {
        next
    } else {
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missed_runs_are_skipped_or_caught_up_once() {
        let interval = Duration::from_millis(100);
        let long_ago = Instant::now() - Duration::from_millis(1050);
        let now = Instant::now();
        // every: a full interval from now.
        let e = every(long_ago, interval);
        assert!(e >= now + interval && e <= Instant::now() + interval);
        // catch_up: one run at once; the schedule goes on from it.
        let g = catch_up(long_ago, interval);
        assert!(g >= now && g <= Instant::now());
        assert_eq!(catch_up(g, interval), g + interval);
        // No miss: the next point.
        let t = Instant::now();
        assert_eq!(every(t, interval), t + interval);
        assert_eq!(catch_up(t, interval), t + interval);
    }

    #[test]
    fn dropping_the_sender_stops_the_loop_and_failures_back_off() {
        let (tx, rx) = crossbeam_channel::bounded::<()>(0);
        let never = || false;
        let mut delays = Vec::new();
        std::thread::scope(|s| {
            let worker = s.spawn(|| {
                let backoff = Backoff::new(Duration::from_millis(4), Duration::from_millis(16));
                let mut runs = 0;
                Periodic::new(&rx, &never, backoff).run(Instant::now(), |run| {
                    runs += 1;
                    let next = run.retry();
                    delays.push(next.saturating_duration_since(Instant::now()));
                    next
                });
                runs
            });
            std::thread::sleep(Duration::from_millis(150));
            drop(tx);
            assert!(worker.join().unwrap() > 3);
        });
        // Capped at 16 ms (jitter draws from [d/2, d]).
        assert!(delays.iter().all(|d| *d <= Duration::from_millis(16)));
    }
}
