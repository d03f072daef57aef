//! Leadership as this node sees it: the current term with its local deadline, shared between
//! the lease thread (which begins and extends terms) and every other thread (which reads it, or
//! ends it on finding the node reaped or the data lost), and a short history of terms.
//!
//! Invariant 3: a term ends on a local deadline started *before* the acquire/refresh was sent
//! ([`deadline`]); [`LeaderState::current`] reads the clock, so a term ends on time even while
//! the lease thread is blocked. Leadership events are emitted under the term lock, so exactly
//! one `LeaderLost` follows each `LeaderAcquired` whichever thread ends the term.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::event::{Event, EventSink, LeaderLostReason};

/// One leadership term as this node sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Term {
    pub epoch: u64,
    /// When this node stops acting as leader unless a refresh confirms the lease first.
    pub deadline: Instant,
    /// The connector's master-switch count (`conn::Redis::master_switches`) of the
    /// connection the acquire or the last refresh went over: once a connection has found
    /// another master, the term does not let the node act until a refresh confirms the lease
    /// on the new master (a failover may have lost it: `Shared::is_leader`).
    pub switches: u64,
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
    /// Terms begun since the node started (the history keeps only the last [`HISTORY`]).
    begun: std::sync::atomic::AtomicU64,
}

impl LeaderState {
    /// Terms begun since the node started.
    pub(crate) fn terms_begun(&self) -> u64 {
        self.begun.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The last terms, oldest first.
    pub(crate) fn history(&self) -> Vec<TermRecord> {
        self.history.lock().iter().copied().collect()
    }

    /// A new term starts now; `LeaderAcquired` is emitted under the same lock as the change,
    /// so no `LeaderLost` of this term (from any thread) can be emitted before it.
    pub(crate) fn begin(&self, t: Term, events: &EventSink) {
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
        self.begun
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        events.emit(Event::LeaderAcquired { epoch: t.epoch });
    }

    /// A refresh confirmed the lease: the deadline moves.
    /// `false` (nothing changed) if the term ended meanwhile (another thread's `end_with`):
    /// a refresh never brings an ended term back.
    pub(crate) fn extend(&self, t: Term) -> bool {
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
        self.end_with_at(events, reason, Instant::now())
    }

    /// [`LeaderState::end_with`], recording `at` as when the node stopped acting (a term the
    /// node had already stopped acting on: found on the old master of a failover, then not
    /// confirmed on the new one).
    pub(crate) fn end_with_at(
        &self,
        events: &EventSink,
        reason: LeaderLostReason,
        at: Instant,
    ) -> bool {
        let mut term = self.term.lock();
        if term.take().is_none() {
            return false;
        }
        if let Some(last) = self.history.lock().back_mut() {
            last.demoted.get_or_insert(at.min(Instant::now()));
        }
        events.emit(Event::LeaderLost { reason });
        true
    }

    /// The term, if its deadline has not passed.
    pub(crate) fn current(&self) -> Option<Term> {
        (*self.term.lock()).filter(|t| Instant::now() < t.deadline)
    }

    /// The term, even if its deadline has passed (the lease thread ends it).
    pub(crate) fn raw(&self) -> Option<Term> {
        *self.term.lock()
    }
}

/// The local deadline of a term confirmed by a request sent at `sent`: `sent + lease_ttl -
/// lease_ttl/10` (the tenth absorbs clock-rate differences). The server's TTL starts when the
/// command arrives, after `sent`, so this node stops acting before any other node can acquire.
pub(crate) fn deadline(sent: Instant, lease_ttl: Duration) -> Instant {
    sent + lease_ttl - lease_ttl / 10
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
            switches: 0,
        };
        state.begin(term(7), &events);
        assert!(state.extend(term(7)));
        assert!(state.end_with(&events, LeaderLostReason::LeaseTaken));
        assert!(!state.extend(term(7)));
        assert!(state.current().is_none());
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
                            switches: 0,
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
