//! The host calls on Redis: [`RedisStore`] runs each on a pooled connection, straight through
//! the data-access functions of `rooms` and `peers` (`memory::MemoryStore` is the in-memory
//! counterpart; `Node` holds one of the two as one enum). Ids reaching a store are validated.

use std::sync::Arc;

use crate::conn::{self, Conn};
use crate::error::{Error, Result};
use crate::keys::Id;
use crate::peers::{self, Upserted};
use crate::rooms;
use crate::scripts::SCRIPTS;
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

    /// Deletes this instance's heartbeat key, info and sorted-set entry (`Node::leave`), or
    /// hands it to the reaper when a room index of it remains ([`deregister_on`]).
    pub(crate) fn deregister(&self) -> Result<Deregistered> {
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

/// What [`deregister_on`] did (`deregister.lua`'s reply).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Deregistered {
    /// The sorted-set entry is gone: nothing of the instance is indexed.
    Gone,
    /// A room index of the instance still exists (a reap of it is under way, or entries the
    /// leave could not settle): its score is 0, so a leader reaps what is left.
    Handed,
}

/// `Node::leave`'s deregistration of instance `ctx.me` (`deregister.lua`, one round trip): its
/// heartbeat key and info hash are deleted; its sorted-set entry is removed, unless a room
/// index of it still exists (its live one, or one a reap moved aside) or a reap's token: then
/// its score becomes 0 and a leader reaps what the indexes reach (invariant 2; model check, finding 3: a
/// zombie's leave during its reap removed the reap's mark, and no round listed it again).
pub(crate) fn deregister_on(ctx: &Ctx, con: &mut Conn) -> Result<Deregistered> {
    let op = "deregister";
    let (keys, me) = (&ctx.keys, &ctx.me);
    let mut inv = SCRIPTS.deregister.prepare_invoke();
    inv.key(keys.heartbeats())
        .key(keys.heartbeat(me))
        .key(keys.instance_info(me));
    // Its live room index, the one a reap moved aside, and that reap's token.
    for key in keys.instance_index_keys(me) {
        inv.key(key);
    }
    inv.arg(me);
    let status: String = conn::call(con, op, &inv)?;
    match status.as_str() {
        "gone" => Ok(Deregistered::Gone),
        "handed" => {
            log::info!(
                "instance {me} left with rooms still indexed (a reap of it under way, or rooms the leave could not settle): handed to the reaper (score 0)"
            );
            Ok(Deregistered::Handed)
        }
        s => Err(Error::bad_data(op, format!("deregister.lua replied {s:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sfu_redis_testkit::devserver::LocalRedis;

    // Model check, finding 3: `deregister.lua` deletes the heartbeat key and the info, and
    // removes the sorted-set entry only when no room index of the instance is left ('gone');
    // with its live index or the one a reap moved aside still there, the entry gets score 0
    // ('handed'), so a leader reaps what they reach.
    #[test]
    fn a_deregistration_hands_an_instance_with_an_index_to_the_reaper() {
        let server = LocalRedis::start().expect("start redis-server");
        let mut con = crate::conn::Redis::new(&server.url(), std::time::Duration::from_secs(5))
            .unwrap()
            .connect()
            .unwrap();
        let url = server.url();
        let ctx = |id: &str| Ctx::for_test(&url, id);
        // (id, its live index, its moved index, a reap's token, what the deregistration finds)
        let cases = [
            ("clean", false, false, false, Deregistered::Gone),
            ("live-left", true, false, false, Deregistered::Handed),
            ("mid-reap", false, true, false, Deregistered::Handed),
            (
                "mid-reap-no-rooms",
                false,
                false,
                true,
                Deregistered::Handed,
            ),
        ];
        for (id, live, moved, token, want) in cases {
            let c = ctx(id);
            let (ks, me) = (&c.keys, &c.me);
            let mut pipe = redis::pipe();
            pipe.zadd(ks.heartbeats(), me, 12345)
                .ignore()
                .set(ks.heartbeat(me), "boot")
                .ignore()
                .hset(ks.instance_info(me), "started_ms", 1)
                .ignore();
            if live {
                pipe.sadd(ks.instance_rooms(me), "r").ignore();
            }
            if moved {
                pipe.sadd(ks.instance_reaping_rooms(me), "r").ignore();
            }
            if token {
                pipe.set(ks.instance_reaping(me), "1").ignore();
            }
            pipe.query::<()>(&mut con).unwrap();
            assert_eq!(deregister_on(&c, &mut con).unwrap(), want, "{id}");
            let (score, hb, info): (Option<i64>, bool, bool) = redis::pipe()
                .zscore(ks.heartbeats(), me)
                .exists(ks.heartbeat(me))
                .exists(ks.instance_info(me))
                .query(&mut con)
                .unwrap();
            let want_score = (want == Deregistered::Handed).then_some(0);
            assert_eq!((score, hb, info), (want_score, false, false), "{id}");
        }
    }
}
