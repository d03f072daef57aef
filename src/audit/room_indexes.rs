//! `P:{ctl}:instance:<I>:rooms`: every member must be a room whose pin (or, with no pin,
//! metadata) names I (`dangling_room_index`).

use super::findings::{Fix, Verify};
use super::read::{get, is_id, pager, room_names, text, Scan};
use super::snapshot::Seen;
use super::{ProblemKind, BATCH};
use crate::error::Result;
use crate::scan::Scan as ScanOf;

/// A room index entry to check: the instance, its room index key, the room.
type Entry<'s> = (&'s String, String, String);

impl Scan<'_> {
    /// Every `P:{ctl}:instance:<I>:rooms` member must be a room whose pin (or, with no pin,
    /// metadata) names I.
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
                self.check_room_entries(chunk)?;
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

    /// The entry is read again first, then the room: an entry still there whose room (read
    /// after it) does not name the instance (not a pin in flight).
    fn check_room_entries(&mut self, chunk: &[Entry<'_>]) -> Result<()> {
        let mut pipe = redis::pipe();
        for (_, key, room) in chunk {
            let rk = self.ks.room(room);
            pipe.sismember(key, room)
                .get(&rk.owner)
                .hget(&rk.meta, "owner");
        }
        let r = self.exec(&mut pipe)?;
        for (n, (inst, key, room)) in chunk.iter().enumerate() {
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
            let fix = Fix::Unindex {
                set: key.clone(),
                member: room.clone(),
                verify: Verify::Room {
                    room: room.clone(),
                    instance: (*inst).clone(),
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
