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

    out!("sfu-redis demo: three SFU instances share one Redis");
    match &server {
        Some(s) => out!(
            "  Redis:   private redis-server at {} (stopped at the end)",
            s.url()
        ),
        None => out!(
            "  Redis:   {} (from REDIS_URL / --redis-url)",
            redact_url(&url)
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

    /// Moves whatever the collectors delivered into the timeline.
    fn pump(&mut self) {
        self.entries.extend(self.rx.try_iter());
    }

    /// Waits up to `d` for an event; fails when a signal arrives.
    fn idle(&mut self, d: Duration) -> Result<(), Stop> {
        select! {
            recv(self.rx) -> entry => {
                if let Ok(entry) = entry {
                    self.entries.push(entry);
                }
            }
            recv(self.signal) -> _ => return Err("interrupted by a signal".into()),
            default(d) => {}
        }
        Ok(())
    }

    /// Live (not crashed) members that believe they lead; records the most seen at once.
    fn live_leaders(&mut self) -> Vec<usize> {
        let leaders: Vec<usize> = self
            .members
            .iter()
            .enumerate()
            .filter(|(_, m)| !m.crashed && m.node.is_leader())
            .map(|(i, _)| i)
            .collect();
        self.leader_polls += 1;
        self.most_leaders = self.most_leaders.max(leaders.len());
        leaders
    }

    /// Waits until exactly one live member leads; returns its index.
    fn wait_single_leader(&mut self) -> Result<usize, Stop> {
        let deadline = Instant::now() + STEP_DEADLINE;
        loop {
            self.pump();
            let leaders = self.live_leaders();
            if let [one] = leaders[..] {
                return Ok(one);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "no single leader within {} s ({} live nodes lead)",
                    STEP_DEADLINE.as_secs(),
                    leaders.len()
                ));
            }
            self.idle(POLL)?;
        }
    }

    /// Waits until every live member has sent at least `beats` heartbeats.
    fn wait_heartbeats(&mut self, beats: u64) -> Result<(), Stop> {
        let deadline = Instant::now() + STEP_DEADLINE;
        loop {
            self.pump();
            self.live_leaders();
            let slowest = self
                .members
                .iter()
                .filter(|m| !m.crashed)
                .map(|m| m.node.stats().heartbeats)
                .min()
                .unwrap_or(0);
            if slowest >= beats {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "a node sent only {slowest} heartbeats in {} s",
                    STEP_DEADLINE.as_secs()
                ));
            }
            self.idle(POLL)?;
        }
    }

    /// Waits for the first timeline entry at or after `since` that `pred` accepts; returns its
    /// index. Samples the leaders while waiting.
    fn wait_for(
        &mut self,
        since: usize,
        what: &str,
        pred: impl Fn(&Entry) -> bool,
    ) -> Result<usize, Stop> {
        let deadline = Instant::now() + STEP_DEADLINE;
        let mut i = since;
        loop {
            self.pump();
            self.live_leaders();
            while i < self.entries.len() {
                if pred(&self.entries[i]) {
                    return Ok(i);
                }
                i += 1;
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "timed out after {} s waiting for {what}",
                    STEP_DEADLINE.as_secs()
                ));
            }
            self.idle(POLL)?;
        }
    }

    /// Crashes member `i` (kill -9 style) and marks the moment on the timeline; returns the
    /// timeline index from which to look for what follows.
    fn crash(&mut self, i: usize) -> (usize, Duration) {
        self.pump();
        let mark = self.entries.len();
        self.members[i].node.simulate_crash();
        self.members[i].crashed = true;
        let at = self.elapsed();
        self.entries.push(Entry {
            at,
            instance: self.members[i].id.clone(),
            what: What::Note("** crashed (simulate_crash: threads stopped, nothing cleaned up) **"),
        });
        (mark, at)
    }

    fn steps(&mut self, base: &ConfigBuilder) -> Result<(), Stop> {
        self.step_start(base)?;
        let victim = self.step_crash_follower()?;
        let (survivor, old_leader) = self.step_crash_leader()?;
        self.outcome = Some((survivor, vec![victim, old_leader]));
        Ok(())
    }

    /// Step a: three nodes with rooms and peers; one leader.
    fn step_start(&mut self, base: &ConfigBuilder) -> Result<(), Stop> {
        out!(
            "\n[a] start sfu-a, sfu-b, sfu-c; each pins {ROOMS_PER_NODE} rooms and upserts {PEERS_PER_ROOM} peers per room (with guest ids)"
        );
        for letter in LETTERS {
            let id = instance_id(letter);
            let config = base
                .clone()
                .instance_id(&id)
                .build()
                .map_err(|e| format!("config of {id}: {e}"))?;
            let node = Node::start(config).map_err(|e| format!("cannot start {id}: {e}"))?;
            let (events, tx, stop) = (
                node.events(),
                self.tx.clone().ok_or("event channel closed")?,
                self.stop_rx.clone(),
            );
            let (start, cid) = (self.start, id.clone());
            let handle = std::thread::Builder::new()
                .name(format!("demo-events-{id}"))
                .spawn(move || collect(start, cid, events, tx, stop))
                .map_err(|e| format!("cannot spawn the event collector of {id}: {e}"))?;
            self.collectors.push(handle);
            self.members.push(Member {
                id: id.clone(),
                node,
                crashed: false,
            });
            let node = &self.members[self.members.len() - 1].node;
            for room in room_ids(letter) {
                match node.pin_room(&room) {
                    Ok(PinOutcome::Held { owner }) => {
                        return Err(format!("{id}: room {room} is unexpectedly held by {owner}"))
                    }
                    Ok(_) => {}
                    Err(e) => return Err(format!("{id}: pin {room}: {e}")),
                }
                for k in 1..=PEERS_PER_ROOM {
                    let (peer, guest) = (peer_id(&room, k), guest_id(&room, k));
                    let name = format!("Guest {k}");
                    node.upsert_peer(&room, &peer, Some(&guest), &[("display_name", &name)])
                        .map_err(|e| format!("{id}: upsert {peer} in {room}: {e}"))?;
                }
            }
            node.ready();
            self.say(&format!(
                "{id} started: heartbeating, rooms {}-room-1..{ROOMS_PER_NODE} pinned, {} peers written",
                letter,
                ROOMS_PER_NODE * PEERS_PER_ROOM
            ));
        }
        let leader = self.wait_single_leader()?;
        let m = &self.members[leader];
        let epoch = m.node.stats().epoch.unwrap_or(0);
        self.say(&format!(
            "{} leads (holds the reaper lease, epoch {epoch}); the others retry the acquire every ~{} ms",
            m.id,
            self.timings.lease_refresh.as_millis()
        ));
        let id = m.id.clone();
        self.check(
            "exactly one leader elected at start",
            true,
            format!("{id}, epoch {epoch}"),
        );
        self.wait_heartbeats(3)?;
        let config = base
            .clone()
            .instance_id(&id)
            .build()
            .map_err(|e| format!("config: {e}"))?;
        let st = fleet_status(&config).map_err(|e| format!("fleet status: {e}"))?;
        let alive: Vec<&str> = st
            .instances
            .iter()
            .filter(|i| i.alive)
            .map(|i| i.id.as_str())
            .collect();
        self.say(&format!(
            "fleet steady (every node heartbeated 3 times): {} of {} instances alive ({}), leader {}",
            alive.len(),
            st.instances.len(),
            alive.join(", "),
            st.leader.as_deref().unwrap_or("none")
        ));
        Ok(())
    }

    /// Step b: crash a non-leader; the leader finds it, waits, re-checks, reaps.
    fn step_crash_follower(&mut self) -> Result<String, Stop> {
        let leader = self.wait_single_leader()?;
        let leader_id = self.members[leader].id.clone();
        let victim = (0..self.members.len())
            .find(|&i| i != leader && !self.members[i].crashed)
            .ok_or("no live non-leader to crash")?;
        let victim_id = self.members[victim].id.clone();
        out!(
            "\n[b] crash {victim_id}, a non-leader, as kill -9 would (no cleanup, lease untouched)"
        );
        let (mark, _) = self.crash(victim);
        self.say(&format!("{victim_id} crashed"));
        Self::explain(&format!(
            "its heartbeat key expires {} ms after its last beat; once that beat is older than the",
            self.timings.heartbeat_ttl.as_millis()
        ));
        Self::explain(&format!(
            "stale threshold ({} ms, server time), the leader's next reap round lists it as a candidate",
            self.timings.stale_threshold.as_millis()
        ));
        let ci = self.wait_for(
            mark,
            &format!("a candidates event naming {victim_id}"),
            |e| e.is_candidates_naming(&victim_id),
        )?;
        let reaper = self.entries[ci].instance.clone();
        self.say(&format!(
            "{reaper}: candidates [{victim_id}] -- phase one: {victim_id} is only suspected, not yet dead"
        ));
        Self::explain(&format!(
            "{reaper} now waits the two-phase delay ({} ms), then re-checks {victim_id}'s heartbeat and reaps",
            self.timings.two_phase_delay.as_millis()
        ));
        Self::explain(
            "only if it is still dead: an instance that merely missed beats in a network spike survives",
        );
        let ri = self.wait_for(ci, &format!("instance_reaped for {victim_id}"), |e| {
            e.is_reaped(&victim_id)
        })?;
        self.report_reap(ri, &victim_id, &leader_id);
        Ok(victim_id)
    }

    /// Narrates a reap found at `ri` and checks its two-phase gap and counts.
    fn report_reap(&mut self, ri: usize, dead: &str, expected_reaper: &str) {
        let reaper = self.entries[ri].instance.clone();
        let reaped_at = self.entries[ri].at;
        let fields = self.entries[ri]
            .event()
            .map(event_fields)
            .unwrap_or_default();
        let counts = match self.entries[ri].event() {
            Some(Event::InstanceReaped {
                rooms,
                peers,
                skipped_rooms,
                ..
            }) => (*rooms, *peers, *skipped_rooms),
            _ => (0, 0, 0),
        };
        // The candidates event of the round that reaped it: the last one before the reap.
        let cand_at = self.entries[..ri]
            .iter()
            .rev()
            .find(|e| e.instance == reaper && e.is_candidates_naming(dead))
            .map(|e| e.at);
        let gap = cand_at.map(|c| reaped_at.saturating_sub(c));
        self.say(&format!("{reaper}: instance_reaped {fields}"));
        if let Some(gap) = gap {
            Self::explain(&format!(
                "{} after that round's candidates event: the re-check found {dead} still dead, and each of its",
                secs(gap)
            ));
            Self::explain("rooms was deleted by an owner-CAS script (only because its owner was still the dead instance)");
        }
        let delay = self.timings.two_phase_delay;
        if reaper != expected_reaper {
            Self::explain(&format!(
                "(the lease moved from {expected_reaper} to {reaper} meanwhile; the new leader did the reap)"
            ));
        }
        self.check(
            &format!("{dead} reaped only after the two-phase delay"),
            gap.is_some_and(|g| g >= delay),
            match gap {
                Some(g) => format!(
                    "{} between candidates and reap >= {} ms",
                    secs(g),
                    delay.as_millis()
                ),
                None => "no candidates event before the reap".into(),
            },
        );
        let want = (
            ROOMS_PER_NODE as u64,
            (ROOMS_PER_NODE * PEERS_PER_ROOM) as u64,
            0,
        );
        self.check(
            &format!(
                "{dead}'s reap counts: {} rooms, {} peers, 0 skipped",
                want.0, want.1
            ),
            counts == want,
            format!(
                "rooms={} peers={} skipped_rooms={}",
                counts.0, counts.1, counts.2
            ),
        );
    }

    /// Step c: crash the leader; the survivor waits for the lease to expire, takes it, reaps.
    fn step_crash_leader(&mut self) -> Result<(String, String), Stop> {
        let leader = self.wait_single_leader()?;
        let leader_id = self.members[leader].id.clone();
        let old_epoch = self.members[leader].node.stats().epoch.unwrap_or(0);
        let survivor = (0..self.members.len())
            .find(|&i| i != leader && !self.members[i].crashed)
            .ok_or("no live node left to take over")?;
        let survivor_id = self.members[survivor].id.clone();
        out!(
            "\n[c] crash the leader {leader_id} (epoch {old_epoch}); it does not release the lease"
        );
        let (mark, crashed_at) = self.crash(leader);
        let lease_left: Option<i64> =
            query::<i64>(&mut self.con, redis::cmd("PTTL").arg(self.keys.leader()))
                .ok()
                .filter(|ms| *ms >= 0);
        self.say(&format!(
            "{leader_id} crashed holding the lease{}",
            lease_left.map_or(String::new(), |ms| format!(" ({ms} ms of its TTL left)"))
        ));
        Self::explain(&format!(
            "{survivor_id}'s acquire (SET NX, every ~{} ms) fails until that lease key expires in Redis;",
            self.timings.lease_refresh.as_millis()
        ));
        Self::explain("nobody reaps meanwhile, and no second leader can appear");
        let ai = self.wait_for(mark, &format!("leader_acquired from {survivor_id}"), |e| {
            e.instance == survivor_id && matches!(e.event(), Some(Event::LeaderAcquired { .. }))
        })?;
        let took_over_after = self.entries[ai].at.saturating_sub(crashed_at);
        let new_epoch = match self.entries[ai].event() {
            Some(Event::LeaderAcquired { epoch, .. }) => *epoch,
            _ => 0,
        };
        self.say(&format!(
            "{survivor_id}: leader_acquired epoch={new_epoch} -- {} after the crash",
            secs(took_over_after)
        ));
        if let Some(ms) = lease_left {
            let expiry = crashed_at + Duration::from_millis(ms as u64);
            Self::explain(&format!(
                "the old lease expired at about {}; {survivor_id}'s next acquire attempt after that won",
                stamp(expiry).trim_start()
            ));
        }
        self.check(
            &format!("{survivor_id} took the lease only after {leader_id}'s expired"),
            // 10 ms of slack for clock granularity between Redis's expiry and our stamps.
            lease_left.map_or(true, |ms| {
                took_over_after + Duration::from_millis(10) >= Duration::from_millis(ms as u64)
            }),
            match lease_left {
                Some(ms) => format!(
                    "acquired {} after the crash; {ms} ms were left",
                    secs(took_over_after)
                ),
                None => format!(
                    "acquired {} after the crash; lease TTL unknown",
                    secs(took_over_after)
                ),
            },
        );
        self.check(
            "the new term's epoch is higher (fencing token)",
            new_epoch > old_epoch,
            format!("{old_epoch} -> {new_epoch}"),
        );
        let ci = self.wait_for(ai, &format!("a candidates event naming {leader_id}"), |e| {
            e.instance == survivor_id && e.is_candidates_naming(&leader_id)
        })?;
        self.say(&format!(
            "{survivor_id}: candidates [{leader_id}] -- waiting the two-phase delay ({} ms) before the re-check",
            self.timings.two_phase_delay.as_millis()
        ));
        let ri = self.wait_for(ci, &format!("instance_reaped for {leader_id}"), |e| {
            e.is_reaped(&leader_id)
        })?;
        self.report_reap(ri, &leader_id, &survivor_id);
        Ok((survivor_id, leader_id))
    }

    /// Step e (run while the survivor is alive): Redis holds the survivor's data and nothing of
    /// the dead. Returns the fleet status for the table.
    fn data_checks(&mut self, base: &ConfigBuilder) -> Option<FleetStatus> {
        let (survivor, dead) = self.outcome.clone()?;
        match self.survivor_checks(&survivor) {
            Ok(()) => {}
            Err(e) => self.check("survivor's data readable", false, e),
        }
        match self.leftover_check(&dead) {
            Ok(()) => {}
            Err(e) => self.check("scan for leftovers of the dead", false, e),
        }
        let live_problems: Vec<String> = self
            .entries
            .iter()
            .filter(|e| {
                matches!(
                    e.event(),
                    Some(Event::RoomLost { .. } | Event::ReapedSelf { .. })
                )
            })
            .map(|e| {
                format!(
                    "{} {}",
                    e.instance,
                    e.event().map(Event::name).unwrap_or_default()
                )
            })
            .collect();
        self.check(
            "no live instance lost a room (no room_lost / reaped_self events)",
            live_problems.is_empty(),
            if live_problems.is_empty() {
                "none seen".into()
            } else {
                live_problems.join(", ")
            },
        );
        self.check(
            "never more than one live instance believed it led",
            self.most_leaders <= 1,
            format!(
                "at most {} at once over {} polls",
                self.most_leaders, self.leader_polls
            ),
        );
        let config = match base.clone().instance_id(&survivor).build() {
            Ok(c) => c,
            Err(e) => {
                self.check("fleet status", false, e.to_string());
                return None;
            }
        };
        match fleet_status(&config) {
            Ok(st) => {
                let ids: Vec<&str> = st.instances.iter().map(|i| i.id.as_str()).collect();
                let ok = ids == [survivor.as_str()]
                    && st.instances.iter().all(|i| i.alive)
                    && st.leader.as_deref() == Some(survivor.as_str())
                    && st.leader_alive
                    && st.is_clean();
                let mut problems: Vec<&str> = st.problems.iter().map(String::as_str).collect();
                for i in &st.instances {
                    problems.extend(i.problems.iter().map(String::as_str));
                }
                self.check(
                    "fleet status: only the survivor is registered, alive, and it leads; no problems",
                    ok,
                    format!(
                        "instances {ids:?}, leader {}, problems {problems:?}",
                        st.leader.as_deref().unwrap_or("none")
                    ),
                );
                Some(st)
            }
            Err(e) => {
                self.check("fleet status", false, e.to_string());
                None
            }
        }
    }

    /// The survivor's pins, metadata, peer sets, guest maps, peer records, indexes and
    /// heartbeat are all still there. What it owns is read key by key; whether the indexes,
    /// guest maps and peer sets agree with the records (invariant 4) is the library's one
    /// consistency scan (`sfu_redis::audit::scan`): a problem at one of the survivor's rooms
    /// fails the peers check, any other problem under the prefix the indexes check.
    fn survivor_checks(&mut self, survivor: &str) -> Result<(), String> {
        let rooms = room_ids(letter_of(survivor));
        let scan = audit::scan(&self.keys, &mut self.con).map_err(|e| e.to_string())?;
        let (mut peers, mut index): (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());
        for p in &scan {
            let line = format!("{} at {}: {}", p.kind, p.key, p.detail);
            if in_rooms(&self.keys, p, &rooms) {
                peers.push(line);
            } else {
                index.push(line);
            }
        }
        let pins = self.survivor_pins(survivor, &rooms)?;
        peers.extend(self.survivor_peers(survivor, &rooms)?);
        index.extend(self.survivor_registration(survivor)?);
        let n = rooms.len();
        let report = |problems: Vec<String>, ok: String| {
            if problems.is_empty() {
                (true, ok)
            } else {
                (false, problems.join("; "))
            }
        };
        let (ok, d) = report(
            pins,
            format!("{n} pins and {n} meta hashes name {survivor}"),
        );
        self.check(
            &format!("{survivor}'s room pins and metadata intact"),
            ok,
            d,
        );
        let (ok, d) = report(
            peers,
            format!(
                "{} peers with records and guest mappings",
                n * PEERS_PER_ROOM
            ),
        );
        self.check(
            &format!("{survivor}'s peers, guest maps and peer records intact"),
            ok,
            d,
        );
        let (ok, d) = report(
            index,
            "room and peer indexes, heartbeat key and score".into(),
        );
        self.check(&format!("{survivor}'s indexes and heartbeat intact"), ok, d);
        Ok(())
    }

    /// Each room's pin and metadata name the survivor.
    fn survivor_pins(&mut self, survivor: &str, rooms: &[String]) -> Result<Vec<String>, String> {
        let con = &mut self.con;
        let mut pins = Vec::new();
        for room in rooms {
            let rk = self.keys.room(room);
            let owner: Option<String> = query(con, redis::cmd("GET").arg(&rk.owner))?;
            if owner.as_deref() != Some(survivor) {
                pins.push(format!("{} is {owner:?}", rk.owner));
            }
            let meta: Option<String> = query(con, redis::cmd("HGET").arg(&rk.meta).arg("owner"))?;
            if meta.as_deref() != Some(survivor) {
                pins.push(format!("{} owner is {meta:?}", rk.meta));
            }
        }
        Ok(pins)
    }

    /// Each room holds exactly its peers, each with its record (the survivor, its guest, its
    /// host field) and its guest pointing at it.
    fn survivor_peers(&mut self, survivor: &str, rooms: &[String]) -> Result<Vec<String>, String> {
        let con = &mut self.con;
        let mut peers = Vec::new();
        for room in rooms {
            let rk = self.keys.room(room);
            let set: BTreeSet<String> = scan::collect(con, Scan::set(&rk.peers))
                .map_err(redis_failed)?
                .into_iter()
                .map(|m| String::from_utf8_lossy(&m).into_owned())
                .collect();
            let want: BTreeSet<String> = (1..=PEERS_PER_ROOM).map(|k| peer_id(room, k)).collect();
            if set != want {
                peers.push(format!("{} holds {set:?}", rk.peers));
            }
            for k in 1..=PEERS_PER_ROOM {
                let (peer, guest) = (peer_id(room, k), guest_id(room, k));
                let mapped: Option<String> =
                    query(con, redis::cmd("HGET").arg(&rk.guests).arg(&guest))?;
                if mapped.as_deref() != Some(peer.as_str()) {
                    peers.push(format!("{} {guest} -> {mapped:?}", rk.guests));
                }
                let key = self.keys.peer(room, &peer);
                let (inst, g, name): (Option<String>, Option<String>, Option<String>) = query(
                    con,
                    redis::cmd("HMGET")
                        .arg(&key)
                        .arg("instance")
                        .arg("guest")
                        .arg("display_name"),
                )?;
                let want_name = format!("Guest {k}");
                if inst.as_deref() != Some(survivor)
                    || g.as_deref() != Some(guest.as_str())
                    || name.as_deref() != Some(want_name.as_str())
                {
                    peers.push(format!(
                        "{key} is instance={inst:?} guest={g:?} display_name={name:?}"
                    ));
                }
            }
        }
        Ok(peers)
    }

    /// The survivor's heartbeat key and sorted-set score exist.
    fn survivor_registration(&mut self, survivor: &str) -> Result<Vec<String>, String> {
        let con = &mut self.con;
        let hb: bool = query(con, redis::cmd("EXISTS").arg(self.keys.heartbeat(survivor)))?;
        let score: Option<i64> = query(
            con,
            redis::cmd("ZSCORE")
                .arg(self.keys.heartbeats())
                .arg(survivor),
        )?;
        if !hb || score.is_none() {
            return Ok(vec![format!(
                "heartbeat key present: {hb}, sorted-set score: {score:?}"
            )]);
        }
        Ok(Vec::new())
    }

    /// Scans every key under the prefix: no key name, string value, hash field or value, set
    /// member or sorted-set member may contain a dead instance's id or one of its room ids
    /// (peer and guest ids are built from the room ids, so they are covered too).
    fn leftover_check(&mut self, dead: &[String]) -> Result<(), String> {
        let mut needles: Vec<String> = dead.to_vec();
        for d in dead {
            needles.extend(room_ids(letter_of(d)));
        }
        let all = scan_keys(&mut self.con, &self.keys)?;
        let mut values = 0usize;
        let mut problems = Vec::new();
        let hit = |s: &str| needles.iter().find(|n| s.contains(n.as_str())).cloned();
        for key in &all {
            if let Some(n) = hit(key) {
                problems.push(format!("key {key} (refers to {n})"));
            }
            let ty: String = query(&mut self.con, redis::cmd("TYPE").arg(key))?;
            let items: Vec<Vec<u8>> = match ty.as_str() {
                "string" => query::<Option<Vec<u8>>>(&mut self.con, redis::cmd("GET").arg(key))?
                    .into_iter()
                    .collect(),
                "hash" => scan::collect(&mut self.con, Scan::hash(key)).map_err(redis_failed)?,
                "set" => scan::collect(&mut self.con, Scan::set(key)).map_err(redis_failed)?,
                "zset" => {
                    scan::collect(&mut self.con, Scan::sorted_set(key)).map_err(redis_failed)?
                }
                "list" => query(&mut self.con, redis::cmd("LRANGE").arg(key).arg(0).arg(-1))?,
                "none" => Vec::new(), // expired between SCAN and TYPE
                other => {
                    problems.push(format!("key {key} has unexpected type {other}"));
                    Vec::new()
                }
            };
            for item in items {
                values += 1;
                let s = String::from_utf8_lossy(&item);
                if let Some(n) = hit(&s) {
                    problems.push(format!("{key} holds {s:?} (refers to {n})"));
                }
            }
        }
        let ok = problems.is_empty() && !all.is_empty();
        let detail = if problems.is_empty() {
            format!(
                "scanned {} keys and {values} members/fields/values under {}:*; none mention {}",
                all.len(),
                self.keys.prefix(),
                needles.join(", ")
            )
        } else {
            problems.join("; ")
        };
        self.check(
            "nothing under the prefix refers to the crashed instances or their rooms",
            ok,
            detail,
        );
        Ok(())
    }

    /// Shuts down every live node (the survivor releases the lease and emits `stopped`), then
    /// collects the last events.
    fn finish(&mut self) {
        for m in &self.members {
            if !m.crashed {
                if let Err(e) = m.node.shutdown() {
                    log::warn!("shutdown of {}: {e}", m.id);
                }
            }
        }
        // Every event is emitted by now: let the collectors drain and stop.
        self.stop_collectors = None;
        for h in self.collectors.drain(..) {
            if h.join().is_err() {
                log::error!("an event collector panicked");
            }
        }
        self.tx = None;
        self.pump();
        self.members.clear();
    }

    fn print_timeline(&self) {
        out!("\n[d] timeline (time since the demo started, instance, event, fields)");
        let mut sorted: Vec<&Entry> = self.entries.iter().collect();
        sorted.sort_by_key(|e| e.at);
        for e in sorted {
            let (name, fields) = match &e.what {
                What::Event(ev) => (ev.name(), event_fields(ev)),
                What::Note(note) => ("", (*note).to_owned()),
            };
            let line = format!(
                "  {}  {:<5}  {:<16} {fields}",
                stamp(e.at),
                e.instance,
                name
            );
            out!("{}", line.trim_end());
        }
    }

    fn print_check(&self, i: usize) {
        let c = &self.checks[i];
        if c.ok {
            out!("  PASS  {} ({})", c.name, c.detail);
        } else {
            out!("  FAIL  {}: {}", c.name, c.detail);
        }
    }

    fn print_checks(&self) {
        out!(
            "\n[f] checks (read back from Redis with SCAN MATCH {})",
            self.keys.scan_pattern()
        );
        for i in 0..self.checks.len() {
            self.print_check(i);
        }
    }
}
