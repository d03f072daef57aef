//! The reaper: find candidates, wait the two-phase delay (abortable), re-check each, and reap
//! the really dead in bounded batches, re-checking leadership before every batch.
//!
//! Order for one dead instance D (each step idempotent, so a new leader can redo a reap that
//! its predecessor left half done):
//! 1. `reap_begin.lua`: D has no heartbeat key and a stale score -> score set to 0 ("being
//!    reaped"), server time t0 returned; D's room index is moved aside (`RENAME` to
//!    `P:{ctl}:instance:<D>:reaping-rooms`), so what a new life or a zombie of D indexes
//!    meanwhile goes to a fresh live index that the reap never touches.
//! 2. Rooms: `SSCAN` the moved room index; `reap_room.lua` for the rooms of the batch, up to
//!    [`ROOMS_PER_CALL`] rooms per call on one server (one room per call on a cluster), the
//!    calls pipelined with the `SSCAN` of the next page: one round trip per batch. Owner CAS
//!    per room: a room D still owns (pinned before t0) is deleted whole; in a room another
//!    instance owns, or that a new life of D pinned after t0, only D's records written before
//!    t0 go. The room index reaches every record naming D (key schema version 2): there is no
//!    peer phase. D's room entries are not removed one by one: the moved room index goes whole
//!    at the end.
//! 3. The rooms that could not be reaped (bad data) or were kept (a new life's) are put back
//!    into D's live index, then `reap_finish.lua` `UNLINK`s the moved index and removes D's
//!    sorted-set entry (rooms put back for bad data stay for the audit to report).
//!
//! A leader's reap is paced ([`Pace`], `ConfigBuilder::reap_pace`): after each batch but the
//! last it pauses in proportion to the batch's measured duration, so that the SFU's own Redis
//! traffic is not queued behind a big reap. The pause ends at once on shutdown, and the
//! leadership check that precedes every batch follows it.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crossbeam_channel::{after, select, Receiver};

use crate::conn::{self, Backoff, Conn, Link};
use crate::error::{Error, Result};
use crate::event::Event;
use crate::keys::decode_id;
use crate::pause::{Mark, Note};
use crate::rooms::PEER_BATCH;
use crate::scan::{self, Cursor, Scan};
use crate::scripts::{RoomReplies, RoomReply, SCRIPTS};
use crate::state::{Counters, Ctx, Local, Shared};
use crate::worker::{self, stopping, Periodic};

pub use crate::config::REAP_BATCH;

/// Most candidates listed per round.
const MAX_CANDIDATES: usize = 1000;

/// Most members older than the floor ([`Floor`]) whose record one listing reads.
const MAX_EXAMINED: usize = 2000;

/// Members of the heartbeat sorted set whose record one listing reads for the floor walk.
const FLOOR_WALK_PAGE: usize = 256;

/// Counts of one reaped instance.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReapCounts {
    /// Rooms deleted.
    pub rooms: u64,
    /// Peer records deleted.
    pub peers: u64,
    /// Rooms taken over by another instance (left alone).
    pub skipped_rooms: u64,
    /// Index members that could not be reaped (bad data), left in place and reported.
    pub failed: u64,
    /// Index members kept because the same instance id wrote them after the reap began.
    pub kept: u64,
}

/// The shortest stale threshold (ms) the leader knows of among the fleet's instance records
/// (`P:{ctl}:instance:<I>:info`): `candidates.lua` reads the record of every member older
/// than it, and of no younger one, so a short-threshold instance is listed once its own
/// threshold passed while the listing stays bounded. Learned by a walk of the heartbeat sorted
/// set, one page ([`FLOOR_WALK_PAGE`] members) per round: a fleet up to a page is read whole
/// every round; a bigger one over a few rounds (until then a short-threshold instance the walk
/// has not met yet is listed by the leader's own threshold, as before records were consulted:
/// late, never early).
#[derive(Debug, Default)]
pub(crate) struct Floor {
    /// Where the walk goes on (`ZSCAN` cursor; 0 starts a pass).
    cursor: u64,
    /// The shortest threshold seen in the pass under way.
    pass: Option<u64>,
    /// The shortest threshold of the last full pass.
    last: Option<u64>,
}

impl Floor {
    /// The floor for a leader whose own threshold is `leader_ms`: the shortest of it and the
    /// thresholds the walk saw in this pass and the last.
    fn ms(&self, leader_ms: u64) -> u64 {
        [self.pass, self.last]
            .into_iter()
            .flatten()
            .fold(leader_ms, u64::min)
    }

    /// Notes a walk page: its shortest threshold (0: none) and the next cursor.
    fn walked(&mut self, page_min: u64, next: u64) {
        if page_min > 0 {
            self.pass = Some(self.pass.map_or(page_min, |p| p.min(page_min)));
        }
        self.cursor = next;
        if next == 0 {
            // A pass ended: its minimum replaces the last one (instances gone since no longer
            // lower the floor).
            self.last = self.pass.take();
        }
    }
}

/// Phase one: instances (wire form) whose last heartbeat is older than their own stale
/// threshold (their record's `stale_threshold_ms`, else this leader's) on server time, this
/// instance excluded: what `status` calls stale (`candidates.lua`; `floor` is the leader's
/// knowledge of the fleet's shortest threshold, updated by the call).
pub(crate) fn candidates(ctx: &Ctx, con: &mut Conn, floor: &mut Floor) -> Result<Vec<String>> {
    let leader_ms = ctx.timings.stale_threshold.as_millis() as u64;
    let mut inv = SCRIPTS.candidates.prepare_invoke();
    inv.key(ctx.keys.heartbeats())
        .arg(leader_ms)
        .arg(MAX_CANDIDATES)
        .arg(floor.ms(leader_ms))
        .arg(floor.cursor)
        .arg(FLOOR_WALK_PAGE)
        .arg(MAX_EXAMINED);
    let (_now, ids, next, page_min): (i64, Vec<Vec<u8>>, u64, u64) =
        conn::call(con, "find stale instances", &inv)?;
    floor.walked(page_min, next);
    Ok(ids
        .into_iter()
        .filter_map(|raw| match String::from_utf8(raw) {
            Ok(id) if decode_id(&id).is_ok() => Some(id),
            Ok(id) => {
                log::warn!("the heartbeats sorted set holds {id:?}, not an instance id; skipped (see fsck)");
                None
            }
            Err(e) => {
                log::warn!("the heartbeats sorted set holds a non-UTF-8 member {:?}; skipped (see fsck)", String::from_utf8_lossy(e.as_bytes()));
                None
            }
        })
        .filter(|i| *i != ctx.me)
        .collect())
}

/// Phase two for one candidate: `Some(t0)` (server microseconds) if it is really dead (now
/// marked as being reaped).
/// On a cluster, `t0` is the earliest of every master's clock read just before the re-check
/// (a room's `pinned_us` is its own master's time: a new life's pin, which follows the
/// re-check, is newer than `t0` on every master whatever their skew; invariant 1).
/// Phase two (`reap_begin.lua`): `Some((t0, token))` when `dead` is really dead and now being
/// reaped (its room index moved aside); `token` identifies this reap to `reap_finish.lua`.
pub(crate) fn begin(ctx: &Ctx, con: &mut Conn, dead: &str) -> Result<Option<(i64, i64)>> {
    let before = if con.is_cluster() {
        Some(conn::server_time_us(con)?)
    } else {
        None
    };
    let mut inv = SCRIPTS.reap_begin.prepare_invoke();
    inv.key(ctx.keys.heartbeats())
        .key(ctx.keys.heartbeat(dead))
        .key(ctx.keys.leader());
    for key in ctx.keys.instance_index_keys(dead) {
        inv.key(key);
    }
    inv.key(ctx.keys.instance_info(dead))
        .key(ctx.keys.instance_reaped(dead))
        .arg(dead)
        .arg(ctx.timings.stale_threshold.as_millis() as u64)
        .arg(&ctx.me);
    let (status, _now_ms, now_us, replaced): (String, i64, i64, i64) =
        conn::call(con, "re-check candidate", &inv)?;
    warn_replaced(dead, replaced);
    if status == "not_leader" {
        return Err(Error::NotLeader);
    }
    let t0 = before.map_or(now_us, |b| b.min(now_us));
    Ok((status == "dead").then_some((t0, now_us)))
}

/// Logs what `reap_begin.lua` / `reap_force_begin.lua` report as `replaced`: a moved index of
/// `dead` that held another type (bad data on the reaps' own keys), deleted by the script.
pub(crate) fn warn_replaced(dead: &str, replaced: i64) {
    if replaced > 0 {
        log::warn!("the reap's own key P:{{ctl}}:instance:{dead}:reaping-rooms held another type (bad data); deleted, and the room index moved aside anew");
    }
}

/// The next `SSCAN` page of an instance's index (`cursor`: about
/// [`crate::ConfigBuilder::reap_batch`] members a page) as text (see [`utf8_members`]).
fn index_page(con: &mut Conn, op: &'static str, cursor: &mut Cursor) -> Result<Vec<String>> {
    let items = cursor
        .next_page(con)
        .map_err(|e| Error::redis(op, e))?
        .unwrap_or_default();
    let raw = scan::items_as(items).map_err(|e| Error::redis(op, e))?;
    utf8_members(con, op, cursor.scan().key(), raw)
}

/// `SSCAN` of an instance's index, `batch` members a page.
fn index_scan(index: &str, batch: usize) -> Cursor {
    Cursor::new(Scan::set(index).count(batch))
}

/// The members of an index page as text. A member that is not UTF-8 was not written by this
/// crate and names nothing it could reap: it is removed from the index (and logged) rather
/// than stopping the reap.
fn utf8_members(
    con: &mut Conn,
    op: &'static str,
    index: &str,
    raw: Vec<Vec<u8>>,
) -> Result<Vec<String>> {
    let mut members = Vec::with_capacity(raw.len());
    for m in raw {
        match String::from_utf8(m) {
            Ok(m) => members.push(m),
            Err(e) => {
                let bytes = e.into_bytes();
                log::warn!(
                    "{index} holds a non-UTF-8 member {:?}; removed",
                    String::from_utf8_lossy(&bytes)
                );
                redis::cmd("SREM")
                    .arg(index)
                    .arg(bytes)
                    .query::<()>(con)
                    .map_err(|e| Error::redis(op, e))?;
            }
        }
    }
    Ok(members)
}

/// Reaps the rooms of `dead` (wire form) listed in its index: one round trip per batch, the
/// batch's `reap_room.lua` calls together with the `SSCAN` of the next index page.
pub(crate) fn reap_rooms(r: &Reap<'_>, con: &mut Conn, counts: &mut ReapCounts) -> Result<()> {
    reap_room_batches(r, con, counts)
}

/// The pause between a leader's reap batches (`ConfigBuilder::reap_pace`).
#[derive(Clone, Copy)]
pub(crate) struct Pace<'a> {
    /// Pause after a batch, in multiples of the batch's measured duration; 0: none.
    pub ratio: f64,
    /// Disconnected on shutdown: ends a pause at once. `None`: nothing to wait for (no pause
    /// is then taken at all).
    pub stop: Option<&'a Receiver<()>>,
}

impl Pace<'_> {
    /// No pause (an instance's clean-up of its own earlier life, unit tests).
    pub(crate) const NONE: Pace<'static> = Pace {
        ratio: 0.0,
        stop: None,
    };

    /// True when this pace pauses at all (then a reap's batches are small:
    /// [`crate::PACED_REAP_BATCH`]).
    fn paused(&self) -> bool {
        self.stop.is_some() && self.ratio > 0.0
    }

    /// Waits `ratio` times `batch` (the duration of the batch just done), or until `stop`
    /// disconnects, whichever comes first. The caller checks its lease after it: a pause
    /// never lets a batch start after the lease's local deadline.
    fn after(&self, batch: Duration) {
        let Some(stop) = self.stop else {
            return;
        };
        if self.ratio <= 0.0 {
            return;
        }
        let pause = Duration::try_from_secs_f64(batch.as_secs_f64() * self.ratio)
            .unwrap_or(Duration::from_secs(3600));
        // Nothing is ever sent on `stop`: this returns on timeout or on disconnection.
        let _ = stop.recv_timeout(pause);
    }
}

/// One reap of one instance: what its batches need besides a connection.
pub(crate) struct Reap<'a> {
    pub ctx: &'a Ctx,
    /// Where bad data met is reported (it skips one member, it does not stop the reap).
    pub counters: &'a Counters,
    /// The instance reaped (wire form).
    pub dead: &'a str,
    /// Server time (microseconds) the reap began: members written at or after it belong to a
    /// new life of `dead` (docs/DESIGN.md: a same-instant write is never taken for the old
    /// life's).
    pub t0: i64,
    /// This reap's token (`reap_begin.lua`'s server time): `reap_finish.lua` deletes the moved
    /// index only for the reap whose token it carries. Unused with [`Reap::own`].
    pub token: i64,
    /// Rooms this reap must put back into `dead`'s live index before it finishes: those it
    /// could not reap (bad data, for the audit) and those it kept (a new life's).
    pub keep: std::cell::RefCell<Keep>,
    /// Consulted before every batch: `false` (lease lost, shutdown) stops the reap with
    /// [`Error::NotLeader`].
    pub leading: &'a dyn Fn() -> bool,
    /// The pause after each batch but the last (before the `leading` check of the next).
    pub pace: Pace<'a>,
    /// Called after each batch with the counts so far (an operator's reap shows progress).
    pub progress: Option<&'a dyn Fn(&ReapCounts)>,
    /// `Some` when this node cleans up after its own earlier life (`dead` is this instance):
    /// what its host holds now. Its own room index entries are then removed right after each
    /// batch, under the room locks of the entries, skipping every room the host holds (a host
    /// call may pin again while the clean-up runs: its entry must stay).
    pub own: Option<&'a Local>,
}

/// Rooms of a reaped instance's index to put back into its live index (see [`Reap::keep`]).
pub(crate) type Keep = std::collections::BTreeSet<String>;

impl Reap<'_> {
    /// Index members per batch: [`crate::ConfigBuilder::reap_batch`], at most
    /// [`crate::PACED_REAP_BATCH`] when the reap is paced.
    fn batch(&self) -> usize {
        if self.pace.paused() {
            self.ctx.reap_batch.min(crate::config::PACED_REAP_BATCH)
        } else {
            self.ctx.reap_batch
        }
    }

    /// The room index this reap scans: the one `reap_begin.lua` moved aside, or this
    /// instance's own live index when it cleans up after its own earlier life.
    fn room_index(&self) -> String {
        let keys = &self.ctx.keys;
        match self.own {
            Some(_) => keys.instance_rooms(self.dead),
            None => keys.instance_reaping_rooms(self.dead),
        }
    }
}

/// Removes this instance's own `rooms` (wire forms) from its room index, except those its host
/// holds now: the locks of every room involved are taken first (in increasing stripe order)
/// and held until the round trip returns, so no host call pins one of them in between. Every
/// reply is checked.
fn remove_own_entries(
    r: &Reap<'_>,
    local: &Local,
    con: &mut Conn,
    rooms: Vec<String>,
) -> Result<()> {
    let op = "clean own leftovers";
    let room_id = |w: &str| decode_id(w).ok();
    let stripes: std::collections::BTreeSet<usize> = rooms
        .iter()
        .filter_map(|w| room_id(w))
        .map(|id| Local::stripe_of(&id))
        .collect();
    let _locks: Vec<_> = stripes.iter().map(|i| local.lock_stripe(*i)).collect();
    let rooms: Vec<String> = rooms
        .into_iter()
        .filter(|w| room_id(w).map_or(true, |id| !local.has_room(&id)))
        .collect();
    if rooms.is_empty() {
        return Ok(());
    }
    let mut pipe = redis::pipe();
    for chunk in rooms.chunks(conn::MEMBERS_PER_COMMAND) {
        pipe.srem(r.ctx.keys.instance_rooms(&r.ctx.me), chunk);
    }
    for reply in conn::exec(con, &mut pipe).map_err(|e| Error::redis(op, e))? {
        reply.map_err(|e| Error::redis(op, e))?;
    }
    Ok(())
}

fn reap_room_batches(r: &Reap<'_>, con: &mut Conn, counts: &mut ReapCounts) -> Result<()> {
    let leading = r.leading;
    let op = "reap rooms";
    let index = r.room_index();
    if !leading() {
        return Err(Error::NotLeader);
    }
    let batch = r.batch();
    let mut cursor = index_scan(&index, batch);
    let members = index_page(con, op, &mut cursor)?;
    // (room, SSCAN cursor over its peers): "0" for a room not started yet.
    let mut pending: Vec<(String, String)> = members
        .into_iter()
        .map(|room| (room, "0".to_owned()))
        .collect();
    // The first `alone` pending rooms go one per call: rooms that need another call (a big
    // room, or one a call's work bound left out), so that big rooms never hold up the rest.
    let mut alone = 0;
    // How long the previous batch took: the pause before the next one is in proportion.
    let mut last: Option<Duration> = None;
    loop {
        if pending.is_empty() && cursor.done() {
            return Ok(());
        }
        if let Some(took) = last {
            r.pace.after(took);
        }
        if !leading() {
            return Err(Error::NotLeader);
        }
        let started = Instant::now();
        let mut pipe = redis::pipe();
        let sizes = call_sizes(pending.len(), alone, rooms_per_call(con));
        add_room_scripts(r, &mut pipe, &pending, &sizes, con.is_cluster());
        // The next page rides along unless rooms with many peers still need calls: at most
        // about two batches of scripts per round trip.
        let scan = !cursor.done() && pending.len() < 2 * batch;
        if scan {
            cursor.add_to(&mut pipe);
        }
        let replies = conn::exec(con, &mut pipe).map_err(|e| Error::redis(op, e))?;
        let mut replies = replies.into_iter();
        let mut failed = None;
        let (again, done) = room_replies(r, pending, &sizes, &mut replies, counts, &mut failed);
        if let Some(local) = r.own {
            // Own clean-up: at once, under the room locks (see `Reap::own`).
            if let Err(e) = remove_own_entries(r, local, con, done) {
                failed.get_or_insert(e);
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        alone = again.len();
        pending = again;
        if scan {
            let Some(reply) = replies.next() else {
                return Err(Error::bad_data(op, "fewer replies than commands"));
            };
            let page = reply.and_then(|reply| cursor.advance(reply));
            let raw = page
                .and_then(scan::items_as)
                .map_err(|e| Error::redis(op, e))?;
            // A room `SSCAN` returns again while it is still pending stays with its cursor
            // (two entries of one room in one call would count it twice).
            let held: HashSet<String> = pending.iter().map(|(room, _)| room.clone()).collect();
            pending.extend(
                utf8_members(con, op, &index, raw)?
                    .into_iter()
                    .filter(|room| !held.contains(room))
                    .map(|room| (room, "0".to_owned())),
            );
        }
        if let Some(progress) = r.progress {
            progress(counts);
        }
        last = Some(started.elapsed());
    }
}

/// Rooms per `reap_room.lua` call where every key lives on one server (standalone, a Sentinel
/// master): the call's fixed cost is paid once for them. The script also starts no further
/// room once the rooms it did have seen [`PEER_BATCH`] peers, so one call stays short (about
/// 0.5 ms at 4 peers per room); a room that needs another call (more peers than one call
/// reads, or left out by that bound) gets a call of its own next time. On a cluster a call
/// holds one room (its keys share a slot).
const ROOMS_PER_CALL: usize = 32;

/// Rooms per `reap_room.lua` call on `con` (see [`ROOMS_PER_CALL`]).
fn rooms_per_call(con: &Conn) -> usize {
    if con.is_cluster() {
        1
    } else {
        ROOMS_PER_CALL
    }
}

/// The number of rooms in each `reap_room.lua` call for `len` pending rooms: the first `alone`
/// one per call, the rest `per_call` per call.
fn call_sizes(len: usize, alone: usize, per_call: usize) -> Vec<usize> {
    let alone = alone.min(len);
    let mut sizes = vec![1; alone];
    let mut rest = len - alone;
    while rest > 0 {
        let n = rest.min(per_call.max(1));
        sizes.push(n);
        rest -= n;
    }
    sizes
}

/// `pending` cut into calls of `sizes` rooms.
fn calls<'a>(
    pending: &'a [(String, String)],
    sizes: &'a [usize],
) -> impl Iterator<Item = &'a [(String, String)]> + 'a {
    let mut at = 0;
    sizes.iter().map(move |&n| {
        let call = &pending[at..at + n];
        at += n;
        call
    })
}

/// The `reap_room.lua` calls for the pending rooms (`(room, peer cursor)`), `sizes` rooms
/// each ([`call_sizes`]), added to `pipe` (for a cluster connection or not: `cluster`).
fn add_room_scripts(
    r: &Reap<'_>,
    pipe: &mut redis::Pipeline,
    pending: &[(String, String)],
    sizes: &[usize],
    cluster: bool,
) {
    for chunk in calls(pending, sizes) {
        pipe.invoke_script(&room_invocation(r.ctx, r.dead, r.t0, chunk, cluster));
    }
}

/// One `reap_room.lua` call for `rooms` (`(room, peer cursor)`, wire forms) of `dead`, on a
/// cluster connection or not (`cluster`: every room key declared).
pub(crate) fn room_invocation(
    ctx: &Ctx,
    dead: &str,
    t0: i64,
    rooms: &[(String, String)],
    cluster: bool,
) -> redis::ScriptInvocation<'static> {
    let mut inv = SCRIPTS.reap_room.prepare_invoke();
    // One server: one key per room, its pin (the script derives the others from it). A
    // cluster: the room's five keys, so that a slot being migrated answers TRYAGAIN while
    // they are split between two masters (the script's header).
    for (room, _) in rooms {
        if cluster {
            for k in ctx.keys.room(room).all() {
                inv.key(k);
            }
        } else {
            inv.key(ctx.keys.room_owner(room));
        }
    }
    inv.arg(dead)
        .arg(t0)
        .arg(PEER_BATCH)
        .arg(if cluster { 5 } else { 1 });
    // No cursors when every room starts from "0" (a missing cursor is "0"): nearly every call.
    if rooms.iter().any(|(_, cursor)| cursor != "0") {
        for (_, cursor) in rooms {
            inv.arg(cursor);
        }
    }
    inv
}

/// One room's result in a `reap_room.lua` reply, or the error a command of the script met on
/// this room (status `error`, the error text in place of the cursor). A key of the wrong type
/// is bad data (the room is skipped and kept for the audit); any other error (a key not on
/// this node during a slot migration, OOM, an ACL change) is transient, as when a whole call
/// fails: the reap stops and the next round redoes it.
fn room_result(op: &'static str, reply: RoomReply) -> Result<RoomReply> {
    let (status, cursor, ..) = &reply;
    if status != "error" {
        return Ok(reply);
    }
    Err(if cursor.contains("WRONGTYPE") {
        Error::bad_data(op, format!("a key holds the wrong type of value: {cursor}"))
    } else {
        Error::redis(
            op,
            redis::RedisError::from((
                redis::ErrorKind::Extension,
                "reap_room.lua failed on a room",
                cursor.clone(),
            )),
        )
    })
}

/// Handles one batch's `reap_room.lua` replies (one per pending room, taken from `replies`):
/// counts, the rooms that need another call (with their peer cursor) and the rooms done
/// (reaped, skipped or gone: their index entry may go). A transient error is kept in `failed`
/// (the first one wins); bad data skips its room.
fn room_replies(
    r: &Reap<'_>,
    pending: Vec<(String, String)>,
    sizes: &[usize],
    replies: &mut impl Iterator<Item = redis::RedisResult<redis::Value>>,
    counts: &mut ReapCounts,
    failed: &mut Option<Error>,
) -> (Vec<(String, String)>, Vec<String>) {
    let (op, dead) = ("reap rooms", r.dead);
    let mut done = Vec::new();
    let mut again = Vec::new();
    // One reply per call of `sizes` rooms; `zip` takes a reply only for a call sent: the
    // SSCAN reply stays in `replies`. Each room gets its own result: rooms the call did not
    // reach (its work bound) go again with their cursor; a reply that cannot be read fails
    // every room of its call alike.
    let mut results = Vec::with_capacity(pending.len());
    for (chunk, reply) in calls(&pending, sizes).zip(replies.by_ref()) {
        match conn::decode::<RoomReplies>(op, reply) {
            Ok(RoomReplies(rooms)) => {
                let mut rooms = rooms.into_iter();
                for (room, cursor) in chunk {
                    match rooms.next() {
                        Some(res) => results.push((room.clone(), room_result(op, res))),
                        None => again.push((room.clone(), cursor.clone())),
                    }
                }
            }
            Err(e) if e.kind() == crate::ErrorKind::BadData => {
                for (room, _) in chunk {
                    results.push((room.clone(), Err(Error::bad_data(op, e.to_string()))));
                }
            }
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    for (room, result) in results {
        match result {
            Ok((status, next_cursor, deleted, late)) => {
                counts.peers += deleted;
                // Records the same id wrote at or after t0 in a room kept (a zombie's writes,
                // or a new life's, in a room another instance may own by now): the room stays
                // in the instance's index, put back at the end (the reap then ends `retry`),
                // so a later reap or the new life's clean-up finds them (key schema version 2:
                // the room index must reach every record naming the instance).
                if late > 0 && r.keep.borrow_mut().insert(room.clone()) {
                    counts.kept += 1;
                }
                if next_cursor == "again" {
                    again.push((room, "0".to_owned()));
                    continue;
                }
                if next_cursor != "0" {
                    again.push((room, next_cursor));
                    continue;
                }
                let kept = r.keep.borrow().contains(&room);
                match status.as_str() {
                    "reaped" => counts.rooms += 1,
                    "skipped" => counts.skipped_rooms += 1,
                    "gone" => {}
                    // Pinned again by a new life of the same instance: keep indexed.
                    _ => {
                        if !kept {
                            counts.kept += 1;
                            r.keep.borrow_mut().insert(room);
                        }
                        continue;
                    }
                }
                if !kept {
                    done.push(room);
                }
            }
            Err(e) if e.kind() == crate::ErrorKind::BadData => {
                counts.failed += 1;
                r.counters.bad_data(&e);
                log::warn!("cannot reap room {room:?} of {dead}: {e}; skipped");
                r.keep.borrow_mut().insert(room);
            }
            // Anything else (a script cache flushed again, OOM, BUSY) is transient:
            // stop; the instance stays "being reaped" and the next round redoes it.
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    (again, done)
}

/// Re-checks `dead` (wire form) and, if it is really dead, reaps it: what it deleted and how the
/// reap ended. `Ok(None)`: it is alive again or gone. `leading` is consulted before every
/// batch (after `pace`'s pause) and before the last step.
pub(crate) fn reap_instance(
    ctx: &Ctx,
    counters: &Counters,
    con: &mut Conn,
    dead: &str,
    leading: &dyn Fn() -> bool,
    pace: Pace<'_>,
) -> Result<Option<(ReapCounts, Finish)>> {
    let Some((t0, token)) = begin(ctx, con, dead)? else {
        return Ok(None);
    };
    let mut counts = ReapCounts::default();
    let reap = Reap {
        ctx,
        counters,
        dead,
        t0,
        token,
        keep: Default::default(),
        leading,
        pace,
        progress: None,
        own: None,
    };
    reap_rooms(&reap, con, &mut counts)?;
    // As before every batch: a leader whose lease's local deadline passed writes nothing more.
    if !leading() {
        return Err(Error::NotLeader);
    }
    let finished = finish(&reap, con, counts.kept)?;
    Ok(Some((counts, finished)))
}

/// How `reap_finish.lua` ended a reap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    /// The sorted-set entry (and the info hash) went; rooms that could not be reaped (bad
    /// data) may remain in the index for the audit.
    Done,
    /// `dead` registered again meanwhile: nothing touched.
    Alive,
    /// Rooms pinned after `t0` were kept and `dead` did not register again: the entry keeps
    /// score 0, so the next round reaps them.
    Retry,
}

/// Step 3 of a reap: the rooms of [`Reap::keep`] go back into `dead`'s live index
/// (`reap_putback.lua`: not once `dead` registered again), then `reap_finish.lua` deletes the
/// moved index (if this reap owns it) and removes `dead`'s sorted-set entry unless something
/// is left to reap (`kept`: rooms kept as a new life's, [`ReapCounts::kept`]). One round trip.
pub(crate) fn finish(r: &Reap<'_>, con: &mut Conn, kept: u64) -> Result<Finish> {
    let (ctx, dead, op) = (r.ctx, r.dead, "finish reap");
    let keep = r.keep.take();
    let mut pipe = redis::pipe();
    let rooms: Vec<&String> = keep.iter().collect();
    for chunk in rooms.chunks(conn::MEMBERS_PER_COMMAND) {
        pipe.invoke_script(&putback_invocation(ctx, dead, r.token, chunk));
    }
    pipe.invoke_script(&finish_invocation(ctx, dead, kept, r.token, rooms.len()));
    let mut replies = conn::exec(con, &mut pipe).map_err(|e| Error::redis(op, e))?;
    let last = replies
        .pop()
        .ok_or_else(|| Error::bad_data(op, "fewer replies than commands"))?;
    for reply in replies {
        // A member not put back would be lost with the moved index: fail (the reap is redone).
        reply.map_err(|e| Error::redis(op, e))?;
    }
    let (status, rooms_left): (String, i64) = conn::decode(op, last)?;
    Ok(match status.as_str() {
        "retry" => {
            log::info!("{dead} pinned {kept} rooms after its reap began ({rooms_left} rooms in its index now) or another reap of it is under way, and it did not register again; the next round reaps what is left");
            Finish::Retry
        }
        "alive" => Finish::Alive,
        "incomplete" => {
            log::warn!(
                "reap of {dead} incomplete: {rooms_left} rooms could not be reaped (bad data); left for the audit"
            );
            Finish::Done
        }
        _ => Finish::Done,
    })
}

/// One `reap_putback.lua` call: `rooms` (wire forms) back into `dead`'s live index, by the
/// reap whose token is `token` (skipped unless it still owns the moved index).
pub(crate) fn putback_invocation(
    ctx: &Ctx,
    dead: &str,
    token: i64,
    rooms: &[&String],
) -> redis::ScriptInvocation<'static> {
    let mut inv = SCRIPTS.reap_putback.prepare_invoke();
    inv.key(ctx.keys.heartbeats())
        .key(ctx.keys.heartbeat(dead))
        .key(ctx.keys.instance_rooms(dead))
        .key(ctx.keys.instance_reaping(dead))
        .arg(dead)
        .arg(token)
        .arg(rooms);
    inv
}

/// The `reap_finish.lua` call of a reap of `dead` (`token` from `reap_begin.lua`), `kept` rooms
/// kept as a new life's, `put_back` rooms put back.
pub(crate) fn finish_invocation(
    ctx: &Ctx,
    dead: &str,
    kept: u64,
    token: i64,
    put_back: usize,
) -> redis::ScriptInvocation<'static> {
    let mut inv = SCRIPTS.reap_finish.prepare_invoke();
    inv.key(ctx.keys.heartbeats()).key(ctx.keys.heartbeat(dead));
    for key in ctx.keys.instance_index_keys(dead) {
        inv.key(key);
    }
    inv.key(ctx.keys.instance_info(dead))
        .arg(dead)
        .arg(kept)
        .arg(token)
        .arg(put_back);
    inv
}

/// Removes what an earlier life of this instance id left behind: rooms of its index pinned
/// before `t0` (server µs) and its peer records written before `t0` in the others, with the
/// same owner-CAS script as a reap. Used
/// when an instance registers (after a restart with the same id, or after it found it was
/// reaped while paused); needs no lease, as every step is an owner CAS on this id.
pub(crate) fn clean_own_leftovers(
    ctx: &Ctx,
    counters: &Counters,
    local: &Local,
    con: &mut Conn,
    t0: i64,
) -> Result<ReapCounts> {
    let mut counts = ReapCounts::default();
    let reap = Reap {
        ctx,
        counters,
        dead: &ctx.me,
        t0,
        token: 0,
        keep: Default::default(),
        leading: &|| true,
        pace: Pace::NONE,
        progress: None,
        own: Some(local),
    };
    reap_rooms(&reap, con, &mut counts)?;
    Ok(counts)
}

/// One reap round (the caller checked that this node leads). A skipped round is noted in
/// this node's record, and the note cleared when a round runs or finds nothing to reap
/// (`src/pause.rs`).
fn round(
    sh: &Shared,
    link: &mut Link,
    floor: &mut Floor,
    shutdown: &Receiver<()>,
    demoted: &Receiver<()>,
    note: &mut Note,
) {
    let mark = Mark::take(&sh.counters);
    let cands = match link.run(&sh.redis, |c| candidates(&sh.ctx, c, floor)) {
        Ok(c) if c.is_empty() => return note.clear(sh, link),
        Ok(c) => c,
        Err(e) => {
            sh.note_error(&e);
            log::warn!("cannot list reap candidates: {e}");
            return;
        }
    };
    sh.counters.candidates_found(cands.len());
    sh.events.emit(Event::Candidates {
        instances: cands
            .iter()
            .map(|w| decode_id(w).unwrap_or_else(|_| w.clone()))
            .collect(),
    });
    // Two-phase: wait, abortable by shutdown or by losing the lease.
    select! {
        recv(shutdown) -> _ => return,
        recv(demoted) -> _ => {
            log::info!("lost the lease during the two-phase wait; round abandoned");
            return;
        }
        recv(after(sh.ctx.timings.two_phase_delay)) -> _ => {}
    }
    let leading = || sh.is_leader() && !sh.is_crashed() && !stopping(shutdown);
    if !leading() {
        return;
    }
    if let Some(skip) = mark.skip(&sh.counters, sh.ctx.timings.heartbeat_interval) {
        log::warn!(
            "this node saw {} during the two-phase window (last slow tick {} ms, slow above {} ms); skipping this round",
            skip.reason(),
            skip.last_tick.as_millis(),
            skip.slow_after.as_millis()
        );
        return note.skipped(sh, link, &skip);
    }
    note.clear(sh, link);
    for dead in cands {
        if !leading() || stopping(shutdown) {
            break;
        }
        let started = Instant::now();
        let pace = Pace {
            ratio: sh.ctx.reap_pace,
            stop: Some(shutdown),
        };
        match link.run(&sh.redis, |c| {
            reap_instance(&sh.ctx, &sh.counters, c, &dead, &leading, pace)
        }) {
            Ok(Some((c, finished))) if finished != Finish::Done => {
                // What it deleted is counted; the instance is not gone yet (or lives again):
                // no instance_reaped event.
                sh.counters
                    .reaped(c.rooms, c.peers, c.skipped_rooms, started.elapsed());
                log::info!(
                    "reap of {dead} deleted {} rooms and {} peers in {} ms but did not end it: {}",
                    c.rooms,
                    c.peers,
                    started.elapsed().as_millis(),
                    match finished {
                        Finish::Alive => "it registered again",
                        _ => "the next round reaps what is left",
                    }
                );
            }
            Ok(Some((c, _))) => {
                sh.counters
                    .reaped(c.rooms, c.peers, c.skipped_rooms, started.elapsed());
                log::info!(
                    "reaped {dead}: {} rooms, {} peers, {} skipped rooms in {} ms",
                    c.rooms,
                    c.peers,
                    c.skipped_rooms,
                    started.elapsed().as_millis()
                );
                sh.announce(
                    link,
                    Event::InstanceReaped {
                        dead: decode_id(&dead).unwrap_or(dead),
                        rooms: c.rooms,
                        peers: c.peers,
                        skipped_rooms: c.skipped_rooms,
                        forced: false,
                    },
                );
            }
            Ok(None) => log::info!("candidate {dead} is alive again (or gone); not reaped"),
            Err(e) if e.kind() == crate::ErrorKind::BadData => {
                // One instance's bad data must not stop the reap of the others.
                sh.counters.bad_data(&e);
                log::warn!("cannot reap {dead}: {e}; skipped (see fsck)");
            }
            Err(e) => {
                if e.kind() != crate::ErrorKind::NotLeader {
                    sh.note_error(&e);
                }
                log::warn!("reap of {dead} interrupted: {e}");
                break;
            }
        }
    }
}

/// The reaper thread: a round every `reap_interval` while this node leads (on a fixed grid: a
/// round longer than the interval is followed by the next one at once).
pub(crate) fn run(sh: &Shared, shutdown: &Receiver<()>, demoted: &Receiver<()>) {
    let interval = sh.ctx.timings.reap_interval;
    let mut link = Link::new();
    let mut floor = Floor::default();
    let crashed = || sh.is_crashed();
    // Rounds are not retried sooner after a failure: the backoff is unused.
    let periodic = Periodic::new(shutdown, &crashed, Backoff::new(interval, interval));
    let mut note = Note::new();
    periodic.run(Instant::now() + interval, |run| {
        while demoted.try_recv().is_ok() {}
        if sh.is_leader() {
            round(sh, &mut link, &mut floor, shutdown, demoted, &mut note);
        } else {
            note.clear(sh, &mut link);
        }
        worker::catch_up(run.scheduled, interval)
    });
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::collections::BTreeSet;

    use super::*;
    use crate::{Config, Timings};
    use sfu_redis_testkit::devserver::LocalRedis;

    /// The small context the reap functions take, for a leader "leader" of stage "unit" on
    /// `server`, and a connection to it (no node).
    fn unit(server: &LocalRedis, timings: Timings, batch: Option<usize>) -> (Ctx, Conn) {
        let mut b = Config::builder();
        b = b
            .redis_url(server.url())
            .stage("unit")
            .instance_id("leader")
            .timings(timings);
        if let Some(n) = batch {
            b = b.reap_batch(n);
        }
        let ctx = Ctx::from_config(&b.build().unwrap()).unwrap();
        let con = crate::conn::Redis::new(&server.url(), std::time::Duration::from_secs(5))
            .unwrap()
            .connect()
            .unwrap();
        (ctx, con)
    }

    // The listing judges each member with its own record's stale threshold (issue 26), the
    // leader's (1 s here) without a readable one; the walk learns the fleet's shortest
    // threshold, and a member older than it but younger than its own is not listed. Fails if
    // the listing used the leader's threshold for everyone (short-old would be missed,
    // long-old listed) or took a garbage record's value.
    #[test]
    fn candidates_are_judged_by_their_own_records() {
        let server = LocalRedis::start().expect("start redis-server");
        let mut t = Timings::fast();
        t.stale_threshold = Duration::from_millis(1000);
        let (ctx, mut con) = unit(&server, t, None);
        let now = crate::conn::server_time_ms(&mut con).unwrap();
        // (member, age ms, its record's stale_threshold_ms, listed?)
        let fleet: [(&str, i64, Option<&str>, bool); 8] = [
            ("short-old", 400, Some("300"), true),
            ("short-young", 100, Some("300"), false),
            ("long-old", 5_000, Some("10000"), false),
            ("long-older", 11_000, Some("10000"), true),
            ("plain-old", 1_500, None, true),
            ("plain-young", 500, None, false),
            ("garbage-record", 1_500, Some("-5 ms"), true),
            ("leader", 60_000, None, false),
        ];
        let mut pipe = redis::pipe();
        for (id, age, own, _) in fleet {
            pipe.zadd(ctx.keys.heartbeats(), id, now - age).ignore();
            if let Some(own) = own {
                pipe.hset(ctx.keys.instance_info(id), "stale_threshold_ms", own)
                    .ignore();
            }
        }
        pipe.zadd(ctx.keys.heartbeats(), "being-reaped", 0).ignore();
        pipe.query::<()>(&mut con).unwrap();

        let mut floor = Floor::default();
        let listed: BTreeSet<String> = candidates(&ctx, &mut con, &mut floor)
            .unwrap()
            .into_iter()
            .collect();
        let mut want: BTreeSet<String> = fleet
            .iter()
            .filter(|m| m.3)
            .map(|m| m.0.to_owned())
            .collect();
        want.insert("being-reaped".into());
        assert_eq!(listed, want);
        // One page walked the whole set: the pass ended and its shortest threshold is known.
        assert_eq!((floor.cursor, floor.last), (0, Some(300)));
        assert_eq!(floor.ms(1000), 300);
    }

    // The floor: the shortest of the leader's threshold and the thresholds of this pass and the
    // last; a pass that ends replaces the last one's (an instance gone no longer lowers it).
    #[test]
    fn the_floor_keeps_the_shortest_threshold_of_the_last_pass() {
        let mut f = Floor::default();
        assert_eq!(f.ms(1000), 1000);
        f.walked(300, 7);
        assert_eq!((f.ms(1000), f.cursor), (300, 7));
        f.walked(0, 0);
        assert_eq!(f.ms(1000), 300);
        f.walked(2000, 9);
        assert_eq!(f.ms(1000), 300);
        f.walked(5000, 0);
        assert_eq!(f.ms(1000), 1000);
        assert_eq!(f.ms(800), 800);
    }

    // Model check, finding 2: a zombie pins while its reap runs (the reap keeps that room as
    // a new life's), registers again (its registration merges the moved index back and
    // deletes the reap's token), then leaves (no heartbeat key, no sorted-set entry, its index
    // gone). The reap's put-back must not write the kept room into the index of an instance
    // that is no longer registered (it did, before the put-back checked the reap's token);
    // while the reap still owns the moved index, the put-back writes it as before.
    #[test]
    fn a_putback_after_the_instance_registered_again_and_left_writes_nothing() {
        let server = LocalRedis::start().expect("start redis-server");
        let (ctx, mut con) = unit(&server, Timings::fast(), None);
        let counters = Counters::default();
        let leading = || true;
        let reap = |token: i64| {
            let r = Reap {
                ctx: &ctx,
                counters: &counters,
                dead: "dead",
                t0: 1,
                token,
                keep: Default::default(),
                leading: &leading,
                pace: Pace::NONE,
                progress: None,
                own: None,
            };
            r.keep.borrow_mut().insert("kept-room".to_owned());
            r
        };
        let live = ctx.keys.instance_rooms("dead");
        let exists = |con: &mut Conn| -> bool {
            redis::cmd("EXISTS").arg(&live).query::<i64>(con).unwrap() == 1
        };
        // As reap_begin.lua leaves it (token 5), then the registration and the leave: the
        // token deleted, the moved index merged and gone with the leave, no entry, no key.
        let _: () = redis::pipe()
            .zadd(ctx.keys.heartbeats(), "dead", 0)
            .ignore()
            .sadd(ctx.keys.instance_reaping_rooms("dead"), "kept-room")
            .ignore()
            .set(ctx.keys.instance_reaping("dead"), 5)
            .ignore()
            .del(ctx.keys.instance_reaping("dead"))
            .ignore()
            .del(ctx.keys.instance_reaping_rooms("dead"))
            .ignore()
            .zrem(ctx.keys.heartbeats(), "dead")
            .ignore()
            .query(&mut con)
            .unwrap();
        finish(&reap(5), &mut con, 1).unwrap();
        assert!(
            !exists(&mut con),
            "the put-back wrote into the index of an instance that registered again and left"
        );
        // The reap still owns the moved index: the kept room goes back, and the entry stays
        // for the next round (retry).
        let _: () = redis::pipe()
            .zadd(ctx.keys.heartbeats(), "dead", 0)
            .ignore()
            .sadd(ctx.keys.instance_reaping_rooms("dead"), "kept-room")
            .ignore()
            .set(ctx.keys.instance_reaping("dead"), 6)
            .ignore()
            .query(&mut con)
            .unwrap();
        assert_eq!(finish(&reap(6), &mut con, 1).unwrap(), Finish::Retry);
        let members: BTreeSet<String> = redis::cmd("SMEMBERS").arg(&live).query(&mut con).unwrap();
        assert_eq!(members, BTreeSet::from(["kept-room".to_owned()]));
    }

    // Protects invariants 2 and 4 when a reap stops early (lease lost, shutdown): each of 300
    // rooms of a dead instance holds a record of another instance "x". The reap is stopped
    // after two batches; every room it reached is deleted whole (with x's record), every room
    // it did not reach is intact, and the moved index still lists all of them (it goes whole
    // at the end of a reap that finishes, never member by member), so the next reap reaches
    // what is left.
    #[test]
    fn a_reap_that_stops_early_leaves_every_room_it_did_not_reach_indexed() {
        let server = LocalRedis::start().expect("start redis-server");
        // No node: the reap batches take their small context directly.
        let (ctx, mut con) = unit(&server, Timings::fast(), Some(10));
        let counters = Counters::default();
        let rooms: Vec<String> = (0..300).map(|r| format!("room-{r}")).collect();
        let mut pipe = redis::pipe();
        for room in &rooms {
            let rk = ctx.keys.room(room);
            // As reap_begin.lua leaves it: the index moved aside.
            pipe.sadd(ctx.keys.instance_reaping_rooms("dead"), room)
                .ignore();
            pipe.hset_multiple(&rk.meta, &[("owner", "dead"), ("pinned_ms", "1")])
                .ignore();
            pipe.hset_multiple(
                ctx.keys.peer(room, "xp"),
                &[
                    ("instance", "x"),
                    ("guest", ""),
                    ("generation", "1"),
                    ("updated_ms", "1"),
                ],
            )
            .ignore();
            pipe.sadd(&rk.peers, "xp").ignore();
        }
        pipe.query::<()>(&mut con).unwrap();

        // Leading for the first page and two batches, then not any more.
        let checks = Cell::new(0);
        let leading = || {
            checks.set(checks.get() + 1);
            checks.get() <= 3
        };
        let mut counts = ReapCounts::default();
        let reap = Reap {
            ctx: &ctx,
            counters: &counters,
            dead: "dead",
            t0: i64::MAX / 2,
            token: 1,
            keep: Default::default(),
            leading: &leading,
            pace: Pace::NONE,
            progress: None,
            own: None,
        };
        let out = reap_rooms(&reap, &mut con, &mut counts);
        assert!(matches!(out, Err(Error::NotLeader)), "{out:?}");
        assert!(
            counts.rooms > 0 && counts.rooms < 300,
            "the reap must stop part way: {counts:?}"
        );

        let moved: BTreeSet<String> = redis::cmd("SMEMBERS")
            .arg(ctx.keys.instance_reaping_rooms("dead"))
            .query(&mut con)
            .unwrap();
        assert_eq!(
            moved.len(),
            300,
            "the moved index is never emptied member by member"
        );
        let mut deleted = 0;
        for room in &rooms {
            let (meta, record): (bool, bool) = redis::pipe()
                .exists(ctx.keys.room(room).meta)
                .exists(ctx.keys.peer(room, "xp"))
                .query(&mut con)
                .unwrap();
            deleted += u64::from(!meta);
            assert_eq!(meta, record, "{room}: deleted whole or not touched");
        }
        assert_eq!(deleted, counts.rooms);
    }

    // A room's error inside a batched `reap_room.lua` call is bad data only for a key of the
    // wrong type; any other (a key not on this node during a slot migration, NOPERM, OOM) is
    // transient, as when a whole call fails: skipping the room would leave it unreaped once
    // the instance's reap ends "incomplete".
    #[test]
    fn a_rooms_error_is_bad_data_only_for_a_wrong_type() {
        let err =
            |msg: &str| room_result("reap rooms", ("error".into(), msg.into(), 0, 0)).unwrap_err();
        let wrong = err("WRONGTYPE Operation against a key holding the wrong kind of value");
        assert_eq!(wrong.kind(), crate::ErrorKind::BadData);
        for msg in [
            "Script attempted to access a non local key in a cluster node script",
            "NOPERM this user has no permissions to access one of the keys used as arguments",
            "OOM command not allowed when used memory > 'maxmemory'.",
        ] {
            let e = err(msg);
            assert_eq!(e.kind(), crate::ErrorKind::Redis, "{msg}");
            assert!(e.to_string().contains(msg), "{e}");
        }
        let ok = room_result("reap rooms", ("reaped".into(), "0".into(), 4, 0));
        assert_eq!(ok.unwrap().2, 4);
    }

    // Rooms that need another call go one per call ahead of the new ones, which share calls:
    // a page of big rooms, where each call reaches one room before its work bound, costs one
    // more round trip, not one per `ROOMS_PER_CALL` rooms.
    #[test]
    fn rooms_that_need_another_call_go_alone() {
        assert_eq!(call_sizes(0, 0, 32), Vec::<usize>::new());
        assert_eq!(call_sizes(70, 0, 32), vec![32, 32, 6]);
        assert_eq!(call_sizes(5, 2, 32), vec![1, 1, 3]);
        assert_eq!(call_sizes(3, 7, 32), vec![1, 1, 1]);
        assert_eq!(call_sizes(4, 0, 1), vec![1, 1, 1, 1]);
        let pending: Vec<(String, String)> = (0..5).map(|i| (i.to_string(), "0".into())).collect();
        let sizes = call_sizes(5, 2, 2);
        let cut: Vec<Vec<&str>> = calls(&pending, &sizes)
            .map(|c| c.iter().map(|(r, _)| r.as_str()).collect())
            .collect();
        assert_eq!(cut, vec![vec!["0"], vec!["1"], vec!["2", "3"], vec!["4"]]);
    }
}
