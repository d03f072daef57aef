//! `sfu-redis node --churn-rooms ...` (hidden flags, for the chaos test only): a host workload
//! that keeps pinning, closing, upserting and removing over a pool of rooms shared by the
//! whole fleet, so rooms move between instances and guests reconnect through other instances.
//!
//! Each step (a small random sleep apart, some tens per second) picks a random pool room:
//!
//! - held: upsert one of its guests (`<room>-g<k>`, k = 1..=[`GUESTS`]) with a NEW peer id (a
//!   reconnect: it supersedes the guest's previous peer, wherever that one was hosted), remove
//!   one of the peers this node upserted there (with the generation it got), or, less often,
//!   close the room;
//! - not held: pin it; `Held` is skipped, otherwise a few guests are upserted.
//!
//! Errors (time-outs while a fault proxy blackholes the node, lost replies, `NotOwner` once a
//! room moved) are expected: they are counted and the loop goes on. The counts go to stderr
//! (one `churn:` line when churning stops) and, with `--json`, to stdout as
//! `{"event":"churn_summary","instance":..,"done":bool,...}` lines: one every
//! [`PROGRESS_EVERY`] and a final one (`done: true`). `churn_summary` is no library event.

use std::collections::HashMap;
use std::io::Write as _;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use serde_json::json;
use sfu_redis::keys::{encode_id, IdKind};
use sfu_redis::{Error, ErrorKind, Node, PinOutcome};

use crate::Failure;

/// Guests per pool room: `<room>-g1` ..= `<room>-g<GUESTS>`.
pub(crate) const GUESTS: u32 = 4;
/// Sleep between two steps, ms (uniform): about 40 steps per second.
const PAUSE_MS: (u64, u64) = (10, 40);
/// A cumulative `churn_summary` line this often (a node killed mid-run still told most of
/// its counts).
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// What the churn flags ask for.
#[derive(Debug, Clone)]
pub(crate) struct ChurnPlan {
    pub rooms: Vec<String>,
    pub duration: Duration,
    pub seed: u64,
}

impl ChurnPlan {
    /// Checks the pool's ids (and the longest guest/peer ids derived from them).
    pub(crate) fn new(rooms: &[String], for_ms: u64, seed: Option<u64>) -> Result<Self, Failure> {
        for r in rooms {
            let bad = |e: Error| Failure::usage(format!("--churn-rooms: {e}"));
            encode_id(IdKind::Room, r).map_err(bad)?;
            encode_id(IdKind::Guest, &guest(r, GUESTS)).map_err(bad)?;
            encode_id(
                IdKind::Peer,
                &format!("{}-c{:x}", guest(r, GUESTS), u64::MAX),
            )
            .map_err(bad)?;
        }
        Ok(ChurnPlan {
            rooms: rooms.to_vec(),
            duration: Duration::from_millis(for_ms),
            seed: seed.unwrap_or_else(|| fastrand::u64(..)),
        })
    }
}

fn guest(room: &str, k: u32) -> String {
    format!("{room}-g{k}")
}

/// Operation and error counts.
#[derive(Debug, Default, Clone)]
struct Counts {
    pins: u64,
    pins_held: u64,
    takeovers: u64,
    upserts: u64,
    replaced: u64,
    /// Replaced peers that another process had upserted: the guest reconnected through
    /// this instance after being hosted by another one (peer ids carry the process's tag).
    replaced_elsewhere: u64,
    removes: u64,
    removes_noop: u64,
    closes: u64,
    errors: u64,
    not_owner: u64,
    timeouts: u64,
    other_errors: u64,
}

impl Counts {
    /// Calls made (successful or not).
    fn ops(&self) -> u64 {
        self.pins + self.pins_held + self.upserts + self.removes + self.closes + self.errors
    }

    fn error(&mut self, e: &Error) {
        self.errors += 1;
        if e.kind() == ErrorKind::NotOwner {
            self.not_owner += 1;
        } else if e.is_timeout() || e.is_connection_error() {
            self.timeouts += 1;
        } else {
            self.other_errors += 1;
            log::info!("churn: {e}");
        }
    }
}

/// The pool rooms this node believes it holds, with the peers it upserted there.
type Held = HashMap<String, Vec<(String, u64)>>;

struct Churn<'a> {
    node: &'a Node,
    rng: fastrand::Rng,
    tag: String,
    serial: u64,
    held: Held,
    c: Counts,
}

impl Churn<'_> {
    fn step(&mut self, pool: &[String]) -> Result<(), Error> {
        let room = pool[self.rng.usize(..pool.len())].clone();
        if !self.held.contains_key(&room) {
            return self.pin(&room);
        }
        let roll = self.rng.u32(..100);
        let has_peers = self.held.get(&room).is_some_and(|p| !p.is_empty());
        if roll < 8 {
            self.close(&room)
        } else if roll < 45 && has_peers {
            self.remove(&room)
        } else {
            self.upsert(&room)
        }
    }

    fn pin(&mut self, room: &str) -> Result<(), Error> {
        match self.node.pin_room(room) {
            Ok(PinOutcome::Held { .. }) => {
                self.c.pins_held += 1;
                Ok(())
            }
            Ok(outcome) => {
                self.c.pins += 1;
                if matches!(outcome, PinOutcome::TookOver { .. }) {
                    self.c.takeovers += 1;
                }
                self.held.entry(room.to_owned()).or_default();
                for _ in 0..self.rng.u32(1..=3) {
                    self.upsert(room)?;
                }
                Ok(())
            }
            Err(e) => self.failed(room, e),
        }
    }

    /// A guest (re)connects with a new peer id.
    fn upsert(&mut self, room: &str) -> Result<(), Error> {
        let g = guest(room, self.rng.u32(1..=GUESTS));
        self.serial += 1;
        let peer = format!("{g}-c{}{:x}", self.tag, self.serial);
        match self
            .node
            .upsert_peer_detailed(room, &peer, Some(&g), &[("churn", "1")])
        {
            Ok(u) => {
                self.c.upserts += 1;
                let peers = self.held.entry(room.to_owned()).or_default();
                if let Some(old) = &u.replaced {
                    self.c.replaced += 1;
                    if !old.contains(&format!("-c{}", self.tag)) {
                        self.c.replaced_elsewhere += 1;
                    }
                    peers.retain(|(p, _)| p != old);
                }
                peers.push((peer, u.generation));
                Ok(())
            }
            Err(e) => self.failed(room, e),
        }
    }

    fn remove(&mut self, room: &str) -> Result<(), Error> {
        let Some(peers) = self.held.get_mut(room).filter(|p| !p.is_empty()) else {
            return Ok(());
        };
        let (peer, generation) = peers.swap_remove(self.rng.usize(..peers.len()));
        match self.node.remove_peer(room, &peer, generation) {
            Ok(removed) => {
                self.c.removes += 1;
                if !removed {
                    self.c.removes_noop += 1;
                }
                Ok(())
            }
            Err(e) => self.failed(room, e),
        }
    }

    fn close(&mut self, room: &str) -> Result<(), Error> {
        // Forgotten whatever the outcome: a close whose outcome is unknown is finished by the
        // library's heartbeat; after a known failure the next pin says where the room is.
        self.held.remove(room);
        match self.node.close_room(room) {
            Ok(()) => {
                self.c.closes += 1;
                Ok(())
            }
            Err(e) => self.failed(room, e),
        }
    }

    /// Counts `e`; a room this node no longer owns is forgotten. `Stopped` ends the churn.
    fn failed(&mut self, room: &str, e: Error) -> Result<(), Error> {
        if e.kind() == ErrorKind::Stopped {
            return Err(e);
        }
        if matches!(e, Error::NotOwner { .. }) {
            self.held.remove(room);
        }
        self.c.error(&e);
        Ok(())
    }
}

/// Churns until `plan.duration` has passed, the node stops or `signal` fires (disconnected).
/// Prints the counts as described in the module docs.
pub(crate) fn run(node: &Node, plan: &ChurnPlan, json: bool, signal: &Receiver<()>) {
    if plan.rooms.is_empty() || plan.duration.is_zero() {
        return;
    }
    let mut rng = fastrand::Rng::with_seed(plan.seed);
    let tag = format!("{:06x}", rng.u32(..1 << 24));
    let mut ch = Churn {
        node,
        rng,
        tag,
        serial: 0,
        held: Held::new(),
        c: Counts::default(),
    };
    let start = Instant::now();
    let end = start + plan.duration;
    let mut next_progress = start + PROGRESS_EVERY;
    log::info!(
        "churn: {} pool rooms for {} ms (seed {})",
        plan.rooms.len(),
        plan.duration.as_millis(),
        plan.seed
    );
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        if now >= next_progress {
            next_progress = now + PROGRESS_EVERY;
            report(node, &ch.c, start.elapsed(), false, json);
        }
        let pause = Duration::from_millis(ch.rng.u64(PAUSE_MS.0..=PAUSE_MS.1));
        match signal.recv_timeout(pause.min(end - now)) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => break,
        }
        if ch.step(&plan.rooms).is_err() {
            break;
        }
    }
    report(node, &ch.c, start.elapsed(), true, json);
}

fn report(node: &Node, c: &Counts, took: Duration, done: bool, json: bool) {
    let secs = took.as_secs_f64();
    if done {
        eprintln!(
            "churn: {} ops in {secs:.1}s ({:.1}/s): pins={} held_elsewhere={} takeovers={} upserts={} replaced={} (elsewhere {}) removes={} (no-op {}) closes={} errors={} (not_owner={} timeout_or_connection={} other={})",
            c.ops(),
            c.ops() as f64 / secs.max(0.001),
            c.pins,
            c.pins_held,
            c.takeovers,
            c.upserts,
            c.replaced,
            c.replaced_elsewhere,
            c.removes,
            c.removes_noop,
            c.closes,
            c.errors,
            c.not_owner,
            c.timeouts,
            c.other_errors
        );
    }
    if !json {
        return;
    }
    let line = json!({
        "event": "churn_summary",
        "instance": node.instance_id(),
        "done": done,
        "secs": secs,
        "ops": c.ops(),
        "pins": c.pins,
        "held_elsewhere": c.pins_held,
        "takeovers": c.takeovers,
        "upserts": c.upserts,
        "replaced": c.replaced,
        "replaced_elsewhere": c.replaced_elsewhere,
        "removes": c.removes,
        "removes_noop": c.removes_noop,
        "closes": c.closes,
        "errors": c.errors,
        "not_owner": c.not_owner,
        "timeouts": c.timeouts,
        "other_errors": c.other_errors,
    });
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}
