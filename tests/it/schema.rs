//! The key schema version (`P:{ctl}:schema`, docs/DESIGN.md "Schema version"): a node stamps
//! a prefix that has none, refuses to register on one stamped with another version (writing
//! nothing), keeps heartbeating when the stamp changes under it, stamps again after Redis lost
//! its data; `status`, `doctor` and `sfu-redis migrate` read it; `migrate` brings a prefix
//! written before versions existed to this release's version while a node runs on it.

use std::process::Output;
use std::time::Duration;

use serde_json::Value;
use sfu_redis::{ErrorKind, Node, SCHEMA_VERSION};

use crate::support::{self, *};

const LONG: Duration = Duration::from_secs(30);

fn cli(sub: &str, s: &Server, stage: &str, args: &[&str]) -> Output {
    support::procs::cli_output(sub, stage, &s.url(), args)
}

fn text(o: &Output) -> String {
    support::procs::output_text(o)
}

fn json_of(o: &Output) -> Value {
    let out = String::from_utf8_lossy(&o.stdout);
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {}", text(o)))
}

fn stamp(s: &Server, stage: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(ks(stage).schema())
        .query(&mut s.con())
        .expect("GET schema")
}

fn set_stamp(s: &Server, stage: &str, v: &str) {
    let _: () = redis::cmd("SET")
        .arg(ks(stage).schema())
        .arg(v)
        .query(&mut s.con())
        .expect("SET schema");
}

// A node stamps a new prefix with this release's version. On a prefix stamped "2" a node's
// start fails with ErrorKind::Schema, naming both versions, and writes nothing of the
// instance (no heartbeat entry, key or record); the stamp stays "2". `status` shows the stamp
// and a problem, `doctor`'s schema check fails (exit 1), `migrate` refuses (exit 1) and writes
// nothing.
#[test]
fn a_node_stamps_a_new_prefix_and_refuses_one_in_another_version() {
    let s = Server::start();
    assert_eq!(stamp(&s, "schema-new"), None);
    let a = s.node("schema-new", "sa");
    assert_eq!(
        stamp(&s, "schema-new").as_deref(),
        Some(SCHEMA_VERSION.to_string().as_str())
    );
    let o = cli("status", &s, "schema-new", &["--json"]);
    assert_eq!(
        json_of(&o)["schema"],
        SCHEMA_VERSION.to_string(),
        "{}",
        text(&o)
    );
    a.leave().unwrap();

    let stage = "schema-two";
    set_stamp(&s, stage, "2");
    let e = match Node::start(s.config(stage, "sb")) {
        Ok(_) => panic!("a node registered on a prefix of schema version 2"),
        Err(e) => e,
    };
    assert_eq!(e.kind(), ErrorKind::Schema, "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("\"2\"") && msg.contains("speaks version 1"),
        "{msg}"
    );
    assert!(msg.contains(&format!("sfu:{stage}:main")), "{msg}");
    let keys = s.keys(&format!("sfu:{stage}:*"));
    assert_eq!(
        keys,
        vec![ks(stage).schema()],
        "the refused start wrote keys"
    );
    assert_eq!(stamp(&s, stage).as_deref(), Some("2"));

    let o = cli("status", &s, stage, &["--json"]);
    let st = json_of(&o);
    assert_eq!(st["schema"], "2", "{st}");
    let problems = st["problems"].to_string();
    assert!(problems.contains("schema version \\\"2\\\""), "{st}");

    let o = cli("doctor", &s, stage, &["--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let r = json_of(&o);
    let check = r["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "schema")
        .unwrap_or_else(|| panic!("no schema check: {r}"))
        .clone();
    assert_eq!(check["status"], "fail", "{check}");
    assert!(
        check["detail"].as_str().unwrap().contains("\"2\""),
        "{check}"
    );

    for mode in ["--dry-run", "--apply"] {
        let o = cli("migrate", &s, stage, &[mode]);
        assert_eq!(o.status.code(), Some(1), "{mode}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("speaks version 1"),
            "{}",
            text(&o)
        );
        assert_eq!(stamp(&s, stage).as_deref(), Some("2"));
    }
    // Not a version at all: refused the same way.
    set_stamp(&s, stage, "one");
    let e = Node::start(s.config(stage, "sb")).expect_err("refused");
    assert_eq!(e.kind(), ErrorKind::Schema, "{e}");
    assert_eq!(
        cli("migrate", &s, stage, &["--apply"]).status.code(),
        Some(1)
    );
}

// A prefix as a release before versions left it: a node's rooms and peers, its registration
// released by a clean stop, and no stamp. `migrate --dry-run` lists the one step and writes
// nothing; `--apply`, run while another node of the fleet is registered and ticking, stamps
// version 1 and keeps every key; a new node then joins the prefix. A second `--apply` has
// nothing to do.
#[test]
fn migrate_brings_a_prefix_written_before_versions_to_this_release_while_a_node_runs() {
    let s = Server::start();
    let stage = "schema-old";
    let a = s.node_with(stage, "old-a", quiet());
    a.pin_room("room-1").unwrap();
    a.upsert_peer("room-1", "peer-1", Some("guest-1"), &[("k", "v")])
        .unwrap();
    a.shutdown().unwrap();
    // What the previous release wrote carried no stamp.
    let _: () = redis::cmd("DEL")
        .arg(ks(stage).schema())
        .query(&mut s.con())
        .unwrap();
    let before = s.dump(&format!("sfu:{stage}:main:room:*"));
    assert!(!before.is_empty());

    let o = cli("migrate", &s, stage, &["--dry-run", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = json_of(&o);
    assert_eq!(r["found"], Value::Null, "{r}");
    assert_eq!(r["dry_run"], true, "{r}");
    assert_eq!(r["version_after"], Value::Null, "{r}");
    assert_eq!(r["steps"].as_array().map(Vec::len), Some(1), "{r}");
    assert_eq!(r["steps"][0]["from"], 0, "{r}");
    assert_eq!(r["steps"][0]["to"], 1, "{r}");
    assert_eq!(r["steps"][0]["done"], false, "{r}");
    assert_eq!(stamp(&s, stage), None, "a dry run wrote the stamp");

    // Another node of the fleet runs (registered on the unstamped prefix: it stamps it at
    // registration, as the previous release's nodes would not; delete the stamp again so
    // that migrate meets an unstamped prefix with a live node on it).
    let b = s.node_with(stage, "old-b", quiet());
    let _: () = redis::cmd("DEL")
        .arg(ks(stage).schema())
        .query(&mut s.con())
        .unwrap();
    let o = cli("migrate", &s, stage, &["--apply", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = json_of(&o);
    assert_eq!(r["dry_run"], false, "{r}");
    assert_eq!(r["steps"][0]["done"], true, "{r}");
    assert_eq!(r["version_after"], 1, "{r}");
    assert_eq!(stamp(&s, stage).as_deref(), Some("1"));
    assert_eq!(
        s.dump(&format!("sfu:{stage}:main:room:*")),
        before,
        "migrate changed a room"
    );
    b.heartbeat_now().expect("the running node still ticks");

    let o = cli("migrate", &s, stage, &["--apply"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("nothing to do"),
        "{}",
        text(&o)
    );

    let c = s.node_with(stage, "new-c", quiet());
    c.pin_room("room-2").unwrap();
    assert_eq!(
        s.dump(&format!("sfu:{stage}:main:room:{{room-1}}:*")).len(),
        before.len()
    );
    c.leave().unwrap();
    b.leave().unwrap();
}

// The stamp changes under a running node (a migration it does not speak): the node keeps
// heartbeating (its rooms stay alive) and leaves the stamp alone. When the stamp is lost with
// Redis's data, the next tick writes it again.
#[test]
fn a_running_node_keeps_heartbeating_under_a_new_stamp_and_stamps_again_after_data_loss() {
    let s = Server::start_with(&[]); // one server: FLUSHALL
    let stage = "schema-run";
    let a = s.node_with(stage, "run-a", quiet());
    a.pin_room("room-r").unwrap();
    set_stamp(&s, stage, "7");
    let score = |s: &Server| -> i64 {
        redis::cmd("ZSCORE")
            .arg(ks(stage).heartbeats())
            .arg("run-a")
            .query::<Option<i64>>(&mut s.con())
            .unwrap()
            .unwrap_or(0)
    };
    let first = score(&s);
    a.heartbeat_now().expect("a tick under another stamp");
    wait_for(LONG, "a later heartbeat", || {
        (score(&s) > first).then_some(())
    });
    assert_eq!(stamp(&s, stage).as_deref(), Some("7"));
    assert_eq!(
        a.pin_room("room-r").unwrap(),
        sfu_redis::PinOutcome::AlreadyOurs
    );

    set_stamp(&s, stage, "1");
    let _: () = redis::cmd("FLUSHALL").query(&mut s.raw_con()).unwrap();
    a.heartbeat_now().ok();
    wait_for(LONG, "the stamp written again", || {
        (stamp(&s, stage).as_deref() == Some("1")).then_some(())
    });
    a.leave().unwrap();
}

fn in_zset(s: &Server, stage: &str, id: &str) -> bool {
    redis::cmd("ZSCORE")
        .arg(ks(stage).heartbeats())
        .arg(id)
        .query::<Option<f64>>(&mut s.con())
        .unwrap()
        .is_some()
}

// A running node is reaped (its sorted-set entry removed, as a leader's reap does) while the
// prefix is stamped "2": it reports itself reaped once, its registration is refused, and it is
// parked: no heartbeat entry, no lease, no epoch written, host calls fail with
// ErrorKind::Schema. When the stamp names its version again it registers as a fresh life and
// pins again.
#[test]
fn a_node_refused_after_a_reap_is_parked_until_the_stamp_names_its_version() {
    let s = Server::start();
    let stage = "schema-park";
    let a = s.node(stage, "park-a");
    let mut log = EventLog::new(&a);
    a.pin_room("room-p").unwrap();
    wait_for(LONG, "leadership", || a.is_leader().then_some(()));
    set_stamp(&s, stage, "2");
    let _: () = redis::cmd("ZREM")
        .arg(ks(stage).heartbeats())
        .arg("park-a")
        .query(&mut s.con())
        .unwrap();
    log.wait(LONG, "reaped_self", |e| {
        matches!(e, sfu_redis::Event::ReapedSelf { .. })
    });
    log.drain();
    let mark = log.mark();
    wait_for(LONG, "a refused host call", || match a.pin_room("room-q") {
        Err(e) if e.kind() == ErrorKind::Schema => Some(()),
        _ => None,
    });
    let epoch = |s: &Server| -> Option<String> {
        redis::cmd("GET")
            .arg(ks(stage).epoch())
            .query(&mut s.con())
            .unwrap()
    };
    let epoch_then = epoch(&s);
    // Many ticks and lease rounds later: still nothing written.
    std::thread::sleep(Duration::from_secs(3));
    assert!(!in_zset(&s, stage, "park-a"), "a parked node heartbeated");
    assert!(!a.is_leader());
    let leader: Option<String> = redis::cmd("GET")
        .arg(ks(stage).leader())
        .query(&mut s.con())
        .unwrap();
    assert_eq!(leader, None, "a parked node took the lease");
    assert_eq!(epoch(&s), epoch_then, "a parked node raised the epoch");
    let reaped_selves = log
        .since(mark)
        .iter()
        .filter(|e| matches!(e, sfu_redis::Event::ReapedSelf { .. }))
        .count();
    assert_eq!(reaped_selves, 0, "reaped_self reported again while parked");
    assert_eq!(stamp(&s, stage).as_deref(), Some("2"));

    set_stamp(&s, stage, "1");
    wait_for(LONG, "registered again", || {
        in_zset(&s, stage, "park-a").then_some(())
    });
    wait_for(LONG, "a pin", || a.pin_room("room-q").ok());
    a.leave().unwrap();
}

// Redis loses its data and the prefix is stamped "2" before the node's next tick: the node
// does not restore anything (the tick that would re-register is refused), reports its rooms
// lost, and writes nothing under the prefix but what was there.
#[test]
fn a_node_does_not_restore_into_a_prefix_of_another_version() {
    let s = Server::start_with(&[]); // one server: FLUSHALL
    let stage = "schema-loss";
    let a = s.node(stage, "loss-a");
    let mut log = EventLog::new(&a);
    a.pin_room("room-l").unwrap();
    a.upsert_peer("room-l", "peer-l", None, &[]).unwrap();
    let mut con = s.raw_con();
    let _: () = redis::pipe()
        .atomic()
        .cmd("FLUSHALL")
        .cmd("SET")
        .arg(ks(stage).schema())
        .arg("2")
        .query(&mut con)
        .unwrap();
    log.wait(
        LONG,
        "room_lost",
        |e| matches!(e, sfu_redis::Event::RoomLost { room, new_owner: None } if room == "room-l"),
    );
    std::thread::sleep(Duration::from_secs(2));
    let keys = s.keys(&format!("{}:*", ks(stage).prefix()));
    assert_eq!(keys, vec![ks(stage).schema()], "a refused node wrote keys");
    let e = a.upsert_peer("room-l", "peer-m", None, &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Schema, "{e}");
    a.leave().ok();
}

// Stamps an operator might leave: bytes that are not UTF-8, a version written another way
// ("01"), a huge value. A running node keeps ticking and refreshing its pins under each; a new
// node is refused with ErrorKind::Schema; migrate refuses (exit 1); status stays short.
#[test]
fn odd_stamps_are_refused_clearly_and_never_stop_a_running_node() {
    let s = Server::start();
    let stage = "schema-odd";
    let a = s.node(stage, "odd-a");
    a.pin_room("room-o").unwrap();
    let pin_ttl = |s: &Server| -> i64 {
        redis::cmd("PTTL")
            .arg(ks(stage).room("room-o").owner)
            .query(&mut s.con())
            .unwrap()
    };
    let huge = "9".repeat(1_000_000);
    for bad in [b"\xff\xfe".to_vec(), b"01".to_vec(), huge.into_bytes()] {
        let _: () = redis::cmd("SET")
            .arg(ks(stage).schema())
            .arg(&bad)
            .query(&mut s.con())
            .unwrap();
        // Several fast ticks (200 ms) later the pin is still refreshed.
        for _ in 0..3 {
            a.heartbeat_now().expect("a tick under an odd stamp");
        }
        std::thread::sleep(Duration::from_millis(700));
        assert!(pin_ttl(&s) > 0, "the pin lapsed under an odd stamp");
        let e = Node::start(s.config(stage, "odd-b")).expect_err("refused");
        assert_eq!(e.kind(), ErrorKind::Schema, "{e}");
        assert!(e.to_string().len() < 600, "{} bytes", e.to_string().len());
        let o = cli("migrate", &s, stage, &["--dry-run"]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        let o = cli("status", &s, stage, &[]);
        assert!(
            o.stdout.len() < 20_000,
            "status printed {} bytes",
            o.stdout.len()
        );
    }
    a.leave().unwrap();
}
