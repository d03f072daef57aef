//! One-shot performance report, without criterion:
//!
//! ```sh
//! cargo run --release --example perf_report                 # loopback
//! cargo run --release --example perf_report -- --rtt-ms 1   # through a delaying TCP proxy
//! ```
//!
//! Runs the reap comparison (library / seed-style baseline / floor) at 10,000 rooms of 4 peers,
//! the heartbeat tick with 10,000 rooms against its floor (with its round trips counted), and
//! the latency a second client sees (PING in a loop) while 100,000 rooms are reaped, once
//! unpaced (`unpaced_*` fields) and once at the reaper's pace (`latency_reap_ms`, `ping_*`),
//! against the same PING loop for 5 s with nothing else running (`alone_*`: the machine's own
//! tail);
//! prints one JSON object, then the goals and whether each is met. The comparisons with the
//! baselines run unpaced (`reap_pace` 0): they time the reap's own work. They run `--runs`
//! rounds (default 3), each the library, the seed-style reaper, the floor and the script floor
//! back to back on fresh data (one line per round on stderr); each figure is the median of its
//! rounds.
//!
//! Metrics cost: the tick of a node that records its metrics against the tick of one built
//! with `ConfigBuilder::metrics(false)` (no clock reads, no histogram updates; the counters
//! `Stats` reports are kept either way), alternating tick by tick, with `--rooms` pins and with
//! none (`metrics_tick_ratio`, `metrics_empty_tick_ratio`: the median of each pair's on / off
//! ratio; `*_on_ms` / `*_off_ms`: the medians), and the time
//! one `Node::metrics()` render takes (`metrics_render_us`). `--metrics` runs only this part
//! (one JSON object, its goals).
//!
//! Churn (`examples/perf/churn.rs`): `--pairs` (default 5,000) peer joins and leaves from one
//! thread against the same writes as one script call per operation (script floor) and as one
//! pipelined round trip of plain commands per operation (raw floor), wall time and Redis CPU
//! per pair (`churn_*` fields), then the library's pairs per second from 8 threads.
//! `--churn` runs only this part (one JSON object, its goals).
//!
//! `--reap-batch N` sets the leader's reap batch size (default 500); `--pace P` the pace of
//! the paced big reap (default `sfu_redis::REAP_PACE`).
//! `--pace-sweep 0,0.5,1,2` instead reaps `--latency-rooms` rooms `--runs` times at each pace,
//! with the PING client running, one JSON line per reap (with the machine's load average),
//! after one line per run of the PING loop alone (5 s):
//! the measurement behind the default pace.
//! `SFU_PERF_STATS=1` also prints the server's `INFO commandstats` of each library reap (where
//! the server's time goes, command by command, including the commands inside the scripts).
//! `script_floor_ms` is the same reap done by the cheapest possible per-room script (`UNLINK`
//! of the room's keys, no checks): the part of the library's cost that any per-room atomic
//! step pays.
//! `--sweep 100,250,500,1000,2000` instead measures, for each batch size, the reap of `--rooms`
//! rooms (median of `--runs`) and the PING latency during the reap of `--latency-rooms` rooms,
//! one JSON line per size: the measurement behind the default batch size.
//!
//! Two more modes, each printing one JSON object (details in `examples/perf/`):
//!
//! ```sh
//! cargo run --release --example perf_report -- --tls    # plaintext vs TLS, one server
//! cargo run --release --example perf_report -- --wait   # WAIT 1 on a replicated master
//! cargo run --release --example perf_report -- --cluster  # 3-master cluster vs one server
//! cargo run --release --example perf_report -- --cluster --churn  # its churn part alone
//! ```
//!
//! `--cluster` (`examples/perf/cluster.rs`): the reap (`--rooms` rooms x 4 peers, median of
//! `--runs`), the tick (`--rooms` pinned rooms) and churn (peer joins and leaves in 300 rooms
//! spread evenly over the masters: 3,000 pairs per run from one thread, `--pairs` sets
//! another count, then as many from 8 threads sharing one node) on a private 3-master Redis
//! Cluster and on one standalone server, alternating; each master's share of the reap's
//! server CPU, the cluster reap's speed relative to the standalone one, the tick's round
//! trips per master, churn's server CPU per pair on each master against the standalone
//! server's (`*_churn_*` fields) and the 8-thread pairs per second of each side (issue 31).
//! With `--churn` it runs only the churn part.
//!
//! `--tls` (`examples/perf/tls.rs`): the reap (`--rooms` rooms x 4 peers, median of `--runs`)
//! and the tick (`--rooms` pinned rooms, median of 3 x `--runs`) over the plaintext port and
//! over the TLS port of one `redis-server`, alternating, and the connect time (`--connects`
//! of each, default 50): `plain_*` / `tls_*` fields and `tls_*_ratio` = TLS / plaintext.
//! `--wait` (`examples/perf/wait.rs`): p50 / p99 of the lease acquire and refresh with and
//! without `ROLE` + `WAIT 1 t`, and of a pin with and without a `WAIT` (`--samples` each,
//! default 2000; `t` = `--command-timeout-ms` / 2, default the library's 2 s / 2), then
//! what `WAIT` returns and how long it blocks while the replica is SIGSTOPped
//! (`--stopped-samples`, default 3).

#[path = "perf/churn.rs"]
mod churn;
#[path = "perf/cluster.rs"]
mod cluster;
#[path = "../benches/common/mod.rs"]
mod common;
#[path = "perf/tls.rs"]
mod tls;
#[path = "perf/wait.rs"]
mod wait;

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

/// Milliseconds, rounded to the µs.
fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// The median of `v` (not empty).
fn median_of(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v[v.len() / 2]
}

/// CPU time (user + system, µs) the Redis server process has used so far, from `INFO cpu`:
/// the server-side cost of a measurement is the difference of two readings.
fn server_cpu_us(con: &mut impl redis::ConnectionLike) -> u64 {
    let info: String = redis::cmd("INFO").arg("cpu").query(con).expect("INFO");
    info.lines()
        .filter(|l| l.starts_with("used_cpu_user:") || l.starts_with("used_cpu_sys:"))
        .filter_map(|l| l.split(':').nth(1))
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .map(|s| (s * 1e6) as u64)
        .sum()
}

/// With `SFU_PERF_CALLGRIND` set (the private `redis-server` then runs under
/// `valgrind --tool=callgrind --collect-atstart=no`, see docs/src/performance.md): instruction
/// collection on (`on`) or off with a dump named `phase` (the dump's totals are the phase's
/// instructions). A no-op otherwise.
fn callgrind(con: &mut impl redis::ConnectionLike, on: bool, phase: &str) {
    if std::env::var_os("SFU_PERF_CALLGRIND").is_none() {
        return;
    }
    let info: String = redis::cmd("INFO").arg("server").query(con).expect("INFO");
    let pid = info
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .expect("process_id")
        .trim()
        .to_owned();
    let run = |args: &[&str]| {
        let ok = std::process::Command::new("callgrind_control")
            .args(args)
            .arg(&pid)
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "callgrind_control {args:?} {pid} failed");
    };
    if on {
        run(&["--zero"]);
        run(&["--instr=on"]);
    } else {
        run(&[&format!("--dump={phase}")]);
        run(&["--instr=off"]);
    }
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
    fab: &mut sfu_redis::ops::conn::Conn,
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

/// PING in a loop for `secs` with nothing else running: the machine's own tail latency, against
/// which the PING latency during a reap is judged. Sorted round trips.
fn ping_alone(direct: &str, secs: f64) -> Vec<Duration> {
    let mut con = connect(direct);
    let mut samples = Vec::new();
    let t = Instant::now();
    while t.elapsed().as_secs_f64() < secs {
        let s = Instant::now();
        let _: String = redis::cmd("PING").query(&mut con).expect("PING");
        samples.push(s.elapsed());
    }
    samples.sort();
    samples
}

/// `--pace-sweep`: the big reap and the PING latency at each pace, `runs` times, at loopback.
fn pace_sweep(paces: &[f64], batch: usize, rooms: usize, runs: usize) {
    let server = server();
    let url = server.url();
    let mut fab = connect(&url);
    for run in 0..runs {
        let alone = ping_alone(&url, 5.0);
        let pct = |p: f64| alone[((alone.len() - 1) as f64 * p) as usize];
        println!(
            "{}",
            json!({
                "run": run,
                "baseline": "PING alone, 5 s",
                "ping_samples": alone.len(),
                "ping_p99_ms": ms(pct(0.99)),
                "ping_max_ms": ms(*alone.last().expect("samples")),
                "loadavg": load_average(),
            })
        );
        for &pace in paces {
            let leader = fast_leader_paced(&Target::plain(&url), batch, pace);
            let (took, samples) = reap_with_pings(&leader, &mut fab, &url, rooms);
            leader.leave().ok();
            let pct = |p: f64| samples[((samples.len() - 1) as f64 * p) as usize];
            println!(
                "{}",
                json!({
                    "run": run,
                    "reap_pace": pace,
                    "reap_batch": batch,
                    // What a paced reap's batches hold (sfu_redis::PACED_REAP_BATCH).
                    "effective_batch": if pace > 0.0 { batch.min(sfu_redis::PACED_REAP_BATCH) } else { batch },
                    "rooms": rooms,
                    "reap_ms": ms(took),
                    "ping_samples": samples.len(),
                    "ping_p50_ms": ms(pct(0.50)),
                    "ping_p99_ms": ms(pct(0.99)),
                    "ping_max_ms": ms(*samples.last().expect("samples")),
                    "loadavg": load_average(),
                })
            );
        }
    }
}

/// The machine's 1-minute load average (`/proc/loadavg`), `None` where it cannot be read: the
/// machine may be shared, and PING's tail latency depends on it.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The command line (see the module docs).
struct Args {
    rtt_ms: f64,
    rooms: usize,
    latency_rooms: usize,
    runs: usize,
    batch: usize,
    /// The reaper's pace of the paced big reap.
    pace: f64,
    /// `--tls`: connects of each kind and transport.
    connects: usize,
    /// `--wait`: samples per variant, samples with the replica stopped, the command timeout.
    samples: usize,
    stopped_samples: usize,
    command_timeout_ms: Option<u64>,
    /// Join + leave pairs per churn run.
    pairs: usize,
}

impl Args {
    fn parse() -> Args {
        let num =
            |name: &str, default: usize| arg(name).and_then(|v| v.parse().ok()).unwrap_or(default);
        Args {
            rtt_ms: arg("--rtt-ms").and_then(|v| v.parse().ok()).unwrap_or(0.0),
            rooms: num("--rooms", 10_000),
            latency_rooms: num("--latency-rooms", 100_000),
            runs: num("--runs", 3),
            batch: num("--reap-batch", sfu_redis::REAP_BATCH),
            pace: arg("--pace")
                .and_then(|v| v.parse().ok())
                .unwrap_or(sfu_redis::REAP_PACE),
            connects: num("--connects", 50).max(1),
            samples: num("--samples", 2000).max(1),
            stopped_samples: num("--stopped-samples", 3).max(1),
            command_timeout_ms: arg("--command-timeout-ms").and_then(|v| v.parse().ok()),
            pairs: num("--pairs", 5_000).max(8),
        }
    }
}

/// Where the measurements run: `url` for the library and the baselines (through a proxy
/// delaying each direction by half the RTT with `--rtt-ms`), `direct` for fabrication and
/// the PING client.
struct Bench {
    server: sfu_redis_testkit::devserver::LocalRedis,
    _proxy: FaultProxy,
    url: String,
    direct: String,
    ks: sfu_redis::keys::KeySpace,
    fab: sfu_redis::ops::conn::Conn,
    via: sfu_redis::ops::conn::Conn,
}

impl Bench {
    fn start(rtt_ms: f64) -> Bench {
        let server = server();
        // At loopback there is no proxy hop (its threads would compete with Redis for the CPU).
        let proxy = FaultProxy::start(("127.0.0.1", server.port())).expect("proxy");
        proxy.set_delay(Duration::from_secs_f64(rtt_ms / 2000.0));
        let direct = server.url();
        let url = if rtt_ms > 0.0 {
            proxy.url()
        } else {
            direct.clone()
        };
        Bench {
            fab: connect(&direct),
            via: connect(&url),
            ks: keyspace(),
            server,
            _proxy: proxy,
            url,
            direct,
        }
    }
}

/// The reap of `rooms` rooms by the library, the seed-style reaper, the floor and the script
/// floor (medians), with the server CPU of the library's and the floor's.
struct Reaps {
    library: Duration,
    seed: Duration,
    floor: Duration,
    script_floor: Duration,
    library_cpu_us: u64,
    floor_cpu_us: u64,
    script_floor_cpu_us: u64,
}

fn measure_reaps(b: &mut Bench, leader: &Node, rooms: usize, runs: usize) -> Reaps {
    let stats = std::env::var_os("SFU_PERF_STATS").is_some();
    // Interleaved: each round runs the library, the seed-style reaper, the floor and the
    // script floor back to back, so a drift of the machine's speed over the measurement
    // moves all four alike (as the churn figures are measured); the medians are per kind.
    let (mut library, mut seed, mut floor, mut script_floor) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut library_cpu, mut floor_cpu, mut script_floor_cpu) =
        (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        fabricate(&mut b.fab, &b.ks, "dead", rooms);
        if stats {
            let _: () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query(&mut b.fab)
                .unwrap();
        }
        let cpu = server_cpu_us(&mut b.fab);
        callgrind(&mut b.fab, true, "");
        let t = Instant::now();
        let c = leader.reap_now("dead").expect("reap").expect("dead");
        library.push(t.elapsed());
        callgrind(&mut b.fab, false, "library reap");
        library_cpu.push(server_cpu_us(&mut b.fab) - cpu);
        // SFU_PERF_STATS=1: the server's per-command costs of the library's reap.
        if stats {
            let s: String = redis::cmd("INFO")
                .arg("commandstats")
                .query(&mut b.fab)
                .unwrap();
            eprintln!("{s}");
        }
        assert_eq!(c.rooms as usize, rooms);
        assert_eq!(count_keys(&mut b.fab), 0, "the library left keys");

        fabricate(&mut b.fab, &b.ks, "dead", rooms);
        let t = Instant::now();
        assert_eq!(seed_style_reap(&mut b.via, &b.ks, "dead"), rooms);
        seed.push(t.elapsed());

        let keys = fabricate(&mut b.fab, &b.ks, "dead", rooms);
        let cpu = server_cpu_us(&mut b.fab);
        let t = Instant::now();
        floor_reap(&mut b.via, &keys);
        floor.push(t.elapsed());
        floor_cpu.push(server_cpu_us(&mut b.fab) - cpu);

        let keys = fabricate(&mut b.fab, &b.ks, "dead", rooms);
        let cpu = server_cpu_us(&mut b.fab);
        callgrind(&mut b.fab, true, "");
        let t = Instant::now();
        script_floor_reap(&mut b.via, &keys);
        script_floor.push(t.elapsed());
        callgrind(&mut b.fab, false, "script floor");
        script_floor_cpu.push(server_cpu_us(&mut b.fab) - cpu);
        let last = |v: &Vec<Duration>| ms(*v.last().expect("a run"));
        eprintln!(
            "reap round: library {:.1} ms ({:.1} ms Redis CPU), seed-style {:.1} ms, floor {:.1} ms, script floor {:.1} ms ({:.1} ms Redis CPU)",
            last(&library),
            *library_cpu.last().expect("a run") as f64 / 1000.0,
            last(&seed),
            last(&floor),
            last(&script_floor),
            *script_floor_cpu.last().expect("a run") as f64 / 1000.0,
        );
    }
    let _: () = redis::cmd("ZREM")
        .arg(b.ks.heartbeats())
        .arg("dead")
        .query(&mut b.fab)
        .expect("ZREM");
    Reaps {
        library: middle(library),
        seed: middle(seed),
        floor: middle(floor),
        script_floor: middle(script_floor),
        library_cpu_us: middle(library_cpu),
        floor_cpu_us: middle(floor_cpu),
        script_floor_cpu_us: middle(script_floor_cpu),
    }
}

/// The median of `v`.
fn middle<T: Ord + Copy>(mut v: Vec<T>) -> T {
    v.sort();
    v[v.len() / 2]
}

/// The heartbeat tick with `rooms` pinned rooms against its floor (one pipelined `PEXPIRE` per
/// pin), its server CPU, and its round trips (counted through a proxy adding 25 ms each way).
struct Ticks {
    tick: Duration,
    floor: Duration,
    cpu_us: u64,
    round_trips: u64,
}

/// The tick with metrics recorded and without (medians, alternating), with `--rooms` pins and
/// with none, and one `Node::metrics()` render.
struct MetricsCost {
    tick_on: Duration,
    tick_off: Duration,
    /// Median of the pairs' on / off ratios.
    tick_ratio: f64,
    empty_on: Duration,
    empty_off: Duration,
    empty_ratio: f64,
    render: Duration,
}

/// Alternates `on` and `off` ticks `n` times each (each pair in a random order): their medians
/// and the median of each pair's on / off ratio (a pair shares the machine's load of the
/// moment, so the ratio is steadier than the ratio of the medians).
fn paired_ticks(on: &Node, off: &Node, n: usize) -> (Duration, Duration, f64) {
    let time = |node: &Node| {
        let t = Instant::now();
        node.heartbeat_now().expect("tick");
        t.elapsed()
    };
    let (mut a, mut b) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        if fastrand::bool() {
            a.push(time(on));
            b.push(time(off));
        } else {
            b.push(time(off));
            a.push(time(on));
        }
    }
    let mut ratios: Vec<f64> = a.iter().zip(&b).map(|(x, y)| secs(*x) / secs(*y)).collect();
    ratios.sort_by(f64::total_cmp);
    (median_of(&a), median_of(&b), ratios[ratios.len() / 2])
}

fn measure_metrics_cost(b: &Bench, rooms: usize, runs: usize) -> MetricsCost {
    let start = |id: &str, on: bool| {
        let cfg = config(&b.url, id)
            .to_builder()
            .metrics(on)
            .build()
            .expect("config");
        Node::start(cfg).expect("node")
    };
    let (empty_on_node, empty_off_node) = (start("empty-on", true), start("empty-off", false));
    let (empty_on, empty_off, empty_ratio) =
        paired_ticks(&empty_on_node, &empty_off_node, 200 * runs);
    let (on, off) = (start("metrics-on", true), start("metrics-off", false));
    for r in 0..rooms {
        on.pin_room(&format!("on-r{r}")).expect("pin");
        off.pin_room(&format!("off-r{r}")).expect("pin");
    }
    let (tick_on, tick_off, tick_ratio) = paired_ticks(&on, &off, 20 * runs);
    let render = median(101, || {
        let t = Instant::now();
        std::hint::black_box(on.metrics());
        t.elapsed()
    });
    for n in [empty_on_node, empty_off_node, on, off] {
        n.leave().ok();
    }
    MetricsCost {
        tick_on,
        tick_off,
        tick_ratio,
        empty_on,
        empty_off,
        empty_ratio,
        render,
    }
}

fn measure_ticks(b: &mut Bench, rooms: usize, runs: usize) -> Ticks {
    let ticker = Node::start(config(&b.url, "ticker")).expect("ticker");
    let names: Vec<String> = (0..rooms).map(|r| format!("tick-r{r}")).collect();
    for r in &names {
        ticker.pin_room(r).expect("pin");
    }
    let cpu = server_cpu_us(&mut b.fab);
    let tick = median(runs * 3, || {
        let t = Instant::now();
        ticker.heartbeat_now().expect("tick");
        t.elapsed()
    });
    let cpu_us = (server_cpu_us(&mut b.fab) - cpu) / (runs as u64 * 3);
    let owners: Vec<String> = names.iter().map(|r| b.ks.room(r).owner).collect();
    let floor = median(runs * 3, || {
        let t = Instant::now();
        let mut pipe = redis::pipe();
        for k in &owners {
            pipe.pexpire(k, 90_000).ignore();
        }
        pipe.query::<()>(&mut b.via).expect("PEXPIRE");
        t.elapsed()
    });
    let slow = FaultProxy::start(("127.0.0.1", b.server.port())).expect("proxy");
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
    slow_ticker.leave().ok();
    ticker.leave().ok();
    Ticks {
        tick,
        floor,
        cpu_us,
        round_trips: (secs(base) / 0.050).round() as u64,
    }
}

fn main() {
    let a = Args::parse();
    if let Some(list) = arg("--sweep") {
        let sizes: Vec<usize> = list
            .split(',')
            .filter_map(|v| v.trim().parse().ok())
            .collect();
        sweep(&sizes, a.rooms, a.latency_rooms, a.runs);
        return;
    }
    if let Some(list) = arg("--pace-sweep") {
        let paces: Vec<f64> = list
            .split(',')
            .filter_map(|v| v.trim().parse().ok())
            .collect();
        pace_sweep(&paces, a.batch, a.latency_rooms, a.runs);
        return;
    }
    let flag = |name: &str| std::env::args().any(|a| a == name);
    if flag("--tls") {
        tls::report(&a);
        return;
    }
    if flag("--cluster") {
        cluster::report(&a);
        return;
    }
    if flag("--wait") {
        wait::report(&a);
        return;
    }
    if flag("--churn") {
        let b = Bench::start(a.rtt_ms);
        let c = churn::measure(&b.url, &b.direct, a.pairs, a.runs);
        let mut v = churn::fields(&c);
        v["rtt_ms"] = json!(a.rtt_ms);
        v["loadavg"] = json!(load_average());
        println!("{v}");
        let goals = churn::goals(&c);
        for (goal, met) in goals {
            eprintln!("goal {:<45} {}", goal, if met { "met" } else { "NOT met" });
        }
        let ok = goals.iter().all(|(_, met)| *met);
        // `exit` runs no destructor: stop the private redis-server first.
        drop(b);
        std::process::exit(if ok { 0 } else { 1 });
    }
    if flag("--reap") {
        let mut b = Bench::start(a.rtt_ms);
        let leader = fast_leader_with_batch(&b.url, a.batch);
        let r = measure_reaps(&mut b, &leader, a.rooms, a.runs);
        let mut v = reap_fields(&a, &r);
        v["loadavg"] = json!(load_average());
        println!("{v}");
        let goals = reap_goals(&a, &r);
        for (goal, met) in goals {
            eprintln!("goal {:<45} {}", goal, if met { "met" } else { "NOT met" });
        }
        let ok = goals.iter().all(|(_, met)| *met);
        // `exit` runs no destructor: stop the node, then the private redis-server.
        drop(leader);
        drop(b);
        std::process::exit(if ok { 0 } else { 1 });
    }
    if flag("--metrics") {
        let b = Bench::start(a.rtt_ms);
        let m = measure_metrics_cost(&b, a.rooms, a.runs);
        let ok = metrics_report(&a, &m);
        drop(b);
        std::process::exit(if ok { 0 } else { 1 });
    }
    let mut b = Bench::start(a.rtt_ms);
    eprintln!(
        "perf_report: {} rooms x {PEERS_PER_ROOM} peers, rtt {} ms, {} runs each",
        a.rooms, a.rtt_ms, a.runs
    );
    let leader = fast_leader_with_batch(&b.url, a.batch);
    let reaps = measure_reaps(&mut b, &leader, a.rooms, a.runs);
    let ticks = measure_ticks(&mut b, a.rooms, a.runs);
    let metrics = measure_metrics_cost(&b, a.rooms, a.runs);
    let churn = churn::measure(&b.url, &b.direct, a.pairs, a.runs);
    let direct = b.direct.clone();
    // The machine's own PING tail with no reap running, to judge the two below against.
    let alone = ping_alone(&direct, 5.0);
    let unpaced = reap_with_pings(&leader, &mut b.fab, &direct, a.latency_rooms);
    // The same reap at the reaper's pace: a leader of its own (the first one leaves, releasing
    // the lease).
    leader.leave().ok();
    let paced_leader = fast_leader_paced(&Target::plain(&b.url), a.batch, a.pace);
    let paced = reap_with_pings(&paced_leader, &mut b.fab, &direct, a.latency_rooms);
    paced_leader.leave().ok();
    report(
        &a, &reaps, &ticks, &metrics, &churn, &alone, &unpaced, &paced,
    );
}

/// The reap comparison's fields of the report.
fn reap_fields(a: &Args, r: &Reaps) -> serde_json::Value {
    let ms = |d: Duration| (d.as_secs_f64() * 1e6).round() / 1e3;
    let rate = |d: Duration| (a.rooms as f64 / secs(d)).round();
    let ratio = |x: Duration, y: Duration| (secs(x) / secs(y) * 100.0).round() / 100.0;
    json!({
        "rooms": a.rooms,
        "peers_per_room": PEERS_PER_ROOM,
        "rtt_ms": a.rtt_ms,
        "reap_batch": a.batch,
        "library_rooms_per_s": rate(r.library),
        "seed_style_rooms_per_s": rate(r.seed),
        "floor_rooms_per_s": rate(r.floor),
        "library_vs_seed_style": ratio(r.seed, r.library),
        "library_vs_floor": ratio(r.floor, r.library),
        "script_floor_ms": ms(r.script_floor),
        "library_vs_script_floor": ratio(r.script_floor, r.library),
        "library_ms": ms(r.library),
        "library_server_cpu_ms": r.library_cpu_us as f64 / 1000.0,
        "library_server_cpu_us_per_room": (r.library_cpu_us as f64 / a.rooms as f64 * 100.0).round() / 100.0,
        "floor_server_cpu_ms": r.floor_cpu_us as f64 / 1000.0,
        "script_floor_server_cpu_ms": r.script_floor_cpu_us as f64 / 1000.0,
        "library_vs_script_floor_cpu": (r.script_floor_cpu_us as f64 / r.library_cpu_us.max(1) as f64 * 100.0).round() / 100.0,
        "seed_style_ms": ms(r.seed),
        "floor_ms": ms(r.floor),
    })
}

/// The reap comparison's goals: against the seed-style reaper (5x at loopback, 50x at 1 ms
/// RTT), the plain `UNLINK` floor and the script floor (issue 27: within 1.4x of it).
fn reap_goals(a: &Args, r: &Reaps) -> [(&'static str, bool); 3] {
    let loopback = a.rtt_ms == 0.0;
    let seed_goal = if loopback { 5.0 } else { 50.0 };
    [
        (
            if loopback {
                "reap >= 5x seed-style (loopback)"
            } else {
                "reap >= 50x seed-style (1 ms RTT)"
            },
            secs(r.seed) / secs(r.library) >= seed_goal,
        ),
        ("reap >= 0.5x floor", secs(r.floor) / secs(r.library) >= 0.5),
        (
            "reap >= 0.7x script floor",
            secs(r.script_floor) / secs(r.library) >= 0.7,
        ),
    ]
}

/// The metrics-cost fields of the report.
fn metrics_fields(m: &MetricsCost) -> serde_json::Value {
    let ms = |d: Duration| (d.as_secs_f64() * 1e6).round() / 1e3;
    let ratio = |r: f64| (r * 1000.0).round() / 1000.0;
    json!({
        "metrics_tick_on_ms": ms(m.tick_on),
        "metrics_tick_off_ms": ms(m.tick_off),
        "metrics_tick_ratio": ratio(m.tick_ratio),
        "metrics_empty_tick_on_ms": ms(m.empty_on),
        "metrics_empty_tick_off_ms": ms(m.empty_off),
        "metrics_empty_tick_ratio": ratio(m.empty_ratio),
        "metrics_render_us": (m.render.as_secs_f64() * 1e7).round() / 10.0,
    })
}

/// The metrics-cost goals: (goal, met).
fn metrics_goals(m: &MetricsCost) -> [(&'static str, bool); 2] {
    [
        ("tick with metrics <= 1.05x without", m.tick_ratio <= 1.05),
        (
            "empty tick with metrics <= 1.05x without",
            m.empty_ratio <= 1.05,
        ),
    ]
}

/// `--metrics`: the metrics cost alone; true when its goals are met.
fn metrics_report(a: &Args, m: &MetricsCost) -> bool {
    let mut v = metrics_fields(m);
    v["rooms"] = json!(a.rooms);
    v["rtt_ms"] = json!(a.rtt_ms);
    println!("{v}");
    let goals = metrics_goals(m);
    for (goal, met) in goals {
        eprintln!("goal {:<45} {}", goal, if met { "met" } else { "NOT met" });
    }
    goals.iter().all(|(_, met)| *met)
}

/// Prints the JSON report, then each goal and whether it is met. `unpaced` and `paced`: the
/// big reap's duration and the sorted PING round trips during it, at pace 0 and at `a.pace`.
#[allow(clippy::too_many_arguments)] // one per part of the report
fn report(
    a: &Args,
    r: &Reaps,
    t: &Ticks,
    m: &MetricsCost,
    c: &churn::Churn,
    alone: &[Duration],
    unpaced: &(Duration, Vec<Duration>),
    paced: &(Duration, Vec<Duration>),
) {
    let (big_reap, samples) = (paced.0, &paced.1);
    let pct = |p: f64| samples[((samples.len() - 1) as f64 * p) as usize];
    let unpaced_pct = |p: f64| unpaced.1[((unpaced.1.len() - 1) as f64 * p) as usize];
    let ms = |d: Duration| (d.as_secs_f64() * 1e6).round() / 1e3;
    let ratio = |x: Duration, y: Duration| (secs(x) / secs(y) * 100.0).round() / 100.0;
    let ping_max = *samples.last().expect("samples");
    let report = json!({
        "tick_server_cpu_ms": t.cpu_us as f64 / 1000.0,
        "tick_ms": ms(t.tick),
        "tick_floor_ms": ms(t.floor),
        "tick_round_trips": t.round_trips,
        "tick_vs_floor": ratio(t.tick, t.floor),
        "latency_rooms": a.latency_rooms,
        "alone_ping_p99_ms": ms(alone[((alone.len() - 1) as f64 * 0.99) as usize]),
        "alone_ping_max_ms": ms(*alone.last().expect("samples")),
        "unpaced_latency_reap_ms": ms(unpaced.0),
        "unpaced_ping_samples": unpaced.1.len(),
        "unpaced_ping_p50_ms": ms(unpaced_pct(0.50)),
        "unpaced_ping_p99_ms": ms(unpaced_pct(0.99)),
        "unpaced_ping_max_ms": ms(*unpaced.1.last().expect("samples")),
        "reap_pace": a.pace,
        "pace_slowdown": ratio(big_reap, unpaced.0),
        "loadavg": load_average(),
        "latency_reap_ms": ms(big_reap),
        "ping_samples": samples.len(),
        "ping_p50_ms": ms(pct(0.50)),
        "ping_p99_ms": ms(pct(0.99)),
        "ping_max_ms": ms(ping_max),
    });
    let mut report = report;
    for more in [reap_fields(a, r), metrics_fields(m), churn::fields(c)] {
        if let (Some(all), serde_json::Value::Object(more)) = (report.as_object_mut(), more) {
            all.extend(more);
        }
    }
    println!("{report}");
    let goals = [
        ("tick <= 2 round trips", t.round_trips <= 2),
        ("tick <= 2x floor", secs(t.tick) <= 2.0 * secs(t.floor)),
        (
            "PING p99 < 2 ms during the paced big reap",
            pct(0.99) < Duration::from_millis(2),
        ),
        (
            "PING max < 5 ms during the paced big reap",
            ping_max < Duration::from_millis(5),
        ),
    ];
    for (goal, met) in reap_goals(a, r)
        .into_iter()
        .chain(goals)
        .chain(metrics_goals(m))
        .chain(churn::goals(c))
    {
        eprintln!("goal {:<45} {}", goal, if met { "met" } else { "NOT met" });
    }
}
