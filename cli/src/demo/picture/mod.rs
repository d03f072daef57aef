//! `demo --svg FILE`: the run as a picture. One lane per instance on a time axis (seconds
//! since the demo started): its heartbeats as ticks, its leadership terms as bars with their
//! epochs, the candidates events naming it, the two-phase wait, its crash and its reap; the
//! Redis failover (with `--sentinel`) as a line across the lanes.
//!
//! Everything drawn is something the demo observed: events at the times their nodes emitted
//! them (`Node::emitted`; the timeline is re-stamped so when the demo ends), crashes when it crashed a node, and heartbeats from each node's [`Stats`] polled by
//! the demo's waits (every [`POLL`] at most): a heartbeat is drawn at the poll's time minus
//! `last_heartbeat_age`, so at the time it succeeded. Beats that happened between two polls
//! before the last one have no known time: they are counted on the picture, not drawn.
//!
//! [`Stats`]: sfu_redis::Stats

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use sfu_redis::Stats;

use super::*;

mod draw;

/// The lane of the demo's own notes about Redis (the failover): drawn across every lane.
pub(super) const REDIS_LANE: &str = "redis";

/// What the picture needs besides the timeline's entries.
#[derive(Default)]
pub(super) struct Trace {
    /// Per instance: when each heartbeat the demo saw succeeded (since the demo started).
    beats: BTreeMap<String, Vec<Duration>>,
    /// Per instance: its heartbeat count at the last poll.
    counts: BTreeMap<String, u64>,
    /// Heartbeats that happened between two polls, before the last one: no known time.
    unseen: u64,
    /// (instance, when the demo crashed it).
    crashes: Vec<(String, Duration)>,
    /// (crashed leader, when its lease key expired in Redis), from `PTTL` right after the
    /// crash.
    lease_expiry: Option<(String, Duration)>,
    /// When the last node stopped (the end of the time axis).
    end: Duration,
}

impl Trace {
    /// Records `stats` of instance `id`, read at `now`: a new heartbeat count adds a tick at
    /// the time of the last one.
    fn sample(&mut self, id: &str, stats: &Stats, now: Duration) {
        let before = self.counts.get(id).copied().unwrap_or(0);
        if stats.heartbeats <= before {
            return;
        }
        self.counts.insert(id.to_owned(), stats.heartbeats);
        self.unseen += stats.heartbeats - before - 1;
        let beats = self.beats.entry(id.to_owned()).or_default();
        // The count and the age are two reads: when a beat lands between them, a poll can see
        // a time it already drew (within 1 ms): that beat is counted as unseen, not drawn twice.
        match stats.last_heartbeat_age.map(|age| now.saturating_sub(age)) {
            Some(at)
                if beats
                    .last()
                    .map_or(true, |&last| at > last + Duration::from_millis(1)) =>
            {
                beats.push(at);
            }
            _ => self.unseen += 1,
        }
    }

    pub(super) fn crashed(&mut self, id: &str, at: Duration) {
        self.crashes.push((id.to_owned(), at));
    }

    pub(super) fn lease_expires(&mut self, leader: &str, at: Duration) {
        self.lease_expiry = Some((leader.to_owned(), at));
    }

    pub(super) fn ended(&mut self, at: Duration) {
        self.end = at;
    }
}

/// The file `--svg` names, opened before the demo starts so that a path it cannot write is
/// refused at once. Its old content stays until the picture replaces it; a file the demo
/// created but never wrote is removed.
pub(super) struct Output {
    path: PathBuf,
    file: File,
    created: bool,
    written: bool,
}

impl Output {
    /// Opens (creates) `path` for writing.
    ///
    /// # Errors
    /// A usage failure (exit 2) naming the path and the system's reason.
    pub(super) fn open(path: &Path) -> Result<Output, Failure> {
        let created = !path.exists();
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| {
                Failure::usage(format!(
                    "demo --svg {}: cannot write the picture there: {e}",
                    path.display()
                ))
            })?;
        Ok(Output {
            path: path.to_owned(),
            file,
            created,
            written: false,
        })
    }

    /// Replaces the file's content with `bytes`.
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.written = true;
        self.file.set_len(0)?;
        self.file.write_all(bytes)?;
        self.file.sync_all()
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if self.created && !self.written {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// A leadership term on one lane.
struct Term {
    epoch: u64,
    from: Duration,
    /// When the node stopped leading (or the end of the picture).
    to: Duration,
    /// Why it ended: `crashed`, a `leader_lost` reason, `stopped`, or `still leading`.
    ended: String,
    /// After a crash: when the lease key it left expired in Redis.
    lease_until: Option<Duration>,
}

/// A reap of the lane's instance.
struct Reap {
    at: Duration,
    by: String,
    rooms: u64,
    peers: u64,
    skipped_rooms: u64,
}

/// Everything drawn on one instance's lane.
#[derive(Default)]
struct Lane {
    id: String,
    /// Its `ready` event.
    ready: Option<Duration>,
    beats: Vec<Duration>,
    terms: Vec<Term>,
    crash: Option<Duration>,
    /// (when, by whom): candidates events naming it (phase one of a reap round).
    candidates: Vec<(Duration, String)>,
    /// The two-phase wait of the round that reaped it: (candidates event, reap).
    wait: Option<(Duration, Duration)>,
    reaped: Option<Reap>,
    stopped: Option<Duration>,
    /// The demo's other notes on this lane, and events that should not happen here
    /// (`room_lost`, `reaped_self`).
    notes: Vec<(Duration, String)>,
}

impl Lane {
    /// Where its life line starts: its first sign of life.
    fn start(&self) -> Duration {
        let first_beat = self.beats.first().copied();
        [self.ready, first_beat]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or_default()
    }

    fn close_term(&mut self, at: Duration, ended: &str) {
        if let Some(t) = self.terms.last_mut().filter(|t| t.ended.is_empty()) {
            t.to = at;
            t.ended = ended.to_owned();
        }
    }
}

/// The picture's content: the lanes, in instance order, and the Redis notes.
struct Picture<'a> {
    lanes: Vec<Lane>,
    /// (when, text) of the demo's notes about Redis.
    redis: Vec<(Duration, String)>,
    end: Duration,
    unseen: u64,
    timings: &'a Timings,
}

impl<'a> Picture<'a> {
    fn new(entries: &[Entry], trace: &Trace, timings: &'a Timings) -> Picture<'a> {
        let mut sorted: Vec<&Entry> = entries.iter().collect();
        sorted.sort_by_key(|e| e.at);
        let end = sorted
            .last()
            .map_or(trace.end, |e| e.at.max(trace.end))
            .max(Duration::from_millis(1));
        let mut lanes: BTreeMap<String, Lane> = BTreeMap::new();
        let mut redis = Vec::new();
        for (id, beats) in &trace.beats {
            lane(&mut lanes, id).beats.clone_from(beats);
        }
        for e in sorted {
            match &e.what {
                What::Note(text) if e.instance == REDIS_LANE => redis.push((e.at, unstar(text))),
                What::Note(text) => {
                    let is_crash = trace
                        .crashes
                        .iter()
                        .any(|(i, at)| *i == e.instance && *at == e.at);
                    if !is_crash {
                        lane(&mut lanes, &e.instance)
                            .notes
                            .push((e.at, unstar(text)));
                    }
                }
                What::Event(ev) => add_event(&mut lanes, &e.instance, e.at, ev),
            }
        }
        for (id, at) in &trace.crashes {
            let l = lane(&mut lanes, id);
            l.crash = Some(*at);
            l.close_term(*at, "crashed");
            if let Some((_, until)) = trace.lease_expiry.as_ref().filter(|(who, _)| who == id) {
                if let Some(t) = l.terms.last_mut() {
                    t.lease_until = Some(*until);
                }
            }
        }
        for l in lanes.values_mut() {
            l.close_term(end, "still leading");
        }
        Picture {
            lanes: lanes.into_values().collect(),
            redis,
            end,
            unseen: trace.unseen,
            timings,
        }
    }
}

fn lane<'l>(lanes: &'l mut BTreeMap<String, Lane>, id: &str) -> &'l mut Lane {
    lanes.entry(id.to_owned()).or_insert_with(|| Lane {
        id: id.to_owned(),
        ..Lane::default()
    })
}

/// `** text **` -> `text`.
fn unstar(text: &str) -> String {
    text.trim_matches(|c: char| c == '*' || c.is_whitespace())
        .to_owned()
}

/// Puts event `ev` of instance `who` at `at` on the lanes it concerns.
fn add_event(lanes: &mut BTreeMap<String, Lane>, who: &str, at: Duration, ev: &Event) {
    match ev {
        Event::Ready { .. } => lane(lanes, who).ready = Some(at),
        Event::LeaderAcquired { epoch } => lane(lanes, who).terms.push(Term {
            epoch: *epoch,
            from: at,
            to: at,
            ended: String::new(),
            lease_until: None,
        }),
        Event::LeaderLost { reason } => lane(lanes, who).close_term(at, reason.as_str()),
        Event::Candidates { instances } => {
            for i in instances {
                lane(lanes, i).candidates.push((at, who.to_owned()));
            }
        }
        Event::InstanceReaped {
            dead,
            rooms,
            peers,
            skipped_rooms,
            ..
        } => {
            let l = lane(lanes, dead);
            // The round that reaped it: the reaper's last candidates event naming it.
            let named = l.candidates.iter().rev().find(|(_, by)| by == who);
            l.wait = named.map(|(c, _)| (*c, at));
            l.reaped = Some(Reap {
                at,
                by: who.to_owned(),
                rooms: *rooms,
                peers: *peers,
                skipped_rooms: *skipped_rooms,
            });
        }
        Event::Stopped => {
            let l = lane(lanes, who);
            l.stopped = Some(at);
            l.close_term(at, "stopped");
        }
        other => lane(lanes, who)
            .notes
            .push((at, format!("{} {}", other.name(), event_fields(other)))),
    }
}

impl Demo {
    /// Polls every live node's heartbeat count (called by the waits, and before a crash).
    pub(super) fn sample_beats(&mut self) {
        for m in self.members.iter().filter(|m| !m.crashed) {
            let stats = m.node.stats();
            let now = self.start.elapsed();
            self.trace.sample(&m.id, &stats, now);
        }
    }

    /// Draws the run into `out`; prints where it went.
    ///
    /// # Errors
    /// The path and the system's reason when the file cannot be written.
    pub(super) fn write_picture(&self, out: &mut Output) -> Result<(), String> {
        let picture = Picture::new(&self.entries, &self.trace, &self.timings);
        let path = out.path.display().to_string();
        let failed =
            |e: std::io::Error| format!("demo --svg {path}: cannot write the picture: {e}");
        let bytes = draw::svg(&picture).map_err(failed)?;
        out.write(&bytes).map_err(failed)?;
        let beats: usize = picture.lanes.iter().map(|l| l.beats.len()).sum();
        out!(
            "\npicture: wrote {path} ({} lanes, {beats} heartbeats, {} bytes)",
            picture.lanes.len(),
            bytes.len()
        );
        Ok(())
    }
}
