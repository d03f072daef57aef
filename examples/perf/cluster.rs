//! `perf_report --cluster`: the reap and the heartbeat tick on a Redis Cluster of 3 masters
//! and on one standalone server, in one run, alternating (standalone then cluster, then
//! cluster then standalone, ...) so a noisy neighbour hits both alike.
//!
//! Each Redis has its own leader and ticker, live for the whole run. Fabrication goes over the
//! library's connector (on the cluster: routed by slot, one pipeline split per master), outside
//! the timed parts. Server CPU is `INFO cpu` (user + sys) of each server before and after each
//! timed call, read on direct connections to every master: the cluster's total and each
//! master's share of it. The tick's round trips per master are counted by the library's
//! cluster connections (`sfu_redis::conn::cluster_round_trips`, feature `testing`).
//!
//! `SFU_PERF_STATS=1` also prints each master's `INFO commandstats` of the first cluster reap
//! (calls and µs per command, commands inside scripts included).
//!
//! `cluster_master_ports` lists the masters in the order of the `*_cpu_share_pct` arrays and
//! `cluster_ctl_master_port` names the one serving `{ctl}` (the control plane's slot).
//!
//! Goals (issue 13): each master's share of the reap's CPU within 10 points of a third; the
//! cluster reap at least 0.8x as fast as the standalone one (`cluster_reap_speed` =
//! standalone ms / cluster ms); at most 2 tick round trips per master.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;
use sfu_redis::Node;
use sfu_redis_testkit::cluster::LocalCluster;
use sfu_redis_testkit::devserver::LocalRedis;

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

/// The port of the master serving the `{ctl}` slot (the one holding keys in it: the leaders
/// heartbeat there), so that the report names which share is the control plane's.
fn ctl_master(ports: &[u16]) -> Option<u16> {
    ports.iter().copied().find(|port| {
        let mut con = direct(*port);
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg("{ctl}")
            .query(&mut con)
            .expect("CLUSTER KEYSLOT");
        let keys: i64 = redis::cmd("CLUSTER")
            .arg("COUNTKEYSINSLOT")
            .arg(slot)
            .query(&mut con)
            .expect("CLUSTER COUNTKEYSINSLOT");
        keys > 0
    })
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

pub fn report(a: &Args) {
    if a.rtt_ms > 0.0 {
        eprintln!("perf_report --cluster: --rtt-ms is ignored (loopback only)");
    }
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
        "perf_report --cluster: {} rooms x {PEERS_PER_ROOM} peers, {} runs each, standalone {} and a 3-master cluster {}, alternating",
        a.rooms, a.runs, sides[0].target.url, sides[1].target.url
    );
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
    let ctl_port = ctl_master(&sides[1].ports);
    let mut reaps = [Samples::default(), Samples::default()];
    for i in 0..a.runs {
        for s in order(i) {
            let ks = sides[s].target.keyspace();
            fabricate(&mut fabs[s], &ks, "dead", a.rooms);
            let leader = &leaders[s];
            let rooms = a.rooms;
            let name = sides[s].name;
            let stats = std::env::var_os("SFU_PERF_STATS").is_some() && s == 1 && i == 0;
            let before: Vec<_> = if stats {
                sides[s].ports.iter().map(|p| commandstats(*p)).collect()
            } else {
                Vec::new()
            };
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
            if stats {
                // Where each master's time went during the first cluster reap.
                for (port, was) in sides[s].ports.iter().zip(&before) {
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
            let before = sfu_redis::conn::cluster_round_trips();
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
                let after = sfu_redis::conn::cluster_round_trips();
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
    let report = json!({
        "mode": "cluster",
        "rooms": a.rooms,
        "peers_per_room": PEERS_PER_ROOM,
        "reap_batch": a.batch,
        "runs": a.runs,
        "tick_runs": a.runs * 3,
        "masters": sides[1].ports.len(),
        "standalone_reap_ms": reaps[0].median_ms(),
        "cluster_reap_ms": reaps[1].median_ms(),
        "cluster_reap_speed": speed,
        "standalone_reap_server_cpu_ms": reaps[0].median_cpu_ms(),
        "cluster_reap_server_cpu_ms": reaps[1].median_cpu_ms(),
        "cluster_master_ports": sides[1].ports,
        "cluster_ctl_master_port": ctl_port,
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
    println!("{report}");
    let goals = [
        (
            "each master's reap CPU share within 10 points of a third",
            spread_ok,
        ),
        ("cluster reap >= 0.8x the standalone one", speed >= 0.8),
        ("tick <= 2 round trips per master", max_trips <= 2),
    ];
    for (goal, met) in goals {
        eprintln!("  {} {goal}", if met { "MET   " } else { "MISSED" });
    }
}

/// Keys matching `pattern`, the `{ctl}` keys aside (what a reap must leave at 0), through the
/// library's connector (every master on a cluster).
fn count_prefix(con: &mut sfu_redis::conn::Conn, pattern: &str) -> usize {
    sfu_redis::scan::collect(con, sfu_redis::scan::Scan::keys(pattern))
        .expect("SCAN")
        .iter()
        .filter(|k| !String::from_utf8_lossy(k).contains("{ctl}"))
        .count()
}
