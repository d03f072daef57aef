//! Peer records `P:room:{R}:peer:<peer>`: their fields (`malformed_peer`) and their three
//! indexes, the room's `peers`, the instance's peer index and the guest's pointer
//! (`unindexed_peer`).
//!
//! Each index is read before the record is read (again): an index entry missing while the
//! record that is read after it exists is a real gap, not an upsert in flight (index first,
//! record second).

use std::collections::BTreeSet;

use redis::{RedisResult, Value};

use super::findings::Fix;
use super::read::{get, is_id, Scan};
use super::snapshot::Seen;
use super::ProblemKind::{MalformedPeer, UnindexedPeer};
use super::BATCH;
use crate::error::Result;
use crate::keys::peer_member;

/// A record to check: room and peer.
type RecordRef<'s> = (&'s String, &'s String);

/// A well-formed record of a live room, for the second pass: room, peer, record key, the
/// instance and guest (`""` if none) it names.
struct Named<'s> {
    room: &'s String,
    peer: &'s String,
    key: String,
    instance: String,
    guest: String,
}

/// `instance`, `guest` (`""` if none) and `generation` of an `HMGET` reply.
fn record_fields(f: Vec<Option<String>>) -> (Option<String>, String, Option<String>) {
    let mut f = f.into_iter();
    let instance = f.next().flatten();
    let guest = f.next().flatten().unwrap_or_default();
    let generation = f.next().flatten();
    (instance, guest, generation)
}

/// Appends `HMGET rec instance guest generation`.
fn read_fields(pipe: &mut redis::Pipeline, rec: &str) {
    pipe.cmd("HMGET")
        .arg(rec)
        .arg("instance")
        .arg("guest")
        .arg("generation");
}

/// What is wrong with a record's fields (empty: nothing).
fn field_problems(
    instance: &Option<String>,
    guest: &str,
    generation: &Option<String>,
) -> Vec<String> {
    let mut bad = Vec::new();
    match instance {
        None => bad.push("no `instance` field".to_owned()),
        Some(i) if !is_id(i) => bad.push(format!("instance {i:?} is not an id")),
        Some(_) => {}
    }
    match generation {
        None => bad.push("no `generation` field".to_owned()),
        Some(g) if g.parse::<u64>().is_err() => {
            bad.push(format!("generation {g:?} is not a number"))
        }
        Some(_) => {}
    }
    if !guest.is_empty() && !is_id(guest) {
        bad.push(format!("guest {guest:?} is not an id"));
    }
    bad
}

impl Scan<'_> {
    /// Every peer record: its fields, and its three indexes (room `peers`, instance peer
    /// index, guest pointer). Records of orphaned rooms are only checked for their fields:
    /// they go with their room.
    pub(super) fn records(&mut self, seen: &Seen, orphans: &BTreeSet<String>) -> Result<()> {
        let all: Vec<RecordRef<'_>> = seen
            .rooms
            .iter()
            .flat_map(|(r, s)| s.records.iter().map(move |p| (r, p)))
            .collect();
        for chunk in all.chunks(BATCH) {
            let named = self.records_first(chunk, orphans)?;
            self.records_second(&named)?;
        }
        Ok(())
    }

    /// First pass: the room's `peers` membership, then the record's fields. Returns the
    /// well-formed records of live rooms.
    fn records_first<'s>(
        &mut self,
        chunk: &[RecordRef<'s>],
        orphans: &BTreeSet<String>,
    ) -> Result<Vec<Named<'s>>> {
        let mut pipe = redis::pipe();
        for (room, peer) in chunk {
            let rec = self.ks.peer(room, peer);
            pipe.sismember(self.ks.room(room).peers, *peer).exists(&rec);
            read_fields(&mut pipe, &rec);
        }
        let r = self.exec(&mut pipe)?;
        let mut named = Vec::new();
        for (n, &(room, peer)) in chunk.iter().enumerate() {
            let (Some(in_room), Some(true), Some(f)) = (
                get::<bool>(r.get(3 * n)),
                get::<bool>(r.get(3 * n + 1)),
                get::<Vec<Option<String>>>(r.get(3 * n + 2)),
            ) else {
                continue; // gone meanwhile, or wrong-typed (reported by itself)
            };
            let key = self.ks.peer(room, peer);
            let (instance, guest, generation) = record_fields(f);
            let bad = field_problems(&instance, &guest, &generation);
            if !bad.is_empty() {
                let detail = format!("peer record: {}", bad.join(", "));
                self.found(MalformedPeer, &key, "", detail, None);
            }
            let Some(instance) = instance.filter(|i| is_id(i)) else {
                continue;
            };
            if orphans.contains(room) {
                continue;
            }
            if !in_room {
                self.not_in_room(room, peer, &key);
            }
            named.push(Named {
                room,
                peer,
                key,
                instance,
                guest,
            });
        }
        Ok(named)
    }

    fn not_in_room(&mut self, room: &str, peer: &str, key: &str) {
        let detail = format!("not in {}", self.ks.room(room).peers);
        let fix = Fix::RoomEntry {
            room: room.to_owned(),
            peer: peer.to_owned(),
            guest: String::new(),
            mode: "add_peer",
        };
        self.found(UnindexedPeer, key, "room", detail, Some(fix));
    }

    /// Second pass: the instance's peer index and the guest's pointer, then the record again.
    fn records_second(&mut self, named: &[Named<'_>]) -> Result<()> {
        let mut pipe = redis::pipe();
        for e in named {
            // An index a reap moved aside counts (the reap deletes the record or puts the
            // entry back).
            let member = peer_member(e.room, e.peer);
            pipe.sismember(self.ks.instance_peers(&e.instance), &member)
                .sismember(self.ks.instance_reaping_peers(&e.instance), &member)
                .hget(self.ks.room(e.room).guests, &e.guest);
            read_fields(&mut pipe, &e.key);
        }
        let r = self.exec(&mut pipe)?;
        for (n, e) in named.iter().enumerate() {
            self.record_indexes(e, &r, n);
        }
        Ok(())
    }

    /// The second pass's verdict on record `n`.
    fn record_indexes(&mut self, e: &Named<'_>, r: &[RedisResult<Value>], n: usize) {
        let (Some(live), Some(aside), Some(pointer), Some(f)) = (
            get::<bool>(r.get(4 * n)),
            get::<bool>(r.get(4 * n + 1)),
            get::<Option<String>>(r.get(4 * n + 2)),
            get::<Vec<Option<String>>>(r.get(4 * n + 3)),
        ) else {
            return;
        };
        let indexed = live || aside;
        let (now_instance, now_guest, _) = record_fields(f);
        if !indexed && now_instance.as_ref() == Some(&e.instance) {
            let set = self.ks.instance_peers(&e.instance);
            let detail = format!("not in {set}");
            let fix = Fix::Add {
                set,
                member: peer_member(e.room, e.peer),
            };
            self.found(UnindexedPeer, &e.key, "instance", detail, Some(fix));
        }
        let guest = &e.guest;
        if guest.is_empty() || !is_id(guest) || now_guest != *guest {
            return;
        }
        match pointer {
            None => {
                let detail = format!("guest {guest} has no pointer to it");
                let fix = Fix::RoomEntry {
                    room: e.room.clone(),
                    peer: e.peer.clone(),
                    guest: guest.clone(),
                    mode: "add_guest",
                };
                self.found(UnindexedPeer, &e.key, "guest", detail, Some(fix));
            }
            Some(other) if other != *e.peer => {
                let detail = format!(
                    "guest {guest} points at peer {other}: a superseded record (not repaired: which one is current is the host's call)"
                );
                self.found(UnindexedPeer, &e.key, "guest", detail, None);
            }
            Some(_) => {}
        }
    }
}
