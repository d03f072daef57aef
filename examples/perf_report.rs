//! One-shot performance report, without criterion:
//!
//! ```sh
//! cargo run --release --example perf_report                 # loopback
//! cargo run --release --example perf_report -- --rtt-ms 1   # through a delaying TCP proxy
//! ```
//!
//! Runs the reap comparison (library / seed-style baseline / floor) at 10,000 rooms of 4 peers,
//! the heartbeat tick with 10,000 rooms against its floor (with its round trips counted), and
//! the latency a second client sees (PING in a loop) while 100,000 rooms are reaped; prints one
//! JSON object, then the goals and whether each is met.
//!
//! `--reap-batch N` sets the leader's reap batch size (default 500).
//! `SFU_PERF_STATS=1` also prints the server's `INFO commandstats` of each library reap (where
//! the server's time goes, command by command, including the commands inside the scripts).
//! `script_floor_ms` is the same reap done by the cheapest possible per-room script (`UNLINK`
//! of the room's keys, no checks): the part of the library's cost that any per-room atomic
//! step pays.
//! `--sweep 100,250,500,1000,2000` instead measures, for each batch size, the reap of `--rooms`
//! rooms (median of `--runs`) and the PING latency during the reap of `--latency-rooms` rooms,
//! one JSON line per size: the measurement behind the default batch size.

#[path = "../benches/common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sfu_redis::Node;
use sfu_redis_testkit::faultproxy::FaultProxy;

use common::*;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// CPU time (user + system, µs) the Redis server process has used so far, from `INFO cpu`:
/// the server-side cost of a measurement is the difference of two readings.
fn server_cpu_us(con: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("cpu").query(con).expect("INFO");
    info.lines()
        .filter(|l| l.starts_with("used_cpu_user:") || l.starts_with("used_cpu_sys:"))
        .filter_map(|l| l.split(':').nth(1))
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .map(|s| (s * 1e6) as u64)
        .sum()
}

/// Median of `n` runs of `f` (each returns its own measured duration).
fn median(n: usize, mut f: impl FnMut() -> Duration) -> Duration {
    let mut v: Vec<Duration> = (0..n).map(|_| f()).collect();
    v.sort();
    v[n / 2]
}

/// Reaps a fabricated instance of `rooms` rooms while a second client (direct to the server)
/// sends PING in a loop: the reap's duration and the sorted PING round trips.
fn reap_with_pings(
    leader: &Node,
    fab: &mut redis::Connection,
    direct: &str,
    rooms: usize,
) -> (Duration, Vec<Duration>) {
    fabricate(fab, &keyspace(), "huge", rooms);
    let stop = Arc::new(AtomicBool::new(false));
    let pinger = {
        let stop = Arc::clone(&stop);
        let direct = direct.to_owned();
        std::thread::spawn(move || {
            let mut con = connect(&direct);
            let mut samples = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let _: String = redis::cmd("PING").query(&mut con).expect("PING");
                samples.push(t.elapsed());
            }
            samples
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    let c = leader.reap_now("huge").expect("reap").expect("dead");
    let took = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut samples = pinger.join().expect("pinger");
    assert_eq!(c.rooms as usize, rooms);
    samples.sort();
    (took, samples)
}

/// `--sweep`: the reap and the PING latency for each batch size, at loopback.
fn sweep(sizes: &[usize], rooms: usize, latency_rooms: usize, runs: usize) {
    let server = server();
    let url = server.url();
    let ks = keyspace();
    let mut fab = connect(&url);
    let ms = |d: Duration| (d.as_secs_f64() * 1e6).round() / 1e3;
    for &batch in sizes {
        let leader = fast_leader_with_batch(&url, batch);
        let reap = median(runs, || {
            fabricate(&mut fab, &ks, "dead", rooms);
            let t = Instant::now();
            let c = leader.reap_now("dead").expect("reap").expect("dead");
            assert_eq!(c.rooms as usize, rooms);
            t.elapsed()
        });
        let (big, samples) = reap_with_pings(&leader, &mut fab, &url, latency_rooms);
        let pct = |p: f64| samples[((samples.len() - 1) as f64 * p) as usize];
        println!(
            "{}",
            json!({
                "reap_batch": batch,
                "rooms": rooms,
                "library_ms": ms(reap),
                "library_rooms_per_s": (rooms as f64 / secs(reap)).round(),
                "latency_rooms": latency_rooms,
                "latency_reap_ms": ms(big),
                "ping_p50_ms": ms(pct(0.50)),
                "ping_p99_ms": ms(pct(0.99)),
                "ping_max_ms": ms(*samples.last().expect("samples")),
            })
        );
        leader.leave().ok();
    }
}

fn main() {
    let rtt_ms: f64 = arg("--rtt-ms").and_then(|v| v.parse().ok()).unwrap_or(0.0);
    let rooms: usize = arg("--rooms")
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let latency_rooms: usize = arg("--latency-rooms")
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let runs: usize = arg("--runs").and_then(|v| v.parse().ok()).unwrap_or(3);
    let batch: usize = arg("--reap-batch")
        .and_then(|v| v.parse().ok())
        .unwrap_or(sfu_redis::REAP_BATCH);
    if let Some(list) = arg("--sweep") {
        let sizes: Vec<usize> = list
            .split(',')
            .filter_map(|v| v.trim().parse().ok())
            .collect();
        sweep(&sizes, rooms, latency_rooms, runs);
        return;
    }

    let server = server();
    // With --rtt-ms, everything the library and the baselines send goes through a proxy that
    // delays each direction by half the RTT; fabrication and the PING client go direct. At
    // loopback there is no proxy (its threads would compete with Redis for the CPU).
    let proxy = FaultProxy::start(("127.0.0.1", server.port())).expect("proxy");
    proxy.set_delay(Duration::from_secs_f64(rtt_ms / 2000.0));
    let direct = server.url();
    let url = if rtt_ms > 0.0 {
        proxy.url()
    } else {
        direct.clone()
    };
    let ks = keyspace();
    eprintln!(
        "perf_report: {rooms} rooms x {PEERS_PER_ROOM} peers, rtt {rtt_ms} ms, {runs} runs each"
    );

    // --- reap ---------------------------------------------------------------------------
    let leader = fast_leader_with_batch(&url, batch);
    let mut fab = connect(&direct);
    let mut library_server = Vec::new();
    let library = median(runs, || {
        fabricate(&mut fab, &ks, "dead", rooms);
        if std::env::var_os("SFU_PERF_STATS").is_some() {
            let _: () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query(&mut fab)
                .unwrap();
        }
        let cpu = server_cpu_us(&mut fab);
        let t = Instant::now();
        let c = leader.reap_now("dead").expect("reap").expect("dead");
        let d = t.elapsed();
        library_server.push(server_cpu_us(&mut fab) - cpu);
        // SFU_PERF_STATS=1: the server's per-command costs of the library's reap.
        if std::env::var_os("SFU_PERF_STATS").is_some() {
            let s: String = redis::cmd("INFO")
                .arg("commandstats")
                .query(&mut fab)
                .unwrap();
            eprintln!("{s}");
        }
        assert_eq!(c.rooms as usize, rooms);
        d
    });
    library_server.sort();
    assert_eq!(count_keys(&mut fab), 0, "the library left keys");
    let mut via = connect(&url);
    let seed = median(runs, || {
        fabricate(&mut fab, &ks, "dead", rooms);
        let t = Instant::now();
        assert_eq!(seed_style_reap(&mut via, &ks, "dead"), rooms);
        t.elapsed()
    });
    let mut floor_server = Vec::new();
    let floor = median(runs, || {
        let keys = fabricate(&mut fab, &ks, "dead", rooms);
        let cpu = server_cpu_us(&mut fab);
        let t = Instant::now();
        floor_reap(&mut via, &keys);
        let d = t.elapsed();
        floor_server.push(server_cpu_us(&mut fab) - cpu);
        d
    });
    floor_server.sort();
    let script_floor = median(runs, || {
        let keys = fabricate(&mut fab, &ks, "dead", rooms);
        let t = Instant::now();
        script_floor_reap(&mut via, &keys);
        t.elapsed()
    });
    let _: () = redis::cmd("ZREM")
        .arg(ks.heartbeats())
        .arg("dead")
        .query(&mut fab)
        .expect("ZREM");

    // --- heartbeat tick -----------------------------------------------------------------
    let ticker = Node::start(config(&url, "ticker")).expect("ticker");
    let names: Vec<String> = (0..rooms).map(|r| format!("tick-r{r}")).collect();
    for r in &names {
        ticker.pin_room(r).expect("pin");
    }
    let cpu = server_cpu_us(&mut fab);
    let tick = median(runs * 3, || {
        let t = Instant::now();
        ticker.heartbeat_now().expect("tick");
        t.elapsed()
    });
    let tick_server_us = (server_cpu_us(&mut fab) - cpu) / (runs as u64 * 3);
    let owners: Vec<String> = names.iter().map(|r| ks.room(r).owner).collect();
    let tick_floor = median(runs * 3, || {
        let t = Instant::now();
        let mut pipe = redis::pipe();
        for k in &owners {
            pipe.pexpire(k, 90_000).ignore();
        }
        pipe.query::<()>(&mut via).expect("PEXPIRE");
        t.elapsed()
    });
    // Round trips: the same tick through a proxy adding 25 ms each way.
    let slow = FaultProxy::start(("127.0.0.1", server.port())).expect("proxy");
    slow.set_delay(Duration::from_millis(25));
    let slow_ticker = Node::start(config(&slow.url(), "slow-ticker")).expect("slow ticker");
    for r in 0..1000 {
        slow_ticker.pin_room(&format!("slow-r{r}")).expect("pin");
    }
    let base = median(3, || {
        let t = Instant::now();
        slow_ticker.heartbeat_now().expect("tick");
        t.elapsed()
    });
    let tick_round_trips = (secs(base) / 0.050).round() as u64;
    slow_ticker.leave().ok();
    ticker.leave().ok();

    // --- latency during a big reap ------------------------------------------------------
    let (big_reap, samples) = reap_with_pings(&leader, &mut fab, &direct, latency_rooms);
    let pct = |p: f64| samples[((samples.len() - 1) as f64 * p) as usize];
    let ms = |d: Duration| (d.as_secs_f64() * 1e6).round() / 1e3;
    leader.shutdown().ok();

    let rate = |d: Duration| (rooms as f64 / secs(d)).round();
    let report = json!({
        "rooms": rooms,
        "peers_per_room": PEERS_PER_ROOM,
        "rtt_ms": rtt_ms,
        "reap_batch": batch,
        "library_rooms_per_s": rate(library),
        "seed_style_rooms_per_s": rate(seed),
        "floor_rooms_per_s": rate(floor),
        "library_vs_seed_style": (secs(seed) / secs(library) * 100.0).round() / 100.0,
        "library_vs_floor": (secs(floor) / secs(library) * 100.0).round() / 100.0,
        "script_floor_ms": ms(script_floor),
        "library_vs_script_floor": (secs(script_floor) / secs(library) * 100.0).round() / 100.0,
        "library_ms": ms(library),
        "library_server_cpu_ms": library_server[library_server.len() / 2] as f64 / 1000.0,
        "floor_server_cpu_ms": floor_server[floor_server.len() / 2] as f64 / 1000.0,
        "tick_server_cpu_ms": tick_server_us as f64 / 1000.0,
        "seed_style_ms": ms(seed),
        "floor_ms": ms(floor),
        "tick_ms": ms(tick),
        "tick_floor_ms": ms(tick_floor),
        "tick_round_trips": tick_round_trips,
        "tick_vs_floor": (secs(tick) / secs(tick_floor) * 100.0).round() / 100.0,
        "latency_rooms": latency_rooms,
        "latency_reap_ms": ms(big_reap),
        "ping_samples": samples.len(),
        "ping_p50_ms": ms(pct(0.50)),
        "ping_p99_ms": ms(pct(0.99)),
        "ping_max_ms": ms(*samples.last().expect("samples")),
    });
    println!("{report}");
    let loopback = rtt_ms == 0.0;
    let goals = [
        (
            if loopback {
                "reap >= 5x seed-style (loopback)"
            } else {
                "reap >= 50x seed-style (1 ms RTT)"
            },
            secs(seed) / secs(library) >= if loopback { 5.0 } else { 50.0 },
        ),
        ("reap >= 0.5x floor", secs(floor) / secs(library) >= 0.5),
        ("tick <= 2 round trips", tick_round_trips <= 2),
        ("tick <= 2x floor", secs(tick) <= 2.0 * secs(tick_floor)),
        (
            "PING p99 < 2 ms during the big reap",
            pct(0.99) < Duration::from_millis(2),
        ),
        (
            "PING max < 10 ms during the big reap",
            *samples.last().expect("samples") < Duration::from_millis(10),
        ),
    ];
    for (goal, met) in goals {
        eprintln!("goal {:<45} {}", goal, if met { "met" } else { "NOT met" });
    }
}
