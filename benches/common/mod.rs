//! Shared by the benchmarks and `examples/perf_report.rs`: a dead instance's data written
//! exactly as the library writes it, the seed-style baseline reaper, and the floor.
//!
//! Everything takes a plain `redis://` URL and uses the stage [`STAGE`], as the criterion
//! benches do; the `*_at` variants take a [`Target`] instead (a `rediss://` URL with its CA
//! file, and a stage of its own), for `perf_report --tls`.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use sfu_redis::keys::KeySpace;
use sfu_redis::ops::conn::Conn as Connection;
use sfu_redis::ops::conn::{server_time_ms, Redis};
use sfu_redis::{Config, ConfigBuilder, Node, Timings};
use sfu_redis_testkit::data::{fabricate_dead, DeadInstance, FakeRoom, BATCH};
use sfu_redis_testkit::devserver::LocalRedis;

/// Peers per room in every reap benchmark.
pub const PEERS_PER_ROOM: usize = 4;

/// The stage every benchmark uses.
pub const STAGE: &str = "bench";

pub fn keyspace() -> KeySpace {
    KeySpace::new("sfu", STAGE, "main").expect("key space")
}

/// Timings for benchmarks: the defaults (10 s heartbeat), so background ticks and reap rounds
/// rarely run during a measurement.
pub fn timings() -> Timings {
    Timings::default()
}

/// Where a benchmark's nodes and connections go: the URL, the CA file a `rediss://` server's
/// certificate must chain to, and the stage of the key prefix (two targets with different
/// stages share a server without seeing each other's data or lease).
#[derive(Debug, Clone)]
pub struct Target {
    pub url: String,
    pub tls_ca: Option<PathBuf>,
    pub stage: String,
}

impl Target {
    /// A plaintext `redis://` URL, stage [`STAGE`]: what every `url` argument below means.
    pub fn plain(url: &str) -> Target {
        Target {
            url: url.to_owned(),
            tls_ca: None,
            stage: STAGE.to_owned(),
        }
    }

    /// A `rediss://` URL whose server certificate chains to `ca`, stage [`STAGE`].
    pub fn tls(url: &str, ca: impl Into<PathBuf>) -> Target {
        Target {
            tls_ca: Some(ca.into()),
            ..Target::plain(url)
        }
    }

    /// The same target with another stage.
    pub fn with_stage(self, stage: &str) -> Target {
        Target {
            stage: stage.to_owned(),
            ..self
        }
    }

    /// The key space of this target's nodes.
    pub fn keyspace(&self) -> KeySpace {
        KeySpace::new("sfu", &self.stage, "main").expect("key space")
    }

    /// A config builder with this target's URL, CA file and stage.
    pub fn builder(&self) -> ConfigBuilder {
        let b = Config::builder().redis_url(&self.url).stage(&self.stage);
        match &self.tls_ca {
            Some(ca) => b.tls_ca_file(ca),
            None => b,
        }
    }
}

pub fn config(url: &str, instance: &str) -> Config {
    config_at(&Target::plain(url), instance)
}

/// [`config`] for `target`.
pub fn config_at(target: &Target, instance: &str) -> Config {
    target
        .builder()
        .instance_id(instance)
        .timings(timings())
        .build()
        .expect("config")
}

/// A node that holds the lease (waits for it: no lease is granted within a lease TTL of a
/// fresh dataset, so with default timings this takes up to 90 s; use [`fast_leader`]).
pub fn leader(url: &str) -> Node {
    let node = Node::start(config(url, "bench-leader")).expect("start leader");
    let deadline = Instant::now() + Duration::from_secs(300);
    while !node.is_leader() {
        assert!(Instant::now() < deadline, "no lease within 300 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    node
}

/// A leader with timings short enough to win the lease in about a second, and a reap round
/// interval long enough not to run during a measurement.
pub fn fast_leader(url: &str) -> Node {
    fast_leader_with_batch(url, sfu_redis::REAP_BATCH)
}

/// [`fast_leader`] with its reap batch size set to `batch`.
pub fn fast_leader_with_batch(url: &str, batch: usize) -> Node {
    fast_leader_at(&Target::plain(url), batch)
}

/// [`fast_leader_with_batch`] for `target`. Unpaced (`reap_pace` 0): the throughput
/// measurements time the reap's own work; the pace is measured on its own
/// ([`fast_leader_paced`], `perf_report --pace-sweep`).
pub fn fast_leader_at(target: &Target, batch: usize) -> Node {
    fast_leader_paced(target, batch, 0.0)
}

/// [`fast_leader_at`] with the reaper's pace set to `pace` (`ConfigBuilder::reap_pace`).
pub fn fast_leader_paced(target: &Target, batch: usize, pace: f64) -> Node {
    let mut t = Timings::from_heartbeat(Duration::from_millis(500), Duration::from_millis(1500));
    t.reap_interval = Duration::from_secs(3600);
    t.two_phase_delay = Duration::from_secs(3600);
    // 1 s instead of the derived 250 ms: on a loaded machine a 500-room batch's round trip
    // can take longer, and a long (paced) reap must not fail on it.
    t.command_timeout = Duration::from_secs(1);
    let cfg = target
        .builder()
        .instance_id("bench-leader")
        .timings(t)
        .reap_batch(batch)
        .reap_pace(pace)
        .build()
        .expect("config");
    let node = Node::start(cfg).expect("start leader");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !node.is_leader() {
        assert!(Instant::now() < deadline, "no lease within 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    node
}

/// A connection from the library's connector (30 s timeouts: a benchmark's big pipelines).
pub fn connect(url: &str) -> Connection {
    Redis::new(url, Duration::from_secs(30))
        .and_then(|r| r.connect())
        .expect("connect")
}

pub fn server() -> LocalRedis {
    LocalRedis::start().expect("start redis-server (is it on PATH?)")
}

/// Writes a dead instance `dead` with `rooms` rooms (`<dead>-r<k>`) of [`PEERS_PER_ROOM`]
/// peers each, as the library writes them (`sfu_redis_testkit::data::fabricate_dead`: the room
/// index, pins for an hour, metadata naming it, peer records, guests), with a heartbeat score a
/// minute old and no heartbeat key. Returns every key written (for the floor).
pub fn fabricate(con: &mut Connection, ks: &KeySpace, dead: &str, rooms: usize) -> Vec<String> {
    let score = server_time_ms(con).expect("TIME") - 60_000;
    let spec = DeadInstance {
        pin_px: Some(3_600_000),
        peer_field: Some("bench"),
        ..DeadInstance::new(dead, score)
    };
    let rooms: Vec<FakeRoom> = (0..rooms)
        .map(|r| FakeRoom::numbered(format!("{dead}-r{r}"), PEERS_PER_ROOM))
        .collect();
    fabricate_dead(con, ks, &spec, &rooms).expect("fabricate")
}

/// The seed system's reap, on the same data: `SMEMBERS` of the room index, then one script
/// round trip per room (owner check; delete the room's keys and its peer records; `SREM`
/// from the room index), then the instance's own keys. Returns the rooms reaped. (Key schema
/// version 2 keeps no peer index, so neither does this baseline: the same writes as the
/// library's reap, minus its checks.)
pub fn seed_style_reap(con: &mut Connection, ks: &KeySpace, dead: &str) -> usize {
    let script = redis::Script::new(
        r"
local owner = redis.call('GET', KEYS[1])
local meta_owner = redis.call('HGET', KEYS[2], 'owner')
if owner ~= ARGV[1] and not (owner == false and meta_owner == ARGV[1]) then return 0 end
local base = string.sub(KEYS[1], 1, -6)
for _, p in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  redis.call('DEL', base .. 'peer:' .. p)
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
redis.call('SREM', KEYS[6], ARGV[2])
return 1
",
    );
    let rooms: Vec<String> = redis::cmd("SMEMBERS")
        .arg(ks.instance_rooms(dead))
        .query(con)
        .expect("SMEMBERS");
    let mut reaped = 0;
    for room in &rooms {
        let rk = ks.room(room);
        let n: i64 = script
            .key(&rk.owner)
            .key(&rk.meta)
            .key(&rk.peers)
            .key(&rk.guests)
            .key(&rk.guest_state)
            .key(ks.instance_rooms(dead))
            .arg(dead)
            .arg(room)
            .invoke(con)
            .expect("seed-style reap");
        reaped += n as usize;
    }
    redis::pipe()
        .del(ks.heartbeat(dead))
        .ignore()
        .zrem(ks.heartbeats(), dead)
        .ignore()
        .query::<()>(con)
        .expect("finish");
    reaped
}

/// Sends one command per room of `keys` (as [`fabricate`] returns them: each room's keys, then
/// the room index key as one last group), [`BATCH`] rooms per pipelined round trip.
fn per_room_pipelined(
    con: &mut Connection,
    keys: &[String],
    what: &str,
    mut add: impl FnMut(&mut redis::Pipeline, &[String]),
) {
    for chunk in keys
        .chunks(5 + PEERS_PER_ROOM)
        .collect::<Vec<_>>()
        .chunks(BATCH)
    {
        let mut pipe = redis::pipe();
        for room_keys in chunk {
            add(&mut pipe, room_keys);
        }
        pipe.query::<()>(con).expect(what);
    }
}

/// The floor: the same keys removed by pipelined `UNLINK` (one per room's keys), no checks.
pub fn floor_reap(con: &mut Connection, keys: &[String]) {
    per_room_pipelined(con, keys, "UNLINK", |pipe, room_keys| {
        pipe.cmd("UNLINK").arg(room_keys).ignore();
    });
}

/// The script floor: the same keys removed by one Lua script per room (`UNLINK` of the keys
/// passed in `KEYS`, no checks), pipelined [`BATCH`] per round trip. What any per-room atomic step
/// costs before it checks anything: EVALSHA's fixed cost and the in-script command overhead.
pub fn script_floor_reap(con: &mut Connection, keys: &[String]) {
    let script = redis::Script::new("return redis.call('UNLINK', unpack(KEYS))");
    let _: String = script.prepare_invoke().load(con).expect("SCRIPT LOAD");
    per_room_pipelined(con, keys, "script floor", |pipe, room_keys| {
        let mut inv = script.prepare_invoke();
        for k in room_keys {
            inv.key(k);
        }
        pipe.invoke_script(&inv).ignore();
    });
}

/// Every key of the bench prefix (for checks).
pub fn count_keys(con: &mut Connection) -> usize {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("sfu:{STAGE}:main:*"))
        .query(con)
        .expect("KEYS");
    keys.iter().filter(|k| !k.contains("{ctl}")).count()
}
