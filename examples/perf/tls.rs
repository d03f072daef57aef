//! `perf_report --tls`: the heartbeat tick and the reap over plaintext and over TLS, against
//! the same server (one `redis-server` with a TLS port and a plaintext port), in one run.
//!
//! Each transport has its own key prefix (stages `bench-tcp` and `bench-tls`, same length, so
//! same key sizes), its own leader and its own ticker, all live for the whole run; the runs
//! alternate between the two (plaintext then TLS, then TLS then plaintext, ...) so that a
//! noisy neighbour hits both alike. Fabrication and the server-CPU readings go over a separate
//! plaintext connection, outside the timed parts.
//!
//! Connect time: `Redis::connect` (TCP, TLS handshake, the script preload pipeline, `ROLE`)
//! on a new connector each time (`*_connect_fresh_ms`) and on one connector again and again
//! (`*_connect_ms`: what a node's reconnect costs), and a bare redis-rs connection plus one
//! `PING` (`*_handshake_ms`: the handshake without the library's preload). Every TLS connect
//! is a full handshake: redis-rs builds a new rustls client config (and so an empty session
//! cache) for each connection, so the two connect times should agree.

use std::time::{Duration, Instant};

use serde_json::json;
use sfu_redis::keys::KeySpace;
use sfu_redis::ops::conn::Redis;
use sfu_redis::Node;
use sfu_redis_testkit::devserver::{LocalRedis, TlsServer};
use sfu_redis_testkit::tls::TestCerts;

use super::common::*;
use super::{median_of, ms, server_cpu_us, Args};

/// One transport: where it connects and the key space of its prefix.
struct Side {
    name: &'static str,
    target: Target,
    ks: KeySpace,
}

/// The two sides in the order run `i` measures them: plaintext first on even runs, TLS first
/// on odd ones.
fn order(i: usize) -> [usize; 2] {
    if i % 2 == 0 {
        [0, 1]
    } else {
        [1, 0]
    }
}

/// Per side: the measured durations and the server CPU (µs) of each.
#[derive(Default)]
struct Samples {
    took: Vec<Duration>,
    cpu_us: Vec<u64>,
}

impl Samples {
    fn median_ms(&self) -> f64 {
        ms(median_of(&self.took))
    }

    fn median_cpu_ms(&self) -> f64 {
        let mut v = self.cpu_us.clone();
        v.sort();
        v[v.len() / 2] as f64 / 1000.0
    }

    fn all_ms(&self) -> Vec<f64> {
        self.took.iter().map(|d| ms(*d)).collect()
    }
}

/// Keys of `ks` (the `{ctl}` keys aside): what a reap must leave at 0.
fn data_keys(con: &mut sfu_redis::ops::conn::Conn, ks: &KeySpace) -> usize {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(ks.scan_pattern())
        .query(con)
        .expect("KEYS");
    keys.iter().filter(|k| !k.contains("{ctl}")).count()
}

/// Times `f` on each side, `runs` times, alternating, with the server CPU of each call.
fn alternate(
    fab: &mut sfu_redis::ops::conn::Conn,
    runs: usize,
    mut setup: impl FnMut(&mut sfu_redis::ops::conn::Conn, usize),
    mut f: impl FnMut(usize) -> Duration,
) -> [Samples; 2] {
    let mut out = [Samples::default(), Samples::default()];
    for i in 0..runs {
        for side in order(i) {
            setup(fab, side);
            let cpu = server_cpu_us(fab);
            let took = f(side);
            out[side].cpu_us.push(server_cpu_us(fab) - cpu);
            out[side].took.push(took);
        }
    }
    out
}

/// Connect times, alternating sides: fresh connectors, one connector reused, bare handshakes.
fn connects(sides: &[Side; 2], certs: &TestCerts, n: usize) -> [[Vec<Duration>; 3]; 2] {
    let connector =
        |s: &Side| Redis::from_config(&config_at(&s.target, "connect-probe")).expect("connector");
    let reused = [connector(&sides[0]), connector(&sides[1])];
    let ca = std::fs::read(certs.ca()).expect("read the CA file");
    let bare = [
        redis::Client::open(sides[0].target.url.as_str()).expect("client"),
        redis::Client::build_with_tls(
            sides[1].target.url.as_str(),
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(ca),
            },
        )
        .expect("TLS client"),
    ];
    let mut out: [[Vec<Duration>; 3]; 2] = Default::default();
    for i in 0..n {
        for side in order(i) {
            // A new connector: nothing to resume, a full TLS handshake.
            let fresh = connector(&sides[side]);
            let t = Instant::now();
            drop(fresh.connect().expect("connect"));
            out[side][0].push(t.elapsed());
            let t = Instant::now();
            drop(reused[side].connect().expect("connect"));
            out[side][1].push(t.elapsed());
            let t = Instant::now();
            let mut con = bare[side]
                .get_connection_with_timeout(Duration::from_secs(5))
                .expect("bare connect");
            let _: String = redis::cmd("PING").query(&mut con).expect("PING");
            out[side][2].push(t.elapsed());
        }
    }
    out
}

pub fn report(a: &Args) {
    if a.rtt_ms > 0.0 {
        eprintln!("perf_report --tls: --rtt-ms is ignored (loopback only)");
    }
    let certs = TestCerts::generate().expect("test certificates (is openssl on PATH?)");
    let server = LocalRedis::start_tls(
        &certs,
        TlsServer {
            plain_port: true,
            ..TlsServer::default()
        },
    )
    .expect("start redis-server with a TLS port (is it built with TLS?)");
    let sides = [
        Target::plain(&server.url()).with_stage("bench-tcp"),
        Target::tls(&server.tls_url(), certs.ca()).with_stage("bench-tls"),
    ]
    .map(|target| Side {
        name: if target.tls_ca.is_some() {
            "tls"
        } else {
            "plain"
        },
        ks: target.keyspace(),
        target,
    });
    eprintln!(
        "perf_report --tls: {} rooms x {PEERS_PER_ROOM} peers, {} runs each, plaintext {} and TLS {} on one server, alternating",
        a.rooms, a.runs, sides[0].target.url, sides[1].target.url
    );
    let mut fab = connect(&server.url());

    let conn = connects(&sides, &certs, a.connects);

    // Both leaders wait for their lease (a new prefix: a lease TTL) at the same time.
    let leaders: Vec<Node> = std::thread::scope(|s| {
        let started: Vec<_> = sides
            .iter()
            .map(|side| s.spawn(|| fast_leader_at(&side.target, a.batch)))
            .collect();
        started
            .into_iter()
            .map(|h| h.join().expect("leader"))
            .collect()
    });
    let rooms = a.rooms;
    let reaps = alternate(
        &mut fab,
        a.runs,
        |fab, side| {
            fabricate(fab, &sides[side].ks, "dead", rooms);
        },
        |side| {
            let t = Instant::now();
            let c = leaders[side].reap_now("dead").expect("reap").expect("dead");
            let took = t.elapsed();
            assert_eq!(c.rooms as usize, rooms, "{} reap", sides[side].name);
            took
        },
    );
    for side in &sides {
        assert_eq!(
            data_keys(&mut fab, &side.ks),
            0,
            "the {} reap left keys",
            side.name
        );
        let _: () = redis::cmd("ZREM")
            .arg(side.ks.heartbeats())
            .arg("dead")
            .query(&mut fab)
            .expect("ZREM");
    }
    for l in &leaders {
        l.shutdown().ok();
    }

    let tickers: Vec<Node> = sides
        .iter()
        .map(|side| {
            let n = Node::start(config_at(&side.target, "ticker")).expect("ticker");
            for r in 0..rooms {
                n.pin_room(&format!("tick-r{r}")).expect("pin");
            }
            n
        })
        .collect();
    let ticks = alternate(
        &mut fab,
        a.runs * 3,
        |_, _| {},
        |side| {
            let t = Instant::now();
            tickers[side].heartbeat_now().expect("tick");
            t.elapsed()
        },
    );
    for t in &tickers {
        t.leave().ok();
    }

    let ratio = |tls: f64, plain: f64| (tls / plain * 100.0).round() / 100.0;
    let c = |side: usize, k: usize| ms(median_of(&conn[side][k]));
    let report = json!({
        "mode": "tls",
        "rooms": rooms,
        "peers_per_room": PEERS_PER_ROOM,
        "reap_batch": a.batch,
        "runs": a.runs,
        "tick_runs": a.runs * 3,
        "connects": a.connects,
        "plain_reap_ms": reaps[0].median_ms(),
        "tls_reap_ms": reaps[1].median_ms(),
        "tls_reap_ratio": ratio(reaps[1].median_ms(), reaps[0].median_ms()),
        "plain_reap_server_cpu_ms": reaps[0].median_cpu_ms(),
        "tls_reap_server_cpu_ms": reaps[1].median_cpu_ms(),
        "plain_tick_ms": ticks[0].median_ms(),
        "tls_tick_ms": ticks[1].median_ms(),
        "tls_tick_ratio": ratio(ticks[1].median_ms(), ticks[0].median_ms()),
        "plain_tick_server_cpu_ms": ticks[0].median_cpu_ms(),
        "tls_tick_server_cpu_ms": ticks[1].median_cpu_ms(),
        "plain_connect_fresh_ms": c(0, 0),
        "tls_connect_fresh_ms": c(1, 0),
        "tls_connect_fresh_ratio": ratio(c(1, 0), c(0, 0)),
        "plain_connect_ms": c(0, 1),
        "tls_connect_ms": c(1, 1),
        "tls_connect_ratio": ratio(c(1, 1), c(0, 1)),
        "plain_handshake_ms": c(0, 2),
        "tls_handshake_ms": c(1, 2),
        "plain_reap_runs_ms": reaps[0].all_ms(),
        "tls_reap_runs_ms": reaps[1].all_ms(),
        "plain_tick_runs_ms": ticks[0].all_ms(),
        "tls_tick_runs_ms": ticks[1].all_ms(),
    });
    println!("{report}");
    eprintln!(
        "TLS / plaintext (medians): reap {:.2}x, tick {:.2}x, connect {:.2}x (fresh connector {:.2}x)",
        ratio(reaps[1].median_ms(), reaps[0].median_ms()),
        ratio(ticks[1].median_ms(), ticks[0].median_ms()),
        ratio(c(1, 1), c(0, 1)),
        ratio(c(1, 0), c(0, 0)),
    );
}
