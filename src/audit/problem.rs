//! What the audit reports: [`ProblemKind`] (stable names) and [`Problem`].

use std::fmt;

/// What kind of problem the audit found. The names ([`ProblemKind::as_str`]) are stable:
/// operators' scripts match on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum ProblemKind {
    /// `orphaned_room`: room keys with no pin whose metadata names no registered instance (or
    /// that have no metadata at all). Invariant 2. Repaired: deleted.
    OrphanedRoom,
    /// `dangling_room_index`: a room in `P:{ctl}:instance:<I>:rooms` whose pin (or, with no
    /// pin, metadata) does not name I and that holds no peer record naming I (such a record
    /// keeps the entry right: the room index must reach it). Invariants 2, 4. Repaired:
    /// removed, after the same check once more; put back if it holds again after the settle
    /// delay.
    DanglingRoomIndex,
    /// `dangling_room_peer`: a member of a room's `peers` set without a record. Invariant 4.
    /// Repaired: removed.
    DanglingRoomPeer,
    /// `dangling_guest`: a `guests` entry pointing at a missing peer or at a peer whose record
    /// names another guest. Invariant 4. Repaired: removed with its guest state.
    DanglingGuest,
    /// `unindexed_peer`: a peer record missing from its room's `peers` set or from its guest's
    /// pointer, or whose room is in neither its instance's room index nor that instance's
    /// moved room index (so the reaper could never reach it). Invariants 2, 4. Repaired: the
    /// entry added, the room into the live room index (unless the guest points at another
    /// peer: report only).
    UnindexedPeer,
    /// `unindexed_room`: a room whose owner (pin, else metadata) does not list it in its room
    /// index, so the reaper could never reach it. Invariant 2. Repaired: added.
    UnindexedRoom,
    /// `forgotten_room`: a room with no pin in two scans further apart than its metadata
    /// owner's heartbeat interval plus command timeout, while that owner is alive and
    /// heartbeated in between: the owner, which re-pins every room it holds each interval,
    /// no longer holds it (kept until the owner dies otherwise). Invariant 2. Repaired:
    /// deleted with the owner CAS (still no pin, same metadata owner and `pinned_ms`); never
    /// added to the live owner's indexes.
    ForgottenRoom,
    /// `unregistered_instance`: an instance with a room index (live or moved aside by a reap),
    /// an info hash or a heartbeat key but no entry in the heartbeat sorted set ("sets but no
    /// heartbeat"). Invariant 2. Repaired when it has no heartbeat key: handed to the reaper
    /// (score 0), or, with empty room indexes, its info hash deleted.
    UnregisteredInstance,
    /// `orphaned_guest_state`: a `guest-state` field of a guest that has no pointer. Report
    /// only: guest state is the host's data.
    OrphanedGuestState,
    /// `wrong_type`: a key of the schema holding another Redis type. Report only.
    WrongType,
    /// `malformed_lease`: the lease value is not a wire-form instance id, or the lease has no
    /// TTL. Report only (`lease_acquire.lua` replaces a lease without TTL by itself).
    MalformedLease,
    /// `malformed_peer`: a peer record without `instance` or `generation`, or with values
    /// that are not an instance id / a number. Report only.
    MalformedPeer,
    /// `malformed_value`: another value this crate never writes (an epoch that is not a
    /// number, a heartbeat key or pin without TTL, an owner or sorted-set member that is not
    /// an id, an index member that is not UTF-8). Report only.
    MalformedValue,
    /// `unknown_key`: a key under the prefix that the schema does not know, or whose ids are
    /// not in wire form; also a key schema version 1 peer index left over
    /// (`P:{ctl}:instance:<I>:peers`, `...:reaping-peers`: `sfu-redis migrate --apply` folds
    /// it into the room index). Report only.
    UnknownKey,
}

impl ProblemKind {
    /// Every kind, in report order.
    pub const ALL: [ProblemKind; 14] = [
        ProblemKind::OrphanedRoom,
        ProblemKind::DanglingRoomIndex,
        ProblemKind::DanglingRoomPeer,
        ProblemKind::DanglingGuest,
        ProblemKind::UnindexedPeer,
        ProblemKind::UnindexedRoom,
        ProblemKind::ForgottenRoom,
        ProblemKind::UnregisteredInstance,
        ProblemKind::OrphanedGuestState,
        ProblemKind::WrongType,
        ProblemKind::MalformedLease,
        ProblemKind::MalformedPeer,
        ProblemKind::MalformedValue,
        ProblemKind::UnknownKey,
    ];

    /// The stable snake_case name (`"orphaned_room"`, ...), as in the JSON report.
    pub fn as_str(self) -> &'static str {
        match self {
            ProblemKind::OrphanedRoom => "orphaned_room",
            ProblemKind::DanglingRoomIndex => "dangling_room_index",
            ProblemKind::DanglingRoomPeer => "dangling_room_peer",
            ProblemKind::DanglingGuest => "dangling_guest",
            ProblemKind::UnindexedPeer => "unindexed_peer",
            ProblemKind::UnindexedRoom => "unindexed_room",
            ProblemKind::ForgottenRoom => "forgotten_room",
            ProblemKind::UnregisteredInstance => "unregistered_instance",
            ProblemKind::OrphanedGuestState => "orphaned_guest_state",
            ProblemKind::WrongType => "wrong_type",
            ProblemKind::MalformedLease => "malformed_lease",
            ProblemKind::MalformedPeer => "malformed_peer",
            ProblemKind::MalformedValue => "malformed_value",
            ProblemKind::UnknownKey => "unknown_key",
        }
    }

    /// Whether `--repair` may fix problems of this kind (some single problems of a repairable
    /// kind still cannot be, e.g. a room with a wrong-typed key).
    pub fn is_repairable(self) -> bool {
        !matches!(
            self,
            ProblemKind::OrphanedGuestState
                | ProblemKind::WrongType
                | ProblemKind::MalformedLease
                | ProblemKind::MalformedPeer
                | ProblemKind::MalformedValue
                | ProblemKind::UnknownKey
        )
    }
}

impl fmt::Display for ProblemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One problem found by [`audit`](super::audit) or [`scan`](super::scan).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Problem {
    /// What is wrong.
    pub kind: ProblemKind,
    /// The full Redis key it was found at (see the table in the module docs).
    pub key: String,
    /// For people: which member, field or value, and why. Ids in wire form.
    pub detail: String,
    /// `--repair` fixed it.
    pub repaired: bool,
}
