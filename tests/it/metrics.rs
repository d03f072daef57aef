//! Metrics and health: `sfu-redis node --metrics-addr` scraped over HTTP and parsed with an
//! independent parser (the `prometheus-parse` crate), counters that move (a reap, a script
//! flush, a Redis restart), `/healthz` going 503 while Redis is down and back to 200; a
//! `--metrics-addr` that cannot bind; and `Node::metrics` / `Node::health` in-process (both
//! formats, memory-only mode, metrics off).

use crate::support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use prometheus_parse::{Scrape, Value as PValue};
use serde_json::Value;
use sfu_redis::{Config, MetricsFormat, Node, Timings};
use support::procs::{cli_bin, is, Events, Spawn, FAST};
use support::*;

/// One HTTP/1.1 exchange on a fresh connection (`Connection: close`): (status, body).
fn http_get(addr: SocketAddr, path: &str, accept: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("connect to the metrics server at {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw)
        .unwrap_or_else(|e| panic!("read the answer to GET {path}: {e}"));
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {raw:?}"));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    (status, body.to_owned())
}

/// A parsed exposition: every sample by name and labels.
struct Parsed {
    samples: Vec<prometheus_parse::Sample>,
    types: BTreeMap<String, &'static str>,
}

/// Parses with `prometheus-parse`, and reads the `# TYPE` lines (the parser keeps a
/// histogram's type only on its samples).
fn parse(text: &str) -> Parsed {
    let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("parse");
    let mut types = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').expect("# TYPE name type");
            let ty = match ty {
                "counter" => "counter",
                "gauge" => "gauge",
                "histogram" => "histogram",
                other => panic!("unexpected type {other:?} of {name}"),
            };
            types.insert(name.to_owned(), ty);
        }
    }
    Parsed {
        samples: scrape.samples,
        types,
    }
}

impl Parsed {
    fn sample(&self, name: &str, labels: &[(&str, &str)]) -> &prometheus_parse::Sample {
        self.samples
            .iter()
            .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
            .unwrap_or_else(|| panic!("no sample {name} {labels:?}"))
    }

    /// A counter's or gauge's value (the parser types them from `# TYPE`).
    fn value(&self, name: &str) -> f64 {
        self.labelled(name, &[])
    }

    fn labelled(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        match &self.sample(name, labels).value {
            PValue::Counter(v) | PValue::Gauge(v) | PValue::Untyped(v) => *v,
            other => panic!("{name} is not a single value: {other:?}"),
        }
    }

    /// A histogram's observation count: its `+Inf` bucket.
    fn histogram_count(&self, name: &str) -> f64 {
        match &self.sample(name, &[]).value {
            PValue::Histogram(buckets) => buckets
                .iter()
                .find(|b| b.less_than.is_infinite())
                .map(|b| b.count)
                .unwrap_or_else(|| panic!("{name} has no +Inf bucket")),
            other => panic!("{name} is not a histogram: {other:?}"),
        }
    }
}

/// Every metric the README lists, with its type (names as exposed).
const EXPECTED: [(&str, &str); 25] = [
    ("sfu_redis_node", "gauge"),
    ("sfu_redis_healthy", "gauge"),
    ("sfu_redis_heartbeat_age_seconds", "gauge"),
    ("sfu_redis_heartbeats_total", "counter"),
    ("sfu_redis_heartbeat_failures_total", "counter"),
    ("sfu_redis_slow_ticks_total", "counter"),
    ("sfu_redis_tick_duration_seconds", "histogram"),
    ("sfu_redis_is_leader", "gauge"),
    ("sfu_redis_leader_epoch", "gauge"),
    ("sfu_redis_epoch_seen", "gauge"),
    ("sfu_redis_leadership_terms_total", "counter"),
    ("sfu_redis_reap_candidates_total", "counter"),
    ("sfu_redis_reaps_total", "counter"),
    ("sfu_redis_reaped_rooms_total", "counter"),
    ("sfu_redis_reaped_peers_total", "counter"),
    ("sfu_redis_skipped_rooms_total", "counter"),
    ("sfu_redis_reap_duration_seconds", "histogram"),
    ("sfu_redis_redis_errors_total", "counter"),
    ("sfu_redis_bad_data_total", "counter"),
    ("sfu_redis_reconnects_total", "counter"),
    ("sfu_redis_script_reloads_total", "counter"),
    ("sfu_redis_master_switches_total", "counter"),
    ("sfu_redis_events_dropped_total", "counter"),
    ("sfu_redis_rooms", "gauge"),
    ("sfu_redis_peers", "gauge"),
];

fn assert_every_metric(p: &Parsed) {
    for (name, ty) in EXPECTED {
        assert_eq!(
            p.types.get(name).copied(),
            Some(ty),
            "# TYPE of {name} (types: {:?})",
            p.types
        );
        assert!(
            p.samples.iter().any(|s| s.metric == name),
            "no sample of {name}"
        );
    }
    for kind in ["timeout", "connection", "reply", "other"] {
        p.labelled("sfu_redis_redis_errors_total", &[("kind", kind)]);
    }
    assert_eq!(
        p.types.len(),
        EXPECTED.len(),
        "no other metric: {:?}",
        p.types.keys()
    );
}

/// A node process serving metrics on a port the kernel picked: its address (read from the
/// stderr line it prints), its stdout events on `tx`.
struct MetricsNode {
    child: Child,
    addr: SocketAddr,
}

impl Drop for MetricsNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_metrics_node(
    url: &str,
    stage: &str,
    id: &str,
    tx: mpsc::Sender<(String, Value)>,
) -> MetricsNode {
    let mut child = Command::new(cli_bin())
        .args(["node", "--json", "--stage", stage, "--instance-id", id])
        .args(["--redis-url", url, "--metrics-addr", "127.0.0.1:0"])
        .args(FAST)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sfu-redis node");
    let stdout = child.stdout.take().expect("stdout");
    let name = id.to_owned();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let v: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line}"));
            if tx.send((name.clone(), v)).is_err() {
                break;
            }
        }
    });
    // The address line, then the rest of stderr passed through (the node's logs).
    let (addr_tx, addr_rx) = mpsc::channel();
    let stderr = child.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("sfu-redis: serving http://") {
                let addr = rest.split('/').next().unwrap_or_default().to_owned();
                let _ = addr_tx.send(addr);
            }
            eprintln!("[metrics node] {line}");
        }
    });
    let addr = addr_rx
        .recv_timeout(LONG)
        .expect("the node prints the metrics address on stderr")
        .parse()
        .expect("a socket address");
    MetricsNode { child, addr }
}

/// Scrapes until `pred` holds (deadline [`LONG`]); the last scrape.
fn scrape_until(addr: SocketAddr, what: &str, pred: impl Fn(&Parsed) -> bool) -> Parsed {
    wait_for(LONG, what, || {
        let (status, body) = http_get(addr, "/metrics", None);
        assert_eq!(status, 200, "/metrics answers 200: {body}");
        let p = parse(&body);
        pred(&p).then_some(p)
    })
}

// The scrape test: a leader node serving /metrics is scraped over HTTP, its exposition
// parsed by prometheus-parse; killing another node makes the reap counters move; a SCRIPT FLUSH
// moves the script reloads; with Redis down /metrics is still served and /healthz says 503
// with the reason; Redis back, /healthz is 200 again and the reconnects moved.
#[test]
fn a_scraped_node_shows_its_reaps_and_its_health_through_a_redis_outage() {
    let mut server = Server::start_with(&[]);
    let url = server.url();
    let stage = "metrics";
    let (tx, rx) = mpsc::channel();
    let mut events = Events::new(rx);
    let leader = spawn_metrics_node(&url, stage, "m-leader", tx.clone());
    events.expect("m-leader leads", |i, v| {
        i == "m-leader" && is(v, "leader_acquired")
    });

    let first = scrape_until(leader.addr, "a scrape of the leader", |p| {
        p.value("sfu_redis_is_leader") == 1.0
    });
    assert_every_metric(&first);
    assert_eq!(first.value("sfu_redis_reaps_total"), 0.0);
    assert!(first.value("sfu_redis_leadership_terms_total") >= 1.0);
    assert!(first.value("sfu_redis_leader_epoch") >= 1.0);
    assert_eq!(first.value("sfu_redis_healthy"), 1.0);
    let node = first.sample("sfu_redis_node", &[("instance_id", "m-leader")]);
    assert_eq!(node.labels.get("mode"), Some("redis"));
    assert_eq!(node.labels.get("prefix"), Some("sfu:metrics:main"));

    let (status, body) = http_get(leader.addr, "/healthz", None);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("last heartbeat"), "{body}");
    let (status, _) = http_get(leader.addr, "/nope", None);
    assert_eq!(status, 404);

    // Another node with 2 rooms x 3 peers dies; the leader reaps it.
    let mut victim = Spawn::new(&url, stage, "m-victim", &["m-r1", "m-r2"]).run(tx);
    events.expect("m-victim ready", |i, v| i == "m-victim" && is(v, "ready"));
    victim.kill9();
    let after = scrape_until(leader.addr, "the reap counted", |p| {
        p.value("sfu_redis_reaps_total") >= 1.0
    });
    assert_eq!(after.value("sfu_redis_reaps_total"), 1.0);
    assert_eq!(after.value("sfu_redis_reaped_rooms_total"), 2.0);
    assert_eq!(after.value("sfu_redis_reaped_peers_total"), 6.0);
    assert_eq!(after.value("sfu_redis_skipped_rooms_total"), 0.0);
    assert!(after.value("sfu_redis_reap_candidates_total") >= 1.0);
    assert_eq!(
        after.histogram_count("sfu_redis_reap_duration_seconds"),
        1.0
    );
    assert!(
        after.histogram_count("sfu_redis_tick_duration_seconds")
            > first.histogram_count("sfu_redis_tick_duration_seconds")
    );
    assert!(after.value("sfu_redis_heartbeats_total") > first.value("sfu_redis_heartbeats_total"));
    events.expect("the reap event agrees", |i, v| {
        i == "m-leader" && is(v, "instance_reaped") && v["dead"] == "m-victim" && v["rooms"] == 2
    });

    // A flushed script cache: the next tick meets NOSCRIPT and reloads.
    server
        .redis()
        .cli(&["SCRIPT", "FLUSH"])
        .expect("SCRIPT FLUSH");
    scrape_until(leader.addr, "a script reload counted", |p| {
        p.value("sfu_redis_script_reloads_total") >= 1.0
    });

    // Redis down: still served, unhealthy with the reason.
    let before_outage = scrape_until(leader.addr, "a scrape", |_| true);
    server.redis_mut().kill9();
    let body = wait_for(LONG, "/healthz answers 503", || {
        let (status, body) = http_get(leader.addr, "/healthz", None);
        (status == 503).then_some(body)
    });
    assert!(
        body.contains("no successful heartbeat within heartbeat_ttl 0.600 s")
            && body.contains("last error:"),
        "{body}"
    );
    let down = scrape_until(leader.addr, "a scrape while Redis is down", |p| {
        p.value("sfu_redis_healthy") == 0.0
    });
    assert_every_metric(&down);
    assert!(down.value("sfu_redis_heartbeat_age_seconds") >= 0.6);
    assert!(
        down.value("sfu_redis_heartbeat_failures_total")
            > before_outage.value("sfu_redis_heartbeat_failures_total")
    );
    let errors = |p: &Parsed| {
        ["timeout", "connection", "reply", "other"]
            .map(|k| p.labelled("sfu_redis_redis_errors_total", &[("kind", k)]))
    };
    let (was, now) = (errors(&before_outage), errors(&down));
    assert!(
        now[1] > was[1],
        "refused connections count as kind=connection: {was:?} -> {now:?}"
    );

    // Redis back (empty): healthy again; the dropped connections were made again.
    server
        .redis_mut()
        .start_again()
        .expect("redis-server again");
    let (status, body) = wait_for(LONG, "/healthz answers 200 again", || {
        let (status, body) = http_get(leader.addr, "/healthz", None);
        (status == 200).then_some((status, body))
    });
    assert_eq!(status, 200, "{body}");
    let back = scrape_until(leader.addr, "healthy again", |p| {
        p.value("sfu_redis_healthy") == 1.0
    });
    assert!(
        back.value("sfu_redis_reconnects_total")
            > before_outage.value("sfu_redis_reconnects_total")
    );
}

/// Runs `sfu-redis` with `args` (killed after [`LONG`]): (exit code, stderr).
fn run_cli(args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(cli_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sfu-redis");
    let deadline = Instant::now() + LONG;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("sfu-redis {args:?} still runs after {LONG:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .unwrap();
    (status.code(), err)
}

// Bad input: an address already in use (and one that is no address) ends the node at once
// with exit 2 and a message naming the address and the OS error; nothing is registered.
#[test]
fn a_metrics_addr_that_cannot_bind_exits_2_before_registering() {
    let server = Server::start_with(&[]);
    let url = server.url();
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().unwrap().to_string();
    let (code, err) = run_cli(&[
        "node",
        "--redis-url",
        &url,
        "--stage",
        "badbind",
        "--metrics-addr",
        &addr,
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!("--metrics-addr {addr}")) && err.contains("in use"),
        "{err}"
    );
    assert!(
        server.keys("sfu:badbind:*").is_empty(),
        "nothing registered: {:?}",
        server.keys("sfu:badbind:*")
    );

    let (code, err) = run_cli(&["node", "--metrics-addr", "no-port-here"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--metrics-addr") && err.contains("no-port-here"),
        "{err}"
    );
}

// In-process: both formats render every metric (OpenMetrics ends with # EOF), the values
// follow Stats, health follows the heartbeat; with metrics(false) the histograms stay empty
// while the counters still count; memory-only mode is healthy and renders too.
#[test]
fn node_metrics_render_both_formats_and_follow_the_node() {
    let server = Server::start();
    let node = server.node("metrics-lib", "lib-a");
    node.pin_room("lib-r1").unwrap();
    node.upsert_peer("lib-r1", "lib-p1", None, &[]).unwrap();
    node.heartbeat_now().unwrap();
    let p = parse(&node.metrics());
    assert_every_metric(&p);
    assert_eq!(p.value("sfu_redis_rooms"), 1.0);
    assert_eq!(p.value("sfu_redis_peers"), 1.0);
    assert!(p.histogram_count("sfu_redis_tick_duration_seconds") >= 1.0);
    let s = node.stats();
    assert_eq!(p.value("sfu_redis_heartbeats_total"), s.heartbeats as f64);
    let health = node.health();
    assert!(
        health.ok && health.reason.contains("last heartbeat"),
        "{health:?}"
    );

    let om = node.metrics_as(MetricsFormat::OpenMetrics);
    assert!(om.ends_with("# EOF\n"), "{om}");
    assert!(om.contains("# TYPE sfu_redis_reaps counter\nsfu_redis_reaps_total 0\n"));
    assert!(om.contains("# UNIT sfu_redis_tick_duration_seconds seconds\n"));
    node.shutdown().unwrap();
    let health = node.health();
    assert!(!health.ok && health.reason == "stopped", "{health:?}");
    assert_eq!(parse(&node.metrics()).value("sfu_redis_healthy"), 0.0);

    // Metrics off: ticks are counted, not timed.
    let config = server
        .config_with("metrics-lib", "lib-off", Timings::fast())
        .to_builder()
        .metrics(false)
        .build()
        .unwrap();
    let off = Node::start(config).unwrap();
    off.heartbeat_now().unwrap();
    off.heartbeat_now().unwrap();
    let p = parse(&off.metrics());
    assert!(p.value("sfu_redis_heartbeats_total") >= 3.0);
    assert_eq!(p.histogram_count("sfu_redis_tick_duration_seconds"), 0.0);
    off.shutdown().unwrap();

    // Memory-only: healthy, no heartbeat age.
    let mem = Node::start(Config::builder().instance_id("mem-1").build().unwrap()).unwrap();
    let health = mem.health();
    assert!(
        health.ok && health.reason.contains("memory-only"),
        "{health:?}"
    );
    let p = parse(&mem.metrics());
    assert_every_metric(&p);
    assert!(p.value("sfu_redis_heartbeat_age_seconds").is_nan());
    assert_eq!(
        p.sample("sfu_redis_node", &[]).labels.get("mode"),
        Some("memory")
    );
}
