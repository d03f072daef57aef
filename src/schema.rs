//! The key schema version of a prefix, and the steps that move a prefix from one version to
//! the next (`sfu-redis migrate`).
//!
//! A prefix records the layout its keys are in under `P:{ctl}:schema` ([`KeySpace::schema`]),
//! a decimal string. This release reads and writes version [`SCHEMA_VERSION`]. A prefix
//! without a stamp but with a dataset token (`P:{ctl}:dataset`) was written by a release from
//! before stamps: its layout is version 1. A prefix with neither is new. The first heartbeat
//! on a new prefix writes the stamp (`heartbeat.lua`), and a registration on a prefix in
//! another version is refused ([`Error::Schema`]), so a node never writes one layout's keys
//! into another's (docs/DESIGN.md "Schema version").
//!
//! [`migrate`] plans (`apply: false`) or runs the steps from the prefix's version to this
//! release's:
//!
//! - **new prefix -> 2**: write the stamp (`SET NX`). Safe while nodes run.
//! - **1 -> 2**: version 2 dropped the per-instance peer indexes
//!   (`P:{ctl}:instance:<I>:peers`, `...:reaping-peers`, members `<room>/<peer>`): every peer
//!   record naming I must be in a room of I's room index (`...:rooms`, or `...:reaping-rooms`
//!   while I is being reaped), as the version 2 reaper walks only room indexes. The step folds
//!   each peer index into the room index beside it (the room of every member `SADD`ed, read
//!   in `SSCAN` pages; a member that is not `<room>/<peer>` in wire form is skipped and
//!   reported), deletes the peer indexes, and only then stamps `2` (a compare-and-set that
//!   replaces `1` or a missing stamp only). **It needs the fleet stopped**: a version 1 node
//!   keeps the records of rooms it lost reachable only through its peer index, which no
//!   version 2 reaper reads, and a version 1 node already running under a version 2 stamp
//!   keeps running. So it is refused while any instance is live (its heartbeat key
//!   `P:{ctl}:hb:<I>` exists and does not hold `released`), checked before the fold and again
//!   before the stamp ([`MigrateReport::live`]). Run again after an interruption, it finishes
//!   the job: a fold only adds, and the peer indexes go only after every fold.
//! - **2, with version 1 peer indexes left over** (a version 1 node ran on after the move):
//!   the same fold and delete (step 2 -> 2), with the same need for a stopped fleet. A prefix
//!   at version 2 without them has nothing to do, whatever runs on it.
//!
//! Every key the steps write is in the `{ctl}` slot; the keys are found with `SCAN` (on a
//! Redis Cluster, over every master), so the steps run on every topology.

use std::collections::BTreeSet;

use redis::Value;

use crate::config::Config;
use crate::conn::{Conn, Redis, MEMBERS_PER_COMMAND};
use crate::error::{Error, Result};
use crate::keys::{decode_id, split_peer_member, KeySpace, ParsedKey, SCHEMA_VERSION};
use crate::scan::{items_as, Cursor, Scan, LOOKUP_BATCH};

/// Room ids (and skipped members) a [`Fold`] lists by name; the rest are counted.
pub const FOLD_IDS_SHOWN: usize = 20;

/// Live instances a refusal names ([`MigrateReport::refusal`]); the rest are counted.
const LIVE_SHOWN: usize = 5;

/// The compare-and-set of the stamp that ends step 1 -> 2. An inline script on purpose (the
/// CLI's one-off path; `lua/` holds the node's scripts, preloaded on every connection):
/// `MULTI`/`WATCH` are not routed on a cluster connection.
///
/// KEYS[1] P:{ctl}:schema; ARGV[1] the version moved from; ARGV[2] the version moved to.
/// Reply {status, stamp before}: 'set' (the stamp was ARGV[1] or missing, now ARGV[2]),
/// 'already' (it held ARGV[2]), 'other' (anything else: left alone). A stamp of another type
/// fails the call (WRONGTYPE: bad data).
const STAMP_CAS: &str = r"
local v = redis.call('GET', KEYS[1])
if v == false or v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return {'set', v or ''}
end
if v == ARGV[2] then return {'already', v} end
return {'other', v}
";

/// One step of a migration.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MigrateStep {
    /// The version the step starts from; 0 for a new prefix (no stamp, no dataset token).
    pub from: u32,
    /// The version the prefix is in after the step.
    pub to: u32,
    /// What the step does, for people (one sentence).
    pub action: String,
    /// The step ran to its end (only with `apply`).
    pub done: bool,
    /// The fold steps (1 -> 2, and 2 -> 2 for leftovers): the version 1 peer indexes found,
    /// each folded (or to fold) into the room index beside it. Empty for other steps, or when
    /// there are none.
    pub folds: Vec<Fold>,
}

impl MigrateStep {
    /// The keys the step deletes (or deleted): the version 1 peer indexes of [`Self::folds`].
    pub fn deletes(&self) -> Vec<&str> {
        self.folds.iter().map(|f| f.from_key.as_str()).collect()
    }
}

/// One version 1 peer index folded into a room index (steps 1 -> 2 and 2 -> 2). Ids and keys
/// in wire form.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Fold {
    /// The instance the index belongs to.
    pub instance: String,
    /// The version 1 peer index: `P:{ctl}:instance:<I>:peers` or `...:reaping-peers`.
    pub from_key: String,
    /// The room index it goes into: `P:{ctl}:instance:<I>:rooms` or `...:reaping-rooms`.
    pub into_key: String,
    /// Members read.
    pub members: u64,
    /// Distinct rooms those members name.
    pub rooms: u64,
    /// Of those, rooms the room index did not hold: to add (a dry run), or added.
    pub new_rooms: u64,
    /// The first [`FOLD_IDS_SHOWN`] of the new rooms.
    pub new_room_ids: Vec<String>,
    /// Members that are not `<room>/<peer>` with both ids in wire form: skipped (the index
    /// is deleted with them).
    pub skipped: u64,
    /// The first [`FOLD_IDS_SHOWN`] skipped members (bytes that are not UTF-8 replaced).
    pub skipped_members: Vec<String>,
    /// `Some(type)` when the key held another type than a set: nothing to fold; deleted as
    /// bad data (version 2 has no such key).
    pub not_a_set: Option<String>,
}

/// What [`migrate`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MigrateReport {
    /// `<namespace>:<stage>:<branch>`.
    pub prefix: String,
    /// What the stamp held before: `None` when it was missing.
    pub found: Option<String>,
    /// The version the prefix was in: the stamp's, 1 for a prefix without a stamp but with a
    /// dataset token (written before stamps), `None` for a new prefix (neither).
    pub version: Option<u32>,
    /// The version this release speaks ([`SCHEMA_VERSION`]).
    pub speaks: u32,
    /// The steps from `version` to `speaks`, in order (empty: nothing to do).
    pub steps: Vec<MigrateStep>,
    /// Steps were run (`apply`), not only planned.
    pub applied: bool,
    /// Live instances (wire form, sorted) that refuse the migration: a step needs the fleet
    /// stopped and these instances' heartbeat keys hold a boot token (not `released`). Empty
    /// unless refused. Found before the first step, nothing was written; found only before
    /// the stamp (an instance started meanwhile), the folds ran but the stamp was not
    /// written (see [`MigrateStep::done`]).
    pub live: Vec<String>,
}

impl MigrateReport {
    /// The refusal for people when [`Self::live`] is not empty: which instances are live
    /// (at most five by name, then a count), what was written, and what to do.
    pub fn refusal(&self) -> Option<String> {
        if self.live.is_empty() {
            return None;
        }
        let shown: Vec<String> = self
            .live
            .iter()
            .take(LIVE_SHOWN)
            .map(|i| decode_id(i).unwrap_or_else(|_| i.clone()))
            .collect();
        let more = self.live.len().saturating_sub(LIVE_SHOWN);
        let names = if more > 0 {
            format!("{} and {more} more", shown.join(", "))
        } else {
            shown.join(", ")
        };
        let from = self.version.unwrap_or(0);
        // Folds are listed only once the first check passed.
        let written = if self.applied && self.steps.iter().any(|s| !s.folds.is_empty()) {
            "the peer indexes were folded already but the stamp was not written (an instance started during the run)"
        } else {
            "nothing was written"
        };
        Some(format!(
            "refused: {} live on prefix {} (a heartbeat key holding a boot token): {names}. Moving the prefix from key schema version {from} to {} needs the whole fleet stopped: stop them (or wait for their heartbeat keys to expire), then run `sfu-redis migrate --apply` again; {written} (docs/src/ops/schema.md \"Key schema versions\")",
            if self.live.len() == 1 {
                "1 instance is".to_owned()
            } else {
                format!("{} instances are", self.live.len())
            },
            self.prefix,
            self.speaks,
        ))
    }
}

/// The refusal of a prefix stamped `found`: [`Error::Schema`] naming this release's version.
pub(crate) fn refused(ks: &KeySpace, found: String) -> Error {
    Error::Schema {
        prefix: ks.prefix().to_owned(),
        found,
        speaks: SCHEMA_VERSION,
    }
}

/// Reads `P:{ctl}:schema` on `con`: `None` when missing; bytes that are not UTF-8 are
/// replaced (such a stamp names no version). A key of another type is bad data.
pub(crate) fn read_stamp(
    con: &mut impl redis::ConnectionLike,
    ks: &KeySpace,
) -> Result<Option<String>> {
    let key = ks.schema();
    redis::cmd("GET")
        .arg(&key)
        .query::<Option<Vec<u8>>>(con)
        .map(|v| v.map(|b| String::from_utf8_lossy(&b).into_owned()))
        .map_err(|e| Error::redis(format!("read the key schema version {key}"), e))
}

/// The version a stamp names, or [`Error::Schema`] when this release cannot move a prefix
/// from it (a newer version, or not a version as a release writes one: `"01"`, `" 1"` are
/// refused, as `heartbeat.lua` compares the exact string).
fn stamped_version(ks: &KeySpace, found: &str) -> Result<u32> {
    match crate::error::stamp_version(found) {
        Some(v) if (1..=SCHEMA_VERSION).contains(&v) => Ok(v),
        _ => Err(refused(ks, found.to_owned())),
    }
}

/// Plans (`apply` false: nothing is written) or runs the steps that bring `config`'s prefix
/// to [`SCHEMA_VERSION`] (the module's documentation lists them). A step that needs the
/// fleet stopped is not run while an instance is live: the report's
/// [`MigrateReport::live`] names them (with `apply` false too: the plan is what `apply`
/// would refuse). Errors: [`Error::Schema`] when the prefix is stamped with a version this
/// release does not know (newer, or not a number), or the stamp changed to one during the
/// run: nothing more is written; [`crate::ErrorKind::Redis`] when Redis cannot be reached or
/// a call fails (a run again finishes the job); bad data when the stamp is not a string or a
/// room index is not a set; an invalid configuration without a Redis URL.
pub fn migrate(config: &Config, apply: bool) -> Result<MigrateReport> {
    if config.redis_url().is_none() {
        return Err(Error::config(
            "redis_url",
            "migrate works on a prefix in Redis (set REDIS_URL); memory-only mode has no key schema",
        ));
    }
    let ks = config.keys();
    let redis = Redis::from_config(config)?;
    let mut con = redis.connect()?;
    let found = read_stamp(&mut con, ks)?;
    let version = match &found {
        Some(f) => Some(stamped_version(ks, f)?),
        None => has_dataset_token(&mut con, ks)?.then_some(1),
    };
    let mut report = MigrateReport {
        prefix: ks.prefix().to_owned(),
        found,
        version,
        speaks: SCHEMA_VERSION,
        steps: Vec::new(),
        applied: apply,
        live: Vec::new(),
    };
    match version {
        None => {
            // A new prefix: no node ever ran on it (a node writes the dataset token with its
            // first heartbeat).
            if apply {
                stamp(&mut con, ks, SCHEMA_VERSION)?;
            }
            report.steps.push(MigrateStep {
                from: 0,
                to: SCHEMA_VERSION,
                action: format!(
                    "stamp the new prefix with version {SCHEMA_VERSION} ({} = {SCHEMA_VERSION}): it has neither a stamp nor a dataset token",
                    ks.schema()
                ),
                done: apply,
                folds: Vec::new(),
            });
        }
        Some(1) => {
            let found = scan_ctl(&mut con, ks)?;
            let step = fold_peer_indexes(&mut con, ks, 1, found, apply, &mut report.live)?;
            report.steps.push(step);
        }
        Some(v) => {
            // This release's version: nothing to do, unless version 1 peer indexes are left
            // over (a version 1 node ran on after the move): they are folded the same way.
            let found = scan_ctl(&mut con, ks)?;
            if !found.peer_indexes.is_empty() {
                let step = fold_peer_indexes(&mut con, ks, v, found, apply, &mut report.live)?;
                report.steps.push(step);
            }
        }
    }
    Ok(report)
}

/// True when `P:{ctl}:dataset` exists: a node ran on the prefix.
fn has_dataset_token(con: &mut Conn, ks: &KeySpace) -> Result<bool> {
    redis::cmd("EXISTS")
        .arg(ks.dataset())
        .query(con)
        .map_err(|e| Error::redis("read the dataset token", e))
}

/// Step 1 -> 2 (the module's documentation), or from 2 the same fold of version 1 peer
/// indexes left over: refused while an instance is live (`live` filled, nothing written);
/// else each version 1 peer index of `found` folded into its room index (planned only
/// without `apply`), the peer indexes deleted, liveness checked again, and the stamp set to 2.
fn fold_peer_indexes(
    con: &mut Conn,
    ks: &KeySpace,
    from: u32,
    found: CtlKeys,
    apply: bool,
    live: &mut Vec<String>,
) -> Result<MigrateStep> {
    let action = if from == 1 {
        format!(
            "fold each version 1 peer index (P:{{ctl}}:instance:<I>:peers, :reaping-peers) into the room index beside it (:rooms, :reaping-rooms), delete the peer indexes, then stamp version 2 ({} = 2, replacing 1 or no stamp); needs every node of the prefix stopped",
            ks.schema()
        )
    } else {
        "fold the version 1 peer indexes left over under the version 2 stamp (a version 1 node ran on after the move) into the room indexes beside them and delete them; needs every node of the prefix stopped".to_owned()
    };
    let mut step = MigrateStep {
        from,
        to: 2,
        action,
        done: false,
        folds: Vec::new(),
    };
    *live = live_instances(con, ks, &found.heartbeats)?;
    if !live.is_empty() {
        return Ok(step);
    }
    for (instance, from_key, into_key) in &found.peer_indexes {
        step.folds
            .push(fold(con, instance, from_key, into_key, apply)?);
    }
    if !apply {
        return Ok(step);
    }
    if !step.folds.is_empty() {
        let mut pipe = redis::pipe();
        for f in &step.folds {
            pipe.cmd("UNLINK").arg(&f.from_key).ignore();
        }
        pipe.query::<()>(con)
            .map_err(|e| Error::redis("delete the version 1 peer indexes", e))?;
    }
    // An instance started since the first check (the operator did not stop the whole fleet):
    // no stamp under it. A run once it stopped folds what it wrote meanwhile.
    let again = scan_ctl(con, ks)?;
    *live = live_instances(con, ks, &again.heartbeats)?;
    if !live.is_empty() {
        return Ok(step);
    }
    stamp_over(con, ks, 1, 2)?;
    step.done = true;
    Ok(step)
}

/// What a `SCAN` of `P:{ctl}:*` found: heartbeat keys `(instance, key)` and version 1 peer
/// indexes `(instance, key, the room index it goes into)`, each sorted, without repeats.
#[derive(Debug, Default)]
struct CtlKeys {
    heartbeats: Vec<(String, String)>,
    peer_indexes: Vec<(String, String, String)>,
}

fn scan_ctl(con: &mut Conn, ks: &KeySpace) -> Result<CtlKeys> {
    let op = "list the prefix's control keys";
    let mut heartbeats = BTreeSet::new();
    let mut peer_indexes = BTreeSet::new();
    let mut cursor = Cursor::new(Scan::keys(format!("{}:{{ctl}}:*", ks.prefix())));
    while let Some(items) = cursor.next_page(con).map_err(|e| Error::redis(op, e))? {
        let names: Vec<Vec<u8>> = items_as(items).map_err(|e| Error::redis(op, e))?;
        for name in names {
            let Ok(key) = String::from_utf8(name) else {
                continue;
            };
            match ks.parse(&key) {
                Some(ParsedKey::Heartbeat(i)) => {
                    heartbeats.insert((i, key));
                }
                Some(ParsedKey::V1InstancePeers(i)) => {
                    let into = ks.instance_rooms(&i);
                    peer_indexes.insert((i, key, into));
                }
                Some(ParsedKey::V1InstanceReapingPeers(i)) => {
                    let into = ks.instance_reaping_rooms(&i);
                    peer_indexes.insert((i, key, into));
                }
                _ => {}
            }
        }
    }
    Ok(CtlKeys {
        heartbeats: heartbeats.into_iter().collect(),
        peer_indexes: peer_indexes.into_iter().collect(),
    })
}

/// The instances of `heartbeats` whose key holds a live boot token: any value but
/// `released`, or a key of another type (as `reap_force_begin.lua` judges them). A key gone
/// meanwhile is not live.
fn live_instances(
    con: &mut Conn,
    ks: &KeySpace,
    heartbeats: &[(String, String)],
) -> Result<Vec<String>> {
    let op = format!("read the heartbeat keys of {}", ks.prefix());
    let mut live = Vec::new();
    for chunk in heartbeats.chunks(LOOKUP_BATCH) {
        let mut pipe = redis::pipe();
        for (_, key) in chunk {
            pipe.cmd("GET").arg(key);
        }
        pipe.ignore_errors();
        let replies: Vec<redis::RedisResult<Value>> =
            pipe.query(con).map_err(|e| Error::redis(op.clone(), e))?;
        for ((instance, _), reply) in chunk.iter().zip(replies) {
            let is_live = match reply {
                Ok(Value::Nil) => false,
                Ok(Value::BulkString(b)) => b != b"released",
                Ok(Value::SimpleString(s)) => s != "released",
                Ok(_) => true,
                Err(e) if e.code() == Some("WRONGTYPE") => true,
                Err(e) => return Err(Error::redis(op, e)),
            };
            if is_live {
                live.push(instance.clone());
            }
        }
    }
    Ok(live)
}

/// The room of a version 1 peer index member, in wire form; `None` when the member is not
/// `<room>/<peer>` with both ids in wire form.
fn member_room(member: &[u8]) -> Option<&str> {
    let m = std::str::from_utf8(member).ok()?;
    let (room, peer) = split_peer_member(m)?;
    (decode_id(room).is_ok() && decode_id(peer).is_ok()).then_some(room)
}

/// Reads `from_key` in `SSCAN` pages and, per page, finds which of its rooms `into_key` does
/// not hold (`SMISMEMBER`) and, with `apply`, adds them (`SADD`, in the same round trip).
fn fold(
    con: &mut Conn,
    instance: &str,
    from_key: &str,
    into_key: &str,
    apply: bool,
) -> Result<Fold> {
    let op = format!("fold {from_key} into {into_key}");
    let mut f = Fold {
        instance: instance.to_owned(),
        from_key: from_key.to_owned(),
        into_key: into_key.to_owned(),
        ..Fold::default()
    };
    let kind: String = redis::cmd("TYPE")
        .arg(from_key)
        .query(con)
        .map_err(|e| Error::redis(op.clone(), e))?;
    if kind != "set" {
        if kind != "none" {
            f.not_a_set = Some(kind);
        }
        return Ok(f);
    }
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut cursor = Cursor::new(Scan::set(from_key));
    while let Some(items) = cursor
        .next_page(con)
        .map_err(|e| Error::redis(op.clone(), e))?
    {
        let members: Vec<Vec<u8>> = items_as(items).map_err(|e| Error::redis(op.clone(), e))?;
        let mut rooms = Vec::new();
        for m in &members {
            f.members += 1;
            match member_room(m) {
                Some(r) => {
                    if seen.insert(r.to_owned()) {
                        rooms.push(r.to_owned());
                    }
                }
                None => {
                    f.skipped += 1;
                    if f.skipped_members.len() < FOLD_IDS_SHOWN {
                        f.skipped_members
                            .push(String::from_utf8_lossy(m).into_owned());
                    }
                }
            }
        }
        for chunk in rooms.chunks(MEMBERS_PER_COMMAND) {
            let mut pipe = redis::pipe();
            pipe.cmd("SMISMEMBER").arg(into_key).arg(chunk);
            if apply {
                pipe.cmd("SADD").arg(into_key).arg(chunk).ignore();
            }
            let (held,): (Vec<bool>,) = pipe.query(con).map_err(|e| Error::redis(op.clone(), e))?;
            for (room, held) in chunk.iter().zip(held) {
                if !held {
                    f.new_rooms += 1;
                    if f.new_room_ids.len() < FOLD_IDS_SHOWN {
                        f.new_room_ids.push(room.clone());
                    }
                }
            }
        }
    }
    f.rooms = seen.len() as u64;
    Ok(f)
}

/// Writes version `v` where no stamp is (`SET NX`): a node that stamped meanwhile wrote the
/// same version or refuses to register on ours. Another version found then is an
/// [`Error::Schema`]; a stamp deleted again between the two commands is written again.
fn stamp(con: &mut impl redis::ConnectionLike, ks: &KeySpace, v: u32) -> Result<()> {
    let op = "write the key schema version";
    for _ in 0..3 {
        let set: Option<String> = redis::cmd("SET")
            .arg(ks.schema())
            .arg(v)
            .arg("NX")
            .query(con)
            .map_err(|e| Error::redis(op, e))?;
        if set.is_some() {
            return Ok(());
        }
        match read_stamp(con, ks)? {
            None => continue,
            Some(now) if now == v.to_string() => return Ok(()),
            Some(now) => return Err(refused(ks, now)),
        }
    }
    Err(Error::bad_data(
        op,
        format!(
            "{} was deleted three times while being written",
            ks.schema()
        ),
    ))
}

/// Replaces the stamp `from` (or a missing one) with `to` ([`STAMP_CAS`]). Another stamp
/// found there (written during the run) is an [`Error::Schema`]: left alone.
fn stamp_over(con: &mut Conn, ks: &KeySpace, from: u32, to: u32) -> Result<()> {
    let (status, before): (String, String) = redis::cmd("EVAL")
        .arg(STAMP_CAS)
        .arg(1)
        .arg(ks.schema())
        .arg(from)
        .arg(to)
        .query(con)
        .map_err(|e| Error::redis("write the key schema version", e))?;
    match status.as_str() {
        "set" | "already" => Ok(()),
        _ => Err(refused(ks, before)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_names_a_version_this_release_can_move_from_or_is_refused() {
        let ks = KeySpace::new("sfu", "dev", "main").unwrap();
        let speaks = format!("speaks version {SCHEMA_VERSION}");
        for v in 1..=SCHEMA_VERSION {
            assert_eq!(stamped_version(&ks, &v.to_string()).unwrap(), v);
        }
        let newer = (SCHEMA_VERSION + 1).to_string();
        for bad in [
            newer.as_str(),
            "0",
            "-1",
            "one",
            "",
            "1.0",
            "01",
            "+1",
            " 1",
            "1\n",
        ] {
            let e = stamped_version(&ks, bad).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Schema, "{bad:?}");
            let msg = e.to_string();
            assert!(msg.contains(&format!("{bad:?}")), "{msg}");
            assert!(msg.contains(&speaks), "{msg}");
            assert!(msg.contains("sfu:dev:main"), "{msg}");
        }
        // Garbage of any size makes a message of one short line.
        let e = stamped_version(&ks, &"x".repeat(100_000)).unwrap_err();
        let msg = e.to_string();
        assert!(msg.len() < 500, "{} bytes", msg.len());
        assert!(msg.contains(&format!("{}...", "x".repeat(64))), "{msg}");
    }

    #[test]
    fn a_member_folds_only_as_room_and_peer_in_wire_form() {
        assert_eq!(member_room(b"room-1/peer-1"), Some("room-1"));
        assert_eq!(member_room(b"room%3A1/p%2F2"), Some("room%3A1"));
        for bad in [
            &b"no-slash"[..],
            b"/peer",
            b"room/",
            b"a/b/c",
            b"room:1/p",
            b"r/p q",
            b"\xff/p",
            b"r/%zz",
        ] {
            assert_eq!(member_room(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
        let long = format!("{}/p", "r".repeat(300));
        assert_eq!(member_room(long.as_bytes()), None);
    }

    #[test]
    fn a_refusal_names_a_few_live_instances_then_counts() {
        let mut r = MigrateReport {
            prefix: "sfu:dev:main".into(),
            found: Some("1".into()),
            version: Some(1),
            speaks: 2,
            steps: Vec::new(),
            applied: false,
            live: Vec::new(),
        };
        assert_eq!(r.refusal(), None);
        r.live = vec!["node%3Aa".into()];
        let one = r.refusal().unwrap();
        assert!(one.contains("1 instance is live"), "{one}");
        assert!(one.contains(": node:a."), "{one}");
        assert!(one.contains("nothing was written"), "{one}");
        assert!(one.contains("sfu-redis migrate --apply"), "{one}");
        r.live = (0..8).map(|i| format!("n{i}")).collect();
        let many = r.refusal().unwrap();
        assert!(
            many.contains("8 instances are live") && many.contains("n0, n1, n2, n3, n4 and 3 more"),
            "{many}"
        );
        assert!(!many.contains("n5"), "{many}");
    }
}
