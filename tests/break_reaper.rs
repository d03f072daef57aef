//! Adversarial: ways to make the leader stop reaping (fleet-wide) or keep reaping after it lost
//! the lease.

mod support;

use std::time::{Duration, Instant};

use sfu_redis::keys::{peer_member, IdKind};
use sfu_redis::{Event, Timings};
use support::*;

const STAGE: &str = "br";

fn scard(s: &Server, key: &str) -> i64 {
    redis::cmd("SCARD").arg(key).query(&mut s.con()).unwrap()
}

// One room of the LEADER holds bad data (its pin key replaced by a hash, as in
// tests/bad_data.rs). Its pin refresh fails on every heartbeat tick, and each failure counts
// as a "Redis error seen during the two-phase window", so the leader skips every reap round,
// forever: a dead instance is never reaped (invariant 2), although the leader's Redis is
// perfectly healthy. Expected: a dead instance is reaped within a few seconds
// (fast timings: ~2.5 s).
#[test]
fn one_bad_room_on_the_leader_stops_all_reaping() {
    let s = Server::start();
    let ks = ks(STAGE);
    let (leader, mut log) = s.leader(STAGE, "leader", Timings::fast());
    leader.pin_room("spoiled").unwrap();
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
    let now = s.server_ms();
    s.fabricate_dead(
        &ks,
        "dead-1",
        now - 5_000,
        None,
        &[("d-room", &[("d-peer", Some("d-guest"))])],
    );
    let got = log.try_wait(Duration::from_secs(10), |e| reaped(e, "dead-1"));
    assert!(
        got.is_some(),
        "dead-1 not reaped within 10 s (normally ~2.5 s); leader stats: {:?}",
        leader.stats()
    );
}

// One dead instance whose room index is not a set (garbage / another tool's key) makes
// `reap_instance` fail with BadData; `round` then `break`s out of the candidate loop. Because
// that instance's score is 0 (being reaped) it is first in every later round, so every other
// dead instance behind it is never reaped: one bad key stops all reaping fleet-wide.
#[test]
fn one_dead_instance_with_a_wrong_typed_index_blocks_every_other_reap() {
    let s = Server::start();
    let ks = ks(STAGE);
    let (leader, mut log) = s.leader(STAGE, "leader", Timings::fast());
    let now = s.server_ms();
    s.fabricate_dead(&ks, "broken", now - 10_000, None, &[]);
    let _: () = redis::cmd("SET")
        .arg(ks.instance_rooms(&wire(IdKind::Instance, "broken")))
        .arg("not a set")
        .query(&mut s.con())
        .unwrap();
    s.fabricate_dead(
        &ks,
        "innocent",
        now - 5_000,
        None,
        &[("i-room", &[("i-peer", None)])],
    );
    let got = log.try_wait(Duration::from_secs(10), |e| reaped(e, "innocent"));
    assert!(
        got.is_some(),
        "'innocent' (a perfectly normal dead instance) was not reaped within 10 s because \
         another dead instance has one wrong-typed key; leader's last error: {:?}",
        leader.stats().last_error
    );
}

// A member of the heartbeats sorted set that is not UTF-8 (garbage written by another tool)
// makes candidates.lua's reply undecodable (Vec<String>): every round fails with "cannot list
// reap candidates" and nobody is ever reaped again.
#[test]
fn one_non_utf8_member_in_the_heartbeats_zset_stops_all_reaping() {
    let s = Server::start();
    let ks = ks(STAGE);
    let (leader, mut log) = s.leader(STAGE, "leader", Timings::fast());
    let now = s.server_ms();
    let _: () = redis::cmd("ZADD")
        .arg(ks.heartbeats())
        .arg(now - 60_000)
        .arg(&b"\xff\xfe garbage"[..])
        .query(&mut s.con())
        .unwrap();
    s.fabricate_dead(
        &ks,
        "innocent",
        now - 5_000,
        None,
        &[("i-room", &[("i-peer", None)])],
    );
    let got = log.try_wait(Duration::from_secs(10), |e| reaped(e, "innocent"));
    assert!(
        got.is_some(),
        "'innocent' was not reaped within 10 s because one heartbeats member is not UTF-8; \
         leader's last error: {:?}",
        leader.stats().last_error
    );
}

// Invariant 3: "a reaper that has lost the lease stops before its next batch". A dead
// instance owns one big room (40 000 peers); reap_room.lua deletes it 256 peers per call and
// `reap_rooms` loops over those calls (`while !pending.is_empty()`) without re-checking
// leadership. The lease is taken away while the room is being reaped (another holder's id
// written into the lease key, as after an expiry + takeover); the leader sees `leader_lost`
// quickly, but its reaper goes on deleting peer records batch after batch for seconds.
// A small network delay (FaultProxy, 10 ms each way) makes each batch take a few tens of ms.
#[test]
fn reaper_keeps_deleting_a_big_room_after_losing_the_lease() {
    let s = Server::start();
    let ks = ks(STAGE);
    let proxy = s.proxy();
    proxy.set_delay(Duration::from_millis(10));
    let leader =
        sfu_redis::Node::start(config_for(&proxy.url(), STAGE, "leader", Timings::fast())).unwrap();
    let mut log = EventLog::new(&leader);
    log.wait(LONG, "leader_acquired", |e| {
        matches!(e, Event::LeaderAcquired { .. })
    });

    // A dead instance with one room of 40 000 peers (written directly, following the schema).
    const N: usize = 40_000;
    let dead = wire(IdKind::Instance, "dead-big");
    let room = "big";
    let rk = ks.room(room);
    let now = s.server_ms();
    {
        let mut con = s.con();
        let mut pipe = redis::pipe();
        pipe.sadd(ks.instance_rooms(&dead), room).ignore();
        pipe.cmd("HSET")
            .arg(&rk.meta)
            .arg("owner")
            .arg(&dead)
            .arg("pinned_ms")
            .arg(now - 6_000)
            .ignore();
        for i in 0..N {
            let p = format!("p{i}");
            pipe.sadd(ks.instance_peers(&dead), peer_member(room, &p))
                .ignore();
            pipe.cmd("HSET")
                .arg(ks.peer(room, &p))
                .arg("instance")
                .arg(&dead)
                .arg("generation")
                .arg(i + 1)
                .arg("updated_ms")
                .arg(now - 6_000)
                .ignore();
            pipe.sadd(&rk.peers, &p).ignore();
        }
        pipe.cmd("ZADD")
            .arg(ks.heartbeats())
            .arg(now - 5_000)
            .arg(&dead)
            .ignore();
        let _: () = pipe.query(&mut con).unwrap();
    }
    // Wait until the reap of the big room is under way.
    wait_for(
        Duration::from_secs(15),
        "reap of the big room started",
        || (scard(&s, &rk.peers) < N as i64).then_some(()),
    );
    // Take the lease away: someone else holds it now.
    let _: () = redis::cmd("SET")
        .arg(ks.leader())
        .arg("thief")
        .arg("PX")
        .arg(60_000)
        .query(&mut s.con())
        .unwrap();
    log.wait(Duration::from_secs(5), "leader_lost", |e| {
        matches!(e, Event::LeaderLost { .. })
    });
    assert!(!leader.is_leader());
    // One batch may be in flight; give it a generous 500 ms to land.
    std::thread::sleep(Duration::from_millis(500));
    let at_loss = scard(&s, &rk.peers);
    std::thread::sleep(Duration::from_millis(1500));
    let later = scard(&s, &rk.peers);
    let deleted_after = at_loss - later;
    drop(leader);
    assert_eq!(
        deleted_after, 0,
        "the demoted reaper deleted {deleted_after} more peer records of the big room \
         0.5-2 s after it lost the lease ({at_loss} -> {later})"
    );
}

// Node::shutdown during the reap of a big room: the same missing check (and `stopping()` is
// only consulted between instances) means shutdown waits for the whole room to be reaped.
// Expected: shutdown returns within a couple of command timeouts (< 2 s).
#[test]
fn shutdown_waits_for_a_big_room_reap_to_finish() {
    let s = Server::start();
    let ks = ks(STAGE);
    let proxy = s.proxy();
    proxy.set_delay(Duration::from_millis(10));
    let leader =
        sfu_redis::Node::start(config_for(&proxy.url(), STAGE, "leader", Timings::fast())).unwrap();
    let mut log = EventLog::new(&leader);
    log.wait(LONG, "leader_acquired", |e| {
        matches!(e, Event::LeaderAcquired { .. })
    });
    const N: usize = 40_000;
    let dead = wire(IdKind::Instance, "dead-big");
    let room = "big";
    let rk = ks.room(room);
    let now = s.server_ms();
    {
        let mut con = s.con();
        let mut pipe = redis::pipe();
        pipe.sadd(ks.instance_rooms(&dead), room).ignore();
        pipe.cmd("HSET")
            .arg(&rk.meta)
            .arg("owner")
            .arg(&dead)
            .arg("pinned_ms")
            .arg(now - 6_000)
            .ignore();
        for i in 0..N {
            let p = format!("p{i}");
            pipe.cmd("HSET")
                .arg(ks.peer(room, &p))
                .arg("instance")
                .arg(&dead)
                .ignore();
            pipe.sadd(&rk.peers, &p).ignore();
        }
        pipe.cmd("ZADD")
            .arg(ks.heartbeats())
            .arg(now - 5_000)
            .arg(&dead)
            .ignore();
        let _: () = pipe.query(&mut con).unwrap();
    }
    wait_for(
        Duration::from_secs(15),
        "reap of the big room started",
        || (scard(&s, &rk.peers) < N as i64).then_some(()),
    );
    let t = Instant::now();
    leader.shutdown().unwrap();
    let took = t.elapsed();
    let left = scard(&s, &rk.peers);
    assert!(
        took < Duration::from_secs(2),
        "shutdown took {took:?} (it waited for the reap of the big room; {left} peers left)"
    );
}

// reap_finish.lua removes a dead instance's sorted-set entry even when its indexes still hold
// members that reap_room/reap_peer kept as "new life" (written after t0). That is right when
// the instance really came back (its heartbeat key exists; reap_finish then says 'alive'), but
// when it did not (a late write of a dying/zombie instance that landed after t0, then the
// process died for good) the entry is removed with the members still indexed: the instance is
// no longer a candidate, nobody will ever look at them again, and they stay forever.
// Here the state a late write leaves is written directly: a room and a peer record of the dead
// instance stamped later than the reap's t0 (server time + 5 s).
#[test]
fn late_writes_of_an_instance_that_never_came_back_are_orphaned_forever() {
    let s = Server::start();
    let ks = ks(STAGE);
    let (leader, mut log) = s.leader(STAGE, "leader", Timings::fast());
    let now = s.server_ms();
    s.fabricate_dead(
        &ks,
        "ghost",
        now - 5_000,
        None,
        &[("old-room", &[("old-peer", None)])],
    );
    let d = wire(IdKind::Instance, "ghost");
    let rk = ks.room("late-room");
    let _: () = redis::pipe()
        .sadd(ks.instance_rooms(&d), "late-room")
        .ignore()
        .sadd(ks.instance_peers(&d), peer_member("late-room", "late-peer"))
        .ignore()
        .cmd("HSET")
        .arg(&rk.meta)
        .arg("owner")
        .arg(&d)
        .arg("pinned_ms")
        .arg(now + 5_000)
        .arg("peer_seq")
        .arg(1)
        .ignore()
        .cmd("HSET")
        .arg(ks.peer("late-room", "late-peer"))
        .arg("instance")
        .arg(&d)
        .arg("generation")
        .arg(1)
        .arg("updated_ms")
        .arg(now + 5_000)
        .ignore()
        .sadd(&rk.peers, "late-peer")
        .ignore()
        .query(&mut s.con())
        .unwrap();
    log.wait(LONG, "ghost reaped (first pass)", |e| reaped(e, "ghost"));
    // Give later rounds every chance (the stamps are 5 s ahead; wait past them).
    std::thread::sleep(Duration::from_secs(8));
    let left = references(&s.dump(&ks.scan_pattern()), std::slice::from_ref(&d));
    let zscore: Option<i64> = redis::cmd("ZSCORE")
        .arg(ks.heartbeats())
        .arg(&d)
        .query(&mut s.con())
        .unwrap();
    drop(leader);
    assert!(
        left.is_empty(),
        "the dead instance is gone from the heartbeats set (score {zscore:?}) but these still name it, \
         and no later round will ever reap them: {left:#?}"
    );
}
