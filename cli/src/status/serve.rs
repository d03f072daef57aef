//! `sfu-redis status --serve HOST:PORT`: the live fleet page.
//!
//! Routes (anything else is 404; other methods 405):
//! - `GET /`: one self-contained HTML page (inline CSS and script, no external resource) that
//!   fetches `/status.json` every second and draws it.
//! - `GET /status.json`: the object of `status --json` plus `updated_ms` (this host's ms of
//!   the reading), `error: null`, `recent_events` ([`EventRing::to_json`]) and `fsck` (the
//!   summary of the last page-started audit). While Redis cannot be read: `{"error": "Redis
//!   unreachable since <UTC time>: <error>", "unreachable_since_ms", "updated_ms",
//!   "last_status": <the last reading or null>, "recent_events", "fsck"}` (HTTP 200: the
//!   server itself is fine).
//! - `POST /fsck.json`: starts a report-only audit (`sfu_redis::audit`, never a repair; the
//!   settle delay `fsck` would use) in the background: 202 with the summary; 409 `{"busy":
//!   true, "error"}` while one is running. `GET /fsck.json`: the last audit in full
//!   (`{"running", "started_ms", "finished_ms", "error", "report": <fsck --json> | null}`).
//!
//! The fleet is read by one thread every second ([`REFRESH`]), not per request: any number of
//! open pages costs Redis one status read a second, and a request never waits on Redis. The
//! URL on the page is always the redacted one; errors name it without its password.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sfu_redis::audit::{audit, AuditOptions};
use tiny_http::{Header, Method, Request, Response, Server};

use super::events::EventRing;
use super::{now_ms, utc, Outage, Source};
use crate::{with_place, Failure};

/// The page, served as is.
const PAGE: &str = include_str!("page.html");

/// Time between two readings of the fleet (the page refetches at the same pace).
pub(crate) const REFRESH: Duration = Duration::from_secs(1);

/// Problems of the last audit listed in `/status.json`'s `fsck` summary (all of them are in
/// `/fsck.json`).
const FSCK_LISTED: usize = 20;

/// The last reading.
#[derive(Debug, Default)]
struct Snapshot {
    /// The last successful reading (`status --json`), kept through an outage.
    status: Option<Value>,
    /// `(since ms, message)` while Redis cannot be read.
    error: Option<(i64, String)>,
    updated_ms: i64,
}

/// The page-started audit.
#[derive(Debug, Default)]
struct Fsck {
    running: bool,
    started_ms: Option<i64>,
    finished_ms: Option<i64>,
    report: Option<Value>,
    error: Option<String>,
}

impl Fsck {
    /// The full state (`GET /fsck.json`).
    fn to_json(&self) -> Value {
        json!({
            "running": self.running,
            "started_ms": self.started_ms,
            "finished_ms": self.finished_ms,
            "error": self.error,
            "report": self.report,
        })
    }

    /// The summary in `/status.json`: counts by kind and the first [`FSCK_LISTED`] problems.
    fn summary(&self) -> Value {
        let mut v = self.to_json();
        if let Some(report) = &self.report {
            let problems = report["problems"].as_array().cloned().unwrap_or_default();
            let mut by_kind = serde_json::Map::new();
            for p in &problems {
                let kind = p["kind"].as_str().unwrap_or("?").to_owned();
                let n = by_kind.get(&kind).and_then(Value::as_u64).unwrap_or(0);
                by_kind.insert(kind, json!(n + 1));
            }
            v["report"] = json!({
                "clean": report["clean"],
                "problem_count": problems.len(),
                "by_kind": by_kind,
                "problems": problems.iter().take(FSCK_LISTED).collect::<Vec<_>>(),
            });
        }
        v
    }
}

struct Page {
    src: Source,
    snapshot: Mutex<Snapshot>,
    fsck: Mutex<Fsck>,
    events: EventRing,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `--serve`'s argument: `HOST:PORT`, `[v6]:PORT`, or a bare `PORT` (loopback).
pub(crate) fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    let s = s.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        let port: u16 = s
            .parse()
            .map_err(|_| format!("--serve {s:?}: a port is 0 to 65535"))?;
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    let mut addrs = s
        .to_socket_addrs()
        .map_err(|e| format!("--serve {s:?}: expected HOST:PORT or PORT ({e})"))?;
    addrs
        .next()
        .ok_or_else(|| format!("--serve {s:?}: {s} resolves to no address"))
}

pub(crate) fn run(src: Source, addr: &str) -> Result<(), Failure> {
    let addr = parse_addr(addr).map_err(Failure::usage)?;
    let server = Server::http(addr)
        .map_err(|e| Failure::usage(format!("cannot serve the fleet page on {addr}: {e}")))?;
    let bound = server.server_addr().to_ip().unwrap_or(addr);
    if !bound.ip().is_loopback() {
        eprintln!(
            "sfu-redis: warning: the fleet page on {bound} is reachable from other hosts and has no authentication"
        );
    }
    let events = EventRing::start(&src.config)
        .map_err(|e| Failure::runtime(format!("cannot start the events subscriber: {e}")))?;
    let page = Arc::new(Page {
        src,
        snapshot: Mutex::new(Snapshot::default()),
        fsck: Mutex::new(Fsck::default()),
        events,
    });
    // The first reading before the first request, so the page never starts empty.
    let mut outage = Outage::default();
    refresh(&page, &mut outage);
    let p = page.clone();
    std::thread::Builder::new()
        .name("sfu-page-status".into())
        .spawn(move || loop {
            let started = Instant::now();
            refresh(&p, &mut outage);
            std::thread::sleep(REFRESH.saturating_sub(started.elapsed()));
        })
        .map_err(|e| Failure::runtime(format!("cannot start the status reader: {e}")))?;
    out!(
        "serving the fleet page of {} on http://{bound}/ (Ctrl-C to stop)",
        page.src.config.keys().prefix()
    );
    for req in server.incoming_requests() {
        handle(&page, req);
    }
    Ok(())
}

/// One reading into the snapshot.
fn refresh(page: &Page, outage: &mut Outage) {
    let read = page.src.read();
    let down = outage.note(&read);
    let mut s = lock(&page.snapshot);
    s.updated_ms = now_ms();
    match read {
        Ok(status) => {
            s.status = Some(status.to_json());
            s.error = None;
        }
        Err(e) => {
            log::debug!("{e}");
            s.error = down;
        }
    }
}

/// `/status.json`.
fn status_json(page: &Page) -> Value {
    let s = lock(&page.snapshot);
    let mut v = match &s.error {
        None => s.status.clone().unwrap_or_else(|| json!({})),
        Some((since, message)) => json!({
            "error": message,
            "unreachable_since_ms": since,
            "last_status": s.status,
        }),
    };
    v["updated_ms"] = json!(s.updated_ms);
    if s.error.is_none() {
        v["error"] = Value::Null;
    }
    drop(s);
    v["recent_events"] = page.events.to_json();
    v["fsck"] = lock(&page.fsck).summary();
    v
}

/// `POST /fsck.json`: starts an audit unless one runs.
fn start_fsck(page: &Arc<Page>) -> (u16, Value) {
    {
        let mut f = lock(&page.fsck);
        if f.running {
            let since = f.started_ms.map(utc).unwrap_or_default();
            return (
                409,
                json!({"busy": true, "error": format!("an fsck is already running (started {since}); wait for its result")}),
            );
        }
        *f = Fsck {
            running: true,
            started_ms: Some(now_ms()),
            ..Fsck::default()
        };
    }
    let p = page.clone();
    let spawned = std::thread::Builder::new()
        .name("sfu-page-fsck".into())
        .spawn(move || {
            let config = &p.src.config;
            let options = AuditOptions {
                repair: false,
                settle: crate::fsck::fleet_settle(config),
            };
            let result = audit(config, &options);
            let mut f = lock(&p.fsck);
            f.running = false;
            f.finished_ms = Some(now_ms());
            match result {
                Ok(report) => f.report = Some(report.to_json()),
                Err(e) => f.error = Some(with_place("cannot audit", Some(&p.src.url), &e)),
            }
        });
    let mut f = lock(&page.fsck);
    if let Err(e) = spawned {
        f.running = false;
        f.error = Some(format!("cannot start the audit: {e}"));
        return (500, f.summary());
    }
    (202, f.summary())
}

fn header(name: &str, value: &str) -> Option<Header> {
    Header::from_bytes(name.as_bytes(), value.as_bytes()).ok()
}

fn handle(page: &Arc<Page>, req: Request) {
    let path = req.url().split('?').next().unwrap_or("/").to_owned();
    let method = req.method().clone();
    let (code, body, kind) = match (&method, path.as_str()) {
        (Method::Get, "/" | "/index.html") => (200, PAGE.to_owned(), "text/html; charset=utf-8"),
        (Method::Get, "/status.json") => (200, status_json(page).to_string(), "application/json"),
        (Method::Get, "/fsck.json") => (
            200,
            lock(&page.fsck).to_json().to_string(),
            "application/json",
        ),
        (Method::Post, "/fsck.json") => {
            let (code, v) = start_fsck(page);
            (code, v.to_string(), "application/json")
        }
        (_, "/" | "/index.html" | "/status.json" | "/fsck.json") => (
            405,
            json!({"error": format!("{method} is not allowed on {path}")}).to_string(),
            "application/json",
        ),
        _ => (
            404,
            json!({"error": format!("no such page: {path} (try / or /status.json)")}).to_string(),
            "application/json",
        ),
    };
    let mut resp = Response::from_string(body).with_status_code(code);
    for h in [
        header("Content-Type", kind),
        header("Cache-Control", "no-store"),
        header("X-Content-Type-Options", "nosniff"),
        header(
            "Content-Security-Policy",
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'",
        ),
    ]
    .into_iter()
    .flatten()
    {
        resp.add_header(h);
    }
    if let Err(e) = req.respond(resp) {
        log::debug!("cannot answer {method} {path}: {e}");
    }
}
