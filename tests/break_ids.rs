//! Adversarial: ids at the 256-byte limit made of every odd character, end to end (pin,
//! upsert with guests, reconnect, remove, crash, reap), plus instance ids of the same kind.

mod support;

use sfu_redis::keys::{encode_id, IdKind};
use sfu_redis::{Node, PinOutcome, Timings};
use support::*;

const STAGE: &str = "bid";

/// An id of exactly `len` bytes built from `alphabet` (cycled, cut at a char boundary and
/// padded with 'x').
fn id_of(alphabet: &str, len: usize) -> String {
    let mut s = String::new();
    for c in alphabet.chars().cycle() {
        if s.len() + c.len_utf8() > len {
            break;
        }
        s.push(c);
    }
    while s.len() < len {
        s.push('x');
    }
    s
}

#[test]
fn odd_ids_at_the_limit_survive_a_full_life_and_reap() {
    let s = Server::start();
    let ks = ks(STAGE);
    let alphabets = [
        ":{}*/ %?#[]\\\"'`~!@$^&()+=|<>,;",
        "방🙂\u{202E}\u{200F}\u{FEFF}\u{200B}é́ñ",
        "%25%3A%7B%7D",
        "{ctl}:heartbeats",
        "a/b/c/../..//",
        "*?[^]-",
        "\u{00A0}\u{2028}\u{2029}\u{FFFD}",
    ];
    let leader_id = id_of("leader {ctl}:*/", 256);
    let (leader, mut log) = s.leader(STAGE, &leader_id, Timings::fast());
    let victim_id = id_of("victim:{x}/ 방%", 256);
    let victim = Node::start(s.config(STAGE, &victim_id)).unwrap();
    let mut victim_rooms = Vec::new();
    for (i, a) in alphabets.iter().enumerate() {
        let room = id_of(&format!("{i}{a}"), 256);
        let peer = id_of(&format!("p{i}{a}"), 256);
        let peer2 = id_of(&format!("q{i}{a}"), 256);
        let guest = id_of(&format!("g{i}{a}"), 256);
        assert_eq!(
            victim.pin_room(&room).unwrap(),
            PinOutcome::Pinned,
            "{room:?}"
        );
        let g1 = victim
            .upsert_peer(&room, &peer, Some(&guest), &[("n", a)])
            .unwrap();
        // The guest reconnects with a new peer id; the old connection's remove is a no-op.
        victim
            .upsert_peer(&room, &peer2, Some(&guest), &[])
            .unwrap();
        assert!(!victim.remove_peer(&room, &peer, g1).unwrap());
        assert_eq!(
            victim.room_owner(&room).unwrap().as_deref(),
            Some(victim_id.as_str())
        );
        victim_rooms.push(room);
    }
    // The leader pins a room whose id differs only by escaping from one of the victim's.
    let lookalike = encode_id(IdKind::Room, &victim_rooms[0]).unwrap();
    if lookalike.len() <= 256 {
        assert_eq!(leader.pin_room(&lookalike).unwrap(), PinOutcome::Pinned);
    }
    assert!(
        s.index_problems(&ks).is_empty(),
        "{:#?}",
        s.index_problems(&ks)
    );
    victim.simulate_crash();
    log.wait(LONG, "victim reaped", |e| reaped(e, &victim_id));
    std::thread::sleep(std::time::Duration::from_millis(300));
    let dump = s.dump(&ks.scan_pattern());
    let mut needles = vec![wire(IdKind::Instance, &victim_id)];
    for r in &victim_rooms {
        needles.push(format!("{{{}}}", wire(IdKind::Room, r)));
    }
    let left = references(&dump, &needles);
    assert!(left.is_empty(), "leftovers of the reaped victim: {left:#?}");
    if lookalike.len() <= 256 {
        assert_eq!(
            leader.room_owner(&lookalike).unwrap().as_deref(),
            Some(leader_id.as_str())
        );
    }
    assert!(
        s.index_problems(&ks).is_empty(),
        "{:#?}",
        s.index_problems(&ks)
    );
}

// Ids just over the limit, or with control characters anywhere (also as the last char of a
// multi-byte-heavy id), are refused with InvalidId and nothing is written.
#[test]
fn ids_over_the_limit_or_with_controls_are_refused() {
    let s = Server::start();
    let n = s.node(STAGE, "n");
    for bad in [
        id_of("방", 255) + "xx", // 257 bytes
        id_of("a", 255) + "\u{7}",
        "a\u{85}b".to_owned(), // NEL (C1 control)
        "\u{9F}".to_owned(),
        "a\rb".to_owned(),
    ] {
        let e = n.pin_room(&bad).unwrap_err();
        assert_eq!(e.kind(), sfu_redis::ErrorKind::InvalidId, "{bad:?}: {e}");
    }
    assert_eq!(s.keys("sfu:bid:main:room:*"), Vec::<String>::new());
}
