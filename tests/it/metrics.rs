//! Metrics and health: `sfu-redis node --metrics-addr` scraped over HTTP and parsed with an
//! independent parser (the `prometheus-parse` crate), counters that move (a reap, a script
//! flush, a Redis restart), `/healthz` going 503 while Redis is down and back to 200; a
//! `--metrics-addr` that cannot bind; and `Node::metrics` / `Node::health` in-process (both
//! formats, memory-only mode, metrics off).
//!
//! Hostile clients over real TCP (issue 26 item 1): one that pipelines thousands of requests
//! and never reads (neither `/healthz` nor SIGTERM waits for it), a request line or header
//! without a line end (431, bounded memory), a slowloris trickle (cut at its deadline), more
//! connections than the cap (503, the slots come back).

use crate::support;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use prometheus_parse::{Scrape, Value as PValue};
use serde_json::Value;
use sfu_redis::ops::status::{fleet_status, InstanceState};
use sfu_redis::{Config, MetricsFormat, Node, Timings};
use support::procs::{cli_bin, is, signal, Events, MetricsNode, Spawn};
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

/// Every metric a node exposes, with its type (names as exposed); docs/src/reference/metrics.md
/// lists the same (`assert_the_reference_lists_exactly` checks the page against a scrape).
const EXPECTED: [(&str, &str); 27] = [
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
    ("sfu_redis_data_losses_total", "counter"),
    ("sfu_redis_reaped_self_total", "counter"),
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

const METRICS_PAGE: &str = "docs/src/reference/metrics.md";

/// `docs/src/reference/metrics.md` lists exactly the metrics of the exposition `p` (a scrape of
/// a node), both ways: each with its type, its labels (`name{a, b}`; a histogram's `le` aside)
/// and, for a `_seconds` metric, the unit `s`.
fn assert_the_reference_lists_exactly(p: &Parsed) {
    let page = support::pages::Page::reference("metrics.md");
    let table = page
        .sections
        .iter()
        .find_map(|s| s.table_with("type").filter(|t| t.column("name").is_some()))
        .unwrap_or_else(|| panic!("{METRICS_PAGE}: no table with the columns name and type"));
    let col = |c: &str| table.column(c).expect("a column");
    let (name_col, type_col, unit_col) = (col("name"), col("type"), table.column("unit"));
    // name -> (type, labels, unit, line)
    let mut documented = BTreeMap::new();
    for row in &table.rows {
        let spans = support::pages::code_spans(table.cell(row, name_col));
        let [span] = spans.as_slice() else {
            panic!("{METRICS_PAGE}:{}: one `name` per row: {spans:?}", row.line);
        };
        let (name, labels) = match span.split_once('{') {
            Some((n, rest)) => (
                n.trim(),
                rest.trim_end_matches('}')
                    .split(',')
                    .map(|l| l.trim().to_owned())
                    .filter(|l| !l.is_empty())
                    .collect(),
            ),
            None => (span.as_str(), std::collections::BTreeSet::new()),
        };
        let unit = unit_col.map(|c| table.cell(row, c).to_owned());
        documented.insert(
            name.to_owned(),
            (table.cell(row, type_col).to_owned(), labels, unit, row.line),
        );
    }
    let mut problems = Vec::new();
    for (name, ty) in &p.types {
        let labels: std::collections::BTreeSet<String> = p
            .samples
            .iter()
            .filter(|s| s.metric == *name)
            .flat_map(|s| s.labels.keys().cloned())
            .filter(|l| l != "le")
            .collect();
        let Some((doc_ty, doc_labels, unit, line)) = documented.get(name) else {
            problems.push(format!(
                "a node exposes {name} ({ty}), which {METRICS_PAGE} does not list"
            ));
            continue;
        };
        if doc_ty != ty {
            problems.push(format!(
                "{METRICS_PAGE}:{line}: {name} is a {ty}, the page says {doc_ty:?}"
            ));
        }
        if *doc_labels != labels {
            problems.push(format!(
                "{METRICS_PAGE}:{line}: {name} carries the labels {labels:?}, the page says {doc_labels:?}"
            ));
        }
        if let Some(unit) = unit {
            if name.ends_with("_seconds") != (unit == "s") {
                problems.push(format!(
                    "{METRICS_PAGE}:{line}: {name} has the unit {unit:?}: `s` is the unit of the `_seconds` metrics, and of them only"
                ));
            }
        }
    }
    for (name, (_, _, _, line)) in &documented {
        if !p.types.contains_key(name) {
            problems.push(format!(
                "{METRICS_PAGE}:{line} lists {name}, which a scrape of a node does not have (it has {:?})",
                p.types.keys()
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{} difference(s) between {METRICS_PAGE} and a scrape (fix the page):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

// The metrics reference against a node's exposition, both ways, without Redis: a memory-only
// node renders every metric (the scrape of a node process over HTTP is checked the same way in
// the first test below).
#[test]
fn metrics_reference_lists_exactly_the_metrics_a_node_exposes() {
    let node = Node::start(
        Config::builder()
            .instance_id("ref-metrics")
            .build()
            .unwrap(),
    )
    .unwrap();
    let p = parse(&node.metrics());
    assert_every_metric(&p);
    assert_the_reference_lists_exactly(&p);
    node.shutdown().unwrap();
}

fn spawn_metrics_node(
    url: &str,
    stage: &str,
    id: &str,
    tx: mpsc::Sender<(String, Value)>,
) -> MetricsNode {
    support::procs::spawn_metrics_node(url, stage, id, &[], Some(tx))
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
    assert_the_reference_lists_exactly(&first);
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

/// One `GET path` on a fresh connection, answered within `within` (connect, write and read):
/// `(status, body)`, or what went wrong.
fn get_within(addr: SocketAddr, path: &str, within: Duration) -> Result<(u16, String), String> {
    let started = Instant::now();
    let mut s = TcpStream::connect_timeout(&addr, within).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(within)).unwrap();
    s.set_write_timeout(Some(within)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("write: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| {
        format!(
            "no complete answer after {:?} ({e}); got {:?}",
            started.elapsed(),
            String::from_utf8_lossy(&raw)
        )
    })?;
    if started.elapsed() > within {
        return Err(format!("answered only after {:?}", started.elapsed()));
    }
    let raw = String::from_utf8_lossy(&raw);
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no header end in {raw:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))?;
    Ok((status, body.to_owned()))
}

/// A field of `/proc/<pid>/status` in KiB (`VmRSS`, `VmHWM`).
fn vm_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Reads everything `s` answers until the server closes, the connection resets or `within`
/// passes: (bytes, closed by the server).
fn read_answer(mut s: TcpStream, within: Duration) -> (Vec<u8>, bool) {
    s.set_read_timeout(Some(within)).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (out, true),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return (out, false)
            }
            Err(_) => return (out, true),
        }
    }
}

/// Sends `prefix` then `b'a'` up to `total` bytes in all on one connection while reading its
/// answer on another thread: (answer, bytes sent before the server cut the connection). The
/// answer is read for at most 20 s.
fn flood(addr: SocketAddr, prefix: &[u8], total: usize) -> (Vec<u8>, usize) {
    let mut s = TcpStream::connect(addr).expect("connect");
    let r = s.try_clone().unwrap();
    let reader = std::thread::spawn(move || read_answer(r, Duration::from_secs(20)).0);
    let chunk = vec![b'a'; 1 << 20];
    let mut sent = 0;
    let mut next: &[u8] = prefix;
    while sent < total {
        match s.write(next) {
            Ok(n) => {
                sent += n;
                next = &chunk[..chunk.len().min(total - sent)];
            }
            Err(_) => break,
        }
    }
    (reader.join().unwrap(), sent)
}

/// A node serving metrics, `/healthz` answering: the node.
fn healthy_metrics_node(url: &str, stage: &str, id: &str) -> MetricsNode {
    let (tx, _rx) = mpsc::channel();
    let node = spawn_metrics_node(url, stage, id, tx);
    wait_for(LONG, "/healthz answers 200", || {
        (http_get(node.addr, "/healthz", None).0 == 200).then_some(())
    });
    node
}

// Issue 26, finding 1: one client pipelines 10000 `GET /metrics` on one connection and never
// reads. The old server (one thread, no write timeout) blocked writing to it: /healthz got no
// answer and SIGTERM waited for that thread while the node kept its heartbeat and lease. Now
// /healthz answers at once, and SIGTERM stops the node cleanly (exit 0, the lease released,
// the heartbeat released) while the client still holds its connection open.
#[test]
fn a_client_that_never_reads_delays_neither_healthz_nor_the_stop() {
    let server = Server::start_with(&[]);
    let url = server.url();
    let stage = "mhold";
    let (tx, rx) = mpsc::channel();
    let mut events = Events::new(rx);
    let mut node = spawn_metrics_node(&url, stage, "hold-1", tx);
    events.expect("hold-1 leads", |i, v| {
        i == "hold-1" && is(v, "leader_acquired")
    });
    let ks = ks(stage);
    let lease: Option<String> = redis::cmd("GET")
        .arg(ks.leader())
        .query(&mut server.raw_con())
        .unwrap();
    assert!(lease.is_some(), "hold-1 holds the lease");

    // The hog: 10000 pipelined requests (about 100 MB of answers), nothing read.
    let mut hog = TcpStream::connect(node.addr).expect("connect");
    let mut pump = hog.try_clone().unwrap();
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {}\r\n\r\n", node.addr).repeat(100);
    let pumping = std::thread::spawn(move || {
        for _ in 0..100 {
            // The new server closes the connection after its answer: the writes then fail.
            if pump.write_all(request.as_bytes()).is_err() {
                return;
            }
        }
    });
    for round in 1..=3 {
        match get_within(node.addr, "/healthz", Duration::from_secs(5)) {
            Ok((status, body)) => assert_eq!(status, 200, "{body}"),
            Err(e) => panic!("/healthz (round {round}) while a client does not read: {e}"),
        }
    }

    signal(node.child.id(), "TERM");
    let exit = wait_for(
        Duration::from_secs(15),
        "the node's exit after SIGTERM while a client does not read",
        || node.child.try_wait().unwrap(),
    );
    assert!(exit.success(), "exit 0 after SIGTERM: {exit}");
    let lease: Option<String> = redis::cmd("GET")
        .arg(ks.leader())
        .query(&mut server.raw_con())
        .unwrap();
    assert_eq!(lease, None, "the lease was released");
    let st = fleet_status(&server.config(stage, "reader")).unwrap();
    let me = st
        .instances
        .iter()
        .find(|i| i.id == "hold-1")
        .expect("hold-1 listed");
    assert_eq!(
        me.state,
        InstanceState::Stopped,
        "heartbeat released: {st:#?}"
    );
    // Held open until here.
    let _ = hog.flush();
    drop(hog);
    let _ = pumping.join();
}

// Issue 26, finding 1: a request line without a line end was buffered whole (1 GiB took the
// node from 13 MiB to 906 MiB). Now the head is capped at 8 KiB: 431, the connection is closed
// long before 64 MiB are sent, and the node's peak memory (VmHWM) grows by less than 32 MiB.
// A header line without an end gets 431 too.
#[test]
fn a_request_head_without_a_line_end_gets_431_and_memory_stays_bounded() {
    let server = Server::start_with(&[]);
    let node = healthy_metrics_node(&server.url(), "mhuge", "huge-1");
    let pid = node.child.id();
    let peak_before = vm_kib(pid, "VmHWM");
    let total = 64 << 20;
    let (answer, sent) = flood(node.addr, b"GET /", total);
    let peak_after = vm_kib(pid, "VmHWM");
    assert!(
        peak_after < peak_before + 32 * 1024,
        "peak RSS {peak_before} KiB -> {peak_after} KiB after a {sent}-byte request line"
    );
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 431 "),
        "431 for the request line: {answer:?}"
    );
    assert!(
        sent < total,
        "the server closed the connection: all {sent} bytes were taken"
    );

    let (answer, _) = flood(
        node.addr,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Long: ",
        1 << 20,
    );
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 431 ") && answer.contains("8192 bytes"),
        "431 for a header: {answer:?}"
    );
    let (status, _) = http_get(node.addr, "/healthz", None);
    assert_eq!(status, 200, "still serving");
}

// Slowloris: a client that sends its head one byte every 300 ms. The whole request must arrive
// within 5 s of the accept (a trickle does not extend it): the connection is cut (408) while
// other clients are served meanwhile. The old server had no deadline: the trickle held on.
#[test]
fn a_slow_client_is_cut_at_its_deadline_and_others_are_served_meanwhile() {
    let server = Server::start_with(&[]);
    let node = healthy_metrics_node(&server.url(), "mslow", "slow-1");
    let started = Instant::now();
    let slow = TcpStream::connect(node.addr).expect("connect");
    let mut w = slow.try_clone().unwrap();
    let trickle = std::thread::spawn(move || {
        if w.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            .is_err()
        {
            return;
        }
        let until = Instant::now() + Duration::from_secs(40);
        while Instant::now() < until {
            if w.write_all(b"a").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    });
    for round in 1..=3 {
        match get_within(node.addr, "/healthz", Duration::from_secs(5)) {
            Ok((status, body)) => assert_eq!(status, 200, "{body}"),
            Err(e) => panic!("/healthz (round {round}) during a slowloris: {e}"),
        }
    }
    let (answer, closed) = read_answer(slow, Duration::from_secs(20));
    let took = started.elapsed();
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        closed,
        "the trickling connection is still open after {took:?}: {answer:?}"
    );
    assert!(
        took < Duration::from_secs(15),
        "cut only after {took:?} (the deadline is 5 s)"
    );
    assert!(
        answer.starts_with("HTTP/1.1 408 ") && answer.contains("within 5 s"),
        "{answer:?}"
    );
    let _ = trickle.join();
}

// The connection cap against one client that holds many connections (an adversarial trial:
// 40 threads, each sending a request line then a header a second, never finishing, and
// reconnecting as soon as it is cut, kept /healthz at 503 in 46-52 of 60 probes). Now a new
// connection beyond the 32 open takes the place of the one that has waited longest for its
// request: every probe of a prompt client gets 200 while the hog holds on, and the hog's
// oldest connections are the ones closed. The old server took any number of connections; the
// first fix refused the 33rd with 503.
#[test]
fn a_client_holding_many_unfinished_requests_cannot_keep_a_probe_out() {
    let server = Server::start_with(&[]);
    let node = healthy_metrics_node(&server.url(), "mcap", "cap-1");
    let stop = Arc::new(AtomicBool::new(false));
    let cut = Arc::new(AtomicUsize::new(0));
    let hogs: Vec<_> = (0..40)
        .map(|_| {
            let (stop, cut, addr) = (stop.clone(), cut.clone(), node.addr);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut s) = TcpStream::connect(addr) else {
                        continue;
                    };
                    let _ = s.write_all(b"GET /healthz HTTP/1.1\r\n");
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(200));
                        if s.write_all(b"X: y\r\n").is_err() {
                            cut.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                    }
                }
            })
        })
        .collect();
    // Past the cap for a while: the hog's connections are cut to make room.
    wait_for(LONG, "some of the hog's connections closed", || {
        (cut.load(Ordering::Relaxed) > 0).then_some(())
    });
    let mut answers = Vec::new();
    for _ in 0..20 {
        answers.push(get_within(node.addr, "/healthz", Duration::from_secs(5)).map(|(c, _)| c));
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    for h in hogs {
        let _ = h.join();
    }
    assert!(
        answers.iter().all(|a| a == &Ok(200)),
        "a probe was kept out by a client holding 40 unfinished requests: {answers:?}"
    );
}
