//! Repair of an orphaned (or forgotten) room: `audit_delete_room.lua` with the owner CAS of
//! what both scans saw, then the room's entry in its last owner's room index.

use super::repair::Outcome;
use crate::conn::{self, Conn};
use crate::error::{Error, Result};
use crate::keys::KeySpace;
use crate::rooms::PEER_BATCH;
use crate::scripts::SCRIPTS;

/// An orphaned room as both scans saw it: the CAS values of its deletion.
pub(super) struct RoomSeenByScan<'a> {
    pub(super) room: &'a str,
    pub(super) meta_owner: &'a str,
    pub(super) pinned_ms: &'a str,
}

/// Deletes one orphaned room with `audit_delete_room.lua` (records found by the scan first,
/// then the `peers` set batch by batch, then the room keys), then the room in its last
/// owner's room index (index after record). Other instances whose records were in the room
/// keep it in their room indexes: an entry pointing at nothing, which their own walk, their
/// reap or a later audit (`dangling_room_index`) settles.
pub(super) fn delete_room(
    ks: &KeySpace,
    con: &mut Conn,
    seen: &RoomSeenByScan<'_>,
    records: &[String],
) -> Result<Outcome> {
    for chunk in records.chunks(PEER_BATCH) {
        let (status, _) = delete_room_call(ks, con, seen, "", chunk)?;
        if status != "more" {
            return Ok(refused(&status));
        }
    }
    let mut cursor = "0".to_owned();
    loop {
        let (status, next) = delete_room_call(ks, con, seen, &cursor, &[])?;
        match status.as_str() {
            "more" => cursor = next,
            "deleted" => break,
            s => return Ok(refused(s)),
        }
    }
    if !seen.meta_owner.is_empty() {
        redis::cmd("SREM")
            .arg(ks.instance_rooms(seen.meta_owner))
            .arg(seen.room)
            .query::<()>(con)
            .map_err(|e| Error::redis(DELETE_OP, e))?;
    }
    Ok(Outcome::Repaired)
}

const DELETE_OP: &str = "audit: delete orphaned room";

/// One call of `audit_delete_room.lua` (the records `peers`, or the `peers` set from
/// `cursor`). Returns the script's status and next cursor.
fn delete_room_call(
    ks: &KeySpace,
    con: &mut Conn,
    seen: &RoomSeenByScan<'_>,
    cursor: &str,
    peers: &[String],
) -> Result<(String, String)> {
    let rk = ks.room(seen.room);
    let mut inv = SCRIPTS.audit_delete_room.prepare_invoke();
    inv.key(&rk.owner)
        .key(&rk.meta)
        .key(&rk.peers)
        .key(&rk.guests)
        .key(&rk.guest_state)
        .arg(seen.meta_owner)
        .arg(seen.pinned_ms)
        .arg(cursor)
        .arg(PEER_BATCH);
    for p in peers {
        inv.arg(p);
    }
    conn::call(con, DELETE_OP, &inv)
}

/// The outcome of a deletion the script refused.
fn refused(status: &str) -> Outcome {
    match status {
        "owned" => Outcome::Left("the room was pinned meanwhile".into()),
        "changed" => Outcome::Left("the room's metadata changed meanwhile".into()),
        "wrong_type" => Outcome::Left("a key of the room holds the wrong type".into()),
        other => Outcome::Left(format!("unexpected reply {other:?}")),
    }
}
