//! Hooks of the model's trace replay (`model/tests/replay.rs`), `testing` feature only: one
//! instance's Redis calls, each a thin wrapper over the data-access function or the script
//! invocation the library itself sends (the same keys and arguments), on a connection the
//! caller owns. Not an API: replies are plain strings and numbers, as the model compares them.

use crate::config::Timings;
use crate::conn::{self, Conn};
use crate::error::{Error, ErrorKind, Result};
use crate::heartbeat::{self, BeatMode};
use crate::keys::{decode_id, encode_id, IdKind, KeySpace};
use crate::lease::{self, Acquire};
use crate::peers;
use crate::reaper::{self, Floor};
use crate::rooms::{self, Refreshed};
use crate::scripts::SCRIPTS;
use crate::state::Ctx;

/// One instance (its id, key space and timings): what a data-access function needs.
#[derive(Debug, Clone)]
pub struct Instance {
    ctx: Ctx,
}

/// The wire form of room or peer id `raw` (ids of the replay are plain).
fn wire(kind: IdKind, raw: &str) -> String {
    encode_id(kind, raw).expect("a plain id")
}

fn not_owner(e: Error) -> Result<Option<String>> {
    match e {
        Error::NotOwner { owner, .. } => Ok(owner),
        e => Err(e),
    }
}

impl Instance {
    /// Instance `id` (a plain id) of the prefix `keys`, with `timings`.
    pub fn new(keys: &KeySpace, id: &str, timings: Timings) -> Instance {
        Instance {
            ctx: Ctx {
                me: wire(IdKind::Instance, id),
                keys: keys.clone(),
                timings,
                reap_batch: crate::REAP_BATCH,
                reap_pace: 0.0,
                unconfirmed: Default::default(),
                started_ms: Default::default(),
            },
        }
    }

    /// heartbeat.lua as `heartbeat::beat` sends it (no info fields, no peers; `started_ms`
    /// this life's start, 0 if unknown): `(status, server_ms, server_us)`.
    pub fn heartbeat(
        &self,
        con: &mut Conn,
        register: bool,
        known: &str,
        boot: &str,
        max_epoch: u64,
        started_ms: i64,
    ) -> Result<(String, i64, i64)> {
        let mode = if register {
            BeatMode::Register
        } else {
            BeatMode::Tick
        };
        let inv =
            heartbeat::beat_invocation(&self.ctx, mode, known, boot, max_epoch, started_ms, 0, &[]);
        let (status, ms, _token, _epoch, us, ..): heartbeat::BeatReply =
            conn::call(con, "heartbeat", &inv)?;
        Ok((status, ms, us))
    }

    /// heartbeat_release.lua (as `heartbeat::release` sends it).
    pub fn heartbeat_release(&self, con: &mut Conn, boot: &str) -> Result<bool> {
        let mut inv = SCRIPTS.heartbeat_release.prepare_invoke();
        inv.key(self.ctx.keys.heartbeat(&self.ctx.me)).arg(boot);
        Ok(conn::call::<i64>(con, "release heartbeat", &inv)? == 1)
    }

    /// `index_add.lua` of `rooms` to this instance's room index (`rooms::index_add`, as
    /// `rooms::pin` and the re-assert send it; it marks an unregistered instance with score
    /// 0, if `may_mark`: the registration is confirmed, or if the reap tombstone names
    /// `started_ms`, this life's start, 0 if unknown): how many were new.
    pub fn index_add(
        &self,
        con: &mut Conn,
        rooms: &[&str],
        may_mark: bool,
        started_ms: i64,
    ) -> Result<i64> {
        use std::sync::atomic::Ordering;
        let rooms: Vec<String> = rooms.iter().map(|r| wire(IdKind::Room, r)).collect();
        self.ctx.unconfirmed.store(!may_mark, Ordering::Relaxed);
        self.ctx.started_ms.store(started_ms, Ordering::Relaxed);
        Ok(rooms::index_add(&self.ctx, con, "index", &rooms)?.added)
    }

    /// `SREM` of `rooms` from this instance's room index.
    pub fn index_remove(&self, con: &mut Conn, rooms: &[&str]) -> Result<()> {
        let rooms: Vec<String> = rooms.iter().map(|r| wire(IdKind::Room, r)).collect();
        redis::cmd("SREM")
            .arg(self.ctx.keys.instance_rooms(&self.ctx.me))
            .arg(rooms)
            .query(con)
            .map_err(|e| Error::redis("unindex", e))
    }

    /// `Node::leave`'s deregistration (`deregister.lua`): heartbeat key and info deleted; the
    /// sorted-set entry removed, or set to 0 when a room index of the instance remains.
    pub fn deregister(&self, con: &mut Conn) -> Result<()> {
        crate::store::deregister_on(&self.ctx, con).map(|_| ())
    }

    /// One pin_room.lua call (`rooms::pin_room_script`): `(status, other)`, ids decoded.
    pub fn pin_room(
        &self,
        con: &mut Conn,
        room: &str,
        stale_owner: Option<&str>,
    ) -> Result<(String, String)> {
        let stale = stale_owner.map_or(String::new(), |o| wire(IdKind::Instance, o));
        let (status, other) =
            rooms::pin_room_script(&self.ctx, con, &wire(IdKind::Room, room), &stale)?;
        Ok((status, decode_id(&other).unwrap_or(other)))
    }

    /// `EXISTS` of `instance`'s heartbeat key (the takeover check of `rooms::try_pin`).
    pub fn hb_exists(&self, con: &mut Conn, instance: &str) -> Result<bool> {
        redis::cmd("EXISTS")
            .arg(self.ctx.keys.heartbeat(&wire(IdKind::Instance, instance)))
            .query(con)
            .map_err(|e| Error::redis("exists", e))
    }

    /// The tick's plain refresh of one pin (`rooms::refresh_plain`): `None` lapsed, `Some(None)`
    /// ours, `Some(Some(owner))` another's.
    pub fn refresh_plain(&self, con: &mut Conn, room: &str) -> Result<Option<Option<String>>> {
        let rooms = [(room.to_owned(), wire(IdKind::Room, room))];
        let plain = rooms::refresh_plain(&self.ctx, con, &rooms, &redis::pipe())?;
        if !plain.lapsed.is_empty() {
            return Ok(None);
        }
        match plain.out.into_iter().next() {
            Some((_, Refreshed::Ok)) => Ok(Some(None)),
            Some((_, Refreshed::Lost(o))) => Ok(Some(Some(o.unwrap_or_default()))),
            Some((_, Refreshed::Failed(e))) => Err(e),
            other => Err(Error::bad_data("refresh", format!("{other:?}"))),
        }
    }

    /// pin_refresh.lua ('0', `rooms::refresh_lapsed`): "ok", "repinned", "gone" or the owner.
    pub fn pin_refresh(&self, con: &mut Conn, room: &str) -> Result<String> {
        let lapsed = vec![(room.to_owned(), wire(IdKind::Room, room))];
        match rooms::refresh_lapsed(&self.ctx, con, lapsed)?.pop() {
            Some((_, Refreshed::Ok)) => Ok("ok".into()),
            Some((_, Refreshed::Repinned)) => Ok("repinned".into()),
            Some((_, Refreshed::Lost(None))) => Ok("gone".into()),
            Some((_, Refreshed::Lost(Some(o)))) => Ok(o),
            Some((_, Refreshed::Failed(e))) => Err(e),
            None => Err(Error::bad_data("refresh", "no reply")),
        }
    }

    /// The restore of one held room after Redis lost its data (`rooms::restore_pins`: its
    /// room index entry, then pin_refresh.lua '1'): "ok", "repinned" or the owner.
    pub fn restore_pin(&self, con: &mut Conn, room: &str) -> Result<String> {
        let rooms = vec![(room.to_owned(), wire(IdKind::Room, room))];
        match rooms::restore_pins(&self.ctx, con, rooms, &redis::pipe())?
            .1
            .pop()
        {
            Some((_, Refreshed::Ok)) => Ok("ok".into()),
            Some((_, Refreshed::Repinned)) => Ok("repinned".into()),
            Some((_, Refreshed::Lost(None))) => Ok("gone".into()),
            Some((_, Refreshed::Lost(Some(o)))) => Ok(o),
            Some((_, Refreshed::Failed(e))) => Err(e),
            None => Err(Error::bad_data("restore", "no reply")),
        }
    }

    /// The write-back of one held peer record with its generation (`peers::restore`, no
    /// guest, no fields): whether it was written ('not_owner' writes nothing).
    pub fn restore_peer(
        &self,
        con: &mut Conn,
        room: &str,
        peer: &str,
        generation: u64,
    ) -> Result<bool> {
        let held = crate::state::LocalPeer {
            guest: None,
            fields: Vec::new(),
            generation,
        };
        Ok(peers::restore(&self.ctx, con, &[(room.to_owned(), peer.to_owned(), held)])? == 1)
    }

    /// close_room.lua until closed (`rooms::close_scripts`): `Ok(None)` closed, `Ok(Some(o))`
    /// not the owner (`o` the owner, empty if none).
    pub fn close_room(&self, con: &mut Conn, room: &str) -> Result<Option<String>> {
        match rooms::close_scripts(&self.ctx, con, &wire(IdKind::Room, room), room) {
            Ok(()) => Ok(None),
            Err(e) => not_owner(e).map(|o| Some(o.unwrap_or_default())),
        }
    }

    /// `rooms::sweep_own`: `false` when the room is this instance's (nothing swept).
    pub fn sweep_own(&self, con: &mut Conn, room: &str) -> Result<bool> {
        Ok(rooms::sweep_own(&self.ctx, con, &wire(IdKind::Room, room))?.is_some())
    }

    /// upsert_peer.lua (`peers::upsert`, no guest, no fields): `Ok(generation)` or
    /// `Err(owner)` (empty if none).
    pub fn upsert(
        &self,
        con: &mut Conn,
        room: &str,
        peer: &str,
    ) -> Result<std::result::Result<u64, String>> {
        let (rw, pw) = (wire(IdKind::Room, room), wire(IdKind::Peer, peer));
        match peers::upsert(&self.ctx, con, &rw, room, &pw, None, &[]) {
            Ok(u) => Ok(Ok(u.generation)),
            Err(e) => not_owner(e).map(|o| Err(o.unwrap_or_default())),
        }
    }

    /// remove_peer.lua (`peers::remove`): `Ok(removed)` or `Err(owner)` (another's record).
    pub fn remove(
        &self,
        con: &mut Conn,
        room: &str,
        peer: &str,
        generation: u64,
    ) -> Result<std::result::Result<bool, String>> {
        let (rw, pw) = (wire(IdKind::Room, room), wire(IdKind::Peer, peer));
        match peers::remove(&self.ctx, con, (&rw, room), (&pw, peer), generation) {
            Ok(b) => Ok(Ok(b)),
            Err(Error::NotPeerOwner { owner, .. }) => Ok(Err(owner)),
            Err(e) => Err(e),
        }
    }

    /// lease_acquire.lua (`lease::acquire`): `Ok(epoch)` or `Err(holder)`.
    pub fn lease_acquire(
        &self,
        con: &mut Conn,
        seen: u64,
    ) -> Result<std::result::Result<u64, String>> {
        Ok(match lease::acquire(&self.ctx, con, seen)? {
            Acquire::Won { epoch, .. } => Ok(epoch),
            Acquire::Held(h) => Err(decode_id(&h).unwrap_or(h)),
        })
    }

    /// lease_refresh.lua (`lease::refresh`).
    pub fn lease_refresh(&self, con: &mut Conn) -> Result<bool> {
        lease::refresh(&self.ctx, con)
    }

    /// lease_release.lua (`lease::release`).
    pub fn lease_release(&self, con: &mut Conn) -> Result<bool> {
        lease::release(&self.ctx, con)
    }

    /// candidates.lua (`reaper::candidates`, a fresh floor): instance ids, this one excluded.
    pub fn candidates(&self, con: &mut Conn) -> Result<Vec<String>> {
        let ids = reaper::candidates(&self.ctx, con, &mut Floor::default())?;
        Ok(ids
            .into_iter()
            .map(|w| decode_id(&w).unwrap_or(w))
            .collect())
    }

    /// reap_begin.lua (`reaper::begin`) for `dead`: "not_leader", "none" (alive or gone) or
    /// "dead" with `(t0, token)` (server µs).
    pub fn reap_begin(&self, con: &mut Conn, dead: &str) -> Result<(String, i64, i64)> {
        match reaper::begin(&self.ctx, con, &wire(IdKind::Instance, dead)) {
            Ok(Some((t0, token))) => Ok(("dead".into(), t0, token)),
            Ok(None) => Ok(("none".into(), 0, 0)),
            Err(e) if e.kind() == ErrorKind::NotLeader => Ok(("not_leader".into(), 0, 0)),
            Err(e) => Err(e),
        }
    }

    /// reap_room.lua for one room of `dead` (`reaper::room_invocation`), called until its peer
    /// cursor is done: `(status, deleted, late)` of the last call, `deleted` and `late` summed.
    pub fn reap_room(
        &self,
        con: &mut Conn,
        dead: &str,
        t0: i64,
        room: &str,
    ) -> Result<(String, u64, u64)> {
        let (dw, rw) = (wire(IdKind::Instance, dead), wire(IdKind::Room, room));
        let (mut cursor, mut deleted, mut late) = ("0".to_owned(), 0, 0);
        loop {
            let one = [(rw.clone(), cursor)];
            let inv = reaper::room_invocation(&self.ctx, &dw, t0, &one, con.is_cluster());
            let crate::scripts::RoomReplies(replies) = conn::call(con, "reap room", &inv)?;
            let Some((status, next, d, l)) = replies.into_iter().next() else {
                return Err(Error::bad_data("reap room", "no reply"));
            };
            if status == "error" {
                return Err(Error::bad_data("reap room", next));
            }
            deleted += d;
            late += l;
            match next.as_str() {
                "0" => return Ok((status, deleted, late)),
                "again" => cursor = "0".to_owned(),
                _ => cursor = next,
            }
        }
    }

    /// reap_putback.lua (`reaper::putback_invocation`) of the reap whose token is `token`:
    /// how many rooms went back, -1 skipped.
    pub fn reap_putback(
        &self,
        con: &mut Conn,
        dead: &str,
        token: i64,
        rooms: &[&str],
    ) -> Result<i64> {
        let rooms: Vec<String> = rooms.iter().map(|r| wire(IdKind::Room, r)).collect();
        let refs: Vec<&String> = rooms.iter().collect();
        let inv =
            reaper::putback_invocation(&self.ctx, &wire(IdKind::Instance, dead), token, &refs);
        conn::call(con, "put back", &inv)
    }

    /// reap_finish.lua (`reaper::finish_invocation`): `(status, rooms)`.
    pub fn reap_finish(
        &self,
        con: &mut Conn,
        dead: &str,
        kept: u64,
        token: i64,
        put_back: usize,
    ) -> Result<(String, i64)> {
        let inv = reaper::finish_invocation(
            &self.ctx,
            &wire(IdKind::Instance, dead),
            kept,
            token,
            put_back,
        );
        conn::call(con, "finish reap", &inv)
    }
}
