//! Ids with special characters end to end on a real redis-server ("ids are data, not
//! syntax"): `:`, `{`, `}`, `*`, `/`, `%`, spaces and Korean text in room, peer, guest and
//! instance ids pin, upsert, remove, close and reap like any other id, and never collide.

use crate::support;

use sfu_redis::keys::{encode_id, IdKind, ParsedKey};
use sfu_redis::{Event, PinOutcome, Timings};
use support::*;

const STAGE: &str = "i";

const ROOMS: [&str; 10] = [
    "a:b",
    "{x}",
    "*",
    "a b",
    "한국어 방",
    "a/b",
    "%41",
    "}{",
    "room:{ctl}:hb",
    "A",
];
const PEERS: [&str; 4] = ["p:1", "{p}", "p/q *", "참가자"];
const GUESTS: [&str; 2] = ["g:{1}", "게스트 1"];

// Protects "ids are data, not syntax" end to end. An instance whose own id holds `{`, `:`,
// `*`, `/` and Korean pins ten rooms whose ids look like key syntax (including `%41` next to
// `A`, and one that imitates a control key), upserts peers and guests with such ids, removes
// one and closes one; every key parses back under the prefix, every room key's hash tag is the
// room's wire id, nothing collides (`%41` and `A` are different rooms), and reading back
// returns the callers' ids. Then the instance crashes and is reaped: `instance_reaped` names
// it by its raw id and nothing refers to it or its rooms afterwards. Fails if any id reached a
// key unencoded (a `}` would end the hash tag, a `:` would shift the key's shape, `*` would
// match other keys) or if decoding did not give the callers' ids back.
#[test]
fn special_ids_work_end_to_end() {
    let s = Server::start();
    let ks = ks(STAGE);
    let (leader, mut log) = s.leader(STAGE, "leader", Timings::fast());
    let odd = "inst {1}:*/한";
    let n = s.node(STAGE, odd);
    for r in ROOMS {
        assert_eq!(n.pin_room(r).unwrap(), PinOutcome::Pinned, "{r}");
    }
    assert_eq!(
        leader.pin_room("{x}").unwrap(),
        PinOutcome::Held { owner: odd.into() }
    );
    let mut gens = std::collections::HashMap::new();
    for r in ROOMS {
        for (i, p) in PEERS.iter().enumerate() {
            let g = GUESTS.get(i).copied();
            let gen = n.upsert_peer(r, p, g, &[("display", "이름: {x}")]).unwrap();
            gens.insert((r, *p), gen);
        }
    }
    for r in ROOMS {
        assert_eq!(n.room_owner(r).unwrap().as_deref(), Some(odd), "{r}");
    }
    // Guest reconnect with special ids.
    n.upsert_peer("a:b", "p:2", Some("g:{1}"), &[]).unwrap();
    assert!(n.remove_peer("a b", "{p}", gens[&("a b", "{p}")]).unwrap());
    n.close_room("*").unwrap();
    assert_eq!(n.room_owner("*").unwrap(), None);
    assert_eq!(n.room_owner("a b").unwrap().as_deref(), Some(odd));
    assert_eq!(n.stats().rooms, ROOMS.len() - 1);
    assert_eq!(
        n.stats().peers,
        (ROOMS.len() - 1) * PEERS.len() - 1,
        "one superseded+added, one removed"
    );

    let keys = s.keys("*");
    for k in &keys {
        let parsed = ks.parse(k);
        assert!(parsed.is_some(), "{k:?} does not parse");
        if let Some(r) = parsed.as_ref().and_then(ParsedKey::room) {
            let open = k.find('{').unwrap();
            let close = open + k[open..].find('}').unwrap();
            assert_eq!(&k[open + 1..close], r, "hash tag of {k:?}");
            assert!(ROOMS
                .iter()
                .any(|room| encode_id(IdKind::Room, room).unwrap() == *r));
        }
        assert!(!k.contains(' ') && !k.contains('*'), "{k:?}");
    }
    assert!(
        s.index_problems(&ks).is_empty(),
        "{:#?}",
        s.index_problems(&ks)
    );

    n.simulate_crash();
    let e = log.wait(LONG, "the odd instance reaped", |e| reaped(e, odd));
    assert_eq!(
        e,
        Event::InstanceReaped {
            dead: odd.into(),
            rooms: (ROOMS.len() - 1) as u64,
            peers: ((ROOMS.len() - 1) * PEERS.len() - 1) as u64,
            skipped_rooms: 0,
            forced: false
        }
    );
    let mut needles = vec![encode_id(IdKind::Instance, odd).unwrap()];
    needles.extend(
        ROOMS
            .iter()
            .map(|r| format!("{{{}}}", encode_id(IdKind::Room, r).unwrap())),
    );
    let left = references(&s.dump("*"), &needles);
    assert!(left.is_empty(), "{left:#?}");
    assert!(s.keys(&format!("{}:room:*", ks.prefix())).is_empty());
}
