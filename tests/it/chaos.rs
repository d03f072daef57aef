//! Chaos: five `sfu-redis node --json` processes with rooms and peers on one private
//! redis-server, each behind its own fault proxy. For a fixed period (`SFU_CHAOS_SECS`,
//! default 90 s) a seeded schedule injects random faults (`SFU_CHAOS_SEED` replays the same
//! random draws; choices that depend on timing, such as which node leads, may still differ):
//!
//! - `kill -9` of a node (the slot is refilled a moment later by a fresh process with new
//!   fixed rooms; mostly with a NEW instance id, so "every dead instance is reaped" can be
//!   checked by id, sometimes (`REUSE_PCT`) with the killed id again: a restarted process with
//!   a stable id, which waits for the old heartbeat key to expire and clears the old life);
//! - SIGSTOP/SIGCONT: short pauses (well inside the reap window: the node must lose nothing),
//!   medium ones (around the two-phase window: either outcome is legal) and long ones (past the
//!   reap window: the node becomes a zombie, must report `reaped_self`, register again and never
//!   bring its old rooms back);
//! - proxy blackholes of one node's traffic (requests, replies or both), short, medium or long;
//! - exactly one Redis restart without persistence, at a random moment: every running node must
//!   restore its heartbeat, pins, indexes and peer records within a couple of ticks;
//! - random single-reply losses (`FaultProxy::lose_next_reply`, several per second across the
//!   fleet, on running nodes): the next request of that node runs, its reply is lost with the
//!   connection. Not counted as faults (they disrupt no slot).
//!
//! **Failover mode** (`chaos_failovers_then_check`: a second run whose fault period is
//! `SFU_CHAOS_FAILOVERS=<seconds>`, 60 by default, the shortest to which every check applies;
//! `0` skips it). The same five node processes, faults, churn and checker, on a Sentinel group instead
//! of one redis-server: a master, one replica and three sentinels (`down-after-milliseconds`
//! 500, `SentinelGroup`), every node started with a `redis+sentinel://` URL (so every new
//! connection asks the sentinels and checks `ROLE`). Instead of the Redis restart, failovers at
//! random moments, one at a time, each on its own thread while the schedule goes on (kinds in
//! shuffled rounds of three, so a run of three or more has each):
//!
//! - `SENTINEL FAILOVER`: the replica is promoted, and the sentinels themselves demote the old
//!   master a moment later (until then nodes still connected to it write there, and those
//!   writes are lost);
//! - kill -9 of the master: the sentinels promote the replica; the old master is started again
//!   (empty) 0.5 to 3 s after the switch and rejoins as a replica;
//! - SIGSTOP of the master until the sentinels promoted the replica, SIGCONT 0 to 1.5 s later:
//!   it comes back believing it is the master, and must be demoted.
//!
//! Each waits until the group is healthy again (`wait_healthy`: one master named by every
//! sentinel, the other node replicating it), and the next one starts 2 to 6 s later (and at
//! least 6.5 s after the previous one started: twice the sentinels' failover timeout). Churn and
//! node faults go on throughout. After each switch every node that was running then must
//! heartbeat on the new master (its score there newer than the switch) and own everything
//! again within a few ticks (the restore after a master switch: a write acknowledged by the
//! old master just before may be lost, and must be written back by its owner or reported
//! lost, never silently gone); after `SENTINEL FAILOVER` the few ticks count from the old
//! master's demotion (the group healthy), since until then a node whose connections to it keep
//! working has no sign of the switch. Extra index entries left by churn calls around the
//! switch (`dangling_*`) do not count there: removing them is invariant 4's convergence,
//! checked exactly after quiescence. Lease and epoch samples skip the failover windows, as they do
//! the restart (a lost `INCR` is not a repeated epoch: the events' epochs are checked). A
//! reap that ran while a failover was under way went to the old master and may be lost with
//! it: a node reaped then that never noticed (its registration survived on the new master) is
//! noted (`reaps_undone=`), not counted as reaped; its data is checked as every live node's.
//!
//! The proxy faults are kept, faithfully: with discovery a node connects to the address the
//! sentinels name, which would bypass a proxy in front of one redis-server, so nodes of slots
//! 2 to 4 reach the group through their own `FaultRoute` (testkit): a proxy in front of each
//! data node and, in front of each sentinel, a proxy and a translator that forwards every
//! command and reply unchanged except the master's address in `GET-MASTER-ADDR-BY-NAME`
//! replies, which becomes the node's proxy of that data node. Such a node follows the real
//! sentinels' answers (every switch is a switch of proxy address; `ROLE` is the real node's),
//! its blackholes cut it off from sentinels and data nodes alike, and its reply losses hit
//! the master it was named last. Dropping those faults would have left the failovers
//! without lost replies and partitions around them, the combinations where a lost write is
//! most likely to go unnoticed. Slots 0 and 1 use the group's own URL, with no proxy at all
//! (they get kill -9 and SIGSTOP only), so the plain production path runs too. The checker
//! reads through the master the sentinels name at check time (after `wait_healthy`); `status`
//! and the audit go through the library's own discovery (the checker's config has the group's
//! URL).
//!
//! Besides its fixed rooms (`<id>-v<life>-r<k>`, pinned with their peers at start), every node
//! churns for the whole fault period over a pool of `POOL` rooms shared by the fleet (`pool-NN`,
//! the node's hidden `--churn-*` flags, `cli/src/churn.rs`): pins (taking rooms over from dead
//! or paused owners), guest reconnects with new peer ids (guests are shared per room, so a
//! guest reconnects through whichever instance holds the room now), removes and closes. Its
//! cumulative counts arrive as `churn_summary` lines (no library event).
//!
//! At most two of the five slots are disrupted at once, and a node gets a cool-down after each
//! fault (so two faults never merge into one longer outage). The current leader is targeted on
//! purpose now and then.
//!
//! Then quiescence: every fault healed, every paused node continued, empty slots refilled, at
//! least two full reap windows, then polling until the fleet has converged. The checker:
//!
//! 1. every live node owns every room it did not report lost: pin and metadata name it, peer
//!    set, guest map and peer records complete, its room index holds exactly that and reaches
//!    every record naming it (the index part is the audit's one consistency scan,
//!    `sfu_redis::ops::audit::scan`). Nobody takes a
//!    fixed room over or closes one, so the only legal loss of one is a zombie's (`reaped_self`,
//!    then `room_lost` for each of its rooms); a `room_lost` of a fixed room outside such a
//!    report is a live instance's room lost (pool rooms may be lost: they move). A room
//!    reported lost has no key left anywhere; a node whose faults were all short lost no fixed
//!    room and was never reaped; a node that was reaped noticed it;
//! 2. the audit (`sfu_redis::ops::audit::audit`, two scans) is clean: no orphans, no stale indexes;
//! 3. leadership: `leader_acquired` epochs never repeat and strictly increase in arrival order
//!    (an event printed late by a node paused right after its acquire is the one exception);
//!    terms (from each node's acquired/lost events, on this process's clock) do not overlap by
//!    more than a small slack unless the old leader was paused or cut off at that moment (it
//!    could not act); sampled during the run, the lease key names a known instance and the
//!    epoch counter never goes backwards (across the Redis restart too), and `fleet_status`
//!    reports no problem;
//! 4. every killed instance id appears nowhere (no key, member, field or value) and is not in
//!    the heartbeat sorted set; for a killed life whose id a later, live life reuses: none of
//!    the old life's fixed rooms appears anywhere (the new life's are checked by 1); and for
//!    every live instance (a reused id, or a zombie that registered again), nothing of an
//!    earlier registration of its id is left: no peer record naming it written, and no room
//!    whose metadata names it pinned, before its current registration (`started_ms` of its
//!    info hash; `earlier_life_problems`);
//! 5. every live node is registered and alive in `fleet_status`, nothing else is registered,
//!    and a live leader holds the lease;
//! 6. invariant 4 exactly, for every live instance, from the dump (`index_problems`): every
//!    member of its room index is a room whose pin and metadata name it, every room whose pin
//!    or metadata names it is in its room index, every peer record naming it lies in a room of
//!    its room index (key schema version 2: the room index is an instance's one index and
//!    reaches its records), and it has no room index moved aside by a reap. Besides, for every
//!    record in the dump, whichever instance it names, live or dead: its room is in that
//!    instance's room index or moved room index (`support::unreached_records`). The audit
//!    (checks 1 and 2) finds the same directions (`dangling_room_index`, `unindexed_room`,
//!    `unindexed_peer`,
//!    judging a room by its pin, else its metadata, and a pin and metadata naming two
//!    instances as `malformed_value`); this check is independent of it and names the instance;
//! 7. the workload ran: at least 5 churn calls per node-second, every kind of churn call
//!    happened and replies were really lost.
//!
//! It prints one summary line (`chaos: seed=... faults=... reaps=... churn_ops=...
//! churn_ops_per_s=... churn_errors=... lost_replies=... violations=...`; ops per second over
//! the churn window, i.e. the fault period; in failover mode also `failovers=N (command=...
//! kill9=... stop=...)` and `node_switches=`, the master switches the nodes logged) and fails
//! if any violation was found. Node stderr logs (RUST_LOG=info) are kept in a temp dir when
//! it fails.

use crate::support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use redis::Connection;
use serde_json::{json, Value};
use sfu_redis::keys::{KeySpace, ParsedKey};
use sfu_redis::ops::audit::{self, audit, AuditOptions, Problem, ProblemKind};
use sfu_redis::ops::status::fleet_status;
use sfu_redis::{Config, Timings};
use sfu_redis_testkit::faultroute::FaultRoute;
use sfu_redis_testkit::sentinel::{SentinelGroup, SentinelOptions};
use support::procs::{NodeProc, FAST};
use support::{config_for, references, unreached_records, Direction, FaultProxy, Server, Val};

const STAGE: &str = "chaos";
/// Node processes kept running (five "live-ish" nodes most of the time).
const SLOTS: usize = 5;
/// At most this many slots are disrupted (paused, cut off, dead or starting) at once.
const MAX_DISRUPTED: usize = 2;
/// Default fault period, seconds: the whole test takes well under 3 minutes.
const DEFAULT_SECS: u64 = 90;
/// The failover run's default fault period (`SFU_CHAOS_FAILOVERS`): the shortest to which every
/// check applies (`check_workload`: takeovers and guests re-homed elsewhere need 60 s).
const DEFAULT_FAILOVER_SECS: u64 = 60;
/// Fault durations, ms: short ones must leave a node untouched; medium ones straddle the
/// two-phase window; long ones outlast a full reap window (zombies).
const SHORT: (u64, u64) = (50, 800);
const MEDIUM: (u64, u64) = (1_500, 3_500);
const LONG: (u64, u64) = (5_500, 9_000);
/// No new fault on a node this long after its last one ended.
const COOL_DOWN: Duration = Duration::from_secs(3);
/// Tolerated overlap of two leaders' terms as seen through event arrival times (pipe and
/// scheduling latency of two processes).
const SLACK: Duration = Duration::from_millis(300);
/// How long a fresh process may take to print `ready`.
const READY_WITHIN: Duration = Duration::from_secs(30);
/// Rooms of the churn pool shared by every node (`pool-01` ...), disjoint from the nodes'
/// fixed rooms (`<id>-v<life>-r<k>`).
const POOL: usize = 16;
/// Gap between two random single-reply losses across the fleet, ms (about 3.3 per second).
const LOSS_GAP: (u64, u64) = (100, 500);
/// Chance (percent) that the refill after a kill -9 reuses the killed instance id.
const REUSE_PCT: u32 = 40;
/// Failover mode: slots below this connect with the group's own URL (no proxy); the others
/// through their own `FaultRoute`.
const DIRECT_SLOTS: usize = 2;
/// Failover mode: pause between a failover's settling and the next one's start, ms.
const FAILOVER_GAP: (u64, u64) = (2_000, 6_000);
/// Failover mode: least time between two failovers' starts (twice the sentinels' failover
/// timeout: a sentinel does not retry a failover of the same master sooner).
const FAILOVER_SPACING: Duration = Duration::from_millis(6_500);
/// How long the killed master stays down after the switch, ms.
const KILL_HOLD: (u64, u64) = (500, 3_000);
const KILL_HOLD_MAX: Duration = Duration::from_millis(KILL_HOLD.1);
/// How long the stopped master stays stopped after the switch, ms.
const STOP_HOLD: (u64, u64) = (0, 1_500);
/// Bounds of one failover's steps: the sentinels' switch, then the group's health (loaded
/// 2-core machine; with `down-after-milliseconds` 500 both normally take 1 to 3 s).
const SWITCH_WITHIN: Duration = Duration::from_secs(45);
const HEALTHY_WITHIN: Duration = Duration::from_secs(45);

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

/// What a fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Stop,
    Blackhole(Direction),
}

impl Kind {
    fn name(self) -> String {
        match self {
            Kind::Stop => "stop".into(),
            Kind::Blackhole(d) => format!("blackhole-{d:?}").to_lowercase(),
        }
    }
}

/// One fault of one node: planned end while it runs, actual end once healed.
#[derive(Debug, Clone)]
struct Fault {
    kind: Kind,
    start: Instant,
    end: Instant,
    done: bool,
}

impl Fault {
    fn contains(&self, t: Instant) -> bool {
        self.start <= t && t <= self.end
    }
}

/// A node's faulty path to Redis: its fault proxy in front of the one redis-server, or (in
/// failover mode) its own route to the Sentinel group.
enum Link {
    Proxy(FaultProxy),
    Route(FaultRoute),
}

impl Link {
    fn url(&self) -> String {
        match self {
            Link::Proxy(p) => p.url(),
            Link::Route(r) => r.url(),
        }
    }

    fn blackhole(&self, d: Direction) {
        match self {
            Link::Proxy(p) => p.blackhole(d),
            Link::Route(r) => r.blackhole(d),
        }
    }

    fn heal(&self) {
        match self {
            Link::Proxy(p) => p.heal(),
            Link::Route(r) => r.heal(),
        }
    }

    /// Arms one single-reply loss; `false` when there is nothing to arm it on yet (a route
    /// whose node was named no master yet).
    fn lose_next_reply(&self) -> bool {
        match self {
            Link::Proxy(p) => {
                p.lose_next_reply();
                true
            }
            Link::Route(r) => r.lose_next_reply(),
        }
    }

    fn replies_lost(&self) -> u64 {
        match self {
            Link::Proxy(p) => p.replies_lost(),
            Link::Route(r) => r.replies_lost(),
        }
    }
}

/// Failover mode: what a failover does to the master.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failover {
    /// `SENTINEL FAILOVER`.
    Command,
    /// kill -9, started again after the switch.
    Kill,
    /// SIGSTOP until the switch, SIGCONT after.
    Stop,
}

impl Failover {
    fn name(self) -> &'static str {
        match self {
            Failover::Command => "command",
            Failover::Kill => "kill9",
            Failover::Stop => "stop",
        }
    }
}

/// What a failover thread reports.
enum JobMsg {
    /// Every sentinel names `new`, whose `ROLE` is master.
    Switched { at: Instant, old: u16, new: u16 },
    /// The group is healthy again, `Ok(false)` when the sentinels did not carry a
    /// `SENTINEL FAILOVER` out (or the error).
    Done {
        at: Instant,
        result: std::result::Result<bool, String>,
    },
    /// Something the sentinels did that the job did not ask for, worth a note.
    Note(String),
}

/// A failover in progress: its thread holds the group.
struct Job {
    kind: Failover,
    started: Instant,
    switched: Option<Instant>,
    old: Option<u16>,
    new: Option<u16>,
    /// The lives running when it started (their restore after the switch is timed).
    running: Vec<usize>,
    rx: mpsc::Receiver<JobMsg>,
    handle: Option<JoinHandle<SentinelGroup>>,
}

/// A failover, finished.
#[derive(Debug, Clone)]
struct FailoverRecord {
    kind: Failover,
    started: Instant,
    switched: Option<Instant>,
    settled: Instant,
    old: Option<u16>,
    new: Option<u16>,
}

/// Failover mode: the Sentinel group and the failover schedule.
struct Sentinels {
    /// `None` while a failover's thread holds it.
    group: Option<SentinelGroup>,
    url: String,
    sentinel_ports: Vec<u16>,
    data_ports: Vec<u16>,
    master_name: String,
    job: Option<Job>,
    done: Vec<FailoverRecord>,
    /// The next kinds (refilled with a shuffled round of all three).
    queue: Vec<Failover>,
    next_at: Option<Instant>,
    /// The checker's own connection to a sentinel (index, connection), for the probe.
    sentinel_con: Option<(usize, Connection)>,
}

impl Sentinels {
    fn new(group: SentinelGroup) -> Sentinels {
        Sentinels {
            url: group.url(),
            sentinel_ports: group.sentinel_ports(),
            data_ports: group.data_ports(),
            master_name: group.master_name().to_owned(),
            group: Some(group),
            job: None,
            done: Vec::new(),
            queue: Vec::new(),
            next_at: None,
            sentinel_con: None,
        }
    }

    /// The master's port as the first sentinel that answers names it (the checker's own
    /// query, independent of the library's discovery; 500 ms per sentinel at most).
    fn ask_master(&mut self) -> Option<u16> {
        for k in 0..self.sentinel_ports.len() {
            let i = match &self.sentinel_con {
                Some((i, _)) => (*i + k) % self.sentinel_ports.len(),
                None => k,
            };
            if self.sentinel_con.as_ref().map(|(j, _)| *j) != Some(i) {
                let con =
                    redis::Client::open(format!("redis://127.0.0.1:{}", self.sentinel_ports[i]))
                        .ok()
                        .and_then(|c| c.get_connection_with_timeout(ms(500)).ok());
                let Some(con) = con else { continue };
                if con.set_read_timeout(Some(ms(500))).is_err() {
                    continue;
                }
                self.sentinel_con = Some((i, con));
            }
            let (_, con) = self.sentinel_con.as_mut().expect("just set");
            let said: redis::RedisResult<Option<(String, u16)>> = redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(&self.master_name)
                .query(con);
            match said {
                Ok(Some((_, port))) => return Some(port),
                Ok(None) => {}
                Err(_) => self.sentinel_con = None,
            }
        }
        None
    }

    fn count(&self, kind: Failover) -> usize {
        self.done.iter().filter(|f| f.kind == kind).count()
            + usize::from(self.job.as_ref().is_some_and(|j| j.kind == kind))
    }
}

/// Where Redis is: one redis-server (the default run) or a Sentinel group (failover mode).
enum Backend {
    Single(Box<Server>),
    Sentinel(Box<Sentinels>),
}

/// The failover thread: `kind` on the group's master, the switch reported as soon as every
/// sentinel names the new master, the old master back (`hold` after the switch), then the
/// group healthy again. Returns the group.
fn run_failover(
    mut g: SentinelGroup,
    kind: Failover,
    hold: Duration,
    tx: mpsc::Sender<JobMsg>,
) -> SentinelGroup {
    let result = failover_steps(&mut g, kind, hold, &tx);
    let _ = tx.send(JobMsg::Done {
        at: Instant::now(),
        result,
    });
    g
}

fn failover_steps(
    g: &mut SentinelGroup,
    kind: Failover,
    hold: Duration,
    tx: &mpsc::Sender<JobMsg>,
) -> std::result::Result<bool, String> {
    let (_, old) = g
        .master_addr()
        .map_err(|e| format!("ask the sentinels for the master: {e}"))?;
    let name = g.master_name().to_owned();
    match kind {
        Failover::Command => {
            let said = g.sentinels()[0]
                .cli(&["SENTINEL", "FAILOVER", &name])
                .map_err(|e| format!("SENTINEL FAILOVER: {e}"))?;
            if said != "OK" {
                return Err(format!("SENTINEL FAILOVER {name} said {said:?}"));
            }
        }
        Failover::Kill => g
            .server(old)
            .ok_or("no data node on the master's port")?
            .kill9(),
        Failover::Stop => g
            .server(old)
            .ok_or("no data node on the master's port")?
            .sigstop()
            .map_err(|e| format!("SIGSTOP the master: {e}"))?,
    }
    let switched = g.wait_master_change(old, SWITCH_WITHIN);
    if let Ok(new) = &switched {
        let _ = tx.send(JobMsg::Switched {
            at: Instant::now(),
            old,
            new: *new,
        });
        std::thread::sleep(hold);
    }
    // The old master comes back whatever happened (a group left broken fails everything after).
    let server = g
        .server(old)
        .ok_or("no data node on the old master's port")?;
    let back = match kind {
        Failover::Command => Ok(()),
        Failover::Kill => server
            .start_again()
            .map_err(|e| format!("start the old master again: {e}")),
        Failover::Stop => server
            .sigcont()
            .map_err(|e| format!("SIGCONT the old master: {e}")),
    };
    if kind == Failover::Command && switched.is_err() {
        // The sentinels may accept a `SENTINEL FAILOVER` and then abort it (no replica they
        // deem good yet, say one restarted a moment ago): nothing failed over, which is not
        // the nodes' doing, as long as the group is healthy on its master.
        return match g.wait_healthy(HEALTHY_WITHIN) {
            Ok(master) if master == old => Ok(false),
            _ => Err(format!(
                "the sentinels did not promote the replica and the group is not healthy: {}",
                switched.err().map(|e| e.to_string()).unwrap_or_default()
            )),
        };
    }
    let new = switched.map_err(|e| format!("the sentinels did not promote the replica: {e}"))?;
    back?;
    let healthy = g
        .wait_healthy(HEALTHY_WITHIN)
        .map_err(|e| format!("the group did not get healthy after the switch: {e}"))?;
    if healthy == old && old != new {
        // The sentinels failed over again, back to the old master once it answered (a slow
        // promotion on a loaded machine: CI, seed 14199188026244425002). Sentinel's choice, not
        // the nodes': they met one more master switch inside this job's window, which the
        // checks count as a failover window.
        let _ = tx.send(JobMsg::Note(format!(
            "failover {}: the sentinels promoted {new}, then settled back on {old}",
            kind.name()
        )));
        return Ok(true);
    }
    if healthy != new {
        return Err(format!(
            "the group settled on master {healthy}, not on the promoted {new}"
        ));
    }
    Ok(true)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Spawned, `ready` not seen yet.
    Spawning,
    Running,
    /// Paused or cut off (its last fault is not done).
    Faulted,
    /// Killed (or exited): an instance that must be reaped.
    Dead,
}

/// One node process, i.e. one instance id.
struct Life {
    id: String,
    slot: usize,
    rooms: Vec<String>,
    peers: u32,
    node: NodeProc,
    /// Its fault proxy or route while it lives (`None` once dead, and for a node of failover
    /// mode that uses the group's own URL).
    link: Option<Link>,
    phase: Phase,
    spawned: Instant,
    ready_at: Option<Instant>,
    cool_until: Instant,
    faults: Vec<Fault>,
    killed_at: Option<Instant>,
    /// Rooms it reported lost (`room_lost`, `reaped_self`).
    lost: BTreeSet<String>,
    /// Arrival times of its `reaped_self` events.
    reaped_self: Vec<Instant>,
    log: PathBuf,
    /// Which life of its instance id this is (1 = the first; more when a refill reused it).
    incarnation: u32,
    /// Pool rooms it reported lost (legal: pool rooms move between instances).
    pool_lost: u32,
    /// Its last `churn_summary` line (cumulative counts).
    churn: Option<Value>,
    /// Replies its proxy lost so far (kept when the proxy is dropped).
    lost_replies: u64,
}

impl Life {
    fn live(&self) -> bool {
        self.killed_at.is_none()
    }

    fn current_fault(&self) -> Option<&Fault> {
        self.faults.last().filter(|f| !f.done)
    }

    fn kept_rooms(&self) -> impl Iterator<Item = &String> {
        self.rooms.iter().filter(|r| !self.lost.contains(*r))
    }

    fn longest_fault(&self) -> Duration {
        self.faults
            .iter()
            .map(|f| f.end.saturating_duration_since(f.start))
            .max()
            .unwrap_or_default()
    }

    /// Paused or cut off (requests or both ways) at `t`: it could not act on Redis then.
    fn incapable_at(&self, t: Instant) -> bool {
        self.faults.iter().any(|f| {
            f.contains(t)
                && matches!(
                    f.kind,
                    Kind::Stop | Kind::Blackhole(Direction::Upstream | Direction::Both)
                )
        })
    }

    fn stopped_at(&self, t: Instant) -> bool {
        self.faults
            .iter()
            .any(|f| f.kind == Kind::Stop && f.contains(t))
    }

    fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

/// One line of a node's stdout, stamped when it arrived.
#[derive(Debug, Clone)]
struct Ev {
    at: Instant,
    /// The process (life) that printed it.
    life: usize,
    id: String,
    v: Value,
}

impl Ev {
    fn is(&self, name: &str) -> bool {
        self.v["event"] == name
    }
}

/// A leadership term as seen from outside: from the `leader_acquired` event's arrival to the
/// `leader_lost` event's arrival (or the kill).
#[derive(Debug, Clone)]
struct Term {
    life: usize,
    epoch: u64,
    start: Instant,
    end: Option<Instant>,
    how: String,
}

/// `kill -<sig> <pid>`, never panicking (used in `Drop` too).
fn sig(pid: u32, name: &str) -> bool {
    Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// The value of flag `name` in `procs::FAST`, ms.
fn fast_flag(name: &str) -> Duration {
    let i = FAST.iter().position(|f| *f == name).expect("flag in FAST");
    ms(FAST[i + 1].parse().expect("number"))
}

/// Everything missing or wrong in what `life` must own now: its registration; for each room
/// it did not report lost, the pin and metadata name it, its peer records name it and their
/// guests, the room's peer set holds exactly those peers; the records naming it are exactly
/// those (no other room's). Ids here are plain `[a-z0-9-]`: wire form = id.
///
/// Whether its room index, guest pointers and sets agree with those records (invariant 4) is
/// the audit's one consistency scan (`scan`, [`sfu_redis::ops::audit::scan`]): every problem it
/// found at this life's keys (heartbeat key, room index, its rooms' keys) is one here. With the
/// ownership above, a clean scan means its room index holds exactly its rooms and reaches its
/// records, and each guest points at its peer.
fn owned_problems(
    ks: &KeySpace,
    dump: &BTreeMap<String, Val>,
    scan: &[Problem],
    life: &Life,
) -> Vec<String> {
    let id = life.id.as_str();
    let mut p = registration_problems(ks, dump, id);
    let kept: BTreeSet<String> = life.kept_rooms().cloned().collect();
    let mut want_records = BTreeSet::new();
    for r in &kept {
        p.extend(room_problems(ks, dump, life, r));
        want_records.extend((1..=life.peers).map(|k| ks.peer(r, &format!("{r}-p{k}"))));
    }
    // Outside the churn pool (whose records come and go).
    let named: BTreeSet<String> = dump
        .iter()
        .filter(|(k, v)| {
            matches!(ks.parse(k), Some(ParsedKey::Peer(r, _)) if !is_pool(&r))
                && matches!(v, Val::Hash(h) if h.get("instance").map(String::as_str) == Some(id))
        })
        .map(|(k, _)| k.clone())
        .collect();
    if named != want_records {
        p.push(format!(
            "{id}: the records naming it outside the pool are {named:?}, expected {want_records:?}"
        ));
    }
    for pr in scan.iter().filter(|pr| at_life_key(ks, &pr.key, id, &kept)) {
        p.push(format!("{id}: {} at {}: {}", pr.kind, pr.key, pr.detail));
    }
    p
}

/// Invariant 4, exactly, for live instance `id`, from the dump alone (besides the audit), with
/// key schema version 2's one index per instance: every member of its room index is a room
/// whose pin AND metadata name it; every room whose pin or metadata names it is in its room
/// index; every peer record naming it lies in a room of its room index (so, with the first
/// rule, in a room it owns: only a room's owner writes records into it, and an instance that
/// lost a room deletes its records there before the room leaves its index); and no room index
/// of it is moved aside (a reap of a live instance ends `alive`, its registration merged the
/// moved index back). (The audit's `dangling_room_index` / `unindexed_room` judge a room by its
/// pin, else its metadata, and report a pin and metadata that disagree as `malformed_value`;
/// here both must name it.) Ids here are plain: wire form = id.
fn index_problems(ks: &KeySpace, dump: &BTreeMap<String, Val>, id: &str) -> Vec<String> {
    let set = |k: &str| match dump.get(k) {
        Some(Val::Set(v)) => v.clone(),
        _ => BTreeSet::new(),
    };
    let room_index = set(&ks.instance_rooms(id));
    let mut p = Vec::new();
    let mut owned = BTreeSet::new();
    let mut named = BTreeSet::new();
    for (k, v) in dump {
        match (ks.parse(k), v) {
            (Some(ParsedKey::RoomOwner(r)), Val::Str(o)) if o == id => {
                owned.insert(r);
            }
            (Some(ParsedKey::RoomMeta(r)), Val::Hash(h))
                if h.get("owner").map(String::as_str) == Some(id) =>
            {
                owned.insert(r);
            }
            (Some(ParsedKey::Peer(r, peer)), Val::Hash(h))
                if h.get("instance").map(String::as_str) == Some(id) =>
            {
                named.insert((r, peer));
            }
            _ => {}
        }
    }
    for r in &room_index {
        let rk = ks.room(r);
        let pin = match dump.get(&rk.owner) {
            Some(Val::Str(v)) => Some(v.as_str()),
            _ => None,
        };
        let meta = match dump.get(&rk.meta) {
            Some(Val::Hash(h)) => h.get("owner").map(String::as_str),
            _ => None,
        };
        if pin != Some(id) || meta != Some(id) {
            p.push(format!(
                "invariant 4: {id}'s room index holds {r}, whose pin is {pin:?} and metadata owner {meta:?}"
            ));
        }
    }
    for r in owned.difference(&room_index) {
        p.push(format!(
            "invariant 4: room {r} (pin or metadata names {id}) is not in {id}'s room index"
        ));
    }
    for (r, peer) in &named {
        if !room_index.contains(r) {
            p.push(format!(
                "invariants 2 and 4: peer record {r}/{peer} names {id}, but room {r} is not in {id}'s room index (no reap of {id} would reach it)"
            ));
        }
    }
    let moved = set(&ks.instance_reaping_rooms(id));
    if !moved.is_empty() || dump.contains_key(&ks.instance_reaping(id)) {
        p.push(format!(
            "{id} is live, yet a reap's moved room index {moved:?} (or its token) is left"
        ));
    }
    p
}

/// What an earlier registration of live instance `id` (an earlier life of a reused id, or the
/// same process before it was reaped as a zombie and registered again) left behind, from the
/// dump: a peer record naming `id` written (`updated_ms`), or a room whose metadata names `id`
/// pinned (`pinned_ms`), before the current registration (`started_ms` of its info hash,
/// server ms; a registration comes before any write of its life, and a restore after data
/// loss keeps `started_ms` and writes its records and pins anew). After a reap, or the new
/// registration's clean-up of its earlier life, nothing may name that earlier life (invariant
/// 2). Empty when the info hash (or its `started_ms`) is missing: `registration_problems`
/// and the audit report that.
fn earlier_life_problems(ks: &KeySpace, dump: &BTreeMap<String, Val>, id: &str) -> Vec<String> {
    let Some(started) = (match dump.get(&ks.instance_info(id)) {
        Some(Val::Hash(h)) => h.get("started_ms").and_then(|v| v.parse::<i64>().ok()),
        _ => None,
    }) else {
        return Vec::new();
    };
    let before = |h: &BTreeMap<String, String>, f: &str| {
        h.get(f)
            .and_then(|v| v.parse::<i64>().ok())
            .map_or(true, |t| t < started)
    };
    let mut p = Vec::new();
    for (k, v) in dump {
        let Val::Hash(h) = v else { continue };
        let what = match ks.parse(k) {
            Some(ParsedKey::Peer(..))
                if h.get("instance").map(String::as_str) == Some(id) && before(h, "updated_ms") =>
            {
                "written"
            }
            Some(ParsedKey::RoomMeta(_))
                if h.get("owner").map(String::as_str) == Some(id) && before(h, "pinned_ms") =>
            {
                "pinned"
            }
            _ => continue,
        };
        p.push(format!(
            "invariant 2: {k} names {id} and was {what} before its registration at {started} ms (an earlier life's): {h:?}"
        ));
    }
    p
}

/// A room of the churn pool.
fn is_pool(room: &str) -> bool {
    room.starts_with("pool-")
}

fn pool() -> Vec<String> {
    (1..=POOL).map(|k| format!("pool-{k:02}")).collect()
}

/// Its heartbeat key exists and it is in the sorted set with a score above 0.
fn registration_problems(ks: &KeySpace, dump: &BTreeMap<String, Val>, id: &str) -> Vec<String> {
    let mut p = Vec::new();
    if !matches!(dump.get(&ks.heartbeat(id)), Some(Val::Str(_))) {
        p.push(format!("{id}: no heartbeat key"));
    }
    match dump.get(&ks.heartbeats()) {
        Some(Val::ZSet(z)) if z.iter().any(|(m, s)| m == id && *s > 0) => {}
        _ => p.push(format!(
            "{id}: not in the heartbeats sorted set (or score 0)"
        )),
    }
    p
}

/// Room `r` of `life`: pin and metadata name it, its peer records name it and their guests,
/// the room's peer set holds exactly its peers.
fn room_problems(ks: &KeySpace, dump: &BTreeMap<String, Val>, life: &Life, r: &str) -> Vec<String> {
    let id = life.id.as_str();
    let hash = |k: &str| match dump.get(k) {
        Some(Val::Hash(h)) => h.clone(),
        _ => BTreeMap::new(),
    };
    let mut p = Vec::new();
    let rk = ks.room(r);
    let pin = match dump.get(&rk.owner) {
        Some(Val::Str(v)) => Some(v.clone()),
        _ => None,
    };
    if pin.as_deref() != Some(id) {
        p.push(format!("{id}: room {r}: pin is {pin:?}"));
    }
    let meta = hash(&rk.meta);
    if meta.get("owner").map(String::as_str) != Some(id) {
        p.push(format!("{id}: room {r}: metadata is {meta:?}"));
    }
    let mut want_peers = BTreeSet::new();
    for k in 1..=life.peers {
        let (peer, guest) = (format!("{r}-p{k}"), format!("{r}-g{k}"));
        let rec = hash(&ks.peer(r, &peer));
        if rec.get("instance").map(String::as_str) != Some(id) || rec.get("guest") != Some(&guest) {
            p.push(format!("{id}: room {r}: peer record {peer} is {rec:?}"));
        }
        want_peers.insert(peer);
    }
    let got_peers = match dump.get(&rk.peers) {
        Some(Val::Set(v)) => v.clone(),
        _ => BTreeSet::new(),
    };
    if got_peers != want_peers {
        p.push(format!("{id}: room {r}: peer set is {got_peers:?}"));
    }
    p
}

/// True for a key of instance `id` (heartbeat key, room index live or moved aside, reap token,
/// info hash) or of one of its `rooms` (any room key, peer records included).
fn at_life_key(ks: &KeySpace, key: &str, id: &str, rooms: &BTreeSet<String>) -> bool {
    ks.parse(key)
        .is_some_and(|k| k.instance() == Some(id) || k.room().is_some_and(|r| rooms.contains(r)))
}

struct Chaos {
    lives: Vec<Life>,
    backend: Backend,
    ks: KeySpace,
    t: Timings,
    checker: Config,
    rng: fastrand::Rng,
    seed: u64,
    secs: u64,
    tx: mpsc::Sender<Ev>,
    rx: mpsc::Receiver<Ev>,
    events: Vec<Ev>,
    by_id: HashMap<String, usize>,
    slot_life: [Option<usize>; SLOTS],
    respawn_at: [Option<Instant>; SLOTS],
    next_n: u32,
    dir: PathBuf,
    start: Instant,
    kills: u32,
    stops: u32,
    blackholes: u32,
    restarts: u32,
    spawn_failures: u32,
    /// When the restart began and when the new server answered.
    restart: Option<(Instant, Instant)>,
    restore_pending: Vec<usize>,
    restore_times: Vec<(String, Duration)>,
    /// What the restore watch measures from: the restart's end or a failover's switch; with
    /// a failover, the new master's clock (ms) then, which a node's heartbeat score there must
    /// pass (it heartbeats on the new master).
    restore_since: Option<(Instant, Option<i64>)>,
    /// How long a node may take to restore after `restore_since`.
    restore_limit: Duration,
    /// When the restores pending must be done; `None` while not known yet (after a
    /// `SENTINEL FAILOVER` switch: `restore_limit` after the group is healthy again, i.e. the
    /// old master demoted; until then a node whose connections to it still work has no sign
    /// of the switch, and keeps writing there).
    restore_deadline: Option<Instant>,
    /// The port of the data node the probe is connected to (failover mode).
    probe_port: Option<u16>,
    hold_until: Instant,
    leader_now: Option<String>,
    probe: Option<sfu_redis::ops::conn::Conn>,
    next_sample: Instant,
    next_status: Instant,
    max_epoch_sampled: u64,
    samples: u32,
    status_samples: u32,
    status_errors: u32,
    violations: Vec<(Option<usize>, String)>,
    notes: Vec<String>,
    /// The fault period, which is the churn window: from the moment the first fleet is ready
    /// (`start_fleet`) for `secs`; refills churn until its end. `None` before.
    churn_from: Instant,
    churn_end: Option<Instant>,
    /// The id a slot's next refill reuses (set by some kills).
    reuse_id: [Option<String>; SLOTS],
    /// Lives so far per instance id.
    incarnations: HashMap<String, u32>,
    reuses: u32,
    reply_losses_armed: u32,
    /// Reaps of live nodes that a failover undid (failover mode; notes).
    reaps_undone: usize,
}

impl Drop for Chaos {
    fn drop(&mut self) {
        // Paused processes are continued before they are killed (NodeProc's Drop kills).
        for l in &self.lives {
            if l.live() && l.current_fault().is_some_and(|f| f.kind == Kind::Stop) {
                sig(l.node.pid(), "CONT");
            }
        }
        for l in &mut self.lives {
            let _ = l.node.child.kill();
            let _ = l.node.child.wait();
        }
        // A failover thread holds the group: wait for it (its steps are bounded), so that the
        // group's processes are killed on drop rather than left behind.
        if let Backend::Sentinel(b) = &mut self.backend {
            if let Some(h) = b.job.as_mut().and_then(|j| j.handle.take()) {
                b.group = h.join().ok();
            }
        }
        if std::thread::panicking() || !self.violations.is_empty() {
            eprintln!("chaos: node logs kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Chaos {
    fn new(backend: Backend, seed: u64, secs: u64) -> Chaos {
        let t = Timings::fast();
        // The node processes run procs::FAST; this test reasons with Timings::fast().
        assert_eq!(fast_flag("--heartbeat-interval-ms"), t.heartbeat_interval);
        assert_eq!(fast_flag("--heartbeat-ttl-ms"), t.heartbeat_ttl);
        assert_eq!(fast_flag("--lease-ttl-ms"), t.lease_ttl);
        assert_eq!(fast_flag("--lease-refresh-ms"), t.lease_refresh);
        assert_eq!(fast_flag("--two-phase-delay-ms"), t.two_phase_delay);
        assert_eq!(fast_flag("--reap-interval-ms"), t.reap_interval);
        assert_eq!(fast_flag("--command-timeout-ms"), t.command_timeout);
        // A short fault plus the reconnect after it (a timed-out call, one backoff) must stay
        // well inside what it takes to be reaped (no heartbeat for stale + two-phase).
        assert!(
            ms(SHORT.1) + t.command_timeout + t.heartbeat_interval + ms(500)
                <= t.stale_threshold + t.two_phase_delay
        );
        assert!(ms(LONG.0) >= reap_window(&t));
        let dir =
            std::env::temp_dir().join(format!("sfu-chaos-{}-{seed:016x}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create log dir");
        let (tx, rx) = mpsc::channel();
        let now = Instant::now();
        let url = match &backend {
            Backend::Single(s) => s.url(),
            Backend::Sentinel(b) => b.url.clone(),
        };
        let checker = config_for(&url, STAGE, "chaos-checker", t);
        // Two ticks plus one command timeout, and a second of scheduling slack (loaded CI);
        // after a failover one more command timeout (a call to the old master times out
        // before the node asks the sentinels again) and one more second (the discovery: a
        // sentinel, then `ROLE` on the master it names).
        let restore_limit = match &backend {
            Backend::Single(_) => t.heartbeat_interval * 2 + t.command_timeout + ms(1_000),
            Backend::Sentinel(_) => t.heartbeat_interval * 2 + t.command_timeout * 2 + ms(2_000),
        };
        Chaos {
            lives: Vec::new(),
            ks: support::ks(STAGE),
            backend,
            t,
            checker,
            rng: fastrand::Rng::with_seed(seed),
            seed,
            secs,
            tx,
            rx,
            events: Vec::new(),
            by_id: HashMap::new(),
            slot_life: [None; SLOTS],
            respawn_at: [None; SLOTS],
            next_n: 0,
            dir,
            start: now,
            kills: 0,
            stops: 0,
            blackholes: 0,
            restarts: 0,
            spawn_failures: 0,
            restart: None,
            restore_pending: Vec::new(),
            restore_times: Vec::new(),
            restore_since: None,
            restore_limit,
            restore_deadline: None,
            probe_port: None,
            hold_until: now,
            leader_now: None,
            probe: None,
            next_sample: now,
            next_status: now,
            max_epoch_sampled: 0,
            samples: 0,
            status_samples: 0,
            status_errors: 0,
            violations: Vec::new(),
            notes: Vec::new(),
            churn_from: now,
            churn_end: None,
            reuse_id: Default::default(),
            incarnations: HashMap::new(),
            reuses: 0,
            reply_losses_armed: 0,
            reaps_undone: 0,
        }
    }

    fn say(&self, msg: &str) {
        eprintln!("[{:8.2}s] {msg}", self.start.elapsed().as_secs_f64());
    }

    fn violation(&mut self, life: Option<usize>, msg: String) {
        self.say(&format!("VIOLATION: {msg}"));
        self.violations.push((life, msg));
    }

    fn note(&mut self, msg: String) {
        self.say(&format!("note: {msg}"));
        self.notes.push(msg);
    }

    fn faults(&self) -> u32 {
        self.kills + self.stops + self.blackholes + self.restarts
    }

    /// A direct connection to Redis for sampling and dumps (not through any proxy); in
    /// failover mode to the master the sentinels name now (asked each time; a connection to
    /// an earlier master is dropped).
    fn probe(&mut self) -> Option<&mut sfu_redis::ops::conn::Conn> {
        let url = match &mut self.backend {
            Backend::Single(s) => s.url(),
            Backend::Sentinel(b) => {
                let port = b.ask_master()?;
                if self.probe_port != Some(port) {
                    self.probe = None;
                    self.probe_port = Some(port);
                }
                format!("redis://127.0.0.1:{port}")
            }
        };
        if self.probe.is_none() {
            let con = sfu_redis::ops::conn::Redis::new(&url, Duration::from_secs(2))
                .ok()?
                .connect()
                .ok()?;
            self.probe = Some(con);
        }
        self.probe.as_mut()
    }

    fn dump(&mut self) -> Option<BTreeMap<String, Val>> {
        let pattern = self.ks.scan_pattern();
        let con = self.probe()?;
        match sfu_redis_testkit::data::dump(con, &pattern) {
            Ok(d) => Some(d),
            Err(_) => {
                self.probe = None;
                None
            }
        }
    }

    /// Every key with its content, then one consistency scan of the audit
    /// ([`audit::scan`]); `None` when Redis cannot be read right now.
    fn view(&mut self) -> Option<(BTreeMap<String, Val>, Vec<Problem>)> {
        let dump = self.dump()?;
        let ks = self.ks.clone();
        let con = self.probe()?;
        match audit::scan(&ks, con) {
            Ok(scan) => Some((dump, scan)),
            Err(_) => {
                self.probe = None;
                None
            }
        }
    }

    // ---- processes ----------------------------------------------------------------------

    fn spawn(&mut self, slot: usize) -> usize {
        let id = match self.reuse_id[slot].take() {
            Some(id) => {
                self.reuses += 1;
                id
            }
            None => {
                self.next_n += 1;
                format!("s{slot}-{:04}", self.next_n)
            }
        };
        let incarnation = {
            let n = self.incarnations.entry(id.clone()).or_insert(0);
            *n += 1;
            *n
        };
        let nrooms = self.rng.usize(3..=5);
        let peers = self.rng.u32(2..=4);
        // Distinct per life (no room name is a substring of another life's).
        let rooms: Vec<String> = (1..=nrooms)
            .map(|k| format!("{id}-v{incarnation}-r{k}"))
            .collect();
        let link = match &self.backend {
            Backend::Single(s) => Some(Link::Proxy(s.proxy())),
            Backend::Sentinel(_) if slot < DIRECT_SLOTS => None,
            Backend::Sentinel(b) => Some(Link::Route(
                FaultRoute::start(&b.sentinel_ports, &b.data_ports, &b.master_name)
                    .expect("start a fault route"),
            )),
        };
        let url = match (&link, &self.backend) {
            (Some(l), _) => l.url(),
            (None, Backend::Sentinel(b)) => b.url.clone(),
            (None, Backend::Single(_)) => unreachable!("single-server nodes have a proxy"),
        };
        let log = self.dir.join(format!("{id}-v{incarnation}.log"));
        let stderr = File::create(&log).expect("create node log");
        let mut cmd = Command::new(support::procs::cli_bin());
        cmd.args(["node", "--json", "--stage", STAGE, "--instance-id", &id])
            .args(["--redis-url", &url])
            .args(["--peers-per-room", &peers.to_string()])
            .args(["--rooms", &rooms.join(",")])
            .args(FAST);
        // Churn over the shared pool until the end of the fault period (a refill spawned
        // mid-period churns for the time left). The first fleet is spawned before the period
        // starts (it starts when they are ready, `start_fleet`): each churns for the whole
        // period from its own `ready`.
        let churn_ms = self.churn_end.map_or(self.secs * 1_000, |end| {
            end.saturating_duration_since(Instant::now()).as_millis() as u64
        });
        if churn_ms >= 500 {
            cmd.args(["--churn-rooms", &pool().join(",")])
                .args(["--churn-for-ms", &churn_ms.to_string()])
                .args(["--churn-seed", &self.rng.u64(..).to_string()]);
        }
        let mut child = cmd
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .spawn()
            .expect("spawn sfu-redis node");
        let stdout = child.stdout.take().expect("stdout");
        let tx = self.tx.clone();
        let name = id.clone();
        let life = self.lives.len();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let at = Instant::now();
                let v = serde_json::from_str(&line)
                    .unwrap_or_else(|_| json!({ "event": "not_json", "line": line }));
                if tx
                    .send(Ev {
                        at,
                        life,
                        id: name.clone(),
                        v,
                    })
                    .is_err()
                {
                    break;
                }
            }
        });
        let now = Instant::now();
        let li = self.lives.len();
        self.lives.push(Life {
            id: id.clone(),
            slot,
            rooms: rooms.clone(),
            peers,
            node: NodeProc {
                id: id.clone(),
                rooms,
                child,
            },
            link,
            phase: Phase::Spawning,
            spawned: now,
            ready_at: None,
            cool_until: now,
            faults: Vec::new(),
            killed_at: None,
            lost: BTreeSet::new(),
            reaped_self: Vec::new(),
            log,
            incarnation,
            pool_lost: 0,
            churn: None,
            lost_replies: 0,
        });
        self.by_id.insert(id.clone(), li);
        self.slot_life[slot] = Some(li);
        self.respawn_at[slot] = None;
        let path = match (&self.backend, &self.lives[li].link) {
            (Backend::Single(_), _) => "",
            (Backend::Sentinel(_), Some(_)) => ", through its fault route",
            (Backend::Sentinel(_), None) => ", the group's URL",
        };
        self.say(&format!(
            "spawn {id}{} (slot {slot}, {nrooms} rooms x {peers} peers{path}{})",
            if incarnation > 1 {
                format!(" (life {incarnation} of this id)")
            } else {
                String::new()
            },
            if churn_ms >= 500 {
                format!(", churning {churn_ms} ms")
            } else {
                String::new()
            }
        ));
        li
    }

    /// The process is gone (kill -9 or exit): the instance must be reaped; the slot is
    /// refilled after `respawn_in`.
    fn mark_dead(&mut self, li: usize, now: Instant, respawn_in: Duration) {
        let l = &mut self.lives[li];
        if let Some(f) = l.faults.last_mut().filter(|f| !f.done) {
            f.end = now;
            f.done = true;
        }
        l.killed_at = Some(now);
        l.phase = Phase::Dead;
        if let Some(p) = l.link.take() {
            l.lost_replies = p.replies_lost();
        }
        let slot = l.slot;
        if self.leader_now.as_deref() == Some(l.id.as_str()) {
            self.leader_now = None;
        }
        if self.slot_life[slot] == Some(li) {
            self.slot_life[slot] = None;
            self.respawn_at[slot] = Some(now + respawn_in);
        }
    }

    fn kill9(&mut self, li: usize) {
        let l = &mut self.lives[li];
        let _ = l.node.child.kill();
        let _ = l.node.child.wait();
        let was = match l.phase {
            Phase::Faulted => format!(" (while {})", l.current_fault().unwrap().kind.name()),
            _ => String::new(),
        };
        let id = l.id.clone();
        let leader = self.leader_now.as_deref() == Some(id.as_str());
        let respawn = ms(self.rng.u64(500..=3_000));
        let slot = self.lives[li].slot;
        self.mark_dead(li, Instant::now(), respawn);
        self.kills += 1;
        // The refill of this slot reuses the id now and then (a restarted process with a
        // stable id: it waits for the old heartbeat key to expire, then clears the old life).
        if self.slot_life[slot].is_none() && self.rng.u32(0..100) < REUSE_PCT {
            self.reuse_id[slot] = Some(id.clone());
        }
        self.say(&format!(
            "kill -9 {id}{}{was}",
            if leader { " (leader)" } else { "" }
        ));
    }

    fn begin_fault(&mut self, li: usize, kind: Kind, dur: Duration) {
        let leader = self.leader_now.as_deref() == Some(self.lives[li].id.as_str());
        let l = &mut self.lives[li];
        let now = Instant::now();
        match kind {
            Kind::Stop => {
                if !sig(l.node.pid(), "STOP") {
                    return;
                }
                self.stops += 1;
            }
            Kind::Blackhole(d) => {
                l.link
                    .as_ref()
                    .expect("a live node with a link")
                    .blackhole(d);
                self.blackholes += 1;
            }
        }
        l.faults.push(Fault {
            kind,
            start: now,
            end: now + dur,
            done: false,
        });
        l.phase = Phase::Faulted;
        let id = l.id.clone();
        self.say(&format!(
            "{} {id}{} for {:.2}s",
            kind.name(),
            if leader { " (leader)" } else { "" },
            dur.as_secs_f64()
        ));
    }

    fn end_fault(&mut self, li: usize) {
        let now = Instant::now();
        let l = &mut self.lives[li];
        let Some(f) = l.faults.last_mut().filter(|f| !f.done) else {
            return;
        };
        match f.kind {
            Kind::Stop => {
                sig(l.node.pid(), "CONT");
            }
            Kind::Blackhole(_) => {
                if let Some(p) = &l.link {
                    p.heal();
                }
            }
        }
        // Recorded after the heal: the recorded span covers the real one.
        f.end = Instant::now().max(now);
        f.done = true;
        l.phase = Phase::Running;
        l.cool_until = f.end + COOL_DOWN;
    }

    fn disrupted(&self) -> usize {
        self.slot_life
            .iter()
            .filter(|s| match s {
                None => true,
                Some(li) => self.lives[*li].phase != Phase::Running,
            })
            .count()
    }

    fn current(&self) -> Vec<usize> {
        self.slot_life.iter().flatten().copied().collect()
    }

    // ---- events -------------------------------------------------------------------------

    fn pump(&mut self, wait: Duration) {
        let mut batch: Vec<Ev> = self.rx.recv_timeout(wait).ok().into_iter().collect();
        batch.extend(self.rx.try_iter());
        for e in batch {
            self.on_event(e);
        }
    }

    fn on_event(&mut self, e: Ev) {
        let li = e.life;
        if e.v["instance"] != e.id.as_str() {
            self.violation(
                Some(li),
                format!("{}: event of another instance: {}", e.id, e.v),
            );
        }
        let id = e.id.clone();
        match e.v["event"].as_str().unwrap_or("") {
            "ready" => {
                let l = &mut self.lives[li];
                l.ready_at = Some(e.at);
                if l.phase == Phase::Spawning {
                    l.phase = Phase::Running;
                }
                let (rooms, peers) = (
                    l.rooms.len() as u64,
                    l.rooms.len() as u64 * u64::from(l.peers),
                );
                let took = e.at - l.spawned;
                if e.v["rooms"] != rooms || e.v["peers"] != peers {
                    self.violation(
                        Some(li),
                        format!(
                            "{id}: ready with {}, expected {rooms} rooms and {peers} peers",
                            e.v
                        ),
                    );
                }
                self.say(&format!("{id} ready after {:.2}s", took.as_secs_f64()));
            }
            "leader_acquired" => {
                self.leader_now = Some(id.clone());
                self.say(&format!("{id} leads, epoch {}", e.v["epoch"]));
            }
            "leader_lost" => {
                if self.leader_now.as_deref() == Some(id.as_str()) {
                    self.leader_now = None;
                }
                self.say(&format!("{id} lost the lead: {}", e.v["reason"]));
            }
            "instance_reaped" => {
                self.say(&format!(
                    "{id} reaped {} ({} rooms, {} peers, {} skipped)",
                    e.v["dead"], e.v["rooms"], e.v["peers"], e.v["skipped_rooms"]
                ));
            }
            "candidates" => {}
            // A start-up that failed (its master killed in a failover, say) ends with a clean
            // stop, then exit 1: check_processes notes the exit as a spawn failure. A node that
            // was ready never stops on its own (the run ends with kill -9).
            "stopped" if self.lives[li].phase == Phase::Spawning => {}
            "churn_summary" => {
                if e.v["done"] == true {
                    self.say(&format!(
                        "{id} stopped churning: {} ops, {} errors",
                        e.v["ops"], e.v["errors"]
                    ));
                }
                self.lives[li].churn = Some(e.v.clone());
                return;
            }
            "room_lost" => {
                let room = e.v["room"].as_str().unwrap_or_default().to_owned();
                let l = &mut self.lives[li];
                if is_pool(&room) {
                    // Pool rooms move: taken over while this node was paused or cut off.
                    l.pool_lost += 1;
                } else if !l.rooms.contains(&room) {
                    self.violation(Some(li), format!("{id}: lost a room it never had: {}", e.v));
                } else if l.lost.insert(room.clone()) {
                    // Not part of a reaped_self report (that one lists the room first). Here
                    // nobody else ever pins a node's rooms and no host closes one, so a room
                    // lost by an instance that was not reaped is a room of a live instance lost.
                    self.violation(
                        Some(li),
                        format!(
                            "{id} lost room {room} without being reaped (new owner {}): a live instance's room is gone",
                            e.v["new_owner"]
                        ),
                    );
                }
            }
            "reaped_self" => {
                let l = &mut self.lives[li];
                let held: BTreeSet<String> = l.kept_rooms().cloned().collect();
                let all: BTreeSet<String> = e.v["room_ids"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|r| r.as_str().map(str::to_owned))
                    .collect();
                // Its fixed rooms must all be reported; pool rooms it held then may be too.
                let (pool_rooms, reported): (BTreeSet<String>, BTreeSet<String>) =
                    all.iter().cloned().partition(|r| is_pool(r));
                l.lost.extend(reported.iter().cloned());
                l.pool_lost += pool_rooms.len() as u32;
                l.reaped_self.push(e.at);
                if reported != held || e.v["rooms"] != all.len() {
                    self.violation(
                        Some(li),
                        format!("{id}: reaped_self reports {}, but it held {held:?}", e.v),
                    );
                }
                self.say(&format!(
                    "{id} found it was reaped (zombie): {} rooms lost",
                    reported.len()
                ));
            }
            other => {
                self.violation(
                    Some(li),
                    format!("{id}: unexpected output ({other}): {}", e.v),
                );
            }
        }
        self.events.push(e);
    }

    // ---- the loop -----------------------------------------------------------------------

    /// One turn: events, due fault ends, exits, respawns, the restore watch, samples.
    fn step(&mut self) {
        self.pump(ms(20));
        let now = Instant::now();
        for li in self.current() {
            if self.lives[li].current_fault().is_some_and(|f| f.end <= now) {
                self.end_fault(li);
            }
        }
        self.check_processes();
        for slot in 0..SLOTS {
            if self.slot_life[slot].is_none()
                && self.respawn_at[slot].is_some_and(|t| t <= Instant::now())
            {
                self.spawn(slot);
            }
        }
        self.poll_failover();
        self.watch_restore();
        self.sample();
    }

    fn check_processes(&mut self) {
        for li in self.current() {
            let now = Instant::now();
            let exited = self.lives[li].node.child.try_wait().ok().flatten();
            let l = &self.lives[li];
            if let Some(status) = exited {
                let (id, tail) = (l.id.clone(), l.log_tail(20));
                if l.phase == Phase::Spawning {
                    self.spawn_failures += 1;
                    self.note(format!("{id} exited during start-up ({status}):\n{tail}"));
                } else {
                    self.violation(
                        Some(li),
                        format!("{id} exited on its own ({status}):\n{tail}"),
                    );
                }
                self.mark_dead(li, now, ms(1_000));
            } else if l.phase == Phase::Spawning && now - l.spawned > READY_WITHIN {
                let id = l.id.clone();
                self.violation(Some(li), format!("{id} not ready within {READY_WITHIN:?}"));
                let _ = self.lives[li].node.child.kill();
                let _ = self.lives[li].node.child.wait();
                self.mark_dead(li, now, ms(1_000));
            }
        }
    }

    /// Samples the lease key and the epoch counter (every 250 ms) and `fleet_status` (every
    /// second).
    fn sample(&mut self) {
        let now = Instant::now();
        // Until the switch, the master may be stopped or gone: nothing to read.
        if self.switch_pending() {
            return;
        }
        let in_restart = self.loss_windows().iter().any(|(began, back)| {
            now >= *began && now <= *back + self.t.lease_ttl + Duration::from_secs(2)
        });
        if now >= self.next_sample {
            self.next_sample = now + ms(250);
            let (leader_key, epoch_key) = (self.ks.leader(), self.ks.epoch());
            let read = self.probe().map(|con| {
                redis::pipe()
                    .get(&leader_key)
                    .get(&epoch_key)
                    .query::<(Option<String>, Option<u64>)>(con)
            });
            match read {
                Some(Ok((holder, epoch))) => {
                    self.samples += 1;
                    if let Some(h) = holder.filter(|h| !self.by_id.contains_key(h)) {
                        self.violation(
                            None,
                            format!("the lease key holds {h:?}, not a known instance"),
                        );
                    }
                    let epoch = epoch.unwrap_or(0);
                    if !in_restart && epoch < self.max_epoch_sampled {
                        let max = self.max_epoch_sampled;
                        self.violation(
                            None,
                            format!("the epoch counter went back from {max} to {epoch}"),
                        );
                    }
                    if !in_restart {
                        self.max_epoch_sampled = self.max_epoch_sampled.max(epoch);
                    }
                }
                Some(Err(_)) => self.probe = None,
                None => {}
            }
        }
        if now >= self.next_status {
            self.next_status = now + ms(1_000);
            match fleet_status(&self.checker) {
                Ok(st) => {
                    self.status_samples += 1;
                    if let Some(h) = st.leader.as_ref().filter(|h| !self.by_id.contains_key(*h)) {
                        self.violation(
                            None,
                            format!("status names leader {h:?}, not a known instance"),
                        );
                    }
                    if !st.is_clean() {
                        self.violation(None, format!("status reports problems: {}", st.to_json()));
                    }
                }
                Err(e) => {
                    self.status_errors += 1;
                    if !in_restart {
                        self.note(format!(
                            "fleet_status failed outside the restart and failovers: {e}"
                        ));
                    }
                }
            }
        }
    }

    /// After the restart (or a failover's switch): each node that was running then must have
    /// written back its heartbeat, pins, indexes and peer records within a couple of ticks
    /// (after a switch: on the new master, its heartbeat there newer than the switch).
    fn watch_restore(&mut self) {
        if self.restore_pending.is_empty() {
            return;
        }
        let Some((back, since_ms)) = self.restore_since else {
            return;
        };
        let Some((dump, scan)) = self.view() else {
            return;
        };
        let now = Instant::now();
        let limit = self.restore_limit;
        let what = if since_ms.is_some() {
            "the master switch"
        } else {
            "the Redis restart"
        };
        let late = self.restore_deadline.is_some_and(|d| now > d);
        // What must be back is what the node holds: its registration, pins, metadata, records
        // and the room index entries that reach them (`unindexed_*`). Extra entries
        // (`dangling_*`: a room index entry whose pin never landed, from a churn pin around the
        // restart or the switch, index first, its pin's reply lost with the connection; a
        // room's peer or guest entry whose record went) are the index walk's to remove, one
        // page of the room index per tick (more than the restore's limit on a loaded machine:
        // a loaded run once saw one 1.8 s after a restart): invariant 4, checked exactly after
        // quiescence.
        let scan: Vec<Problem> = scan
            .into_iter()
            .filter(|p| {
                !matches!(
                    p.kind,
                    ProblemKind::DanglingRoomIndex
                        | ProblemKind::DanglingRoomPeer
                        | ProblemKind::DanglingGuest
                )
            })
            .collect();
        for li in std::mem::take(&mut self.restore_pending) {
            let l = &self.lives[li];
            if l.phase != Phase::Running {
                let id = l.id.clone();
                self.note(format!(
                    "{id} faulted before it restored; restore not timed"
                ));
                continue;
            }
            let mut problems = owned_problems(&self.ks, &dump, &scan, l);
            if let Some(since) = since_ms {
                let score = match dump.get(&self.ks.heartbeats()) {
                    Some(Val::ZSet(z)) => z.iter().find(|(m, _)| *m == l.id).map(|(_, s)| *s),
                    _ => None,
                };
                if !score.is_some_and(|s| s > since) {
                    problems.push(format!(
                        "{}: no heartbeat on the new master since the switch (score {score:?}, switch at {since} ms)",
                        l.id
                    ));
                }
            }
            if problems.is_empty() {
                let took = now - back;
                self.say(&format!("{} restored after {} ms", l.id, took.as_millis()));
                self.restore_times.push((l.id.clone(), took));
            } else if late {
                let id = l.id.clone();
                let after = if since_ms.is_some() {
                    format!(
                        "{} ms after {what} ({limit:?} after the old master stopped taking writes)",
                        (now - back).as_millis()
                    )
                } else {
                    format!("{limit:?} after {what}")
                };
                self.violation(
                    Some(li),
                    format!("{id} not restored {after}: {problems:#?}"),
                );
            } else {
                self.restore_pending.push(li);
            }
        }
    }

    fn restart_redis(&mut self) {
        let measured: Vec<usize> = self
            .current()
            .into_iter()
            .filter(|li| self.lives[*li].phase == Phase::Running)
            .collect();
        self.say("restart redis-server (no persistence: every key is lost)");
        let began = Instant::now();
        self.probe = None;
        let Backend::Single(s) = &mut self.backend else {
            unreachable!("the restart is a fault of the single-server run");
        };
        s.redis_mut().restart().expect("restart redis-server");
        let back = Instant::now();
        self.restarts += 1;
        self.restart = Some((began, back));
        self.restore_since = Some((back, None));
        self.restore_deadline = Some(back + self.restore_limit);
        self.restore_pending = measured;
        self.hold_until = back + Duration::from_secs(3);
        self.say(&format!(
            "redis-server back after {} ms",
            (back - began).as_millis()
        ));
    }

    // ---- failovers (failover mode) --------------------------------------------------------

    /// A failover runs and the sentinels have not named the new master yet.
    fn switch_pending(&self) -> bool {
        matches!(&self.backend, Backend::Sentinel(b) if b.job.as_ref().is_some_and(|j| j.switched.is_none()))
    }

    /// When Redis may have lost writes, `(began, back)`: the restart (every key), and each
    /// failover from its start until the group is healthy again (the last writes before the
    /// switch, and those the old master took until it was demoted or restarted, are lost), a
    /// running one until now.
    fn loss_windows(&self) -> Vec<(Instant, Instant)> {
        let mut w: Vec<(Instant, Instant)> = self.restart.into_iter().collect();
        w.extend(self.failover_windows());
        w
    }

    /// The failovers' part of [`Chaos::loss_windows`].
    fn failover_windows(&self) -> Vec<(Instant, Instant)> {
        let mut w = Vec::new();
        if let Backend::Sentinel(b) = &self.backend {
            w.extend(b.done.iter().map(|f| (f.started, f.settled)));
            if let Some(j) = &b.job {
                w.push((j.started, Instant::now()));
            }
        }
        w
    }

    /// A reap of live life `li` (event at `at`) that a failover undid: it ran while a failover
    /// was under way (within a second of its window: the reap's own time, event latency), so
    /// its writes went to the old master and were lost with it, and the node never noticed
    /// (its registration survived on the new master). Its data is checked as any live node's.
    fn reap_undone_by_failover(&self, li: usize, at: Instant) -> bool {
        let noticed = self.lives[li]
            .reaped_self
            .iter()
            .any(|t| *t + ms(2_000) > at);
        !noticed
            && self
                .failover_windows()
                .iter()
                .any(|(began, back)| at + ms(1_000) >= *began && at <= *back + ms(1_000))
    }

    fn failovers(&self) -> usize {
        match &self.backend {
            Backend::Sentinel(b) => b.done.len() + usize::from(b.job.is_some()),
            Backend::Single(_) => 0,
        }
    }

    /// Starts the next failover on its own thread (which takes the group until it is done).
    fn start_failover(&mut self) {
        let running: Vec<usize> = self
            .current()
            .into_iter()
            .filter(|li| self.lives[*li].phase == Phase::Running)
            .collect();
        let Backend::Sentinel(b) = &mut self.backend else {
            return;
        };
        if b.job.is_some() {
            return;
        }
        let Some(group) = b.group.take() else {
            return;
        };
        if b.queue.is_empty() {
            let mut round = [Failover::Command, Failover::Kill, Failover::Stop];
            self.rng.shuffle(&mut round);
            b.queue.extend(round);
        }
        let kind = b.queue.remove(0);
        let hold = match kind {
            Failover::Command => Duration::ZERO,
            Failover::Kill => ms(self.rng.u64(KILL_HOLD.0..=KILL_HOLD.1)),
            Failover::Stop => ms(self.rng.u64(STOP_HOLD.0..=STOP_HOLD.1)),
        };
        let (tx, rx) = mpsc::channel();
        let handle = std::thread::Builder::new()
            .name("chaos-failover".into())
            .spawn(move || run_failover(group, kind, hold, tx))
            .expect("spawn the failover thread");
        b.job = Some(Job {
            kind,
            started: Instant::now(),
            switched: None,
            old: None,
            new: None,
            running,
            rx,
            handle: Some(handle),
        });
        let leader = self.leader_now.clone().unwrap_or_else(|| "none".into());
        self.say(&format!(
            "failover {} of the master{} (leader {leader})",
            kind.name(),
            match kind {
                Failover::Command => String::new(),
                _ => format!(", back {} ms after the switch", hold.as_millis()),
            }
        ));
    }

    /// Handles what the failover thread reported: the switch starts the restore watch; the
    /// end gives the group back and schedules the next failover.
    fn poll_failover(&mut self) {
        let msgs: Vec<JobMsg> = match &self.backend {
            Backend::Sentinel(b) => b
                .job
                .as_ref()
                .map(|j| j.rx.try_iter().collect())
                .unwrap_or_default(),
            Backend::Single(_) => return,
        };
        for m in msgs {
            match m {
                JobMsg::Switched { at, old, new } => {
                    let Backend::Sentinel(b) = &mut self.backend else {
                        return;
                    };
                    let Some(j) = b.job.as_mut() else { return };
                    j.switched = Some(at);
                    j.old = Some(old);
                    j.new = Some(new);
                    let (kind, started, running) = (j.kind, j.started, j.running.clone());
                    // The new master's clock now: a node heartbeating there after the switch
                    // has a higher score.
                    self.probe = None;
                    let clock = self
                        .probe()
                        .and_then(|c| sfu_redis::ops::conn::server_time_ms(c).ok());
                    if self.probe_port != Some(new) {
                        self.note(format!(
                            "after the switch to {new} the checker reached {:?}",
                            self.probe_port
                        ));
                    }
                    self.say(&format!(
                        "failover {}: master {old} -> {new} after {} ms",
                        kind.name(),
                        (at - started).as_millis()
                    ));
                    if !self.restore_pending.is_empty() {
                        let ids: Vec<String> = self
                            .restore_pending
                            .iter()
                            .map(|li| self.lives[*li].id.clone())
                            .collect();
                        self.note(format!(
                            "a new switch while restores were pending: {ids:?} (not timed)"
                        ));
                    }
                    let still: Vec<usize> = running
                        .into_iter()
                        .filter(|li| self.lives[*li].phase == Phase::Running)
                        .collect();
                    match clock {
                        Some(ms_now) => {
                            self.restore_since = Some((at, Some(ms_now)));
                            self.restore_deadline =
                                (kind != Failover::Command).then_some(at + self.restore_limit);
                            self.restore_pending = still;
                        }
                        None => {
                            self.note(
                                "the new master's clock could not be read; restore not timed"
                                    .into(),
                            );
                            self.restore_pending.clear();
                        }
                    }
                }
                JobMsg::Note(n) => self.note(n),
                JobMsg::Done { at, result } => {
                    let Backend::Sentinel(b) = &mut self.backend else {
                        return;
                    };
                    let Some(mut j) = b.job.take() else { return };
                    b.group = j.handle.take().and_then(|h| h.join().ok());
                    if self.restore_deadline.is_none() {
                        // The old master is demoted now (the group is healthy).
                        self.restore_deadline = Some(at + self.restore_limit);
                    }
                    b.done.push(FailoverRecord {
                        kind: j.kind,
                        started: j.started,
                        switched: j.switched,
                        settled: at,
                        old: j.old,
                        new: j.new,
                    });
                    let gap = ms(self.rng.u64(FAILOVER_GAP.0..=FAILOVER_GAP.1));
                    b.next_at = Some((at + gap).max(j.started + FAILOVER_SPACING));
                    let lost_group = b.group.is_none();
                    match result {
                        Ok(true) => self.say(&format!(
                            "failover {}: group healthy {} ms after the start",
                            j.kind.name(),
                            (at - j.started).as_millis()
                        )),
                        Ok(false) => self.note(format!(
                            "failover {}: the sentinels accepted SENTINEL FAILOVER but did not carry it out; the group stayed healthy on its master",
                            j.kind.name()
                        )),
                        Err(e) => self.violation(None, format!("failover {}: {e}", j.kind.name())),
                    }
                    if lost_group {
                        panic!("the failover thread panicked (the group is gone)");
                    }
                }
            }
        }
    }

    /// Starts a failover when one is due (none running, the last one settled long enough
    /// ago).
    fn maybe_failover(&mut self, t0: Instant) {
        let now = Instant::now();
        let Backend::Sentinel(b) = &mut self.backend else {
            return;
        };
        if b.job.is_some() {
            return;
        }
        let due = *b
            .next_at
            .get_or_insert_with(|| t0 + ms(self.rng.u64(2_000..=5_000)));
        if now >= due {
            self.start_failover();
        }
    }

    /// Steps until no failover runs (bounded by its own steps' bounds, plus a margin).
    fn wait_failover(&mut self) {
        let deadline = Instant::now() + SWITCH_WITHIN + HEALTHY_WITHIN + KILL_HOLD_MAX + ms(10_000);
        while matches!(&self.backend, Backend::Sentinel(b) if b.job.is_some()) {
            assert!(
                Instant::now() < deadline,
                "a failover thread did not finish within its bounds"
            );
            self.step();
        }
    }

    /// One random fault on an eligible node (if the disruption budget allows).
    fn inject(&mut self) {
        let now = Instant::now();
        let roll = self.rng.u32(0..13);
        // Now and then kill a node that is already paused or cut off.
        if roll < 2 && self.rng.u32(0..4) == 0 {
            let faulted: Vec<usize> = self
                .current()
                .into_iter()
                .filter(|li| self.lives[*li].phase == Phase::Faulted)
                .collect();
            if !faulted.is_empty() {
                let li = faulted[self.rng.usize(0..faulted.len())];
                self.kill9(li);
                return;
            }
        }
        if self.disrupted() >= MAX_DISRUPTED {
            return;
        }
        let eligible: Vec<usize> = self
            .current()
            .into_iter()
            .filter(|li| {
                let l = &self.lives[*li];
                l.phase == Phase::Running && l.cool_until <= now
            })
            .collect();
        if eligible.is_empty() {
            return;
        }
        let leader = eligible
            .iter()
            .copied()
            .find(|li| self.leader_now.as_deref() == Some(self.lives[*li].id.as_str()));
        let li = match leader {
            Some(li) if self.rng.u32(0..100) < 35 => li,
            _ => eligible[self.rng.usize(0..eligible.len())],
        };
        if roll < 2 {
            self.kill9(li);
            return;
        }
        let dir =
            [Direction::Upstream, Direction::Downstream, Direction::Both][self.rng.usize(0..3)];
        let (kind, (lo, hi)) = match roll {
            2..=4 => (Kind::Stop, SHORT),
            5 => (Kind::Stop, MEDIUM),
            6..=7 => (Kind::Stop, LONG),
            8..=10 => (Kind::Blackhole(dir), SHORT),
            11 => (Kind::Blackhole(dir), MEDIUM),
            _ => (Kind::Blackhole(dir), LONG),
        };
        let d = ms(self.rng.u64(lo..=hi));
        if matches!(kind, Kind::Blackhole(_)) && self.lives[li].link.is_none() {
            // A node of failover mode on the group's own URL: no proxy to cut.
            return;
        }
        self.begin_fault(li, kind, d);
    }

    /// Arms one random single-reply loss on a random running node's proxy
    /// (`FaultProxy::lose_next_reply`: its next request runs, the reply is lost with the
    /// connection). Not counted as a fault: it does not disrupt a slot.
    fn lose_a_reply(&mut self) {
        let running: Vec<usize> = self
            .current()
            .into_iter()
            .filter(|li| self.lives[*li].phase == Phase::Running && self.lives[*li].link.is_some())
            .collect();
        if running.is_empty() {
            return;
        }
        let li = running[self.rng.usize(0..running.len())];
        if let Some(p) = &self.lives[li].link {
            if p.lose_next_reply() {
                self.reply_losses_armed += 1;
            }
        }
    }

    /// Replies lost by every proxy so far.
    fn lost_replies(&self) -> u64 {
        self.lives
            .iter()
            .map(|l| l.link.as_ref().map_or(l.lost_replies, Link::replies_lost))
            .sum()
    }

    // ---- phases -------------------------------------------------------------------------

    /// Starts the five nodes and waits until they are ready and one leads. The fault period
    /// (the churn window) starts when the last of them printed `ready`: each churns from its
    /// own `ready` for the period's length. Counted from the spawn, a machine slow to start
    /// processes (or to build the CLI first) once ate the whole 90 s period before any node
    /// ran, and the churn check then expected "at least 0" calls.
    fn start_fleet(&mut self) {
        support::procs::cli_bin();
        for slot in 0..SLOTS {
            self.spawn(slot);
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline
            && self
                .current()
                .iter()
                .any(|li| self.lives[*li].phase == Phase::Spawning)
        {
            self.step();
        }
        assert!(
            self.current()
                .iter()
                .all(|li| self.lives[*li].phase == Phase::Running),
            "five nodes ready within 60 s"
        );
        let ready = self
            .current()
            .iter()
            .filter_map(|li| self.lives[*li].ready_at)
            .max()
            .expect("five ready lives");
        self.churn_from = ready;
        self.churn_end = Some(ready + Duration::from_secs(self.secs));
        self.say(&format!(
            "fault period of {} s starts: five nodes ready",
            self.secs
        ));
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline && self.leader_now.is_none() {
            self.step();
        }
        assert!(self.leader_now.is_some(), "a leader within 60 s");
    }

    fn fault_period(&mut self) {
        let t0 = Instant::now();
        let end = self
            .churn_end
            .expect("set by start_fleet")
            .max(t0 + ms(1_000));
        let period = end - t0;
        let restart_at = t0 + period.mul_f64(0.25 + 0.5 * self.rng.f64());
        let single = matches!(self.backend, Backend::Single(_));
        let mut next = t0 + ms(500);
        let mut next_loss = t0 + ms(self.rng.u64(LOSS_GAP.0..=LOSS_GAP.1));
        while Instant::now() < end {
            self.step();
            let now = Instant::now();
            if now >= next_loss {
                next_loss = now + ms(self.rng.u64(LOSS_GAP.0..=LOSS_GAP.1));
                self.lose_a_reply();
            }
            let spawning = self
                .current()
                .iter()
                .any(|li| self.lives[*li].phase == Phase::Spawning);
            if single && self.restart.is_none() && now >= restart_at && !spawning {
                self.restart_redis();
                continue;
            }
            // Failover mode: failovers instead of the restart, on their own thread.
            self.maybe_failover(t0);
            if now >= next && now >= self.hold_until {
                self.inject();
                next = now + ms(self.rng.u64(300..=1_500));
            }
        }
        if single && self.restart.is_none() {
            // Start-ups kept it from happening (very short periods): once, now.
            while self
                .current()
                .iter()
                .any(|li| self.lives[*li].phase == Phase::Spawning)
            {
                self.step();
            }
            self.restart_redis();
        }
        if !single && self.failovers() == 0 {
            // A period too short for the first one: once, now.
            self.start_failover();
        }
    }

    /// Heal everything, refill every slot, wait two full reap windows, then poll until the
    /// fleet has converged (bounded).
    fn quiesce(&mut self) {
        self.say("quiescence: healing every fault, continuing every paused node");
        for li in self.current() {
            self.end_fault(li);
        }
        for slot in 0..SLOTS {
            if self.slot_life[slot].is_none() {
                self.spawn(slot);
            }
        }
        // Failover mode: the failover under way finishes (the group healthy again) first.
        self.wait_failover();
        let healed = Instant::now();
        let window = reap_window(&self.t);
        while Instant::now() < healed + window * 2
            || (self
                .current()
                .iter()
                .any(|li| self.lives[*li].phase == Phase::Spawning)
                && Instant::now() < healed + READY_WITHIN + window)
            || !self.restore_pending.is_empty()
        {
            self.step();
        }
        let deadline = Instant::now() + Duration::from_secs(45);
        let mut next_check = Instant::now();
        loop {
            self.step();
            if Instant::now() < next_check {
                continue;
            }
            next_check = Instant::now() + ms(500);
            if self.converged() {
                self.say(&format!(
                    "converged {:.1}s after the heal",
                    healed.elapsed().as_secs_f64()
                ));
                break;
            }
            if Instant::now() > deadline {
                self.say("not converged within 45 s; checking anyway");
                break;
            }
        }
        self.pump(ms(100));
    }

    fn converged(&mut self) -> bool {
        let Some((dump, scan)) = self.view() else {
            return false;
        };
        let Ok(st) = fleet_status(&self.checker) else {
            return false;
        };
        let live: BTreeSet<&str> = self
            .lives
            .iter()
            .filter(|l| l.live())
            .map(|l| l.id.as_str())
            .collect();
        let registered: BTreeSet<&str> = st.instances.iter().map(|i| i.id.as_str()).collect();
        live == registered
            && st.instances.iter().all(|i| i.alive)
            && st.leader_alive
            && unreached_records(&self.ks, &dump).is_empty()
            && self.lives.iter().enumerate().all(|(li, l)| {
                if l.live() {
                    owned_problems(&self.ks, &dump, &scan, l).is_empty()
                        && index_problems(&self.ks, &dump, &l.id).is_empty()
                        && earlier_life_problems(&self.ks, &dump, &l.id).is_empty()
                } else {
                    self.dead_leftovers(&dump, li).is_empty()
                }
            })
    }

    /// What dead life `li` left behind: every reference to its id (check 4), or, when a
    /// later life of the same id lives on, every reference to this life's fixed rooms.
    fn dead_leftovers(&self, dump: &BTreeMap<String, Val>, li: usize) -> Vec<String> {
        let l = &self.lives[li];
        let newest = self.by_id[&l.id];
        if newest != li && self.lives[newest].live() {
            references(dump, &l.rooms)
        } else {
            references(dump, std::slice::from_ref(&l.id))
        }
    }

    /// The `instance_reaped` events that reaped life `li`: those naming its id that arrived
    /// while it was the newest life of the id, from its `ready` on (a reap of the id before
    /// the new life is ready is the previous life's).
    fn reaps_of(&self, li: usize) -> Vec<Instant> {
        let l = &self.lives[li];
        let from = l.ready_at.unwrap_or(l.spawned);
        let until = self
            .lives
            .iter()
            .skip(li + 1)
            .find(|n| n.id == l.id)
            .map(|n| n.ready_at.unwrap_or(n.spawned));
        self.events
            .iter()
            .filter(|e| e.is("instance_reaped") && e.v["dead"] == l.id.as_str())
            .map(|e| e.at)
            .filter(|at| *at >= from && until.map_or(true, |u| *at < u))
            .collect()
    }

    // ---- the checker --------------------------------------------------------------------

    fn check(&mut self) {
        self.say("checking");
        // Failover mode: through the master every sentinel names now, with its replica in
        // sync (no failover runs any more: `quiesce` waited for it).
        let master = match &self.backend {
            Backend::Sentinel(b) => Some(
                b.group
                    .as_ref()
                    .expect("the group is back once no failover runs")
                    .wait_healthy(HEALTHY_WITHIN),
            ),
            Backend::Single(_) => None,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        let (dump, scan) = loop {
            if let Some(v) = self.view() {
                break v;
            }
            assert!(
                Instant::now() < deadline,
                "Redis cannot be read at check time"
            );
            std::thread::sleep(ms(100));
        };
        match master {
            Some(Ok(port)) if self.probe_port == Some(port) => {
                self.say(&format!(
                    "checking on master {port}, the one every sentinel names"
                ));
            }
            Some(Ok(port)) => self.violation(
                None,
                format!(
                    "the sentinels name master {port}, but the checker read {:?}",
                    self.probe_port
                ),
            ),
            Some(Err(e)) => {
                self.violation(None, format!("the group is not healthy at check time: {e}"));
            }
            None => {}
        }
        let safe_limit = self.t.stale_threshold + self.t.two_phase_delay
            - self.t.command_timeout
            - self.t.heartbeat_interval
            - ms(500);
        let mut found = Vec::new();
        let mut long_unreaped = Vec::new();
        let mut undone = Vec::new();
        for (li, l) in self.lives.iter().enumerate() {
            let id = &l.id;
            let reaps_of = self.reaps_of(li);
            if l.live() {
                // Failover mode: reaps whose writes a failover lost are noted, not counted.
                let (lost, reaps_of): (Vec<Instant>, Vec<Instant>) = reaps_of
                    .into_iter()
                    .partition(|at| self.reap_undone_by_failover(li, *at));
                for at in lost {
                    undone.push(format!(
                        "{id} was reaped at +{:.2}s during a failover, on the old master: the reap was lost with it (the node lives on, registered)",
                        self.rel(at)
                    ));
                }
                // (1) everything it did not report lost is there, whole.
                for p in owned_problems(&self.ks, &dump, &scan, l) {
                    found.push((li, format!("live node lost data: {p}")));
                }
                // (6) invariant 4, exactly, over its fixed and pool rooms alike.
                for p in index_problems(&self.ks, &dump, id) {
                    found.push((li, p));
                }
                // (4) nothing of an earlier registration of its id is left.
                for p in earlier_life_problems(&self.ks, &dump, id) {
                    found.push((li, p));
                }
                let lost: Vec<String> = l.lost.iter().cloned().collect();
                let back = references(&dump, &lost);
                if !back.is_empty() {
                    found.push((
                        li,
                        format!("{id}: rooms it reported lost came back: {back:#?}"),
                    ));
                }
                let longest = l.longest_fault();
                if longest <= safe_limit
                    && (!l.lost.is_empty() || !l.reaped_self.is_empty() || !reaps_of.is_empty())
                {
                    found.push((
                        li,
                        format!(
                            "{id}: its longest fault was {} ms (faults: {}), yet it lost {:?}, reaped_self {} times, reaped {} times",
                            longest.as_millis(),
                            fault_list(l),
                            l.lost,
                            l.reaped_self.len(),
                            reaps_of.len()
                        ),
                    ));
                }
                // A pause past the reap window normally makes a zombie; it is not guaranteed
                // (a leader change or the restart in between can delay the reap past the
                // pause), so an unreaped long pause is only noted.
                for f in l.faults.iter().filter(|f| f.kind == Kind::Stop && f.done) {
                    if f.end.saturating_duration_since(f.start) < ms(LONG.0) {
                        continue;
                    }
                    // (The restart, or a failover: either may lose the reap's writes.)
                    let restart_between = self.loss_windows().iter().any(|(began, _)| {
                        *began + reap_window(&self.t) >= f.start && *began <= f.end
                    });
                    if !restart_between && !l.reaped_self.iter().any(|t| *t >= f.end) {
                        long_unreaped.push(format!(
                            "{id} paused {} ms from +{:.2}s was not reaped meanwhile",
                            f.end.saturating_duration_since(f.start).as_millis(),
                            self.rel(f.start)
                        ));
                    }
                }
                // A reap of a node that lives on must have been noticed by it (reaped_self),
                // unless Redis lost everything before it resumed. The node may notice while
                // the reap still runs (score 0), so shortly before the reap's event too; two
                // zombie episodes of one node are further apart (cool-down plus a pause).
                for at in &reaps_of {
                    let noticed = l.reaped_self.iter().any(|t| *t + ms(2_000) > *at);
                    let wiped = self.restart.is_some_and(|(began, _)| {
                        began > *at && l.faults.iter().any(|f| f.contains(began))
                    });
                    if !noticed && !wiped {
                        found.push((
                            li,
                            format!("{id} was reaped at +{:.2}s while it lives on, and never reported reaped_self", self.rel(*at)),
                        ));
                    }
                }
            } else {
                // (4) a dead instance leaves nothing behind (a dead life whose id lives on
                // in a later life: nothing of its fixed rooms).
                let left = self.dead_leftovers(&dump, li);
                if !left.is_empty() {
                    found.push((
                        li,
                        format!(
                            "dead instance {id} (life {}) not reaped: {left:#?}",
                            l.incarnation
                        ),
                    ));
                }
            }
        }
        // (6) every record in the dump, whichever instance it names (live or dead, reaped or
        // not yet): its room is in that instance's room index, live or moved aside.
        for p in unreached_records(&self.ks, &dump) {
            found.push((usize::MAX, format!("invariants 2 and 4: {p}")));
        }
        // (4/5) nothing else registered.
        let zset: Vec<String> = match dump.get(&self.ks.heartbeats()) {
            Some(Val::ZSet(z)) => z.iter().map(|(m, _)| m.clone()).collect(),
            _ => Vec::new(),
        };
        for m in zset {
            if !self.by_id.get(&m).is_some_and(|li| self.lives[*li].live()) {
                found.push((usize::MAX, format!("{m} is registered but is no live node")));
            }
        }
        for (li, msg) in found {
            self.violation((li != usize::MAX).then_some(li), msg);
        }
        for n in long_unreaped {
            self.note(n);
        }
        self.reaps_undone = undone.len();
        for n in undone {
            self.note(n);
        }
        // (5) status: every live node alive, a live leader.
        match fleet_status(&self.checker) {
            Ok(st) => {
                for l in self.lives.iter().filter(|l| l.live()) {
                    let alive = st.instances.iter().any(|i| i.id == l.id && i.alive);
                    if !alive {
                        let msg = format!("{} is not alive in status: {}", l.id, st.to_json());
                        self.violations.push((None, msg));
                    }
                }
                let leader_live = st
                    .leader
                    .as_ref()
                    .and_then(|h| self.by_id.get(h))
                    .is_some_and(|li| self.lives[*li].live());
                if !(leader_live && st.leader_alive) {
                    self.violation(None, format!("no live leader in status: {}", st.to_json()));
                }
                if !st.is_clean() {
                    self.violation(None, format!("status reports problems: {}", st.to_json()));
                }
            }
            Err(e) => self.violation(None, format!("fleet_status failed after quiescence: {e}")),
        }
        // (2) the audit: two scans 1.5 s apart.
        let options = AuditOptions {
            repair: false,
            settle: ms(1_500),
        };
        match audit(&self.checker, &options) {
            Ok(report) if report.clean() => self.say("audit clean"),
            Ok(report) => {
                for p in report.remaining() {
                    let msg = format!("audit: {} at {}: {}", p.kind, p.key, p.detail);
                    self.violation(None, msg);
                }
            }
            Err(e) => self.violation(None, format!("audit failed: {e}")),
        }
        // (3) leadership.
        self.check_leadership();
    }

    fn rel(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.start).as_secs_f64()
    }

    /// Terms from the events; epochs never repeat and increase in arrival order; terms do not
    /// overlap (beyond `SLACK`) unless the older leader could not act at that moment.
    fn check_leadership(&mut self) -> (usize, Option<i128>) {
        let mut evs: Vec<&Ev> = self
            .events
            .iter()
            .filter(|e| e.is("leader_acquired") || e.is("leader_lost"))
            .collect();
        evs.sort_by_key(|e| e.at);
        let mut found: Vec<(Option<usize>, String)> = Vec::new();
        let mut notes = Vec::new();
        let mut terms: Vec<Term> = Vec::new();
        let mut open: HashMap<usize, usize> = HashMap::new();
        let mut seen: BTreeMap<u64, String> = BTreeMap::new();
        let mut max_so_far: Option<(u64, Instant)> = None;
        for e in &evs {
            let li = e.life;
            if e.is("leader_acquired") {
                let Some(epoch) = e.v["epoch"].as_u64() else {
                    found.push((
                        Some(li),
                        format!("leader_acquired without an epoch: {}", e.v),
                    ));
                    continue;
                };
                if let Some(prev) = seen.insert(epoch, e.id.clone()) {
                    found.push((
                        Some(li),
                        format!("epoch {epoch} handed out twice: {prev} and {}", e.id),
                    ));
                }
                match max_so_far {
                    Some((max, max_at)) if epoch <= max => {
                        // A node paused between its acquire and printing it prints late.
                        let l = &self.lives[li];
                        if l.stopped_at(max_at) {
                            notes.push(format!(
                                "epoch {epoch} of {} arrived after epoch {max}: it was paused meanwhile",
                                e.id
                            ));
                        } else {
                            found.push((
                                Some(li),
                                format!(
                                    "epochs out of order: {} acquired epoch {epoch} (arrived +{:.2}s) after epoch {max} (+{:.2}s)",
                                    e.id,
                                    self.rel(e.at),
                                    self.rel(max_at)
                                ),
                            ));
                        }
                    }
                    _ => max_so_far = Some((epoch, e.at)),
                }
                if open.contains_key(&li) {
                    found.push((
                        Some(li),
                        format!(
                            "{} acquired epoch {epoch} while its previous term was open",
                            e.id
                        ),
                    ));
                }
                open.insert(li, terms.len());
                terms.push(Term {
                    life: li,
                    epoch,
                    start: e.at,
                    end: None,
                    how: String::new(),
                });
            } else if let Some(ti) = open.remove(&li) {
                terms[ti].end = Some(e.at);
                terms[ti].how = e.v["reason"].as_str().unwrap_or_default().to_owned();
            } else {
                notes.push(format!(
                    "{} sent leader_lost with no open term: {}",
                    e.id, e.v
                ));
            }
        }
        for (li, ti) in open {
            if let Some(k) = self.lives[li].killed_at {
                terms[ti].end = Some(k);
                terms[ti].how = "kill -9".into();
            }
        }
        terms.sort_by_key(|t| t.start);
        let mut min_gap: Option<i128> = None;
        let mut explained = 0;
        for j in 0..terms.len() {
            for i in 0..j {
                let (a, b) = (&terms[i], &terms[j]);
                if a.life == b.life {
                    continue;
                }
                if let Some(end) = a.end {
                    // Handover gaps between a capable old leader and the next one.
                    let la = &self.lives[a.life];
                    let capable = !la.incapable_at(b.start)
                        && !la.incapable_at(end.checked_sub(ms(1)).unwrap_or(end))
                        && la.killed_at != Some(end);
                    if i + 1 == j && capable {
                        let gap = b.start.duration_since(self.start).as_millis() as i128
                            - end.duration_since(self.start).as_millis() as i128;
                        min_gap = Some(min_gap.map_or(gap, |m: i128| m.min(gap)));
                    }
                }
                let overlaps = a.end.map_or(true, |end| end > b.start + SLACK);
                if !overlaps {
                    continue;
                }
                let la = &self.lives[a.life];
                let (ida, idb) = (la.id.clone(), self.lives[b.life].id.clone());
                let what = format!(
                    "{ida}'s term (epoch {}, +{:.2}s..{}) overlaps {idb}'s (epoch {}, from +{:.2}s)",
                    a.epoch,
                    self.rel(a.start),
                    a.end
                        .map_or("open".into(), |e| format!("+{:.2}s {}", self.rel(e), a.how)),
                    b.epoch,
                    self.rel(b.start)
                );
                if la.incapable_at(b.start) {
                    explained += 1;
                    notes.push(format!("{what}: {ida} was paused or cut off then"));
                } else {
                    found.push((Some(a.life), what));
                }
            }
        }
        for n in notes {
            self.note(n);
        }
        for (li, msg) in found {
            self.violation(li, msg);
        }
        let n = terms.len();
        self.say(&format!(
            "leadership: {n} terms, {explained} overlaps explained by a paused or cut-off old leader, smallest handover gap {} ms",
            min_gap.map_or("-".into(), |g| g.to_string())
        ));
        (n, min_gap)
    }

    /// One churn count (`churn_summary` field `name`) summed over every life (a killed life
    /// counts up to its last progress line).
    fn churn_total(&self, name: &str) -> u64 {
        self.lives
            .iter()
            .filter_map(|l| l.churn.as_ref())
            .map(|v| v[name].as_u64().unwrap_or(0))
            .sum()
    }

    /// The workload really ran and the reply losses really fired (a churn that silently
    /// did nothing would make the invariant-4 check vacuous).
    fn check_workload(&mut self) {
        let ops = self.churn_total("ops");
        // At least 2 calls per second of each life's readiness within the fault period (a
        // churning node makes some 25 a second): judged on the time nodes really were up.
        let end = self.churn_end.expect("set by start_fleet");
        let node_secs: f64 = self
            .lives
            .iter()
            .filter_map(|l| {
                let ready = l.ready_at?;
                let until = l.killed_at.unwrap_or(end).min(end);
                Some(until.saturating_duration_since(ready).as_secs_f64())
            })
            .sum();
        // And they were up: the period starts when the fleet is ready, and at most
        // MAX_DISRUPTED slots are ever dead or starting, so the others' lives cover the whole
        // period (a fifth off for the edges: a refill's start, the last events' arrival).
        let floor = (SLOTS - MAX_DISRUPTED) as f64 * self.secs as f64 * 0.8;
        if node_secs < floor {
            self.violation(
                None,
                format!(
                    "the nodes were ready for {node_secs:.0} node-seconds of a {} s fault period; expected at least {floor:.0}",
                    self.secs
                ),
            );
        }
        let want = ((node_secs * 2.0) as u64).max(1);
        if ops < want {
            self.violation(
                None,
                format!(
                    "the churn made {ops} calls over {node_secs:.0} s of ready nodes in a {} s fault period; expected at least {want}",
                    self.secs
                ),
            );
        }
        // Takeovers (and so guests reconnecting through another instance) need a node
        // paused or killed while it held pool rooms: certain only over a longer period.
        for (name, min_secs) in [
            ("upserts", 20),
            ("replaced", 20),
            ("removes", 20),
            ("closes", 20),
            ("pins", 20),
            ("takeovers", 60),
            ("replaced_elsewhere", 60),
        ] {
            if self.secs >= min_secs && self.churn_total(name) == 0 {
                self.violation(None, format!("the churn made no {name}"));
            }
        }
        if self.secs >= 20 && self.lost_replies() == 0 {
            self.violation(None, "no reply was lost during the fault period".into());
        }
    }

    /// Master switches the nodes noticed (the library's warning "the master of ... is now ...",
    /// in their logs), over every life.
    fn node_switches(&self) -> usize {
        self.lives
            .iter()
            .map(|l| {
                std::fs::read_to_string(&l.log)
                    .unwrap_or_default()
                    .lines()
                    .filter(|line| line.contains("the master of") && line.contains(" is now "))
                    .count()
            })
            .sum()
    }

    fn summary(&self, took: Duration) -> String {
        let reaps = self
            .events
            .iter()
            .filter(|e| e.is("instance_reaped"))
            .count();
        let zombies = self
            .lives
            .iter()
            .filter(|l| !l.reaped_self.is_empty())
            .count();
        let terms = self
            .events
            .iter()
            .filter(|e| e.is("leader_acquired"))
            .count();
        let restore = self
            .restore_times
            .iter()
            .map(|(_, d)| d.as_millis())
            .max()
            .map_or("-".into(), |m| format!("{m}ms"));
        let ops = self.churn_total("ops");
        let churn_secs = self.churn_end.map_or(0.0, |e| {
            e.saturating_duration_since(self.churn_from).as_secs_f64()
        });
        // Failover mode only (the default run's line is unchanged).
        let failovers = match &self.backend {
            Backend::Sentinel(b) => format!(
                " failovers={} (command={} kill9={} stop={}) node_switches={} reaps_undone={}",
                self.failovers(),
                b.count(Failover::Command),
                b.count(Failover::Kill),
                b.count(Failover::Stop),
                self.node_switches(),
                self.reaps_undone
            ),
            Backend::Single(_) => String::new(),
        };
        format!(
            "chaos: seed={} secs={} faults={} (kill9={} stop={} blackhole={} restart={}){failovers} reaps={} zombies={} lives={} reused_ids={} leader_terms={} restore_max={} churn_ops={} churn_ops_per_s={:.1} churn_errors={} (upserts={} replaced={} replaced_elsewhere={} removes={} pins={} takeovers={} closes={}) lost_replies={} violations={} took={:.0}s",
            self.seed,
            self.secs,
            self.faults(),
            self.kills,
            self.stops,
            self.blackholes,
            self.restarts,
            reaps,
            zombies,
            self.lives.len(),
            self.reuses,
            terms,
            restore,
            ops,
            ops as f64 / churn_secs.max(0.001),
            self.churn_total("errors"),
            self.churn_total("upserts"),
            self.churn_total("replaced"),
            self.churn_total("replaced_elsewhere"),
            self.churn_total("removes"),
            self.churn_total("pins"),
            self.churn_total("takeovers"),
            self.churn_total("closes"),
            self.lost_replies(),
            self.violations.len(),
            took.as_secs_f64()
        )
    }
}

fn fault_list(l: &Life) -> String {
    l.faults
        .iter()
        .map(|f| {
            format!(
                "{} {}ms",
                f.kind.name(),
                f.end.saturating_duration_since(f.start).as_millis()
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// From a death to the end of its reap, in the worst case (the dead node led: its lease
/// expires, a new leader acquires, finds it stale, waits the two-phase delay, reaps).
fn reap_window(t: &Timings) -> Duration {
    t.stale_threshold + t.two_phase_delay + t.reap_interval + t.lease_ttl + t.lease_refresh
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

#[test]
fn chaos_kill_pause_partition_restart_then_check() {
    let seed = env_u64("SFU_CHAOS_SEED").unwrap_or_else(|| fastrand::u64(..));
    let secs = env_u64("SFU_CHAOS_SECS").unwrap_or(DEFAULT_SECS);
    eprintln!("chaos: seed={seed} secs={secs} (SFU_CHAOS_SEED={seed} reproduces the schedule)");
    let began = Instant::now();
    run(
        Chaos::new(Backend::Single(Box::new(Server::start())), seed, secs),
        began,
    );
}

/// Failover mode (module docs): `SFU_CHAOS_FAILOVERS=<seconds of faults>`, 60 by default (the
/// shortest period every check of the run applies to: takeovers need 60 s), `0` skips it.
#[test]
fn chaos_failovers_then_check() {
    let secs = match std::env::var("SFU_CHAOS_FAILOVERS") {
        Err(_) => DEFAULT_FAILOVER_SECS,
        Ok(v) if v.trim().is_empty() => DEFAULT_FAILOVER_SECS,
        Ok(v) => v.trim().parse::<u64>().unwrap_or_else(|_| {
            panic!("SFU_CHAOS_FAILOVERS={v:?}: expected a number of seconds (the fault period)")
        }),
    };
    if secs == 0 {
        eprintln!("chaos failovers: skipped (SFU_CHAOS_FAILOVERS=0)");
        return;
    }
    let seed = env_u64("SFU_CHAOS_SEED").unwrap_or_else(|| fastrand::u64(..));
    eprintln!(
        "chaos: failover mode, seed={seed} secs={secs} (SFU_CHAOS_SEED={seed} SFU_CHAOS_FAILOVERS={secs} reproduces the schedule)"
    );
    // Built before the clock starts (the fault period is counted from the fleet's start).
    support::procs::cli_bin();
    let began = Instant::now();
    let group = SentinelGroup::start(SentinelOptions {
        replicas: 1,
        sentinels: 3,
        down_after: ms(500),
        ..SentinelOptions::default()
    })
    .expect("start a master, a replica and three sentinels");
    let backend = Backend::Sentinel(Box::new(Sentinels::new(group)));
    run(Chaos::new(backend, seed, secs), began);
}

/// The whole run: fleet, fault period, quiescence, the checks, the report; panics on any
/// violation.
fn run(mut c: Chaos, began: Instant) {
    let seed = c.seed;
    c.start_fleet();
    c.fault_period();
    c.quiesce();
    c.check();
    c.check_workload();
    let summary = c.summary(began.elapsed());
    let mut involved = BTreeSet::new();
    for (li, msg) in &c.violations {
        eprintln!("violation: {msg}");
        involved.extend(*li);
    }
    for l in involved.into_iter().filter_map(|li| c.lives.get(li)) {
        eprintln!(
            "---- {} (faults: {}) stderr tail ----\n{}",
            l.id,
            fault_list(l),
            l.log_tail(40)
        );
    }
    for n in &c.notes {
        eprintln!("note: {n}");
    }
    let restores = match &c.backend {
        Backend::Single(_) => format!(
            "restore after the Redis restart: {:?}",
            c.restore_times
                .iter()
                .map(|(id, d)| format!("{id} {} ms", d.as_millis()))
                .collect::<Vec<_>>()
        ),
        Backend::Sentinel(b) => {
            let mut took: Vec<u128> = c.restore_times.iter().map(|(_, d)| d.as_millis()).collect();
            took.sort_unstable();
            let failovers: Vec<String> = b
                .done
                .iter()
                .map(|f| {
                    format!(
                        "{} at +{:.1}s {:?}->{:?} switch {} ms, healthy {} ms",
                        f.kind.name(),
                        c.rel(f.started),
                        f.old,
                        f.new,
                        f.switched
                            .map_or("-".into(), |t| (t - f.started).as_millis().to_string()),
                        (f.settled - f.started).as_millis()
                    )
                })
                .collect();
            format!(
                "restores after a switch: {} timed, median {} ms, max {} ms; failovers: {failovers:?}",
                took.len(),
                took.get(took.len() / 2).map_or("-".into(), ToString::to_string),
                took.last().map_or("-".into(), ToString::to_string),
            )
        }
    };
    eprintln!(
        "chaos detail: lease/epoch samples={} status samples={} (errors {}) spawn failures={} notes={} {restores}",
        c.samples,
        c.status_samples,
        c.status_errors,
        c.spawn_failures,
        c.notes.len(),
    );
    if !c.violations.is_empty() {
        if let Backend::Sentinel(b) = &c.backend {
            for s in b.group.iter().flat_map(|g| g.sentinels()) {
                let log = s.log();
                let lines: Vec<&str> = log.lines().collect();
                eprintln!(
                    "---- sentinel {} log tail ----\n{}",
                    s.port(),
                    lines[lines.len().saturating_sub(40)..].join("\n")
                );
            }
        }
    }
    // Straight to the process's stderr, past the test harness's capture: CI logs show the
    // summary line whether the test passes or fails.
    {
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "{summary}");
    }
    // The violations themselves in the panic message too: a CI log that keeps only the tail
    // of the output still shows what broke (the sentinels' logs above can push them out).
    let listed: Vec<String> = c
        .violations
        .iter()
        .map(|(life, msg)| match life {
            Some(li) => format!(
                "- {} (life {}): {msg}",
                c.lives[*li].id, c.lives[*li].incarnation
            ),
            None => format!("- {msg}"),
        })
        .collect();
    assert!(
        c.violations.is_empty(),
        "{} violations (seed {seed}); node logs and the timeline above:\n{}",
        c.violations.len(),
        listed.join("\n")
    );
}
