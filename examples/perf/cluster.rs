//! `perf_report --cluster`: the reap, the heartbeat tick and churn on a Redis Cluster of 3
//! masters and on one standalone server, in one run, alternating (standalone then cluster,
//! then cluster then standalone, ...) so a noisy neighbour hits both alike.
//! `perf_report --cluster --churn` runs the churn part alone (no reap, no tick).
//!
//! Each Redis has its own leader and ticker, live for the whole run. Fabrication goes over the
//! library's connector (on the cluster: routed by slot, one pipeline split per master), outside
//! the timed parts. Server CPU is `INFO cpu` (user + sys) of each server before and after each
//! timed call, read on direct connections to every master: the cluster's total and each
//! master's share of it. The tick's round trips per master are counted by the library's
//! cluster connections (`sfu_redis::ops::conn::cluster_round_trips`, feature `testing`).
//!
//! Churn (issue 31), the SFU's steady load: a peer joins (`Node::upsert_peer` with a guest id
//! and one field) and leaves (`Node::remove_peer` with the generation the join returned), in
//! rooms the host node pinned first (`examples/perf/churn.rs`, `library_pairs`). One host node
//! per side (default timings), 300 rooms, the same ids on both sides, chosen so that each
//! master serves 100 of them (`cluster_churn_rooms_by_master`, also printed); each room's
//! pairs go to its master (key schema version 2: a join or a leave is one script call in the
//! room's slot on every topology, no `{ctl}` round trip). From one thread: 3,000 pairs per side
//! per run (`--pairs` sets another count) in chunks of 600 (two in every room), the sides
//! alternating chunk by chunk, server CPU read before and after each chunk
//! (`churn_pairs`: pairs per side, all runs):
//!
//! - `standalone_churn_wall_us_per_pair`, `cluster_churn_wall_us_per_pair`: wall time per pair;
//! - `standalone_churn_cpu_us_per_pair`: the standalone server's CPU per pair;
//! - `cluster_churn_cpu_us_per_pair_by_master` (in `cluster_master_ports` order),
//!   `cluster_churn_cpu_us_per_pair_total`: each master's CPU per pair, and their sum;
//! - `cluster_churn_cpu_share_pct`: each master's share of the cluster's churn CPU;
//! - `cluster_churn_busiest_vs_standalone`: the busiest master's CPU per pair over the
//!   standalone server's (what bounds the cluster's churn capacity against one server's).
//!
//! Then, per run, the same number of pairs from 8 threads sharing the host node, the sides
//! alternating (`churn_8_threads_pairs`: pairs per side, all runs):
//! `standalone_churn_8_threads_pairs_per_s`, `cluster_churn_8_threads_pairs_per_s`,
//! `cluster_vs_standalone_8_threads` (cluster / standalone). Where that time went, per side
//! over all its 8-thread runs: `machine_cores` (the cores this process may use),
//! `*_churn_8_threads_cores_busy` (the side's servers' CPU and the host process's own,
//! `getrusage`, over the wall time: near `machine_cores` means the machine, not Redis, bounds
//! the figure), `*_churn_8_threads_host_cpu_us_per_pair`,
//! `standalone_churn_8_threads_server_cpu_us_per_pair`,
//! `cluster_churn_8_threads_server_cpu_us_per_pair_by_master`, and
//! `cluster_vs_standalone_8_threads_server_bound`: one server's CPU per pair over the busiest
//! master's, the cluster's throughput over one server's on a machine where every server has a
//! core of its own and the hosts have theirs (an estimate: per-pair CPU falls somewhat as a
//! server saturates).
//!
//! `SFU_PERF_STATS=1` also prints each master's `INFO commandstats` of the first cluster reap
//! and each server's of the first churn chunk of both sides (calls and µs per command,
//! commands inside scripts included).
//! `SFU_PERF_CALLGRIND=1` (every `redis-server` under callgrind, as for the reap: see
//! docs/src/performance.md) dumps each server's instructions for the first churn chunk of both
//! sides, one dump per server named `churn standalone <port>` / `churn cluster <port>`.
//!
//! `cluster_master_ports` lists the masters in the order of the `*_cpu_share_pct` and
//! `*_by_master` arrays and `cluster_ctl_master_port` names the one serving `{ctl}` (the
//! control plane's slot).
//!
//! Goals (issue 13): each master's share of the reap's CPU within 10 points of a third; the
//! cluster reap at least 0.8x as fast as the standalone one (`cluster_reap_speed` =
//! standalone ms / cluster ms); at most 2 tick round trips per master. Goals (issue 31), for
//! churn: the busiest master's CPU per pair at most 0.35x the standalone server's; no
//! master's share of the churn CPU above 40 %; from 8 threads, at least 2x the standalone
//! server's pairs per second on 3 masters.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sfu_redis::keys::{encode_id, IdKind};
use sfu_redis::Node;
use sfu_redis_testkit::cluster::LocalCluster;
use sfu_redis_testkit::devserver::LocalRedis;

use super::churn::library_pairs;
use super::common::*;
use super::{median_of, ms, server_cpu_us, Args};

/// A plain driver connection to the master on `port` (the library's connector refuses a
/// cluster node's address given as a standalone URL).
fn direct(port: u16) -> redis::Connection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .expect("client")
        .get_connection()
        .expect("connect to a master")
}

/// `INFO cpu` user + sys of the server on `port`, µs.
fn cpu_us(port: u16) -> u64 {
    let mut con = direct(port);
    server_cpu_us(&mut con)
}

/// `INFO commandstats` of the server on `port`: command -> (calls, usec).
fn commandstats(port: u16) -> BTreeMap<String, (u64, u64)> {
    let mut con = direct(port);
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut con)
        .expect("INFO");
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |f: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(f)?.strip_prefix('='))
                    .and_then(|v| v.parse::<u64>().ok())
            };
            Some((name.to_owned(), (field("calls")?, field("usec")?)))
        })
        .collect()
}

/// Each port's `INFO commandstats` before a timed part, with `SFU_PERF_STATS=1` and `first`
/// (the part's first cluster run), for [`print_commandstats_since`].
fn stats_before(first: bool, ports: &[u16]) -> Option<Vec<BTreeMap<String, (u64, u64)>>> {
    (first && std::env::var_os("SFU_PERF_STATS").is_some())
        .then(|| ports.iter().map(|p| commandstats(*p)).collect())
}

/// Prints each master's `INFO commandstats` since `before` (one [`commandstats`] per port of
/// `ports`): (command, calls, µs) by µs, most first.
fn print_commandstats_since(ports: &[u16], before: &[BTreeMap<String, (u64, u64)>]) {
    for (port, was) in ports.iter().zip(before) {
        let now = commandstats(*port);
        let mut diff: Vec<(String, u64, u64)> = now
            .iter()
            .map(|(k, (c, u))| {
                let (c0, u0) = was.get(k).copied().unwrap_or((0, 0));
                (k.clone(), c - c0, u - u0)
            })
            .filter(|(_, c, _)| *c > 0)
            .collect();
        diff.sort_by_key(|d| std::cmp::Reverse(d.2));
        eprintln!("master {port}: {diff:?}");
    }
}

/// The master serving each slot (indexed by slot), from `CLUSTER SLOTS` of the node on `port`.
fn slot_masters(port: u16) -> Vec<u16> {
    let mut con = direct(port);
    let ranges: Vec<Vec<redis::Value>> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(&mut con)
        .expect("CLUSTER SLOTS");
    let num = |v: &redis::Value| redis::from_redis_value_ref::<u16>(v).expect("CLUSTER SLOTS");
    let mut map = vec![0u16; 16384];
    for range in &ranges {
        let master: Vec<redis::Value> =
            redis::from_redis_value_ref(&range[2]).expect("CLUSTER SLOTS");
        let (first, last) = (usize::from(num(&range[0])), usize::from(num(&range[1])));
        map[first..=last].fill(num(&master[1]));
    }
    assert!(!map.contains(&0), "CLUSTER SLOTS leaves slots unserved");
    map
}

/// The slot of `key` (`CLUSTER KEYSLOT` on `con`).
fn key_slot(con: &mut redis::Connection, key: &str) -> usize {
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query(con)
        .expect("CLUSTER KEYSLOT")
}

/// One Redis: its URL, the ports whose CPU counts, the key space of its prefix.
struct Side {
    name: &'static str,
    target: Target,
    ports: Vec<u16>,
}

#[derive(Default)]
struct Samples {
    took: Vec<Duration>,
    /// Server CPU of each run, per port.
    cpu: Vec<Vec<u64>>,
}

impl Samples {
    fn median_ms(&self) -> f64 {
        ms(median_of(&self.took))
    }

    /// Each port's CPU summed over the runs, over `n` (pairs, rooms): µs per unit.
    fn cpu_per(&self, n: usize) -> Vec<f64> {
        let ports = self.cpu.first().map_or(0, Vec::len);
        (0..ports)
            .map(|i| {
                let total: u64 = self.cpu.iter().map(|c| c[i]).sum();
                total as f64 / n as f64
            })
            .collect()
    }

    /// Each port's share of the CPU summed over the runs, in percent.
    fn shares(&self) -> Vec<f64> {
        let n = self.cpu.first().map_or(0, Vec::len);
        let per: Vec<u64> = (0..n)
            .map(|i| self.cpu.iter().map(|c| c[i]).sum())
            .collect();
        let total: u64 = per.iter().sum::<u64>().max(1);
        per.iter()
            .map(|c| (*c as f64 * 1000.0 / total as f64).round() / 10.0)
            .collect()
    }

    /// Median total server CPU of a run, ms.
    fn median_cpu_ms(&self) -> f64 {
        let mut v: Vec<u64> = self.cpu.iter().map(|c| c.iter().sum()).collect();
        v.sort();
        v[v.len() / 2] as f64 / 1000.0
    }
}

fn timed(side: &Side, f: impl FnOnce() -> Duration, out: &mut Samples) {
    let before: Vec<u64> = side.ports.iter().map(|p| cpu_us(*p)).collect();
    let took = f();
    let after: Vec<u64> = side.ports.iter().map(|p| cpu_us(*p)).collect();
    out.took.push(took);
    out.cpu.push(
        after
            .iter()
            .zip(&before)
            .map(|(a, b)| a.saturating_sub(*b))
            .collect(),
    );
}

fn order(i: usize) -> [usize; 2] {
    if i % 2 == 0 {
        [0, 1]
    } else {
        [1, 0]
    }
}

/// A goal line: what is asked, and whether it is met.
type Goal = (&'static str, bool);

pub fn report(a: &Args) {
    if a.rtt_ms > 0.0 {
        eprintln!("perf_report --cluster: --rtt-ms is ignored (loopback only)");
    }
    let churn_only = std::env::args().any(|arg| arg == "--churn");
    let one = LocalRedis::start().expect("start redis-server");
    let cluster = LocalCluster::start(3, 0).expect("start a Redis Cluster of 3 masters");
    let sides = [
        Side {
            name: "standalone",
            target: Target::plain(&one.url()).with_stage("bench-one"),
            ports: vec![one.port()],
        },
        Side {
            name: "cluster",
            target: Target::plain(&cluster.url()).with_stage("bench-cls"),
            ports: cluster.master_ports(),
        },
    ];
    eprintln!(
        "perf_report --cluster{}: {} runs each, standalone {} and a 3-master cluster {}, alternating",
        if churn_only { " --churn" } else { "" },
        a.runs,
        sides[0].target.url,
        sides[1].target.url
    );
    let slots = slot_masters(sides[1].ports[0]);
    let ctl_port = {
        let mut con = direct(sides[1].ports[0]);
        slots[key_slot(&mut con, &sides[1].target.keyspace().heartbeats())]
    };
    let mut report = json!({
        "mode": "cluster",
        "churn_only": churn_only,
        "runs": a.runs,
        "masters": sides[1].ports.len(),
        "cluster_master_ports": sides[1].ports,
        "cluster_ctl_master_port": ctl_port,
    });
    let mut goals: Vec<Goal> = Vec::new();
    let mut parts = Vec::new();
    if !churn_only {
        let (fields, met) = reap_and_tick(a, &sides);
        parts.push(fields);
        goals.extend(met);
    }
    let pairs = super::arg("--pairs")
        .and_then(|v| v.parse().ok())
        .unwrap_or(CHURN_PAIRS)
        .max(CHURN_THREADS);
    let churn = measure_churn(&sides, &slots, pairs, a.runs);
    parts.push(churn_fields(&churn));
    goals.extend(churn_goals(&churn));
    for part in parts {
        if let (Some(all), serde_json::Value::Object(more)) = (report.as_object_mut(), part) {
            all.extend(more);
        }
    }
    println!("{report}");
    for (goal, met) in goals {
        eprintln!("  {} {goal}", if met { "MET   " } else { "MISSED" });
    }
    eprintln!(
        "  8 threads kept {:.2} (standalone) and {:.2} (cluster) of this machine's {} cores busy; the servers alone, each on a core of its own, would allow the cluster {:.2}x one server's pairs per second",
        churn.threaded_cores_busy(0),
        churn.threaded_cores_busy(1),
        machine_cores(),
        churn.threaded_server_bound()
    );
}

/// The reap (`a.rooms` rooms of a fabricated dead instance, `a.runs` times) and the tick
/// (`a.rooms` pinned rooms, 3 x `a.runs` times) on each side, alternating: their fields of
/// the report and their goals.
fn reap_and_tick(a: &Args, sides: &[Side; 2]) -> (serde_json::Value, Vec<Goal>) {
    eprintln!("reap and tick: {} rooms x {PEERS_PER_ROOM} peers", a.rooms);
    let mut fabs: Vec<_> = sides.iter().map(|s| connect(&s.target.url)).collect();
    let leaders: Vec<Node> = std::thread::scope(|sc| {
        let started: Vec<_> = sides
            .iter()
            .map(|side| sc.spawn(|| fast_leader_at(&side.target, a.batch)))
            .collect();
        started
            .into_iter()
            .map(|h| h.join().expect("leader"))
            .collect()
    });
    let mut reaps = [Samples::default(), Samples::default()];
    for i in 0..a.runs {
        for s in order(i) {
            let ks = sides[s].target.keyspace();
            fabricate(&mut fabs[s], &ks, "dead", a.rooms);
            let leader = &leaders[s];
            let rooms = a.rooms;
            let name = sides[s].name;
            let before = stats_before(s == 1 && i == 0, &sides[s].ports);
            timed(
                &sides[s],
                || {
                    let t = Instant::now();
                    let c = leader.reap_now("dead").expect("reap").expect("dead");
                    let took = t.elapsed();
                    assert_eq!(c.rooms as usize, rooms, "{name} reap");
                    took
                },
                &mut reaps[s],
            );
            if let Some(before) = &before {
                // Where each master's time went during the first cluster reap.
                print_commandstats_since(&sides[s].ports, before);
            }
            let left = count_prefix(&mut fabs[s], &ks.scan_pattern());
            assert_eq!(left, 0, "the {name} reap left keys");
            let _: () = redis::cmd("ZREM")
                .arg(ks.heartbeats())
                .arg("dead")
                .query(&mut fabs[s])
                .expect("ZREM");
        }
    }
    for l in &leaders {
        l.shutdown().ok();
    }

    let tickers: Vec<Node> = sides
        .iter()
        .map(|side| {
            let n = Node::start(config_at(&side.target, "ticker")).expect("ticker");
            for r in 0..a.rooms {
                n.pin_room(&format!("tick-r{r}")).expect("pin");
            }
            n
        })
        .collect();
    let mut ticks = [Samples::default(), Samples::default()];
    let mut trips: Vec<BTreeMap<String, u64>> = Vec::new();
    for i in 0..a.runs * 3 {
        for s in order(i) {
            let before = sfu_redis::ops::conn::cluster_round_trips();
            let ticker = &tickers[s];
            timed(
                &sides[s],
                || {
                    let t = Instant::now();
                    ticker.heartbeat_now().expect("tick");
                    t.elapsed()
                },
                &mut ticks[s],
            );
            if s == 1 {
                let after = sfu_redis::ops::conn::cluster_round_trips();
                trips.push(
                    after
                        .into_iter()
                        .map(|(k, v)| {
                            let was = before.get(&k).copied().unwrap_or(0);
                            (k, v - was)
                        })
                        .filter(|(_, v)| *v > 0)
                        .collect(),
                );
            }
        }
    }
    for t in &tickers {
        t.leave().ok();
    }
    let max_trips = trips
        .iter()
        .flat_map(|t| t.values().copied())
        .max()
        .unwrap_or(0);
    let shares = reaps[1].shares();
    let speed = (reaps[0].median_ms() / reaps[1].median_ms() * 100.0).round() / 100.0;
    let spread_ok = shares.iter().all(|s| (s - 100.0 / 3.0).abs() <= 10.0);
    let fields = json!({
        "rooms": a.rooms,
        "peers_per_room": PEERS_PER_ROOM,
        "reap_batch": a.batch,
        "tick_runs": a.runs * 3,
        "standalone_reap_ms": reaps[0].median_ms(),
        "cluster_reap_ms": reaps[1].median_ms(),
        "cluster_reap_speed": speed,
        "standalone_reap_server_cpu_ms": reaps[0].median_cpu_ms(),
        "cluster_reap_server_cpu_ms": reaps[1].median_cpu_ms(),
        "cluster_reap_cpu_share_pct": shares,
        "standalone_tick_ms": ticks[0].median_ms(),
        "cluster_tick_ms": ticks[1].median_ms(),
        "standalone_tick_server_cpu_ms": ticks[0].median_cpu_ms(),
        "cluster_tick_server_cpu_ms": ticks[1].median_cpu_ms(),
        "cluster_tick_cpu_share_pct": ticks[1].shares(),
        "cluster_tick_round_trips_per_master": trips.last(),
        "cluster_tick_round_trips_max": max_trips,
        "standalone_reap_runs_ms": reaps[0].took.iter().map(|d| ms(*d)).collect::<Vec<_>>(),
        "cluster_reap_runs_ms": reaps[1].took.iter().map(|d| ms(*d)).collect::<Vec<_>>(),
    });
    let goals = vec![
        (
            "each master's reap CPU share within 10 points of a third",
            spread_ok,
        ),
        ("cluster reap >= 0.8x the standalone one", speed >= 0.8),
        ("tick <= 2 round trips per master", max_trips <= 2),
    ];
    (fields, goals)
}

/// Churn: join + leave pairs per side per run (`--pairs` sets another count).
const CHURN_PAIRS: usize = 3000;
/// Rooms the churn host pins and its pairs spread over, as many on each master.
const CHURN_ROOMS: usize = 300;
/// Pairs of one side measured at a time: two in every room.
const CHURN_CHUNK: usize = 2 * CHURN_ROOMS;
/// Host threads sharing the churn host's node in the throughput part.
const CHURN_THREADS: usize = 8;
/// The churn host's instance id (each side has its own key prefix).
const CHURN_HOST: &str = "churn-host";

/// The churn measurements of both sides (index 0 standalone, 1 cluster).
struct Churn {
    /// Rooms served by each master, in `cluster_master_ports` order.
    rooms_by_master: Vec<usize>,
    /// Single-thread pairs of each side.
    pairs: usize,
    /// Each chunk's wall time and server CPU per port.
    one_thread: [Samples; 2],
    /// Pairs of each side in the 8-thread part, and their wall times and server CPU per port.
    threaded_pairs: usize,
    threaded: [Samples; 2],
    /// The host process's own CPU (all its threads, user + sys) in each side's 8-thread
    /// parts, µs.
    threaded_host_cpu: [u64; 2],
}

/// This process's CPU time so far (every thread, user + sys), µs: `getrusage(RUSAGE_SELF)`.
fn host_cpu_us() -> u64 {
    // SAFETY: getrusage writes the struct it is given, zeroed here, and reads nothing else.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable rusage.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    assert_eq!(rc, 0, "getrusage");
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    us(u.ru_utime) + us(u.ru_stime)
}

/// [`CHURN_ROOMS`] room ids, as many served by each master of `side` (by the slot of their
/// keys' hash tag on the cluster side's key space): the ids, and how many each master serves.
fn churn_rooms(side: &Side, slots: &[u16]) -> (Vec<String>, Vec<usize>) {
    let ks = side.target.keyspace();
    let mut con = direct(side.ports[0]);
    let per_master = CHURN_ROOMS / side.ports.len();
    let mut counts = vec![0; side.ports.len()];
    let mut rooms = Vec::with_capacity(CHURN_ROOMS);
    for k in 0.. {
        if rooms.len() == per_master * side.ports.len() {
            break;
        }
        let room = format!("churn-r{k}");
        let encoded = encode_id(IdKind::Room, &room).expect("room id");
        let served_by = slots[key_slot(&mut con, &ks.room(&encoded).owner)];
        let m = side
            .ports
            .iter()
            .position(|p| *p == served_by)
            .expect("a master serves the room");
        if counts[m] < per_master {
            counts[m] += 1;
            rooms.push(room);
        }
    }
    (rooms, counts)
}

/// Churn on both sides: one host node each (default timings: a tick every 10 s), holding the
/// pins of the same rooms (spread evenly over the masters); `pairs` x `runs` join + leave
/// pairs from one thread in chunks of [`CHURN_CHUNK`], the sides alternating chunk by chunk
/// (server CPU read before and after each chunk, every master of the cluster); then, per run,
/// `pairs` pairs from [`CHURN_THREADS`] threads sharing the node, the sides alternating.
fn measure_churn(sides: &[Side; 2], slots: &[u16], pairs: usize, runs: usize) -> Churn {
    let (rooms, rooms_by_master) = churn_rooms(&sides[1], slots);
    eprintln!(
        "churn: {CHURN_ROOMS} rooms, masters {:?} serve {rooms_by_master:?} of them; {} pairs per side per run in chunks of {CHURN_CHUNK}, then {CHURN_THREADS} threads",
        sides[1].ports,
        pairs.div_ceil(CHURN_CHUNK) * CHURN_CHUNK
    );
    let hosts: Vec<Arc<Node>> = sides
        .iter()
        .map(|side| {
            let node = Node::start(config_at(&side.target, CHURN_HOST)).expect("churn host");
            for r in &rooms {
                node.pin_room(r).expect("pin");
            }
            // Warm up: scripts loaded, connections made, the rooms' counters created.
            library_pairs(&node, &rooms, CHURN_CHUNK, 0);
            Arc::new(node)
        })
        .collect();
    let chunks = pairs.div_ceil(CHURN_CHUNK) * runs;
    let mut one_thread = [Samples::default(), Samples::default()];
    for c in 0..chunks {
        for s in order(c) {
            let host = &hosts[s];
            let rooms = &rooms;
            let before = stats_before(c == 0, &sides[s].ports);
            let cg = c == 0 && std::env::var_os("SFU_PERF_CALLGRIND").is_some();
            if cg {
                for p in &sides[s].ports {
                    super::callgrind(&mut direct(*p), true, "");
                }
            }
            timed(
                &sides[s],
                || {
                    let t = Instant::now();
                    library_pairs(host, rooms, CHURN_CHUNK, 0);
                    t.elapsed()
                },
                &mut one_thread[s],
            );
            if cg {
                // Instructions, which do not move with the machine: each server's own dump.
                for p in &sides[s].ports {
                    let phase = format!("churn {} {p}", sides[s].name);
                    super::callgrind(&mut direct(*p), false, &phase);
                }
            }
            if let Some(before) = &before {
                // Where each server's time went during each side's first chunk.
                print_commandstats_since(&sides[s].ports, before);
            }
        }
    }
    let per_thread = pairs / CHURN_THREADS;
    let mut threaded = [Samples::default(), Samples::default()];
    let mut threaded_host_cpu = [0, 0];
    for run in 0..runs {
        for s in order(run) {
            let host_before = host_cpu_us();
            timed(
                &sides[s],
                || {
                    let t = Instant::now();
                    std::thread::scope(|sc| {
                        for k in 0..CHURN_THREADS {
                            let (host, rooms) = (Arc::clone(&hosts[s]), &rooms);
                            sc.spawn(move || {
                                library_pairs(&host, rooms, per_thread, k * per_thread)
                            });
                        }
                    });
                    t.elapsed()
                },
                &mut threaded[s],
            );
            threaded_host_cpu[s] += host_cpu_us().saturating_sub(host_before);
        }
    }
    for host in &hosts {
        host.leave().expect("leave");
    }
    Churn {
        rooms_by_master,
        pairs: chunks * CHURN_CHUNK,
        one_thread,
        threaded_pairs: per_thread * CHURN_THREADS * runs,
        threaded,
        threaded_host_cpu,
    }
}

impl Churn {
    /// Server CPU per single-thread pair of side `s`, µs, each port.
    fn cpu_per_pair(&self, s: usize) -> Vec<f64> {
        self.one_thread[s].cpu_per(self.pairs)
    }

    /// Wall time per single-thread pair of side `s`, µs.
    fn wall_per_pair(&self, s: usize) -> f64 {
        let total: Duration = self.one_thread[s].took.iter().sum();
        total.as_secs_f64() * 1e6 / self.pairs as f64
    }

    /// Pairs per second of side `s` from [`CHURN_THREADS`] threads.
    fn threaded_rate(&self, s: usize) -> f64 {
        self.threaded_pairs as f64 / self.threaded_wall(s).as_secs_f64()
    }

    fn threaded_wall(&self, s: usize) -> Duration {
        self.threaded[s].took.iter().sum()
    }

    /// Server CPU per 8-thread pair of side `s`, µs, each port.
    fn threaded_server_cpu_per_pair(&self, s: usize) -> Vec<f64> {
        self.threaded[s].cpu_per(self.threaded_pairs)
    }

    /// The host process's CPU per 8-thread pair of side `s`, µs.
    fn threaded_host_cpu_per_pair(&self, s: usize) -> f64 {
        self.threaded_host_cpu[s] as f64 / self.threaded_pairs as f64
    }

    /// Cores kept busy by side `s`'s 8-thread parts: its servers' CPU and the host process's,
    /// over the wall time.
    fn threaded_cores_busy(&self, s: usize) -> f64 {
        let servers: f64 = self.threaded_server_cpu_per_pair(s).iter().sum();
        (servers + self.threaded_host_cpu_per_pair(s)) * self.threaded_pairs as f64
            / (self.threaded_wall(s).as_secs_f64() * 1e6)
    }

    /// What the servers alone would allow, each on a core of its own with the hosts' cores
    /// aside: one server's CPU per 8-thread pair over the busiest master's (the cluster's
    /// throughput over one server's once the busiest server, not the machine, is the bound).
    fn threaded_server_bound(&self) -> f64 {
        let busiest = self
            .threaded_server_cpu_per_pair(1)
            .into_iter()
            .fold(0.0, f64::max);
        self.threaded_server_cpu_per_pair(0)[0] / busiest
    }

    /// The busiest master's CPU per pair over the standalone server's.
    fn busiest_vs_standalone(&self) -> f64 {
        let busiest = self.cpu_per_pair(1).into_iter().fold(0.0, f64::max);
        busiest / self.cpu_per_pair(0)[0]
    }
}

/// The churn fields of the report.
fn churn_fields(c: &Churn) -> serde_json::Value {
    let r1 = |x: f64| (x * 10.0).round() / 10.0;
    let r2 = |x: f64| (x * 100.0).round() / 100.0;
    let by_master = c.cpu_per_pair(1);
    json!({
        "churn_pairs": c.pairs,
        "churn_rooms": CHURN_ROOMS,
        "cluster_churn_rooms_by_master": c.rooms_by_master,
        "standalone_churn_wall_us_per_pair": r1(c.wall_per_pair(0)),
        "cluster_churn_wall_us_per_pair": r1(c.wall_per_pair(1)),
        "standalone_churn_cpu_us_per_pair": r1(c.cpu_per_pair(0)[0]),
        "cluster_churn_cpu_us_per_pair_by_master": by_master.iter().map(|x| r1(*x)).collect::<Vec<_>>(),
        "cluster_churn_cpu_us_per_pair_total": r1(by_master.iter().sum()),
        "cluster_churn_cpu_share_pct": c.one_thread[1].shares(),
        "cluster_churn_busiest_vs_standalone": r2(c.busiest_vs_standalone()),
        "churn_8_threads_pairs": c.threaded_pairs,
        "standalone_churn_8_threads_pairs_per_s": c.threaded_rate(0).round(),
        "cluster_churn_8_threads_pairs_per_s": c.threaded_rate(1).round(),
        "cluster_vs_standalone_8_threads": r2(c.threaded_rate(1) / c.threaded_rate(0)),
        "machine_cores": machine_cores(),
        "standalone_churn_8_threads_cores_busy": r2(c.threaded_cores_busy(0)),
        "cluster_churn_8_threads_cores_busy": r2(c.threaded_cores_busy(1)),
        "standalone_churn_8_threads_host_cpu_us_per_pair": r1(c.threaded_host_cpu_per_pair(0)),
        "cluster_churn_8_threads_host_cpu_us_per_pair": r1(c.threaded_host_cpu_per_pair(1)),
        "standalone_churn_8_threads_server_cpu_us_per_pair": r1(c.threaded_server_cpu_per_pair(0)[0]),
        "cluster_churn_8_threads_server_cpu_us_per_pair_by_master": c.threaded_server_cpu_per_pair(1).iter().map(|x| r1(*x)).collect::<Vec<_>>(),
        "cluster_vs_standalone_8_threads_server_bound": r2(c.threaded_server_bound()),
    })
}

/// The cores this process may run on.
fn machine_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The churn goals (issue 31).
fn churn_goals(c: &Churn) -> [Goal; 3] {
    [
        (
            "busiest master's churn CPU per pair <= 0.35x the standalone's",
            c.busiest_vs_standalone() <= 0.35,
        ),
        (
            "no master's share of churn CPU above 40 %",
            c.one_thread[1].shares().iter().all(|s| *s <= 40.0),
        ),
        (
            "churn from 8 threads on 3 masters >= 2x one server's",
            c.threaded_rate(1) >= 2.0 * c.threaded_rate(0),
        ),
    ]
}

/// Keys matching `pattern`, the `{ctl}` keys aside (what a reap must leave at 0), through the
/// library's connector (every master on a cluster).
fn count_prefix(con: &mut sfu_redis::ops::conn::Conn, pattern: &str) -> usize {
    sfu_redis::ops::scan::collect(con, sfu_redis::ops::scan::Scan::keys(pattern))
        .expect("SCAN")
        .iter()
        .filter(|k| !String::from_utf8_lossy(k).contains("{ctl}"))
        .count()
}
