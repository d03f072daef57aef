//! Data helpers shared by the tests, the benchmarks and `perf_report`: a dead instance's data
//! written as the library writes it ([`fabricate_dead`]), a dump of every key of a pattern
//! ([`dump`]) and the places a dump still names something ([`references`]).
//!
//! Ids given here are callers' ids; they are written in wire form (`sfu_redis::keys`), as
//! the library does.

use std::collections::{BTreeMap, BTreeSet};

use redis::{ConnectionLike, RedisResult};
use sfu_redis::keys::{encode_id, IdKind, KeySpace};

/// Rooms per pipelined round trip when fabricating, and keys per pipelined round trip when
/// dumping.
pub const BATCH: usize = 500;

/// `COUNT` of the `SCAN` of [`dump`].
const SCAN_COUNT: usize = 1000;

/// One room of a fabricated instance: its id and its peers, each `(peer id, guest id)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeRoom {
    /// The room id (caller's form).
    pub id: String,
    /// `(peer id, guest id)` of each peer (callers' forms).
    pub peers: Vec<(String, Option<String>)>,
}

impl FakeRoom {
    /// A room of `peers` peers `p0`, `p1`, ... with guests `g0`, `g1`, ...
    pub fn numbered(id: impl Into<String>, peers: usize) -> FakeRoom {
        FakeRoom {
            id: id.into(),
            peers: (0..peers)
                .map(|p| (format!("p{p}"), Some(format!("g{p}"))))
                .collect(),
        }
    }

    /// A room with the given `(peer, guest)` pairs.
    pub fn with_peers(id: &str, peers: &[(&str, Option<&str>)]) -> FakeRoom {
        FakeRoom {
            id: id.to_owned(),
            peers: peers
                .iter()
                .map(|(p, g)| ((*p).to_owned(), g.map(str::to_owned)))
                .collect(),
        }
    }
}

/// What [`fabricate_dead`] writes for a dead instance.
#[derive(Debug, Clone)]
pub struct DeadInstance<'a> {
    /// The instance id (caller's form).
    pub id: &'a str,
    /// Its sorted-set score (its last heartbeat, server ms); no heartbeat key is written.
    pub score_ms: i64,
    /// `Some(px)`: each room's pin, with that TTL (ms); `None`: the pins have expired.
    pub pin_px: Option<u64>,
    /// The value of the `name` host field of each peer record (`None`: `host field of <peer>`).
    pub peer_field: Option<&'a str>,
}

impl<'a> DeadInstance<'a> {
    /// A dead instance `id` whose last heartbeat was at `score_ms`, pins expired.
    pub fn new(id: &'a str, score_ms: i64) -> Self {
        DeadInstance {
            id,
            score_ms,
            pin_px: None,
            peer_field: None,
        }
    }
}

fn wire(kind: IdKind, id: &str) -> String {
    encode_id(kind, id).expect("a valid id")
}

/// Writes, following the key schema (version 2), the data a dead instance left: for each room
/// its pin (if [`DeadInstance::pin_px`]), metadata (`owner`, `pinned_ms` and `pinned_us` a
/// second before the score, `peer_seq`), peer records (`instance`, `guest`, `generation` 1..,
/// and `updated_ms` and `updated_us` half a second before the score, plus a `name` host field), the room's peer set, guest
/// pointers and guest states, and the instance's room index, which reaches every one of those
/// records (index first, record second, as the library writes); then its sorted-set entry with
/// no heartbeat key. [`BATCH`] rooms per pipeline (not atomic: on a cluster the rooms are on
/// several masters; the sorted-set entry that makes the instance a candidate is written last,
/// apart). Returns the keys written, each room's five room keys and then its peer records,
/// room after room, and last the room index key (the shape the benchmarks' floors expect).
pub fn fabricate_dead(
    con: &mut impl ConnectionLike,
    ks: &KeySpace,
    dead: &DeadInstance<'_>,
    rooms: &[FakeRoom],
) -> RedisResult<Vec<String>> {
    let i = wire(IdKind::Instance, dead.id);
    let mut keys = Vec::new();
    for chunk in rooms.chunks(BATCH) {
        let mut pipe = redis::pipe();
        for room in chunk {
            pipe.sadd(ks.instance_rooms(&i), wire(IdKind::Room, &room.id))
                .ignore();
        }
        for room in chunk {
            write_room(&mut pipe, ks, dead, &i, room, &mut keys);
        }
        pipe.query::<()>(con)?;
    }
    redis::cmd("ZADD")
        .arg(ks.heartbeats())
        .arg(dead.score_ms)
        .arg(&i)
        .query::<()>(con)?;
    keys.push(ks.instance_rooms(&i));
    Ok(keys)
}

/// The room's own keys and records (after its index entries).
fn write_room(
    pipe: &mut redis::Pipeline,
    ks: &KeySpace,
    dead: &DeadInstance<'_>,
    i: &str,
    room: &FakeRoom,
    keys: &mut Vec<String>,
) {
    let r = wire(IdKind::Room, &room.id);
    let rk = ks.room(&r);
    if let Some(px) = dead.pin_px {
        pipe.cmd("SET")
            .arg(&rk.owner)
            .arg(i)
            .arg("PX")
            .arg(px)
            .ignore();
    }
    pipe.cmd("HSET")
        .arg(&rk.meta)
        .arg("owner")
        .arg(i)
        .arg("pinned_ms")
        .arg(dead.score_ms - 1000)
        .arg("pinned_us")
        .arg((dead.score_ms - 1000) * 1000)
        .arg("peer_seq")
        .arg(room.peers.len())
        .ignore();
    keys.extend([
        rk.owner.clone(),
        rk.meta.clone(),
        rk.peers.clone(),
        rk.guests.clone(),
        rk.guest_state.clone(),
    ]);
    for (n, (peer, guest)) in room.peers.iter().enumerate() {
        let p = wire(IdKind::Peer, peer);
        let g = guest
            .as_deref()
            .map(|g| wire(IdKind::Guest, g))
            .unwrap_or_default();
        let record = ks.peer(&r, &p);
        let name = dead
            .peer_field
            .map_or_else(|| format!("host field of {peer}"), str::to_owned);
        pipe.cmd("HSET")
            .arg(&record)
            .arg("instance")
            .arg(i)
            .arg("guest")
            .arg(&g)
            .arg("generation")
            .arg(n + 1)
            .arg("updated_ms")
            .arg(dead.score_ms - 500)
            .arg("updated_us")
            .arg((dead.score_ms - 500) * 1000)
            .arg("name")
            .arg(name)
            .ignore();
        pipe.sadd(&rk.peers, &p).ignore();
        if !g.is_empty() {
            pipe.hset(&rk.guests, &g, &p).ignore();
            pipe.hset(&rk.guest_state, &g, "joined").ignore();
        }
        keys.push(record);
    }
}

/// A key's whole content, as [`dump`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Val {
    /// A string.
    Str(String),
    /// A hash: field -> value.
    Hash(BTreeMap<String, String>),
    /// A set's members.
    Set(BTreeSet<String>),
    /// A sorted set's `(member, score)`s, in score order.
    ZSet(Vec<(String, i64)>),
    /// A list.
    List(Vec<String>),
    /// Another type, by name.
    Other(String),
}

/// Every key matching `pattern` with its whole content: `SCAN MATCH` (never `KEYS`), then the
/// types and the contents pipelined [`BATCH`] keys per round trip. A key that expires or
/// empties meanwhile is left out. Fallible, so it can run while Redis restarts or nodes write.
pub fn dump(con: &mut impl ConnectionLike, pattern: &str) -> RedisResult<BTreeMap<String, Val>> {
    let mut keys = BTreeSet::new();
    let mut cursor = 0u64;
    loop {
        let (next, page): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT)
            .query(con)?;
        keys.extend(page);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    let keys: Vec<String> = keys.into_iter().collect();
    let mut out = BTreeMap::new();
    for chunk in keys.chunks(BATCH) {
        dump_chunk(con, chunk, &mut out)?;
    }
    Ok(out)
}

fn dump_chunk(
    con: &mut impl ConnectionLike,
    keys: &[String],
    out: &mut BTreeMap<String, Val>,
) -> RedisResult<()> {
    let mut p = redis::pipe();
    for k in keys {
        p.cmd("TYPE").arg(k);
    }
    let types: Vec<String> = p.query(con)?;
    let mut p = redis::pipe();
    for (k, t) in keys.iter().zip(&types) {
        match t.as_str() {
            "string" => p.get(k),
            "hash" => p.hgetall(k),
            "set" => p.smembers(k),
            "zset" => p.zrange_withscores(k, 0, -1),
            "list" => p.lrange(k, 0, -1),
            _ => p.cmd("PING"),
        };
    }
    let vals: Vec<redis::Value> = p.query(con)?;
    for ((k, t), v) in keys.iter().zip(types).zip(vals) {
        if let Some(val) = decode(&t, v) {
            out.insert(k.clone(), val);
        }
    }
    Ok(())
}

/// A key's content by its type; `None` for a key gone (or emptied) between the two reads.
fn decode(t: &str, v: redis::Value) -> Option<Val> {
    let non_empty = |ok: bool| ok.then_some(());
    Some(match t {
        "none" => return None,
        "string" => Val::Str(
            String::from_utf8_lossy(&redis::from_redis_value::<Option<Vec<u8>>>(v).ok()??)
                .into_owned(),
        ),
        "hash" => {
            let h = redis::from_redis_value::<BTreeMap<String, String>>(v).ok()?;
            non_empty(!h.is_empty())?;
            Val::Hash(h)
        }
        "set" => {
            let s = redis::from_redis_value::<BTreeSet<String>>(v).ok()?;
            non_empty(!s.is_empty())?;
            Val::Set(s)
        }
        "zset" => {
            let z = redis::from_redis_value::<Vec<(String, f64)>>(v).ok()?;
            non_empty(!z.is_empty())?;
            Val::ZSet(z.into_iter().map(|(m, s)| (m, s as i64)).collect())
        }
        "list" => {
            let l = redis::from_redis_value::<Vec<String>>(v).ok()?;
            non_empty(!l.is_empty())?;
            Val::List(l)
        }
        other => Val::Other(other.to_owned()),
    })
}

/// Whether `key` is a reap tombstone, `<prefix>:{ctl}:instance:<I>:reaped`.
pub fn is_reap_tombstone(key: &str) -> bool {
    key.ends_with(":reaped")
        && key
            .split_once(":{ctl}:instance:")
            .is_some_and(|(_, rest)| rest.len() > ":reaped".len())
}

/// Every place in `dump` where one of `needles` appears: a key name, a string value, a set
/// member, a hash field or value, a sorted-set member or a list element, as readable lines.
/// Needles are wire forms. A reap tombstone (`P:{ctl}:instance:<I>:reaped`, the start of the
/// life a reap took, kept a day by design so that a zombie is told on any master) is not a
/// leftover and is skipped.
pub fn references(dump: &BTreeMap<String, Val>, needles: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    for (key, val) in dump {
        if is_reap_tombstone(key) {
            continue;
        }
        let mut check = |what: &str, s: &str| {
            for n in needles {
                if s.contains(n.as_str()) {
                    found.push(format!("{key}: {what} {s:?} contains {n:?}"));
                }
            }
        };
        check("key", key);
        match val {
            Val::Str(s) => check("value", s),
            Val::Hash(h) => {
                for (f, v) in h {
                    check("field", f);
                    check("value", v);
                }
            }
            Val::Set(s) => s.iter().for_each(|m| check("member", m)),
            Val::ZSet(z) => z.iter().for_each(|(m, _)| check("member", m)),
            Val::List(l) => l.iter().for_each(|m| check("element", m)),
            Val::Other(_) => {}
        }
    }
    found
}
