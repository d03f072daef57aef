//! Repair (module docs, "Repair policy"): the fixes of the findings both scans saw, in a safe
//! order: index additions, room-slot fixes (each re-checked in a script), control-plane
//! removals (re-verified after the settle delay and put back if their record meanwhile names
//! the instance), orphaned rooms, hand-overs to the reaper.

use std::time::Duration;

use redis::{Pipeline, RedisResult, Value};

use super::delete_room::{delete_room, RoomSeenByScan};
use super::findings::{Finding, Fix, Verify};
use super::read::{exec, get, room_names};
use super::{BATCH, OP};
use crate::conn::Redis;
use crate::conn::{self, Conn};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::KeySpace;
use crate::scripts::SCRIPTS;

/// Where a finding's repair stands.
#[derive(Debug)]
pub(super) enum Outcome {
    /// Not (yet) repaired.
    Open,
    /// Fixed.
    Repaired,
    /// The problem went away by itself meanwhile: not reported.
    Resolved,
    /// The fix was refused on re-check; the reason is appended to the detail.
    Left(String),
}

/// A finding both scans saw, and its repair's outcome.
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) f: Finding,
    pub(super) outcome: Outcome,
}

impl Entry {
    pub(super) fn open(f: Finding) -> Entry {
        Entry {
            f,
            outcome: Outcome::Open,
        }
    }
}

/// Applies the fixes of `entries` in a safe order: index additions, room-slot removals (each
/// re-checked in a script), control-plane removals (re-verified after `settle`), orphaned
/// rooms, hand-overs to the reaper.
pub(super) fn repair(
    ks: &KeySpace,
    redis: &Redis,
    mut con: Conn,
    entries: &mut [Entry],
    settle: Duration,
) -> Result<()> {
    let con = &mut con;
    // 1. Index additions first (always safe), then the room-slot removals.
    for want_add in [true, false] {
        let idx = select(entries, |fix| match fix {
            Fix::Add { .. } => want_add,
            Fix::RoomEntry { mode, .. } => mode.starts_with("add") == want_add,
            _ => false,
        });
        batched(
            con,
            entries,
            &idx,
            |p, fix| add_or_room_entry(ks, p, fix),
            |fix, r| match fix {
                Fix::Add { .. } => set_outcome(&r),
                _ => room_entry_outcome(r),
            },
        )?;
    }
    // 2. Control-plane index entries pointing at nothing: removed now, verified later.
    let unindex = select(entries, |fix| matches!(fix, Fix::Unindex { .. }));
    batched(con, entries, &unindex, unindex_cmd, |_, r| set_outcome(&r))?;
    // 3. Orphaned rooms.
    delete_rooms(ks, con, entries)?;
    // 4. Unregistered instances: to the reaper.
    let enqueue = select(entries, |fix| matches!(fix, Fix::Enqueue { .. }));
    batched(
        con,
        entries,
        &enqueue,
        |p, fix| enqueue_cmd(ks, p, fix),
        |_, r| enqueue_outcome(r),
    )?;
    // 5. Removed control-plane entries whose record now names their instance go back.
    put_back(ks, redis, entries, unindex, settle)
}

/// The indexes of the entries whose fix `want` selects.
fn select(entries: &[Entry], want: impl Fn(&Fix) -> bool) -> Vec<usize> {
    (0..entries.len())
        .filter(|&i| entries[i].f.fix.as_ref().is_some_and(&want))
        .collect()
}

/// Runs the fixes of entries `idx`, [`BATCH`] per pipelined round trip: `cmd` appends one
/// fix's command, `judge` turns its reply into the entry's outcome.
fn batched(
    con: &mut Conn,
    entries: &mut [Entry],
    idx: &[usize],
    cmd: impl Fn(&mut Pipeline, &Fix),
    judge: impl Fn(&Fix, RedisResult<Value>) -> Outcome,
) -> Result<()> {
    for chunk in idx.chunks(BATCH) {
        let mut pipe = redis::pipe();
        for &i in chunk {
            if let Some(fix) = &entries[i].f.fix {
                cmd(&mut pipe, fix);
            }
        }
        let replies = exec(con, &mut pipe)?;
        for (&i, r) in chunk.iter().zip(replies) {
            if let Some(fix) = &entries[i].f.fix {
                entries[i].outcome = judge(fix, r);
            }
        }
    }
    Ok(())
}

/// `SADD` of an index addition, or `audit_room_index.lua` for a room-slot fix.
fn add_or_room_entry(ks: &KeySpace, pipe: &mut Pipeline, fix: &Fix) {
    match fix {
        Fix::Add { set, member } => {
            pipe.sadd(set, member);
        }
        Fix::RoomEntry {
            room,
            peer,
            guest,
            mode,
        } => {
            let rk = ks.room(room);
            let mut inv = SCRIPTS.audit_room_index.prepare_invoke();
            inv.key(ks.peer(room, peer))
                .key(&rk.peers)
                .key(&rk.guests)
                .key(&rk.guest_state)
                .arg(*mode)
                .arg(peer)
                .arg(guest);
            pipe.invoke_script(&inv);
        }
        _ => {}
    }
}

fn unindex_cmd(pipe: &mut Pipeline, fix: &Fix) {
    if let Fix::Unindex { set, member, .. } = fix {
        pipe.srem(set, member);
    }
}

fn enqueue_cmd(ks: &KeySpace, pipe: &mut Pipeline, fix: &Fix) {
    if let Fix::Enqueue { instance } = fix {
        let mut inv = SCRIPTS.audit_enqueue.prepare_invoke();
        inv.key(ks.heartbeats())
            .key(ks.heartbeat(instance))
            .key(ks.instance_rooms(instance))
            .key(ks.instance_peers(instance))
            .key(ks.instance_info(instance))
            .key(ks.instance_reaping_rooms(instance))
            .key(ks.instance_reaping_peers(instance))
            .key(ks.instance_reaping(instance))
            .arg(instance);
        pipe.invoke_script(&inv);
    }
}

/// The outcome of an `SADD`/`SREM`: 1 changed it, 0 found it done already.
fn set_outcome(r: &RedisResult<Value>) -> Outcome {
    match get::<i64>(Some(r)) {
        Some(1) => Outcome::Repaired,
        Some(_) => Outcome::Resolved,
        None => Outcome::Left("the index holds the wrong type".into()),
    }
}

/// The outcome of `audit_room_index.lua`.
fn room_entry_outcome(r: RedisResult<Value>) -> Outcome {
    match conn::decode::<String>(OP, r) {
        Ok(s) => match s.as_str() {
            "fixed" => Outcome::Repaired,
            "gone" => Outcome::Resolved,
            "changed" => Outcome::Left("the entry changed meanwhile".into()),
            "malformed" => Outcome::Left("the record is malformed".into()),
            "wrong_type" => Outcome::Left("a key holds the wrong type".into()),
            other => Outcome::Left(format!("unexpected reply {other:?}")),
        },
        Err(e) => Outcome::Left(e.to_string()),
    }
}

/// The outcome of `audit_enqueue.lua`.
fn enqueue_outcome(r: RedisResult<Value>) -> Outcome {
    match conn::decode::<String>(OP, r) {
        Ok(s) => match s.as_str() {
            "queued" | "empty" => Outcome::Repaired,
            "registered" => Outcome::Resolved,
            "alive" => Outcome::Left("its heartbeat key exists".into()),
            "wrong_type" => Outcome::Left("a key holds the wrong type".into()),
            other => Outcome::Left(format!("unexpected reply {other:?}")),
        },
        Err(e) => Outcome::Left(e.to_string()),
    }
}

/// Deletes every orphaned room (one at a time); a refusal for bad data is the entry's
/// outcome, any other error stops the repair.
fn delete_rooms(ks: &KeySpace, con: &mut Conn, entries: &mut [Entry]) -> Result<()> {
    for e in entries.iter_mut() {
        if let Some(Fix::DeleteRoom {
            room,
            meta_owner,
            pinned_ms,
            records,
        }) = &e.f.fix
        {
            let seen = RoomSeenByScan {
                room,
                meta_owner,
                pinned_ms,
            };
            e.outcome = match delete_room(ks, con, &seen, records) {
                Ok(o) => o,
                Err(err) if err.kind() == ErrorKind::BadData => Outcome::Left(err.to_string()),
                Err(err) => return Err(err),
            };
        }
    }
    Ok(())
}

/// Step 5: removed control-plane entries whose record now names their instance (an
/// operation was in flight after all) go back: a removal never leaves a live record
/// unindexed. Waits `settle` first, when there is anything to verify.
fn put_back(
    ks: &KeySpace,
    redis: &Redis,
    entries: &mut [Entry],
    unindex: Vec<usize>,
    settle: Duration,
) -> Result<()> {
    let removed: Vec<usize> = unindex
        .into_iter()
        .filter(|&i| matches!(entries[i].outcome, Outcome::Repaired))
        .filter(|&i| {
            matches!(&entries[i].f.fix, Some(Fix::Unindex { verify, .. }) if *verify != Verify::Never)
        })
        .collect();
    if removed.is_empty() {
        return Ok(());
    }
    std::thread::sleep(settle);
    let con = &mut redis.connect()?;
    for chunk in removed.chunks(BATCH) {
        put_back_chunk(ks, con, entries, chunk)?;
    }
    Ok(())
}

/// Re-reads what each removed entry of `chunk` points at (two replies per entry) and puts
/// back the entries that became valid.
fn put_back_chunk(
    ks: &KeySpace,
    con: &mut Conn,
    entries: &mut [Entry],
    chunk: &[usize],
) -> Result<()> {
    let mut pipe = redis::pipe();
    for &i in chunk {
        if let Some(Fix::Unindex { verify, .. }) = &entries[i].f.fix {
            verify_reads(ks, &mut pipe, verify);
        }
    }
    let r = exec(con, &mut pipe)?;
    let mut back = redis::pipe();
    let mut back_idx = Vec::new();
    for (n, &i) in chunk.iter().enumerate() {
        let Some(Fix::Unindex {
            set,
            member,
            verify,
        }) = &entries[i].f.fix
        else {
            continue;
        };
        let a = get::<Option<String>>(r.get(2 * n)).flatten();
        let b = get::<Option<String>>(r.get(2 * n + 1)).flatten();
        if verified(verify, a.as_deref(), b.as_deref()) {
            back.sadd(set, member).ignore();
            back_idx.push(i);
        }
    }
    if back_idx.is_empty() {
        return Ok(());
    }
    back.query::<()>(con).map_err(|e| Error::redis(OP, e))?;
    for i in back_idx {
        log::info!(
            "audit: {} {:?} became valid meanwhile; put back",
            entries[i].f.kind,
            entries[i].f.key
        );
        entries[i].outcome = Outcome::Resolved;
    }
    Ok(())
}

/// Appends the two reads that tell whether a removed entry is valid again.
fn verify_reads(ks: &KeySpace, pipe: &mut Pipeline, verify: &Verify) {
    match verify {
        Verify::Room { room, .. } => {
            let rk = ks.room(room);
            pipe.get(&rk.owner).hget(&rk.meta, "owner");
        }
        Verify::Peer { room, peer, .. } => {
            let rec = ks.peer(room, peer);
            pipe.hget(&rec, "instance").hget(&rec, "instance");
        }
        Verify::Never => {
            pipe.cmd("PING").cmd("PING");
        }
    }
}

/// Whether the two reads of [`verify_reads`] make the removed entry valid again.
fn verified(verify: &Verify, a: Option<&str>, b: Option<&str>) -> bool {
    match verify {
        Verify::Room { instance, .. } => room_names(a, b, instance),
        Verify::Peer { instance, .. } => a == Some(instance.as_str()),
        Verify::Never => false,
    }
}
