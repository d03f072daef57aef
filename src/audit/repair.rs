//! Repair (module docs, "Repair policy"): the fixes of the findings both scans saw, in a safe
//! order: index additions, room-slot fixes (each re-checked in a script), control-plane
//! removals (checked right before, and re-verified after the settle delay and put back if
//! their room or a record in it meanwhile names the instance), orphaned rooms, hand-overs to
//! the reaper.

use std::collections::BTreeSet;
use std::time::Duration;

use redis::{Pipeline, RedisResult, Value};

use super::delete_room::{delete_room, RoomSeenByScan};
use super::findings::{Finding, Fix, Verify};
use super::read::{exec, get, room_names};
use super::room_indexes::{records_naming, RecordsOf};
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
/// re-checked in a script), control-plane removals (checked right before, re-verified after
/// `settle`), orphaned rooms, hand-overs to the reaper.
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
        if want_add {
            shared_additions(entries, &idx);
        }
    }
    // 2. Control-plane index entries pointing at nothing: checked once more, removed, verified
    // again later.
    let unindex = select(entries, |fix| matches!(fix, Fix::Unindex { .. }));
    let unindex = still_dangling(ks, con, entries, unindex)?;
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

/// Several findings may need the same `SADD` (records of one instance in one room, or that
/// room unindexed too): the first one's reply is 1, the others' 0. Each of those problems was
/// real and is fixed: marked repaired like the first.
fn shared_additions(entries: &mut [Entry], idx: &[usize]) {
    let added: BTreeSet<(String, String)> = idx
        .iter()
        .filter(|&&i| matches!(entries[i].outcome, Outcome::Repaired))
        .filter_map(|&i| match &entries[i].f.fix {
            Some(Fix::Add { set, member }) => Some((set.clone(), member.clone())),
            _ => None,
        })
        .collect();
    for &i in idx {
        let e = &mut entries[i];
        if let (Outcome::Resolved, Some(Fix::Add { set, member })) = (&e.outcome, &e.f.fix) {
            if added.contains(&(set.clone(), member.clone())) {
                e.outcome = Outcome::Repaired;
            }
        }
    }
}

/// Step 2's check right before the removal: entries `idx` whose entry is valid now (its room
/// or a record in it names its instance: an operation in flight, or the problem went away)
/// are resolved and not removed; returns the others.
fn still_dangling(
    ks: &KeySpace,
    con: &mut Conn,
    entries: &mut [Entry],
    idx: Vec<usize>,
) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(idx.len());
    for chunk in idx.chunks(BATCH) {
        let verifies: Vec<&Verify> = chunk.iter().map(|&i| verify_of(&entries[i])).collect();
        let valid = valid_now(ks, con, &verifies)?;
        for (&i, valid) in chunk.iter().zip(valid) {
            if valid {
                entries[i].outcome = Outcome::Resolved;
            } else {
                out.push(i);
            }
        }
    }
    Ok(out)
}

/// The check of an entry's `Unindex` fix ([`Verify::Never`] for any other).
fn verify_of(e: &Entry) -> &Verify {
    match &e.f.fix {
        Some(Fix::Unindex { verify, .. }) => verify,
        _ => &Verify::Never,
    }
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
            .key(ks.instance_info(instance))
            .key(ks.instance_reaping_rooms(instance))
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

/// Step 5: removed control-plane entries that are valid again (an operation was in flight
/// after all: their room or a record in it names their instance) go back: a removal never
/// leaves a live room or record out of its instance's room index for longer than the settle
/// delay. Waits `settle` first, when there is anything to verify.
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
        .filter(|&i| *verify_of(&entries[i]) != Verify::Never)
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

/// Checks each removed entry of `chunk` again and puts back those that became valid.
fn put_back_chunk(
    ks: &KeySpace,
    con: &mut Conn,
    entries: &mut [Entry],
    chunk: &[usize],
) -> Result<()> {
    let verifies: Vec<&Verify> = chunk.iter().map(|&i| verify_of(&entries[i])).collect();
    let valid = valid_now(ks, con, &verifies)?;
    let mut back = redis::pipe();
    let mut back_idx = Vec::new();
    for (&i, valid) in chunk.iter().zip(valid) {
        if let (true, Some(Fix::Unindex { set, member, .. })) = (valid, &entries[i].f.fix) {
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

/// Whether each entry checked by `verifies` is valid now: for [`Verify::Room`], its room's pin
/// (or, with no pin, metadata) names the instance, or a peer record in the room does
/// ([`records_naming`]); a pin or metadata that cannot be read (another type) counts as
/// valid, so that nothing is removed on a guess. [`Verify::Never`]: never valid.
fn valid_now(ks: &KeySpace, con: &mut Conn, verifies: &[&Verify]) -> Result<Vec<bool>> {
    let mut valid = vec![false; verifies.len()];
    let mut pipe = redis::pipe();
    let mut rooms = Vec::new();
    for (n, v) in verifies.iter().enumerate() {
        if let Verify::Room { room, .. } = v {
            let rk = ks.room(room);
            pipe.get(&rk.owner).hget(&rk.meta, "owner");
            rooms.push(n);
        }
    }
    if rooms.is_empty() {
        return Ok(valid);
    }
    let r = exec(con, &mut pipe)?;
    let mut ask = Vec::new();
    let mut questions = Vec::new();
    for (k, &n) in rooms.iter().enumerate() {
        let Verify::Room {
            room,
            instance,
            records,
        } = verifies[n]
        else {
            continue;
        };
        let pin = get::<Option<String>>(r.get(2 * k));
        let meta = get::<Option<String>>(r.get(2 * k + 1));
        match (pin, meta) {
            (Some(pin), Some(meta)) if !room_names(pin.as_deref(), meta.as_deref(), instance) => {
                ask.push(n);
                questions.push(RecordsOf {
                    room,
                    instance,
                    known: records,
                });
            }
            _ => valid[n] = true,
        }
    }
    for (n, named) in ask.into_iter().zip(records_naming(ks, con, &questions)?) {
        valid[n] = named;
    }
    Ok(valid)
}
