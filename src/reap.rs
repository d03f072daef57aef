//! An operator's reap of one instance, now (`sfu-redis reap --instance ID`): no stale wait, no
//! two-phase delay, no lease, and the leader's own steps otherwise.
//!
//! [`reap_instance`] follows the leader's order (`crate::reaper`'s module docs) with one
//! different first step: `reap_force_begin.lua` instead of `reap_begin.lua`. It checks, on
//! Redis server time and atomically, that the instance may be reaped, and marks it as being
//! reaped (score 0). Then the rooms and peer records go with the leader's owner-CAS script
//! (`reap_room.lua`) in the leader's batches, and `reap_finish.lua` ends it.
//!
//! # When an instance is refused ([`Refusal`])
//!
//! - its heartbeat key holds a live boot token (any value but `released`, written by
//!   `heartbeat.lua` while the process runs): never reaped, even with [`ReapOptions::force`];
//! - its heartbeat key holds `released` (a clean stop whose key has not expired yet), or its
//!   last heartbeat is younger than its own stale threshold (the `stale_threshold_ms` of its
//!   record `P:{ctl}:instance:<I>:info`, else the [`Config`]'s): refused unless forced (a
//!   forced reap deletes the `released` key, as the reap's scripts count any heartbeat key as
//!   a registration);
//! - it is not in the heartbeat sorted set: nothing to reap (its leftover index sets, if any,
//!   are `fsck --repair`'s to hand to the reaper).
//!
//! # Against a leader reaping the same instance
//!
//! This reap holds no lease, so a leader may reap the same instance at the same moment. Every
//! step is an owner CAS or idempotent: a room or peer record is deleted by exactly one of the
//! two scripts that reach it (the other sees it gone), so the counts of the two reaps add up;
//! `reap_finish.lua` may run twice. Instead of the leader's lease check, the instance is
//! checked before every batch: its heartbeat key must still be absent and its score 0 or gone
//! (a leader finished). Should it register again, the reap stops
//! ([`Refusal::RegisteredAgain`]); what its new life wrote after the reap began is kept by the
//! scripts in any case (invariant 1).

use std::cell::{Cell, RefCell};
use std::fmt;

use crate::config::Config;
use crate::conn::{self, Conn, Redis};
use crate::error::{Error, Result};
use crate::keys::{decode_id, encode_id, IdKind, KeySpace};
use crate::reaper::{self, Finish, Pace, Reap, ReapCounts};
use crate::scan::{self, Cursor, Scan};
use crate::scripts::SCRIPTS;
use crate::state::{Counters, Ctx};

/// Most room ids and most peer ids a dry run lists ([`ReapReport::room_ids`],
/// [`ReapReport::peer_ids`]).
pub const SAMPLE: usize = 20;

const OP: &str = "operator reap";

/// How [`reap_instance`] runs.
#[derive(Clone, Copy, Default)]
pub struct ReapOptions<'a> {
    /// Reap an instance whose heartbeat key holds `released` or whose last heartbeat is within
    /// its stale threshold. Never overrides a live boot token.
    pub force: bool,
    /// Check and list what would go; write nothing.
    pub dry_run: bool,
    /// Called after each batch of the reap (not in a dry run), on the calling thread.
    pub progress: Option<&'a dyn Fn(&ReapProgress)>,
}

impl fmt::Debug for ReapOptions<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReapOptions")
            .field("force", &self.force)
            .field("dry_run", &self.dry_run)
            .field("progress", &self.progress.map(|_| "Fn"))
            .finish()
    }
}

/// Where a reap stands, given to [`ReapOptions::progress`] after each batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReapProgress {
    /// What this reap did so far.
    pub counts: ReapCounts,
    /// Rooms of the instance's room index when the reap began.
    pub rooms_listed: u64,
    /// Peer records naming the instance in those rooms when the reap began.
    pub peers_listed: u64,
}

/// Why [`reap_instance`] did not reap (or did not finish).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// Its heartbeat key holds a live process's boot token: never reaped, forced or not.
    Live,
    /// Its heartbeat key holds `released` (it stopped cleanly, the key has not expired yet):
    /// reaped only when forced.
    Released,
    /// Its last heartbeat is younger than its stale threshold: reaped only when forced.
    Fresh {
        /// Age of its last heartbeat on server time, ms.
        age_ms: i64,
    },
    /// It is not in the heartbeat sorted set.
    NotRegistered {
        /// Index sets, an info hash or a heartbeat key of it exist all the same
        /// (`fsck --repair` hands such an instance to the reaper): `not_registered`. Without
        /// any, nothing of it is under the prefix (a wrong id or prefix, or reaped already):
        /// `unknown_instance`.
        leftovers: bool,
    },
    /// It registered again while it was being reaped: the reap stopped; its new life's data
    /// is kept.
    RegisteredAgain,
}

impl Refusal {
    /// `live`, `released`, `fresh`, `not_registered` (leftovers of it remain),
    /// `unknown_instance` (nothing of it under the prefix) or `registered_again` (the CLI's
    /// JSON `refused`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Refusal::Live => "live",
            Refusal::Released => "released",
            Refusal::Fresh { .. } => "fresh",
            Refusal::NotRegistered { leftovers: true } => "not_registered",
            Refusal::NotRegistered { leftovers: false } => "unknown_instance",
            Refusal::RegisteredAgain => "registered_again",
        }
    }
}

/// What [`reap_instance`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReapReport {
    /// The instance (caller's id).
    pub instance: String,
    /// A dry run: nothing was written.
    pub dry_run: bool,
    /// `Some`: not reaped (or stopped part way, see [`Refusal::RegisteredAgain`]).
    pub refused: Option<Refusal>,
    /// The reap ran to its end: its sorted-set entry and info hash are gone (index members
    /// that could not be reaped, bad data, are left for the audit: [`ReapCounts::failed`]).
    /// `false` with no refusal when members its new life wrote were kept
    /// ([`ReapCounts::kept`]): a leader's round finishes it.
    pub reaped: bool,
    /// What this call deleted (zero in a dry run). A leader reaping at the same moment deletes
    /// the rest: the two add up.
    pub counts: ReapCounts,
    /// Rooms of its room index (live and moved aside by a reap under way) when checked: what
    /// a dry run says would be visited (a room another instance owns now keeps everything but
    /// the instance's own records).
    pub rooms_listed: u64,
    /// Peer records naming it in those rooms when checked (read record by record).
    pub peers_listed: u64,
    /// A dry run: up to [`SAMPLE`] of the rooms that would go (callers' ids).
    pub room_ids: Vec<String>,
    /// A dry run: up to [`SAMPLE`] of the peers that would go, as `<room>/<peer>` (callers'
    /// ids).
    pub peer_ids: Vec<String>,
    /// Its stale threshold, ms, and where it came from: `record` or `config`.
    pub stale_threshold_ms: u64,
    /// `record` (its info hash) or `config` (none readable: the caller's configuration).
    pub stale_threshold_from: &'static str,
    /// Its sorted-set score when checked (server ms; 0: being reaped already; -1: not
    /// registered).
    pub last_heartbeat_ms: i64,
    /// Redis server time of the check, ms.
    pub server_ms: i64,
}

/// Reaps the instance `instance` (caller's id) of `config`'s prefix now, or says why not
/// ([`ReapReport::refused`]; module docs for the rules). In a dry run ([`ReapOptions::dry_run`])
/// the same check runs and nothing is written. Needs no lease and may run while a leader
/// reaps the same instance (module docs).
///
/// ```no_run
/// # fn main() -> sfu_redis::Result<()> {
/// let config = sfu_redis::Config::from_env()?;
/// let report = sfu_redis::reap::reap_instance(&config, "sfu-a", &Default::default())?;
/// match &report.refused {
///     None => println!("reaped {} rooms", report.counts.rooms),
///     Some(why) => println!("refused: {}", why.as_str()),
/// }
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// [`Error::InvalidId`] for an id that is empty, longer than 256 bytes or holds a control
/// character; [`Error::InvalidConfig`] in memory-only mode; [`Error::Redis`] when a call fails
/// (the reap is then partly done; every step is safe to redo, and the instance's score 0
/// makes it a leader's candidate); [`Error::BadData`] for replies this crate would not send
/// or an index of the wrong type.
pub fn reap_instance(
    config: &Config,
    instance: &str,
    options: &ReapOptions<'_>,
) -> Result<ReapReport> {
    let dead = encode_id(IdKind::Instance, instance)?;
    if config.redis_url().is_none() {
        return Err(Error::config(
            "redis_url",
            "reaping needs Redis (set REDIS_URL); memory-only mode has nothing to reap",
        ));
    }
    let mut ctx = Ctx::from_config(config)?;
    // Not an instance: no id (the reap's own-index paths are for an instance's own life).
    ctx.me = String::new();
    let redis = Redis::from_config(config)?;
    let mut con = redis.connect()?;
    let (stale, from) = match own_threshold(&mut con, &ctx.keys, &dead)? {
        Some(ms) => (ms, "record"),
        None => (
            config.timings().stale_threshold.as_millis() as u64,
            "config",
        ),
    };
    let mut report = ReapReport {
        instance: instance.to_owned(),
        dry_run: options.dry_run,
        refused: None,
        reaped: false,
        counts: ReapCounts::default(),
        rooms_listed: 0,
        peers_listed: 0,
        room_ids: Vec::new(),
        peer_ids: Vec::new(),
        stale_threshold_ms: stale,
        stale_threshold_from: from,
        last_heartbeat_ms: -1,
        server_ms: 0,
    };
    let Some((t0, token)) = begin(&ctx, &mut con, &dead, stale, options, &mut report)? else {
        return Ok(report);
    };
    let sample = if options.dry_run { SAMPLE } else { 0 };
    listed(&ctx.keys, &mut con, &dead, sample, &mut report)?;
    if options.dry_run {
        return Ok(report);
    }
    let check = RefCell::new(redis.connect()?);
    let came_back = Cell::new(false);
    let check_failed = RefCell::new(None);
    let still_dead = || match still_dead(&ctx.keys, &mut check.borrow_mut(), &dead) {
        Ok(dead) => {
            came_back.set(!dead);
            dead
        }
        Err(e) => {
            *check_failed.borrow_mut() = Some(e);
            false
        }
    };
    let (rooms_listed, peers_listed) = (report.rooms_listed, report.peers_listed);
    let progress = |counts: &ReapCounts| {
        if let Some(p) = options.progress {
            p(&ReapProgress {
                counts: *counts,
                rooms_listed,
                peers_listed,
            });
        }
    };
    // The configured pace, with nothing to stop it early (this call ends when the reap does).
    let (_keep, never) = crossbeam_channel::bounded::<()>(0);
    let reap = Reap {
        ctx: &ctx,
        counters: &Counters::default(),
        dead: &dead,
        t0,
        token,
        keep: Default::default(),
        leading: &still_dead,
        pace: Pace {
            ratio: ctx.reap_pace,
            stop: Some(&never),
        },
        progress: Some(&progress),
        own: None,
    };
    let mut counts = ReapCounts::default();
    let out = reaper::reap_rooms(&reap, &mut con, &mut counts);
    report.counts = counts;
    match out {
        Ok(()) => {}
        Err(Error::NotLeader) => {
            if let Some(e) = check_failed.into_inner() {
                return Err(e);
            }
            debug_assert!(came_back.get());
            report.refused = Some(Refusal::RegisteredAgain);
            return Ok(report);
        }
        Err(e) => return Err(e),
    }
    match reaper::finish(&reap, &mut con, counts.kept)? {
        Finish::Done => {
            report.reaped = true;
            publish_reaped(config, &ctx, &mut con, &dead, &counts, options.force);
        }
        Finish::Alive => report.refused = Some(Refusal::RegisteredAgain),
        Finish::Retry => {}
    }
    Ok(report)
}

/// Publishes `instance_reaped` on `P:events`, as a leader does after a reap, so the fleet page
/// and other subscribers see an operator's reap too: its `instance` field is the caller's id
/// ([`Config::instance_id`]; the CLI's is `sfu-redis-reap@<host>:<pid>`), `forced` says
/// whether [`ReapOptions::force`] was set. Best effort: a failure is logged, the reap is done
/// all the same.
fn publish_reaped(
    config: &Config,
    ctx: &Ctx,
    con: &mut Conn,
    dead: &str,
    counts: &ReapCounts,
    forced: bool,
) {
    let event = crate::event::Event::InstanceReaped {
        dead: decode_id(dead).unwrap_or_else(|_| dead.to_owned()),
        rooms: counts.rooms,
        peers: counts.peers,
        skipped_rooms: counts.skipped_rooms,
        forced,
    };
    let sent = redis::cmd("PUBLISH")
        .arg(ctx.keys.events_channel())
        .arg(event.to_json(config.instance_id()).to_string())
        .query::<i64>(con);
    if let Err(e) = sent {
        log::warn!("could not publish instance_reaped for {dead}: {e}");
    }
}

/// The stale threshold (ms) of `dead`'s own record, `None` without a readable one.
fn own_threshold(con: &mut Conn, ks: &KeySpace, dead: &str) -> Result<Option<u64>> {
    let mut pipe = redis::pipe();
    pipe.cmd("HGETALL").arg(ks.instance_info(dead));
    let reply = conn::exec(con, &mut pipe)
        .map_err(|e| Error::redis(OP, e))?
        .pop();
    // An error reply (a key of another type) or an unexpected shape: no record.
    let pairs: Vec<(String, String)> = match reply {
        Some(Ok(v)) => redis::from_redis_value(v).unwrap_or_default(),
        _ => Vec::new(),
    };
    let (info, _) = crate::info::InstanceInfo::from_fields(&pairs);
    Ok(info.stale_threshold().map(|d| d.as_millis() as u64))
}

/// `reap_force_begin.lua` (module docs): `Some((t0, token))` (server microseconds; the token
/// identifies this reap to `reap_finish.lua`) when `dead` may be reaped (and, unless a dry run,
/// is now marked as being reaped, its room index moved aside); else `None`, with the refusal in
/// `report`.
fn begin(
    ctx: &Ctx,
    con: &mut Conn,
    dead: &str,
    stale_ms: u64,
    options: &ReapOptions<'_>,
    report: &mut ReapReport,
) -> Result<Option<(i64, i64)>> {
    // On a cluster, t0 is the earliest master clock read before the mark (`reaper::begin`).
    let before = if con.is_cluster() && !options.dry_run {
        Some(conn::server_time_us(con)?)
    } else {
        None
    };
    let mut inv = SCRIPTS.reap_force_begin.prepare_invoke();
    inv.key(ctx.keys.heartbeats()).key(ctx.keys.heartbeat(dead));
    for key in ctx.keys.instance_index_keys(dead) {
        inv.key(key);
    }
    inv.key(ctx.keys.instance_info(dead))
        .key(ctx.keys.instance_reaped(dead))
        .arg(dead)
        .arg(stale_ms)
        .arg(if options.force { "1" } else { "0" })
        .arg(if options.dry_run { "check" } else { "begin" });
    let (status, now_ms, score, now_us, replaced): (String, i64, i64, i64, i64) =
        conn::call(con, OP, &inv)?;
    reaper::warn_replaced(dead, replaced);
    report.server_ms = now_ms;
    report.last_heartbeat_ms = score;
    report.refused = match status.as_str() {
        "dead" => return Ok(Some((before.map_or(now_us, |b| b.min(now_us)), now_us))),
        "live" => Some(Refusal::Live),
        "released" => Some(Refusal::Released),
        "fresh" => Some(Refusal::Fresh {
            age_ms: now_ms - score,
        }),
        "gone" => Some(Refusal::NotRegistered {
            leftovers: leftovers(&ctx.keys, con, dead)?,
        }),
        other => {
            return Err(Error::bad_data(
                OP,
                format!("unexpected reply {other:?} from reap_force_begin.lua"),
            ))
        }
    };
    Ok(None)
}

/// Sends `pipe` and returns each reply decoded as `T` (an error reply is bad data: a key of
/// another type).
fn each<T: redis::FromRedisValue>(con: &mut Conn, pipe: &mut redis::Pipeline) -> Result<Vec<T>> {
    conn::exec(con, pipe)
        .map_err(|e| Error::redis(OP, e))?
        .into_iter()
        .map(|r| conn::decode(OP, r))
        .collect()
}

/// True when any key of `dead`'s registration exists: room index (live or moved aside by an
/// interrupted reap), info hash, heartbeat key.
fn leftovers(ks: &KeySpace, con: &mut Conn, dead: &str) -> Result<bool> {
    let mut pipe = redis::pipe();
    for key in [
        ks.instance_rooms(dead),
        ks.instance_reaping_rooms(dead),
        ks.instance_info(dead),
        ks.heartbeat(dead),
    ] {
        pipe.exists(key);
    }
    Ok(each::<bool>(con, &mut pipe)?.into_iter().any(|e| e))
}

/// Before each batch: `dead` has no heartbeat key and its score is 0 or gone (a leader may
/// have finished the reap meanwhile).
fn still_dead(ks: &KeySpace, con: &mut Conn, dead: &str) -> Result<bool> {
    let mut pipe = redis::pipe();
    pipe.exists(ks.heartbeat(dead))
        .zscore(ks.heartbeats(), dead);
    let replies = conn::exec(con, &mut pipe).map_err(|e| Error::redis(OP, e))?;
    let mut replies = replies.into_iter();
    let hb: bool = conn::decode(OP, replies.next().unwrap_or(Ok(redis::Value::Nil)))?;
    let score: Option<f64> = conn::decode(OP, replies.next().unwrap_or(Ok(redis::Value::Nil)))?;
    Ok(!hb && score.map_or(true, |s| s == 0.0))
}

/// Walks `dead`'s room index (the live one, then one a reap under way moved aside, skipped if
/// it holds another type: bad data, which a reap deletes) and the records of its rooms:
/// counts the rooms and the records naming `dead` into `report`, and lists the first `sample`
/// of each (callers' ids; peers as `<room>/<peer>`). One round trip per page of rooms and one
/// per page's records.
fn listed(
    ks: &KeySpace,
    con: &mut Conn,
    dead: &str,
    sample: usize,
    report: &mut ReapReport,
) -> Result<()> {
    let readable = |w: &str| decode_id(w).unwrap_or_else(|_| w.to_owned());
    let (mut rooms, mut peers) = (0u64, 0u64);
    let mut seen = std::collections::HashSet::new();
    for (n, index) in [ks.instance_rooms(dead), ks.instance_reaping_rooms(dead)]
        .into_iter()
        .enumerate()
    {
        let mut cursor = Cursor::new(Scan::set(index).count(256));
        loop {
            let items = match cursor.next_page(con) {
                Ok(Some(items)) => items,
                Ok(None) => break,
                Err(e) if n == 1 && e.code() == Some("WRONGTYPE") => break,
                Err(e) => return Err(Error::redis(OP, e)),
            };
            let raw: Vec<Vec<u8>> = scan::items_as(items).map_err(|e| Error::redis(OP, e))?;
            let page: Vec<String> = raw
                .into_iter()
                .map(|m| String::from_utf8_lossy(&m).into_owned())
                .filter(|r| seen.insert(r.clone()))
                .collect();
            rooms += page.len() as u64;
            for r in &page {
                if report.room_ids.len() < sample {
                    report.room_ids.push(readable(r));
                }
            }
            let mut pipe = redis::pipe();
            for r in &page {
                pipe.smembers(ks.room(r).peers);
            }
            // A room's peers set of another type is bad data: counted as empty here.
            let members: Vec<Vec<String>> = conn::exec(con, &mut pipe)
                .map_err(|e| Error::redis(OP, e))?
                .into_iter()
                .map(|r| conn::decode(OP, r).unwrap_or_default())
                .collect();
            let mut pipe = redis::pipe();
            let mut asked = Vec::new();
            for (r, ps) in page.iter().zip(&members) {
                for p in ps {
                    pipe.hget(ks.peer(r, p), "instance");
                    asked.push((r, p));
                }
            }
            if asked.is_empty() {
                continue;
            }
            let named: Vec<Option<String>> = conn::exec(con, &mut pipe)
                .map_err(|e| Error::redis(OP, e))?
                .into_iter()
                .map(|r| conn::decode(OP, r).unwrap_or(None))
                .collect();
            for ((r, p), inst) in asked.into_iter().zip(named) {
                if inst.as_deref() == Some(dead) {
                    peers += 1;
                    if report.peer_ids.len() < sample {
                        report
                            .peer_ids
                            .push(format!("{}/{}", readable(r), readable(p)));
                    }
                }
            }
        }
    }
    report.rooms_listed = rooms;
    report.peers_listed = peers;
    Ok(())
}
