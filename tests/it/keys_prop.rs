//! Property tests of the key space ("ids are data, not syntax"): for arbitrary UTF-8 ids,
//! including `:`, `{`, `}`, `*`, `/`, `%`, spaces and non-ASCII, encoding is reversible and
//! injective, keys and `<room>/<peer>` members never collide, a room key's hash tag is exactly
//! the room's wire id, and keys parse back to what built them. Prefix segments (namespace,
//! stage, branch) are escaped injectively into `[A-Za-z0-9._-]`: distinct names never share a
//! prefix (invariant 5).

use proptest::prelude::*;
use sfu_redis::keys::{
    decode_id, encode_id, peer_member, split_peer_member, IdKind, KeySpace, ParsedKey, MAX_ID_BYTES,
};
use sfu_redis::ErrorKind;

/// Strings rich in the characters that could break a key: separators, hash-tag braces, glob
/// characters, the escape character itself, spaces, multi-byte characters; sometimes long.
fn tricky() -> impl Strategy<Value = String> {
    let ch = prop_oneof![
        4 => prop::sample::select(vec![
            ':', '{', '}', '*', '/', '%', ' ', '?', '[', ']', '\\', '.', '_', '-', 'a', 'Z', '0',
            '방', '한', 'é', '😀', '\u{200b}',
        ]),
        1 => any::<char>(),
    ];
    prop_oneof![
        4 => prop::collection::vec(ch.clone(), 1..24).prop_map(String::from_iter),
        1 => prop::collection::vec(ch, 60..120).prop_map(String::from_iter),
        1 => any::<String>(),
    ]
}

/// Prefix segment names, often near-collisions under a lossy normalization: `_`, `/`, hex
/// digits (`_2F` is the escape of `/`), spaces (trimmed), `:`, `%`, multi-byte characters.
fn segment_name() -> impl Strategy<Value = String> {
    let ch = prop::sample::select(vec![
        '_', '/', '2', 'F', 'f', 'a', ' ', '.', '-', ':', '%', '방', '\t',
    ]);
    prop_oneof![
        2 => tricky(),
        3 => prop::collection::vec(ch, 1..12).prop_map(String::from_iter),
    ]
}

/// The old, lossy normalization (every character outside `[A-Za-z0-9._-]` became `_`): a
/// name and its image under it are the pairs that used to share a prefix.
fn old_normalization(s: &str) -> String {
    s.trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Undoes the escaping of one prefix segment (`__` -> `_`, `_XX` -> byte `XX`, other
/// characters verbatim); `None` if `s` is not an escaped segment.
fn unescape(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'_' if b.get(i + 1) == Some(&b'_') => {
                out.push(b'_');
                i += 2;
            }
            b'_' => {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                if hex.bytes().any(|h| !matches!(h, b'0'..=b'9' | b'A'..=b'F')) {
                    return None;
                }
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            c if c.is_ascii_alphanumeric() || c == b'.' || c == b'-' => {
                out.push(c);
                i += 1;
            }
            _ => return None,
        }
    }
    Some(out)
}

/// The prefix of `sfu:dev:main` with segment `pos` replaced by `name`.
fn prefix_with(pos: usize, name: &str) -> Option<String> {
    let mut segs = ["sfu", "dev", "main"];
    segs[pos] = name;
    KeySpace::new(segs[0], segs[1], segs[2])
        .ok()
        .map(|k| k.prefix().to_owned())
}

fn valid(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_ID_BYTES && !id.chars().any(char::is_control)
}

fn valid_id() -> impl Strategy<Value = String> {
    tricky().prop_filter("valid id", |s| valid(s))
}

fn ks() -> KeySpace {
    KeySpace::new("sfu", "dev", "main").unwrap()
}

/// The Redis Cluster hash tag of `key`: the text between the first `{` and the first `}`
/// after it, if non-empty.
fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let close = key[open + 1..].find('}')? + open + 1;
    (close > open + 1).then(|| &key[open + 1..close])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    // Encoding round-trips for every valid id, refuses every invalid one with InvalidId, and
    // the wire form holds only `[A-Za-z0-9._%-]` (no separator, brace, glob char or space);
    // plain ids stay verbatim (readable with `redis-cli --scan`).
    #[test]
    fn encode_decode_round_trip(id in tricky()) {
        match encode_id(IdKind::Room, &id) {
            Ok(w) => {
                prop_assert!(valid(&id));
                prop_assert!(w.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-%".contains(&b)), "{w}");
                prop_assert_eq!(decode_id(&w).unwrap(), id.clone());
                if id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
                    prop_assert_eq!(&w, &id);
                }
            }
            Err(e) => {
                prop_assert!(!valid(&id), "{id:?} refused: {e}");
                prop_assert_eq!(e.kind(), ErrorKind::InvalidId);
            }
        }
    }

    // Distinct ids give distinct wire forms, hence distinct keys of every kind and distinct
    // `<room>/<peer>` members, and a member splits back into its two wire ids.
    #[test]
    fn distinct_ids_never_collide(
        (r1, p1) in (valid_id(), valid_id()),
        (r2, p2) in (valid_id(), valid_id()),
    ) {
        let ks = ks();
        let w = |id: &str| encode_id(IdKind::Room, id).unwrap();
        let (wr1, wp1, wr2, wp2) = (w(&r1), w(&p1), w(&r2), w(&p2));
        prop_assert_eq!(r1 == r2, wr1 == wr2);
        prop_assert_eq!(ks.room(&wr1) == ks.room(&wr2), r1 == r2);
        prop_assert_eq!(ks.instance_rooms(&wr1) == ks.instance_rooms(&wr2), r1 == r2);
        prop_assert_eq!(ks.instance_reaping_rooms(&wr1) == ks.instance_reaping_rooms(&wr2), r1 == r2);
        // Key schema version 1's peer index: never written now, still named (fsck, migrate).
        prop_assert_eq!(ks.v1_instance_peers(&wr1) == ks.v1_instance_peers(&wr2), r1 == r2);
        prop_assert_eq!(ks.heartbeat(&wr1) == ks.heartbeat(&wr2), r1 == r2);
        let same = r1 == r2 && p1 == p2;
        prop_assert_eq!(ks.peer(&wr1, &wp1) == ks.peer(&wr2, &wp2), same);
        prop_assert_eq!(peer_member(&wr1, &wp1) == peer_member(&wr2, &wp2), same);
        let member = peer_member(&wr1, &wp1);
        prop_assert_eq!(split_peer_member(&member), Some((wr1.as_str(), wp1.as_str())));
        // A room's keys never equal a peer record key or a control key.
        let rk = ks.room(&wr1);
        for k in [&rk.owner, &rk.meta, &rk.peers, &rk.guests, &rk.guest_state] {
            prop_assert_ne!(k, &ks.peer(&wr2, &wp2));
            prop_assert_ne!(k, &ks.heartbeat(&wr2));
            prop_assert_ne!(k, &ks.heartbeats());
        }
    }

    // The hash tag of every key of a room (and of its peer records) is exactly the room's
    // wire id, so one room's scripts touch one slot, whatever the room or peer id holds.
    #[test]
    fn room_hash_tag_is_the_wire_id(room in valid_id(), peer in valid_id()) {
        let ks = ks();
        let wr = encode_id(IdKind::Room, &room).unwrap();
        let wp = encode_id(IdKind::Peer, &peer).unwrap();
        let braces = wr.contains('{') || wr.contains('}');
        prop_assert!(!braces, "wire form {} holds a brace", wr);
        let rk = ks.room(&wr);
        for k in [&rk.owner, &rk.meta, &rk.peers, &rk.guests, &rk.guest_state, &ks.peer(&wr, &wp)] {
            prop_assert_eq!(hash_tag(k), Some(wr.as_str()), "{}", k);
        }
        for k in [ks.heartbeats(), ks.heartbeat(&wp), ks.instance_rooms(&wr), ks.instance_reaping_rooms(&wr), ks.instance_reaping(&wr), ks.instance_info(&wr), ks.v1_instance_peers(&wr), ks.leader(), ks.epoch(), ks.dataset(), ks.schema()] {
            prop_assert_eq!(hash_tag(&k), Some("ctl"), "{}", k);
        }
    }

    // Every key parses back to its role and ids.
    #[test]
    fn keys_parse_back(room in valid_id(), peer in valid_id()) {
        let ks = ks();
        let wr = encode_id(IdKind::Room, &room).unwrap();
        let wp = encode_id(IdKind::Peer, &peer).unwrap();
        let rk = ks.room(&wr);
        prop_assert_eq!(ks.parse(&rk.owner), Some(ParsedKey::RoomOwner(wr.clone())));
        prop_assert_eq!(ks.parse(&rk.meta), Some(ParsedKey::RoomMeta(wr.clone())));
        prop_assert_eq!(ks.parse(&rk.peers), Some(ParsedKey::RoomPeers(wr.clone())));
        prop_assert_eq!(ks.parse(&rk.guests), Some(ParsedKey::RoomGuests(wr.clone())));
        prop_assert_eq!(ks.parse(&rk.guest_state), Some(ParsedKey::RoomGuestState(wr.clone())));
        prop_assert_eq!(ks.parse(&ks.peer(&wr, &wp)), Some(ParsedKey::Peer(wr.clone(), wp.clone())));
        prop_assert_eq!(ks.parse(&ks.heartbeat(&wp)), Some(ParsedKey::Heartbeat(wp.clone())));
        prop_assert_eq!(ks.parse(&ks.instance_rooms(&wp)), Some(ParsedKey::InstanceRooms(wp.clone())));
        prop_assert_eq!(ks.parse(&ks.instance_reaping_rooms(&wp)), Some(ParsedKey::InstanceReapingRooms(wp.clone())));
        prop_assert_eq!(ks.parse(&ks.instance_reaping(&wp)), Some(ParsedKey::InstanceReaping(wp.clone())));
        prop_assert_eq!(ks.parse(&ks.v1_instance_peers(&wp)), Some(ParsedKey::V1InstancePeers(wp.clone())));
        prop_assert_eq!(ks.parse(&ks.v1_instance_reaping_peers(&wp)), Some(ParsedKey::V1InstanceReapingPeers(wp.clone())));
        prop_assert_eq!(ks.parse(&ks.instance_info(&wp)), Some(ParsedKey::InstanceInfo(wp.clone())));
    }

    // Any prefix segments give exactly three `[A-Za-z0-9._-]` segments (no brace, so no hash
    // tag from the prefix; no `:`, so no fourth segment), and keys of two different prefixes
    // never belong to each other's key space, even when one prefix is a string prefix of the
    // other (`main` / `main2`).
    #[test]
    fn prefixes_are_three_plain_segments(
        a in (tricky(), tricky(), tricky()),
        b in (tricky(), tricky(), tricky()),
        room in valid_id(),
    ) {
        let (Ok(ka), Ok(kb)) = (KeySpace::new(&a.0, &a.1, &a.2), KeySpace::new(&b.0, &b.1, &b.2)) else {
            return Ok(());
        };
        for k in [&ka, &kb] {
            let segs: Vec<&str> = k.prefix().split(':').collect();
            prop_assert_eq!(segs.len(), 3, "{}", k.prefix());
            for s in segs {
                prop_assert!(!s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)), "{}", k.prefix());
            }
            let channel_prefixed = k.events_channel().starts_with(&format!("{}:", k.prefix()));
            prop_assert!(channel_prefixed, "channel {}", k.events_channel());
            prop_assert_eq!(k.scan_pattern(), format!("{}:*", k.prefix()));
        }
        let wr = encode_id(IdKind::Room, &room).unwrap();
        if ka.prefix() != kb.prefix() {
            prop_assert_eq!(kb.parse(&ka.room(&wr).owner), None);
            prop_assert_eq!(kb.parse(&ka.heartbeats()), None);
        }
        if let Ok(longer) = KeySpace::new(&a.0, &a.1, &format!("{}2", a.2.trim())) {
            prop_assert_eq!(ka.parse(&longer.leader()), None);
            let inside = longer.leader().starts_with(&format!("{}:", ka.prefix()));
            prop_assert!(!inside, "{} is inside {}", longer.leader(), ka.prefix());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    // Prefix segments are escaped injectively (invariant 5): two names that differ after
    // trimming never share a prefix, in any of the three positions; in particular a name and
    // its image under the old lossy normalization (`feature/login` / `feature_login`) stay
    // apart. Every prefix character is in `[A-Za-z0-9._-]` (plus the two `:` separators), and
    // each segment unescapes back to the trimmed name.
    #[test]
    fn distinct_segments_give_distinct_prefixes(
        a in segment_name(),
        b in segment_name(),
        pos in 0usize..3,
    ) {
        let old = old_normalization(&a);
        for (x, y) in [(a.as_str(), b.as_str()), (a.as_str(), old.as_str())] {
            let (Some(px), Some(py)) = (prefix_with(pos, x), prefix_with(pos, y)) else {
                continue;
            };
            prop_assert_eq!(px == py, x.trim() == y.trim(), "{:?} -> {}, {:?} -> {}", x, px, y, py);
        }
        if let Some(p) = prefix_with(pos, &a) {
            let segs: Vec<&str> = p.split(':').collect();
            prop_assert_eq!(segs.len(), 3, "{}", p);
            for seg in &segs {
                let plain = seg.bytes().all(|c| c.is_ascii_alphanumeric() || b"._-".contains(&c));
                prop_assert!(plain, "{:?} -> {}", a, p);
            }
            prop_assert_eq!(unescape(segs[pos]), Some(a.trim().as_bytes().to_vec()), "{:?} -> {}", a, p);
        }
    }

    // The same over whole prefixes: two (namespace, stage, branch) triples give the same
    // prefix exactly when they are equal after trimming.
    #[test]
    fn distinct_triples_give_distinct_prefixes(
        a in (segment_name(), segment_name(), segment_name()),
        b in (segment_name(), segment_name(), segment_name()),
    ) {
        let (Ok(ka), Ok(kb)) = (KeySpace::new(&a.0, &a.1, &a.2), KeySpace::new(&b.0, &b.1, &b.2)) else {
            return Ok(());
        };
        let same = (a.0.trim(), a.1.trim(), a.2.trim()) == (b.0.trim(), b.1.trim(), b.2.trim());
        prop_assert_eq!(ka.prefix() == kb.prefix(), same, "{:?} {:?}", a, b);
    }
}

// Hand-picked names that the old normalization merged, and their escaped forms.
#[test]
fn tricky_segments_do_not_collide() {
    let names = [
        "feature/login",
        "feature_login",
        "feature__login",
        "feature_2Flogin",
        "feature:login",
        "feature login",
        "feature%2Flogin",
        "prod_eu",
        "prod__eu",
        "prod-eu",
        "prod.eu",
        "_",
        "__",
        "_5F",
        "방",
        "_EB_B0_A9",
    ];
    let mut seen = std::collections::HashMap::new();
    for n in names {
        let p = prefix_with(2, n).unwrap();
        assert!(p.starts_with("sfu:dev:"), "{p}");
        if let Some(other) = seen.insert(p.clone(), n) {
            panic!("{n:?} and {other:?} share the prefix {p}");
        }
    }
    assert_eq!(
        prefix_with(2, "feature/login").unwrap(),
        "sfu:dev:feature_2Flogin"
    );
    assert_eq!(
        prefix_with(2, "feature_login").unwrap(),
        "sfu:dev:feature__login"
    );
    assert_eq!(prefix_with(1, "prod_eu").unwrap(), "sfu:prod__eu:main");
    assert_eq!(prefix_with(0, "a:b").unwrap(), "a_3Ab:dev:main");
}

// Hand-picked ids that look like syntax, checked pairwise for collisions.
#[test]
fn tricky_ids_do_not_collide() {
    let ids = [
        "a:b",
        "a",
        "b",
        "a%3Ab",
        "%3A",
        ":",
        "{x}",
        "x",
        "%7Bx%7D",
        "*",
        "%",
        "%25",
        "a b",
        "a+b",
        "a/b",
        "a%2Fb",
        "한국어 방",
        "ctl",
        "{ctl}",
        "}{",
        "room:{ctl}:hb",
        "A",
        "%41",
    ];
    let ks = ks();
    let mut keys = std::collections::BTreeSet::new();
    let mut members = std::collections::BTreeSet::new();
    for r in ids {
        let w = encode_id(IdKind::Room, r).unwrap();
        assert_eq!(decode_id(&w).unwrap(), r);
        assert!(keys.insert(ks.room(&w).owner), "{r}");
        for p in ids {
            let wp = encode_id(IdKind::Peer, p).unwrap();
            assert!(members.insert(peer_member(&w, &wp)), "{r} / {p}");
        }
    }
    assert!(decode_id("a:b").is_err());
    assert!(decode_id("{x}").is_err());
    assert!(decode_id("").is_err());
}

// `decode_id` documents BadData for anything that "is not the wire form of a valid id": it
// must accept only canonical wire forms, i.e. `encode_id(decode_id(w)) == w`. Otherwise
// foreign values read from Redis (owners, index members) are silently taken for other ids:
// `%41` reads as instance "A" (whose keys use `A`), `%2f` as "/" (canonical `%2F`), and `%ZZ`
// as the id "%ZZ" (canonical `%25ZZ`). The crate's own unit test `keys::tests::bad_ids_are_refused`
// asserts `decode_id("%ZZ").is_err()`.
#[test]
fn decode_accepts_only_canonical_wire_forms() {
    for w in ["%ZZ", "%41", "%2f", "%", "a%2"] {
        if let Ok(id) = decode_id(w) {
            assert_eq!(
                encode_id(IdKind::Room, &id).unwrap(),
                w,
                "{w:?} decoded to {id:?}"
            );
        }
    }
    proptest!(|(w in "[A-Za-z0-9._%-]{1,12}")| {
        if let Ok(id) = decode_id(&w) {
            prop_assert_eq!(encode_id(IdKind::Room, &id).unwrap(), w);
        }
    });
}
