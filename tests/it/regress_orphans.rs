//! Regression tests: nothing of a dead instance is left out of every reaper's reach because
//! its sorted-set entry went before its leftovers did (model check, `model/README.md`
//! "Findings" 1 to 3). An instance that writes its own room index while it is not registered
//! (a zombie whose reap completed, a crash before its next tick) hands itself to the reaper
//! (`index_add.lua`: score 0); a leave that finds a room index of itself still there (a reap
//! of it under way) keeps the score-0 mark (`deregister.lua`: 'handed').
//!
//! Promises covered: docs/DESIGN.md invariant 2 (a dead instance leaves nothing behind) and
//! the rule "No leftovers out of reach".
use crate::support;

use sfu_redis::keys::IdKind;
use sfu_redis::replay;
use sfu_redis::{PinOutcome, Timings};
use support::*;

const STAGE: &str = "orph";

fn zscore(s: &Server, instance: &str) -> Option<i64> {
    redis::cmd("ZSCORE")
        .arg(ks(STAGE).heartbeats())
        .arg(wire(IdKind::Instance, instance))
        .query(&mut s.con())
        .unwrap()
}

/// Every place a dump of the stage still names `instance` (keys, members, fields, values).
fn naming(s: &Server, instance: &str) -> Vec<String> {
    let ks = ks(STAGE);
    references(
        &s.dump(&ks.scan_pattern()),
        &[wire(IdKind::Instance, instance)],
    )
}

/// Waits until nothing of the stage names `instance`; the leftovers in the panic otherwise.
fn wait_nothing_names(s: &Server, instance: &str) {
    let deadline = std::time::Instant::now() + LONG;
    loop {
        let left = naming(s, instance);
        if left.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{LONG:?} after a leader started these still name {instance}: {left:#?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

// Model check, finding 1. A paused instance is reaped to completion (no sorted-set entry, no
// heartbeat key, no index). It resumes and, before its next tick notices the reap, its host
// pins a room and writes a peer record there; then it crashes (kill -9) before any tick
// registers it again. Its index, pin, metadata and record used to stay for ever: nothing in
// the sorted set named it, and per-boot ids mean no process reuses it. Protection: the index
// write of the pin (`index_add.lua`) found it unregistered and set its score to 0, so the next
// leader lists it, re-checks it and reaps everything it left.
#[test]
fn a_zombie_that_pins_after_its_completed_reap_and_crashes_is_reaped() {
    let s = Server::start();
    let ks = ks(STAGE);
    // Quiet timings: the zombie never ticks during the test.
    let z = s.node_with(STAGE, "zmb-pins", quiet());
    let w = wire(IdKind::Instance, "zmb-pins");
    assert_eq!(z.pin_room("zp-before").unwrap(), PinOutcome::Pinned);
    // Paused past its stale threshold: a leader reaps it to the end, then stops.
    s.make_stale(&ks, "zmb-pins", 1);
    let (first, mut log) = s.leader(STAGE, "zp-first", Timings::fast());
    log.wait(LONG, "the zombie reaped", |e| reaped(e, "zmb-pins"));
    first.shutdown().unwrap();
    drop(first);
    assert_eq!(zscore(&s, "zmb-pins"), None, "the reap completed");
    assert!(
        naming(&s, "zmb-pins").is_empty(),
        "{:#?}",
        naming(&s, "zmb-pins")
    );

    // It resumes: its host pins a room and upserts a peer, then the process dies.
    assert_eq!(z.pin_room("zp-after").unwrap(), PinOutcome::Pinned);
    z.upsert_peer("zp-after", "zp-peer", Some("zp-guest"), &[("k", "v")])
        .unwrap();
    z.simulate_crash();
    assert_eq!(
        zscore(&s, "zmb-pins"),
        Some(0),
        "its index write handed it to the reaper"
    );
    let rk = ks.room("zp-after");
    for key in [
        ks.instance_rooms(&w),
        rk.owner.clone(),
        rk.meta.clone(),
        ks.peer("zp-after", "zp-peer"),
    ] {
        assert!(
            !s.dump(&key).is_empty(),
            "{key}: the zombie's write is there"
        );
    }

    // The next leader reaps all of it: index, moved index, pin, metadata, peers, record, entry.
    let (_second, _log) = s.leader(STAGE, "zp-second", Timings::fast());
    wait_nothing_names(&s, "zmb-pins");
    assert!(s.keys(&format!("{}*zp-after*", ks.prefix())).is_empty());
    assert!(
        s.index_problems(&ks).is_empty(),
        "{:#?}",
        s.index_problems(&ks)
    );
}

// Model check, findings 1 and 2 (the crash between the two steps of a pin): an instance that
// was never registered, or whose reap completed, writes its room index and dies before the
// pin script runs. The entry named a room that does not exist, in the index of an instance no
// sorted set named: only fsck found it. Protection: the same mark (`index_add.lua`, through
// the library's call as the trace replay sends it); a leader then reaps the index.
#[test]
fn an_index_entry_written_unregistered_is_handed_to_the_reaper() {
    let s = Server::start();
    let ks = ks(STAGE);
    let ghost = replay::Instance::new(&ks, "zmb-index", Timings::fast());
    let mut con = s.con();
    assert_eq!(ghost.index_add(&mut con, &["zi-room"], true, 0).unwrap(), 1);
    assert_eq!(zscore(&s, "zmb-index"), Some(0));
    let (_leader, mut log) = s.leader(STAGE, "zi-leader", Timings::fast());
    log.wait(LONG, "the index reaped", |e| reaped(e, "zmb-index"));
    wait_nothing_names(&s, "zmb-index");
}

// Model check, finding 3. A zombie (reaped while paused, not noticed yet) leaves while a reap
// of it is under way: reap_begin.lua moved its room index aside, set its score to 0 and wrote
// its token. The leave closes the rooms it holds and settles its live index (empty: the reap
// moved it), then deregistered, which removed the score-0 mark. A room of the moved index the
// node did not hold (here one of its earlier life, pinned with a record) then stayed: the reap
// puts kept rooms back and ends 'retry', but no later round lists an instance the sorted set
// no longer names. Protection: `deregister.lua` finds the moved index and keeps score 0
// ('handed'); the leader's next rounds reap everything.
#[test]
fn a_zombies_leave_during_its_reap_hands_it_to_the_reaper() {
    let s = Server::start();
    let ks = ks(STAGE);
    let z = s.node_with(STAGE, "zmb-leaves", quiet());
    let w = wire(IdKind::Instance, "zmb-leaves");
    assert_eq!(z.pin_room("zl-held").unwrap(), PinOutcome::Pinned);
    z.upsert_peer("zl-held", "zl-held-peer", None, &[]).unwrap();
    // A room of its index the node does not hold, with its pin and a record of it.
    let now = s.server_ms();
    s.fabricate_dead(
        &ks,
        "zmb-leaves",
        now,
        Some(600_000),
        &[("zl-unheld", &[("zl-unheld-peer", Some("zl-guest"))])],
    );
    // Its heartbeat key expired while it was paused; a leader's reap began (and stalled).
    let _: () = redis::cmd("DEL")
        .arg(ks.heartbeat(&w))
        .query(&mut s.con())
        .unwrap();
    s.interrupt_reap(&ks, &w);

    z.leave().expect("the leave settles what it holds");
    assert_eq!(
        zscore(&s, "zmb-leaves"),
        Some(0),
        "the leave kept the reap's mark"
    );
    assert!(
        s.dump(&ks.heartbeat(&w)).is_empty(),
        "heartbeat key deleted"
    );
    assert!(s.dump(&ks.instance_info(&w)).is_empty(), "info deleted");
    assert!(
        !s.dump(&ks.room("zl-unheld").meta).is_empty(),
        "the room it did not hold is still there"
    );

    let (_leader, mut log) = s.leader(STAGE, "zl-leader", Timings::fast());
    log.wait(LONG, "the leaver reaped", |e| reaped(e, "zmb-leaves"));
    wait_nothing_names(&s, "zmb-leaves");
    assert!(
        s.index_problems(&ks).is_empty(),
        "{:#?}",
        s.index_problems(&ks)
    );
}

// The other side of the same script: a leave that settled everything (no room index left)
// removes the sorted-set entry ('gone'), and nothing names the instance afterwards, without
// any leader. Fails if `deregister.lua` handed every leaver to the reaper.
#[test]
fn a_clean_leave_removes_the_entry() {
    let s = Server::start();
    let n = s.node_with(STAGE, "zmb-clean", quiet());
    assert_eq!(n.pin_room("zc-room").unwrap(), PinOutcome::Pinned);
    n.upsert_peer("zc-room", "zc-peer", None, &[]).unwrap();
    assert!(zscore(&s, "zmb-clean").is_some());
    n.leave().unwrap();
    assert_eq!(zscore(&s, "zmb-clean"), None);
    let left = naming(&s, "zmb-clean");
    assert!(left.is_empty(), "{left:#?}");
}

// After Redis lost its data, a host pin that runs before the node's next tick writes the room
// index of an instance the new dataset does not know: `index_add.lua` marks it (score 0), as
// it marks a zombie. The next tick must still take this as the data loss it is and restore
// (`heartbeat.lua`: a score 0 under a dataset token the instance never saw is 'restored'),
// not as a reap: before, it answered 'reaped' and the node reported both rooms lost and
// dropped them, the one it had just pinned included (found by review of the mark).
#[test]
fn a_pin_between_a_data_loss_and_the_next_tick_still_restores() {
    let s = Server::start();
    let n = s.node_with(STAGE, "dl", quiet());
    assert_eq!(n.pin_room("r1").unwrap(), PinOutcome::Pinned);
    let _: () = redis::cmd("FLUSHALL").query(&mut s.con()).unwrap();
    assert_eq!(n.pin_room("r2").unwrap(), PinOutcome::Pinned);
    assert_eq!(zscore(&s, "dl"), Some(0), "the pin's index write marks it");
    n.heartbeat_now().unwrap();
    let deadline = std::time::Instant::now() + LONG;
    loop {
        let st = n.stats();
        let owners: Vec<Option<String>> = ["r1", "r2"]
            .iter()
            .map(|r| n.room_owner(r).unwrap())
            .collect();
        let score = zscore(&s, "dl");
        assert_eq!(st.reaped_self, 0, "taken as reaped after a data loss");
        if st.data_losses == 1
            && owners.iter().all(|o| o.as_deref() == Some("dl"))
            && score.is_some_and(|v| v > 0)
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no restore within {LONG:?}: data_losses {}, owners {owners:?}, score {score:?}",
            st.data_losses
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let rooms: Vec<String> = redis::cmd("SMEMBERS")
        .arg(ks(STAGE).instance_rooms("dl"))
        .query(&mut s.con())
        .unwrap();
    let mut rooms = rooms;
    rooms.sort();
    assert_eq!(rooms, ["r1", "r2"], "both rooms back in the index");
}

// The other side of that rule: once a leader's reap of the marked instance began (its token
// is there), the instance was silent through a two-phase wait after the loss, and the reap's
// t0 would delete the rooms it pinned before: its tick must take this as a reap (a zombie:
// rooms reported lost, a fresh life), not restore and keep rooms the reap deletes under it
// (model check, loss scenario, property b).
#[test]
fn a_reap_begun_after_a_data_loss_and_a_pin_makes_a_zombie() {
    let s = Server::start();
    let ks = ks(STAGE);
    let n = s.node_with(STAGE, "dlz", quiet());
    let w = wire(IdKind::Instance, "dlz");
    assert_eq!(n.pin_room("z1").unwrap(), PinOutcome::Pinned);
    let _: () = redis::cmd("FLUSHALL").query(&mut s.con()).unwrap();
    assert_eq!(n.pin_room("z2").unwrap(), PinOutcome::Pinned);
    assert_eq!(zscore(&s, "dlz"), Some(0), "the pin's index write marks it");
    s.interrupt_reap(&ks, &w);
    n.heartbeat_now().unwrap();
    let deadline = std::time::Instant::now() + LONG;
    while n.stats().reaped_self == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "not taken as reaped within {LONG:?}: {:?}",
            n.stats()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        zscore(&s, "dlz").is_some_and(|v| v > 0),
        "registered again as a fresh life"
    );
}

// The reap tombstone (`P:{ctl}:instance:<I>:reaped`, CI chaos seed 7183887166631589195): a
// reap records the start of the life it reaps, and heartbeat.lua answers 'zombie' to that
// life, not 'missing' / 'reaped', which the node may read as a registration a failover lost
// (docs/src/deploy/failover.md). Another life of the id still gets the old answers; a
// registration clears the tombstone; the info always names the life whose heartbeat wrote
// the entry (the tombstone is copied from it).
#[test]
fn a_reap_tells_the_reaped_life_apart_from_any_other() {
    let s = Server::start();
    let ks = ks(STAGE);
    let mut con = s.con();
    let z = replay::Instance::new(&ks, "zmb-tomb", Timings::fast());
    let w = wire(IdKind::Instance, "zmb-tomb");
    let boot = "zt-boot";
    let (life, other) = (1_000_001_i64, 2_000_002_i64);
    assert_eq!(
        z.heartbeat(&mut con, true, "", boot, 0, life).unwrap().0,
        "ok"
    );
    // The dataset token that registration created: known to every later beat.
    let token: String = redis::cmd("GET").arg(ks.dataset()).query(&mut con).unwrap();
    let beat = |con: &mut sfu_redis::ops::conn::Conn, register: bool, started: i64| {
        z.heartbeat(con, register, &token, boot, 0, started)
            .unwrap()
            .0
    };
    // A tick of another life (a master that kept an earlier life's record): the info is
    // rewritten to name the life that heartbeats.
    assert_eq!(beat(&mut con, false, other), "ok");
    let started = |con: &mut sfu_redis::ops::conn::Conn| -> Option<String> {
        redis::cmd("HGET")
            .arg(ks.instance_info(&w))
            .arg("started_ms")
            .query(con)
            .unwrap()
    };
    assert_eq!(started(&mut con), Some(other.to_string()));
    assert_eq!(beat(&mut con, false, life), "ok");
    assert_eq!(started(&mut con), Some(life.to_string()));

    // A leader's reap begins once the heartbeat key expired and the score is stale.
    // (The lease as a won acquire leaves it; lease_acquire.lua waits a lease TTL after the
    // dataset token this registration just created.)
    let leader = replay::Instance::new(&ks, "zt-leader", Timings::fast());
    let _: () = redis::cmd("SET")
        .arg(ks.leader())
        .arg(wire(IdKind::Instance, "zt-leader"))
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("DEL")
        .arg(ks.heartbeat(&w))
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("ZADD")
        .arg(ks.heartbeats())
        .arg(1)
        .arg(&w)
        .query(&mut con)
        .unwrap();
    assert_eq!(leader.reap_begin(&mut con, "zmb-tomb").unwrap().0, "dead");
    let tomb = ks.instance_reaped(&w);
    let held: Option<String> = redis::cmd("GET").arg(&tomb).query(&mut con).unwrap();
    assert_eq!(
        held,
        Some(life.to_string()),
        "the tombstone names the reaped life"
    );
    let ttl: i64 = redis::cmd("PTTL").arg(&tomb).query(&mut con).unwrap();
    let day = sfu_redis::keys::REAPED_TTL_MS as i64;
    assert!(ttl > day - 60_000 && ttl <= day, "tombstone PTTL {ttl} ms");

    // Being reaped (score 0): 'zombie' for the reaped life, 'reaped' for another.
    assert_eq!(beat(&mut con, false, life), "zombie");
    assert_eq!(beat(&mut con, false, other), "reaped");
    assert_eq!(
        beat(&mut con, false, 0),
        "reaped",
        "an unknown life is never told"
    );
    // Reaped to completion (entry gone): 'zombie' still, 'missing' for another life.
    let _: () = redis::cmd("ZREM")
        .arg(ks.heartbeats())
        .arg(&w)
        .query(&mut con)
        .unwrap();
    assert_eq!(beat(&mut con, false, life), "zombie");
    assert_eq!(beat(&mut con, false, other), "missing");
    // Neither answer wrote anything.
    assert_eq!(zscore(&s, "zmb-tomb"), None);
    // A registration (the zombie's next life) clears it.
    assert_eq!(beat(&mut con, true, other), "ok");
    let held: Option<String> = redis::cmd("GET").arg(&tomb).query(&mut con).unwrap();
    assert_eq!(held, None, "a registration deletes the tombstone");
}

// Model check, finding 9: a failover lost a registration no replica had acknowledged, and
// the node pinned before its next tick. Marked, the live node was a reap candidate at once.
// While the registration is unconfirmed, index_add.lua adds the members and marks nothing.
#[test]
fn an_unconfirmed_registration_is_never_handed_to_the_reaper() {
    let s = Server::start();
    let ks = ks(STAGE);
    let mut con = s.con();
    let lost = replay::Instance::new(&ks, "zmb-unconf", Timings::fast());
    assert_eq!(lost.index_add(&mut con, &["zu-room"], false, 0).unwrap(), 1);
    assert_eq!(
        zscore(&s, "zmb-unconf"),
        None,
        "not marked while unconfirmed"
    );
    let members: Vec<String> = redis::cmd("SMEMBERS")
        .arg(ks.instance_rooms(&wire(IdKind::Instance, "zmb-unconf")))
        .query(&mut con)
        .unwrap();
    assert_eq!(members, vec![wire(IdKind::Room, "zu-room")]);
    // Confirmed, the same write marks it.
    assert_eq!(lost.index_add(&mut con, &["zu-other"], true, 0).unwrap(), 1);
    assert_eq!(zscore(&s, "zmb-unconf"), Some(0));
}

// Model check, finding 11. A zombie whose registration no replica acknowledged (its
// replica's acknowledgements cut), reaped to the end while paused, pins a room and dies before
// its next tick. `index_add.lua` never marks while the registration is unconfirmed (a failover
// may have lost it: finding 9), so the pin's index write left it out of the sorted set and
// the room out of every leader's reach. Protection: the reap tombstone names the zombie's life
// (a reap took the registration; no failover lost it), and `index_add.lua` marks it then.
#[test]
fn an_unconfirmed_zombie_that_pins_after_its_completed_reap_and_crashes_is_reaped() {
    if cluster_topology() {
        // One master and its replica: the first run covers it.
        return;
    }
    let s = Server::start_with(&[]);
    let ks = ks(STAGE);
    // A replica; its acknowledgements cut, the data flowing on.
    let (replica, proxy) = replica_through_proxy(&s);
    let mut master = s.raw_con();
    let mut rep = replica.raw_con();
    proxy.blackhole(Direction::Upstream);
    assert_eq!(
        wait_replicated(&mut master, 1, std::time::Duration::from_millis(300)),
        0
    );

    // The zombie-to-be registers unacknowledged and pins a room. It never ticks in the test
    // (a tick after the heal below would confirm its registration).
    let z = s.node_with(STAGE, "zmb-unack", silent());
    let w = wire(IdKind::Instance, "zmb-unack");
    assert_eq!(z.pin_room("zq-before").unwrap(), PinOutcome::Pinned);
    assert_eq!(
        wait_replicated(&mut master, 1, std::time::Duration::from_millis(300)),
        0,
        "the replica acknowledged: the registration may be confirmed"
    );
    // No WAIT of the zombie pending (one answered after the heal would confirm it); then the
    // acknowledgements flow again, for the leaders' lease writes.
    wait_for(LONG, "no client blocked in WAIT", || {
        let text: String = redis::cmd("INFO")
            .arg("clients")
            .query(&mut master)
            .unwrap();
        text.lines()
            .any(|l| l.trim() == "blocked_clients:0")
            .then_some(())
    });
    proxy.heal();

    // Paused past its stale threshold: a leader reaps it to the end, then stops.
    s.make_stale(&ks, "zmb-unack", 1);
    let (first, mut log) = s.leader(STAGE, "zq-first", Timings::fast());
    log.wait(LONG, "the zombie reaped", |e| reaped(e, "zmb-unack"));
    first.shutdown().unwrap();
    drop(first);
    assert_eq!(zscore(&s, "zmb-unack"), None, "the reap completed");
    let tomb: Option<String> = redis::cmd("GET")
        .arg(ks.instance_reaped(&w))
        .query(&mut master)
        .unwrap();
    let life: Option<String> = redis::cmd("HGET")
        .arg(ks.instance_info(&w))
        .arg("started_ms")
        .query(&mut rep)
        .unwrap();
    assert!(tomb.is_some(), "the reap left its tombstone");

    // It resumes: its host pins a room, then the process dies.
    assert_eq!(z.pin_room("zq-after").unwrap(), PinOutcome::Pinned);
    z.simulate_crash();
    assert_eq!(
        zscore(&s, "zmb-unack"),
        Some(0),
        "the tombstone names its life ({tomb:?}; its info on the replica said {life:?}): its \
         index write handed it to the reaper"
    );

    // The next leader reaps what it wrote.
    let (_second, _log) = s.leader(STAGE, "zq-second", Timings::fast());
    wait_nothing_names(&s, "zmb-unack");
    assert!(s.keys(&format!("{}*zq-after*", ks.prefix())).is_empty());
}
