//! Per room: the pin's and metadata's values (`malformed_value`), rooms nobody owns
//! (`orphaned_room`), the owner's room index (`unindexed_room`); then the room's `peers`,
//! `guests` and `guest-state` (their own files).

use std::collections::{BTreeMap, BTreeSet};

use redis::{RedisResult, Value};

use super::findings::{self, Evidence, Fix};
use super::read::{get, is_id, room_names, Scan};
use super::snapshot::{RoomSeen, Seen};
use super::ProblemKind::{ForgottenRoom, OrphanedRoom, UnindexedRoom};
use super::BATCH;
use crate::config::Timings;
use crate::conn;
use crate::error::Result;
use crate::keys::KeySpace;

/// Peer records named in the `EXISTS` that tells whether a room still has any key.
const EXISTS_RECORDS: usize = 8;

/// A room with what the scan saw of it.
type RoomRef<'s> = (&'s String, &'s RoomSeen);

/// What the room check found for the record check ([`Scan::records`]).
#[derive(Debug, Default)]
pub(super) struct RoomVerdicts {
    /// Orphaned rooms: their records go with them.
    pub(super) orphans: BTreeSet<String>,
    /// Rooms with no pin whose metadata names an alive instance (`forgotten_room`
    /// candidates), with that instance: its records there are not indexed by the audit
    /// either (fsck never indexes a room its live owner no longer holds).
    pub(super) unheld: BTreeMap<String, String>,
}

/// A room with no pin whose metadata names a registered instance, with the metadata's
/// `pinned_ms`: forgotten if that instance is alive ([`Scan::unpinned`]), else left to the
/// reaper like any room of a dead instance.
type Unpinned<'s> = (RoomRef<'s>, String, Option<String>);

/// What was read of one room: its pin (`None`: wrong type), the pin's `PTTL`, the metadata's
/// `owner` and `pinned_ms` (`None`: wrong type), and whether any key of it still exists.
struct RoomRead {
    pin: Option<Option<String>>,
    pttl: Option<i64>,
    meta: Option<(Option<String>, Option<String>)>,
    has_keys: bool,
}

impl RoomRead {
    fn from_replies(r: &[RedisResult<Value>], n: usize) -> RoomRead {
        let meta = get::<Vec<Option<String>>>(r.get(4 * n + 2))
            .map(|v| (v.first().cloned().flatten(), v.get(1).cloned().flatten()));
        RoomRead {
            pin: get::<Option<String>>(r.get(4 * n)),
            pttl: get::<i64>(r.get(4 * n + 1)),
            meta,
            has_keys: get::<i64>(r.get(4 * n + 3)).unwrap_or(1) > 0,
        }
    }
}

impl Scan<'_> {
    /// Per room: pin and metadata values, orphaned rooms, the owner's room index, the room's
    /// `peers`, `guests` and `guest-state`. Returns the orphaned rooms and the
    /// `forgotten_room` candidates.
    pub(super) fn rooms(
        &mut self,
        seen: &Seen,
        registry: Option<&BTreeSet<String>>,
    ) -> Result<RoomVerdicts> {
        let mut v = RoomVerdicts::default();
        let rooms: Vec<RoomRef<'_>> = seen.rooms.iter().collect();
        for chunk in rooms.chunks(BATCH) {
            let (mut owned, unpinned) = self.room_chunk(chunk, registry, &mut v.orphans)?;
            owned.extend(self.unpinned(unpinned, &mut v.unheld)?);
            self.owner_indexes(&owned)?;
        }
        let live: Vec<RoomRef<'_>> = rooms
            .into_iter()
            .filter(|(r, _)| !v.orphans.contains(*r))
            .collect();
        self.room_peers(&live)?;
        self.guests(&live)?;
        self.guest_states(&live)?;
        Ok(v)
    }

    /// Reads a chunk of rooms, checks their values and finds the orphans (added to
    /// `orphans`). Returns the pinned rooms with their owner, and the unpinned rooms whose
    /// metadata names a registered instance.
    #[allow(clippy::type_complexity)]
    fn room_chunk<'s>(
        &mut self,
        chunk: &[RoomRef<'s>],
        registry: Option<&BTreeSet<String>>,
        orphans: &mut BTreeSet<String>,
    ) -> Result<(Vec<(RoomRef<'s>, String)>, Vec<Unpinned<'s>>)> {
        let mut pipe = redis::pipe();
        for (room, rs) in chunk {
            read_room(self.ks, &mut pipe, room, rs);
        }
        let r = self.exec(&mut pipe)?;
        let mut owned = Vec::new();
        let mut unpinned = Vec::new();
        for (n, &(room, rs)) in chunk.iter().enumerate() {
            let read = RoomRead::from_replies(&r, n);
            self.room_values(room, &read);
            let (Some(pin), Some((meta_owner, pinned_ms))) = (read.pin, read.meta) else {
                continue; // a wrong-typed pin or metadata: reported by itself
            };
            if let (None, Some(registry), true) = (&pin, registry, read.has_keys) {
                if self.orphaned(room, rs, registry, &meta_owner, &pinned_ms) {
                    orphans.insert(room.clone());
                    continue;
                }
                if let Some(owner) = meta_owner.as_ref().filter(|o| is_id(o)) {
                    unpinned.push(((room, rs), owner.clone(), pinned_ms));
                    continue;
                }
            }
            if let Some(owner) = pin.or(meta_owner).filter(|o| is_id(o)) {
                owned.push(((room, rs), owner));
            }
        }
        Ok((owned, unpinned))
    }

    /// Rooms with no pin whose metadata names a registered instance: reads each owner (its
    /// score, heartbeat key and record's timings, and the server clock, in one round trip).
    /// A room of an alive owner is a `forgotten_room` candidate (confirmed only by a second
    /// scan, [`Evidence`]) and is not checked against the owner's index (fsck must never
    /// index a room its live owner no longer holds: that owner's walk of its index would close
    /// the room, racing the audit's own deletion); it goes into `unheld` with its owner. The
    /// others are returned to be checked as owned rooms (a dead instance's room must be in its
    /// index for the reaper).
    fn unpinned<'s>(
        &mut self,
        rooms: Vec<Unpinned<'s>>,
        unheld: &mut BTreeMap<String, String>,
    ) -> Result<Vec<(RoomRef<'s>, String)>> {
        if rooms.is_empty() {
            return Ok(Vec::new());
        }
        let ks = self.ks;
        let owners: BTreeSet<String> = rooms.iter().map(|(_, o, _)| o.clone()).collect();
        let mut pipe = redis::pipe();
        pipe.cmd("TIME");
        for o in &owners {
            pipe.zscore(ks.heartbeats(), o)
                .get(ks.heartbeat(o))
                .cmd("HMGET")
                .arg(ks.instance_info(o))
                .arg("heartbeat_interval_ms")
                .arg("command_timeout_ms");
        }
        let r = self.exec(&mut pipe)?;
        let Some(now) = r
            .first()
            .and_then(|t| t.as_ref().ok())
            .and_then(|t| conn::time_reply_ms(t).ok())
        else {
            return Ok(rooms.into_iter().map(|(rr, o, _)| (rr, o)).collect());
        };
        let defaults = Timings::default();
        let default_gap =
            (defaults.heartbeat_interval + defaults.command_timeout).as_millis() as i64;
        let mut alive = BTreeMap::new();
        for (n, o) in owners.iter().enumerate() {
            let score = get::<f64>(r.get(1 + 3 * n));
            let hb = get::<Option<String>>(r.get(2 + 3 * n)).flatten();
            let timings = get::<Vec<Option<u64>>>(r.get(3 + 3 * n)).unwrap_or_default();
            let gap = match (
                timings.first().copied().flatten(),
                timings.get(1).copied().flatten(),
            ) {
                (Some(i), Some(t)) => i64::try_from(i.saturating_add(t)).unwrap_or(i64::MAX),
                _ => default_gap,
            };
            // Alive: registered with a real heartbeat, and a live process's token in its
            // heartbeat key (not `released`: a stopped instance refreshes nothing).
            if let (Some(score), Some(hb)) = (score, hb) {
                if score > 0.0 && hb != "released" {
                    alive.insert(o.clone(), (score as i64, gap));
                }
            }
        }
        let mut rest = Vec::new();
        for ((room, rs), owner, pinned_ms) in rooms {
            let Some(&(owner_heartbeat_ms, min_gap_ms)) = alive.get(owner.as_str()) else {
                rest.push(((room, rs), owner));
                continue;
            };
            unheld.insert(room.clone(), owner.clone());
            let rk = ks.room(room);
            let detail = format!(
                "room {room}: no pin, while its metadata names {owner}, which is alive (last heartbeat at server ms {owner_heartbeat_ms}) and re-pins every room it holds within {min_gap_ms} ms: it no longer holds this one"
            );
            let fix = (!rs.wrong_typed && rs.meta).then(|| Fix::DeleteRoom {
                room: room.clone(),
                meta_owner: owner.clone(),
                pinned_ms: pinned_ms.clone().unwrap_or_default(),
                records: rs.records.iter().cloned().collect(),
            });
            let evidence = Evidence {
                scan_ms: now,
                owner_heartbeat_ms,
                min_gap_ms,
            };
            findings::add_with_evidence(
                &mut self.out,
                ForgottenRoom,
                &rk.meta,
                detail,
                fix,
                evidence,
            );
        }
        Ok(rest)
    }

    /// The pin must be an instance id with a TTL; the metadata's owner an instance id, the
    /// same as the pin's.
    fn room_values(&mut self, room: &str, read: &RoomRead) {
        let rk = self.ks.room(room);
        if let Some(Some(p)) = &read.pin {
            if !is_id(p) {
                let detail = format!("the pin holds {p:?}, not an instance id");
                self.malformed(&rk.owner, "value", detail);
            }
            if read.pttl == Some(-1) {
                let detail = "the pin has no TTL: the room can never be taken over".to_owned();
                self.malformed(&rk.owner, "ttl", detail);
            }
        }
        if let Some((Some(m), _)) = &read.meta {
            if !is_id(m) {
                let detail = format!("the metadata's owner is {m:?}, not an instance id");
                self.malformed(&rk.meta, "owner", detail);
            } else if let Some(Some(p)) = &read.pin {
                // pin_room.lua and pin_refresh.lua write the pin and the metadata's owner
                // together (one slot, one script): two different owners are damage.
                if p != m && is_id(p) {
                    let detail = format!(
                        "the metadata names {m} as the owner while the pin names {p} \
                         (they are written together)"
                    );
                    self.malformed(&rk.meta, "owner", detail);
                }
            }
        }
    }

    /// A room without a pin is orphaned when its metadata names no registered instance (or
    /// there is none); reports it and returns true.
    fn orphaned(
        &mut self,
        room: &String,
        rs: &RoomSeen,
        registry: &BTreeSet<String>,
        meta_owner: &Option<String>,
        pinned_ms: &Option<String>,
    ) -> bool {
        let why = match meta_owner {
            None => "no pin and no metadata".to_owned(),
            Some(m) if !registry.contains(m) => {
                format!("no pin, and its metadata names {m}, which is not a registered instance")
            }
            Some(_) => return false,
        };
        let key = representative(self.ks, room, rs);
        let detail = format!("room {room}: {why} ({} keys)", rs.key_count());
        let fix = (!rs.wrong_typed).then(|| Fix::DeleteRoom {
            room: room.clone(),
            meta_owner: meta_owner.clone().unwrap_or_default(),
            pinned_ms: pinned_ms.clone().unwrap_or_default(),
            records: rs.records.iter().cloned().collect(),
        });
        self.found(OrphanedRoom, &key, "", detail, fix);
        true
    }

    /// The owner's index is read first, then the room again: a missing entry while the room
    /// read after it still names the owner is a real gap, not a pin in flight.
    fn owner_indexes(&mut self, owned: &[(RoomRef<'_>, String)]) -> Result<()> {
        let ks = self.ks;
        let mut pipe = redis::pipe();
        for ((room, _), owner) in owned {
            let rk = ks.room(room);
            // An index a reap moved aside counts: that reap deletes the room or puts its entry
            // back (reap_begin.lua, reap_finish.lua).
            pipe.sismember(ks.instance_rooms(owner), *room)
                .sismember(ks.instance_reaping_rooms(owner), *room)
                .get(&rk.owner)
                .hget(&rk.meta, "owner");
        }
        let r = self.exec(&mut pipe)?;
        for (n, ((room, rs), owner)) in owned.iter().enumerate() {
            let (Some(false), Some(false), Some(pin), Some(meta)) = (
                get::<bool>(r.get(4 * n)),
                get::<bool>(r.get(4 * n + 1)),
                get::<Option<String>>(r.get(4 * n + 2)),
                get::<Option<String>>(r.get(4 * n + 3)),
            ) else {
                continue;
            };
            if !room_names(pin.as_deref(), meta.as_deref(), owner) {
                continue;
            }
            let rk = ks.room(room);
            let key = if rs.meta { rk.meta } else { rk.owner };
            let set = ks.instance_rooms(owner);
            let detail = format!("room {room}: its owner {owner} does not list it in {set}");
            let fix = Fix::Add {
                set,
                member: (*room).clone(),
            };
            self.found(UnindexedRoom, &key, "", detail, Some(fix));
        }
        Ok(())
    }
}

/// Appends the reads of one room: pin and its `PTTL`, metadata owner and `pinned_ms`, and
/// whether any of its keys still exists (a room closed meanwhile is no orphan).
fn read_room(ks: &KeySpace, pipe: &mut redis::Pipeline, room: &str, rs: &RoomSeen) {
    let rk = ks.room(room);
    pipe.get(&rk.owner)
        .pttl(&rk.owner)
        .cmd("HMGET")
        .arg(&rk.meta)
        .arg("owner")
        .arg("pinned_ms");
    let exists = pipe
        .cmd("EXISTS")
        .arg(&rk.meta)
        .arg(&rk.peers)
        .arg(&rk.guests)
        .arg(&rk.guest_state);
    for p in rs.records.iter().take(EXISTS_RECORDS) {
        exists.arg(ks.peer(room, p));
    }
}

/// The key an orphaned room is reported at: its metadata, else its first key.
fn representative(ks: &KeySpace, room: &str, rs: &RoomSeen) -> String {
    let rk = ks.room(room);
    if rs.meta {
        rk.meta
    } else if rs.peers {
        rk.peers
    } else if rs.guests {
        rk.guests
    } else if rs.guest_state {
        rk.guest_state
    } else if let Some(p) = rs.records.iter().next() {
        ks.peer(room, p)
    } else {
        rk.owner
    }
}
