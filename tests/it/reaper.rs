//! The reaper on a real redis-server: a crashed instance leaves nothing behind, the two-phase
//! re-check spares an instance that only missed heartbeats, the owner CAS keeps rooms another
//! instance took over, expired pins are still reaped, and a leader never reaps itself.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sfu_redis::keys::IdKind;
use sfu_redis::ops::status::InstanceState;
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

fn sismember(s: &Server, key: &str, member: &str) -> bool {
    redis::cmd("SISMEMBER")
        .arg(key)
        .arg(member)
        .query(&mut s.con())
        .unwrap()
}

// Protects invariant 2 (a dead instance leaves nothing behind) end to end: a node with rooms,
// peers, guests and guest states is killed (no cleanup); the leader reaps it and afterwards no
// key, set member, hash field or sorted-set entry names it, its rooms or its peers, while the
// leader's own room is untouched. Fails if any reap step (rooms, peer records, guest pointers,
// the room index, the heartbeat entry) were skipped, or if the reap touched the live leader's
// data.
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
// one of D's guests and adds a peer of its own. The taken-over room stays in D's room index (D's
// record there is reached through it, key schema version 2). The reap must delete D's other
// room whole, and in the taken-over room only D's own leftover peer (and its guest pointer and
// state), keeping H's pin, metadata, peers, guest pointer and room index entry: afterwards no
// record names D anywhere. Without the owner CAS the reap would delete the whole taken-over
// room: `rooms: 2, skipped_rooms: 0` and H's keys gone; without the per-record instance check
// it would delete H's records too.
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
    // D's record left in the taken-over room is reached through D's room index (or the one
    // a reap under way moved aside; read in this order, a record still there was reachable).
    let indexed = [
        ks.instance_rooms("doomed"),
        ks.instance_reaping_rooms("doomed"),
    ]
    .iter()
    .any(|k| sismember(&s, k, "shared-room"));
    assert!(
        indexed || !exists(&s, &ks.peer("shared-room", "d-peer-2")),
        "D's record in the taken-over room is reached by no index of D"
    );

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
        smembers(&ks.instance_rooms("heir")),
        BTreeSet::from(["shared-room".to_owned()])
    );
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
    let status = || sfu_redis::ops::status::fleet_status(&status_config).expect("fleet status");
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

// Protects each of reap_begin.lua's two re-checks on its own (issue 32: with only the key check
// removed, every other reaper test passed, since they restore the key and the score together).
// An instance whose sorted-set score is ten minutes stale but whose heartbeat key is live (a
// running process whose score is behind: a restore, a lost write) and which has no instance
// record to judge it by is not reaped: the re-check answers "alive" and nothing of it changes,
// not even its score. Then the key goes but the score is fresh: alive again. Then both say
// dead and the same instance is reaped: the scenario can fail.
#[test]
fn a_live_heartbeat_key_or_a_fresh_score_alone_spares_an_instance() {
    let s = Server::start();
    let ks = ks(STAGE);
    let (leader, _log) = s.leader(STAGE, "keyed-leader", Timings::fast());
    let now = s.server_ms();
    let stale = now - 600_000;
    s.fabricate_dead(
        &ks,
        "keyed",
        stale,
        Some(60_000),
        &[("keyed-room", &[("keyed-peer", Some("keyed-guest"))])],
    );
    let w = wire(IdKind::Instance, "keyed");
    let _: () = redis::cmd("SET")
        .arg(ks.heartbeat(&w))
        .arg("boot-token-of-a-running-process")
        .arg("PX")
        .arg(120_000)
        .query(&mut s.con())
        .unwrap();
    assert!(!exists(&s, &ks.instance_info(&w)), "no instance record");
    let before = view(&s, &["keyed-room"], &["keyed"]);
    assert!(before.len() >= 4, "fabricated: {before:#?}");

    assert_eq!(leader.reap_now("keyed").expect("reap_now"), None);
    assert_eq!(view(&s, &["keyed-room"], &["keyed"]), before);
    assert_eq!(zscore(&s, "keyed"), Some(stale), "score untouched");

    // The score alone: no key, but a score within the stale threshold (the key expired by its
    // TTL while the instance was judged, a heartbeat landed between the phases): alive too.
    s.make_stale(&ks, "keyed", s.server_ms());
    let fresh = zscore(&s, "keyed");
    assert_eq!(leader.reap_now("keyed").expect("reap_now"), None);
    assert_eq!(view(&s, &["keyed-room"], &["keyed"]), before);
    assert_eq!(zscore(&s, "keyed"), fresh, "score untouched");

    // Control: without the key, the same instance is dead (reap_now or the reaper thread).
    s.make_stale(&ks, "keyed", stale);
    let out = leader.reap_now("keyed").expect("reap_now");
    if let Some(c) = out {
        assert_eq!((c.rooms, c.peers), (1, 1), "reap_now gave {c:?}");
    }
    wait_for(LONG, "keyed reaped", || {
        (view(&s, &["keyed-room"], &["keyed"]).is_empty() && zscore(&s, "keyed").is_none())
            .then_some(())
    });
}

// Protects reap_begin.lua's fencing (invariant 3: the lease in Redis, not the caller's belief,
// decides): a node that still believes it leads (its local deadline has not passed) while the
// lease in Redis names another holder (Redis lost the lease and another node took it) starts
// no reap: `Error::NotLeader`, and the dead instance keeps its score and its room index where it
// is (the re-check's first step would set the score to 0 and move the index aside). Issue
// 32: the per-batch leadership check caught the reap later, so no test saw the fence go.
#[test]
fn a_leader_whose_lease_another_holds_starts_no_reap() {
    let s = Server::start();
    let ks = ks(STAGE);
    let ms = Duration::from_millis;
    // The lease is refreshed every 1.5 s: the test acts right after a refresh, well before the
    // next one would show the node the foreign holder.
    let mut t = Timings::fast();
    t.lease_ttl = ms(4000);
    t.lease_refresh = ms(1500);
    t.validate().unwrap();
    let (leader, _log) = s.leader(STAGE, "fenced-leader", t);
    for attempt in 0..5 {
        wait_for(LONG, "a lease refresh", || {
            let pttl: i64 = redis::cmd("PTTL")
                .arg(ks.leader())
                .query(&mut s.con())
                .unwrap();
            (pttl > 3700).then_some(())
        });
        let _: () = redis::cmd("SET")
            .arg(ks.leader())
            .arg(wire(IdKind::Instance, "usurper"))
            .arg("KEEPTTL")
            .query(&mut s.con())
            .unwrap();
        // Written after the lease changed hands: the reaper thread cannot have started on it.
        let dead = format!("fenced-dead-{attempt}");
        let room = format!("fenced-room-{attempt}");
        let stale = s.server_ms() - 600_000;
        s.fabricate_dead(
            &ks,
            &dead,
            stale,
            None,
            &[(&room, &[("fenced-peer", None)])],
        );
        let before = view(&s, &[&room], &[&dead]);
        if !leader.is_leader() {
            continue; // demoted already (a slow moment): again in its next term
        }
        match leader.reap_now(&dead) {
            Err(sfu_redis::Error::NotLeader) => {}
            other => panic!("reap_now with another's lease gave {other:?}"),
        }
        assert_eq!(view(&s, &[&room], &[&dead]), before);
        assert_eq!(zscore(&s, &dead), Some(stale), "score untouched");
        let w = wire(IdKind::Instance, &dead);
        assert!(
            !exists(&s, &ks.instance_reaping_rooms(&w)),
            "nothing moved aside"
        );
        return;
    }
    panic!("the node never still believed it led when asked (machine too slow?)");
}

// Protects heartbeat.lua's zombie rule for a reap under way (score 0, set by reap_begin.lua):
// an instance that resumes while it is being reaped learns it was reaped (`reaped_self` with its
// rooms) instead of writing a fresh score over the 0 and going on as if alive. Here the reap
// died right after its first step (score 0, room index moved aside): no leader runs, so the
// instance's own heartbeat is all that can notice. Issue 32: with the score-0 check removed,
// the zombie tests still passed through the other path (the entry gone after a completed reap).
#[test]
fn an_instance_resuming_mid_reap_learns_it_was_reaped() {
    let s = Server::start();
    let ks = ks(STAGE);
    let z = s.node_with(STAGE, "mid-reap", Timings::fast());
    let mut zlog = EventLog::new(&z);
    for room in ["mr-room-1", "mr-room-2"] {
        assert_eq!(z.pin_room(room).unwrap(), PinOutcome::Pinned);
        z.upsert_peer(room, &format!("{room}-peer"), None, &[])
            .unwrap();
    }
    let w = wire(IdKind::Instance, "mid-reap");
    let _: () = redis::cmd("DEL")
        .arg(ks.heartbeat(&w))
        .query(&mut s.con())
        .unwrap();
    s.interrupt_reap(&ks, &w);
    let e = zlog.wait(LONG, "reaped_self", |e| {
        matches!(e, Event::ReapedSelf { .. })
    });
    let Event::ReapedSelf { rooms, .. } = e else {
        unreachable!()
    };
    assert_eq!(rooms, 2, "{e:?}");
    // Counted for the operators (`sfu_redis_reaped_self_total`, deploy/ alert).
    assert_eq!(z.stats().reaped_self, 1);
    assert!(
        z.metrics().contains("sfu_redis_reaped_self_total 1"),
        "{}",
        z.metrics()
    );
}

// Protects the reap's owner CAS and reap_room.lua's per-record instance check in a room kept,
// with reap_now (no timing): two rooms of a dead instance taken over by a live instance B, which
// then hosts a peer under the same peer id as the dead one's (its record now names B). In the
// first room the dead instance also left a record of its own ("old-peer"); in the second, B's
// re-homed peer replaced the only one. Both rooms stay in the dead instance's room index (key
// schema version 2: that is how the reap reaches the dead instance's records there). The reap
// skips both rooms (pin and metadata name B) and deletes only the record naming the dead
// instance: B's rooms, records and room index stay exactly as they were, and nothing else of
// the dead instance is left. Fails if the reap deletes a room B took over (owner CAS) or a
// record under a re-homed id (instance check), or leaves the dead instance's record behind.
#[test]
fn a_reap_keeps_a_taken_over_room_and_a_peer_re_homed_under_the_same_id() {
    let s = Server::start();
    let ks = ks(STAGE);
    let (leader, _log) = s.leader(STAGE, "rehome-leader", Timings::fast());
    let b = s.node_with(STAGE, "rehome-b", Timings::fast());
    // Stale by minutes but written now: the reaper thread may list it too, and must agree.
    let stale = s.server_ms() - 600_000;
    s.fabricate_dead(
        &ks,
        "rehome-dead",
        stale,
        None,
        &[
            (
                "rehome-taken",
                &[("shared-peer", Some("g1")), ("old-peer", None)],
            ),
            ("rehome-lost", &[("lost-peer", None)]),
            ("rehome-gone", &[("gone-peer", None)]),
        ],
    );
    let dead = wire(IdKind::Instance, "rehome-dead");
    let mut records = BTreeMap::new();
    for (room, peer) in [
        ("rehome-taken", "shared-peer"),
        ("rehome-lost", "lost-peer"),
    ] {
        match b.pin_room(room).unwrap() {
            PinOutcome::TookOver { previous } => assert_eq!(previous, "rehome-dead"),
            other => panic!("B's pin of {room} gave {other:?}"),
        }
        b.upsert_peer(room, peer, Some("g1"), &[("k", "b")])
            .unwrap();
        let key = ks.peer(room, peer);
        assert_eq!(hget(&s, &key, "instance").as_deref(), Some("rehome-b"));
        records.insert(key.clone(), s.dump(&key));
    }
    assert_eq!(
        records_naming(&s, &support::ks(STAGE), &dead),
        vec![
            ks.peer("rehome-gone", "gone-peer"),
            ks.peer("rehome-taken", "old-peer")
        ],
        "fabricated: the dead instance's records left"
    );
    let b_index = s.dump(&ks.instance_rooms("rehome-b"));
    if let Some(c) = leader.reap_now("rehome-dead").expect("reap_now") {
        assert_eq!((c.rooms, c.skipped_rooms, c.peers), (1, 2, 2), "{c:?}");
    } // None: the reaper thread reaped it first; the state below says the same
    wait_for(LONG, "rehome-dead reaped", || {
        zscore(&s, "rehome-dead").is_none().then_some(())
    });
    for (key, before) in &records {
        assert_eq!(&s.dump(key), before, "B's record {key} untouched");
    }
    for (room, peer) in [
        ("rehome-taken", "shared-peer"),
        ("rehome-lost", "lost-peer"),
    ] {
        let rk = ks.room(room);
        assert_eq!(
            redis::cmd("GET")
                .arg(&rk.owner)
                .query::<Option<String>>(&mut s.con())
                .unwrap()
                .as_deref(),
            Some("rehome-b")
        );
        let peers: BTreeSet<String> = redis::cmd("SMEMBERS")
            .arg(&rk.peers)
            .query(&mut s.con())
            .unwrap();
        assert_eq!(peers, BTreeSet::from([peer.to_string()]), "{room}");
    }
    assert_eq!(s.dump(&ks.instance_rooms("rehome-b")), b_index);
    assert!(
        !exists(&s, &ks.room("rehome-gone").meta),
        "the dead one's own room reaped"
    );
    assert_eq!(
        records_naming(&s, &support::ks(STAGE), &dead),
        Vec::<String>::new()
    );
    let left = references(&s.dump(&ks.scan_pattern()), &[dead]);
    assert!(left.is_empty(), "leftovers of the dead instance: {left:#?}");
    assert!(
        s.index_problems(&ks).is_empty(),
        "{:#?}",
        s.index_problems(&ks)
    );
}

// Protects the reap's new-life checks (issue 32: each survived the suite, whose new lives
// register first, which merges the moved index back and ends the reap before it meets their
// writes): reap_room.lua's status (`new_life`: a room pinned again after the reap began is
// kept) and its per-record check in such a room (a record of the same id written after t0 is
// kept, one written before t0 is the dead life's and goes). A slow reap (batches of 2 rooms,
// pace 10) of a dead instance's 400 rooms runs in `reap_now`; once it has moved the room index
// aside, the same instance id writes again without registering (a zombie, or a new life between
// its first write and its registration), through the data itself: ten rooms still present are
// pinned again with the server's time and one peer record of each (p1) is rewritten. The reap
// reports them `kept` and leaves exactly them, each with its rewritten p1 and without its old
// p2, back in the instance's live room index (so a later round, or the new life, reaches
// them); the rest of the instance is gone.
#[test]
fn a_reap_keeps_what_the_same_id_wrote_after_it_began() {
    let s = Server::start();
    let ks = ks(STAGE);
    let mut t = Timings::fast();
    // The reaper thread waits a minute before its re-check: only reap_now reaps here.
    t.two_phase_delay = Duration::from_secs(60);
    t.validate().unwrap();
    let config = s
        .config_with(STAGE, "slow-leader", t)
        .to_builder()
        .reap_batch(2)
        .reap_pace(10.0)
        .build()
        .unwrap();
    let leader = sfu_redis::Node::start(config).unwrap();
    wait_for(LONG, "slow-leader leads", || {
        leader.is_leader().then_some(())
    });
    let names: Vec<String> = (0..400).map(|k| format!("later{k}")).collect();
    let peers: &[(&str, Option<&str>)] = &[("p1", None), ("p2", None)];
    let fake: Vec<FakeRoom<'_>> = names.iter().map(|r| (r.as_str(), peers)).collect();
    s.fabricate_dead(&ks, "later", s.server_ms() - 600_000, None, &fake);
    let dead = wire(IdKind::Instance, "later");
    // The writes of the same id after t0: pin (server time) and one peer record (server time).
    let rewrite = redis::Script::new(
        "local t = redis.call('TIME')
         local us = t[1] .. string.format('%06d', tonumber(t[2]))
         local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
         if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
         redis.call('SET', KEYS[1], ARGV[1], 'PX', 600000)
         redis.call('HSET', KEYS[2], 'owner', ARGV[1], 'pinned_ms', ms, 'pinned_us', us)
         redis.call('HSET', KEYS[3], 'updated_ms', ms, 'updated_us', us)
         return 1",
    );
    let rewritten = std::thread::scope(|scope| {
        let reap = scope.spawn(|| leader.reap_now("later"));
        wait_for(LONG, "the room index moved aside", || {
            exists(&s, &ks.instance_reaping_rooms(&dead)).then_some(())
        });
        let mut rewritten = Vec::new();
        for room in names.iter().rev() {
            let rk = ks.room(room);
            let done: i64 = rewrite
                .key(&rk.owner)
                .key(&rk.meta)
                .key(ks.peer(room, "p1"))
                .arg(&dead)
                .invoke(&mut s.con())
                .unwrap();
            if done == 1 {
                rewritten.push(room.clone());
            }
            if rewritten.len() == 10 {
                break;
            }
        }
        let counts = reap.join().expect("reap_now thread").expect("reap_now");
        let counts = counts.expect("the dead instance was reaped");
        assert!(
            counts.kept >= 1,
            "no member kept: every rewrite came after its room was reaped? {counts:?}"
        );
        rewritten
    });
    assert!(
        !rewritten.is_empty(),
        "no room left to rewrite: the reap was too fast"
    );
    for room in &names {
        let meta = exists(&s, &ks.room(room).meta);
        if rewritten.contains(room) {
            assert!(meta, "{room}, pinned again after t0, was reaped");
            let p1 = ks.peer(room, "p1");
            assert!(exists(&s, &p1), "{room}'s rewritten peer p1 was reaped");
            let p2 = ks.peer(room, "p2");
            assert!(!exists(&s, &p2), "{room}'s p2, written before t0, stays");
            assert!(
                sismember(&s, &ks.instance_rooms(&dead), room),
                "{room}, kept, is not back in the live room index"
            );
        } else {
            assert!(!meta, "{room} of the dead life stays");
        }
    }
    let mut kept_records = records_naming(&s, &support::ks(STAGE), &dead);
    kept_records.sort();
    let mut want: Vec<String> = rewritten.iter().map(|r| ks.peer(r, "p1")).collect();
    want.sort();
    assert_eq!(
        kept_records, want,
        "the records naming the instance after the reap"
    );
}

// Protects reap_room.lua's guest-pointer guard (issue 32): in a room another instance took
// over, a dead instance's peer record goes, but the guest pointer it names goes with it only if
// the pointer still names that peer. Here the guest reconnected to the live owner (its pointer
// names the live peer) and the dead instance's record of the guest's old peer is still there (a
// write of the dead instance that landed late, written back by hand). The reap removes the dead
// record and keeps the live peer's pointer and record.
#[test]
fn a_reap_keeps_a_guest_pointer_that_names_a_live_peer() {
    let s = Server::start();
    let ks = ks(STAGE);
    let (leader, _log) = s.leader(STAGE, "guestptr-leader", Timings::fast());
    let b = s.node_with(STAGE, "guestptr-b", Timings::fast());
    let stale = s.server_ms() - 600_000;
    let (room, old_peer, new_peer) = ("guestptr-room", "old-peer", "new-peer");
    s.fabricate_dead(
        &ks,
        "guestptr-dead",
        stale,
        None,
        &[(room, &[(old_peer, Some("g1"))])],
    );
    let dead = wire(IdKind::Instance, "guestptr-dead");
    let old_key = ks.peer(room, old_peer);
    let old_record: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(&old_key)
        .query(&mut s.con())
        .unwrap();
    assert_eq!(hget(&s, &old_key, "guest").as_deref(), Some("g1"));
    match b.pin_room(room).unwrap() {
        PinOutcome::TookOver { previous } => assert_eq!(previous, "guestptr-dead"),
        other => panic!("B's pin gave {other:?}"),
    }
    // The guest reconnects to B: its pointer names the new peer, the old record is superseded.
    let up = b
        .upsert_peer_detailed(room, new_peer, Some("g1"), &[("k", "b")])
        .unwrap();
    assert_eq!(up.replaced.as_deref(), Some(old_peer));
    // The dead instance's record of the old peer, back as it was (in the room's peers set;
    // the room is still in the dead instance's room index, which reaches it).
    let _: () = redis::pipe()
        .hset_multiple(&old_key, &old_record)
        .ignore()
        .sadd(&ks.room(room).peers, old_peer)
        .ignore()
        .query(&mut s.con())
        .unwrap();
    assert!(sismember(&s, &ks.instance_rooms(&dead), room));
    let guests = ks.room(room).guests;
    assert_eq!(hget(&s, &guests, "g1").as_deref(), Some(new_peer));
    let new_key = ks.peer(room, new_peer);
    let new_record = s.dump(&new_key);
    if let Some(c) = leader.reap_now("guestptr-dead").expect("reap_now") {
        assert_eq!((c.rooms, c.skipped_rooms), (0, 1), "{c:?}");
    } // None: the reaper thread reaped it first; the state below says the same
    wait_for(LONG, "guestptr-dead reaped", || {
        zscore(&s, "guestptr-dead").is_none().then_some(())
    });
    assert!(!exists(&s, &old_key), "the dead instance's record goes");
    assert_eq!(
        hget(&s, &guests, "g1").as_deref(),
        Some(new_peer),
        "the guest's pointer to the live peer stays"
    );
    assert_eq!(
        s.dump(&new_key),
        new_record,
        "the live peer's record untouched"
    );
    assert_eq!(
        records_naming(&s, &support::ks(STAGE), &dead),
        Vec::<String>::new()
    );
    assert!(
        s.index_problems(&ks).is_empty(),
        "{:#?}",
        s.index_problems(&ks)
    );
}
