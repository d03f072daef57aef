//! `P:{ctl}:instance:<I>:rooms`: every member must be a room whose pin (or, with no pin,
//! metadata) names I, or a room that still holds a peer record naming I
//! (`dangling_room_index`).
//!
//! The second half is key schema version 2's rule: I's room index reaches every record naming
//! I, so a room I lost (taken over, or deleted whole by a close or a reap) stays in I's index
//! until I's own records there are gone (I's heartbeat walk sweeps them, or the reaper does
//! when I dies). Only an entry that reaches neither a room of I nor a record of I is dangling.

use std::collections::BTreeSet;

use super::findings::{Fix, Verify};
use super::read::{exec, get, is_id, pager, room_names, text, Scan};
use super::snapshot::Seen;
use super::{ProblemKind, BATCH, OP};
use crate::conn::Conn;
use crate::error::{Error, Result};
use crate::keys::KeySpace;
use crate::scan::{items_as, Pager, Scan as ScanOf};

/// A room index entry to check: the instance, its room index key, the room.
type Entry<'s> = (&'s String, String, String);

/// A room index entry whose room does not name its instance: why, and the records the scan
/// found in the room (peer ids, wire form).
struct NotNamed<'e, 's> {
    entry: &'e Entry<'s>,
    detail: String,
    known: Vec<String>,
}

/// A question for [`records_naming`]: does a peer record in `room` name `instance`? `known`
/// are records already known to be in the room (the scan's `SCAN` found their keys).
pub(super) struct RecordsOf<'a> {
    pub(super) room: &'a str,
    pub(super) instance: &'a str,
    pub(super) known: &'a [String],
}

impl Scan<'_> {
    /// Every `P:{ctl}:instance:<I>:rooms` member must be a room whose pin (or, with no pin,
    /// metadata) names I, or hold a peer record naming I.
    pub(super) fn room_indexes(&mut self, seen: &Seen) -> Result<()> {
        let owners = seen.instances_with(|s| s.rooms);
        let keys = owners.iter().map(|i| self.ks.instance_rooms(i)).collect();
        let mut pager = pager(keys, ScanOf::set);
        while let Some(pages) = self.pages(&mut pager)? {
            let mut check = Vec::new();
            for (n, items) in pages {
                let key = pager.scan(n).key().to_owned();
                for m in items.unwrap_or_default() {
                    if let Some(room) = self.room_member(&key, m) {
                        check.push((owners[n], key.clone(), room));
                    }
                }
            }
            for chunk in check.chunks(BATCH) {
                self.check_room_entries(chunk, seen)?;
            }
        }
        Ok(())
    }

    /// A member of room index `key` as a room id to check; reports one that is not.
    fn room_member(&mut self, key: &str, m: Vec<u8>) -> Option<String> {
        match text(m) {
            Ok(room) if is_id(&room) => Some(room),
            Ok(room) => {
                let detail = format!("room {room:?} is not a room id");
                let fix = Fix::Unindex {
                    set: key.to_owned(),
                    member: room.clone(),
                    verify: Verify::Never,
                };
                self.dangling_room(key, &room, detail, Some(fix));
                None
            }
            Err(lossy) => {
                self.malformed(key, &lossy, format!("member {lossy:?} is not UTF-8"));
                None
            }
        }
    }

    /// The entry is read again first, then the room, then the room's records: an entry still
    /// there whose room (read after it) does not name the instance (not a pin in flight) and
    /// holds no record naming it (read last).
    fn check_room_entries(&mut self, chunk: &[Entry<'_>], seen: &Seen) -> Result<()> {
        let mut pipe = redis::pipe();
        for (_, key, room) in chunk {
            let rk = self.ks.room(room);
            pipe.sismember(key, room)
                .get(&rk.owner)
                .hget(&rk.meta, "owner");
        }
        let r = self.exec(&mut pipe)?;
        let mut not_named = Vec::new();
        for (n, entry) in chunk.iter().enumerate() {
            let (inst, _, room) = entry;
            let (Some(true), Some(pin), Some(meta)) = (
                get::<bool>(r.get(3 * n)),
                get::<Option<String>>(r.get(3 * n + 1)),
                get::<Option<String>>(r.get(3 * n + 2)),
            ) else {
                continue; // gone meanwhile, or a wrong-typed key (reported by itself)
            };
            if room_names(pin.as_deref(), meta.as_deref(), inst) {
                continue;
            }
            let detail = match (pin, meta) {
                (Some(p), _) => format!("room {room}: its pin names {p}, not {inst}"),
                (None, Some(m)) => {
                    format!("room {room}: no pin, its metadata names {m}, not {inst}")
                }
                (None, None) => format!("room {room}: no pin and no metadata"),
            };
            let known = seen
                .rooms
                .get(room)
                .map(|rs| rs.records.iter().cloned().collect())
                .unwrap_or_default();
            not_named.push(NotNamed {
                entry,
                detail,
                known,
            });
        }
        if not_named.is_empty() {
            return Ok(());
        }
        let questions: Vec<RecordsOf<'_>> = not_named
            .iter()
            .map(|e| RecordsOf {
                room: &e.entry.2,
                instance: e.entry.0,
                known: &e.known,
            })
            .collect();
        let named = records_naming(self.ks, self.con, &questions)?;
        for (e, named) in not_named.into_iter().zip(named) {
            if named {
                continue; // the entry reaches a record of its instance: right as it is
            }
            let (inst, key, room) = e.entry;
            let detail = format!("{}, and no peer record in it names {inst}", e.detail);
            let fix = Fix::Unindex {
                set: key.clone(),
                member: room.clone(),
                verify: Verify::Room {
                    room: room.clone(),
                    instance: (*inst).clone(),
                    records: e.known,
                },
            };
            self.dangling_room(key, room, detail, Some(fix));
        }
        Ok(())
    }

    fn dangling_room(&mut self, key: &str, room: &str, detail: String, fix: Option<Fix>) {
        self.found(ProblemKind::DanglingRoomIndex, key, room, detail, fix);
    }
}

/// For each question: whether a peer record in its room names its instance, reading the
/// records it knows of and every member of the room's `peers` set now (`SSCAN`, paged), each
/// record's `instance` field (`HGET`, pipelined by [`BATCH`]). A `peers` set or record that
/// cannot be read (another type) counts as naming it: the answer must never let a removal
/// leave a record of the instance out of its room index.
///
/// # Errors
/// [`Error::Redis`] when a round trip fails.
pub(super) fn records_naming(
    ks: &KeySpace,
    con: &mut Conn,
    questions: &[RecordsOf<'_>],
) -> Result<Vec<bool>> {
    let mut named = vec![false; questions.len()];
    let mut peers: Vec<BTreeSet<String>> = questions
        .iter()
        .map(|q| q.known.iter().cloned().collect())
        .collect();
    let mut pager = Pager::new(
        questions
            .iter()
            .map(|q| ScanOf::set(ks.room(q.room).peers))
            .collect(),
    );
    while let Some(pages) = pager.next(con).map_err(|e| Error::redis(OP, e))? {
        for (n, page) in pages {
            match page.and_then(items_as::<Vec<Vec<u8>>>) {
                Ok(items) => {
                    // A member that is not UTF-8 is no peer id this crate writes; its record
                    // key could not be named either (reported by the room's own check).
                    peers[n].extend(items.into_iter().filter_map(|m| String::from_utf8(m).ok()))
                }
                Err(_) => named[n] = true,
            }
        }
    }
    let asks: Vec<(usize, String)> = peers
        .iter()
        .enumerate()
        .filter(|(n, _)| !named[*n])
        .flat_map(|(n, ps)| ps.iter().map(move |p| (n, ks.peer(questions[n].room, p))))
        .collect();
    for chunk in asks.chunks(BATCH) {
        let mut pipe = redis::pipe();
        for (_, rec) in chunk {
            pipe.hget(rec, "instance");
        }
        let r = exec(con, &mut pipe)?;
        for (n, (q, _)) in chunk.iter().enumerate() {
            match r.get(n).map(|r| r.as_ref()) {
                Some(Ok(_)) => {
                    if get::<Option<String>>(r.get(n)).flatten().as_deref()
                        == Some(questions[*q].instance)
                    {
                        named[*q] = true;
                    }
                }
                _ => named[*q] = true, // unreadable: keep the entry
            }
        }
    }
    Ok(named)
}
