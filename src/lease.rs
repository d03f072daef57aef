//! The reaper lease: acquire (`SET NX PX` + epoch `INCR`), refresh (owner CAS `PEXPIRE`),
//! release (owner CAS `DEL`), and the local deadline that ends a term.
//!
//! Invariant 3: leadership ends on a local deadline started *before* the acquire/refresh was
//! sent (`sent + lease_ttl - lease_ttl/10`; the tenth absorbs clock-rate differences), not on
//! the next error. The server's TTL starts when the command arrives, after `sent`, so this node
//! stops acting before any other node can acquire. [`LeaderState::is_leader`] reads the clock,
//! so a term ends on time even while the lease thread is blocked.

use std::sync::atomic::Ordering;
use std::time::Instant;

use crossbeam_channel::{select, Receiver, Sender};
use redis::{Connection, Value};

use crate::conn::{self, jitter, Backoff, Link};
use crate::error::{Error, Result};
use crate::event::{Event, LeaderLostReason};
use crate::keys::decode_id;
use crate::leader::{deadline, Term};
use crate::scripts::SCRIPTS;
use crate::state::{Ctx, Shared};

/// What an acquire attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Acquire {
    /// We hold the lease; a new term with this epoch. `repaired` names a foreign value that
    /// was replaced (a lease key without TTL).
    Won {
        epoch: u64,
        repaired: Option<String>,
    },
    /// Another holder (its id, or `<type>` for a wrong-typed key).
    Held(String),
}

/// Tries to take the lease (`SET NX PX` + epoch `INCR`, `lease_acquire.lua`); epochs start
/// above `max_epoch`, the highest this node has seen.
pub(crate) fn acquire(ctx: &Ctx, con: &mut Connection, max_epoch: u64) -> Result<Acquire> {
    let op = "acquire lease";
    let mut inv = SCRIPTS.lease_acquire.prepare_invoke();
    inv.key(ctx.keys.leader())
        .key(ctx.keys.epoch())
        .key(ctx.keys.dataset())
        .arg(&ctx.me)
        .arg(ctx.timings.lease_ttl.as_millis() as u64)
        .arg(max_epoch);
    let (won, v, repaired): (i64, Value, String) = conn::call(con, op, &inv)?;
    let text: String = redis::from_redis_value(v)
        .map_err(|e| Error::bad_data(op, format!("unexpected reply: {e}")))?;
    if won == 1 {
        let epoch = text
            .parse()
            .map_err(|_| Error::bad_data(op, format!("epoch {text:?} is not a number")))?;
        Ok(Acquire::Won {
            epoch,
            repaired: Some(repaired).filter(|r| !r.is_empty()),
        })
    } else {
        Ok(Acquire::Held(text))
    }
}

/// Extends the lease if it still holds our id. `Ok(false)`: it does not.
pub(crate) fn refresh(ctx: &Ctx, con: &mut Connection) -> Result<bool> {
    let mut inv = SCRIPTS.lease_refresh.prepare_invoke();
    inv.key(ctx.keys.leader())
        .arg(&ctx.me)
        .arg(ctx.timings.lease_ttl.as_millis() as u64);
    Ok(conn::call::<i64>(con, "refresh lease", &inv)? == 1)
}

/// Deletes the lease if it still holds our id. `Ok(false)`: it did not.
pub(crate) fn release(ctx: &Ctx, con: &mut Connection) -> Result<bool> {
    let mut inv = SCRIPTS.lease_release.prepare_invoke();
    inv.key(ctx.keys.leader()).arg(&ctx.me);
    Ok(conn::call::<i64>(con, "release lease", &inv)? == 1)
}

/// The lease thread: non-leaders try to acquire every `lease_refresh` (jittered); the leader
/// refreshes every `lease_refresh` and demotes at once on a failed, refused or late refresh.
/// `demoted` tells the reaper thread to abandon its round. On shutdown the lease is released
/// (unless `crashed` is set: a simulated kill -9 leaves it to expire).
pub(crate) fn run(sh: &Shared, shutdown: &Receiver<()>, demoted: &Sender<()>) {
    let t = sh.ctx.timings;
    let mut link = Link::new();
    let mut backoff = Backoff::new(t.lease_refresh / 8, t.lease_refresh);
    let mut next = Instant::now();
    let demote = |reason: LeaderLostReason| {
        if sh.leader.end_with(&sh.events, reason) {
            let _ = demoted.try_send(());
        }
    };
    loop {
        let now = Instant::now();
        // A term whose deadline passed while we slept (or were paused) ends now.
        if let Some(term) = sh.leader.raw() {
            if now >= term.deadline {
                demote(LeaderLostReason::DeadlinePassed);
            }
        }
        let wait = next.saturating_duration_since(now);
        let wake = match sh.leader.raw() {
            Some(term) => wait.min(term.deadline.saturating_duration_since(now)),
            None => wait,
        };
        select! {
            recv(shutdown) -> _ => break,
            default(wake) => {}
        }
        if Instant::now() < next {
            continue;
        }
        let sent = Instant::now();
        if let Some(term) = sh.leader.raw() {
            match link.run(&sh.redis, |c| refresh(&sh.ctx, c)) {
                Ok(true) if Instant::now() < term.deadline => {
                    let extended = sh.leader.extend(Term {
                        epoch: term.epoch,
                        deadline: deadline(sent, t.lease_ttl),
                    });
                    next = if extended {
                        sent + t.lease_refresh
                    } else {
                        // Ended by the heartbeat meanwhile (reaped or data lost): stays ended.
                        Instant::now() + jitter(t.lease_refresh)
                    };
                }
                Ok(true) => {
                    demote(LeaderLostReason::DeadlinePassed);
                    next = Instant::now();
                }
                Ok(false) => {
                    log::warn!("lease no longer holds our id; demoting");
                    demote(LeaderLostReason::LeaseTaken);
                    next = Instant::now() + jitter(t.lease_refresh);
                }
                Err(e) => {
                    sh.note_error(&e);
                    log::warn!("lease refresh failed; demoting: {e}");
                    demote(LeaderLostReason::RefreshFailed);
                    next = Instant::now() + backoff.next_delay();
                }
            }
        } else {
            match link.run(&sh.redis, |c| {
                acquire(&sh.ctx, c, sh.max_epoch.load(Ordering::Relaxed))
            }) {
                Ok(Acquire::Won { epoch, repaired }) => {
                    sh.max_epoch.fetch_max(epoch, Ordering::Relaxed);
                    backoff.reset();
                    if let Some(r) = repaired {
                        log::warn!("replaced a lease key of type {r} that had no TTL");
                    }
                    sh.leader.begin(
                        Term {
                            epoch,
                            deadline: deadline(sent, t.lease_ttl),
                        },
                        &sh.events,
                    );
                    sh.publish(&mut link, &Event::LeaderAcquired { epoch });
                    next = sent + t.lease_refresh;
                }
                Ok(Acquire::Held(holder)) => {
                    backoff.reset();
                    if holder == "<dataset new>" {
                        log::debug!("the dataset is younger than a lease TTL (fresh or after data loss); waiting to acquire");
                    } else if holder.starts_with('<') || decode_id(&holder).is_err() {
                        log::warn!("the lease key holds {holder:?}, not an instance id; waiting for it to expire");
                    }
                    next = Instant::now() + jitter(t.lease_refresh);
                }
                Err(e) => {
                    sh.note_error(&e);
                    log::warn!("lease acquire failed: {e}");
                    next = Instant::now() + backoff.next_delay();
                }
            }
        }
    }
    if sh.is_crashed() {
        return;
    }
    let was_leader = sh.leader.end_with(&sh.events, LeaderLostReason::Shutdown);
    if was_leader {
        let _ = demoted.try_send(());
    }
    // Always try: a refresh that failed on our side may still have extended the lease.
    if let Err(e) = link.run(&sh.redis, |c| release(&sh.ctx, c)) {
        log::warn!("could not release the lease on shutdown (it will expire): {e}");
    }
    if was_leader {
        sh.publish(
            &mut link,
            &Event::LeaderLost {
                reason: LeaderLostReason::Shutdown,
            },
        );
    }
}
