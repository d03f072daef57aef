//! `sfu-redis reap --instance ID` (issue 15, item 3; `sfu_redis::ops::reap`) and the progress
//! display of `reap` and `fsck` (item 2), on a real redis-server.
//!
//! Promises covered: an operator's reap never touches a live instance (invariant 1: a live
//! boot token refuses it even with --force; a heartbeat key or a fresh heartbeat refuses it
//! without --force), leaves nothing of the reaped instance behind (invariant 2), writes
//! nothing in a dry run, says clearly why it refuses (exit 1) or cannot check (exit 2), and
//! interleaves safely with a leader reaping the same instance (counts add up, state clean).

use crate::support;

use std::io::Write as _;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value as Json;
use sfu_redis::keys::IdKind;
use sfu_redis::{Config, Event, Node, Timings};
use support::*;

const STAGE: &str = "reapcmd";

/// Runs `sfu-redis reap --stage STAGE --redis-url url <args>` with a clean environment.
fn reap(url: &str, args: &[&str]) -> Output {
    cli(url, "reap", args)
}

fn cli(url: &str, sub: &str, args: &[&str]) -> Output {
    let mut c = Command::new(procs::cli_bin());
    c.arg(sub)
        .args(["--stage", STAGE, "--redis-url", url])
        .args(args)
        .env_remove("REDIS_URL")
        .env_remove("SFU_NAMESPACE")
        .env_remove("SFU_STAGE")
        .env_remove("SFU_BRANCH")
        .env_remove("SFU_INSTANCE_ID")
        .env_remove("RUST_LOG");
    c.output().expect("run sfu-redis")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The one JSON object `--json` prints on stdout.
fn json_of(o: &Output) -> Json {
    let text = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "one JSON object expected, got {text:?}; stderr {}",
        stderr(o)
    );
    serde_json::from_str(lines[0]).expect("valid JSON")
}

/// True for the id `sfu-redis reap` publishes under: `sfu-redis-reap@<host>:<pid>`.
fn is_reaper_id(v: &Json) -> bool {
    let Some(rest) = v.as_str().and_then(|s| s.strip_prefix("sfu-redis-reap@")) else {
        return false;
    };
    rest.rsplit_once(':').is_some_and(|(host, pid)| {
        !host.is_empty() && !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())
    })
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exit code")
}

/// Pins `room` on `n` and upserts `peers` into it.
fn populate(n: &Node, room: &str, peers: &[&str]) {
    n.pin_room(room).unwrap();
    for p in peers {
        n.upsert_peer(room, p, None, &[("name", p)]).unwrap();
    }
}

/// Every key, member, field or value of the prefix that names `instance` (wire form).
fn traces_of(s: &Server, instance: &str) -> Vec<String> {
    let w = wire(IdKind::Instance, instance);
    references(&s.dump(&ks(STAGE).scan_pattern()), &[w])
}

/// The heartbeat sorted-set score of `instance` (0: being reaped; `None`: not registered).
fn score(s: &Server, instance: &str) -> Option<f64> {
    redis::cmd("ZSCORE")
        .arg(ks(STAGE).heartbeats())
        .arg(wire(IdKind::Instance, instance))
        .query(&mut s.con())
        .unwrap()
}

/// Writes a dead (stale) instance `dead` with `rooms` rooms (`<dead>-r<k>`), one peer each.
fn fabricate(s: &Server, dead: &str, rooms: usize) -> Vec<String> {
    let names: Vec<String> = (0..rooms).map(|r| format!("{dead}-r{r}")).collect();
    let peers: &[(&str, Option<&str>)] = &[("p", None)];
    let fake: Vec<FakeRoom<'_>> = names.iter().map(|r| (r.as_str(), peers)).collect();
    s.fabricate_dead(&ks(STAGE), dead, s.server_ms() - 60_000, None, &fake);
    names
}

// Protects: invariant 1 for a crashed node's last moments, and the --force rules. Fault: a node
// crashes (no release: its heartbeat key keeps its boot token until the TTL); its record asks
// for a long stale threshold (60 s). Protection: while the key exists the reap is refused even
// with --force (a live token); once the key expired but the last heartbeat is within the
// instance's own threshold, refused without --force (exit 1, "fresh", the record's threshold
// named), accepted with it; then nothing of it is left and the prefix audits clean. Fails if a
// live token can be overridden, if the record's threshold is ignored, or if the reap leaves
// keys behind.
#[test]
fn a_crashed_node_is_refused_until_its_key_is_gone_then_reaped_with_force() {
    let s = Server::start();
    let url = s.url();
    // A heartbeat key that outlives the crash by 3 s (time for the CLI calls below), and a
    // long stale threshold in the node's record.
    let mut t = Timings::fast();
    t.heartbeat_ttl = Duration::from_secs(3);
    t.stale_threshold = Duration::from_secs(60);
    let node = s.node_with(STAGE, "crashy", t);
    procs::cli_bin(); // built before the clock starts
    populate(&node, "c-room1", &["a", "b"]);
    populate(&node, "c-room2", &["c"]);
    node.simulate_crash();
    let hb = ks(STAGE).heartbeat(&wire(IdKind::Instance, "crashy"));
    let exists =
        |s: &Server| -> bool { redis::cmd("EXISTS").arg(&hb).query(&mut s.con()).unwrap() };
    assert!(
        exists(&s),
        "the heartbeat key outlives the crash for its TTL"
    );
    let before = s.dump(&ks(STAGE).scan_pattern());

    // Its key still holds its boot token: refused, with and without --force.
    for args in [
        &["--instance", "crashy", "--json"][..],
        &["--instance", "crashy", "--json", "--force"],
    ] {
        let o = reap(&url, args);
        if !exists(&s) {
            break; // expired during the call: the next phase covers it
        }
        assert_eq!(code(&o), 1, "{args:?}: {}", stderr(&o));
        let j = json_of(&o);
        assert_eq!(j["refused"], "live", "{j}");
        assert_eq!(j["reaped"], false);
        assert!(stderr(&o).contains("alive"), "{}", stderr(&o));
        assert_eq!(
            s.dump(&ks(STAGE).scan_pattern()),
            before,
            "a refusal writes nothing"
        );
    }

    // Key expired, last heartbeat within the record's 60 s: refused without --force.
    wait_for(LONG, "crashy's heartbeat key expired", || {
        (!exists(&s)).then_some(())
    });
    let o = reap(&url, &["--instance", "crashy", "--json"]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    let j = json_of(&o);
    assert_eq!(j["refused"], "fresh", "{j}");
    assert_eq!(j["stale_threshold_ms"], 60_000, "{j}");
    assert_eq!(j["stale_threshold_from"], "record", "{j}");
    let err = stderr(&o);
    assert!(err.contains("--force") && err.contains("60000 ms"), "{err}");

    // With --force: reaped, and announced on P:events as a leader's reap is (checked on a
    // single server: a subscriber there needs no cluster client).
    let mut sub = (!cluster_topology()).then(|| {
        let client = redis::Client::open(url.as_str()).unwrap();
        let con = client.get_connection().unwrap();
        con.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        con
    });
    // One PubSub for the whole check (dropping it unsubscribes).
    let mut ps = sub.as_mut().map(|con| con.as_pubsub());
    if let Some(ps) = ps.as_mut() {
        ps.subscribe(ks(STAGE).events_channel()).unwrap();
    }
    let o = reap(&url, &["--instance", "crashy", "--json", "--force"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    if let Some(ps) = ps.as_mut() {
        let announced: Json = loop {
            let msg = ps.get_message().expect("an event on P:events within 10 s");
            let payload: String = msg.get_payload().unwrap();
            let e: Json = serde_json::from_str(&payload).unwrap();
            if e["event"] == "instance_reaped" {
                break e;
            }
        };
        assert_eq!(announced["dead"], "crashy", "{announced}");
        assert_eq!(announced["rooms"], 2, "{announced}");
        assert_eq!(announced["peers"], 3, "{announced}");
        // Published by the CLI under its own id, marked forced.
        assert_eq!(announced["forced"], true, "{announced}");
        assert!(is_reaper_id(&announced["instance"]), "{announced}");
    }
    let j = json_of(&o);
    assert_eq!(j["reaped"], true, "{j}");
    assert_eq!(j["refused"], Json::Null, "{j}");
    assert_eq!(
        (j["rooms"].as_u64(), j["peers"].as_u64()),
        (Some(2), Some(3)),
        "{j}"
    );
    assert_eq!(traces_of(&s, "crashy"), Vec::<String>::new());
    assert!(s.keys(&format!("sfu:{STAGE}:room:*")).is_empty());
    assert_eq!(s.index_problems(&ks(STAGE)), Vec::<String>::new());
}

// Protects: invariant 1 against an operator. Fault: `reap --force` aimed at a running node.
// Protection: its heartbeat key holds its boot token: refused (exit 1), nothing written, the
// node keeps heartbeating. A node stopped cleanly (key `released`) is refused without --force
// and reaped with it. Fails if --force overrides a live token, or if a released key blocks
// a forced reap or is taken for a live one.
#[test]
fn a_live_instance_is_never_reaped_and_a_stopped_one_only_with_force() {
    let s = Server::start();
    let url = s.url();
    let live = s.node(STAGE, "alive-1");
    populate(&live, "l-room", &["x", "y"]);
    let view = room_view(&s, STAGE, &["l-room"], &["alive-1"]);
    for args in [
        &["--instance", "alive-1"][..],
        &["--instance", "alive-1", "--force"],
    ] {
        let o = reap(&url, args);
        assert_eq!(code(&o), 1, "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("alive-1 is alive"), "{}", stderr(&o));
    }
    assert_eq!(room_view(&s, STAGE, &["l-room"], &["alive-1"]), view);
    assert!(
        score(&s, "alive-1").is_some_and(|s| s > 0.0),
        "not marked as being reaped"
    );

    // A released heartbeat key that lives 10 s, stale after 15 s: neither expires nor turns
    // stale during the calls below.
    let mut t = Timings::fast();
    t.heartbeat_ttl = Duration::from_secs(10);
    t.stale_threshold = Duration::from_secs(15);
    let stopped = s.node_with(STAGE, "stopped-1", t);
    populate(&stopped, "s-room", &["z"]);
    stopped.shutdown().unwrap();
    let o = reap(&url, &["--instance", "stopped-1", "--json"]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert_eq!(json_of(&o)["refused"], "released");
    assert!(stderr(&o).contains("--force"), "{}", stderr(&o));
    let o = reap(&url, &["--instance", "stopped-1", "--force"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("reaped stopped-1: 1 rooms, 1 peers"), "{out}");
    assert_eq!(traces_of(&s, "stopped-1"), Vec::<String>::new());
    // The live node is untouched.
    assert_eq!(room_view(&s, STAGE, &["l-room"], &["alive-1"]), view);
    assert_eq!(s.index_problems(&ks(STAGE)), Vec::<String>::new());
}

// Protects: --dry-run writes nothing and its listing is bounded. Fault: none; a stale dead
// instance with 30 rooms. Protection: the dry run exits 0, counts 30 rooms and 30 peers, lists
// 20 ids of each, and every key is byte-for-byte the same afterwards; then the real reap
// (no --force needed: it is stale) removes everything. Fails if a dry run writes (the score 0
// mark included) or lists without bound.
#[test]
fn dry_run_lists_and_writes_nothing() {
    let s = Server::start();
    let url = s.url();
    fabricate(&s, "dead-dry", 30);
    let before = s.dump(&ks(STAGE).scan_pattern());
    let o = reap(&url, &["--instance", "dead-dry", "--dry-run", "--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let j = json_of(&o);
    assert_eq!(j["dry_run"], true);
    assert_eq!(j["reaped"], false);
    assert_eq!(
        (j["rooms"].as_u64(), j["peers"].as_u64()),
        (Some(30), Some(30)),
        "{j}"
    );
    assert_eq!(j["room_ids"].as_array().map(Vec::len), Some(20), "{j}");
    assert_eq!(j["peer_ids"].as_array().map(Vec::len), Some(20), "{j}");
    assert!(
        j["room_ids"][0]
            .as_str()
            .is_some_and(|r| r.starts_with("dead-dry-r")),
        "{j}"
    );
    assert_eq!(
        s.dump(&ks(STAGE).scan_pattern()),
        before,
        "a dry run writes nothing"
    );
    let o = reap(&url, &["--instance", "dead-dry", "--dry-run"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("would be reaped: 30 rooms, 30 peers") && out.contains("(and 10 more)"),
        "{out}"
    );
    assert_eq!(s.dump(&ks(STAGE).scan_pattern()), before);

    // The real reap is announced on P:events, not forced (checked on a single server).
    let mut sub = (!cluster_topology()).then(|| {
        let client = redis::Client::open(url.as_str()).unwrap();
        let con = client.get_connection().unwrap();
        con.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        con
    });
    let mut ps = sub.as_mut().map(|con| con.as_pubsub());
    if let Some(ps) = ps.as_mut() {
        ps.subscribe(ks(STAGE).events_channel()).unwrap();
    }
    let o = reap(&url, &["--instance", "dead-dry", "--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let j = json_of(&o);
    assert_eq!(
        (j["rooms"].as_u64(), j["peers"].as_u64()),
        (Some(30), Some(30)),
        "{j}"
    );
    if let Some(ps) = ps.as_mut() {
        let msg = ps.get_message().expect("an event on P:events within 10 s");
        let e: Json = serde_json::from_str(&msg.get_payload::<String>().unwrap()).unwrap();
        assert_eq!(e["event"], "instance_reaped", "{e}");
        assert_eq!(e["dead"], "dead-dry", "{e}");
        assert_eq!(e["forced"], false, "{e}");
        assert!(is_reaper_id(&e["instance"]), "{e}");
    }
    assert!(
        s.keys(&format!("sfu:{STAGE}:*")).is_empty(),
        "{:?}",
        s.keys("*")
    );
}

// Protects: a dry run's `peers` (and `peer_ids`) count the records naming the instance in the
// rooms of its room index (key schema version 2 keeps no peer index to count): a room another
// instance took over is listed (the reap visits it), but the new owner's records in it are not
// counted, and the dead instance's own record there is. The real reap then deletes exactly the
// counted records: the new owner's room and record stay. Fails if the dry run counted every
// record of the listed rooms (4 instead of 3) or none of a room it does not own.
#[test]
fn a_dry_run_counts_only_the_records_naming_the_instance() {
    let s = Server::start();
    let url = s.url();
    let ks = ks(STAGE);
    let names = fabricate(&s, "dead-count", 3);
    // Room 0 taken over by "taker" (pin and metadata), which hosts a peer of its own there.
    let taken = &names[0];
    let rk = ks.room(taken);
    let taker = wire(IdKind::Instance, "taker");
    let _: () = redis::pipe()
        .set(&rk.owner, &taker)
        .ignore()
        .pexpire(&rk.owner, 600_000)
        .ignore()
        .hset(&rk.meta, "owner", &taker)
        .ignore()
        .hset_multiple(
            ks.peer(taken, "t"),
            &[
                ("instance", taker.as_str()),
                ("guest", ""),
                ("generation", "9"),
                ("updated_ms", "1"),
            ],
        )
        .ignore()
        .sadd(&rk.peers, "t")
        .ignore()
        .query(&mut s.con())
        .unwrap();
    let before = s.dump(&ks.scan_pattern());
    let o = reap(&url, &["--instance", "dead-count", "--dry-run", "--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let j = json_of(&o);
    assert_eq!(
        (j["rooms"].as_u64(), j["peers"].as_u64()),
        (Some(3), Some(3)),
        "{j}"
    );
    let mut listed: Vec<String> = j["peer_ids"]
        .as_array()
        .expect("peer_ids")
        .iter()
        .map(|p| p.as_str().unwrap().to_owned())
        .collect();
    listed.sort();
    let want: Vec<String> = names.iter().map(|r| format!("{r}/p")).collect();
    assert_eq!(listed, want, "{j}");
    assert_eq!(
        s.dump(&ks.scan_pattern()),
        before,
        "a dry run writes nothing"
    );

    let o = reap(&url, &["--instance", "dead-count", "--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let j = json_of(&o);
    assert_eq!(
        (j["rooms"].as_u64(), j["peers"].as_u64()),
        (Some(2), Some(3)),
        "{j}"
    );
    // Nothing names the dead instance any more but the name of the room it once had, which
    // the taker keeps.
    let taken_keys = format!("{}:room:{{{taken}}}:", ks.prefix());
    let left: Vec<String> = traces_of(&s, "dead-count")
        .into_iter()
        .filter(|t| !(t.starts_with(&taken_keys) && t.contains(": key ")))
        .collect();
    assert_eq!(left, Vec::<String>::new());
    for r in &names[1..] {
        assert!(
            s.keys(&format!("{}:room:{{{r}}}:*", ks.prefix()))
                .is_empty(),
            "{r}"
        );
    }
    assert_eq!(score(&s, "dead-count"), None);
    let record: Option<String> = redis::cmd("HGET")
        .arg(ks.peer(taken, "t"))
        .arg("instance")
        .query(&mut s.con())
        .unwrap();
    assert_eq!(
        record.as_deref(),
        Some("taker"),
        "the new owner's record stays"
    );
}

// Protects: bad input gets a clear message and the documented code, no panic. Fault: a
// malformed id (empty, a control character, 300 bytes), an unknown id, an id with leftover
// index sets but no registration. Protection: malformed and unknown exit 2 naming the
// problem; leftovers exit 1 pointing at `fsck --repair`, and nothing is written.
#[test]
fn unknown_and_malformed_ids() {
    let s = Server::start();
    let url = s.url();
    let long = "x".repeat(300);
    for bad in ["", "bad\u{1}id", long.as_str()] {
        let o = reap(&url, &["--instance", bad]);
        assert_eq!(code(&o), 2, "{bad:?}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains("--instance") && err.contains("instance id"),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    let o = reap(&url, &["--instance", "nobody", "--json"]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert_eq!(json_of(&o)["refused"], "unknown_instance");
    assert!(
        stderr(&o).contains("no instance \"nobody\""),
        "{}",
        stderr(&o)
    );

    let ks = ks(STAGE);
    let w = wire(IdKind::Instance, "ghost");
    let _: () = redis::cmd("SADD")
        .arg(ks.instance_rooms(&w))
        .arg("some-room")
        .query(&mut s.con())
        .unwrap();
    let before = s.dump(&ks.scan_pattern());
    let o = reap(&url, &["--instance", "ghost", "--force"]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(stderr(&o).contains("fsck --repair"), "{}", stderr(&o));
    assert_eq!(s.dump(&ks.scan_pattern()), before);
    // `--json` tells leftovers (`not_registered`, exit 1) from an unknown id (above).
    let o = reap(&url, &["--instance", "ghost", "--json"]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert_eq!(json_of(&o)["refused"], "not_registered");
    assert_eq!(s.dump(&ks.scan_pattern()), before);

    let o = Command::new(procs::cli_bin())
        .args(["reap", "--instance", "x"])
        .env_remove("REDIS_URL")
        .output()
        .unwrap();
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("REDIS_URL"), "{}", stderr(&o));
}

/// A leader config of stage [`STAGE`] that reaps slowly: batches of 10, paced.
fn slow_leader(url: &str) -> Config {
    Config::builder()
        .redis_url(url)
        .stage(STAGE)
        .instance_id("boss")
        .timings(Timings::fast())
        .reap_batch(10)
        .reap_pace(3.0)
        .build()
        .expect("valid config")
}

// Protects: invariants 1 and 2 with two reapers at once (the CLI holds no lease). Fault: a
// leader is part way through the reap of a dead instance (1000 rooms, batches of 10, paced)
// when `reap --force` of the same instance starts. Protection: every step is owner-CAS and
// idempotent: each room is deleted by exactly one of them, the live instances' rooms and
// indexes are untouched, and the prefix ends clean. Fails if the two double count or miss a
// room (CLI rooms + the leader's instance_reaped rooms != 1000), if a live key changes, or if
// anything of the dead instance is left.
#[test]
fn a_forced_reap_races_a_leader_reaping_the_same_instance() {
    procs::cli_bin(); // built before the leader starts its clock
    let s = Server::start();
    let url = s.url();
    let boss = Node::start(slow_leader(&url)).expect("start leader");
    let mut log = EventLog::new(&boss);
    log.wait(LONG, "leader_acquired", |e| {
        matches!(e, Event::LeaderAcquired { .. })
    });
    let other = s.node(STAGE, "bystander");
    populate(&boss, "boss-room", &["b1", "b2"]);
    populate(&other, "other-room", &["o1"]);
    let live_view = || {
        room_view(
            &s,
            STAGE,
            &["boss-room", "other-room"],
            &["boss", "bystander"],
        )
    };
    let view = live_view();

    const ROOMS: u64 = 1000;
    fabricate(&s, "dead-race", ROOMS as usize);
    let ks = ks(STAGE);
    // The leader's re-check marked it: it is reaping now.
    wait_for(LONG, "the leader began reaping dead-race", || {
        (score(&s, "dead-race") == Some(0.0)).then_some(())
    });
    let cli = std::thread::spawn({
        let url = url.clone();
        move || reap(&url, &["--instance", "dead-race", "--force", "--json"])
    });
    let o = cli.join().expect("CLI thread");
    // The CLI ran while the leader was reaping: each deleted a share. Which of them ends the
    // reap depends on which began last and which finished first (docs/src/ops/reap.md "Against a leader"):
    // the CLI reaped the rest (exit 0), found it finished (exit 2, not_registered), or left the
    // end to a leader round that began after it (exit 1, not finished); and the leader emits
    // instance_reaped only when its own reap ends the instance. On a loaded machine the
    // leader's paced reap once finished its scan before the CLI (whose token was the later
    // one): its reap ended "retry", the CLI then ended the instance, and the leader never
    // emitted the event this test waited for. Its share is in its stats either way.
    let (cli_rooms, cli_peers) = match code(&o) {
        c @ (0 | 1) => {
            let j = json_of(&o);
            assert_eq!(j["reaped"], c == 0, "{j}");
            assert_eq!(j["refused"], Json::Null, "{j}");
            (j["rooms"].as_u64().unwrap(), j["peers"].as_u64().unwrap())
        }
        2 if json_of(&o)["refused"] == "unknown_instance" => (0, 0),
        c => panic!("exit {c}: {}", stderr(&o)),
    };
    // Nothing of the dead instance is left, and the leader has counted its share (it counts
    // when a reap call returns, after its last delete).
    let shares = || {
        let st = boss.stats();
        (cli_rooms + st.rooms_reaped, cli_peers + st.peers_reaped)
    };
    let deadline = Instant::now() + LONG;
    while !(traces_of(&s, "dead-race").is_empty() && shares().0 >= ROOMS && shares().1 >= ROOMS) {
        assert!(
            Instant::now() < deadline,
            "within {LONG:?}: traces of dead-race {:?}, cli {cli_rooms} rooms {cli_peers} peers, leader {:?}",
            traces_of(&s, "dead-race"),
            shares()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // A leader round that listed it before it was gone re-checks it a two-phase delay later
    // and finds it gone: after that (and a reap round) no reap of it can count anything more.
    let t = Timings::fast(); // slow_leader's
    std::thread::sleep(t.two_phase_delay + t.reap_interval * 2);
    let (rooms, peers) = shares();
    assert_eq!(
        rooms,
        ROOMS,
        "cli {cli_rooms} + leader {}",
        rooms - cli_rooms
    );
    assert_eq!(
        peers,
        ROOMS,
        "cli {cli_peers} + leader {}",
        peers - cli_peers
    );
    // If the leader's reap ended the instance, its event counts no more than its stats.
    if let Some(Event::InstanceReaped { rooms: r, .. }) =
        log.try_wait(Duration::ZERO, |e| reaped(e, "dead-race"))
    {
        assert!(
            r <= rooms - cli_rooms,
            "instance_reaped rooms={r}, stats {}",
            rooms - cli_rooms
        );
    }
    assert_eq!(traces_of(&s, "dead-race"), Vec::<String>::new());
    assert_eq!(live_view(), view, "the live instances' rooms and indexes");
    let problems = sfu_redis::ops::audit::scan(&ks, &mut s.con()).unwrap();
    assert!(problems.is_empty(), "{problems:#?}");
    for live in ["boss", "bystander"] {
        assert!(
            score(&s, live).is_some_and(|s| s > 0.0),
            "{live} registered"
        );
    }
}

// Progress (item 2), plain mode: with stderr piped, `reap` and `fsck` print progress lines
// ("reap: ...", "fsck: ... keys (N/s)") and no escape code; stdout keeps exactly one JSON
// object. Fails if progress goes to stdout, if escape codes leak into a pipe, or if nothing
// is printed.
#[test]
fn progress_is_plain_lines_when_piped() {
    let s = Server::start();
    let url = s.url();
    fabricate(&s, "dead-prog", 50);
    let o = reap(&url, &["--instance", "dead-prog", "--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    json_of(&o);
    let err = stderr(&o);
    assert!(
        err.lines()
            .any(|l| l.starts_with("reap: ") && l.contains("50 of 50 rooms") && l.contains("/s)")),
        "{err}"
    );
    assert!(!err.contains('\x1b') && !err.contains('\r'), "{err:?}");
    // No status is printed twice (the rate aside): one line per batch of rooms, each with its
    // own counts (key schema version 2 has no separate peer phase to repeat the last one).
    let statuses: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("reap: "))
        .map(|l| l.rsplit_once(" (").map_or(l, |(status, _)| status))
        .collect();
    let mut unique = statuses.clone();
    unique.dedup();
    assert_eq!(statuses, unique, "{err}");

    fabricate(&s, "dead-prog2", 800);
    let total = s.keys(&ks(STAGE).scan_pattern()).len();
    assert!(total > 1000, "more than one SCAN page: {total}");
    let o = cli(&url, "fsck", &["--settle-ms", "0", "--json"]);
    json_of(&o);
    let err = stderr(&o);
    // The first scan's final count is printed (a new user saw only the first page's, "1002
    // keys", for 14,074), and a rate over a few microseconds is not shown as a rate.
    let counted = err
        .lines()
        .filter_map(|l| l.strip_prefix("fsck: scan 1: "))
        .filter_map(|l| l.split_whitespace().find_map(|w| w.parse::<usize>().ok()))
        .max()
        .unwrap_or(0);
    assert_eq!(counted, total, "{err}");
    assert!(
        !err.lines().any(|l| l.contains("000000/s")),
        "an absurd rate: {err}"
    );
    assert!(
        err.lines()
            .any(|l| l.starts_with("fsck: ") && l.contains(" keys") && l.contains("/s)")),
        "{err}"
    );
    assert!(err.contains("fsck: done: 0 problems"), "{err}");
    assert!(!err.contains('\x1b') && !err.contains('\r'), "{err:?}");
}

// Progress, terminal mode: under a pseudo-terminal (`script` from util-linux), `fsck` and
// `reap` draw an indicatif bar: its escape codes and carriage returns appear, and no plain
// line does. Fails if the terminal is not detected (plain lines on a terminal) or no bar is
// drawn.
#[test]
fn progress_is_a_bar_on_a_terminal() {
    if Command::new("script").arg("--version").output().is_err() {
        panic!("`script` (util-linux) is missing: apt-get install bsdutils");
    }
    let s = Server::start();
    let url = s.url();
    fabricate(&s, "dead-tty", 50);
    let bin = procs::cli_bin().display().to_string();
    let on_tty = |sub: &str, extra: &str| -> String {
        let cmd = format!("{bin} {sub} --stage {STAGE} --redis-url {url} {extra}");
        let o = Command::new("script")
            .args(["-qec", &cmd, "/dev/null"])
            .env_remove("REDIS_URL")
            .env_remove("SFU_STAGE")
            .env_remove("RUST_LOG")
            .env("TERM", "xterm")
            .output()
            .expect("run script");
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(o.status.success(), "{cmd}: {text}");
        text
    };
    let out = on_tty("reap", "--instance dead-tty");
    assert!(out.contains("\x1b[") && out.contains('\r'), "{out:?}");
    assert!(
        !out.contains("reap: "),
        "no plain lines on a terminal: {out:?}"
    );
    assert!(out.contains("reaped dead-tty: 50 rooms"), "{out:?}");
    let out = on_tty("fsck", "--settle-ms 0");
    assert!(out.contains("\x1b[") && out.contains('\r'), "{out:?}");
    assert!(!out.contains("fsck: "), "{out:?}");
    let _ = std::io::stdout().flush();
}
