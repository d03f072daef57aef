//! End to end: three `sfu-redis node --json` processes on a real redis-server. SIGKILL one
//! non-leader: every key of its rooms and peers goes, the other two keep all of theirs. Then
//! SIGKILL the leader: the survivor takes the lease and reaps it. Finally SIGTERM the survivor:
//! it releases the lease and exits 0.

mod support;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{wait_for, Server, LONG};

struct NodeProc {
    id: String,
    rooms: Vec<String>,
    child: Child,
}

fn spawn_node(s: &Server, id: &str, rooms: &[&str], tx: mpsc::Sender<(String, Value)>) -> NodeProc {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sfu-redis"))
        .args(["node", "--json", "--stage", "e2e", "--instance-id", id])
        .args(["--redis-url", &s.url()])
        .args(["--rooms", &rooms.join(",")])
        .args(["--peers-per-room", "3"])
        .args([
            "--heartbeat-interval-ms",
            "200",
            "--heartbeat-ttl-ms",
            "600",
        ])
        .args(["--lease-ttl-ms", "1800", "--lease-refresh-ms", "600"])
        .args(["--two-phase-delay-ms", "1000", "--reap-interval-ms", "300"])
        .args(["--command-timeout-ms", "400"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn sfu-redis node");
    let stdout = child.stdout.take().expect("stdout");
    let name = id.to_owned();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let v: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("{name}: stdout line is not JSON ({e}): {line}"));
            if tx.send((name.clone(), v)).is_err() {
                break;
            }
        }
    });
    NodeProc {
        id: id.to_owned(),
        rooms: rooms.iter().map(|r| (*r).to_owned()).collect(),
        child,
    }
}

/// Collects events; `expect` waits for one matching `pred`.
struct Events {
    rx: mpsc::Receiver<(String, Value)>,
    seen: Vec<(String, Value)>,
}

impl Events {
    fn expect(&mut self, what: &str, pred: impl Fn(&str, &Value) -> bool) -> (String, Value) {
        if let Some(hit) = self.seen.iter().find(|(i, v)| pred(i, v)) {
            return hit.clone();
        }
        let deadline = Instant::now() + LONG;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok((i, v)) => {
                    assert_eq!(
                        v["instance"],
                        Value::from(i.as_str()),
                        "event carries its instance"
                    );
                    self.seen.push((i.clone(), v.clone()));
                    if pred(&i, &v) {
                        return (i, v);
                    }
                }
                Err(_) => panic!("timed out waiting for {what}; seen: {:#?}", self.seen),
            }
        }
    }
}

fn is(v: &Value, event: &str) -> bool {
    v["event"] == event
}

/// Every key of the prefix (SCAN) with every id-like string it holds: set and zset members,
/// hash fields and values, string values.
fn dump(con: &mut redis::Connection) -> Vec<(String, Vec<String>)> {
    let keys: Vec<String> = redis::cmd("SCAN")
        .cursor_arg(0)
        .arg("MATCH")
        .arg("sfu:e2e:main:*")
        .arg("COUNT")
        .arg(1000)
        .clone()
        .iter(con)
        .expect("scan")
        .collect::<Result<_, _>>()
        .expect("scan");
    keys.into_iter()
        .map(|k| {
            let t: String = redis::cmd("TYPE").arg(&k).query(con).unwrap();
            let vals: Vec<String> = match t.as_str() {
                "string" => vec![redis::cmd("GET").arg(&k).query(con).unwrap()],
                "set" => redis::cmd("SMEMBERS").arg(&k).query(con).unwrap(),
                "zset" => redis::cmd("ZRANGE")
                    .arg(&k)
                    .arg(0)
                    .arg(-1)
                    .query(con)
                    .unwrap(),
                "hash" => redis::cmd("HGETALL").arg(&k).query(con).unwrap(),
                _ => vec![],
            };
            (k, vals)
        })
        .collect()
}

/// Keys and values that mention `node` or one of its rooms.
fn traces_of(con: &mut redis::Connection, node: &NodeProc) -> Vec<String> {
    let mut needles = vec![node.id.clone()];
    needles.extend(node.rooms.iter().cloned());
    let mentions = |s: &str| {
        needles.iter().any(|n| {
            s.split([':', '/', '{', '}'])
                .any(|part| part == n || part.starts_with(&format!("{n}-")))
        })
    };
    let mut out = Vec::new();
    for (k, vals) in dump(con) {
        if mentions(&k) {
            out.push(k.clone());
        }
        for v in vals {
            if mentions(&v) {
                out.push(format!("{k} holds {v}"));
            }
        }
    }
    out
}

/// Every key a live node must still have: its heartbeat, its indexes, and per room the pin,
/// metadata, peer set, guests and each peer record.
fn expected_keys(node: &NodeProc) -> BTreeSet<String> {
    let p = "sfu:e2e:main";
    let mut k = BTreeSet::from([
        format!("{p}:{{ctl}}:hb:{}", node.id),
        format!("{p}:{{ctl}}:instance:{}:rooms", node.id),
        format!("{p}:{{ctl}}:instance:{}:peers", node.id),
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

fn missing_keys(con: &mut redis::Connection, node: &NodeProc) -> Vec<String> {
    let present: BTreeSet<String> = dump(con).into_iter().map(|(k, _)| k).collect();
    expected_keys(node).difference(&present).cloned().collect()
}

fn sigkill(node: &mut NodeProc) {
    node.child.kill().expect("SIGKILL");
    let _ = node.child.wait();
}

#[test]
fn three_processes_kill_a_member_then_the_leader() {
    let s = Server::start();
    let mut con = s.con();
    let (tx, rx) = mpsc::channel();
    let mut nodes = vec![
        spawn_node(&s, "n1", &["n1-a", "n1-b"], tx.clone()),
        spawn_node(&s, "n2", &["n2-a", "n2-b"], tx.clone()),
        spawn_node(&s, "n3", &["n3-a", "n3-b"], tx),
    ];
    let mut ev = Events {
        rx,
        seen: Vec::new(),
    };
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
            missing_keys(&mut con, n).is_empty(),
            "{} wrote all its keys",
            n.id
        );
    }

    // 1. SIGKILL a non-leader.
    let vi = nodes.iter().position(|n| n.id != leader).unwrap();
    let mut victim = nodes.remove(vi);
    sigkill(&mut victim);
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
    let traces = wait_for(LONG, "no trace of the victim", || {
        let t = traces_of(&mut con, &victim);
        t.is_empty().then_some(t)
    });
    assert!(traces.is_empty());
    for n in &nodes {
        assert_eq!(
            missing_keys(&mut con, n),
            Vec::<String>::new(),
            "{} keeps all its keys",
            n.id
        );
    }

    // 2. SIGKILL the leader: the survivor takes the lease after it expires and reaps it.
    let li = nodes.iter().position(|n| n.id == leader).unwrap();
    let mut old_leader = nodes.remove(li);
    sigkill(&mut old_leader);
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
    wait_for(LONG, "no trace of the old leader", || {
        traces_of(&mut con, &old_leader).is_empty().then_some(())
    });
    assert!(traces_of(&mut con, &victim).is_empty());
    assert_eq!(
        missing_keys(&mut con, &nodes[0]),
        Vec::<String>::new(),
        "the survivor keeps all its keys"
    );

    // 3. SIGTERM the survivor: it releases the lease and exits 0.
    let pid = nodes[0].child.id().to_string();
    let st = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("run kill");
    assert!(st.success());
    ev.expect("leader_lost shutdown", |i, v| {
        i == survivor && is(v, "leader_lost") && v["reason"] == "shutdown"
    });
    ev.expect("stopped", |i, v| i == survivor && is(v, "stopped"));
    let status = wait_for(Duration::from_secs(10), "survivor exit", || {
        nodes[0].child.try_wait().ok().flatten()
    });
    assert!(status.success(), "node exits 0 on SIGTERM, got {status}");
    let leader_key: Option<String> = redis::cmd("GET")
        .arg("sfu:e2e:main:{ctl}:leader")
        .query(&mut con)
        .unwrap();
    assert_eq!(leader_key, None, "the lease was released");
}
