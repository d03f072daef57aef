//! Peer records `P:room:{R}:peer:<peer>`: their fields (`malformed_peer`) and what must reach
//! them (`unindexed_peer`): the room's `peers`, the guest's pointer, and the room index of the
//! instance the record names. Key schema version 2 has no per-instance peer index: every
//! record naming I is in a room listed in I's room index (`P:{ctl}:instance:<I>:rooms`) or in
//! the one a reap moved aside (`...:reaping-rooms`), so that the reaper, which walks only that
//! index, reaches it when I dies.
//!
//! Each index is read before the record is read (again): an index entry missing while the
//! record that is read after it exists is a real gap, not an upsert in flight (index first,
//! record second).

use redis::{RedisResult, Value};

use super::findings::Fix;
use super::read::{get, is_id, Scan};
use super::rooms::RoomVerdicts;
use super::snapshot::Seen;
use super::ProblemKind::{MalformedPeer, UnindexedPeer};
use super::BATCH;
use crate::error::Result;

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
    /// The room is a `forgotten_room` candidate of `instance`: not checked against its room
    /// index.
    unheld: bool,
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
    /// Every peer record: its fields, and what must reach it (room `peers`, the instance's
    /// room index, guest pointer). Records of orphaned rooms are only checked for their
    /// fields: they go with their room. A record of the alive metadata owner of a room with
    /// no pin (a `forgotten_room` candidate) is not checked against that owner's room index:
    /// fsck never indexes a room its live owner no longer holds; the room goes as a whole
    /// (`forgotten_room`), or with the owner's reap once the owner is dead and the room
    /// checked as its own.
    pub(super) fn records(&mut self, seen: &Seen, verdicts: &RoomVerdicts) -> Result<()> {
        let all: Vec<RecordRef<'_>> = seen
            .rooms
            .iter()
            .flat_map(|(r, s)| s.records.iter().map(move |p| (r, p)))
            .collect();
        for chunk in all.chunks(BATCH) {
            let named = self.records_first(chunk, verdicts)?;
            self.records_second(&named)?;
        }
        Ok(())
    }

    /// First pass: the room's `peers` membership, then the record's fields. Returns the
    /// well-formed records of live rooms.
    fn records_first<'s>(
        &mut self,
        chunk: &[RecordRef<'s>],
        verdicts: &RoomVerdicts,
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
            if verdicts.orphans.contains(room) {
                continue;
            }
            if !in_room {
                self.not_in_room(room, peer, &key);
            }
            named.push(Named {
                room,
                peer,
                key,
                unheld: verdicts.unheld.get(room) == Some(&instance),
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

    /// Second pass: the instance's room index (live and moved aside) and the guest's pointer,
    /// then the record again.
    fn records_second(&mut self, named: &[Named<'_>]) -> Result<()> {
        let mut pipe = redis::pipe();
        for e in named {
            // A room index a reap moved aside counts: that reap walks the room (deletes the
            // record) or puts the entry back into the live index.
            pipe.sismember(self.ks.instance_rooms(&e.instance), e.room)
                .sismember(self.ks.instance_reaping_rooms(&e.instance), e.room)
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
        if !indexed && !e.unheld && now_instance.as_ref() == Some(&e.instance) {
            // Index first: adding the room is safe whoever owns it. In a room another instance
            // owns, a reap of this one deletes only its own records, and its live walk sweeps
            // them.
            let set = self.ks.instance_rooms(&e.instance);
            let detail = format!(
                "room {} is not in {set} (nor in {}): no reap of {} would reach this record",
                e.room,
                self.ks.instance_reaping_rooms(&e.instance),
                e.instance
            );
            let fix = Fix::Add {
                set,
                member: e.room.clone(),
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
