//! The reaper on a real redis-server: a crashed instance leaves nothing behind, the two-phase
//! re-check spares an instance that only missed heartbeats, the owner CAS keeps rooms another
//! instance took over, expired pins are still reaped, and a leader never reaps itself.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sfu_redis::keys::IdKind;
use sfu_redis::status::InstanceState;
use sfu_redis::{Event, PinOutcome, Timings};
use support::*;

const STAGE: &str = "t";

fn view(s: &Server, rooms: &[&str], instances: &[&str]) -> BTreeMap<String, Val> {
    room_view(s, STAGE, rooms, instances)
}

fn zscore(s: &Server, instance: &str) -> Option<i64> {
    redis::cmd("ZSCORE")
        .arg(ks(STAGE).heartbeats())
        .arg(wire(IdKind::Instance, instance))
        .query(&mut s.con())
        .unwrap()
}

fn exists(s: &Server, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query(&mut s.con()).unwrap()
}

// Protects invariant 2 (a dead instance leaves nothing behind) end to end: a node with rooms,
// peers, guests and guest states is killed (no cleanup); the leader reaps it and afterwards no
// key, set member, hash field or sorted-set entry names it, its rooms or its peers, while the
// leader's own room is untouched. Fails if any reap step (rooms, peers, guest pointers, either
// index, the heartbeat entry) were skipped, or if the reap touched the live leader's data.
#[test]
fn crashed_instance_is_fully_reaped() {
    let s = Server::start();
    let ks = ks(STAGE);
    let (leader, mut log) = s.leader(STAGE, "keeper", Timings::fast());
    assert_eq!(leader.pin_room("keeper-room").unwrap(), PinOutcome::Pinned);
    leader
        .upsert_peer("keeper-room", "keeper-peer", Some("keeper-guest"), &[])
        .unwrap();
    let keeper_before = view(&s, &["keeper-room"], &["keeper"]);

    let victim = s.node(STAGE, "victim-x");
    for room in ["vroom-1", "vroom-2"] {
        assert_eq!(victim.pin_room(room).unwrap(), PinOutcome::Pinned);
    }
    victim
        .upsert_peer("vroom-1", "vpeer-1", Some("vguest-1"), &[("name", "Ada")])
        .unwrap();
    victim
        .upsert_peer("vroom-1", "vpeer-2", None, &[("name", "Bob")])
        .unwrap();
    victim
        .upsert_peer("vroom-2", "vpeer-3", Some("vguest-3"), &[])
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(ks.room("vroom-1").guest_state)
        .arg("vguest-1")
        .arg("speaking")
        .query(&mut s.con())
        .unwrap();
    assert!(s.index_problems(&ks).is_empty());

    victim.simulate_crash();
    let e = log.wait(LONG, "victim reaped", |e| reaped(e, "victim-x"));
    assert_eq!(
        e,
        Event::InstanceReaped {
            dead: "victim-x".into(),
            rooms: 2,
            peers: 3,
            skipped_rooms: 0,
            forced: false
        }
    );

    let dump = s.dump("*");
    let needles: Vec<String> = [
        "victim-x", "vroom-1", "vroom-2", "vpeer-1", "vpeer-2", "vpeer-3", "vguest-1", "vguest-3",
    ]
    .iter()
    .map(|n| n.to_string())
    .collect();
    let left = references(&dump, &needles);
    assert!(left.is_empty(), "leftovers of the dead instance: {left:#?}");
    assert_eq!(view(&s, &["keeper-room"], &["keeper"]), keeper_before);
    assert!(s.index_problems(&ks).is_empty());
    let st = leader.stats();
    assert_eq!(
        (st.instances_reaped, st.rooms_reaped, st.peers_reaped),
        (1, 2, 3)
    );
    assert!(log.drain().iter().all(
        |e| !matches!(e, Event::Candidates { instances } if instances.iter().any(|i| i == "keeper"))
    ));
}

// Protects the two-phase re-check (pitfall "removing the two-phase re-check reaps instances
// that only missed a heartbeat in a network spike"). A live instance V, heartbeating every
// 400 ms, is made to look dead right after one of its beats (heartbeat key deleted, score an
// hour... a minute old) and the leader's phase one lists it as a candidate; V heartbeats again
// long before the leader's 3 s two-phase delay is over, so the re-check must spare it. Without
// the re-check (reaping what phase one found) V, listed while it looked dead, would be reaped:
// an `instance_reaped` for V and its rooms gone. Contrast: a really dead instance listed in the
// same round (a "sentinel" written after V in server-time order, so its reap also proves that
// V's re-check is over) is reaped completely.
#[test]
fn two_phase_recheck_spares_an_instance_that_came_back() {
    let s = Server::start();
    let ks = ks(STAGE);
    let mut lt = Timings::fast();
    lt.stale_threshold = Duration::from_millis(1500);
    lt.two_phase_delay = Duration::from_secs(3);
    lt.validate().unwrap();
    let (leader, mut log) = s.leader(STAGE, "leader", lt);

    // V beats every 400 ms: never stale (1.5 s) on its own.
    let mut vt = Timings::from_heartbeat(Duration::from_millis(400), Duration::from_millis(1200));
    vt.command_timeout = Duration::from_millis(400);
    let v = s.node_with(STAGE, "victim", vt);
    let mut vlog = EventLog::new(&v);
    v.pin_room("v-room").unwrap();
    v.upsert_peer("v-room", "v-peer-1", Some("v-guest"), &[("k", "1")])
        .unwrap();
    v.upsert_peer("v-room", "v-peer-2", None, &[("k", "2")])
        .unwrap();
    let before = view(&s, &["v-room"], &["victim"]);
    let hb_v = ks.heartbeat("victim");

    let mut proven = false;
    for attempt in 0..6 {
        // Right after one of V's beats, so V stays "dead" for most of a 400 ms interval while
        // the leader runs a round every 300 ms.
        wait_for(LONG, "a fresh heartbeat of V", || {
            let pttl: i64 = redis::cmd("PTTL").arg(&hb_v).query(&mut s.con()).unwrap();
            (pttl > 1100).then_some(())
        });
        let now = s.server_ms();
        let sentinel = format!("sentinel-{attempt}");
        let sroom = format!("sentinel-room-{attempt}");
        s.fabricate_dead(
            &ks,
            &sentinel,
            now - 50_000,
            Some(60_000),
            &[(&sroom, &[("sentinel-peer", Some("sentinel-guest"))])],
        );
        s.make_stale(&ks, "victim", now - 60_000);
        let e = log.wait(LONG, "candidates listing the sentinel", |e| {
            candidates_with(e, &sentinel)
        });
        let listed_v = candidates_with(&e, "victim");
        // The really dead one is reaped; V, ordered first in the same list, was re-checked.
        log.wait(LONG, "sentinel reaped", |e| reaped(e, &sentinel));
        let left = references(&s.dump("*"), &[sentinel.clone(), sroom.clone()]);
        assert!(left.is_empty(), "sentinel not fully reaped: {left:#?}");
        if listed_v {
            proven = true;
            break;
        }
    }
    assert!(
        proven,
        "phase one never listed V while it looked dead (machine too slow?)"
    );

    let events = log.drain().to_vec();
    assert!(
        !events.iter().any(|e| reaped(e, "victim")),
        "V was reaped although it heartbeated again within the two-phase delay: {events:?}"
    );
    assert!(!events.iter().any(|e| candidates_with(e, "leader")));
    assert!(exists(&s, &hb_v), "V's heartbeat key is back");
    assert!(zscore(&s, "victim").unwrap() > 0);
    assert_eq!(v.room_owner("v-room").unwrap().as_deref(), Some("victim"));
    assert_eq!(view(&s, &["v-room"], &["victim"]), before);
    let vevents = vlog.drain();
    assert!(
        !vevents
            .iter()
            .any(|e| matches!(e, Event::ReapedSelf { .. } | Event::RoomLost { .. })),
        "{vevents:?}"
    );
    assert_eq!(leader.stats().instances_reaped as usize, {
        events
            .iter()
            .filter(|e| matches!(e, Event::InstanceReaped { .. }))
            .count()
    });
}

// Protects the owner CAS of the reap (pitfall "without the owner check, the reaper deletes
// rooms another instance already took over"). A room of a crashed instance D is taken over by
// a live instance H (`pin_room` after D's heartbeat key is gone -> `TookOver`), which re-homes
// one of D's guests and adds a peer of its own. The reap must delete D's other room whole, and
// in the taken-over room only D's own leftover peer (and its guest pointer and state), keeping
// H's pin, metadata, peers, guest pointer and index entries. Without the owner CAS the reap
// would delete the whole taken-over room: `rooms: 2, skipped_rooms: 0` and H's keys gone.
#[test]
fn owner_cas_keeps_a_room_taken_over_by_a_live_instance() {
    let s = Server::start();
    let ks = ks(STAGE);
    let (leader, mut log) = s.leader(STAGE, "leader", Timings::fast());
    let d = s.node(STAGE, "doomed");
    let h = s.node(STAGE, "heir");
    let mut hlog = EventLog::new(&h);
    assert_eq!(d.pin_room("shared-room").unwrap(), PinOutcome::Pinned);
    assert_eq!(d.pin_room("doomed-room").unwrap(), PinOutcome::Pinned);
    d.upsert_peer("shared-room", "d-peer-1", Some("guest-1"), &[("f", "d1")])
        .unwrap();
    d.upsert_peer("shared-room", "d-peer-2", Some("guest-2"), &[("f", "d2")])
        .unwrap();
    d.upsert_peer("doomed-room", "d-peer-3", Some("guest-3"), &[("f", "d3")])
        .unwrap();
    let mut con = s.con();
    for g in ["guest-1", "guest-2"] {
        let _: () = redis::cmd("HSET")
            .arg(ks.room("shared-room").guest_state)
            .arg(g)
            .arg("joined")
            .query(&mut con)
            .unwrap();
    }
    // A live owner's room cannot be taken.
    assert_eq!(
        h.pin_room("shared-room").unwrap(),
        PinOutcome::Held {
            owner: "doomed".into()
        }
    );

    d.simulate_crash();
    let _: () = redis::cmd("DEL")
        .arg(ks.heartbeat("doomed"))
        .query(&mut con)
        .unwrap();
    assert_eq!(
        h.pin_room("shared-room").unwrap(),
        PinOutcome::TookOver {
            previous: "doomed".into()
        }
    );
    h.upsert_peer("shared-room", "h-peer-1", Some("guest-1"), &[("f", "h1")])
        .unwrap();
    h.upsert_peer("shared-room", "h-peer-2", None, &[("f", "h2")])
        .unwrap();

    let e = log.wait(LONG, "doomed reaped", |e| reaped(e, "doomed"));
    assert_eq!(
        e,
        Event::InstanceReaped {
            dead: "doomed".into(),
            rooms: 1,
            peers: 2,
            skipped_rooms: 1,
            forced: false
        }
    );

    let rk = ks.room("shared-room");
    let get = |k: &str| -> Option<String> { redis::cmd("GET").arg(k).query(&mut s.con()).unwrap() };
    let hget = |k: &str, f: &str| -> Option<String> {
        redis::cmd("HGET")
            .arg(k)
            .arg(f)
            .query(&mut s.con())
            .unwrap()
    };
    let smembers = |k: &str| -> BTreeSet<String> {
        redis::cmd("SMEMBERS").arg(k).query(&mut s.con()).unwrap()
    };
    let hkeys =
        |k: &str| -> BTreeSet<String> { redis::cmd("HKEYS").arg(k).query(&mut s.con()).unwrap() };
    assert_eq!(get(&rk.owner).as_deref(), Some("heir"));
    assert_eq!(hget(&rk.meta, "owner").as_deref(), Some("heir"));
    assert_eq!(
        smembers(&rk.peers),
        BTreeSet::from(["h-peer-1".to_owned(), "h-peer-2".to_owned()])
    );
    assert_eq!(hget(&rk.guests, "guest-1").as_deref(), Some("h-peer-1"));
    assert_eq!(hkeys(&rk.guests), BTreeSet::from(["guest-1".to_owned()]));
    assert_eq!(
        hkeys(&rk.guest_state),
        BTreeSet::from(["guest-1".to_owned()])
    );
    for (p, f) in [("h-peer-1", "h1"), ("h-peer-2", "h2")] {
        let rec = ks.peer("shared-room", p);
        assert_eq!(hget(&rec, "instance").as_deref(), Some("heir"));
        assert_eq!(hget(&rec, "f").as_deref(), Some(f));
    }
    assert_eq!(
        smembers(&ks.instance_peers("heir")),
        BTreeSet::from([
            "shared-room/h-peer-1".to_owned(),
            "shared-room/h-peer-2".to_owned()
        ])
    );
    assert!(smembers(&ks.instance_rooms("heir")).contains("shared-room"));
    let left = references(
        &s.dump("*"),
        &[
            "doomed".into(),
            "d-peer-".into(),
            "guest-2".into(),
            "guest-3".into(),
        ],
    );
    assert!(left.is_empty(), "leftovers of the dead instance: {left:#?}");
    assert!(
        s.index_problems(&ks).is_empty(),
        "{:#?}",
        s.index_problems(&ks)
    );
    assert_eq!(
        h.room_owner("shared-room").unwrap().as_deref(),
        Some("heir")
    );
    assert!(!hlog
        .drain()
        .iter()
        .any(|e| matches!(e, Event::RoomLost { .. } | Event::ReapedSelf { .. })));
    let st = leader.stats();
    assert_eq!(
        (st.instances_reaped, st.rooms_reaped, st.peers_reaped),
        (1, 1, 2)
    );
}

// Protects invariant 2 "whatever the timing ratios": with pin_ttl (300 ms) much shorter than
// stale_threshold + two_phase_delay (2.1 s), a dead instance's pins have all expired before the
// reap runs; its rooms (metadata naming it, peers, guests, states) are still its leftovers and
// must go. Without the "expired pin + metadata names the dead instance" rule in reap_room.lua
// the rooms' metadata, peer sets and guest hashes would remain, found by the key dump.
#[test]
fn dead_instance_whose_pins_expired_is_still_fully_reaped() {
    let s = Server::start();
    let ks = ks(STAGE);
    let mut t = Timings::fast();
    t.pin_ttl = Duration::from_millis(300);
    t.validate().unwrap();
    assert!(t.pin_ttl < t.stale_threshold + t.two_phase_delay);
    let (_leader, mut log) = s.leader(STAGE, "leader", t);
    let d = s.node_with(STAGE, "gone-x", t);
    let rooms = ["xroom-1", "xroom-2", "xroom-3"];
    for (n, room) in rooms.iter().enumerate() {
        d.pin_room(room).unwrap();
        d.upsert_peer(
            room,
            &format!("xpeer-{n}-a"),
            Some(&format!("xguest-{n}")),
            &[],
        )
        .unwrap();
        d.upsert_peer(room, &format!("xpeer-{n}-b"), None, &[("k", "v")])
            .unwrap();
        let _: () = redis::cmd("HSET")
            .arg(ks.room(room).guest_state)
            .arg(format!("xguest-{n}"))
            .arg("joined")
            .query(&mut s.con())
            .unwrap();
    }
    d.simulate_crash();
    wait_for(LONG, "every pin of the dead instance expired", || {
        rooms
            .iter()
            .all(|r| !exists(&s, &ks.room(r).owner))
            .then_some(())
    });
    assert!(
        !log.drain().iter().any(|e| reaped(e, "gone-x")),
        "the pins must expire before the reap for this test to mean anything"
    );
    let e = log.wait(LONG, "gone-x reaped", |e| reaped(e, "gone-x"));
    assert_eq!(
        e,
        Event::InstanceReaped {
            dead: "gone-x".into(),
            rooms: 3,
            peers: 6,
            skipped_rooms: 0,
            forced: false
        }
    );
    let left = references(
        &s.dump("*"),
        &[
            "gone-x".into(),
            "xroom-".into(),
            "xpeer-".into(),
            "xguest-".into(),
        ],
    );
    assert!(left.is_empty(), "leftovers of the dead instance: {left:#?}");
}

// Protects invariant 2 and invariant 4 for the reap's `solo` shortcut (pin_room.lua,
// reap_room.lua): a room pinned while it already held a record of another instance ("other",
// with its index entry) is deleted whole when its owner dies, and the other instance's index
// entry for that record goes with it. A room pinned empty is marked solo and reaped without
// reading each record. Fails if pin_room marked every room solo (the other instance's index
// entry would be left pointing at a deleted record) or if the reap ignored the mark's owner.
#[test]
fn whole_room_reap_removes_other_instances_index_entries() {
    let s = Server::start();
    let ks = ks(STAGE);
    let (_leader, mut log) = s.leader(STAGE, "leader", Timings::fast());
    let d = s.node(STAGE, "solo-d");
    // "other" left a record in mixed-room (say it owned the room before and its pin lapsed).
    let other = wire(IdKind::Instance, "other");
    let mixed = ks.room("mixed-room");
    let _: () = redis::pipe()
        .sadd(ks.instance_peers(&other), "mixed-room/o-peer")
        .ignore()
        .hset_multiple(
            ks.peer("mixed-room", "o-peer"),
            &[
                ("instance", other.as_str()),
                ("guest", ""),
                ("generation", "1"),
                ("updated_ms", "1"),
            ],
        )
        .ignore()
        .sadd(&mixed.peers, "o-peer")
        .ignore()
        .query(&mut s.con())
        .unwrap();
    assert_eq!(d.pin_room("mixed-room").unwrap(), PinOutcome::Pinned);
    assert_eq!(d.pin_room("empty-room").unwrap(), PinOutcome::Pinned);
    let solo = |room: &str| -> Option<String> {
        redis::cmd("HGET")
            .arg(ks.room(room).meta)
            .arg("solo")
            .query(&mut s.con())
            .unwrap()
    };
    assert_eq!(
        solo("mixed-room"),
        None,
        "a room holding another's record is not solo"
    );
    assert_eq!(solo("empty-room").as_deref(), Some("solo-d"));
    d.upsert_peer("mixed-room", "d-peer-1", None, &[]).unwrap();
    d.upsert_peer("empty-room", "d-peer-2", Some("d-guest"), &[])
        .unwrap();
    d.simulate_crash();
    let e = log.wait(LONG, "solo-d reaped", |e| reaped(e, "solo-d"));
    assert_eq!(
        e,
        Event::InstanceReaped {
            dead: "solo-d".into(),
            rooms: 2,
            peers: 3,
            skipped_rooms: 0,
            forced: false
        }
    );
    let left = references(
        &s.dump("*"),
        &[
            "solo-d".into(),
            "mixed-room".into(),
            "empty-room".into(),
            "o-peer".into(),
            "d-peer".into(),
            "d-guest".into(),
        ],
    );
    assert!(left.is_empty(), "left behind: {left:#?}");
    assert!(
        s.index_problems(&ks).is_empty(),
        "{:#?}",
        s.index_problems(&ks)
    );
}

// Protects "an instance never reaps itself". The leader's own heartbeat key is deleted and its
// score set a minute into the past over and over (every few ms) for a whole round, including
// its two-phase re-check, while a really dead instance makes the round happen. The leader must
// never list itself as a candidate, never re-check or reap itself, and keep its room and peer.
// Without the self-exclusion the re-check would find it "dead" (no heartbeat key, stale score)
// and reap it: `instance_reaped` for the leader, its room deleted, then `reaped_self`.
#[test]
fn leader_never_reaps_itself() {
    let s = Server::start();
    let ks = ks(STAGE);
    let (leader, mut log) = s.leader(STAGE, "self-leader", Timings::fast());
    leader.pin_room("own-room").unwrap();
    leader
        .upsert_peer("own-room", "own-peer", Some("own-guest"), &[])
        .unwrap();
    let before = view(&s, &["own-room"], &["self-leader"]);

    let now = s.server_ms();
    let stop = Arc::new(AtomicBool::new(false));
    let saboteur = {
        let stop = Arc::clone(&stop);
        let url = s.url();
        let ks = ks.clone();
        std::thread::spawn(move || {
            let mut con = support::con_to(&url);
            while !stop.load(Ordering::Relaxed) {
                let _: () = redis::pipe()
                    .atomic()
                    .del(ks.heartbeat("self-leader"))
                    .ignore()
                    .cmd("ZADD")
                    .arg(ks.heartbeats())
                    .arg("XX")
                    .arg(now - 60_000)
                    .arg("self-leader")
                    .ignore()
                    .query(&mut con)
                    .unwrap();
                std::thread::sleep(Duration::from_millis(3));
            }
        })
    };
    s.fabricate_dead(
        &ks,
        "really-dead",
        now - 50_000,
        None,
        &[("dead-room", &[("dead-peer", None)])],
    );
    log.wait(LONG, "really-dead reaped", |e| reaped(e, "really-dead"));
    stop.store(true, Ordering::Relaxed);
    saboteur.join().unwrap();

    let events = log.drain().to_vec();
    assert!(
        events.iter().any(|e| candidates_with(e, "really-dead")),
        "{events:?}"
    );
    assert!(
        !events.iter().any(|e| candidates_with(e, "self-leader")
            || reaped(e, "self-leader")
            || matches!(e, Event::ReapedSelf { .. } | Event::RoomLost { .. })),
        "the leader listed or reaped itself: {events:?}"
    );
    wait_for(LONG, "the leader's heartbeat key is back", || {
        exists(&s, &ks.heartbeat("self-leader")).then_some(())
    });
    assert!(zscore(&s, "self-leader").unwrap() > now);
    assert_eq!(view(&s, &["own-room"], &["self-leader"]), before);
    assert_eq!(
        leader.room_owner("own-room").unwrap().as_deref(),
        Some("self-leader")
    );
    assert_eq!((leader.stats().rooms, leader.stats().peers), (1, 1));
    assert!(leader.is_leader());
}

// Protects invariant 1 and "status and reaper agree" in a fleet with mixed timings (issue 26).
// Three real nodes with different timings: the leader (stale threshold 6 s), "mixed-short"
// (fast timings: 0.9 s) and "mixed-long" (9 s); the two others crash at the same moment. Each
// instance must be judged with its own record's threshold, as `status` judges it:
// - every `candidates` event lists only instances `status` (read right after) calls stale,
//   so mixed-long is never listed while it is only late (old code: listed at the leader's 6 s);
// - mixed-short is reaped in line with its own 0.9 s, well before the leader's 6 s (old code:
//   listed only once the leader's 6 s had passed);
// - mixed-long is never reaped before its own 9 s of silence, and its room stays until then.
#[test]
fn a_mixed_timings_fleet_is_reaped_by_each_instances_own_threshold() {
    let s = Server::start();
    let ks = ks(STAGE);
    let ms = Duration::from_millis;
    let timings = |interval: u64, ttl: u64| {
        let mut t = Timings::from_heartbeat(ms(interval), ms(ttl));
        t.command_timeout = ms(400);
        t
    };
    // Short two-phase delay and reap interval: the listing is what differs.
    let mut leader_t = timings(400, 4000);
    leader_t.two_phase_delay = ms(1000);
    leader_t.reap_interval = ms(300);
    // A lease granted soon after the dataset token is written (a lease TTL after it).
    leader_t.lease_ttl = ms(3000);
    leader_t.lease_refresh = ms(1000);
    let long_t = timings(500, 6000);
    let short_t = Timings::fast();
    assert_eq!(leader_t.stale_threshold, ms(6000));
    assert_eq!(long_t.stale_threshold, ms(9000));
    assert_eq!(short_t.stale_threshold, ms(900));

    let (leader, mut log) = s.leader(STAGE, "mixed-leader", leader_t);
    let short = s.node_with(STAGE, "mixed-short", short_t);
    let long = s.node_with(STAGE, "mixed-long", long_t);
    for (node, room) in [(&short, "short-room"), (&long, "long-room")] {
        assert_eq!(node.pin_room(room).unwrap(), PinOutcome::Pinned);
        node.upsert_peer(room, &format!("{room}-peer"), None, &[])
            .unwrap();
    }
    let status_config = s.config_with(STAGE, "mixed-reader", leader_t);
    let status = || sfu_redis::status::fleet_status(&status_config).expect("fleet status");
    // Both judged with their own records from the start.
    let st = status();
    for (id, own) in [("mixed-short", 900), ("mixed-long", 9000)] {
        let i = st.instances.iter().find(|i| i.id == id).expect(id);
        assert_eq!(
            (i.stale_threshold_ms, i.stale_threshold_from),
            (own, "record")
        );
    }

    short.simulate_crash();
    long.simulate_crash();
    let mark = log.mark();
    // The last heartbeat (server ms) of each, read while it is registered; the silence at its
    // reap is measured from it.
    let mut last: BTreeMap<&str, i64> = BTreeMap::new();
    let mut reaped_at: BTreeMap<String, i64> = BTreeMap::new();
    let deadline = std::time::Instant::now() + LONG;
    while reaped_at.len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "not both reaped within {LONG:?}: {:?}",
            log.since(mark)
        );
        for id in ["mixed-short", "mixed-long"] {
            if let Some(score) = zscore(&s, id).filter(|s| *s > 0) {
                last.insert(id, score);
            }
        }
        let quiet = s.server_ms() - last["mixed-long"];
        if quiet < 8500 {
            assert!(
                exists(&s, &ks.room("long-room").meta),
                "mixed-long's room went after {quiet} ms of silence, before its own 9 s"
            );
        }
        let Some(e) = log.try_wait(ms(100), |_| true) else {
            continue;
        };
        match e {
            Event::Candidates { instances } => {
                // Listed => stale by `status` (its own record's threshold), being reaped or
                // gone (reaped meanwhile): never only late.
                let st = status();
                for id in instances.iter().filter(|i| i.starts_with("mixed-")) {
                    if let Some(i) = st.instances.iter().find(|i| &i.id == id) {
                        assert!(
                            matches!(i.state, InstanceState::Stale | InstanceState::BeingReaped),
                            "the leader listed {id}, which status calls {} ({} ms of silence, own threshold {} ms)",
                            i.state,
                            i.age_ms,
                            i.stale_threshold_ms
                        );
                    }
                }
            }
            Event::InstanceReaped { dead, .. } if dead.starts_with("mixed-") => {
                reaped_at.insert(dead, s.server_ms());
            }
            _ => {}
        }
    }
    let short_after = reaped_at["mixed-short"] - last["mixed-short"];
    let long_after = reaped_at["mixed-long"] - last["mixed-long"];
    eprintln!("silence at reap: mixed-short {short_after} ms (own threshold 900 ms), mixed-long {long_after} ms (own 9000 ms); the leader's threshold 6000 ms");
    assert!(
        (900..6000).contains(&short_after),
        "mixed-short reaped after {short_after} ms of silence: its own threshold is 0.9 s, the leader's 6 s"
    );
    assert!(
        long_after >= 9000,
        "mixed-long reaped after {long_after} ms"
    );
    assert!(!exists(&s, &ks.room("short-room").meta));
    assert!(!exists(&s, &ks.room("long-room").meta));
    assert!(leader.is_leader());
}
