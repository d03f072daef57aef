//! Peers on Redis: upsert (stale index entries removed first) and remove (no-op for an older
//! generation).
//!
//! On one server (standalone, a Sentinel master) a join or a leave is one script call: the
//! script also keeps the instance peer indexes (`{ctl}`), so record and index entry change in
//! one atomic step and one round trip. On Redis Cluster the indexes live in another slot, often
//! on another master: cross-slot order there, `<room>/<peer>` goes into the instance's peer
//! index before the record is written (`{R}`), and leaves indexes only after its record was
//! deleted (docs/DESIGN.md "Cross-slot order").

use redis::{ScriptInvocation, Value};

use crate::conn::{self, Conn};
use crate::error::{Error, Result};
use crate::keys::{decode_id, encode_id, peer_member, IdKind, KeySpace, RoomKeys};
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
/// One round trip on one server; two or three on a cluster (index, script, the other indexes'
/// clean-up).
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
    let index = ctx.keys.instance_peers(&ctx.me);
    let member = peer_member(room, peer);
    let keys = UpsertKeys::new(&ctx.keys, room, peer);
    let one_server = !con.is_cluster();
    let inv = keys.invocation(
        &ctx.me,
        peer,
        guest,
        None,
        &member,
        one_server.then_some(index.as_str()),
        fields,
    );
    let reply: Vec<Value> = if one_server {
        // The script writes the index entry (first) and the record in one call. A refusal
        // before it ran leaves neither; a command failing inside it (a key of the wrong type)
        // may leave the entry without the record, which is harmless; an unknown outcome is
        // settled by the heartbeat, as on a cluster.
        conn::call(con, op, &inv)?
    } else {
        // Index first, in its own round trip: the record is written only if the index took it.
        redis::cmd("SADD")
            .arg(&index)
            .arg(&member)
            .query::<()>(con)
            .map_err(|e| Error::redis(op, e))?;
        match conn::call(con, op, &inv) {
            Ok(r) => r,
            Err(e) => {
                if e.outcome_known() {
                    // Refused (OOM, WRONGTYPE, ...): the script did not run, and on a cluster
                    // the index took the entry on another master. The entry is right only if
                    // the record already names this instance (an earlier upsert): derived from
                    // the record, not from a reply (invariant 4). If this fails too, the caller
                    // settles it on a later heartbeat.
                    let ours: Option<String> = redis::cmd("HGET")
                        .arg(&keys.record)
                        .arg("instance")
                        .query(con)
                        .map_err(|e| Error::redis(op, e))?;
                    if ours.as_deref() != Some(ctx.me.as_str()) {
                        redis::cmd("SREM")
                            .arg(&index)
                            .arg(&member)
                            .query::<()>(con)
                            .map_err(|e| Error::redis(op, e))?;
                    }
                }
                return Err(e);
            }
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
        // The index entry written above is only right if an earlier upsert made the record
        // ours. On one server the script has already taken it out.
        if !one_server && text(2)? != ctx.me {
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
    if !one_server {
        let mut cleanup = redis::pipe();
        if !old_inst.is_empty() && old_inst != ctx.me {
            cleanup
                .srem(ctx.keys.instance_peers(&old_inst), &member)
                .ignore();
        }
        if !sup.is_empty() && !sup_inst.is_empty() {
            cleanup
                .srem(ctx.keys.instance_peers(&sup_inst), peer_member(room, &sup))
                .ignore();
        }
        if !cleanup.is_empty() {
            cleanup.query::<()>(con).map_err(|e| Error::redis(op, e))?;
        }
    }
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

    /// `upsert_peer.lua`'s call; with `index` (this instance's peer index, one server only)
    /// the script keeps the instance peer indexes itself.
    #[allow(clippy::too_many_arguments)] // the script's arguments, one each
    fn invocation<'a>(
        &'a self,
        me: &str,
        peer: &str,
        guest: Option<&str>,
        generation: Option<u64>,
        member: &str,
        index: Option<&str>,
        fields: &[(&str, &str)],
    ) -> ScriptInvocation<'a> {
        let mut inv = SCRIPTS.upsert_peer.prepare_invoke();
        inv.key(&self.record)
            .key(&self.room.peers)
            .key(&self.room.guests)
            .key(&self.room.guest_state)
            .key(&self.room.owner)
            .key(&self.room.meta);
        if let Some(index) = index {
            inv.key(index);
        }
        inv.arg(me)
            .arg(peer)
            .arg(guest.unwrap_or(""))
            .arg(generation.map(|g| g.to_string()).unwrap_or_default())
            .arg(member);
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
        .map(|(((room, peer, guest, l), k), f)| {
            let member = peer_member(room, peer);
            k.invocation(
                &ctx.me,
                peer,
                guest.as_deref(),
                Some(l.generation),
                &member,
                None,
                f,
            )
        })
        .collect();
    let index = ctx.keys.instance_peers(&ctx.me);
    if wired.is_empty() {
        return Ok(0);
    }
    // Index first (one round trip, checked), records second.
    let mut pipe = redis::pipe();
    for chunk in wired.chunks(conn::MEMBERS_PER_COMMAND) {
        let members: Vec<String> = chunk.iter().map(|(r, p, _, _)| peer_member(r, p)).collect();
        pipe.sadd(&index, members);
    }
    pipe.query::<Vec<i64>>(con)
        .map_err(|e| Error::redis(op, e))?;
    let mut pipe = redis::pipe();
    for inv in &invs {
        pipe.invoke_script(inv);
    }
    let replies = conn::exec(con, &mut pipe).map_err(|e| Error::redis(op, e))?;
    let mut written = 0;
    let mut unindex = redis::pipe();
    for ((room, peer, _, _), r) in wired.iter().zip(replies) {
        match conn::decode::<Vec<Value>>(op, r) {
            Ok(v) if matches!(v.first(), Some(Value::Int(_))) => written += 1,
            Ok(v) => {
                // not_owner: the room is not ours any more; the index entry goes unless the
                // record (still) names us.
                let record_instance: Option<String> =
                    v.get(2).and_then(|x| redis::from_redis_value_ref(x).ok());
                if record_instance.as_deref() != Some(ctx.me.as_str()) {
                    unindex.srem(&index, peer_member(room, peer)).ignore();
                }
            }
            Err(e) => log::warn!("could not restore peer {peer} of room {room}: {e}"),
        }
    }
    if !unindex.is_empty() {
        unindex.query::<()>(con).map_err(|e| Error::redis(op, e))?;
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
    let index = ctx.keys.instance_peers(&ctx.me);
    let member = peer_member(room, peer);
    let one_server = !con.is_cluster();
    let mut inv = SCRIPTS.remove_peer.prepare_invoke();
    inv.key(ctx.keys.peer(room, peer))
        .key(&rk.peers)
        .key(&rk.guests)
        .key(&rk.guest_state)
        .arg(peer)
        .arg(generation)
        .arg(&ctx.me);
    if one_server {
        // The script removes the index entry with the record: one atomic step.
        inv.key(&index).arg(&member);
    }
    let (removed, owner): (i64, String) = conn::call(con, op, &inv)?;
    if removed == 1 {
        if !one_server {
            let _: () = redis::cmd("SREM")
                .arg(&index)
                .arg(&member)
                .query(con)
                .map_err(|e| Error::redis(op, e))?;
        }
    } else if !owner.is_empty() {
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
/// was told failed stays written (README "Using the library"). A record naming another instance
/// or none is left alone. The index entry is the caller's next step (record first, index
/// second: [`unindex_gone`]). Returns whether a record was deleted.
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

/// Removes from this instance's peer index each `<room>/<peer>` of `peers` (wire forms) whose
/// record is gone or names another instance; members whose record names this instance stay
/// (the index then holds what the record says). Record read first, index entry second, in
/// batches of [`crate::rooms::PEER_BATCH`] (two round trips each). Returns, per peer, whether
/// its record still names this instance (its member was kept).
///
/// Protects invariant 4 after a lost reply: the clean-up is derived from the records and the
/// node's own knowledge of what it had, never from the reply of the script that deleted them.
pub(crate) fn unindex_gone(
    ctx: &Ctx,
    con: &mut Conn,
    room: &str,
    peers: &[String],
) -> Result<Vec<bool>> {
    let op = "unindex peers whose record is gone";
    let index = ctx.keys.instance_peers(&ctx.me);
    let mut kept = Vec::with_capacity(peers.len());
    for batch in peers.chunks(crate::rooms::PEER_BATCH) {
        let mut reads = redis::pipe();
        for p in batch {
            reads.hget(ctx.keys.peer(room, p), "instance");
        }
        let owners: Vec<Option<String>> = reads.query(con).map_err(|e| Error::redis(op, e))?;
        let mut gone = Vec::new();
        for (p, owner) in batch.iter().zip(owners) {
            let ours = owner.as_deref() == Some(ctx.me.as_str());
            if !ours {
                gone.push(peer_member(room, p));
            }
            kept.push(ours);
        }
        if gone.is_empty() {
            continue;
        }
        let mut srem = redis::pipe();
        for chunk in gone.chunks(conn::MEMBERS_PER_COMMAND) {
            srem.srem(&index, chunk).ignore();
        }
        srem.query::<()>(con).map_err(|e| Error::redis(op, e))?;
    }
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Local;
    use crate::{Config, Timings};
    use sfu_redis_testkit::devserver::LocalRedis;

    // Invariant 4 at the data-access level, no node: a remove carrying an older generation is
    // a no-op, the right one removes the record and its index entry, and an upsert into a room
    // this instance does not own is refused without leaving an index entry.
    #[test]
    fn remove_of_an_older_generation_is_a_no_op_without_a_node() {
        let server = LocalRedis::start().expect("start redis-server");
        let cfg = Config::builder()
            .redis_url(server.url())
            .stage("unit")
            .instance_id("a")
            .timings(Timings::fast())
            .build()
            .unwrap();
        let ctx = Ctx::from_config(&cfg).unwrap();
        let mut con = crate::conn::Redis::new(&server.url(), std::time::Duration::from_secs(5))
            .unwrap()
            .connect()
            .unwrap();
        let index = |con: &mut Conn| -> Vec<String> {
            redis::cmd("SMEMBERS")
                .arg(ctx.keys.instance_peers(&ctx.me))
                .query(con)
                .unwrap()
        };
        match upsert(&ctx, &mut con, "r", "r", "p", None, &[]) {
            Err(Error::NotOwner { .. }) => {}
            other => panic!("upsert into a room nobody pinned: {other:?}"),
        }
        assert!(index(&mut con).is_empty());

        crate::rooms::pin(&ctx, &Local::default(), &mut con, "r", "r", false).unwrap();
        let first = upsert(&ctx, &mut con, "r", "r", "p", Some("g"), &[("k", "v")]).unwrap();
        let second = upsert(&ctx, &mut con, "r", "r", "p", Some("g"), &[("k", "w")]).unwrap();
        assert!(second.generation > first.generation);
        assert_eq!(index(&mut con), vec![peer_member("r", "p")]);

        let stale = remove(&ctx, &mut con, ("r", "r"), ("p", "p"), first.generation).unwrap();
        assert!(!stale, "an older generation's remove must be a no-op");
        assert_eq!(index(&mut con), vec![peer_member("r", "p")]);
        let removed = remove(&ctx, &mut con, ("r", "r"), ("p", "p"), second.generation).unwrap();
        assert!(removed);
        assert!(index(&mut con).is_empty());
        let exists: bool = redis::cmd("EXISTS")
            .arg(ctx.keys.peer("r", "p"))
            .query(&mut con)
            .unwrap();
        assert!(!exists);
    }

    // The lost-reply clean-up at the data-access level: `drop_unheld` deletes a record naming
    // this instance (by its own generation) and leaves another instance's alone;
    // `unindex_gone` then removes only members whose record is gone or not ours.
    #[test]
    fn unindex_gone_removes_only_members_whose_record_is_not_ours() {
        let server = LocalRedis::start().expect("start redis-server");
        let cfg = |id: &str| {
            Config::builder()
                .redis_url(server.url())
                .stage("unit")
                .instance_id(id)
                .timings(Timings::fast())
                .build()
                .unwrap()
        };
        let (a, b) = (
            Ctx::from_config(&cfg("a")).unwrap(),
            Ctx::from_config(&cfg("b")).unwrap(),
        );
        let mut con = crate::conn::Redis::new(&server.url(), std::time::Duration::from_secs(5))
            .unwrap()
            .connect()
            .unwrap();
        crate::rooms::pin(&a, &Local::default(), &mut con, "r", "r", false).unwrap();
        crate::rooms::pin(&b, &Local::default(), &mut con, "s", "s", false).unwrap();
        upsert(&a, &mut con, "r", "r", "kept", None, &[]).unwrap();
        upsert(&a, &mut con, "r", "r", "landed", None, &[]).unwrap();
        upsert(&b, &mut con, "s", "s", "theirs", None, &[]).unwrap();
        // Entries a lost reply may leave: one with no record, one whose record is b's.
        let _: () = redis::cmd("SADD")
            .arg(a.keys.instance_peers(&a.me))
            .arg(peer_member("r", "never"))
            .arg(peer_member("s", "theirs"))
            .query(&mut con)
            .unwrap();
        assert!(drop_unheld(&a, &mut con, ("r", "r"), ("landed", "landed")).unwrap());
        assert!(!drop_unheld(&a, &mut con, ("s", "s"), ("theirs", "theirs")).unwrap());
        let kept = unindex_gone(
            &a,
            &mut con,
            "r",
            &["kept".to_owned(), "landed".to_owned(), "never".to_owned()],
        )
        .unwrap();
        assert_eq!(kept, vec![true, false, false]);
        assert_eq!(
            unindex_gone(&a, &mut con, "s", &["theirs".to_owned()]).unwrap(),
            vec![false]
        );
        let mut index: Vec<String> = redis::cmd("SMEMBERS")
            .arg(a.keys.instance_peers(&a.me))
            .query(&mut con)
            .unwrap();
        index.sort();
        assert_eq!(index, vec![peer_member("r", "kept")]);
        let theirs: bool = redis::cmd("EXISTS")
            .arg(b.keys.peer("s", "theirs"))
            .query(&mut con)
            .unwrap();
        assert!(theirs, "another instance's record is never deleted");
    }
}
