//! Regression tests: a node keeps its own room index exact by itself (the tick's re-assertion
//! and walk, heartbeat.rs `Reassert`), without ever holding host calls up, whatever bad data
//! sits in it; a reap works at the largest batch size, reaches every record through the dead
//! instance's room index (key schema version 2: no peer index), and its failures are never
//! swallowed. Each test was first written by an adversarial review of issue 11's change and
//! failed on it (the record-reach test replaced, with key schema version 2, one written against
//! the peer index's clean-up).
//!
//! Promises covered: docs/DESIGN.md invariant 4 (indexes exact), invariant 2 (a dead instance is
//! reaped whole), "no orphans", the rule "no clean-up that only a reply knows", and bounded host
//! calls (docs/src/rust/threads.md).
use crate::support;

use std::time::Duration;

use sfu_redis::{Event, Node, Timings};
use support::*;

const RB: &str = "ownidx";

/// Members left in an index, live and moved aside (a reap moves it aside at its start).
fn members_left(s: &Server, index: [String; 2]) -> i64 {
    index
        .iter()
        .map(|k| {
            redis::cmd("SCARD")
                .arg(k)
                .query::<i64>(&mut s.con())
                .unwrap()
        })
        .sum()
}

/// A member this crate never writes (not UTF-8) in a LIVE node's own room index: the tick's
/// walk decodes the SSCAN page as strings, fails, returns Err before the refresh outcomes are
/// handled, and does not advance its cursor: every tick fails from then on.
/// Protection: the walk skips (and logs) members that are not UTF-8 and never fails the tick.
#[test]
fn a_non_utf8_member_in_a_nodes_own_index_does_not_fail_its_ticks() {
    let s = Server::start();
    let ks = ks(RB);
    let a = s.node(RB, "a");
    a.pin_room("r1").unwrap();
    let mut log = EventLog::new(&a);
    wait_for(LONG, "a first tick", || {
        (a.stats().heartbeats > 0).then_some(())
    });
    let _: () = redis::cmd("SADD")
        .arg(ks.instance_rooms("a"))
        .arg(&b"\xff\xfe not utf-8"[..])
        .query(&mut s.con())
        .unwrap();
    // Ticks keep succeeding with the garbage in the index: at least six more (a full walk of
    // the index at one page per tick) within 20 heartbeat intervals.
    let before = a.stats();
    let bound = Timings::fast().heartbeat_interval * 20;
    let deadline = std::time::Instant::now() + bound;
    let mut mid = a.stats();
    while mid.heartbeats <= before.heartbeats + 5 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        mid = a.stats();
    }
    eprintln!(
        "before: heartbeats={} failures={} | after: heartbeats={} failures={} last_error={:?}",
        before.heartbeats,
        before.heartbeat_failures,
        mid.heartbeats,
        mid.heartbeat_failures,
        mid.last_error
    );
    assert!(
        mid.heartbeats > before.heartbeats + 5,
        "ticks stopped succeeding once a non-UTF-8 member sat in the node's own room index: {} -> {} ok within {bound:?}, failures {} -> {} ({:?})",
        before.heartbeats, mid.heartbeats, before.heartbeat_failures, mid.heartbeat_failures, mid.last_error
    );
    // Another instance takes r1 over (as after a takeover): the node must report room_lost,
    // and its room index lets the room go (key schema version 2: after its own records there
    // are swept, none here); the garbage member is left for fsck.
    let rk = ks.room("r1");
    let _: () = redis::pipe()
        .cmd("SET")
        .arg(&rk.owner)
        .arg("b")
        .arg("PX")
        .arg(60_000)
        .ignore()
        .cmd("HSET")
        .arg(&rk.meta)
        .arg("owner")
        .arg("b")
        .ignore()
        .query(&mut s.con())
        .unwrap();
    log.wait(
        Duration::from_secs(5),
        "room_lost of r1",
        |e| matches!(e, Event::RoomLost { room, .. } if room == "r1"),
    );
    wait_for(LONG, "r1 leaves a's room index", || {
        let members: Vec<Vec<u8>> = redis::cmd("SMEMBERS")
            .arg(ks.instance_rooms("a"))
            .query(&mut s.con())
            .unwrap();
        (!members.contains(&b"r1".to_vec())).then_some(())
    });
    assert_eq!(a.stats().rooms, 0);
}

/// The same garbage in the LEADER's own index (its room index, the one index of key schema
/// version 2; written against its peer index before): every tick fails, each failure counts
/// as a Redis error, and the leader skips every reap round in which its error count grew: a
/// dead instance is never reaped (invariant 2).
/// Protection: as above; the tick succeeds, so no error count grows and reap rounds run.
#[test]
fn a_non_utf8_member_in_the_leaders_own_index_does_not_stop_reaping() {
    let s = Server::start();
    let ks = ks(RB);
    let (leader, mut log) = s.leader(RB, "leader", Timings::fast());
    let _: () = redis::cmd("SADD")
        .arg(ks.instance_rooms("leader"))
        .arg(&b"\xff\xfe not utf-8"[..])
        .query(&mut s.con())
        .unwrap();
    // The walk reads the garbage within a few ticks (one page per tick, one page here).
    let beats = leader.stats().heartbeats;
    wait_for(LONG, "three ticks over the garbage", || {
        (leader.stats().heartbeats >= beats + 3).then_some(())
    });
    let now = s.server_ms();
    s.fabricate_dead(
        &ks,
        "dead",
        now - 60_000,
        None,
        &[("d-room", &[("d-peer", Some("g"))])],
    );
    let reaped = log.try_wait(
        Duration::from_secs(20),
        |e| matches!(e, Event::InstanceReaped { dead, .. } if dead == "dead"),
    );
    let st = leader.stats();
    eprintln!(
        "leader: is_leader={} heartbeats={} failures={} redis_errors={} last_error={:?}",
        st.is_leader, st.heartbeats, st.heartbeat_failures, st.redis_errors, st.last_error
    );
    assert!(
        reaped.is_some(),
        "the dead instance was never reaped within 20 s (fast timings: ~2.5 s)"
    );
    wait_for(LONG, "nothing names the reaped instance", || {
        references(&s.dump(&ks.scan_pattern()), &["dead".into()])
            .is_empty()
            .then_some(())
    });
}

/// A zombie's own clean-up (`register` -> `clean_own_leftovers`) races a host re-pin of one of
/// its lost rooms: the clean-up's reap_room finds the room gone, the host pins it again, then
/// the clean-up's removal of the room-index entry would strip the new pin's entry: a room pinned
/// by the instance that no index lists, never reaped once it dies (orphan).
/// Protection: the own clean-up removes its index entries under the room locks, skipping what
/// the host holds, so the host's pin waits for that round trip. Here the removal is held on
/// the network past the command timeout and lands late, after the pin (no lock can stop a
/// request already sent): the failed clean-up makes the next tick put back everything the
/// node holds. The instance then crashes and is reaped whole.
#[test]
fn zombie_clean_up_racing_a_re_pin_leaves_no_orphan() {
    let s = Server::start_with(&[]); // one server: its process or the fault proxy
    let ks = ks(RB);
    let (_leader, mut log) = s.leader(RB, "leader", Timings::fast());
    let proxy = s.proxy();
    let z = Node::start(config_for(&proxy.url(), RB, "zombie", Timings::fast())).unwrap();
    let mut zlog = EventLog::new(&z);
    z.pin_room("z-room-1").unwrap();
    z.upsert_peer("z-room-1", "zp", Some("zg"), &[]).unwrap();
    proxy.stall(Direction::Both);
    log.wait(LONG, "the stalled instance is reaped", |e| {
        reaped(e, "zombie")
    });
    let rooms_index = ks.instance_rooms("zombie");
    proxy.heal();
    proxy.hold_request_of(format!("SREM\r\n${}\r\n{rooms_index}", rooms_index.len()).as_bytes());
    zlog.wait(LONG, "reaped_self", |e| {
        matches!(e, Event::ReapedSelf { .. })
    });
    wait_for(LONG, "own clean-up SREM held", || {
        proxy.request_held().then_some(())
    });
    // The host pins its room again (a client came back) while the clean-up's SREM is in flight.
    assert!(z.pin_room("z-room-1").unwrap().is_owned());
    proxy.heal();
    wait_for(LONG, "the re-pinned room is indexed again", || {
        let members: Vec<String> = redis::cmd("SMEMBERS")
            .arg(&rooms_index)
            .query(&mut s.con())
            .unwrap();
        members.contains(&"z-room-1".to_owned()).then_some(())
    });
    // Settled: the late SREM has landed (or never will: the proxy forwarded it at heal).
    std::thread::sleep(Timings::fast().heartbeat_interval * 10);
    let members: Vec<String> = redis::cmd("SMEMBERS")
        .arg(&rooms_index)
        .query(&mut s.con())
        .unwrap();
    assert!(
        members.contains(&"z-room-1".to_owned()),
        "stripped again: {members:?}"
    );
    z.simulate_crash();
    log.wait(LONG, "the crashed new life is reaped", |e| {
        reaped(e, "zombie")
    });
    wait_for(LONG, "nothing of the crashed instance is left", || {
        references(&s.dump("*"), &["zombie".into(), "z-room".into()])
            .is_empty()
            .then_some(())
    });
}

/// A guest reconnect on the SAME node whose upsert reply is lost: the script deleted the
/// superseded peer's record, the node never learns it (`replaced` came in the lost reply; a
/// retry finds the guest already pointing at the new peer) and keeps holding the old peer: it
/// counts a peer whose record is gone, and would write that record back after a data loss.
/// (Under key schema version 1 the tick's re-assertion also kept the old peer's entry in the
/// peer index: an index member with no record.)
/// Protection: an upsert with an unknown outcome marks the node's other peers of the same
/// guest as suspects; the next tick reads their records and forgets those whose record no
/// longer names this instance.
#[test]
fn an_own_peer_superseded_by_an_upsert_with_a_lost_reply_is_forgotten() {
    let s = Server::start_with(&[]); // one server: its process or the fault proxy
    let ks = ks(RB);
    let proxy = s.proxy();
    let a = Node::start(config_for(&proxy.url(), RB, "a", Timings::fast())).unwrap();
    a.pin_room("r").unwrap();
    a.upsert_peer("r", "p1", Some("g"), &[]).unwrap();
    proxy.lose_reply_of(b":peer:p2");
    let out = a.upsert_peer_detailed("r", "p2", Some("g"), &[]);
    assert!(out.is_err(), "{out:?}");
    assert!(
        !proxy.reply_loss_pending(),
        "the upsert script was never sent"
    );
    let retry = a.upsert_peer_detailed("r", "p2", Some("g"), &[]).unwrap();
    eprintln!("retry: {retry:?}; node holds {} peers", a.stats().peers);
    // The fault happened: p1's record went with the lost call.
    let pattern = format!("{}:room:{{r}}:peer:*", ks.prefix());
    assert_eq!(s.keys(&pattern), vec![ks.peer("r", "p2")]);
    let bound = Timings::fast().heartbeat_interval * 25;
    let deadline = std::time::Instant::now() + bound;
    while a.stats().peers != 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        a.stats().peers,
        1,
        "after {bound:?} (25 ticks) the node still holds the superseded peer p1, whose record is gone"
    );
    assert_eq!(s.keys(&pattern), vec![ks.peer("r", "p2")]);
    let problems = s.index_problems(&ks);
    assert!(problems.is_empty(), "{problems:#?}");
}

/// Host calls wait for the tick's round trip when their room's stripe is in the tick's
/// re-assertion window: a tick whose connection hangs holds 8/64 stripes until its
/// command_timeout, and host calls on a healthy connection wait for it.
/// Protection: the re-assertion holds no lock across its round trip; what was closed or
/// removed meanwhile is handed to the next tick's settlements.
#[test]
fn host_calls_never_wait_for_a_hung_tick() {
    let s = Server::start_with(&[]); // one server: its process or the fault proxy
    let proxy = s.proxy();
    let a = Node::start(config_for(&proxy.url(), RB, "a", Timings::fast())).unwrap();
    let rooms: Vec<String> = (0..32).map(|i| format!("r{i}")).collect();
    for r in &rooms {
        a.pin_room(r).unwrap();
    }
    // The tick's pipeline (PEXPIRE .. GT) is held on the heartbeat's connection only.
    proxy.hold_request_of(b"$2\r\nGT\r\n");
    wait_for(LONG, "tick held", || proxy.request_held().then_some(()));
    let st = a.stats();
    eprintln!(
        "held; heartbeats={} failures={}",
        st.heartbeats, st.heartbeat_failures
    );
    let mut worst = Duration::ZERO;
    let t0 = std::time::Instant::now();
    for r in &rooms {
        let t = std::time::Instant::now();
        a.pin_room(r).unwrap();
        worst = worst.max(t.elapsed());
    }
    eprintln!(
        "32 pins took {:?}; slowest {:?} (command_timeout {:?})",
        t0.elapsed(),
        worst,
        Timings::fast().command_timeout
    );
    let st = a.stats();
    eprintln!(
        "after; heartbeats={} failures={} {:?}",
        st.heartbeats, st.heartbeat_failures, st.last_error
    );
    proxy.heal();
    assert!(
        worst < Timings::fast().command_timeout,
        "a host call on a healthy connection waited {worst:?} for the tick"
    );
}

/// (Written when the reap removed index entries through reap_unindex.lua, whose
/// `unpack(ARGV, 2)` fails above ~8000 values, and `Reap::unindex` did not chunk; the reap
/// now moves the indexes aside and deletes them whole, and still must empty them.) With reap_batch up to MAX_REAP_BATCH (10 000, accepted by the
/// config) one batch's room clean-up is one script call with thousands of members: it fails,
/// the reap stops, and every later round redoes it and fails again: never reaped.
/// Protection: every index clean-up is sent in commands of at most MEMBERS_PER_COMMAND members.
#[test]
fn the_largest_reap_batch_reaps_every_room() {
    let s = Server::start();
    let ks = ks(RB);
    let t = Timings::fast();
    let leader = Node::start(
        config_for(&s.url(), RB, "leader", t)
            .to_builder()
            .reap_batch(10_000)
            .reap_pace(0.0) // unpaced: paced batches hold at most PACED_REAP_BATCH
            .build()
            .unwrap(),
    )
    .unwrap();
    let mut log = EventLog::new(&leader);
    wait_for(LONG, "is_leader", || leader.is_leader().then_some(()));
    let names: Vec<String> = (0..8500).map(|i| format!("big{i:05}")).collect();
    let rooms: Vec<FakeRoom<'_>> = names.iter().map(|r| (r.as_str(), &[][..])).collect();
    s.fabricate_dead(&ks, "big", s.server_ms() - 60_000, None, &rooms);
    let reaped = log.try_wait(
        Duration::from_secs(30),
        |e| matches!(e, Event::InstanceReaped { dead, .. } if dead == "big"),
    );
    let left = members_left(
        &s,
        [ks.instance_rooms("big"), ks.instance_reaping_rooms("big")],
    );
    let st = leader.stats();
    eprintln!(
        "reaped event: {reaped:?}; room index left: {left}; last_error: {:?}",
        st.last_error
    );
    assert!(
        reaped.is_some() && left == 0,
        "not reaped within 30 s; {left} index members left"
    );
}

/// Key schema version 2's reap reaches every record through the dead instance's room index,
/// at the largest batch size: a room the dead instance owns with thousands of peers (deleted
/// whole, in several calls of the script's work bound), and a room a live instance took over
/// in which the dead one left thousands of records (each read, and deleted as written before
/// the reap began). (It replaces a test of the peer index's clean-up at this batch size,
/// written against reap_unindex.lua, whose swallowed "too many results to unpack" error left
/// the index for ever.) A failed or truncated call that the reaper swallowed would leave
/// records naming the dead instance (`references` below) or end the reap early (its sorted-set
/// entry stays); a reap that deleted the taken room whole would delete the live owner's room.
#[test]
fn the_largest_reap_batch_deletes_every_record_the_room_index_reaches() {
    const PEERS: usize = 6000;
    let s = Server::start();
    let ks = ks(RB);
    let t = Timings::fast();
    let leader = Node::start(
        config_for(&s.url(), RB, "leader", t)
            .to_builder()
            .reap_batch(10_000)
            .reap_pace(0.0) // unpaced: paced batches hold at most PACED_REAP_BATCH
            .build()
            .unwrap(),
    )
    .unwrap();
    let mut log = EventLog::new(&leader);
    wait_for(LONG, "is_leader", || leader.is_leader().then_some(()));
    let names: Vec<String> = (0..PEERS).map(|i| format!("p{i:05}")).collect();
    let guests: Vec<String> = (0..PEERS).map(|i| format!("g{i:05}")).collect();
    let peers: Vec<(&str, Option<&str>)> = names
        .iter()
        .zip(&guests)
        .map(|(p, g)| (p.as_str(), Some(g.as_str())))
        .collect();
    s.fabricate_dead(
        &ks,
        "bigp",
        s.server_ms() - 60_000,
        None,
        &[("whole", &peers), ("taken", &peers)],
    );
    // "taken" belongs to a live instance now (pin and metadata), as after a takeover; its
    // owner's own record there stays.
    let rk = ks.room("taken");
    let _: () = redis::pipe()
        .cmd("SET")
        .arg(&rk.owner)
        .arg("leader")
        .arg("PX")
        .arg(600_000)
        .ignore()
        .cmd("HSET")
        .arg(&rk.meta)
        .arg("owner")
        .arg("leader")
        .arg("pinned_ms")
        .arg(s.server_ms())
        .ignore()
        .cmd("HSET")
        .arg(ks.peer("taken", "mine"))
        .arg("instance")
        .arg("leader")
        .arg("generation")
        .arg(PEERS + 1)
        .ignore()
        .sadd(&rk.peers, "mine")
        .ignore()
        .query(&mut s.con())
        .unwrap();
    let reaped = log.try_wait(
        Duration::from_secs(30),
        |e| matches!(e, Event::InstanceReaped { dead, .. } if dead == "bigp"),
    );
    let st = leader.stats();
    eprintln!("reaped event: {reaped:?}; last_error: {:?}", st.last_error);
    assert!(reaped.is_some(), "bigp not reaped within 30 s");
    wait_for(LONG, "nothing names bigp", || {
        let dump = s.dump(&ks.scan_pattern());
        references(&dump, &["bigp".into()]).is_empty().then_some(())
    });
    let zs: Option<f64> = redis::cmd("ZSCORE")
        .arg(ks.heartbeats())
        .arg("bigp")
        .query(&mut s.con())
        .unwrap();
    assert_eq!(zs, None, "the reap did not finish");
    assert!(
        s.keys(&format!("{}:room:{{whole}}:*", ks.prefix()))
            .is_empty(),
        "keys of the dead instance's own room are left"
    );
    let taken: std::collections::BTreeSet<String> = s.smembers(&rk.peers);
    assert_eq!(
        taken,
        ["mine".to_owned()].into(),
        "the taken room keeps exactly its live owner's peer"
    );
    assert_eq!(
        s.keys(&format!("{}:room:{{taken}}:peer:*", ks.prefix())),
        vec![ks.peer("taken", "mine")]
    );
}
