//! An exhaustive model check of the sfu-redis protocol (heartbeats, the leader lease, the
//! two-phase owner-CAS reaper, rooms and peers under key schema version 2) with `stateright`.
//!
//! Redis is one store ([`store::Redis`]) whose scripts are atomic functions mirroring
//! `lua/*.lua`; each instance ([`node::Node`]) acts through the steps of the Rust code
//! (`src/heartbeat.rs`, `src/lease.rs`, `src/reaper.rs`, `src/rooms.rs`, `src/peers.rs`,
//! `src/node.rs`); faults (crash, pause, lost reply, crash between two steps, Redis data loss,
//! a failover to a replica missing the last writes) are actions.
//! See README.md for what is modelled, the bounds and every simplification.

pub mod config;
pub mod node;
pub mod store;

use stateright::{Model, Property};

pub use config::{Config, Mutation, Timings};
use node::{Node, Phase, Reaper};
use store::{Beat, Begin, Deleted, Finish, Id, PinReply, Redis, Refreshed, RoomStatus, Rooms};

/// (a) At most one instance acts as leader (a term whose local deadline has not passed).
pub const P_ONE_LEADER: &str = "a: at most one leader by local deadline";
/// (a) Every acquire hands out a higher epoch than any before.
pub const P_EPOCHS: &str = "a: fencing epochs increase";
/// (a) The lease key names the winner of the latest term (refresh never recreates or steals).
pub const P_LEASE_TERM: &str = "a: the lease names its term's winner";
/// (b) No reap deletes a room or record of a live instance's current life.
pub const P_LIVE_SAFE: &str = "b: a live instance's rooms and records are never reaped";
/// (c) Nothing names an instance that is down and deregistered (a completed reap, a leave).
pub const P_NOTHING_LEFT: &str = "c: nothing left of a reaped or departed instance";
/// (d) Every record naming I lies in a room of I's room index or moved index.
pub const P_REACHABLE: &str = "d: every record is reachable from its instance's index";
/// (e) After a clean tick, an instance's room index is exactly the rooms it holds.
pub const P_INDEX_MATCHES: &str = "e: a ticked instance's index matches what it holds";
/// (f) At the end of a tick, every room an instance holds is pinned by it (pin and metadata
/// naming it) and every peer it holds has its record; and the first full tick after data loss
/// or a master switch reports a room it held lost only if another instance's pin or metadata
/// names it (everything else is written back).
pub const P_HELD_STORED: &str =
    "f: after a tick, what an instance holds is on Redis (after a loss: lost only to another)";
/// Examples: the check is not vacuous.
pub const S_REAP_DONE: &str = "sometimes: a reap completes";
pub const S_TAKEOVER: &str = "sometimes: a room is taken over";
pub const S_LEASE_MOVED: &str = "sometimes: the lease changes hands";
pub const S_ZOMBIE: &str = "sometimes: a reaped zombie registers again";
/// (c) An instance that is down and not in the sorted set has nothing left: whatever it wrote
/// is in a leader's reach (a zombie's write after its reap completed, a leave during a reap:
/// model findings 1-3, fixed by index_add.lua and deregister.lua handing it to the reaper).
pub const P_IN_REACH: &str = "c: a down instance's leftovers are in a leader's reach";
pub const S_KEPT: &str = "sometimes: a reap keeps a room written after t0";
pub const S_RESTORED: &str = "sometimes: a heartbeat finds Redis lost its data (restored)";
pub const S_WRITTEN_BACK: &str =
    "sometimes: an instance writes back what it holds (after data loss or a master switch)";
pub const S_REREGISTERED: &str =
    "sometimes: a failover loses a registration that is registered again";
/// An epoch handed out a second time (data loss or failover; see README "Findings").
pub const S_EPOCH_AGAIN: &str =
    "finding: an epoch is handed out again (its holder did not write it back within a lease TTL of the loss)";
/// A failover lost the heartbeat that made an instance live again after a pause past the
/// stale threshold: the new master's leader reaps it (README "Findings").
pub const S_BEAT_LOST: &str =
    "finding: a live instance whose last heartbeat a failover lost is reaped on the new master";
/// A registration that finds Redis lost its data (a zombie's, between the tick that found it
/// reaped and its registration) asks for no restore: rooms its host pinned meanwhile are
/// reported lost at the next tick instead of written back (README "Findings").
pub const S_REGISTER_RESTORED: &str =
    "finding: data loss before a zombie registers again: rooms pinned meanwhile are reported lost, not written back";
/// (b) The lost-registration rule never takes a reap of the instance's current life (begun
/// on this master or on one it replicated) for a registration a failover lost: such a zombie
/// reports its rooms lost and registers as a new life, never writes them back (it did before
/// the reap tombstone: README "Findings" 7 and 8, the rule's old price).
pub const P_NO_PRICE: &str = "b: a reap of this very life is never taken as a lost registration";
/// (b) index_add.lua never hands a running instance whose registration a failover lost to the
/// reaper (score 0): a leader could reap it while it lives (README "Findings" 9).
pub const P_NO_MARK: &str =
    "b: index_add never marks a live instance whose registration a failover lost";
/// (b) The other half of the tombstone's contract: 'zombie' answers only a life a reap of
/// which began (on this master or on one it replicated), never a registration a failover
/// lost (that life would report its rooms lost and start again; checked with
/// `Config::failover`, where the ghosts that tell the two apart are kept).
pub const P_ZOMBIE_TRUE: &str = "b: 'zombie' answers only a life a reap of which began";
/// The reap tombstone at work: a zombie whose registration no replica acknowledged meets its
/// reap on a new master ('zombie'), where the lost-registration rule alone would have read a
/// lost registration.
pub const S_ZOMBIE_LOST: &str =
    "sometimes: an unacknowledged zombie on a new master is told its reap ('zombie')";

const BAD_LIVE: u8 = 1;
const BAD_LEFT: u8 = 2;
const BAD_EPOCH: u8 = 4;
const BAD_HELD: u8 = 8;
const BAD_PRICE: u8 = 16;
const BAD_MARK: u8 = 32;
const BAD_ZOMBIE: u8 = 64;

const SEEN_REAP_DONE: u16 = 1;
const SEEN_TAKEOVER: u16 = 2;
const SEEN_LEASE_MOVED: u16 = 4;
const SEEN_ZOMBIE: u16 = 8;
const SEEN_KEPT: u16 = 16;
const SEEN_RESTORED: u16 = 32;
const SEEN_WRITTEN_BACK: u16 = 64;
const SEEN_REREGISTERED: u16 = 128;
const SEEN_ZOMBIE_LOST: u16 = 256;
const SEEN_EPOCH_AGAIN: u16 = 512;
const SEEN_BEAT_LOST: u16 = 1024;
const SEEN_REGISTER_RESTORED: u16 = 2048;

/// A fault injected into one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    None,
    /// The script ran; its reply was lost (the caller sees an error of unknown outcome).
    LostReply,
    /// The process crashed between the call's two steps (after the index `SADD` of a pin,
    /// after the script of a close).
    CrashMid,
}

/// One step of one instance, a fault, or time passing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// One unit of time passes (TTLs run out).
    Advance,
    /// The heartbeat thread: one whole tick (without `Config::split_tick`).
    Tick(Id),
    /// The heartbeat thread: heartbeat.lua ('tick').
    Beat(Id),
    /// The heartbeat thread: the rest of the tick (settlements, re-assert and walk of the
    /// index, pin refresh, lost rooms).
    Refresh(Id),
    /// A zombie's registration and clean-up of its earlier life.
    Register(Id),
    /// A new process of a stopped instance id starts (register + clean-up).
    Restart(Id),
    Pin(Id, Id, Fault),
    /// Mutation `UpsertBeforeIndex`: the index entry of a pin, written late.
    PinIndex(Id, Id),
    Close(Id, Id, Fault),
    Upsert(Id, Id, Id, Fault),
    Remove(Id, Id, Id, Fault),
    /// The lease thread sends an acquire or a refresh (its local clock read first).
    LeaseSend(Id),
    /// The request runs on Redis and its reply is handled.
    LeaseExec(Id, Fault),
    /// `LeaseSend` and `LeaseExec` at once (without `Config::split_lease`).
    Lease(Id, Fault),
    /// The reaper thread's next step.
    Reap(Id),
    /// `Node::leave`; `Fault::LostReply`: its first close fails.
    Leave(Id, Fault),
    Crash(Id),
    /// `heartbeat::confirm_registration`: `WAIT 1` (`lease::replicated`) on the master the
    /// registration was last found on, after a registration or at the end of a tick.
    Confirm(Id),
    /// Redis loses its data (a fault; `Config::data_loss`).
    DataLoss,
    /// The replica catches up with the master (asynchronous replication, at any time;
    /// `Config::failover`).
    Replicate,
    /// The replica replaces the master, without the writes since it last caught up (a fault;
    /// `Config::failover`).
    Failover,
}

/// The whole system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    pub redis: Redis,
    pub nodes: Vec<Node>,
    pub faults: u8,
    pub host_calls: u8,
    /// The winner of the latest term (ghost).
    pub winner: Option<Id>,
    /// Ghost: violations seen by a transition (BAD_*).
    pub bad: u8,
    /// Ghost: interesting things the last action did (SEEN_*; cleared by the next action, so
    /// that it multiplies only the states right after such an action).
    pub seen: u16,
    /// The replica (`Config::failover`): the master as it was when the replica last caught
    /// up. `None` without failover, or once no fault is left (no failover can come).
    pub replica: Option<Redis>,
    /// Master switches so far: what every connection made from now on counts
    /// (`conn::Redis::master_switches`; a switch drops every older connection).
    pub switches: u8,
    /// Ghost (with data loss or failover): the highest epoch handed out so far.
    pub epoch_hwm: u8,
}

/// The model: its configuration.
#[derive(Debug, Clone)]
pub struct SfuModel {
    pub cfg: Config,
}

impl SfuModel {
    pub fn new(cfg: Config) -> SfuModel {
        assert!(cfg.rooms <= 8 && cfg.rooms * cfg.peers <= 8 && cfg.instances <= 8);
        // A lease request sent before a switch and executed after it is not modelled (it
        // would run on the old master).
        assert!(
            !(cfg.failover && cfg.split_lease),
            "failover with split_lease"
        );
        assert!((cfg.max_upserts as u16) < store::GEN_SCALE);
        SfuModel { cfg }
    }

    fn peers_of(&self, r: Id) -> impl Iterator<Item = (Id, usize)> {
        let p = self.cfg.peers;
        (0..p).map(move |q| (q, (r * p + q) as usize))
    }

    /// Whether `i`'s current life is live: registered and heartbeated within the stale
    /// threshold (server time).
    fn live(&self, s: &State, i: Id) -> bool {
        let n = &s.nodes[i as usize];
        n.phase == Phase::Running
            && n.last_beat != 0
            && n.last_beat as i16 >= s.redis.now as i16 - self.cfg.timings.stale as i16
    }

    /// Flags what a reap deleted of a live instance's current life. One life is set apart as a
    /// finding (README): one live only by a heartbeat a failover lost.
    fn check_deleted(&self, s: &mut State, d: &Deleted) {
        let victims = d
            .room_of
            .into_iter()
            .chain(d.records.iter().flatten().copied());
        for (i, life) in victims {
            let n = &s.nodes[i as usize];
            if self.live(s, i) && n.life == life {
                if n.beat_lost {
                    s.seen |= SEEN_BEAT_LOST;
                } else {
                    s.bad |= BAD_LIVE;
                }
            }
        }
    }

    /// `rooms::sweep_own` then the `SREM` (`heartbeat::unindex_unheld`): `i`'s records in a
    /// room it does not hold, then its entry; a room found ours again keeps its entry.
    fn unindex_unheld(&self, s: &mut State, i: Id, r: Id) {
        if s.redis.sweep_own(&self.cfg, i, r) {
            s.redis.index_remove(i, 1 << r);
        }
    }

    /// `reaper::clean_own_leftovers`: `i`'s own live index walked with reap_room.lua (`i` as
    /// the dead instance, `t0`); rooms done and not held leave the index.
    fn clean_own(&self, s: &mut State, i: Id, t0: u8) {
        let rooms = s.redis.index[i as usize];
        for r in 0..self.cfg.rooms {
            if rooms & (1 << r) == 0 {
                continue;
            }
            let mut d = Deleted::default();
            let (status, late) = s.redis.reap_room(&self.cfg, i, Some(t0), r, &mut d);
            self.check_deleted(s, &d);
            let done = status != RoomStatus::NewLife && late == 0;
            if done && s.nodes[i as usize].held & (1 << r) == 0 {
                s.redis.index_remove(i, 1 << r);
            }
        }
    }

    /// Ghost (with `Config::failover`): a reap of `i`'s current life marked or removed its
    /// sorted-set entry on the current master (not one of an earlier life whose mark the
    /// master still has), whatever the tombstone says.
    fn reaped_here(&self, s: &State, i: Id) -> bool {
        s.redis.reaped_mark & (1 << i) != 0
            && s.redis.entry_life[i as usize] == s.nodes[i as usize].life
    }

    /// `heartbeat::beat`: heartbeat.lua with what the node knows (the dataset token it saw
    /// last, the highest epoch it has seen, this life's `started_ms`: its life), the status as
    /// the library reads it, and what it notes: the token, the epoch in the reply, whether the
    /// registration awaits a replica's acknowledgement (written now, or found on another
    /// master); a term ends when Redis lost its data.
    fn beat(&self, s: &mut State, i: Id, register: bool) -> Beat {
        let c = &self.cfg;
        let iu = i as usize;
        let made = s.switches;
        let (boot, known, seen, life) = {
            let n = &s.nodes[iu];
            (n.boot, n.token, n.max_epoch, n.life)
        };
        let reply = if register {
            s.redis.heartbeat_register(c, i, boot, known, seen, life)
        } else {
            s.redis.heartbeat_tick(c, i, boot, known, seen, life)
        };
        let reaped_here = c.failover && self.reaped_here(s, i);
        let n = &mut s.nodes[iu];
        // `registration_lost`.
        let lost = n.unconfirmed && made != n.reg_switches;
        let beat = match reply.status {
            Beat::Ok if known.is_some() && reply.token != known => Beat::Restored,
            // A reap of this very life began: reaped, whatever master this is.
            Beat::Zombie => {
                if lost {
                    s.seen |= SEEN_ZOMBIE_LOST;
                }
                Beat::Reaped
            }
            Beat::Missing | Beat::Reaped if lost => Beat::Unregistered,
            b => b,
        };
        if beat == Beat::Unregistered && reaped_here {
            // A real reap of this life, taken as a lost registration (the old price).
            s.bad |= BAD_PRICE;
        }
        if reply.status == Beat::Zombie && c.failover && !reaped_here {
            s.bad |= BAD_ZOMBIE;
        }
        let written = beat == Beat::Restored || (register && beat == Beat::Ok);
        if c.failover && (written || (beat == Beat::Ok && made != n.reg_switches)) {
            n.unconfirmed = true;
            n.reg_switches = made;
        }
        if beat == Beat::Restored {
            n.demote();
        }
        if matches!(beat, Beat::Ok | Beat::Restored) || (beat == Beat::Duplicate && !register) {
            n.token = reply.token;
            n.beat_lost = false;
            if c.failover {
                s.redis.entry_life[iu] = n.life;
            }
        }
        if c.data_loss || c.failover {
            n.max_epoch = n.max_epoch.max(reply.epoch);
        }
        beat
    }

    /// heartbeat.lua ('register'), the clean-up of the earlier life, the held rooms put back
    /// (`heartbeat::register`). `false`: refused as a duplicate (nothing written).
    fn register(&self, s: &mut State, i: Id, t0: u8) -> bool {
        let iu = i as usize;
        if self.cfg.failover {
            s.nodes[iu].life_t0 = t0;
        }
        match self.beat(s, i, true) {
            Beat::Duplicate => return false,
            // `heartbeat::register` asks for a restore: what the host holds (pinned since the
            // reap was noticed) is written back by the next tick (README "Findings" 6, fixed).
            Beat::Restored => s.nodes[iu].restore = true,
            _ => {}
        }
        let now = s.redis.now;
        let n = &mut s.nodes[iu];
        n.phase = Phase::Running;
        n.last_beat = now;
        n.beat_done = false;
        n.clean = false;
        self.clean_own(s, i, t0);
        let held = s.nodes[iu].held;
        self.index_add(s, i, held);
        true
    }

    /// `rooms::index_add` (index_add.lua): ARGV[2] '0' (never mark) while the node's
    /// registration is unconfirmed (`registration_unconfirmed`), else '1'. Flags a mark of a
    /// running instance, on the dataset it knows, whose entry no reap of its current life
    /// removed: a registration a failover lost (property `P_NO_MARK`; registrations are lost
    /// only with `Config::failover`). Whether any room was new.
    fn index_add(&self, s: &mut State, i: Id, rooms: Rooms) -> bool {
        let iu = i as usize;
        let may_mark = !s.nodes[iu].unconfirmed;
        let life = s.nodes[iu].life;
        let (added, marked) = s.redis.index_add(&self.cfg, i, rooms, may_mark, life);
        if marked && self.cfg.failover {
            let n = &s.nodes[iu];
            if n.phase == Phase::Running
                && n.token == s.redis.dataset.map(|d| d.gen)
                && !self.reaped_here(s, i)
            {
                s.bad |= BAD_MARK;
            }
        }
        added
    }

    /// `heartbeat::resume_after_reap` up to its registration: every room forgotten, the term
    /// ended; a new life starts (what the process writes from now on is its).
    fn reaped(&self, s: &mut State, i: Id) {
        let now = s.redis.now;
        let n = &mut s.nodes[i as usize];
        let lost = n.clear();
        n.demote();
        // `resume_after_reap`: the registration is gone for certain (a reap took it), so no
        // failover can have lost it: index writes until the next registration may mark.
        n.unconfirmed = false;
        n.life += 1;
        n.last_beat = 0;
        n.clean = false;
        n.beat_done = false;
        n.restore = false;
        n.phase = Phase::Reregister { t0: now, lost };
    }

    /// `heartbeat::register_lost`: a failover lost this life's registration; registered again
    /// with this life's clean-up boundary, and what it holds is written back (the rest of this
    /// tick, or the next one). `false`: refused as a duplicate.
    fn register_lost(&self, s: &mut State, i: Id) -> bool {
        let iu = i as usize;
        s.nodes[iu].restore = true;
        s.seen |= SEEN_REREGISTERED;
        let t0 = match s.nodes[iu].life_t0 {
            0 => s.redis.now,
            t0 => t0,
        };
        self.register(s, i, t0)
    }

    /// `heartbeat::tick_once` up to the settlements: the heartbeat and what its status asks
    /// for, then the master-switch check. `false`: the tick ends there (reaped: the zombie's
    /// registration is next).
    fn tick_beat(&self, s: &mut State, i: Id) -> bool {
        let iu = i as usize;
        match self.beat(s, i, false) {
            Beat::Reaped | Beat::Missing => {
                self.reaped(s, i);
                return false;
            }
            Beat::Unregistered => {
                if !self.register_lost(s, i) {
                    return false;
                }
            }
            b => {
                s.nodes[iu].last_beat = s.redis.now;
                if b == Beat::Restored {
                    s.nodes[iu].restore = true;
                    s.seen |= SEEN_RESTORED;
                }
            }
        }
        let n = &mut s.nodes[iu];
        if n.switches_seen != s.switches {
            n.switches_seen = s.switches;
            n.restore = !self.cfg.mutated(Mutation::NoRestoreAfterSwitch);
        }
        true
    }

    /// `lease::replicated` after a write that went through (`WAIT 1`): the replica has
    /// everything the master has (a replica always acknowledges in time in this model).
    fn wait_replica(&self, s: &mut State) {
        if s.replica.is_some() {
            s.replica = Some(s.redis.clone());
        }
    }

    fn crash(&self, s: &mut State, i: Id) {
        s.nodes[i as usize].reset();
    }

    /// The rest of a tick (`heartbeat::tick_once` after the beat).
    fn refresh(&self, s: &mut State, i: Id) {
        let c = &self.cfg;
        let iu = i as usize;
        let life = s.nodes[iu].life;
        let held_before = s.nodes[iu].held;
        let mut clean = true;
        // settle_uncertain: rooms.
        let uncertain = s.nodes[iu].uncertain;
        if uncertain != 0 {
            clean = false;
        }
        for r in 0..c.rooms {
            if uncertain & (1 << r) == 0 {
                continue;
            }
            if s.nodes[iu].held & (1 << r) == 0 {
                match s.redis.close_room(i, r) {
                    Ok(()) => s.redis.index_remove(i, 1 << r),
                    Err(_) => self.unindex_unheld(s, i, r),
                }
            }
            s.nodes[iu].uncertain &= !(1 << r);
        }
        // ... removes sent again.
        for r in 0..c.rooms {
            for (p, k) in self.peers_of(r) {
                if let Some(g) = s.nodes[iu].uncertain_removes[k].take() {
                    clean = false;
                    let _ = s.redis.remove_peer(i, r, p, g);
                }
            }
        }
        // ... upserts: a record of this instance for a peer it does not hold goes.
        let ups = s.nodes[iu].uncertain_upserts;
        if ups != 0 {
            clean = false;
        }
        s.nodes[iu].uncertain_upserts = 0;
        for r in 0..c.rooms {
            for (p, k) in self.peers_of(r) {
                if ups & (1 << k) == 0 || s.nodes[iu].peers[k].is_some() {
                    continue;
                }
                if let Some(rec) = s.redis.read_record(r, p) {
                    if rec.instance == i {
                        let _ = s.redis.remove_peer(i, r, p, rec.generation);
                    }
                }
            }
        }
        let restore = s.nodes[iu].restore;
        let held = s.nodes[iu].held;
        let mut lost: Rooms = 0;
        if restore {
            // `rooms::restore_pins`: every held room into the index first, then
            // pin_refresh.lua '1' (a pin still free is taken again, metadata and all).
            clean = false;
            if held != 0 {
                s.seen |= SEEN_WRITTEN_BACK;
            }
            self.index_add(s, i, held);
            for r in 0..c.rooms {
                if held & (1 << r) != 0
                    && matches!(
                        s.redis.pin_restore(c, i, life, r),
                        Refreshed::Lost(_) | Refreshed::Gone
                    )
                {
                    lost |= 1 << r;
                }
            }
        } else {
            // Reassert: held rooms back into the index; the walk marks members not held.
            self.index_add(s, i, held);
            let unheld = s.redis.index[iu] & !held;
            if unheld != 0 && !c.mutated(Mutation::ReplyDependentCleanup) {
                clean = false;
                s.nodes[iu].uncertain |= unheld;
            }
            // Pin refresh: plain, then pin_refresh.lua for the lapsed ones.
            for r in 0..c.rooms {
                if held & (1 << r) == 0 {
                    continue;
                }
                let out = match s.redis.refresh_plain(c, i, r) {
                    Some(o) => o,
                    None => s.redis.pin_refresh(c, i, life, r),
                };
                if matches!(out, Refreshed::Lost(_) | Refreshed::Gone) {
                    lost |= 1 << r;
                }
            }
        }
        if lost != 0 {
            clean = false;
            // Ask again before reporting: reaped while paused mid-tick?
            match self.beat(s, i, false) {
                Beat::Reaped | Beat::Missing => {
                    self.reaped(s, i);
                    return;
                }
                Beat::Unregistered => {
                    // The restore runs at the next tick.
                    self.register_lost(s, i);
                    return;
                }
                Beat::Restored => {
                    // Lost its data between the two beats: restored at the next tick.
                    let n = &mut s.nodes[iu];
                    n.last_beat = s.redis.now;
                    n.restore = true;
                    n.beat_done = false;
                    n.clean = false;
                    s.seen |= SEEN_RESTORED;
                    return;
                }
                Beat::Ok | Beat::Duplicate => {}
                Beat::Zombie => unreachable!("`beat` reads 'zombie' as reaped"),
            }
            s.nodes[iu].last_beat = s.redis.now;
            for r in 0..c.rooms {
                if lost & (1 << r) != 0 && s.nodes[iu].held & (1 << r) != 0 {
                    s.nodes[iu].remove_room(r, c.peers);
                    self.unindex_unheld(s, i, r);
                }
            }
        }
        if restore {
            // `peers::restore`: every held record written back with its generation.
            for r in 0..c.rooms {
                for (p, k) in self.peers_of(r) {
                    if let Some(g) = s.nodes[iu].peers[k] {
                        s.redis.restore_peer(i, r, p, g, life);
                    }
                }
            }
            s.nodes[iu].restore = false;
        }
        let n = &mut s.nodes[iu];
        n.beat_done = false;
        n.clean = clean;
        if !self.held_stored(s, i) {
            s.bad |= BAD_HELD;
        }
        if s.nodes[iu].faulted {
            s.nodes[iu].faulted = false;
            let gone = held_before & !s.nodes[iu].held;
            let taken = (0..c.rooms).all(|r| {
                let room = &s.redis.rooms[r as usize];
                gone & (1 << r) == 0
                    || room.pin.is_some_and(|(o, _)| o != i)
                    || room.meta.is_some_and(|m| m.owner != i)
            });
            if !taken && std::mem::take(&mut s.nodes[iu].register_restored) {
                s.seen |= SEEN_REGISTER_RESTORED;
            } else if !taken {
                s.bad |= BAD_HELD;
            }
        }
        s.nodes[iu].register_restored = false;
    }

    /// Whether every room `i` holds is pinned by it (pin and metadata) and every peer it
    /// holds has its record (instance and generation).
    fn held_stored(&self, s: &State, i: Id) -> bool {
        let n = &s.nodes[i as usize];
        (0..self.cfg.rooms).all(|r| {
            let room = &s.redis.rooms[r as usize];
            n.held & (1 << r) == 0
                || (room.pin.is_some_and(|(o, _)| o == i)
                    && room.meta.is_some_and(|m| m.owner == i)
                    && self.peers_of(r).all(|(p, k)| {
                        n.peers[k].map_or(true, |g| {
                            room.records[p as usize]
                                .is_some_and(|x| x.instance == i && x.generation == g)
                        })
                    }))
        })
    }

    /// `rooms::pin` (index first, then pin_room.lua with the takeover of a holder whose
    /// heartbeat key is gone) and `Node::pin_room`.
    fn pin(&self, s: &mut State, i: Id, r: Id, fault: Fault) {
        let c = &self.cfg;
        let iu = i as usize;
        let bit = 1 << r;
        let life = s.nodes[iu].life;
        if c.mutated(Mutation::UpsertBeforeIndex) {
            // Known-bad: pin first; the index entry follows in a later step.
            let out = self.try_pin(s, i, life, r);
            if !matches!(out, PinReply::Held(_)) {
                s.nodes[iu].held |= bit;
                s.nodes[iu].pending_index |= bit;
            }
            return;
        }
        let added = self.index_add(s, i, bit);
        if fault == Fault::CrashMid {
            self.crash(s, i);
            return;
        }
        let out = self.try_pin(s, i, life, r);
        if fault == Fault::LostReply {
            s.nodes[iu].uncertain |= bit;
            return;
        }
        match out {
            PinReply::Held(_) => {
                if added {
                    s.redis.index_remove(i, bit);
                } else {
                    s.nodes[iu].uncertain |= bit;
                }
            }
            _ => {
                s.nodes[iu].held |= bit;
                s.nodes[iu].uncertain &= !bit;
            }
        }
    }

    fn try_pin(&self, s: &mut State, i: Id, life: u8, r: Id) -> PinReply {
        let mut out = s.redis.pin_room(&self.cfg, i, life, r, None);
        if let PinReply::Held(o) = out {
            if !s.redis.hb_exists(o) {
                out = s.redis.pin_room(&self.cfg, i, life, r, Some(o));
            }
        }
        if matches!(out, PinReply::TookOver(_)) {
            s.seen |= SEEN_TAKEOVER;
        }
        out
    }

    /// `Node::close_room` with `rooms::close`.
    fn close(&self, s: &mut State, i: Id, r: Id, fault: Fault) {
        let c = &self.cfg;
        let iu = i as usize;
        let held = s.nodes[iu].held & (1 << r) != 0;
        s.nodes[iu].remove_room(r, c.peers);
        let out = s.redis.close_room(i, r);
        match fault {
            Fault::LostReply if c.mutated(Mutation::ReplyDependentCleanup) => return,
            Fault::LostReply => {
                s.nodes[iu].uncertain |= 1 << r;
                return;
            }
            Fault::CrashMid => {
                self.crash(s, i);
                return;
            }
            Fault::None => {}
        }
        match out {
            Ok(()) => s.redis.index_remove(i, 1 << r),
            Err(_) if held => s.nodes[iu].uncertain |= 1 << r,
            Err(_) => {}
        }
    }

    /// `Node::release_everything` (after the threads stopped: lease and heartbeat released).
    fn leave(&self, s: &mut State, i: Id, fault: Fault) {
        let c = &self.cfg;
        let iu = i as usize;
        let boot = s.nodes[iu].boot;
        s.nodes[iu].demote();
        s.redis.lease_release(i);
        s.redis.heartbeat_release(i, boot);
        let mut failed = false;
        let held = s.nodes[iu].held;
        let known = held | s.redis.index[iu];
        for r in 0..c.rooms {
            if held & (1 << r) == 0 {
                continue;
            }
            if fault == Fault::LostReply && !failed {
                // The call could not reach Redis: the clean-up ends here.
                failed = true;
                break;
            }
            match s.redis.close_room(i, r) {
                Ok(()) => {
                    s.redis.index_remove(i, 1 << r);
                    s.nodes[iu].remove_room(r, c.peers);
                }
                Err(_) => s.nodes[iu].remove_room(r, c.peers),
            }
        }
        if !failed {
            for r in 0..c.rooms {
                for (p, k) in self.peers_of(r) {
                    if let Some(g) = s.nodes[iu].peers[k] {
                        let _ = s.redis.remove_peer(i, r, p, g);
                    }
                }
            }
            // settle_unheld: every room of the index not held.
            for r in 0..c.rooms {
                if s.redis.index[iu] & (1 << r) == 0 {
                    continue;
                }
                match s.redis.close_room(i, r) {
                    Ok(()) => s.redis.index_remove(i, 1 << r),
                    Err(_) => self.unindex_unheld(s, i, r),
                }
            }
            if s.redis.index[iu] != 0 {
                failed = true;
            }
        }
        if !failed || c.mutated(Mutation::LeaveDeregistersAfterFailedClose) {
            // deregister: DEL hb, ZREM, DEL info. Nothing of it may be left then.
            s.redis.deregister(&self.cfg, i);
            // What the leave knew of (rooms held or in its live index) must be clean of it.
            let left = (0..c.rooms).any(|r| {
                let room = &s.redis.rooms[r as usize];
                known & (1 << r) != 0
                    && (room.pin.is_some_and(|(o, _)| o == i)
                        || room.meta.is_some_and(|m| m.owner == i)
                        || room.records.iter().flatten().any(|x| x.instance == i))
            });
            if left {
                s.bad |= BAD_LEFT;
            }
        }
        self.crash(s, i);
    }

    /// The lease thread's request, executed on Redis at `now` and its reply handled at once.
    fn lease_exec(&self, s: &mut State, i: Id, fault: Fault) {
        let c = &self.cfg;
        let iu = i as usize;
        let now = s.redis.now;
        let sent = s.nodes[iu].sent.take().expect("a request was sent");
        match s.nodes[iu].term {
            None => {
                let seen = s.nodes[iu].max_epoch;
                // Above the counter, and above every epoch known to a process that has
                // heartbeated on this dataset (its heartbeats wrote its highest epoch back):
                // after data loss, what heartbeat.lua and lease_acquire.lua promise.
                let token = s.redis.dataset.map(|d| d.gen);
                let known = s
                    .nodes
                    .iter()
                    .filter(|n| n.phase != Phase::Down && n.token.is_some() && n.token == token)
                    .map(|n| n.max_epoch)
                    .max()
                    .unwrap_or(0);
                let before = s.redis.epoch.max(known);
                if let Ok(epoch) = s.redis.lease_acquire(c, i, seen) {
                    if epoch <= before {
                        s.bad |= BAD_EPOCH;
                    }
                    if c.data_loss || c.failover {
                        if epoch <= s.epoch_hwm {
                            s.seen |= SEEN_EPOCH_AGAIN;
                        }
                        s.epoch_hwm = s.epoch_hwm.max(epoch);
                    }
                    if s.winner.is_some_and(|w| w != i) {
                        s.seen |= SEEN_LEASE_MOVED;
                    }
                    s.winner = Some(i);
                    if fault == Fault::LostReply {
                        return;
                    }
                    let n = &mut s.nodes[iu];
                    n.max_epoch = n.max_epoch.max(epoch);
                    if now >= c.deadline(sent) {
                        // Late: confirms nothing; given back.
                        s.redis.lease_release(i);
                    } else {
                        n.term = Some((epoch, c.deadline(sent)));
                        n.term_switches = s.switches;
                        self.wait_replica(s);
                    }
                }
            }
            Some((epoch, deadline)) => {
                let held = s.redis.lease_refresh(c, i);
                if held && fault == Fault::None {
                    self.wait_replica(s);
                }
                let n = &mut s.nodes[iu];
                if fault == Fault::LostReply || !held || now >= deadline {
                    n.demote();
                } else {
                    n.term = Some((epoch, c.deadline(sent)));
                    n.term_switches = s.switches;
                }
            }
        }
    }

    /// The reaper thread's next step.
    fn reap(&self, s: &mut State, i: Id) {
        let c = &self.cfg;
        let iu = i as usize;
        let now = s.redis.now;
        let leading = s.nodes[iu].leading(now, s.switches);
        let step = s.nodes[iu].reaper;
        if !leading && !matches!(step, Reaper::Finishing { .. }) {
            s.nodes[iu].reaper = Reaper::Idle;
            return;
        }
        // `reap_instance` runs on one connection, made at its `reap_begin`: once the master
        // switched, what follows reaches the old master (lost with it) or fails; the round
        // ends. (A refused call, READONLY, runs the whole reap again on the new master from
        // its re-check: a later round here, whose two-phase wait only matters for liveness.)
        if matches!(step, Reaper::Rooms { .. } | Reaper::Finishing { .. })
            && s.nodes[iu].reap_made != s.switches
        {
            s.nodes[iu].reaper = Reaper::Idle;
            return;
        }
        let next_of = |cands: u8| {
            if cands == 0 {
                Reaper::Idle
            } else {
                Reaper::Next { cands }
            }
        };
        s.nodes[iu].reaper = match step {
            Reaper::Idle => {
                let cands = s.redis.candidates(c, i);
                Reaper::Waiting { cands, since: now }
            }
            Reaper::Waiting { cands, .. } | Reaper::Next { cands } => {
                let d = cands.trailing_zeros() as Id;
                let rest = cands & !(1 << d);
                match s.redis.reap_begin(c, d, i) {
                    Begin::Dead { t0, token } => {
                        if c.failover {
                            s.redis.reaped_mark |= 1 << d;
                        }
                        s.nodes[iu].reap_made = s.switches;
                        Reaper::Rooms {
                            cands: rest,
                            dead: d,
                            t0,
                            token,
                            todo: None,
                            keep: 0,
                            reaped: 0,
                        }
                    }
                    Begin::Alive | Begin::Gone => next_of(rest),
                    Begin::NotLeader => Reaper::Idle,
                }
            }
            Reaper::Rooms {
                cands,
                dead,
                t0,
                token,
                todo: None,
                keep,
                reaped,
            } => Reaper::Rooms {
                cands,
                dead,
                t0,
                token,
                todo: Some(s.redis.read_reaping(dead)),
                keep,
                reaped,
            },
            Reaper::Rooms {
                cands,
                dead,
                t0: _,
                token,
                todo: Some(0),
                keep,
                reaped,
            } => {
                if keep != 0 {
                    s.redis.reap_putback(dead, token, keep);
                }
                Reaper::Finishing {
                    cands,
                    dead,
                    token,
                    keep,
                    reaped,
                }
            }
            Reaper::Rooms {
                cands,
                dead,
                t0,
                token,
                todo: Some(todo),
                mut keep,
                mut reaped,
            } => {
                let r = todo.trailing_zeros() as Id;
                let mut d = Deleted::default();
                let (status, late) = s.redis.reap_room(c, dead, Some(t0), r, &mut d);
                self.check_deleted(s, &d);
                if late > 0 || status == RoomStatus::NewLife {
                    keep |= 1 << r;
                    s.seen |= SEEN_KEPT;
                } else if c.mutated(Mutation::DeferredSrem) {
                    reaped |= 1 << r;
                }
                Reaper::Rooms {
                    cands,
                    dead,
                    t0,
                    token,
                    todo: Some(todo & !(1 << r)),
                    keep,
                    reaped,
                }
            }
            Reaper::Finishing {
                cands,
                dead,
                token,
                keep,
                reaped,
            } => {
                if reaped != 0 {
                    // Known-bad (`DeferredSrem`): the reaped rooms leave the live index too,
                    // whoever put them there since the index was moved aside.
                    s.redis.index_remove(dead, reaped);
                }
                let n = keep.count_ones() as u8;
                let out = s.redis.reap_finish(dead, n, token, n);
                if matches!(out, Finish::Done | Finish::Incomplete) {
                    s.seen |= SEEN_REAP_DONE;
                    if s.redis.names(dead, true) || s.redis.hb[dead as usize].is_some() {
                        s.bad |= BAD_LEFT;
                    }
                }
                if s.nodes[iu].leading(now, s.switches) {
                    next_of(cands)
                } else {
                    Reaper::Idle
                }
            }
        };
    }

    fn calls_left(&self, s: &State) -> bool {
        self.cfg.max_host_calls.map_or(true, |m| s.host_calls < m)
    }

    /// Counts a host call against `Config::max_host_calls` (`None`: not counted, so that
    /// states differing only by the count merge).
    fn count_call(&self, s: &mut State) {
        if self.cfg.max_host_calls.is_some() {
            s.host_calls += 1;
        }
    }

    /// Drops what can no longer matter, so that states differing only there merge: once no
    /// fault is left no failover can come, so the replica is forgotten, and so is whether a
    /// replica acknowledged a registration already found on the current master (only a
    /// later master switch would read it).
    fn reduce(&self, s: &mut State) {
        if self.cfg.failover && s.faults >= self.cfg.max_faults {
            s.replica = None;
            for n in s.nodes.iter_mut() {
                if n.reg_switches == s.switches {
                    n.unconfirmed = false;
                }
            }
        }
    }

    fn faults_left(&self, s: &State, i: Id) -> bool {
        self.cfg.faulty & (1 << i) != 0 && s.faults < self.cfg.max_faults
    }
}

impl Model for SfuModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let c = &self.cfg;
        let mut s = State {
            redis: Redis::new(c),
            nodes: (0..c.instances)
                .map(|_| Node::new(c.rooms, c.peers))
                .collect(),
            faults: 0,
            host_calls: 0,
            winner: None,
            bad: 0,
            seen: 0,
            replica: None,
            switches: 0,
            epoch_hwm: 0,
        };
        // The replica has the dataset as it was before the instances registered: no replica
        // has acknowledged a registration yet.
        if c.failover {
            s.replica = Some(s.redis.clone());
        }
        // Every instance starts (registers) at time 1.
        for i in 0..c.instances {
            s.nodes[i as usize].boot = 1;
            s.nodes[i as usize].life = 1;
            assert!(self.register(&mut s, i, 1));
        }
        vec![s]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        let c = &self.cfg;
        let now = s.redis.now;
        let finishing = s
            .nodes
            .iter()
            .any(|n| matches!(n.reaper, Reaper::Finishing { .. }));
        if now < c.max_time && !finishing {
            out.push(Action::Advance);
        }
        if s.faults < c.max_faults {
            if c.data_loss {
                out.push(Action::DataLoss);
            }
            if c.failover {
                out.push(Action::Failover);
            }
        }
        if s.replica.as_ref().is_some_and(|r| *r != s.redis) {
            out.push(Action::Replicate);
        }
        for i in 0..c.instances {
            let n = &s.nodes[i as usize];
            let faults = self.faults_left(s, i);
            let bit = 1u8 << i;
            if n.phase == Phase::Down {
                let free = s.redis.hb[i as usize].map_or(true, |k| k.boot == store::Boot::Released);
                if c.restarts && n.life < c.max_lives && free {
                    out.push(Action::Restart(i));
                }
                continue;
            }
            if faults {
                out.push(Action::Crash(i));
            }
            if c.failover
                && n.phase == Phase::Running
                && n.unconfirmed
                && !n.beat_done
                && n.reg_switches == s.switches
            {
                out.push(Action::Confirm(i));
            }
            match n.phase {
                Phase::Running if n.beat_done => out.push(Action::Refresh(i)),
                Phase::Running if c.split_tick => out.push(Action::Beat(i)),
                Phase::Running => out.push(Action::Tick(i)),
                Phase::Reregister { .. } => out.push(Action::Register(i)),
                Phase::Down => unreachable!(),
            }
            // The lease thread.
            match n.sent {
                _ if c.leaders & bit == 0 => {}
                None if n.term.is_some() || s.redis.epoch < c.max_terms => {
                    if c.split_lease {
                        out.push(Action::LeaseSend(i));
                    } else {
                        out.push(Action::Lease(i, Fault::None));
                        if faults && c.lost_replies {
                            out.push(Action::Lease(i, Fault::LostReply));
                        }
                    }
                }
                None => {}
                Some(_) => {
                    out.push(Action::LeaseExec(i, Fault::None));
                    if faults && c.lost_replies {
                        out.push(Action::LeaseExec(i, Fault::LostReply));
                    }
                }
            }
            // The reaper thread.
            match n.reaper {
                Reaper::Idle => {
                    if n.leading(now, s.switches) && s.redis.candidates(c, i) != 0 {
                        out.push(Action::Reap(i));
                    }
                }
                Reaper::Waiting { since, .. } => {
                    if now >= since + c.timings.two_phase || !n.leading(now, s.switches) {
                        out.push(Action::Reap(i));
                    }
                }
                _ => out.push(Action::Reap(i)),
            }
            // Host calls.
            if !self.calls_left(s) || (c.hosts | c.pinners) & bit == 0 {
                continue;
            }
            let pin_only = c.hosts & bit == 0;
            let lost = faults && c.lost_replies;
            for r in 0..c.rooms {
                let bit = 1 << r;
                if n.pending_index & bit != 0 {
                    out.push(Action::PinIndex(i, r));
                }
                if n.held & bit == 0 {
                    out.push(Action::Pin(i, r, Fault::None));
                    if lost {
                        out.push(Action::Pin(i, r, Fault::LostReply));
                    }
                    if faults {
                        out.push(Action::Pin(i, r, Fault::CrashMid));
                    }
                    continue;
                }
                if pin_only {
                    continue;
                }
                out.push(Action::Close(i, r, Fault::None));
                if lost {
                    out.push(Action::Close(i, r, Fault::LostReply));
                }
                if faults {
                    out.push(Action::Close(i, r, Fault::CrashMid));
                }
                let room = &s.redis.rooms[r as usize];
                let seq = room
                    .meta
                    .and_then(|m| m.peer_seq)
                    .map_or(0, |g| g % store::GEN_SCALE);
                for (p, k) in self.peers_of(r) {
                    if n.peers[k].is_none() && seq < c.max_upserts as u16 {
                        out.push(Action::Upsert(i, r, p, Fault::None));
                        if lost {
                            out.push(Action::Upsert(i, r, p, Fault::LostReply));
                        }
                    }
                    if n.peers[k].is_some() {
                        out.push(Action::Remove(i, r, p, Fault::None));
                        if lost {
                            out.push(Action::Remove(i, r, p, Fault::LostReply));
                        }
                    }
                }
            }
            if c.leave && !pin_only && n.phase == Phase::Running {
                out.push(Action::Leave(i, Fault::None));
                if faults && n.held != 0 {
                    out.push(Action::Leave(i, Fault::LostReply));
                }
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let c = &self.cfg;
        let mut s = last.clone();
        s.seen = 0;
        let fault_of = |f: Fault| u8::from(f != Fault::None);
        match action {
            Action::Advance => {
                s.redis.advance();
                let now = s.redis.now;
                if let Some(r) = s.replica.as_mut() {
                    // A replica's keys expire at the same absolute times.
                    r.now = now;
                    r.expire();
                }
                for n in s.nodes.iter_mut() {
                    // A term whose deadline passed ends (the lease thread's step); one with a
                    // request on the wire ends when its reply comes.
                    if n.term.is_some_and(|(_, d)| now >= d) && n.sent.is_none() {
                        n.demote();
                    }
                }
            }
            Action::Beat(i) => {
                if self.tick_beat(&mut s, i) {
                    s.nodes[i as usize].beat_done = true;
                }
            }
            Action::Refresh(i) => self.refresh(&mut s, i),
            Action::Tick(i) => {
                if self.tick_beat(&mut s, i) {
                    self.refresh(&mut s, i);
                }
            }
            Action::Register(i) => {
                let Phase::Reregister { t0, lost } = s.nodes[i as usize].phase else {
                    return None;
                };
                self.index_add(&mut s, i, lost);
                if !self.register(&mut s, i, t0) {
                    return None;
                }
                s.seen |= SEEN_ZOMBIE;
            }
            Action::Restart(i) => {
                let now = s.redis.now;
                let switches = s.switches;
                let n = &mut s.nodes[i as usize];
                n.boot += 1;
                n.life += 1;
                // A new process: its connector counts switches from here.
                n.switches_seen = switches;
                n.reg_switches = switches;
                if !self.register(&mut s, i, now) {
                    return None;
                }
            }
            Action::Pin(i, r, f) => {
                self.count_call(&mut s);
                s.faults += fault_of(f);
                s.nodes[i as usize].clean &= f == Fault::None;
                self.pin(&mut s, i, r, f);
            }
            Action::PinIndex(i, r) => {
                self.index_add(&mut s, i, 1 << r);
                s.nodes[i as usize].pending_index &= !(1 << r);
            }
            Action::Close(i, r, f) => {
                self.count_call(&mut s);
                s.faults += fault_of(f);
                s.nodes[i as usize].clean &= f == Fault::None;
                self.close(&mut s, i, r, f);
            }
            Action::Upsert(i, r, p, f) => {
                self.count_call(&mut s);
                s.faults += fault_of(f);
                let k = (r * c.peers + p) as usize;
                let life = s.nodes[i as usize].life;
                let out = s.redis.upsert_peer(i, r, p, life);
                let n = &mut s.nodes[i as usize];
                if f == Fault::LostReply {
                    n.clean = false;
                    n.uncertain_upserts |= 1 << k;
                } else if let Ok(g) = out {
                    n.peers[k] = Some(g);
                }
            }
            Action::Remove(i, r, p, f) => {
                self.count_call(&mut s);
                s.faults += fault_of(f);
                let k = (r * c.peers + p) as usize;
                let g = s.nodes[i as usize].peers[k]?;
                let out = s.redis.remove_peer(i, r, p, g);
                let n = &mut s.nodes[i as usize];
                if f == Fault::LostReply {
                    n.clean = false;
                    n.peers[k] = None;
                    n.uncertain_removes[k] = Some(g);
                } else if out.is_ok() {
                    n.peers[k] = None;
                }
            }
            Action::LeaseSend(i) => {
                s.nodes[i as usize].sent = Some(s.redis.now);
            }
            Action::LeaseExec(i, f) => {
                s.faults += fault_of(f);
                self.lease_exec(&mut s, i, f);
            }
            Action::Lease(i, f) => {
                s.faults += fault_of(f);
                s.nodes[i as usize].sent = Some(s.redis.now);
                self.lease_exec(&mut s, i, f);
            }
            Action::Reap(i) => self.reap(&mut s, i),
            Action::Leave(i, f) => {
                self.count_call(&mut s);
                s.faults += fault_of(f);
                self.leave(&mut s, i, f);
            }
            Action::Crash(i) => {
                s.faults += 1;
                self.crash(&mut s, i);
            }
            Action::Confirm(i) => {
                // WAIT 1 on the master the registration was last found on.
                self.wait_replica(&mut s);
                s.nodes[i as usize].unconfirmed = false;
            }
            Action::DataLoss => {
                s.faults += 1;
                s.redis.data_loss();
                // A replica resyncs from the emptied master.
                self.wait_replica(&mut s);
                for n in s.nodes.iter_mut() {
                    n.clean = false;
                    n.faulted = true;
                }
            }
            Action::Replicate => {
                s.replica = Some(s.redis.clone());
            }
            Action::Failover => {
                s.faults += 1;
                let mut promoted = s.replica.clone().expect("a replica");
                promoted.now = s.redis.now;
                promoted.expire();
                s.redis = promoted;
                s.switches += 1;
                for (i, n) in s.nodes.iter_mut().enumerate() {
                    n.clean = false;
                    n.faulted = true;
                    // Ghost: live only by a heartbeat the new master lacks.
                    n.beat_lost = n.last_beat != 0 && s.redis.zset[i] != Some(n.last_beat);
                }
                // Its own replica starts as a full copy of it.
                self.wait_replica(&mut s);
            }
        }
        self.reduce(&mut s);
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(P_ONE_LEADER, |_, s: &State| {
                s.nodes
                    .iter()
                    .filter(|n| n.leading(s.redis.now, s.switches))
                    .count()
                    <= 1
            }),
            Property::always(P_EPOCHS, |_, s: &State| s.bad & BAD_EPOCH == 0),
            Property::always(P_LEASE_TERM, |_, s: &State| {
                s.redis.lease.map_or(true, |l| {
                    l.term == s.redis.epoch && s.winner == Some(l.owner)
                })
            }),
            Property::always(P_LIVE_SAFE, |_, s: &State| s.bad & BAD_LIVE == 0),
            Property::always(P_NOTHING_LEFT, |_, s: &State| s.bad & BAD_LEFT == 0),
            Property::always(P_HELD_STORED, |_, s: &State| s.bad & BAD_HELD == 0),
            Property::always(P_NO_PRICE, |_, s: &State| s.bad & BAD_PRICE == 0),
            Property::always(P_NO_MARK, |_, s: &State| s.bad & BAD_MARK == 0),
            Property::always(P_ZOMBIE_TRUE, |_, s: &State| s.bad & BAD_ZOMBIE == 0),
            Property::always(P_IN_REACH, |_, s: &State| {
                (0..s.nodes.len()).all(|i| {
                    s.nodes[i].phase != Phase::Down
                        || s.redis.zset[i].is_some()
                        || !s.redis.names(i as Id, false)
                })
            }),
            Property::always(P_REACHABLE, |m: &SfuModel, s: &State| {
                s.redis.rooms.iter().enumerate().all(|(r, room)| {
                    room.records.iter().flatten().all(|rec| {
                        let i = rec.instance as usize;
                        (s.redis.index[i] | s.redis.reaping[i]) & (1 << r) != 0
                    }) && (0..m.cfg.peers).all(|p| {
                        (room.members & (1 << p) != 0) == room.records[p as usize].is_some()
                    })
                })
            }),
            Property::always(P_INDEX_MATCHES, |_, s: &State| {
                s.nodes.iter().enumerate().all(|(i, n)| {
                    !(n.phase == Phase::Running
                        && n.clean
                        && n.uncertain == 0
                        && s.redis.zset[i].is_some_and(|z| z > 0))
                        || s.redis.index[i] == n.held
                })
            }),
            Property::sometimes(S_REAP_DONE, |_, s: &State| s.seen & SEEN_REAP_DONE != 0),
            Property::sometimes(S_TAKEOVER, |_, s: &State| s.seen & SEEN_TAKEOVER != 0),
            Property::sometimes(S_LEASE_MOVED, |_, s: &State| s.seen & SEEN_LEASE_MOVED != 0),
            Property::sometimes(S_ZOMBIE, |_, s: &State| s.seen & SEEN_ZOMBIE != 0),
            Property::sometimes(S_KEPT, |_, s: &State| s.seen & SEEN_KEPT != 0),
            Property::sometimes(S_RESTORED, |_, s: &State| s.seen & SEEN_RESTORED != 0),
            Property::sometimes(S_WRITTEN_BACK, |_, s: &State| {
                s.seen & SEEN_WRITTEN_BACK != 0
            }),
            Property::sometimes(S_REREGISTERED, |_, s: &State| {
                s.seen & SEEN_REREGISTERED != 0
            }),
            Property::sometimes(S_ZOMBIE_LOST, |_, s: &State| s.seen & SEEN_ZOMBIE_LOST != 0),
            Property::sometimes(S_EPOCH_AGAIN, |_, s: &State| s.seen & SEEN_EPOCH_AGAIN != 0),
            Property::sometimes(S_BEAT_LOST, |_, s: &State| s.seen & SEEN_BEAT_LOST != 0),
            Property::sometimes(S_REGISTER_RESTORED, |_, s: &State| {
                s.seen & SEEN_REGISTER_RESTORED != 0
            }),
        ]
    }
}
