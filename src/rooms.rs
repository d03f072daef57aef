//! Rooms on Redis: pin (with takeover of a stale pin), close, owner, and the heartbeat's
//! pipelined pin refresh and restore.
//!
//! Cross-slot order (docs/DESIGN.md "Rules"): the instance's room index (`{ctl}`) is written before
//! the pin (`{R}`), and cleaned after the room is deleted, so a crash in between leaves at most
//! an index entry pointing at nothing, never a room that no index reaches. The room index also
//! reaches every peer record naming the instance (key schema version 2): a room the instance
//! no longer holds leaves its index only after its own records there are deleted
//! ([`sweep_own`]).

use redis::Pipeline;
use std::sync::atomic::Ordering;

use crate::conn::{self, Conn};
use crate::error::{Error, Result};
use crate::keys::{decode_id, encode_id, IdKind};
use crate::scripts::{RoomReplies, SCRIPTS};
use crate::state::{Ctx, Local};

/// Peer records deleted per script call when a room is closed or reaped.
pub(crate) const PEER_BATCH: usize = 256;

/// What `Node::pin_room` did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PinOutcome {
    /// The room was free; this instance owns it now.
    Pinned,
    /// This instance already owned it (the pin was refreshed).
    AlreadyOurs,
    /// The previous owner's pin had expired or its heartbeat was gone; this instance took the
    /// room over. The previous owner's peers stay until it is reaped or re-homes them.
    TookOver {
        /// The previous owner.
        previous: String,
    },
    /// Another live instance owns the room; nothing was written. Send the client there.
    Held {
        /// The owner.
        owner: String,
    },
}

impl PinOutcome {
    /// True when this instance owns the room after the call.
    pub fn is_owned(&self) -> bool {
        !matches!(self, PinOutcome::Held { .. })
    }
}

/// What `index_add.lua` did: its reply `{added, marked}`, summed over calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Indexed {
    /// How many members were new.
    pub added: i64,
    /// This instance was not registered (reaped to completion while unresponsive, or it
    /// left): the script set its score to 0, handing it to the reaper.
    pub marked: bool,
}

/// The `index_add.lua` calls that add `members` (wire forms) to this instance's own live room
/// index, at most [`conn::MEMBERS_PER_COMMAND`] members each (none for no member). Every
/// write of the instance's own room index goes through this script ([`index_add`], or these
/// calls in a pipeline, each reply read with [`indexed`]): should the instance no longer be
/// registered (no sorted-set entry, no heartbeat key), the script gives it score 0, so a
/// leader reaps what the index reaches (docs/DESIGN.md "No leftovers out of reach"); while its
/// registration is unconfirmed ([`Ctx::unconfirmed`]: a failover may have lost it while it
/// lives on), only when the reap tombstone names this life ([`Ctx::started_ms`]: a reap took
/// the registration).
pub(crate) fn index_add_invocations<T: AsRef<str>>(
    ctx: &Ctx,
    members: &[T],
) -> Vec<redis::ScriptInvocation<'static>> {
    members
        .chunks(conn::MEMBERS_PER_COMMAND)
        .map(|chunk| {
            let mut inv = SCRIPTS.index_add.prepare_invoke();
            inv.key(ctx.keys.heartbeats())
                .key(ctx.keys.heartbeat(&ctx.me))
                .key(ctx.keys.instance_rooms(&ctx.me))
                .key(ctx.keys.instance_reaped(&ctx.me))
                .arg(&ctx.me)
                .arg(if ctx.unconfirmed.load(Ordering::Relaxed) {
                    "0"
                } else {
                    "1"
                })
                .arg(ctx.started_ms.load(Ordering::Relaxed));
            for m in chunk {
                inv.arg(m.as_ref());
            }
            inv
        })
        .collect()
}

/// Adds `members` (wire forms) to this instance's own live room index (`index_add.lua`, one
/// call per [`conn::MEMBERS_PER_COMMAND`] members, in one round trip), marking it for the
/// reaper should it not be registered any more ([`index_add_invocations`]). `op` names the
/// caller's step in errors and in the warning a mark logs.
pub(crate) fn index_add<T: AsRef<str>>(
    ctx: &Ctx,
    con: &mut Conn,
    op: &'static str,
    members: &[T],
) -> Result<Indexed> {
    let mut invs = index_add_invocations(ctx, members);
    if invs.len() > 1 {
        // One round trip for all.
        let mut pipe = redis::pipe();
        for inv in &invs {
            pipe.invoke_script(inv);
        }
        let mut out = Indexed::default();
        for reply in conn::exec(con, &mut pipe).map_err(|e| Error::redis(op, e))? {
            let one = indexed(ctx, op, reply)?;
            out.added += one.added;
            out.marked |= one.marked;
        }
        return Ok(out);
    }
    let Some(inv) = invs.pop() else {
        return Ok(Indexed::default());
    };
    let (added, marked): (i64, i64) = conn::call(con, op, &inv)?;
    if marked == 1 {
        warn_marked(ctx, op);
    }
    Ok(Indexed {
        added,
        marked: marked == 1,
    })
}

/// The reply of one pipelined `index_add.lua` call ([`index_add_invocations`]); a mark is
/// logged.
pub(crate) fn indexed(
    ctx: &Ctx,
    op: &'static str,
    reply: redis::RedisResult<redis::Value>,
) -> Result<Indexed> {
    let (added, marked): (i64, i64) = conn::decode(op, reply)?;
    if marked == 1 {
        warn_marked(ctx, op);
    }
    Ok(Indexed {
        added,
        marked: marked == 1,
    })
}

fn warn_marked(ctx: &Ctx, op: &str) {
    log::warn!(
        "instance {} wrote its room index ({op}) while not registered (reaped while unresponsive, or it left): handed to the reaper (score 0); its next heartbeat registers it again",
        ctx.me
    );
}

/// Pins `room` (wire form, `room_id` the caller's) for this instance. A pin held by an
/// instance whose heartbeat key is gone is taken over (owner CAS on that dead owner).
///
/// The room goes into this instance's index first, in its own round trip ([`index_add`]:
/// should this instance no longer be registered, a zombie, it is handed to the reaper), and
/// the pin script runs only if that write succeeded (index before record). When the pin is
/// definitely not ours afterwards (held elsewhere, or the script refused on bad data) the
/// index entry is removed again if this call added it (`added` said so; then no record of
/// this instance can be in the room, as none could be without the entry). An entry that was
/// there before (records of this instance left in a room it lost, not swept yet) stays, and
/// the room is marked uncertain: the heartbeat sweeps those records before it removes the
/// entry ([`sweep_own`]). When the outcome is unknown (the request was sent but timed out) nothing
/// more is sent on that connection: the room is marked uncertain in `local` and the heartbeat
/// settles it (releases a pin that did land).
pub(crate) fn pin(
    ctx: &Ctx,
    local: &Local,
    con: &mut Conn,
    room: &str,
    room_id: &str,
    owned: bool,
) -> Result<PinOutcome> {
    let op = "pin room";
    let index = ctx.keys.instance_rooms(&ctx.me);
    let added = index_add(ctx, con, op, &[room]);
    let added = match added {
        Ok(i) => i.added == 1,
        Err(e) => {
            // The entry may have landed with its reply lost: the heartbeat settles the room
            // like an uncertain pin (nothing to release; the entry goes).
            if !e.outcome_known() && !owned {
                local.mark_uncertain(room_id);
            }
            return Err(e);
        }
    };
    let out = try_pin(ctx, con, room);
    let definite = match &out {
        Ok(o) => !o.is_owned(),
        Err(e) => e.outcome_known(),
    };
    if !definite {
        if out.is_err() && !owned {
            local.mark_uncertain(room_id);
        }
        return out;
    }
    if !owned && added {
        let undo: redis::RedisResult<()> = redis::cmd("SREM").arg(&index).arg(room).query(con);
        if let Err(e) = undo {
            log::warn!("could not remove room {room} from this instance's index: {e}");
        }
    } else if !owned {
        local.mark_uncertain(room_id);
    }
    out
}

fn try_pin(ctx: &Ctx, con: &mut Conn, room: &str) -> Result<PinOutcome> {
    let op = "pin room";
    let mut stale_owner = String::new();
    loop {
        let (status, other) = pin_room_script(ctx, con, room, &stale_owner)?;
        // Another instance's id as stored (not decoded if somebody else wrote garbage there:
        // the pin is ours by then, or the caller only needs to know it is held).
        let lenient = |w: String| decode_id(&w).unwrap_or(w);
        return Ok(match status.as_str() {
            "pinned" => PinOutcome::Pinned,
            "ours" => PinOutcome::AlreadyOurs,
            "took_over" => PinOutcome::TookOver {
                previous: lenient(other),
            },
            "held" => {
                // Phase two of a takeover: is the holder's heartbeat gone?
                let alive: bool = redis::cmd("EXISTS")
                    .arg(ctx.keys.heartbeat(&other))
                    .query(con)
                    .map_err(|e| Error::redis(op, e))?;
                if !alive && stale_owner.is_empty() {
                    stale_owner = other;
                    continue;
                }
                PinOutcome::Held {
                    owner: lenient(other),
                }
            }
            s => return Err(Error::bad_data(op, format!("pin_room.lua replied {s:?}"))),
        });
    }
}

/// One `pin_room.lua` call for `room` (wire form): `(status, other)`; `stale_owner` is the
/// holder found dead, or empty.
pub(crate) fn pin_room_script(
    ctx: &Ctx,
    con: &mut Conn,
    room: &str,
    stale_owner: &str,
) -> Result<(String, String)> {
    let rk = ctx.keys.room(room);
    let mut inv = SCRIPTS.pin_room.prepare_invoke();
    inv.key(&rk.owner)
        .key(&rk.meta)
        .arg(&ctx.me)
        .arg(ctx.timings.pin_ttl.as_millis() as u64)
        .arg(stale_owner);
    conn::call(con, "pin room", &inv)
}

/// Deletes `room` (wire form) and its peers if this instance owns it.
pub(crate) fn close(ctx: &Ctx, con: &mut Conn, room: &str, room_id: &str) -> Result<()> {
    let op = "close room";
    close_scripts(ctx, con, room, room_id)?;
    redis::cmd("SREM")
        .arg(ctx.keys.instance_rooms(&ctx.me))
        .arg(room)
        .query::<()>(con)
        .map_err(|e| Error::redis(op, e))
}

/// The script part of [`close`]: `close_room.lua` until the room is closed (its index entry
/// is left to the caller).
pub(crate) fn close_scripts(ctx: &Ctx, con: &mut Conn, room: &str, room_id: &str) -> Result<()> {
    let op = "close room";
    let rk = ctx.keys.room(room);
    let mut cursor = "0".to_owned();
    loop {
        let mut inv = SCRIPTS.close_room.prepare_invoke();
        for k in rk.all() {
            inv.key(k);
        }
        inv.arg(&ctx.me).arg(&cursor).arg(PEER_BATCH);
        let (status, next): (String, String) = conn::call(con, op, &inv)?;
        match status.as_str() {
            "more" => cursor = next,
            "closed" => break,
            "not_owner" => {
                return Err(Error::NotOwner {
                    room: room_id.to_owned(),
                    owner: if next.is_empty() {
                        None
                    } else {
                        decode_id(&next).ok()
                    },
                })
            }
            s => return Err(Error::bad_data(op, format!("close_room.lua replied {s:?}"))),
        }
    }
    Ok(())
}

/// The instance named by the room's pin, if any.
pub(crate) fn owner(ctx: &Ctx, con: &mut Conn, room: &str) -> Result<Option<String>> {
    let op = "read room owner";
    let v: Option<String> = redis::cmd("GET")
        .arg(ctx.keys.room(room).owner)
        .query(con)
        .map_err(|e| Error::redis(op, e))?;
    v.map(|w| decode_id(&w)).transpose()
}

/// Deletes this instance's own peer records in `room` (wire form), a room it does not hold
/// (another instance owns it now, or it is gone), with `reap_room.lua` (this instance as the
/// "dead" one, every record of it older than the largest t0). Run before the room's entry leaves
/// this instance's room index, which must reach every record naming the instance (key schema
/// version 2, invariants 2 and 4): a room lost to a takeover keeps this instance's records
/// until then, and they are stale (the host was told the room is lost). Returns how many
/// records were deleted.
///
/// The caller holds the room's lock and does not hold the room: this instance writes nothing
/// into it meanwhile. Should the room turn out to be this instance's again (pin or metadata
/// naming it: a lock-free path re-pinned it), nothing is deleted: `Error::NotOwner` is not the
/// reply, the room is reported `Ok(None)` and its entry must stay.
pub(crate) fn sweep_own(ctx: &Ctx, con: &mut Conn, room: &str) -> Result<Option<u64>> {
    let op = "delete own records in a room not held";
    let rk = ctx.keys.room(room);
    let (owner, meta_owner): (Option<String>, Option<String>) = redis::pipe()
        .get(&rk.owner)
        .hget(&rk.meta, "owner")
        .query(con)
        .map_err(|e| Error::redis(op, e))?;
    if owner.as_deref() == Some(ctx.me.as_str())
        || (owner.is_none() && meta_owner.as_deref() == Some(ctx.me.as_str()))
    {
        return Ok(None);
    }
    let mut cursor = "0".to_owned();
    let mut deleted = 0u64;
    // Each call moves the room's SSCAN forward; a room kept ('skipped') ends at cursor 0.
    for _ in 0..10_000 {
        // The room's five keys (one room per call: the cluster's form on every topology, so
        // that a slot being migrated answers TRYAGAIN while they are split).
        let mut inv = SCRIPTS.reap_room.prepare_invoke();
        for k in rk.all() {
            inv.key(k);
        }
        inv.arg(&ctx.me)
            .arg(SWEEP_ALL)
            .arg(PEER_BATCH)
            .arg(5)
            .arg(&cursor);
        // Its fourth element (records kept as written after t0) is always 0 here.
        let RoomReplies(replies) = conn::call(con, op, &inv)?;
        let Some((status, next, n, _)) = replies.into_iter().next() else {
            return Err(Error::bad_data(op, "reap_room.lua replied with no room"));
        };
        if status == "error" {
            return Err(Error::bad_data(op, format!("room {room}: {next}")));
        }
        deleted += n;
        match next.as_str() {
            "0" => return Ok(Some(deleted)),
            "again" => cursor = "0".to_owned(),
            _ => cursor = next,
        }
    }
    Err(Error::bad_data(
        op,
        format!("room {room}: its peers kept changing"),
    ))
}

/// `reap_room.lua`'s t0 for [`sweep_own`]: every record, whenever written (2^53 - 1, the
/// largest integer a Lua number holds exactly; server microseconds stay far below it).
const SWEEP_ALL: u64 = (1 << 53) - 1;

/// Per-command replies of a pipeline (`conn::exec`).
pub(crate) type Replies = Vec<redis::RedisResult<redis::Value>>;

/// What the heartbeat found for one of its pins.
#[derive(Debug)]
pub(crate) enum Refreshed {
    /// Still ours; extended.
    Ok,
    /// It was gone and nobody took it: pinned again.
    Repinned,
    /// Another instance owns it now (`Some`), or the room is gone (`None`).
    Lost(Option<String>),
    /// The refresh of this one room failed (bad data); retried next tick.
    Failed(Error),
}

/// The wire forms of `rooms` (callers' ids), as `(id, wire)`; an id that cannot be encoded
/// (never stored) is left out.
pub(crate) fn wired(rooms: &[String]) -> Vec<(String, String)> {
    rooms
        .iter()
        .filter_map(|r| encode_id(IdKind::Room, r).ok().map(|w| (r.clone(), w)))
        .collect()
}

/// What the plain refresh ([`refresh_plain`]) found.
pub(crate) struct Plain {
    /// The replies of the caller's commands sent ahead.
    pub ahead: Replies,
    /// Rooms whose pin named us (extended), named another instance, or failed.
    pub out: Vec<(String, Refreshed)>,
    /// Rooms whose pin is gone, `(id, wire)`: for [`refresh_lapsed`] (or [`restore_pins`]).
    pub lapsed: Vec<(String, String)>,
}

/// Refreshes every pin in `rooms` (`(id, wire)`, [`wired`]), the tick's steady state: one
/// pipelined round trip of plain commands, per room `PEXPIRE owner pin_ttl GT` then `GET
/// owner`. `GT` only ever lengthens a TTL and `PEXPIRE` never changes a value, so the refresh
/// cannot shorten or overwrite another instance's pin; the `GET` tells whether the pin is still
/// ours. (Should it name another instance, that instance's pin got at most one `pin_ttl`
/// longer, which changes no owner: a pin whose owner has no heartbeat can be taken over and is
/// reaped whatever its TTL.) On the server this costs about 2x a bare pipelined `PEXPIRE`,
/// where a per-room script costs about 6x (docs/src/performance.md "Tick").
///
/// Rooms whose pin is gone are returned apart ([`Plain::lapsed`]): the caller sends them
/// through `pin_refresh.lua` ([`refresh_lapsed`]; owner CAS, re-pins a free room) in a second
/// round trip, or restores them ([`restore_pins`]) when their master lost its data.
///
/// `ahead` (may be empty): commands of the caller sent first in the same round trip; their
/// replies are returned in [`Plain::ahead`]. On a cluster each master's share of `ahead` runs
/// before that master's refreshes (one connection per master, commands in order).
pub(crate) fn refresh_plain(
    ctx: &Ctx,
    con: &mut Conn,
    rooms: &[(String, String)],
    ahead: &Pipeline,
) -> Result<Plain> {
    let op = "refresh pins";
    let ttl = ctx.timings.pin_ttl.as_millis() as u64;
    let mut pipe = ahead.clone();
    for (_, w) in rooms {
        let owner = ctx.keys.room_owner(w);
        pipe.cmd("PEXPIRE").arg(&owner).arg(ttl).arg("GT");
        pipe.get(&owner);
    }
    let mut replies = conn::exec(con, &mut pipe).map_err(|e| Error::redis(op, e))?;
    let rest = replies.split_off(ahead.len().min(replies.len()));
    let ahead_replies = replies;
    let mut out = Vec::with_capacity(rooms.len());
    let mut lapsed = Vec::new();
    let mut replies = rest.into_iter();
    for (room, wire) in rooms {
        let (Some(extended), Some(owner)) = (replies.next(), replies.next()) else {
            return Err(Error::bad_data(op, "fewer replies than commands"));
        };
        // A refused PEXPIRE (NOPERM, a server without GT) must not pass for a refresh: the
        // pin would lapse every pin_ttl while the GET still names us.
        if let Err(e) = conn::decode::<i64>(op, extended) {
            out.push((room.clone(), Refreshed::Failed(e)));
            continue;
        }
        let outcome = match conn::decode::<Option<String>>(op, owner) {
            Ok(Some(owner)) if owner == ctx.me => Refreshed::Ok,
            Ok(Some(owner)) => Refreshed::Lost(decode_id(&owner).ok()),
            Ok(None) => {
                lapsed.push((room.clone(), wire.clone()));
                continue;
            }
            Err(e) => Refreshed::Failed(e),
        };
        out.push((room.clone(), outcome));
    }
    Ok(Plain {
        ahead: ahead_replies,
        out,
        lapsed,
    })
}

/// `pin_refresh.lua` for rooms whose pin lapsed (`(id, wire)`), in one pipelined round trip:
/// a room whose metadata still names us is pinned again, one another instance owns is lost,
/// one whose pin and metadata are gone (closed or reaped) is lost with no new owner. Nothing
/// is written to the room index: a re-pin needs metadata naming us, a record the index has
/// reached since the room's pin (index first, `pin`).
pub(crate) fn refresh_lapsed(
    ctx: &Ctx,
    con: &mut Conn,
    lapsed: Vec<(String, String)>,
) -> Result<Vec<(String, Refreshed)>> {
    if lapsed.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    let (_, out) = pin_refresh_scripts(ctx, con, &mut pipe, 0, lapsed, false)?;
    Ok(out)
}

/// Writes back the pins of `rooms` (`(id, wire)`) after their master lost its data (Redis
/// lost its data, a failover to a replica that missed writes, or on a cluster one master
/// restarted empty): each room goes back into this instance's room index, then
/// `pin_refresh.lua` pins it again when it is free (also when its metadata is gone, which it
/// then writes: owner and pin time), reports it lost when another instance owns it, and
/// extends it when it is still ours.
///
/// Cross-slot order (docs/DESIGN.md): the index entry is written before the pin and metadata
/// (`{ctl}` before `{<R>}`), so a crash in between leaves at most an entry pointing at nothing.
/// The index writes ([`index_add_invocations`]) go first in a round trip of their own,
/// checked, and the re-pins follow only once every write succeeded (one more round trip, only
/// when a restore runs): on a cluster a pipeline is split per master and the masters run their
/// shares in any order, and on one server a refused write (an index key of the wrong type)
/// must not be followed by re-pins and records that no index reaches.
///
/// `ahead` (may be empty): commands of the caller sent first, in the first round trip; their
/// replies are returned beside the outcomes.
pub(crate) fn restore_pins(
    ctx: &Ctx,
    con: &mut Conn,
    rooms: Vec<(String, String)>,
    ahead: &Pipeline,
) -> Result<(Replies, Vec<(String, Refreshed)>)> {
    let op = "restore pins";
    let mut pipe = ahead.clone();
    let wires: Vec<&str> = rooms.iter().map(|(_, w)| w.as_str()).collect();
    for inv in index_add_invocations(ctx, &wires) {
        pipe.invoke_script(&inv);
    }
    let mut replies = conn::exec(con, &mut pipe).map_err(|e| Error::redis(op, e))?;
    for r in replies.split_off(ahead.len().min(replies.len())) {
        // An entry not written: no re-pin (it could leave a room no index reaches).
        indexed(ctx, op, r)?;
    }
    let mut scripts = redis::pipe();
    let (_, out) = pin_refresh_scripts(ctx, con, &mut scripts, 0, rooms, true)?;
    Ok((replies, out))
}

/// Adds `pin_refresh.lua` for each of `rooms` (`(id, wire)`) to `pipe`, whose first `before`
/// commands are the caller's, sends it (one round trip), and returns the replies of those
/// `before` commands and the outcome of each room.
fn pin_refresh_scripts(
    ctx: &Ctx,
    con: &mut Conn,
    pipe: &mut Pipeline,
    before: usize,
    rooms: Vec<(String, String)>,
    restore: bool,
) -> Result<(Replies, Vec<(String, Refreshed)>)> {
    let op = "refresh pins";
    let ttl = ctx.timings.pin_ttl.as_millis() as u64;
    let keys: Vec<_> = rooms.iter().map(|(_, w)| ctx.keys.room(w)).collect();
    let invs: Vec<_> = keys
        .iter()
        .map(|rk| {
            let mut inv = SCRIPTS.pin_refresh.prepare_invoke();
            inv.key(&rk.owner)
                .key(&rk.meta)
                .arg(&ctx.me)
                .arg(ttl)
                .arg(if restore { "1" } else { "0" });
            inv
        })
        .collect();
    for inv in &invs {
        pipe.invoke_script(inv);
    }
    let mut replies = conn::exec(con, pipe).map_err(|e| Error::redis(op, e))?;
    let scripts = replies.split_off(before.min(replies.len()));
    if scripts.len() != rooms.len() {
        return Err(Error::bad_data(op, "fewer replies than commands"));
    }
    let out = rooms
        .into_iter()
        .zip(scripts)
        .map(|((room, _), r)| {
            let outcome = match conn::decode::<(String, String)>(op, r) {
                Ok((s, _)) if s == "ok" => Refreshed::Ok,
                Ok((s, _)) if s == "repinned" => Refreshed::Repinned,
                Ok((s, _)) if s == "gone" => Refreshed::Lost(None),
                Ok((_, owner)) => Refreshed::Lost(decode_id(&owner).ok()),
                Err(e) => Refreshed::Failed(e),
            };
            (room, outcome)
        })
        .collect();
    Ok((replies, out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sfu_redis_testkit::devserver::LocalRedis;

    fn ctx(url: &str, instance: &str) -> Ctx {
        Ctx::for_test(url, instance)
    }

    /// A private `redis-server`, its URL and a connection to it.
    fn server() -> (LocalRedis, String, Conn) {
        let server = LocalRedis::start().expect("start redis-server");
        let url = server.url();
        let con = crate::conn::Redis::new(&url, std::time::Duration::from_secs(5))
            .unwrap()
            .connect()
            .unwrap();
        (server, url, con)
    }

    fn rooms_of(con: &mut Conn, ctx: &Ctx) -> Vec<String> {
        redis::cmd("SMEMBERS")
            .arg(ctx.keys.instance_rooms(&ctx.me))
            .query(con)
            .unwrap()
    }

    // The owner check of pin and close, called directly (no node, no threads): a live owner's
    // pin is left alone and the refused pin leaves no index entry behind; only the owner
    // closes; a pin whose owner has no heartbeat key is taken over.
    #[test]
    fn pin_and_close_check_the_owner_without_a_node() {
        let (_server, url, mut con) = server();
        let (a, b) = (ctx(&url, "a"), ctx(&url, "b"));
        let local = Local::default();

        let pinned = pin(&a, &local, &mut con, "r1", "r1", false).unwrap();
        assert_eq!(pinned, PinOutcome::Pinned);
        assert_eq!(owner(&a, &mut con, "r1").unwrap().as_deref(), Some("a"));
        assert_eq!(rooms_of(&mut con, &a), vec!["r1".to_owned()]);
        let again = pin(&a, &local, &mut con, "r1", "r1", true).unwrap();
        assert_eq!(again, PinOutcome::AlreadyOurs);

        // "a" is alive: "b" is refused and keeps no index entry.
        let _: () = redis::cmd("SET")
            .arg(a.keys.heartbeat(&a.me))
            .arg("alive")
            .query(&mut con)
            .unwrap();
        let held = pin(&b, &local, &mut con, "r1", "r1", false).unwrap();
        assert_eq!(
            held,
            PinOutcome::Held {
                owner: "a".to_owned()
            }
        );
        assert!(rooms_of(&mut con, &b).is_empty());
        match close(&b, &mut con, "r1", "r1") {
            Err(Error::NotOwner { owner, .. }) => assert_eq!(owner.as_deref(), Some("a")),
            other => panic!("b closed a's room: {other:?}"),
        }

        close(&a, &mut con, "r1", "r1").unwrap();
        assert_eq!(owner(&a, &mut con, "r1").unwrap(), None);
        assert!(rooms_of(&mut con, &a).is_empty());

        // "a" pins again, then dies (no heartbeat key): "b" takes the room over.
        pin(&a, &local, &mut con, "r1", "r1", false).unwrap();
        let _: () = redis::cmd("DEL")
            .arg(a.keys.heartbeat(&a.me))
            .query(&mut con)
            .unwrap();
        let took = pin(&b, &local, &mut con, "r1", "r1", false).unwrap();
        assert_eq!(
            took,
            PinOutcome::TookOver {
                previous: "a".to_owned()
            }
        );
        assert_eq!(owner(&b, &mut con, "r1").unwrap().as_deref(), Some("b"));
        assert!(local.uncertain().is_empty());
    }

    fn zscore(con: &mut Conn, ctx: &Ctx) -> Option<i64> {
        redis::cmd("ZSCORE")
            .arg(ctx.keys.heartbeats())
            .arg(&ctx.me)
            .query(con)
            .unwrap()
    }

    // Model check, finding 1: `index_add.lua` hands an instance that is not registered (no
    // sorted-set entry, no heartbeat key: reaped to the end, or gone) to the reaper (score 0),
    // and never touches a registered one's score: a live one, one whose heartbeat key expired
    // while its score is still fresh (it may only have missed a beat: marking it would reap it
    // at once, invariant 1), one being reaped, one with a heartbeat key but no entry. A pin of
    // an unregistered instance marks it too; pipelined calls survive a flushed script cache,
    // and more members than one command carries go in several calls.
    #[test]
    fn index_add_hands_only_an_unregistered_instance_to_the_reaper() {
        let (_server, url, mut con) = server();
        let now = crate::conn::server_time_ms(&mut con).unwrap();
        let op = "index";

        let gone = ctx(&url, "gone");
        let first = index_add(&gone, &mut con, op, &["r1"]).unwrap();
        assert_eq!(
            first,
            Indexed {
                added: 1,
                marked: true
            }
        );
        assert_eq!(zscore(&mut con, &gone), Some(0));
        // Marked already: the entry (score 0, a reap's mark) is left as it is.
        let again = index_add(&gone, &mut con, op, &["r1", "r2"]).unwrap();
        assert_eq!(
            again,
            Indexed {
                added: 1,
                marked: false
            }
        );
        assert_eq!(zscore(&mut con, &gone), Some(0));
        assert_eq!(rooms_of(&mut con, &gone).len(), 2);

        // (id, score, heartbeat key)
        let registered: [(&str, Option<i64>, bool); 4] = [
            ("live", Some(now), true),
            ("late", Some(now - 100), false),
            ("being-reaped", Some(0), false),
            ("hb-only", None, true),
        ];
        for (id, score, hb) in registered {
            let c = ctx(&url, id);
            let mut pipe = redis::pipe();
            if let Some(score) = score {
                pipe.zadd(c.keys.heartbeats(), &c.me, score).ignore();
            }
            if hb {
                pipe.set(c.keys.heartbeat(&c.me), "boot").ignore();
            }
            pipe.query::<()>(&mut con).unwrap();
            let out = index_add(&c, &mut con, op, &["r1"]).unwrap();
            assert_eq!(
                out,
                Indexed {
                    added: 1,
                    marked: false
                },
                "{id}"
            );
            assert_eq!(zscore(&mut con, &c), score, "{id}: its score untouched");
        }

        // The index write of a pin marks an unregistered instance.
        let pinner = ctx(&url, "pinner");
        let pinned = pin(&pinner, &Local::default(), &mut con, "p1", "p1", false).unwrap();
        assert_eq!(pinned, PinOutcome::Pinned);
        assert_eq!(zscore(&mut con, &pinner), Some(0));

        // Pipelined (the re-assert, the restore), after the script cache was flushed: the
        // calls that met NOSCRIPT are sent again.
        let piped = ctx(&url, "piped");
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut con).unwrap();
        let mut p = redis::pipe();
        for inv in index_add_invocations(&piped, &["a", "b"]) {
            p.invoke_script(&inv);
        }
        let replies = conn::exec(&mut con, &mut p).unwrap();
        assert_eq!(replies.len(), 1);
        let out = indexed(&piped, op, replies.into_iter().next().unwrap()).unwrap();
        assert_eq!(
            out,
            Indexed {
                added: 2,
                marked: true
            }
        );
        assert_eq!(zscore(&mut con, &piped), Some(0));

        // More members than one command carries: several calls, one round trip.
        let many = ctx(&url, "many");
        let rooms: Vec<String> = (0..conn::MEMBERS_PER_COMMAND + 10)
            .map(|i| format!("m{i}"))
            .collect();
        assert_eq!(index_add_invocations(&many, &rooms).len(), 2);
        let out = index_add(&many, &mut con, op, &rooms).unwrap();
        assert_eq!(out.added, rooms.len() as i64);
        assert!(out.marked);
        assert_eq!(
            index_add(&many, &mut con, op, &Vec::<String>::new()).unwrap(),
            Indexed::default()
        );
    }

    // Model check, findings 9 and 11: while this life's registration is unconfirmed (a
    // failover may have lost it), an unregistered instance is marked only when the reap
    // tombstone names this very life (a reap took the registration): not when it names
    // another life, is missing, has another type, or the life is not known yet.
    #[test]
    fn index_add_while_unconfirmed_marks_only_the_life_a_reap_named() {
        let (_server, url, mut con) = server();
        let op = "index";
        // (id, this life's started_ms, the tombstone: Some(string) or a list, marked)
        let cases: [(&str, i64, Option<&str>, bool); 6] = [
            ("no-tomb", 1_700, None, false),
            ("other-life", 1_700, Some("1699"), false),
            ("this-life", 1_700, Some("1700"), true),
            ("unknown-life", 0, Some("0"), false),
            ("list-tomb", 1_700, Some("list"), false),
            ("confirmed", 1_700, None, true),
        ];
        for (id, started, tomb, want) in cases {
            let c = ctx(&url, id);
            c.unconfirmed.store(id != "confirmed", Ordering::Relaxed);
            c.started_ms.store(started, Ordering::Relaxed);
            let key = c.keys.instance_reaped(&c.me);
            match tomb {
                Some("list") => {
                    let _: () = redis::cmd("RPUSH")
                        .arg(&key)
                        .arg("1700")
                        .query(&mut con)
                        .unwrap();
                }
                Some(v) => {
                    let _: () = redis::cmd("SET").arg(&key).arg(v).query(&mut con).unwrap();
                }
                None => {}
            }
            let out = index_add(&c, &mut con, op, &["r1"]).unwrap();
            assert_eq!(
                out,
                Indexed {
                    added: 1,
                    marked: want
                },
                "{id}"
            );
            assert_eq!(zscore(&mut con, &c), want.then_some(0), "{id}");
            assert_eq!(rooms_of(&mut con, &c).len(), 1, "{id}: the room is indexed");
        }
    }
}
