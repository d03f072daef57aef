//! `P:room:{R}:peers`: every member must have a record (`dangling_room_peer`).

use super::findings::Fix;
use super::read::{get, pager, text, Scan};
use super::snapshot::RoomSeen;
use super::{ProblemKind, BATCH};
use crate::error::Result;
use crate::scan::Scan as ScanOf;

/// A member to check: the room, its `peers` key, the peer.
type Entry<'s> = (&'s String, String, String);

impl Scan<'_> {
    /// Every member of a room's `peers` set must have a record.
    pub(super) fn room_peers(&mut self, rooms: &[(&String, &RoomSeen)]) -> Result<()> {
        let with = rooms_with(rooms, |s| s.peers);
        let keys = with.iter().map(|r| self.ks.room(r).peers).collect();
        let mut pager = pager(keys, ScanOf::set);
        while let Some(pages) = self.pages(&mut pager)? {
            let mut check = Vec::new();
            for (n, items) in pages {
                let key = pager.scan(n).key().to_owned();
                for m in items.unwrap_or_default() {
                    match text(m) {
                        Ok(p) => check.push((with[n], key.clone(), p)),
                        Err(lossy) => {
                            self.malformed(&key, &lossy, format!("member {lossy:?} is not UTF-8"))
                        }
                    }
                }
            }
            for chunk in check.chunks(BATCH) {
                self.check_room_peers(chunk)?;
            }
        }
        Ok(())
    }

    /// The member is read again first, then the record.
    fn check_room_peers(&mut self, chunk: &[Entry<'_>]) -> Result<()> {
        let mut pipe = redis::pipe();
        for (room, key, peer) in chunk {
            pipe.sismember(key, peer).exists(self.ks.peer(room, peer));
        }
        let r = self.exec(&mut pipe)?;
        for (n, (room, key, peer)) in chunk.iter().enumerate() {
            if get::<bool>(r.get(2 * n)) != Some(true)
                || get::<bool>(r.get(2 * n + 1)) != Some(false)
            {
                continue;
            }
            let detail = format!("peer {peer:?} of room {room} has no record");
            let fix = Fix::RoomEntry {
                room: (*room).clone(),
                peer: peer.clone(),
                guest: String::new(),
                mode: "drop_peer",
            };
            self.found(ProblemKind::DanglingRoomPeer, key, peer, detail, Some(fix));
        }
        Ok(())
    }
}

/// The rooms having the key `flag` says (`peers`, `guests`, ...).
pub(super) fn rooms_with<'s>(
    rooms: &[(&'s String, &RoomSeen)],
    flag: fn(&RoomSeen) -> bool,
) -> Vec<&'s String> {
    rooms
        .iter()
        .filter(|(_, s)| flag(s))
        .map(|(r, _)| *r)
        .collect()
}
