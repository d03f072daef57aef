//! `fleet_status` (and `sfu-redis status`) on a real redis-server: garbage in the control keys
//! is reported on the item it concerns instead of failing the whole status, the four instance
//! states, the leader that is not heartbeating, paging with ZSCAN; and the `node` subcommand's
//! bounds on its start-up sizes.

use crate::support;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use sfu_redis::keys::IdKind;
use sfu_redis::ops::status::{
    fleet_status, fleet_status_with_stale, FleetStatus, InstanceState, InstanceStatus,
};
use sfu_redis::{ErrorKind, Timings};
use support::*;

/// Default timings (stale threshold 45 s): states of hand-written entries do not drift while
/// the test runs.
fn reader(s: &Server, stage: &str) -> sfu_redis::Config {
    s.config_with(stage, "reader", Timings::default())
}

fn find<'a>(st: &'a FleetStatus, id: &str) -> &'a InstanceStatus {
    st.instances
        .iter()
        .find(|i| i.id == id)
        .unwrap_or_else(|| panic!("no instance {id:?} in {st:#?}"))
}

fn mentions(problems: &[String], needles: &[&str]) -> bool {
    problems
        .iter()
        .any(|p| needles.iter().all(|n| p.contains(n)))
}

fn zadd(
    con: &mut impl redis::ConnectionLike,
    key: &str,
    score: impl redis::ToRedisArgs,
    member: &[u8],
) {
    let _: () = redis::cmd("ZADD")
        .arg(key)
        .arg(score)
        .arg(member)
        .query(con)
        .unwrap();
}

fn hset(con: &mut impl redis::ConnectionLike, key: &str) {
    let _: () = redis::cmd("HSET")
        .arg(key)
        .arg("f")
        .arg("v")
        .query(con)
        .unwrap();
}

fn set_px(con: &mut impl redis::ConnectionLike, key: &str, value: &str, px: u64) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("PX")
        .arg(px)
        .query(con)
        .unwrap();
}

// Protects "status never fails on garbage": members that are not UTF-8 or not the wire form of
// an id, scores that are not whole numbers (1.5, inf, -inf), an instance's room index of the
// wrong type, a lease and an epoch of the wrong type, a peer count that is not a number. Each is shown and flagged on its item;
// everything else is still read. The old ZRANGE-into-String status failed whole (with the
// wrong error kind) on any of these.
#[test]
fn garbage_members_and_scores_are_flagged_not_fatal() {
    let s = Server::start();
    let stage = "garbage";
    let ks = ks(stage);
    let mut con = s.con();
    let now = s.server_ms();
    let zset = ks.heartbeats();
    let ok = wire(IdKind::Instance, "ok-inst");
    zadd(&mut con, &zset, now, ok.as_bytes());
    set_px(&mut con, &ks.heartbeat(&ok), "1", 60_000);
    hset(&mut con, &ks.instance_rooms(&ok)); // a hash, not a set
                                             // Its peer count: what its heartbeat last wrote into its record.
    let _: () = redis::cmd("HSET")
        .arg(ks.instance_info(&ok))
        .arg("peers")
        .arg("2")
        .query(&mut con)
        .unwrap();
    zadd(&mut con, &zset, now, b"bad-count");
    let _: () = redis::cmd("HSET")
        .arg(ks.instance_info("bad-count"))
        .arg("peers")
        .arg("many")
        .query(&mut con)
        .unwrap();
    zadd(&mut con, &zset, now, b"\xff\xfe-bin");
    zadd(&mut con, &zset, now - 1000, b"has:colon");
    zadd(&mut con, &zset, 1.5, b"frac");
    zadd(&mut con, &zset, "+inf", b"pinf");
    zadd(&mut con, &zset, "-inf", b"ninf");
    hset(&mut con, &ks.leader());
    hset(&mut con, &ks.epoch());

    let st = fleet_status(&reader(&s, stage)).expect("status survives garbage");
    assert_eq!(st.instances.len(), 7, "{st:#?}");

    let i = find(&st, "ok-inst");
    assert_eq!(i.state, InstanceState::Alive);
    assert!(i.alive && !i.being_reaped);
    assert!(!i.rooms_known, "{i:?}");
    assert!(
        mentions(&i.problems, &[&ks.instance_rooms(&ok), "hash"]),
        "{i:?}"
    );
    assert!(i.peers_known);
    assert_eq!(i.peers, 2);

    let bin = st
        .instances
        .iter()
        .find(|i| i.id.ends_with("-bin"))
        .expect("the non-UTF-8 member is listed, lossily");
    assert!(bin.id.contains('\u{fffd}'), "{bin:?}");
    assert!(mentions(&bin.problems, &["UTF-8"]), "{bin:?}");
    assert!(!bin.rooms_known && !bin.peers_known);
    assert_eq!(
        bin.state,
        InstanceState::Late,
        "no heartbeat key is read for it"
    );

    // A record whose peer count is not a number: the count is unknown, the rest is read.
    let count = find(&st, "bad-count");
    assert!(!count.peers_known && count.rooms_known, "{count:?}");
    assert_eq!(count.peers, 0);

    let colon = find(&st, "has:colon");
    assert!(mentions(&colon.problems, &["wire form"]), "{colon:?}");

    let frac = find(&st, "frac");
    assert!(mentions(&frac.problems, &["1.5"]), "{frac:?}");
    assert_eq!(frac.state, InstanceState::Stale);

    let pinf = find(&st, "pinf");
    assert!(mentions(&pinf.problems, &["inf"]), "{pinf:?}");
    assert_eq!(pinf.last_heartbeat_ms, i64::MAX);
    assert_eq!(
        pinf.state,
        InstanceState::Late,
        "never stale: the reaper never picks it"
    );

    let ninf = find(&st, "ninf");
    assert!(mentions(&ninf.problems, &["inf"]), "{ninf:?}");
    assert_eq!(ninf.state, InstanceState::Stale);

    assert_eq!(st.leader, None);
    assert!(!st.leader_alive);
    assert!(mentions(&st.problems, &[&ks.leader(), "hash"]), "{st:#?}");
    assert!(!st.epoch_known);
    assert!(mentions(&st.problems, &[&ks.epoch(), "hash"]), "{st:#?}");
    assert!(!st.is_clean());

    let json = st.to_json();
    assert_eq!(json["epoch"], Value::Null);
    assert_eq!(json["leader_alive"], Value::Bool(false));
    assert!(json["problems"].as_array().unwrap().len() >= 2);
    let ok_json = json["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["id"] == "ok-inst")
        .unwrap();
    assert_eq!(ok_json["state"], "alive");
    assert_eq!(ok_json["rooms"], Value::Null);
    assert_eq!(ok_json["peers"], 2);
    assert!(!ok_json["problems"].as_array().unwrap().is_empty());
    let count_json = json["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["id"] == "bad-count")
        .unwrap();
    assert_eq!(count_json["peers"], Value::Null);
}

// A heartbeat sorted set of the wrong type, a lease that is not an instance id and has no
// TTL, and an epoch that is not a number: status still returns, with no instances and the
// problems named.
#[test]
fn wrong_typed_heartbeats_key_and_garbage_lease_are_flagged() {
    let s = Server::start();
    let stage = "wrongtype";
    let ks = ks(stage);
    let mut con = s.con();
    let _: () = redis::cmd("SET")
        .arg(ks.heartbeats())
        .arg("x")
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(ks.leader())
        .arg("not an id")
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(ks.epoch())
        .arg("seven")
        .query(&mut con)
        .unwrap();
    let st = fleet_status(&reader(&s, stage)).expect("status survives a wrong-typed key");
    assert!(st.instances.is_empty());
    assert!(
        mentions(
            &st.problems,
            &[&ks.heartbeats(), "string", "not a sorted set"]
        ),
        "{st:#?}"
    );
    assert_eq!(st.leader.as_deref(), Some("not an id"));
    assert!(!st.leader_alive);
    assert!(
        mentions(&st.problems, &[&ks.leader(), "not an instance id"]),
        "{st:#?}"
    );
    assert!(mentions(&st.problems, &[&ks.leader(), "no TTL"]), "{st:#?}");
    assert!(!st.epoch_known);
    assert!(mentions(&st.problems, &[&ks.epoch(), "seven"]), "{st:#?}");
}

// Only a failure to reach Redis fails the status, as ErrorKind::Redis.
#[test]
fn unreachable_redis_is_a_redis_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port(); // closed again at once: nothing listens there
    let t = Timings::default();
    let config = config_for(&format!("redis://127.0.0.1:{port}"), "down", "reader", t);
    let e = fleet_status(&config).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Redis, "{e}");
}

// The four states on hand-written entries: alive (heartbeat key, fresh score), late (no
// heartbeat key, fresh score), stale (score older than the threshold, with or without a
// heartbeat key), being_reaped (score 0). A lease held by an instance that is not alive is
// flagged (`leader_alive` false, "(not heartbeating)" in the table).
#[test]
fn states_of_hand_written_entries() {
    let s = Server::start();
    let stage = "states";
    let ks = ks(stage);
    let mut con = s.con();
    let now = s.server_ms();
    let zset = ks.heartbeats();
    for (id, score, hb) in [
        ("i-alive", now - 1000, true),
        ("i-late", now - 1000, false),
        ("i-stale", now - 60_000, false),
        ("i-stale-hb", now - 60_000, true),
        ("i-reaped", 0, false),
    ] {
        zadd(&mut con, &zset, score, id.as_bytes());
        if hb {
            set_px(&mut con, &ks.heartbeat(id), "1", 60_000);
        }
    }
    set_px(&mut con, &ks.leader(), "i-late", 60_000);
    let st = fleet_status(&reader(&s, stage)).unwrap();
    let state = |id| find(&st, id).state;
    assert_eq!(state("i-alive"), InstanceState::Alive);
    assert_eq!(state("i-late"), InstanceState::Late);
    assert_eq!(state("i-stale"), InstanceState::Stale);
    assert_eq!(state("i-stale-hb"), InstanceState::Stale);
    assert_eq!(state("i-reaped"), InstanceState::BeingReaped);
    assert!(find(&st, "i-alive").alive);
    assert!(!find(&st, "i-late").alive);
    assert!(find(&st, "i-reaped").being_reaped);
    assert!(st.is_clean(), "{st:#?}");
    assert_eq!(st.stale_threshold_ms, 45_000);
    assert_eq!(st.leader.as_deref(), Some("i-late"));
    assert!(!st.leader_alive, "the lease holder is late");

    let states: Vec<String> = st.to_json()["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["state"].as_str().unwrap().to_owned())
        .collect();
    for s in ["alive", "late", "stale", "being_reaped"] {
        assert!(states.iter().any(|x| x == s), "{states:?}");
    }

    // The CLI shows the same, with the threshold it used and the leader flagged.
    let out = cli(&["status", "--redis-url", &s.url(), "--stage", stage]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "alive",
        "late",
        "stale",
        "being_reaped",
        "45000 ms",
        "--heartbeat-ttl-ms",
        "--stale-factor",
        "(not heartbeating)",
    ] {
        assert!(text.contains(needle), "{needle:?} missing in:\n{text}");
    }
    let out = cli(&[
        "status",
        "--json",
        "--redis-url",
        &s.url(),
        "--stage",
        stage,
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["leader_alive"], false);
    assert_eq!(json["instances"].as_array().unwrap().len(), 5);
}

// The states of a real node: alive while it runs and holds the lease (leader_alive), then,
// after a crash (no cleanup, lease kept), late once its heartbeat key expired and stale once
// its score is older than the threshold, while the lease it still holds is flagged.
// Late lasts from the key's expiry (heartbeat TTL, 600 ms) to the stale threshold on the
// server's clock: 3 s here, so status calls polled on a loaded machine see it (with fast()'s
// 900 ms the window was 300 ms, about one status call under load).
#[test]
fn states_of_a_crashed_node() {
    let s = Server::start();
    let stage = "crash";
    let mut t = Timings::fast();
    t.stale_threshold = Duration::from_secs(3);
    let (node, _log) = s.leader(stage, "solo", t);
    let config = s.config_with(stage, "reader", t);
    let st = wait_for(LONG, "solo alive and leading", || {
        let st = fleet_status(&config).unwrap();
        (st.leader_alive && find(&st, "solo").state == InstanceState::Alive).then_some(st)
    });
    assert!(st.is_clean(), "{st:#?}");
    node.simulate_crash();
    let mut seen_late = false;
    let st = wait_for(LONG, "solo stale", || {
        let st = fleet_status(&config).unwrap();
        let i = find(&st, "solo");
        if st.leader.as_deref() == Some("solo") && i.state != InstanceState::Alive {
            assert!(!st.leader_alive, "{st:#?}");
        }
        seen_late |= i.state == InstanceState::Late;
        (i.state == InstanceState::Stale).then_some(st)
    });
    assert!(seen_late, "late between alive and stale");
    assert!(find(&st, "solo").age_ms >= t.stale_threshold.as_millis() as i64);
}

// Key schema version 2 keeps no per-instance peer index: an instance's `peers` in `status` is
// the count of peers it holds, which its heartbeat writes into its record (the `peers` field of
// `P:{ctl}:instance:<I>:info`) on every tick. A node that has not ticked since it registered
// (`quiet()`: its first tick is a minute away) has no count yet: unknown (`null` in the JSON),
// not 0. A ticking node's count follows what it holds: it drops after a remove and a close.
// Fails if status counts anything else (records, rooms), if a registration writes a count, or
// if the heartbeat stops writing it.
#[test]
fn an_instances_peer_count_is_what_its_heartbeat_last_wrote() {
    let s = Server::start();
    let stage = "peercount";
    let ks = ks(stage);
    let silent = s.node_with(stage, "silent", quiet());
    silent.pin_room("s-room").unwrap();
    silent.upsert_peer("s-room", "s1", None, &[]).unwrap();
    let ticking = s.node(stage, "ticking");
    ticking.pin_room("t-room").unwrap();
    ticking.pin_room("t-other").unwrap();
    let mut generations = Vec::new();
    for p in ["t1", "t2", "t3"] {
        generations.push(ticking.upsert_peer("t-room", p, None, &[]).unwrap());
    }
    ticking.upsert_peer("t-other", "t4", None, &[]).unwrap();
    let config = reader(&s, stage);
    let count = |st: &FleetStatus, id: &str| {
        let i = find(st, id);
        i.peers_known.then_some(i.peers)
    };
    let st = wait_for(LONG, "ticking's count of 4", || {
        let st = fleet_status(&config).unwrap();
        (count(&st, "ticking") == Some(4)).then_some(st)
    });
    let i = find(&st, "silent");
    assert_eq!((i.peers_known, i.peers, i.rooms), (false, 0, 1), "{i:?}");
    let json = st.to_json();
    let by_id = |id: &str| {
        json["instances"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["id"] == id)
            .unwrap()
            .clone()
    };
    assert_eq!(by_id("silent")["peers"], Value::Null);
    assert_eq!(by_id("ticking")["peers"], 4);

    assert!(ticking.remove_peer("t-room", "t1", generations[0]).unwrap());
    ticking.close_room("t-other").unwrap();
    wait_for(LONG, "ticking's count of 2", || {
        let st = fleet_status(&config).unwrap();
        (count(&st, "ticking") == Some(2)).then_some(())
    });
    let written: Option<String> = redis::cmd("HGET")
        .arg(ks.instance_info("ticking"))
        .arg("peers")
        .query(&mut s.con())
        .unwrap();
    assert_eq!(written.as_deref(), Some("2"));
    let st = fleet_status(&config).unwrap();
    assert_eq!(count(&st, "silent"), None, "a registration writes no count");
}

// Paging: more members than one ZSCAN page and one lookup batch; ZRANGE is never sent.
#[test]
fn many_instances_are_paged_with_zscan() {
    let s = Server::start();
    let stage = "many";
    let ks = ks(stage);
    let mut con = s.con();
    let now = s.server_ms();
    let mut pipe = redis::pipe();
    for n in 0..2500 {
        pipe.cmd("ZADD")
            .arg(ks.heartbeats())
            .arg(now - 1000)
            .arg(format!("i-{n:04}"))
            .ignore();
    }
    let _: () = pipe.query(&mut con).unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut con)
        .unwrap();
    let st = fleet_status(&reader(&s, stage)).unwrap();
    assert_eq!(st.instances.len(), 2500);
    assert!(st
        .instances
        .iter()
        .all(|i| i.state == InstanceState::Late && i.rooms_known && i.rooms == 0));
    assert_eq!(st.instances[0].id, "i-0000");
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut con)
        .unwrap();
    assert!(stats.contains("cmdstat_zscan:"), "{stats}");
    assert!(!stats.contains("cmdstat_zrange"), "{stats}");
}

fn cli(args: &[&str]) -> Output {
    let mut cmd = Command::new(support::procs::cli_bin());
    for var in [
        "REDIS_URL",
        "SFU_NAMESPACE",
        "SFU_STAGE",
        "SFU_BRANCH",
        "SFU_INSTANCE_ID",
    ] {
        cmd.env_remove(var);
    }
    cmd.args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run sfu-redis")
}

// `--peers-per-room 4294967295` used to build ~4 billion peer ids before writing anything and
// abort (SIGABRT) when memory ran out; absurd sizes must be refused at once with exit 2.
#[test]
fn node_refuses_absurd_sizes() {
    for args in [
        &["node", "--peers-per-room", "4294967295", "--rooms", "r"][..],
        &[
            "node",
            "--peers-per-room",
            "100000",
            "--rooms",
            "a,b,c,d,e,f,g,h,i,j,k",
        ][..],
    ] {
        let start = Instant::now();
        let out = cli(args);
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{args:?} took long"
        );
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--peers-per-room"), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}: {out:?}");
    }
}

// `node --leave-on-exit`: on SIGTERM the instance closes its rooms, drops its registration and
// releases the lease (`Node::leave`), so `status` no longer lists it and nothing of it remains;
// without the flag, its rooms stay for the reaper.
#[test]
fn node_leave_on_exit_leaves_nothing_behind() {
    let s = Server::start();
    let url = s.url();
    for (stage, leave) in [("leave", true), ("stay", false)] {
        let ks = ks(stage);
        let mut extra: Vec<&str> = procs::FAST.to_vec();
        if leave {
            extra.push("--leave-on-exit");
        } else {
            // The released heartbeat key must outlive the `status` run below: 600 ms was
            // shorter than a process start on a loaded machine (`late` instead of `stopped`).
            let ttl = extra
                .iter()
                .position(|f| *f == "--heartbeat-ttl-ms")
                .unwrap()
                + 1;
            extra[ttl] = "10000";
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let mut spawn = procs::Spawn::new(&url, stage, "leaver", &["r1", "r2"]);
        spawn.extra = &extra;
        let mut proc = spawn.run(tx);
        let mut events = procs::Events::new(rx);
        events.expect("ready", |_, v| procs::is(v, "ready"));
        let config = s.config(stage, "reader");
        let st = fleet_status(&config).unwrap();
        assert_eq!(find(&st, "leaver").rooms, 2, "{st:#?}");
        proc.signal("TERM");
        let code = wait_for(LONG, "node exit", || proc.child.try_wait().unwrap());
        assert!(code.success(), "{stage}: {code}");
        let st = fleet_status(&config).unwrap();
        let left = s.keys(&format!("{}:*", ks.prefix()));
        if leave {
            assert!(st.instances.is_empty(), "{st:#?}");
            assert_eq!(st.leader, None);
            assert!(
                left.iter()
                    .all(|k| k == &ks.dataset() || k == &ks.epoch() || k == &ks.schema()),
                "{left:#?}"
            );
        } else {
            let me = find(&st, "leaver");
            assert_eq!(me.rooms, 2, "{st:#?}");
            assert!(left.contains(&ks.room("r1").meta), "{left:#?}");
            // A clean stop marks the heartbeat released: `stopped`, not `alive`.
            assert_eq!(me.state, InstanceState::Stopped, "{st:#?}");
            assert!(!me.alive);
            assert!(left.contains(&ks.instance_info("leaver")), "{left:#?}");
            let out = cli(&["status", "--redis-url", &url, "--stage", stage]);
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                text.lines()
                    .any(|l| l.starts_with("leaver") && l.contains(" stopped ")),
                "{text}"
            );
        }
        // Every event line carries the node's wall clock.
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let (_, ready) = events.expect("ready", |_, v| procs::is(v, "ready"));
        let ts = ready["ts_ms"].as_i64().expect("ts_ms is a number");
        assert!(
            (now_ms - 600_000..=now_ms).contains(&ts),
            "ts_ms {ts} vs now {now_ms}"
        );
    }
}

// Issue 14 item 1: each instance is judged with the timings of the record it wrote at
// registration, so `status` needs none of the fleet's timings. A reader with the default
// configuration (stale after 45 s) sees a crashed fast node (stale after 900 ms) turn stale on
// its own threshold; the version, host, pid and uptime come from the record; a fleet with two
// sets of timings, or two versions, is flagged; the flags still override every instance.
#[test]
fn instances_are_judged_with_their_own_records() {
    let s = Server::start();
    let stage = "records";
    let ks = ks(stage);
    let t = Timings::fast();
    let (fast, _log) = s.leader(stage, "fastone", t);
    let _slow = s.node_with(stage, "slowone", Timings::default());
    let st = wait_for(LONG, "both alive", || {
        let st = fleet_status(&reader(&s, stage)).unwrap();
        (st.instances.len() == 2 && st.instances.iter().all(|i| i.state == InstanceState::Alive))
            .then_some(st)
    });
    let me = find(&st, "fastone");
    assert_eq!(me.stale_threshold_ms, t.stale_threshold.as_millis() as i64);
    assert_eq!(me.stale_threshold_from, "record");
    let info = me.info.as_ref().expect("a record");
    assert_eq!(info.version.as_deref(), Some(sfu_redis::ops::info::VERSION));
    assert_eq!(info.pid, Some(std::process::id()));
    assert!(
        info.host.as_deref().is_some_and(|h| !h.is_empty()),
        "{info:?}"
    );
    assert_eq!(
        info.transport.as_deref(),
        Some(if s.is_cluster() { "cluster" } else { "plain" })
    );
    assert_eq!(info.heartbeat_interval(), Some(t.heartbeat_interval));
    assert!(
        me.uptime_ms.is_some_and(|u| (0..600_000).contains(&u)),
        "{me:?}"
    );
    assert_eq!(find(&st, "slowone").stale_threshold_ms, 45_000);
    assert!(me.problems.is_empty(), "{me:?}");
    assert!(
        st.warnings.iter().any(|w| w.starts_with("mixed timings")
            && w.contains("fastone")
            && w.contains("slowone")),
        "{:?}",
        st.warnings
    );
    assert!(!st.warnings.iter().any(|w| w.starts_with("mixed versions")));

    // The CLI with no timing flags: the instance's own threshold, version and host.
    let out = cli(&["status", "--redis-url", &s.url(), "--stage", stage]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "STALE AFTER",
        "VERSION",
        "UPTIME",
        "900 ms",
        sfu_redis::ops::info::VERSION,
        "warning    mixed timings",
    ] {
        assert!(text.contains(needle), "{needle:?} missing in:\n{text}");
    }
    let out = cli(&[
        "status",
        "--json",
        "--redis-url",
        &s.url(),
        "--stage",
        stage,
    ]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = json["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["id"] == "fastone")
        .unwrap()
        .clone();
    assert_eq!(row["version"], sfu_redis::ops::info::VERSION, "{row}");
    assert_eq!(row["timings"]["stale_threshold_ms"], 900, "{row}");
    assert_eq!(row["stale_threshold_from"], "record", "{row}");

    // Another version's hand-written record: mixed versions, its missing fields named.
    let mut con = s.con();
    zadd(&mut con, &ks.heartbeats(), s.server_ms(), b"oldone");
    set_px(&mut con, &ks.heartbeat("oldone"), "1", 60_000);
    let _: () = redis::cmd("HSET")
        .arg(ks.instance_info("oldone"))
        .arg("version")
        .arg("0.0.1")
        .query(&mut con)
        .unwrap();
    let st = fleet_status(&reader(&s, stage)).unwrap();
    assert!(
        st.warnings
            .iter()
            .any(|w| w.starts_with("mixed versions") && w.contains("0.0.1 (oldone)")),
        "{:?}",
        st.warnings
    );
    let old = find(&st, "oldone");
    assert_eq!(old.stale_threshold_from, "default");
    assert!(
        mentions(&old.problems, &["stale_threshold_ms", "missing"]),
        "{old:?}"
    );

    // A crash: stale on its own 900 ms threshold, long before the reader's 45 s.
    fast.simulate_crash();
    wait_for(LONG, "fastone stale", || {
        let st = fleet_status(&reader(&s, stage)).unwrap();
        (find(&st, "fastone").state == InstanceState::Stale).then_some(())
    });
    // The override judges every instance with the operator's threshold.
    let st = fleet_status_with_stale(&reader(&s, stage), Some(Duration::from_secs(3600))).unwrap();
    let me = find(&st, "fastone");
    assert_eq!(me.state, InstanceState::Late, "{me:?}");
    assert_eq!(me.stale_threshold_from, "override");
    assert!(st.stale_override);
}

// Issue 14 item 2: "leader none" says why (a new dataset: no lease until a lease TTL after the
// dataset token was written, and when), and a prefix with no fleet names the prefixes that
// have one (a wrong stage or branch).
#[test]
fn a_new_dataset_and_an_empty_prefix_say_why() {
    let s = Server::start();
    let _node = s.node_with("real", "n1", Timings::default());
    let st = fleet_status(&reader(&s, "real")).unwrap();
    assert_eq!(st.leader, None, "{st:#?}");
    let note = st.leader_note.clone().unwrap_or_default();
    assert!(
        note.contains("new dataset")
            && note.contains(&format!(
                "lease TTL ({} ms)",
                Timings::default().lease_ttl.as_millis()
            ))
            && note.contains("in about"),
        "{note}"
    );
    let created = st.dataset_created_ms.expect("dataset token read");
    assert!((0..60_000).contains(&(st.server_ms - created)), "{st:#?}");
    let out = cli(&["status", "--redis-url", &s.url(), "--stage", "real"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("leader     none") && text.contains("new dataset"),
        "{text}"
    );

    let st = fleet_status(&reader(&s, "typo")).unwrap();
    assert!(st.instances.is_empty());
    assert_eq!(
        st.other_prefixes,
        vec![ks("real").prefix().to_owned()],
        "{st:#?}"
    );
    assert_eq!(
        st.leader_note.as_deref(),
        Some("no instance is registered under this prefix")
    );
    let out = cli(&["status", "--redis-url", &s.url(), "--stage", "typo"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("hint") && text.contains(ks("real").prefix()) && text.contains("--stage"),
        "{text}"
    );
}

/// Timings of a leader whose ticks the fault proxy can make slow without making its calls fail:
/// a tick is slow above 500 ms (half the 1 s interval), a call fails after 1.5 s; a round every
/// 500 ms with a 1.5 s two-phase wait; a 4 s lease (first granted 4 s after the dataset began).
/// A leader whose ticks a 350 ms proxy delay makes slow (a tick is a round trip or more:
/// 700 ms and up, over half its 1 s interval) while no call times out. Its two-phase window
/// (4 s) holds at least two tick completions even on a loaded machine, so every round in the
/// slow phase sees a slow tick (a 1.5 s window could end while its only tick was still under
/// way: the round then reaped).
pub(crate) fn slowable() -> Timings {
    let mut t = Timings::from_heartbeat(Duration::from_secs(1), Duration::from_secs(3));
    t.command_timeout = Duration::from_millis(1500);
    t.lease_ttl = Duration::from_secs(4);
    t.lease_refresh = Duration::from_millis(1800);
    t.two_phase_delay = Duration::from_secs(4);
    t.reap_interval = Duration::from_millis(500);
    t
}

/// Waits until `node` counted a slow heartbeat tick (`sfu_redis_slow_ticks` above 0): the
/// proxy's delay has taken effect before a dead instance appears.
pub(crate) fn wait_for_a_slow_tick(node: &sfu_redis::Node) {
    wait_for(LONG, "a slow tick", || {
        node.metrics()
            .lines()
            .filter(|l| l.starts_with("sfu_redis_slow_ticks"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .any(|n| n > 0.0)
            .then_some(())
    });
}

fn exists(s: &Server, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query(&mut s.con()).unwrap()
}

/// `sfu-redis status --json` of `stage`.
fn status_json(url: &str, stage: &str) -> Value {
    let out = cli(&["status", "--json", "--redis-url", url, "--stage", stage]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    serde_json::from_slice(&out.stdout).expect("status --json is JSON")
}

// Issue 26 item 4: a leader that skips reap rounds says so. Fault: the leader's Redis traffic
// goes through the fault proxy with 350 ms each way, so each heartbeat tick (a round trip or
// more: 700 ms and up) is slower than half its 1 s interval, while no call times out; a dead
// instance is stale from the start. Protection: the leader skips its rounds, and notes why in
// its record: `status --json` has `reaper_note` "reaper paused: ticks slower than 500 ms
// (last N ms)" with the measured N above 500 and the leader's `reaper_paused`, the table
// prints the note, and the dead instance stays (not reaped, not being reaped). Once the delay
// is gone a round runs, reaps it, and the note is gone, from status and from the record.
// Fails if a skipped round leaves no trace (the old code: nothing in status), or if the note
// outlives the pause.
#[test]
fn a_leader_skipping_reap_rounds_says_so_until_a_round_runs() {
    const STAGE: &str = "paused";
    let s = Server::start_with(&[]);
    let url = s.url();
    let proxy = s.proxy();
    let node =
        sfu_redis::Node::start(config_for(&proxy.url(), STAGE, "slowpoke", slowable())).unwrap();
    wait_for(LONG, "slowpoke leads", || node.is_leader().then_some(()));
    support::procs::cli_bin(); // built before the slow part starts
    proxy.set_delay(Duration::from_millis(350));
    wait_for_a_slow_tick(&node);
    let ks = ks(STAGE);
    s.fabricate_dead(
        &ks,
        "stuck",
        s.server_ms() - 60_000,
        None,
        &[("stuck-room", &[("p", None)])],
    );
    let st = wait_for(LONG, "status saying the reaper is paused", || {
        let st = status_json(&url, STAGE);
        st["reaper_note"].is_string().then_some(st)
    });
    eprintln!("reaper_note: {}", st["reaper_note"]);
    let note = st["reaper_note"].as_str().unwrap();
    let last: u64 = note
        .strip_prefix("reaper paused: ticks slower than 500 ms (last ")
        .and_then(|rest| rest.split_once(" ms)"))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("{note}"));
    assert!(last > 500, "{note}");
    assert!(note.contains("round(s) skipped in a row"), "{note}");
    let leader = st["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["id"] == "slowpoke")
        .unwrap_or_else(|| panic!("{st}"));
    assert_eq!(leader["reaper_paused"]["slow_ticks"], true, "{leader}");
    assert!(
        leader["reaper_paused"]["tick_ms"].as_u64() > Some(500),
        "{leader}"
    );
    assert_eq!(leader["reaper_paused"]["slow_after_ms"], 500, "{leader}");
    let stuck = st["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["id"] == "stuck")
        .unwrap_or_else(|| panic!("stuck was reaped while the reaper was paused: {st}"));
    assert_eq!(stuck["state"], "stale", "{stuck}");
    assert!(
        exists(&s, &ks.room("stuck-room").meta),
        "a skipped round reaped nothing"
    );
    let out = cli(&["status", "--redis-url", &url, "--stage", STAGE]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("reaper paused: ticks slower than 500 ms (last "),
        "{text}"
    );

    // The delay is gone: a round runs, reaps `stuck` and clears the note.
    proxy.set_delay(Duration::ZERO);
    let st = wait_for(LONG, "stuck reaped and the note gone", || {
        let st = status_json(&url, STAGE);
        let gone = st["instances"]
            .as_array()?
            .iter()
            .all(|i| i["id"] != "stuck");
        (gone && st["reaper_note"].is_null()).then_some(st)
    });
    let leader = st["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["id"] == "slowpoke")
        .unwrap_or_else(|| panic!("{st}"));
    assert_eq!(leader["reaper_paused"], Value::Null, "{leader}");
    let fields: Vec<Option<String>> = redis::cmd("HMGET")
        .arg(ks.instance_info(&wire(IdKind::Instance, "slowpoke")))
        .arg(&[
            "reaper_paused",
            "reaper_paused_ms",
            "reaper_paused_since_ms",
            "reaper_paused_rounds",
            "reaper_paused_tick_ms",
            "reaper_paused_slow_ms",
        ])
        .query(&mut s.con())
        .unwrap();
    assert!(fields.iter().all(Option::is_none), "{fields:?}");
    assert!(!exists(&s, &ks.room("stuck-room").meta));
    let out = cli(&["status", "--redis-url", &url, "--stage", STAGE]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("reaper paused"), "{text}");
    node.shutdown().unwrap();
}
