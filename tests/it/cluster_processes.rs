//! End to end: three `sfu-redis node --json` processes on a real redis-server. SIGKILL one
//! non-leader: every key of its rooms and peers goes, the other two keep all of theirs. Then
//! SIGKILL the leader: the survivor takes the lease and reaps it. Finally SIGTERM the survivor:
//! it releases the lease and exits 0.

use crate::support;

use std::collections::BTreeSet;
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;
use support::procs::{is, Events, NodeProc, Spawn};
use support::{references, wait_for, Server};

const STAGE: &str = "e2e";

/// Every key a live node must still have: its heartbeat, its indexes, and per room the pin,
/// metadata, peer set, guests and each peer record.
fn expected_keys(node: &NodeProc) -> BTreeSet<String> {
    let p = format!("sfu:{STAGE}:main");
    let mut k = BTreeSet::from([
        format!("{p}:{{ctl}}:hb:{}", node.id),
        format!("{p}:{{ctl}}:instance:{}:rooms", node.id),
        format!("{p}:{{ctl}}:instance:{}:info", node.id),
    ]);
    for r in &node.rooms {
        for suffix in ["owner", "meta", "peers", "guests"] {
            k.insert(format!("{p}:room:{{{r}}}:{suffix}"));
        }
        for i in 1..=3 {
            k.insert(format!("{p}:room:{{{r}}}:peer:{r}-p{i}"));
        }
    }
    k
}

fn missing_keys(s: &Server, node: &NodeProc) -> Vec<String> {
    let present: BTreeSet<String> = s.dump("*").into_keys().collect();
    expected_keys(node).difference(&present).cloned().collect()
}

/// Keys and values that mention `node` or one of its rooms.
fn traces_of(s: &Server, node: &NodeProc) -> Vec<String> {
    let mut needles = vec![node.id.clone()];
    needles.extend(node.rooms.iter().cloned());
    references(&s.dump("*"), &needles)
}

#[test]
fn three_processes_kill_a_member_then_the_leader() {
    let s = Server::start();
    let url = s.url();
    let (tx, rx) = mpsc::channel();
    let mut nodes = vec![
        Spawn::new(&url, STAGE, "n1", &["n1-a", "n1-b"]).run(tx.clone()),
        Spawn::new(&url, STAGE, "n2", &["n2-a", "n2-b"]).run(tx.clone()),
        Spawn::new(&url, STAGE, "n3", &["n3-a", "n3-b"]).run(tx),
    ];
    let mut ev = Events::new(rx);
    for n in &nodes {
        let id = n.id.clone();
        let (_, v) = ev.expect(&format!("ready from {id}"), |i, v| {
            i == id && is(v, "ready")
        });
        assert_eq!(v["rooms"], 2);
        assert_eq!(v["peers"], 6);
    }
    let (leader, first) = ev.expect("a leader", |_, v| is(v, "leader_acquired"));
    let epoch1 = first["epoch"].as_u64().expect("epoch is a number");
    for n in &nodes {
        assert!(
            missing_keys(&s, n).is_empty(),
            "{} wrote all its keys",
            n.id
        );
    }

    // 1. SIGKILL a non-leader.
    let vi = nodes.iter().position(|n| n.id != leader).unwrap();
    let mut victim = nodes.remove(vi);
    victim.kill9();
    let vid = victim.id.clone();
    ev.expect("candidates naming the victim", |i, v| {
        i == leader
            && is(v, "candidates")
            && v["instances"]
                .as_array()
                .is_some_and(|a| a.contains(&Value::from(vid.as_str())))
    });
    let (_, reaped) = ev.expect("the victim reaped", |i, v| {
        i == leader && is(v, "instance_reaped") && v["dead"] == vid.as_str()
    });
    assert_eq!(reaped["rooms"], 2);
    assert_eq!(reaped["peers"], 6);
    assert_eq!(reaped["skipped_rooms"], 0);
    let left = traces_of(&s, &victim);
    assert!(left.is_empty(), "traces of the victim: {left:#?}");
    for n in &nodes {
        assert_eq!(
            missing_keys(&s, n),
            Vec::<String>::new(),
            "{} keeps all its keys",
            n.id
        );
    }

    // 2. SIGKILL the leader: the survivor takes the lease after it expires and reaps it.
    let li = nodes.iter().position(|n| n.id == leader).unwrap();
    let mut old_leader = nodes.remove(li);
    old_leader.kill9();
    let survivor = nodes[0].id.clone();
    let (_, second) = ev.expect("the survivor leads", |i, v| {
        i == survivor && is(v, "leader_acquired")
    });
    assert!(
        second["epoch"].as_u64().unwrap() > epoch1,
        "epochs increase strictly"
    );
    let lid = old_leader.id.clone();
    ev.expect("the old leader reaped", |i, v| {
        i == survivor && is(v, "instance_reaped") && v["dead"] == lid.as_str()
    });
    let left = traces_of(&s, &old_leader);
    assert!(left.is_empty(), "traces of the old leader: {left:#?}");
    assert!(traces_of(&s, &victim).is_empty());
    assert_eq!(
        missing_keys(&s, &nodes[0]),
        Vec::<String>::new(),
        "the survivor keeps all its keys"
    );

    // 3. SIGTERM the survivor: it releases the lease and exits 0.
    nodes[0].signal("TERM");
    ev.expect("leader_lost shutdown", |i, v| {
        i == survivor && is(v, "leader_lost") && v["reason"] == "shutdown"
    });
    ev.expect("stopped", |i, v| i == survivor && is(v, "stopped"));
    let status = wait_for(Duration::from_secs(10), "survivor exit", || {
        nodes[0].child.try_wait().ok().flatten()
    });
    assert!(status.success(), "node exits 0 on SIGTERM, got {status}");
    let leader_key: Option<String> = redis::cmd("GET")
        .arg(format!("sfu:{STAGE}:main:{{ctl}}:leader"))
        .query(&mut s.con())
        .unwrap();
    assert_eq!(leader_key, None, "the lease was released");
}
