//! The operations a host calls, behind one small trait so [`crate::Node`] has no
//! `if redis { .. } else { .. }` branches: [`crate::memory`] keeps everything in memory,
//! [`crate::rooms`] and [`crate::peers`] keep it in Redis. Ids reaching a store are validated.

use std::collections::BTreeMap;

use parking_lot::Mutex;

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

/// One upsert's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Upserted {
    pub generation: u64,
    /// Another peer of the same guest that this upsert replaced (deleted), if any.
    pub superseded: Option<String>,
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

/// What this node holds: the rooms it pinned and the peers it upserted (callers' ids). The
/// heartbeat refreshes these pins; counts come from here.
#[derive(Debug, Default)]
pub(crate) struct Local {
    rooms: Mutex<BTreeMap<String, ()>>,
    peers: Mutex<BTreeMap<(String, String), LocalPeer>>,
}

impl Local {
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
        std::mem::take(&mut *self.rooms.lock())
            .into_keys()
            .collect()
    }
}
