//! `sfu-redis demo`: three in-process instances on one Redis; crash a non-leader, then the
//! leader, and watch the survivor take the lease and reap both. Ends with a timeline, the
//! fleet status and self-checks read straight from Redis; exits 1 if any check fails.
//!
//! With `--sentinel` (and no `REDIS_URL`) the Redis is a private Sentinel group (a master, a
//! replica, three sentinels), which the demo fails over between the two crashes, checking the
//! survivors' data on the new master. With `--cluster` (and no `REDIS_URL`) it is a private
//! Redis Cluster of 3 masters: the rooms spread over them, the control plane on one.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use clap::Args;
use crossbeam_channel::{bounded, select, unbounded, Receiver, Sender};
use sfu_redis::keys::KeySpace;
use sfu_redis::ops::audit::{self, Problem};
use sfu_redis::ops::conn::Conn;
use sfu_redis::ops::conn::{server_time_ms, Redis};
use sfu_redis::ops::scan::{self, Scan};
use sfu_redis::ops::status::{fleet_status, FleetStatus};
use sfu_redis::{
    redact_url, Config, ConfigBuilder, EmittedEvent, Event, Node, PinOutcome, Timings,
};
use sfu_redis_testkit::cluster::LocalCluster;
use sfu_redis_testkit::devserver::LocalRedis;
use sfu_redis_testkit::sentinel::{SentinelGroup, SentinelOptions};

use crate::{event_fields, signal_channel, signalled, Failure, TransportArgs};

mod checks;
mod failover;
mod picture;
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
    /// Use this Redis instead of a private redis-server: redis://, rediss:// (TLS: see the
    /// --tls-* flags), redis+sentinel://[user:password@]host1:port1,.../<master-name>[/db] or
    /// rediss+sentinel://. The demo writes only under a fresh stage (sfu:demo-<random
    /// hex>:main) and deletes those keys at the end.
    #[arg(long, env = "REDIS_URL", hide_env_values = true, value_name = "URL")]
    redis_url: Option<String>,
    /// Run through Redis Sentinel. Without a Redis URL the demo starts its own private group
    /// (a master, 1 replica and 3 sentinels: redis-server processes on free ports, stopped at
    /// the end), runs the nodes through its sentinels, fails its master over between the two
    /// crashes (SENTINEL FAILOVER) and checks the survivors' data on the new master. With a
    /// redis+sentinel:// or rediss+sentinel:// URL it runs through those sentinels but never
    /// fails them over (only a group the demo started itself is); any other URL is refused
    /// (exit 2).
    #[arg(long)]
    sentinel: bool,
    /// Run on a Redis Cluster. Without a Redis URL the demo starts its own (3 masters,
    /// cluster-enabled redis-server processes on free ports joined with redis-cli --cluster
    /// create, stopped at the end); with a redis+cluster:// or rediss+cluster:// URL it runs on
    /// that cluster; any other URL is refused (exit 2).
    #[arg(long, conflicts_with = "sentinel")]
    cluster: bool,
    /// Also draw the run as an SVG picture into FILE (created or replaced): one lane per
    /// instance on a time axis (seconds since the demo started) with its heartbeats as ticks,
    /// its leadership terms as bars with their epochs, the candidates events naming it, the
    /// two-phase wait, its crash and its reap; a Redis failover as a line across the lanes.
    /// A FILE that cannot be opened for writing is refused before the demo starts (exit 2).
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    #[command(flatten)]
    transport: TransportArgs,
}

/// The Redis the demo runs on.
enum Backend {
    /// `REDIS_URL` / `--redis-url`: someone else's; only the demo's stage is touched.
    External,
    /// A private `redis-server`.
    Private(LocalRedis),
    /// A private Sentinel group (`--sentinel`): failed over during the show.
    Group(SentinelGroup),
    /// A private Redis Cluster (`--cluster`).
    Cluster(LocalCluster),
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

/// What happened: an event of a node, or a step of the demo itself (a crash, a failover).
#[derive(Debug)]
enum What {
    Event(Event),
    Note(String),
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
    /// The connector of the demo's own connections (checks, cleanup): the nodes' URL, TLS
    /// files and sentinel credentials, with [`CHECK_TIMEOUT`].
    redis: Redis,
    /// The letter of the last step printed (`a`, `b`, ...).
    letter: u8,
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
    /// The demo's connection; made again ([`Demo::reconnect`]) after a failover and before
    /// the checks, so that it reads the master the sentinels name now.
    con: Conn,
    checks: Vec<Check>,
    /// Heartbeats, crashes and the lease left by a crashed leader, for `--svg`.
    trace: picture::Trace,
    leader_polls: u64,
    most_leaders: usize,
    /// (survivor, [dead non-leader, dead leader]) once step c has run.
    outcome: Option<(String, Vec<String>)>,
}

pub(crate) fn run(args: DemoArgs) -> Result<(), Failure> {
    let signal = signal_channel()?;
    let start = Instant::now();
    // Before anything starts: a picture that cannot be written is a usage error.
    let mut picture = args.svg.as_deref().map(picture::Output::open).transpose()?;
    let external = args
        .redis_url
        .map(|u| u.trim().to_owned())
        .filter(|u| !u.is_empty());
    let transport = if external.is_some() {
        args.transport
    } else {
        let ignored = args.transport.set_flags();
        if !ignored.is_empty() {
            let apply = if ignored.len() == 1 {
                "it applies"
            } else {
                "they apply"
            };
            eprintln!(
                "sfu-redis: note: ignoring {} (flag or environment): {apply} to --redis-url / REDIS_URL, and the demo's own Redis is plaintext without passwords",
                ignored.join(", ")
            );
        }
        TransportArgs::default()
    };
    let stage = format!("demo-{:08x}", fastrand::u32(..));
    let timings = Timings::fast();
    let with_url = |url: &str| {
        transport.apply(
            Config::builder()
                .redis_url(url)
                .stage(&stage)
                .timings(timings),
        )
    };
    // An external URL is checked (and a plain one refused with --sentinel) before anything
    // starts.
    let (backend, url, checked) = match external {
        Some(url) => {
            let redis = checks_connector(&with_url(&url))?;
            if args.sentinel && redis.master_name().is_none() {
                return Err(Failure::usage(format!(
                    "demo --sentinel runs through Redis Sentinel, but REDIS_URL / --redis-url is {} ({}), not a redis+sentinel:// or rediss+sentinel:// URL; unset it to let the demo start its own sentinel group, or drop --sentinel",
                    redact_url(&url),
                    redis.transport()
                )));
            }
            if args.cluster && !redis.is_cluster() {
                return Err(Failure::usage(format!(
                    "demo --cluster runs on a Redis Cluster, but REDIS_URL / --redis-url is {} ({}), not a redis+cluster:// or rediss+cluster:// URL; unset it to let the demo start its own cluster, or drop --cluster",
                    redact_url(&url),
                    redis.transport()
                )));
            }
            (Backend::External, url, Some(redis))
        }
        None if args.cluster => {
            let cluster = LocalCluster::start(3, 0).map_err(|e| {
                Failure::runtime(format!("demo --cluster needs a Redis Cluster: {e}"))
            })?;
            let url = cluster.url();
            (Backend::Cluster(cluster), url, None)
        }
        None if args.sentinel => {
            let group = SentinelGroup::start(SentinelOptions::default()).map_err(|e| {
                Failure::runtime(format!("demo --sentinel needs a sentinel group: {e}"))
            })?;
            let url = group.url();
            (Backend::Group(group), url, None)
        }
        None => {
            let server = LocalRedis::start()
                .map_err(|e| Failure::runtime(format!("demo needs Redis: {e}")))?;
            let url = server.url();
            (Backend::Private(server), url, None)
        }
    };
    let base = with_url(&url);
    let keys = base
        .clone()
        .instance_id(&instance_id('a'))
        .build()
        .map_err(|e| Failure::config(&e))?
        .keys()
        .clone();
    let redis = match checked {
        Some(redis) => redis,
        None => checks_connector(&base)?,
    };
    let con = redis.connect().map_err(|e| {
        Failure::runtime(crate::with_place("demo cannot reach Redis", Some(&url), &e))
    })?;

    print_header(&backend, &redis, &url, &keys, &timings);

    let (tx, rx) = unbounded();
    let (stop_tx, stop_rx) = bounded(0);
    let mut demo = Demo {
        start,
        timings,
        keys,
        redis,
        letter: 0,
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
        trace: picture::Trace::default(),
        leader_polls: 0,
        most_leaders: 0,
        outcome: None,
    };
    let group = match &backend {
        Backend::Group(g) => Some(g),
        _ => None,
    };
    // Steps a-c, and the failover with a private group.
    let planned: u8 = if group.is_some() { 4 } else { 3 };
    let steps = demo.steps(&base, group);
    if let Err(why) = &steps {
        let last = char::from(b'a' + planned - 1);
        demo.check(
            &format!("demo steps a-{last} completed"),
            false,
            why.clone(),
        );
    }
    // Read while the survivor still runs: its pins only live as long as it refreshes them.
    let status = match &steps {
        Ok(()) => demo.data_checks(&base),
        Err(_) => None,
    };
    demo.finish();
    // The report's letters follow the planned steps, even when one stopped early.
    demo.letter = planned;
    demo.print_timeline();
    if let Some(st) = &status {
        let letter = demo.next_letter();
        out!("\n[{letter}] fleet status (read with sfu_redis::ops::status::fleet_status before the survivor shut down)");
        let mut out = std::io::stdout().lock();
        let _ = crate::status::print_table(&mut out, st);
        let _ = out.flush();
    }
    demo.print_checks();
    let drawn = match picture.as_mut() {
        Some(out) => demo.write_picture(out),
        None => Ok(()),
    };
    conclude(demo, backend, start)?;
    drawn.map_err(Failure::runtime)
}

/// The connector of the demo's own connections: `base`'s URL, TLS files and sentinel
/// credentials, with [`CHECK_TIMEOUT`] (the demo's reads are longer than a node's calls).
fn checks_connector(base: &ConfigBuilder) -> Result<Redis, Failure> {
    let timings = Timings {
        command_timeout: CHECK_TIMEOUT,
        ..Timings::default()
    };
    let config = base
        .clone()
        .instance_id(&instance_id('a'))
        .timings(timings)
        .build()
        .map_err(|e| Failure::config(&e))?;
    Redis::from_config(&config).map_err(|e| Failure::config(&e))
}

/// What the demo runs on: the Redis (and, through sentinels, the master they name), the
/// prefix, the timings.
fn print_header(backend: &Backend, redis: &Redis, url: &str, keys: &KeySpace, timings: &Timings) {
    let through = if redis.master_name().is_some() {
        ", through Redis Sentinel"
    } else {
        ""
    };
    let through = if redis.is_cluster() {
        ", a Redis Cluster"
    } else {
        through
    };
    out!("sfu-redis demo: three SFU instances share one Redis{through}");
    let route = redis.route();
    let master = route.master.as_deref().unwrap_or("unknown");
    let named_by = failover::named_by(route.via.as_deref());
    match backend {
        Backend::Private(s) => out!(
            "  Redis:   private redis-server at {} (stopped at the end)",
            s.url()
        ),
        Backend::Group(g) => {
            let replicas: Vec<String> = g
                .data_ports()
                .into_iter()
                .map(|p| format!("127.0.0.1:{p}"))
                .filter(|a| a != master)
                .collect();
            let sentinels: Vec<String> = g
                .sentinel_ports()
                .into_iter()
                .map(|p| format!("127.0.0.1:{p}"))
                .collect();
            let o = g.options();
            out!(
                "  Redis:   private sentinel group {:?} (redis-server processes, stopped at the end): master {master}, replica {},",
                g.master_name(),
                replicas.join(", ")
            );
            out!(
                "           sentinels {} (quorum {}, down-after {} ms)",
                sentinels.join(", "),
                o.sentinels / 2 + 1,
                o.down_after.as_millis()
            );
            out!(
                "  route:   every connection (nodes, checks) asks the sentinels of {} for the master:",
                redact_url(url)
            );
            out!("           now {master}, {named_by}; the demo fails it over between the two crashes");
        }
        Backend::Cluster(c) => {
            out!(
                "  Redis:   private Redis Cluster of {} masters at {} (cluster-enabled redis-server processes, stopped at the end);",
                c.master_ports().len(),
                c.master_ports()
                    .iter()
                    .map(|p| format!("127.0.0.1:{p}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            out!("  route:   every command goes to the master of its key's slot: the rooms spread over every master ({{<room>}} hash tags), the control plane on the master of {{ctl}}");
        }
        Backend::External => {
            let transport = match redis.transport() {
                "plain" => String::new(),
                "tls" => ", TLS".into(),
                other => format!(", {other}"),
            };
            out!(
                "  Redis:   {} (from REDIS_URL / --redis-url{transport})",
                redact_url(url)
            );
            if let Some(name) = redis.master_name() {
                out!(
                    "  route:   every connection asks the sentinels for master {name:?}: now {master}, {named_by};"
                );
                out!(
                    "           not failed over (the demo fails over only the group demo --sentinel starts without REDIS_URL)"
                );
            }
        }
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
fn conclude(mut demo: Demo, backend: Backend, start: Instant) -> Result<(), Failure> {
    if matches!(backend, Backend::External) {
        let cleaned = demo
            .reconnect()
            .and_then(|()| cleanup(&mut demo.con, &demo.keys));
        match cleaned {
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
    drop(backend);
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

fn query<T: redis::FromRedisValue>(con: &mut Conn, cmd: &redis::Cmd) -> Result<T, String> {
    cmd.query(con).map_err(redis_failed)
}

/// Every key under `keys`' prefix, through the library's pager (`SCAN MATCH P:*`, never
/// `KEYS`).
fn scan_keys(con: &mut Conn, keys: &KeySpace) -> Result<Vec<String>, String> {
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
fn cleanup(con: &mut Conn, keys: &KeySpace) -> Result<usize, String> {
    let all = scan_keys(con, keys)?;
    for chunk in all.chunks(UNLINK_BATCH) {
        // One UNLINK per key, pipelined: on a cluster the keys live in many slots.
        let mut pipe = redis::pipe();
        for k in chunk {
            pipe.cmd("UNLINK").arg(k).ignore();
        }
        pipe.query::<()>(con)
            .map_err(|e| format!("unlink the demo's keys: {e}"))?;
    }
    Ok(all.len())
}

/// Forwards one node's events to the demo's timeline, stamped on arrival (the steps wait on
/// them; `Demo::restamp` gives them their emission times at the end).
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

    /// The next step's letter: `a`, `b`, ...
    fn next_letter(&mut self) -> char {
        self.letter += 1;
        char::from(b'a' + self.letter - 1)
    }

    /// A new connection for the demo's own reads, to the master the sentinels name now (a
    /// connection made before a failover may still point at the old master, now a replica).
    fn reconnect(&mut self) -> Result<(), String> {
        self.con = self.redis.connect().map_err(|e| e.to_string())?;
        Ok(())
    }

    fn check(&mut self, name: &str, ok: bool, detail: String) {
        self.checks.push(Check {
            name: name.to_owned(),
            ok,
            detail,
        });
    }
}
