//! How long a Sentinel failover takes, as the nodes see it:
//!
//! ```sh
//! cargo run --release --example failover_report -- --runs 5                 # kill -9 of the master
//! cargo run --release --example failover_report -- --runs 5 --kind sigstop  # a hung master
//! cargo run --release --example failover_report -- --runs 5 --kind failover # SENTINEL FAILOVER
//! ```
//!
//! Each run starts its own `SentinelGroup` (a master, 1 replica, 3 sentinels,
//! `down-after-milliseconds` 500, quick sentinel timers), then 3 nodes (`fa`, `fb`, `fc`) on its
//! `redis+sentinel://` URL with `Timings::from_heartbeat(300 ms, 1200 ms)` and a 300 ms command
//! timeout (as tests/it/sentinel.rs). Each node pins `--rooms` rooms (default 20) with one peer
//! each; once a node leads, each pins one more room right before the fault (its replication
//! may not have finished: the library writes back what it holds after a master switch). Then
//! the fault, at t = 0:
//!
//! - `kill9`: the master is killed (SIGKILL); `sigstop`: it is stopped (SIGSTOP: it holds its
//!   connections and answers nothing); `failover`: `SENTINEL FAILOVER` on the first sentinel
//!   (no down detection: the master stays up until the sentinels demote it).
//!
//! Measured from t = 0, polling every 5 ms over direct connections:
//!
//! - `promoted_ms`: a replica's `ROLE` says `master` (the sentinels' `REPLICAOF NO ONE`); the
//!   new master's clock is read then (`TIME`);
//! - `sentinels_ms`: every sentinel names it (`SENTINEL GET-MASTER-ADDR-BY-NAME`): from then
//!   on the nodes' discovery finds it;
//! - `old_demoted_ms` (`failover` only, else null): the old master's `ROLE` says `slave`
//!   (until then it is still a writable master that the nodes' open connections may use);
//! - `heartbeating_ms` per node, and `all_heartbeating_ms` (their max): the node's score in the
//!   new master's `P:{ctl}:heartbeats` is newer than the new master's clock at promotion (a
//!   heartbeat the node wrote there itself);
//! - `restored_ms`: every room the nodes pinned (owner key naming the node) and every peer
//!   record is on the new master (`missing_at_heartbeat`: how many were not when every node
//!   heartbeated there; `lost`: how many never came back within `--timeout-s`);
//! - `leaderless_ms`: the longest stretch, from t = 0 until the end of the checks, with no node
//!   holding the lease (`leader_before` / `leader_after`; 0 when the leader rode through);
//! - `room_lost_events` / `reaped_events`: `RoomLost`, `InstanceReaped` and `ReapedSelf`
//!   events the nodes emitted (a failover shorter than the reap window should cause none).
//!
//! One JSON line per run, then a summary line (`min` / `median` / `max` of each time over the
//! runs that finished). A run that does not settle within `--timeout-s` (default 30) prints an
//! `error` line and counts in `failed`. `RUST_LOG=warn` shows the library's master switches.

use std::time::{Duration, Instant};

use redis::{Connection, Value};
use serde_json::{json, Value as Json};
use sfu_redis::keys::KeySpace;
use sfu_redis::{Config, Event, Node, Timings};
use sfu_redis_testkit::sentinel::{SentinelGroup, SentinelOptions};

const STAGE: &str = "failover";

/// How often the checks poll.
const POLL: Duration = Duration::from_millis(5);

/// Timeout of one check's connect and of each of its queries.
const CHECK_TIMEOUT: Duration = Duration::from_millis(200);

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e4).round() / 10.0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Kill9,
    Sigstop,
    Failover,
}

impl Kind {
    fn parse(s: &str) -> Kind {
        match s {
            "kill9" => Kind::Kill9,
            "sigstop" => Kind::Sigstop,
            "failover" => Kind::Failover,
            other => {
                eprintln!("failover_report: --kind {other:?}: expected kill9, sigstop or failover");
                std::process::exit(2);
            }
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Kill9 => "kill9",
            Kind::Sigstop => "sigstop",
            Kind::Failover => "failover",
        }
    }
}

struct Args {
    runs: usize,
    kind: Kind,
    rooms: usize,
    timeout: Duration,
}

impl Args {
    fn parse() -> Args {
        let num =
            |name: &str, default: u64| arg(name).and_then(|v| v.parse().ok()).unwrap_or(default);
        Args {
            runs: num("--runs", 5).max(1) as usize,
            kind: Kind::parse(arg("--kind").as_deref().unwrap_or("kill9")),
            rooms: num("--rooms", 20) as usize,
            timeout: Duration::from_secs(num("--timeout-s", 30).max(1)),
        }
    }
}

/// The nodes' timings: heartbeat every 300 ms, TTL 1.2 s, calls time out after 300 ms (a dead
/// instance is reaped some 4 s after its last heartbeat: longer than the failover).
fn timings() -> Timings {
    let mut t = Timings::from_heartbeat(Duration::from_millis(300), Duration::from_millis(1200));
    t.command_timeout = Duration::from_millis(300);
    t
}

struct Member {
    id: &'static str,
    node: Node,
    rooms: Vec<String>,
    peers: Vec<(String, String)>,
}

impl Member {
    /// Pins `room` and writes one peer in it.
    fn write(&mut self, room: String) -> Result<(), String> {
        self.node
            .pin_room(&room)
            .map_err(|e| format!("{}: pin {room}: {e}", self.id))?;
        let peer = format!("p-{room}");
        self.node
            .upsert_peer(&room, &peer, Some(&format!("g-{room}")), &[("k", "v")])
            .map_err(|e| format!("{}: upsert {room}/{peer}: {e}", self.id))?;
        self.rooms.push(room.clone());
        self.peers.push((room, peer));
        Ok(())
    }
}

/// A plaintext connection to `127.0.0.1:port` with short timeouts, for the checks.
fn check_con(port: u16) -> Option<Connection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    let con = client.get_connection_with_timeout(CHECK_TIMEOUT).ok()?;
    con.set_read_timeout(Some(CHECK_TIMEOUT)).ok()?;
    con.set_write_timeout(Some(CHECK_TIMEOUT)).ok()?;
    Some(con)
}

/// A connection that is made again after any error.
struct Probe {
    port: u16,
    con: Option<Connection>,
}

impl Probe {
    fn new(port: u16) -> Probe {
        Probe { port, con: None }
    }

    fn query<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> Option<T> {
        if self.con.is_none() {
            self.con = check_con(self.port);
        }
        let res = cmd.query(self.con.as_mut()?);
        if res.is_err() {
            self.con = None;
        }
        res.ok()
    }
}

/// The first element of `ROLE`.
fn role(p: &mut Probe) -> Option<String> {
    match p.query::<Value>(&redis::cmd("ROLE"))? {
        Value::Array(items) => match items.first()? {
            Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        },
        _ => None,
    }
}

/// The master port a sentinel names.
fn named_master(p: &mut Probe, name: &str) -> Option<u16> {
    let addr: Vec<String> = p.query(
        redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(name),
    )?;
    addr.get(1)?.parse().ok()
}

/// What the nodes hold that `con` (the new master) does not have, and how much was checked.
fn missing(con: &mut Connection, ks: &KeySpace, members: &[Member]) -> Option<(usize, usize)> {
    let mut pipe = redis::pipe();
    let mut want = Vec::new();
    for m in members {
        for r in &m.rooms {
            pipe.get(ks.room(r).owner);
            want.push(m.id);
        }
        for (r, p) in &m.peers {
            pipe.hget(ks.peer(r, p), "instance");
            want.push(m.id);
        }
    }
    let got: Vec<Option<String>> = pipe.query(con).ok()?;
    let n = got
        .iter()
        .zip(&want)
        .filter(|(g, w)| g.as_deref() != Some(**w))
        .count();
    Some((n, want.len()))
}

fn leader(members: &[Member]) -> Option<&'static str> {
    members.iter().find(|m| m.node.is_leader()).map(|m| m.id)
}

/// The longest stretch without a leader, sampled.
#[derive(Default)]
struct Leaderless {
    since: Option<Instant>,
    longest: Duration,
}

impl Leaderless {
    fn sample(&mut self, members: &[Member]) {
        let now = Instant::now();
        match (leader(members), self.since) {
            (None, None) => self.since = Some(now),
            (None, Some(s)) => self.longest = self.longest.max(now - s),
            (Some(_), Some(s)) => {
                self.longest = self.longest.max(now - s);
                self.since = None;
            }
            (Some(_), None) => {}
        }
    }
}

fn wait_until<T>(
    timeout: Duration,
    what: &str,
    mut f: impl FnMut() -> Option<T>,
) -> Result<T, String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if Instant::now() > deadline {
            return Err(format!("no {what} within {} s", timeout.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn run(a: &Args) -> Result<Json, String> {
    let mut group = SentinelGroup::start(SentinelOptions::default())
        .map_err(|e| format!("start the sentinel group: {e}"))?;
    let name = group.master_name().to_owned();
    let ks = KeySpace::new("sfu", STAGE, "main").expect("key space");
    let mut members = Vec::new();
    for id in ["fa", "fb", "fc"] {
        let config = Config::builder()
            .redis_url(group.url())
            .stage(STAGE)
            .instance_id(id)
            .timings(timings())
            .build()
            .map_err(|e| format!("config: {e}"))?;
        let node = Node::start(config).map_err(|e| format!("start {id}: {e}"))?;
        members.push(Member {
            id,
            node,
            rooms: Vec::new(),
            peers: Vec::new(),
        });
    }
    for m in &mut members {
        for r in 0..a.rooms {
            m.write(format!("{}-r{r}", m.id))?;
        }
    }
    // A fresh dataset grants no lease before a lease TTL (3.6 s here).
    let leader_before = wait_until(a.timeout, "leader", || leader(&members))?;
    let epoch_before = members
        .iter()
        .filter_map(|m| m.node.stats().epoch)
        .max()
        .unwrap_or(0);
    let (_, old) = group
        .master_addr()
        .map_err(|e| format!("master address: {e}"))?;
    let mut candidates: Vec<Probe> = group
        .data_ports()
        .into_iter()
        .filter(|p| *p != old)
        .map(Probe::new)
        .collect();
    let mut sentinels: Vec<Probe> = group.sentinel_ports().into_iter().map(Probe::new).collect();
    for m in &mut members {
        m.write(format!("{}-last", m.id))?;
    }

    // The fault.
    let fault_at = Instant::now();
    match a.kind {
        Kind::Kill9 => group.server(old).expect("the master").kill9(),
        Kind::Sigstop => group
            .server(old)
            .expect("the master")
            .sigstop()
            .map_err(|e| format!("SIGSTOP: {e}"))?,
        Kind::Failover => {
            let said = group.sentinels()[0]
                .cli(&["SENTINEL", "FAILOVER", &name])
                .map_err(|e| format!("SENTINEL FAILOVER: {e}"))?;
            if said != "OK" {
                return Err(format!("SENTINEL FAILOVER said {said:?}"));
            }
        }
    }
    let deadline = fault_at + a.timeout;
    let timed_out = |what: &str| format!("{what}: not within {} s", a.timeout.as_secs());

    // Promotion, the sentinels, every node's heartbeat on the new master.
    let mut leaderless = Leaderless::default();
    let mut promoted: Option<(Duration, u16, i64)> = None;
    let mut sentinels_at: Option<Duration> = None;
    let mut beat: Vec<Option<Duration>> = vec![None; members.len()];
    let mut master: Option<Probe> = None;
    // A forced failover leaves the old master up: when the sentinels make it a replica.
    let mut old_probe = (a.kind == Kind::Failover).then(|| Probe::new(old));
    let mut demoted_at: Option<Duration> = None;
    let mut sample_old = |demoted_at: &mut Option<Duration>| {
        if let (None, Some(p)) = (&demoted_at, old_probe.as_mut()) {
            if role(p).as_deref() == Some("slave") {
                *demoted_at = Some(fault_at.elapsed());
            }
        }
    };
    loop {
        leaderless.sample(&members);
        sample_old(&mut demoted_at);
        if promoted.is_none() {
            for c in &mut candidates {
                if role(c).as_deref() == Some("master") {
                    let at = fault_at.elapsed();
                    let clock = c
                        .con
                        .as_mut()
                        .and_then(|con| redis::cmd("TIME").query::<(i64, i64)>(con).ok())
                        .map(|(s, us)| s * 1000 + us / 1000)
                        .ok_or("read the new master's clock")?;
                    promoted = Some((at, c.port, clock));
                    master = Some(Probe::new(c.port));
                    break;
                }
            }
        }
        if let (None, Some((_, new, _))) = (sentinels_at, promoted) {
            if sentinels
                .iter_mut()
                .all(|s| named_master(s, &name) == Some(new))
            {
                sentinels_at = Some(fault_at.elapsed());
            }
        }
        if let (Some((_, _, clock)), Some(p)) = (promoted, master.as_mut()) {
            for (m, b) in members.iter().zip(beat.iter_mut()) {
                if b.is_none() {
                    let score: Option<Option<f64>> =
                        p.query(redis::cmd("ZSCORE").arg(ks.heartbeats()).arg(m.id));
                    if score.flatten().is_some_and(|s| s as i64 > clock) {
                        *b = Some(fault_at.elapsed());
                    }
                }
            }
        }
        if sentinels_at.is_some() && beat.iter().all(Option::is_some) {
            break;
        }
        if Instant::now() > deadline {
            let what = match (promoted, sentinels_at) {
                (None, _) => "a promoted replica",
                (Some(_), None) => "every sentinel naming the new master",
                _ => "every node heartbeating on the new master",
            };
            return Err(timed_out(what));
        }
        std::thread::sleep(POLL);
    }
    let (promoted_at, new, _) = promoted.expect("promoted");
    let all_beat = beat.iter().flatten().max().copied().expect("heartbeats");

    // Everything back on the new master, and a leader.
    let mut con = check_con(new).ok_or("connect to the new master")?;
    let (missing_at_heartbeat, checked) =
        missing(&mut con, &ks, &members).ok_or("read the new master")?;
    let mut restored_at = (missing_at_heartbeat == 0).then(|| fault_at.elapsed());
    let mut lost = missing_at_heartbeat;
    loop {
        leaderless.sample(&members);
        sample_old(&mut demoted_at);
        if restored_at.is_none() {
            if let Some((n, _)) = missing(&mut con, &ks, &members) {
                lost = n;
                if n == 0 {
                    restored_at = Some(fault_at.elapsed());
                }
            } else {
                con = check_con(new).ok_or("connect to the new master")?;
            }
        }
        if restored_at.is_some() && leader(&members).is_some() {
            break;
        }
        if Instant::now() > deadline {
            break;
        }
        std::thread::sleep(POLL);
    }
    let leader_after = leader(&members);
    let epoch_after = members
        .iter()
        .filter_map(|m| m.node.stats().epoch)
        .max()
        .unwrap_or(0);
    let (mut room_lost, mut reaped) = (0, 0);
    for m in &members {
        for e in m.node.events().try_iter() {
            match e {
                Event::RoomLost { .. } => room_lost += 1,
                Event::InstanceReaped { .. } | Event::ReapedSelf { .. } => reaped += 1,
                _ => {}
            }
        }
    }
    for m in &members {
        m.node.shutdown().ok();
    }
    let per_node: serde_json::Map<String, Json> = members
        .iter()
        .zip(&beat)
        .map(|(m, b)| (m.id.to_owned(), json!(b.map(ms))))
        .collect();
    Ok(json!({
        "kind": a.kind.name(),
        "old_master": old,
        "new_master": new,
        "promoted_ms": ms(promoted_at),
        "sentinels_ms": sentinels_at.map(ms),
        "old_demoted_ms": demoted_at.map(ms),
        "heartbeating_ms": per_node,
        "all_heartbeating_ms": ms(all_beat),
        "missing_at_heartbeat": missing_at_heartbeat,
        "restored_ms": restored_at.map(ms),
        "lost": lost,
        "checked": checked,
        "leader_before": leader_before,
        "leader_after": leader_after,
        "leaderless_ms": ms(leaderless.longest),
        "epoch_before": epoch_before,
        "epoch_after": epoch_after,
        "room_lost_events": room_lost,
        "reaped_events": reaped,
    }))
}

/// `min` / `median` / `max` of field `key` over `runs` (those that have it).
fn spread(runs: &[Json], key: &str) -> Json {
    let mut v: Vec<f64> = runs.iter().filter_map(|r| r[key].as_f64()).collect();
    if v.is_empty() {
        return Json::Null;
    }
    v.sort_by(f64::total_cmp);
    json!({"min": v[0], "median": v[v.len() / 2], "max": v[v.len() - 1], "n": v.len()})
}

fn main() {
    let _ = env_logger::try_init();
    let a = Args::parse();
    eprintln!(
        "failover_report: {} runs of {}, 3 nodes x {} rooms (+1 each right before the fault), sentinel group: 1 replica, 3 sentinels, down-after 500 ms",
        a.runs,
        a.kind.name(),
        a.rooms
    );
    let mut done = Vec::new();
    let mut failed = Vec::new();
    for i in 1..=a.runs {
        match run(&a) {
            Ok(mut r) => {
                r["run"] = json!(i);
                println!("{r}");
                done.push(r);
            }
            Err(e) => {
                println!("{}", json!({"run": i, "kind": a.kind.name(), "error": e}));
                failed.push(e);
            }
        }
    }
    let summary = json!({
        "summary": true,
        "kind": a.kind.name(),
        "runs": a.runs,
        "failed": failed.len(),
        "promoted_ms": spread(&done, "promoted_ms"),
        "sentinels_ms": spread(&done, "sentinels_ms"),
        "old_demoted_ms": spread(&done, "old_demoted_ms"),
        "all_heartbeating_ms": spread(&done, "all_heartbeating_ms"),
        "restored_ms": spread(&done, "restored_ms"),
        "leaderless_ms": spread(&done, "leaderless_ms"),
        "missing_at_heartbeat_total": done.iter().filter_map(|r| r["missing_at_heartbeat"].as_u64()).sum::<u64>(),
        "lost_total": done.iter().filter_map(|r| r["lost"].as_u64()).sum::<u64>(),
        "room_lost_events_total": done.iter().filter_map(|r| r["room_lost_events"].as_u64()).sum::<u64>(),
        "reaped_events_total": done.iter().filter_map(|r| r["reaped_events"].as_u64()).sum::<u64>(),
    });
    println!("{summary}");
    if !failed.is_empty() {
        std::process::exit(1);
    }
}
