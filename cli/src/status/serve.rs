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
//! - `POST /fsck.json`: starts a report-only audit (`sfu_redis::ops::audit`, never a repair; the
//!   settle delay `fsck` would use) in the background: 202 with the summary; 409 `{"busy":
//!   true, "error"}` while one is running. `GET /fsck.json`: the last audit in full
//!   (`{"running", "started_ms", "finished_ms", "error", "report": <fsck --json> | null}`).
//!
//! The fleet is read by one thread every second ([`REFRESH`]), not per request: any number of
//! open pages costs Redis one status read a second, and a request never waits on Redis. The
//! URL on the page is always the redacted one; errors name it without its password.
//!
//! Served by the CLI's bounded server ([`crate::http`]: a thread per connection up to a cap,
//! read and write deadlines, head and body caps), so a client that never reads stalls no one.
//! Against DNS rebinding and cross-site requests (issue 26 item 1):
//! - every request needs exactly one `Host` (400 otherwise) naming `localhost`, an IP address
//!   (a literal cannot be rebound: a page can only send one for its own origin), or a name
//!   given with `--allow-host`; any other name gets 403 and no fleet data;
//! - `POST /fsck.json` (the one state-changing request) is refused with 403 when its `Origin`
//!   is not `http://<its Host>` (or `https://`) or its `Sec-Fetch-Site` is `cross-site` or
//!   `same-site` (what browsers send; curl sends neither and is allowed); at most one audit
//!   runs at a time (409).

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sfu_redis::ops::audit::{audit, AuditOptions};

use super::events::EventRing;
use super::{now_ms, utc, Outage, Source};
use crate::http::{self, host_name, is_ip_literal, Limits, Request, Response};
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
    /// `--allow-host` names ([`parse_allow_host`]'s form).
    allowed_hosts: Vec<String>,
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

/// `--allow-host`'s argument: a host name (letters, digits, `-`, `.`, `_`; no port, no
/// scheme), returned in lower case without a trailing dot.
pub(crate) fn parse_allow_host(s: &str) -> Result<String, String> {
    let name = s.trim().trim_end_matches('.').to_ascii_lowercase();
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    if ok {
        Ok(name)
    } else {
        Err("expected a host name such as fleet.example.internal (no scheme, no port)".into())
    }
}

pub(crate) fn run(src: Source, addr: &str, allowed_hosts: Vec<String>) -> Result<(), Failure> {
    let addr = parse_addr(addr).map_err(Failure::usage)?;
    let server = http::Server::bind(addr, Limits::CLI, "fleet page")
        .map_err(|e| Failure::usage(format!("cannot serve the fleet page on {addr}: {e}")))?;
    let bound = server.addr();
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
        allowed_hosts,
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
    server.serve(Arc::new(move |req: &Request| handle(&page, req)));
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

/// A JSON error body.
fn error(code: u16, message: &str) -> Response {
    Response::new(
        code,
        "application/json",
        json!({ "error": message }).to_string(),
    )
}

/// At most this many characters of a client's Host or Origin are quoted back.
const QUOTED: usize = 80;

/// `s` cut to [`QUOTED`] characters.
fn short(s: &str) -> String {
    s.chars().take(QUOTED).collect()
}

/// `s` cut to [`QUOTED`] characters, in quotes, escaped.
fn quoted(s: &str) -> String {
    format!("{:?}", short(s))
}

/// The Host check: `Err(response)` refuses the request.
fn check_host(page: &Page, req: &Request) -> Result<(), Response> {
    let mut hosts = req.all("Host");
    let (Some(host), None) = (hosts.next(), hosts.next()) else {
        return Err(error(
            400,
            "bad request: the fleet page needs exactly one Host header",
        ));
    };
    let name = host_name(host).map_err(|e| error(400, &format!("bad request: {e}")))?;
    if name == "localhost" || is_ip_literal(&name) || page.allowed_hosts.contains(&name) {
        return Ok(());
    }
    Err(error(
        403,
        &format!(
            "Host {} is not allowed: the fleet page answers to localhost, an IP address and the names given with --allow-host (protection against DNS rebinding)",
            quoted(host)
        ),
    ))
}

/// The cross-site check of a state-changing request: its `Origin`, when sent, must be
/// `http://<Host>` (or `https://<Host>`: the page behind a TLS proxy that keeps the Host), and
/// its `Sec-Fetch-Site`, when sent, `same-origin` or `none` (Fetch Metadata, W3C).
fn check_origin(req: &Request) -> Result<(), Response> {
    let host = req.header("Host").unwrap_or_default().trim();
    if let Some(origin) = req.header("Origin") {
        let origin = origin.trim();
        let own = ["http", "https"]
            .iter()
            .any(|scheme| origin.eq_ignore_ascii_case(&format!("{scheme}://{host}")));
        if !own {
            return Err(error(
                403,
                &format!(
                    "cross-origin request refused: Origin {} is not this page (http://{host})",
                    quoted(origin)
                ),
            ));
        }
    }
    if let Some(site) = req.header("Sec-Fetch-Site") {
        if !matches!(site.trim(), "same-origin" | "none") {
            return Err(error(
                403,
                &format!(
                    "cross-site request refused: Sec-Fetch-Site is {}",
                    quoted(site)
                ),
            ));
        }
    }
    Ok(())
}

/// Answers one request: the Host check, then the route (the Origin check on the POST), with
/// the page's security headers on every response.
fn handle(page: &Arc<Page>, req: &Request) -> Response {
    let resp = match check_host(page, req) {
        Ok(()) => route(page, req),
        Err(refusal) => refusal,
    };
    resp.with_header("Cache-Control", "no-store")
        .with_header("X-Content-Type-Options", "nosniff")
        .with_header(
            "Content-Security-Policy",
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'",
        )
}

fn route(page: &Arc<Page>, req: &Request) -> Response {
    let path = req.path();
    let method = req.method.as_str();
    match (method, path) {
        ("GET" | "HEAD", "/" | "/index.html") => {
            Response::new(200, "text/html; charset=utf-8", PAGE)
        }
        ("GET" | "HEAD", "/status.json") => {
            Response::new(200, "application/json", status_json(page).to_string())
        }
        ("GET" | "HEAD", "/fsck.json") => Response::new(
            200,
            "application/json",
            lock(&page.fsck).to_json().to_string(),
        ),
        ("POST", "/fsck.json") => match check_origin(req) {
            Ok(()) => {
                let (code, v) = start_fsck(page);
                Response::new(code, "application/json", v.to_string())
            }
            Err(refusal) => refusal,
        },
        (_, "/" | "/index.html" | "/status.json" | "/fsck.json") => {
            error(405, &format!("{method} is not allowed on {}", short(path)))
        }
        _ => error(
            404,
            &format!("no such page: {} (try / or /status.json)", short(path)),
        ),
    }
}
