//! Memory-only mode: with no Redis URL the library runs single-instance. Pins and peers live
//! in memory with the same rules as on Redis (generations, guest reconnects); there is no
//! heartbeat, lease or reaper (docs/DESIGN.md "What it does", 8). `Node` holds either this or the
//! Redis store (`store::RedisStore`), as one enum.

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::keys::Id;
use crate::peers::Upserted;
use crate::rooms::PinOutcome;

#[derive(Debug, Default)]
struct Room {
    /// peer -> (guest, generation)
    peers: HashMap<String, (Option<String>, u64)>,
    /// guest -> peer
    guests: HashMap<String, String>,
}

/// The in-memory store.
#[derive(Debug, Default)]
pub(crate) struct MemoryStore {
    me: String,
    rooms: Mutex<HashMap<String, Room>>,
    /// Generations come from one counter for the whole store, so they keep growing across
    /// lives of a room (closed, then pinned again): a late remove never matches a new record.
    seq: std::sync::atomic::AtomicU64,
}

impl MemoryStore {
    pub(crate) fn new(instance: &str) -> Self {
        MemoryStore {
            me: instance.to_owned(),
            ..MemoryStore::default()
        }
    }
}

/// The host calls, with the same rules as on Redis (`store::RedisStore`).
impl MemoryStore {
    pub(crate) fn pin_room(&self, room: &Id) -> Result<PinOutcome> {
        let mut rooms = self.rooms.lock();
        if rooms.contains_key(&room.raw) {
            return Ok(PinOutcome::AlreadyOurs);
        }
        rooms.insert(room.raw.clone(), Room::default());
        Ok(PinOutcome::Pinned)
    }

    pub(crate) fn close_room(&self, room: &Id) -> Result<()> {
        match self.rooms.lock().remove(&room.raw) {
            Some(_) => Ok(()),
            None => Err(Error::NotOwner {
                room: room.raw.clone(),
                owner: None,
            }),
        }
    }

    pub(crate) fn room_owner(&self, room: &Id) -> Result<Option<String>> {
        Ok(self
            .rooms
            .lock()
            .contains_key(&room.raw)
            .then(|| self.me.clone()))
    }

    pub(crate) fn upsert_peer(
        &self,
        room: &Id,
        peer: &Id,
        guest: Option<&Id>,
        _fields: &[(&str, &str)],
    ) -> Result<Upserted> {
        let mut rooms = self.rooms.lock();
        let r = rooms.get_mut(&room.raw).ok_or_else(|| Error::NotOwner {
            room: room.raw.clone(),
            owner: None,
        })?;
        let guest = guest.map(|g| g.raw.clone());
        if let Some((Some(old_guest), _)) = r.peers.get(&peer.raw) {
            if Some(old_guest) != guest.as_ref() && r.guests.get(old_guest) == Some(&peer.raw) {
                let old_guest = old_guest.clone();
                r.guests.remove(&old_guest);
            }
        }
        let mut superseded = None;
        if let Some(g) = &guest {
            if let Some(cur) = r.guests.insert(g.clone(), peer.raw.clone()) {
                if cur != peer.raw {
                    r.peers.remove(&cur);
                    superseded = Some(cur);
                }
            }
        }
        let generation = self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        r.peers.insert(peer.raw.clone(), (guest, generation));
        Ok(Upserted {
            generation,
            replaced: superseded,
        })
    }

    pub(crate) fn remove_peer(&self, room: &Id, peer: &Id, generation: u64) -> Result<bool> {
        let mut rooms = self.rooms.lock();
        let Some(r) = rooms.get_mut(&room.raw) else {
            return Ok(false);
        };
        match r.peers.get(&peer.raw) {
            Some((guest, g)) if *g == generation => {
                if let Some(guest) = guest.clone() {
                    if r.guests.get(&guest) == Some(&peer.raw) {
                        r.guests.remove(&guest);
                    }
                }
                r.peers.remove(&peer.raw);
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}
