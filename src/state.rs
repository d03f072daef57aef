//! The state the worker threads and the host calls share: who this instance is and where its
//! keys are ([`Ctx`], all a data-access function needs besides a connection), the counters, the
//! leadership state, what this node holds ([`Local`]) and the event sink. A leaf: it imports no
//! worker (heartbeat, lease, reaper), no data-access module (rooms, peers) and no node, so every
//! one of them can import it.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};

use crate::config::{Config, Timings};
use crate::conn::{Link, Pool, Redis};
use crate::error::{Error, Result};
use crate::event::{Event, EventSink};
use crate::keys::{encode_id, IdKind, KeySpace};
use crate::leader::LeaderState;
use crate::metrics::{self, DurationHistogram};

/// What a data-access function (rooms, peers, lease calls, reap batches) needs to know besides
/// a connection: this instance's id in wire form, the key space and the timings. Built once
/// per node; unit tests build one directly, without a node.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    /// This instance's id (wire form).
    pub me: String,
    pub keys: KeySpace,
    pub timings: Timings,
    /// Index members per reap batch (`ConfigBuilder::reap_batch`).
    pub reap_batch: usize,
    /// Pause after each leader reap batch, in multiples of its duration
    /// (`ConfigBuilder::reap_pace`).
    pub reap_pace: f64,
    /// This life's registration (or its re-registration after data loss) is not yet known to
    /// have reached a replica (`lease::replicated`): until a tick confirms it, a heartbeat that
    /// finds this instance missing under an unchanged dataset token means a failover lost the
    /// registration, not a reap (heartbeat.rs, `Beat::Unregistered`), and an index write never
    /// hands this instance to the reaper (`index_add.lua`'s mark: it may live on, its
    /// registration lost). Shared by every clone; a node starts it `true`, a bare context
    /// (tests, the replay, operator tools) `false`.
    pub unconfirmed: Arc<AtomicBool>,
    /// Server ms this life registered at (its info's `started_ms`, heartbeat.lua's ARGV[8]);
    /// 0 before. `index_add.lua` gets it too: while the registration is unconfirmed, a reap
    /// tombstone naming this life still lets an index write hand the instance to the reaper
    /// (a reap took the registration, no failover lost it). Shared by every clone.
    pub started_ms: Arc<AtomicI64>,
}

impl Ctx {
    /// The context of the node `config` describes.
    ///
    /// # Errors
    /// [`Error::InvalidId`] for an instance id that cannot be encoded.
    pub(crate) fn from_config(config: &Config) -> Result<Ctx> {
        Ok(Ctx {
            me: encode_id(IdKind::Instance, config.instance_id())?,
            keys: config.keys().clone(),
            timings: *config.timings(),
            reap_batch: config.reap_batch(),
            reap_pace: config.reap_pace(),
            unconfirmed: Arc::new(AtomicBool::new(false)),
            started_ms: Arc::new(AtomicI64::new(0)),
        })
    }
}

#[cfg(test)]
impl Ctx {
    /// A unit test's context: instance `id` (plain) of stage `unit` on the Redis at `url`,
    /// with [`Timings::fast`].
    pub(crate) fn for_test(url: &str, id: &str) -> Ctx {
        let cfg = Config::builder()
            .redis_url(Some(url))
            .stage("unit")
            .instance_id(id)
            .timings(Timings::fast())
            .build()
            .unwrap();
        Ctx::from_config(&cfg).unwrap()
    }
}

/// Counters shared by the worker threads: what [`crate::Stats`] and the metrics
/// (`crate::metrics`) report. Relaxed atomics; the two `Mutex`es are taken once per tick or
/// error, never on a host call.
#[derive(Debug)]
pub(crate) struct Counters {
    pub heartbeats: AtomicU64,
    pub heartbeat_failures: AtomicU64,
    pub redis_errors: AtomicU64,
    /// `redis_errors` by kind (`metrics::REDIS_ERROR_KINDS`).
    pub redis_errors_by_kind: [AtomicU64; 4],
    pub slow_ticks: AtomicU64,
    /// Duration of the last slow heartbeat tick, ms (what a leader that skips reap rounds
    /// reports: `src/pause.rs`).
    pub last_slow_tick_ms: AtomicU64,
    pub instances_reaped: AtomicU64,
    pub rooms_reaped: AtomicU64,
    pub peers_reaped: AtomicU64,
    /// Rooms of reaped instances left alone (a live instance owned them by then).
    pub skipped_rooms: AtomicU64,
    /// Stale instances found by reap rounds (each round's list counted once).
    pub candidates: AtomicU64,
    pub bad_data: AtomicU64,
    /// Times the heartbeat found Redis had lost its data (this instance's record gone and the
    /// dataset token changed; on a cluster, one master's token gone or changed, counted per
    /// master) and restored what this node holds.
    pub data_losses: AtomicU64,
    /// Times the heartbeat found this instance had been reaped while it was unresponsive (a
    /// zombie) and registered again.
    pub reaped_self: AtomicU64,
    pub last_heartbeat: Mutex<Option<Instant>>,
    pub last_error: Mutex<Option<String>>,
    /// Record the duration histograms (`ConfigBuilder::metrics`); the counters are kept
    /// either way.
    pub timed: bool,
    /// Duration of each heartbeat tick.
    pub tick_seconds: DurationHistogram,
    /// Duration of each dead instance's reap.
    pub reap_seconds: DurationHistogram,
}

impl Default for Counters {
    fn default() -> Self {
        Counters::new(true)
    }
}

impl Counters {
    /// Zeroed counters; `timed`: record the duration histograms too.
    pub(crate) fn new(timed: bool) -> Self {
        Counters {
            heartbeats: AtomicU64::new(0),
            heartbeat_failures: AtomicU64::new(0),
            redis_errors: AtomicU64::new(0),
            redis_errors_by_kind: Default::default(),
            slow_ticks: AtomicU64::new(0),
            last_slow_tick_ms: AtomicU64::new(0),
            instances_reaped: AtomicU64::new(0),
            rooms_reaped: AtomicU64::new(0),
            peers_reaped: AtomicU64::new(0),
            skipped_rooms: AtomicU64::new(0),
            candidates: AtomicU64::new(0),
            bad_data: AtomicU64::new(0),
            data_losses: AtomicU64::new(0),
            reaped_self: AtomicU64::new(0),
            last_heartbeat: Mutex::new(None),
            last_error: Mutex::new(None),
            timed,
            tick_seconds: DurationHistogram::new(metrics::TICK_BUCKETS),
            reap_seconds: DurationHistogram::new(metrics::REAP_BUCKETS),
        }
    }

    /// When timing is on: now, to pass to [`Counters::tick_took`] (no clock read when off).
    pub(crate) fn start_timer(&self) -> Option<Instant> {
        self.timed.then(Instant::now)
    }

    /// A heartbeat tick that began at `started` ([`Counters::start_timer`]) ended.
    pub(crate) fn tick_took(&self, started: Option<Instant>) {
        if let Some(t) = started {
            self.tick_seconds.observe(t.elapsed());
        }
    }

    /// A reap round listed `n` stale instances.
    pub(crate) fn candidates_found(&self, n: usize) {
        self.candidates.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Bad data met by a worker (a key of the wrong type, a malformed record): reported, but
    /// not a Redis outage, so it does not make the leader skip reap rounds.
    pub(crate) fn bad_data(&self, e: &Error) {
        self.bad_data.fetch_add(1, Ordering::Relaxed);
        *self.last_error.lock() = Some(e.to_string());
    }

    pub(crate) fn heartbeat_ok(&self) {
        self.heartbeats.fetch_add(1, Ordering::Relaxed);
        *self.last_heartbeat.lock() = Some(Instant::now());
    }

    pub(crate) fn heartbeat_failed(&self) {
        self.heartbeat_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// A heartbeat tick took `took`, longer than half the heartbeat interval.
    pub(crate) fn slow_tick(&self, took: Duration) {
        let ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
        self.last_slow_tick_ms.store(ms, Ordering::Relaxed);
        self.slow_ticks.fetch_add(1, Ordering::Relaxed);
    }

    /// One instance reaped in `took`, with the rooms and peer records it lost and the rooms
    /// it skipped (owned by a live instance by then).
    pub(crate) fn reaped(&self, rooms: u64, peers: u64, skipped: u64, took: Duration) {
        self.instances_reaped.fetch_add(1, Ordering::Relaxed);
        self.rooms_reaped.fetch_add(rooms, Ordering::Relaxed);
        self.peers_reaped.fetch_add(peers, Ordering::Relaxed);
        self.skipped_rooms.fetch_add(skipped, Ordering::Relaxed);
        if self.timed {
            self.reap_seconds.observe(took);
        }
    }

    /// A Redis error met by a worker or a tooling call.
    pub(crate) fn redis_error(&self, e: &Error) {
        self.redis_errors.fetch_add(1, Ordering::Relaxed);
        self.redis_errors_by_kind[metrics::redis_error_kind(e)].fetch_add(1, Ordering::Relaxed);
        *self.last_error.lock() = Some(e.to_string());
    }
}

/// Everything the worker threads and the Redis store share.
#[derive(Debug)]
pub(crate) struct Shared {
    /// This instance's id (caller's form).
    pub id: String,
    /// Wire id, keys, timings: what the data-access functions take.
    pub ctx: Ctx,
    pub redis: Redis,
    pub pool: Pool,
    pub local: Arc<Local>,
    pub leader: LeaderState,
    pub events: Arc<EventSink>,
    pub counters: Counters,
    /// The dataset token last seen by the heartbeat.
    pub token: Mutex<String>,
    /// Random per `Node::start`: written in the heartbeat key, so two live processes with the
    /// same instance id are told apart.
    pub boot: String,
    /// The highest epoch this node has seen (heartbeat replies, its own terms): passed to the
    /// acquire so epochs never go backwards, even after Redis lost its data.
    pub max_epoch: AtomicU64,
    /// Redis lost its data and this node has not finished writing its pins and peers back.
    pub restore_pending: AtomicBool,
    /// [`crate::conn::Redis::master_switches`] when this life registered: a missing record on
    /// the master it registered on is a reap, whatever the replicas acknowledged.
    pub registration_switches: AtomicU64,
    /// Server µs this life began: its registration's clean-up boundary (`heartbeat::register`'s
    /// `t0`); 0 before. A registration written again after a failover lost it keeps it.
    pub life_t0_us: AtomicI64,
    /// On a Redis Cluster: the masters' dataset tokens this node knows and the rooms it still
    /// has to restore after one master lost its data (src/shards.rs). Taken by the heartbeat
    /// thread (and a host's manual tick) only.
    pub shards: Mutex<ShardTokens>,
    /// [`Redis::master_switches`] as the heartbeat last saw it: a higher count means a
    /// failover moved the master, and the heartbeat restores what this node holds.
    pub switches_seen: AtomicU64,
    /// A tick found another process's boot token under this id: its stop must not mark the
    /// heartbeat key released (the other process may be the live one).
    pub saw_duplicate: AtomicBool,
    /// The last foreign key schema stamp a tick found (`P:{ctl}:schema` naming another
    /// version: the prefix was migrated under a running node), so each new value is logged
    /// once, not every tick.
    pub schema_seen: Mutex<Option<String>>,
    /// The stamp that refused this node's registration after it started (a re-registration
    /// after a reap or after Redis lost its data): while set, the node is parked. It writes
    /// nothing, host calls fail with `Error::Schema`, the lease is not sought, and each tick
    /// tries to register again (heartbeat.rs).
    pub schema_refused: Mutex<Option<String>>,
    /// The fields of this instance's info hash (`crate::info`), but `started_ms`.
    pub info: Vec<(&'static str, String)>,
    /// Set by `Node::simulate_crash`: threads stop without any cleanup.
    pub crashed: AtomicBool,
    /// Closed as soon as the node begins to stop: a host call that waits (a paced
    /// `Node::reap_now`) wakes at once, before `shutdown` waits for it.
    pub stopping: Stopping,
}

/// What the heartbeat knows of a Redis Cluster's masters' dataset tokens
/// (`P:shard:{<tag>}:dataset`, src/shards.rs).
#[derive(Debug, Default)]
pub(crate) struct ShardTokens {
    /// Token last seen, by hash tag.
    pub known: std::collections::HashMap<String, String>,
    /// The hash tag of each slot that held a token (computed once per slot).
    pub tags: std::collections::HashMap<u16, String>,
    /// Rooms (callers' ids) on a master that lost its data, whose pins, metadata and peers
    /// this node has not finished writing back (the next tick tries again).
    pub restore: BTreeSet<String>,
}

/// A stop signal for host calls: its receiver disconnects once [`Stopping::signal`] ran (the
/// workers have their own, dropped only after the host calls are drained).
#[derive(Debug)]
pub(crate) struct Stopping {
    tx: Mutex<Option<crossbeam_channel::Sender<()>>>,
    /// Only a test hook waits on it (`Node::reap_now`, feature `testing`).
    #[cfg(feature = "testing")]
    rx: crossbeam_channel::Receiver<()>,
}

impl Default for Stopping {
    fn default() -> Self {
        let (tx, _rx) = crossbeam_channel::bounded(0);
        Stopping {
            tx: Mutex::new(Some(tx)),
            #[cfg(feature = "testing")]
            rx: _rx,
        }
    }
}

impl Stopping {
    /// Disconnects the receiver (idempotent).
    pub(crate) fn signal(&self) {
        self.tx.lock().take();
    }

    /// Disconnected once the node began to stop.
    #[cfg(feature = "testing")]
    pub(crate) fn receiver(&self) -> &crossbeam_channel::Receiver<()> {
        &self.rx
    }
}

impl Shared {
    /// Acting as leader now: a term whose local deadline has not passed, confirmed on the
    /// master every connection now reaches. After a failover (another master found) the node
    /// does not act until its lease thread has confirmed the lease there: the failover may
    /// have lost it, and another node may hold one on the new master (invariant 3).
    pub(crate) fn is_leader(&self) -> bool {
        self.leader
            .current()
            .is_some_and(|t| t.switches == self.redis.master_switches())
    }

    pub(crate) fn note_error(&self, e: &Error) {
        self.counters.redis_error(e);
    }

    /// Emits `e` locally and publishes it (as JSON, with `"instance"`) on the prefix's
    /// `P:events` channel, best effort: other processes (dashboards, `redis-cli subscribe`) see
    /// leader changes and reaps without reading every node's output.
    pub(crate) fn announce(&self, link: &mut Link, e: Event) {
        self.publish(link, &e);
        self.events.emit(e);
    }

    /// The pub/sub half of [`Shared::announce`] alone (for events emitted locally elsewhere).
    pub(crate) fn publish(&self, link: &mut Link, e: &Event) {
        let payload = e.to_json(&self.id).to_string();
        let sent = link.run(&self.redis, |c| {
            redis::cmd("PUBLISH")
                .arg(self.ctx.keys.events_channel())
                .arg(&payload)
                .query::<i64>(c)
                .map_err(|err| Error::redis("publish event", err))
        });
        if let Err(err) = sent {
            log::debug!("could not publish {}: {err}", e.name());
        }
    }

    /// Set by `Node::simulate_crash`: threads stop without any cleanup.
    pub(crate) fn is_crashed(&self) -> bool {
        self.crashed.load(Ordering::Relaxed)
    }
}

/// A peer this node upserted, as the node remembers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LocalPeer {
    pub guest: Option<String>,
    pub fields: Vec<(String, String)>,
    pub generation: u64,
}

/// Stripes of the per-room lock.
pub(crate) const ROOM_LOCKS: usize = 64;

/// What this node holds: the rooms it pinned and the peers it upserted (callers' ids). The
/// heartbeat refreshes these pins; counts come from here.
///
/// Operations of this node on one room (pin, close, upsert, remove, the heartbeat's handling of
/// a lost room) run under that room's lock ([`Local::lock_room`]): each is several round trips
/// across two hash slots (index and record), and two of them interleaving on one node could
/// leave a record that no index reaches.
#[derive(Debug)]
pub(crate) struct Local {
    rooms: Mutex<BTreeMap<String, ()>>,
    peers: Mutex<BTreeMap<(String, String), LocalPeer>>,
    /// Rooms whose pin or close ended without a known outcome; the heartbeat settles them
    /// (releases the pin if it is ours and the host does not hold the room).
    uncertain: Mutex<BTreeSet<String>>,
    /// Peers whose remove ended without a known outcome, with the generation to remove; the
    /// heartbeat sends the remove again (it is a no-op if it had run).
    uncertain_peers: Mutex<BTreeMap<(String, String), u64>>,
    /// Peers whose upsert ended without a known outcome: its record may have been written
    /// although the host was told the call failed. The heartbeat deletes such a record (if it
    /// names this instance and the node does not hold the peer).
    uncertain_upserts: Mutex<BTreeSet<(String, String)>>,
    /// Held peers whose record an upsert with an unknown outcome may have deleted (they had the
    /// guest of that upsert, which supersedes a guest's previous peer): the heartbeat reads
    /// each record and forgets the peer if the record no longer names this instance.
    suspects: Mutex<BTreeSet<(String, String)>>,
    locks: Vec<Mutex<()>>,
    /// The first lock stripe of the next tick's re-assertion of held entries.
    reassert_next: std::sync::atomic::AtomicUsize,
    /// `SSCAN` cursor of the tick's walk over this instance's own room index.
    pub(crate) index_walk: Mutex<u64>,
    /// Set when a removal from this instance's own room index ended without a known outcome (it
    /// may still land, late, after the host wrote the same entry again): the next tick puts
    /// back everything the node holds, not one eighth.
    reassert_all: std::sync::atomic::AtomicBool,
}

impl Default for Local {
    fn default() -> Self {
        Local {
            rooms: Mutex::default(),
            peers: Mutex::default(),
            uncertain: Mutex::default(),
            uncertain_peers: Mutex::default(),
            uncertain_upserts: Mutex::default(),
            suspects: Mutex::default(),
            locks: (0..ROOM_LOCKS).map(|_| Mutex::new(())).collect(),
            reassert_next: std::sync::atomic::AtomicUsize::new(0),
            index_walk: Mutex::new(0),
            reassert_all: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl Local {
    /// The lock of `room` (striped: unrelated rooms may share a stripe).
    pub(crate) fn lock_room(&self, room: &str) -> MutexGuard<'_, ()> {
        self.locks[Self::stripe_of(room)].lock()
    }

    /// The lock of stripe `i` (`0..ROOM_LOCKS`): every room of [`Local::stripe_of`] `i`. A
    /// caller taking several takes them in increasing order (host calls take one at a time).
    pub(crate) fn lock_stripe(&self, i: usize) -> MutexGuard<'_, ()> {
        self.locks[i % ROOM_LOCKS].lock()
    }

    /// The lock stripe of `room` (`0..ROOM_LOCKS`).
    pub(crate) fn stripe_of(room: &str) -> usize {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        room.hash(&mut h);
        (h.finish() as usize) % ROOM_LOCKS
    }

    pub(crate) fn mark_uncertain(&self, room: &str) {
        self.uncertain.lock().insert(room.to_owned());
    }

    pub(crate) fn uncertain(&self) -> Vec<String> {
        self.uncertain.lock().iter().cloned().collect()
    }

    pub(crate) fn settled(&self, room: &str) {
        self.uncertain.lock().remove(room);
    }

    pub(crate) fn mark_uncertain_peer(&self, room: &str, peer: &str, generation: u64) {
        self.uncertain_peers
            .lock()
            .insert((room.to_owned(), peer.to_owned()), generation);
    }

    /// Takes the peers whose remove must be sent again.
    pub(crate) fn take_uncertain_peers(&self) -> Vec<(String, String, u64)> {
        std::mem::take(&mut *self.uncertain_peers.lock())
            .into_iter()
            .map(|((r, p), g)| (r, p, g))
            .collect()
    }

    /// Notes an upsert whose outcome is unknown (see [`Local`]'s `uncertain_upserts`).
    pub(crate) fn mark_uncertain_upsert(&self, room: &str, peer: &str) {
        self.uncertain_upserts
            .lock()
            .insert((room.to_owned(), peer.to_owned()));
    }

    /// Takes the upserts whose outcome the heartbeat must settle.
    pub(crate) fn take_uncertain_upserts(&self) -> Vec<(String, String)> {
        std::mem::take(&mut *self.uncertain_upserts.lock())
            .into_iter()
            .collect()
    }

    /// Notes the held peers of `room` with guest `guest`, other than `peer` (see [`Local`]'s
    /// `suspects`).
    pub(crate) fn mark_guest_suspects(&self, room: &str, peer: &str, guest: &str) {
        let found: Vec<String> = self
            .peers
            .lock()
            .range((room.to_owned(), String::new())..)
            .take_while(|((r, _), _)| r == room)
            .filter(|((_, p), l)| p != peer && l.guest.as_deref() == Some(guest))
            .map(|((_, p), _)| p.clone())
            .collect();
        let mut s = self.suspects.lock();
        for p in found {
            s.insert((room.to_owned(), p));
        }
    }

    /// Takes the suspects to check.
    pub(crate) fn take_suspects(&self) -> Vec<(String, String)> {
        std::mem::take(&mut *self.suspects.lock())
            .into_iter()
            .collect()
    }

    /// Puts a suspect back (its check failed; the next tick tries again).
    pub(crate) fn mark_suspect(&self, room: &str, peer: &str) {
        self.suspects
            .lock()
            .insert((room.to_owned(), peer.to_owned()));
    }

    /// The generation this node last got for a peer, if it holds it.
    pub(crate) fn peer_generation(&self, room: &str, peer: &str) -> Option<u64> {
        self.peers
            .lock()
            .get(&(room.to_owned(), peer.to_owned()))
            .map(|p| p.generation)
    }

    pub(crate) fn add_room(&self, room: &str) {
        self.rooms.lock().insert(room.to_owned(), ());
    }

    /// Forgets a room and every peer in it.
    pub(crate) fn remove_room(&self, room: &str) {
        self.rooms.lock().remove(room);
        self.peers.lock().retain(|(r, _), _| r != room);
    }

    pub(crate) fn has_room(&self, room: &str) -> bool {
        self.rooms.lock().contains_key(room)
    }

    pub(crate) fn rooms(&self) -> Vec<String> {
        self.rooms.lock().keys().cloned().collect()
    }

    pub(crate) fn room_count(&self) -> usize {
        self.rooms.lock().len()
    }

    pub(crate) fn peer_count(&self) -> usize {
        self.peers.lock().len()
    }

    pub(crate) fn put_peer(&self, room: &str, peer: &str, p: LocalPeer) {
        self.peers
            .lock()
            .insert((room.to_owned(), peer.to_owned()), p);
    }

    /// Every peer, as `(room, peer, record)`.
    pub(crate) fn peers(&self) -> Vec<(String, String, LocalPeer)> {
        self.peers
            .lock()
            .iter()
            .map(|((r, p), l)| (r.clone(), p.clone(), l.clone()))
            .collect()
    }

    pub(crate) fn remove_peer(&self, room: &str, peer: &str) {
        self.peers
            .lock()
            .remove(&(room.to_owned(), peer.to_owned()));
    }

    /// The rooms this node holds whose lock stripe is in `stripes`.
    pub(crate) fn held_rooms_in_stripes(&self, stripes: &std::ops::Range<usize>) -> Vec<String> {
        self.rooms
            .lock()
            .keys()
            .filter(|r| stripes.contains(&Self::stripe_of(r)))
            .cloned()
            .collect()
    }

    /// Asks the next tick to put back everything the node holds (see `reassert_all`).
    pub(crate) fn reassert_everything(&self) {
        self.reassert_all
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The next `n` lock stripes whose holdings a tick puts back into the room index (a rotating
    /// window: every stripe once per `ROOM_LOCKS / n` calls), or all of them once after
    /// [`Local::reassert_everything`].
    pub(crate) fn next_reassert_stripes(&self, n: usize) -> std::ops::Range<usize> {
        if self
            .reassert_all
            .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            return 0..ROOM_LOCKS;
        }
        let n = n.clamp(1, ROOM_LOCKS);
        let start = self
            .reassert_next
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed)
            % ROOM_LOCKS;
        start..(start + n).min(ROOM_LOCKS)
    }

    /// Forgets everything (after this node was reaped).
    pub(crate) fn clear(&self) -> Vec<String> {
        self.peers.lock().clear();
        self.uncertain.lock().clear();
        self.uncertain_peers.lock().clear();
        self.uncertain_upserts.lock().clear();
        self.suspects.lock().clear();
        std::mem::take(&mut *self.rooms.lock())
            .into_keys()
            .collect()
    }
}
