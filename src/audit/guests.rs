//! `P:room:{R}:guests`: every entry `g -> p` must point at a record of `p` that names guest
//! `g` (`dangling_guest`).

use super::findings::Fix;
use super::read::{get, pager, text, Scan};
use super::room_peers::rooms_with;
use super::snapshot::RoomSeen;
use super::{ProblemKind, BATCH};
use crate::error::Result;
use crate::scan::Scan as ScanOf;

/// An entry to check: the room, its `guests` key, the guest, the peer it points at.
type Entry<'s> = (&'s String, String, String, String);

impl Scan<'_> {
    /// Every `guests` entry `g -> p` must point at a record of `p` that names guest `g`.
    pub(super) fn guests(&mut self, rooms: &[(&String, &RoomSeen)]) -> Result<()> {
        let with = rooms_with(rooms, |s| s.guests);
        let keys = with.iter().map(|r| self.ks.room(r).guests).collect();
        let mut pager = pager(keys, ScanOf::hash);
        while let Some(pages) = self.pages(&mut pager)? {
            let mut check = Vec::new();
            for (n, items) in pages {
                let mut items = items.unwrap_or_default().into_iter();
                while let (Some(g), Some(p)) = (items.next(), items.next()) {
                    let key = pager.scan(n).key().to_owned();
                    match (text(g), text(p)) {
                        (Ok(g), Ok(p)) => check.push((with[n], key, g, p)),
                        (g, _) => {
                            let g = g.unwrap_or_else(|e| e);
                            let detail = format!("guest {g:?}: field or value is not UTF-8");
                            self.malformed(&key, &g, detail);
                        }
                    }
                }
            }
            for chunk in check.chunks(BATCH) {
                self.check_guests(chunk)?;
            }
        }
        Ok(())
    }

    /// The pointer is read again first, then the record.
    fn check_guests(&mut self, chunk: &[Entry<'_>]) -> Result<()> {
        let mut pipe = redis::pipe();
        for (room, key, guest, peer) in chunk {
            let rec = self.ks.peer(room, peer);
            pipe.hget(key, guest).exists(&rec).hget(&rec, "guest");
        }
        let r = self.exec(&mut pipe)?;
        for (n, (room, key, guest, peer)) in chunk.iter().enumerate() {
            let (Some(Some(now)), Some(exists), Some(named)) = (
                get::<Option<String>>(r.get(3 * n)),
                get::<bool>(r.get(3 * n + 1)),
                get::<Option<String>>(r.get(3 * n + 2)),
            ) else {
                continue;
            };
            if now != *peer {
                continue; // re-pointed meanwhile
            }
            let detail = match (exists, named) {
                (false, _) => format!("guest {guest} -> peer {peer:?}, which has no record"),
                (true, Some(g)) if g == *guest => continue,
                (true, named) => format!(
                    "guest {guest} -> peer {peer:?}, whose record names guest {:?}",
                    named.unwrap_or_default()
                ),
            };
            let fix = Fix::RoomEntry {
                room: (*room).clone(),
                peer: peer.clone(),
                guest: guest.clone(),
                mode: "drop_guest",
            };
            self.found(ProblemKind::DanglingGuest, key, guest, detail, Some(fix));
        }
        Ok(())
    }
}
