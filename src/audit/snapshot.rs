//! The first step of a scan: `SCAN MATCH P:*` with a pipelined `TYPE` per page, which keys of
//! the schema exist and with which type ([`Seen`]). Keys outside the schema are reported
//! (`unknown_key`, key schema version 1's peer indexes among them), keys of the wrong type too
//! (`wrong_type`) and are then left out of every other check.

use std::collections::{BTreeMap, BTreeSet};

use super::read::{get, is_id, text, Scan};
use super::{ProblemKind, OP};
use crate::error::{Error, Result};
use crate::keys::ParsedKey;
use crate::scan::{items_as, Cursor, Scan as ScanOf};

/// The keys of one room that exist with the right type.
#[derive(Debug, Default)]
pub(super) struct RoomSeen {
    pub(super) owner: bool,
    pub(super) meta: bool,
    pub(super) peers: bool,
    pub(super) guests: bool,
    pub(super) guest_state: bool,
    /// One of its keys (or records) holds the wrong type: never deleted by the audit.
    pub(super) wrong_typed: bool,
    pub(super) records: BTreeSet<String>,
}

impl RoomSeen {
    /// How many keys of the room exist (records included).
    pub(super) fn key_count(&self) -> usize {
        [
            self.owner,
            self.meta,
            self.peers,
            self.guests,
            self.guest_state,
        ]
        .iter()
        .filter(|b| **b)
        .count()
            + self.records.len()
    }
}

/// The control-plane keys of one instance that exist with the right type.
#[derive(Debug, Default)]
pub(super) struct InstanceSeen {
    pub(super) hb: bool,
    pub(super) rooms: bool,
    /// Its self-description (`P:{ctl}:instance:<I>:info`).
    pub(super) info: bool,
    /// A room index moved aside by a reap under way or interrupted
    /// (`P:{ctl}:instance:<I>:reaping-rooms`), or that reap's token (`:reaping`).
    pub(super) reaping: bool,
}

/// What one `SCAN` of the prefix saw, by role.
#[derive(Debug, Default)]
pub(super) struct Seen {
    /// `Some(false)`: the heartbeat key holds another type (registration unknown).
    pub(super) heartbeats: Option<bool>,
    pub(super) leader: bool,
    pub(super) epoch: bool,
    pub(super) rooms: BTreeMap<String, RoomSeen>,
    pub(super) instances: BTreeMap<String, InstanceSeen>,
    /// Keys the `SCAN` listed (of any kind).
    pub(super) keys: u64,
}

impl Seen {
    /// The instances with a key of the given role (`flag`), in id order.
    pub(super) fn instances_with(&self, flag: fn(&InstanceSeen) -> bool) -> Vec<&String> {
        self.instances
            .iter()
            .filter(|(_, s)| flag(s))
            .map(|(i, _)| i)
            .collect()
    }

    /// Notes one key of the schema: present with the right type (`ok`), or wrong-typed. Key
    /// schema version 1's peer indexes are not keys of this schema ([`v1_peer_index`]).
    fn note(&mut self, parsed: ParsedKey, ok: bool) {
        match parsed {
            ParsedKey::Heartbeats => self.heartbeats = Some(ok),
            ParsedKey::Leader => self.leader = ok,
            ParsedKey::Epoch => self.epoch = ok,
            ParsedKey::Dataset | ParsedKey::Schema | ParsedKey::ShardDataset(_) => {}
            ParsedKey::Heartbeat(i) => self.instances.entry(i).or_default().hb |= ok,
            ParsedKey::InstanceRooms(i) => self.instances.entry(i).or_default().rooms |= ok,
            ParsedKey::InstanceInfo(i) => self.instances.entry(i).or_default().info |= ok,
            ParsedKey::InstanceReapingRooms(i) | ParsedKey::InstanceReaping(i) => {
                self.instances.entry(i).or_default().reaping |= ok;
            }
            // A reap tombstone outlives the instance by design (a day): not a leftover.
            ParsedKey::V1InstancePeers(_)
            | ParsedKey::V1InstanceReapingPeers(_)
            | ParsedKey::InstanceReaped(_) => {}
            ParsedKey::RoomOwner(r) => self.room_flag(r, ok, |s| &mut s.owner),
            ParsedKey::RoomMeta(r) => self.room_flag(r, ok, |s| &mut s.meta),
            ParsedKey::RoomPeers(r) => self.room_flag(r, ok, |s| &mut s.peers),
            ParsedKey::RoomGuests(r) => self.room_flag(r, ok, |s| &mut s.guests),
            ParsedKey::RoomGuestState(r) => self.room_flag(r, ok, |s| &mut s.guest_state),
            ParsedKey::Peer(r, p) => {
                let room = self.rooms.entry(r).or_default();
                room.wrong_typed |= !ok;
                if ok {
                    room.records.insert(p);
                }
            }
        }
    }

    /// Notes one of a room's keys: present with the right type (`ok`), or wrong-typed.
    fn room_flag(&mut self, room: String, ok: bool, flag: impl FnOnce(&mut RoomSeen) -> &mut bool) {
        let rs = self.rooms.entry(room).or_default();
        rs.wrong_typed |= !ok;
        *flag(rs) |= ok;
    }
}

/// What to say about a key schema version 1 peer index (`None`: `k` is not one). Version 2
/// dropped them (`keys::SCHEMA_VERSION`): the room index reaches every record.
fn v1_peer_index(k: &ParsedKey) -> Option<&'static str> {
    match k {
        ParsedKey::V1InstancePeers(_) => Some(
            "a key schema version 1 peer index (`<room>/<peer>` members), which version 2 does not use; `sfu-redis migrate --apply` folds it into the instance's room index; left alone",
        ),
        ParsedKey::V1InstanceReapingPeers(_) => Some(
            "a key schema version 1 peer index moved aside by a reap, which version 2 does not use; `sfu-redis migrate --apply` folds it into the instance's room index; left alone",
        ),
        _ => None,
    }
}

/// The Redis type the schema gives a key (key schema version 1's peer indexes: a set, as
/// they were).
fn expected_type(k: &ParsedKey) -> &'static str {
    match k {
        ParsedKey::Heartbeats => "zset",
        ParsedKey::Heartbeat(_)
        | ParsedKey::Leader
        | ParsedKey::Epoch
        | ParsedKey::Dataset
        | ParsedKey::Schema
        | ParsedKey::ShardDataset(_)
        | ParsedKey::InstanceReaping(_)
        | ParsedKey::InstanceReaped(_)
        | ParsedKey::RoomOwner(_) => "string",
        ParsedKey::InstanceRooms(_)
        | ParsedKey::V1InstancePeers(_)
        | ParsedKey::InstanceReapingRooms(_)
        | ParsedKey::V1InstanceReapingPeers(_)
        | ParsedKey::RoomPeers(_) => "set",
        ParsedKey::InstanceInfo(_)
        | ParsedKey::RoomMeta(_)
        | ParsedKey::RoomGuests(_)
        | ParsedKey::RoomGuestState(_)
        | ParsedKey::Peer(..) => "hash",
    }
}

/// The ids in a key's name (instance, room, room and peer), to be checked for wire form.
fn ids_of(parsed: &ParsedKey) -> Vec<&String> {
    match parsed {
        ParsedKey::Heartbeat(i)
        | ParsedKey::InstanceRooms(i)
        | ParsedKey::V1InstancePeers(i)
        | ParsedKey::InstanceInfo(i)
        | ParsedKey::InstanceReapingRooms(i)
        | ParsedKey::V1InstanceReapingPeers(i)
        | ParsedKey::InstanceReaping(i)
        | ParsedKey::InstanceReaped(i) => vec![i],
        ParsedKey::RoomOwner(r)
        | ParsedKey::RoomMeta(r)
        | ParsedKey::RoomPeers(r)
        | ParsedKey::RoomGuests(r)
        | ParsedKey::RoomGuestState(r) => vec![r],
        ParsedKey::Peer(r, p) => vec![r, p],
        _ => Vec::new(),
    }
}

impl Scan<'_> {
    /// `SCAN MATCH P:*` with a pipelined `TYPE` per page: what exists, by role. `listed` is
    /// told the number of keys listed so far after each page.
    pub(super) fn keys(&mut self, listed: &dyn Fn(u64)) -> Result<Seen> {
        let mut cursor = Cursor::new(ScanOf::keys(self.ks.scan_pattern()));
        let mut seen = Seen::default();
        let redis_err = |e| Error::redis(OP, e);
        while let Some(items) = cursor.next_page(self.con).map_err(redis_err)? {
            let names: Vec<Vec<u8>> = items_as(items).map_err(redis_err)?;
            seen.keys += names.len() as u64;
            let mut pipe = redis::pipe();
            for n in &names {
                pipe.cmd("TYPE").arg(n);
            }
            let types = self.exec(&mut pipe)?;
            for (name, t) in names.into_iter().zip(types) {
                let t: String = get(Some(&t)).unwrap_or_default();
                self.classify(&mut seen, name, &t);
            }
            listed(seen.keys);
        }
        Ok(seen)
    }

    /// Notes one key of type `t` in `seen`, or reports it (`unknown_key`, `wrong_type`).
    fn classify(&mut self, seen: &mut Seen, name: Vec<u8>, t: &str) {
        let key = match text(name) {
            Ok(k) => k,
            Err(lossy) => {
                let detail = "the key name is not UTF-8; not a key of the schema".to_owned();
                return self.unknown(&lossy, detail);
            }
        };
        if t.is_empty() || t == "none" {
            return; // expired meanwhile
        }
        let Some(parsed) = self.ks.parse(&key) else {
            let detail = format!("a {t} that is not a key of the schema; left alone");
            return self.unknown(&key, detail);
        };
        if let Some(why) = v1_peer_index(&parsed) {
            return self.unknown(&key, why.to_owned());
        }
        if let Some(bad) = ids_of(&parsed).into_iter().find(|i| !is_id(i)) {
            let detail = format!("{bad:?} in the key name is not an id in wire form; left alone");
            return self.unknown(&key, detail);
        }
        let expected = expected_type(&parsed);
        let ok = t == expected;
        if !ok {
            let detail = format!("holds a {t}, the schema says {expected}; left alone");
            self.found(ProblemKind::WrongType, &key, "", detail, None);
        }
        seen.note(parsed, ok);
    }

    fn unknown(&mut self, key: &str, detail: String) {
        self.found(ProblemKind::UnknownKey, key, "", detail, None);
    }
}
