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
        }
    }

    /// Everything local is lost (a crash, or the end of a leave); boot and life stay counted.
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

    /// `Shared::is_leader`: a term whose local deadline has not passed.
    pub fn leading(&self, now: u8) -> bool {
        self.phase != Phase::Down && self.term.is_some_and(|(_, d)| now < d)
    }
}
