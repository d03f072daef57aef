//! The operations a host calls, behind one small trait so [`crate::Node`] has no
//! `if redis { .. } else { .. }` branches: [`crate::memory`] keeps everything in memory,
//! [`crate::rooms`] and [`crate::peers`] keep it in Redis. Ids reaching a store are validated.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};

use parking_lot::{Mutex, MutexGuard};

use crate::error::Result;
use crate::keys::Id;

/// What [`crate::Node::pin_room`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PinOutcome {
    /// The room was free; this instance owns it now.
    Pinned,
    /// This instance already owned it (the pin was refreshed).
    AlreadyOurs,
    /// The previous owner's pin had expired or its heartbeat was gone; this instance took the
    /// room over. The previous owner's peers stay until it is reaped or re-homes them.
    TookOver {
        /// The previous owner.
        previous: String,
    },
    /// Another live instance owns the room; nothing was written. Send the client there.
    Held {
        /// The owner.
        owner: String,
    },
}

impl PinOutcome {
    /// True when this instance owns the room after the call.
    pub fn is_owned(&self) -> bool {
        !matches!(self, PinOutcome::Held { .. })
    }
}

/// Peer fields reserved by the library; a host field with one of these names is refused.
pub const RESERVED_PEER_FIELDS: [&str; 4] = ["instance", "guest", "generation", "updated_ms"];

/// The most host fields one peer record may carry.
pub const MAX_PEER_FIELDS: usize = 64;

/// What [`crate::Node::upsert_peer_detailed`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Upserted {
    /// The record's generation: pass it to [`crate::Node::remove_peer`].
    pub generation: u64,
    /// Another peer of the same guest that this upsert replaced (its record was deleted): a
    /// quick reconnect with a new peer id. Tear its transport down.
    pub replaced: Option<String>,
}

/// Host-facing operations, implemented in memory and on Redis. Ids are the callers' ids,
/// already validated.
pub(crate) trait Store: Send + Sync {
    fn pin_room(&self, room: &Id) -> Result<PinOutcome>;
    /// Deletes the room if this instance owns it; [`crate::Error::NotOwner`] otherwise.
    fn close_room(&self, room: &Id) -> Result<()>;
    fn room_owner(&self, room: &Id) -> Result<Option<String>>;
    fn upsert_peer(
        &self,
        room: &Id,
        peer: &Id,
        guest: Option<&Id>,
        fields: &[(&str, &str)],
    ) -> Result<Upserted>;
    fn remove_peer(&self, room: &Id, peer: &Id, generation: u64) -> Result<bool>;
}

/// A peer this node upserted, as the node remembers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LocalPeer {
    pub guest: Option<String>,
    pub fields: Vec<(String, String)>,
    pub generation: u64,
}

/// Stripes of the per-room lock.
const ROOM_LOCKS: usize = 64;

/// What this node holds: the rooms it pinned and the peers it upserted (callers' ids). The
/// heartbeat refreshes these pins; counts come from here.
///
/// Operations of this node on one room (pin, close, upsert, remove, the heartbeat's handling of
/// a lost room) run under that room's lock ([`Local::lock_room`]): each is several round trips
/// across two hash slots (index and record), and two of them interleaving on one node could
/// leave a record that no index reaches.
#[derive(Debug)]
pub(crate) struct Local {
    rooms: Mutex<BTreeMap<String, ()>>,
    peers: Mutex<BTreeMap<(String, String), LocalPeer>>,
    /// Rooms whose pin or close ended without a known outcome; the heartbeat settles them
    /// (releases the pin if it is ours and the host does not hold the room).
    uncertain: Mutex<BTreeSet<String>>,
    /// Peers whose remove ended without a known outcome, with the generation to remove; the
    /// heartbeat sends the remove again (it is a no-op if it had run).
    uncertain_peers: Mutex<BTreeMap<(String, String), u64>>,
    locks: Vec<Mutex<()>>,
}

impl Default for Local {
    fn default() -> Self {
        Local {
            rooms: Mutex::default(),
            peers: Mutex::default(),
            uncertain: Mutex::default(),
            uncertain_peers: Mutex::default(),
            locks: (0..ROOM_LOCKS).map(|_| Mutex::new(())).collect(),
        }
    }
}

impl Local {
    /// The lock of `room` (striped: unrelated rooms may share a stripe).
    pub(crate) fn lock_room(&self, room: &str) -> MutexGuard<'_, ()> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        room.hash(&mut h);
        self.locks[(h.finish() as usize) % ROOM_LOCKS].lock()
    }

    pub(crate) fn mark_uncertain(&self, room: &str) {
        self.uncertain.lock().insert(room.to_owned());
    }

    pub(crate) fn uncertain(&self) -> Vec<String> {
        self.uncertain.lock().iter().cloned().collect()
    }

    pub(crate) fn settled(&self, room: &str) {
        self.uncertain.lock().remove(room);
    }

    pub(crate) fn mark_uncertain_peer(&self, room: &str, peer: &str, generation: u64) {
        self.uncertain_peers
            .lock()
            .insert((room.to_owned(), peer.to_owned()), generation);
    }

    /// Takes the peers whose remove must be sent again.
    pub(crate) fn take_uncertain_peers(&self) -> Vec<(String, String, u64)> {
        std::mem::take(&mut *self.uncertain_peers.lock())
            .into_iter()
            .map(|((r, p), g)| (r, p, g))
            .collect()
    }

    /// The generation this node last got for a peer, if it holds it.
    pub(crate) fn peer_generation(&self, room: &str, peer: &str) -> Option<u64> {
        self.peers
            .lock()
            .get(&(room.to_owned(), peer.to_owned()))
            .map(|p| p.generation)
    }

    pub(crate) fn add_room(&self, room: &str) {
        self.rooms.lock().insert(room.to_owned(), ());
    }

    /// Forgets a room and every peer in it.
    pub(crate) fn remove_room(&self, room: &str) {
        self.rooms.lock().remove(room);
        self.peers.lock().retain(|(r, _), _| r != room);
    }

    pub(crate) fn has_room(&self, room: &str) -> bool {
        self.rooms.lock().contains_key(room)
    }

    pub(crate) fn rooms(&self) -> Vec<String> {
        self.rooms.lock().keys().cloned().collect()
    }

    pub(crate) fn room_count(&self) -> usize {
        self.rooms.lock().len()
    }

    pub(crate) fn peer_count(&self) -> usize {
        self.peers.lock().len()
    }

    pub(crate) fn put_peer(&self, room: &str, peer: &str, p: LocalPeer) {
        self.peers
            .lock()
            .insert((room.to_owned(), peer.to_owned()), p);
    }

    /// Every peer, as `(room, peer, record)`.
    pub(crate) fn peers(&self) -> Vec<(String, String, LocalPeer)> {
        self.peers
            .lock()
            .iter()
            .map(|((r, p), l)| (r.clone(), p.clone(), l.clone()))
            .collect()
    }

    pub(crate) fn remove_peer(&self, room: &str, peer: &str) {
        self.peers
            .lock()
            .remove(&(room.to_owned(), peer.to_owned()));
    }

    /// Forgets everything (after this node was reaped).
    pub(crate) fn clear(&self) -> Vec<String> {
        self.peers.lock().clear();
        self.uncertain.lock().clear();
        self.uncertain_peers.lock().clear();
        std::mem::take(&mut *self.rooms.lock())
            .into_keys()
            .collect()
    }
}
