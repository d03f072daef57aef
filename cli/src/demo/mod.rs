//! `sfu-redis demo`: three in-process instances on one Redis; crash a non-leader, then the
//! leader, and watch the survivor take the lease and reap both. Ends with a timeline, the
//! fleet status and self-checks read straight from Redis; exits 1 if any check fails.

use std::collections::BTreeSet;
use std::io::Write;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use clap::Args;
use crossbeam_channel::{bounded, select, unbounded, Receiver, Sender};
use redis::Connection;
use sfu_redis::audit::{self, Problem};
use sfu_redis::conn::Redis;
use sfu_redis::keys::KeySpace;
use sfu_redis::scan::{self, Scan};
use sfu_redis::status::{fleet_status, FleetStatus};
use sfu_redis::{redact_url, Config, ConfigBuilder, Event, Node, PinOutcome, Timings};
use sfu_redis_testkit::devserver::LocalRedis;

use crate::{event_fields, signal_channel, signalled, Failure};

mod checks;
mod report;
mod steps;

/// The instances: `sfu-a`, `sfu-b`, `sfu-c`; instance `sfu-x` pins rooms `x-room-1..`.
/// No id contains another, so "a dead id appears nowhere" can be checked by substring.
const LETTERS: [char; 3] = ['a', 'b', 'c'];
const ROOMS_PER_NODE: usize = 3;
const PEERS_PER_ROOM: usize = 3;
/// The longest any step may take.
const STEP_DEADLINE: Duration = Duration::from_secs(20);
/// Poll period of the waits (they also wake on every event).
const POLL: Duration = Duration::from_millis(20);
/// Timeout of the demo's own Redis calls (checks, cleanup).
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);
/// Keys removed per `UNLINK` at the end.
const UNLINK_BATCH: usize = 500;

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Use this Redis instead of a private redis-server. The demo writes only under a fresh
    /// stage (sfu:demo-<random hex>:main) and deletes those keys at the end.
    #[arg(long, env = "REDIS_URL", hide_env_values = true, value_name = "URL")]
    redis_url: Option<String>,
}

fn instance_id(letter: char) -> String {
    format!("sfu-{letter}")
}

fn room_ids(letter: char) -> Vec<String> {
    (1..=ROOMS_PER_NODE)
        .map(|r| format!("{letter}-room-{r}"))
        .collect()
}

fn peer_id(room: &str, k: usize) -> String {
    format!("{room}-p{k}")
}

fn guest_id(room: &str, k: usize) -> String {
    format!("{room}-g{k}")
}

fn letter_of(id: &str) -> char {
    id.chars().last().unwrap_or('?')
}

/// `+1.234s`, right-aligned to 8 columns.
fn stamp(d: Duration) -> String {
    format!("{:>8}", format!("+{:.3}s", d.as_secs_f64()))
}

fn secs(d: Duration) -> String {
    format!("{:.3} s", d.as_secs_f64())
}

/// What happened: an event of a node, or a step of the demo itself (a crash).
#[derive(Debug)]
enum What {
    Event(Event),
    Note(&'static str),
}

/// One timeline line: when (since the demo started), who, what.
#[derive(Debug)]
struct Entry {
    at: Duration,
    instance: String,
    what: What,
}

impl Entry {
    fn event(&self) -> Option<&Event> {
        match &self.what {
            What::Event(e) => Some(e),
            What::Note(_) => None,
        }
    }

    fn is_candidates_naming(&self, who: &str) -> bool {
        matches!(self.event(), Some(Event::Candidates { instances, .. }) if instances.iter().any(|i| i == who))
    }

    fn is_reaped(&self, who: &str) -> bool {
        matches!(self.event(), Some(Event::InstanceReaped { dead, .. }) if dead == who)
    }
}

struct Member {
    id: String,
    node: Node,
    crashed: bool,
}

/// A check's outcome.
struct Check {
    name: String,
    ok: bool,
    detail: String,
}

/// Why the steps stopped early.
type Stop = String;

struct Demo {
    start: Instant,
    timings: Timings,
    keys: KeySpace,
    members: Vec<Member>,
    /// Every collector's sender is a clone of this one; dropped in `finish`.
    tx: Option<Sender<Entry>>,
    rx: Receiver<Entry>,
    /// Dropped in `finish`: collectors drain their node's queue and stop.
    stop_collectors: Option<Sender<()>>,
    stop_rx: Receiver<()>,
    collectors: Vec<JoinHandle<()>>,
    entries: Vec<Entry>,
    signal: Receiver<()>,
    con: Connection,
    checks: Vec<Check>,
    leader_polls: u64,
    most_leaders: usize,
    /// (survivor, [dead non-leader, dead leader]) once step c has run.
    outcome: Option<(String, Vec<String>)>,
}

pub(crate) fn run(args: DemoArgs) -> Result<(), Failure> {
    let signal = signal_channel()?;
    let start = Instant::now();
    let external = args
        .redis_url
        .map(|u| u.trim().to_owned())
        .filter(|u| !u.is_empty());
    let (server, url) = match external {
        Some(url) => (None, url),
        None => {
            let server = LocalRedis::start()
                .map_err(|e| Failure::runtime(format!("demo needs Redis: {e}")))?;
            let url = server.url();
            (Some(server), url)
        }
    };
    let stage = format!("demo-{:08x}", fastrand::u32(..));
    let timings = Timings::fast();
    let base = Config::builder()
        .redis_url(&url)
        .stage(&stage)
        .timings(timings);
    let keys = base
        .clone()
        .instance_id(&instance_id('a'))
        .build()
        .map_err(|e| Failure::config(&e))?
        .keys()
        .clone();
    let con = connect(&url).map_err(Failure::runtime)?;

    print_header(server.as_ref(), &url, &keys, &timings);

    let (tx, rx) = unbounded();
    let (stop_tx, stop_rx) = bounded(0);
    let mut demo = Demo {
        start,
        timings,
        keys,
        members: Vec::new(),
        tx: Some(tx),
        rx,
        stop_collectors: Some(stop_tx),
        stop_rx,
        collectors: Vec::new(),
        entries: Vec::new(),
        signal,
        con,
        checks: Vec::new(),
        leader_polls: 0,
        most_leaders: 0,
        outcome: None,
    };
    let steps = demo.steps(&base);
    if let Err(why) = &steps {
        demo.check("demo steps a-c completed", false, why.clone());
    }
    // Read while the survivor still runs: its pins only live as long as it refreshes them.
    let status = match &steps {
        Ok(()) => demo.data_checks(&base),
        Err(_) => None,
    };
    demo.finish();
    demo.print_timeline();
    if let Some(st) = &status {
        out!("\n[e] fleet status (read with sfu_redis::status::fleet_status before the survivor shut down)");
        let mut out = std::io::stdout().lock();
        let _ = crate::status::print_table(&mut out, st, timings.heartbeat_ttl, None);
        let _ = out.flush();
    }
    demo.print_checks();
    conclude(demo, server, start)
}

/// What the demo runs on: the Redis, the prefix, the timings.
fn print_header(server: Option<&LocalRedis>, url: &str, keys: &KeySpace, timings: &Timings) {
    out!("sfu-redis demo: three SFU instances share one Redis");
    match server {
        Some(s) => out!(
            "  Redis:   private redis-server at {} (stopped at the end)",
            s.url()
        ),
        None => out!(
            "  Redis:   {} (from REDIS_URL / --redis-url)",
            redact_url(url)
        ),
    }
    out!(
        "  keys:    under {}:* only (a fresh stage; nothing else is read or written)",
        keys.prefix()
    );
    out!(
        "  timings: heartbeat every {} ms (TTL {} ms), stale after {} ms, lease {} ms refreshed every {} ms,",
        timings.heartbeat_interval.as_millis(),
        timings.heartbeat_ttl.as_millis(),
        timings.stale_threshold.as_millis(),
        timings.lease_ttl.as_millis(),
        timings.lease_refresh.as_millis()
    );
    out!(
        "           two-phase delay {} ms, reap round every {} ms (Timings::fast(); production uses seconds)",
        timings.two_phase_delay.as_millis(),
        timings.reap_interval.as_millis()
    );
}

/// Removes the demo's keys (on an external Redis), stops the private server, and turns the
/// checks into the exit status.
fn conclude(mut demo: Demo, server: Option<LocalRedis>, start: Instant) -> Result<(), Failure> {
    if server.is_none() {
        match cleanup(&mut demo.con, &demo.keys) {
            Ok(n) => out!(
                "\nremoved the demo's {n} keys under {}:*",
                demo.keys.prefix()
            ),
            Err(e) => {
                out!();
                demo.check(
                    "demo keys removed",
                    false,
                    format!("{e}; remove them with: redis-cli --scan --pattern '{}:*' | xargs redis-cli unlink", demo.keys.prefix()),
                );
                demo.print_check(demo.checks.len() - 1);
            }
        }
    }
    drop(server);
    let failed = demo.checks.iter().filter(|c| !c.ok).count();
    let total = demo.checks.len();
    let took = secs(start.elapsed());
    if signalled(&demo.signal) {
        return Err(Failure {
            code: 130,
            message: format!("demo interrupted after {took}"),
        });
    }
    if failed == 0 {
        out!("\ndemo finished in {took}: all {total} checks passed");
        Ok(())
    } else {
        out!("\ndemo finished in {took}: {failed} of {total} checks FAILED");
        Err(Failure::runtime(format!(
            "demo: {failed} of {total} checks failed"
        )))
    }
}

/// A connection for the demo's own checks, from the library's connector (timeouts, the URL
/// redacted in errors).
fn connect(url: &str) -> Result<Connection, String> {
    Redis::new(url, CHECK_TIMEOUT)
        .and_then(|r| r.connect())
        .map_err(|e| e.to_string())
}

fn query<T: redis::FromRedisValue>(con: &mut Connection, cmd: &redis::Cmd) -> Result<T, String> {
    cmd.query(con).map_err(redis_failed)
}

/// Every key under `keys`' prefix, through the library's pager (`SCAN MATCH P:*`, never
/// `KEYS`).
fn scan_keys(con: &mut Connection, keys: &KeySpace) -> Result<Vec<String>, String> {
    let names = scan::collect(con, Scan::keys(keys.scan_pattern())).map_err(redis_failed)?;
    Ok(names
        .into_iter()
        .map(|n| String::from_utf8_lossy(&n).into_owned())
        .collect())
}

fn redis_failed(e: redis::RedisError) -> String {
    format!("Redis call failed: {e}")
}

/// True when problem `p` is at a key of one of `rooms` (peer records included).
fn in_rooms(keys: &KeySpace, p: &Problem, rooms: &[String]) -> bool {
    keys.parse(&p.key)
        .is_some_and(|k| k.room().is_some_and(|r| rooms.iter().any(|x| x == r)))
}

/// Deletes every key under the demo's prefix; returns how many.
fn cleanup(con: &mut Connection, keys: &KeySpace) -> Result<usize, String> {
    let all = scan_keys(con, keys)?;
    for chunk in all.chunks(UNLINK_BATCH) {
        let _: i64 = query(con, redis::cmd("UNLINK").arg(chunk))?;
    }
    Ok(all.len())
}

/// Forwards one node's events to the demo's timeline, stamped on arrival.
fn collect(
    start: Instant,
    id: String,
    events: Receiver<Event>,
    tx: Sender<Entry>,
    stop: Receiver<()>,
) {
    let send = |event: Event| {
        let _ = tx.send(Entry {
            at: start.elapsed(),
            instance: id.clone(),
            what: What::Event(event),
        });
    };
    loop {
        select! {
            recv(events) -> event => match event {
                Ok(event) => send(event),
                Err(_) => return,
            },
            recv(stop) -> _ => {
                events.try_iter().for_each(send);
                return;
            }
        }
    }
}

impl Demo {
    fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// A narration line stamped with the time since the demo started.
    fn say(&self, text: &str) {
        out!("  {}  {text}", stamp(self.elapsed()));
    }

    /// An explanation line under a narration line.
    fn explain(text: &str) {
        out!("            {text}");
    }

    fn check(&mut self, name: &str, ok: bool, detail: String) {
        self.checks.push(Check {
            name: name.to_owned(),
            ok,
            detail,
        });
    }
}
