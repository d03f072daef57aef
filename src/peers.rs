//! Peers on Redis: upsert (stale index entries removed first) and remove (no-op for an older
//! generation).
//!
//! Cross-slot order: `<room>/<peer>` goes into the instance's peer index (`{ctl}`) before the
//! record is written (`{R}`), and leaves other instances' indexes only after their record was
//! deleted.

use redis::{Connection, Value};

use crate::error::{Error, Result};
use crate::keys::{decode_id, peer_member};
use crate::node::Shared;
use crate::scripts::{self, SCRIPTS};
use crate::store::Upserted;

/// Upserts peer `peer` of `room` (wire forms) for this instance; returns its generation.
pub(crate) fn upsert(
    sh: &Shared,
    con: &mut Connection,
    room: &str,
    room_id: &str,
    peer: &str,
    guest: Option<&str>,
    fields: &[(&str, &str)],
) -> Result<Upserted> {
    let op = "upsert peer";
    let rk = sh.keys.room(room);
    let record = sh.keys.peer(room, peer);
    let index = sh.keys.instance_peers(&sh.me);
    let member = peer_member(room, peer);
    let mut inv = SCRIPTS.upsert_peer.prepare_invoke();
    inv.key(&record)
        .key(&rk.peers)
        .key(&rk.guests)
        .key(&rk.guest_state)
        .key(&rk.owner)
        .key(&rk.meta)
        .arg(&sh.me)
        .arg(peer)
        .arg(guest.unwrap_or(""));
    for (k, v) in fields {
        inv.arg(*k).arg(*v);
    }
    let mut pipe = redis::pipe();
    pipe.sadd(&index, &member).ignore().invoke_script(&inv);
    let mut replies = scripts::exec(con, &mut pipe).map_err(|e| Error::redis(op, e))?;
    let reply: Vec<Value> = scripts::decode(op, replies.pop().unwrap_or(Ok(Value::Nil)))?;
    let text = |i: usize| -> Result<String> {
        match reply.get(i) {
            Some(v) => redis::from_redis_value_ref(v)
                .map_err(|e| Error::bad_data(op, format!("unexpected reply: {e}"))),
            None => Err(Error::bad_data(op, "short reply from upsert_peer.lua")),
        }
    };
    if text(0)? == "not_owner" {
        // The index entry written above is only right if an earlier upsert made the record ours.
        if text(2)? != sh.me {
            let _: () = redis::cmd("SREM")
                .arg(&index)
                .arg(&member)
                .query(con)
                .map_err(|e| Error::redis(op, e))?;
        }
        let owner = text(1)?;
        return Err(Error::NotOwner {
            room: room_id.to_owned(),
            owner: decode_id(&owner).ok(),
        });
    }
    let generation: u64 = text(0)?
        .parse()
        .map_err(|_| Error::bad_data(op, "generation is not a number"))?;
    let (old_inst, sup, sup_inst) = (text(1)?, text(2)?, text(3)?);
    let mut cleanup = redis::pipe();
    if !old_inst.is_empty() && old_inst != sh.me {
        cleanup
            .srem(sh.keys.instance_peers(&old_inst), &member)
            .ignore();
    }
    if !sup.is_empty() && !sup_inst.is_empty() {
        cleanup
            .srem(sh.keys.instance_peers(&sup_inst), peer_member(room, &sup))
            .ignore();
    }
    if !cleanup.is_empty() {
        cleanup.query::<()>(con).map_err(|e| Error::redis(op, e))?;
    }
    Ok(Upserted {
        generation,
        superseded: if sup.is_empty() {
            None
        } else {
            decode_id(&sup).ok()
        },
    })
}

/// Removes peer `peer` of `room` (wire forms) if its record still has `generation`.
pub(crate) fn remove(
    sh: &Shared,
    con: &mut Connection,
    room: &str,
    peer: &str,
    generation: u64,
) -> Result<bool> {
    let op = "remove peer";
    let rk = sh.keys.room(room);
    let mut inv = SCRIPTS.remove_peer.prepare_invoke();
    inv.key(sh.keys.peer(room, peer))
        .key(&rk.peers)
        .key(&rk.guests)
        .key(&rk.guest_state)
        .arg(peer)
        .arg(generation);
    let (removed, inst): (i64, String) = scripts::call(con, op, &inv)?;
    if removed == 1 && !inst.is_empty() {
        let _: () = redis::cmd("SREM")
            .arg(sh.keys.instance_peers(&inst))
            .arg(peer_member(room, peer))
            .query(con)
            .map_err(|e| Error::redis(op, e))?;
    }
    Ok(removed == 1)
}
