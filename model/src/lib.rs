//! An exhaustive model check of the sfu-redis protocol (heartbeats, the leader lease, the
//! two-phase owner-CAS reaper, rooms and peers under key schema version 2) with `stateright`.
//!
//! Redis is one store ([`store::Redis`]) whose scripts are atomic functions mirroring
//! `lua/*.lua`; each instance ([`node::Node`]) acts through the steps of the Rust code
//! (`src/heartbeat.rs`, `src/lease.rs`, `src/reaper.rs`, `src/rooms.rs`, `src/peers.rs`,
//! `src/node.rs`); faults (crash, pause, lost reply, crash between two steps) are actions.
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

const BAD_LIVE: u8 = 1;
const BAD_LEFT: u8 = 2;
const BAD_EPOCH: u8 = 4;

const SEEN_REAP_DONE: u8 = 1;
const SEEN_TAKEOVER: u8 = 2;
const SEEN_LEASE_MOVED: u8 = 4;
const SEEN_ZOMBIE: u8 = 8;
const SEEN_KEPT: u8 = 16;

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
    pub seen: u8,
}

/// The model: its configuration.
#[derive(Debug, Clone)]
pub struct SfuModel {
    pub cfg: Config,
}

impl SfuModel {
    pub fn new(cfg: Config) -> SfuModel {
        assert!(cfg.rooms <= 8 && cfg.rooms * cfg.peers <= 8 && cfg.instances <= 8);
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

    /// Flags what a reap deleted of a live instance's current life.
    fn check_deleted(&self, s: &mut State, d: &Deleted) {
        let victims = d
            .room_of
            .into_iter()
            .chain(d.records.iter().flatten().copied());
        for (i, life) in victims {
            if self.live(s, i) && s.nodes[i as usize].life == life {
                s.bad |= BAD_LIVE;
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

    /// heartbeat.lua ('register'), the clean-up of the earlier life, the held rooms put back
    /// (`heartbeat::register`). `false`: refused as a duplicate (nothing written).
    fn register(&self, s: &mut State, i: Id, t0: u8) -> bool {
        let iu = i as usize;
        let boot = s.nodes[iu].boot;
        if s.redis.heartbeat_register(&self.cfg, i, boot) == Beat::Duplicate {
            return false;
        }
        let now = s.redis.now;
        let n = &mut s.nodes[iu];
        n.phase = Phase::Running;
        n.last_beat = now;
        n.beat_done = false;
        n.clean = false;
        self.clean_own(s, i, t0);
        let held = s.nodes[iu].held;
        s.redis.index_add(&self.cfg, i, held);
        true
    }

    /// `heartbeat::resume_after_reap` up to its registration: every room forgotten, the term
    /// ended; a new life starts (what the process writes from now on is its).
    fn reaped(&self, s: &mut State, i: Id) {
        let now = s.redis.now;
        let n = &mut s.nodes[i as usize];
        let lost = n.clear();
        n.demote();
        n.life += 1;
        n.last_beat = 0;
        n.clean = false;
        n.beat_done = false;
        n.phase = Phase::Reregister { t0: now, lost };
    }

    fn crash(&self, s: &mut State, i: Id) {
        s.nodes[i as usize].reset();
    }

    /// The rest of a tick (`heartbeat::tick_once` after the beat).
    fn refresh(&self, s: &mut State, i: Id) {
        let c = &self.cfg;
        let iu = i as usize;
        let life = s.nodes[iu].life;
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
        // Reassert: held rooms back into the index; the walk marks members not held.
        let held = s.nodes[iu].held;
        s.redis.index_add(&self.cfg, i, held);
        let unheld = s.redis.index[iu] & !held;
        if unheld != 0 && !c.mutated(Mutation::ReplyDependentCleanup) {
            clean = false;
            s.nodes[iu].uncertain |= unheld;
        }
        // Pin refresh: plain, then pin_refresh.lua for the lapsed ones.
        let mut lost: Rooms = 0;
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
        if lost != 0 {
            clean = false;
            // Ask again before reporting: reaped while paused mid-tick?
            let boot = s.nodes[iu].boot;
            if matches!(
                s.redis.heartbeat_tick(c, i, boot),
                Beat::Reaped | Beat::Missing
            ) {
                self.reaped(s, i);
                return;
            }
            s.nodes[iu].last_beat = s.redis.now;
            for r in 0..c.rooms {
                if lost & (1 << r) != 0 && s.nodes[iu].held & (1 << r) != 0 {
                    s.nodes[iu].remove_room(r, c.peers);
                    self.unindex_unheld(s, i, r);
                }
            }
        }
        let n = &mut s.nodes[iu];
        n.beat_done = false;
        n.clean = clean;
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
        let added = s.redis.index_add(&self.cfg, i, bit);
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
                let before = s.redis.epoch;
                if let Ok(epoch) = s.redis.lease_acquire(c, i, seen) {
                    if epoch <= before {
                        s.bad |= BAD_EPOCH;
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
                    }
                }
            }
            Some((epoch, deadline)) => {
                let held = s.redis.lease_refresh(c, i);
                let n = &mut s.nodes[iu];
                if fault == Fault::LostReply || !held || now >= deadline {
                    n.demote();
                } else {
                    n.term = Some((epoch, c.deadline(sent)));
                }
            }
        }
    }

    /// The reaper thread's next step.
    fn reap(&self, s: &mut State, i: Id) {
        let c = &self.cfg;
        let iu = i as usize;
        let now = s.redis.now;
        let leading = s.nodes[iu].leading(now);
        let step = s.nodes[iu].reaper;
        if !leading && !matches!(step, Reaper::Finishing { .. }) {
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
                    Begin::Dead { t0, token } => Reaper::Rooms {
                        cands: rest,
                        dead: d,
                        t0,
                        token,
                        todo: None,
                        keep: 0,
                        reaped: 0,
                    },
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
                if s.nodes[iu].leading(now) {
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
        };
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
                    if n.leading(now) && s.redis.candidates(c, i) != 0 {
                        out.push(Action::Reap(i));
                    }
                }
                Reaper::Waiting { since, .. } => {
                    if now >= since + c.timings.two_phase || !n.leading(now) {
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
                for n in s.nodes.iter_mut() {
                    // A term whose deadline passed ends (the lease thread's step); one with a
                    // request on the wire ends when its reply comes.
                    if n.term.is_some_and(|(_, d)| now >= d) && n.sent.is_none() {
                        n.demote();
                    }
                }
            }
            Action::Beat(i) => {
                let boot = s.nodes[i as usize].boot;
                match s.redis.heartbeat_tick(c, i, boot) {
                    Beat::Reaped | Beat::Missing => self.reaped(&mut s, i),
                    _ => {
                        let now = s.redis.now;
                        let n = &mut s.nodes[i as usize];
                        n.last_beat = now;
                        n.beat_done = true;
                    }
                }
            }
            Action::Refresh(i) => self.refresh(&mut s, i),
            Action::Tick(i) => {
                let boot = s.nodes[i as usize].boot;
                match s.redis.heartbeat_tick(c, i, boot) {
                    Beat::Reaped | Beat::Missing => self.reaped(&mut s, i),
                    _ => {
                        s.nodes[i as usize].last_beat = s.redis.now;
                        self.refresh(&mut s, i);
                    }
                }
            }
            Action::Register(i) => {
                let Phase::Reregister { t0, lost } = s.nodes[i as usize].phase else {
                    return None;
                };
                s.redis.index_add(&self.cfg, i, lost);
                if !self.register(&mut s, i, t0) {
                    return None;
                }
                s.seen |= SEEN_ZOMBIE;
            }
            Action::Restart(i) => {
                let now = s.redis.now;
                let n = &mut s.nodes[i as usize];
                n.boot += 1;
                n.life += 1;
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
                s.redis.index_add(&self.cfg, i, 1 << r);
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
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(P_ONE_LEADER, |_, s: &State| {
                s.nodes.iter().filter(|n| n.leading(s.redis.now)).count() <= 1
            }),
            Property::always(P_EPOCHS, |_, s: &State| s.bad & BAD_EPOCH == 0),
            Property::always(P_LEASE_TERM, |_, s: &State| {
                s.redis.lease.map_or(true, |l| {
                    l.term == s.redis.epoch && s.winner == Some(l.owner)
                })
            }),
            Property::always(P_LIVE_SAFE, |_, s: &State| s.bad & BAD_LIVE == 0),
            Property::always(P_NOTHING_LEFT, |_, s: &State| s.bad & BAD_LEFT == 0),
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
        ]
    }
}
