//! [`Node`]: the handle a host holds. It owns the worker threads (heartbeat, lease, reaper),
//! the event channel and the stats, and shuts everything down on [`Node::shutdown`] or `Drop`.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender};
use parking_lot::{Mutex, RwLock, RwLockReadGuard};

use crate::config::{Config, Mode};
use crate::conn::{self, Link, Pool, Redis};
use crate::error::{Error, Result};
use crate::event::{Event, EventSink};
use crate::heartbeat;
use crate::keys::{Id, IdKind};
use crate::leader::{LeaderState, TermRecord};
use crate::memory::MemoryStore;
use crate::metrics::{self, Health, MetricsFormat, Snapshot};
use crate::peers::{Upserted, MAX_PEER_FIELDS, RESERVED_PEER_FIELDS};
use crate::rooms::PinOutcome;
use crate::state::{Counters, Ctx, Local, LocalPeer, Shared};
use crate::store::RedisStore;
#[cfg(feature = "testing")]
use crate::ReapCounts;
use crate::{lease, reaper};

/// Capacity of a node's event channel; when full, new events are dropped and counted in
/// [`Stats::events_dropped`].
pub const EVENT_CAPACITY: usize = 4096;

/// Most idle connections kept for host threads' calls.
const POOL_IDLE: usize = 16;

/// The node's rooms and peers: in memory or in Redis. Each host call dispatches here once.
#[derive(Debug)]
enum Backend {
    Memory(MemoryStore),
    Redis(RedisStore),
}

impl Backend {
    fn mode(&self) -> Mode {
        match self {
            Backend::Memory(_) => Mode::Memory,
            Backend::Redis(_) => Mode::Redis,
        }
    }

    fn pin_room(&self, room: &Id) -> Result<PinOutcome> {
        match self {
            Backend::Memory(m) => m.pin_room(room),
            Backend::Redis(r) => r.pin_room(room),
        }
    }

    fn close_room(&self, room: &Id) -> Result<()> {
        match self {
            Backend::Memory(m) => m.close_room(room),
            Backend::Redis(r) => r.close_room(room),
        }
    }

    fn room_owner(&self, room: &Id) -> Result<Option<String>> {
        match self {
            Backend::Memory(m) => m.room_owner(room),
            Backend::Redis(r) => r.room_owner(room),
        }
    }

    fn upsert_peer(
        &self,
        room: &Id,
        peer: &Id,
        guest: Option<&Id>,
        fields: &[(&str, &str)],
    ) -> Result<Upserted> {
        match self {
            Backend::Memory(m) => m.upsert_peer(room, peer, guest, fields),
            Backend::Redis(r) => r.upsert_peer(room, peer, guest, fields),
        }
    }

    fn remove_peer(&self, room: &Id, peer: &Id, generation: u64) -> Result<bool> {
        match self {
            Backend::Memory(m) => m.remove_peer(room, peer, generation),
            Backend::Redis(r) => r.remove_peer(room, peer, generation),
        }
    }

    /// The state shared with the worker threads; `None` in memory-only mode.
    fn shared(&self) -> Option<&Arc<Shared>> {
        match self {
            Backend::Memory(_) => None,
            Backend::Redis(r) => Some(r.shared()),
        }
    }
}

/// A snapshot of a node's state and counters ([`Node::stats`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// This instance's id.
    pub instance_id: String,
    /// False in memory-only mode (the same as `mode == Mode::Memory`).
    pub redis: bool,
    /// Where the node keeps its rooms and peers.
    pub mode: Mode,
    /// Whether this node holds the reaper lease now.
    pub is_leader: bool,
    /// The current term's epoch, when leading.
    pub epoch: Option<u64>,
    /// Rooms this node owns.
    pub rooms: usize,
    /// Peers this node upserted and has not removed.
    pub peers: usize,
    /// Successful heartbeat ticks.
    pub heartbeats: u64,
    /// Failed heartbeat ticks.
    pub heartbeat_failures: u64,
    /// Time since the last successful heartbeat.
    pub last_heartbeat_age: Option<Duration>,
    /// Redis errors seen by the worker threads.
    pub redis_errors: u64,
    /// Bad data met by the worker threads (keys of the wrong type, malformed records).
    pub bad_data: u64,
    /// The last error or bad data seen (never contains a password).
    pub last_error: Option<String>,
    /// Dead instances this node reaped.
    pub instances_reaped: u64,
    /// Rooms deleted by those reaps.
    pub rooms_reaped: u64,
    /// Peer records deleted by those reaps.
    pub peers_reaped: u64,
    /// Rooms of those reaped instances left alone: a live instance owned them by then (owner
    /// CAS).
    pub skipped_rooms: u64,
    /// Stale instances this node's reap rounds found (each round's list counted once; each is
    /// re-checked before any reap).
    pub reap_candidates: u64,
    /// Leadership terms this node began (reaper lease acquired).
    pub leadership_terms: u64,
    /// Connections made again after one was dropped (an error, a timeout, a failover, a dead
    /// idle connection).
    pub reconnects: u64,
    /// Script-cache reloads after a `NOSCRIPT` reply (`SCRIPT FLUSH`, a restarted server).
    pub script_reloads: u64,
    /// Events dropped because the event channel was full.
    pub events_dropped: u64,
    /// Times this node found Redis had lost its data and restored its pins, index entries
    /// and peer records: its record gone and the dataset token changed, or on a Redis
    /// Cluster one master's dataset token gone or changed (counted per master). A failover
    /// that kept the data is not counted (`sfu_redis_master_switches_total`).
    pub data_losses: u64,
    /// Times this node found it had been reaped while it was unresponsive (a zombie: paused
    /// or cut off past the stale threshold and the two-phase re-check). Its rooms were lost
    /// ([`crate::Event::ReapedSelf`]); it registered again as a fresh live instance.
    pub reaped_self: u64,
}

struct Workers {
    shutdown: Sender<()>,
    handles: Vec<JoinHandle<()>>,
}

/// One SFU instance's handle on the shared Redis: pins, peers, heartbeat, lease and reaper.
///
/// `Node` is `Send + Sync`; share it between host threads with an `Arc` (or by reference).
/// Every method is a blocking call bounded by the configured command timeout.
///
/// ```no_run
/// use sfu_redis::{Config, Node, PinOutcome};
///
/// let config = Config::builder()
///     .redis_url(Some("redis://127.0.0.1:6379"))
///     .stage("prod")
///     .build()?;
/// let node = Node::start(config)?;
/// match node.pin_room("room-1")? {
///     PinOutcome::Held { owner } => println!("send the client to {owner}"),
///     _ => {
///         let generation = node.upsert_peer("room-1", "peer-1", Some("guest-1"), &[("name", "Ada")])?;
///         node.remove_peer("room-1", "peer-1", generation)?;
///     }
/// }
/// for event in node.events().try_iter() {
///     println!("{event:?}");
/// }
/// node.shutdown()?;
/// # Ok::<(), sfu_redis::Error>(())
/// ```
pub struct Node {
    id: String,
    /// The key prefix (`<namespace>:<stage>:<branch>`), for the metrics.
    prefix: String,
    backend: Backend,
    local: Arc<Local>,
    events: Arc<EventSink>,
    events_rx: Receiver<Event>,
    workers: Mutex<Option<Workers>>,
    stopped: AtomicBool,
    /// Held (shared) by every host call for its duration; `shutdown` and `leave` take it
    /// exclusively after setting `stopped`, so no call that passed the check is still writing
    /// when they release the heartbeat or clean up.
    ops: RwLock<()>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("instance_id", &self.id)
            .field("mode", &self.backend.mode())
            .field("stopped", &self.stopped.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Starts a node. With a Redis URL: connects, registers the first heartbeat (so a bad URL
    /// or an unreachable Redis fails here, not later) and starts the heartbeat, lease and
    /// reaper threads. Without one: memory-only mode, no threads.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis cannot be reached or refuses (wrong password, ACL);
    /// [`Error::Io`] when a thread cannot be spawned.
    pub fn start(config: Config) -> Result<Node> {
        let (tx, rx) = bounded(EVENT_CAPACITY);
        let events = Arc::new(EventSink::new(config.instance_id(), tx));
        let local = Arc::new(Local::default());
        let id = config.instance_id().to_owned();
        let prefix = config.keys().prefix().to_owned();
        let node = |backend: Backend, workers: Option<Workers>| Node {
            id: id.clone(),
            prefix: prefix.clone(),
            backend,
            local: Arc::clone(&local),
            events: Arc::clone(&events),
            events_rx: rx.clone(),
            workers: Mutex::new(workers),
            stopped: AtomicBool::new(false),
            ops: RwLock::new(()),
        };
        if config.redis_url().is_none() {
            // Info, not a warning: no URL is the documented way to run one instance alone. The
            // mode shows in `Node::mode`, `Stats::mode` and the `ready` event; the CLI warns.
            log::info!(
                "no Redis URL: memory-only mode (single instance; no heartbeat, lease or reaper)"
            );
            return Ok(node(Backend::Memory(MemoryStore::new(&id)), None));
        }
        let ctx = Ctx::from_config(&config)?;
        // Until a replica acknowledges the first registration (heartbeat.rs).
        ctx.unconfirmed.store(true, Ordering::Relaxed);
        let redis = Redis::from_config(&config)?;
        let shared = Arc::new(Shared {
            id: id.clone(),
            info: crate::info::fields(&config, redis.transport()),
            redis,
            ctx,
            pool: Pool::new(POOL_IDLE),
            local: Arc::clone(&local),
            leader: LeaderState::default(),
            events: Arc::clone(&events),
            counters: Counters::new(config.metrics()),
            token: Mutex::new(String::new()),
            boot: format!("{:016x}", fastrand::u64(..)),
            max_epoch: AtomicU64::new(0),
            restore_pending: AtomicBool::new(false),
            registration_switches: AtomicU64::new(0),
            life_t0_us: AtomicI64::new(0),
            shards: Mutex::default(),
            switches_seen: AtomicU64::new(0),
            saw_duplicate: AtomicBool::new(false),
            schema_seen: Mutex::new(None),
            schema_refused: Mutex::new(None),
            crashed: AtomicBool::new(false),
            stopping: Default::default(),
        });
        register_at_start(&shared)?;
        log::info!(
            "instance {} registered on {} ({}) under prefix {}",
            id,
            shared.redis.safe_url(),
            shared.redis.describe(),
            shared.ctx.keys.prefix()
        );
        let pairs: Vec<(String, String)> = shared
            .info
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect();
        let (me, _) = crate::info::InstanceInfo::from_fields(&pairs);
        log::info!(
            "instance {id} effective timings: {}; reap batch {}",
            me.timings_summary(),
            config.reap_batch()
        );
        let workers = spawn_workers(&shared)?;
        Ok(node(Backend::Redis(RedisStore::new(shared)), Some(workers)))
    }

    /// Where this node keeps its rooms and peers: [`Mode::Memory`] when the configuration has
    /// no Redis URL (the seed's rule), else [`Mode::Redis`].
    pub fn mode(&self) -> Mode {
        self.backend.mode()
    }

    /// This instance's id.
    pub fn instance_id(&self) -> &str {
        &self.id
    }

    /// Enters a host call: `Error::Stopped` once `shutdown`/`leave` began, else a guard that
    /// `shutdown`/`leave` wait for. (A recursive read: never blocks behind their wait, which
    /// only starts after `stopped` is set, so later calls fail at once.)
    /// Also `Error::Schema` while the node is parked by a foreign key schema stamp (it writes
    /// nothing of its layout then; heartbeat.rs).
    fn enter(&self) -> Result<RwLockReadGuard<'_, ()>> {
        let guard = self.enter_parked()?;
        if let Some(sh) = self.backend.shared() {
            if let Some(found) = sh.schema_refused.lock().clone() {
                return Err(crate::schema::refused(&sh.ctx.keys, found));
            }
        }
        Ok(guard)
    }

    /// [`Node::enter`] for the calls a parked node still serves: a read, and a tick (which
    /// tries to register again).
    fn enter_parked(&self) -> Result<RwLockReadGuard<'_, ()>> {
        let guard = self.ops.read_recursive();
        if self.stopped.load(Ordering::Acquire) {
            return Err(Error::Stopped);
        }
        Ok(guard)
    }

    /// After `stopped` is set: wakes the host calls that wait (a paced reap), so that
    /// [`Node::drain_calls`] does not wait for their pauses.
    fn wake_calls(&self) {
        if let Some(sh) = self.backend.shared() {
            sh.stopping.signal();
        }
    }

    /// After `stopped` is set: waits for the host calls that entered before.
    fn drain_calls(&self) {
        drop(self.ops.write());
    }

    /// Pins `room` for this instance: free rooms are taken, a pin whose owner's heartbeat is
    /// gone (or that expired) is taken over, a live owner's pin is left alone
    /// ([`PinOutcome::Held`]). Owned rooms are refreshed by every heartbeat tick.
    ///
    /// # Errors
    /// [`Error::InvalidId`], [`Error::Redis`], [`Error::BadData`] (a room key of the wrong
    /// type), [`Error::Stopped`].
    pub fn pin_room(&self, room: &str) -> Result<PinOutcome> {
        let _call = self.enter()?;
        let room = Id::new(IdKind::Room, room)?;
        let _guard = self.local.lock_room(&room.raw);
        let outcome = self.backend.pin_room(&room)?;
        if outcome.is_owned() {
            self.local.add_room(&room.raw);
            self.local.settled(&room.raw);
        }
        Ok(outcome)
    }

    /// Deletes `room`, its metadata and all its peers, if this instance owns it.
    ///
    /// # Errors
    /// [`Error::NotOwner`] when another instance (or nobody) owns it; [`Error::InvalidId`],
    /// [`Error::Redis`], [`Error::Stopped`].
    pub fn close_room(&self, room: &str) -> Result<()> {
        let _call = self.enter()?;
        let room = Id::new(IdKind::Room, room)?;
        let _guard = self.local.lock_room(&room.raw);
        // Forget it first so a concurrent heartbeat cannot report it lost.
        let held = self.local.has_room(&room.raw);
        self.local.remove_room(&room.raw);
        let out = self.backend.close_room(&room);
        match &out {
            // Unknown outcome: the host was told it failed, but the close may have run. The
            // heartbeat finishes it (owner CAS), so the room does not linger half-known.
            Err(e) if !e.outcome_known() => {
                self.local.mark_uncertain(&room.raw);
                self.local.reassert_everything();
            }
            // Lost meanwhile (another instance took it over): this instance's records there
            // go with the next tick's settlement, before the room leaves its index.
            Err(e) if held && e.kind() == crate::ErrorKind::NotOwner => {
                self.local.mark_uncertain(&room.raw)
            }
            Err(e) if held => self.local.add_room(&room.raw),
            _ => {}
        }
        out
    }

    /// The instance whose pin `room` carries now, if any.
    ///
    /// # Errors
    /// [`Error::InvalidId`], [`Error::Redis`], [`Error::BadData`], [`Error::Stopped`].
    pub fn room_owner(&self, room: &str) -> Result<Option<String>> {
        let _call = self.enter_parked()?;
        self.backend.room_owner(&Id::new(IdKind::Room, room)?)
    }

    /// Writes peer `peer` of `room` (which this instance must own) with the host's `fields`,
    /// and returns its generation (unique within the room; pass it to [`Node::remove_peer`]).
    ///
    /// Index entries that change (the peer's previous guest, a previous instance) are removed
    /// first; if `guest` already points at another peer (a quick reconnect with a new peer
    /// id), that peer's record is replaced (docs/DESIGN.md pitfall "upsert_peer without removing old
    /// index entries").
    ///
    /// # Errors
    /// [`Error::NotOwner`] when this instance does not own the room; [`Error::InvalidId`];
    /// [`Error::InvalidArgument`] for a reserved, empty or control-character field name or more
    /// than [`MAX_PEER_FIELDS`] fields; [`Error::Redis`], [`Error::BadData`], [`Error::Stopped`].
    pub fn upsert_peer(
        &self,
        room: &str,
        peer: &str,
        guest: Option<&str>,
        fields: &[(&str, &str)],
    ) -> Result<u64> {
        self.upsert_peer_detailed(room, peer, guest, fields)
            .map(|u| u.generation)
    }

    /// [`Node::upsert_peer`], also telling which peer of the same guest the upsert replaced
    /// (its record is gone; tear its transport down).
    ///
    /// # Errors
    /// As [`Node::upsert_peer`].
    pub fn upsert_peer_detailed(
        &self,
        room: &str,
        peer: &str,
        guest: Option<&str>,
        fields: &[(&str, &str)],
    ) -> Result<Upserted> {
        let _call = self.enter()?;
        let room = Id::new(IdKind::Room, room)?;
        let peer = Id::new(IdKind::Peer, peer)?;
        let guest = guest.map(|g| Id::new(IdKind::Guest, g)).transpose()?;
        check_fields(fields)?;
        let _guard = self.local.lock_room(&room.raw);
        let upserted = match self
            .backend
            .upsert_peer(&room, &peer, guest.as_ref(), fields)
        {
            Ok(u) => u,
            Err(e) => {
                if !e.outcome_known() || matches!(e, Error::Redis { .. }) {
                    // The record may have been written although the host is told the call
                    // failed: the heartbeat settles it.
                    self.local.mark_uncertain_upsert(&room.raw, &peer.raw);
                    // If it landed, it superseded the guest's previous peer here.
                    if let Some(g) = &guest {
                        self.local.mark_guest_suspects(&room.raw, &peer.raw, &g.raw);
                    }
                }
                return Err(e);
            }
        };
        let generation = upserted.generation;
        if let Some(old) = &upserted.replaced {
            self.local.remove_peer(&room.raw, old);
        }
        self.local.put_peer(
            &room.raw,
            &peer.raw,
            LocalPeer {
                guest: guest.map(|g| g.raw),
                fields: fields
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
                generation,
            },
        );
        Ok(upserted)
    }

    /// Removes peer `peer` of `room` if its record still carries `generation`; a delayed
    /// remove of an older connection is a no-op and returns `false` (invariant 4).
    ///
    /// # Errors
    /// [`Error::NotOwner`] when the record belongs to another instance (only the instance that
    /// hosts a peer removes it); [`Error::InvalidId`], [`Error::Redis`], [`Error::BadData`],
    /// [`Error::Stopped`].
    pub fn remove_peer(&self, room: &str, peer: &str, generation: u64) -> Result<bool> {
        let _call = self.enter()?;
        let room = Id::new(IdKind::Room, room)?;
        let peer = Id::new(IdKind::Peer, peer)?;
        let _guard = self.local.lock_room(&room.raw);
        let held = self.local.peer_generation(&room.raw, &peer.raw) == Some(generation);
        let removed = match self.backend.remove_peer(&room, &peer, generation) {
            Ok(r) => r,
            Err(e) => {
                if !e.outcome_known() && held {
                    // The remove may have run: forget the peer (a restore must never write it
                    // back) and let the heartbeat send the remove again.
                    self.local.remove_peer(&room.raw, &peer.raw);
                    self.local
                        .mark_uncertain_peer(&room.raw, &peer.raw, generation);
                    self.local.reassert_everything();
                }
                return Err(e);
            }
        };
        // A no-op for the generation this node holds means its record is gone (closed or
        // replaced elsewhere): forget it too, so a restore never writes it back.
        if removed || held {
            self.local.remove_peer(&room.raw, &peer.raw);
        }
        Ok(removed)
    }

    /// Runs one heartbeat tick now, on the calling thread: the heartbeat script, then the
    /// pipelined refresh of every pin (two round trips whatever the number of rooms), with the
    /// same handling of lost rooms, data loss and zombies as the heartbeat thread, which keeps
    /// its own schedule. For tooling and benchmarks. Only with the `testing` feature.
    ///
    /// # Errors
    /// [`Error::Redis`], [`Error::BadData`], [`Error::Stopped`]; [`Error::InvalidConfig`] in
    /// memory-only mode.
    #[cfg(feature = "testing")]
    pub fn heartbeat_now(&self) -> Result<()> {
        let _call = self.enter_parked()?;
        match &self.backend {
            Backend::Redis(r) => r.heartbeat_now(),
            Backend::Memory(_) => Err(Error::config("redis_url", "heartbeats need Redis")),
        }
    }

    /// Reaps one instance now, on the calling thread, as the leader's reaper would after its
    /// two-phase wait: the atomic re-check still runs (`Ok(None)` if `instance` has a heartbeat
    /// key, a fresh score, or is not registered), then its rooms and peers are removed with the
    /// owner-CAS scripts in batches, and [`Event::InstanceReaped`] is emitted. Only the *wait*
    /// is skipped: use it when you know the
    /// instance is dead (an orchestrator saw its process exit), for tooling, and in benchmarks.
    /// The reaper thread may reap the same instance concurrently; every step is idempotent.
    /// Only with the `testing` feature.
    ///
    /// # Errors
    /// [`Error::NotLeader`] unless this node holds the lease (also if it loses it midway);
    /// [`Error::InvalidId`]; [`Error::Redis`]; [`Error::BadData`]; [`Error::Stopped`];
    /// [`Error::InvalidConfig`] in memory-only mode.
    #[cfg(feature = "testing")]
    pub fn reap_now(&self, instance: &str) -> Result<Option<ReapCounts>> {
        let _call = self.enter()?;
        let dead = Id::new(IdKind::Instance, instance)?;
        match &self.backend {
            Backend::Redis(r) => r.reap_now(&dead),
            Backend::Memory(_) => Err(Error::config("redis_url", "reaping needs Redis")),
        }
    }

    /// Whether this node holds the reaper lease now (its local deadline has not passed).
    /// Always `false` in memory-only mode.
    pub fn is_leader(&self) -> bool {
        self.backend.shared().is_some_and(|s| s.is_leader())
    }

    /// This node's last leadership terms (up to 64, oldest first) on the local monotonic
    /// clock: when each started, its deadline, and when it ended. For audits and tests of
    /// invariant 3 (no two nodes' terms overlap). Empty in memory-only mode.
    pub fn terms(&self) -> Vec<TermRecord> {
        self.backend
            .shared()
            .map(|s| s.leader.history())
            .unwrap_or_default()
    }

    /// The event channel. Every clone of the receiver takes events from the same queue, so
    /// read it from one place. Bounded ([`EVENT_CAPACITY`]); events that find it full are
    /// dropped and counted. [`Event::Stopped`] is the last event: the channel disconnects
    /// after it, so `for event in node.events()` ends on shutdown.
    pub fn events(&self) -> Receiver<Event> {
        self.events_rx.clone()
    }

    /// The last [`EMITTED_HISTORY`](crate::EMITTED_HISTORY) events this node emitted,
    /// oldest first, each with the monotonic time its emitting thread sent it (whether or not
    /// the channel took it). For timing what the node did between two events (the two-phase
    /// wait between `candidates` and `instance_reaped`) without the reader's scheduling in
    /// the measure; [`Node::terms`] does the same for leadership terms.
    pub fn emitted(&self) -> Vec<crate::EmittedEvent> {
        self.events.history()
    }

    /// Emits [`Event::Ready`] with the current room and peer counts. Call it once the host's
    /// start-up pins and peers are written; operators' tooling waits for it.
    pub fn ready(&self) {
        if self.stopped.load(Ordering::Acquire) {
            return;
        }
        self.events.emit(Event::Ready {
            rooms: self.local.room_count(),
            peers: self.local.peer_count(),
            mode: self.backend.mode(),
        });
    }

    /// A snapshot of the node's state and counters.
    pub fn stats(&self) -> Stats {
        let mut s = Stats {
            instance_id: self.id.clone(),
            redis: self.backend.mode() == Mode::Redis,
            mode: self.backend.mode(),
            is_leader: false,
            epoch: None,
            rooms: self.local.room_count(),
            peers: self.local.peer_count(),
            heartbeats: 0,
            heartbeat_failures: 0,
            last_heartbeat_age: None,
            redis_errors: 0,
            bad_data: 0,
            last_error: None,
            instances_reaped: 0,
            rooms_reaped: 0,
            peers_reaped: 0,
            skipped_rooms: 0,
            reap_candidates: 0,
            leadership_terms: 0,
            reconnects: 0,
            script_reloads: 0,
            events_dropped: self.events.dropped(),
            data_losses: 0,
            reaped_self: 0,
        };
        if let Some(sh) = self.backend.shared() {
            let c = &sh.counters;
            let term = sh.leader.current();
            s.is_leader = sh.is_leader();
            s.epoch = term.map(|t| t.epoch);
            s.heartbeats = c.heartbeats.load(Ordering::Relaxed);
            s.heartbeat_failures = c.heartbeat_failures.load(Ordering::Relaxed);
            s.last_heartbeat_age = c.last_heartbeat.lock().map(|t| t.elapsed());
            s.redis_errors = c.redis_errors.load(Ordering::Relaxed);
            s.bad_data = c.bad_data.load(Ordering::Relaxed);
            s.last_error = c.last_error.lock().clone();
            s.instances_reaped = c.instances_reaped.load(Ordering::Relaxed);
            s.rooms_reaped = c.rooms_reaped.load(Ordering::Relaxed);
            s.peers_reaped = c.peers_reaped.load(Ordering::Relaxed);
            s.skipped_rooms = c.skipped_rooms.load(Ordering::Relaxed);
            s.reap_candidates = c.candidates.load(Ordering::Relaxed);
            s.leadership_terms = sh.leader.terms_begun();
            s.reconnects = sh.redis.stats().reconnects();
            s.script_reloads = sh.redis.stats().script_reloads();
            s.data_losses = c.data_losses.load(Ordering::Relaxed);
            s.reaped_self = c.reaped_self.load(Ordering::Relaxed);
        }
        s
    }

    /// Whether this node is healthy, and why: what an orchestrator's liveness probe should
    /// ask (`GET /healthz` of `sfu-redis node --metrics-addr` answers it).
    ///
    /// - `ok` when the last successful heartbeat tick is younger than `heartbeat_ttl`: the
    ///   instance's heartbeat key still lives, so the fleet sees it alive. Not ok once it is
    ///   older (Redis unreachable or slow for a whole TTL: the node's rooms are at risk of
    ///   being reaped after the stale threshold); the reason then names the last error.
    /// - Memory-only mode: always `ok` (there is no heartbeat to miss).
    /// - After [`Node::shutdown`] / [`Node::leave`] (or a simulated crash): not ok, "stopped".
    ///
    /// Reads a few atomics and one lock; no Redis call.
    pub fn health(&self) -> Health {
        if self.stopped.load(Ordering::Acquire) {
            return Health {
                ok: false,
                reason: "stopped".to_owned(),
            };
        }
        let Some(sh) = self.backend.shared() else {
            return Health {
                ok: true,
                reason: "memory-only mode: no heartbeat".to_owned(),
            };
        };
        let ttl = sh.ctx.timings.heartbeat_ttl;
        let age = sh.counters.last_heartbeat.lock().map(|t| t.elapsed());
        let secs = |d: Duration| format!("{:.3} s", d.as_secs_f64());
        match age {
            Some(age) if age < ttl => Health {
                ok: true,
                reason: format!(
                    "last heartbeat {} ago (heartbeat_ttl {})",
                    secs(age),
                    secs(ttl)
                ),
            },
            _ => {
                let when = age.map_or("never".to_owned(), |a| format!("{} ago", secs(a)));
                let last = sh
                    .counters
                    .last_error
                    .lock()
                    .clone()
                    .unwrap_or_else(|| "none recorded".to_owned());
                Health {
                    ok: false,
                    reason: format!(
                        "no successful heartbeat within heartbeat_ttl {} (last one {when}); last error: {last}",
                        secs(ttl)
                    ),
                }
            }
        }
    }

    /// The node's metrics in the Prometheus text exposition format 0.0.4
    /// ([`MetricsFormat::Prometheus`]; content type
    /// `text/plain; version=0.0.4; charset=utf-8`), for a host to serve on its own
    /// `/metrics` endpoint. Every name starts with `sfu_redis_`, durations are in seconds,
    /// counters end in `_total`; the list is in docs/src/reference/metrics.md. Counters start at 0
    /// when the node starts. Works in memory-only mode (heartbeat, leader and reap metrics
    /// stay 0) and after shutdown (the last values).
    ///
    /// Cheap to record, rendered only here: a few microseconds per call, no Redis call.
    pub fn metrics(&self) -> String {
        self.metrics_as(MetricsFormat::Prometheus)
    }

    /// [`Node::metrics`] in the given format (OpenMetrics when the scraper asks for it:
    /// [`MetricsFormat::from_accept`]).
    pub fn metrics_as(&self, format: MetricsFormat) -> String {
        metrics::render(self.snapshot(), format)
    }

    /// Every value of a scrape, read now.
    fn snapshot(&self) -> Snapshot {
        let s = self.stats();
        let mut snap = Snapshot {
            instance: s.instance_id,
            mode: s.mode.as_str(),
            prefix: self.prefix.clone(),
            healthy: self.health().ok,
            heartbeat_age: s.last_heartbeat_age,
            heartbeats: s.heartbeats,
            heartbeat_failures: s.heartbeat_failures,
            slow_ticks: 0,
            tick: metrics::DurationHistogram::new(metrics::TICK_BUCKETS).snapshot(),
            is_leader: s.is_leader,
            leader_epoch: s.epoch.unwrap_or(0),
            epoch_seen: 0,
            leadership_terms: s.leadership_terms,
            candidates: s.reap_candidates,
            reaps: s.instances_reaped,
            reaped_rooms: s.rooms_reaped,
            reaped_peers: s.peers_reaped,
            skipped_rooms: s.skipped_rooms,
            reap: metrics::DurationHistogram::new(metrics::REAP_BUCKETS).snapshot(),
            redis_errors: [0; 4],
            bad_data: s.bad_data,
            reconnects: s.reconnects,
            script_reloads: s.script_reloads,
            master_switches: 0,
            events_dropped: s.events_dropped,
            data_losses: s.data_losses,
            reaped_self: s.reaped_self,
            rooms: s.rooms as u64,
            peers: s.peers as u64,
        };
        if let Some(sh) = self.backend.shared() {
            let c = &sh.counters;
            snap.slow_ticks = c.slow_ticks.load(Ordering::Relaxed);
            snap.tick = c.tick_seconds.snapshot();
            snap.reap = c.reap_seconds.snapshot();
            snap.epoch_seen = sh.max_epoch.load(Ordering::Relaxed).max(snap.leader_epoch);
            snap.redis_errors =
                std::array::from_fn(|i| c.redis_errors_by_kind[i].load(Ordering::Relaxed));
            snap.master_switches = sh.redis.master_switches();
        }
        snap
    }

    /// Stops the worker threads, releases the lease (owner CAS) and emits [`Event::Stopped`].
    /// Pins and peers stay in Redis: they are reaped once this instance is seen dead, unless
    /// the host closed them, or a restart with the same instance id clears them at its
    /// registration (an earlier life's leftovers). Host calls still running are waited for,
    /// then the heartbeat key is marked released (it keeps its TTL, so the instance still
    /// counts as alive until it expires): a restart with the same id starts at once instead of
    /// waiting for it to expire. Not released if this process ever saw another process tick
    /// under its id (a duplicate): that one may still be live. Idempotent; also run by `Drop`. Later calls on the node return
    /// [`Error::Stopped`].
    ///
    /// # Errors
    /// None today; the signature leaves room for reporting a failed release.
    pub fn shutdown(&self) -> Result<()> {
        if self.stopped.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.wake_calls();
        self.drain_calls();
        // The heartbeat thread marks the heartbeat released as it exits.
        self.join_workers();
        self.events.close(Event::Stopped);
        Ok(())
    }

    /// Leaves the cluster for good: stops the worker threads (releasing the lease), closes
    /// every room this node owns (with their peers), removes its other peer records, and
    /// deletes its heartbeat registration, so other instances can pin its rooms at once instead
    /// of waiting for the reaper. Then emits [`Event::Stopped`]. For a planned shutdown whose
    /// media goes away with the process; [`Node::shutdown`] keeps the rooms (they are reaped
    /// once the instance is seen dead). Idempotent with `shutdown`: only the first call acts.
    ///
    /// A clean-up that fails (Redis unreachable, a timeout, bad data) stops at the first call
    /// that could not reach Redis and does **not** deregister: the instance stays in the
    /// heartbeat sorted set with its heartbeat released, so once its score is older than its
    /// stale threshold a leader reaps what is left, after the two-phase delay, as for an
    /// instance that died (invariant 2: deregistering would hide the leftovers from every
    /// reaper). A restart with the same instance id clears them at its registration too.
    ///
    /// # Errors
    /// The first error met, its message prefixed with how many rooms and peers were not
    /// removed and that the instance stays registered for the reaper.
    pub fn leave(&self) -> Result<()> {
        if self.stopped.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.wake_calls();
        self.drain_calls();
        self.join_workers();
        let out = self.release_everything();
        self.events.close(Event::Stopped);
        out
    }

    fn release_everything(&self) -> Result<()> {
        let Backend::Redis(store) = &self.backend else {
            return Ok(());
        };
        // A node parked by a foreign key schema stamp writes nothing under the prefix (it
        // forgot its rooms when it was parked): the leave ends as a shutdown does.
        if let Some(found) = store.shared().schema_refused.lock().clone() {
            return Err(crate::schema::refused(&store.shared().ctx.keys, found));
        }
        let mut first_error: Option<Error> = None;
        // A call that could not reach Redis (timeout, dropped connection) ends the clean-up:
        // the next ones would wait as long for nothing. What is left goes to the reaper.
        let note = |first: &mut Option<Error>, e: Error| {
            let cut = !e.outcome_known() || e.is_connection_error();
            first.get_or_insert(e);
            cut
        };
        let mut cut = false;
        let (rooms, mut rooms_left) = (self.local.rooms(), 0);
        for (i, room) in rooms.iter().enumerate() {
            let Ok(id) = Id::new(IdKind::Room, room) else {
                continue;
            };
            match store.close_room(&id) {
                Ok(()) | Err(Error::NotOwner { .. }) => self.local.remove_room(room),
                Err(e) => {
                    rooms_left += 1;
                    if note(&mut first_error, e) {
                        rooms_left += rooms.len() - i - 1;
                        cut = true;
                        break;
                    }
                }
            }
        }
        let mut peers_left = 0;
        if !cut {
            let peers = self.local.peers();
            for (i, (room, peer, p)) in peers.iter().enumerate() {
                let (Ok(r), Ok(pe)) = (Id::new(IdKind::Room, room), Id::new(IdKind::Peer, peer))
                else {
                    continue;
                };
                match store.remove_peer(&r, &pe, p.generation) {
                    // Another instance's record now: not this one's to remove.
                    Ok(_) | Err(Error::NotPeerOwner { .. }) => {}
                    Err(e) => {
                        peers_left += 1;
                        if note(&mut first_error, e) {
                            peers_left += peers.len() - i - 1;
                            break;
                        }
                    }
                }
            }
        } else {
            peers_left = self.local.peer_count();
        }
        if first_error.is_none() && !cut {
            // Rooms it lost keep its records until it deletes them (key schema version 2).
            match store.settle_unheld() {
                Ok(0) => {}
                Ok(n) => {
                    rooms_left += n;
                    first_error = Some(Error::bad_data(
                        "leave",
                        format!("{n} rooms of this instance's room index could not be settled (bad data, or held again)"),
                    ));
                }
                Err(e) => {
                    first_error = Some(e);
                }
            }
        }
        match first_error {
            // Deregistered only when nothing it owned is left (invariant 2).
            None => store.deregister().map(|_| ()),
            // Still registered, its heartbeat released by the heartbeat thread's stop: its
            // score ages past the stale threshold and the leader reaps the rest, as for any
            // instance that died. Deregistering here would hide it from every reaper.
            Some(e) => Err(e.within(&format!(
                "leave: {rooms_left} rooms and {peers_left} peers of this instance were not removed; \
                 it stays registered (its heartbeat released, or expiring by its TTL) so that a \
                 leader reaps them once its heartbeat is stale"
            ))),
        }
    }

    /// Stops the worker threads with no cleanup at all, as `kill -9` would: the lease is not
    /// released and nothing is written. For demos and tests of the reaper. Only with the
    /// `testing` feature.
    #[cfg(feature = "testing")]
    pub fn simulate_crash(&self) {
        if self.stopped.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(sh) = self.backend.shared() {
            sh.crashed.store(true, Ordering::Relaxed);
            sh.stopping.signal();
        }
        self.join_workers();
    }

    fn join_workers(&self) {
        let Some(w) = self.workers.lock().take() else {
            return;
        };
        drop(w.shutdown);
        for h in w.handles {
            let name = h.thread().name().unwrap_or("worker").to_owned();
            if h.join().is_err() {
                log::error!("thread {name} panicked");
            }
        }
        // A stopped (or crashed) node acts as nothing, whatever its last term's deadline.
        if let Some(sh) = self.backend.shared() {
            sh.leader.end();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

fn check_fields(fields: &[(&str, &str)]) -> Result<()> {
    let bad = |reason: String| Error::InvalidArgument {
        what: "peer field",
        reason,
    };
    if fields.len() > MAX_PEER_FIELDS {
        return Err(bad(format!(
            "{} fields given; at most {MAX_PEER_FIELDS} are allowed",
            fields.len()
        )));
    }
    for (k, _) in fields {
        if k.is_empty() || k.len() > 256 || k.chars().any(char::is_control) {
            return Err(bad(format!(
                "name {k:?} must be 1 to 256 bytes without control characters"
            )));
        }
        if RESERVED_PEER_FIELDS.contains(k) {
            return Err(bad(format!("name {k:?} is reserved by sfu-redis")));
        }
    }
    Ok(())
}

/// Most heartbeat TTLs of its own a start waits for a crashed process's heartbeat key of the
/// same id (one written with a longer TTL, by a process of other timings) to expire.
const START_WAIT_TTLS: u32 = 10;

/// First registration. A heartbeat key holding another boot token means another process uses
/// this instance id, or a crashed one did until its key expires: retried until the longer of
/// this node's `heartbeat_ttl` and the key's remaining TTL when first met (the other process's
/// own TTL, which may be longer; at most [`START_WAIT_TTLS`] of this node's), plus one
/// interval, has passed, then refused. The key's TTL is read once: a live process refreshes
/// it, so waiting for it to run out would never end.
fn register_at_start(sh: &Shared) -> Result<()> {
    let mut link = Link::new();
    let t = &sh.ctx.timings;
    let mut give_up = Instant::now() + t.heartbeat_ttl + t.heartbeat_interval;
    let mut read_ttl = false;
    loop {
        let t0 = link.run(&sh.redis, conn::server_time_us)?;
        match heartbeat::register(sh, &mut link, t0) {
            Err(Error::InvalidConfig { field, reason }) if field == "instance_id" => {
                if !read_ttl {
                    read_ttl = true;
                    // PTTL: -2 no key, -1 no expiry (not written by this crate): own TTL then.
                    let key = sh.ctx.keys.heartbeat(&sh.ctx.me);
                    let pttl = link.run(&sh.redis, |c| {
                        redis::cmd("PTTL")
                            .arg(&key)
                            .query::<i64>(c)
                            .map_err(|e| Error::redis("read the heartbeat key's TTL", e))
                    });
                    if let Ok(ms) = pttl {
                        if ms > 0 {
                            let left = Duration::from_millis(ms as u64)
                                .min(t.heartbeat_ttl * START_WAIT_TTLS);
                            give_up = give_up.max(Instant::now() + left + t.heartbeat_interval);
                        }
                    }
                }
                if Instant::now() >= give_up {
                    return Err(Error::InvalidConfig { field, reason });
                }
                log::warn!(
                    "instance id {:?} is still registered by another process; waiting for its heartbeat to expire",
                    sh.id
                );
                std::thread::sleep(t.heartbeat_interval);
            }
            other => return other,
        }
    }
}

fn spawn_workers(shared: &Arc<Shared>) -> Result<Workers> {
    let (shutdown_tx, shutdown_rx) = bounded::<()>(0);
    let (demoted_tx, demoted_rx) = bounded::<()>(1);
    let mut handles = Vec::new();
    let mut spawn = |name: &str, f: Box<dyn FnOnce() + Send>| -> Result<()> {
        // Signals blocked for the thread's life (the crate's signals module).
        let h = crate::signals::spawn(std::thread::Builder::new().name(name.to_owned()), f)
            .map_err(|e| Error::Io {
                op: format!("spawn thread {name}"),
                source: e,
            })?;
        handles.push(h);
        Ok(())
    };
    let (sh, rx) = (Arc::clone(shared), shutdown_rx.clone());
    spawn("sfu-heartbeat", Box::new(move || heartbeat::run(&sh, &rx)))?;
    let (sh, rx) = (Arc::clone(shared), shutdown_rx.clone());
    spawn(
        "sfu-lease",
        Box::new(move || lease::run(&sh, &rx, &demoted_tx)),
    )?;
    let (sh, rx) = (Arc::clone(shared), shutdown_rx);
    spawn(
        "sfu-reaper",
        Box::new(move || reaper::run(&sh, &rx, &demoted_rx)),
    )?;
    Ok(Workers {
        shutdown: shutdown_tx,
        handles,
    })
}
