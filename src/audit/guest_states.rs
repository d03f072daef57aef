//! `P:room:{R}:guest-state`: every field must belong to a guest with a pointer
//! (`orphaned_guest_state`, report only: guest state is the host's data).

use super::read::{get, pager, text, Scan};
use super::room_peers::rooms_with;
use super::snapshot::RoomSeen;
use super::{ProblemKind, BATCH};
use crate::error::Result;
use crate::scan::Scan as ScanOf;

/// A field to check: the room, its `guest-state` key, the guest.
type Entry<'s> = (&'s String, String, String);

impl Scan<'_> {
    /// Every `guest-state` field must belong to a guest with a pointer (report only).
    pub(super) fn guest_states(&mut self, rooms: &[(&String, &RoomSeen)]) -> Result<()> {
        let with = rooms_with(rooms, |s| s.guest_state);
        let keys = with.iter().map(|r| self.ks.room(r).guest_state).collect();
        let mut pager = pager(keys, ScanOf::hash);
        while let Some(pages) = self.pages(&mut pager)? {
            let mut check = Vec::new();
            for (n, items) in pages {
                for g in items.unwrap_or_default().into_iter().step_by(2) {
                    let g = text(g).unwrap_or_else(|e| e);
                    check.push((with[n], pager.scan(n).key().to_owned(), g));
                }
            }
            for chunk in check.chunks(BATCH) {
                self.check_guest_states(chunk)?;
            }
        }
        Ok(())
    }

    /// The field is read again first, then the pointer.
    fn check_guest_states(&mut self, chunk: &[Entry<'_>]) -> Result<()> {
        let mut pipe = redis::pipe();
        for (room, key, guest) in chunk {
            pipe.hexists(key, guest)
                .hexists(self.ks.room(room).guests, guest);
        }
        let r = self.exec(&mut pipe)?;
        for (n, (room, key, guest)) in chunk.iter().enumerate() {
            if get::<bool>(r.get(2 * n)) != Some(true)
                || get::<bool>(r.get(2 * n + 1)) != Some(false)
            {
                continue;
            }
            let detail = format!(
                "state of guest {guest:?} in room {room}, which has no pointer; left alone (host data)"
            );
            self.found(ProblemKind::OrphanedGuestState, key, guest, detail, None);
        }
        Ok(())
    }
}
