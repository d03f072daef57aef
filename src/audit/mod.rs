//! The audit (`sfu-redis fsck`): checks one prefix's keys against the data model and, on
//! request, repairs what is safe to repair while live instances keep running.
//!
//! # What is read
//!
//! Only the keys of one prefix `P`: `SCAN 0 MATCH P:* COUNT 1000` (never `KEYS`), each key
//! parsed with [`KeySpace::parse`], so another stage's or branch's keys are never listed, read
//! or touched (invariant 5; `sfu:dev:main:*` does not match `sfu:dev:main-2:...`). Sets,
//! hashes and the sorted set are read page by page with `SSCAN`/`HSCAN`/`ZSCAN` (`COUNT 1000`),
//! point look-ups are pipelined in batches of [`BATCH`], so no single command blocks Redis
//! for long. The client keeps the key names of the prefix in memory (one scan's worth).
//!
//! # What is checked ([`ProblemKind`])
//!
//! | kind | key reported | meaning | repair |
//! |---|---|---|---|
//! | `orphaned_room` | the room's `meta` (else its first key) | no pin, and the metadata names no registered instance (or there is no metadata) | room deleted (owner CAS) |
//! | `dangling_room_index` | `P:{ctl}:instance:<I>:rooms` | a room whose pin (or, with no pin, metadata) does not name I and that holds no peer record naming I | entry removed (checked again right before; put back if valid again after the settle delay) |
//! | `dangling_room_peer` | `P:room:{R}:peers` | a peer id without a record | entry removed |
//! | `dangling_guest` | `P:room:{R}:guests` | a guest pointing at a missing peer, or at a peer whose record names another guest | pointer (and its guest state) removed |
//! | `unindexed_peer` | the peer record | missing from its room's `peers` or its guest's pointer, or its room is in neither its instance's room index nor its moved room index (`...:reaping-rooms`; not checked for the alive metadata owner's records in a room with no pin: see `forgotten_room`) | entry added (the room into the instance's room index) |
//! | `unindexed_room` | the room's `meta` (else `owner`) | its owner's room index does not list it (a room with no pin whose owner is alive is never added: see `forgotten_room`) | entry added |
//! | `forgotten_room` | the room's `meta` | no pin in two scans further apart than its metadata owner's heartbeat interval plus command timeout (the owner's own record), while that owner is registered, alive and heartbeated after the first scan: a live owner re-pins every room it holds each interval, so it no longer holds this one. Needs two scans ([`scan`] and a zero settle delay never report it) | room deleted (owner CAS: still no pin, same metadata owner and `pinned_ms`), never added to the owner's indexes |
//! | `unregistered_instance` | the instance's room index (else its moved room index, else info hash, else heartbeat key) | a room index (live or moved aside), an info hash or a heartbeat key but no sorted-set entry | handed to the reaper (score 0); with empty room indexes its info hash deleted |
//! | `orphaned_guest_state` | `P:room:{R}:guest-state` | the state of a guest that has no pointer | report only (host data) |
//! | `wrong_type` | the key | a key of the schema holding another Redis type | report only |
//! | `malformed_lease` | `P:{ctl}:leader` | the lease value is not an instance id, or it has no TTL | report only |
//! | `malformed_peer` | the peer record | no `instance` or `generation` field, or unusable values | report only |
//! | `malformed_value` | the key | another value this crate would not write: an epoch that is not a number, a heartbeat key or pin without TTL, an owner or sorted-set member that is not an id | report only |
//! | `unknown_key` | the key | a key under the prefix that the schema does not know, or whose ids are not in wire form; also a key schema version 1 peer index left over (`P:{ctl}:instance:<I>:peers`, `...:reaping-peers`: `sfu-redis migrate --apply` folds it into the room index) | report only |
//!
//! The checks protect docs/DESIGN.md's invariants: 2 (a dead instance leaves nothing behind:
//! `orphaned_room`, `unregistered_instance`, the `dangling_*` kinds, and `unindexed_*`, since
//! the reaper reaches a room and the records in it only through the room index), 4 (each
//! index holds exactly what the peer records say: `dangling_*`, `unindexed_*`) and 5 (one
//! prefix only).
//!
//! Key schema version 2 (`keys::SCHEMA_VERSION`) has no per-instance peer index. Its rule,
//! which `unindexed_peer` and `dangling_room_index` check from both sides: every peer record
//! naming instance I is in a room listed in I's room index or in I's moved room index. It
//! holds because only a room's owner writes records into it, a room goes into its owner's
//! room index before its pin, and an instance removes a room it lost from its index only
//! after deleting its own records there. So a room index entry of I whose room I no longer
//! owns is right while a record of I is left in it.
//!
//! # Repair policy ([`AuditOptions::repair`])
//!
//! The data model writes an index entry before its record and deletes the record before the
//! index entry (cross-slot order), so an index entry without a record may be an operation in
//! flight. Therefore:
//!
//! 1. A problem counts only if two scans separated by [`AuditOptions::settle`] both find it
//!    (with a zero settle delay, one scan is made and nothing can be repaired). The settle
//!    delay must be longer than the command timeout, the longest a live operation keeps its
//!    two steps apart.
//! 2. Each fix re-checks its item right before it writes: atomically in a Lua script where
//!    the item lives in one hash slot (`audit_room_index.lua`, `audit_delete_room.lua`,
//!    `audit_enqueue.lua`).
//! 3. Index entries are added freely (index before record is always safe). Room index
//!    entries (control plane) that point at a room in another slot are checked once more
//!    right before their removal (the room's pin or metadata, then every record the scan
//!    found in it and every member of its `peers` set: none may name the instance), removed,
//!    then checked again after the settle delay and put back if the room or a record in it
//!    meanwhile names the instance (a pin in flight): a removal can never leave a live room or
//!    record out of its instance's room index for longer than the settle delay.
//! 4. Orphaned rooms are deleted batch by batch by `audit_delete_room.lua`, only while they
//!    still have no pin and unchanged metadata (owner CAS); records first, then the room's
//!    entry in its last owner's room index. Other instances whose records were in the room
//!    keep their entries (pointing at nothing now: their walk, their reap or the next audit
//!    settles them).
//! 5. An unregistered instance with a leftover room index and no heartbeat key gets score 0 in
//!    the sorted set ("being reaped", `audit_enqueue.lua`): the leader's reaper then reaps it
//!    with its two-phase re-check and owner-CAS scripts. The audit does not reap by itself: it
//!    holds no lease, and the reaper is the one place that knows how (new lives, takeovers,
//!    batches). Until a leader runs, `sfu-redis status` shows the instance as being reaped.
//! 6. Wrong-typed keys, malformed values, unknown keys and guest states are never repaired.
//!
//! # Layout
//!
//! One scan ([`scan`]) reads the key names first (`snapshot.rs`), then runs one check per
//! file: `control.rs` (registry, lease, epoch, heartbeat keys, unregistered instances),
//! `room_indexes.rs`, `rooms.rs` (pins, metadata, orphans, the owner's room index),
//! `room_peers.rs`, `guests.rs`, `guest_states.rs` and `records.rs`. [`audit`]
//! runs two scans, keeps what both saw, repairs (`repair.rs`, orphaned rooms in
//! `delete_room.rs`) and reports (`report.rs`).
//! Every `SCAN`/`SSCAN`/`HSCAN`/`ZSCAN` goes through the crate's one pager, [`crate::scan`].

mod control;
mod delete_room;
mod findings;
mod guest_states;
mod guests;
mod problem;
mod read;
mod records;
mod repair;
mod report;
mod room_indexes;
mod room_peers;
mod rooms;
mod snapshot;

use std::time::Duration;

use self::findings::{in_both, single_scan, Finding, Findings};
use self::read::Scan;
use self::repair::{repair, Entry};
use crate::config::Config;
use crate::conn::{Conn, Redis};
use crate::error::{Error, Result};
use crate::keys::KeySpace;

pub use self::problem::{Problem, ProblemKind};
pub use self::report::AuditReport;
pub use crate::scan::SCAN_COUNT;

/// Most look-ups per pipelined round trip ([`crate::scan::LOOKUP_BATCH`], 500).
pub const BATCH: usize = crate::scan::LOOKUP_BATCH;

/// The default settle delay between the two scans: 5 s, longer than the default command
/// timeout (2 s).
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(5);

const OP: &str = "audit";

/// How [`audit`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditOptions {
    /// Fix what is safe to fix (module docs, "Repair policy"). Needs `settle` longer than the
    /// configuration's command timeout.
    pub repair: bool,
    /// The delay between the two scans (and before re-reading removed control-plane index
    /// entries). Zero: one scan, no repair. Default [`DEFAULT_SETTLE`].
    pub settle: Duration,
}

impl Default for AuditOptions {
    fn default() -> Self {
        AuditOptions {
            repair: false,
            settle: DEFAULT_SETTLE,
        }
    }
}

/// Audits the prefix of `config` on `config`'s Redis; see the module docs for what is checked
/// and what `options.repair` fixes. Takes about `2 x options.settle` plus the scans' time
/// (`3 x settle` when control-plane index entries are removed).
///
/// # Errors
/// [`Error::InvalidConfig`] in memory-only mode (no Redis URL); [`Error::InvalidArgument`]
/// when `options.repair` is set and `options.settle` is not longer than the command timeout;
/// [`Error::Redis`] when Redis is unreachable or a call fails (a repair may then be partly
/// done; every step is safe to redo by running the audit again).
pub fn audit(config: &Config, options: &AuditOptions) -> Result<AuditReport> {
    audit_with_progress(config, options, &|_| {})
}

/// What an audit is doing, in the order an audit goes through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Phase {
    /// Listing the prefix's keys (`SCAN`, page by page): [`Progress::keys`] grows.
    Scanning,
    /// Checking the keys listed ([`Progress::keys`] is the scan's total).
    Checking,
    /// Waiting the settle delay between the two scans.
    Settling,
    /// Repairing [`Progress::problems`] problems seen in both scans.
    Repairing,
    /// Finished: [`Progress::problems`] problems found.
    Done,
}

impl Phase {
    /// `scanning`, `checking`, `settling`, `repairing` or `done`.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Scanning => "scanning",
            Phase::Checking => "checking",
            Phase::Settling => "settling",
            Phase::Repairing => "repairing",
            Phase::Done => "done",
        }
    }
}

/// Where an audit stands, given to the callback of [`audit_with_progress`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// What it is doing.
    pub phase: Phase,
    /// Which scan: 1, or 2 after the settle delay (0 before the first).
    pub scan: u32,
    /// Keys of the prefix the current scan listed so far.
    pub keys: u64,
    /// Problems found (by both scans when there are two); 0 until the scans are done.
    pub problems: u64,
}

/// [`audit`], calling `progress` on the calling thread as it goes: after each `SCAN` page
/// (about [`SCAN_COUNT`] keys) and at each change of [`Phase`]. The callback should return
/// quickly (it runs between Redis calls); it cannot stop the audit. Same errors as [`audit`].
pub fn audit_with_progress(
    config: &Config,
    options: &AuditOptions,
    progress: &dyn Fn(&Progress),
) -> Result<AuditReport> {
    if config.redis_url().is_none() {
        return Err(Error::config(
            "redis_url",
            "the audit needs a Redis URL (set REDIS_URL)",
        ));
    }
    let timeout = config.timings().command_timeout;
    check_settle(options, timeout)?;
    let redis = Redis::from_config(config)?;
    let ks = config.keys();
    let mut con = redis.connect()?;
    let first = find_reporting(ks, &mut con, 1, progress)?;
    let found = if options.settle.is_zero() {
        single_scan(first)
    } else {
        progress(&Progress {
            phase: Phase::Settling,
            scan: 1,
            keys: 0,
            problems: 0,
        });
        // A new connection after each pause: a server with an idle `timeout` may have closed
        // the old one.
        drop(con);
        std::thread::sleep(options.settle);
        con = redis.connect()?;
        in_both(&first, find_reporting(ks, &mut con, 2, progress)?)
    };
    let mut entries: Vec<Entry> = found.into_values().map(Entry::open).collect();
    let scans = if options.settle.is_zero() { 1 } else { 2 };
    if options.repair && !entries.is_empty() {
        progress(&Progress {
            phase: Phase::Repairing,
            scan: scans,
            keys: 0,
            problems: entries.len() as u64,
        });
        repair(ks, &redis, con, &mut entries, options.settle)?;
    }
    let report = AuditReport::from_entries(ks.prefix(), entries);
    progress(&Progress {
        phase: Phase::Done,
        scan: scans,
        keys: 0,
        problems: report.problems.len() as u64,
    });
    Ok(report)
}

/// A repair needs a settle delay longer than the command timeout.
fn check_settle(options: &AuditOptions, timeout: Duration) -> Result<()> {
    if options.repair && options.settle <= timeout {
        return Err(Error::InvalidArgument {
            what: "settle delay",
            reason: format!(
                "{} ms must be longer than the command timeout ({} ms) to repair safely",
                options.settle.as_millis(),
                timeout.as_millis()
            ),
        });
    }
    Ok(())
}

/// Runs ONE consistency scan of `keys`' prefix on `con` and returns every problem it found,
/// sorted by kind and key (then member or field), none repaired: the checks of the module
/// docs' table, with the same kinds, keys and details as [`audit`] reports.
///
/// Unlike [`audit`], a single scan cannot tell a real problem from an operation in flight
/// (an index entry written a moment before its record): call it on a quiescent prefix, or
/// call it again a moment later and keep what both calls found. This is the consistency
/// check the crate's tests, its chaos test and the demo rely on (invariants 2, 4 and 5).
/// Only the prefix's keys are read (`SCAN MATCH P:*`, never `KEYS`); nothing is written.
///
/// ```no_run
/// # fn main() -> sfu_redis::Result<()> {
/// let keys = sfu_redis::keys::KeySpace::new("sfu", "dev", "main")?;
/// let redis = sfu_redis::conn::Redis::new("redis://127.0.0.1/", std::time::Duration::from_secs(2))?;
/// let mut con = redis.connect()?; // redis+cluster:// too: every master is scanned
/// for p in sfu_redis::audit::scan(&keys, &mut con)? {
///     eprintln!("{} at {}: {}", p.kind, p.key, p.detail);
/// }
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// [`Error::Redis`] when a call fails (I/O, timeout); wrong-typed keys and bad values are
/// problems, not errors.
pub fn scan(keys: &KeySpace, con: &mut Conn) -> Result<Vec<Problem>> {
    Ok(single_scan(find(keys, con)?)
        .into_values()
        .map(Finding::into_problem)
        .collect())
}

/// One full scan of the prefix: every finding, keyed by identity.
fn find(ks: &KeySpace, con: &mut Conn) -> Result<Findings> {
    find_reporting(ks, con, 1, &|_| {})
}

/// [`find`], telling `progress` how it goes (scan number `scan`).
fn find_reporting(
    ks: &KeySpace,
    con: &mut Conn,
    scan: u32,
    progress: &dyn Fn(&Progress),
) -> Result<Findings> {
    let mut s = Scan {
        ks,
        con,
        out: Findings::new(),
    };
    let seen = s.keys(&|keys| {
        progress(&Progress {
            phase: Phase::Scanning,
            scan,
            keys,
            problems: 0,
        })
    })?;
    progress(&Progress {
        phase: Phase::Checking,
        scan,
        keys: seen.keys,
        problems: 0,
    });
    let registry = s.registry(&seen)?;
    s.control(&seen, registry.as_ref())?;
    s.room_indexes(&seen)?;
    let verdicts = s.rooms(&seen, registry.as_ref())?;
    s.records(&seen, &verdicts)?;
    Ok(s.out)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::read::room_names;
    use super::*;

    #[test]
    fn kind_names_are_unique_snake_case() {
        let names: BTreeSet<&str> = ProblemKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(names.len(), ProblemKind::ALL.len());
        for n in names {
            assert!(n.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{n}");
        }
    }

    #[test]
    fn report_json_shape() {
        let r = AuditReport {
            prefix: "sfu:dev:main".into(),
            problems: vec![
                Problem {
                    kind: ProblemKind::OrphanedRoom,
                    key: "k1".into(),
                    detail: "d".into(),
                    repaired: true,
                },
                Problem {
                    kind: ProblemKind::WrongType,
                    key: "k2".into(),
                    detail: "d".into(),
                    repaired: false,
                },
            ],
            repaired: 1,
        };
        let j = r.to_json();
        assert_eq!(j["clean"], false);
        assert_eq!(j["repaired"], 1);
        assert_eq!(j["problems"][0]["kind"], "orphaned_room");
        assert_eq!(j["problems"][1]["key"], "k2");
        assert_eq!(j.as_object().map(|o| o.len()), Some(3));
    }

    #[test]
    fn room_index_rule() {
        assert!(room_names(Some("a"), Some("b"), "a"));
        assert!(!room_names(Some("b"), Some("a"), "a"));
        assert!(room_names(None, Some("a"), "a"));
        assert!(!room_names(None, None, "a"));
    }
}
