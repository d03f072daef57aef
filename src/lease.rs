//! The reaper lease: acquire (`SET NX PX` + epoch `INCR`), refresh (owner CAS `PEXPIRE`),
//! release (owner CAS `DEL`), and the local deadline that ends a term.
//!
//! Invariant 3: leadership ends on a local deadline started *before* the acquire/refresh was
//! sent (`sent + lease_ttl - lease_ttl/10`; the tenth absorbs clock-rate differences), not on
//! the next error. The server's TTL starts when the command arrives, after `sent`, so this node
//! stops acting before any other node can acquire. [`LeaderState::is_leader`] reads the clock,
//! so a term ends on time even while the lease thread is blocked.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, Sender};
use parking_lot::Mutex;
use redis::{Connection, Value};

use crate::conn::{self, jitter, Backoff, Link};
use crate::error::{Error, Result};
use crate::event::{Event, EventSink, LeaderLostReason};
use crate::keys::decode_id;
use crate::node::Shared;
use crate::scripts::SCRIPTS;

/// One leadership term as this node sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Term {
    pub epoch: u64,
    /// When this node stops acting as leader unless a refresh confirms the lease first.
    pub deadline: Instant,
}

/// One leadership term of this node, on the local monotonic clock ([`crate::Node::terms`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TermRecord {
    /// The term's fencing token.
    pub epoch: u64,
    /// When this node started acting as leader (after the acquire reply arrived).
    pub started: Instant,
    /// The local deadline as last extended by a refresh.
    pub deadline: Instant,
    /// When the lease thread demoted the node, if it did.
    pub demoted: Option<Instant>,
}

impl TermRecord {
    /// When the node stopped acting as leader: the demotion or the deadline, whichever came
    /// first; `None` while the term is still running.
    pub fn ended(&self) -> Option<Instant> {
        match self.demoted {
            Some(d) => Some(d.min(self.deadline)),
            None if Instant::now() >= self.deadline => Some(self.deadline),
            None => None,
        }
    }
}

/// Terms kept in [`LeaderState`]'s history.
const HISTORY: usize = 64;

/// The current term, shared between the lease thread (writer) and everyone else, and a short
/// history of terms for audits and tests.
#[derive(Debug, Default)]
pub(crate) struct LeaderState {
    term: Mutex<Option<Term>>,
    history: Mutex<std::collections::VecDeque<TermRecord>>,
}

impl LeaderState {
    /// The last terms, oldest first.
    pub(crate) fn history(&self) -> Vec<TermRecord> {
        self.history.lock().iter().copied().collect()
    }

    /// A new term starts now; `LeaderAcquired` is emitted under the same lock as the change,
    /// so no `LeaderLost` of this term (from any thread) can be emitted before it.
    fn begin(&self, t: Term, events: &EventSink) {
        let mut term = self.term.lock();
        {
            let mut h = self.history.lock();
            if h.len() == HISTORY {
                h.pop_front();
            }
            h.push_back(TermRecord {
                epoch: t.epoch,
                started: Instant::now(),
                deadline: t.deadline,
                demoted: None,
            });
        }
        *term = Some(t);
        events.emit(Event::LeaderAcquired { epoch: t.epoch });
    }

    /// A refresh confirmed the lease: the deadline moves.
    /// `false` (nothing changed) if the term ended meanwhile (another thread's `end_with`):
    /// a refresh never brings an ended term back.
    fn extend(&self, t: Term) -> bool {
        let mut term = self.term.lock();
        if term.map(|cur| cur.epoch) != Some(t.epoch) {
            return false;
        }
        if let Some(last) = self.history.lock().back_mut() {
            last.deadline = t.deadline;
        }
        *term = Some(t);
        true
    }

    /// The node stops acting as leader (if it was), silently (a stopped or crashed node).
    pub(crate) fn end(&self) {
        let mut term = self.term.lock();
        if term.take().is_some() {
            if let Some(last) = self.history.lock().back_mut() {
                last.demoted.get_or_insert(Instant::now());
            }
        }
    }

    /// The node stops acting as leader if it was, and then emits `LeaderLost { reason }` under
    /// the same lock: whichever thread ends a term (the lease thread on a late or failed
    /// refresh, the heartbeat on finding the node reaped or the data lost), exactly one
    /// `LeaderLost` follows each `LeaderAcquired`. Returns whether a term ended.
    pub(crate) fn end_with(&self, events: &EventSink, reason: LeaderLostReason) -> bool {
        let mut term = self.term.lock();
        if term.take().is_none() {
            return false;
        }
        if let Some(last) = self.history.lock().back_mut() {
            last.demoted.get_or_insert(Instant::now());
        }
        events.emit(Event::LeaderLost { reason });
        true
    }

    /// The term, if its deadline has not passed.
    pub(crate) fn current(&self) -> Option<Term> {
        (*self.term.lock()).filter(|t| Instant::now() < t.deadline)
    }

    pub(crate) fn is_leader(&self) -> bool {
        self.current().is_some()
    }

    fn raw(&self) -> Option<Term> {
        *self.term.lock()
    }
}

/// The local deadline of a term confirmed by a request sent at `sent`.
pub(crate) fn deadline(sent: Instant, lease_ttl: Duration) -> Instant {
    sent + lease_ttl - lease_ttl / 10
}

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

pub(crate) fn acquire(sh: &Shared, con: &mut Connection) -> Result<Acquire> {
    let op = "acquire lease";
    let mut inv = SCRIPTS.lease_acquire.prepare_invoke();
    inv.key(sh.keys.leader())
        .key(sh.keys.epoch())
        .key(sh.keys.dataset())
        .arg(&sh.me)
        .arg(sh.timings.lease_ttl.as_millis() as u64)
        .arg(sh.max_epoch.load(Ordering::Relaxed));
    let (won, v, repaired): (i64, Value, String) = conn::call(con, op, &inv)?;
    let text: String = redis::from_redis_value(v)
        .map_err(|e| Error::bad_data(op, format!("unexpected reply: {e}")))?;
    if won == 1 {
        let epoch = text
            .parse()
            .map_err(|_| Error::bad_data(op, format!("epoch {text:?} is not a number")))?;
        sh.max_epoch.fetch_max(epoch, Ordering::Relaxed);
        Ok(Acquire::Won {
            epoch,
            repaired: Some(repaired).filter(|r| !r.is_empty()),
        })
    } else {
        Ok(Acquire::Held(text))
    }
}

/// Extends the lease if it still holds our id. `Ok(false)`: it does not.
pub(crate) fn refresh(sh: &Shared, con: &mut Connection) -> Result<bool> {
    let mut inv = SCRIPTS.lease_refresh.prepare_invoke();
    inv.key(sh.keys.leader())
        .arg(&sh.me)
        .arg(sh.timings.lease_ttl.as_millis() as u64);
    Ok(conn::call::<i64>(con, "refresh lease", &inv)? == 1)
}

/// Deletes the lease if it still holds our id. `Ok(false)`: it did not.
pub(crate) fn release(sh: &Shared, con: &mut Connection) -> Result<bool> {
    let mut inv = SCRIPTS.lease_release.prepare_invoke();
    inv.key(sh.keys.leader()).arg(&sh.me);
    Ok(conn::call::<i64>(con, "release lease", &inv)? == 1)
}

/// The lease thread: non-leaders try to acquire every `lease_refresh` (jittered); the leader
/// refreshes every `lease_refresh` and demotes at once on a failed, refused or late refresh.
/// `demoted` tells the reaper thread to abandon its round. On shutdown the lease is released
/// (unless `crashed` is set: a simulated kill -9 leaves it to expire).
pub(crate) fn run(sh: &Shared, shutdown: &Receiver<()>, demoted: &Sender<()>) {
    let t = sh.timings;
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
            match link.run(&sh.redis, |c| refresh(sh, c)) {
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
            match link.run(&sh.redis, |c| acquire(sh, c)) {
                Ok(Acquire::Won { epoch, repaired }) => {
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
    if let Err(e) = link.run(&sh.redis, |c| release(sh, c)) {
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

#[cfg(test)]
mod tests {
    use super::*;

    // Two threads end terms while a third begins them (the lease thread acquiring while the
    // heartbeat finds the node reaped): the event stream must still alternate
    // LeaderAcquired / LeaderLost, each LeaderLost closing the term just announced. Before
    // `begin`/`end_with` emitted under the term lock, a term could be ended (and LeaderLost
    // emitted) between the state change and its LeaderAcquired: the chaos run's checker saw
    // "acquired epoch 37 while its previous term was open".
    // A refresh that returns after another thread ended the term must not bring it back
    // (the node would lead again with no LeaderAcquired, then emit a second LeaderLost).
    #[test]
    fn a_refresh_never_revives_an_ended_term() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let events = EventSink::new("t", tx);
        let state = LeaderState::default();
        let term = |epoch| Term {
            epoch,
            deadline: Instant::now() + Duration::from_secs(60),
        };
        state.begin(term(7), &events);
        assert!(state.extend(term(7)));
        assert!(state.end_with(&events, LeaderLostReason::LeaseTaken));
        assert!(!state.extend(term(7)));
        assert!(!state.is_leader());
        assert!(!state.end_with(&events, LeaderLostReason::RefreshFailed));
        let got: Vec<Event> = rx.try_iter().collect();
        assert_eq!(
            got,
            vec![
                Event::LeaderAcquired { epoch: 7 },
                Event::LeaderLost {
                    reason: LeaderLostReason::LeaseTaken
                }
            ]
        );
    }

    #[test]
    fn leadership_events_alternate_whichever_thread_ends_the_term() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let events = EventSink::new("t", tx);
        let state = LeaderState::default();
        let terms = 2000u64;
        std::thread::scope(|s| {
            s.spawn(|| {
                for epoch in 1..=terms {
                    state.begin(
                        Term {
                            epoch,
                            deadline: Instant::now() + Duration::from_secs(60),
                        },
                        &events,
                    );
                    while state.raw().is_some() {
                        std::thread::yield_now();
                    }
                }
            });
            for reason in [
                LeaderLostReason::DeadlinePassed,
                LeaderLostReason::LeaseTaken,
            ] {
                let (state, events) = (&state, &events);
                s.spawn(move || {
                    let mut ended = 0;
                    while state.history().last().map(|t| t.epoch) != Some(terms)
                        || state.raw().is_some()
                    {
                        if state.end_with(events, reason) {
                            ended += 1;
                        }
                    }
                    ended
                });
            }
        });
        let got: Vec<Event> = rx.try_iter().collect();
        assert_eq!(
            got.len() as u64,
            terms * 2,
            "one acquired and one lost per term"
        );
        for (k, pair) in got.chunks(2).enumerate() {
            assert_eq!(
                pair[0],
                Event::LeaderAcquired {
                    epoch: k as u64 + 1
                },
                "event {}",
                2 * k
            );
            assert!(
                matches!(pair[1], Event::LeaderLost { .. }),
                "event {}: {:?}",
                2 * k + 1,
                pair[1]
            );
        }
    }
}
