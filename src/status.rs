//! The fleet as Redis sees it: the leader and epoch, and each registered instance with its
//! heartbeat age on server time, its [`InstanceState`], and its room and peer counts. What
//! `sfu-redis status` prints.
//!
//! Status is a diagnostic tool, so it reads whatever it finds: garbage in the heartbeat sorted
//! set (a member that is not an instance id, a score that is not a whole number of ms) or a
//! key of the wrong type is reported as a problem of the item it concerns
//! ([`FleetStatus::problems`], [`InstanceStatus::problems`]) and the rest is still shown. Only
//! a failure to reach Redis fails the whole call.
//!
//! Each instance is judged with its own timings, read from the record it wrote at registration
//! (`P:{ctl}:instance:<I>:info`, [`crate::info`]); the [`Config`]'s stale threshold is used
//! only for an instance without a record (an older version, or a record lost with the data),
//! and for every instance when the caller overrides it ([`fleet_status_with_stale`], the
//! CLI's `--heartbeat-ttl-ms` / `--stale-factor`). A fleet whose records show more than one
//! version or more than one set of timings is flagged in [`FleetStatus::warnings`].
//!
//! What it sends: the sorted set is paged with `ZSCAN ... COUNT 1000` (the crate's pager,
//! [`crate::scan`]; never one `ZRANGE` over the whole set); each instance's keys are looked up
//! with `TYPE`/`GET`/`SCARD`/`HMGET` (its record's known fields only), pipelined for
//! [`STATUS_BATCH`] instances at a time. When no instance is registered, a bounded key-space
//! scan ([`PREFIX_SCAN_PAGES`] pages) lists the prefixes that do have a fleet on this Redis.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use redis::{RedisResult, Value};
use serde_json::{json, Value as Json};

use crate::config::Config;
use crate::conn::{self, Conn, Redis};
use crate::error::{Error, Result};
use crate::info::{InstanceInfo, REAPER_PAUSED_FIELDS, TIMING_FIELDS};
use crate::keys::{decode_id, KeySpace};
use crate::scan::{Cursor, Scan};

/// Instances whose keys are looked up in one pipeline.
pub const STATUS_BATCH: usize = crate::scan::LOOKUP_BATCH;

const OP: &str = "read fleet status";

/// Most `SCAN` pages (of [`crate::scan::SCAN_COUNT`] keys) read to list other prefixes when
/// this one has no instance: the hint is best effort and never holds Redis for long.
pub const PREFIX_SCAN_PAGES: usize = 50;

/// The record fields read with `HMGET` (every field [`crate::info`] documents).
const INFO_FIELDS: [&str; 22] = [
    "version",
    "host",
    "pid",
    "started_ms",
    TIMING_FIELDS[0],
    TIMING_FIELDS[1],
    TIMING_FIELDS[2],
    TIMING_FIELDS[3],
    TIMING_FIELDS[4],
    TIMING_FIELDS[5],
    TIMING_FIELDS[6],
    TIMING_FIELDS[7],
    TIMING_FIELDS[8],
    "reap_batch",
    "transport",
    // Not written by this version; read so a newer writer's knob shows up as a known field.
    "reap_pace",
    // Only while the instance, as the leader, skips reap rounds (`src/pause.rs`).
    REAPER_PAUSED_FIELDS[0],
    REAPER_PAUSED_FIELDS[1],
    REAPER_PAUSED_FIELDS[2],
    REAPER_PAUSED_FIELDS[3],
    REAPER_PAUSED_FIELDS[4],
    REAPER_PAUSED_FIELDS[5],
];

/// The value a cleanly stopped instance leaves in its heartbeat key (`heartbeat_release.lua`).
const RELEASED: &[u8] = b"released";

/// Where an instance stands, judged on Redis server time with its own stale threshold (its
/// record's, else the [`Config`]'s, or the caller's override).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InstanceState {
    /// Its heartbeat key exists (holding a live process's boot token) and its last heartbeat
    /// is younger than the stale threshold: it is heartbeating.
    Alive,
    /// Its heartbeat key holds `released`: the process stopped cleanly (`Node::shutdown`, the
    /// CLI on SIGTERM) and no longer heartbeats; the key keeps its TTL, so the instance
    /// becomes `late`, then `stale` and is reaped, unless it is restarted with the same id
    /// first (which then starts at once).
    Stopped,
    /// Its heartbeat key is gone (expired) but its last heartbeat is still younger than the
    /// stale threshold: it missed a beat or died recently; not a reap candidate yet.
    Late,
    /// Its last heartbeat is at least the stale threshold old: a reap candidate (the leader
    /// re-checks it after the two-phase delay; an instance whose heartbeat key still exists
    /// passes that re-check).
    Stale,
    /// Its score is 0: a leader started reaping it and has not finished.
    BeingReaped,
}

impl InstanceState {
    /// `alive`, `stopped`, `late`, `stale` or `being_reaped` (the `state` of
    /// `status --json`).
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceState::Alive => "alive",
            InstanceState::Stopped => "stopped",
            InstanceState::Late => "late",
            InstanceState::Stale => "stale",
            InstanceState::BeingReaped => "being_reaped",
        }
    }

    /// The state of an instance whose score is `score` (server ms), `age_ms` old, with or
    /// without a heartbeat key, released or not.
    fn judge(score: f64, age_ms: f64, heartbeat_key: bool, released: bool, stale_ms: f64) -> Self {
        if score == 0.0 {
            InstanceState::BeingReaped
        } else if age_ms.is_nan() || age_ms >= stale_ms {
            // Also a score that is not a number at all: nothing says it is alive.
            InstanceState::Stale
        } else if heartbeat_key && released {
            InstanceState::Stopped
        } else if heartbeat_key {
            InstanceState::Alive
        } else {
            InstanceState::Late
        }
    }
}

impl fmt::Display for InstanceState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One registered instance (one member of the heartbeat sorted set).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct InstanceStatus {
    /// Its id; the member as found (lossily decoded if it is not UTF-8) if it is not the wire
    /// form of an id (then [`problems`](Self::problems) says so).
    pub id: String,
    /// Server ms of its last heartbeat (0 while it is being reaped). A score that is not a
    /// whole number is truncated (saturating: `inf` gives `i64::MAX`) and flagged.
    pub last_heartbeat_ms: i64,
    /// Server time minus that, ms (saturating).
    pub age_ms: i64,
    /// Where it stands.
    pub state: InstanceState,
    /// `state == Alive`: its heartbeat key exists and its last heartbeat is within the stale
    /// threshold.
    pub alive: bool,
    /// `state == BeingReaped`: a leader started reaping it (score 0) and has not finished.
    pub being_reaped: bool,
    /// Members of its room index (0 when [`rooms_known`](Self::rooms_known) is false).
    pub rooms: u64,
    /// False when the room index could not be read (wrong type, or the member is not an id);
    /// [`problems`](Self::problems) says why. `rooms` is `null` in the JSON then.
    pub rooms_known: bool,
    /// Peers it held at its last heartbeat: the `peers` field of its record, written by every
    /// heartbeat (key schema version 2 keeps no per-instance peer index to count). 0 when
    /// [`peers_known`](Self::peers_known) is false.
    pub peers: u64,
    /// False when its record has no readable `peers` field (no record, not a heartbeat since
    /// it registered, or an older release); `peers` is `null` in the JSON then.
    pub peers_known: bool,
    /// The stale threshold its state was judged with, ms: its record's, else the
    /// configuration's, or the caller's override ([`fleet_status_with_stale`]).
    pub stale_threshold_ms: i64,
    /// Where that threshold came from: `record`, `default` (no record: the configuration's)
    /// or `override`.
    pub stale_threshold_from: &'static str,
    /// Its self-description ([`crate::info`]), `None` when it has no record (an older
    /// version, or the record was lost with Redis's data until the next registration).
    pub info: Option<InstanceInfo>,
    /// Server time since its registration (`started_ms` of its record), ms.
    pub uptime_ms: Option<i64>,
    /// What is wrong with this instance's entry or keys, one sentence each naming the key.
    pub problems: Vec<String>,
}

/// The fleet of one prefix.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct FleetStatus {
    /// `<namespace>:<stage>:<branch>`.
    pub prefix: String,
    /// Redis server time, ms.
    pub server_ms: i64,
    /// The stale threshold used for an instance without a record (the configuration's), or
    /// for every instance when [`stale_override`](Self::stale_override) is set, ms.
    pub stale_threshold_ms: i64,
    /// Every instance was judged with [`stale_threshold_ms`](Self::stale_threshold_ms)
    /// (the caller's override) instead of its own record's.
    pub stale_override: bool,
    /// The lease holder, if any (its raw value if it is not an instance id).
    pub leader: Option<String>,
    /// Remaining lease TTL, ms.
    pub leader_ttl_ms: Option<i64>,
    /// The lease holder is a registered instance in state [`InstanceState::Alive`]. False
    /// without a leader, or when the lease outlives its holder (the lease expires on its own).
    pub leader_alive: bool,
    /// Without a leader: why, and until when (one sentence; the rule is
    /// `lua/lease_acquire.lua`'s: no lease is granted until a lease TTL after the dataset
    /// token was written, so a leader of a lost dataset has passed its own deadline).
    pub leader_note: Option<String>,
    /// The lease holder skips its reap rounds (its record's `reaper_paused*` fields,
    /// [`crate::info::ReaperPaused`]): why, and since when, on server time, one line:
    /// `reaper paused: ticks slower than 500 ms (last 812 ms); 3 round(s) skipped in a row,
    /// the first 40.0 s ago, the last 2.0 s ago`. Stale instances are not reaped meanwhile.
    pub reaper_note: Option<String>,
    /// Server ms at which the dataset token (`P:{ctl}:dataset`) was written: when this
    /// dataset was first heartbeated on. `None` when the token is absent or not readable.
    pub dataset_created_ms: Option<i64>,
    /// What the prefix's key schema stamp (`P:{ctl}:schema`) holds: the version its layout
    /// is in (`"2"`); `None` when it is missing (a new prefix until a node registers; beside
    /// a dataset token, a prefix written before versions existed, layout 1, until
    /// `sfu-redis migrate --apply` moves it) or not a string (a problem then). A version other than [`crate::SCHEMA_VERSION`] is a problem too.
    pub schema: Option<String>,
    /// The Redis type of `P:{ctl}:schema` when it is not a string (bad data: the next
    /// heartbeat replaces it with this release's version).
    pub schema_type: Option<String>,
    /// The last epoch handed out (0 when [`epoch_known`](Self::epoch_known) is false).
    pub epoch: u64,
    /// False when the epoch key could not be read (wrong type, not a number); `epoch` is
    /// `null` in the JSON then.
    pub epoch_known: bool,
    /// Registered instances, by id.
    pub instances: Vec<InstanceStatus>,
    /// What is wrong with the control keys (heartbeat sorted set, lease, epoch), one sentence
    /// each naming the key. Problems of one instance are in its [`InstanceStatus::problems`].
    pub problems: Vec<String>,
    /// What an operator should know that is not a fault of a key: a fleet running mixed
    /// versions or mixed timings (from the instances' records), instances without a record.
    pub warnings: Vec<String>,
    /// When no instance is registered under this prefix: the prefixes that do have a
    /// heartbeat sorted set on this Redis (a bounded scan, at most [`PREFIX_SCAN_PAGES`]
    /// pages), so a wrong namespace, stage or branch is easy to spot.
    pub other_prefixes: Vec<String>,
    /// How Redis was reached (empty when the status was read on a caller's connection).
    pub route: RouteStatus,
}

/// How [`fleet_status`] reached Redis: the JSON `redis` object of `status --json`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteStatus {
    /// The URL without its password.
    pub url: String,
    /// `plain`, `tls`, `sentinel`, `sentinel+tls`, `cluster` or `cluster+tls`.
    pub transport: String,
    /// Sentinel URLs: the master name.
    pub master_name: Option<String>,
    /// Sentinel URLs: the master reached (`host:port`).
    pub master: Option<String>,
    /// Sentinel URLs: the sentinel that named it (`host:port`), `None` if every sentinel
    /// failed and the last known master was used.
    pub sentinel: Option<String>,
    /// Replicas connected to the server (its `ROLE`; 0 when unknown); on a cluster, the
    /// replicas its slot map lists for all masters.
    pub replicas: usize,
    /// Cluster URLs: every master (`host:port`, address order); empty otherwise.
    pub masters: Vec<String>,
    /// Cluster URLs: the master serving the control plane's slot (`{ctl}`: heartbeats,
    /// lease, indexes).
    pub ctl_master: Option<String>,
}

impl FleetStatus {
    /// The JSON object printed by `sfu-redis status --json`.
    pub fn to_json(&self) -> Json {
        json!({
            "prefix": self.prefix,
            "server_ms": self.server_ms,
            "stale_threshold_ms": self.stale_threshold_ms,
            "stale_override": self.stale_override,
            "leader": self.leader,
            "leader_ttl_ms": self.leader_ttl_ms,
            "leader_alive": self.leader_alive,
            "leader_note": self.leader_note,
            "reaper_note": self.reaper_note,
            "dataset_created_ms": self.dataset_created_ms,
            "schema": self.schema,
            "epoch": self.epoch_known.then_some(self.epoch),
            "redis": {
                "url": self.route.url,
                "transport": self.route.transport,
                "master_name": self.route.master_name,
                "master": self.route.master,
                "sentinel": self.route.sentinel,
                "replicas": self.route.replicas,
                "masters": self.route.masters,
                "ctl_master": self.route.ctl_master,
            },
            "instances": self.instances.iter().map(|i| json!({
                "id": i.id,
                "last_heartbeat_ms": i.last_heartbeat_ms,
                "age_ms": i.age_ms,
                "state": i.state.as_str(),
                "alive": i.alive,
                "being_reaped": i.being_reaped,
                "rooms": i.rooms_known.then_some(i.rooms),
                "peers": i.peers_known.then_some(i.peers),
                "stale_threshold_ms": i.stale_threshold_ms,
                "stale_threshold_from": i.stale_threshold_from,
                "version": i.info.as_ref().and_then(|r| r.version.clone()),
                "host": i.info.as_ref().and_then(|r| r.host.clone()),
                "pid": i.info.as_ref().and_then(|r| r.pid),
                "started_ms": i.info.as_ref().and_then(|r| r.started_ms),
                "uptime_ms": i.uptime_ms,
                "transport": i.info.as_ref().and_then(|r| r.transport.clone()),
                "timings": i.info.as_ref().map(timings_json),
                "reaper_paused": i.info.as_ref().and_then(|r| r.reaper_paused.as_ref()).map(paused_json),
                "problems": i.problems,
            })).collect::<Vec<_>>(),
            "problems": self.problems,
            "warnings": self.warnings,
            "other_prefixes": self.other_prefixes,
        })
    }

    /// True when neither the control keys nor any instance has a problem.
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty() && self.instances.iter().all(|i| i.problems.is_empty())
    }
}

/// Reads the fleet status of `config`'s prefix from `config`'s Redis. Each instance is judged
/// with the stale threshold of its own record, `config`'s for an instance without one.
///
/// Data this crate did not write (a key of the wrong type, a sorted-set member that is not an
/// id, a score that is not a whole number) does not fail the call: it is reported in
/// [`FleetStatus::problems`] or [`InstanceStatus::problems`].
///
/// # Errors
/// [`Error::InvalidConfig`] in memory-only mode (no Redis URL); [`Error::Redis`] when Redis
/// cannot be reached, times out, cannot tell the time, or refuses to page the heartbeat
/// sorted set for another reason than its type (a cluster that is down: `CLUSTERDOWN`; a
/// server loading its data; an ACL without the permission), so a fleet that cannot be read
/// is never shown as an empty one.
pub fn fleet_status(config: &Config) -> Result<FleetStatus> {
    fleet_status_with_stale(config, None)
}

/// [`fleet_status`], with `stale_override`: `Some(threshold)` judges every instance with it
/// instead of its record's (an operator who knows better, or a record of a fleet that was
/// reconfigured); `None` is [`fleet_status`].
///
/// # Errors
/// As [`fleet_status`].
pub fn fleet_status_with_stale(
    config: &Config,
    stale_override: Option<Duration>,
) -> Result<FleetStatus> {
    if config.redis_url().is_none() {
        return Err(Error::config(
            "redis_url",
            "status needs a Redis URL (set REDIS_URL)",
        ));
    }
    let redis = Redis::from_config(config)?;
    let mut con = redis.connect()?;
    let mut status = read(config, &mut con, stale_override, true)?;
    let route = redis.route();
    status.route = RouteStatus {
        url: redis.safe_url().to_owned(),
        transport: redis.transport().to_owned(),
        master_name: redis.master_name().map(str::to_owned),
        master: route.master,
        sentinel: route.via,
        replicas: if con.is_cluster() {
            con.cluster_replicas()
        } else {
            route.replicas
        },
        masters: con.cluster_masters(),
        ctl_master: con.cluster_master_of(&config.keys().leader()),
    };
    Ok(status)
}

/// [`fleet_status`] read on the caller's connection `con` (to `config`'s Redis), touching only
/// the servers of the control plane: no new connection (a cluster's slot map is not read
/// again) and no key-space scan for other prefixes ([`FleetStatus::other_prefixes`] stays
/// empty); [`FleetStatus::route`] is left empty. `sfu-redis doctor` reads the fleet on the
/// connection its checks use, so a master that does not answer is not waited for again.
///
/// # Errors
/// As [`fleet_status`].
pub fn fleet_status_on(config: &Config, con: &mut Conn) -> Result<FleetStatus> {
    read(config, con, None, false)
}

/// One member of the heartbeat sorted set, as read.
struct Member {
    raw: Vec<u8>,
    /// The id for people: decoded, else the raw member (lossy).
    id: String,
    /// The wire form, if the member is the wire form of an id.
    wire: Option<String>,
    score: f64,
    problems: Vec<String>,
}

fn exec(con: &mut Conn, pipe: &mut redis::Pipeline, n: usize) -> Result<Vec<Reply>> {
    let replies = conn::exec(con, pipe).map_err(|e| Error::redis(OP, e))?;
    if replies.len() != n {
        return Err(Error::bad_data(
            OP,
            format!("{} replies to a pipeline of {n} commands", replies.len()),
        ));
    }
    Ok(replies)
}

type Reply = RedisResult<Value>;

/// A Redis type name for people.
fn type_name(t: &str) -> &str {
    match t {
        "zset" => "sorted set",
        other => other,
    }
}

/// The reply of `TYPE`, or the error text.
fn key_type(r: &Reply) -> std::result::Result<String, String> {
    match r {
        Ok(v) => redis::from_redis_value_ref::<String>(v).map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// `(id for people, wire form if it is one)`.
fn show_id(raw: &[u8]) -> (String, Option<String>) {
    match std::str::from_utf8(raw) {
        Ok(s) => match decode_id(s) {
            Ok(id) => (id, Some(s.to_owned())),
            Err(_) => (s.to_owned(), None),
        },
        Err(_) => (String::from_utf8_lossy(raw).into_owned(), None),
    }
}

/// A score as Redis sent it.
fn score_of(v: &Value) -> Option<f64> {
    match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.trim().parse().ok(),
        Value::SimpleString(s) => s.trim().parse().ok(),
        Value::Double(d) => Some(*d),
        Value::Int(i) => Some(*i as f64),
        _ => None,
    }
}

fn member_bytes(v: Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.into_bytes()),
        _ => None,
    }
}

/// Pages through the heartbeat sorted set with `ZSCAN` (the crate's pager, [`crate::scan`]),
/// its `TYPE` read in the same round trip. A wrong-typed key or an unexpected reply is a
/// problem of the fleet (and the instances read so far are kept).
fn scan_members(
    con: &mut Conn,
    key: &str,
    problems: &mut Vec<String>,
) -> Result<BTreeMap<Vec<u8>, f64>> {
    let mut members = BTreeMap::new();
    let mut cursor = Cursor::new(Scan::sorted_set(key));
    while !cursor.done() {
        let mut pipe = redis::pipe();
        cursor.add_to(&mut pipe);
        pipe.cmd("TYPE").arg(key);
        let mut replies = exec(con, &mut pipe, 2)?.into_iter();
        let (page, ty) = (replies.next(), replies.next());
        let items = match page {
            Some(Ok(v)) => cursor.advance(v).ok(),
            // Bad data (the key holds another type) is a problem of the fleet; any other
            // error (`CLUSTERDOWN`, `LOADING`, `NOPERM`, ...) means the fleet cannot be read
            // at all: an error, never an empty fleet.
            Some(Err(e)) if e.code() == Some("WRONGTYPE") || wrong_type(ty.as_ref()) => {
                problems.push(unreadable(key, &e, ty.as_ref()));
                return Ok(members);
            }
            Some(Err(e)) => return Err(Error::redis(format!("read {key}"), e)),
            None => None,
        };
        let Some(items) = items else {
            problems.push(format!(
                "{key}: unexpected ZSCAN reply; instances not listed"
            ));
            return Ok(members);
        };
        let mut items = items.into_iter();
        while let (Some(member), Some(score)) = (items.next(), items.next()) {
            let score = score_of(&score).unwrap_or(f64::NAN);
            match member_bytes(member) {
                Some(raw) => {
                    members.insert(raw, score);
                }
                None => problems.push(format!("{key}: a member that is not a string")),
            }
        }
    }
    Ok(members)
}

/// Whether a `TYPE` reply names another type than a sorted set (or no key).
fn wrong_type(ty: Option<&Reply>) -> bool {
    matches!(ty.map(key_type), Some(Ok(t)) if t != "zset" && t != "none")
}

/// Why the sorted set could not be paged: it holds another type (its `TYPE` reply `ty`
/// says), or the error `e`.
fn unreadable(key: &str, e: &redis::RedisError, ty: Option<&Reply>) -> String {
    match ty.map(key_type) {
        Some(Ok(t)) if t != "zset" => format!(
            "{key} holds a {}, not a sorted set: no instance can register or be reaped",
            type_name(&t)
        ),
        _ => format!("cannot read {key}: {e}"),
    }
}

/// What is wrong with a score (server ms), if anything. `now` is the server time read after
/// the scan, so a heartbeat's score is never ahead of it unless the server clock went back.
fn score_problem(key: &str, id: &str, score: f64, now: i64) -> Option<String> {
    let what = if score.is_nan() {
        "is not a number".to_owned()
    } else if !score.is_finite() {
        format!("is {score}, not a time")
    } else if score.fract() != 0.0 {
        format!("is {score}, not a whole number of server ms")
    } else if score < 0.0 {
        format!("is {score}, a negative time")
    } else if score > now as f64 {
        format!(
            "is {score}, {} ms ahead of the server time {now}",
            score - now as f64
        )
    } else {
        return None;
    };
    Some(format!("{key}: the score of {id:?} {what}"))
}

/// `hint`: list the other prefixes when this one has none (a key-space scan of every master).
fn read(
    config: &Config,
    con: &mut Conn,
    stale_override: Option<Duration>,
    hint: bool,
) -> Result<FleetStatus> {
    let ks = config.keys();
    let stale = stale_override.unwrap_or(config.timings().stale_threshold);
    let judge = Judge {
        fallback_ms: stale.as_millis() as f64,
        overridden: stale_override.is_some(),
    };
    let mut problems = Vec::new();
    let zset = ks.heartbeats();
    let scanned = scan_members(con, &zset, &mut problems)?;
    // The clock, lease and epoch, read after the scan (so no score read is newer than `now`).
    let head = read_head(con, ks, &mut problems)?;
    let now = head.now;
    let members = members(&zset, scanned, now);
    let instances = read_instances(con, ks, members, now, &judge)?;
    let leader_alive = head.leader_raw.as_ref().is_some_and(|raw| {
        instances
            .iter()
            .any(|(m, i)| &m.raw == raw && i.state == InstanceState::Alive)
    });
    // The leader's note only: another instance's is left from an earlier term (it clears it
    // at its next reap interval).
    let reaper_note = head.leader_raw.as_ref().and_then(|raw| {
        instances
            .iter()
            .find(|(m, _)| &m.raw == raw)
            .and_then(|(_, i)| i.info.as_ref()?.reaper_paused.as_ref())
            .map(|p| p.message_at(now))
    });
    let instances: Vec<InstanceStatus> = instances.into_iter().map(|(_, i)| i).collect();
    let leader_note = head
        .leader
        .is_none()
        .then(|| no_leader_note(&head, &instances, config));
    let other_prefixes = if hint && instances.is_empty() {
        other_prefixes(con, ks.prefix())
    } else {
        Vec::new()
    };
    Ok(FleetStatus {
        prefix: ks.prefix().to_owned(),
        server_ms: now,
        stale_threshold_ms: i64::try_from(stale.as_millis()).unwrap_or(i64::MAX),
        stale_override: judge.overridden,
        leader: head.leader,
        leader_ttl_ms: head.leader_ttl_ms,
        leader_alive,
        leader_note,
        reaper_note,
        dataset_created_ms: head.dataset_created_ms,
        schema: head.schema,
        schema_type: head.schema_type,
        epoch: head.epoch,
        epoch_known: head.epoch_known,
        warnings: fleet_warnings(&instances),
        instances,
        problems,
        other_prefixes,
        route: RouteStatus::default(),
    })
}

/// How instances are judged: with their own record's stale threshold unless overridden.
struct Judge {
    /// The configuration's threshold (or the override), ms.
    fallback_ms: f64,
    overridden: bool,
}

/// The record's timings as a JSON object (`null` for a field it lacks).
fn timings_json(info: &InstanceInfo) -> Json {
    let mut map = serde_json::Map::new();
    for (name, v) in TIMING_FIELDS.iter().zip(info.timings_ms) {
        map.insert((*name).to_owned(), json!(v));
    }
    map.insert("reap_batch".into(), json!(info.reap_batch));
    Json::Object(map)
}

/// A record's `reaper_paused*` fields as the JSON object of `status --json`.
fn paused_json(p: &crate::info::ReaperPaused) -> Json {
    json!({
        "reason": p.reason,
        "slow_ticks": p.slow_ticks,
        "redis_errors": p.redis_errors,
        "tick_ms": p.tick_ms,
        "slow_after_ms": p.slow_after_ms,
        "at_ms": p.at_ms,
        "since_ms": p.since_ms,
        "rounds": p.rounds,
        "message": p.message(),
    })
}

/// Mixed versions, mixed timings, instances without a record: one sentence each.
fn fleet_warnings(instances: &[InstanceStatus]) -> Vec<String> {
    let mut warnings = Vec::new();
    let mut versions: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    let mut timings: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    let mut unrecorded = Vec::new();
    for i in instances {
        match &i.info {
            Some(r) => {
                let v = r.version.clone().unwrap_or_else(|| "unknown".into());
                versions.entry(v).or_default().push(&i.id);
                timings.entry(r.timings_summary()).or_default().push(&i.id);
            }
            None => unrecorded.push(i.id.as_str()),
        }
    }
    let list = |groups: &BTreeMap<String, Vec<&str>>| {
        groups
            .iter()
            .map(|(k, ids)| format!("{k} ({})", ids.join(", ")))
            .collect::<Vec<_>>()
            .join("; ")
    };
    if versions.len() > 1 {
        warnings.push(format!("mixed versions: {}", list(&versions)));
    }
    if timings.len() > 1 {
        warnings.push(format!(
            "mixed timings (each instance is judged with its own, by status and by the reaper): {}",
            list(&timings)
        ));
    }
    if !unrecorded.is_empty() {
        warnings.push(format!(
            "no instance record (P:{{ctl}}:instance:<I>:info) for {}: judged with the default stale threshold; it is written again at the next registration",
            unrecorded.join(", ")
        ));
    }
    warnings
}

/// Why nobody holds the lease, and until when (`lua/lease_acquire.lua`'s rules).
fn no_leader_note(head: &Head, instances: &[InstanceStatus], config: &Config) -> String {
    let alive = instances
        .iter()
        .filter(|i| i.state == InstanceState::Alive)
        .count();
    if instances.is_empty() {
        return "no instance is registered under this prefix".into();
    }
    if alive == 0 {
        return "no instance is alive to take the lease".into();
    }
    // The longest lease TTL among the records (what the first acquire must wait out).
    let lease_ttl = instances
        .iter()
        .filter_map(|i| i.info.as_ref()?.timing("lease_ttl_ms"))
        .max()
        .unwrap_or(config.timings().lease_ttl)
        .as_millis() as i64;
    match head.dataset_created_ms {
        Some(created) if head.now - created < lease_ttl => format!(
            "a new dataset: no lease is granted until a lease TTL ({lease_ttl} ms) after the dataset token was written at server ms {created}, in about {} ms (a leader of a lost dataset may still act until its own deadline)",
            lease_ttl - (head.now - created)
        ),
        None if !head.dataset_present => format!(
            "no dataset token yet (the first heartbeat writes it): no lease is granted until a lease TTL ({lease_ttl} ms) after it"
        ),
        _ => "the lease is free: the next election of an alive instance (every lease refresh interval) takes it".into(),
    }
}

/// The prefixes with a heartbeat sorted set on this Redis, other than `mine`: a bounded
/// key-space scan, best effort (an error ends it quietly: this is a hint).
fn other_prefixes(con: &mut Conn, mine: &str) -> Vec<String> {
    const SUFFIX: &str = ":{ctl}:heartbeats";
    let mut found = std::collections::BTreeSet::new();
    let mut cursor = Cursor::new(Scan::keys(format!("*{SUFFIX}")));
    for _ in 0..PREFIX_SCAN_PAGES {
        if cursor.done() {
            break;
        }
        let Ok(Some(items)) = cursor.next_page(con) else {
            break;
        };
        for v in items {
            if let Some(prefix) = member_bytes(v)
                .and_then(|b| String::from_utf8(b).ok())
                .and_then(|k| k.strip_suffix(SUFFIX).map(str::to_owned))
            {
                if prefix != mine {
                    found.insert(prefix);
                }
            }
        }
    }
    found.into_iter().collect()
}

/// The server clock, the lease and the epoch, read in one round trip.
struct Head {
    now: i64,
    /// The lease holder for people, and its raw value.
    leader: Option<String>,
    leader_raw: Option<Vec<u8>>,
    leader_ttl_ms: Option<i64>,
    epoch: u64,
    epoch_known: bool,
    /// The dataset token's creation time (`<random>:<server ms>`), if readable.
    dataset_created_ms: Option<i64>,
    /// The dataset token exists (whatever its form).
    dataset_present: bool,
    /// The key schema stamp, if it is a string (at most 64 characters shown).
    schema: Option<String>,
    /// Its type when it is not a string.
    schema_type: Option<String>,
}

fn read_head(con: &mut Conn, ks: &KeySpace, problems: &mut Vec<String>) -> Result<Head> {
    let (leader_key, epoch_key, dataset_key) = (ks.leader(), ks.epoch(), ks.dataset());
    let mut pipe = redis::pipe();
    pipe.cmd("TIME")
        .cmd("TYPE")
        .arg(&leader_key)
        .get(&leader_key)
        .pttl(&leader_key)
        .cmd("TYPE")
        .arg(&epoch_key)
        .get(&epoch_key)
        .get(&dataset_key);
    let schema_key = ks.schema();
    pipe.cmd("TYPE").arg(&schema_key).get(&schema_key);
    let head = exec(con, &mut pipe, 9)?;
    let now = match &head[0] {
        Ok(v) => conn::time_reply_ms(v)?,
        Err(e) => return Err(Error::redis("read the server time", e.clone())),
    };
    let (leader, leader_raw, leader_ttl_ms) = lease(&leader_key, &head[1..4], problems);
    let (epoch, epoch_known) = epoch(&epoch_key, &head[4..6], problems);
    let dataset = match &head[6] {
        Ok(Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    };
    let dataset_created_ms = dataset
        .as_deref()
        .and_then(|d| d.rsplit_once(':'))
        .and_then(|(_, ms)| ms.parse::<i64>().ok());
    let mut schema_type = None;
    let schema = match key_type(&head[7]) {
        Ok(t) if t == "none" => None,
        Ok(t) if t == "string" => match &head[8] {
            Ok(Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        },
        Ok(t) => {
            problems.push(format!(
                "{schema_key} holds a {t}, not the key schema version (a string): the heartbeat replaces it with version {}",
                crate::SCHEMA_VERSION
            ));
            schema_type = Some(t);
            None
        }
        Err(_) => None,
    };
    if let Some(v) = schema
        .as_deref()
        .filter(|v| *v != crate::SCHEMA_VERSION.to_string())
    {
        problems.push(format!(
            "{schema_key} names key schema version {:?}; this release speaks version {}: its nodes refuse to register here and this status may misread the keys (docs/src/ops/schema.md \"Key schema versions\")",
            crate::error::stamp_shown(v),
            crate::SCHEMA_VERSION
        ));
    }
    let schema = schema.map(|v| crate::error::stamp_shown(&v));
    Ok(Head {
        schema,
        schema_type,
        dataset_created_ms,
        dataset_present: dataset.is_some(),
        now,
        leader,
        leader_raw,
        leader_ttl_ms,
        epoch,
        epoch_known,
    })
}

/// The lease from its `TYPE`, `GET` and `PTTL` replies: holder (for people), raw value, TTL.
fn lease(
    leader_key: &str,
    r: &[Reply],
    problems: &mut Vec<String>,
) -> (Option<String>, Option<Vec<u8>>, Option<i64>) {
    let mut ttl_ms = None;
    match key_type(&r[0]) {
        Ok(t) if t == "none" => {}
        Ok(t) if t == "string" => match &r[1] {
            Ok(Value::BulkString(raw)) => {
                let (id, wire) = show_id(raw);
                if wire.is_none() {
                    problems.push(format!(
                        "{leader_key}: the lease value {id:?} is not an instance id"
                    ));
                }
                match &r[2] {
                    Ok(Value::Int(ttl)) if *ttl >= 0 => ttl_ms = Some(*ttl),
                    Ok(Value::Int(-1)) => problems.push(format!(
                        "{leader_key} has no TTL (not written by sfu-redis): the next election replaces it"
                    )),
                    _ => {} // expired meanwhile
                }
                return (Some(id), Some(raw.clone()), ttl_ms);
            }
            Ok(Value::Nil) => {} // expired meanwhile
            Ok(other) => problems.push(format!("{leader_key}: unexpected value {other:?}")),
            Err(e) => problems.push(format!("cannot read {leader_key}: {e}")),
        },
        Ok(t) => {
            let then = match &r[2] {
                Ok(Value::Int(ttl)) if *ttl >= 0 => {
                    format!("elections wait until it expires in {ttl} ms")
                }
                _ => "the next election replaces it".to_owned(),
            };
            problems.push(format!(
                "{leader_key} holds a {}, not a string: nobody holds the lease; {then}",
                type_name(&t)
            ));
        }
        Err(e) => problems.push(format!("cannot read the type of {leader_key}: {e}")),
    }
    (None, None, ttl_ms)
}

/// The epoch from its `TYPE` and `GET` replies, and whether it could be read (0 when unset).
fn epoch(epoch_key: &str, r: &[Reply], problems: &mut Vec<String>) -> (u64, bool) {
    match key_type(&r[0]) {
        Ok(t) if t == "none" => (0, true),
        Ok(t) if t == "string" => match &r[1] {
            Ok(Value::Nil) => (0, true),
            Ok(v) => match redis::from_redis_value_ref::<String>(v)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
            {
                Some(n) => (n, true),
                None => {
                    let shown = match v {
                        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                        other => format!("{other:?}"),
                    };
                    problems.push(format!(
                        "{epoch_key}: {shown:?} is not an epoch (a whole number); the next election replaces it"
                    ));
                    (0, false)
                }
            },
            Err(e) => {
                problems.push(format!("cannot read {epoch_key}: {e}"));
                (0, false)
            }
        },
        Ok(t) => {
            problems.push(format!(
                "{epoch_key} holds a {}, not a counter: the next election replaces it",
                type_name(&t)
            ));
            (0, false)
        }
        Err(e) => {
            problems.push(format!("cannot read the type of {epoch_key}: {e}"));
            (0, false)
        }
    }
}

/// The sorted set's members with the problems of their names and scores, sorted by id.
fn members(zset: &str, scanned: BTreeMap<Vec<u8>, f64>, now: i64) -> Vec<Member> {
    let mut members: Vec<Member> = scanned
        .into_iter()
        .map(|(raw, score)| {
            let (id, wire) = show_id(&raw);
            let mut problems = Vec::new();
            if wire.is_none() {
                let what = if std::str::from_utf8(&raw).is_err() {
                    "is not UTF-8"
                } else {
                    "is not the wire form of an instance id"
                };
                problems.push(format!(
                    "{zset}: member {id:?} {what} (not written by sfu-redis); its keys are not read"
                ));
            }
            problems.extend(score_problem(zset, &id, score, now));
            Member {
                raw,
                id,
                wire,
                score,
                problems,
            }
        })
        .collect();
    members.sort_by(|a, b| a.id.cmp(&b.id).then_with(|| a.raw.cmp(&b.raw)));
    members
}

/// Each member's heartbeat key and index counts, [`STATUS_BATCH`] members per round trip, and
/// its state; each status stays paired with its member (for the leader's liveness).
fn read_instances(
    con: &mut Conn,
    ks: &KeySpace,
    mut members: Vec<Member>,
    now: i64,
    judge: &Judge,
) -> Result<Vec<(Member, InstanceStatus)>> {
    let mut instances = Vec::with_capacity(members.len());
    for batch in members.chunks_mut(STATUS_BATCH) {
        let mut pipe = redis::pipe();
        let mut n = 0;
        for w in batch.iter().filter_map(|m| m.wire.as_ref()) {
            let (rooms, info) = (ks.instance_rooms(w), ks.instance_info(w));
            let hb = ks.heartbeat(w);
            pipe.cmd("TYPE")
                .arg(&hb)
                .get(&hb)
                .cmd("TYPE")
                .arg(&rooms)
                .scard(&rooms)
                .cmd("TYPE")
                .arg(&info)
                .cmd("HMGET")
                .arg(&info)
                .arg(&INFO_FIELDS[..])
                // What a reap under way moved aside (reap_begin.lua) still counts.
                .scard(ks.instance_reaping_rooms(w))
                .hget(&info, "peers");
            n += PER_INSTANCE;
        }
        let mut replies = exec(con, &mut pipe, n)?.into_iter();
        for m in batch.iter_mut() {
            let r: Vec<Reply> = match m.wire {
                Some(_) => replies.by_ref().take(PER_INSTANCE).collect(),
                None => Vec::new(),
            };
            instances.push(instance_status(ks, m, &r, now, judge));
        }
    }
    Ok(members.into_iter().zip(instances).collect())
}

/// Commands sent per instance by [`read_instances`].
const PER_INSTANCE: usize = 8;

/// One instance from its [`PER_INSTANCE`] replies (none for a member that is not an id).
fn instance_status(
    ks: &KeySpace,
    m: &mut Member,
    r: &[Reply],
    now: i64,
    judge: &Judge,
) -> InstanceStatus {
    let mut hb = false;
    let mut released = false;
    let mut rooms = None;
    let mut peers = None;
    let mut info = None;
    if let Some(w) = &m.wire {
        let hb_key = ks.heartbeat(w);
        match key_type(&r[0]) {
            Ok(t) if t == "none" => {}
            Ok(t) if t == "string" => {
                hb = true;
                released = matches!(&r[1], Ok(Value::BulkString(b)) if b.as_slice() == RELEASED);
            }
            Ok(t) => {
                // The reaper checks EXISTS: any type counts as a heartbeat.
                hb = true;
                m.problems.push(format!(
                    "{hb_key} holds a {}, not a string (it still counts as a heartbeat)",
                    type_name(&t)
                ));
            }
            Err(e) => m.problems.push(format!(
                "cannot read the type of {hb_key} ({e}); taken as absent"
            )),
        }
        // A moved index of another type counts as empty (bad data a reap deletes; fsck names it).
        let moved = |r: &Reply| match r {
            Ok(v) => redis::from_redis_value_ref::<u64>(v).unwrap_or(0),
            Err(_) => 0,
        };
        rooms =
            count(&ks.instance_rooms(w), &r[2], &r[3], &mut m.problems).map(|n| n + moved(&r[6]));
        info = record(&ks.instance_info(w), &r[4], &r[5], &mut m.problems);
        // A record of another type was reported by `record`; a field that is not a count
        // leaves the count unknown.
        peers = match &r[7] {
            Ok(v) => redis::from_redis_value_ref::<Option<String>>(v)
                .ok()
                .flatten()
                .and_then(|s| s.parse::<u64>().ok()),
            Err(_) => None,
        };
    }
    let own = info
        .as_ref()
        .and_then(InstanceInfo::stale_threshold)
        .filter(|_| !judge.overridden);
    let (stale_ms, from) = match own {
        Some(d) => (d.as_millis() as f64, "record"),
        None if judge.overridden => (judge.fallback_ms, "override"),
        None => (judge.fallback_ms, "default"),
    };
    let age = now as f64 - m.score;
    let state = InstanceState::judge(m.score, age, hb, released, stale_ms);
    // `as` saturates (and maps NaN to 0).
    let last = m.score as i64;
    InstanceStatus {
        id: m.id.clone(),
        last_heartbeat_ms: last,
        age_ms: now.saturating_sub(last),
        state,
        alive: state == InstanceState::Alive,
        being_reaped: state == InstanceState::BeingReaped,
        rooms: rooms.unwrap_or(0),
        rooms_known: rooms.is_some(),
        peers: peers.unwrap_or(0),
        peers_known: peers.is_some(),
        stale_threshold_ms: stale_ms as i64,
        stale_threshold_from: from,
        uptime_ms: info
            .as_ref()
            .and_then(|r| r.started_ms)
            .map(|s| now.saturating_sub(s)),
        info,
        problems: std::mem::take(&mut m.problems),
    }
}

/// The instance's record from its `TYPE` and `HMGET` replies: `None` when there is none, or
/// (with a problem naming the key) when it is not a hash or cannot be read. A field that is
/// missing or garbage is a problem too, and the rest of the record is still used.
fn record(
    key: &str,
    ty: &Reply,
    values: &Reply,
    problems: &mut Vec<String>,
) -> Option<InstanceInfo> {
    match key_type(ty) {
        Ok(t) if t == "none" => return None,
        Ok(t) if t == "hash" => {}
        Ok(t) => {
            problems.push(format!(
                "{key} holds a {}, not a hash: the record is ignored (the next registration rewrites it)",
                type_name(&t)
            ));
            return None;
        }
        Err(e) => {
            problems.push(format!("cannot read the type of {key} ({e})"));
            return None;
        }
    }
    let values = match values {
        Ok(Value::Array(vs)) => vs,
        Ok(other) => {
            problems.push(format!("{key}: unexpected HMGET reply {other:?}"));
            return None;
        }
        Err(e) => {
            problems.push(format!("cannot read {key} ({e})"));
            return None;
        }
    };
    let pairs: Vec<(String, String)> = INFO_FIELDS
        .iter()
        .zip(values)
        .filter_map(|(name, v)| match v {
            Value::BulkString(b) => Some(((*name).to_owned(), String::from_utf8_lossy(b).into())),
            _ => None,
        })
        .collect();
    let (info, bad) = InstanceInfo::from_fields(&pairs);
    problems.extend(bad.into_iter().map(|p| format!("{key}: {p}")));
    Some(info)
}

/// The `SCARD` of an index set, or `None` (with a problem naming the key) when it holds
/// another type or cannot be read.
fn count(key: &str, ty: &Reply, card: &Reply, problems: &mut Vec<String>) -> Option<u64> {
    match card {
        Ok(v) => match redis::from_redis_value_ref::<u64>(v) {
            Ok(n) => Some(n),
            Err(e) => {
                problems.push(format!(
                    "{key}: unexpected SCARD reply ({e}); count unknown"
                ));
                None
            }
        },
        Err(e) => {
            problems.push(match key_type(ty) {
                Ok(t) if t != "set" && t != "none" => {
                    format!("{key} holds a {}, not a set: count unknown", type_name(&t))
                }
                _ => format!("cannot read {key} ({e}); count unknown"),
            });
            None
        }
    }
}
