//! What the model is checked with: bounds, timings, mutations.

/// Discrete timings, in model time units. They keep the order of the real defaults
/// (docs/DESIGN.md "Timings": interval 10 s < heartbeat_ttl 30 s < stale 45 s < two-phase
/// 60 s < pin_ttl 90 s = lease_ttl 90 s; lease_refresh 30 s < lease_ttl / 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Timings {
    /// `heartbeat_ttl`: the PX of `P:{ctl}:hb:<I>`.
    pub heartbeat_ttl: u8,
    /// `stale_threshold`: a score older than `now - stale` makes a candidate.
    pub stale: u8,
    /// `two_phase_delay`: the leader's wait between listing and re-check.
    pub two_phase: u8,
    /// `pin_ttl`: the PX of a room's pin.
    pub pin_ttl: u8,
    /// `lease_ttl`: the PX of the lease.
    pub lease_ttl: u8,
    /// The local deadline's margin (`leader::deadline`: `sent + lease_ttl - lease_ttl / 10`),
    /// at least one unit.
    pub lease_margin: u8,
}

impl Timings {
    /// The ratio-preserving timings of the full run.
    pub const RATIOS: Timings = Timings {
        heartbeat_ttl: 2,
        stale: 3,
        two_phase: 4,
        pin_ttl: 6,
        lease_ttl: 6,
        lease_margin: 1,
    };

    /// The default run's timings: as `RATIOS` but for a two-phase wait of one unit and pin and
    /// lease TTLs of four (still interval < heartbeat_ttl < stale < pin_ttl = lease_ttl,
    /// lease refresh possible every unit < lease_ttl / 2). The two-phase wait's length only
    /// matters for liveness (the re-check is atomic in reap_begin.lua).
    pub const SMALL: Timings = Timings {
        heartbeat_ttl: 2,
        stale: 3,
        two_phase: 1,
        pin_ttl: 4,
        lease_ttl: 4,
        lease_margin: 1,
    };
}

/// A known-bad behaviour the model can be run with; the checker must find a counterexample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// `reap_begin.lua` marks a candidate dead without re-checking its heartbeat key and score.
    NoTwoPhaseRecheck,
    /// `reap_room.lua` deletes every room of the dead instance's index whole, whoever owns it.
    NoOwnerCasInReapRoom,
    /// `lease_refresh.lua` extends (or recreates) the lease whoever holds it.
    LeaseRefreshNoOwnerCheck,
    /// `Node::leave` deregisters even after a close failed.
    LeaveDeregistersAfterFailedClose,
    /// t0 compared on a coarse clock: a write at the reap's start instant counts as before it
    /// (`<=` instead of `<` in `reap_room.lua`).
    MillisecondT0Ties,
    /// `pin` writes the pin first and the room index entry in a later step; the host may upsert
    /// into the room in between (a record in a room not in the writer's index).
    UpsertBeforeIndex,
    /// A call whose reply was lost is settled from the reply alone (the clean-up before issue
    /// 11): a close whose reply was lost marks nothing uncertain, and the tick does not walk
    /// the room index for members the node does not hold.
    ReplyDependentCleanup,
    /// The reaper's deferred `SREM`: at the end of a reap, the rooms it reaped are removed from
    /// the dead instance's live room index, even if that instance registered again meanwhile
    /// (and indexed those rooms anew).
    DeferredSrem,
    /// index_add.lua without its hand-over: an instance's index write after its reap
    /// completed leaves it out of the sorted set (model findings 1 and 2).
    UnregisteredIndexWriteUnmarked,
    /// deregister.lua without its hand-over: a zombie's leave during its reap removes the
    /// reap's mark from the sorted set (model finding 3).
    LeaveDuringReapUnmarked,
    /// `lease_acquire.lua` does not wait a lease TTL after a new dataset (data loss).
    NoDatasetWait,
    /// `heartbeat.lua` does not write the caller's highest epoch back (ARGV[7]).
    NoEpochWriteBack,
    /// The heartbeat does not restore what the node holds after a master switch.
    NoRestoreAfterSwitch,
    /// `heartbeat.lua` without the tombstone check: never 'zombie', so a reap of this very
    /// life met on a new master before a replica acknowledged the registration reads as a
    /// lost registration (the old price of the lost-registration rule).
    HeartbeatIgnoresTombstone,
    /// `heartbeat.lua`'s tombstone check without the life: 'zombie' whenever a tombstone
    /// exists, whichever life it names.
    TombstoneNamesAnyLife,
    /// `index_add.lua` marks an unregistered instance whatever ARGV[2] says (the node's
    /// registration unconfirmed: a failover may have lost it and the instance lives on).
    MarkWhileUnconfirmed,
    /// `index_add.lua` without the tombstone clause: while unconfirmed, never marks, even when
    /// the reap tombstone names the caller's life (a zombie whose reap completed, that pins and
    /// crashes before its next tick, leaves rooms no leader reaches: model finding 11).
    UnconfirmedZombieUnmarked,
}

impl Mutation {
    /// Every mutation.
    pub const ALL: [Mutation; 17] = [
        Mutation::ReplyDependentCleanup,
        Mutation::DeferredSrem,
        Mutation::UnregisteredIndexWriteUnmarked,
        Mutation::LeaveDuringReapUnmarked,
        Mutation::NoTwoPhaseRecheck,
        Mutation::NoOwnerCasInReapRoom,
        Mutation::LeaseRefreshNoOwnerCheck,
        Mutation::LeaveDeregistersAfterFailedClose,
        Mutation::MillisecondT0Ties,
        Mutation::UpsertBeforeIndex,
        Mutation::NoDatasetWait,
        Mutation::NoEpochWriteBack,
        Mutation::NoRestoreAfterSwitch,
        Mutation::HeartbeatIgnoresTombstone,
        Mutation::TombstoneNamesAnyLife,
        Mutation::MarkWhileUnconfirmed,
        Mutation::UnconfirmedZombieUnmarked,
    ];

    /// The scenario whose bounds expose the mutation.
    pub fn scenario(self) -> Config {
        let base = match self {
            Mutation::LeaseRefreshNoOwnerCheck => Config::lease(),
            Mutation::LeaveDeregistersAfterFailedClose => Config::leave(),
            Mutation::NoTwoPhaseRecheck | Mutation::MillisecondT0Ties | Mutation::DeferredSrem => {
                Config::pause_only()
            }
            // One pin after the reap completed, then a crash.
            Mutation::UnregisteredIndexWriteUnmarked => Config {
                max_host_calls: Some(1),
                ..Config::default_bounds()
            },
            // A pin, then the zombie's leave while its reap runs.
            Mutation::LeaveDuringReapUnmarked => Config::leave_reap(),
            Mutation::NoDatasetWait | Mutation::NoEpochWriteBack => Config::loss_lease(),
            Mutation::NoRestoreAfterSwitch | Mutation::MarkWhileUnconfirmed => Config::failover(),
            // A reap of the paused instance, its pin, its crash: one room, one peer, one term.
            Mutation::UnconfirmedZombieUnmarked => Config {
                rooms: 1,
                peers: 1,
                max_terms: 1,
                ..Config::failover()
            },
            // A reap on the new master and the zombie's tick: no host call needed.
            Mutation::HeartbeatIgnoresTombstone | Mutation::TombstoneNamesAnyLife => Config {
                max_host_calls: Some(0),
                hosts: 0,
                ..Config::failover()
            },
            _ => Config::default_bounds(),
        };
        base.with(self)
    }

    /// The property whose counterexample the checker must find.
    pub fn expected_property(self) -> &'static str {
        match self {
            Mutation::NoTwoPhaseRecheck => crate::P_LIVE_SAFE,
            Mutation::NoOwnerCasInReapRoom => crate::P_LIVE_SAFE,
            Mutation::LeaseRefreshNoOwnerCheck => crate::P_LEASE_TERM,
            Mutation::LeaveDeregistersAfterFailedClose => crate::P_NOTHING_LEFT,
            Mutation::MillisecondT0Ties => crate::P_LIVE_SAFE,
            Mutation::UpsertBeforeIndex => crate::P_REACHABLE,
            Mutation::ReplyDependentCleanup => crate::P_INDEX_MATCHES,
            Mutation::DeferredSrem => crate::P_REACHABLE,
            Mutation::UnregisteredIndexWriteUnmarked | Mutation::LeaveDuringReapUnmarked => {
                crate::P_IN_REACH
            }
            Mutation::NoDatasetWait => crate::P_ONE_LEADER,
            Mutation::NoEpochWriteBack => crate::P_EPOCHS,
            Mutation::NoRestoreAfterSwitch => crate::P_HELD_STORED,
            Mutation::HeartbeatIgnoresTombstone => crate::P_NO_PRICE,
            Mutation::TombstoneNamesAnyLife => crate::P_ZOMBIE_TRUE,
            Mutation::MarkWhileUnconfirmed => crate::P_NO_MARK,
            Mutation::UnconfirmedZombieUnmarked => crate::P_IN_REACH,
        }
    }
}

/// The model's bounds and options.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Config {
    /// Instances (ids 0..instances).
    pub instances: u8,
    /// Rooms (ids 0..rooms), at most 8.
    pub rooms: u8,
    /// Peer ids per room; rooms * peers at most 8.
    pub peers: u8,
    /// Model time runs from 1 (0 is the reaped mark) to this.
    pub max_time: u8,
    /// Lives (registrations) per instance, the first included.
    pub max_lives: u8,
    /// Terms (successful lease acquires) in total.
    pub max_terms: u8,
    /// Upserts per room life (generations handed out by one room's counter).
    pub max_upserts: u8,
    /// Faults in total: crash, pause, lost reply, crash between two steps, a failed call in
    /// `leave`.
    pub max_faults: u8,
    /// Host calls (pin, close, upsert, remove, leave) in total; `None`: unbounded (the state
    /// space stays finite: generations are bounded per room life, time by `max_time`).
    pub max_host_calls: Option<u8>,
    /// Instances (bit i) whose host makes every call (pin, close, upsert, remove, leave).
    pub hosts: u8,
    /// Instances (bit i) whose host only pins (to take rooms over).
    pub pinners: u8,
    /// Instances (bit i) that run a lease thread (and so a reaper).
    pub leaders: u8,
    /// Instances (bit i) that may crash or lose replies.
    pub faulty: u8,
    /// The tick as two steps (heartbeat, then the rest) rather than one.
    pub split_tick: bool,
    /// The lease request as two steps (the local clock read and the request sent, then its
    /// execution on Redis and the reply) rather than one.
    pub split_lease: bool,
    /// Whether replies may be lost.
    pub lost_replies: bool,
    /// Whether a stopped instance may start again (a new process, same id).
    pub restarts: bool,
    /// Whether `leave` is explored.
    pub leave: bool,
    /// Whether Redis may lose its data (`Action::DataLoss`, a fault): every key gone, the
    /// dataset token with them.
    pub data_loss: bool,
    /// Whether a replica is kept and may replace the master (`Action::Replicate`,
    /// `Action::Failover`, a fault), with the lost-registration rule and the switch fence.
    pub failover: bool,
    pub timings: Timings,
    pub mutation: Option<Mutation>,
}

impl Config {
    /// The default check ("reap" scenario): 2 instances x 2 rooms x 2 peers; instance 0's host
    /// makes every call and may crash or lose replies, instance 1 leads (lease, reaper) and its
    /// host pins (takeovers). Time runs to 6 units: a reap of instance 0 can complete.
    pub fn default_bounds() -> Config {
        Config {
            instances: 2,
            rooms: 2,
            peers: 2,
            max_time: 6,
            max_lives: 2,
            max_terms: 2,
            max_upserts: 1,
            max_faults: 1,
            max_host_calls: Some(3),
            hosts: 0b01,
            pinners: 0b10,
            leaders: 0b10,
            faulty: 0b01,
            split_tick: false,
            split_lease: false,
            lost_replies: true,
            restarts: true,
            leave: false,
            data_loss: false,
            failover: false,
            timings: Timings::SMALL,
            mutation: None,
        }
    }

    /// The "lease" scenario: both instances lead, crash and restart; no host calls; the lease
    /// request split into send and execution (time passes between: network delay, a pause).
    pub fn lease() -> Config {
        Config {
            max_time: 6,
            max_terms: 3,
            max_faults: 1,
            max_host_calls: Some(0),
            hosts: 0,
            pinners: 0,
            leaders: 0b11,
            faulty: 0b11,
            split_lease: true,
            ..Config::default_bounds()
        }
    }

    /// The "leave" scenario: the default with `Node::leave` and a shorter time bound.
    pub fn leave() -> Config {
        Config {
            max_time: 4,
            leave: true,
            ..Config::default_bounds()
        }
    }

    /// The "leave-reap" scenario: a leave while a reap of the instance may run (time 6 as
    /// the default), with fewer host calls (a pin or two, then the leave).
    pub fn leave_reap() -> Config {
        Config {
            max_host_calls: Some(2),
            leave: true,
            ..Config::default_bounds()
        }
    }

    /// The reap scenario with no faults but a pause (any instance may idle while time
    /// passes) and no takeovers: what the mutations that need only a pause are checked in
    /// (a tenth of the states).
    pub fn pause_only() -> Config {
        Config {
            faulty: 0,
            pinners: 0,
            ..Config::default_bounds()
        }
    }

    /// The "loss" scenario: the default with Redis data loss as the one fault (no crash, no
    /// lost reply) and two host calls: restores (pins still free taken again, records written
    /// back, a room taken over meanwhile reported lost), reaps across the loss.
    pub fn loss() -> Config {
        Config {
            max_host_calls: Some(2),
            faulty: 0,
            lost_replies: false,
            data_loss: true,
            ..Config::default_bounds()
        }
    }

    /// The "loss-lease" scenario: the "lease" scenario with data loss as the one fault
    /// instead of a crash: a leader of the lost dataset acting on its local deadline while
    /// another waits out lease_acquire.lua's lease TTL after the new dataset.
    pub fn loss_lease() -> Config {
        Config {
            faulty: 0,
            data_loss: true,
            ..Config::lease()
        }
    }

    /// The "failover" scenario: the default with a replica and a failover to it or a crash of
    /// instance 0 as the one fault (no lost reply), one host call and no pinner:
    /// registrations lost or met reaped on the new master, restores after the switch, reaps
    /// across it, and an unacknowledged zombie that pins and crashes before its next tick
    /// (model finding 11).
    pub fn failover() -> Config {
        Config {
            max_host_calls: Some(1),
            pinners: 0,
            faulty: 0b01,
            lost_replies: false,
            failover: true,
            ..Config::default_bounds()
        }
    }

    /// The "failover-lease" scenario: the "lease" scenario with a failover as the one fault
    /// instead of a crash (the lease request in one step: a request sent before a switch and
    /// executed after it is not modelled): the switch fence and `WAIT 1` after lease writes.
    pub fn failover_lease() -> Config {
        Config {
            faulty: 0,
            split_lease: false,
            failover: true,
            ..Config::lease()
        }
    }

    /// The bigger run behind `SFU_MODEL_FULL=1`: the default scenario with leave, two upserts
    /// per room life, and the tick and the lease request split in two steps each.
    pub fn full() -> Config {
        Config {
            max_upserts: 2,
            leave: true,
            split_tick: true,
            split_lease: true,
            ..Config::default_bounds()
        }
    }

    /// The scenarios the default test checks (with `SFU_MODEL_FULL=1`, `full` instead of
    /// the first; `SFU_MODEL_ONLY=loss,failover`: only those), each with `from_env`'s
    /// overrides.
    pub fn scenarios() -> Vec<(&'static str, Config)> {
        let full = std::env::var("SFU_MODEL_FULL").is_ok_and(|v| v == "1");
        vec![
            (
                "reap",
                if full {
                    Config::full()
                } else {
                    Config::default_bounds()
                },
            ),
            ("lease", Config::lease()),
            ("leave", Config::leave()),
            ("leave-reap", Config::leave_reap()),
            ("loss", Config::loss()),
            ("loss-lease", Config::loss_lease()),
            ("failover", Config::failover()),
            ("failover-lease", Config::failover_lease()),
        ]
        .into_iter()
        .filter(|(name, _)| Config::selected(name))
        .collect()
    }

    /// `SFU_MODEL_ONLY` (comma-separated scenario names): only those run; unset, all.
    fn selected(name: &str) -> bool {
        std::env::var("SFU_MODEL_ONLY").map_or(true, |only| only.split(',').any(|n| n == name))
    }

    /// `self` with the bounds given in the environment (`SFU_MODEL_MAX_TIME`,
    /// `SFU_MODEL_MAX_FAULTS`, `SFU_MODEL_HOST_CALLS` (0: unbounded), `SFU_MODEL_LEAVE`,
    /// `SFU_MODEL_MAX_UPSERTS`, `SFU_MODEL_HOSTS`, `SFU_MODEL_PINNERS`, `SFU_MODEL_LEADERS`,
    /// `SFU_MODEL_FAULTY` (bit masks), `SFU_MODEL_LOSS`, `SFU_MODEL_FAILOVER`,
    /// `SFU_MODEL_LOST_REPLIES` (0 or 1), `SFU_MODEL_LIVES`, `SFU_MODEL_TERMS`,
    /// `SFU_MODEL_ROOMS`, `SFU_MODEL_PEERS`, `SFU_MODEL_SPLIT_LEASE`, `SFU_MODEL_SPLIT_TICK`),
    /// to explore how
    /// the state count grows.
    pub fn env_overrides(self) -> Config {
        let mut c = self;
        let num = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u8>().ok());
        if let Some(t) = num("SFU_MODEL_MAX_TIME") {
            c.max_time = t;
        }
        if let Some(h) = num("SFU_MODEL_HOST_CALLS") {
            c.max_host_calls = (h != 0).then_some(h);
        }
        if let Some(l) = num("SFU_MODEL_LEAVE") {
            c.leave = l != 0;
        }
        if let Some(u) = num("SFU_MODEL_MAX_UPSERTS") {
            c.max_upserts = u;
        }
        if let Some(h) = num("SFU_MODEL_HOSTS") {
            c.hosts = h;
        }
        if let Some(h) = num("SFU_MODEL_PINNERS") {
            c.pinners = h;
        }
        if let Some(h) = num("SFU_MODEL_LEADERS") {
            c.leaders = h;
        }
        if let Some(h) = num("SFU_MODEL_FAULTY") {
            c.faulty = h;
        }
        if let Some(f) = num("SFU_MODEL_MAX_FAULTS") {
            c.max_faults = f;
        }
        if let Some(l) = num("SFU_MODEL_LOSS") {
            c.data_loss = l != 0;
        }
        if let Some(f) = num("SFU_MODEL_FAILOVER") {
            c.failover = f != 0;
        }
        if let Some(l) = num("SFU_MODEL_LIVES") {
            c.max_lives = l;
        }
        if let Some(t) = num("SFU_MODEL_TERMS") {
            c.max_terms = t;
        }
        if let Some(l) = num("SFU_MODEL_SPLIT_LEASE") {
            c.split_lease = l != 0;
        }
        if let Some(l) = num("SFU_MODEL_SPLIT_TICK") {
            c.split_tick = l != 0;
        }
        if let Some(p) = num("SFU_MODEL_PEERS") {
            c.peers = p;
        }
        if let Some(r) = num("SFU_MODEL_ROOMS") {
            c.rooms = r;
        }
        if let Some(l) = num("SFU_MODEL_LOST_REPLIES") {
            c.lost_replies = l != 0;
        }
        c
    }

    /// The same bounds with `m`.
    pub fn with(mut self, m: Mutation) -> Config {
        self.mutation = Some(m);
        self
    }

    pub(crate) fn mutated(&self, m: Mutation) -> bool {
        self.mutation == Some(m)
    }

    /// The local deadline of a term confirmed by a request sent at `sent`.
    pub(crate) fn deadline(&self, sent: u8) -> u8 {
        sent + self.timings.lease_ttl - self.timings.lease_margin
    }
}
