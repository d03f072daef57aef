//! `perf_report --wait`: what `WAIT 1 <t>` costs on a replicated master (a `redis-server` and
//! one replica, loopback), with `t = command_timeout / 2` as the lease thread sends it
//! (`src/lease.rs`, `replicated`).
//!
//! - `acquire_*`: `lease_acquire.lua` (the library's script, on a connection from the library's
//!   connector), alone / then `ROLE` / then `ROLE` and `WAIT 1 t` (what the library sends on
//!   a replicated master: three round trips). The lease key is deleted between two acquires,
//!   outside the timed part.
//! - `refresh_*`: `lease_refresh.lua` alone / + `ROLE` / + `ROLE` + `WAIT` (every
//!   `lease_refresh` while leading).
//! - `pin_*`: `Node::pin_room` of a new room alone / followed by `WAIT 1 t`: whether pins should
//!   also wait. `WAIT` only waits for the writes of the connection that sends it, and the pin
//!   goes over the node's own connection, so the `WAIT` here is sent (one pipelined round trip)
//!   after a one-key `SET` on a second connection: replication offsets are global, so the
//!   replica acknowledging that `SET` has the pin too. That is what the library would pay
//!   with a `WAIT` on its own connection, plus one tiny `SET`.
//!
//! Variants are interleaved (A, B, C, A, B, C, ...) so noise hits them alike; `p50_us`,
//! `p99_us` and `max_us` of `--samples` each. `wait_acked` counts what `WAIT` returned.
//!
//! Then the replica is SIGSTOPped (the master still lists it: it drops a replica only after
//! `repl-timeout`, 60 s) and `WAIT 1 t` is timed `--stopped-samples` times, alone and in the
//! acquire path: how long a lease write blocks, and what `WAIT` returns (0: the library then
//! releases a won lease, or keeps a refreshed term's old deadline). Last, after SIGCONT, how
//! long until `WAIT` is acknowledged again.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use redis::{Script, Value};
use serde_json::{json, Value as Json};
use sfu_redis::keys::{encode_id, IdKind, KeySpace};
use sfu_redis::ops::conn::Conn as Connection;
use sfu_redis::{Node, Timings};
use sfu_redis_testkit::devserver::LocalRedis;

use super::common::*;
use super::{ms, Args};

/// The library's lease scripts, as the library sends them.
const LEASE_ACQUIRE: &str = include_str!("../../lua/lease_acquire.lua");
const LEASE_REFRESH: &str = include_str!("../../lua/lease_refresh.lua");

/// The key the pin variant's second connection writes before its `WAIT`.
const PROBE: &str = "bench-wait-probe";

/// Connected replicas in the master's `ROLE` reply (`["master", offset, [[ip, port, off], ...]]`).
fn role_replicas(con: &mut Connection) -> usize {
    match redis::cmd("ROLE").query::<Value>(con).expect("ROLE") {
        Value::Array(items) => match items.get(2) {
            Some(Value::Array(r)) => r.len(),
            _ => 0,
        },
        other => panic!("ROLE replied {other:?}"),
    }
}

fn wait(con: &mut Connection, wait_ms: u64) -> i64 {
    redis::cmd("WAIT")
        .arg(1)
        .arg(wait_ms)
        .query(con)
        .expect("WAIT")
}

/// `p50_us`, `p99_us`, `max_us` of `v`.
fn percentiles(mut v: Vec<Duration>) -> Json {
    v.sort();
    let us = |d: Duration| (d.as_secs_f64() * 1e7).round() / 10.0;
    let at = |p: f64| v[((v.len() - 1) as f64 * p) as usize];
    json!({"p50_us": us(at(0.5)), "p99_us": us(at(0.99)), "max_us": us(v[v.len() - 1])})
}

fn p50_us(j: &Json) -> f64 {
    j["p50_us"].as_f64().unwrap_or(f64::NAN)
}

/// `samples` rounds of every variant `0..variants`, interleaved; `f(variant)` returns the
/// variant's measured time. One result list per variant.
fn interleaved(
    samples: usize,
    variants: usize,
    mut f: impl FnMut(usize) -> Duration,
) -> Vec<Vec<Duration>> {
    // Warm-up (script loads, connection pools), not recorded.
    for _ in 0..20 {
        (0..variants).for_each(|v| {
            f(v);
        });
    }
    let mut out = vec![Vec::with_capacity(samples); variants];
    for _ in 0..samples {
        for (v, times) in out.iter_mut().enumerate() {
            times.push(f(v));
        }
    }
    out
}

/// The lease of `ks` for `me`: acquire, refresh.
struct Lease {
    ks: KeySpace,
    me: String,
    ttl_ms: u64,
    acquire: Script,
    refresh: Script,
}

impl Lease {
    fn acquire(&self, con: &mut Connection) {
        let (won, _, _): (i64, Value, String) = self
            .acquire
            .key(self.ks.leader())
            .key(self.ks.epoch())
            .key(self.ks.dataset())
            .arg(&self.me)
            .arg(self.ttl_ms)
            .arg(0)
            .invoke(con)
            .expect("lease_acquire.lua");
        assert_eq!(won, 1, "the acquire did not win (lease held?)");
    }

    fn refresh(&self, con: &mut Connection) {
        let held: i64 = self
            .refresh
            .key(self.ks.leader())
            .arg(&self.me)
            .arg(self.ttl_ms)
            .invoke(con)
            .expect("lease_refresh.lua");
        assert_eq!(held, 1, "the refresh found the lease not ours");
    }

    fn drop_lease(&self, con: &mut Connection) {
        let _: () = redis::cmd("DEL")
            .arg(self.ks.leader())
            .query(con)
            .expect("DEL");
    }
}

pub fn report(a: &Args) {
    let command_timeout = a
        .command_timeout_ms
        .map(Duration::from_millis)
        .unwrap_or(Timings::default().command_timeout);
    let wait_ms = (command_timeout.as_millis() as u64 / 2).max(1);
    let master = LocalRedis::start_with(&["--repl-diskless-sync-delay", "0"])
        .expect("start redis-server (is it on PATH?)");
    let replica = LocalRedis::start_replica_of(&master, &[]).expect("start a replica");
    eprintln!(
        "perf_report --wait: master {} + 1 replica, WAIT 1 {wait_ms} (command_timeout {} ms), {} samples per variant",
        master.url(),
        command_timeout.as_millis(),
        a.samples
    );
    let mut con = connect(&master.url());
    let mut second = connect(&master.url());
    let replicas = role_replicas(&mut con);
    assert_eq!(replicas, 1, "the master lists no replica");
    let mut acked: BTreeMap<i64, u64> = BTreeMap::new();

    // A prefix of its own, with a dataset token older than a lease TTL (lease_acquire.lua
    // refuses on a younger dataset) and no node on it, so no one else takes the lease.
    let lease = Lease {
        ks: KeySpace::new("sfu", "bench-lease", "main").expect("key space"),
        me: encode_id(IdKind::Instance, "bench-wait").expect("id"),
        ttl_ms: Timings::default().lease_ttl.as_millis() as u64,
        acquire: Script::new(LEASE_ACQUIRE),
        refresh: Script::new(LEASE_REFRESH),
    };
    let _: () = redis::cmd("SET")
        .arg(lease.ks.dataset())
        .arg("bench:0")
        .query(&mut con)
        .expect("SET dataset");

    let acquires = interleaved(a.samples, 3, |v| {
        lease.drop_lease(&mut con);
        let t = Instant::now();
        lease.acquire(&mut con);
        if v >= 1 {
            assert_eq!(role_replicas(&mut con), 1);
        }
        if v == 2 {
            *acked.entry(wait(&mut con, wait_ms)).or_default() += 1;
        }
        t.elapsed()
    });
    let refreshes = interleaved(a.samples, 3, |v| {
        let t = Instant::now();
        lease.refresh(&mut con);
        if v >= 1 {
            assert_eq!(role_replicas(&mut con), 1);
        }
        if v == 2 {
            *acked.entry(wait(&mut con, wait_ms)).or_default() += 1;
        }
        t.elapsed()
    });

    let pinner = Node::start(config(&master.url(), "bench-pinner")).expect("start a node");
    let mut room = 0u64;
    let pins = interleaved(a.samples, 2, |v| {
        room += 1;
        let name = format!("wait-r{room}");
        let t = Instant::now();
        pinner.pin_room(&name).expect("pin");
        if v == 1 {
            let (_, n): ((), i64) = redis::pipe()
                .set(PROBE, room)
                .cmd("WAIT")
                .arg(1)
                .arg(wait_ms)
                .query(&mut second)
                .expect("SET + WAIT");
            *acked.entry(n).or_default() += 1;
        }
        t.elapsed()
    });
    pinner.leave().ok();

    // The replica hangs: SIGSTOP.
    replica.sigstop().expect("SIGSTOP the replica");
    let stopped_replicas = role_replicas(&mut con);
    let mut stopped_wait = Vec::new();
    let mut stopped_acquire = Vec::new();
    for _ in 0..a.stopped_samples {
        let _: () = redis::cmd("SET")
            .arg(PROBE)
            .arg("stopped")
            .query(&mut con)
            .expect("SET");
        let t = Instant::now();
        let n = wait(&mut con, wait_ms);
        stopped_wait.push((n, t.elapsed()));
        lease.drop_lease(&mut con);
        let t = Instant::now();
        lease.acquire(&mut con);
        let replicas = role_replicas(&mut con);
        let n = wait(&mut con, wait_ms);
        stopped_acquire.push((n, t.elapsed(), replicas));
    }
    replica.sigcont().expect("SIGCONT the replica");
    let t = Instant::now();
    let recovered = loop {
        let _: () = redis::cmd("SET")
            .arg(PROBE)
            .arg("continued")
            .query(&mut con)
            .expect("SET");
        if wait(&mut con, wait_ms) >= 1 {
            break t.elapsed();
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no ack 30 s after SIGCONT"
        );
    };

    let [acquire, acquire_role, acquire_role_wait] = acquires
        .try_into()
        .map(|v: [Vec<Duration>; 3]| v.map(percentiles))
        .expect("3 variants");
    let [refresh, refresh_role, refresh_role_wait] = refreshes
        .try_into()
        .map(|v: [Vec<Duration>; 3]| v.map(percentiles))
        .expect("3 variants");
    let [pin, pin_wait] = pins
        .try_into()
        .map(|v: [Vec<Duration>; 2]| v.map(percentiles))
        .expect("2 variants");
    let delta = |with: &Json, without: &Json| (p50_us(with) - p50_us(without)).round();
    let report = json!({
        "mode": "wait",
        "samples": a.samples,
        "command_timeout_ms": command_timeout.as_millis() as u64,
        "wait_ms": wait_ms,
        "replicas": replicas,
        "acquire": acquire,
        "acquire_role": acquire_role,
        "acquire_role_wait": acquire_role_wait,
        "acquire_wait_cost_p50_us": delta(&acquire_role_wait, &acquire),
        "refresh": refresh,
        "refresh_role": refresh_role,
        "refresh_role_wait": refresh_role_wait,
        "refresh_wait_cost_p50_us": delta(&refresh_role_wait, &refresh),
        "pin": pin,
        "pin_wait": pin_wait,
        "pin_wait_cost_p50_us": delta(&pin_wait, &pin),
        "wait_acked": acked.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
        "stopped_replica": {
            "role_replicas": stopped_replicas,
            "wait_returned": stopped_wait.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            "wait_blocked_ms": stopped_wait.iter().map(|(_, d)| ms(*d)).collect::<Vec<_>>(),
            "acquire_role_wait_returned": stopped_acquire.iter().map(|(n, _, _)| *n).collect::<Vec<_>>(),
            "acquire_role_wait_blocked_ms": stopped_acquire.iter().map(|(_, d, _)| ms(*d)).collect::<Vec<_>>(),
            "acquire_role_replicas": stopped_acquire.iter().map(|(_, _, r)| *r).collect::<Vec<_>>(),
            "acked_again_after_sigcont_ms": ms(recovered),
        },
    });
    println!("{report}");
    eprintln!(
        "WAIT adds (p50): acquire {} us, refresh {} us, pin {} us ({:.1}x a pin alone); a SIGSTOPped replica blocks each lease write {:?} ms",
        delta(&acquire_role_wait, &acquire),
        delta(&refresh_role_wait, &refresh),
        delta(&pin_wait, &pin),
        p50_us(&pin_wait) / p50_us(&pin),
        stopped_acquire.iter().map(|(_, d, _)| ms(*d)).collect::<Vec<_>>(),
    );
}
