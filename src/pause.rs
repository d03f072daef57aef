//! Why a leader skips reap rounds, and where it says so.
//!
//! The reaper skips a round when the node saw Redis errors or slow heartbeat ticks (a tick
//! longer than half the heartbeat interval, `src/heartbeat.rs`) during the round's two-phase
//! wait (docs/DESIGN.md "Lessons from other systems": a node that cannot trust its own view
//! does not delete). A [`Mark`] taken when the round starts tells which of the two happened
//! since ([`Mark::skip`]).
//!
//! So that a stale instance left unreaped for that reason is explained, the leader notes the
//! skip in its own record `P:{ctl}:instance:<I>:info` (`lua/reaper_paused.lua`: fields
//! `reaper_paused`, `reaper_paused_ms`, `reaper_paused_since_ms`, `reaper_paused_rounds`,
//! `reaper_paused_tick_ms`, `reaper_paused_slow_ms`; read back as
//! [`crate::info::ReaperPaused`]) and clears the note when a round runs again, finds nothing
//! to reap, or the node no longer leads ([`Note`]). `status` and the fleet page show it.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::conn::{self, Link};
use crate::scripts::SCRIPTS;
use crate::state::{Counters, Shared};

/// The trouble counters when a round began.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark {
    redis_errors: u64,
    slow_ticks: u64,
}

/// Why a round is skipped: what grew since its [`Mark`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Skip {
    /// Heartbeat ticks longer than `slow_after` ran meanwhile.
    pub slow_ticks: bool,
    /// Redis errors were met meanwhile.
    pub redis_errors: bool,
    /// The last slow tick (`slow_ticks` only).
    pub last_tick: Duration,
    /// Half the heartbeat interval: a longer tick is slow.
    pub slow_after: Duration,
}

impl Mark {
    /// The counters now.
    pub(crate) fn take(c: &Counters) -> Mark {
        Mark {
            redis_errors: c.redis_errors.load(Ordering::Relaxed),
            slow_ticks: c.slow_ticks.load(Ordering::Relaxed),
        }
    }

    /// `Some` when Redis errors or slow ticks were counted since this mark (the round must be
    /// skipped); `heartbeat_interval` is the node's.
    pub(crate) fn skip(&self, c: &Counters, heartbeat_interval: Duration) -> Option<Skip> {
        let now = Mark::take(c);
        let skip = Skip {
            slow_ticks: now.slow_ticks > self.slow_ticks,
            redis_errors: now.redis_errors > self.redis_errors,
            last_tick: Duration::from_millis(c.last_slow_tick_ms.load(Ordering::Relaxed)),
            slow_after: heartbeat_interval / 2,
        };
        (skip.slow_ticks || skip.redis_errors).then_some(skip)
    }
}

impl Skip {
    /// `slow_ticks`, `redis_errors` or `slow_ticks,redis_errors` (the record's
    /// `reaper_paused`).
    pub(crate) fn reason(&self) -> &'static str {
        match (self.slow_ticks, self.redis_errors) {
            (true, true) => "slow_ticks,redis_errors",
            (true, false) => "slow_ticks",
            _ => "redis_errors",
        }
    }
}

/// Whether this node's record holds a note, as far as this node knows: notes are written and
/// cleared by the reaper thread only.
#[derive(Debug)]
pub(crate) struct Note {
    /// A note may be in the record.
    noted: bool,
}

impl Note {
    /// No note yet: the registration of this life wrote the record whole, without one, and
    /// only this node's reaper thread writes one.
    pub(crate) fn new() -> Note {
        Note { noted: false }
    }

    /// Notes a skipped round. Best effort: a failure is logged (and not counted as a Redis
    /// error of the node, which would make the next round skip too).
    pub(crate) fn skipped(&mut self, sh: &Shared, link: &mut Link, skip: &Skip) {
        let mut inv = SCRIPTS.reaper_paused.prepare_invoke();
        inv.key(sh.ctx.keys.instance_info(&sh.ctx.me))
            .arg("skip")
            .arg(skip.reason())
            .arg(if skip.slow_ticks {
                skip.last_tick.as_millis().to_string()
            } else {
                String::new()
            })
            .arg(skip.slow_after.as_millis().to_string());
        self.noted = true;
        if let Err(e) = link.run(&sh.redis, |c| {
            conn::call::<i64>(c, "note the skipped reap round", &inv)
        }) {
            log::warn!("could not note the skipped reap round in this instance's record: {e}");
        }
    }

    /// Clears the note, if there may be one (a round runs, found nothing to reap, or this node
    /// no longer leads). Best effort: on a failure it is tried again next time.
    pub(crate) fn clear(&mut self, sh: &Shared, link: &mut Link) {
        if !self.noted {
            return;
        }
        let mut inv = SCRIPTS.reaper_paused.prepare_invoke();
        inv.key(sh.ctx.keys.instance_info(&sh.ctx.me)).arg("run");
        match link.run(&sh.redis, |c| {
            conn::call::<i64>(c, "clear the reaper's pause note", &inv)
        }) {
            Ok(_) => self.noted = false,
            Err(e) => log::debug!("could not clear the reaper's pause note: {e}"),
        }
    }
}
