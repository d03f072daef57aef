//! What one instance (one process of an instance id) knows locally: the Rust side's state.

use crate::store::{Id, Rooms};

/// Where the instance's process stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// No process (never started, crashed, or left).
    Down,
    /// A tick found the instance reaped (a zombie): its rooms were forgotten; `register`
    /// (`heartbeat::resume_after_reap`) is next: `lost` goes into the room index, then the
    /// registration and the clean-up of the earlier life (records and pins before `t0`).
    Reregister { t0: u8, lost: Rooms },
    /// Registered and running its threads.
    Running,
}

/// The reaper thread's round (`reaper::round`, `reaper::reap_instance`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reaper {
    Idle,
    /// Candidates listed at `since`; the two-phase wait runs, then the first re-check.
    Waiting {
        cands: u8,
        since: u8,
    },
    /// Re-check (reap_begin.lua) the remaining candidates in turn.
    Next {
        cands: u8,
    },
    /// Reaping `dead`: `todo` the rooms of its moved index still to send through
    /// reap_room.lua (`None`: the index page is not read yet), `keep` the rooms to put back.
    Rooms {
        cands: u8,
        dead: Id,
        t0: u8,
        token: u16,
        todo: Option<Rooms>,
        keep: Rooms,
        /// Mutation `DeferredSrem` only (else 0): the rooms reaped, to unindex at the end.
        reaped: Rooms,
    },
    /// reap_putback.lua ran; reap_finish.lua, in the same pipeline, is next.
    Finishing {
        cands: u8,
        dead: Id,
        token: u16,
        keep: Rooms,
        /// As in `Rooms`.
        reaped: Rooms,
    },
}

/// One instance's local state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Node {
    pub phase: Phase,
    /// The boot token of the current process (a restart is a new one).
    pub boot: u8,
    /// Ghost: the life counter (a registration, or a zombie's notice of its reap, starts one).
    pub life: u8,
    /// The tick's heartbeat ran; its pin refresh is next.
    pub beat_done: bool,
    /// Rooms the node holds.
    pub held: Rooms,
    /// Peers the node holds: index `room * peers + peer` -> generation.
    pub peers: Vec<Option<u16>>,
    /// Rooms whose pin or close ended without a known outcome (`Local::uncertain`).
    pub uncertain: Rooms,
    /// Upserts whose outcome is unknown (bit `room * peers + peer`).
    pub uncertain_upserts: u8,
    /// Removes to send again: generation.
    pub uncertain_removes: Vec<Option<u16>>,
    /// Mutation `UpsertBeforeIndex`: rooms pinned whose index entry is not written yet.
    pub pending_index: Rooms,
    /// The current term: (epoch, local deadline).
    pub term: Option<(u8, u8)>,
    /// An acquire or refresh request sent at this local time, not executed yet.
    pub sent: Option<u8>,
    /// The highest epoch seen.
    pub max_epoch: u8,
    pub reaper: Reaper,
    /// Ghost: server time of this life's last heartbeat written (0: none yet).
    pub last_beat: u8,
    /// Ghost: the last tick found nothing to settle and no fault happened since.
    pub clean: bool,
    /// The dataset token seen last (`Shared::token`; `None`: '', a process that has not
    /// heartbeated yet).
    pub token: Option<u8>,
    /// `Shared::restore_pending`: the next tick (or the rest of this one) writes back every
    /// pin, index entry and record held (after data loss, a lost registration, a master
    /// switch).
    pub restore: bool,
    /// `Shared::registration_unconfirmed` (only with `Config::failover`): no replica of
    /// the master the registration was last found on has acknowledged it yet.
    pub unconfirmed: bool,
    /// `Shared::registration_switches`: the master-switch count of the connection that wrote
    /// the registration or last found it on a new master.
    pub reg_switches: u8,
    /// `Shared::switches_seen`: the master-switch count the heartbeat last saw.
    pub switches_seen: u8,
    /// `Term::switches`: the master-switch count of the connection that confirmed the term.
    pub term_switches: u8,
    /// `Shared::life_t0_us` (only with `Config::failover`): this life's clean-up boundary,
    /// which a registration a failover lost registers again with.
    pub life_t0: u8,
    /// Ghost: a failover lost this life's last heartbeat (the new master has an older score);
    /// until it heartbeats again.
    pub beat_lost: bool,
    /// The master-switch count of the connection the reaper's current `reap_instance` runs
    /// on (made at its `reap_begin`).
    pub reap_made: u8,
    /// Ghost: data loss or a failover happened since this node's last full tick.
    pub faulted: bool,
    /// Ghost: this life's registration found Redis had lost its data ('ok' under a new
    /// dataset token: `Beat::Restored`), which asks for no restore; until its next full tick.
    pub register_restored: bool,
}

impl Node {
    pub fn new(rooms: u8, peers: u8) -> Node {
        let n = (rooms * peers) as usize;
        Node {
            phase: Phase::Down,
            boot: 0,
            life: 0,
            beat_done: false,
            held: 0,
            peers: vec![None; n],
            uncertain: 0,
            uncertain_upserts: 0,
            uncertain_removes: vec![None; n],
            pending_index: 0,
            term: None,
            sent: None,
            max_epoch: 0,
            reaper: Reaper::Idle,
            last_beat: 0,
            clean: false,
            token: None,
            restore: false,
            unconfirmed: false,
            reg_switches: 0,
            switches_seen: 0,
            term_switches: 0,
            life_t0: 0,
            beat_lost: false,
            reap_made: 0,
            faulted: false,
            register_restored: false,
        }
    }

    /// Everything local is lost (a crash, or the end of a leave); boot and life stay counted.
    /// (A new process's connector counts master switches from its start: a restart sets
    /// `switches_seen` to the current count.)
    pub fn reset(&mut self) {
        let (boot, life) = (self.boot, self.life);
        let n = self.peers.len();
        *self = Node {
            boot,
            life,
            ..Node::new(1, n as u8)
        };
    }

    /// `Local::clear`: every room and peer forgotten, with what was uncertain.
    pub fn clear(&mut self) -> Rooms {
        let held = self.held;
        self.held = 0;
        self.peers.iter_mut().for_each(|x| *x = None);
        self.uncertain = 0;
        self.uncertain_upserts = 0;
        self.uncertain_removes.iter_mut().for_each(|x| *x = None);
        self.pending_index = 0;
        held
    }

    /// `Local::remove_room`: the room and its peers.
    pub fn remove_room(&mut self, r: Id, peers: u8) {
        self.held &= !(1 << r);
        for p in 0..peers {
            self.peers[(r * peers + p) as usize] = None;
        }
    }

    /// The term ends (`LeaderState::end*`); the reaper abandons its round unless its last
    /// pipeline is on the wire.
    pub fn demote(&mut self) {
        self.term = None;
        if !matches!(self.reaper, Reaper::Finishing { .. }) {
            self.reaper = Reaper::Idle;
        }
    }

    /// `Shared::is_leader`: a term whose local deadline has not passed, confirmed on the
    /// master every connection reaches now (`switches`, the master-switch count).
    pub fn leading(&self, now: u8, switches: u8) -> bool {
        self.phase != Phase::Down
            && self.term.is_some_and(|(_, d)| now < d)
            && self.term_switches == switches
    }
}
