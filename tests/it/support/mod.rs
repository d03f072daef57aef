//! Test support: a real `redis-server` per test on a random port (see
//! `sfu_redis_testkit::devserver::LocalRedis`), whose log is printed when the test panics, plus
//! helpers to build nodes with fast timings and poll with deadlines.
//!
//! Beyond that: an [`EventLog`] that records every event a node emits, a dump of every key
//! (with set members, hash fields and sorted-set entries) to prove that nothing refers to a
//! reaped instance, the audit's consistency scan and key schema version 2's reach rule
//! ([`unreached_records`]) as readable lines, a writer of a dead instance's data following the
//! key schema (docs/src/reference/key-schema.md / `sfu_redis::keys`), and a TCP [`FaultProxy`] that stalls one node's
//! connections (a network stall of one instance only).
#![allow(dead_code, unreachable_pub, unused_imports)]

pub mod pages;
pub mod procs;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use sfu_redis::keys::{encode_id, IdKind, KeySpace, ParsedKey};
use sfu_redis::ops::audit::{self, ProblemKind};
use sfu_redis::{Config, Event, Node, Timings};
use sfu_redis_testkit::cluster::LocalCluster;
use sfu_redis_testkit::data;
pub use sfu_redis_testkit::data::{references, Val};
use sfu_redis_testkit::devserver::LocalRedis;
pub use sfu_redis_testkit::faultproxy::{Direction, FaultProxy};

/// A private Redis for one test: one server, or a Redis Cluster of 3 masters; prints the
/// log(s) if the test panics.
///
/// `Server::start()` follows `SFU_TEST_TOPOLOGY`: unset or `standalone` starts one
/// `redis-server`, `cluster` starts a cluster (`sfu_redis_testkit::cluster::LocalCluster`, 3
/// masters, no replicas) whose URL is `redis+cluster://...`. So one test body runs on both
/// (`.ci/run` runs the modules that apply a second time with `SFU_TEST_TOPOLOGY=cluster`).
/// A test that needs one server's process (restart, pause, its port) uses
/// [`Server::start_with`] or [`Server::redis`], which are standalone only.
pub struct Server {
    backend: Backend,
}

enum Backend {
    One(LocalRedis),
    Cluster(LocalCluster),
}

/// True when `SFU_TEST_TOPOLOGY=cluster`.
pub fn cluster_topology() -> bool {
    std::env::var("SFU_TEST_TOPOLOGY").is_ok_and(|t| t.eq_ignore_ascii_case("cluster"))
}

impl Server {
    pub fn start() -> Server {
        if cluster_topology() {
            return Self::cluster(3, 0);
        }
        Self::start_with(&[])
    }

    /// One server started with extra `redis-server` arguments (not `--requirepass`: the
    /// readiness check of `LocalRedis` cannot authenticate; use `CONFIG SET requirepass`).
    pub fn start_with(args: &[&str]) -> Server {
        let _ = env_logger::builder().is_test(true).try_init();
        Server {
            backend: Backend::One(LocalRedis::start_with(args).expect("start redis-server")),
        }
    }

    /// A Redis Cluster of `masters` masters with `replicas` replicas each.
    pub fn cluster(masters: usize, replicas: usize) -> Server {
        let _ = env_logger::builder().is_test(true).try_init();
        Server {
            backend: Backend::Cluster(
                LocalCluster::start(masters, replicas).expect("start a Redis Cluster"),
            ),
        }
    }

    pub fn url(&self) -> String {
        match &self.backend {
            Backend::One(r) => r.url(),
            Backend::Cluster(c) => c.url(),
        }
    }

    /// The one server (standalone only: panics on a cluster).
    pub fn redis(&self) -> &LocalRedis {
        match &self.backend {
            Backend::One(r) => r,
            Backend::Cluster(_) => panic!("this test needs one server, not a cluster"),
        }
    }

    /// The one server, mutably (restart).
    pub fn redis_mut(&mut self) -> &mut LocalRedis {
        match &mut self.backend {
            Backend::One(r) => r,
            Backend::Cluster(_) => panic!("this test needs one server, not a cluster"),
        }
    }

    /// The cluster (`None` for one server).
    pub fn nodes(&self) -> Option<&LocalCluster> {
        match &self.backend {
            Backend::One(_) => None,
            Backend::Cluster(c) => Some(c),
        }
    }

    /// The cluster, mutably (kill -9 of a node).
    pub fn nodes_mut(&mut self) -> Option<&mut LocalCluster> {
        match &mut self.backend {
            Backend::One(_) => None,
            Backend::Cluster(c) => Some(c),
        }
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self.backend, Backend::Cluster(_))
    }

    /// A fault-injecting TCP proxy in front of this server (`sfu_redis_testkit::faultproxy`).
    pub fn proxy(&self) -> FaultProxy {
        FaultProxy::start(("127.0.0.1", self.redis().port())).expect("start fault proxy")
    }

    /// A connection of the library's connector (`sfu_redis::ops::conn::Redis`: scripts preloaded;
    /// on a cluster, every command routed by its slot and `SCAN` over every master).
    pub fn con(&self) -> sfu_redis::ops::conn::Conn {
        con_to(&self.url())
    }

    /// A plain driver connection to the one server, whatever its role (a replica too: the
    /// library's connector refuses those). Standalone only.
    pub fn raw_con(&self) -> redis::Connection {
        redis::Client::open(self.redis().url())
            .unwrap()
            .get_connection()
            .expect("connect to test redis")
    }

    /// A config for this server with fast timings.
    pub fn config(&self, stage: &str, instance: &str) -> Config {
        self.config_with(stage, instance, Timings::fast())
    }

    pub fn config_with(&self, stage: &str, instance: &str, t: Timings) -> Config {
        config_for(&self.url(), stage, instance, t)
    }

    pub fn node(&self, stage: &str, instance: &str) -> Node {
        Node::start(self.config(stage, instance)).expect("start node")
    }

    pub fn node_with(&self, stage: &str, instance: &str, t: Timings) -> Node {
        Node::start(self.config_with(stage, instance, t)).expect("start node")
    }

    /// Starts a node and waits until it holds the lease (start it before any other node of
    /// its stage). Its event log has seen the `leader_acquired` event.
    pub fn leader(&self, stage: &str, instance: &str, t: Timings) -> (Node, EventLog) {
        let node = self.node_with(stage, instance, t);
        let mut log = EventLog::new(&node);
        log.wait(LONG, "leader_acquired", |e| {
            matches!(e, Event::LeaderAcquired { .. })
        });
        wait_for(LONG, "is_leader", || node.is_leader().then_some(()));
        (node, log)
    }

    /// Every key of the server (tests use small data sets).
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        let mut keys: Vec<String> = sfu_redis::ops::scan::collect(
            &mut self.con(),
            sfu_redis::ops::scan::Scan::keys(pattern),
        )
        .unwrap()
        .into_iter()
        .map(|k| String::from_utf8(k).unwrap())
        .collect();
        keys.sort();
        keys
    }

    /// Redis server time, ms.
    pub fn server_ms(&self) -> i64 {
        sfu_redis::ops::conn::server_time_ms(&mut self.con()).expect("read the server time")
    }

    /// Every key matching `pattern` with its whole content (`sfu_redis_testkit::data::dump`).
    pub fn dump(&self, pattern: &str) -> BTreeMap<String, Val> {
        data::dump(&mut self.con(), pattern).expect("dump the test server's keys")
    }

    /// Makes `instance` (caller's id) look dead: heartbeat key deleted and its sorted-set score
    /// set to `score_ms` (server ms), atomically. Only touches an existing sorted-set entry.
    pub fn make_stale(&self, ks: &KeySpace, instance: &str, score_ms: i64) {
        let w = wire(IdKind::Instance, instance);
        let _: () = redis::pipe()
            .atomic()
            .del(ks.heartbeat(&w))
            .ignore()
            .cmd("ZADD")
            .arg(ks.heartbeats())
            .arg("XX")
            .arg(score_ms)
            .arg(&w)
            .ignore()
            .query(&mut self.con())
            .unwrap();
    }

    /// Writes, following the key schema, the data a dead instance `instance` left: its
    /// sorted-set entry (score `score_ms`, no heartbeat key), and for each room its pin (if
    /// `pin_px` is set; `None` = the pin has expired), metadata, peer records, guest pointers
    /// and guest states, and its room index (which reaches every record, key schema version
    /// 2). Ids are callers' ids.
    pub fn fabricate_dead(
        &self,
        ks: &KeySpace,
        instance: &str,
        score_ms: i64,
        pin_px: Option<u64>,
        rooms: &[FakeRoom<'_>],
    ) {
        let dead = data::DeadInstance {
            pin_px,
            ..data::DeadInstance::new(instance, score_ms)
        };
        let rooms: Vec<data::FakeRoom> = rooms
            .iter()
            .map(|(room, peers)| data::FakeRoom::with_peers(room, peers))
            .collect();
        data::fabricate_dead(&mut self.con(), ks, &dead, &rooms)
            .expect("fabricate a dead instance");
    }

    /// Leaves instance `i` (wire form) as a reap that died right after `reap_begin.lua` leaves
    /// it: score 0, its room index moved aside (`P:{ctl}:instance:<I>:reaping-rooms`), a token
    /// no running reap holds. (Key schema version 2 has no peer index to move.)
    pub fn interrupt_reap(&self, ks: &KeySpace, i: &str) {
        let mut con = self.con();
        let _: () = redis::cmd("ZADD")
            .arg(ks.heartbeats())
            .arg("XX")
            .arg(0)
            .arg(i)
            .query(&mut con)
            .unwrap();
        let _: () = redis::cmd("RENAME")
            .arg(ks.instance_rooms(i))
            .arg(ks.instance_reaping_rooms(i))
            .query(&mut con)
            .unwrap();
        let _: () = redis::cmd("SET")
            .arg(ks.instance_reaping(i))
            .arg("1")
            .query(&mut con)
            .unwrap();
    }

    /// Everything wrong with one prefix, as readable lines `"{kind} at {key}: {detail}"`
    /// (empty = every index holds exactly what the records say, invariant 4; every room's
    /// owner lists it in its room index; every key is one of the schema). One consistency
    /// scan of the audit ([`sfu_redis::ops::audit::scan`]), then key schema version 2's reach rule
    /// checked on its own from a dump ([`unreached_records`]: every peer record naming an
    /// instance lies in a room of that instance's room index, live or moved aside), so a test
    /// does not rest on the audit alone for it. Call it when no operation is in flight.
    ///
    /// One kind is left out where it is legal: `dangling_room_index` in the room index of an
    /// instance whose heartbeat key is gone. A room taken over from a dead instance stays in
    /// the dead one's room index until the reaper runs (invariant 2, the reaper's job; tests
    /// that keep the dead instance unreaped on purpose see it). A live instance's room index
    /// naming a room it does not own is reported.
    pub fn index_problems(&self, ks: &KeySpace) -> Vec<String> {
        let mut con = self.con();
        let problems = audit::scan(ks, &mut con).expect("audit scan");
        let mut lines = Vec::new();
        for p in problems {
            if p.kind == ProblemKind::DanglingRoomIndex {
                if let Some(ParsedKey::InstanceRooms(i)) = ks.parse(&p.key) {
                    let alive: bool = redis::cmd("EXISTS")
                        .arg(ks.heartbeat(&i))
                        .query(&mut con)
                        .unwrap();
                    if !alive {
                        continue;
                    }
                }
            }
            lines.push(format!("{} at {}: {}", p.kind, p.key, p.detail));
        }
        lines.extend(unreached_records(ks, &self.dump(&ks.scan_pattern())));
        lines
    }

    /// The members of `key` (a set; empty if it does not exist).
    pub fn smembers(&self, key: &str) -> BTreeSet<String> {
        redis::cmd("SMEMBERS")
            .arg(key)
            .query(&mut self.con())
            .unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if std::thread::panicking() {
            match &self.backend {
                Backend::One(r) => {
                    eprintln!("---- redis-server log ({}) ----\n{}", self.url(), r.log())
                }
                Backend::Cluster(c) => eprintln!("---- Redis Cluster {} ({c:?}) ----", self.url()),
            }
        }
    }
}

/// A room of a fabricated dead instance: its id and its peers' ids with their guests.
pub type FakeRoom<'a> = (&'a str, &'a [(&'a str, Option<&'a str>)]);

/// A config for `url` (any Redis URL, e.g. a [`FaultProxy`]'s) with prefix `sfu:<stage>:main`.
pub fn config_for(url: &str, stage: &str, instance: &str, t: Timings) -> Config {
    Config::builder()
        .redis_url(Some(url))
        .stage(stage)
        .instance_id(instance)
        .timings(t)
        .build()
        .expect("valid config")
}

/// A connection of the library's connector to `url` (a cluster URL too). A server still
/// loading its dataset (just restarted with persistence: `LOADING`) is waited for, up to
/// [`LONG`].
pub fn con_to(url: &str) -> sfu_redis::ops::conn::Conn {
    let redis = sfu_redis::ops::conn::Redis::new(url, Duration::from_secs(5)).unwrap();
    let deadline = Instant::now() + LONG;
    loop {
        match redis.connect() {
            Ok(con) => return con,
            Err(e) if e.to_string().contains("LOADING") || e.to_string().contains("loading") => {
                assert!(Instant::now() < deadline, "still loading: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("connect to test redis: {e}"),
        }
    }
}

/// The key space of stage `stage` (`sfu:<stage>:main`).
pub fn ks(stage: &str) -> KeySpace {
    KeySpace::new("sfu", stage, "main").unwrap()
}

/// The wire form of a valid id.
pub fn wire(kind: IdKind, id: &str) -> String {
    encode_id(kind, id).expect("valid id")
}

/// Waits, on the master's side (`WAIT`), until `replicas` replicas have acknowledged every
/// write the master behind `con` took so far, or `timeout` passed; returns how many did.
/// `WAIT` counts from the caller's own last write, so a write of its own comes first (a probe
/// key set and deleted): the replication offset is the master's, so that covers every other
/// client's earlier writes too.
pub fn wait_replicated(con: &mut redis::Connection, replicas: usize, timeout: Duration) -> i64 {
    let (acked,): (i64,) = redis::pipe()
        .cmd("SET")
        .arg("sfu-test:wait-probe")
        .arg(1)
        .ignore()
        .cmd("DEL")
        .arg("sfu-test:wait-probe")
        .ignore()
        .cmd("WAIT")
        .arg(replicas)
        .arg(timeout.as_millis() as u64)
        .query(con)
        .expect("WAIT on the master");
    acked
}

/// A replica of the standalone server `s`, in sync, that replicates through a fault proxy:
/// `proxy.blackhole(Direction::Upstream)` then cuts its acknowledgements (the replica is the
/// proxy's client), so `WAIT 1` answers 0 while the data flows on; `proxy.heal()` lets them
/// through again.
pub fn replica_through_proxy(s: &Server) -> (Server, FaultProxy) {
    let replica = Server::start_with(&[]);
    let proxy = s.proxy();
    replica
        .redis()
        .cli(&["REPLICAOF", "127.0.0.1", &proxy.addr().port().to_string()])
        .expect("REPLICAOF");
    let mut rep = replica.raw_con();
    wait_for(LONG, "the replica in sync", || {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut rep)
            .expect("INFO");
        info.lines()
            .any(|l| l.trim() == "master_link_status:up")
            .then_some(())
    });
    assert_eq!(
        wait_replicated(&mut s.raw_con(), 1, LONG),
        1,
        "the replica never acknowledged through the proxy"
    );
    (replica, proxy)
}

/// Polls `f` until it returns `Some`, or panics after `timeout` with `what`.
pub fn wait_for<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for an event matching `pred` on `node`'s channel; returns it.
pub fn wait_event(
    node: &Node,
    timeout: Duration,
    what: &str,
    pred: impl Fn(&Event) -> bool,
) -> Event {
    let rx = node.events();
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(e) if pred(&e) => return e,
            Ok(_) => {}
            Err(_) => panic!("timed out after {timeout:?} waiting for event: {what}"),
        }
    }
}

/// Records every event of one node, so a test can both wait for an event and later assert
/// that some other event never happened. Use it as the only reader of that node's events.
pub struct EventLog {
    rx: crossbeam_channel::Receiver<Event>,
    seen: Vec<Event>,
}

impl EventLog {
    pub fn new(node: &Node) -> EventLog {
        EventLog {
            rx: node.events(),
            seen: Vec::new(),
        }
    }

    /// Waits for a new event matching `pred` (every event received is recorded).
    pub fn wait(&mut self, timeout: Duration, what: &str, pred: impl Fn(&Event) -> bool) -> Event {
        self.try_wait(timeout, &pred).unwrap_or_else(|| {
            panic!(
                "timed out after {timeout:?} waiting for event: {what}; seen: {:?}",
                self.seen
            )
        })
    }

    /// Like [`EventLog::wait`], `None` on timeout.
    pub fn try_wait(&mut self, timeout: Duration, pred: impl Fn(&Event) -> bool) -> Option<Event> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(e) => {
                    self.seen.push(e.clone());
                    if pred(&e) {
                        return Some(e);
                    }
                }
                Err(_) => return None,
            }
        }
    }

    /// Records every event already queued; returns all events seen so far.
    pub fn drain(&mut self) -> &[Event] {
        self.seen.extend(self.rx.try_iter());
        &self.seen
    }

    /// How many events were seen so far (a mark for [`EventLog::since`]).
    pub fn mark(&mut self) -> usize {
        self.drain().len()
    }

    /// Events seen since `mark`.
    pub fn since(&mut self, mark: usize) -> &[Event] {
        &self.drain()[mark..]
    }
}

/// True for a `candidates` event that lists `id`.
pub fn candidates_with(e: &Event, id: &str) -> bool {
    matches!(e, Event::Candidates { instances } if instances.iter().any(|i| i == id))
}

/// True for an `instance_reaped` event of `id`.
pub fn reaped(e: &Event, id: &str) -> bool {
    matches!(e, Event::InstanceReaped { dead, .. } if dead == id)
}

/// Waits for an event matching `pred` on any of `logs`; returns the log's index and the event.
pub fn wait_any(
    logs: &mut [&mut EventLog],
    timeout: Duration,
    what: &str,
    pred: impl Fn(&Event) -> bool,
) -> (usize, Event) {
    let deadline = Instant::now() + timeout;
    loop {
        for (i, log) in logs.iter_mut().enumerate() {
            if let Some(e) = log.try_wait(Duration::from_millis(20), &pred) {
                return (i, e);
            }
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for event on any node: {what}");
        }
    }
}

/// Key schema version 2's reach rule (docs/DESIGN.md invariants 2 and 4), from `dump` alone:
/// every peer record naming an instance I lies in a room listed in I's room index
/// (`P:{ctl}:instance:<I>:rooms`) or, while I is being reaped, in its moved room index
/// (`...:reaping-rooms`). A record no index reaches is an orphan once I dies: no reap finds it.
/// One readable line per record that breaks it (empty: none). Records without an `instance`
/// field name nobody (the audit reports them as malformed); they are left out here.
pub fn unreached_records(ks: &KeySpace, dump: &BTreeMap<String, Val>) -> Vec<String> {
    let set = |k: &str| match dump.get(k) {
        Some(Val::Set(s)) => s.clone(),
        _ => BTreeSet::new(),
    };
    let mut lines = Vec::new();
    for (key, val) in dump {
        let (Some(ParsedKey::Peer(room, peer)), Val::Hash(h)) = (ks.parse(key), val) else {
            continue;
        };
        let Some(i) = h.get("instance") else {
            continue;
        };
        let (live, moved) = (
            set(&ks.instance_rooms(i)),
            set(&ks.instance_reaping_rooms(i)),
        );
        if !live.contains(&room) && !moved.contains(&room) {
            lines.push(format!(
                "unreached_record at {key}: peer {peer} names instance {i}, but room {room} is in \
                 neither {} {live:?} nor {} {moved:?}",
                ks.instance_rooms(i),
                ks.instance_reaping_rooms(i)
            ));
        }
    }
    lines
}

/// One hash field of `key`, read on a fresh connection.
pub fn hget(s: &Server, key: &str, field: &str) -> Option<String> {
    redis::cmd("HGET")
        .arg(key)
        .arg(field)
        .query(&mut s.con())
        .unwrap()
}

/// Every peer record under `ks`'s prefix whose `instance` field names `instance` (wire form),
/// read record by record from the keys (not from any index), as their keys.
pub fn records_naming(s: &Server, ks: &KeySpace, instance: &str) -> Vec<String> {
    let dump = s.dump(&ks.scan_pattern());
    records_of(ks, &dump, instance)
        .into_iter()
        .map(|(r, p)| ks.peer(&r, &p))
        .collect()
}

/// The peer records naming instance `i` (wire form) in `dump`, as `(room, peer)` (wire forms):
/// what key schema version 2 offers in place of an instance's peer index (its room index
/// reaches them, see [`unreached_records`]).
pub fn records_of(
    ks: &KeySpace,
    dump: &BTreeMap<String, Val>,
    i: &str,
) -> BTreeSet<(String, String)> {
    dump.iter()
        .filter_map(|(key, val)| match (ks.parse(key), val) {
            (Some(ParsedKey::Peer(r, p)), Val::Hash(h))
                if h.get("instance").map(String::as_str) == Some(i) =>
            {
                Some((r, p))
            }
            _ => None,
        })
        .collect()
}

/// The keys of the given rooms and the given instances' room indexes in stage `stage`, with
/// their contents: what live instances own and must keep (key schema version 2: the room index
/// is an instance's only index; its records are among the rooms' keys). Pins (`owner` keys)
/// are left out, as they may lapse and be re-pinned in between; check them with `room_owner`.
pub fn room_view(
    s: &Server,
    stage: &str,
    rooms: &[&str],
    instances: &[&str],
) -> BTreeMap<String, Val> {
    let ks = ks(stage);
    let room_prefixes: Vec<String> = rooms
        .iter()
        .map(|r| format!("{}:room:{{{}}}:", ks.prefix(), wire(IdKind::Room, r)))
        .collect();
    let index_keys: BTreeSet<String> = instances
        .iter()
        .map(|i| ks.instance_rooms(&wire(IdKind::Instance, i)))
        .collect();
    s.dump(&ks.scan_pattern())
        .into_iter()
        .filter(|(k, _)| {
            index_keys.contains(k)
                || (room_prefixes.iter().any(|p| k.starts_with(p.as_str()))
                    && !k.ends_with(":owner"))
        })
        .collect()
}

/// Generous bound for anything that takes a few reap cycles with `Timings::fast()`.
pub const LONG: Duration = Duration::from_secs(30);

/// Timings under which a node does not tick during a test (first tick after a minute; 2 s
/// command timeout). A ticking node puts back the index entries of what it holds and settles
/// what a call left uncertain (heartbeat.rs, `Reassert`): a check made right after a host call
/// can see that work half done (a re-assertion read before a close and sent during it puts
/// back entries the close removed, settled a tick later). With these timings what a test sees
/// in Redis is its own calls' doing.
pub fn quiet() -> Timings {
    Timings::from_heartbeat(Duration::from_secs(60), Duration::from_secs(180))
}

/// Timings under which a node never ticks nor seeks the lease on its own within a test (a
/// 600 s heartbeat interval): a test drives its ticks (`Node::heartbeat_now`).
pub fn silent() -> Timings {
    Timings::from_heartbeat(Duration::from_secs(600), Duration::from_secs(1800))
}

/// What a thread of this process or of a node may lose to scheduling on a loaded 2-core
/// machine (load 4, both cores busy), added to bounds that measure a client's own timing.
pub const SCHED_SLACK: Duration = Duration::from_millis(700);
