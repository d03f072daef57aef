//! Peers on Redis: upsert (stale index entries removed first) and remove (no-op for an older
//! generation).
//!
//! A join or a leave is one script call in the room's slot, on every topology: the room's
//! own indexes (`peers`, `guests`) change with the record, and the instance's room index, which
//! reaches every record naming the instance, already holds the room (key schema version 2:
//! only a room's owner writes records into it; docs/DESIGN.md "Schema version").

use redis::{ScriptInvocation, Value};

use crate::conn::{self, Conn};
use crate::error::{Error, Result};
use crate::keys::{decode_id, encode_id, IdKind, KeySpace, RoomKeys};
use crate::scripts::SCRIPTS;
use crate::state::{Ctx, LocalPeer};

/// Peer fields reserved by the library; a host field with one of these names is refused.
pub const RESERVED_PEER_FIELDS: [&str; 5] = [
    "instance",
    "guest",
    "generation",
    "updated_ms",
    "updated_us",
];

/// The most host fields one peer record may carry.
pub const MAX_PEER_FIELDS: usize = 64;

/// What `Node::upsert_peer_detailed` did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Upserted {
    /// The record's generation: pass it to `Node::remove_peer`.
    pub generation: u64,
    /// Another peer of the same guest that this upsert replaced (its record was deleted): a
    /// quick reconnect with a new peer id. Tear its transport down.
    pub replaced: Option<String>,
}

/// Upserts peer `peer` of `room` (wire forms) for this instance; returns its generation.
/// One round trip (`upsert_peer.lua`).
pub(crate) fn upsert(
    ctx: &Ctx,
    con: &mut Conn,
    room: &str,
    room_id: &str,
    peer: &str,
    guest: Option<&str>,
    fields: &[(&str, &str)],
) -> Result<Upserted> {
    let op = "upsert peer";
    let keys = UpsertKeys::new(&ctx.keys, room, peer);
    let inv = keys.invocation(&ctx.me, peer, guest, None, fields);
    // A bare integer: the generation, no peer superseded (the common case).
    let reply: Vec<Value> = match conn::call(con, op, &inv)? {
        Value::Int(generation) => {
            return u64::try_from(generation)
                .map(|generation| Upserted {
                    generation,
                    replaced: None,
                })
                .map_err(|_| Error::bad_data(op, "generation is not a number"));
        }
        Value::Array(reply) => reply,
        other => {
            return Err(Error::bad_data(
                op,
                format!("unexpected reply from upsert_peer.lua: {other:?}"),
            ))
        }
    };
    let text = |i: usize| -> Result<String> {
        match reply.get(i) {
            Some(v) => redis::from_redis_value_ref(v)
                .map_err(|e| Error::bad_data(op, format!("unexpected reply: {e}"))),
            None => Err(Error::bad_data(op, "short reply from upsert_peer.lua")),
        }
    };
    if text(0)? == "not_owner" {
        let owner = text(1)?;
        return Err(Error::NotOwner {
            room: room_id.to_owned(),
            owner: decode_id(&owner).ok(),
        });
    }
    let generation: u64 = text(0)?
        .parse()
        .map_err(|_| Error::bad_data(op, "generation is not a number"))?;
    let sup = text(1)?;
    Ok(Upserted {
        generation,
        replaced: if sup.is_empty() {
            None
        } else {
            decode_id(&sup).ok()
        },
    })
}

/// The keys of `upsert_peer.lua` for one peer.
struct UpsertKeys {
    record: String,
    room: RoomKeys,
}

impl UpsertKeys {
    fn new(keys: &KeySpace, room: &str, peer: &str) -> Self {
        UpsertKeys {
            record: keys.peer(room, peer),
            room: keys.room(room),
        }
    }

    /// `upsert_peer.lua`'s call.
    fn invocation<'a>(
        &'a self,
        me: &str,
        peer: &str,
        guest: Option<&str>,
        generation: Option<u64>,
        fields: &[(&str, &str)],
    ) -> ScriptInvocation<'a> {
        let mut inv = SCRIPTS.upsert_peer.prepare_invoke();
        inv.key(&self.record)
            .key(&self.room.peers)
            .key(&self.room.guests)
            .key(&self.room.guest_state)
            .key(&self.room.owner)
            .key(&self.room.meta)
            .arg(me)
            .arg(peer)
            .arg(guest.unwrap_or(""))
            .arg(generation.map(|g| g.to_string()).unwrap_or_default());
        for (k, v) in fields {
            inv.arg(*k).arg(*v);
        }
        inv
    }
}

/// Writes back every peer this node holds, with its generation, after Redis lost its data (one
/// pipelined round trip). Peers of rooms that are no longer ours are skipped. Returns how many
/// records were written.
pub(crate) fn restore(
    ctx: &Ctx,
    con: &mut Conn,
    peers: &[(String, String, LocalPeer)],
) -> Result<usize> {
    let op = "restore peers";
    let wired: Vec<_> = peers
        .iter()
        .filter_map(|(r, p, l)| {
            let room = encode_id(IdKind::Room, r).ok()?;
            let peer = encode_id(IdKind::Peer, p).ok()?;
            let guest = match &l.guest {
                Some(g) => Some(encode_id(IdKind::Guest, g).ok()?),
                None => None,
            };
            Some((room, peer, guest, l))
        })
        .collect();
    let keys: Vec<_> = wired
        .iter()
        .map(|(room, peer, _, _)| UpsertKeys::new(&ctx.keys, room, peer))
        .collect();
    let fields: Vec<Vec<(&str, &str)>> = wired
        .iter()
        .map(|(_, _, _, l)| {
            l.fields
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect()
        })
        .collect();
    let invs: Vec<_> = wired
        .iter()
        .zip(&keys)
        .zip(&fields)
        .map(|(((_, peer, guest, l), k), f)| {
            k.invocation(&ctx.me, peer, guest.as_deref(), Some(l.generation), f)
        })
        .collect();
    if wired.is_empty() {
        return Ok(0);
    }
    let mut pipe = redis::pipe();
    for inv in &invs {
        pipe.invoke_script(inv);
    }
    let replies = conn::exec(con, &mut pipe).map_err(|e| Error::redis(op, e))?;
    let mut written = 0;
    for ((room, peer, _, _), r) in wired.iter().zip(replies) {
        match conn::decode::<Value>(op, r) {
            // The generation, bare or first in {generation, superseded}; not_owner: the room
            // is not ours any more; nothing was written.
            Ok(v) => {
                written += usize::from(match &v {
                    Value::Int(_) => true,
                    Value::Array(v) => matches!(v.first(), Some(Value::Int(_))),
                    _ => false,
                })
            }
            Err(e) => log::warn!("could not restore peer {peer} of room {room}: {e}"),
        }
    }
    Ok(written)
}

/// Removes peer `peer` of `room` (wire forms) if its record still has `generation`.
pub(crate) fn remove(
    ctx: &Ctx,
    con: &mut Conn,
    (room, room_id): (&str, &str),
    (peer, peer_id): (&str, &str),
    generation: u64,
) -> Result<bool> {
    let op = "remove peer";
    let rk = ctx.keys.room(room);
    let mut inv = SCRIPTS.remove_peer.prepare_invoke();
    inv.key(ctx.keys.peer(room, peer))
        .key(&rk.peers)
        .key(&rk.guests)
        .key(&rk.guest_state)
        .arg(peer)
        .arg(generation)
        .arg(&ctx.me);
    // A bare integer (1 removed, 0 gone or another generation), or {0, owner}.
    let (removed, owner): (i64, String) = match conn::call(con, op, &inv)? {
        Value::Int(removed) => (removed, String::new()),
        reply => redis::from_redis_value(reply)
            .map_err(|e| Error::bad_data(op, format!("unexpected reply: {e}")))?,
    };
    if removed == 0 && !owner.is_empty() {
        return Err(Error::NotPeerOwner {
            room: room_id.to_owned(),
            peer: peer_id.to_owned(),
            owner: decode_id(&owner).unwrap_or(owner),
        });
    }
    Ok(removed == 1)
}

/// Settles an upsert of `peer` (wire form, then caller's) in `room` whose reply was lost, for a
/// node that does not hold the peer (the host was told the call failed): a record that names
/// this instance is deleted by its own generation with `remove_peer.lua`, so nothing the host
/// was told failed stays written (docs/src/rust/errors.md "A reply that never came"). A record naming another instance
/// or none is left alone. Returns whether a record was deleted.
pub(crate) fn drop_unheld(
    ctx: &Ctx,
    con: &mut Conn,
    room: (&str, &str),
    peer: (&str, &str),
) -> Result<bool> {
    let op = "settle an uncertain upsert";
    let (instance, generation): (Option<String>, Option<String>) = redis::cmd("HMGET")
        .arg(ctx.keys.peer(room.0, peer.0))
        .arg("instance")
        .arg("generation")
        .query(con)
        .map_err(|e| Error::redis(op, e))?;
    if instance.as_deref() != Some(ctx.me.as_str()) {
        return Ok(false);
    }
    let Some(generation) = generation.and_then(|g| g.parse::<u64>().ok()) else {
        return Err(Error::bad_data(
            op,
            "peer record without a numeric generation",
        ));
    };
    match remove(ctx, con, room, peer, generation) {
        Ok(removed) => Ok(removed),
        Err(Error::NotPeerOwner { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Local;
    use sfu_redis_testkit::devserver::LocalRedis;

    fn ctx(url: &str, id: &str) -> Ctx {
        Ctx::for_test(url, id)
    }

    fn exists(con: &mut Conn, key: &str) -> bool {
        redis::cmd("EXISTS").arg(key).query(con).unwrap()
    }

    // Invariant 4 at the data-access level, no node: an upsert into a room this instance does
    // not own writes nothing; a remove carrying an older generation is a no-op, the right one
    // removes the record and its room entry.
    #[test]
    fn remove_of_an_older_generation_is_a_no_op_without_a_node() {
        let server = LocalRedis::start().expect("start redis-server");
        let ctx = ctx(&server.url(), "a");
        let mut con = crate::conn::Redis::new(&server.url(), std::time::Duration::from_secs(5))
            .unwrap()
            .connect()
            .unwrap();
        match upsert(&ctx, &mut con, "r", "r", "p", None, &[]) {
            Err(Error::NotOwner { .. }) => {}
            other => panic!("upsert into a room nobody pinned: {other:?}"),
        }
        assert!(!exists(&mut con, &ctx.keys.peer("r", "p")));
        assert!(!exists(&mut con, &ctx.keys.room("r").peers));

        crate::rooms::pin(&ctx, &Local::default(), &mut con, "r", "r", false).unwrap();
        let first = upsert(&ctx, &mut con, "r", "r", "p", Some("g"), &[("k", "v")]).unwrap();
        let second = upsert(&ctx, &mut con, "r", "r", "p", Some("g"), &[("k", "w")]).unwrap();
        assert!(second.generation > first.generation);
        let rooms: Vec<String> = redis::cmd("SMEMBERS")
            .arg(ctx.keys.instance_rooms(&ctx.me))
            .query(&mut con)
            .unwrap();
        assert_eq!(
            rooms,
            vec!["r".to_owned()],
            "the room index reaches the record"
        );

        let stale = remove(&ctx, &mut con, ("r", "r"), ("p", "p"), first.generation).unwrap();
        assert!(!stale, "an older generation's remove must be a no-op");
        assert!(exists(&mut con, &ctx.keys.peer("r", "p")));
        let removed = remove(&ctx, &mut con, ("r", "r"), ("p", "p"), second.generation).unwrap();
        assert!(removed);
        assert!(!exists(&mut con, &ctx.keys.peer("r", "p")));
        assert!(!exists(&mut con, &ctx.keys.room("r").peers));
        assert!(!exists(&mut con, &ctx.keys.room("r").guests));
    }

    // The lost-reply clean-up at the data-access level: `drop_unheld` deletes a record naming
    // this instance (by its own generation) and leaves another instance's alone.
    #[test]
    fn drop_unheld_deletes_only_this_instances_record() {
        let server = LocalRedis::start().expect("start redis-server");
        let (a, b) = (ctx(&server.url(), "a"), ctx(&server.url(), "b"));
        let mut con = crate::conn::Redis::new(&server.url(), std::time::Duration::from_secs(5))
            .unwrap()
            .connect()
            .unwrap();
        crate::rooms::pin(&a, &Local::default(), &mut con, "r", "r", false).unwrap();
        crate::rooms::pin(&b, &Local::default(), &mut con, "s", "s", false).unwrap();
        upsert(&a, &mut con, "r", "r", "landed", None, &[]).unwrap();
        upsert(&b, &mut con, "s", "s", "theirs", None, &[]).unwrap();
        assert!(drop_unheld(&a, &mut con, ("r", "r"), ("landed", "landed")).unwrap());
        assert!(!exists(&mut con, &a.keys.peer("r", "landed")));
        assert!(!drop_unheld(&a, &mut con, ("s", "s"), ("theirs", "theirs")).unwrap());
        assert!(
            exists(&mut con, &b.keys.peer("s", "theirs")),
            "another instance's record is never deleted"
        );
        assert!(!drop_unheld(&a, &mut con, ("r", "r"), ("never", "never")).unwrap());
    }
}
