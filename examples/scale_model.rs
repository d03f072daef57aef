//! Measures the steady-state Redis load of a fleet at the default timings, the numbers behind
//! `docs/src/deploy/sizing.md`:
//!
//! ```sh
//! cargo run --release --example scale_model                      # 10 instances x 1,000 rooms, 60 s
//! cargo run --release --example scale_model -- --instances 20 --rooms 500 --seconds 120
//! ```
//!
//! Starts a private `redis-server`, measures its idle CPU, starts `--instances` nodes with
//! `Timings::default()` (10 s heartbeat, 30 s lease refresh, 15 s reap rounds) in this process,
//! each pinning `--rooms` rooms with `--peers` peers, then counts over `--seconds` (a multiple of
//! 30 s, so every periodic task runs a whole number of times) the commands Redis executed
//! (`INFO commandstats`) and the CPU it used (`INFO cpu`). A churn phase then measures the
//! server CPU of one peer join + leave (upsert + remove) and of one room open + close (pin +
//! close). Prints one JSON object: per-instance and per-room commands/s and CPU, the per-op
//! churn costs, memory per room, and the capacity of one Redis primary at 50% of one core.

#[path = "../benches/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;
use sfu_redis::{Config, Node, Timings};

use common::server;

fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `INFO <section>` as field -> value.
fn info(con: &mut sfu_redis::ops::conn::Conn, section: &str) -> BTreeMap<String, String> {
    let text: String = redis::cmd("INFO").arg(section).query(con).expect("INFO");
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
        .collect()
}

/// Server CPU used so far (user + sys), µs.
fn cpu_us(con: &mut sfu_redis::ops::conn::Conn) -> f64 {
    let i = info(con, "cpu");
    let f = |k: &str| i.get(k).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (f("used_cpu_user") + f("used_cpu_sys")) * 1e6
}

/// Calls per command since the last `CONFIG RESETSTAT` (`INFO` itself excluded).
fn calls(con: &mut sfu_redis::ops::conn::Conn) -> BTreeMap<String, u64> {
    info(con, "commandstats")
        .into_iter()
        .filter_map(|(k, v)| {
            let name = k.strip_prefix("cmdstat_")?.to_owned();
            if name == "info" || name.starts_with("config") {
                return None;
            }
            let n = v.split(',').next()?.strip_prefix("calls=")?.parse().ok()?;
            Some((name, n))
        })
        .collect()
}

fn used_memory(con: &mut sfu_redis::ops::conn::Conn) -> f64 {
    info(con, "memory")["used_memory"]
        .parse()
        .expect("used_memory")
}

fn round(x: f64, digits: i32) -> f64 {
    let p = 10f64.powi(digits);
    (x * p).round() / p
}

/// `instances` nodes, each pinning `rooms` rooms with `peers` peers (with guests).
fn start_fleet(url: &str, instances: usize, rooms: usize, peers: usize, t: Timings) -> Vec<Node> {
    (0..instances)
        .map(|i| {
            let node = Node::start(scale_config(url, &format!("sfu-{i}"), t)).expect("start");
            for r in 0..rooms {
                let room = format!("i{i}-r{r}");
                node.pin_room(&room).expect("pin");
                for p in 0..peers {
                    node.upsert_peer(
                        &room,
                        &format!("{room}-p{p}"),
                        Some(&format!("{room}-g{p}")),
                        &[("transport", "webrtc")],
                    )
                    .expect("upsert");
                }
            }
            node
        })
        .collect()
}

fn scale_config(url: &str, instance: &str, t: Timings) -> Config {
    Config::builder()
        .redis_url(url)
        .stage("scale")
        .instance_id(instance)
        .timings(t)
        .build()
        .expect("config")
}

/// The steady state over a window: its length (s), the server CPU (µs) and the calls by
/// command name.
struct Steady {
    window: f64,
    cpu: f64,
    by_cmd: BTreeMap<String, u64>,
}

fn steady_window(con: &mut sfu_redis::ops::conn::Conn, seconds: u64) -> Steady {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(con)
        .expect("RESETSTAT");
    let c0 = cpu_us(con);
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs(seconds));
    Steady {
        window: t.elapsed().as_secs_f64(),
        cpu: cpu_us(con) - c0,
        by_cmd: calls(con),
    }
}

/// Server CPU (µs) of one tick of `node`, averaged over 20 ticks.
fn tick_cpu_us(con: &mut sfu_redis::ops::conn::Conn, node: &Node) -> f64 {
    let ticks = 20;
    let c0 = cpu_us(con);
    for _ in 0..ticks {
        node.heartbeat_now().expect("tick");
    }
    (cpu_us(con) - c0) / ticks as f64
}

/// Server CPU (µs) of a peer joining and leaving, and of a room opening and closing, on `node`.
fn churn_cpu_us(con: &mut sfu_redis::ops::conn::Conn, node: &Node, churn_ops: usize) -> (f64, f64) {
    let churn_room = "churn-room";
    node.pin_room(churn_room).expect("pin");
    let c0 = cpu_us(con);
    for k in 0..churn_ops {
        let peer = format!("cp{k}");
        let generation = node
            .upsert_peer(
                churn_room,
                &peer,
                Some(&format!("cg{k}")),
                &[("transport", "webrtc")],
            )
            .expect("upsert");
        node.remove_peer(churn_room, &peer, generation)
            .expect("remove");
    }
    let peer = (cpu_us(con) - c0) / churn_ops as f64;
    let room_ops = churn_ops / 4;
    let c0 = cpu_us(con);
    for k in 0..room_ops {
        let room = format!("cr{k}");
        node.pin_room(&room).expect("pin");
        node.close_room(&room).expect("close");
    }
    (peer, (cpu_us(con) - c0) / room_ops as f64)
}

fn main() {
    let instances: usize = arg("--instances", 10);
    let rooms: usize = arg("--rooms", 1000);
    let peers: usize = arg("--peers", 4);
    let seconds: u64 = arg("--seconds", 60);
    let churn_ops: usize = arg("--churn-ops", 20_000);
    let timings = Timings::default();

    let srv = server();
    let url = srv.url();
    let mut con = common::connect(&url);
    eprintln!(
        "scale_model: {instances} instances x {rooms} rooms x {peers} peers, default timings \
         (heartbeat every {:?}), {seconds} s window",
        timings.heartbeat_interval
    );

    // Idle: what Redis burns with no client (its own cron), subtracted from nothing but shown.
    let idle_window = Duration::from_secs(10);
    let c0 = cpu_us(&mut con);
    std::thread::sleep(idle_window);
    let idle_cpu_per_s = (cpu_us(&mut con) - c0) / idle_window.as_secs_f64();

    let mem0 = used_memory(&mut con);
    let nodes = start_fleet(&url, instances, rooms, peers, timings);
    let mem1 = used_memory(&mut con);
    // Let every node's first tick after the set-up pass, then count a whole window.
    std::thread::sleep(timings.heartbeat_interval + Duration::from_secs(1));
    let steady = steady_window(&mut con, seconds);
    let total: u64 = steady.by_cmd.values().sum();
    // The per-room commands of a tick are the refresh's PEXPIRE + GET; everything else
    // (heartbeat, lease and reaper scripts, and the commands they run inside) is per instance.
    let per_room_calls = steady.by_cmd.get("pexpire").copied().unwrap_or(0)
        + steady.by_cmd.get("get").copied().unwrap_or(0);
    let total_rooms = (instances * rooms) as f64;
    let window = steady.window;
    let steady_cpu_per_s = steady.cpu / window; // µs of server CPU per second

    // Split the CPU: one tick's cost alone (heartbeat_now on one node) prices a room, against
    // a tick with no rooms (the per-instance part, on a node that owns none).
    let probe = &nodes[0];
    let tick_us = tick_cpu_us(&mut con, probe);
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut con)
        .expect("RESETSTAT");
    let empty = Node::start(scale_config(&url, "sfu-empty", timings)).expect("start");
    let empty_tick_cpu_us = tick_cpu_us(&mut con, &empty);
    let room_tick_cpu_us = ((tick_us - empty_tick_cpu_us) / rooms as f64).max(0.0);
    let interval = timings.heartbeat_interval.as_secs_f64();
    let room_cpu_per_s = room_tick_cpu_us / interval;
    // Per instance: its tick with no rooms, every interval (its lease and reaper calls, every
    // 15-30 s, are left in the all-in per-room figure below).
    let instance_cpu_per_s = empty_tick_cpu_us / interval;
    // All-in per room: everything the window measured beyond idle and the instances' ticks,
    // spread over the rooms (pin refreshes, and whatever background work a larger dataset
    // costs Redis: expiry sampling, allocator purging, lease and reaper calls). Conservative.
    let room_all_in_cpu_per_s =
        ((steady_cpu_per_s - idle_cpu_per_s - instance_cpu_per_s * instances as f64) / total_rooms)
            .max(room_cpu_per_s);
    let (peer_churn_cpu_us, room_churn_cpu_us) = churn_cpu_us(&mut con, probe, churn_ops);

    // Capacity of one primary at 50% of one core (Redis executes commands on one thread).
    let budget = 0.5e6 - idle_cpu_per_s;
    let capacity = |n_instances: f64, joins_per_room_per_min: f64| -> f64 {
        let per_room = room_all_in_cpu_per_s + joins_per_room_per_min / 60.0 * peer_churn_cpu_us;
        ((budget - n_instances * instance_cpu_per_s) / per_room).max(0.0)
    };
    let report = json!({
        "instances": instances,
        "rooms_per_instance": rooms,
        "peers_per_room": peers,
        "window_s": round(window, 1),
        "heartbeat_interval_s": interval,
        "commands_per_s": round(total as f64 / window, 1),
        "commands_per_s_per_instance":
            round((total - per_room_calls) as f64 / window / instances as f64, 3),
        "commands_per_s_per_room": round(per_room_calls as f64 / window / total_rooms, 3),
        "commands_by_name": steady.by_cmd,
        "server_cpu_pct": round(steady_cpu_per_s / 1e4, 3),
        "idle_cpu_pct": round(idle_cpu_per_s / 1e4, 3),
        "cpu_us_per_s_per_instance": round(instance_cpu_per_s, 2),
        "cpu_us_per_s_per_room_tick": round(room_cpu_per_s, 4),
        "cpu_us_per_s_per_room_all_in": round(room_all_in_cpu_per_s, 4),
        "tick_cpu_us_per_room": round(room_tick_cpu_us, 3),
        "empty_tick_cpu_us": round(empty_tick_cpu_us, 1),
        "peer_join_leave_cpu_us": round(peer_churn_cpu_us, 2),
        "room_open_close_cpu_us": round(room_churn_cpu_us, 2),
        "memory_bytes_per_room": round((mem1 - mem0) / total_rooms, 0),
        "capacity_rooms_at_50pct_cpu_100_instances_no_churn": capacity(100.0, 0.0).round(),
        "capacity_rooms_at_50pct_cpu_100_instances_1_join_per_room_per_min":
            capacity(100.0, 1.0).round(),
        "capacity_rooms_at_50pct_cpu_1000_instances_10_joins_per_room_per_min":
            capacity(1000.0, 10.0).round(),
        "capacity_rooms_at_50pct_cpu_1000_instances_1_join_per_room_per_min":
            capacity(1000.0, 1.0).round(),
    });
    println!("{report}");
    empty.shutdown().ok();
    for n in nodes {
        n.shutdown().ok();
    }
}
