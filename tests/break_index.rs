//! Adversarial: the index write that must come first (cross-slot rule "index first, record
//! second") is sent as an `.ignore()`d command in a pipeline with `ignore_errors()`; redis-rs
//! then silently discards its error, and the record is written although the index write
//! failed.

mod support;

use sfu_redis::keys::IdKind;
use sfu_redis::{ErrorKind, Timings};
use support::*;

const STAGE: &str = "bi";

fn exists(s: &Server, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query(&mut s.con()).unwrap()
}

// The instance's room index holds a string (bad data). pin_room's SADD to it fails with
// WRONGTYPE, the error is dropped, and the room is pinned all the same: pin_room returns Ok,
// the room is owned, and no index reaches it. Expected: BadData, nothing written (as
// tests/bad_data.rs expects for a wrong-typed room key). Worse, when this node dies the
// reaper cannot reach the room.
#[test]
fn pin_room_writes_the_room_although_the_index_write_failed() {
    let s = Server::start();
    let ks = ks(STAGE);
    let a = s.node_with(STAGE, "inst-a", Timings::fast());
    let me = wire(IdKind::Instance, "inst-a");
    let _: () = redis::cmd("SET")
        .arg(ks.instance_rooms(&me))
        .arg("junk")
        .query(&mut s.con())
        .unwrap();
    let out = a.pin_room("r1");
    let pinned = exists(&s, &ks.room("r1").owner);
    assert!(
        matches!(&out, Err(e) if e.kind() == ErrorKind::BadData) && !pinned,
        "pin_room with a wrong-typed room index returned {out:?} and the room's pin exists: {pinned} \
         (the index write failed silently, the record was written anyway)"
    );
}

// Same for upsert_peer: the instance's peer index holds a string, SADD fails silently and the
// peer record is written anyway: a record that the instance's peer index does not reach.
#[test]
fn upsert_peer_writes_the_record_although_the_index_write_failed() {
    let s = Server::start();
    let ks = ks(STAGE);
    let a = s.node_with(STAGE, "inst-b", Timings::fast());
    a.pin_room("r1").unwrap();
    let me = wire(IdKind::Instance, "inst-b");
    let _: () = redis::cmd("SET")
        .arg(ks.instance_peers(&me))
        .arg("junk")
        .query(&mut s.con())
        .unwrap();
    let out = a.upsert_peer("r1", "p1", None, &[]);
    let written = exists(&s, &ks.peer("r1", "p1"));
    assert!(
        matches!(&out, Err(e) if e.kind() == ErrorKind::BadData) && !written,
        "upsert_peer with a wrong-typed peer index returned {out:?} and the record exists: {written} \
         (the index write failed silently, the record was written anyway)"
    );
}

// A realistic trigger of the same bug: Redis at maxmemory (noeviction). The index SADD is a
// `denyoom` command and fails with OOM (silently dropped); upsert_peer.lua for a guest's quick
// reconnect starts with a DEL of the superseded record (not `denyoom`), after which Redis lets
// the rest of the script write, so the new record is written while its index entry is not.
#[test]
fn under_maxmemory_a_guest_reconnect_writes_a_record_no_index_reaches() {
    let s = Server::start();
    let ks = ks(STAGE);
    let a = s.node_with(STAGE, "inst-c", Timings::fast());
    a.pin_room("r1").unwrap();
    a.upsert_peer("r1", "old-conn", Some("guest"), &[]).unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1")
        .query(&mut s.con())
        .unwrap();
    let out = a.upsert_peer("r1", "new-conn", Some("guest"), &[]);
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("0")
        .query(&mut s.con())
        .unwrap();
    let problems = s.index_problems(&ks);
    assert!(
        problems.is_empty(),
        "upsert under maxmemory returned {out:?}; indexes now disagree with records: {problems:#?}"
    );
}

// A room whose pin holds a value that is not an instance id (garbage, e.g. "legacy:owner").
// pin_room sees it "held", finds no heartbeat key for that "owner", retries as a takeover, and
// pin_room.lua TAKES THE ROOM OVER (pin and metadata now name this node). Only then does
// try_pin decode the previous owner with `decode_id(&other)?`, which fails: pin_room returns
// BadData, `pin()` undoes the index entry, and the node does not remember the room. Result: a
// room pinned by this node that neither its index nor its heartbeat knows; its metadata names
// the node forever (when the node dies the reaper cannot find it).
#[test]
fn takeover_of_a_garbage_pin_leaves_a_room_no_index_reaches() {
    let s = Server::start();
    let ks = ks(STAGE);
    let a = s.node_with(STAGE, "inst-d", Timings::fast());
    let rk = ks.room("r1");
    let _: () = redis::cmd("SET")
        .arg(&rk.owner)
        .arg("legacy:owner")
        .arg("PX")
        .arg(60_000)
        .query(&mut s.con())
        .unwrap();
    let out = a.pin_room("r1");
    let owner: Option<String> = redis::cmd("GET")
        .arg(&rk.owner)
        .query(&mut s.con())
        .unwrap();
    let me = wire(IdKind::Instance, "inst-d");
    let indexed: bool = redis::cmd("SISMEMBER")
        .arg(ks.instance_rooms(&me))
        .arg("r1")
        .query(&mut s.con())
        .unwrap();
    assert!(
        owner.as_deref() != Some(me.as_str()) || indexed,
        "pin_room returned {out:?}, yet the room's pin now names this node ({owner:?}) and its room \
         index does not list it"
    );
}
