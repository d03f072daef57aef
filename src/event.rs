//! What a node reports: leadership changes, reap progress, lost rooms.
//!
//! Rust hosts read [`Event`]s from [`crate::Node::events`]; the `sfu-redis node --json` binary
//! prints each as one JSON line ([`Event::to_json`]) with the same names and fields, plus
//! `"instance"` (the emitting node).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crossbeam_channel::{Sender, TrySendError};
use serde_json::{json, Value};

use crate::config::Mode;

/// Why a node stopped being the leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaderLostReason {
    /// A lease refresh failed (Redis error or timeout): demoted at once.
    RefreshFailed,
    /// The local deadline (started before the last successful acquire/refresh was sent)
    /// passed before a refresh confirmed the lease.
    DeadlinePassed,
    /// The lease no longer holds this instance's id.
    LeaseTaken,
    /// The node shut down and released the lease.
    Shutdown,
}

impl LeaderLostReason {
    /// `refresh_failed`, `deadline_passed`, `lease_taken` or `shutdown`.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaderLostReason::RefreshFailed => "refresh_failed",
            LeaderLostReason::DeadlinePassed => "deadline_passed",
            LeaderLostReason::LeaseTaken => "lease_taken",
            LeaderLostReason::Shutdown => "shutdown",
        }
    }
}

/// One thing a node reports. Ids are the callers' ids (decoded from the wire form).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// Start-up writes are done ([`crate::Node::ready`]): counts of rooms and peers held.
    Ready {
        /// Rooms pinned by this node.
        rooms: usize,
        /// Peers upserted by this node.
        peers: usize,
        /// Where the node keeps them: `memory` means no Redis URL was configured (a single
        /// instance nobody else sees).
        mode: Mode,
    },
    /// This node holds the reaper lease; `epoch` is the term's fencing token.
    LeaderAcquired {
        /// Strictly increasing across all terms of one prefix.
        epoch: u64,
    },
    /// This node stopped being the leader.
    LeaderLost {
        /// Why.
        reason: LeaderLostReason,
    },
    /// Phase one of a reap round found instances with stale heartbeats (not yet dead).
    Candidates {
        /// Their ids.
        instances: Vec<String>,
    },
    /// A dead instance was reaped.
    InstanceReaped {
        /// Its id.
        dead: String,
        /// Rooms deleted (it owned them).
        rooms: u64,
        /// Peer records deleted.
        peers: u64,
        /// Rooms in its index that another instance had taken over (left alone).
        skipped_rooms: u64,
        /// An operator's `sfu-redis reap --force` (`reap::ReapOptions::force`): reaped
        /// without waiting for it to go stale. Always false for a leader's reap (a node's
        /// event); true only in what `sfu_redis::reap::reap_instance` publishes on
        /// `P:events`.
        forced: bool,
    },
    /// A room this node owned is no longer its own.
    RoomLost {
        /// The room.
        room: String,
        /// Its owner now, if any.
        new_owner: Option<String>,
    },
    /// This node found it had been reaped while it was unresponsive (a zombie): every room it
    /// held is lost; it registered again as a fresh live instance.
    ReapedSelf {
        /// How many rooms were lost.
        rooms: usize,
        /// Which.
        room_ids: Vec<String>,
    },
    /// The node shut down; no event follows.
    Stopped,
}

/// This process's wall clock, ms since the Unix epoch (0 if the clock is before it).
fn wall_clock_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Event {
    /// Every event's name ([`Event::name`]), in the order of the variants: what
    /// docs/src/reference/events.md lists (`tests/docs.rs` checks it). A unit test keeps it
    /// complete.
    #[doc(hidden)]
    pub const NAMES: [&'static str; 8] = [
        "ready",
        "leader_acquired",
        "leader_lost",
        "candidates",
        "instance_reaped",
        "room_lost",
        "reaped_self",
        "stopped",
    ];

    /// The event's name, as in the JSON `"event"` field.
    pub fn name(&self) -> &'static str {
        match self {
            Event::Ready { .. } => "ready",
            Event::LeaderAcquired { .. } => "leader_acquired",
            Event::LeaderLost { .. } => "leader_lost",
            Event::Candidates { .. } => "candidates",
            Event::InstanceReaped { .. } => "instance_reaped",
            Event::RoomLost { .. } => "room_lost",
            Event::ReapedSelf { .. } => "reaped_self",
            Event::Stopped => "stopped",
        }
    }

    /// The JSON object printed by `sfu-redis node --json`:
    /// `{"event": name, "instance": instance, "ts_ms": wall-clock ms, ...fields}`.
    ///
    /// `ts_ms` is this process's wall clock (system time, ms since the Unix epoch) when the
    /// object is made: the CLI makes it as the event arrives, so operators can time failovers
    /// and reaps from the lines alone. It is not Redis server time (use `status` for that).
    pub fn to_json(&self, instance: &str) -> Value {
        let mut v = match self {
            Event::Ready { rooms, peers, mode } => {
                json!({ "rooms": rooms, "peers": peers, "mode": mode.as_str() })
            }
            Event::LeaderAcquired { epoch } => json!({ "epoch": epoch }),
            Event::LeaderLost { reason } => json!({ "reason": reason.as_str() }),
            Event::Candidates { instances } => json!({ "instances": instances }),
            Event::InstanceReaped {
                dead,
                rooms,
                peers,
                skipped_rooms,
                forced,
            } => {
                json!({ "dead": dead, "rooms": rooms, "peers": peers, "skipped_rooms": skipped_rooms, "forced": forced })
            }
            Event::RoomLost { room, new_owner } => json!({ "room": room, "new_owner": new_owner }),
            Event::ReapedSelf { rooms, room_ids } => {
                json!({ "rooms": rooms, "room_ids": room_ids })
            }
            Event::Stopped => json!({}),
        };
        if let Value::Object(map) = &mut v {
            map.insert("event".into(), self.name().into());
            map.insert("instance".into(), instance.into());
            map.insert("ts_ms".into(), wall_clock_ms().into());
        }
        v
    }
}

/// One event as it was emitted: [`crate::Node::emitted`] keeps the last [`EMITTED_HISTORY`].
///
/// `at` is taken by the emitting thread (the reaper, the lease or the heartbeat thread) right
/// before the event enters the channel, so the time between two events of one node is what the
/// node did in between, whenever a reader took them from the channel. Rule's source: issue 26
/// item 4 ("timing checks compare stamps taken where things happen"): `sfu-redis demo` checks
/// the two-phase wait between a `candidates` event and the `instance_reaped` that follows it
/// with these stamps; stamped on arrival, a reader descheduled while `candidates` waited in the
/// channel measured 1.195 s for a 1.2 s wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmittedEvent {
    /// When it was emitted, on this process's monotonic clock.
    pub at: Instant,
    /// The event.
    pub event: Event,
}

/// How many of its last events a node keeps with their emission times
/// ([`crate::Node::emitted`]).
pub const EMITTED_HISTORY: usize = 256;

/// The sending side of a node's bounded event channel; a full channel drops the event and
/// counts it rather than blocking a worker thread. [`EventSink::close`] (after `Stopped`)
/// disconnects the channel, so a host's `for event in receiver` loop ends.
#[derive(Debug)]
pub(crate) struct EventSink {
    instance: String,
    tx: parking_lot::Mutex<Option<Sender<Event>>>,
    dropped: AtomicU64,
    /// The last [`EMITTED_HISTORY`] events with their emission times, oldest first.
    history: parking_lot::Mutex<VecDeque<EmittedEvent>>,
}

impl EventSink {
    pub(crate) fn new(instance: &str, tx: Sender<Event>) -> Self {
        EventSink {
            instance: instance.to_owned(),
            tx: parking_lot::Mutex::new(Some(tx)),
            dropped: AtomicU64::new(0),
            history: parking_lot::Mutex::new(VecDeque::with_capacity(EMITTED_HISTORY)),
        }
    }

    pub(crate) fn emit(&self, e: Event) {
        log::info!("event {}", e.to_json(&self.instance));
        let tx = self.tx.lock();
        let Some(tx) = tx.as_ref() else {
            return;
        };
        {
            let mut h = self.history.lock();
            if h.len() == EMITTED_HISTORY {
                h.pop_front();
            }
            h.push_back(EmittedEvent {
                at: Instant::now(),
                event: e.clone(),
            });
        }
        match tx.try_send(e) {
            Ok(()) | Err(TrySendError::Disconnected(_)) => {}
            Err(TrySendError::Full(e)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                log::warn!("event channel full; dropped {}", e.name());
            }
        }
    }

    /// Emits `last` and disconnects: nothing is sent after it.
    pub(crate) fn close(&self, last: Event) {
        self.emit(last);
        self.tx.lock().take();
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The last events emitted, oldest first, with their emission times.
    pub(crate) fn history(&self) -> Vec<EmittedEvent> {
        self.history.lock().iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The position of `e`'s variant in [`Event::NAMES`]. No wildcard arm: a new variant does
    /// not compile until it has an arm here; give it the next position, add its name to
    /// `Event::NAMES` and an event of it to `one_of_each`.
    fn position(e: &Event) -> usize {
        match e {
            Event::Ready { .. } => 0,
            Event::LeaderAcquired { .. } => 1,
            Event::LeaderLost { .. } => 2,
            Event::Candidates { .. } => 3,
            Event::InstanceReaped { .. } => 4,
            Event::RoomLost { .. } => 5,
            Event::ReapedSelf { .. } => 6,
            Event::Stopped => 7,
        }
    }

    /// One event of each variant, in the order of [`position`].
    fn one_of_each() -> Vec<Event> {
        vec![
            Event::Ready {
                rooms: 0,
                peers: 0,
                mode: Mode::Memory,
            },
            Event::LeaderAcquired { epoch: 1 },
            Event::LeaderLost {
                reason: LeaderLostReason::Shutdown,
            },
            Event::Candidates { instances: vec![] },
            Event::InstanceReaped {
                dead: "a".into(),
                rooms: 0,
                peers: 0,
                skipped_rooms: 0,
                forced: false,
            },
            Event::RoomLost {
                room: "r".into(),
                new_owner: None,
            },
            Event::ReapedSelf {
                rooms: 0,
                room_ids: vec![],
            },
            Event::Stopped,
        ]
    }

    #[test]
    fn names_are_every_variants_name_in_order() {
        let all = one_of_each();
        let highest = all.iter().map(position).max();
        assert_eq!(
            (all.len(), highest),
            (Event::NAMES.len(), Some(Event::NAMES.len() - 1)),
            "one event of each variant, one name each"
        );
        for (i, e) in all.iter().enumerate() {
            assert_eq!(
                position(e),
                i,
                "one_of_each is in the order of position: {e:?}"
            );
            assert_eq!(e.name(), Event::NAMES[i], "Event::NAMES[{i}]");
            assert_eq!(e.to_json("x")["event"], Event::NAMES[i]);
            // The variant is the name in CamelCase (tests/docs.rs checks the reference's Rust
            // column by this rule).
            let debug = format!("{e:?}");
            let variant = debug.split([' ', '{', '(']).next().unwrap_or_default();
            let camel: String = Event::NAMES[i]
                .split('_')
                .map(|w| w[..1].to_uppercase() + &w[1..])
                .collect();
            assert_eq!(variant, camel, "the variant of `{}`", Event::NAMES[i]);
        }
    }
}
