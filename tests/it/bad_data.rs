//! Data this crate did not write (keys of the wrong type) stays contained: the call that meets
//! it fails with `BadData`, every other room keeps working, the heartbeat keeps refreshing and
//! the reaper keeps reaping.

use crate::support;

use std::collections::BTreeSet;

use sfu_redis::{ErrorKind, Event, PinOutcome, Timings};
use support::*;

const STAGE: &str = "b";

fn hset(s: &Server, key: &str) {
    let _: () = redis::cmd("HSET")
        .arg(key)
        .arg("junk")
        .arg("1")
        .query(&mut s.con())
        .unwrap();
}

fn pttl(s: &Server, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(&mut s.con()).unwrap()
}

fn smembers(s: &Server, key: &str) -> BTreeSet<String> {
    redis::cmd("SMEMBERS").arg(key).query(&mut s.con()).unwrap()
}

// A room whose owner key holds a HASH: pin_room of that room returns BadData; the other rooms
// of the same node still pin, take peers and close; the heartbeat keeps refreshing (ticks
// counted, heartbeat key's server time moves on). Fails if one bad key broke the connection
// pool, the node, or the heartbeat thread.
#[test]
fn wrong_type_owner_key_gives_bad_data_and_nothing_else_breaks() {
    let s = Server::start();
    let ks = ks(STAGE);
    let a = s.node(STAGE, "inst-a");
    a.pin_room("good-1").unwrap();
    hset(&s, &ks.room("bad").owner);
    for _ in 0..3 {
        let e = a.pin_room("bad").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::BadData, "{e}");
    }
    assert_eq!(a.room_owner("bad").unwrap_err().kind(), ErrorKind::BadData);
    assert_eq!(a.pin_room("good-2").unwrap(), PinOutcome::Pinned);
    a.upsert_peer("good-2", "p", Some("g"), &[]).unwrap();
    a.upsert_peer("good-1", "p", None, &[]).unwrap();
    a.close_room("good-1").unwrap();
    assert_eq!(a.stats().rooms, 1);
    let first: i64 = redis::cmd("ZSCORE")
        .arg(ks.heartbeats())
        .arg("inst-a")
        .query(&mut s.con())
        .unwrap();
    let beats = a.stats().heartbeats;
    wait_for(LONG, "the heartbeat goes on", || {
        let now: i64 = redis::cmd("ZSCORE")
            .arg(ks.heartbeats())
            .arg("inst-a")
            .query(&mut s.con())
            .unwrap();
        (a.stats().heartbeats >= beats + 3 && now > first).then_some(())
    });
    assert!(pttl(&s, &ks.room("good-2").owner) > 0);
    // The bad key itself is left alone.
    let t: String = redis::cmd("TYPE")
        .arg(ks.room("bad").owner)
        .query(&mut s.con())
        .unwrap();
    assert_eq!(t, "hash");
}

// A failed pin must not leave the room in the node's room index: the node does not own it,
// and when the node dies the reaper would meet the bad room in its index on every round, so the
// reap could never finish. Checks the index right after the BadData.
#[test]
fn failed_pin_leaves_no_room_index_entry() {
    let s = Server::start();
    let ks = ks(STAGE);
    let a = s.node(STAGE, "inst-a");
    hset(&s, &ks.room("bad").owner);
    assert_eq!(a.pin_room("bad").unwrap_err().kind(), ErrorKind::BadData);
    assert!(
        !smembers(&s, &ks.instance_rooms("inst-a")).contains("bad"),
        "room index lists a room the instance does not own"
    );
}

// Bad data inside one owned room (its pin replaced by a hash) makes only that room's pin
// refresh fail: the other room's pin keeps being refreshed on every tick and the heartbeat
// goes on. Fails if one failed script in the refresh pipeline aborted the whole tick.
#[test]
fn bad_data_in_one_owned_room_does_not_stop_the_other_pins() {
    let s = Server::start();
    let ks = ks(STAGE);
    let a = s.node(STAGE, "inst-a");
    a.pin_room("spoiled").unwrap();
    a.pin_room("fine").unwrap();
    let owner = ks.room("spoiled").owner;
    let _: () = redis::pipe()
        .atomic()
        .del(&owner)
        .ignore()
        .cmd("HSET")
        .arg(&owner)
        .arg("junk")
        .arg("1")
        .ignore()
        .query(&mut s.con())
        .unwrap();
    let bad = a.stats().bad_data;
    // Several pin TTLs (1.8 s) pass; the fine room's pin never expires.
    let until = std::time::Instant::now() + Timings::fast().pin_ttl * 2;
    while std::time::Instant::now() < until {
        assert!(
            pttl(&s, &ks.room("fine").owner) > 0,
            "fine room's pin expired"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(a.stats().bad_data > bad, "the bad room is reported");
    // Bad data is not a Redis outage: it must not make the leader skip reap rounds.
    assert_eq!(a.stats().redis_errors, 0, "{:?}", a.stats().last_error);
    assert!(a.stats().last_error.is_some());
    assert!(a.stats().last_heartbeat_age.unwrap() < std::time::Duration::from_secs(2));
    assert_eq!(a.room_owner("fine").unwrap().as_deref(), Some("inst-a"));
}

// The reaper meets bad data in a dead instance's room: that room is left alone (and reported),
// while the dead instance's other rooms and another dead instance are reaped in full. Fails if
// one bad room aborted the round or the reap of the other rooms.
#[test]
fn reaper_skips_a_bad_room_and_reaps_the_rest() {
    let s = Server::start();
    let ks = ks(STAGE);
    let (leader, mut log) = s.leader(STAGE, "leader", Timings::fast());
    let now = s.server_ms();
    s.fabricate_dead(
        &ks,
        "dead-1",
        now - 60_000,
        Some(60_000),
        &[
            ("d1-ok", &[("d1-p1", Some("d1-g1"))]),
            ("d1-bad", &[("d1-p2", None)]),
        ],
    );
    s.fabricate_dead(
        &ks,
        "dead-2",
        now - 50_000,
        None,
        &[("d2-room", &[("d2-p1", Some("d2-g1"))])],
    );
    // Spoil one room of dead-1: its metadata becomes a string.
    let meta = ks.room("d1-bad").meta;
    let _: () = redis::pipe()
        .atomic()
        .del(&meta)
        .ignore()
        .set(&meta, "junk")
        .ignore()
        .query(&mut s.con())
        .unwrap();
    log.wait(LONG, "dead-2 reaped", |e| reaped(e, "dead-2"));
    let left = references(&s.dump("*"), &["dead-2".into(), "d2-".into()]);
    assert!(left.is_empty(), "{left:#?}");
    let left = references(
        &s.dump("*"),
        &["d1-ok".into(), "d1-p1".into(), "d1-g1".into()],
    );
    assert!(left.is_empty(), "dead-1's good room not reaped: {left:#?}");
    // The bad room is still there and still indexed (reported, left for the audit), while
    // dead-1 itself is gone from the sorted set: the reap finished with what it could do.
    assert!(smembers(&s, &ks.instance_rooms("dead-1")).contains("d1-bad"));
    wait_for(LONG, "dead-1 leaves the sorted set", || {
        let score: Option<i64> = redis::cmd("ZSCORE")
            .arg(ks.heartbeats())
            .arg("dead-1")
            .query(&mut s.con())
            .unwrap();
        score.is_none().then_some(())
    });
    assert!(leader.stats().bad_data > 0);
    assert!(log
        .drain()
        .iter()
        .all(|e| !matches!(e, Event::ReapedSelf { .. })));
}

// An instance whose reap cannot finish (bad data in one of its rooms) is reaped once: what
// could be reaped is, the broken room is reported and stays in the index for the audit, and the
// instance leaves the sorted set so it is not re-reaped (and re-reported as `instance_reaped`)
// every round forever. Without that the stuck instance stays a candidate and is "reaped" again
// every reap_interval.
#[test]
fn incomplete_reap_is_reported_once_and_leaves_the_broken_room_for_the_audit() {
    let s = Server::start();
    let ks = ks(STAGE);
    let (leader, mut log) = s.leader(STAGE, "leader", Timings::fast());
    let now = s.server_ms();
    s.fabricate_dead(
        &ks,
        "stuck",
        now - 60_000,
        None,
        &[("stuck-bad", &[("stuck-p", None)])],
    );
    let meta = ks.room("stuck-bad").meta;
    let _: () = redis::pipe()
        .atomic()
        .del(&meta)
        .ignore()
        .set(&meta, "junk")
        .ignore()
        .query(&mut s.con())
        .unwrap();
    log.wait(LONG, "the reap", |e| reaped(e, "stuck"));
    let mut con = s.con();
    let score: Option<f64> = redis::cmd("ZSCORE")
        .arg(ks.heartbeats())
        .arg("stuck")
        .query(&mut con)
        .unwrap();
    assert_eq!(score, None, "the instance left the sorted set");
    let still: bool = redis::cmd("SISMEMBER")
        .arg(ks.instance_rooms("stuck"))
        .arg("stuck-bad")
        .query(&mut con)
        .unwrap();
    assert!(still, "the broken room stays indexed for the audit");
    // Several more reap intervals: no second report.
    std::thread::sleep(Timings::fast().reap_interval * 8);
    let n = log.drain().iter().filter(|e| reaped(e, "stuck")).count();
    assert_eq!(n, 1, "reported reaped {n} times");
    assert_eq!(leader.stats().instances_reaped, 1);
}

// Garbage in a dead instance's room index (members that are not UTF-8, or not ids this crate
// writes) must not stop its reap: a reaper that decoded each SSCAN page as strings would fail
// on the page, retry every round, and never reap the instance's real rooms and records.
#[test]
fn non_utf8_index_members_do_not_stop_a_reap() {
    let s = Server::start();
    let ks = ks(STAGE);
    let (_leader, mut log) = s.leader(STAGE, "leader", Timings::fast());
    let now = s.server_ms();
    s.fabricate_dead(
        &ks,
        "junky",
        now - 60_000,
        None,
        &[("j-room", &[("j-peer", Some("j-guest"))])],
    );
    let mut con = s.con();
    let _: () = redis::cmd("SADD")
        .arg(ks.instance_rooms("junky"))
        .arg(&b"\xff\xfe not utf-8"[..])
        .arg("not/a{valid}:member")
        .query(&mut con)
        .unwrap();
    log.wait(
        LONG,
        "junky reaped",
        |e| matches!(e, Event::InstanceReaped { dead, rooms: 1, peers: 1, .. } if dead == "junky"),
    );
    let left = references(&s.dump("*"), &["j-".into(), "junky".into()]);
    assert!(left.is_empty(), "{left:#?}");
}

// Index keys of the node's own id holding another type than a set (bad data: the library only
// writes sets there): the node still starts, deletes them at registration (counted as bad
// data), and indexes its pins in a fresh set, which reaches the records it writes there; the
// same keys of another instance id are left alone. Fails if a wrong-typed index of its own
// stops the start (the clean-up of its earlier life met WRONGTYPE) or if the registration
// touches another instance's keys.
#[test]
fn a_node_starts_over_wrong_typed_index_keys_of_its_own() {
    let s = Server::start();
    let ks = ks(STAGE);
    let [rooms, reaping_rooms, _] = ks.instance_index_keys("inst-w");
    let _: () = redis::cmd("SET")
        .arg(&rooms)
        .arg("junk")
        .query(&mut s.con())
        .unwrap();
    hset(&s, &reaping_rooms);
    let other = ks.instance_rooms("inst-other");
    hset(&s, &other);
    let a = s.node(STAGE, "inst-w");
    assert!(a.stats().bad_data >= 1, "{:?}", a.stats());
    assert_eq!(a.pin_room("r1").unwrap(), PinOutcome::Pinned);
    a.upsert_peer("r1", "p1", None, &[]).unwrap();
    assert_eq!(smembers(&s, &rooms), BTreeSet::from(["r1".to_owned()]));
    let owner: Option<String> = redis::cmd("HGET")
        .arg(ks.peer("r1", "p1"))
        .arg("instance")
        .query(&mut s.con())
        .unwrap();
    assert_eq!(owner.as_deref(), Some("inst-w"));
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&reaping_rooms)
        .query(&mut s.con())
        .unwrap();
    assert_eq!(exists, 0, "the wrong-typed moved index is gone");
    let t: String = redis::cmd("TYPE").arg(&other).query(&mut s.con()).unwrap();
    assert_eq!(t, "hash", "another instance's key is left alone");
}
