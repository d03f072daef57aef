//! Adversarial: real faults (SIGSTOP of redis-server, restarts, SCRIPT FLUSH) around
//! shutdown, start, leadership and the fencing epoch.

mod support;

use std::time::{Duration, Instant};

use sfu_redis::{Event, Node, Timings};
use support::*;

const STAGE: &str = "bf";

struct Stopped(u32);

impl Stopped {
    fn new(s: &Server) -> Stopped {
        let pid = s.redis.pid().unwrap();
        unsafe_kill(pid, "STOP");
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        unsafe_kill(self.0, "CONT");
    }
}

fn unsafe_kill(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig} {pid}");
}

// Node::shutdown while redis-server is frozen (SIGSTOP): every call is bounded by
// command_timeout (400 ms), so shutdown should take at most a few of them.
#[test]
fn shutdown_while_redis_is_frozen_is_bounded() {
    let s = Server::start();
    let (leader, _log) = s.leader(STAGE, "a", Timings::fast());
    leader.pin_room("r").unwrap();
    let frozen = Stopped::new(&s);
    std::thread::sleep(Duration::from_millis(700));
    let t = Instant::now();
    leader.shutdown().unwrap();
    let took = t.elapsed();
    drop(frozen);
    assert!(took < Duration::from_secs(3), "shutdown took {took:?}");
}

// Node::start against a frozen redis-server fails within a few command timeouts.
#[test]
fn start_against_a_frozen_redis_fails_fast() {
    let s = Server::start();
    let frozen = Stopped::new(&s);
    let t = Instant::now();
    let r = Node::start(s.config(STAGE, "b"));
    let took = t.elapsed();
    drop(frozen);
    assert!(r.is_err(), "started against a frozen Redis");
    assert!(took < Duration::from_secs(3), "start took {took:?}");
}

// The fencing epoch: `Event::LeaderAcquired::epoch` is documented as "strictly increasing
// across all terms of one prefix" (src/event.rs). After Redis loses its data (restart without
// persistence, or a failover to a replica that missed the last writes) the counter starts
// again at 1: a later term gets a SMALLER fencing token than an earlier one, although the
// nodes that held the earlier terms are still running and know it (the pins and peers are
// restored after data loss; the epoch is not).
#[test]
fn epoch_goes_backwards_after_redis_loses_its_data() {
    let mut s = Server::start();
    let ks = ks(STAGE);
    // Many terms have passed already.
    let _: () = redis::cmd("SET")
        .arg(ks.epoch())
        .arg(41)
        .query(&mut s.con())
        .unwrap();
    let a = s.node(STAGE, "a");
    let b = s.node(STAGE, "b");
    let mut la = EventLog::new(&a);
    let mut lb = EventLog::new(&b);
    let (_, first) = wait_any(&mut [&mut la, &mut lb], LONG, "first term", |e| {
        matches!(e, Event::LeaderAcquired { .. })
    });
    let Event::LeaderAcquired { epoch: e1 } = first else {
        unreachable!()
    };
    s.redis.restart().unwrap();
    let (_, second) = wait_any(&mut [&mut la, &mut lb], LONG, "term after restart", |e| {
        matches!(e, Event::LeaderAcquired { .. })
    });
    let Event::LeaderAcquired { epoch: e2 } = second else {
        unreachable!()
    };
    assert!(
        e2 > e1,
        "fencing epoch went backwards: term before the Redis restart had epoch {e1}, the next one {e2}; a: {:?} b: {:?}",
        la.drain(),
        lb.drain()
    );
}

// At most one leader at any moment (invariant 3), checked by polling both nodes' is_leader()
// while the lease key disappears (Redis data loss: here a restart without persistence). The
// old leader keeps believing it leads until its next refresh (up to lease_refresh later),
// while the other node acquires the now-free lease at once.
#[test]
fn two_nodes_lead_at_once_after_redis_loses_the_lease() {
    let mut s = Server::start();
    let (a, _la) = s.leader(STAGE, "a", Timings::fast());
    let b = s.node(STAGE, "b");
    let mut both_at_once = 0u32;
    for _ in 0..5 {
        s.redis.restart().unwrap();
        let until = Instant::now() + Duration::from_millis(1500);
        while Instant::now() < until {
            if a.is_leader() && b.is_leader() {
                both_at_once += 1;
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        if both_at_once > 0 {
            break;
        }
    }
    assert_eq!(
        both_at_once, 0,
        "both nodes reported is_leader() == true at the same time ({both_at_once} samples)"
    );
}

// SCRIPT FLUSH hammered while nodes work: every thread must keep working (NOSCRIPT recovered
// everywhere, including pipelines) and nothing may be left inconsistent.
#[test]
fn script_flush_storm_keeps_everything_working() {
    let s = Server::start();
    let ks = ks(STAGE);
    let (leader, mut log) = s.leader(STAGE, "keeper", Timings::fast());
    let victim = s.node(STAGE, "victim");
    for i in 0..20 {
        let r = format!("v{i}");
        victim.pin_room(&r).unwrap();
        victim.upsert_peer(&r, "p", Some("g"), &[]).unwrap();
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let st = std::sync::Arc::clone(&stop);
    let url = s.url();
    let flusher = std::thread::spawn(move || {
        let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
        while !st.load(std::sync::atomic::Ordering::Relaxed) {
            let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut con).unwrap();
            std::thread::sleep(Duration::from_millis(3));
        }
    });
    let mut errors = Vec::new();
    for i in 0..200 {
        let r = format!("k{}", i % 5);
        if let Err(e) = leader.pin_room(&r) {
            errors.push(e.to_string());
        }
        if let Err(e) = leader.upsert_peer(&r, &format!("p{}", i % 7), Some("g"), &[]) {
            errors.push(e.to_string());
        }
    }
    victim.simulate_crash();
    let got = log.try_wait(Duration::from_secs(15), |e| reaped(e, "victim"));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flusher.join().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let problems = s.index_problems(&ks);
    let left = references(
        &s.dump(&ks.scan_pattern()),
        &[wire(sfu_redis::keys::IdKind::Instance, "victim")],
    );
    assert!(
        errors.is_empty() && got.is_some() && problems.is_empty() && left.is_empty(),
        "host errors: {errors:?}\nreaped: {got:?}\nindex problems: {problems:#?}\nleftovers: {left:#?}\nstats: {:?}",
        leader.stats()
    );
}

// A leader whose connections are blackholed (bytes vanish, connections stay open) for longer
// than the lease: it must stop leading before the other node starts (never both at once), and
// the other node must take over.
#[test]
fn blackholed_leader_never_overlaps_with_the_next() {
    let s = Server::start();
    let proxy = s.proxy();
    let a = Node::start(config_for(&proxy.url(), STAGE, "a", Timings::fast())).unwrap();
    let mut la = EventLog::new(&a);
    la.wait(LONG, "a leads", |e| {
        matches!(e, Event::LeaderAcquired { .. })
    });
    let b = s.node(STAGE, "b");
    proxy.blackhole(support::Direction::Both);
    let until = Instant::now() + Duration::from_secs(5);
    let (mut both, mut b_led) = (0, false);
    while Instant::now() < until {
        let (x, y) = (a.is_leader(), b.is_leader());
        if x && y {
            both += 1;
        }
        b_led |= y;
        std::thread::sleep(Duration::from_micros(300));
    }
    proxy.heal();
    assert!(both == 0 && b_led, "overlap samples {both}, b led: {b_led}");
}

// A broken epoch key (a hash, as written by another tool) blocks every election forever: the
// lease key itself is repaired by lease_acquire.lua when it was not written by the protocol,
// but INCR on the epoch fails before that, so no node ever leads and nothing is ever reaped.
#[test]
fn wrong_typed_epoch_blocks_every_election_forever() {
    let s = Server::start();
    let ks = ks(STAGE);
    let _: () = redis::cmd("HSET")
        .arg(ks.epoch())
        .arg("junk")
        .arg("1")
        .query(&mut s.con())
        .unwrap();
    let a = s.node(STAGE, "a");
    let mut la = EventLog::new(&a);
    let got = la.try_wait(Duration::from_secs(6), |e| {
        matches!(e, Event::LeaderAcquired { .. })
    });
    assert!(
        got.is_some(),
        "no leader within 6 s (normally < 1 s); last error: {:?}",
        a.stats().last_error
    );
}

// Redis restarts (no persistence) while the leader is in the middle of reaping a big dead
// instance; afterwards every worker must resume and a newly dead instance must be reaped.
#[test]
fn redis_restart_mid_reap_then_everything_resumes() {
    let mut s = Server::start();
    let ks = ks(STAGE);
    let (leader, mut log) = s.leader(STAGE, "leader", Timings::fast());
    let now = s.server_ms();
    let rooms: Vec<String> = (0..3000).map(|i| format!("r{i}")).collect();
    let peers: Vec<(&str, Option<&str>)> = vec![("p", Some("g"))];
    let fake: Vec<support::FakeRoom<'_>> = rooms.iter().map(|r| (r.as_str(), &peers[..])).collect();
    s.fabricate_dead(&ks, "big-dead", now - 5_000, None, &fake);
    let idx = ks.instance_rooms(&wire(sfu_redis::keys::IdKind::Instance, "big-dead"));
    wait_for(Duration::from_secs(15), "reap under way", || {
        let n: i64 = redis::cmd("SCARD").arg(&idx).query(&mut s.con()).unwrap();
        (n < 3000).then_some(())
    });
    s.redis.restart().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let now = s.server_ms();
    s.fabricate_dead(
        &ks,
        "later-dead",
        now - 5_000,
        None,
        &[("lr", &[("lp", None)])],
    );
    let got = log.try_wait(Duration::from_secs(15), |e| reaped(e, "later-dead"));
    assert!(
        got.is_some(),
        "not reaped after the restart; stats {:?}",
        leader.stats()
    );
}

// Node::shutdown of a leader whose network is blackholed (connections open, bytes vanish).
#[test]
fn shutdown_while_blackholed_is_bounded() {
    let s = Server::start();
    let proxy = s.proxy();
    let a = Node::start(config_for(&proxy.url(), STAGE, "a", Timings::fast())).unwrap();
    let mut la = EventLog::new(&a);
    la.wait(LONG, "a leads", |e| {
        matches!(e, Event::LeaderAcquired { .. })
    });
    a.pin_room("r").unwrap();
    proxy.blackhole(support::Direction::Both);
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    a.shutdown().unwrap();
    let took = t.elapsed();
    eprintln!("shutdown while blackholed took {took:?}");
    assert!(took < Duration::from_secs(3), "shutdown took {took:?}");
}

// README: "Every call is blocking and bounded by `command_timeout`". pin_room against a
// frozen Redis takes about three command timeouts (1.2 s with a 400 ms timeout): after its
// pipeline timed out, `rooms::pin` sends the index "undo" SREM on the same, timed-out
// connection and waits for it to time out too (the connection is dropped only afterwards).
// The undo is also harmful: when the pin ran after all (a slow reply, not a lost request) the
// SREM removes the index entry of a room that is pinned (see break_races.rs
// `pin_room_timing_out_after_it_ran_leaves_a_room_no_index_reaches`).
#[test]
fn pin_room_on_a_frozen_redis_takes_several_command_timeouts() {
    let s = Server::start();
    let a = s.node(STAGE, "t");
    a.pin_room("r").unwrap(); // a pooled connection exists
    let frozen = Stopped::new(&s);
    let t = Instant::now();
    // pin_room sends a pipeline (index SADD + pin_room.lua); plain single commands such as
    // room_owner's GET are recognized as timeouts, pipelined ones are not.
    let e = a.pin_room("r2").unwrap_err();
    let took = t.elapsed();
    drop(frozen);
    let timeout = Timings::fast().command_timeout;
    assert!(
        e.is_timeout()
            && e.to_string().contains("timed out")
            && took < timeout + Duration::from_millis(150),
        "after {took:?} (command_timeout {timeout:?}): is_timeout() = {}, error: {e}",
        e.is_timeout()
    );
}
