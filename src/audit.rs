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
//! | `dangling_room_index` | `P:{ctl}:instance:<I>:rooms` | a room whose pin (or, with no pin, metadata) does not name I | entry removed |
//! | `dangling_peer_index` | `P:{ctl}:instance:<I>:peers` | a `<room>/<peer>` whose record is missing or names another instance | entry removed |
//! | `dangling_room_peer` | `P:room:{R}:peers` | a peer id without a record | entry removed |
//! | `dangling_guest` | `P:room:{R}:guests` | a guest pointing at a missing peer, or at a peer whose record names another guest | pointer (and its guest state) removed |
//! | `unindexed_peer` | the peer record | missing from its room's `peers`, its instance's peer index, or its guest's pointer | entry added |
//! | `unindexed_room` | the room's `meta` (else `owner`) | its owner's room index does not list it | entry added |
//! | `unregistered_instance` | the instance's room index (else peer index, else heartbeat key) | index sets or a heartbeat key but no sorted-set entry | handed to the reaper (score 0) |
//! | `orphaned_guest_state` | `P:room:{R}:guest-state` | the state of a guest that has no pointer | report only (host data) |
//! | `wrong_type` | the key | a key of the schema holding another Redis type | report only |
//! | `malformed_lease` | `P:{ctl}:leader` | the lease value is not an instance id, or it has no TTL | report only |
//! | `malformed_peer` | the peer record | no `instance` or `generation` field, or unusable values | report only |
//! | `malformed_value` | the key | another value this crate would not write: an epoch that is not a number, a heartbeat key or pin without TTL, an owner or sorted-set member that is not an id | report only |
//! | `unknown_key` | the key | a key under the prefix that the schema does not know, or whose ids are not in wire form | report only |
//!
//! The checks protect docs/DESIGN.md's invariants: 2 (a dead instance leaves nothing behind:
//! `orphaned_room`, `unregistered_instance`, the `dangling_*` kinds), 4 (each index holds
//! exactly what the peer records say: `dangling_*`, `unindexed_*`) and 5 (one prefix only).
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
//! 3. Index entries are added freely (index before record is always safe). Index entries of
//!    the control plane that point at a room record (another slot) are removed, then re-read
//!    after the settle delay once more and put back if their record meanwhile names the
//!    instance (an upsert or pin in flight): a removal can never leave a live record unindexed.
//! 4. Orphaned rooms are deleted batch by batch by `audit_delete_room.lua`, only while they
//!    still have no pin and unchanged metadata (owner CAS); records first, then their index
//!    entries.
//! 5. An unregistered instance with leftover index sets and no heartbeat key gets score 0 in
//!    the sorted set ("being reaped", `audit_enqueue.lua`): the leader's reaper then reaps it
//!    with its two-phase re-check and owner-CAS scripts. The audit does not reap by itself: it
//!    holds no lease, and the reaper is the one place that knows how (new lives, takeovers,
//!    batches). Until a leader runs, `sfu-redis status` shows the instance as being reaped.
//! 6. Wrong-typed keys, malformed values, unknown keys and guest states are never repaired.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::time::Duration;

use redis::{Connection, FromRedisValue, RedisResult, Value};
use serde_json::{json, Value as Json};

use crate::config::Config;
use crate::conn::{self, Redis};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::{decode_id, peer_member, split_peer_member, KeySpace, ParsedKey};
use crate::rooms::PEER_BATCH;
use crate::scripts::SCRIPTS;

/// `COUNT` of every `SCAN`, `SSCAN`, `HSCAN` and `ZSCAN` call.
pub const SCAN_COUNT: usize = 1000;

/// Most look-ups (or collections paged at once) per pipelined round trip.
pub const BATCH: usize = 500;

/// The default settle delay between the two scans: 5 s, longer than the default command
/// timeout (2 s).
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(5);

/// Collections whose next page is fetched in one pipelined round trip (at most
/// `PAGE_KEYS x SCAN_COUNT` items in memory at once).
const PAGE_KEYS: usize = 100;

const OP: &str = "audit";

/// What kind of problem the audit found. The names ([`ProblemKind::as_str`]) are stable:
/// operators' scripts match on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum ProblemKind {
    /// `orphaned_room`: room keys with no pin whose metadata names no registered instance (or
    /// that have no metadata at all). Invariant 2. Repaired: deleted.
    OrphanedRoom,
    /// `dangling_room_index`: a room in `P:{ctl}:instance:<I>:rooms` whose pin (or, with no
    /// pin, metadata) does not name I. Invariants 2, 4. Repaired: removed.
    DanglingRoomIndex,
    /// `dangling_peer_index`: a `<room>/<peer>` in `P:{ctl}:instance:<I>:peers` whose record
    /// is missing or names another instance. Invariant 4. Repaired: removed.
    DanglingPeerIndex,
    /// `dangling_room_peer`: a member of a room's `peers` set without a record. Invariant 4.
    /// Repaired: removed.
    DanglingRoomPeer,
    /// `dangling_guest`: a `guests` entry pointing at a missing peer or at a peer whose record
    /// names another guest. Invariant 4. Repaired: removed with its guest state.
    DanglingGuest,
    /// `unindexed_peer`: a peer record missing from its room's `peers` set, from its
    /// instance's peer index, or from its guest's pointer. Invariants 2, 4. Repaired: added
    /// (unless the guest points at another peer: report only).
    UnindexedPeer,
    /// `unindexed_room`: a room whose owner (pin, else metadata) does not list it in its room
    /// index, so the reaper could never reach it. Invariant 2. Repaired: added.
    UnindexedRoom,
    /// `unregistered_instance`: an instance with index sets or a heartbeat key but no entry in
    /// the heartbeat sorted set ("sets but no heartbeat"). Invariant 2. Repaired: handed to
    /// the reaper (score 0) when it has no heartbeat key.
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
    /// not in wire form. Report only.
    UnknownKey,
}

impl ProblemKind {
    /// Every kind, in report order.
    pub const ALL: [ProblemKind; 14] = [
        ProblemKind::OrphanedRoom,
        ProblemKind::DanglingRoomIndex,
        ProblemKind::DanglingPeerIndex,
        ProblemKind::DanglingRoomPeer,
        ProblemKind::DanglingGuest,
        ProblemKind::UnindexedPeer,
        ProblemKind::UnindexedRoom,
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
            ProblemKind::DanglingPeerIndex => "dangling_peer_index",
            ProblemKind::DanglingRoomPeer => "dangling_room_peer",
            ProblemKind::DanglingGuest => "dangling_guest",
            ProblemKind::UnindexedPeer => "unindexed_peer",
            ProblemKind::UnindexedRoom => "unindexed_room",
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

/// One problem found by [`audit`].
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

/// The result of [`audit`]: the problems found (in two scans, unless the settle delay is
/// zero) and how many were repaired.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuditReport {
    /// `<namespace>:<stage>:<branch>` that was audited.
    pub prefix: String,
    /// Every problem found, repaired or not, sorted by kind and key.
    pub problems: Vec<Problem>,
    /// How many of them were repaired.
    pub repaired: usize,
}

impl AuditReport {
    /// True when no problem remains: none was found, or every one was repaired.
    pub fn clean(&self) -> bool {
        self.problems.iter().all(|p| p.repaired)
    }

    /// The problems that remain (not repaired).
    pub fn remaining(&self) -> impl Iterator<Item = &Problem> {
        self.problems.iter().filter(|p| !p.repaired)
    }

    /// The JSON object printed by `sfu-redis fsck --json`:
    /// `{"clean": bool, "problems": [{"kind", "key", "detail", "repaired"}...], "repaired": n}`.
    pub fn to_json(&self) -> Json {
        json!({
            "clean": self.clean(),
            "problems": self.problems.iter().map(|p| json!({
                "kind": p.kind.as_str(),
                "key": p.key,
                "detail": p.detail,
                "repaired": p.repaired,
            })).collect::<Vec<_>>(),
            "repaired": self.repaired,
        })
    }
}

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
    let url = config
        .redis_url()
        .ok_or_else(|| Error::config("redis_url", "the audit needs a Redis URL (set REDIS_URL)"))?;
    let timeout = config.timings().command_timeout;
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
    let redis = Redis::new(url, timeout)?;
    let ks = config.keys();
    let mut con = redis.connect()?;
    let first = scan(ks, &mut con)?;
    let found = if options.settle.is_zero() {
        first
    } else {
        // A new connection after each pause: a server with an idle `timeout` may have closed
        // the old one.
        drop(con);
        std::thread::sleep(options.settle);
        con = redis.connect()?;
        let second = scan(ks, &mut con)?;
        // Only what both scans saw; the second scan's data (CAS values) is the fresher.
        second
            .into_iter()
            .filter(|(id, _)| first.contains_key(id))
            .collect()
    };
    let mut entries: Vec<Entry> = found
        .into_values()
        .map(|f| Entry {
            f,
            outcome: Outcome::Open,
        })
        .collect();
    if options.repair {
        repair(ks, &redis, con, &mut entries, options.settle)?;
    }
    let problems: Vec<Problem> = entries
        .into_iter()
        .filter_map(|e| {
            let (repaired, note) = match e.outcome {
                Outcome::Resolved => return None,
                Outcome::Open => (false, None),
                Outcome::Repaired => (true, None),
                Outcome::Left(why) => (false, Some(why)),
            };
            let mut detail = e.f.detail;
            if let Some(why) = note {
                detail.push_str(&format!(" (not repaired: {why})"));
            }
            Some(Problem {
                kind: e.f.kind,
                key: e.f.key,
                detail,
                repaired,
            })
        })
        .collect();
    Ok(AuditReport {
        prefix: ks.prefix().to_owned(),
        repaired: problems.iter().filter(|p| p.repaired).count(),
        problems,
    })
}

// ---------------------------------------------------------------------------------------------
// Findings

/// A finding's identity across the two scans: kind, key and the item (member, field, ...).
type FindingId = (ProblemKind, String, String);

#[derive(Debug, Clone)]
struct Finding {
    kind: ProblemKind,
    key: String,
    detail: String,
    fix: Option<Fix>,
}

/// How one finding is repaired (ids in wire form).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fix {
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
enum Verify {
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

type Findings = BTreeMap<FindingId, Finding>;

fn add(
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

// ---------------------------------------------------------------------------------------------
// Reading helpers

fn exec(con: &mut Connection, pipe: &mut redis::Pipeline) -> Result<Vec<RedisResult<Value>>> {
    conn::exec(con, pipe).map_err(|e| Error::redis(OP, e))
}

/// A pipelined reply as `T`; `None` on an error reply (a wrong-typed key, reported by its own
/// check) or an unexpected shape.
fn get<T: FromRedisValue>(r: Option<&RedisResult<Value>>) -> Option<T> {
    r.and_then(|r| r.as_ref().ok())
        .and_then(|v| redis::from_redis_value_ref(v).ok())
}

fn text(bytes: Vec<u8>) -> std::result::Result<String, String> {
    String::from_utf8(bytes).map_err(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

fn is_id(wire: &str) -> bool {
    decode_id(wire).is_ok()
}

/// Pages through many collections (`SSCAN`/`HSCAN`/`ZSCAN`, `COUNT` [`SCAN_COUNT`]), the
/// next pages of up to `PAGE_KEYS` of them pipelined together.
struct Pager {
    cmd: &'static str,
    keys: Vec<String>,
    pending: VecDeque<(usize, String)>,
}

impl Pager {
    fn new(cmd: &'static str, keys: Vec<String>) -> Self {
        let pending = (0..keys.len()).map(|i| (i, "0".to_owned())).collect();
        Pager { cmd, keys, pending }
    }

    fn key(&self, i: usize) -> &str {
        &self.keys[i]
    }

    /// The next pages: `(key index, items)`, items `None` when the call failed with an error
    /// reply (the key holds another type). `None` once every collection is done.
    #[allow(clippy::type_complexity)]
    fn next(&mut self, con: &mut Connection) -> Result<Option<Vec<(usize, Option<Vec<Vec<u8>>>)>>> {
        if self.pending.is_empty() {
            return Ok(None);
        }
        let take = self.pending.len().min(PAGE_KEYS);
        let batch: Vec<(usize, String)> = self.pending.drain(..take).collect();
        let mut pipe = redis::pipe();
        for (i, cursor) in &batch {
            pipe.cmd(self.cmd)
                .arg(&self.keys[*i])
                .arg(cursor)
                .arg("COUNT")
                .arg(SCAN_COUNT);
        }
        let replies = exec(con, &mut pipe)?;
        let mut pages = Vec::with_capacity(batch.len());
        for ((i, _), r) in batch.into_iter().zip(replies) {
            match get::<(String, Vec<Vec<u8>>)>(Some(&r)) {
                Some((next, items)) => {
                    if next != "0" {
                        self.pending.push_back((i, next));
                    }
                    pages.push((i, Some(items)));
                }
                None => pages.push((i, None)),
            }
        }
        Ok(Some(pages))
    }
}

// ---------------------------------------------------------------------------------------------
// One scan

#[derive(Debug, Default)]
struct RoomSeen {
    owner: bool,
    meta: bool,
    peers: bool,
    guests: bool,
    guest_state: bool,
    /// One of its keys (or records) holds the wrong type: never deleted by the audit.
    wrong_typed: bool,
    records: BTreeSet<String>,
}

#[derive(Debug, Default)]
struct InstanceSeen {
    hb: bool,
    rooms: bool,
    peers: bool,
}

#[derive(Debug, Default)]
struct Seen {
    /// `Some(false)`: the heartbeat key holds another type (registration unknown).
    heartbeats: Option<bool>,
    leader: bool,
    epoch: bool,
    rooms: BTreeMap<String, RoomSeen>,
    instances: BTreeMap<String, InstanceSeen>,
}

/// Notes one of a room's keys: present with the right type (`ok`), or wrong-typed.
fn room_flag(
    seen: &mut Seen,
    room: String,
    ok: bool,
    flag: impl FnOnce(&mut RoomSeen) -> &mut bool,
) {
    let rs = seen.rooms.entry(room).or_default();
    rs.wrong_typed |= !ok;
    *flag(rs) |= ok;
}

fn expected_type(k: &ParsedKey) -> &'static str {
    match k {
        ParsedKey::Heartbeats => "zset",
        ParsedKey::Heartbeat(_)
        | ParsedKey::Leader
        | ParsedKey::Epoch
        | ParsedKey::Dataset
        | ParsedKey::RoomOwner(_) => "string",
        ParsedKey::InstanceRooms(_) | ParsedKey::InstancePeers(_) | ParsedKey::RoomPeers(_) => {
            "set"
        }
        ParsedKey::RoomMeta(_)
        | ParsedKey::RoomGuests(_)
        | ParsedKey::RoomGuestState(_)
        | ParsedKey::Peer(..) => "hash",
    }
}

struct Scan<'a> {
    ks: &'a KeySpace,
    con: &'a mut Connection,
    out: Findings,
}

/// One full scan of the prefix: every finding, keyed by identity.
fn scan(ks: &KeySpace, con: &mut Connection) -> Result<Findings> {
    let mut s = Scan {
        ks,
        con,
        out: Findings::new(),
    };
    let seen = s.keys()?;
    let registry = s.registry(&seen)?;
    s.control(&seen, registry.as_ref())?;
    s.room_indexes(&seen)?;
    s.peer_indexes(&seen)?;
    let orphans = s.rooms(&seen, registry.as_ref())?;
    s.records(&seen, &orphans)?;
    Ok(s.out)
}

impl Scan<'_> {
    /// `SCAN MATCH P:*` with a pipelined `TYPE` per page: what exists, by role.
    fn keys(&mut self) -> Result<Seen> {
        let pattern = self.ks.scan_pattern();
        let mut seen = Seen::default();
        let mut cursor = "0".to_owned();
        loop {
            let (next, names): (String, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(&cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT)
                .query(self.con)
                .map_err(|e| Error::redis(OP, e))?;
            let mut pipe = redis::pipe();
            for n in &names {
                pipe.cmd("TYPE").arg(n);
            }
            let types = exec(self.con, &mut pipe)?;
            for (name, t) in names.into_iter().zip(types) {
                let t: String = get(Some(&t)).unwrap_or_default();
                self.classify(&mut seen, name, &t);
            }
            if next == "0" {
                return Ok(seen);
            }
            cursor = next;
        }
    }

    fn classify(&mut self, seen: &mut Seen, name: Vec<u8>, t: &str) {
        use ProblemKind::{UnknownKey, WrongType};
        let key = match text(name) {
            Ok(k) => k,
            Err(lossy) => {
                let detail = "the key name is not UTF-8; not a key of the schema".to_owned();
                add(&mut self.out, UnknownKey, &lossy, "", detail, None);
                return;
            }
        };
        if t.is_empty() || t == "none" {
            return; // expired meanwhile
        }
        let Some(parsed) = self.ks.parse(&key) else {
            let detail = format!("a {t} that is not a key of the schema; left alone");
            add(&mut self.out, UnknownKey, &key, "", detail, None);
            return;
        };
        let ids: Vec<&String> = match &parsed {
            ParsedKey::Heartbeat(i) | ParsedKey::InstanceRooms(i) | ParsedKey::InstancePeers(i) => {
                vec![i]
            }
            ParsedKey::RoomOwner(r)
            | ParsedKey::RoomMeta(r)
            | ParsedKey::RoomPeers(r)
            | ParsedKey::RoomGuests(r)
            | ParsedKey::RoomGuestState(r) => vec![r],
            ParsedKey::Peer(r, p) => vec![r, p],
            _ => Vec::new(),
        };
        if let Some(bad) = ids.into_iter().find(|i| !is_id(i)) {
            let detail = format!("{bad:?} in the key name is not an id in wire form; left alone");
            add(&mut self.out, UnknownKey, &key, "", detail, None);
            return;
        }
        let expected = expected_type(&parsed);
        let ok = t == expected;
        if !ok {
            let detail = format!("holds a {t}, the schema says {expected}; left alone");
            add(&mut self.out, WrongType, &key, "", detail, None);
        }
        match parsed {
            ParsedKey::Heartbeats => seen.heartbeats = Some(ok),
            ParsedKey::Leader => seen.leader = ok,
            ParsedKey::Epoch => seen.epoch = ok,
            ParsedKey::Dataset => {}
            ParsedKey::Heartbeat(i) => seen.instances.entry(i).or_default().hb |= ok,
            ParsedKey::InstanceRooms(i) => seen.instances.entry(i).or_default().rooms |= ok,
            ParsedKey::InstancePeers(i) => seen.instances.entry(i).or_default().peers |= ok,
            ParsedKey::RoomOwner(r) => room_flag(seen, r, ok, |s| &mut s.owner),
            ParsedKey::RoomMeta(r) => room_flag(seen, r, ok, |s| &mut s.meta),
            ParsedKey::RoomPeers(r) => room_flag(seen, r, ok, |s| &mut s.peers),
            ParsedKey::RoomGuests(r) => room_flag(seen, r, ok, |s| &mut s.guests),
            ParsedKey::RoomGuestState(r) => room_flag(seen, r, ok, |s| &mut s.guest_state),
            ParsedKey::Peer(r, p) => {
                let room = seen.rooms.entry(r).or_default();
                room.wrong_typed |= !ok;
                if ok {
                    room.records.insert(p);
                }
            }
        }
    }

    /// The registered instances (members of the heartbeat sorted set, any score); `None` when
    /// that key holds the wrong type or cannot be read, which disables the checks that depend
    /// on registration (`orphaned_room`, `unregistered_instance`).
    fn registry(&mut self, seen: &Seen) -> Result<Option<BTreeSet<String>>> {
        if seen.heartbeats == Some(false) {
            return Ok(None);
        }
        let key = self.ks.heartbeats();
        let mut pager = Pager::new("ZSCAN", vec![key.clone()]);
        let mut registered = BTreeSet::new();
        while let Some(pages) = pager.next(self.con)? {
            for (_, items) in pages {
                let Some(items) = items else {
                    return Ok(None);
                };
                for member in items.into_iter().step_by(2) {
                    match text(member) {
                        Ok(m) if is_id(&m) => {
                            registered.insert(m);
                        }
                        Ok(m) | Err(m) => {
                            let detail = format!("member {m:?} is not an instance id");
                            add(
                                &mut self.out,
                                ProblemKind::MalformedValue,
                                &key,
                                &m,
                                detail,
                                None,
                            );
                        }
                    }
                }
            }
        }
        Ok(Some(registered))
    }

    /// The lease, the epoch, heartbeat keys' TTLs, and instances with sets but no entry in
    /// the sorted set.
    fn control(&mut self, seen: &Seen, registry: Option<&BTreeSet<String>>) -> Result<()> {
        use ProblemKind::{MalformedLease, MalformedValue, UnregisteredInstance};
        let ks = self.ks;
        let mut pipe = redis::pipe();
        pipe.get(ks.leader()).pttl(ks.leader()).get(ks.epoch());
        let hbs: Vec<&String> = seen
            .instances
            .iter()
            .filter(|(_, s)| s.hb)
            .map(|(i, _)| i)
            .collect();
        for i in &hbs {
            pipe.pttl(ks.heartbeat(i));
        }
        let r = exec(self.con, &mut pipe)?;
        if seen.leader {
            let key = ks.leader();
            if let Some(Some(v)) = get::<Option<Vec<u8>>>(r.first()) {
                let value = String::from_utf8_lossy(&v).into_owned();
                if !is_id(&value) {
                    let detail = format!(
                        "holds {value:?}, not an instance id in wire form; elections wait for it to expire"
                    );
                    add(&mut self.out, MalformedLease, &key, "value", detail, None);
                }
            }
            if get::<i64>(r.get(1)) == Some(-1) {
                let detail =
                    "has no TTL: no instance could ever be elected (the next acquire replaces it)"
                        .to_owned();
                add(&mut self.out, MalformedLease, &key, "ttl", detail, None);
            }
        }
        if seen.epoch {
            if let Some(Some(v)) = get::<Option<Vec<u8>>>(r.get(2)) {
                if String::from_utf8_lossy(&v).parse::<u64>().is_err() {
                    let detail = format!(
                        "holds {:?}, not a number: no lease can be acquired",
                        String::from_utf8_lossy(&v)
                    );
                    add(&mut self.out, MalformedValue, &ks.epoch(), "", detail, None);
                }
            }
        }
        for (n, i) in hbs.iter().enumerate() {
            if get::<i64>(r.get(3 + n)) == Some(-1) {
                let detail = format!("heartbeat key of {i} has no TTL: it can never be seen dead");
                add(
                    &mut self.out,
                    MalformedValue,
                    &ks.heartbeat(i),
                    "ttl",
                    detail,
                    None,
                );
            }
        }
        let Some(registry) = registry else {
            return Ok(());
        };
        for (i, s) in &seen.instances {
            if registry.contains(i) || !(s.hb || s.rooms || s.peers) {
                continue;
            }
            let key = if s.rooms {
                ks.instance_rooms(i)
            } else if s.peers {
                ks.instance_peers(i)
            } else {
                ks.heartbeat(i)
            };
            let (detail, fix) = if s.hb {
                (
                    format!(
                        "instance {i} has a heartbeat key but no entry in {}; not handed to the reaper while the key lives",
                        ks.heartbeats()
                    ),
                    None,
                )
            } else {
                (
                    format!(
                        "instance {i} has index sets but no entry in {} (sets but no heartbeat)",
                        ks.heartbeats()
                    ),
                    Some(Fix::Enqueue {
                        instance: i.clone(),
                    }),
                )
            };
            add(&mut self.out, UnregisteredInstance, &key, "", detail, fix);
        }
        Ok(())
    }

    /// Every `P:{ctl}:instance:<I>:rooms` member must be a room whose pin (or, with no pin,
    /// metadata) names I.
    fn room_indexes(&mut self, seen: &Seen) -> Result<()> {
        let ks = self.ks;
        let owners: Vec<&String> = seen
            .instances
            .iter()
            .filter(|(_, s)| s.rooms)
            .map(|(i, _)| i)
            .collect();
        let keys = owners.iter().map(|i| ks.instance_rooms(i)).collect();
        let mut pager = Pager::new("SSCAN", keys);
        while let Some(pages) = pager.next(self.con)? {
            let mut check = Vec::new();
            for (n, items) in pages {
                let inst = owners[n];
                let key = pager.key(n).to_owned();
                for m in items.unwrap_or_default() {
                    match text(m) {
                        Ok(room) if is_id(&room) => check.push((inst, key.clone(), room)),
                        Ok(room) => {
                            let detail = format!("room {room:?} is not a room id");
                            let fix = Fix::Unindex {
                                set: key.clone(),
                                member: room.clone(),
                                verify: Verify::Never,
                            };
                            self.dangling_room(&key, &room, detail, Some(fix));
                        }
                        Err(lossy) => {
                            let detail = format!("member {lossy:?} is not UTF-8");
                            add(
                                &mut self.out,
                                ProblemKind::MalformedValue,
                                &key,
                                &lossy,
                                detail,
                                None,
                            );
                        }
                    }
                }
            }
            for chunk in check.chunks(BATCH) {
                // The entry is read again first, then the room: an entry still there whose
                // room (read after it) does not name the instance (not a pin in flight).
                let mut pipe = redis::pipe();
                for (_, key, room) in chunk {
                    let rk = ks.room(room);
                    pipe.sismember(key, room)
                        .get(&rk.owner)
                        .hget(&rk.meta, "owner");
                }
                let r = exec(self.con, &mut pipe)?;
                for (n, (inst, key, room)) in chunk.iter().enumerate() {
                    let (Some(true), Some(pin), Some(meta)) = (
                        get::<bool>(r.get(3 * n)),
                        get::<Option<String>>(r.get(3 * n + 1)),
                        get::<Option<String>>(r.get(3 * n + 2)),
                    ) else {
                        continue; // gone meanwhile, or a wrong-typed key (reported by itself)
                    };
                    if room_names(pin.as_deref(), meta.as_deref(), inst) {
                        continue;
                    }
                    let detail = match (pin, meta) {
                        (Some(p), _) => format!("room {room}: its pin names {p}, not {inst}"),
                        (None, Some(m)) => {
                            format!("room {room}: no pin, its metadata names {m}, not {inst}")
                        }
                        (None, None) => format!("room {room}: no pin and no metadata"),
                    };
                    let fix = Fix::Unindex {
                        set: key.clone(),
                        member: room.clone(),
                        verify: Verify::Room {
                            room: room.clone(),
                            instance: (*inst).clone(),
                        },
                    };
                    self.dangling_room(key, room, detail, Some(fix));
                }
            }
        }
        Ok(())
    }

    fn dangling_room(&mut self, key: &str, room: &str, detail: String, fix: Option<Fix>) {
        add(
            &mut self.out,
            ProblemKind::DanglingRoomIndex,
            key,
            room,
            detail,
            fix,
        );
    }

    /// Every `P:{ctl}:instance:<I>:peers` member `<room>/<peer>` must have a record that names
    /// I. (A record without an `instance` field is reported as `malformed_peer` instead.)
    fn peer_indexes(&mut self, seen: &Seen) -> Result<()> {
        let ks = self.ks;
        let owners: Vec<&String> = seen
            .instances
            .iter()
            .filter(|(_, s)| s.peers)
            .map(|(i, _)| i)
            .collect();
        let keys = owners.iter().map(|i| ks.instance_peers(i)).collect();
        let mut pager = Pager::new("SSCAN", keys);
        while let Some(pages) = pager.next(self.con)? {
            let mut check = Vec::new();
            for (n, items) in pages {
                let inst = owners[n];
                let key = pager.key(n).to_owned();
                for m in items.unwrap_or_default() {
                    let member = match text(m) {
                        Ok(member) => member,
                        Err(lossy) => {
                            let detail = format!("member {lossy:?} is not UTF-8");
                            add(
                                &mut self.out,
                                ProblemKind::MalformedValue,
                                &key,
                                &lossy,
                                detail,
                                None,
                            );
                            continue;
                        }
                    };
                    match split_peer_member(&member) {
                        Some((r, p)) if is_id(r) && is_id(p) => check.push((
                            inst,
                            key.clone(),
                            r.to_owned(),
                            p.to_owned(),
                            member.clone(),
                        )),
                        _ => {
                            let detail = format!("member {member:?} is not <room>/<peer>");
                            let fix = Fix::Unindex {
                                set: key.clone(),
                                member: member.clone(),
                                verify: Verify::Never,
                            };
                            add(
                                &mut self.out,
                                ProblemKind::DanglingPeerIndex,
                                &key,
                                &member,
                                detail,
                                Some(fix),
                            );
                        }
                    }
                }
            }
            for chunk in check.chunks(BATCH) {
                let mut pipe = redis::pipe();
                for (_, key, room, peer, member) in chunk {
                    let rec = ks.peer(room, peer);
                    pipe.sismember(key, member)
                        .exists(&rec)
                        .hget(&rec, "instance");
                }
                let r = exec(self.con, &mut pipe)?;
                for (n, (inst, key, room, peer, member)) in chunk.iter().enumerate() {
                    let (Some(true), Some(exists), Some(named)) = (
                        get::<bool>(r.get(3 * n)),
                        get::<bool>(r.get(3 * n + 1)),
                        get::<Option<String>>(r.get(3 * n + 2)),
                    ) else {
                        continue;
                    };
                    let detail = match (exists, named) {
                        (false, _) => format!("{member}: no such peer record"),
                        (true, Some(other)) if other != **inst => {
                            format!("{member}: the record names instance {other}, not {inst}")
                        }
                        _ => continue, // ours, or malformed (reported with the record)
                    };
                    let fix = Fix::Unindex {
                        set: key.clone(),
                        member: member.clone(),
                        verify: Verify::Peer {
                            room: room.clone(),
                            peer: peer.clone(),
                            instance: (*inst).clone(),
                        },
                    };
                    add(
                        &mut self.out,
                        ProblemKind::DanglingPeerIndex,
                        key,
                        member,
                        detail,
                        Some(fix),
                    );
                }
            }
        }
        Ok(())
    }

    /// Per room: pin and metadata values, orphaned rooms, the owner's room index, the room's
    /// `peers`, `guests` and `guest-state`. Returns the orphaned rooms.
    fn rooms(
        &mut self,
        seen: &Seen,
        registry: Option<&BTreeSet<String>>,
    ) -> Result<BTreeSet<String>> {
        use ProblemKind::{MalformedValue, OrphanedRoom, UnindexedRoom};
        let ks = self.ks;
        let mut orphans = BTreeSet::new();
        let rooms: Vec<(&String, &RoomSeen)> = seen.rooms.iter().collect();
        for chunk in rooms.chunks(BATCH) {
            let mut pipe = redis::pipe();
            for (room, rs) in chunk {
                let rk = ks.room(room);
                pipe.get(&rk.owner)
                    .pttl(&rk.owner)
                    .cmd("HMGET")
                    .arg(&rk.meta)
                    .arg("owner")
                    .arg("pinned_ms");
                // Does the room still have any key (a room closed meanwhile is no orphan)?
                let exists = pipe
                    .cmd("EXISTS")
                    .arg(&rk.meta)
                    .arg(&rk.peers)
                    .arg(&rk.guests)
                    .arg(&rk.guest_state);
                for p in rs.records.iter().take(8) {
                    exists.arg(ks.peer(room, p));
                }
            }
            let r = exec(self.con, &mut pipe)?;
            let mut owned = Vec::new();
            for (n, (room, rs)) in chunk.iter().enumerate() {
                let rk = ks.room(room);
                let pin = get::<Option<String>>(r.get(4 * n));
                let pttl = get::<i64>(r.get(4 * n + 1));
                let meta = get::<Vec<Option<String>>>(r.get(4 * n + 2));
                let has_keys = get::<i64>(r.get(4 * n + 3)).unwrap_or(1) > 0;
                if let Some(Some(p)) = &pin {
                    if !is_id(p) {
                        let detail = format!("the pin holds {p:?}, not an instance id");
                        add(
                            &mut self.out,
                            MalformedValue,
                            &rk.owner,
                            "value",
                            detail,
                            None,
                        );
                    }
                    if pttl == Some(-1) {
                        let detail =
                            "the pin has no TTL: the room can never be taken over".to_owned();
                        add(
                            &mut self.out,
                            MalformedValue,
                            &rk.owner,
                            "ttl",
                            detail,
                            None,
                        );
                    }
                }
                let (meta_owner, pinned_ms) = match &meta {
                    Some(v) => (v.first().cloned().flatten(), v.get(1).cloned().flatten()),
                    None => (None, None),
                };
                if let Some(m) = &meta_owner {
                    if !is_id(m) {
                        let detail = format!("the metadata's owner is {m:?}, not an instance id");
                        add(
                            &mut self.out,
                            MalformedValue,
                            &rk.meta,
                            "owner",
                            detail,
                            None,
                        );
                    }
                }
                let (Some(pin), Some(_)) = (pin, meta) else {
                    continue; // a wrong-typed pin or metadata: reported by itself
                };
                if let (None, Some(registry), true) = (&pin, registry, has_keys) {
                    let orphaned = match &meta_owner {
                        None => Some("no pin and no metadata".to_owned()),
                        Some(m) if !registry.contains(m) => Some(format!(
                            "no pin, and its metadata names {m}, which is not a registered instance"
                        )),
                        Some(_) => None,
                    };
                    if let Some(why) = orphaned {
                        let key = representative(ks, room, rs);
                        let keys = [rs.owner, rs.meta, rs.peers, rs.guests, rs.guest_state]
                            .iter()
                            .filter(|b| **b)
                            .count()
                            + rs.records.len();
                        let detail = format!("room {room}: {why} ({keys} keys)");
                        let fix = (!rs.wrong_typed).then(|| Fix::DeleteRoom {
                            room: (*room).clone(),
                            meta_owner: meta_owner.clone().unwrap_or_default(),
                            pinned_ms: pinned_ms.clone().unwrap_or_default(),
                            records: rs.records.iter().cloned().collect(),
                        });
                        add(&mut self.out, OrphanedRoom, &key, "", detail, fix);
                        orphans.insert((*room).clone());
                        continue;
                    }
                }
                if let Some(owner) = pin.or(meta_owner).filter(|o| is_id(o)) {
                    owned.push((*room, rs, owner));
                }
            }
            // The owner's index is read first, then the room again: a missing entry while the
            // room read after it still names the owner is a real gap, not a pin in flight.
            let mut pipe = redis::pipe();
            for (room, _, owner) in &owned {
                let rk = ks.room(room);
                pipe.sismember(ks.instance_rooms(owner), *room)
                    .get(&rk.owner)
                    .hget(&rk.meta, "owner");
            }
            let r = exec(self.con, &mut pipe)?;
            for (n, (room, rs, owner)) in owned.iter().enumerate() {
                let (Some(false), Some(pin), Some(meta)) = (
                    get::<bool>(r.get(3 * n)),
                    get::<Option<String>>(r.get(3 * n + 1)),
                    get::<Option<String>>(r.get(3 * n + 2)),
                ) else {
                    continue;
                };
                if !room_names(pin.as_deref(), meta.as_deref(), owner) {
                    continue;
                }
                let rk = ks.room(room);
                let key = if rs.meta { rk.meta } else { rk.owner };
                let set = ks.instance_rooms(owner);
                let detail = format!("room {room}: its owner {owner} does not list it in {set}");
                let fix = Fix::Add {
                    set,
                    member: (*room).clone(),
                };
                add(&mut self.out, UnindexedRoom, &key, "", detail, Some(fix));
            }
        }
        let live: Vec<(&String, &RoomSeen)> = rooms
            .into_iter()
            .filter(|(r, _)| !orphans.contains(*r))
            .collect();
        self.room_peers(&live)?;
        self.guests(&live)?;
        self.guest_states(&live)?;
        Ok(orphans)
    }

    /// Every member of a room's `peers` set must have a record.
    fn room_peers(&mut self, rooms: &[(&String, &RoomSeen)]) -> Result<()> {
        let ks = self.ks;
        let with: Vec<&String> = rooms
            .iter()
            .filter(|(_, s)| s.peers)
            .map(|(r, _)| *r)
            .collect();
        let mut pager = Pager::new("SSCAN", with.iter().map(|r| ks.room(r).peers).collect());
        while let Some(pages) = pager.next(self.con)? {
            let mut check = Vec::new();
            for (n, items) in pages {
                for m in items.unwrap_or_default() {
                    match text(m) {
                        Ok(p) => check.push((with[n], pager.key(n).to_owned(), p)),
                        Err(lossy) => {
                            let detail = format!("member {lossy:?} is not UTF-8");
                            let key = pager.key(n).to_owned();
                            add(
                                &mut self.out,
                                ProblemKind::MalformedValue,
                                &key,
                                &lossy,
                                detail,
                                None,
                            );
                        }
                    }
                }
            }
            for chunk in check.chunks(BATCH) {
                let mut pipe = redis::pipe();
                for (room, key, peer) in chunk {
                    pipe.sismember(key, peer).exists(ks.peer(room, peer));
                }
                let r = exec(self.con, &mut pipe)?;
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
                    add(
                        &mut self.out,
                        ProblemKind::DanglingRoomPeer,
                        key,
                        peer,
                        detail,
                        Some(fix),
                    );
                }
            }
        }
        Ok(())
    }

    /// Every `guests` entry `g -> p` must point at a record of `p` that names guest `g`.
    fn guests(&mut self, rooms: &[(&String, &RoomSeen)]) -> Result<()> {
        let ks = self.ks;
        let with: Vec<&String> = rooms
            .iter()
            .filter(|(_, s)| s.guests)
            .map(|(r, _)| *r)
            .collect();
        let mut pager = Pager::new("HSCAN", with.iter().map(|r| ks.room(r).guests).collect());
        while let Some(pages) = pager.next(self.con)? {
            let mut check = Vec::new();
            for (n, items) in pages {
                let mut items = items.unwrap_or_default().into_iter();
                while let (Some(g), Some(p)) = (items.next(), items.next()) {
                    let key = pager.key(n).to_owned();
                    match (text(g), text(p)) {
                        (Ok(g), Ok(p)) => check.push((with[n], key, g, p)),
                        (g, _) => {
                            let g = g.unwrap_or_else(|e| e);
                            let detail = format!("guest {g:?}: field or value is not UTF-8");
                            add(
                                &mut self.out,
                                ProblemKind::MalformedValue,
                                &key,
                                &g,
                                detail,
                                None,
                            );
                        }
                    }
                }
            }
            for chunk in check.chunks(BATCH) {
                let mut pipe = redis::pipe();
                for (room, key, guest, peer) in chunk {
                    let rec = ks.peer(room, peer);
                    pipe.hget(key, guest).exists(&rec).hget(&rec, "guest");
                }
                let r = exec(self.con, &mut pipe)?;
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
                        (false, _) => {
                            format!("guest {guest} -> peer {peer:?}, which has no record")
                        }
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
                    add(
                        &mut self.out,
                        ProblemKind::DanglingGuest,
                        key,
                        guest,
                        detail,
                        Some(fix),
                    );
                }
            }
        }
        Ok(())
    }

    /// Every `guest-state` field must belong to a guest with a pointer (report only).
    fn guest_states(&mut self, rooms: &[(&String, &RoomSeen)]) -> Result<()> {
        let ks = self.ks;
        let with: Vec<&String> = rooms
            .iter()
            .filter(|(_, s)| s.guest_state)
            .map(|(r, _)| *r)
            .collect();
        let mut pager = Pager::new(
            "HSCAN",
            with.iter().map(|r| ks.room(r).guest_state).collect(),
        );
        while let Some(pages) = pager.next(self.con)? {
            let mut check = Vec::new();
            for (n, items) in pages {
                for g in items.unwrap_or_default().into_iter().step_by(2) {
                    let g = text(g).unwrap_or_else(|e| e);
                    check.push((with[n], pager.key(n).to_owned(), g));
                }
            }
            for chunk in check.chunks(BATCH) {
                let mut pipe = redis::pipe();
                for (room, key, guest) in chunk {
                    pipe.hexists(key, guest)
                        .hexists(ks.room(room).guests, guest);
                }
                let r = exec(self.con, &mut pipe)?;
                for (n, (room, key, guest)) in chunk.iter().enumerate() {
                    if get::<bool>(r.get(2 * n)) != Some(true)
                        || get::<bool>(r.get(2 * n + 1)) != Some(false)
                    {
                        continue;
                    }
                    let detail = format!(
                        "state of guest {guest:?} in room {room}, which has no pointer; left alone (host data)"
                    );
                    add(
                        &mut self.out,
                        ProblemKind::OrphanedGuestState,
                        key,
                        guest,
                        detail,
                        None,
                    );
                }
            }
        }
        Ok(())
    }

    /// Every peer record: its fields, and its three indexes (room `peers`, instance peer
    /// index, guest pointer). Records of orphaned rooms are only checked for their fields:
    /// they go with their room.
    ///
    /// Each index is read before the record is read (again): an index entry missing while
    /// the record that is read after it exists is a real gap, not an upsert in flight (index
    /// first, record second).
    fn records(&mut self, seen: &Seen, orphans: &BTreeSet<String>) -> Result<()> {
        use ProblemKind::{MalformedPeer, UnindexedPeer};
        let ks = self.ks;
        let all: Vec<(&String, &String)> = seen
            .rooms
            .iter()
            .flat_map(|(r, s)| s.records.iter().map(move |p| (r, p)))
            .collect();
        let fields = |c: &mut redis::Pipeline, rec: &str| {
            c.cmd("HMGET")
                .arg(rec)
                .arg("instance")
                .arg("guest")
                .arg("generation");
        };
        for chunk in all.chunks(BATCH) {
            let mut pipe = redis::pipe();
            for (room, peer) in chunk {
                let rec = ks.peer(room, peer);
                pipe.sismember(ks.room(room).peers, *peer).exists(&rec);
                fields(&mut pipe, &rec);
            }
            let r = exec(self.con, &mut pipe)?;
            let mut second = Vec::new();
            for (n, (room, peer)) in chunk.iter().enumerate() {
                let (Some(in_room), Some(true), Some(f)) = (
                    get::<bool>(r.get(3 * n)),
                    get::<bool>(r.get(3 * n + 1)),
                    get::<Vec<Option<String>>>(r.get(3 * n + 2)),
                ) else {
                    continue; // gone meanwhile, or wrong-typed (reported by itself)
                };
                let key = ks.peer(room, peer);
                let (instance, guest, generation) = record_fields(f);
                let mut bad = Vec::new();
                match &instance {
                    None => bad.push("no `instance` field".to_owned()),
                    Some(i) if !is_id(i) => bad.push(format!("instance {i:?} is not an id")),
                    Some(_) => {}
                }
                match &generation {
                    None => bad.push("no `generation` field".to_owned()),
                    Some(g) if g.parse::<u64>().is_err() => {
                        bad.push(format!("generation {g:?} is not a number"))
                    }
                    Some(_) => {}
                }
                if !guest.is_empty() && !is_id(&guest) {
                    bad.push(format!("guest {guest:?} is not an id"));
                }
                if !bad.is_empty() {
                    let detail = format!("peer record: {}", bad.join(", "));
                    add(&mut self.out, MalformedPeer, &key, "", detail, None);
                }
                let Some(instance) = instance.filter(|i| is_id(i)) else {
                    continue;
                };
                if orphans.contains(*room) {
                    continue;
                }
                if !in_room {
                    let detail = format!("not in {}", ks.room(room).peers);
                    let fix = Fix::RoomEntry {
                        room: (*room).clone(),
                        peer: (*peer).clone(),
                        guest: String::new(),
                        mode: "add_peer",
                    };
                    add(
                        &mut self.out,
                        UnindexedPeer,
                        &key,
                        "room",
                        detail,
                        Some(fix),
                    );
                }
                second.push((*room, *peer, key, instance, guest));
            }
            let mut pipe = redis::pipe();
            for (room, peer, key, instance, guest) in &second {
                pipe.sismember(ks.instance_peers(instance), peer_member(room, peer))
                    .hget(ks.room(room).guests, guest);
                fields(&mut pipe, key);
            }
            let r = exec(self.con, &mut pipe)?;
            for (n, (room, peer, key, instance, guest)) in second.iter().enumerate() {
                let (Some(indexed), Some(pointer), Some(f)) = (
                    get::<bool>(r.get(3 * n)),
                    get::<Option<String>>(r.get(3 * n + 1)),
                    get::<Vec<Option<String>>>(r.get(3 * n + 2)),
                ) else {
                    continue;
                };
                let (now_instance, now_guest, _) = record_fields(f);
                if !indexed && now_instance.as_ref() == Some(instance) {
                    let set = ks.instance_peers(instance);
                    let detail = format!("not in {set}");
                    let fix = Fix::Add {
                        set,
                        member: peer_member(room, peer),
                    };
                    add(
                        &mut self.out,
                        UnindexedPeer,
                        key,
                        "instance",
                        detail,
                        Some(fix),
                    );
                }
                if guest.is_empty() || !is_id(guest) || now_guest != *guest {
                    continue;
                }
                match pointer {
                    None => {
                        let detail = format!("guest {guest} has no pointer to it");
                        let fix = Fix::RoomEntry {
                            room: (*room).clone(),
                            peer: (*peer).clone(),
                            guest: guest.clone(),
                            mode: "add_guest",
                        };
                        add(
                            &mut self.out,
                            UnindexedPeer,
                            key,
                            "guest",
                            detail,
                            Some(fix),
                        );
                    }
                    Some(other) if other != **peer => {
                        let detail = format!(
                            "guest {guest} points at peer {other}: a superseded record (not repaired: which one is current is the host's call)"
                        );
                        add(&mut self.out, UnindexedPeer, key, "guest", detail, None);
                    }
                    Some(_) => {}
                }
            }
        }
        Ok(())
    }
}

/// `instance`, `guest` (`""` if none) and `generation` of an `HMGET` reply.
fn record_fields(f: Vec<Option<String>>) -> (Option<String>, String, Option<String>) {
    let mut f = f.into_iter();
    let instance = f.next().flatten();
    let guest = f.next().flatten().unwrap_or_default();
    let generation = f.next().flatten();
    (instance, guest, generation)
}

/// True when a room index entry of `inst` is right: the pin names it, or there is no pin and
/// the metadata names it.
fn room_names(pin: Option<&str>, meta: Option<&str>, inst: &str) -> bool {
    match pin {
        Some(p) => p == inst,
        None => meta == Some(inst),
    }
}

/// The key an orphaned room is reported at: its metadata, else its first key.
fn representative(ks: &KeySpace, room: &str, rs: &RoomSeen) -> String {
    let rk = ks.room(room);
    if rs.meta {
        rk.meta
    } else if rs.peers {
        rk.peers
    } else if rs.guests {
        rk.guests
    } else if rs.guest_state {
        rk.guest_state
    } else if let Some(p) = rs.records.iter().next() {
        ks.peer(room, p)
    } else {
        rk.owner
    }
}

// ---------------------------------------------------------------------------------------------
// Repair

#[derive(Debug)]
enum Outcome {
    /// Not (yet) repaired.
    Open,
    /// Fixed.
    Repaired,
    /// The problem went away by itself meanwhile: not reported.
    Resolved,
    /// The fix was refused on re-check; the reason is appended to the detail.
    Left(String),
}

#[derive(Debug)]
struct Entry {
    f: Finding,
    outcome: Outcome,
}

/// Applies the fixes of `entries` in a safe order: index additions, room-slot removals (each
/// re-checked in a script), control-plane removals (re-verified after `settle`), orphaned
/// rooms, hand-overs to the reaper.
fn repair(
    ks: &KeySpace,
    redis: &Redis,
    mut con: Connection,
    entries: &mut [Entry],
    settle: Duration,
) -> Result<()> {
    let con = &mut con;
    // 1. Index additions and room-slot fixes.
    for want_add in [true, false] {
        let idx: Vec<usize> = (0..entries.len())
            .filter(|&i| match &entries[i].f.fix {
                Some(Fix::Add { .. }) => want_add,
                Some(Fix::RoomEntry { mode, .. }) => mode.starts_with("add") == want_add,
                _ => false,
            })
            .collect();
        for chunk in idx.chunks(BATCH) {
            let mut pipe = redis::pipe();
            for &i in chunk {
                match &entries[i].f.fix {
                    Some(Fix::Add { set, member }) => {
                        pipe.sadd(set, member);
                    }
                    Some(Fix::RoomEntry {
                        room,
                        peer,
                        guest,
                        mode,
                    }) => {
                        let rk = ks.room(room);
                        let mut inv = SCRIPTS.audit_room_index.prepare_invoke();
                        inv.key(ks.peer(room, peer))
                            .key(&rk.peers)
                            .key(&rk.guests)
                            .key(&rk.guest_state)
                            .arg(*mode)
                            .arg(peer)
                            .arg(guest);
                        pipe.invoke_script(&inv);
                    }
                    _ => {}
                }
            }
            let replies = exec(con, &mut pipe)?;
            for (&i, r) in chunk.iter().zip(replies) {
                entries[i].outcome = match &entries[i].f.fix {
                    Some(Fix::Add { .. }) => match get::<i64>(Some(&r)) {
                        Some(1) => Outcome::Repaired,
                        Some(_) => Outcome::Resolved,
                        None => Outcome::Left("the index holds the wrong type".into()),
                    },
                    _ => match conn::decode::<String>(OP, r) {
                        Ok(s) => match s.as_str() {
                            "fixed" => Outcome::Repaired,
                            "gone" => Outcome::Resolved,
                            "changed" => Outcome::Left("the entry changed meanwhile".into()),
                            "malformed" => Outcome::Left("the record is malformed".into()),
                            "wrong_type" => Outcome::Left("a key holds the wrong type".into()),
                            other => Outcome::Left(format!("unexpected reply {other:?}")),
                        },
                        Err(e) => Outcome::Left(e.to_string()),
                    },
                };
            }
        }
    }

    // 2. Control-plane index entries pointing at nothing: removed now, verified later.
    let unindex: Vec<usize> = (0..entries.len())
        .filter(|&i| matches!(entries[i].f.fix, Some(Fix::Unindex { .. })))
        .collect();
    for chunk in unindex.chunks(BATCH) {
        let mut pipe = redis::pipe();
        for &i in chunk {
            if let Some(Fix::Unindex { set, member, .. }) = &entries[i].f.fix {
                pipe.srem(set, member);
            }
        }
        let replies = exec(con, &mut pipe)?;
        for (&i, r) in chunk.iter().zip(replies) {
            entries[i].outcome = match get::<i64>(Some(&r)) {
                Some(1) => Outcome::Repaired,
                Some(_) => Outcome::Resolved,
                None => Outcome::Left("the index holds the wrong type".into()),
            };
        }
    }

    // 3. Orphaned rooms.
    for e in entries.iter_mut() {
        if let Some(Fix::DeleteRoom {
            room,
            meta_owner,
            pinned_ms,
            records,
        }) = &e.f.fix
        {
            e.outcome = match delete_room(ks, con, room, meta_owner, pinned_ms, records) {
                Ok(o) => o,
                Err(err) if err.kind() == ErrorKind::BadData => Outcome::Left(err.to_string()),
                Err(err) => return Err(err),
            };
        }
    }

    // 4. Unregistered instances: to the reaper.
    let enqueue: Vec<usize> = (0..entries.len())
        .filter(|&i| matches!(entries[i].f.fix, Some(Fix::Enqueue { .. })))
        .collect();
    for chunk in enqueue.chunks(BATCH) {
        let mut pipe = redis::pipe();
        for &i in chunk {
            if let Some(Fix::Enqueue { instance }) = &entries[i].f.fix {
                let mut inv = SCRIPTS.audit_enqueue.prepare_invoke();
                inv.key(ks.heartbeats())
                    .key(ks.heartbeat(instance))
                    .key(ks.instance_rooms(instance))
                    .key(ks.instance_peers(instance))
                    .arg(instance);
                pipe.invoke_script(&inv);
            }
        }
        let replies = exec(con, &mut pipe)?;
        for (&i, r) in chunk.iter().zip(replies) {
            entries[i].outcome = match conn::decode::<String>(OP, r) {
                Ok(s) => match s.as_str() {
                    "queued" | "empty" => Outcome::Repaired,
                    "registered" => Outcome::Resolved,
                    "alive" => Outcome::Left("its heartbeat key exists".into()),
                    "wrong_type" => Outcome::Left("a key holds the wrong type".into()),
                    other => Outcome::Left(format!("unexpected reply {other:?}")),
                },
                Err(e) => Outcome::Left(e.to_string()),
            };
        }
    }

    // 5. Removed control-plane entries whose record now names their instance (an operation
    // was in flight after all) go back: a removal never leaves a live record unindexed.
    let removed: Vec<usize> = unindex
        .into_iter()
        .filter(|&i| matches!(entries[i].outcome, Outcome::Repaired))
        .filter(|&i| {
            matches!(&entries[i].f.fix, Some(Fix::Unindex { verify, .. }) if *verify != Verify::Never)
        })
        .collect();
    if removed.is_empty() {
        return Ok(());
    }
    std::thread::sleep(settle);
    let con = &mut redis.connect()?;
    for chunk in removed.chunks(BATCH) {
        let mut pipe = redis::pipe();
        for &i in chunk {
            if let Some(Fix::Unindex { verify, .. }) = &entries[i].f.fix {
                match verify {
                    Verify::Room { room, .. } => {
                        let rk = ks.room(room);
                        pipe.get(&rk.owner).hget(&rk.meta, "owner");
                    }
                    Verify::Peer { room, peer, .. } => {
                        let rec = ks.peer(room, peer);
                        pipe.hget(&rec, "instance").hget(&rec, "instance");
                    }
                    Verify::Never => {
                        pipe.cmd("PING").cmd("PING");
                    }
                }
            }
        }
        let r = exec(con, &mut pipe)?;
        let mut back = redis::pipe();
        let mut back_idx = Vec::new();
        for (n, &i) in chunk.iter().enumerate() {
            let Some(Fix::Unindex {
                set,
                member,
                verify,
            }) = &entries[i].f.fix
            else {
                continue;
            };
            let a = get::<Option<String>>(r.get(2 * n)).flatten();
            let b = get::<Option<String>>(r.get(2 * n + 1)).flatten();
            let valid = match verify {
                Verify::Room { instance, .. } => room_names(a.as_deref(), b.as_deref(), instance),
                Verify::Peer { instance, .. } => a.as_deref() == Some(instance.as_str()),
                Verify::Never => false,
            };
            if valid {
                back.sadd(set, member).ignore();
                back_idx.push(i);
            }
        }
        if !back_idx.is_empty() {
            back.query::<()>(con).map_err(|e| Error::redis(OP, e))?;
            for i in back_idx {
                log::info!(
                    "audit: {} {:?} became valid meanwhile; put back",
                    entries[i].f.kind,
                    entries[i].f.key
                );
                entries[i].outcome = Outcome::Resolved;
            }
        }
    }
    Ok(())
}

/// Deletes one orphaned room with `audit_delete_room.lua` (records found by the scan first,
/// then the `peers` set batch by batch, then the room keys), then the deleted records' entries
/// in their instances' peer indexes and the room in its last owner's room index.
fn delete_room(
    ks: &KeySpace,
    con: &mut Connection,
    room: &str,
    meta_owner: &str,
    pinned_ms: &str,
    records: &[String],
) -> Result<Outcome> {
    let op = "audit: delete orphaned room";
    let rk = ks.room(room);
    let call = |con: &mut Connection, cursor: &str, peers: &[String]| -> Result<_> {
        let mut inv = SCRIPTS.audit_delete_room.prepare_invoke();
        inv.key(&rk.owner)
            .key(&rk.meta)
            .key(&rk.peers)
            .key(&rk.guests)
            .key(&rk.guest_state)
            .arg(meta_owner)
            .arg(pinned_ms)
            .arg(cursor)
            .arg(PEER_BATCH);
        for p in peers {
            inv.arg(p);
        }
        let (status, next, removed): (String, String, Vec<String>) = conn::call(con, op, &inv)?;
        let mut pipe = redis::pipe();
        for pair in removed.chunks_exact(2) {
            if !pair[1].is_empty() {
                pipe.srem(ks.instance_peers(&pair[1]), peer_member(room, &pair[0]))
                    .ignore();
            }
        }
        if !pipe.is_empty() {
            pipe.query::<()>(con).map_err(|e| Error::redis(op, e))?;
        }
        Ok((status, next))
    };
    let refused = |status: &str| match status {
        "owned" => Outcome::Left("the room was pinned meanwhile".into()),
        "changed" => Outcome::Left("the room's metadata changed meanwhile".into()),
        "wrong_type" => Outcome::Left("a key of the room holds the wrong type".into()),
        other => Outcome::Left(format!("unexpected reply {other:?}")),
    };
    for chunk in records.chunks(PEER_BATCH) {
        let (status, _) = call(con, "", chunk)?;
        if status != "more" {
            return Ok(refused(&status));
        }
    }
    let mut cursor = "0".to_owned();
    loop {
        let (status, next) = call(con, &cursor, &[])?;
        match status.as_str() {
            "more" => cursor = next,
            "deleted" => break,
            s => return Ok(refused(s)),
        }
    }
    if !meta_owner.is_empty() {
        redis::cmd("SREM")
            .arg(ks.instance_rooms(meta_owner))
            .arg(room)
            .query::<()>(con)
            .map_err(|e| Error::redis(op, e))?;
    }
    Ok(Outcome::Repaired)
}

#[cfg(test)]
mod tests {
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
