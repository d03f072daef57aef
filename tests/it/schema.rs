//! The key schema version (`P:{ctl}:schema`, docs/DESIGN.md "Schema version"): a node stamps
//! a new prefix, refuses to register on one in another version (stamped, or unstamped beside
//! a dataset token: version 1) writing nothing, keeps heartbeating when the stamp changes
//! under it, stamps again after Redis lost its data; `status`, `doctor` and `sfu-redis
//! migrate` read it. `migrate` stamps a new prefix, and moves the previous release's prefix
//! (version 1, tests/fixtures/v1-prefix.json: written by that release's own nodes) to version
//! 2 once its fleet is stopped, refusing while an instance is live; a leader of this release
//! then reaps what the dead left.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Output;
use std::time::Duration;

use serde_json::Value;
use sfu_redis::keys::{decode_id, split_peer_member, KeySpace, ParsedKey};
use sfu_redis::{ErrorKind, Node, Timings, SCHEMA_VERSION};
use sfu_redis_testkit::fixture::{Fixture, Ttl};

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

// A node stamps a new prefix with this release's version. On a prefix stamped with a newer
// version a node's start fails with ErrorKind::Schema, naming both versions, and writes
// nothing of the instance (no heartbeat entry, key or record); the stamp stays. `status` shows
// the stamp and a problem, `doctor`'s schema check fails (exit 1), `migrate` refuses (exit 1)
// and writes nothing.
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

    let stage = "schema-newer";
    let newer = (SCHEMA_VERSION + 1).to_string();
    let quoted = format!("{newer:?}");
    let speaks = format!("speaks version {SCHEMA_VERSION}");
    set_stamp(&s, stage, &newer);
    let e = match Node::start(s.config(stage, "sb")) {
        Ok(_) => panic!("a node registered on a prefix of a newer schema version"),
        Err(e) => e,
    };
    assert_eq!(e.kind(), ErrorKind::Schema, "{e}");
    let msg = e.to_string();
    assert!(msg.contains(&quoted) && msg.contains(&speaks), "{msg}");
    assert!(msg.contains(&format!("sfu:{stage}:main")), "{msg}");
    let keys = s.keys(&format!("sfu:{stage}:*"));
    assert_eq!(
        keys,
        vec![ks(stage).schema()],
        "the refused start wrote keys"
    );
    assert_eq!(stamp(&s, stage), Some(newer.clone()));

    let o = cli("status", &s, stage, &["--json"]);
    let st = json_of(&o);
    assert_eq!(st["schema"], newer.as_str(), "{st}");
    let problems = st["problems"].to_string();
    assert!(
        problems.contains(&format!("schema version \\\"{newer}\\\"")),
        "{st}"
    );

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
        check["detail"].as_str().unwrap().contains(&quoted),
        "{check}"
    );

    for mode in ["--dry-run", "--apply"] {
        let o = cli("migrate", &s, stage, &[mode]);
        assert_eq!(o.status.code(), Some(1), "{mode}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(&speaks),
            "{}",
            text(&o)
        );
        assert_eq!(stamp(&s, stage), Some(newer.clone()));
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

// A new prefix (neither a stamp nor a dataset token): `migrate --dry-run` lists one step
// (from 0: stamp it with this release's version) and writes nothing; `--apply` stamps it, and
// a run on a prefix at this release's version has nothing to do, also while a node runs on
// it (no step, so no refusal). A running node whose stamp an operator deleted writes it back
// with its next tick (its dataset token alone would make the prefix read as version 1).
#[test]
fn migrate_stamps_a_new_prefix_and_a_running_node_writes_a_deleted_stamp_back() {
    let s = Server::start();
    let stage = "schema-new-migrate";
    let all = format!("{}:*", ks(stage).prefix());
    let o = cli("migrate", &s, stage, &["--dry-run", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = json_of(&o);
    assert_eq!(r["found"], Value::Null, "{r}");
    assert_eq!(r["version"], Value::Null, "{r}");
    assert_eq!(r["dry_run"], true, "{r}");
    assert_eq!(r["version_after"], Value::Null, "{r}");
    assert_eq!(r["steps"].as_array().map(Vec::len), Some(1), "{r}");
    assert_eq!(r["steps"][0]["from"], 0, "{r}");
    assert_eq!(r["steps"][0]["to"], SCHEMA_VERSION, "{r}");
    assert_eq!(r["steps"][0]["done"], false, "{r}");
    assert_eq!(r["steps"][0]["folds"], serde_json::json!([]), "{r}");
    assert_eq!(r["steps"][0]["delete"], serde_json::json!([]), "{r}");
    assert!(s.keys(&all).is_empty(), "a dry run wrote keys");

    let o = cli("migrate", &s, stage, &["--apply", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = json_of(&o);
    assert_eq!(r["dry_run"], false, "{r}");
    assert_eq!(r["steps"][0]["done"], true, "{r}");
    assert_eq!(r["version_after"], SCHEMA_VERSION, "{r}");
    assert_eq!(stamp(&s, stage), Some(SCHEMA_VERSION.to_string()));
    assert_eq!(s.keys(&all), vec![ks(stage).schema()]);

    let a = s.node(stage, "new-a");
    a.pin_room("room-1").unwrap();
    let o = cli("migrate", &s, stage, &["--apply"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("nothing to do"),
        "{}",
        text(&o)
    );

    let _: () = redis::cmd("DEL")
        .arg(ks(stage).schema())
        .query(&mut s.con())
        .unwrap();
    a.heartbeat_now().expect("a tick without a stamp");
    wait_for(LONG, "the stamp written back", || {
        (stamp(&s, stage) == Some(SCHEMA_VERSION.to_string())).then_some(())
    });
    assert_eq!(
        a.pin_room("room-1").unwrap(),
        sfu_redis::PinOutcome::AlreadyOurs
    );
    a.leave().unwrap();
}

/// The prefix the previous release (key schema version 1, commit e7f26df) left, written by its
/// own node processes: tests/fixtures/README.md says how and what it holds.
const V1_PREFIX: &str = include_str!("../fixtures/v1-prefix.json");
/// The fixture's stage (`sfu:v1fix:main`).
const V1_STAGE: &str = "v1fix";

/// Loads the fixture into `s` frozen (no key expires: a test removes what it wants gone).
fn load_v1(s: &Server) -> Fixture {
    let f = Fixture::parse(V1_PREFIX).expect("tests/fixtures/v1-prefix.json parses");
    assert_eq!(f.prefix, ks(V1_STAGE).prefix());
    f.load(&mut s.con(), Ttl::Frozen).expect("load the fixture");
    f
}

fn set_key(s: &Server, key: &str, value: &str) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query(&mut s.con())
        .unwrap();
}

fn del_key(s: &Server, key: &str) {
    let _: () = redis::cmd("DEL").arg(key).query(&mut s.con()).unwrap();
}

/// The room of a version 1 peer index member as `sfu-redis migrate` folds it: `<room>/<peer>`
/// with both ids in wire form, else `None` (skipped).
fn foldable_room(member: &str) -> Option<String> {
    let (room, peer) = split_peer_member(member)?;
    (decode_id(room).is_ok() && decode_id(peer).is_ok()).then(|| room.to_owned())
}

/// What `dump` (a version 1 prefix) becomes by step 1 -> 2, worked out from the dump alone:
/// each peer index's foldable rooms added to the room index beside it, the peer indexes gone,
/// the stamp "2", nothing else changed.
fn migrated(ks: &KeySpace, dump: &BTreeMap<String, Val>) -> BTreeMap<String, Val> {
    let mut after = dump.clone();
    for (key, val) in dump {
        let into = match ks.parse(key) {
            Some(ParsedKey::V1InstancePeers(i)) => ks.instance_rooms(&i),
            Some(ParsedKey::V1InstanceReapingPeers(i)) => ks.instance_reaping_rooms(&i),
            _ => continue,
        };
        after.remove(key);
        let Val::Set(members) = val else { continue };
        let rooms: BTreeSet<String> = members.iter().filter_map(|m| foldable_room(m)).collect();
        if rooms.is_empty() {
            continue;
        }
        match after
            .entry(into.clone())
            .or_insert_with(|| Val::Set(BTreeSet::new()))
        {
            Val::Set(s) => s.extend(rooms),
            other => panic!("{into} holds {other:?}"),
        }
    }
    after.insert(ks.schema(), Val::Str("2".into()));
    after
}

/// The version 1 peer indexes among `keys`.
fn v1_keys<'a>(ks: &KeySpace, keys: impl IntoIterator<Item = &'a String>) -> Vec<String> {
    keys.into_iter()
        .filter(|k| {
            matches!(
                ks.parse(k),
                Some(ParsedKey::V1InstancePeers(_) | ParsedKey::V1InstanceReapingPeers(_))
            )
        })
        .cloned()
        .collect()
}

/// A JSON array of strings as a set.
fn strings(v: &Value) -> BTreeSet<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("{v} is not an array"))
        .iter()
        .map(|s| s.as_str().unwrap_or_else(|| panic!("{s}")).to_owned())
        .collect()
}

fn set_of(dump: &BTreeMap<String, Val>, key: &str) -> BTreeSet<String> {
    match dump.get(key) {
        Some(Val::Set(s)) => s.clone(),
        other => panic!("{key}: {other:?}"),
    }
}

/// The keys of `dump` whose names contain one of `parts`, with their contents.
fn keys_with(dump: &BTreeMap<String, Val>, parts: &[&str]) -> BTreeMap<String, Val> {
    dump.iter()
        .filter(|(k, _)| parts.iter().any(|p| k.contains(p)))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

// The previous release's prefix (tests/fixtures/v1-prefix.json, written by that release's own
// nodes: a registered node-a killed during a reap of it that its leader node-l did not finish
// because node-l was killed too, node-a's record left in room `shared` after node-b took the
// room over, node-b still running at the dump), its fleet stopped since: the lease lapsed and
// node-b stopped cleanly (its heartbeat key holds `released` until it expires).
//
// A node of this release refuses the prefix (stamped "1", and unstamped beside its dataset
// token alike) with ErrorKind::Schema naming version 1 and `sfu-redis migrate --apply`,
// writing nothing. `migrate --dry-run` lists the plan (each peer index, the rooms it adds:
// `shared` for node-a's moved index) and writes nothing. `--apply` folds the peer indexes
// into the room indexes, deletes them and stamps "2", changing nothing else; every record
// naming an instance is then in a room of that instance's room index. A second run has
// nothing to do. A leader of this release then reaps node-a (resuming the interrupted reap)
// and node-l: nothing refers to them any more, and node-a's record in `shared` is gone while
// node-b's room and record stay as they were (node-b is not reaped while its heartbeat key
// holds `released`). Once that key expires node-b is reaped too and nothing of the fixture is
// left.
#[test]
fn migrate_moves_the_previous_releases_prefix_to_version_2_and_a_leader_then_reaps_it() {
    let s = Server::start();
    let f = load_v1(&s);
    let ks = ks(V1_STAGE);
    let all = ks.scan_pattern();
    let loaded = s.dump(&all);
    // What the scenario left (tests/fixtures/README.md); a fixture made again must hold it.
    let a_moved_peers = set_of(&loaded, &ks.v1_instance_reaping_peers("node-a"));
    assert!(
        a_moved_peers.contains("shared/shared-p2"),
        "{a_moved_peers:?}"
    );
    let a_moved_rooms = set_of(&loaded, &ks.instance_reaping_rooms("node-a"));
    assert!(!a_moved_rooms.contains("shared"), "{a_moved_rooms:?}");
    assert!(loaded.contains_key(&ks.instance_reaping("node-a")));
    assert!(!loaded.contains_key(&ks.instance_rooms("node-a")));
    assert!(!loaded.contains_key(&ks.heartbeat("node-a")));
    assert!(!loaded.contains_key(&ks.heartbeat("node-l")));
    assert!(loaded.contains_key(&ks.v1_instance_peers("node-l")));
    assert!(matches!(loaded.get(&ks.heartbeat("node-b")), Some(Val::Str(t)) if t != "released"));
    assert_eq!(
        loaded.get(&ks.room("shared").owner),
        Some(&Val::Str("node-b".into()))
    );
    let shared_p2 = ks.peer("shared", "shared-p2");
    assert!(
        matches!(loaded.get(&shared_p2), Some(Val::Hash(h)) if h["instance"] == "node-a"),
        "{:?}",
        loaded.get(&shared_p2)
    );
    assert_eq!(
        loaded.get(&ks.schema()),
        Some(&Val::Str("1".into())),
        "the previous release stamps version 1"
    );
    // Its times are in this server's past (a fixture from this machine's clock).
    let now = s.server_ms();
    assert!(
        f.keys.iter().any(|k| k.key == ks.heartbeats()),
        "no heartbeats in the fixture"
    );
    if let Some(Val::ZSet(z)) = loaded.get(&ks.heartbeats()) {
        for (i, score) in z {
            assert!(
                *score < now,
                "{i}'s heartbeat {score} is not before now {now}"
            );
        }
    }

    // The fleet stopped: the lease lapsed, node-b stopped cleanly.
    del_key(&s, &ks.leader());
    set_key(&s, &ks.heartbeat("node-b"), "released");
    let stamped = s.dump(&all);
    for unstamped in [false, true] {
        if unstamped {
            del_key(&s, &ks.schema());
        }
        let before = s.dump(&all);
        let e = match Node::start(s.config(V1_STAGE, "node-v2")) {
            Ok(_) => panic!("a node of this release registered on a version 1 prefix"),
            Err(e) => e,
        };
        assert_eq!(e.kind(), ErrorKind::Schema, "{e}");
        let msg = e.to_string();
        for part in [
            "\"1\"",
            &format!("speaks version {SCHEMA_VERSION}"),
            "sfu-redis migrate --apply",
            "fleet stopped",
            "sfu:v1fix:main",
        ] {
            assert!(msg.contains(part), "{part:?} not in {msg}");
        }
        assert_eq!(
            s.dump(&all),
            before,
            "a refused start wrote (unstamped {unstamped})"
        );
    }
    let mut before = stamped.clone();
    before.remove(&ks.schema());
    assert_eq!(s.dump(&all), before);

    // The plan, from an unstamped prefix with a dataset token: version 1.
    let o = cli("migrate", &s, V1_STAGE, &["--dry-run", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = json_of(&o);
    assert_eq!(r["found"], Value::Null, "{r}");
    assert_eq!(r["version"], 1, "{r}");
    assert_eq!(r["speaks"], SCHEMA_VERSION, "{r}");
    assert_eq!(r["dry_run"], true, "{r}");
    assert_eq!(r["version_after"], 1, "{r}");
    assert_eq!(r["steps"].as_array().map(Vec::len), Some(1), "{r}");
    let step = &r["steps"][0];
    assert_eq!(
        (step["from"].clone(), step["to"].clone()),
        (1.into(), 2.into()),
        "{r}"
    );
    assert_eq!(step["done"], false, "{r}");
    let v1 = v1_keys(&ks, before.keys());
    assert_eq!(v1.len(), 3, "{v1:?}");
    assert_eq!(
        strings(&step["delete"]),
        v1.iter().cloned().collect::<BTreeSet<_>>(),
        "{r}"
    );
    let folds = step["folds"].as_array().expect("folds");
    assert_eq!(folds.len(), v1.len(), "{r}");
    for key in &v1 {
        let fold = folds
            .iter()
            .find(|f| f["from_key"] == key.as_str())
            .unwrap_or_else(|| panic!("no fold of {key}: {r}"));
        let members = set_of(&before, key);
        let rooms: BTreeSet<String> = members.iter().filter_map(|m| foldable_room(m)).collect();
        let into = fold["into_key"].as_str().unwrap();
        let held = match before.get(into) {
            Some(Val::Set(s)) => s.clone(),
            _ => BTreeSet::new(),
        };
        let new: BTreeSet<String> = rooms.difference(&held).cloned().collect();
        assert_eq!(fold["members"], members.len(), "{fold}");
        assert_eq!(fold["rooms"], rooms.len(), "{fold}");
        assert_eq!(fold["new_rooms"], new.len(), "{fold}");
        assert_eq!(strings(&fold["new_room_ids"]), new, "{fold}");
        assert_eq!(fold["skipped"], 0, "{fold}");
        assert_eq!(fold["not_a_set"], Value::Null, "{fold}");
    }
    let a = folds
        .iter()
        .find(|f| f["instance"] == "node-a")
        .unwrap_or_else(|| panic!("no fold of node-a: {r}"));
    assert_eq!(a["from_key"], ks.v1_instance_reaping_peers("node-a"), "{a}");
    assert_eq!(a["into_key"], ks.instance_reaping_rooms("node-a"), "{a}");
    assert_eq!(a["new_room_ids"], serde_json::json!(["shared"]), "{a}");
    assert_eq!(s.dump(&all), before, "a dry run wrote");
    let o = cli("migrate", &s, V1_STAGE, &["--dry-run"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for part in [
        "1 -> 2",
        "[would run]",
        "shared",
        "to delete 3 keys",
        "dry run: nothing written",
    ] {
        assert!(out.contains(part), "{part:?}: {}", text(&o));
    }
    assert_eq!(s.dump(&all), before, "a dry run wrote");

    // The step.
    let o = cli("migrate", &s, V1_STAGE, &["--apply", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = json_of(&o);
    assert_eq!(r["dry_run"], false, "{r}");
    assert_eq!(r["steps"][0]["done"], true, "{r}");
    assert_eq!(r["version_after"], 2, "{r}");
    let after = s.dump(&all);
    assert!(v1_keys(&ks, after.keys()).is_empty(), "{after:?}");
    assert_eq!(
        after,
        migrated(&ks, &before),
        "apply changed more (or less) than the fold"
    );
    assert!(set_of(&after, &ks.instance_reaping_rooms("node-a")).contains("shared"));
    let unreached = unreached_records(&ks, &after);
    assert!(unreached.is_empty(), "{unreached:#?}");
    let o = cli("migrate", &s, V1_STAGE, &["--apply"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("nothing to do"),
        "{}",
        text(&o)
    );
    assert_eq!(s.dump(&all), after);

    // A leader of this release reaps the dead.
    let (leader, mut log) = s.leader(V1_STAGE, "node-v2", Timings::fast());
    let dead = ["node-a".to_owned(), "node-l".to_owned()];
    for d in &dead {
        log.wait(LONG, "instance_reaped", |e| reaped(e, d));
    }
    let room_keys = |dump: &BTreeMap<String, Val>, rooms: &[&str]| {
        let parts: Vec<String> = rooms.iter().map(|r| format!(":room:{{{r}}}:")).collect();
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        keys_with(dump, &parts)
    };
    let gone = ["a1", "a2", "a3", "l1", "l2"];
    wait_for(LONG, "nothing left of node-a and node-l", || {
        let d = s.dump(&all);
        (references(&d, &dead).is_empty() && room_keys(&d, &gone).is_empty()).then_some(())
    });
    let now = s.dump(&all);
    // node-b's rooms as they were but for node-a's record (and its guest) in `shared`.
    let mut kept = room_keys(&after, &["shared", "b1"]);
    kept.remove(&shared_p2);
    let shared = ks.room("shared");
    kept.insert(
        shared.peers.clone(),
        Val::Set(["shared-p1".to_owned()].into()),
    );
    match kept.get_mut(&shared.guests) {
        Some(Val::Hash(h)) => {
            assert_eq!(h.remove("shared-g2").as_deref(), Some("shared-p2"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(room_keys(&now, &["shared", "b1"]), kept);
    assert_eq!(
        keys_with(&now, &[":node-b:"]),
        keys_with(&after, &[":node-b:"]),
        "node-b's indexes and record changed"
    );
    let unreached = unreached_records(&ks, &now);
    assert!(unreached.is_empty(), "{unreached:#?}");

    // node-b's heartbeat key expires: it is reaped too.
    del_key(&s, &ks.heartbeat("node-b"));
    log.wait(LONG, "node-b reaped", |e| reaped(e, "node-b"));
    let fixture_ids: Vec<String> = ["node-a", "node-l", "node-b"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    wait_for(LONG, "nothing left of the fixture", || {
        let d = s.dump(&all);
        (references(&d, &fixture_ids).is_empty() && room_keys(&d, &["shared", "b1"]).is_empty())
            .then_some(())
    });
    let left: Vec<String> = s
        .dump(&all)
        .into_keys()
        .filter(|k| k.contains(":room:"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    leader.leave().unwrap();
}

// `migrate` refuses while an instance is live (its heartbeat key holds a boot token, or a
// value of another type): node-b as the fixture caught it running. Both modes, text and JSON,
// exit 1 with no JSON, name the instance and say to stop it, and write nothing. More than five
// live instances: five named, the rest counted. A heartbeat key holding `released` (a clean
// stop) is not live: the step then runs.
#[test]
fn migrate_refuses_while_an_instance_is_live() {
    let s = Server::start();
    load_v1(&s);
    let ks = ks(V1_STAGE);
    let all = ks.scan_pattern();
    let before = s.dump(&all);
    for args in [
        &["--dry-run"][..],
        &["--dry-run", "--json"],
        &["--apply"],
        &["--apply", "--json"],
    ] {
        let o = cli("migrate", &s, V1_STAGE, args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", text(&o));
        assert!(o.stdout.is_empty(), "{args:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        for part in [
            "1 instance is live",
            ": node-b.",
            "stop them",
            "sfu-redis migrate --apply",
            "nothing was written",
        ] {
            assert!(err.contains(part), "{args:?} {part:?}: {}", text(&o));
        }
        assert_eq!(s.dump(&all), before, "{args:?} wrote");
    }

    // Seven more: six boot tokens and one key of another type.
    for n in 0..6 {
        set_key(&s, &ks.heartbeat(&format!("live-{n}")), "0123456789abcdef");
    }
    let _: () = redis::cmd("HSET")
        .arg(ks.heartbeat("live-hash"))
        .arg("f")
        .arg("v")
        .query(&mut s.con())
        .unwrap();
    set_key(&s, &ks.heartbeat("stopped"), "released");
    let o = cli("migrate", &s, V1_STAGE, &["--apply"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    // node-b, live-0..5 and live-hash; "stopped" is not counted.
    assert!(
        err.contains("8 instances are live")
            && err.contains(": live-0, live-1, live-2, live-3, live-4 and 3 more."),
        "{}",
        text(&o)
    );
    assert_eq!(stamp(&s, V1_STAGE).as_deref(), Some("1"));
    assert_eq!(v1_keys(&ks, s.dump(&all).keys()).len(), 3);

    for n in 0..6 {
        del_key(&s, &ks.heartbeat(&format!("live-{n}")));
    }
    del_key(&s, &ks.heartbeat("live-hash"));
    del_key(&s, &ks.heartbeat("stopped"));
    set_key(&s, &ks.heartbeat("node-b"), "released");
    let o = cli("migrate", &s, V1_STAGE, &["--apply"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(stamp(&s, V1_STAGE).as_deref(), Some("2"));
    assert!(v1_keys(&ks, s.dump(&all).keys()).is_empty());
}

// What migrate cannot fold it skips and reports, and a run interrupted anywhere is finished by
// the next. The fixture with a peer index holding members that are not `<room>/<peer>` in wire
// form and one that is no set: the plan counts and names them, `--apply` folds the rest and
// deletes both keys. Before that, a run cut short after node-l's fold (its rooms added, its
// peer index deleted, no stamp) and node-a's half done: the next `--apply` ends where an
// uninterrupted run would (the fixture's migration, the odd keys gone). At version 2 a peer
// index left over (a version 1 node ran on) is folded too, once no instance is live.
#[test]
fn migrate_skips_what_it_cannot_fold_and_finishes_an_interrupted_run() {
    let s = Server::start();
    load_v1(&s);
    let ks = ks(V1_STAGE);
    let all = ks.scan_pattern();
    del_key(&s, &ks.heartbeat("node-b")); // node-b stopped: its key expired
    del_key(&s, &ks.leader());
    let fixture = s.dump(&all);
    let odd_index = ks.v1_instance_peers("odd");
    let bad = ["no-slash", "room:1/p", "r/p/q", "/p", "r/"];
    let _: () = redis::cmd("SADD")
        .arg(&odd_index)
        .arg(&bad[..])
        .arg("o1/p1")
        .arg("o%3A2/p%202")
        .query(&mut s.con())
        .unwrap();
    let not_a_set = ks.v1_instance_reaping_peers("odd");
    set_key(&s, &not_a_set, "garbage");

    let o = cli("migrate", &s, V1_STAGE, &["--dry-run", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = json_of(&o);
    let folds = r["steps"][0]["folds"].as_array().unwrap();
    let odd = folds
        .iter()
        .find(|f| f["from_key"] == odd_index.as_str())
        .unwrap_or_else(|| panic!("{r}"));
    assert_eq!(odd["members"], 7, "{odd}");
    assert_eq!(odd["skipped"], 5, "{odd}");
    assert_eq!(
        strings(&odd["skipped_members"]),
        bad.iter().map(|b| b.to_string()).collect(),
        "{odd}"
    );
    assert_eq!(odd["rooms"], 2, "{odd}");
    assert_eq!(
        strings(&odd["new_room_ids"]),
        ["o1".to_owned(), "o%3A2".to_owned()].into(),
        "{odd}"
    );
    let garbage = folds
        .iter()
        .find(|f| f["from_key"] == not_a_set.as_str())
        .unwrap_or_else(|| panic!("{r}"));
    assert_eq!(garbage["not_a_set"], "string", "{garbage}");
    assert_eq!(garbage["members"], 0, "{garbage}");
    let o = cli("migrate", &s, V1_STAGE, &["--dry-run"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("skipped 5 members") && out.contains("holds a string, not a set"),
        "{}",
        text(&o)
    );

    // An apply cut short: node-l folded and its index deleted, node-a's rooms added but its
    // index kept, no stamp.
    let mut con = s.con();
    let _: () = redis::cmd("SADD")
        .arg(ks.instance_rooms("node-l"))
        .arg(&["l1", "l2"][..])
        .query(&mut con)
        .unwrap();
    del_key(&s, &ks.v1_instance_peers("node-l"));
    let _: () = redis::cmd("SADD")
        .arg(ks.instance_reaping_rooms("node-a"))
        .arg("shared")
        .query(&mut con)
        .unwrap();
    let o = cli("migrate", &s, V1_STAGE, &["--apply", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = json_of(&o);
    assert_eq!(r["version_after"], 2, "{r}");
    let a = r["steps"][0]["folds"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["instance"] == "node-a")
        .cloned()
        .unwrap_or_else(|| panic!("{r}"));
    assert_eq!(a["new_rooms"], 0, "{a}");
    let mut expected = migrated(&ks, &fixture);
    expected.insert(
        ks.instance_rooms("odd"),
        Val::Set(["o1".to_owned(), "o%3A2".to_owned()].into()),
    );
    assert_eq!(s.dump(&all), expected);
    let unreached = unreached_records(&ks, &expected);
    assert!(unreached.is_empty(), "{unreached:#?}");

    // At version 2, a peer index written by a version 1 node that ran on after the move: folded
    // the same way (step 2 -> 2), refused while an instance is live.
    let _: () = redis::cmd("SADD")
        .arg(ks.v1_instance_peers("node-l"))
        .arg("l3/l3-p1")
        .query(&mut con)
        .unwrap();
    set_key(&s, &ks.heartbeat("node-l"), "0123456789abcdef");
    let o = cli("migrate", &s, V1_STAGE, &["--dry-run"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(": node-l."),
        "{}",
        text(&o)
    );
    del_key(&s, &ks.heartbeat("node-l"));
    let o = cli("migrate", &s, V1_STAGE, &["--apply", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = json_of(&o);
    assert_eq!(r["version"], 2, "{r}");
    assert_eq!(r["steps"][0]["from"], 2, "{r}");
    assert_eq!(r["steps"][0]["done"], true, "{r}");
    assert_eq!(
        strings(&r["steps"][0]["folds"][0]["new_room_ids"]),
        ["l3".to_owned()].into(),
        "{r}"
    );
    let now = s.dump(&all);
    assert!(v1_keys(&ks, now.keys()).is_empty(), "{now:?}");
    assert!(set_of(&now, &ks.instance_rooms("node-l")).contains("l3"));
    assert_eq!(stamp(&s, V1_STAGE).as_deref(), Some("2"));
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

    let ours = SCHEMA_VERSION.to_string();
    set_stamp(&s, stage, &ours);
    let _: () = redis::cmd("FLUSHALL").query(&mut s.raw_con()).unwrap();
    a.heartbeat_now().ok();
    wait_for(LONG, "the stamp written again", || {
        (stamp(&s, stage) == Some(ours.clone())).then_some(())
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
// prefix is stamped with a newer version: it reports itself reaped once, its registration is refused, and it is
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
    let newer = (SCHEMA_VERSION + 1).to_string();
    set_stamp(&s, stage, &newer);
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
    assert_eq!(stamp(&s, stage), Some(newer));

    set_stamp(&s, stage, &SCHEMA_VERSION.to_string());
    wait_for(LONG, "registered again", || {
        in_zset(&s, stage, "park-a").then_some(())
    });
    wait_for(LONG, "a pin", || a.pin_room("room-q").ok());
    a.leave().unwrap();
}

// Redis loses its data and the prefix is stamped "1" (by a node of the previous release)
// before the node's next tick: the node
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
        .arg("1")
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
    // A parked node's leave writes nothing either: it stops as a shutdown does.
    let e = a.leave().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Schema, "{e}");
    let keys = s.keys(&format!("{}:*", ks(stage).prefix()));
    assert_eq!(
        keys,
        vec![ks(stage).schema()],
        "a parked node's leave wrote keys"
    );
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
