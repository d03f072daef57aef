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
    /// What a finding that needs two scans to hold must show in both ([`in_both`]).
    pub(super) evidence: Option<Evidence>,
}

/// A `forgotten_room`'s evidence in one scan: when the scan read the room's owner and what
/// it found. The finding holds only if the second scan is at least `min_gap_ms` after the
/// first (the owner's heartbeat interval plus command timeout: a live owner re-pins a lapsed
/// room within that) and the owner heartbeated after the first scan read it (it was alive
/// and ticking the whole time, so its ticks had their chance to re-pin).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Evidence {
    /// Server ms at which the owner was read.
    pub(super) scan_ms: i64,
    /// The owner's last heartbeat (its score), server ms.
    pub(super) owner_heartbeat_ms: i64,
    /// The owner's heartbeat interval plus command timeout (its record's, else the defaults').
    pub(super) min_gap_ms: i64,
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
    /// `SREM set member` unless `verify` holds right before, then, after the settle delay,
    /// put back if `verify` holds again.
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

/// What makes a control-plane index entry valid: checked right before it is removed (a valid
/// one stays) and again after the settle delay (a valid one is put back).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verify {
    /// Room index entry `room` of `instance`: the room's pin (or, with no pin, its metadata)
    /// names `instance`, or a peer record in the room names it (one of `records`, which the
    /// scan found, or of the room's `peers` set when checked).
    Room {
        room: String,
        instance: String,
        records: Vec<String>,
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
            evidence: None,
        });
}

/// Records a finding that holds only if both scans show it ([`Evidence`]).
pub(super) fn add_with_evidence(
    out: &mut Findings,
    kind: ProblemKind,
    key: &str,
    detail: String,
    fix: Option<Fix>,
    evidence: Evidence,
) {
    out.entry((kind, key.to_owned(), String::new()))
        .or_insert(Finding {
            kind,
            key: key.to_owned(),
            detail,
            fix,
            evidence: Some(evidence),
        });
}

/// The two settle-separated scans' findings seen by both; the second scan's data (CAS
/// values) is the fresher. A finding with [`Evidence`] also needs the same repair in both
/// (same CAS values), the scans far enough apart and its owner heartbeating in between.
pub(super) fn in_both(first: &Findings, second: Findings) -> Findings {
    second
        .into_iter()
        .filter(|(id, f)| match (first.get(id), f.evidence) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(earlier), Some(now)) => earlier.evidence.is_some_and(|then| {
                earlier.fix == f.fix
                    && now.owner_heartbeat_ms > then.scan_ms
                    && now.scan_ms - then.scan_ms >= now.min_gap_ms
            }),
        })
        .collect()
}

/// Drops what one scan cannot tell (findings that need [`Evidence`] from two).
pub(super) fn single_scan(found: Findings) -> Findings {
    found
        .into_iter()
        .filter(|(_, f)| f.evidence.is_none())
        .collect()
}
