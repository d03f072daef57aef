//! The peer store on a real redis-server: `upsert_peer` removes stale index entries first
//! (guest reconnects, guest changes, peers moving between instances), `remove_peer` is a no-op
//! for an older generation, and after any sequence the indexes hold exactly what the records
//! say (invariant 4). Key schema version 2: an instance keeps no peer index; every record
//! naming it lies in a room of its room index (`P:{ctl}:instance:<I>:rooms`), and only a room's
//! owner writes records into it.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};

use sfu_redis::{ErrorKind, PinOutcome, Timings, MAX_PEER_FIELDS};
use support::*;

const STAGE: &str = "p";

fn smembers(s: &Server, key: &str) -> BTreeSet<String> {
    redis::cmd("SMEMBERS").arg(key).query(&mut s.con()).unwrap()
}

fn hgetall(s: &Server, key: &str) -> BTreeMap<String, String> {
    redis::cmd("HGETALL").arg(key).query(&mut s.con()).unwrap()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn map(items: &[(&str, &str)]) -> BTreeMap<String, String> {
    items
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The rooms of `instance`'s room index.
fn room_index(s: &Server, instance: &str) -> BTreeSet<String> {
    smembers(s, &ks(STAGE).instance_rooms(instance))
}

fn assert_consistent(s: &Server) {
    let problems = s.index_problems(&ks(STAGE));
    assert!(problems.is_empty(), "index problems: {problems:#?}");
}

// Protects invariant 4 / pitfall "upsert_peer without removing old index entries leaves stale
// mappings forever": a guest that reconnects with a new peer id replaces its old connection.
// Afterwards the old peer record is gone, the guest points at the new peer, the room's peer set
// holds exactly the new peer, and the room (which reaches the record) is in the instance's room
// index. Without the supersede step the old record and its room-set member would stay forever.
#[test]
fn guest_reconnect_with_new_peer_id_leaves_no_stale_mapping() {
    let s = Server::start();
    let ks = ks(STAGE);
    let a = s.node(STAGE, "inst-a");
    a.pin_room("room").unwrap();
    let g1 = a
        .upsert_peer("room", "conn-1", Some("alice"), &[("device", "phone")])
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(ks.room("room").guest_state)
        .arg("alice")
        .arg("speaking")
        .query(&mut s.con())
        .unwrap();
    let g2 = a
        .upsert_peer("room", "conn-2", Some("alice"), &[("device", "laptop")])
        .unwrap();
    assert!(g2 > g1, "generations grow within a room");
    let rk = ks.room("room");
    assert!(hgetall(&s, &ks.peer("room", "conn-1")).is_empty());
    assert_eq!(hgetall(&s, &rk.guests), map(&[("alice", "conn-2")]));
    assert_eq!(smembers(&s, &rk.peers), set(&["conn-2"]));
    assert_eq!(room_index(&s, "inst-a"), set(&["room"]));
    let rec = hgetall(&s, &ks.peer("room", "conn-2"));
    assert_eq!(rec["instance"], "inst-a");
    assert_eq!(rec["guest"], "alice");
    assert_eq!(rec["generation"], g2.to_string());
    assert_eq!(rec["device"], "laptop");
    // The guest is still the same guest: its state stays.
    assert_eq!(hgetall(&s, &rk.guest_state), map(&[("alice", "speaking")]));
    assert_eq!(a.stats().peers, 1);
    // The old connection's delayed remove finds nothing to remove.
    assert!(!a.remove_peer("room", "conn-1", g1).unwrap());
    assert_eq!(smembers(&s, &rk.peers), set(&["conn-2"]));
    assert_consistent(&s);
}

// Protects invariant 4: a peer that changes guest (or drops its guest) takes the old guest's
// pointer and state with it; the new guest points at it. Without step (1) of upsert_peer.lua
// the old guest would keep pointing at a peer that is no longer its own.
#[test]
fn peer_changing_guest_drops_the_old_guest_pointer() {
    let s = Server::start();
    let ks = ks(STAGE);
    let a = s.node(STAGE, "inst-a");
    a.pin_room("room").unwrap();
    let rk = ks.room("room");
    a.upsert_peer("room", "conn", Some("g-old"), &[]).unwrap();
    let _: () = redis::cmd("HSET")
        .arg(&rk.guest_state)
        .arg("g-old")
        .arg("muted")
        .query(&mut s.con())
        .unwrap();
    a.upsert_peer("room", "conn", Some("g-new"), &[]).unwrap();
    assert_eq!(hgetall(&s, &rk.guests), map(&[("g-new", "conn")]));
    assert!(hgetall(&s, &rk.guest_state).is_empty());
    assert_consistent(&s);
    // And dropping the guest altogether.
    a.upsert_peer("room", "conn", None, &[]).unwrap();
    assert!(hgetall(&s, &rk.guests).is_empty());
    assert_eq!(hgetall(&s, &ks.peer("room", "conn"))["guest"], "");
    assert_eq!(smembers(&s, &rk.peers), set(&["conn"]));
    assert_consistent(&s);
    // A guest pointer that already moved to another peer is not touched by the old peer.
    a.upsert_peer("room", "p1", Some("bob"), &[]).unwrap();
    a.upsert_peer("room", "p2", Some("carol"), &[]).unwrap();
    a.upsert_peer("room", "p1", Some("carol"), &[]).unwrap(); // supersedes p2, drops bob
    assert_eq!(
        hgetall(&s, &rk.guests),
        map(&[("carol", "p1")]),
        "bob's pointer went with p1, p2 was superseded"
    );
    assert_eq!(smembers(&s, &rk.peers), set(&["conn", "p1"]));
    assert_consistent(&s);
}

// Protects invariant 4 "a delayed remove of an old connection (older generation) is a no-op":
// a reconnect with the same peer id gets a new generation; removing with the old generation
// changes nothing (record, room set, guest pointer and state, room index intact); removing
// with the current generation cleans every index of the room, and the room, still pinned, stays
// in the instance's room index. Without the generation check the stale remove would delete the
// live connection's record and indexes.
#[test]
fn remove_peer_is_a_no_op_for_an_older_generation() {
    let s = Server::start();
    let ks = ks(STAGE);
    let a = s.node(STAGE, "inst-a");
    a.pin_room("room").unwrap();
    let rk = ks.room("room");
    let old = a
        .upsert_peer("room", "conn", Some("guest"), &[("v", "1")])
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(&rk.guest_state)
        .arg("guest")
        .arg("on")
        .query(&mut s.con())
        .unwrap();
    let cur = a
        .upsert_peer("room", "conn", Some("guest"), &[("v", "2")])
        .unwrap();
    assert_ne!(old, cur);
    let snapshot = s.dump(&ks.scan_pattern());
    // The instance's info hash is left out: every tick writes its peer count there.
    let room_keys = |d: &BTreeMap<String, Val>| -> BTreeMap<String, Val> {
        d.iter()
            .filter(|(k, _)| {
                k.contains(":room:") || (k.contains(":instance:") && !k.ends_with(":info"))
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    assert!(!a.remove_peer("room", "conn", old).unwrap());
    assert!(!a.remove_peer("room", "conn", cur + 100).unwrap());
    assert_eq!(room_keys(&s.dump(&ks.scan_pattern())), room_keys(&snapshot));
    assert_eq!(a.stats().peers, 1);

    assert!(a.remove_peer("room", "conn", cur).unwrap());
    assert!(hgetall(&s, &ks.peer("room", "conn")).is_empty());
    assert!(smembers(&s, &rk.peers).is_empty());
    assert!(hgetall(&s, &rk.guests).is_empty());
    assert!(hgetall(&s, &rk.guest_state).is_empty());
    assert_eq!(room_index(&s, "inst-a"), set(&["room"]));
    assert_eq!(a.stats().peers, 0);
    // Removing twice is harmless.
    assert!(!a.remove_peer("room", "conn", cur).unwrap());
    // The room itself stays pinned.
    assert_eq!(a.room_owner("room").unwrap().as_deref(), Some("inst-a"));
    assert_consistent(&s);
}

// Protects invariant 4 across instances: when a room moves to a live instance B (its owner A
// died) and B upserts a peer id that A had, or a guest whose pointer names A's peer, B's record
// replaces A's and A's superseded record goes with the guest's old pointer, in the one script
// call. A's record that B did not touch stays, and so does the room's entry in A's room index:
// it is what lets the reaper reach that record once A is reaped (invariant 2). Fails if the
// superseded record or the old guest pointer survives, if B's upsert left A's record naming A,
// or if the room left A's index while a record of A is in it.
#[test]
fn peer_moving_to_another_instance_leaves_no_stale_mapping() {
    let s = Server::start();
    let ks = ks(STAGE);
    // Slow reaper so that A's data stays while B takes over: B is the only other node and
    // leads, but a long two-phase delay keeps it from reaping A during the test.
    let mut t = Timings::fast();
    t.two_phase_delay = std::time::Duration::from_secs(60);
    let b = s.node_with(STAGE, "inst-b", t);
    let a = s.node_with(STAGE, "inst-a", t);
    a.pin_room("room").unwrap();
    a.upsert_peer("room", "same-id", None, &[]).unwrap();
    a.upsert_peer("room", "a-conn", Some("dora"), &[]).unwrap();
    a.upsert_peer("room", "a-stays", None, &[]).unwrap();
    a.simulate_crash();
    let _: () = redis::cmd("DEL")
        .arg(ks.heartbeat("inst-a"))
        .query(&mut s.con())
        .unwrap();
    assert_eq!(
        b.pin_room("room").unwrap(),
        PinOutcome::TookOver {
            previous: "inst-a".into()
        }
    );
    b.upsert_peer("room", "same-id", None, &[]).unwrap();
    let up = b
        .upsert_peer_detailed("room", "b-conn", Some("dora"), &[])
        .unwrap();
    assert_eq!(up.replaced.as_deref(), Some("a-conn"));
    let rk = ks.room("room");
    assert_eq!(
        hgetall(&s, &ks.peer("room", "same-id"))["instance"],
        "inst-b"
    );
    assert!(hgetall(&s, &ks.peer("room", "a-conn")).is_empty());
    assert_eq!(hgetall(&s, &rk.guests), map(&[("dora", "b-conn")]));
    assert_eq!(
        hgetall(&s, &ks.peer("room", "a-stays"))["instance"],
        "inst-a"
    );
    assert_eq!(
        smembers(&s, &rk.peers),
        set(&["same-id", "b-conn", "a-stays"])
    );
    assert_eq!(room_index(&s, "inst-a"), set(&["room"]));
    assert_eq!(room_index(&s, "inst-b"), set(&["room"]));
    assert_consistent(&s);
}

// Protects owner CAS on upsert and invariants 2 and 4: a node that does not own the room gets
// NotOwner (naming the owner) and nothing is written: no record, no room-set member, no guest
// pointer, and no room in its own room index. Only a room's owner writes records into it, so
// every record naming an instance lies in a room of that instance's room index; a record
// written here would be one that no index of B reaches (an orphan once B dies).
#[test]
fn upsert_into_a_room_owned_elsewhere_is_refused_and_writes_nothing() {
    let s = Server::start();
    let ks = ks(STAGE);
    let a = s.node(STAGE, "inst-a");
    let b = s.node(STAGE, "inst-b");
    a.pin_room("room").unwrap();
    a.upsert_peer("room", "a-peer", None, &[]).unwrap();
    let e = b.upsert_peer("room", "b-peer", None, &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotOwner);
    assert!(e.to_string().contains("inst-a"), "{e}");
    // Overwriting a peer of A is refused too, and A's record is untouched.
    let e = b.upsert_peer("room", "a-peer", None, &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotOwner);
    assert_eq!(
        hgetall(&s, &ks.peer("room", "a-peer"))["instance"],
        "inst-a"
    );
    // A room nobody pinned: refused too, and nothing of it is written.
    let e = b
        .upsert_peer("free-room", "b-peer", Some("b-guest"), &[])
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotOwner);
    assert!(room_index(&s, "inst-b").is_empty());
    assert!(hgetall(&s, &ks.peer("room", "b-peer")).is_empty());
    assert_eq!(smembers(&s, &ks.room("room").peers), set(&["a-peer"]));
    assert!(s
        .keys(&format!("{}:room:{{free-room}}:*", ks.prefix()))
        .is_empty());
    assert_eq!(b.stats().peers, 0);
    assert_consistent(&s);
}

// Host fields are stored on the record, reserved names and oversized field lists are refused
// with InvalidArgument before anything is written, and a re-upsert replaces the old fields
// (no stale field survives). Would fail if the record were merged instead of rewritten.
#[test]
fn host_fields_are_stored_and_reserved_names_refused() {
    let s = Server::start();
    let ks = ks(STAGE);
    let a = s.node(STAGE, "inst-a");
    a.pin_room("room").unwrap();
    a.upsert_peer("room", "p", None, &[("name", "Ada"), ("role", "host")])
        .unwrap();
    a.upsert_peer("room", "p", None, &[("name", "Ada L.")])
        .unwrap();
    let rec = hgetall(&s, &ks.peer("room", "p"));
    assert_eq!(rec.get("name").map(String::as_str), Some("Ada L."));
    assert!(!rec.contains_key("role"), "stale host field kept: {rec:?}");
    for bad in ["instance", "guest", "generation", "updated_ms", ""] {
        let e = a.upsert_peer("room", "q", None, &[(bad, "x")]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad:?}");
    }
    let many: Vec<(String, String)> = (0..=MAX_PEER_FIELDS)
        .map(|i| (format!("f{i}"), "v".into()))
        .collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (&**k, &**v)).collect();
    let e = a.upsert_peer("room", "q", None, &many).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(hgetall(&s, &ks.peer("room", "q")).is_empty());
    assert_consistent(&s);
}

// Invariant 4 under a random-ish sequence: many upserts, reconnects, guest changes and removes
// (some stale) by one owner; after each step the indexes hold exactly what the records say.
#[test]
fn indexes_match_records_after_a_long_sequence() {
    let s = Server::start();
    let a = s.node(STAGE, "inst-a");
    a.pin_room("room").unwrap();
    let mut rng = fastrand::Rng::with_seed(7);
    let mut gens: BTreeMap<String, u64> = BTreeMap::new();
    for step in 0..150 {
        let peer = format!("p{}", rng.usize(0..6));
        let guest = match rng.usize(0..4) {
            0 => None,
            n => Some(format!("g{n}")),
        };
        if rng.usize(0..4) == 0 {
            let gen = gens.get(&peer).copied().unwrap_or(0);
            let stale = rng.bool();
            let removed = a
                .remove_peer(
                    "room",
                    &peer,
                    if stale { gen.saturating_sub(1) } else { gen },
                )
                .unwrap();
            if removed {
                gens.remove(&peer);
            }
        } else {
            let gen = a
                .upsert_peer(
                    "room",
                    &peer,
                    guest.as_deref(),
                    &[("step", &step.to_string())],
                )
                .unwrap();
            gens.insert(peer, gen);
        }
        if step % 10 == 9 {
            assert_consistent(&s);
        }
    }
    assert_consistent(&s);
}

// Protects remove_peer.lua's instance check (only the instance that hosts a peer removes it;
// issue 32: with that check removed, every test of `peers::` and `regress_races::` passed). The
// room's owner A hosts a peer; B, another live instance of the fleet, removes it with the right
// generation: `Error::NotPeerOwner` naming A (kind `NotOwner`, the C API's
// `SFU_ERR_NOT_OWNER`), and A's record, the room's peer set, the guest pointer and state and
// both room indexes are exactly as before. A's own remove then works: the guard refused B only.
#[test]
fn remove_of_another_instances_peer_is_refused_and_touches_nothing() {
    let s = Server::start();
    let ks = ks(STAGE);
    let a = s.node(STAGE, "host-a");
    let b = s.node(STAGE, "host-b");
    a.pin_room("shared").unwrap();
    let generation = a
        .upsert_peer("shared", "pa", Some("ga"), &[("k", "v")])
        .unwrap();
    let rk = ks.room("shared");
    let _: () = redis::cmd("HSET")
        .arg(&rk.guest_state)
        .arg("ga")
        .arg("speaking")
        .query(&mut s.con())
        .unwrap();
    let before = room_view(&s, STAGE, &["shared"], &["host-a", "host-b"]);
    assert!(
        before.contains_key(&ks.peer("shared", "pa")),
        "fabricated: {before:#?}"
    );

    let err = b
        .remove_peer("shared", "pa", generation)
        .expect_err("another instance's peer");
    assert_eq!(err.kind(), ErrorKind::NotOwner, "{err}");
    assert!(
        matches!(&err, sfu_redis::Error::NotPeerOwner { owner, .. } if owner == "host-a"),
        "{err:?}"
    );
    assert_eq!(
        room_view(&s, STAGE, &["shared"], &["host-a", "host-b"]),
        before
    );
    assert_consistent(&s);

    assert!(a.remove_peer("shared", "pa", generation).unwrap());
    assert!(hgetall(&s, &ks.peer("shared", "pa")).is_empty());
    assert!(smembers(&s, &rk.peers).is_empty());
    assert!(hgetall(&s, &rk.guests).is_empty());
    assert_eq!(room_index(&s, "host-a"), set(&["shared"]));
    assert!(room_index(&s, "host-b").is_empty());
    assert_consistent(&s);
}

// Protects remove_peer.lua's guest-pointer guard (a remove drops the guest pointer only while it
// still names the removed peer; issue 32: removing the guard survived the suite). Two records
// name one guest while the pointer names the second (no sequence of library calls leaves this;
// bad data or a hand edit can, and it is written here directly). Removing the older record
// keeps the pointer and the guest's state, which belong to the newer connection.
#[test]
fn remove_keeps_a_guest_pointer_that_names_another_peer() {
    let s = Server::start();
    let ks = ks(STAGE);
    let a = s.node(STAGE, "inst-a");
    a.pin_room("room").unwrap();
    let rk = ks.room("room");
    let old = a
        .upsert_peer("room", "old-conn", Some("dave"), &[])
        .unwrap();
    a.upsert_peer("room", "new-conn", Some("erin"), &[])
        .unwrap();
    // new-conn becomes dave's current connection; old-conn's record still names dave.
    let _: () = redis::pipe()
        .atomic()
        .hset(ks.peer("room", "new-conn"), "guest", "dave")
        .ignore()
        .hdel(&rk.guests, "erin")
        .ignore()
        .hset(&rk.guests, "dave", "new-conn")
        .ignore()
        .hset(&rk.guest_state, "dave", "publishing")
        .ignore()
        .query(&mut s.con())
        .unwrap();
    assert_eq!(hgetall(&s, &ks.peer("room", "old-conn"))["guest"], "dave");

    assert!(a.remove_peer("room", "old-conn", old).unwrap());
    assert!(hgetall(&s, &ks.peer("room", "old-conn")).is_empty());
    assert_eq!(hgetall(&s, &rk.guests), map(&[("dave", "new-conn")]));
    assert_eq!(hgetall(&s, &rk.guest_state), map(&[("dave", "publishing")]));
    assert_eq!(smembers(&s, &rk.peers), set(&["new-conn"]));
    assert_consistent(&s);
}

// Protects upsert_peer.lua's guard on the old guest's pointer (step 1 drops it only while it
// still names this peer; issue 32: dropping the condition survived the suite). A record names
// guest "bob" while bob's pointer names another connection (no sequence of library calls leaves
// this; bad data or a hand edit can, written here directly); the record changes guest: bob's
// pointer and state, which belong to the other connection, stay.
#[test]
fn a_guest_change_keeps_the_old_guests_pointer_to_another_peer() {
    let s = Server::start();
    let ks = ks(STAGE);
    let a = s.node(STAGE, "inst-a");
    a.pin_room("room").unwrap();
    let rk = ks.room("room");
    a.upsert_peer("room", "first", Some("bob"), &[]).unwrap();
    a.upsert_peer("room", "second", Some("zed"), &[]).unwrap();
    let _: () = redis::pipe()
        .atomic()
        .hset(ks.peer("room", "second"), "guest", "bob")
        .ignore()
        .hdel(&rk.guests, "zed")
        .ignore()
        .hset(&rk.guests, "bob", "second")
        .ignore()
        .hset(&rk.guest_state, "bob", "publishing")
        .ignore()
        .query(&mut s.con())
        .unwrap();
    assert_eq!(hgetall(&s, &ks.peer("room", "first"))["guest"], "bob");

    a.upsert_peer("room", "first", Some("carol"), &[]).unwrap();
    assert_eq!(
        hgetall(&s, &rk.guests),
        map(&[("bob", "second"), ("carol", "first")])
    );
    assert_eq!(hgetall(&s, &rk.guest_state), map(&[("bob", "publishing")]));
}
