//! The heartbeat: one script call on Redis server time, then one pipelined pin refresh for
//! every owned room (two round trips per tick whatever the number of rooms), on a named thread
//! that never exits on errors.
//!
//! The same tick notices what happened to this instance while it could not see Redis:
//! - Redis lost its data (`restored`): pins, indexes and peer records are written back, and a
//!   lease this node held is given up (the lease key is gone with the data);
//! - on a Redis Cluster, one master lost its data (its dataset token, checked ahead of the pin
//!   refresh, is gone or changed: src/shards.rs): the rooms this node holds there are written
//!   back (pins, metadata, peer records), as after a loss of everything, for those rooms only;
//! - a leader reaped it (`reaped`, a zombie): every room is reported lost, forgotten and never
//!   written back; its own leftovers are cleaned; it registers again as a fresh life;
//! - host calls whose reply was lost (pin, close, upsert, remove): settled, and the index
//!   entries they may have left are removed once their records are known gone, from what the
//!   node knew, never from a reply (`settle_uncertain`). In steady state (nothing uncertain)
//!   this costs no round trip.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crossbeam_channel::Receiver;

use crate::conn::{self, Backoff, Conn, Link};
use crate::error::{Error, Result};
use crate::event::{Event, LeaderLostReason};
use crate::keys::{decode_id, encode_id, IdKind, SCHEMA_VERSION};
use crate::lease;
use crate::peers;
use crate::reaper;
use crate::rooms::{self, Refreshed};
use crate::schema;
use crate::scripts::SCRIPTS;
use crate::shards;
use crate::state::{Shared, ROOM_LOCKS};
use crate::worker::{self, Periodic};

/// First heartbeat of a life, or a regular one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BeatMode {
    Register,
    Tick,
}

/// What heartbeat.lua found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Beat {
    /// Heartbeat written.
    Ok,
    /// Redis lost its data; this instance registered again and must restore its pins.
    Restored,
    /// A leader reaped this instance while it was unresponsive; nothing written.
    Reaped,
    /// This instance is missing (or being reaped) under an unchanged dataset token on another
    /// master than the one its registration was last found on, and no replica of that master
    /// had acknowledged it (`registration_lost`): a failover promoted a replica that never got
    /// it. Nothing written; the caller registers again and restores what it holds.
    Unregistered,
    /// Another live process uses this instance id (its heartbeat key holds another boot
    /// token). On register nothing was written.
    Duplicate,
}

/// One heartbeat's reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Beaten {
    pub beat: Beat,
    /// Redis server time, ms.
    pub server_ms: i64,
    /// The same server time, microseconds (the start of a clean-up of an earlier life: pins and
    /// records written strictly before it are that life's).
    pub server_us: i64,
}

/// The `heartbeat.lua` call of instance `ctx.me` (`known`: the dataset token seen last, `boot`
/// this process's boot token, `started_ms` this life's registration time, `peers` how many
/// peers it holds, `info` its record's other fields); a fresh random dataset token value.
#[allow(clippy::too_many_arguments)]
pub(crate) fn beat_invocation(
    ctx: &crate::state::Ctx,
    mode: BeatMode,
    known: &str,
    boot: &str,
    max_epoch: u64,
    started_ms: i64,
    peers: usize,
    info: &[(&'static str, String)],
) -> redis::ScriptInvocation<'static> {
    let fresh = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
    let mut inv = SCRIPTS.heartbeat.prepare_invoke();
    inv.key(ctx.keys.heartbeats())
        .key(ctx.keys.heartbeat(&ctx.me))
        .key(ctx.keys.dataset())
        .key(ctx.keys.epoch())
        .key(ctx.keys.instance_info(&ctx.me));
    for key in ctx.keys.instance_index_keys(&ctx.me) {
        inv.key(key);
    }
    inv.key(ctx.keys.schema())
        .key(ctx.keys.instance_reaped(&ctx.me));
    inv.arg(&ctx.me)
        .arg(ctx.timings.heartbeat_ttl.as_millis() as u64)
        .arg(match mode {
            BeatMode::Register => "register",
            BeatMode::Tick => "tick",
        })
        .arg(known)
        .arg(&fresh)
        .arg(boot)
        .arg(max_epoch)
        .arg(started_ms)
        .arg(SCHEMA_VERSION)
        .arg(match mode {
            BeatMode::Register => String::new(),
            BeatMode::Tick => peers.to_string(),
        });
    for (name, value) in info {
        inv.arg(*name).arg(value);
    }
    inv
}

/// `heartbeat.lua`'s reply: `{status, server_ms, token, epoch, server_us, replaced, schema,
/// schema_replaced}` (its header).
pub(crate) type BeatReply = (String, i64, String, String, i64, i64, Vec<u8>, i64);

/// Sends one heartbeat (`heartbeat.lua`), remembers the dataset token and the highest epoch
/// seen.
///
/// `made`: the master-switch count the connection was made under ([`Link::run_fenced`]): the
/// master this beat reached, as far as the node can tell.
pub(crate) fn beat(sh: &Shared, con: &mut Conn, mode: BeatMode, made: u64) -> Result<Beaten> {
    let op = "heartbeat";
    let known = sh.token.lock().clone();
    let peers = sh.local.peer_count();
    let inv = beat_invocation(
        &sh.ctx,
        mode,
        &known,
        &sh.boot,
        sh.max_epoch.load(Ordering::Relaxed),
        sh.ctx.started_ms.load(Ordering::Relaxed),
        peers,
        &sh.info,
    );
    let (status, server_ms, token, epoch, server_us, replaced, schema, schema_replaced): BeatReply =
        conn::call(con, op, &inv)?;
    // Whatever bytes an operator left in the stamp: shown, never a decoding failure that
    // would fail the tick (and let the pins lapse).
    let schema = String::from_utf8_lossy(&schema).into_owned();
    if status == "schema" {
        // A registration (or a tick that would re-register: Redis lost its data) on a prefix
        // laid out in another key schema version: refused, nothing written (docs/DESIGN.md
        // "Schema version"). The node is parked until a registration succeeds.
        *sh.schema_refused.lock() = Some(schema.clone());
        return Err(schema::refused(&sh.ctx.keys, schema));
    }
    if schema_replaced > 0 {
        let e = Error::bad_data(
            op,
            format!(
                "{} held another type than a string; replaced by the key schema version {SCHEMA_VERSION}",
                sh.ctx.keys.schema()
            ),
        );
        sh.counters.bad_data(&e);
        log::warn!("{e}");
    }
    if matches!(status.as_str(), "ok" | "restored") {
        let foreign = (schema != SCHEMA_VERSION.to_string()).then_some(schema);
        let mut seen = sh.schema_seen.lock();
        if foreign.is_some() && *seen != foreign {
            log::error!(
                "{}; this node registered before the change and keeps heartbeating its rooms: stop it and start a release that speaks the prefix's version",
                schema::refused(&sh.ctx.keys, foreign.clone().unwrap_or_default())
            );
        }
        *seen = foreign;
    }
    if replaced > 0 {
        // Bad data on this instance's own index keys, deleted by the script (a clean-up and
        // every pin of this life would fail on them).
        let e = Error::bad_data(
            op,
            format!(
                "{replaced} of the index keys of instance {:?} ({}, -peers, -reaping-rooms, -reaping-peers) held another type than a set; deleted at registration (rooms they listed are left to fsck)",
                sh.id,
                sh.ctx.keys.instance_rooms(&sh.ctx.me)
            ),
        );
        sh.counters.bad_data(&e);
        log::warn!("{e}");
    }
    let beat = match status.as_str() {
        // The dataset token changed under a heartbeat that found us registered: an earlier
        // heartbeat re-registered us after Redis lost its data, but its reply was lost.
        "ok" if !known.is_empty() && token != known => Beat::Restored,
        "ok" => Beat::Ok,
        "restored" => Beat::Restored,
        // A reap of this very life began (its tombstone names this life's start): whatever
        // master this is, a reap, never a registration a failover lost.
        "zombie" => Beat::Reaped,
        "missing" | "reaped" if registration_lost(sh, made) => Beat::Unregistered,
        "missing" | "reaped" => Beat::Reaped,
        "duplicate" => Beat::Duplicate,
        s => return Err(Error::bad_data(op, format!("heartbeat.lua replied {s:?}"))),
    };
    let written =
        matches!(beat, Beat::Restored) || (mode == BeatMode::Register && beat == Beat::Ok);
    // A registration written now, or found on another master than before (it survived a
    // switch): until a replica of this master has it, a failover may still lose it.
    if written || (beat == Beat::Ok && made != sh.registration_switches.load(Ordering::Relaxed)) {
        sh.ctx.unconfirmed.store(true, Ordering::Relaxed);
        sh.registration_switches.store(made, Ordering::Relaxed);
    }
    if beat == Beat::Restored {
        // The lease went with the data: stop acting now. (No new term starts anywhere until a
        // lease TTL after the dataset was re-created: lease_acquire.lua.)
        sh.leader.end_with(&sh.events, LeaderLostReason::LeaseTaken);
    }
    if beat == Beat::Duplicate && mode == BeatMode::Tick {
        // Another process ticks under this id: never mark the key released on our stop.
        sh.saw_duplicate.store(true, Ordering::Relaxed);
    }
    if matches!(beat, Beat::Ok | Beat::Restored)
        || (beat == Beat::Duplicate && mode == BeatMode::Tick)
    {
        *sh.token.lock() = token;
    }
    if mode == BeatMode::Register && beat == Beat::Ok {
        // Registered: no longer parked by a foreign schema stamp.
        *sh.schema_refused.lock() = None;
        // heartbeat.lua wrote this life's info with the start `register` gave it (its
        // clean-up boundary), or with this server time when none was given.
        if sh.ctx.started_ms.load(Ordering::Relaxed) == 0 {
            sh.ctx.started_ms.store(server_ms, Ordering::Relaxed);
        }
    }
    if let Ok(e) = epoch.parse::<u64>() {
        sh.max_epoch.fetch_max(e, Ordering::Relaxed);
    }
    Ok(Beaten {
        beat,
        server_ms,
        server_us,
    })
}

/// One tick: heartbeat, then refresh (or restore) every pin; its duration goes to the
/// tick-duration histogram (failed ticks too) unless metrics are off.
pub(crate) fn tick(sh: &Shared, link: &mut Link) -> Result<()> {
    let timer = sh.counters.start_timer();
    let out = tick_once(sh, link);
    sh.counters.tick_took(timer);
    out
}

fn tick_once(sh: &Shared, link: &mut Link) -> Result<()> {
    // Through sentinels: an old master keeps its clients' connections (and accepts writes)
    // for a while after the sentinels promoted a replica; ask them which master it is now.
    if sh.redis.sentinels_moved() {
        log::warn!(
            "the sentinels name another master than {}: reconnecting",
            sh.redis.describe()
        );
        link.reset();
    }
    if sh.schema_refused.lock().is_some() {
        // Parked: a registration was refused by a foreign key schema stamp. Try again (the
        // script refuses without writing while the stamp stays); a success is a fresh life
        // with no rooms, as after a reap.
        let t0 = link.run(&sh.redis, conn::server_time_us)?;
        return register(sh, link, t0);
    }
    let beaten = match link.run_fenced(&sh.redis, |c, made| beat(sh, c, BeatMode::Tick, made)) {
        Err(e @ Error::Schema { .. }) => {
            park(sh, &e);
            return Err(e);
        }
        other => other?,
    };
    match beaten.beat {
        Beat::Reaped => return resume_after_reap(sh, link, beaten.server_us),
        // Registered again; the restore below writes back what the failover lost.
        Beat::Unregistered => register_lost(sh, link)?,
        Beat::Restored => {
            log::warn!(
                "instance {} was missing from Redis and the dataset token changed: Redis lost its data; restoring pins and peers",
                sh.id
            );
            // beat() ended a term this node held.
        }
        Beat::Duplicate => log::error!(
            "another live process uses instance id {:?}; instance ids must be unique",
            sh.id
        ),
        Beat::Ok => {}
    }
    // Restoring takes this whole tick; until it succeeded, later ticks restore again (a lost
    // reply or a failed pipeline must not turn "Redis lost our rooms" into "rooms lost").
    if beaten.beat == Beat::Restored {
        sh.counters.data_losses.fetch_add(1, Ordering::Relaxed);
        sh.restore_pending.store(true, Ordering::Relaxed);
    }
    // A failover moved the master (through the sentinels): replication is asynchronous, so
    // the last pins, records and index entries written before it may be missing on the new
    // master. Restore what this node holds, as after data loss: pins still free are taken
    // again, rooms another instance took are reported lost, records and entries written back
    // (docs/DESIGN.md "Deployment topologies"). The lease is left to the lease thread (a term
    // whose lease did not survive ends at its next refresh).
    let switches = sh.redis.master_switches();
    if sh.switches_seen.swap(switches, Ordering::Relaxed) != switches {
        log::warn!(
            "the master changed ({}); restoring pins and peers this node holds",
            sh.redis.describe()
        );
        sh.restore_pending.store(true, Ordering::Relaxed);
    }
    let restore = sh.restore_pending.load(Ordering::Relaxed);
    settle_uncertain(sh, link)?;
    let rooms = sh.local.rooms();
    // On a cluster: rooms on a master that lost its data, restored this tick (all of them
    // with `restore`).
    let mut partial: Vec<String> = Vec::new();
    let results = if restore {
        // Everything is written back, on every master: the masters' dataset tokens are only
        // learnt (checked ahead, in the same first round trip).
        sh.shards.lock().restore.clear();
        let wires = rooms::wired(&rooms);
        link.run(&sh.redis, |c| {
            let checks = shards::Checks::new(sh, c, &wires, &[]);
            let (replies, out) = rooms::restore_pins(&sh.ctx, c, wires.clone(), checks.pipe())?;
            checks.handle(&sh.shards, replies);
            Ok(out)
        })?
    } else {
        // Rooms still to restore after their master lost its data (an earlier tick's restore
        // failed) are not refreshed plainly: a gone pin of theirs is no lost room.
        let pending: BTreeSet<String> = sh
            .shards
            .lock()
            .restore
            .iter()
            .filter(|r| sh.local.has_room(r))
            .cloned()
            .collect();
        let plain = rooms::wired(&rooms)
            .into_iter()
            .filter(|(r, _)| !pending.contains(r))
            .collect::<Vec<_>>();
        // This tick's share of the held entries (and a page of each index) and, on a cluster,
        // the check of each master's dataset token ride ahead of the pin refresh: still two
        // round trips per tick.
        let stripes = sh.local.next_reassert_stripes(REASSERT_STRIPES);
        let (mut results, lapsed, newly) =
            Reassert::new(sh, stripes, true).send_with_refresh(link, &plain, &rooms, &pending)?;
        if !newly.is_empty() {
            sh.shards.lock().restore.extend(newly.iter().cloned());
            // What the refresh found there is replaced by what the restore finds.
            results.retain(|(r, _)| !newly.contains(r));
        }
        let lapsed: Vec<(String, String)> = lapsed
            .into_iter()
            .filter(|(r, _)| !newly.contains(r))
            .collect();
        if !lapsed.is_empty() {
            results.extend(link.run(&sh.redis, |c| {
                rooms::refresh_lapsed(&sh.ctx, c, lapsed.clone())
            })?);
        }
        partial = pending.union(&newly).cloned().collect();
        if !partial.is_empty() {
            let wires = rooms::wired(&partial);
            let (_, out) = link.run(&sh.redis, |c| {
                rooms::restore_pins(&sh.ctx, c, wires.clone(), &redis::pipe())
            })?;
            results.extend(out);
        }
        results
    };
    let mut lost = Vec::new();
    for (room, outcome) in results {
        match outcome {
            Refreshed::Ok => {}
            Refreshed::Repinned if !sh.local.has_room(&room) => {
                // A restore pinned again a room the host closed meanwhile: the settlements of
                // the next tick release it (owner CAS) and remove its index entry. The entry
                // is written again first, under the room's lock: a host call that removed it
                // meanwhile (a close, or a pin refused as held) must not leave this pin where
                // no index reaches it (invariant 2).
                let _guard = sh.local.lock_room(&room);
                if !sh.local.has_room(&room) {
                    if let Ok(w) = encode_id(IdKind::Room, &room) {
                        let put = link.run(&sh.redis, |c| {
                            rooms::index_add(&sh.ctx, c, "index a room pinned again", &[&w])
                        });
                        if let Err(e) = put {
                            log::warn!("room {room:?}: {e}");
                        }
                    }
                    sh.local.mark_uncertain(&room);
                }
            }
            Refreshed::Repinned => log::info!("room {room:?}: pin had lapsed; pinned again"),
            Refreshed::Lost(new_owner) => lost.push((room, new_owner)),
            Refreshed::Failed(e) => {
                // Bad data in one room: reported, retried next tick; not a Redis outage, so it
                // does not make the leader skip reap rounds.
                sh.counters.bad_data(&e);
                log::warn!("room {room:?}: pin refresh failed: {e}");
            }
        }
    }
    if !lost.is_empty() {
        // A pin gone under us may mean we were reaped while paused mid-tick: ask again before
        // reporting, so a zombie reports all its rooms through `reaped_self`.
        let again = link.run_fenced(&sh.redis, |c, made| beat(sh, c, BeatMode::Tick, made))?;
        if again.beat == Beat::Reaped {
            return resume_after_reap(sh, link, again.server_us);
        }
        if again.beat == Beat::Unregistered {
            return register_lost(sh, link);
        }
        if again.beat == Beat::Restored {
            // Redis lost its data between the two beats: the pins are gone with it, not lost
            // to anyone. The next tick restores (pins still free, peers), reporting only rooms
            // another instance took meanwhile.
            log::warn!("Redis lost its data during this tick; restoring on the next one");
            sh.restore_pending.store(true, Ordering::Relaxed);
            return Ok(());
        }
        lose_rooms(sh, link, lost)?;
    }
    if restore {
        let restored = link.run(&sh.redis, |c| peers::restore(&sh.ctx, c, &sh.local.peers()))?;
        log::info!(
            "wrote back the {restored} peer records this node holds (after data loss or a master switch)"
        );
        sh.restore_pending.store(false, Ordering::Relaxed);
    } else if !partial.is_empty() {
        let partial: BTreeSet<String> = partial.into_iter().collect();
        let held: Vec<_> = sh
            .local
            .peers()
            .into_iter()
            .filter(|(r, _, _)| partial.contains(r))
            .collect();
        let restored = link.run(&sh.redis, |c| peers::restore(&sh.ctx, c, &held))?;
        log::info!(
            "restored {} rooms and wrote back their {restored} peer records (their master lost its data)",
            partial.len()
        );
        sh.shards.lock().restore.retain(|r| !partial.contains(r));
    }
    // Last: with a replica that is connected but stuck, the WAIT takes half the command
    // timeout, which must not delay this tick's pin refresh.
    confirm_registration(sh, link);
    sh.counters.heartbeat_ok();
    Ok(())
}

/// Lock stripes whose holdings one tick puts back into this instance's room index: every stripe
/// once per `ROOM_LOCKS / REASSERT_STRIPES` (8) ticks.
const REASSERT_STRIPES: usize = 8;

/// Puts the rooms this node holds in lock stripes `stripes` back into its room index
/// (`index_add.lua`: a member already there is left as it is; should this instance no longer
/// be registered, it is handed to the reaper). What it repairs: an entry of this node removed
/// by a clean-up that raced with a new write of the same room (this node's clean-up of its
/// own earlier life, an operator's repair), which would otherwise leave a room, and the
/// records in it, that no index reaches: an orphan once this instance dies (invariant 4,
/// issue 11).
/// Nothing is added before its record: a held room's pin exists (or the next tick reports it
/// lost). No lock is held across the round trip (a hung connection must not hold host calls
/// up): a room the host closed meanwhile (its `SREM` may have gone before this write) is
/// handed to the next tick's settlements, which remove its entry under the room lock once the
/// room is known not to be ours.
///
/// With `walk`, it also reads the next page of this instance's room index (`SSCAN`,
/// [`WALK_PAGE`] members) and hands every room this node does not hold to `settle_uncertain`
/// (its pin released if it is still ours; else this instance's records in it deleted, then its
/// entry removed). This finds, from durable state, the entries a clean-up known only from a
/// lost reply would have removed, and the records this instance left in a room it lost: every
/// entry is looked at once per walk of the index. Rooms the node holds cost nothing more.
///
/// Bad data (a member that is not UTF-8, an index key of the wrong type) is logged and
/// skipped: it never fails the tick (fsck reports it).
///
/// The tick sends these commands ahead of its pin refresh, in the same round trip
/// ([`Reassert::send_with_refresh`]); a registration sends them alone ([`reassert_held`]).
struct Reassert<'a> {
    sh: &'a Shared,
    pipe: redis::Pipeline,
    /// The rooms re-asserted (callers' ids).
    rooms: Vec<String>,
    sadds: usize,
    walk: bool,
}

const REASSERT_OP: &str = "re-assert held index entries";

impl<'a> Reassert<'a> {
    /// Builds the commands from what the node holds now.
    fn new(sh: &'a Shared, stripes: std::ops::Range<usize>, walk: bool) -> Reassert<'a> {
        let held = sh.local.held_rooms_in_stripes(&stripes);
        let mut wire_rooms = Vec::with_capacity(held.len());
        let mut rooms = Vec::with_capacity(held.len());
        for room in held {
            let Ok(r) = encode_id(IdKind::Room, &room) else {
                continue;
            };
            wire_rooms.push(r);
            rooms.push(room);
        }
        let mut pipe = redis::pipe();
        let room_index = sh.ctx.keys.instance_rooms(&sh.ctx.me);
        for inv in rooms::index_add_invocations(&sh.ctx, &wire_rooms) {
            pipe.invoke_script(&inv);
        }
        let sadds = pipe.len();
        if walk {
            let cursor = *sh.local.index_walk.lock();
            pipe.cmd("SSCAN")
                .arg(&room_index)
                .arg(cursor)
                .arg("COUNT")
                .arg(WALK_PAGE);
        }
        Reassert {
            sh,
            pipe,
            rooms,
            sadds,
            walk,
        }
    }

    /// Sends the commands ahead of the plain pin refresh of `plain` (`(id, wire)`; one round
    /// trip), with, on a cluster, the check of the dataset token of every master serving a
    /// room of `held` (`plain` and `pending`; `crate::shards`); handles their replies. Returns
    /// the refresh's outcomes, the rooms whose pin lapsed (for `rooms::refresh_lapsed`) and
    /// the rooms of `held` on a master that lost its data (to restore).
    #[allow(clippy::type_complexity)]
    fn send_with_refresh(
        self,
        link: &mut Link,
        plain: &[(String, String)],
        held: &[String],
        pending: &BTreeSet<String>,
    ) -> Result<(
        Vec<(String, Refreshed)>,
        Vec<(String, String)>,
        BTreeSet<String>,
    )> {
        let sh = self.sh;
        // The masters to check: those of the rooms held (the pending ones too).
        let pending: Vec<String> = pending
            .iter()
            .filter_map(|r| encode_id(IdKind::Room, r).ok())
            .collect();
        let (refreshed, lost) = link.run(&sh.redis, |c| {
            let checks = shards::Checks::new(sh, c, plain, &pending);
            let with_checks;
            let ahead = if checks.pipe().is_empty() {
                &self.pipe
            } else {
                let mut p = self.pipe.clone();
                for cmd in checks.pipe().cmd_iter() {
                    p.add_command(cmd.clone());
                }
                with_checks = p;
                &with_checks
            };
            let mut refreshed = rooms::refresh_plain(&sh.ctx, c, plain, ahead)?;
            let checked = refreshed
                .ahead
                .split_off(self.pipe.len().min(refreshed.ahead.len()));
            let lost = checks.handle(&sh.shards, checked);
            sh.counters
                .data_losses
                .fetch_add(lost.len() as u64, Ordering::Relaxed);
            let lost = if lost.is_empty() {
                BTreeSet::new()
            } else {
                let rooms: BTreeSet<String> =
                    shards::rooms_on(c, &lost, held).into_iter().collect();
                log::warn!(
                    "{} rooms this node holds are on {}, which lost its data: restoring them",
                    rooms.len(),
                    shards::describe(&lost)
                );
                rooms
            };
            Ok((refreshed, lost))
        })?;
        let rooms::Plain { ahead, out, lapsed } = refreshed;
        self.handle(ahead);
        Ok((out, lapsed, lost))
    }

    /// Handles the replies of the commands (never fails: see [`Reassert`]).
    fn handle(self, replies: Vec<redis::RedisResult<redis::Value>>) {
        let sh = self.sh;
        // Closed while the round trip was under way: the index write may have landed after its
        // SREM; the settlements look again under the room lock.
        for room in &self.rooms {
            if !sh.local.has_room(room) {
                sh.local.mark_uncertain(room);
            }
        }
        let mut replies = replies.into_iter();
        let mut added = 0;
        for reply in replies.by_ref().take(self.sadds) {
            match rooms::indexed(&sh.ctx, REASSERT_OP, reply) {
                Ok(i) => added += i.added,
                Err(e) => log::warn!("{e}"),
            }
        }
        if added > 0 {
            log::warn!(
                "put {added} missing entries back into this instance's room index (rooms it holds; a clean-up had removed them)"
            );
        }
        if self.walk {
            let (next, rooms) = walk_page(&mut replies, "room index");
            *sh.local.index_walk.lock() = next;
            for w in rooms {
                if let Ok(room) = decode_id(&w) {
                    if !sh.local.has_room(&room) {
                        sh.local.mark_uncertain(&room);
                    }
                }
            }
        }
    }
}

/// One `SSCAN` reply of the walk: the next cursor and the members that are text. A failed
/// reply (an index key of the wrong type) or a malformed one restarts that walk at 0; members
/// that are not UTF-8 were not written by this crate and are skipped (logged; fsck reports).
fn walk_page(
    replies: &mut impl Iterator<Item = redis::RedisResult<redis::Value>>,
    what: &str,
) -> (u64, Vec<String>) {
    let Some(reply) = replies.next() else {
        return (0, Vec::new());
    };
    match conn::decode::<(u64, Vec<Vec<u8>>)>(REASSERT_OP, reply) {
        Ok((next, raw)) => {
            let members = raw
                .into_iter()
                .filter_map(|m| match String::from_utf8(m) {
                    Ok(m) => Some(m),
                    Err(e) => {
                        log::warn!(
                            "this instance's {what} holds a non-UTF-8 member {:?}; skipped (see fsck)",
                            String::from_utf8_lossy(e.as_bytes())
                        );
                        None
                    }
                })
                .collect();
            (next, members)
        }
        Err(e) => {
            log::warn!("walk of this instance's {what}: {e}");
            (0, Vec::new())
        }
    }
}

/// [`Reassert`] of every stripe, in a round trip of its own (no walk).
fn reassert_held(sh: &Shared, link: &mut Link) -> Result<()> {
    let r = Reassert::new(sh, 0..ROOM_LOCKS, false);
    if r.pipe.is_empty() {
        return Ok(());
    }
    let replies = link.run(&sh.redis, |c| {
        conn::exec(c, &mut r.pipe.clone()).map_err(|e| Error::redis(REASSERT_OP, e))
    })?;
    r.handle(replies);
    Ok(())
}

/// Members of the room index one tick looks at (see `reassert_held`).
const WALK_PAGE: usize = 256;

/// Forgets rooms another instance owns now (or that are gone), reports them, deletes this
/// instance's records left in them ([`rooms::sweep_own`]) and removes them from this
/// instance's room index (record first, index second: the index reaches those records until
/// they are gone).
fn lose_rooms(sh: &Shared, link: &mut Link, lost: Vec<(String, Option<String>)>) -> Result<()> {
    for (room, new_owner) in lost {
        let _guard = sh.local.lock_room(&room);
        // Closed by the host meanwhile: nothing to report.
        if !sh.local.has_room(&room) {
            continue;
        }
        sh.local.remove_room(&room);
        sh.events.emit(Event::RoomLost {
            room: room.clone(),
            new_owner,
        });
        if let Ok(w) = encode_id(IdKind::Room, &room) {
            // Should this fail, the walk of the room index finds the room again (not held) and
            // settles it the same way.
            unindex_unheld(sh, link, &room, &w)?;
        }
    }
    Ok(())
}

/// Rooms whose `pin_room` or `close_room` ended without a known outcome (a timeout after the
/// request was sent): a pin that did land is released (owner CAS) and the index entry removed;
/// rooms the host pinned again meanwhile are left alone. Peers whose `remove_peer` ended so
/// get the remove sent again (a no-op if it had run). Then uncertain upserts are settled.
fn settle_uncertain(sh: &Shared, link: &mut Link) -> Result<()> {
    for room in sh.local.uncertain() {
        let _guard = sh.local.lock_room(&room);
        if sh.local.has_room(&room) {
            sh.local.settled(&room);
            continue;
        }
        let Ok(w) = encode_id(IdKind::Room, &room) else {
            sh.local.settled(&room);
            continue;
        };
        match link.run(&sh.redis, |c| rooms::close(&sh.ctx, c, &w, &room)) {
            Ok(()) => log::info!("room {room:?}: released a pin whose pin_room had timed out"),
            Err(Error::NotOwner { .. }) => unindex_unheld(sh, link, &room, &w)?,
            Err(e) if e.kind() == crate::ErrorKind::BadData => log::warn!("room {room:?}: {e}"),
            Err(e) => return Err(e),
        }
        sh.local.settled(&room);
    }
    let mut removes = sh.local.take_uncertain_peers().into_iter();
    while let Some((room, peer, generation)) = removes.next() {
        let Some((r, p)) = wire_room_peer(&room, &peer) else {
            continue;
        };
        let _guard = sh.local.lock_room(&room);
        let out = link.run(&sh.redis, |c| {
            peers::remove(&sh.ctx, c, (&r, &room), (&p, &peer), generation)
        });
        match out {
            Ok(_) | Err(Error::NotPeerOwner { .. }) => {}
            Err(e) if e.kind() == crate::ErrorKind::BadData => log::warn!("peer {peer:?}: {e}"),
            Err(e) => {
                // This one and the ones not tried yet: the next tick tries them again.
                sh.local.mark_uncertain_peer(&room, &peer, generation);
                for (room, peer, generation) in removes {
                    sh.local.mark_uncertain_peer(&room, &peer, generation);
                }
                return Err(e);
            }
        }
    }
    settle_uncertain_upserts(sh, link)?;
    settle_suspects(sh, link)
}

/// Removes `room` (id, wire form), which this node does not hold and whose pin is not ours,
/// from this instance's room index, after deleting this instance's records left in it
/// ([`rooms::sweep_own`]: record first, index second; invariants 2 and 4). A room found ours
/// again keeps its entry. The caller holds the room's lock.
fn unindex_unheld(sh: &Shared, link: &mut Link, room: &str, wire: &str) -> Result<()> {
    let swept = match link.run(&sh.redis, |c| rooms::sweep_own(&sh.ctx, c, wire)) {
        Ok(swept) => swept,
        Err(e) if e.kind() == crate::ErrorKind::BadData => {
            // Left for the audit; the entry stays, so the records stay reachable.
            log::warn!("room {room:?}: {e}");
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let Some(n) = swept else {
        return Ok(());
    };
    if n > 0 {
        log::info!(
            "room {room:?}: deleted {n} records of this instance in a room it no longer holds"
        );
    }
    link.run(&sh.redis, |c| {
        redis::cmd("SREM")
            .arg(sh.ctx.keys.instance_rooms(&sh.ctx.me))
            .arg(wire)
            .query::<()>(c)
            .map_err(|e| Error::redis("unindex a room not held", e))
    })
}

/// Held peers an upsert with a lost reply may have superseded (same guest, see `Local`'s
/// `suspects`): under the room's lock, a peer the node still holds whose record no longer names
/// this instance (deleted by that upsert, which did land) is forgotten and its index entry
/// Otherwise the node would keep a peer whose record is gone, and write it back after a data
/// loss (invariant 4).
fn settle_suspects(sh: &Shared, link: &mut Link) -> Result<()> {
    let mut suspects = sh.local.take_suspects().into_iter();
    while let Some((room, peer)) = suspects.next() {
        let Some((r, p)) = wire_room_peer(&room, &peer) else {
            continue;
        };
        let _guard = sh.local.lock_room(&room);
        if sh.local.peer_generation(&room, &peer).is_none() {
            continue;
        }
        let out = link.run(&sh.redis, |c| {
            redis::cmd("HGET")
                .arg(sh.ctx.keys.peer(&r, &p))
                .arg("instance")
                .query::<Option<String>>(c)
                .map_err(|e| Error::redis("check a possibly superseded peer", e))
        });
        match out {
            Ok(Some(i)) if i == sh.ctx.me => {}
            Ok(_) => {
                log::info!("peer {peer:?} of room {room:?}: superseded by an upsert whose reply was lost; forgotten");
                sh.local.remove_peer(&room, &peer);
            }
            Err(e) if e.kind() == crate::ErrorKind::BadData => log::warn!("peer {peer:?}: {e}"),
            Err(e) => {
                sh.local.mark_suspect(&room, &peer);
                for (room, peer) in suspects {
                    sh.local.mark_suspect(&room, &peer);
                }
                return Err(e);
            }
        }
    }
    Ok(())
}

/// The wire forms of a room and peer id the node stored (always valid; `None` skips it).
fn wire_room_peer(room: &str, peer: &str) -> Option<(String, String)> {
    Some((
        encode_id(IdKind::Room, room).ok()?,
        encode_id(IdKind::Peer, peer).ok()?,
    ))
}

/// Upserts whose outcome is unknown (a timeout after the request was sent): the record may
/// have been written although the host was told the call failed. Rule (the simplest safe one;
/// the lost reply's generation is unknown): if the node does not hold the peer, a record
/// naming this instance is deleted by its generation. A peer the node holds (the host upserted
/// it again, or held it before this attempt) keeps its record. Protects invariant 4 and "nothing the host was told failed is written back".
fn settle_uncertain_upserts(sh: &Shared, link: &mut Link) -> Result<()> {
    let mut upserts = sh.local.take_uncertain_upserts().into_iter();
    while let Some((room, peer)) = upserts.next() {
        let Some((r, p)) = wire_room_peer(&room, &peer) else {
            continue;
        };
        let _guard = sh.local.lock_room(&room);
        if sh.local.peer_generation(&room, &peer).is_some() {
            continue;
        }
        let out = link.run(&sh.redis, |c| {
            peers::drop_unheld(&sh.ctx, c, (&r, &room), (&p, &peer))
        });
        match out {
            Ok(removed) => {
                if removed {
                    log::info!("peer {peer:?} of room {room:?}: removed the record of an upsert that had timed out");
                }
            }
            Err(e) if e.kind() == crate::ErrorKind::BadData => log::warn!("peer {peer:?}: {e}"),
            Err(e) => {
                // This one and the ones not tried yet: the next tick tries them again.
                sh.local.mark_uncertain_upsert(&room, &peer);
                for (room, peer) in upserts {
                    sh.local.mark_uncertain_upsert(&room, &peer);
                }
                return Err(e);
            }
        }
    }
    Ok(())
}

/// A tick that would have registered this instance again (Redis lost its data) found the
/// prefix stamped with another key schema version: nothing was written. The node stops acting
/// on the prefix: its term ends, every room it held is reported lost (`room_lost`, no new
/// owner), and it stays parked (`Shared::schema_refused`) until a registration succeeds.
fn park(sh: &Shared, e: &Error) {
    log::error!("{e}; this node stops writing to the prefix and registers again once the stamp names its version");
    sh.leader.end_with(&sh.events, LeaderLostReason::LeaseTaken);
    let rooms = sh.local.clear();
    sh.restore_pending.store(false, Ordering::Relaxed);
    sh.shards.lock().restore.clear();
    for room in rooms {
        sh.events.emit(Event::RoomLost {
            room,
            new_owner: None,
        });
    }
}

/// This instance was reaped while it was unresponsive (a zombie): every room it held is lost.
/// Report them, forget them (never write them back), clean what the reap may have left of this
/// id (rooms and peers written before `server_us`, server microseconds), and register again as
/// a fresh life.
fn resume_after_reap(sh: &Shared, link: &mut Link, server_us: i64) -> Result<()> {
    // The registration is gone for certain: a reap took it, no failover lost it. Until the
    // next registration (which is unconfirmed again), an index write of this instance may
    // hand it to the reaper (`index_add.lua`): a crash before that registration leaves
    // nothing out of a leader's reach (model check).
    sh.ctx.unconfirmed.store(false, Ordering::Relaxed);
    let room_ids = sh.local.clear();
    sh.restore_pending.store(false, Ordering::Relaxed);
    sh.shards.lock().restore.clear();
    log::warn!(
        "instance {} was reaped while unresponsive; {} rooms lost; registering again",
        sh.id,
        room_ids.len()
    );
    sh.leader
        .end_with(&sh.events, LeaderLostReason::DeadlinePassed);
    sh.counters.reaped_self.fetch_add(1, Ordering::Relaxed);
    sh.events.emit(Event::ReapedSelf {
        rooms: room_ids.len(),
        room_ids: room_ids.clone(),
    });
    let owners: Vec<Option<String>> = link
        .run(&sh.redis, |c| {
            let mut pipe = redis::pipe();
            for r in &room_ids {
                let w = encode_id(IdKind::Room, r)?;
                pipe.get(sh.ctx.keys.room(&w).owner);
            }
            pipe.query::<Vec<Option<String>>>(c)
                .map_err(|e| Error::redis("read owners of lost rooms", e))
        })
        .unwrap_or_else(|_| vec![None; room_ids.len()]);
    // The lost rooms go into the room index (index first) so that the clean-up of the earlier
    // life below finds each, also one whose entry a reaper removed while a host call pinned
    // it again before this tick saw the reap: it reaps those still pinned before
    // `server_us` (reported lost above) and keeps what was pinned after.
    let wires: Vec<String> = room_ids
        .iter()
        .filter_map(|r| encode_id(IdKind::Room, r).ok())
        .collect();
    if !wires.is_empty() {
        link.run(&sh.redis, |c| {
            rooms::index_add(&sh.ctx, c, "index the lost rooms for the clean-up", &wires)
        })?;
    }
    for (room, owner) in room_ids.into_iter().zip(owners) {
        let new_owner = owner.map(|o| decode_id(&o).unwrap_or(o));
        sh.events.emit(Event::RoomLost { room, new_owner });
    }
    register(sh, link, server_us)
}

/// Whether a heartbeat that finds this instance missing (or being reaped) under an unchanged
/// dataset token means a failover lost its registration rather than a reap: no replica of the
/// master it was last found on had acknowledged it, and this beat reached another master
/// (`made`, the connection's switch count).
fn registration_lost(sh: &Shared, made: u64) -> bool {
    sh.ctx.unconfirmed.load(Ordering::Relaxed)
        && made != sh.registration_switches.load(Ordering::Relaxed)
}

/// Asks, until it is so, whether a replica has this life's registration (`lease::replicated`:
/// `WAIT`, or no replica a failover could promote). A failure leaves it unconfirmed for the
/// next tick.
fn confirm_registration(sh: &Shared, link: &mut Link) {
    if !sh.ctx.unconfirmed.load(Ordering::Relaxed) {
        return;
    }
    let asked = link.run_fenced(&sh.redis, |c, made| {
        // Only on the master the registration was last found on: WAIT covers this
        // connection's own writes, and a promoted master has no replica history yet.
        if made != sh.registration_switches.load(Ordering::Relaxed) {
            return Ok(false);
        }
        // On a cluster a keyless command goes to the node of the last keyed one: the
        // control slot's master, where the registration is.
        redis::cmd("EXISTS")
            .arg(sh.ctx.keys.heartbeats())
            .query::<i64>(c)
            .map_err(|e| Error::redis("confirm the registration", e))?;
        lease::replicated(&sh.ctx, &sh.redis, c)
    });
    match asked {
        Ok(true) => sh.ctx.unconfirmed.store(false, Ordering::Relaxed),
        Ok(false) => log::debug!(
            "no replica has acknowledged the registration of {} yet",
            sh.id
        ),
        Err(e) => log::debug!("confirm the registration of {}: {e}", sh.id),
    }
}

/// A failover lost this life's registration (`Beat::Unregistered`): the new master has no
/// record of it, and whatever it wrote after registering is gone with it (replication keeps
/// order). It registers again and restores every pin and peer it holds, as after any master
/// switch (`restore_pending`); its host was never told anything failed, so nothing is reported
/// lost but rooms another instance took meanwhile. What an earlier life of this id left there
/// is cleaned as at the first registration: rooms and records written before this life began
/// (`Shared::life_t0_us`, the lost registration's clean-up boundary, in µs; what this life wrote
/// since is newer, or comes back with the restore). Also met as 'reaped' (score 0): a reap
/// under way on this master began before the registration reached it; registering merges the
/// moved index back and the reap ends 'alive'.
fn register_lost(sh: &Shared, link: &mut Link) -> Result<()> {
    log::warn!(
        "instance {} is missing on {}, and no replica had acknowledged its registration: a failover lost it; registering again and restoring pins and peers",
        sh.id,
        sh.redis.describe()
    );
    sh.restore_pending.store(true, Ordering::Relaxed);
    let t0 = match sh.life_t0_us.load(Ordering::Relaxed) {
        0 => link.run(&sh.redis, conn::server_time_us)?,
        t0 => t0,
    };
    register(sh, link, t0)
}

/// Registers a fresh life of this instance id and removes what an earlier life left under it
/// (rooms and peer records written strictly before `t0`, server microseconds), with the
/// reaper's owner-CAS
/// scripts. Rooms the host pins from now on are newer than `t0` and kept.
pub(crate) fn register(sh: &Shared, link: &mut Link, t0: i64) -> Result<()> {
    // The life starts at `t0`, its clean-up boundary: what it writes from there on is kept,
    // so its info's `started_ms` says the same (a zombie's host may pin between the beat that
    // found the reap and this registration; a chaos check once took such a room for an
    // earlier life's, pinned 1 ms before the registration's own server time).
    sh.ctx
        .started_ms
        .store((t0 / 1000).max(1), Ordering::Relaxed);
    sh.life_t0_us.store(t0, Ordering::Relaxed);
    let beaten = link.run_fenced(&sh.redis, |c, made| {
        beat(sh, c, BeatMode::Register, made).inspect_err(|_| {
            // The registration may have landed with its reply lost: the next tick then finds
            // it 'ok' and writes nothing, so this is the only moment to note that a replica
            // has yet to acknowledge it (else no `WAIT` is ever made for this life, and a
            // failover that loses it is taken for a reap).
            sh.ctx.unconfirmed.store(true, Ordering::Relaxed);
            sh.registration_switches.store(made, Ordering::Relaxed);
        })
    })?;
    if beaten.beat == Beat::Ok {
        // Mostly at once (WAIT returns when a replica acknowledges); else the ticks ask again.
        confirm_registration(sh, link);
    }
    if beaten.beat == Beat::Duplicate {
        return Err(Error::config(
            "instance_id",
            format!(
                "another live process is using instance id {:?} (its heartbeat key holds another boot token); instance ids must be unique",
                sh.id
            ),
        ));
    }
    if beaten.beat == Beat::Restored {
        // Redis lost its data since this node last saw it (a zombie registering again after
        // the loss, say): what its host holds now, pinned since the reap was noticed, is
        // written back by the next tick as after any data loss, not reported lost (model
        // check, finding 6).
        log::warn!(
            "instance {} registered under a new dataset token: Redis lost its data; restoring pins and peers",
            sh.id
        );
        sh.counters.data_losses.fetch_add(1, Ordering::Relaxed);
        sh.restore_pending.store(true, Ordering::Relaxed);
    }
    let cleaned = link
        .run(&sh.redis, |c| {
            reaper::clean_own_leftovers(&sh.ctx, &sh.counters, &sh.local, c, t0)
        })
        .inspect_err(|_| {
            // A removal may still land late, after a host call wrote the entry again.
            sh.local.reassert_everything();
        })?;
    if cleaned.rooms + cleaned.peers > 0 {
        log::warn!(
            "removed {} rooms and {} peer records left by an earlier life of instance {}",
            cleaned.rooms,
            cleaned.peers,
            sh.id
        );
    }
    // Host calls may have pinned or upserted meanwhile (after a zombie's rooms were
    // forgotten), and the clean-up removes index entries in a later round trip than the
    // deletes: what this node holds now goes back into its room index.
    reassert_held(sh, link)?;
    sh.counters.heartbeat_ok();
    Ok(())
}

/// The heartbeat thread: a tick every `heartbeat_interval` (missed ticks are skipped); after a
/// failure, retries with jittered backoff capped at the interval, so it resumes within two
/// ticks of Redis coming back. Never exits but on shutdown.
pub(crate) fn run(sh: &Shared, shutdown: &Receiver<()>) {
    let interval = sh.ctx.timings.heartbeat_interval;
    let mut link = Link::new();
    let crashed = || sh.is_crashed();
    let periodic = Periodic::new(shutdown, &crashed, Backoff::new(interval / 8, interval));
    periodic.run(Instant::now() + interval, |run| {
        let started = Instant::now();
        match tick(sh, &mut link) {
            Ok(()) => {
                let took = started.elapsed();
                if took > interval / 2 {
                    sh.counters.slow_tick(took);
                    log::warn!("heartbeat tick took {} ms", took.as_millis());
                }
                run.ok(worker::every(run.scheduled, interval))
            }
            Err(e) => {
                sh.note_error(&e);
                sh.counters.heartbeat_failed();
                log::warn!("heartbeat failed: {e}");
                run.retry()
            }
        }
    });
    // A graceful stop (the host calls have drained: `Node::shutdown`): mark the heartbeat
    // released, on this thread's connection, so the call is bounded by `command_timeout` and
    // runs alongside the lease thread's release. Best effort: if it fails, a restart with
    // this id waits for the key to expire.
    if !sh.is_crashed() {
        if let Err(e) = release(sh, &mut link) {
            log::warn!(
                "could not mark the heartbeat released ({e}); a restart with instance id {:?} waits up to heartbeat_ttl",
                sh.id
            );
        }
    }
}

/// Marks this process's heartbeat key released (owner CAS on the boot token; the key keeps its
/// TTL, so the instance still looks alive until it expires): a restart with the same id then
/// registers at once. Skipped if a tick ever found another process's token under this id.
fn release(sh: &Shared, link: &mut Link) -> Result<()> {
    if sh.saw_duplicate.load(Ordering::Relaxed) {
        log::warn!(
            "another process used instance id {:?} while this one ran; heartbeat not released",
            sh.id
        );
        return Ok(());
    }
    let mut inv = SCRIPTS.heartbeat_release.prepare_invoke();
    inv.key(sh.ctx.keys.heartbeat(&sh.ctx.me)).arg(&sh.boot);
    link.run(&sh.redis, |c| {
        conn::call::<i64>(c, "release heartbeat", &inv)
    })?;
    Ok(())
}
