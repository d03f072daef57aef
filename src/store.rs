//! The host calls on Redis: [`RedisStore`] runs each on a pooled connection, straight through
//! the data-access functions of `rooms` and `peers` (`memory::MemoryStore` is the in-memory
//! counterpart; `Node` holds one of the two as one enum). Ids reaching a store are validated.

use std::sync::Arc;

use crate::conn::Conn;
use crate::error::{Error, Result};
use crate::keys::Id;
use crate::peers::{self, Upserted};
use crate::rooms;
use crate::state::{Ctx, Shared};

// `ffi` names the outcome by this path.
pub(crate) use crate::rooms::PinOutcome;

/// The Redis-backed host calls of one node.
#[derive(Debug)]
pub(crate) struct RedisStore {
    sh: Arc<Shared>,
    /// The connection of `Node::heartbeat_now`.
    #[cfg(feature = "testing")]
    manual: parking_lot::Mutex<crate::conn::Link>,
}

impl RedisStore {
    pub(crate) fn new(sh: Arc<Shared>) -> Self {
        RedisStore {
            sh,
            #[cfg(feature = "testing")]
            manual: parking_lot::Mutex::new(crate::conn::Link::new()),
        }
    }

    /// The state shared with the worker threads.
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.sh
    }

    pub(crate) fn pin_room(&self, room: &Id) -> Result<PinOutcome> {
        let sh = &*self.sh;
        let owned = sh.local.has_room(&room.raw);
        sh.pool.run(&sh.redis, |c| {
            rooms::pin(&sh.ctx, &sh.local, c, &room.wire, &room.raw, owned)
        })
    }

    /// Deletes the room if this instance owns it; [`Error::NotOwner`] otherwise.
    pub(crate) fn close_room(&self, room: &Id) -> Result<()> {
        let sh = &*self.sh;
        sh.pool.run(&sh.redis, |c| {
            rooms::close(&sh.ctx, c, &room.wire, &room.raw)
        })
    }

    pub(crate) fn room_owner(&self, room: &Id) -> Result<Option<String>> {
        let sh = &*self.sh;
        sh.pool
            .run(&sh.redis, |c| rooms::owner(&sh.ctx, c, &room.wire))
    }

    pub(crate) fn upsert_peer(
        &self,
        room: &Id,
        peer: &Id,
        guest: Option<&Id>,
        fields: &[(&str, &str)],
    ) -> Result<Upserted> {
        let sh = &*self.sh;
        sh.pool.run(&sh.redis, |c| {
            peers::upsert(
                &sh.ctx,
                c,
                &room.wire,
                &room.raw,
                &peer.wire,
                guest.map(|g| g.wire.as_str()),
                fields,
            )
        })
    }

    pub(crate) fn remove_peer(&self, room: &Id, peer: &Id, generation: u64) -> Result<bool> {
        let sh = &*self.sh;
        sh.pool.run(&sh.redis, |c| {
            peers::remove(
                &sh.ctx,
                c,
                (&room.wire, &room.raw),
                (&peer.wire, &peer.raw),
                generation,
            )
        })
    }

    /// Before deregistering (`Node::leave`, once the rooms it held are closed): every room still
    /// in this instance's room index is one it does not hold (lost to another instance, or a
    /// pin whose outcome was unknown). Each is settled as the tick settles one: closed if its
    /// pin is still ours, else this instance's records in it deleted ([`rooms::sweep_own`]),
    /// then its entry removed, so that no record naming this instance is left out of a
    /// reaper's reach once it is gone (invariant 2). Returns how many rooms stay indexed (bad
    /// data, or held again meanwhile).
    pub(crate) fn settle_unheld(&self) -> Result<usize> {
        let sh = &*self.sh;
        let op = "settle rooms not held";
        let index = sh.ctx.keys.instance_rooms(&sh.ctx.me);
        let members: Vec<Vec<u8>> = sh.pool.run(&sh.redis, |c| {
            redis::cmd("SMEMBERS")
                .arg(&index)
                .query(c)
                .map_err(|e| Error::redis(op, e))
        })?;
        let mut left = 0;
        for raw in members {
            let Some((wire, id)) = String::from_utf8(raw)
                .ok()
                .and_then(|w| crate::keys::decode_id(&w).ok().map(|id| (w, id)))
            else {
                left += 1;
                continue;
            };
            let _guard = sh.local.lock_room(&id);
            if sh.local.has_room(&id) {
                left += 1;
                continue;
            }
            let settled = sh.pool.run(&sh.redis, |c| {
                match rooms::close(&sh.ctx, c, &wire, &id) {
                    Ok(()) => return Ok(true),
                    Err(Error::NotOwner { .. }) => {}
                    Err(e) => return Err(e),
                }
                if rooms::sweep_own(&sh.ctx, c, &wire)?.is_none() {
                    return Ok(false);
                }
                redis::cmd("SREM")
                    .arg(&index)
                    .arg(&wire)
                    .query::<()>(c)
                    .map_err(|e| Error::redis(op, e))?;
                Ok(true)
            });
            match settled {
                Ok(true) => {}
                Ok(false) => left += 1,
                Err(e) if e.kind() == crate::ErrorKind::BadData => {
                    log::warn!("room {id:?}: {e}");
                    left += 1;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(left)
    }

    /// Deletes this instance's heartbeat key and sorted-set entry (`Node::leave`).
    pub(crate) fn deregister(&self) -> Result<()> {
        let sh = &*self.sh;
        sh.pool.run(&sh.redis, |c| deregister_on(&sh.ctx, c))
    }

    /// One heartbeat tick on the calling thread (`Node::heartbeat_now`).
    #[cfg(feature = "testing")]
    pub(crate) fn heartbeat_now(&self) -> Result<()> {
        crate::heartbeat::tick(&self.sh, &mut self.manual.lock())
    }

    /// Re-checks and reaps `dead` on the calling thread, as the leader's reaper would after its
    /// two-phase wait (`Node::reap_now`).
    #[cfg(feature = "testing")]
    pub(crate) fn reap_now(&self, dead: &Id) -> Result<Option<crate::ReapCounts>> {
        use crate::event::Event;
        let sh = &*self.sh;
        // An instance never reaps itself.
        if dead.wire == sh.ctx.me {
            return Ok(None);
        }
        let stop = sh.stopping.receiver();
        let leading = || sh.is_leader() && !crate::worker::stopping(stop);
        if !leading() {
            return Err(Error::NotLeader);
        }
        let started = std::time::Instant::now();
        let pace = crate::reaper::Pace {
            ratio: sh.ctx.reap_pace,
            stop: Some(stop),
        };
        let counts = sh
            .pool
            .run(&sh.redis, |c| {
                crate::reaper::reap_instance(&sh.ctx, &sh.counters, c, &dead.wire, &leading, pace)
            })
            // The node began to stop during the reap (its pause ended at once): say so.
            .map_err(|e| match e {
                Error::NotLeader if crate::worker::stopping(stop) => Error::Stopped,
                e => e,
            })?;
        if let Some((c, finished)) = &counts {
            sh.counters
                .reaped(c.rooms, c.peers, c.skipped_rooms, started.elapsed());
            // As the reaper thread: the event says the instance is gone.
            if *finished == crate::reaper::Finish::Done {
                sh.events.emit(Event::InstanceReaped {
                    dead: dead.raw.clone(),
                    rooms: c.rooms,
                    peers: c.peers,
                    skipped_rooms: c.skipped_rooms,
                    forced: false,
                });
            }
        }
        Ok(counts.map(|(c, _)| c))
    }
}

/// `Node::leave`'s deregistration of instance `ctx.me`: its heartbeat key, sorted-set entry and
/// info hash, in one round trip.
pub(crate) fn deregister_on(ctx: &Ctx, con: &mut Conn) -> Result<()> {
    let (keys, me) = (&ctx.keys, &ctx.me);
    redis::pipe()
        .del(keys.heartbeat(me))
        .ignore()
        .zrem(keys.heartbeats(), me)
        .ignore()
        .del(keys.instance_info(me))
        .ignore()
        .query::<()>(con)
        .map_err(|e| Error::redis("deregister", e))
}
