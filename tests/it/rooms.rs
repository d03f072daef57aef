//! Rooms on a real redis-server: pin outcomes and the owner CAS, close, and what the heartbeat
//! does with a pin that lapsed, was taken, or was deleted.

use crate::support;

use std::collections::BTreeSet;

use sfu_redis::{Error, ErrorKind, Event, Mode, PinOutcome};
use support::*;

const STAGE: &str = "r";

fn get(s: &Server, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(&mut s.con()).unwrap()
}

fn smembers(s: &Server, key: &str) -> BTreeSet<String> {
    redis::cmd("SMEMBERS").arg(key).query(&mut s.con()).unwrap()
}

// Protects the pin owner CAS (invariant 1): a room is pinned once, re-pinning by its owner is
// `AlreadyOurs`, and a live owner's room is `Held` by anyone else, who writes nothing (not
// even an entry in its own room index, which the pipeline adds before the script runs).
// Without the CAS the second instance would overwrite the live owner's pin.
#[test]
fn pin_outcomes_and_owner() {
    let s = Server::start();
    let ks = ks(STAGE);
    let a = s.node(STAGE, "inst-a");
    let b = s.node(STAGE, "inst-b");
    assert_eq!((a.mode(), a.stats().mode), (Mode::Redis, Mode::Redis));
    assert_eq!(a.mode().as_str(), "redis");
    assert_eq!(a.pin_room("room").unwrap(), PinOutcome::Pinned);
    assert_eq!(a.pin_room("room").unwrap(), PinOutcome::AlreadyOurs);
    let held = b.pin_room("room").unwrap();
    assert_eq!(
        held,
        PinOutcome::Held {
            owner: "inst-a".into()
        }
    );
    assert!(!held.is_owned());
    assert_eq!(get(&s, &ks.room("room").owner).as_deref(), Some("inst-a"));
    assert_eq!(b.room_owner("room").unwrap().as_deref(), Some("inst-a"));
    assert_eq!(b.room_owner("nobody's").unwrap(), None);
    assert!(smembers(&s, &ks.instance_rooms("inst-b")).is_empty());
    assert_eq!(
        smembers(&s, &ks.instance_rooms("inst-a")),
        BTreeSet::from(["room".to_owned()])
    );
    assert_eq!((a.stats().rooms, b.stats().rooms), (1, 0));
}

// Protects the close owner CAS: a non-owner's close is refused with NotOwner (naming the
// owner) and deletes nothing; the owner's close deletes the room's keys, every peer record (in
// batches: 600 peers > one batch of 256), every `<room>/<peer>` index entry and the room-index
// entry. A second close is NotOwner with no owner. Without the CAS the non-owner would delete
// a live room; without the batched loop peers beyond the first batch would be orphans.
//
// Both nodes run with `quiet()` timings (no tick during the test), so the before/after dump
// and the index checks see what the calls did and nothing else. With ticking nodes it failed
// once on a cluster under load (reproduced by widening the window): a's tick read the room's
// 600 peers to re-assert them in its index just before the close took the room lock, and its
// `SADD` landed while the close was under way, putting back entries the close had removed
// (the next tick's settlement removes them). `fast()` timings also let a tick delayed past
// the 1.8 s pin TTL, or any of the 600 calls over the 400 ms timeout, fail it.
#[test]
fn close_room_is_owner_only_and_removes_everything() {
    let s = Server::start();
    let ks = ks(STAGE);
    let a = s.node_with(STAGE, "inst-a", quiet());
    let b = s.node_with(STAGE, "inst-b", quiet());
    a.pin_room("big").unwrap();
    a.pin_room("other").unwrap();
    a.upsert_peer("other", "keep", None, &[]).unwrap();
    for i in 0..600 {
        let guest = format!("g{}", i % 50);
        a.upsert_peer(
            "big",
            &format!("p{i}"),
            (i % 2 == 0).then_some(&*guest),
            &[],
        )
        .unwrap();
    }
    let before = s.dump(&ks.scan_pattern());
    let e = b.close_room("big").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotOwner);
    assert!(
        matches!(&e, Error::NotOwner { owner: Some(o), .. } if o == "inst-a"),
        "{e:?}"
    );
    let room_part = |d: &std::collections::BTreeMap<String, Val>| {
        d.iter()
            .filter(|(k, _)| k.contains(":room:") || k.contains(":instance:"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(room_part(&s.dump(&ks.scan_pattern())), room_part(&before));

    a.close_room("big").unwrap();
    assert!(s
        .keys(&format!("{}:room:{{big}}:*", ks.prefix()))
        .is_empty());
    assert_eq!(
        smembers(&s, &ks.instance_peers("inst-a")),
        BTreeSet::from(["other/keep".to_owned()])
    );
    assert_eq!(
        smembers(&s, &ks.instance_rooms("inst-a")),
        BTreeSet::from(["other".to_owned()])
    );
    assert_eq!((a.stats().rooms, a.stats().peers), (1, 1));
    let e = a.close_room("big").unwrap_err();
    assert!(matches!(&e, Error::NotOwner { owner: None, .. }), "{e:?}");
    assert!(s.index_problems(&ks).is_empty());
}

// DESIGN "Behaviour details": a tick that finds its own pin gone re-pins the room if nobody
// took it over, without reporting it lost. Fails if the heartbeat only PEXPIREd (the pin would
// stay gone and any instance could take the room) or reported room_lost.
#[test]
fn lapsed_pin_is_pinned_again_by_the_owner() {
    let s = Server::start();
    let ks = ks(STAGE);
    let a = s.node(STAGE, "inst-a");
    let mut log = EventLog::new(&a);
    a.pin_room("room").unwrap();
    let _: () = redis::cmd("DEL")
        .arg(ks.room("room").owner)
        .query(&mut s.con())
        .unwrap();
    wait_for(LONG, "the pin back", || {
        (get(&s, &ks.room("room").owner).as_deref() == Some("inst-a")).then_some(())
    });
    assert!(!log
        .drain()
        .iter()
        .any(|e| matches!(e, Event::RoomLost { .. })));
    assert_eq!(a.stats().rooms, 1);
}

// Protects the refresh owner CAS: when another instance's id is in the pin, the owner's tick
// reports `room_lost` naming the new owner, forgets the room, and never overwrites the pin,
// nor shortens its TTL (the tick's `PEXPIRE ... GT` only lengthens). Without the CAS the
// tick's refresh would write its own id back over the new owner's; with a plain `PEXPIRE` or
// `GETEX` the new owner's 10-minute pin would drop to this node's pin TTL (a few seconds).
#[test]
fn pin_taken_by_another_instance_is_reported_lost_and_not_overwritten() {
    let s = Server::start();
    let ks = ks(STAGE);
    let a = s.node(STAGE, "inst-a");
    let mut log = EventLog::new(&a);
    a.pin_room("room").unwrap();
    let _: () = redis::cmd("SET")
        .arg(ks.room("room").owner)
        .arg("usurper")
        .arg("PX")
        .arg(600_000)
        .query(&mut s.con())
        .unwrap();
    let e = log.wait(LONG, "room_lost", |e| matches!(e, Event::RoomLost { .. }));
    assert_eq!(
        e,
        Event::RoomLost {
            room: "room".into(),
            new_owner: Some("usurper".into())
        }
    );
    assert_eq!(a.stats().rooms, 0);
    let beats = a.stats().heartbeats;
    wait_for(LONG, "more ticks", || {
        (a.stats().heartbeats >= beats + 3).then_some(())
    });
    assert_eq!(get(&s, &ks.room("room").owner).as_deref(), Some("usurper"));
    let pttl: i64 = redis::cmd("PTTL")
        .arg(ks.room("room").owner)
        .query(&mut s.con())
        .unwrap();
    let own_ttl = sfu_redis::Timings::fast().pin_ttl.as_millis() as i64;
    assert!(
        pttl > own_ttl * 10,
        "the new owner's pin TTL was cut to {pttl} ms"
    );
    assert_eq!(
        a.upsert_peer("room", "p", None, &[]).unwrap_err().kind(),
        ErrorKind::NotOwner
    );
}

// A room deleted under its owner (closed or reaped elsewhere: pin and metadata gone) is
// reported lost with no new owner and never written back by the heartbeat. Fails if the
// refresh re-pinned rooms whose metadata is gone outside of a data-loss recovery.
#[test]
fn deleted_room_is_reported_lost_and_not_resurrected() {
    let s = Server::start();
    let ks = ks(STAGE);
    let a = s.node(STAGE, "inst-a");
    let mut log = EventLog::new(&a);
    a.pin_room("room").unwrap();
    let rk = ks.room("room");
    let _: () = redis::cmd("DEL")
        .arg(&rk.owner)
        .arg(&rk.meta)
        .query(&mut s.con())
        .unwrap();
    let e = log.wait(LONG, "room_lost", |e| matches!(e, Event::RoomLost { .. }));
    assert_eq!(
        e,
        Event::RoomLost {
            room: "room".into(),
            new_owner: None
        }
    );
    let beats = a.stats().heartbeats;
    wait_for(LONG, "more ticks", || {
        (a.stats().heartbeats >= beats + 3).then_some(())
    });
    assert!(s
        .keys(&format!("{}:room:{{room}}:*", ks.prefix()))
        .is_empty());
}

// A live instance's pin is refreshed by its heartbeat: after several pin TTLs the room is
// still pinned (PTTL keeps being reset), so nobody can take it over.
#[test]
fn heartbeat_keeps_pins_alive() {
    let s = Server::start();
    let ks = ks(STAGE);
    let a = s.node(STAGE, "inst-a");
    let b = s.node(STAGE, "inst-b");
    a.pin_room("room").unwrap();
    let ttl = sfu_redis::Timings::fast().pin_ttl;
    let until = std::time::Instant::now() + ttl * 2;
    while std::time::Instant::now() < until {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(ks.room("room").owner)
            .query(&mut s.con())
            .unwrap();
        assert!(pttl > 0, "pin expired under a live owner");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(matches!(
        b.pin_room("room").unwrap(),
        PinOutcome::Held { .. }
    ));
}

// The instance's room index should list the rooms it owns. After the heartbeat finds a room
// lost (taken by another instance, or deleted), the room stays in the index until the instance
// dies: `sfu-redis status` (`fleet_status`) then over-counts the instance's rooms, and a
// long-lived instance's index grows with every room it ever lost. Expects the index (and the
// status count) to drop the lost room.
#[test]
fn lost_room_leaves_the_room_index() {
    let s = Server::start();
    let ks = ks(STAGE);
    let a = s.node(STAGE, "inst-a");
    let mut log = EventLog::new(&a);
    a.pin_room("kept").unwrap();
    a.pin_room("taken").unwrap();
    let _: () = redis::cmd("SET")
        .arg(ks.room("taken").owner)
        .arg("usurper")
        .arg("PX")
        .arg(60_000)
        .query(&mut s.con())
        .unwrap();
    log.wait(LONG, "room_lost", |e| matches!(e, Event::RoomLost { .. }));
    let status = sfu_redis::status::fleet_status(&s.config(STAGE, "reader")).unwrap();
    let me = status.instances.iter().find(|i| i.id == "inst-a").unwrap();
    assert_eq!(
        smembers(&s, &ks.instance_rooms("inst-a")),
        BTreeSet::from(["kept".to_owned()])
    );
    assert_eq!(me.rooms, 1);
}

// A tick whose PEXPIRE is refused (here an ACL user without PEXPIRE; likewise a server without
// `GT`) must count as a failed refresh, reported as bad data each tick, not as a refresh: the
// GET alone still names this node, so ignoring the PEXPIRE's error would let the pin lapse
// every pin_ttl unnoticed, open to a takeover. Fails if the PEXPIRE reply is ignored.
#[test]
fn refused_pin_refresh_is_reported_not_taken_for_a_refresh() {
    let s = Server::start();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("nopex")
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg("-pexpire")
        .query(&mut s.con())
        .unwrap();
    let url = s.url().replacen("://", "://nopex:pw@", 1);
    let a = sfu_redis::Node::start(config_for(
        &url,
        STAGE,
        "inst-a",
        sfu_redis::Timings::fast(),
    ))
    .unwrap();
    a.pin_room("room").unwrap();
    let before = a.stats().bad_data;
    wait_for(LONG, "refused refreshes reported", || {
        (a.stats().bad_data >= before + 2).then_some(())
    });
}

// Protects pin_refresh.lua's owner CAS during a restore (issue 32: both of its checks survived
// the suite, since a room taken over normally has its pin and its metadata naming the new owner,
// and either check alone refuses it). Redis loses its data and, in the same transaction, two of
// the owner's rooms are found claimed by someone else in one key only: room 1's pin names
// another instance (its metadata gone), room 2's metadata does (its pin gone). The owner's
// restore writes every pin back with pin_refresh.lua; it must report both rooms lost to that
// instance and write neither back, while its third room is restored.
#[test]
fn a_restore_never_overwrites_a_room_another_instance_claimed() {
    let s = Server::start_with(&[]); // one server: FLUSHALL and the claims in one MULTI
    let ks = ks(STAGE);
    let a = s.node(STAGE, "restorer");
    let mut log = EventLog::new(&a);
    for room in ["claimed-pin", "claimed-meta", "kept"] {
        assert_eq!(a.pin_room(room).unwrap(), PinOutcome::Pinned);
    }
    let other = wire(sfu_redis::keys::IdKind::Instance, "claimer");
    let _: () = redis::pipe()
        .atomic()
        .cmd("FLUSHALL")
        .ignore()
        .set(ks.room("claimed-pin").owner, &other)
        .ignore()
        .pexpire(ks.room("claimed-pin").owner, 600_000)
        .ignore()
        .hset(ks.room("claimed-meta").meta, "owner", &other)
        .ignore()
        .query(&mut s.con())
        .unwrap();
    let mut lost = BTreeSet::new();
    while lost.len() < 2 {
        let e = log.wait(LONG, "room_lost", |e| matches!(e, Event::RoomLost { .. }));
        let Event::RoomLost { room, new_owner } = e else {
            unreachable!()
        };
        assert_eq!(new_owner.as_deref(), Some("claimer"), "{room}");
        assert!(lost.insert(room));
    }
    assert_eq!(
        lost,
        BTreeSet::from(["claimed-meta".to_string(), "claimed-pin".to_string()])
    );
    wait_for(LONG, "the third room restored", || {
        (get(&s, &ks.room("kept").owner).as_deref() == Some("restorer")).then_some(())
    });
    assert_eq!(
        get(&s, &ks.room("claimed-pin").owner).as_deref(),
        Some("claimer")
    );
    assert_eq!(get(&s, &ks.room("claimed-meta").owner), None);
    assert_eq!(a.stats().rooms, 1);
}
