//! What one scan finds before it becomes a [`Problem`]: a finding with its identity across
//! the two scans and, when it is safe to repair, how ([`Fix`]).

use std::collections::BTreeMap;

use super::{Problem, ProblemKind};

/// A finding's identity across the two scans: kind, key and the item (member, field, ...).
pub(super) type FindingId = (ProblemKind, String, String);

/// Every finding of one scan, keyed (and so sorted) by identity.
pub(super) type Findings = BTreeMap<FindingId, Finding>;

#[derive(Debug, Clone)]
pub(super) struct Finding {
    pub(super) kind: ProblemKind,
    pub(super) key: String,
    pub(super) detail: String,
    pub(super) fix: Option<Fix>,
}

impl Finding {
    /// The finding as an unrepaired [`Problem`].
    pub(super) fn into_problem(self) -> Problem {
        Problem {
            kind: self.kind,
            key: self.key,
            detail: self.detail,
            repaired: false,
        }
    }
}

/// How one finding is repaired (ids in wire form).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Fix {
    /// `SADD set member`: an index entry added before/after its record is always safe.
    Add { set: String, member: String },
    /// `audit_room_index.lua` in mode `mode`.
    RoomEntry {
        room: String,
        peer: String,
        guest: String,
        mode: &'static str,
    },
    /// `SREM set member`, then, after the settle delay, put back if `verify` now holds.
    Unindex {
        set: String,
        member: String,
        verify: Verify,
    },
    /// `audit_delete_room.lua` with the metadata seen (owner CAS) and the records found.
    DeleteRoom {
        room: String,
        meta_owner: String,
        pinned_ms: String,
        records: Vec<String>,
    },
    /// `audit_enqueue.lua`.
    Enqueue { instance: String },
}

/// What makes a removed control-plane index entry valid again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verify {
    /// The room's pin (or, with no pin, its metadata) names `instance`.
    Room { room: String, instance: String },
    /// The peer record names `instance`.
    Peer {
        room: String,
        peer: String,
        instance: String,
    },
    /// The member can never be valid (not an id).
    Never,
}

/// Records a finding of `kind` at `key` about `item` (the first one seen of an identity
/// wins).
pub(super) fn add(
    out: &mut Findings,
    kind: ProblemKind,
    key: &str,
    item: &str,
    detail: String,
    fix: Option<Fix>,
) {
    out.entry((kind, key.to_owned(), item.to_owned()))
        .or_insert(Finding {
            kind,
            key: key.to_owned(),
            detail,
            fix,
        });
}

/// The two settle-separated scans' findings seen by both; the second scan's data (CAS
/// values) is the fresher.
pub(super) fn in_both(first: &Findings, second: Findings) -> Findings {
    second
        .into_iter()
        .filter(|(id, _)| first.contains_key(id))
        .collect()
}
