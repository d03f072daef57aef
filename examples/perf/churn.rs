//! Churn, the SFU's steady load: a peer joins (`upsert_peer` with a guest id and one field, on
//! a room the node owns) and leaves (`remove_peer` with the generation the join returned), one
//! pair after the other from one thread, against two floors doing the same writes with no
//! checks:
//!
//! - the *script floor*: one Lua script call per operation (join: `HINCRBY` of the room's
//!   generation counter, `HSET` of the record's fields, `SADD` to the room's peers, `HSET` of
//!   the guest pointer; leave: `DEL`, `SREM`, `HDEL` x 2), the record's times passed in by the
//!   client, numbers passed to Redis as strings (as the library does: Redis 7.0 formats a Lua
//!   number argument with `snprintf`), a bare integer for a reply. Key schema version 2 keeps
//!   no per-instance peer index (the room index, written when the room is pinned, reaches
//!   every record), so neither the library nor the floors write one per join or leave;
//! - the *raw floor*: the same commands, one pipelined round trip of plain commands per
//!   operation.
//!
//! Each runs `pairs` x `runs` pairs in chunks of 500, interleaved (library, script floor, raw
//! floor, then script floor, raw floor, library, ...), over the same connection kind and URL
//! as the library; wall time and the server's CPU (`INFO cpu`, user + sys) per pair are
//! reported (`churn_pairs`: pairs of each kind). Then the library alone from 8 threads
//! sharing one `Node` (pairs per second, all threads together).
//!
//! Goals (issue 27): the library's pair within 1.3x the script floor, in wall time and in
//! server CPU.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sfu_redis::keys::{encode_id, IdKind, KeySpace};
use sfu_redis::{Node, Timings};

use super::common::*;
use super::server_cpu_us;

/// Pairs of one kind measured at a time (see `measure`).
const CHUNK: usize = 500;
/// Rooms the pairs spread over.
const ROOMS: usize = 50;
/// The host's instance id (also the floors' `instance` field).
const HOST: &str = "churn-host";
/// The floor's join and leave scripts (see the module docs).
const FLOOR_JOIN: &str = r"
local gen = redis.call('HINCRBY', KEYS[4], 'peer_seq', '1')
redis.call('HSET', KEYS[1], 'instance', ARGV[1], 'guest', ARGV[3], 'generation', string.format('%d', gen),
  'updated_ms', ARGV[4], 'updated_us', ARGV[5], ARGV[6], ARGV[7])
redis.call('SADD', KEYS[2], ARGV[2])
redis.call('HSET', KEYS[3], ARGV[3], ARGV[2])
return gen";
const FLOOR_LEAVE: &str = r"
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[2])
redis.call('HDEL', KEYS[4], ARGV[2])
return 1";

/// Per pair: wall time and server CPU, in µs.
#[derive(Debug, Clone, Copy)]
pub struct Cost {
    pub wall_us: f64,
    pub cpu_us: f64,
}

#[derive(Debug)]
pub struct Churn {
    pub pairs: usize,
    pub library: Cost,
    pub script_floor: Cost,
    pub raw_floor: Cost,
    /// The library from 8 threads sharing one node: pairs per second.
    pub library_8_threads_pairs_per_s: f64,
}

/// The keys and arguments of one pair, as the library names them.
struct Pair {
    record: String,
    peers: String,
    guests: String,
    guest_state: String,
    meta: String,
    peer: String,
    guest: String,
}

impl Pair {
    fn new(ks: &KeySpace, room: &str, peer: &str, guest: &str) -> Pair {
        let room = encode_id(IdKind::Room, room).expect("room id");
        let peer = encode_id(IdKind::Peer, peer).expect("peer id");
        let guest = encode_id(IdKind::Guest, guest).expect("guest id");
        let rk = ks.room(&room);
        Pair {
            record: ks.peer(&room, &peer),
            peers: rk.peers,
            guests: rk.guests,
            guest_state: rk.guest_state,
            meta: rk.meta,
            peer,
            guest,
        }
    }
}

fn names(i: usize) -> (String, String, String) {
    (
        format!("room-{}", i % ROOMS),
        format!("peer-{i}"),
        format!("guest-{i}"),
    )
}

fn now_strings() -> (String, String) {
    let us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_micros();
    ((us / 1000).to_string(), us.to_string())
}

/// `pairs` joins and leaves through `node`, one pair after the other: pair `i` (counting from
/// `offset`) is peer `peer-<i>` with guest `guest-<i>` and one field, in room
/// `rooms[i % rooms.len()]`, which `node` must hold (pinned). Pairs that run at the same time
/// (threads sharing a node) need offsets far enough apart for their peers to differ.
pub fn library_pairs(node: &Node, rooms: &[String], pairs: usize, offset: usize) {
    for i in offset..offset + pairs {
        let room = &rooms[i % rooms.len()];
        let (peer, guest) = (format!("peer-{i}"), format!("guest-{i}"));
        let generation = node
            .upsert_peer(room, &peer, Some(&guest), &[("name", "x")])
            .expect("upsert_peer");
        assert!(
            node.remove_peer(room, &peer, generation)
                .expect("remove_peer"),
            "the pair's own remove"
        );
    }
}

fn script_floor_pairs(con: &mut impl redis::ConnectionLike, ks: &KeySpace, pairs: usize) {
    let join = redis::Script::new(FLOOR_JOIN);
    let leave = redis::Script::new(FLOOR_LEAVE);
    for i in 0..pairs {
        let (room, peer, guest) = names(i);
        let p = Pair::new(ks, &room, &peer, &guest);
        let (ms, us) = now_strings();
        let _: i64 = join
            .key(&p.record)
            .key(&p.peers)
            .key(&p.guests)
            .key(&p.meta)
            .arg(HOST)
            .arg(&p.peer)
            .arg(&p.guest)
            .arg(ms)
            .arg(us)
            .arg("name")
            .arg("x")
            .invoke(con)
            .expect("floor join");
        let _: i64 = leave
            .key(&p.record)
            .key(&p.peers)
            .key(&p.guests)
            .key(&p.guest_state)
            .arg(&p.peer)
            .arg(&p.guest)
            .invoke(con)
            .expect("floor leave");
    }
}

fn raw_floor_pairs(con: &mut impl redis::ConnectionLike, ks: &KeySpace, pairs: usize) {
    for i in 0..pairs {
        let (room, peer, guest) = names(i);
        let p = Pair::new(ks, &room, &peer, &guest);
        let (ms, us) = now_strings();
        let _: () = redis::pipe()
            .hincr(&p.meta, "peer_seq", 1)
            .ignore()
            .hset_multiple(
                &p.record,
                &[
                    ("instance", HOST),
                    ("guest", p.guest.as_str()),
                    ("generation", "1"),
                    ("updated_ms", ms.as_str()),
                    ("updated_us", us.as_str()),
                    ("name", "x"),
                ],
            )
            .ignore()
            .sadd(&p.peers, &p.peer)
            .ignore()
            .hset(&p.guests, &p.guest, &p.peer)
            .ignore()
            .query(con)
            .expect("raw join");
        let _: () = redis::pipe()
            .del(&p.record)
            .ignore()
            .srem(&p.peers, &p.peer)
            .ignore()
            .hdel(&p.guests, &p.guest)
            .ignore()
            .hdel(&p.guest_state, &p.guest)
            .ignore()
            .query(con)
            .expect("raw leave");
    }
}

/// Runs `f` once: its wall time and the server CPU it cost (µs).
fn timed(fab: &mut impl redis::ConnectionLike, f: impl FnOnce()) -> (Duration, u64) {
    let cpu = server_cpu_us(fab);
    let started = Instant::now();
    f();
    let took = started.elapsed();
    (took, server_cpu_us(fab) - cpu)
}

/// Measures churn at `url` (the library's and the floors' connections) with `direct` for the
/// CPU readings: `pairs` x `runs` pairs of each kind, in chunks of [`CHUNK`], interleaved.
pub fn measure(url: &str, direct: &str, pairs: usize, runs: usize) -> Churn {
    let ks = keyspace();
    // Default timings: a tick every 10 s, rarely during a run.
    let cfg = Target::plain(url)
        .builder()
        .instance_id(HOST)
        .timings(Timings::default())
        .build()
        .expect("config");
    let node = Arc::new(Node::start(cfg).expect("start the churn host"));
    // The rooms of the floors' pairs (`names`).
    let rooms: Vec<String> = (0..ROOMS).map(|r| format!("room-{r}")).collect();
    for r in &rooms {
        node.pin_room(r).expect("pin");
    }
    let mut fab = connect(direct);
    let mut via = connect(url);
    // Warm up: scripts loaded, connections pooled, the rooms' counters created.
    library_pairs(&node, &rooms, 200, 0);
    script_floor_pairs(&mut via, &ks, 200);
    raw_floor_pairs(&mut via, &ks, 200);
    // With SFU_PERF_CALLGRIND: one chunk of each kind counted in instructions, one dump each
    // ("library churn", "script floor churn", "raw floor churn"), before the timed chunks.
    if std::env::var_os("SFU_PERF_CALLGRIND").is_some() {
        super::callgrind(&mut fab, true, "");
        library_pairs(&node, &rooms, CHUNK, 0);
        super::callgrind(&mut fab, false, "library churn");
        super::callgrind(&mut fab, true, "");
        script_floor_pairs(&mut via, &ks, CHUNK);
        super::callgrind(&mut fab, false, "script floor churn");
        super::callgrind(&mut fab, true, "");
        raw_floor_pairs(&mut via, &ks, CHUNK);
        super::callgrind(&mut fab, false, "raw floor churn");
    }
    // Interleaved in chunks of CHUNK pairs, the order rotating, so that a change of the
    // machine's speed during the run (other tenants, frequency) weighs on all three alike.
    let chunks = (pairs * runs).div_ceil(CHUNK);
    let mut totals = [(Duration::ZERO, 0u64); 3];
    for c in 0..chunks {
        for k in 0..3 {
            let kind = (c + k) % 3;
            let (d, cpu) = match kind {
                0 => timed(&mut fab, || library_pairs(&node, &rooms, CHUNK, 0)),
                1 => timed(&mut fab, || script_floor_pairs(&mut via, &ks, CHUNK)),
                _ => timed(&mut fab, || raw_floor_pairs(&mut via, &ks, CHUNK)),
            };
            totals[kind].0 += d;
            totals[kind].1 += cpu;
        }
    }
    let per_pair = |(d, cpu): (Duration, u64)| Cost {
        wall_us: d.as_secs_f64() * 1e6 / (chunks * CHUNK) as f64,
        cpu_us: cpu as f64 / (chunks * CHUNK) as f64,
    };
    let threads = 8;
    let started = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (node, rooms) = (Arc::clone(&node), &rooms);
            s.spawn(move || library_pairs(&node, rooms, pairs / threads, t * pairs));
        }
    });
    let eight = (pairs / threads * threads) as f64 / started.elapsed().as_secs_f64();
    node.leave().expect("leave");
    Churn {
        pairs: chunks * CHUNK,
        library: per_pair(totals[0]),
        script_floor: per_pair(totals[1]),
        raw_floor: per_pair(totals[2]),
        library_8_threads_pairs_per_s: eight.round(),
    }
}

/// The report's churn fields.
pub fn fields(c: &Churn) -> serde_json::Value {
    let r1 = |x: f64| (x * 10.0).round() / 10.0;
    let r2 = |x: f64| (x * 100.0).round() / 100.0;
    json!({
        "churn_pairs": c.pairs,
        "churn_library_wall_us": r1(c.library.wall_us),
        "churn_library_cpu_us": r1(c.library.cpu_us),
        "churn_script_floor_wall_us": r1(c.script_floor.wall_us),
        "churn_script_floor_cpu_us": r1(c.script_floor.cpu_us),
        "churn_raw_floor_wall_us": r1(c.raw_floor.wall_us),
        "churn_raw_floor_cpu_us": r1(c.raw_floor.cpu_us),
        "churn_wall_vs_script_floor": r2(c.library.wall_us / c.script_floor.wall_us),
        "churn_cpu_vs_script_floor": r2(c.library.cpu_us / c.script_floor.cpu_us),
        "churn_8_threads_pairs_per_s": c.library_8_threads_pairs_per_s,
    })
}

/// The churn goals: (goal, met).
pub fn goals(c: &Churn) -> [(&'static str, bool); 2] {
    [
        (
            "join + leave wall <= 1.3x script floor",
            c.library.wall_us <= 1.3 * c.script_floor.wall_us,
        ),
        (
            "join + leave Redis CPU <= 1.3x script floor",
            c.library.cpu_us <= 1.3 * c.script_floor.cpu_us,
        ),
    ]
}
