//! The key space: the prefix, every key and channel name, and how ids are encoded.
//!
//! `P` = `<namespace>:<stage>:<branch>`, always three segments of `[A-Za-z0-9._-]`
//! (docs/DESIGN.md "Recommended key schema"). Control-plane keys share the hash tag `{ctl}`, each
//! room's keys share the hash tag `{<room>}`, so every Lua script touches one hash slot.
//!
//! | key | type | meaning |
//! |---|---|---|
//! | `P:{ctl}:heartbeats` | ZSET | instance -> last heartbeat (Redis server time, ms); score 0 = being reaped |
//! | `P:{ctl}:hb:<I>` | STRING, PX heartbeat_ttl | per-instance heartbeat |
//! | `P:{ctl}:leader` | STRING, PX lease_ttl | reaper lease holder (instance id) |
//! | `P:{ctl}:epoch` | counter | fencing token, INCR on every acquire |
//! | `P:{ctl}:dataset` | STRING | dataset token: tells "reaped" from "Redis lost its data" |
//! | `P:{ctl}:schema` | STRING | the key schema version the prefix is laid out in ([`SCHEMA_VERSION`]) |
//! | `P:shard:{<tag>}:dataset` | STRING | a Redis Cluster master's dataset token (`<tag>` hashes to a slot it serves): tells a master that lost its data |
//! | `P:{ctl}:instance:<I>:rooms` | SET | rooms pinned by I |
//! | `P:{ctl}:instance:<I>:reaping-rooms` | SET | I's room index while I is being reaped (moved aside) |
//! | `P:{ctl}:instance:<I>:reaping` | STRING | token (server µs) of the reap that owns the moved index |
//! | `P:{ctl}:instance:<I>:info` | HASH | I's self-description |
//! | `P:room:{<R>}:owner` | STRING, PX pin_ttl | owning instance |
//! | `P:room:{<R>}:meta` | HASH | `owner`, `pinned_ms`, `pinned_us`, `peer_seq` |
//! | `P:room:{<R>}:peers` | SET | peer ids in the room |
//! | `P:room:{<R>}:guests` | HASH | guest id -> current peer id |
//! | `P:room:{<R>}:guest-state` | HASH | guest id -> state (written by the host) |
//! | `P:room:{<R>}:peer:<peer>` | HASH | `instance`, `guest`, `generation`, `updated_ms`, `updated_us`, host fields |
//! | `P:events` | channel | `leader_acquired`, `leader_lost` (shutdown), `instance_reaped` as JSON |
//!
//! **Ids are data, not syntax.** Any non-empty UTF-8 id of at most [`MAX_ID_BYTES`] bytes
//! without control characters is accepted. In Redis an id always appears in its *wire form*:
//! bytes of `[A-Za-z0-9._-]` verbatim, every other byte percent-encoded (`%XX`). The wire
//! form never contains `:`, `/`, `{`, `}`, `*` or spaces, so ids can neither collide, break the
//! hash tag nor split a `<room>/<peer>` member. Ids stored as values (owners, index members,
//! record fields) use the wire form too.

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use crate::error::{Error, Result};

/// The longest id accepted, in bytes of UTF-8.
pub const MAX_ID_BYTES: usize = 256;

/// The version of the key schema this release reads and writes (the layout of this module's
/// table). A prefix records the version it is laid out in under [`KeySpace::schema`]; a node
/// refuses to register on a prefix stamped with another version ([`crate::Error::Schema`]),
/// and `sfu-redis migrate` moves a prefix from one version to the next. Prefixes written
/// before versions existed carry no stamp: their layout is version 1.
///
/// Version 2 (this table) dropped version 1's per-instance peer indexes
/// (`P:{ctl}:instance:<I>:peers`, `...:reaping-peers`): an instance's room index reaches every
/// peer record naming it (docs/DESIGN.md "Schema version").
pub const SCHEMA_VERSION: u32 = 2;

/// How long a reap tombstone ([`KeySpace::instance_reaped`]) lasts, ms: one day. A zombie
/// paused longer than that after its reap, whose registration no replica acknowledged, and
/// that meets another master when it resumes, takes the reap for a lost registration again
/// (docs/src/deploy/failover.md). The Lua scripts hold the same number.
pub const REAPED_TTL_MS: u64 = 86_400_000;

/// Bytes that are escaped: everything but `[A-Za-z0-9._-]`.
const ESCAPED: &AsciiSet = &NON_ALPHANUMERIC.remove(b'.').remove(b'_').remove(b'-');

/// Which kind of id a string is; used in error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdKind {
    /// A room id.
    Room,
    /// A peer (connection) id.
    Peer,
    /// A guest (user) id.
    Guest,
    /// An SFU instance id.
    Instance,
}

impl IdKind {
    fn name(self) -> &'static str {
        match self {
            IdKind::Room => "room",
            IdKind::Peer => "peer",
            IdKind::Guest => "guest",
            IdKind::Instance => "instance",
        }
    }
}

/// Checks an id and returns its wire form (see the module docs).
///
/// # Errors
/// [`Error::InvalidId`] when `id` is empty, longer than [`MAX_ID_BYTES`] or holds a control
/// character.
pub fn encode_id(kind: IdKind, id: &str) -> Result<String> {
    let fail = |reason: String| Error::InvalidId {
        what: kind.name(),
        reason,
    };
    if id.is_empty() {
        return Err(fail("it is empty".into()));
    }
    if id.len() > MAX_ID_BYTES {
        return Err(fail(format!(
            "it is {} bytes long; at most {MAX_ID_BYTES} are allowed",
            id.len()
        )));
    }
    if let Some(c) = id.chars().find(|c| c.is_control()) {
        return Err(fail(format!("it holds the control character {c:?}")));
    }
    Ok(utf8_percent_encode(id, ESCAPED).to_string())
}

/// A validated id: the caller's form and the wire form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Id {
    pub raw: String,
    pub wire: String,
}

impl Id {
    pub(crate) fn new(kind: IdKind, raw: &str) -> Result<Id> {
        Ok(Id {
            wire: encode_id(kind, raw)?,
            raw: raw.to_owned(),
        })
    }
}

/// Turns a wire-form id read from Redis back into the caller's id.
///
/// # Errors
/// [`Error::BadData`] when `wire` is not the wire form of a valid id (somebody else wrote it).
pub fn decode_id(wire: &str) -> Result<String> {
    // Only the canonical wire form is accepted: decoding then encoding again must give `wire`
    // back (so `%ZZ`, `%41` or `a:b` are refused).
    percent_decode_str(wire)
        .decode_utf8()
        .ok()
        .filter(|id| matches!(encode_id(IdKind::Room, id), Ok(w) if w == wire))
        .map(|id| id.into_owned())
        .ok_or_else(|| {
            Error::bad_data(
                "decode id",
                format!("{wire:?} is not an id written by sfu-redis"),
            )
        })
}

/// Escapes one prefix segment into `[A-Za-z0-9._-]`, injectively (see [`KeySpace::new`]):
/// the value is trimmed; bytes of `[A-Za-z0-9.-]` are kept, `_` becomes `__`, and every other
/// byte (of the UTF-8 encoding) becomes `_` and two uppercase hex digits.
fn segment(field: &'static str, value: &str) -> Result<String> {
    /// The longest segment accepted, in bytes of UTF-8 after trimming, before escaping.
    const MAX_SEGMENT_BYTES: usize = 64;
    let value = value.trim();
    if value.is_empty() {
        return Err(Error::config(field, "must not be empty"));
    }
    if value.len() > MAX_SEGMENT_BYTES {
        return Err(Error::config(
            field,
            format!(
                "must be at most {MAX_SEGMENT_BYTES} bytes (it is {} bytes)",
                value.len()
            ),
        ));
    }
    let mut out = String::with_capacity(value.len() * 3);
    for b in value.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'-' => out.push(char::from(b)),
            b'_' => out.push_str("__"),
            _ => {
                const HEX: &[u8; 16] = b"0123456789ABCDEF";
                out.push('_');
                out.push(char::from(HEX[usize::from(b >> 4)]));
                out.push(char::from(HEX[usize::from(b & 0xF)]));
            }
        }
    }
    Ok(out)
}

/// The names of one room's keys. All share the hash tag `{<room>}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoomKeys {
    /// `P:room:{R}:owner`, the expiring pin.
    pub owner: String,
    /// `P:room:{R}:meta`, the non-expiring metadata (second copy of the owner).
    pub meta: String,
    /// `P:room:{R}:peers`, the room's peer ids.
    pub peers: String,
    /// `P:room:{R}:guests`, guest id -> current peer id.
    pub guests: String,
    /// `P:room:{R}:guest-state`, guest id -> state.
    pub guest_state: String,
}

impl RoomKeys {
    /// The five keys in the order the room scripts declare them (`close_room.lua`,
    /// `reap_room.lua` on a cluster): owner, meta, peers, guests, guest-state.
    pub fn all(&self) -> [&str; 5] {
        [
            &self.owner,
            &self.meta,
            &self.peers,
            &self.guests,
            &self.guest_state,
        ]
    }
}

/// Builds every key and channel name of one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpace {
    prefix: String,
}

impl KeySpace {
    /// A key space for `<namespace>:<stage>:<branch>`.
    ///
    /// Each segment is trimmed (leading and trailing whitespace) and then escaped into
    /// `[A-Za-z0-9._-]`, one byte of its UTF-8 encoding at a time:
    ///
    /// - `A`-`Z`, `a`-`z`, `0`-`9`, `.` and `-` are kept verbatim;
    /// - `_` is written `__`;
    /// - every other byte is written `_` followed by its value in two uppercase hex digits.
    ///
    /// | segment | in the prefix |
    /// |---|---|
    /// | `main`, `v1.2-rc` | `main`, `v1.2-rc` |
    /// | `feature/login` | `feature_2Flogin` |
    /// | `feature_login` | `feature__login` |
    /// | `a:b`, `x y` | `a_3Ab`, `x_20y` |
    /// | `방` | `_EB_B0_A9` |
    ///
    /// The escaping is injective (it can be undone: `__` is `_`, `_XX` is byte `XX`), so two
    /// segments that differ after trimming never give the same prefix: `feature/login` and
    /// `feature_login` never see or reap each other. The prefix never holds `:` inside a
    /// segment, `{`, `}`, `*` or spaces.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the field (`namespace`, `stage` or `branch`) when a
    /// segment is empty after trimming or longer than 64 bytes (of UTF-8, after trimming and
    /// before escaping).
    pub fn new(namespace: &str, stage: &str, branch: &str) -> Result<Self> {
        let prefix = format!(
            "{}:{}:{}",
            segment("namespace", namespace)?,
            segment("stage", stage)?,
            segment("branch", branch)?
        );
        Ok(KeySpace { prefix })
    }

    /// `<namespace>:<stage>:<branch>`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The `SCAN MATCH` pattern that covers this prefix and nothing else: `P:*`.
    pub fn scan_pattern(&self) -> String {
        format!("{}:*", self.prefix)
    }

    /// `P:{ctl}:heartbeats`.
    pub fn heartbeats(&self) -> String {
        format!("{}:{{ctl}}:heartbeats", self.prefix)
    }

    /// `P:{ctl}:hb:<I>` (`instance` in wire form).
    pub fn heartbeat(&self, instance: &str) -> String {
        format!("{}:{{ctl}}:hb:{instance}", self.prefix)
    }

    /// `P:{ctl}:leader`.
    pub fn leader(&self) -> String {
        format!("{}:{{ctl}}:leader", self.prefix)
    }

    /// `P:{ctl}:epoch`.
    pub fn epoch(&self) -> String {
        format!("{}:{{ctl}}:epoch", self.prefix)
    }

    /// `P:{ctl}:dataset`.
    pub fn dataset(&self) -> String {
        format!("{}:{{ctl}}:dataset", self.prefix)
    }

    /// `P:{ctl}:schema`: the key schema version the prefix is laid out in, as a decimal
    /// string ([`SCHEMA_VERSION`]). Written by the first heartbeat that finds it missing
    /// (`heartbeat.lua`: a new prefix, one written before versions, or a Redis that lost its
    /// data) and by `sfu-redis migrate --apply`; read at every registration, which it refuses
    /// when it names another version (docs/DESIGN.md "Schema version").
    pub fn schema(&self) -> String {
        format!("{}:{{ctl}}:schema", self.prefix)
    }

    /// `P:shard:{<tag>}:dataset`: on a Redis Cluster, the dataset token of the master that
    /// serves `tag`'s hash slot (`tag` is `<slot>.<n>`, chosen so that it hashes to that slot:
    /// src/shards.rs). A heartbeat that finds it gone or changed knows that master lost its
    /// data and restores the rooms this node holds there. The token is data like any key: it
    /// moves with its slot (a migration) and lives on in a promoted replica (a failover that
    /// kept the data).
    pub fn shard_dataset(&self, tag: &str) -> String {
        format!("{}:shard:{{{tag}}}:dataset", self.prefix)
    }

    /// `P:{ctl}:instance:<I>:rooms` (`instance` in wire form).
    pub fn instance_rooms(&self, instance: &str) -> String {
        format!("{}:{{ctl}}:instance:{instance}:rooms", self.prefix)
    }

    /// `P:{ctl}:instance:<I>:peers`: key schema version 1's peer index of I (`<room>/<peer>`
    /// members). Version 2 does not write it; `sfu-redis migrate` folds it into I's room index
    /// and deletes it, and `fsck` reports one left over.
    pub fn v1_instance_peers(&self, instance: &str) -> String {
        format!("{}:{{ctl}}:instance:{instance}:peers", self.prefix)
    }

    /// `P:{ctl}:instance:<I>:reaping-rooms` (`instance` in wire form): the room index of an
    /// instance being reaped, moved aside by the reap's first step (`reap_begin.lua`) so that
    /// what a new life (or a zombie) of the instance indexes meanwhile goes to a fresh
    /// [`KeySpace::instance_rooms`], untouched by the reap, and the reap ends with one `UNLINK`
    /// instead of a removal per member. It exists only while a reap is under way (or was
    /// interrupted: the next reap of the instance, or its next registration, takes it over).
    pub fn instance_reaping_rooms(&self, instance: &str) -> String {
        format!("{}:{{ctl}}:instance:{instance}:reaping-rooms", self.prefix)
    }

    /// `P:{ctl}:instance:<I>:reaping-peers`: key schema version 1's peer index moved aside by
    /// a reap, as [`KeySpace::v1_instance_peers`].
    pub fn v1_instance_reaping_peers(&self, instance: &str) -> String {
        format!("{}:{{ctl}}:instance:{instance}:reaping-peers", self.prefix)
    }

    /// `P:{ctl}:instance:<I>:reaped` (STRING, expires after [`REAPED_TTL_MS`]): the reap
    /// tombstone, the `started_ms` of the life a reap of I began on (`reap_begin.lua`,
    /// `reap_force_begin.lua` copy it from I's info). A heartbeat of that very life is
    /// answered 'zombie' (`heartbeat.lua`), on whatever master it lands: a reap, never a
    /// registration a failover lost. Outlives the instance's other keys by design.
    pub fn instance_reaped(&self, instance: &str) -> String {
        format!("{}:{{ctl}}:instance:{instance}:reaped", self.prefix)
    }

    /// `P:{ctl}:instance:<I>:reaping` (STRING): the start (server microseconds, t0) of the
    /// reap that owns the moved index; only that reap deletes it when it ends
    /// (`reap_finish.lua`).
    pub fn instance_reaping(&self, instance: &str) -> String {
        format!("{}:{{ctl}}:instance:{instance}:reaping", self.prefix)
    }

    /// The keys of `instance`'s index as the reap scripts and `heartbeat.lua` declare them,
    /// in this order: the live room index, the moved one
    /// ([`KeySpace::instance_reaping_rooms`]) and the reap's token
    /// ([`KeySpace::instance_reaping`]).
    pub fn instance_index_keys(&self, instance: &str) -> [String; 3] {
        [
            self.instance_rooms(instance),
            self.instance_reaping_rooms(instance),
            self.instance_reaping(instance),
        ]
    }

    /// `P:{ctl}:instance:<I>:info` (`instance` in wire form): the hash in which an instance
    /// describes itself (version, host, pid, start, timings, transport), written with its
    /// registration and removed by its reap and by [`Node::leave`](crate::Node::leave).
    pub fn instance_info(&self, instance: &str) -> String {
        format!("{}:{{ctl}}:instance:{instance}:info", self.prefix)
    }

    /// The keys of room `room` (wire form).
    pub fn room(&self, room: &str) -> RoomKeys {
        let base = format!("{}:room:{{{room}}}:", self.prefix);
        RoomKeys {
            owner: format!("{base}owner"),
            meta: format!("{base}meta"),
            peers: format!("{base}peers"),
            guests: format!("{base}guests"),
            guest_state: format!("{base}guest-state"),
        }
    }

    /// `P:room:{R}:owner` alone (the same key as [`KeySpace::room`]`.owner`), for the tick's
    /// per-room refresh.
    pub fn room_owner(&self, room: &str) -> String {
        format!("{}:room:{{{room}}}:owner", self.prefix)
    }

    /// `P:room:{R}:peer:<peer>` (both in wire form).
    pub fn peer(&self, room: &str, peer: &str) -> String {
        format!("{}:room:{{{room}}}:peer:{peer}", self.prefix)
    }

    /// `P:events`, the pub/sub channel.
    pub fn events_channel(&self) -> String {
        format!("{}:events", self.prefix)
    }

    /// Parses a key of this prefix; `None` for keys of other prefixes or unknown shapes.
    pub fn parse(&self, key: &str) -> Option<ParsedKey> {
        let rest = key.strip_prefix(self.prefix.as_str())?.strip_prefix(':')?;
        if let Some(ctl) = rest.strip_prefix("{ctl}:") {
            return Some(match ctl {
                "heartbeats" => ParsedKey::Heartbeats,
                "leader" => ParsedKey::Leader,
                "epoch" => ParsedKey::Epoch,
                "dataset" => ParsedKey::Dataset,
                "schema" => ParsedKey::Schema,
                _ => {
                    if let Some(i) = ctl.strip_prefix("hb:") {
                        ParsedKey::Heartbeat(i.to_owned())
                    } else if let Some(i) = ctl
                        .strip_prefix("instance:")
                        .and_then(|s| s.strip_suffix(":rooms"))
                    {
                        ParsedKey::InstanceRooms(i.to_owned())
                    } else if let Some(i) = ctl
                        .strip_prefix("instance:")
                        .and_then(|s| s.strip_suffix(":peers"))
                    {
                        ParsedKey::V1InstancePeers(i.to_owned())
                    } else if let Some(i) = ctl
                        .strip_prefix("instance:")
                        .and_then(|s| s.strip_suffix(":info"))
                    {
                        ParsedKey::InstanceInfo(i.to_owned())
                    } else if let Some(i) = ctl
                        .strip_prefix("instance:")
                        .and_then(|s| s.strip_suffix(":reaping-rooms"))
                    {
                        ParsedKey::InstanceReapingRooms(i.to_owned())
                    } else if let Some(i) = ctl
                        .strip_prefix("instance:")
                        .and_then(|s| s.strip_suffix(":reaping-peers"))
                    {
                        ParsedKey::V1InstanceReapingPeers(i.to_owned())
                    } else if let Some(i) = ctl
                        .strip_prefix("instance:")
                        .and_then(|s| s.strip_suffix(":reaping"))
                    {
                        ParsedKey::InstanceReaping(i.to_owned())
                    } else if let Some(i) = ctl
                        .strip_prefix("instance:")
                        .and_then(|s| s.strip_suffix(":reaped"))
                    {
                        ParsedKey::InstanceReaped(i.to_owned())
                    } else {
                        return None;
                    }
                }
            });
        }
        if let Some(tag) = rest
            .strip_prefix("shard:{")
            .and_then(|t| t.strip_suffix("}:dataset"))
            .filter(|t| !t.is_empty() && !t.contains(['{', '}']))
        {
            return Some(ParsedKey::ShardDataset(tag.to_owned()));
        }
        let room = rest.strip_prefix("room:{")?;
        let (room, tail) = room.split_once("}:")?;
        let room = room.to_owned();
        Some(match tail {
            "owner" => ParsedKey::RoomOwner(room),
            "meta" => ParsedKey::RoomMeta(room),
            "peers" => ParsedKey::RoomPeers(room),
            "guests" => ParsedKey::RoomGuests(room),
            "guest-state" => ParsedKey::RoomGuestState(room),
            _ => ParsedKey::Peer(room, tail.strip_prefix("peer:")?.to_owned()),
        })
    }
}

/// A key of one prefix, by role; ids in wire form.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum ParsedKey {
    Heartbeats,
    Heartbeat(String),
    Leader,
    Epoch,
    Dataset,
    /// The key schema version ([`KeySpace::schema`]).
    Schema,
    /// A cluster master's dataset token ([`KeySpace::shard_dataset`]): its hash tag.
    ShardDataset(String),
    InstanceRooms(String),
    /// Key schema version 1's peer index ([`KeySpace::v1_instance_peers`]).
    V1InstancePeers(String),
    InstanceInfo(String),
    InstanceReapingRooms(String),
    /// Key schema version 1's moved peer index ([`KeySpace::v1_instance_reaping_peers`]).
    V1InstanceReapingPeers(String),
    InstanceReaping(String),
    /// The reap tombstone ([`KeySpace::instance_reaped`]).
    InstanceReaped(String),
    RoomOwner(String),
    RoomMeta(String),
    RoomPeers(String),
    RoomGuests(String),
    RoomGuestState(String),
    Peer(String, String),
}

impl ParsedKey {
    /// The room (wire form) of a room key or peer record; `None` for a control-plane key.
    pub fn room(&self) -> Option<&str> {
        match self {
            ParsedKey::RoomOwner(r)
            | ParsedKey::RoomMeta(r)
            | ParsedKey::RoomPeers(r)
            | ParsedKey::RoomGuests(r)
            | ParsedKey::RoomGuestState(r)
            | ParsedKey::Peer(r, _) => Some(r),
            _ => None,
        }
    }

    /// The instance (wire form) of a heartbeat key or an instance index; `None` otherwise.
    pub fn instance(&self) -> Option<&str> {
        match self {
            ParsedKey::Heartbeat(i)
            | ParsedKey::InstanceRooms(i)
            | ParsedKey::V1InstancePeers(i)
            | ParsedKey::InstanceInfo(i)
            | ParsedKey::InstanceReapingRooms(i)
            | ParsedKey::V1InstanceReapingPeers(i)
            | ParsedKey::InstanceReaping(i)
            | ParsedKey::InstanceReaped(i) => Some(i),
            _ => None,
        }
    }
}

/// The member `<room>/<peer>` of a key schema version 1 peer index (both in wire form).
pub fn peer_member(room: &str, peer: &str) -> String {
    format!("{room}/{peer}")
}

/// Splits a `<room>/<peer>` member; `None` when it has no `/`.
pub fn split_peer_member(member: &str) -> Option<(&str, &str)> {
    member
        .split_once('/')
        .filter(|(r, p)| !r.is_empty() && !p.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_ids_are_verbatim_and_others_escaped() {
        assert_eq!(encode_id(IdKind::Room, "room-1_a.b").unwrap(), "room-1_a.b");
        assert_eq!(encode_id(IdKind::Room, "a:b").unwrap(), "a%3Ab");
        assert_eq!(encode_id(IdKind::Room, "{x}").unwrap(), "%7Bx%7D");
        assert_eq!(encode_id(IdKind::Room, "%").unwrap(), "%25");
        assert_eq!(encode_id(IdKind::Room, "방").unwrap(), "%EB%B0%A9");
        assert_eq!(decode_id("%EB%B0%A9").unwrap(), "방");
    }

    #[test]
    fn room_owner_is_the_room_keys_owner() {
        let ks = KeySpace::new("sfu", "dev", "main").unwrap();
        for room in ["r1", "a%3Ab", "%EB%B0%A9"] {
            assert_eq!(ks.room_owner(room), ks.room(room).owner);
        }
    }

    #[test]
    fn bad_ids_are_refused() {
        for bad in ["", "a\nb", "\u{7f}"] {
            let e = encode_id(IdKind::Peer, bad).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::InvalidId, "{bad:?}");
        }
        assert!(encode_id(IdKind::Peer, &"x".repeat(MAX_ID_BYTES)).is_ok());
        assert!(encode_id(IdKind::Peer, &"x".repeat(MAX_ID_BYTES + 1)).is_err());
        assert!(decode_id("a:b").is_err());
        assert!(decode_id("%ZZ").is_err());
        assert!(decode_id("%FF").is_err());
        assert!(decode_id("%41").is_err());
        assert!(decode_id("").is_err());
    }

    #[test]
    fn prefix_segments_are_escaped() {
        let cases = [
            ("main", "main"),
            (" v1.2-rc\t", "v1.2-rc"),
            ("feature/login", "feature_2Flogin"),
            ("feature_login", "feature__login"),
            ("feature_2Flogin", "feature__2Flogin"),
            ("prod_eu", "prod__eu"),
            ("a:b", "a_3Ab"),
            ("feature/x y", "feature_2Fx_20y"),
            ("{x}*", "_7Bx_7D_2A"),
            ("%", "_25"),
            ("방", "_EB_B0_A9"),
            ("_", "__"),
        ];
        for (raw, escaped) in cases {
            assert_eq!(segment("branch", raw).unwrap(), escaped, "{raw:?}");
        }
        let ks = KeySpace::new("sfu", "prod", "feature/x y").unwrap();
        assert_eq!(ks.prefix(), "sfu:prod:feature_2Fx_20y");
        assert_ne!(
            KeySpace::new("sfu", "dev", "feature/login").unwrap(),
            KeySpace::new("sfu", "dev", "feature_login").unwrap()
        );
    }

    #[test]
    fn bad_prefix_segments_are_refused_naming_the_field() {
        for (ns, stage, branch, field) in [
            ("", "dev", "main", "namespace"),
            ("sfu", " ", "main", "stage"),
            ("sfu", "dev", "\n", "branch"),
            ("sfu", "dev", &"b".repeat(65), "branch"),
            ("sfu", &"방".repeat(22), "main", "stage"),
        ] {
            let e = KeySpace::new(ns, stage, branch).unwrap_err();
            assert!(
                matches!(&e, Error::InvalidConfig { field: f, .. } if *f == field),
                "{e:?} should name {field}"
            );
        }
        // The limit applies to the segment as given, not to its (longer) escaped form.
        let ks = KeySpace::new("sfu", &"방".repeat(21), &"b".repeat(64)).unwrap();
        assert_eq!(ks.prefix().len(), 4 + 21 * 9 + 1 + 64);
    }

    #[test]
    fn keys_parse_back() {
        let ks = KeySpace::new("sfu", "dev", "main").unwrap();
        let r = ks.room("r%3A1");
        assert_eq!(
            ks.parse(&r.owner),
            Some(ParsedKey::RoomOwner("r%3A1".into()))
        );
        assert_eq!(
            ks.parse(&ks.peer("r", "p")),
            Some(ParsedKey::Peer("r".into(), "p".into()))
        );
        assert_eq!(
            ks.parse(&ks.v1_instance_peers("i")),
            Some(ParsedKey::V1InstancePeers("i".into()))
        );
        assert_eq!(ks.parse("sfu:dev:mainx:{ctl}:leader"), None);
        assert_eq!(ks.parse(&ks.leader()), Some(ParsedKey::Leader));
        assert_eq!(ks.schema(), "sfu:dev:main:{ctl}:schema");
        assert_eq!(ks.parse(&ks.schema()), Some(ParsedKey::Schema));
        assert_eq!(
            ks.parse(&ks.shard_dataset("5461.12")),
            Some(ParsedKey::ShardDataset("5461.12".into()))
        );
        assert_eq!(ks.parse("sfu:dev:main:shard:{}:dataset"), None);
    }
}
