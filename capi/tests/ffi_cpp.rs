//! The C++ example host (examples/cpp/sfu_host.cpp, through include/sfu_redis.hpp), compiled
//! with `g++` against the built `libsfu_redis.so` and run as real processes on a private
//! redis-server:
//!
//! - two hosts; the leader is SIGKILLed; the other becomes leader and reaps it;
//! - one host driven from 8 C++ threads at once (pins, upserts, removes), checked by the host
//!   and against Redis;
//! - the host under valgrind memcheck (with Redis and memory-only): zero errors, no definite
//!   leak.

mod ffi_host;
mod ffi_support;
#[path = "../../tests/it/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use sfu_redis::keys::KeySpace;

use ffi_host::Host;
use ffi_support::{assert_memcheck_clean, build, build_static, root, run};
use support::{references, Server, LONG};

/// Built once per test process (the tests run in parallel).
fn host() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        build(
            "g++",
            "sfu_host",
            &[root().join("examples/cpp/sfu_host.cpp")],
            &["-std=c++17", "-pedantic"],
        )
    })
}

fn get(server: &Server, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(&mut server.con()).unwrap()
}

#[test]
fn two_hosts_sigkill_the_leader_the_other_takes_over_and_reaps_it() {
    let server = Server::start();
    let url = server.url();
    let ks = KeySpace::new("sfu", "cpp", "main").unwrap();
    let common = ["--redis-url", &url, "--stage", "cpp", "--timings", "fast"];

    let mut a = Host::spawn(
        host(),
        "cpp-a",
        &[
            &common[..],
            &["--instance", "cpp-a", "--rooms", "a1,a2", "--peers", "2"],
        ]
        .concat(),
    );
    a.line(LONG, "pinned a1", |l| l == "pinned a1 pinned");
    a.event("ready", |v| {
        v["rooms"] == 2 && v["peers"] == 4 && v["mode"] == "redis"
    });
    a.event("leader_acquired", |v| v["epoch"].as_u64().is_some());

    let mut b = Host::spawn(
        host(),
        "cpp-b",
        &[
            &common[..],
            &["--instance", "cpp-b", "--rooms", "b1,a1", "--peers", "1"],
        ]
        .concat(),
    );
    b.line(LONG, "pinned b1", |l| l == "pinned b1 pinned");
    // a1 belongs to the live cpp-a: B is told to redirect, nothing is written.
    b.line(LONG, "a1 held", |l| l == "pinned a1 held cpp-a");
    b.event("ready", |v| v["rooms"] == 1 && v["peers"] == 1);
    assert_eq!(get(&server, &ks.room("a1").owner).as_deref(), Some("cpp-a"));
    assert_eq!(get(&server, &ks.leader()).as_deref(), Some("cpp-a"));

    // kill -9 the leader: no lease release, no cleanup.
    a.child.kill().expect("SIGKILL cpp-a");
    let _ = a.child.wait();

    let acquired = b.event("leader_acquired", |_| true);
    let reaped = b.event("instance_reaped", |v| v["dead"] == "cpp-a");
    assert_eq!(reaped["rooms"], 2, "{reaped}");
    assert_eq!(reaped["peers"], 4, "{reaped}");
    assert!(acquired["epoch"].as_u64().unwrap() >= 2, "{acquired}");
    assert_eq!(get(&server, &ks.leader()).as_deref(), Some("cpp-b"));

    // Nothing of cpp-a remains; cpp-b's room and peer are intact.
    let dump = server.dump("sfu:cpp:*");
    let left = references(&dump, &["cpp-a".to_owned()]);
    assert!(left.is_empty(), "leftovers of cpp-a: {left:#?}");
    assert!(server.keys("sfu:cpp:main:room:{a*").is_empty());
    assert_eq!(get(&server, &ks.room("b1").owner).as_deref(), Some("cpp-b"));
    assert!(dump.contains_key(&ks.peer("b1", "b1-p1")), "{dump:#?}");

    // SIGTERM: B stops cleanly, releases the lease and reports it.
    support::procs::signal(b.child.id(), "TERM");
    b.event("leader_lost", |v| v["reason"] == "shutdown");
    b.event("stopped", |_| true);
    assert_eq!(b.exit_code(LONG), Some(0), "{}", b.transcript());
    assert!(b.seen.iter().any(|l| l == "exit 0"));
    assert_eq!(get(&server, &ks.leader()), None, "lease released");
}

#[test]
fn eight_cpp_threads_hammer_one_node() {
    let server = Server::start();
    let url = server.url();
    let ks = KeySpace::new("sfu", "hammer", "main").unwrap();
    let me = "cpp-hammer";
    // Default timings: pins live 90 s, so they can be checked after the host exits.
    let mut h = Host::spawn(
        host(),
        me,
        &[
            "--redis-url",
            &url,
            "--stage",
            "hammer",
            "--instance",
            me,
            "--rooms",
            "h0",
            "--peers",
            "1",
            "--hammer",
            "8",
            "--ops",
            "60",
            "--run-ms",
            "0",
        ],
    );
    let line = h.line(LONG, "hammer result", |l| l.starts_with("hammer "));
    assert!(line.starts_with("hammer ok "), "{line}\n{}", h.transcript());
    assert_eq!(h.exit_code(LONG), Some(0), "{}", h.transcript());
    let field = |name: &str| -> usize {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name}= in {line:?}"))
    };
    let (ops, rooms, kept) = (field("ops"), field("rooms"), field("kept"));
    assert_eq!(ops, 480);
    // 8 threads x 4 own rooms + 1 shared; every other op's peer was removed again.
    assert_eq!(rooms, 33);
    assert_eq!(kept, 240);
    let stats = h
        .seen
        .iter()
        .find(|l| l.starts_with("stats "))
        .expect("stats line")
        .clone();
    assert!(
        stats.contains(&format!("rooms={}", rooms + 1))
            && stats.contains(&format!("peers={}", kept + 1)),
        "{stats}"
    );

    // Redis agrees: every hammer room pinned by this instance, exactly the kept peers' records,
    // each naming this instance, and a room index that reaches them (key schema version 2:
    // every record naming the instance lies in a room of its room index).
    let owners = server.keys("sfu:hammer:main:room:{hammer-*}:owner");
    assert_eq!(owners.len(), rooms, "{owners:#?}");
    for k in &owners {
        assert_eq!(get(&server, k).as_deref(), Some(me), "{k}");
    }
    let records = server.keys("sfu:hammer:main:room:{hammer-*}:peer:*");
    assert_eq!(records.len(), kept, "{records:#?}");
    let mut con = server.con();
    for k in &records {
        let instance: Option<String> = redis::cmd("HGET")
            .arg(k)
            .arg("instance")
            .query(&mut con)
            .unwrap();
        assert_eq!(instance.as_deref(), Some(me), "{k}");
    }
    let indexed_rooms: std::collections::BTreeSet<String> = redis::cmd("SMEMBERS")
        .arg(ks.instance_rooms(me))
        .query(&mut con)
        .unwrap();
    assert_eq!(indexed_rooms.len(), rooms + 1, "room index of {me}");
    // Every record naming this instance (the kept ones and the host's own peer in h0) lies in
    // a room of its room index.
    let mine = support::records_of(&ks, &server.dump("sfu:hammer:*"), me);
    assert_eq!(mine.len(), kept + 1, "records naming {me}: {mine:?}");
    let unreached: Vec<&(String, String)> = mine
        .iter()
        .filter(|(room, _)| !indexed_rooms.contains(room))
        .collect();
    assert!(
        unreached.is_empty(),
        "records of {me} in rooms its room index does not list: {unreached:?}"
    );
    let shared: usize = redis::cmd("SCARD")
        .arg(ks.room("hammer-shared").peers)
        .query(&mut con)
        .unwrap();
    // The shared room got ops 0, 3, 6, ... of every thread (20 each); the even ones were kept.
    assert_eq!(shared, 8 * 10, "peers of the shared room");
    assert!(
        server.index_problems(&ks).is_empty(),
        "{:#?}",
        server.index_problems(&ks)
    );
}

/// Timings slow enough for valgrind's slowdown (500 ms heartbeat, 2 s command timeout).
const VALGRIND_TIMINGS: [&str; 18] = [
    "--set",
    "heartbeat_interval_ms=500",
    "--set",
    "heartbeat_ttl_ms=3000",
    "--set",
    "stale_threshold_ms=4500",
    "--set",
    "pin_ttl_ms=9000",
    "--set",
    "lease_ttl_ms=9000",
    "--set",
    "lease_refresh_ms=3000",
    "--set",
    "two_phase_delay_ms=6000",
    "--set",
    "reap_interval_ms=1500",
    "--set",
    "command_timeout_ms=2000",
];

#[test]
fn example_host_under_valgrind() {
    let exe = host();
    let server = Server::start();
    let url = server.url();

    // With Redis: event callback, rooms, peers, 8 hammer threads, stop.
    let args = [
        &["--redis-url", &url, "--stage", "vg", "--instance", "cpp-vg"][..],
        &VALGRIND_TIMINGS[..],
        &[
            "--rooms", "v1,v2", "--peers", "2", "--hammer", "8", "--ops", "12", "--run-ms", "1500",
        ],
    ]
    .concat();
    let r = run(exe, &args, true, &[]);
    assert!(
        r.output.status.success()
            && r.stdout().contains("hammer ok")
            && r.stdout().contains("\"event\":\"stopped\""),
        "{}",
        r.describe()
    );
    assert_metrics_agree_with_stats(&r);
    assert_memcheck_clean("sfu_host (Redis, callback)", &r);

    // Memory-only, polling for events, leaving at the end.
    let r = run(
        exe,
        &[
            "--rooms", "m1,m2", "--peers", "3", "--hammer", "8", "--ops", "12", "--run-ms", "300",
            "--poll", "--leave",
        ],
        true,
        &[],
    );
    assert!(
        r.output.status.success()
            && r.stdout().contains("hammer ok")
            && r.stdout().contains("\"event\":\"stopped\""),
        "{}",
        r.describe()
    );
    assert_memcheck_clean("sfu_host (memory-only, polling)", &r);
}

/// The host printed `health ok` and `metrics sfu_redis_rooms N` / `metrics sfu_redis_peers
/// N` lines (from `Node::metrics()`, the C API's text) that agree with its `stats` line.
fn assert_metrics_agree_with_stats(r: &ffi_support::Run) {
    let out = r.stdout();
    let stat = |key: &str| {
        out.lines()
            .find(|l| l.contains("stats "))
            .and_then(|l| l.split_whitespace().find_map(|w| w.strip_prefix(key)))
            .map(str::to_owned)
    };
    let metric = |name: &str| {
        out.lines()
            .find_map(|l| {
                l.split_once(&format!("metrics {name} "))
                    .map(|(_, v)| v.trim())
            })
            .map(str::to_owned)
    };
    assert!(
        out.contains("health ok: last heartbeat"),
        "{}",
        r.describe()
    );
    assert!(stat("rooms=").is_some(), "{}", r.describe());
    assert_eq!(
        metric("sfu_redis_rooms"),
        stat("rooms="),
        "{}",
        r.describe()
    );
    assert_eq!(
        metric("sfu_redis_peers"),
        stat("peers="),
        "{}",
        r.describe()
    );
}

#[test]
fn example_host_links_statically() {
    // The static-link line of docs/src/c/install.md: libsfu_redis.a plus -lpthread -ldl -lm.
    let exe = build_static(
        "g++",
        "sfu_host_static",
        &[root().join("examples/cpp/sfu_host.cpp")],
        &["-std=c++17"],
    );
    let r = run(
        &exe,
        &["--rooms", "s1", "--peers", "2", "--run-ms", "0", "--poll"],
        false,
        &[],
    );
    assert!(
        r.output.status.success()
            && r.stdout().contains("peer s1 s1-p2")
            && r.stdout().contains("\"event\":\"stopped\""),
        "{}",
        r.describe()
    );
}

#[test]
fn readme_cpp_example_builds_and_runs() {
    // The program of the README's "C and C++" section, pointed at a private server.
    let readme = std::fs::read_to_string(root().join("../README.md")).unwrap();
    let section = readme
        .split("\n## C and C++\n")
        .nth(1)
        .expect("README has a C and C++ section");
    let code = section
        .split("```cpp\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("a ```cpp block in the C and C++ section");
    let server = Server::start();
    let code = code.replace("redis://127.0.0.1:6379", &server.url());
    let src = ffi_support::out_dir().join("readme_example.cpp");
    std::fs::write(&src, code).unwrap();
    let exe = build("g++", "readme_example", &[src], &["-std=c++17"]);
    let r = run(&exe, &[], false, &[]);
    let out = r.stdout();
    assert!(
        r.output.status.success()
            && out.contains("\"event\":\"ready\"")
            && out.contains("\"event\":\"stopped\""),
        "{}",
        r.describe()
    );
    // It owned room-42 (no redirect printed), and leave() closed it with its peers and
    // unregistered: nothing of the stage is left.
    assert!(!out.contains("redirect the client"), "{}", r.describe());
    let ks = KeySpace::new("sfu", "dev", "main").unwrap();
    assert_eq!(get(&server, &ks.room("room-42").owner), None);
    let left: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}:room:*", ks.prefix()))
        .query(&mut server.con())
        .unwrap();
    assert!(left.is_empty(), "left behind: {left:?}");
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg(ks.heartbeats())
        .arg(0)
        .arg(-1)
        .query(&mut server.con())
        .unwrap();
    assert!(members.is_empty(), "still registered: {members:?}");
}

/// The C++ host with the TLS and sentinel keys (`--set key=value` is `sfu_config_set`): a
/// TLS-only sentinel group with passwords on the data nodes and on the sentinels.
#[test]
fn example_host_over_tls_through_sentinels() {
    use sfu_redis_testkit::sentinel::{SentinelGroup, SentinelOptions};
    let certs = std::sync::Arc::new(
        sfu_redis_testkit::tls::TestCerts::generate().expect("generate test certificates"),
    );
    let group = SentinelGroup::start(SentinelOptions {
        tls: Some(certs.clone()),
        master_password: Some("cpp-m-pw".into()),
        sentinel_password: Some("cpp-s-pw".into()),
        ..SentinelOptions::default()
    })
    .expect("start a TLS sentinel group");
    let url = group.url();
    let ca = format!("tls_ca_file={}", certs.ca().display());
    let r = run(
        host(),
        &[
            "--redis-url",
            &url,
            "--set",
            &ca,
            "--set",
            "sentinel_password=cpp-s-pw",
            "--stage",
            "cpp-tls",
            "--instance",
            "cpp-tls",
            "--timings",
            "fast",
            "--rooms",
            "t1",
            "--peers",
            "1",
            "--run-ms",
            "1500",
        ],
        false,
        &[],
    );
    let out = r.stdout();
    assert!(
        r.output.status.success()
            && out.contains("pinned t1 pinned")
            && out.contains("\"event\":\"ready\"")
            && out.contains("\"event\":\"stopped\""),
        "{}",
        r.describe()
    );
    for secret in ["cpp-m-pw", "cpp-s-pw"] {
        assert!(!r.describe().contains(secret), "{}", r.describe());
    }
}

/// The C++ host on a Redis Cluster (`redis+cluster://` in `redis_url`): its rooms and peers
/// land on the masters of their slots, the host stops cleanly, and the cluster then holds its
/// rooms (read back through the library's cluster connection).
#[test]
fn example_host_on_a_redis_cluster() {
    let server = Server::cluster(3, 0);
    let r = run(
        host(),
        &[
            "--redis-url",
            &server.url(),
            "--stage",
            "cpp-cluster",
            "--instance",
            "cpp-cluster",
            "--timings",
            "fast",
            "--rooms",
            "c1,c2,c3,c4",
            "--peers",
            "2",
            "--run-ms",
            "1500",
        ],
        false,
        &[],
    );
    let out = r.stdout();
    assert!(
        r.output.status.success()
            && out.contains("pinned c1 pinned")
            && out.contains("pinned c4 pinned")
            && out.contains("\"event\":\"ready\"")
            && out.contains("\"event\":\"stopped\""),
        "{}",
        r.describe()
    );
    let ks = KeySpace::new("sfu", "cpp-cluster", "main").unwrap();
    for room in ["c1", "c2", "c3", "c4"] {
        let meta: Option<String> = redis::cmd("HGET")
            .arg(ks.room(room).meta)
            .arg("owner")
            .query(&mut server.con())
            .unwrap();
        assert_eq!(meta.as_deref(), Some("cpp-cluster"), "room {room}");
    }
}
