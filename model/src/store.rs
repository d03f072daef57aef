//! Redis as one store, and each Lua script of `lua/` as one atomic function named after its
//! file, with the same guards, effects and reply.
//!
//! Time: `now` is Redis server time in model units (ms and µs alike: see the README for what
//! that simplifies). A key with a PX expires at `expires`; it is gone once `now >= expires`
//! ([`Redis::expire`] runs whenever time advances).

use crate::config::{Config, Mutation};

/// An instance id, a room id, a peer id (indexes).
pub type Id = u8;
/// A set of rooms (bit r).
pub type Rooms = u8;

/// The boot token held by `P:{ctl}:hb:<I>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Boot {
    /// The boot token of a process (its number).
    Process(u8),
    /// `heartbeat_release.lua` marked it released (a graceful stop).
    Released,
}

/// `P:{ctl}:hb:<I>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HbKey {
    pub boot: Boot,
    pub expires: u8,
}

/// `P:{ctl}:leader`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    pub owner: Id,
    pub expires: u8,
    /// Ghost: the epoch of the acquire that created this key (0: not created by an acquire).
    pub term: u8,
}

/// `P:{ctl}:dataset`: the dataset token, `<random>:<server ms>` as the first heartbeat after
/// Redis started empty writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Dataset {
    /// Which token (the random part): 0 is the one the checked run starts with (an old
    /// dataset, no creation time to wait out), `n` the one written after the `n`-th data loss.
    pub gen: u8,
    /// The server time in it (lease_acquire.lua waits a lease TTL after it); unused for gen 0.
    pub created: u8,
}

/// `P:room:{R}:meta` (the fields the protocol reads).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Meta {
    pub owner: Id,
    /// `pinned_us`.
    pub pinned: u8,
    /// `peer_seq` (absent until the first upsert of this room life).
    pub peer_seq: Option<u16>,
    /// Ghost: the life of `owner` that wrote `owner`.
    pub life: u8,
}

/// `P:room:{R}:peer:<p>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Record {
    pub instance: Id,
    pub generation: u16,
    /// `updated_us`.
    pub at: u8,
    /// Ghost: the life of `instance` that wrote it.
    pub life: u8,
}

/// The keys of one room.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Room {
    /// `P:room:{R}:owner`: (owner, expires).
    pub pin: Option<(Id, u8)>,
    pub meta: Option<Meta>,
    /// `P:room:{R}:peers` (bit p).
    pub members: u8,
    /// Peer records by peer id.
    pub records: Vec<Option<Record>>,
}

/// The whole Redis dataset of one prefix.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Redis {
    pub now: u8,
    /// `P:{ctl}:heartbeats`: instance -> score (0 = being reaped).
    pub zset: Vec<Option<u8>>,
    pub hb: Vec<Option<HbKey>>,
    /// `P:{ctl}:epoch`.
    pub epoch: u8,
    pub lease: Option<Lease>,
    pub rooms: Vec<Room>,
    /// `P:{ctl}:instance:<I>:rooms` (an empty set is an absent key).
    pub index: Vec<Rooms>,
    /// `P:{ctl}:instance:<I>:reaping-rooms`.
    pub reaping: Vec<Rooms>,
    /// `P:{ctl}:instance:<I>:reaping`: the token of the reap that moved the index.
    pub reaping_token: Vec<Option<u16>>,
    /// `P:{ctl}:instance:<I>:info`, its `started_ms` field only: which life of I registered
    /// it (a life's `started_ms` is its own: the model's life number stands for it; `None`:
    /// no info hash). Written by every heartbeat that writes (whole at 'register' and
    /// 'restored', and when it is missing or names another life), deleted by reap_finish.lua
    /// with the sorted-set entry and by deregister.lua. Its other fields are not modelled.
    pub info: Vec<Option<u8>>,
    /// `P:{ctl}:instance:<I>:reaped`, the reap tombstone: the life (`started_ms`) whose info
    /// hash reap_begin.lua found when a reap of I began (`None`: no key). Deleted by
    /// heartbeat.lua at 'register' and 'restored'. Its PX (a day) never runs out within the
    /// model's few time units, so it has no expiry here.
    pub tombstone: Vec<Option<u8>>,
    /// `P:{ctl}:dataset` (`None`: gone with the data, until a heartbeat writes a new one).
    pub dataset: Option<Dataset>,
    /// Not a key: data losses so far (survives them), so that each new dataset token differs
    /// from every earlier one (the random part of the real token).
    pub losses: u8,
    /// Ghost (only with `Config::failover`): instances whose sorted-set entry is absent or 0
    /// because of a reap (`reap_begin.lua` marked it, `reap_finish.lua` removed it); a
    /// registration clears it. With `entry_life`, tells a reap of a life from a registration
    /// a failover lost (properties `P_NO_PRICE`, `P_NO_MARK`), independently of the
    /// tombstone.
    pub reaped_mark: u8,
    /// Ghost (only with `Config::failover`): per instance, the life whose heartbeat wrote its
    /// sorted-set entry last.
    pub entry_life: Vec<u8>,
}

/// The generation counter of a room starts at the server time "in microseconds": in model units
/// `now * GEN_SCALE`, above every generation an earlier life of the room handed out (at most
/// `GEN_SCALE - 1` upserts per room life; `Config::max_upserts` stays below).
pub const GEN_SCALE: u16 = 16;

/// pin_room.lua's reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinReply {
    Pinned,
    Ours,
    TookOver(Id),
    Held(Id),
}

/// pin_refresh.lua's reply (and the plain refresh's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refreshed {
    Ok,
    Repinned,
    Gone,
    Lost(Id),
}

/// reap_room.lua's status for one room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoomStatus {
    Reaped,
    Gone,
    Skipped,
    NewLife,
}

/// reap_begin.lua's reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Begin {
    Dead { t0: u8, token: u16 },
    Alive,
    Gone,
    NotLeader,
}

/// reap_finish.lua's reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    Done,
    Incomplete,
    Alive,
    Retry,
}

/// heartbeat.lua's status (one schema), and the library's reading of it (`heartbeat::Beat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beat {
    Ok,
    /// 'restored': no entry and the dataset token gone or changed (Redis lost its data): the
    /// instance was registered again. The library also reads an 'ok' whose token differs from
    /// the one the node knew as this.
    Restored,
    /// Being reaped (score 0).
    Reaped,
    /// No entry, the dataset token unchanged: a completed reap, or a registration a failover
    /// lost.
    Missing,
    /// 'zombie': as 'reaped' or 'missing', and the reap tombstone names this very life: a reap
    /// of it began (on this master or on one it replicated). The library reads it as
    /// `Reaped`, whatever master it reaches.
    Zombie,
    Duplicate,
    /// Not a status of the script: the library's `Beat::Unregistered` ('missing' or 'reaped'
    /// on another master than the one the registration was last found on, no replica having
    /// acknowledged it; never 'zombie').
    Unregistered,
}

/// heartbeat.lua's reply: the status, the dataset token after the call (`None`: '') and the
/// epoch counter after the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BeatReply {
    pub status: Beat,
    pub token: Option<u8>,
    pub epoch: u8,
}

/// What a reap deleted that it must not have, seen by the script as it ran (ghost).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Deleted {
    /// (instance, life) owning a room deleted whole (its pin's or metadata's owner).
    pub room_of: Option<(Id, u8)>,
    /// (instance, life) of each record deleted.
    pub records: [Option<(Id, u8)>; 8],
}

/// One Redis operation of a step with the model's reply: the unit the trace replay
/// (`tests/replay.rs`) runs on a real Redis through the library's calls. Recorded only while
/// [`record`] is on (never during the model check).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// One unit of time passes; `Redis::expire` drops what ran out.
    Advance,
    /// heartbeat.lua 'tick' / 'register' (`known`: the token the node saw last, `seen` the
    /// highest epoch it has seen, `life` the life whose `started_ms` is ARGV[8]).
    Heartbeat {
        i: Id,
        boot: u8,
        register: bool,
        known: Option<u8>,
        seen: u8,
        life: u8,
        reply: BeatReply,
    },
    /// Redis lost its data: every key of the prefix gone, the dataset token with them.
    DataLoss,
    /// heartbeat_release.lua.
    HeartbeatRelease {
        i: Id,
        boot: u8,
        reply: bool,
    },
    /// index_add.lua: `SADD` of rooms to `i`'s room index (`may_mark`: ARGV[2] '1');
    /// `added`: how many were new.
    IndexAdd {
        i: Id,
        rooms: Rooms,
        may_mark: bool,
        /// The caller's life (ARGV[3], its `started_ms`).
        life: u8,
        added: u8,
    },
    /// `SREM` of rooms from `i`'s room index.
    IndexRemove {
        i: Id,
        rooms: Rooms,
    },
    /// `Node::leave`'s deregistration: `DEL hb`, `ZREM` (and `DEL info`).
    Deregister {
        i: Id,
    },
    /// pin_room.lua (the takeover's second call names `stale_owner`).
    PinRoom {
        i: Id,
        r: Id,
        stale_owner: Option<Id>,
        reply: PinReply,
    },
    /// `EXISTS hb:<i>` (a pin's takeover check).
    HbExists {
        i: Id,
        reply: bool,
    },
    /// The tick's plain refresh (`PEXPIRE GT`, `GET`); `None`: the pin lapsed.
    RefreshPlain {
        i: Id,
        r: Id,
        reply: Option<Refreshed>,
    },
    /// pin_refresh.lua ('0'; `restore`: '1', after the room's index entry, as
    /// `rooms::restore_pins` sends it).
    PinRefresh {
        i: Id,
        r: Id,
        restore: bool,
        reply: Refreshed,
    },
    /// close_room.lua until 'closed' or 'not_owner'.
    CloseRoom {
        i: Id,
        r: Id,
        reply: Result<(), Option<Id>>,
    },
    /// `rooms::sweep_own`: `false` when the room is `i`'s (nothing swept).
    SweepOwn {
        i: Id,
        r: Id,
        reply: bool,
    },
    /// upsert_peer.lua.
    UpsertPeer {
        i: Id,
        r: Id,
        p: Id,
        reply: Result<u16, Option<Id>>,
    },
    /// upsert_peer.lua writing back a held record with its generation (`peers::restore`);
    /// `reply`: written (else 'not_owner').
    RestorePeer {
        i: Id,
        r: Id,
        p: Id,
        gen: u16,
        reply: bool,
    },
    /// remove_peer.lua.
    RemovePeer {
        i: Id,
        r: Id,
        p: Id,
        gen: u16,
        reply: Result<bool, Id>,
    },
    /// `HMGET` of a record's instance and generation.
    ReadRecord {
        r: Id,
        p: Id,
        reply: Option<(Id, u16)>,
    },
    /// `Err(None)`: '<dataset new>'.
    LeaseAcquire {
        i: Id,
        seen: u8,
        reply: Result<u8, Option<Id>>,
    },
    LeaseRefresh {
        i: Id,
        reply: bool,
    },
    LeaseRelease {
        i: Id,
        reply: bool,
    },
    /// candidates.lua less the caller.
    Candidates {
        me: Id,
        reply: u8,
    },
    ReapBegin {
        d: Id,
        leader: Id,
        reply: Begin,
    },
    /// The reaper's page of `d`'s moved index.
    ReadReaping {
        d: Id,
        reply: Rooms,
    },
    /// reap_room.lua for one room (`t0: None`: SWEEP_ALL).
    ReapRoom {
        d: Id,
        t0: Option<u8>,
        r: Id,
        reply: (RoomStatus, u8),
    },
    ReapPutback {
        d: Id,
        token: u16,
        rooms: Rooms,
        reply: Option<u8>,
    },
    ReapFinish {
        d: Id,
        kept: u8,
        token: u16,
        put_back: u8,
        reply: Finish,
    },
}

thread_local! {
    static RECORDED: std::cell::RefCell<Option<Vec<Op>>> = const { std::cell::RefCell::new(None) };
}

/// Starts (`true`) or stops recording the [`Op`]s of this thread's steps; returns what was
/// recorded since the last call.
pub fn record(on: bool) -> Vec<Op> {
    RECORDED.with(|r| {
        let mut r = r.borrow_mut();
        let out = r.take().unwrap_or_default();
        if on {
            *r = Some(Vec::new());
        }
        out
    })
}

fn log(op: impl FnOnce() -> Op) {
    RECORDED.with(|r| {
        if let Some(v) = r.borrow_mut().as_mut() {
            v.push(op());
        }
    });
}

impl Redis {
    pub fn new(c: &Config) -> Redis {
        let n = c.instances as usize;
        Redis {
            now: 1,
            zset: vec![None; n],
            hb: vec![None; n],
            epoch: 0,
            lease: None,
            rooms: (0..c.rooms)
                .map(|_| Room {
                    pin: None,
                    meta: None,
                    members: 0,
                    records: vec![None; c.peers as usize],
                })
                .collect(),
            index: vec![0; n],
            reaping: vec![0; n],
            reaping_token: vec![None; n],
            info: vec![None; n],
            tombstone: vec![None; n],
            dataset: Some(Dataset { gen: 0, created: 0 }),
            losses: 0,
            reaped_mark: 0,
            entry_life: vec![0; n],
        }
    }

    /// Drops every key whose PX ran out.
    pub fn expire(&mut self) {
        let now = self.now;
        for k in self.hb.iter_mut() {
            if k.is_some_and(|k| k.expires <= now) {
                *k = None;
            }
        }
        if self.lease.is_some_and(|l| l.expires <= now) {
            self.lease = None;
        }
        for r in self.rooms.iter_mut() {
            if r.pin.is_some_and(|(_, e)| e <= now) {
                r.pin = None;
            }
        }
    }

    fn pin_owner(&self, r: Id) -> Option<Id> {
        self.rooms[r as usize].pin.map(|(o, _)| o)
    }

    fn meta_owner(&self, r: Id) -> Option<Id> {
        self.rooms[r as usize].meta.map(|m| m.owner)
    }

    /// The writes heartbeat.lua makes once it goes on ('ok', 'restored', a tick's
    /// 'duplicate', a registration): a new dataset token if it is gone, the highest epoch the
    /// caller has seen written back, the score and the heartbeat key, the info hash naming
    /// `life` (written whole at 'register' and 'restored', and whenever it is missing or names
    /// another life: after any of these writes it names `life`).
    fn beat_writes(&mut self, c: &Config, i: Id, boot: u8, seen: u8, life: u8) {
        let iu = i as usize;
        if self.dataset.is_none() {
            self.dataset = Some(Dataset {
                gen: self.losses,
                created: self.now,
            });
        }
        if seen > self.epoch && !c.mutated(Mutation::NoEpochWriteBack) {
            self.epoch = seen;
        }
        self.zset[iu] = Some(self.now);
        self.hb[iu] = Some(HbKey {
            boot: Boot::Process(boot),
            expires: self.now + c.timings.heartbeat_ttl,
        });
        self.info[iu] = Some(life);
        if c.failover {
            self.reaped_mark &= !(1 << i);
        }
    }

    fn beat_reply(&self, status: Beat) -> BeatReply {
        BeatReply {
            status,
            token: self.dataset.map(|d| d.gen),
            epoch: self.epoch,
        }
    }

    /// heartbeat.lua, 'tick' mode: 'missing' for no entry under the token the caller knows
    /// (nothing written), 'restored' for no entry under another token or none (Redis lost its
    /// data: registered again; the tombstone deleted), 'reaped' for a 0 score (nothing
    /// written), 'zombie' instead of 'missing' or 'reaped' when the tombstone names `life`
    /// (ARGV[8]: never '0' in the model, a life's `started_ms` is known before its first
    /// heartbeat), else the heartbeat ('duplicate' if another boot token held the key).
    fn heartbeat_tick_(
        &mut self,
        c: &Config,
        i: Id,
        boot: u8,
        known: Option<u8>,
        seen: u8,
        life: u8,
    ) -> BeatReply {
        let iu = i as usize;
        let same = self.dataset.is_some_and(|d| Some(d.gen) == known);
        // The tombstone names this life: a reap of it began.
        let taken = match self.tombstone[iu] {
            _ if c.mutated(Mutation::HeartbeatIgnoresTombstone) => false,
            Some(_) if c.mutated(Mutation::TombstoneNamesAnyLife) => true,
            t => t == Some(life),
        };
        let or_zombie = |b: Beat| if taken { Beat::Zombie } else { b };
        let status = match self.zset[iu] {
            None if same => return self.beat_reply(or_zombie(Beat::Missing)),
            None => Beat::Restored,
            Some(0) if same || self.reaping_token[iu].is_some() => {
                return self.beat_reply(or_zombie(Beat::Reaped))
            }
            // A score 0 under a token the caller never saw, no reap under way: index_add.lua's
            // mark of a write between the loss and this tick, not a reap of its registration.
            Some(0) => Beat::Restored,
            Some(_) => Beat::Ok,
        };
        let holder = self.hb[iu].map(|k| k.boot);
        self.beat_writes(c, i, boot, seen, life);
        if status == Beat::Restored {
            self.tombstone[iu] = None;
        }
        let status = match holder {
            Some(b) if status == Beat::Ok && b != Boot::Process(boot) => Beat::Duplicate,
            _ => status,
        };
        self.beat_reply(status)
    }

    /// heartbeat.lua, 'register' mode: refused ('duplicate') while another process's boot
    /// token holds the heartbeat key; else writes the heartbeat (and a new dataset token if it
    /// is gone, the epoch written back, the info naming `life`), merges a room index a reap
    /// moved aside back into the live one, deletes that reap's token and the tombstone.
    fn heartbeat_register_(
        &mut self,
        c: &Config,
        i: Id,
        boot: u8,
        seen: u8,
        life: u8,
    ) -> BeatReply {
        let iu = i as usize;
        if let Some(k) = self.hb[iu] {
            if k.boot != Boot::Process(boot) && k.boot != Boot::Released {
                return self.beat_reply(Beat::Duplicate);
            }
        }
        self.beat_writes(c, i, boot, seen, life);
        self.index[iu] |= self.reaping[iu];
        self.reaping[iu] = 0;
        self.reaping_token[iu] = None;
        self.tombstone[iu] = None;
        self.beat_reply(Beat::Ok)
    }

    /// heartbeat_release.lua.
    fn heartbeat_release_(&mut self, i: Id, boot: u8) -> bool {
        match &mut self.hb[i as usize] {
            Some(k) if k.boot == Boot::Process(boot) => {
                k.boot = Boot::Released;
                true
            }
            _ => false,
        }
    }

    /// pin_room.lua.
    fn pin_room_(
        &mut self,
        c: &Config,
        i: Id,
        life: u8,
        r: Id,
        stale_owner: Option<Id>,
    ) -> PinReply {
        let owner = self.pin_owner(r);
        let status = if owner == Some(i) {
            PinReply::Ours
        } else if owner.is_none() {
            match self.meta_owner(r) {
                Some(m) if m == i => PinReply::Ours,
                Some(m) => PinReply::TookOver(m),
                None => PinReply::Pinned,
            }
        } else if stale_owner.is_some() && owner == stale_owner {
            PinReply::TookOver(owner.unwrap())
        } else {
            return PinReply::Held(owner.unwrap());
        };
        let now = self.now;
        let room = &mut self.rooms[r as usize];
        room.pin = Some((i, now + c.timings.pin_ttl));
        let peer_seq = room.meta.and_then(|m| m.peer_seq);
        room.meta = Some(Meta {
            owner: i,
            pinned: now,
            peer_seq,
            life,
        });
        status
    }

    /// The tick's plain refresh of one pin: `PEXPIRE owner pin_ttl GT` then `GET owner`.
    /// `None`: the pin is gone (lapsed).
    fn refresh_plain_(&mut self, c: &Config, i: Id, r: Id) -> Option<Refreshed> {
        let now = self.now;
        let room = &mut self.rooms[r as usize];
        let (owner, expires) = room.pin?;
        room.pin = Some((owner, expires.max(now + c.timings.pin_ttl)));
        Some(if owner == i {
            Refreshed::Ok
        } else {
            Refreshed::Lost(owner)
        })
    }

    /// pin_refresh.lua (ARGV[3] '1' with `restore`: a room whose metadata is gone too is
    /// pinned again, pinned now).
    fn pin_refresh_(&mut self, c: &Config, i: Id, life: u8, r: Id, restore: bool) -> Refreshed {
        let now = self.now;
        let owner = self.pin_owner(r);
        let room = &mut self.rooms[r as usize];
        if owner == Some(i) {
            room.pin = Some((i, now + c.timings.pin_ttl));
            return Refreshed::Ok;
        }
        if let Some(o) = owner {
            return Refreshed::Lost(o);
        }
        match room.meta {
            Some(m) if m.owner != i => Refreshed::Lost(m.owner),
            None if restore => {
                room.pin = Some((i, now + c.timings.pin_ttl));
                room.meta = Some(Meta {
                    owner: i,
                    pinned: now,
                    peer_seq: None,
                    life,
                });
                Refreshed::Repinned
            }
            None => Refreshed::Gone,
            Some(mut m) => {
                room.pin = Some((i, now + c.timings.pin_ttl));
                m.owner = i;
                m.life = life;
                room.meta = Some(m);
                Refreshed::Repinned
            }
        }
    }

    /// close_room.lua, called until 'closed' (one call reads every peer of a model room).
    /// `Err(owner)`: 'not_owner'.
    fn close_room_(&mut self, i: Id, r: Id) -> Result<(), Option<Id>> {
        let owner = self.pin_owner(r);
        let meta_owner = self.meta_owner(r);
        if owner != Some(i) && !(owner.is_none() && meta_owner == Some(i)) {
            return Err(owner.or(meta_owner));
        }
        let room = &mut self.rooms[r as usize];
        room.pin = None;
        room.meta = None;
        room.members = 0;
        room.records.iter_mut().for_each(|x| *x = None);
        Ok(())
    }

    /// upsert_peer.lua (no guest). `Err(owner)`: 'not_owner'.
    fn upsert_peer_(&mut self, i: Id, r: Id, p: Id, life: u8) -> Result<u16, Option<Id>> {
        let owner = self.pin_owner(r);
        if owner != Some(i) {
            let meta_owner = self.meta_owner(r);
            if owner.is_some() || meta_owner != Some(i) {
                return Err(owner.or(meta_owner));
            }
        }
        let now = self.now;
        let room = &mut self.rooms[r as usize];
        let meta = room.meta.as_mut().expect("a room with a pin has metadata");
        let gen = match meta.peer_seq {
            None => now as u16 * GEN_SCALE + 1,
            Some(g) => g + 1,
        };
        meta.peer_seq = Some(gen);
        room.records[p as usize] = Some(Record {
            instance: i,
            generation: gen,
            at: now,
            life,
        });
        room.members |= 1 << p;
        Ok(gen)
    }

    /// upsert_peer.lua with ARGV[4] = `gen` (a record written back): the owner check, the
    /// room's counter raised to at least `gen`, the record written with it. `false`:
    /// 'not_owner'.
    fn restore_peer_(&mut self, i: Id, r: Id, p: Id, gen: u16, life: u8) -> bool {
        let owner = self.pin_owner(r);
        if owner != Some(i) && (owner.is_some() || self.meta_owner(r) != Some(i)) {
            return false;
        }
        let now = self.now;
        let room = &mut self.rooms[r as usize];
        let meta = room.meta.as_mut().expect("a room with a pin has metadata");
        if meta.peer_seq.map_or(true, |s| s < gen) {
            meta.peer_seq = Some(gen);
        }
        room.records[p as usize] = Some(Record {
            instance: i,
            generation: gen,
            at: now,
            life,
        });
        room.members |= 1 << p;
        true
    }

    /// remove_peer.lua. `Ok(true)` removed, `Ok(false)` gone or another generation,
    /// `Err(owner)` another instance's record.
    fn remove_peer_(&mut self, i: Id, r: Id, p: Id, gen: u16) -> Result<bool, Id> {
        let room = &mut self.rooms[r as usize];
        let Some(rec) = room.records[p as usize] else {
            return Ok(false);
        };
        if rec.generation != gen {
            return Ok(false);
        }
        if rec.instance != i {
            return Err(rec.instance);
        }
        room.records[p as usize] = None;
        room.members &= !(1 << p);
        Ok(true)
    }

    /// lease_acquire.lua. `Ok(epoch)` won, `Err(Some(holder))` held, `Err(None)` '<dataset
    /// new>': the dataset token is gone or younger than a lease TTL (a leader of the lost
    /// dataset may still act until its local deadline).
    fn lease_acquire_(&mut self, c: &Config, i: Id, seen: u8) -> Result<u8, Option<Id>> {
        match self.dataset {
            None => return Err(None),
            Some(d)
                if d.gen > 0
                    && self.now - d.created < c.timings.lease_ttl
                    && !c.mutated(Mutation::NoDatasetWait) =>
            {
                return Err(None)
            }
            Some(_) => {}
        }
        if let Some(l) = self.lease {
            return Err(Some(l.owner));
        }
        self.epoch = self.epoch.max(seen) + 1;
        self.lease = Some(Lease {
            owner: i,
            expires: self.now + c.timings.lease_ttl,
            term: self.epoch,
        });
        Ok(self.epoch)
    }

    /// lease_refresh.lua.
    fn lease_refresh_(&mut self, c: &Config, i: Id) -> bool {
        let expires = self.now + c.timings.lease_ttl;
        match &mut self.lease {
            Some(l) if l.owner == i => {
                l.expires = expires;
                true
            }
            _ if c.mutated(Mutation::LeaseRefreshNoOwnerCheck) => {
                // The known-bad refresh: SET lease me PX ttl, whoever held it.
                let term = self.lease.map_or(0, |l| l.term);
                self.lease = Some(Lease {
                    owner: i,
                    expires,
                    term,
                });
                true
            }
            _ => false,
        }
    }

    /// lease_release.lua.
    fn lease_release_(&mut self, i: Id) -> bool {
        if self.lease.is_some_and(|l| l.owner == i) {
            self.lease = None;
            return true;
        }
        false
    }

    /// candidates.lua (one set of timings: every member judged by the caller's threshold),
    /// less the caller itself (reaper.rs `candidates`).
    fn candidates_(&self, c: &Config, me: Id) -> u8 {
        let mut out = 0;
        for (d, s) in self.zset.iter().enumerate() {
            if let Some(s) = *s {
                if d as Id != me
                    && (s == 0 || (s as i16) < self.now as i16 - c.timings.stale as i16)
                {
                    out |= 1 << d;
                }
            }
        }
        out
    }

    /// reap_begin.lua.
    fn reap_begin_(&mut self, c: &Config, d: Id, leader: Id) -> Begin {
        let du = d as usize;
        if self.lease.map(|l| l.owner) != Some(leader) {
            return Begin::NotLeader;
        }
        let recheck = !c.mutated(Mutation::NoTwoPhaseRecheck);
        if recheck && self.hb[du].is_some() {
            return Begin::Alive;
        }
        let Some(score) = self.zset[du] else {
            return Begin::Gone;
        };
        if recheck && score as i16 >= self.now as i16 - c.timings.stale as i16 {
            return Begin::Alive;
        }
        self.zset[du] = Some(0);
        if self.reaping[du] == 0 && self.index[du] != 0 {
            self.reaping[du] = self.index[du];
            self.index[du] = 0;
        }
        let token = self.now as u16 * c.instances as u16 + leader as u16;
        self.reaping_token[du] = Some(token);
        // The tombstone: the info's life, if there is an info hash (none for index_add.lua's
        // mark of an unregistered instance: a tombstone already there stays).
        if let Some(life) = self.info[du] {
            self.tombstone[du] = Some(life);
        }
        Begin::Dead {
            t0: self.now,
            token,
        }
    }

    /// reap_room.lua for one room (one call reads every peer of a model room): the room's
    /// status and the number of records of `d` kept as written at or after `t0` (`late`).
    /// `t0 = None`: sweep_own's SWEEP_ALL (every record, whenever written).
    fn reap_room_(
        &mut self,
        c: &Config,
        d: Id,
        t0: Option<u8>,
        r: Id,
        deleted: &mut Deleted,
    ) -> (RoomStatus, u8) {
        let ties = c.mutated(Mutation::MillisecondT0Ties);
        let before = |t: u8| match t0 {
            None => true,
            Some(t0) if ties => t <= t0,
            Some(t0) => t < t0,
        };
        let room = &mut self.rooms[r as usize];
        let owner = room.pin.map(|(o, _)| o);
        let meta_owner = room.meta.map(|m| m.owner);
        // micros(nil, nil) = 999: data without pinned_us counts as pinned at the start of time.
        let pinned = room.meta.map_or(0, |m| m.pinned);
        let dead_owns = c.mutated(Mutation::NoOwnerCasInReapRoom)
            || owner == Some(d)
            || (owner.is_none() && (meta_owner == Some(d) || meta_owner.is_none()));
        let status = if dead_owns && (room.meta.is_none() || before(pinned)) {
            if owner.is_none() && meta_owner.is_none() {
                RoomStatus::Gone
            } else {
                RoomStatus::Reaped
            }
        } else if dead_owns {
            RoomStatus::NewLife
        } else {
            RoomStatus::Skipped
        };
        let whole = matches!(status, RoomStatus::Reaped | RoomStatus::Gone);
        let mut late = 0;
        for p in 0..c.peers {
            if room.members & (1 << p) == 0 {
                continue;
            }
            let rec = room.records[p as usize];
            let mut drop = whole;
            if !drop {
                if let Some(rec) = rec {
                    if rec.instance == d {
                        drop = before(rec.at);
                        if !drop {
                            late += 1;
                        }
                    }
                }
            }
            if drop {
                if let Some(rec) = rec {
                    // A record another instance left in a room taken over from it is no data
                    // of a room it holds: it lost the room (its next tick reports it lost and
                    // sweeps the record, `sweep_own`).
                    let leftover = whole && meta_owner.is_some_and(|o| o != rec.instance);
                    if !leftover {
                        deleted.records[p as usize] = Some((rec.instance, rec.life));
                    }
                }
                room.records[p as usize] = None;
                room.members &= !(1 << p);
            }
        }
        if whole {
            if let Some(m) = room.meta {
                deleted.room_of = Some((m.owner, m.life));
            }
            room.pin = None;
            room.meta = None;
            room.members = 0;
            room.records.iter_mut().for_each(|x| *x = None);
        }
        (status, late)
    }

    /// reap_putback.lua. `None`: skipped (-1).
    fn reap_putback_(&mut self, d: Id, token: u16, rooms: Rooms) -> Option<u8> {
        let du = d as usize;
        if self.hb[du].is_some() {
            return None;
        }
        if self.zset[du].is_some_and(|s| s != 0) {
            return None;
        }
        // Not this reap's moved index any more: a registration merged it back (and deleted
        // the token), or a later reap took it over.
        if self.reaping_token[du] != Some(token) {
            return None;
        }
        let added = (rooms & !self.index[du]).count_ones() as u8;
        self.index[du] |= rooms;
        Some(added)
    }

    /// reap_finish.lua.
    fn reap_finish_(&mut self, d: Id, kept: u8, token: u16, put_back: u8) -> Finish {
        let du = d as usize;
        let mine = self.reaping_token[du] == Some(token);
        if mine {
            self.reaping[du] = 0;
            self.reaping_token[du] = None;
        }
        if self.hb[du].is_some() {
            return Finish::Alive;
        }
        if self.zset[du].is_some_and(|s| s != 0) {
            return Finish::Alive;
        }
        if kept > 0 {
            return Finish::Retry;
        }
        if !mine && (self.reaping[du] != 0 || self.reaping_token[du].is_some()) {
            return Finish::Retry;
        }
        let rooms = self.index[du].count_ones() as u8;
        if rooms > put_back {
            return Finish::Retry;
        }
        self.zset[du] = None;
        self.info[du] = None;
        if rooms > 0 {
            Finish::Incomplete
        } else {
            Finish::Done
        }
    }

    /// heartbeat.lua, 'tick' mode (recorded).
    pub fn heartbeat_tick(
        &mut self,
        c: &Config,
        i: Id,
        boot: u8,
        known: Option<u8>,
        seen: u8,
        life: u8,
    ) -> BeatReply {
        let reply = self.heartbeat_tick_(c, i, boot, known, seen, life);
        log(|| Op::Heartbeat {
            i,
            boot,
            register: false,
            known,
            seen,
            life,
            reply,
        });
        reply
    }

    /// heartbeat.lua, 'register' mode (recorded).
    pub fn heartbeat_register(
        &mut self,
        c: &Config,
        i: Id,
        boot: u8,
        known: Option<u8>,
        seen: u8,
        life: u8,
    ) -> BeatReply {
        let reply = self.heartbeat_register_(c, i, boot, seen, life);
        log(|| Op::Heartbeat {
            i,
            boot,
            register: true,
            known,
            seen,
            life,
            reply,
        });
        reply
    }

    /// heartbeat_release.lua (recorded).
    pub fn heartbeat_release(&mut self, i: Id, boot: u8) -> bool {
        let reply = self.heartbeat_release_(i, boot);
        log(|| Op::HeartbeatRelease { i, boot, reply });
        reply
    }

    /// pin_room.lua (recorded).
    pub fn pin_room(
        &mut self,
        c: &Config,
        i: Id,
        life: u8,
        r: Id,
        stale_owner: Option<Id>,
    ) -> PinReply {
        let reply = self.pin_room_(c, i, life, r, stale_owner);
        log(|| Op::PinRoom {
            i,
            r,
            stale_owner,
            reply,
        });
        reply
    }

    /// The plain refresh (recorded).
    pub fn refresh_plain(&mut self, c: &Config, i: Id, r: Id) -> Option<Refreshed> {
        let reply = self.refresh_plain_(c, i, r);
        log(|| Op::RefreshPlain { i, r, reply });
        reply
    }

    /// pin_refresh.lua (recorded).
    pub fn pin_refresh(&mut self, c: &Config, i: Id, life: u8, r: Id) -> Refreshed {
        let reply = self.pin_refresh_(c, i, life, r, false);
        log(|| Op::PinRefresh {
            i,
            r,
            restore: false,
            reply,
        });
        reply
    }

    /// pin_refresh.lua with '1' (`rooms::restore_pins`, after the room's index entry;
    /// recorded).
    pub fn pin_restore(&mut self, c: &Config, i: Id, life: u8, r: Id) -> Refreshed {
        let reply = self.pin_refresh_(c, i, life, r, true);
        log(|| Op::PinRefresh {
            i,
            r,
            restore: true,
            reply,
        });
        reply
    }

    /// upsert_peer.lua writing back a record this instance holds, with its generation
    /// (`peers::restore`; recorded): `false` for 'not_owner' (nothing written).
    pub fn restore_peer(&mut self, i: Id, r: Id, p: Id, gen: u16, life: u8) -> bool {
        let reply = self.restore_peer_(i, r, p, gen, life);
        log(|| Op::RestorePeer {
            i,
            r,
            p,
            gen,
            reply,
        });
        reply
    }

    /// Redis lost its data (recorded): every key gone, server time goes on.
    pub fn data_loss(&mut self) {
        let now = self.now;
        let losses = self.losses + 1;
        let n = self.zset.len();
        let rooms = self.rooms.len();
        let peers = self.rooms[0].records.len();
        *self = Redis {
            now,
            losses,
            zset: vec![None; n],
            hb: vec![None; n],
            epoch: 0,
            lease: None,
            rooms: (0..rooms)
                .map(|_| Room {
                    pin: None,
                    meta: None,
                    members: 0,
                    records: vec![None; peers],
                })
                .collect(),
            index: vec![0; n],
            reaping: vec![0; n],
            reaping_token: vec![None; n],
            info: vec![None; n],
            tombstone: vec![None; n],
            dataset: None,
            reaped_mark: 0,
            entry_life: vec![0; n],
        };
        log(|| Op::DataLoss);
    }

    /// close_room.lua (recorded).
    pub fn close_room(&mut self, i: Id, r: Id) -> Result<(), Option<Id>> {
        let reply = self.close_room_(i, r);
        log(|| Op::CloseRoom { i, r, reply });
        reply
    }

    /// upsert_peer.lua (recorded).
    pub fn upsert_peer(&mut self, i: Id, r: Id, p: Id, life: u8) -> Result<u16, Option<Id>> {
        let reply = self.upsert_peer_(i, r, p, life);
        log(|| Op::UpsertPeer { i, r, p, reply });
        reply
    }

    /// remove_peer.lua (recorded).
    pub fn remove_peer(&mut self, i: Id, r: Id, p: Id, gen: u16) -> Result<bool, Id> {
        let reply = self.remove_peer_(i, r, p, gen);
        log(|| Op::RemovePeer {
            i,
            r,
            p,
            gen,
            reply,
        });
        reply
    }

    /// lease_acquire.lua (recorded).
    pub fn lease_acquire(&mut self, c: &Config, i: Id, seen: u8) -> Result<u8, Option<Id>> {
        let reply = self.lease_acquire_(c, i, seen);
        log(|| Op::LeaseAcquire { i, seen, reply });
        reply
    }

    /// lease_refresh.lua (recorded).
    pub fn lease_refresh(&mut self, c: &Config, i: Id) -> bool {
        let reply = self.lease_refresh_(c, i);
        log(|| Op::LeaseRefresh { i, reply });
        reply
    }

    /// lease_release.lua (recorded).
    pub fn lease_release(&mut self, i: Id) -> bool {
        let reply = self.lease_release_(i);
        log(|| Op::LeaseRelease { i, reply });
        reply
    }

    /// candidates.lua less the caller (recorded).
    pub fn candidates(&self, c: &Config, me: Id) -> u8 {
        let reply = self.candidates_(c, me);
        log(|| Op::Candidates { me, reply });
        reply
    }

    /// reap_begin.lua (recorded).
    pub fn reap_begin(&mut self, c: &Config, d: Id, leader: Id) -> Begin {
        let reply = self.reap_begin_(c, d, leader);
        log(|| Op::ReapBegin { d, leader, reply });
        reply
    }

    /// reap_room.lua for one room (recorded).
    pub fn reap_room(
        &mut self,
        c: &Config,
        d: Id,
        t0: Option<u8>,
        r: Id,
        deleted: &mut Deleted,
    ) -> (RoomStatus, u8) {
        let reply = self.reap_room_(c, d, t0, r, deleted);
        log(|| Op::ReapRoom { d, t0, r, reply });
        reply
    }

    /// reap_putback.lua (recorded).
    pub fn reap_putback(&mut self, d: Id, token: u16, rooms: Rooms) -> Option<u8> {
        let reply = self.reap_putback_(d, token, rooms);
        log(|| Op::ReapPutback {
            d,
            token,
            rooms,
            reply,
        });
        reply
    }

    /// reap_finish.lua (recorded).
    pub fn reap_finish(&mut self, d: Id, kept: u8, token: u16, put_back: u8) -> Finish {
        let reply = self.reap_finish_(d, kept, token, put_back);
        log(|| Op::ReapFinish {
            d,
            kept,
            token,
            put_back,
            reply,
        });
        reply
    }

    /// One unit of time passes (recorded): `now` advances, TTLs run out.
    pub fn advance(&mut self) {
        self.now += 1;
        self.expire();
        log(|| Op::Advance);
    }

    /// index_add.lua (recorded): `SADD` to `i`'s room index, and, if `may_mark` (ARGV[2]
    /// '1') or the reap tombstone names `life` (ARGV[3], this life's `started_ms`: a reap of
    /// it began), an instance that is not registered (no sorted-set entry, no heartbeat key:
    /// reaped to completion, or gone) is handed to the reaper (score 0). `(added, marked)`:
    /// whether any room was new, whether it marked.
    pub fn index_add(
        &mut self,
        c: &Config,
        i: Id,
        rooms: Rooms,
        may_mark: bool,
        life: u8,
    ) -> (bool, bool) {
        let iu = i as usize;
        let added = (rooms & !self.index[iu]).count_ones() as u8;
        self.index[iu] |= rooms;
        let named =
            self.tombstone[iu] == Some(life) && !c.mutated(Mutation::UnconfirmedZombieUnmarked);
        let marked = rooms != 0
            && (may_mark || named || c.mutated(Mutation::MarkWhileUnconfirmed))
            && self.zset[iu].is_none()
            && self.hb[iu].is_none()
            && !c.mutated(Mutation::UnregisteredIndexWriteUnmarked);
        if marked {
            self.zset[iu] = Some(0);
        }
        if rooms != 0 {
            log(|| Op::IndexAdd {
                i,
                rooms,
                may_mark,
                life,
                added,
            });
        }
        (added > 0, marked)
    }

    /// `SREM` from `i`'s room index (recorded).
    pub fn index_remove(&mut self, i: Id, rooms: Rooms) {
        self.index[i as usize] &= !rooms;
        if rooms != 0 {
            log(|| Op::IndexRemove { i, rooms });
        }
    }

    /// deregister.lua, `Node::leave`'s deregistration (recorded): the heartbeat key and the
    /// info hash go; the sorted-set entry too, unless a room index, a moved one or a reap's
    /// token is left (a reap under way keeps its mark, leftovers are handed to the reaper:
    /// score 0).
    pub fn deregister(&mut self, c: &Config, i: Id) {
        let iu = i as usize;
        self.hb[iu] = None;
        self.info[iu] = None;
        let left = self.index[iu] != 0 || self.reaping[iu] != 0 || self.reaping_token[iu].is_some();
        self.zset[iu] = (left && !c.mutated(Mutation::LeaveDuringReapUnmarked)).then_some(0);
        log(|| Op::Deregister { i });
    }

    /// `EXISTS hb:<i>` (recorded).
    pub fn hb_exists(&self, i: Id) -> bool {
        let reply = self.hb[i as usize].is_some();
        log(|| Op::HbExists { i, reply });
        reply
    }

    /// The reaper's page of `d`'s moved index (recorded).
    pub fn read_reaping(&self, d: Id) -> Rooms {
        let reply = self.reaping[d as usize];
        log(|| Op::ReadReaping { d, reply });
        reply
    }

    /// `HMGET instance generation` of a record (recorded).
    pub fn read_record(&self, r: Id, p: Id) -> Option<Record> {
        let rec = self.rooms[r as usize].records[p as usize];
        log(|| Op::ReadRecord {
            r,
            p,
            reply: rec.map(|x| (x.instance, x.generation)),
        });
        rec
    }

    /// `rooms::sweep_own` (recorded as one step, its reap_room.lua call not apart): `false`
    /// when the room is `i`'s (pin, or no pin and metadata naming it): nothing deleted.
    pub fn sweep_own(&mut self, c: &Config, i: Id, r: Id) -> bool {
        let room = &self.rooms[r as usize];
        let owner = room.pin.map(|(o, _)| o);
        let meta_owner = room.meta.map(|m| m.owner);
        let reply = !(owner == Some(i) || (owner.is_none() && meta_owner == Some(i)));
        if reply {
            let mut d = Deleted::default();
            self.reap_room_(c, i, None, r, &mut d);
        }
        log(|| Op::SweepOwn { i, r, reply });
        reply
    }

    /// Whether anything in the dataset names instance `d`: a pin, metadata, a record, an
    /// index entry, a moved index or its token, a sorted-set member, the info hash (the
    /// tombstone is left out: it is kept a day on purpose, after the reap). Index entries pointing at
    /// rooms that hold nothing of `d` are left out with `tolerate_empty_entries` (the cross-slot
    /// rule tolerates them; fsck's `unregistered_instance` hands such an index to the reaper).
    pub fn names(&self, d: Id, tolerate_empty_entries: bool) -> bool {
        let du = d as usize;
        let holds = |r: &Room| {
            r.pin.is_some_and(|(o, _)| o == d)
                || r.meta.is_some_and(|m| m.owner == d)
                || r.records.iter().flatten().any(|x| x.instance == d)
        };
        let entries = |set: Rooms| {
            (0..self.rooms.len())
                .any(|r| set & (1 << r) != 0 && (!tolerate_empty_entries || holds(&self.rooms[r])))
        };
        self.zset[du].is_some()
            || self.info[du].is_some()
            || entries(self.index[du])
            || entries(self.reaping[du])
            || self.reaping_token[du].is_some()
            || self.rooms.iter().any(holds)
    }
}
