//! Per-master data-loss detection on a Redis Cluster: a dataset token on each master, checked
//! by the heartbeat tick, so that a master that restarted empty (no persistence, no replica)
//! has its rooms restored by their live owners instead of reported lost.
//!
//! The `{ctl}` dataset token (`P:{ctl}:dataset`, docs/DESIGN.md "Reaped or data lost?") lives on
//! one master: it tells when the control plane lost its data, not when another master did. So
//! each master also carries a token, `P:shard:{<tag>}:dataset`, whose hash tag maps to the
//! lowest slot the master serves (the tag is `<slot>.<n>`, the first `n` that hashes there).
//! The tick sends, to every master serving a room this node holds, `GET` of that master's token
//! and `SET ... NX` of a fresh one, ahead of its pin refresh in the same round trip (each
//! master runs its share in order: the check precedes the refreshes there). A token this node
//! saw before and that is now gone or another means that master lost its data: the rooms this
//! node holds on it are restored (pins still free, metadata, peer records: as after the
//! `{ctl}` master lost its data, for those rooms only).
//!
//! What is not a loss: a token that moved with its slot (a migration: still found under its
//! key, now on another master; the master that gave the slot away gets a token of its own at
//! its new lowest slot, seen for the first time), and a replica promoted with the data (the
//! token is replicated like any key). The first sight of a token (a node's first tick with a
//! room on that master) only learns it: a master that lost its data before that is not told
//! apart from a new one.
//!
//! Cost: nothing on one server (no cluster, no check). On a cluster two commands per master
//! holding this node's rooms, in a round trip the tick makes anyway; no round trip is added.

use std::collections::BTreeSet;

use redis::{Pipeline, Value};

use crate::cluster::{self, Addr, SlotMap};
use crate::conn::{self, Conn};
use crate::keys::{encode_id, IdKind};
use crate::state::{ShardTokens, Shared};

/// The hash tag (`<slot>.<n>`) of the first `n` whose slot is `slot`; `None` if none below a
/// bound no slot needs (CRC16 spreads `n` evenly: about 16,384 tries on average).
pub(crate) fn tag_for(slot: u16) -> Option<String> {
    (0..10_000_000u32)
        .map(|n| format!("{slot}.{n}"))
        .find(|t| cluster::slot(t.as_bytes()) == slot)
}

/// The checks of one tick: one per master serving a room this node holds.
pub(crate) struct Checks {
    /// `(tag, master, fresh value)` per check, in pipeline order (two commands each).
    checks: Vec<(String, Addr, String)>,
    pipe: Pipeline,
}

impl Checks {
    /// No check (one server, or nothing held).
    pub(crate) fn none() -> Checks {
        Checks {
            checks: Vec::new(),
            pipe: redis::pipe(),
        }
    }

    /// The checks for the masters (in `con`'s slot map) that serve the rooms `rooms` (`(id,
    /// wire)`) and `more` (wire forms); none on one server.
    pub(crate) fn new(
        sh: &Shared,
        con: &Conn,
        rooms: &[(String, String)],
        more: &[String],
    ) -> Checks {
        let Some(map) = con.slot_map() else {
            return Checks::none();
        };
        let wires = rooms
            .iter()
            .map(|(_, w)| w.as_str())
            .chain(more.iter().map(String::as_str));
        let masters = masters_of(map, wires);
        let mut checks = Vec::with_capacity(masters.len());
        let mut pipe = redis::pipe();
        let mut state = sh.shards.lock();
        for addr in masters {
            let Some(slot) = map.first_slot_of(&addr) else {
                continue;
            };
            let tag = match state.tags.get(&slot) {
                Some(t) => t.clone(),
                None => match tag_for(slot) {
                    Some(t) => {
                        state.tags.insert(slot, t.clone());
                        t
                    }
                    None => continue,
                },
            };
            let key = sh.ctx.keys.shard_dataset(&tag);
            let fresh = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
            pipe.get(&key);
            pipe.cmd("SET").arg(&key).arg(&fresh).arg("NX");
            checks.push((tag, addr, fresh));
        }
        Checks { checks, pipe }
    }

    /// The commands to send (two per check).
    pub(crate) fn pipe(&self) -> &Pipeline {
        &self.pipe
    }

    /// Reads the replies of [`Checks::pipe`]'s commands (in order), notes the tokens, and
    /// returns the masters whose token this node knew and found gone or changed (they lost
    /// their data). A reply that failed (a token of another type: bad data; a full server's
    /// refused `SET`) tells nothing and changes nothing.
    pub(crate) fn handle(
        self,
        state: &parking_lot::Mutex<ShardTokens>,
        replies: Vec<redis::RedisResult<Value>>,
    ) -> Vec<Addr> {
        let op = "check the masters' dataset tokens";
        let mut state = state.lock();
        let mut lost = Vec::new();
        let mut replies = replies.into_iter();
        for (tag, addr, fresh) in self.checks {
            let (Some(got), Some(set)) = (replies.next(), replies.next()) else {
                break;
            };
            let found = match conn::decode::<Option<String>>(op, got) {
                Ok(v) => v,
                Err(e) => {
                    log::warn!("dataset token {tag:?}: {e}");
                    continue;
                }
            };
            let now = match (&found, conn::decode::<Option<String>>(op, set)) {
                (Some(v), _) => Some(v.clone()),
                // Gone, and ours written: the new token.
                (None, Ok(Some(_))) => Some(fresh),
                // Gone, and another client wrote one first (or the write was refused): not
                // known yet; learnt at the next tick.
                (None, _) => None,
            };
            let before = match now {
                Some(v) => state.known.insert(tag.clone(), v.clone()),
                None => state.known.remove(&tag),
            };
            if let Some(before) = before {
                if found.as_deref() != Some(before.as_str()) {
                    log::warn!(
                        "master {} lost its data (its dataset token P:shard:{{{tag}}}:dataset is {}); restoring the rooms this node holds there",
                        crate::endpoint::show_addr(&addr.0, addr.1),
                        if found.is_some() { "another" } else { "gone" }
                    );
                    lost.push(addr);
                }
            }
        }
        lost
    }
}

/// The distinct masters serving the rooms `wires`, in address order. Stops hashing once every
/// master is found (a few rooms of a big set, usually).
fn masters_of<'a>(map: &SlotMap, wires: impl Iterator<Item = &'a str>) -> Vec<Addr> {
    let all = map.masters().len();
    let mut found = BTreeSet::new();
    for w in wires {
        if let Some(a) = map.master(room_slot(w)) {
            found.insert(a.clone());
            if found.len() == all {
                break;
            }
        }
    }
    found.into_iter().collect()
}

/// The slot of room `wire`'s keys (its hash tag is the wire id).
fn room_slot(wire: &str) -> u16 {
    cluster::slot(wire.as_bytes())
}

/// Of `rooms` (callers' ids), those whose slot a master of `lost` serves in `con`'s slot map.
pub(crate) fn rooms_on(con: &Conn, lost: &[Addr], rooms: &[String]) -> Vec<String> {
    let Some(map) = con.slot_map() else {
        return Vec::new();
    };
    rooms
        .iter()
        .filter(|r| {
            encode_id(IdKind::Room, r)
                .ok()
                .and_then(|w| map.master(room_slot(&w)))
                .is_some_and(|a| lost.contains(a))
        })
        .cloned()
        .collect()
}

/// The masters of `lost` as `host:port`, for a log line.
pub(crate) fn describe(lost: &[Addr]) -> String {
    let names: BTreeSet<String> = lost
        .iter()
        .map(|(h, p)| crate::endpoint::show_addr(h, *p))
        .collect();
    names.into_iter().collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_slot_has_a_tag_that_hashes_to_it() {
        for slot in [0u16, 1, 5460, 5461, 10922, 10923, 16383] {
            let tag = tag_for(slot).unwrap();
            assert_eq!(cluster::slot(tag.as_bytes()), slot, "{tag}");
            assert!(tag.starts_with(&format!("{slot}.")));
            let key = format!("sfu:dev:main:shard:{{{tag}}}:dataset");
            assert_eq!(cluster::slot(key.as_bytes()), slot);
        }
    }
}
