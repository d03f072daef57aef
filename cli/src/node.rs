//! `sfu-redis node`: one SFU instance, running until SIGINT/SIGTERM.
//!
//! stdout carries only events: one JSON object per line with `--json` (the library's
//! [`Event::to_json`]), otherwise one human line per event. Everything else goes to stderr.

use std::io::{Stdout, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use crossbeam_channel::select;
use sfu_redis::keys::{encode_id, IdKind};
use sfu_redis::{redact_url, Event, Node, PinOutcome, Timings};

use crate::churn::{self, ChurnPlan};
use crate::metrics::{self, MetricsServer};
use crate::{
    event_fields, parse_factor, scaled, signal_channel, signalled, with_place, Failure, RedisArgs,
};

#[derive(Debug, Args)]
pub(crate) struct NodeArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// This instance's id [default: <host>-<pid>-<random hex>].
    #[arg(
        long,
        env = "SFU_INSTANCE_ID",
        hide_env_values = true,
        value_name = "ID"
    )]
    instance_id: Option<String>,
    /// Rooms to pin at start, comma-separated (at most 100000).
    #[arg(long, value_delimiter = ',', value_name = "R1,R2,...")]
    rooms: Vec<String>,
    /// Peers to upsert in each pinned room: ids <room>-p<k>, guest ids <room>-g<k>, k = 1..=N
    /// (at most 100000; at most 1000000 peers in all).
    #[arg(
        long,
        default_value_t = 0,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(0..=MAX_PEERS_PER_ROOM as i64)
    )]
    peers_per_room: u32,
    #[command(flatten)]
    timings: TimingArgs,
    /// Rooms of a dead instance's index the reaper handles per batch (1 to 10000)
    /// [default: 500].
    #[arg(long, value_name = "N")]
    reap_batch: Option<usize>,
    /// The reaper's pace: after each reap batch it pauses this many times the batch's
    /// measured duration, leaving Redis to the SFU's own traffic (0 = no pause, the fastest
    /// reap; at most 100) [default: 1].
    #[arg(long, env = "SFU_REAP_PACE", value_name = "RATIO")]
    reap_pace: Option<f64>,
    /// Print each event as one JSON line.
    #[arg(long)]
    json: bool,
    /// On SIGINT/SIGTERM, leave the cluster for good (`Node::leave`): close every room this
    /// instance owns with their peers, drop its registration and release the lease, so other
    /// instances can pin its rooms at once. Without it the rooms stay until the reaper removes
    /// them once the instance is seen dead, or a restart with the same id clears them.
    #[arg(long)]
    leave_on_exit: bool,
    /// Serve GET /metrics (Prometheus text format, OpenMetrics when asked) and GET /healthz
    /// (200 when the last heartbeat succeeded within the heartbeat TTL, 503 otherwise, the
    /// reason as body) on this address, e.g. 127.0.0.1:9464 (a bare PORT is 127.0.0.1:PORT);
    /// port 0 picks a free port (the address is printed on stderr). No TLS, no
    /// authentication: bind it to a private address.
    #[arg(long, env = "SFU_METRICS_ADDR", value_name = "HOST:PORT", value_parser = metrics::parse_addr)]
    metrics_addr: Option<String>,
    /// For the chaos test only (hidden, not a public contract): after `ready`, keep pinning,
    /// closing, upserting (guest reconnects with new peer ids) and removing over this pool of
    /// rooms shared by the fleet (`churn.rs`); counts as `churn_summary` JSON lines.
    #[arg(long, hide = true, value_delimiter = ',', value_name = "R1,R2,...")]
    churn_rooms: Vec<String>,
    /// For the chaos test only (hidden): stop churning after this many ms (0: no churn).
    #[arg(long, hide = true, default_value_t = 0, value_name = "MS")]
    churn_for_ms: u64,
    /// For the chaos test only (hidden): the churn's random seed [default: random].
    #[arg(long, hide = true, value_name = "N")]
    churn_seed: Option<u64>,
}

/// Timing overrides. Without `--heartbeat-interval-ms`/`--heartbeat-ttl-ms` the defaults are
/// the library's (10 s / 30 s); with either, every timing is derived from the two first
/// (`Timings::from_heartbeat`), then each explicitly given flag is applied on top.
#[derive(Debug, Args)]
struct TimingArgs {
    /// Heartbeat period [default: 10000].
    #[arg(long, value_name = "MS")]
    heartbeat_interval_ms: Option<u64>,
    /// TTL of the heartbeat key [default: 30000].
    #[arg(long, value_name = "MS")]
    heartbeat_ttl_ms: Option<u64>,
    /// Stale threshold as a multiple of the heartbeat TTL [default: 1.5].
    #[arg(long, value_name = "FACTOR", value_parser = parse_factor)]
    stale_factor: Option<f64>,
    /// TTL of a room pin [default: 3 x heartbeat TTL].
    #[arg(long, value_name = "MS")]
    pin_ttl_ms: Option<u64>,
    /// TTL of the reaper lease [default: 3 x heartbeat TTL].
    #[arg(long, value_name = "MS")]
    lease_ttl_ms: Option<u64>,
    /// Lease refresh / acquire period [default: heartbeat TTL].
    #[arg(long, value_name = "MS")]
    lease_refresh_ms: Option<u64>,
    /// Wait between finding reap candidates and re-checking them [default: 2 x heartbeat TTL].
    #[arg(long, value_name = "MS")]
    two_phase_delay_ms: Option<u64>,
    /// Period of the leader's reap rounds [default: heartbeat TTL / 2].
    #[arg(long, value_name = "MS")]
    reap_interval_ms: Option<u64>,
    /// Timeout of every Redis call [default: min(2000, heartbeat interval / 2)].
    #[arg(long, value_name = "MS")]
    command_timeout_ms: Option<u64>,
}

impl TimingArgs {
    /// The timings these flags ask for (validated later, by the config builder).
    fn resolve(&self) -> Result<Timings, Failure> {
        let ms = Duration::from_millis;
        let defaults = Timings::default();
        let mut t = defaults;
        if self.heartbeat_interval_ms.is_some() || self.heartbeat_ttl_ms.is_some() {
            t = Timings::from_heartbeat(
                self.heartbeat_interval_ms
                    .map_or(defaults.heartbeat_interval, ms),
                self.heartbeat_ttl_ms.map_or(defaults.heartbeat_ttl, ms),
            );
        }
        if let Some(f) = self.stale_factor {
            t.stale_threshold = scaled(t.heartbeat_ttl, f)?;
        }
        let overrides = [
            (self.pin_ttl_ms, &mut t.pin_ttl),
            (self.lease_ttl_ms, &mut t.lease_ttl),
            (self.lease_refresh_ms, &mut t.lease_refresh),
            (self.two_phase_delay_ms, &mut t.two_phase_delay),
            (self.reap_interval_ms, &mut t.reap_interval),
            (self.command_timeout_ms, &mut t.command_timeout),
        ];
        for (flag, field) in overrides {
            if let Some(v) = flag {
                *field = ms(v);
            }
        }
        Ok(t)
    }
}

/// Most `--peers-per-room`.
const MAX_PEERS_PER_ROOM: u32 = 100_000;
/// Most distinct `--rooms`.
const MAX_ROOMS: usize = 100_000;
/// Most peers in all (`--rooms` x `--peers-per-room`).
const MAX_PEERS: u64 = 1_000_000;

/// The start-up writes: the distinct rooms, in order, and the peers of each.
struct Plan {
    rooms: Vec<String>,
    peers_per_room: u32,
}

impl Plan {
    /// Peer `k` of `room`: (peer id, guest id).
    fn peer(room: &str, k: u32) -> (String, String) {
        (format!("{room}-p{k}"), format!("{room}-g{k}"))
    }
}

/// Checks the sizes and every room, peer and guest id before anything is written. Peer ids
/// are generated on the fly; `<room>-p<k>` is valid for every k when it is for the longest
/// (the room id is valid, and only the length grows).
fn plan(rooms: &[String], peers_per_room: u32) -> Result<Plan, Failure> {
    let check = |kind, id: &str| {
        encode_id(kind, id).map_err(|e| Failure::usage(format!("--rooms / --peers-per-room: {e}")))
    };
    let mut seen = std::collections::HashSet::new();
    let mut distinct = Vec::new();
    for room in rooms {
        check(IdKind::Room, room)?;
        if seen.insert(room.as_str()) {
            distinct.push(room.clone());
            if distinct.len() > MAX_ROOMS {
                return Err(Failure::usage(format!(
                    "--rooms: at most {MAX_ROOMS} distinct rooms are allowed"
                )));
            }
        }
    }
    let total = distinct.len() as u64 * u64::from(peers_per_room);
    if total > MAX_PEERS {
        return Err(Failure::usage(format!(
            "--rooms x --peers-per-room: {} rooms x {peers_per_room} peers = {total} peers; at most {MAX_PEERS} are allowed",
            distinct.len()
        )));
    }
    if peers_per_room > 0 {
        for room in &distinct {
            let (peer, guest) = Plan::peer(room, peers_per_room);
            check(IdKind::Peer, &peer)?;
            check(IdKind::Guest, &guest)?;
        }
    }
    Ok(Plan {
        rooms: distinct,
        peers_per_room,
    })
}

/// Prints events on stdout, one line each, flushed.
struct Printer {
    json: bool,
    start: Instant,
    out: Stdout,
    broken: bool,
}

impl Printer {
    fn print(&mut self, instance: &str, event: &Event) {
        let line = if self.json {
            match serde_json::to_string(&event.to_json(instance)) {
                Ok(s) => s,
                Err(e) => {
                    log::error!("cannot serialize event {}: {e}", event.name());
                    return;
                }
            }
        } else {
            let line = format!(
                "{:>10}  {:<16} {}",
                format!("+{:.3}s", self.start.elapsed().as_secs_f64()),
                event.name(),
                event_fields(event)
            );
            line.trim_end().to_owned()
        };
        let mut out = self.out.lock();
        if let Err(e) = writeln!(out, "{line}").and_then(|()| out.flush()) {
            // A closed stdout must not stop the instance; say so once.
            if !self.broken {
                self.broken = true;
                log::warn!("cannot write events to stdout ({e}); the node keeps running");
            }
        }
    }

    fn drain(&mut self, node: &Node, events: &crossbeam_channel::Receiver<Event>) {
        for event in events.try_iter() {
            self.print(node.instance_id(), &event);
        }
    }
}

pub(crate) fn run(args: NodeArgs) -> Result<(), Failure> {
    let timings = args.timings.resolve()?;
    let mut builder = args.redis.builder().timings(timings);
    if let Some(id) = &args.instance_id {
        builder = builder.instance_id(id);
    }
    if let Some(n) = args.reap_batch {
        builder = builder.reap_batch(n);
    }
    if let Some(p) = args.reap_pace {
        builder = builder.reap_pace(p);
    }
    let config = builder.build().map_err(|e| Failure::config(&e))?;
    let plan = plan(&args.rooms, args.peers_per_room)?;
    let churn = ChurnPlan::new(&args.churn_rooms, args.churn_for_ms, args.churn_seed)?;
    // Bound before the node starts: a bad address fails at once, registering nothing.
    let metrics = args
        .metrics_addr
        .as_deref()
        .map(MetricsServer::bind)
        .transpose()?;
    // Installed first, so a signal during start-up still ends in a graceful shutdown.
    let signal = signal_channel()?;
    let mut printer = Printer {
        json: args.json,
        start: Instant::now(),
        out: std::io::stdout(),
        broken: false,
    };
    let url = config.redis_url().map(str::to_owned);
    let place = match &url {
        Some(url) => format!("on Redis {}", redact_url(url)),
        None => {
            // On stderr even with --json: stdout carries only events.
            eprintln!(
                "sfu-redis: warning: no Redis URL (--redis-url / REDIS_URL): running in memory-only mode: \
                 a single instance with no heartbeat, lease or reaping, invisible to other instances and to `status`"
            );
            "in memory-only mode (no Redis URL)".to_owned()
        }
    };
    let prefix = config.keys().prefix().to_owned();
    // Started on a thread of its own, so that SIGINT/SIGTERM ends a start-up that waits (for
    // a previous process of the same instance id to be gone: up to a heartbeat TTL, its own
    // if longer, and an interval) at once: nothing of this node runs yet.
    let (started_tx, started_rx) = crossbeam_channel::bounded(1);
    std::thread::spawn(move || {
        let _ = started_tx.send(Node::start(config));
    });
    let started = crossbeam_channel::select! {
        recv(started_rx) -> r => r.map_err(|_| Failure::runtime("the start-up thread ended without a result"))?,
        recv(signal) -> _ => {
            // A start that completed at the same moment is shut down cleanly.
            if let Ok(Ok(node)) = started_rx.try_recv() {
                let _ = node.shutdown();
            }
            eprintln!("sfu-redis: interrupted during start-up; the node was not started");
            std::process::exit(130);
        }
    };
    let node = started
        .map_err(|e| Failure::runtime(with_place("cannot start the node", url.as_deref(), &e)))?;
    // Shared with the metrics server's connection threads, which may outlive the stop.
    let node = Arc::new(node);
    let events = node.events();
    if !args.json {
        eprintln!(
            "sfu-redis node {} {place}, prefix {prefix}; Ctrl-C to stop",
            node.instance_id()
        );
    }
    if let Some(m) = &metrics {
        // On stderr even with --json (stdout carries only events): with port 0 it is the only
        // way to learn the port.
        eprintln!(
            "sfu-redis: serving http://{}/metrics and /healthz",
            m.addr()
        );
    }
    let stop = |node: &Node| {
        if args.leave_on_exit {
            node.leave()
        } else {
            node.shutdown()
        }
    };
    if let Err(e) = start_up(&node, &plan, &signal) {
        let _ = stop(&node);
        printer.drain(&node, &events);
        return Err(Failure::runtime(format!("start-up writes failed: {e}")));
    }
    // An interrupted start-up is not ready; the loop below sees the signal at once.
    if !signalled(&signal) {
        node.ready();
    }
    // Not scoped: the stop below never waits for an HTTP connection (a client that never
    // reads is cut by its own write deadline, not joined).
    let metrics = metrics.and_then(|m| m.spawn(node.clone()).map_err(|e| log::error!("{e}")).ok());
    std::thread::scope(|scope| {
        let (node, churn, signal2) = (&*node, &churn, signal.clone());
        let json = args.json;
        let _ = std::thread::Builder::new()
            .name("churn".into())
            .spawn_scoped(scope, move || churn::run(node, churn, json, &signal2));
        loop {
            select! {
                recv(events) -> event => match event {
                    Ok(event) => printer.print(node.instance_id(), &event),
                    Err(_) => break,
                },
                // Disconnected when SIGINT/SIGTERM arrives (the churn thread sees it too).
                recv(signal) -> _ => break,
            }
        }
    });
    // Stops accepting; connections in progress end by their deadlines, unwaited.
    if let Some(m) = &metrics {
        m.stop();
    }
    let shut = if args.leave_on_exit {
        log::info!("signal received; leaving (closing the rooms, dropping the registration, releasing the lease)");
        // The error says what was not removed and that the reaper will remove it.
        node.leave().map_err(|e| Failure::runtime(e.to_string()))
    } else {
        log::info!("signal received; shutting down (releasing the lease)");
        node.shutdown()
            .map_err(|e| Failure::runtime(format!("shutdown: {e}")))
    };
    printer.drain(&node, &events);
    shut
}

/// Pins the rooms and upserts their peers; rooms another live instance holds are skipped.
/// Stops early (without error) when a signal arrives.
fn start_up(
    node: &Node,
    plan: &Plan,
    signal: &crossbeam_channel::Receiver<()>,
) -> Result<(), String> {
    for room in &plan.rooms {
        if signalled(signal) {
            return Ok(());
        }
        match node
            .pin_room(room)
            .map_err(|e| format!("pin room {room:?}: {e}"))?
        {
            PinOutcome::Held { owner } => {
                log::warn!(
                    "room {room:?} is held by live instance {owner:?}; not pinned, its peers are skipped"
                );
                continue;
            }
            PinOutcome::TookOver { previous } => {
                log::info!("room {room:?} taken over from {previous:?}");
            }
            _ => {}
        }
        for k in 1..=plan.peers_per_room {
            if signalled(signal) {
                return Ok(());
            }
            let (peer, guest) = Plan::peer(room, k);
            node.upsert_peer(room, &peer, Some(&guest), &[])
                .map_err(|e| format!("upsert peer {peer:?} in room {room:?}: {e}"))?;
        }
    }
    Ok(())
}
