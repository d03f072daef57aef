//! The heartbeat: one script call on Redis server time, then one pipelined pin refresh for
//! every owned room (two round trips per tick whatever the number of rooms), on a named thread
//! that never exits on errors.

use std::time::Instant;

use crossbeam_channel::{select, Receiver};
use redis::Connection;

use crate::conn::{Backoff, Link};
use crate::error::{Error, Result};
use crate::event::Event;
use crate::keys::{decode_id, encode_id, IdKind};
use crate::node::Shared;
use crate::peers;
use crate::rooms::{self, Refreshed};
use crate::scripts::{self, SCRIPTS};

/// First heartbeat of a life, or a regular one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Register,
    Tick,
}

/// What heartbeat.lua found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Beat {
    /// Heartbeat written.
    Ok,
    /// Redis lost its data; this instance registered again and must restore its pins.
    Restored,
    /// A leader reaped this instance while it was unresponsive; nothing written.
    Reaped,
}

/// Sends one heartbeat (`heartbeat.lua`) and remembers the dataset token.
pub(crate) fn beat(sh: &Shared, con: &mut Connection, mode: Mode) -> Result<Beat> {
    let op = "heartbeat";
    let known = sh.token.lock().clone();
    let fresh = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
    let mut inv = SCRIPTS.heartbeat.prepare_invoke();
    inv.key(sh.keys.heartbeats())
        .key(sh.keys.heartbeat(&sh.me))
        .key(sh.keys.dataset())
        .arg(&sh.me)
        .arg(sh.timings.heartbeat_ttl.as_millis() as u64)
        .arg(match mode {
            Mode::Register => "register",
            Mode::Tick => "tick",
        })
        .arg(&known)
        .arg(&fresh);
    let (status, _now, token): (String, i64, String) = scripts::call(con, op, &inv)?;
    let beat = match status.as_str() {
        "ok" => Beat::Ok,
        "restored" => Beat::Restored,
        "reaped" => Beat::Reaped,
        s => return Err(Error::bad_data(op, format!("heartbeat.lua replied {s:?}"))),
    };
    if beat != Beat::Reaped {
        *sh.token.lock() = token;
    }
    Ok(beat)
}

/// One tick: heartbeat, then refresh (or restore) every pin.
pub(crate) fn tick(sh: &Shared, link: &mut Link) -> Result<()> {
    let beat = link.run(&sh.redis, |c| beat(sh, c, Mode::Tick))?;
    match beat {
        Beat::Reaped => return resume_after_reap(sh, link),
        Beat::Restored => log::warn!(
            "instance {} was missing from Redis and the dataset token changed: Redis lost its data; restoring pins",
            sh.id
        ),
        Beat::Ok => {}
    }
    let rooms = sh.local.rooms();
    let results = link.run(&sh.redis, |c| {
        rooms::refresh_pins(sh, c, &rooms, beat == Beat::Restored)
    })?;
    let mut lost = Vec::new();
    for (room, outcome) in results {
        match outcome {
            Refreshed::Ok => {}
            Refreshed::Repinned => log::info!("room {room:?}: pin had lapsed; pinned again"),
            Refreshed::Lost(new_owner) => {
                if sh.local.has_room(&room) {
                    sh.local.remove_room(&room);
                    if let Ok(w) = encode_id(IdKind::Room, &room) {
                        lost.push(w);
                    }
                    sh.events.emit(Event::RoomLost { room, new_owner });
                }
            }
            Refreshed::Failed(e) => {
                sh.note_error(&e);
                log::warn!("room {room:?}: pin refresh failed: {e}");
            }
        }
    }
    if !lost.is_empty() {
        // The pin is another instance's (or gone) now: our index entry goes after it.
        link.run(&sh.redis, |c| {
            redis::cmd("SREM")
                .arg(sh.keys.instance_rooms(&sh.me))
                .arg(&lost)
                .query::<()>(c)
                .map_err(|e| Error::redis("unindex lost rooms", e))
        })?;
    }
    if beat == Beat::Restored {
        let restored = link.run(&sh.redis, |c| peers::restore(sh, c, &sh.local.peers()))?;
        log::warn!("restored {restored} peer records after Redis lost its data");
    }
    sh.counters.heartbeat_ok();
    Ok(())
}

/// This instance was reaped while it was unresponsive (a zombie): every room it held is lost.
/// Report them, forget them (never write them back), and register again as a fresh life.
fn resume_after_reap(sh: &Shared, link: &mut Link) -> Result<()> {
    let room_ids = sh.local.clear();
    log::warn!(
        "instance {} was reaped while unresponsive; {} rooms lost; registering again",
        sh.id,
        room_ids.len()
    );
    sh.events.emit(Event::ReapedSelf {
        rooms: room_ids.len(),
        room_ids: room_ids.clone(),
    });
    let owners: Vec<Option<String>> = link
        .run(&sh.redis, |c| {
            let mut pipe = redis::pipe();
            for r in &room_ids {
                let w = encode_id(IdKind::Room, r)?;
                pipe.get(sh.keys.room(&w).owner);
            }
            pipe.query::<Vec<Option<String>>>(c)
                .map_err(|e| Error::redis("read owners of lost rooms", e))
        })
        .unwrap_or_else(|_| vec![None; room_ids.len()]);
    for (room, owner) in room_ids.into_iter().zip(owners) {
        let new_owner = owner.and_then(|o| decode_id(&o).ok());
        sh.events.emit(Event::RoomLost { room, new_owner });
    }
    link.run(&sh.redis, |c| beat(sh, c, Mode::Register))?;
    sh.counters.heartbeat_ok();
    Ok(())
}

/// The heartbeat thread: a tick every `heartbeat_interval` (missed ticks merge); after a
/// failure, retries with jittered backoff capped at the interval, so it resumes within two
/// ticks of Redis coming back. Never exits but on shutdown.
pub(crate) fn run(sh: &Shared, shutdown: &Receiver<()>) {
    let interval = sh.timings.heartbeat_interval;
    let mut link = Link::new();
    let mut backoff = Backoff::new(interval / 8, interval);
    let mut next = Instant::now() + interval;
    loop {
        select! {
            recv(shutdown) -> _ => break,
            default(next.saturating_duration_since(Instant::now())) => {}
        }
        if sh.is_crashed() {
            break;
        }
        let started = Instant::now();
        match tick(sh, &mut link) {
            Ok(()) => {
                backoff.reset();
                next += interval;
                if next <= Instant::now() {
                    next = Instant::now() + interval;
                }
                let took = started.elapsed();
                if took > interval / 2 {
                    sh.counters.slow_tick();
                    log::warn!("heartbeat tick took {} ms", took.as_millis());
                }
            }
            Err(e) => {
                sh.note_error(&e);
                sh.counters.heartbeat_failed();
                log::warn!("heartbeat failed: {e}");
                next = Instant::now() + backoff.next_delay();
            }
        }
    }
}
