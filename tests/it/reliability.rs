//! Reliability under real faults (issue "Reliability under real faults"): a partitioned leader
//! (fault proxy, each direction), script-cache loss, `DEBUG SLEEP` stalls, a SIGSTOPped node
//! process (zombie), a SIGSTOPped Redis, clock skew (libfaketime), ACLs, passwords in logs, a
//! 500,000-member index and malformed records. Every test runs on a real redis-server.

use crate::support;

use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use sfu_redis::keys::KeySpace;
use sfu_redis::{ErrorKind, Event, Node, TermRecord, Timings};
use support::procs::{is, signal, Events, Spawn};
use support::*;

fn ks(stage: &str) -> KeySpace {
    KeySpace::new("sfu", stage, "main").unwrap()
}

/// All terms of all nodes, sorted by start; panics if two overlap or epochs do not increase.
fn assert_terms_disjoint(terms: &mut [(String, TermRecord)]) {
    terms.sort_by_key(|(_, t)| t.started);
    for w in terms.windows(2) {
        let ((a, ta), (b, tb)) = (&w[0], &w[1]);
        let end = ta
            .ended()
            .unwrap_or_else(|| panic!("{a}'s term {} still runs while {b}'s started", ta.epoch));
        assert!(
            end <= tb.started,
            "{a}'s term (epoch {}) ended {:?} after {b}'s term (epoch {}) started",
            ta.epoch,
            end - tb.started,
            tb.epoch
        );
        assert!(
            tb.epoch > ta.epoch,
            "epochs increase strictly: {ta:?} then {tb:?}"
        );
    }
}

/// A leader cut off from Redis (`dir` dropped by the proxy) stops acting on its local deadline
/// before its lease can expire on the server; the next leader's term starts only after. Terms
/// are recorded by each node on one monotonic clock (all nodes in this process). Without the
/// local deadline (or with a deadline counted from the reply instead of the request) the cut-off
/// leader's term would still run when the next one starts.
fn partitioned_leader(dir: Direction) {
    let s = Server::start_with(&[]); // one server: its process or the fault proxy
    let proxy = s.proxy();
    let stage = "partition";
    let t = Timings::fast();
    let a = Node::start(config_for(&proxy.url(), stage, "cut-off", t)).unwrap();
    wait_for(LONG, "the proxied node leads", || {
        a.is_leader().then_some(())
    });
    let b = s.node_with(stage, "b", t);
    let c = s.node_with(stage, "c", t);
    proxy.blackhole(dir);
    let cut_at = Instant::now();
    wait_for(LONG, "another node leads", || {
        (b.is_leader() || c.is_leader()).then_some(())
    });
    let took = cut_at.elapsed();
    proxy.heal();
    // Let the cut-off node come back and settle as a follower.
    wait_event(&a, LONG, "the cut-off node demoted", |e| {
        matches!(e, Event::LeaderLost { .. })
    });
    std::thread::sleep(t.lease_ttl);
    let mut terms: Vec<(String, TermRecord)> = Vec::new();
    for n in [&a, &b, &c] {
        terms.extend(
            n.terms()
                .into_iter()
                .map(|r| (n.instance_id().to_owned(), r)),
        );
    }
    assert!(terms.len() >= 2, "{terms:?}");
    assert_terms_disjoint(&mut terms);
    let first = terms.iter().find(|(n, _)| n == "cut-off").unwrap().1;
    let end = first.ended().expect("the cut-off term ended");
    assert!(
        end <= cut_at + t.lease_ttl,
        "the cut-off leader acted past its lease TTL"
    );
    eprintln!(
        "{dir:?}: cut-off leader stopped {:?} after the cut; next leader after {took:?}",
        end.saturating_duration_since(cut_at)
    );
}

#[test]
fn partitioned_leader_both_ways_terms_never_overlap() {
    partitioned_leader(Direction::Both);
}

#[test]
fn partitioned_leader_requests_lost_terms_never_overlap() {
    partitioned_leader(Direction::Upstream);
}

/// Replies lost, requests delivered: the leader's refreshes land but it never hears; it must
/// demote on its deadline and must not keep the lease alive by re-acquiring its own lease
/// (otherwise nobody else could ever lead: this test would time out waiting for another leader).
#[test]
fn partitioned_leader_replies_lost_terms_never_overlap() {
    partitioned_leader(Direction::Downstream);
}

/// `SCRIPT FLUSH` empties the script cache under running nodes: single calls (pin, upsert,
/// remove, close) and pipelines (the heartbeat's pin refresh, the reaper's batches) reload and
/// carry on. Without NOSCRIPT recovery in pipelines the heartbeat would fail every tick after
/// the flush and the live node's pins would lapse and its heartbeat go stale.
#[test]
fn script_flush_is_recovered_in_calls_and_pipelines() {
    let s = Server::start();
    let stage = "flush";
    let (leader, mut log) = s.leader(stage, "leader", Timings::fast());
    let other = s.node(stage, "other");
    for i in 0..5 {
        other.pin_room(&format!("o-{i}")).unwrap();
    }
    let victim = s.node(stage, "victim");
    victim.pin_room("v-1").unwrap();
    victim.upsert_peer("v-1", "vp", Some("vg"), &[]).unwrap();
    let mut con = s.con();
    for _ in 0..3 {
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut con).unwrap();
        std::thread::sleep(Duration::from_millis(150));
    }
    let before = other.stats().heartbeats;
    // Pipelines: the heartbeat's refresh keeps ticking after the flush.
    wait_for(LONG, "heartbeats after the flush", || {
        (other.stats().heartbeats >= before + 3).then_some(())
    });
    // Single calls.
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut con).unwrap();
    other.pin_room("o-new").unwrap();
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut con).unwrap();
    let g = other.upsert_peer("o-new", "p", None, &[]).unwrap();
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut con).unwrap();
    assert!(other.remove_peer("o-new", "p", g).unwrap());
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut con).unwrap();
    other.close_room("o-new").unwrap();
    // The reaper's pipelines.
    victim.simulate_crash();
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut con).unwrap();
    log.wait(
        LONG,
        "victim reaped after a flush",
        |e| matches!(e, Event::InstanceReaped { dead, rooms: 1, peers: 1, .. } if dead == "victim"),
    );
    for i in 0..5 {
        assert_eq!(
            other.room_owner(&format!("o-{i}")).unwrap().as_deref(),
            Some("other")
        );
    }
    assert!(leader.is_leader());
    assert!(log
        .drain()
        .iter()
        .all(|e| !matches!(e, Event::RoomLost { .. })));
}

/// `DEBUG SLEEP 0.5` stalls the whole server, again and again, for less than the stale
/// threshold: nothing may be reaped and no room lost. Without the two-phase re-check and the
/// server-time stale cutoff a stall could make live instances look dead.
#[test]
fn debug_sleep_stalls_reap_nothing() {
    let s = Server::start();
    let stage = "sleep";
    let (leader, mut log) = s.leader(stage, "leader", Timings::fast());
    let nodes: Vec<Node> = (0..3).map(|i| s.node(stage, &format!("n{i}"))).collect();
    for (i, n) in nodes.iter().enumerate() {
        n.pin_room(&format!("room-{i}")).unwrap();
        n.upsert_peer(&format!("room-{i}"), "p", Some("g"), &[])
            .unwrap();
    }
    let mut con = s.con();
    for _ in 0..6 {
        let _: () = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg("0.5")
            .query(&mut con)
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
    }
    // Two full reap windows after the last stall.
    let t = Timings::fast();
    std::thread::sleep(t.stale_threshold + t.two_phase_delay + t.reap_interval * 2);
    let events = log.drain().to_vec();
    assert!(
        events
            .iter()
            .all(|e| !matches!(e, Event::InstanceReaped { .. })),
        "{events:?}"
    );
    for (i, n) in nodes.iter().enumerate() {
        assert_eq!(
            n.room_owner(&format!("room-{i}")).unwrap().as_deref(),
            Some(n.instance_id())
        );
        assert_eq!(n.stats().rooms, 1);
    }
    let _ = leader;
}

/// A node *process* SIGSTOPped past the stale threshold plus the two-phase delay is reaped.
/// On SIGCONT it notices on its next tick, emits `reaped_self` with its rooms and `room_lost`
/// for each, registers again as a fresh live instance, and never writes a reaped room back.
/// Without the dataset token / score-0 check it would silently re-pin its rooms.
#[test]
fn sigstopped_node_process_is_reaped_and_resumes_as_a_fresh_instance() {
    let s = Server::start();
    let url = s.url();
    let stage = "zombie";
    let (tx, rx) = mpsc::channel();
    let leader = Spawn::new(&url, stage, "leader", &["l-1"]).run(tx.clone());
    let mut ev = Events::new(rx);
    ev.expect("leader leads", |i, v| {
        i == "leader" && is(v, "leader_acquired")
    });
    let zombie = Spawn::new(&url, stage, "zombie", &["z-1", "z-2"]).run(tx);
    ev.expect("zombie ready", |i, v| i == "zombie" && is(v, "ready"));
    zombie.signal("STOP");
    ev.expect("the paused node is reaped", |i, v| {
        i == "leader" && is(v, "instance_reaped") && v["dead"] == "zombie"
    });
    let ks = ks(stage);
    for r in ["z-1", "z-2"] {
        assert!(!s.dump("*").contains_key(&ks.room(r).owner));
    }
    zombie.signal("CONT");
    let (_, v) = ev.expect("reaped_self", |i, v| i == "zombie" && is(v, "reaped_self"));
    assert_eq!(v["rooms"], 2);
    let mut ids: Vec<&str> = v["room_ids"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|x| x.as_str())
        .collect();
    ids.sort();
    assert_eq!(ids, ["z-1", "z-2"]);
    for r in ["z-1", "z-2"] {
        ev.expect("room_lost", |i, v| {
            i == "zombie" && is(v, "room_lost") && v["room"] == r
        });
    }
    // Registered again, live.
    wait_for(LONG, "the zombie heartbeats again", || {
        let alive: bool = redis::cmd("EXISTS")
            .arg(ks.heartbeat("zombie"))
            .query(&mut s.con())
            .unwrap();
        alive.then_some(())
    });
    // Several ticks and reap rounds later its old rooms are still gone and it was not reaped
    // again.
    let t = Timings::fast();
    std::thread::sleep(t.stale_threshold + t.two_phase_delay + t.reap_interval * 2);
    let dump = s.dump("*");
    let left = references(&dump, &["z-1".into(), "z-2".into()]);
    assert!(left.is_empty(), "a reaped room came back: {left:#?}");
    assert_eq!(
        ev.all("leader", "instance_reaped").len(),
        1,
        "the resumed node is live, not reaped again"
    );
    assert!(
        dump.contains_key(&ks.room("l-1").owner),
        "the leader's room is intact"
    );
    drop(leader);
}

/// Redis unreachable (the server SIGSTOPped) for `SFU_OUTAGE_SECS` (default 60) seconds, then
/// back: every worker thread resumes, each live instance's heartbeat is fresh within two
/// ticks, nothing is reaped and no room is lost (pins lapsed during the outage are pinned
/// again, not reported lost). A worker that died on an error, or a backoff not capped at the
/// heartbeat interval, fails this test.
#[test]
fn redis_unreachable_for_a_minute_then_every_worker_resumes() {
    let secs: u64 = std::env::var("SFU_OUTAGE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let s = Server::start_with(&[]); // one server: its process or the fault proxy
    let stage = "outage";
    let t = Timings::fast();
    let nodes: Vec<Node> = (0..3).map(|i| s.node(stage, &format!("n{i}"))).collect();
    let logs: Vec<EventLog> = nodes.iter().map(EventLog::new).collect();
    for (i, n) in nodes.iter().enumerate() {
        for r in 0..3 {
            n.pin_room(&format!("n{i}-r{r}")).unwrap();
            n.upsert_peer(&format!("n{i}-r{r}"), "p", Some("g"), &[])
                .unwrap();
        }
    }
    wait_for(LONG, "a leader", || {
        nodes.iter().any(|n| n.is_leader()).then_some(())
    });
    let pid = s.redis().pid().expect("server pid");
    signal(pid, "STOP");
    std::thread::sleep(Duration::from_secs(secs));
    let errors: Vec<u64> = nodes.iter().map(|n| n.stats().redis_errors).collect();
    let beats: Vec<u64> = nodes.iter().map(|n| n.stats().heartbeats).collect();
    signal(pid, "CONT");
    let resumed = Instant::now();
    let ks = ks(stage);
    let mut con = s.con();
    // A heartbeat counts once the node has its reply (its own count of successful ticks):
    // the heartbeat keys alone could be written by requests the server found queued when it
    // woke, sent by attempts the nodes had given up on long before.
    let fresh = wait_for(LONG, "every node's heartbeat succeeds again", || {
        let all = nodes
            .iter()
            .zip(&beats)
            .all(|(n, b)| n.stats().heartbeats > *b);
        all.then(|| resumed.elapsed())
    });
    eprintln!(
        "heartbeats fresh {fresh:?} after Redis came back (interval {:?})",
        t.heartbeat_interval
    );
    // Two ticks and a timeout (a backoff capped at the interval), and what a loaded machine
    // costs in scheduling.
    assert!(
        fresh <= t.heartbeat_interval * 2 + t.command_timeout + SCHED_SLACK,
        "heartbeats took {fresh:?} to resume"
    );
    wait_for(LONG, "a leader again", || {
        nodes.iter().any(|n| n.is_leader()).then_some(())
    });
    // A full reap round after the outage: a dead instance planted now is reaped by a round
    // that began after every earlier one ended (a live node listed before its heartbeat
    // resumed is spared by the re-check, or reaped by then). Then nothing else was reaped,
    // nothing lost, everything in place.
    s.fabricate_dead(&ks, "ghost", s.server_ms() - 60_000, None, &[]);
    let mut logs = logs;
    {
        let mut refs: Vec<&mut EventLog> = logs.iter_mut().collect();
        wait_any(&mut refs, LONG, "the planted dead instance reaped", |e| {
            reaped(e, "ghost")
        });
    }
    let harmful = |e: &Event| match e {
        Event::InstanceReaped { dead, .. } => dead != "ghost",
        Event::RoomLost { .. } | Event::ReapedSelf { .. } => true,
        _ => false,
    };
    for ((n, mut log), before) in nodes.iter().zip(logs).zip(errors) {
        assert!(before > 0, "{} saw the outage", n.instance_id());
        let events = log.drain().to_vec();
        assert!(
            !events.iter().any(harmful),
            "{}: {events:?}",
            n.instance_id()
        );
        assert_eq!(n.stats().rooms, 3);
    }
    for (i, n) in nodes.iter().enumerate() {
        for r in 0..3 {
            let room = format!("n{i}-r{r}");
            assert_eq!(
                n.room_owner(&room).unwrap().as_deref(),
                Some(n.instance_id())
            );
            let rec: bool = redis::cmd("EXISTS")
                .arg(ks.peer(&room, "p"))
                .query(&mut con)
                .unwrap();
            assert!(rec, "peer record of {room} intact");
        }
    }
}

/// Clock skew: node processes run under libfaketime, one 10 minutes ahead, one 10 minutes
/// behind. sfu-redis uses Redis server time for liveness and a monotonic clock for deadlines,
/// so no live instance is reaped, and a dead one is reaped on time. A library that stamped
/// heartbeats with the host's wall clock would reap the slow one at once (or never reap the
/// fast one once dead).
///
/// The skew is checked first: each node's `ready` event carries its own wall clock (`ts_ms`),
/// 10 minutes off this test's. Then each node's heartbeat score is the server's time, and the
/// leader, whichever node it is, lists and reaps a dead instance planted after all three were
/// up, in a round that lists none of them (a node never lists itself, hence the scores).
#[test]
fn clock_skew_of_ten_minutes_either_way_changes_nothing() {
    let s = Server::start();
    let url = s.url();
    let stage = "skew";
    let ks = ks(stage);
    let (tx, rx) = mpsc::channel();
    let mut ev = Events::new(rx);
    let wall_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
    };
    // The node's wall clock, as its `ready` event says, is `want` ms off this test's (within a
    // minute: the event's way here takes milliseconds).
    let skewed = |id: &str, ready: &serde_json::Value, want: i64| {
        let off = ready["ts_ms"].as_i64().expect("ts_ms in the ready event") - wall_ms();
        assert!(
            (off - want).abs() < 60_000,
            "{id}'s wall clock is {off} ms off this test's, not {want} ms: the skew did not happen"
        );
    };
    const TEN_MIN: i64 = 600_000;
    let ahead = Spawn {
        faketime: Some("+10m"),
        ..Spawn::new(&url, stage, "ahead", &["a-1", "a-2"])
    }
    .run(tx.clone());
    let (_, ready) = ev.expect("ahead ready", |i, v| i == "ahead" && is(v, "ready"));
    skewed("ahead", &ready, TEN_MIN);
    let mut behind = Spawn {
        faketime: Some("-10m"),
        ..Spawn::new(&url, stage, "behind", &["b-1"])
    }
    .run(tx.clone());
    let (_, ready) = ev.expect("behind ready", |i, v| i == "behind" && is(v, "ready"));
    skewed("behind", &ready, -TEN_MIN);
    let _honest = Spawn::new(&url, stage, "honest", &["h-1"]).run(tx);
    let (_, ready) = ev.expect("honest ready", |i, v| i == "honest" && is(v, "ready"));
    skewed("honest", &ready, 0);
    // Every node stamps its heartbeats with the server's clock: a score within a few
    // heartbeat intervals of the server's time, not 10 minutes off.
    let now = s.server_ms();
    for id in ["ahead", "behind", "honest"] {
        let score: Option<f64> = redis::cmd("ZSCORE")
            .arg(ks.heartbeats())
            .arg(id)
            .query(&mut s.con())
            .unwrap();
        let off = score.expect("registered") as i64 - now;
        assert!(
            off.abs() < 5_000,
            "{id}'s heartbeat score is {off} ms off the server's time"
        );
    }
    // The leader's reaper runs: a dead instance planted now is listed and reaped, by a round
    // that would list a live node whose stamps the leader misread.
    s.fabricate_dead(&ks, "ghost", s.server_ms() - 60_000, None, &[]);
    let listed = |v: &serde_json::Value, id: &str| {
        v["instances"]
            .as_array()
            .is_some_and(|a| a.iter().any(|i| i == id))
    };
    ev.expect("the planted dead instance listed", |_, v| {
        is(v, "candidates") && listed(v, "ghost")
    });
    ev.expect("the planted dead instance reaped", |_, v| {
        is(v, "instance_reaped") && v["dead"] == "ghost"
    });
    ev.pump();
    let judged: Vec<&(String, serde_json::Value)> = ev
        .seen
        .iter()
        .filter(|(_, v)| {
            ["ahead", "behind", "honest"].iter().any(|id| {
                (is(v, "candidates") && listed(v, id))
                    || (is(v, "instance_reaped") && v["dead"] == *id)
            })
        })
        .collect();
    assert!(
        judged.is_empty(),
        "live skewed nodes judged dead: {judged:#?}"
    );
    // The skewed-behind node dies: reaped within the usual window.
    let died = Instant::now();
    behind.kill9();
    ev.expect("behind reaped", |_, v| {
        is(v, "instance_reaped") && v["dead"] == "behind"
    });
    let took = died.elapsed();
    eprintln!("dead skewed node reaped {took:?} after its death");
    assert!(took < Duration::from_secs(15), "reap took {took:?}");
    let dump = s.dump("*");
    assert!(references(&dump, &["b-1".into()]).is_empty());
    for r in ["a-1", "a-2", "h-1"] {
        assert!(dump.contains_key(&ks.room(r).owner), "{r} intact");
    }
    drop(ahead);
}

/// An ACL user allowed only one stage's keys and channel runs a node normally; pointed at
/// another stage it gets a clear permission error (not a crash, not a hang).
#[test]
fn acl_user_limited_to_its_stage() {
    let s = Server::start_with(&[]); // one server: its process or the fault proxy
    let mut con = s.con();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("sfu-acl")
        .arg("on")
        .arg(">acl-s3cret")
        .arg("~sfu:acl:main:*")
        .arg("&sfu:acl:main:*")
        .arg("+@all")
        .query(&mut con)
        .unwrap();
    let port = s.redis().port();
    let url = format!("redis://sfu-acl:acl-s3cret@127.0.0.1:{port}");
    let node = Node::start(config_for(&url, "acl", "allowed", Timings::fast())).unwrap();
    node.pin_room("r").unwrap();
    let g = node.upsert_peer("r", "p", Some("g"), &[]).unwrap();
    wait_for(LONG, "leads under the ACL", || {
        node.is_leader().then_some(())
    });
    assert!(node.remove_peer("r", "p", g).unwrap());
    node.close_room("r").unwrap();
    let before = node.stats().heartbeats;
    wait_for(LONG, "heartbeats", || {
        (node.stats().heartbeats > before + 2).then_some(())
    });
    assert_eq!(
        node.stats().redis_errors,
        0,
        "{:?}",
        node.stats().last_error
    );

    let err = Node::start(config_for(&url, "other", "denied", Timings::fast())).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Redis);
    let msg = err.to_string();
    assert!(
        msg.contains("NoPerm") && msg.contains("permission denied by the Redis ACL"),
        "{msg}"
    );
    assert!(!msg.contains("acl-s3cret"), "{msg}");
    node.shutdown().unwrap();
}

/// The password of a Redis URL never appears in the binary's stdout or stderr, even with
/// debug logging, whether the password is wrong, the server unreachable, or all is well.
#[test]
fn password_never_appears_in_binary_output() {
    let s = Server::start_with(&[]); // one server: its process or the fault proxy
    let mut con = s.con();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("default")
        .arg(">right-pw-XYZZY")
        .query(&mut con)
        .unwrap();
    let port = s.redis().port();
    let run = |url: &str, args: &[&str], secret: &str| {
        let mut child = Command::new(support::procs::cli_bin())
            .args(args)
            .args(["--redis-url", url])
            .env("RUST_LOG", "trace")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline && child.try_wait().unwrap().is_none() {
            std::thread::sleep(Duration::from_millis(50));
        }
        if child.try_wait().unwrap().is_none() {
            signal(child.id(), "TERM");
        }
        let out = child.wait_with_output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !text.contains(secret),
            "{url}: the password leaked:\n{text}"
        );
        assert!(!text.is_empty());
        text
    };
    let node = ["node", "--json", "--stage", "pw", "--rooms", "r"];
    let ok = format!("redis://default:right-pw-XYZZY@127.0.0.1:{port}");
    run(&ok, &node, "right-pw-XYZZY");
    run(&ok, &["status", "--stage", "pw"], "right-pw-XYZZY");
    let wrong = format!("redis://default:wrong-pw-PLUGH@127.0.0.1:{port}");
    let text = run(&wrong, &node, "wrong-pw-PLUGH");
    assert!(
        text.contains("auth") || text.contains("WRONGPASS"),
        "{text}"
    );
    run("redis://u:down-pw-FROB@127.0.0.1:1", &node, "down-pw-FROB");
    run("redis://u:odd/pw?#@127.0.0.1:1", &node, "odd/pw?#");
}

/// A dead instance whose room index holds 500,000 members (most pointing at nothing) is reaped
/// in batches: no single command the reaper sends blocks Redis for 50 ms or more (measured
/// with SLOWLOG), and the real rooms among them are gone afterwards. A reaper that read the
/// whole index with SMEMBERS (68 ms here), deleted it with DEL (76 ms), or looped over it in
/// one Lua call (166 ms) blocks Redis longer.
///
/// SLOWLOG times a command by the wall clock, so a redis-server descheduled in the middle of a
/// tiny command by a busy machine logs it too (a 60 ms `SSCAN ... COUNT 32` with both cores
/// busy). The test's redis-server therefore runs at a higher scheduling priority where the
/// test may set one (`renice -n -10`; root, as in CI): other processes then wait for it, not
/// it for them. Elsewhere, and on a cluster (`SFU_TEST_TOPOLOGY=cluster`), it runs as it is.
/// This is not enough under the whole suite with both cores busy: a 32-room `EVALSHA` was
/// still logged at 100 ms there (2026-12-05); an open problem (stop 47's note).
#[test]
fn huge_index_is_reaped_in_batches_without_blocking_redis() {
    let s = Server::start();
    if let Some(pid) = s.nodes().is_none().then(|| s.redis().pid()).flatten() {
        let _ = std::process::Command::new("renice")
            .args(["-n", "-10", "-p", &pid.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
    let stage = "huge";
    let ks = ks(stage);
    let (leader, mut log) = s.leader(stage, "leader", Timings::fast());
    let mut con = s.con();
    let index = ks.instance_rooms("big");
    for chunk in 0..100 {
        let members: Vec<String> = (0..5000)
            .map(|i| format!("ghost-{}", chunk * 5000 + i))
            .collect();
        let _: () = redis::cmd("SADD")
            .arg(&index)
            .arg(&members)
            .query(&mut con)
            .unwrap();
    }
    let now = s.server_ms();
    s.fabricate_dead(
        &ks,
        "big",
        now - 60_000,
        None,
        &[("real-1", &[("p1", Some("g1"))]), ("real-2", &[])],
    );
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(50_000)
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("SLOWLOG").arg("RESET").query(&mut con).unwrap();
    let started = Instant::now();
    log.wait(
        Duration::from_secs(300),
        "the big instance reaped",
        |e| matches!(e, Event::InstanceReaped { dead, rooms: 2, .. } if dead == "big"),
    );
    eprintln!("reaped 500,002 index members in {:?}", started.elapsed());
    let slow: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(100)
        .query(&mut con)
        .unwrap();
    assert!(slow.is_empty(), "commands of 50 ms or more: {slow:?}");
    let card: u64 = redis::cmd("SCARD").arg(&index).query(&mut con).unwrap();
    assert_eq!(card, 0);
    assert!(references(&s.dump("*"), &["real-".into(), "big".into()]).is_empty());
    let _ = leader;
}

/// A dead instance's peer record missing its fields (no `instance`) is reported and left
/// alone, and the rest of the instance is reaped. A reaper that deleted whatever its index
/// named could delete a record it cannot attribute; one that aborted would leave everything.
#[test]
fn malformed_peer_record_is_skipped_and_the_rest_reaped() {
    let s = Server::start();
    let stage = "malformed";
    let ks = ks(stage);
    let (_leader, mut log) = s.leader(stage, "leader", Timings::fast());
    let now = s.server_ms();
    s.fabricate_dead(
        &ks,
        "dead",
        now - 60_000,
        None,
        &[("d-room", &[("good", Some("g1")), ("broken", Some("g2"))])],
    );
    // The room itself was taken over by a live instance, so the reaper goes peer by peer.
    let live = s.node(stage, "live");
    assert!(matches!(
        live.pin_room("d-room").unwrap(),
        sfu_redis::PinOutcome::TookOver { .. }
    ));
    let broken = ks.peer("d-room", "broken");
    let _: () = redis::cmd("HDEL")
        .arg(&broken)
        .arg("instance")
        .query(&mut s.con())
        .unwrap();
    log.wait(
        LONG,
        "reaped",
        |e| matches!(e, Event::InstanceReaped { dead, .. } if dead == "dead"),
    );
    let dump = s.dump("*");
    assert!(
        !dump.contains_key(&ks.peer("d-room", "good")),
        "the good record is reaped"
    );
    assert!(
        dump.contains_key(&broken),
        "the malformed record is left alone"
    );
    assert_eq!(live.room_owner("d-room").unwrap().as_deref(), Some("live"));
}
