//! A reap moves the dead instance's room index aside (`reap_begin.lua`: `P:{ctl}:instance:<D>:
//! reaping-rooms`, with the reap's token in `...:reaping`) and deletes it whole when it ends
//! (`reap_finish.lua`). Key schema version 2: that room index reaches every peer record naming
//! the instance. What must hold around that move:
//! - a reap interrupted half way (its leader died) is taken over by the next reap, and what a
//!   zombie indexed after the move (in the fresh live index) is reaped by the round after;
//! - an instance that registers again while its room index is moved aside gets it back (merged
//!   into its live index by `heartbeat.lua`), and its clean-up of its earlier life removes
//!   what that life left;
//! - members the reap could not reap (bad data) are put back into the live index for the
//!   audit, and nothing is left moved aside.
//!
//! Promises covered: docs/DESIGN.md invariant 2 (a dead instance is reaped whole), invariant 4
//! and "no orphans" (no index member is dropped that no reap looked at).
use crate::support;

use sfu_redis::keys::KeySpace;
use support::*;

const RA: &str = "aside";

/// The keys of instance `i` in the control plane that a finished reap leaves none of.
fn control_keys(ks: &KeySpace, i: &str) -> [String; 4] {
    [
        ks.instance_rooms(i),
        ks.instance_reaping_rooms(i),
        ks.instance_reaping(i),
        ks.instance_info(i),
    ]
}

fn existing(s: &Server, keys: &[String]) -> Vec<String> {
    let mut con = s.con();
    keys.iter()
        .filter(|k| {
            redis::cmd("EXISTS")
                .arg(k.as_str())
                .query::<bool>(&mut con)
                .unwrap()
        })
        .cloned()
        .collect()
}

/// A reap interrupted after its first step, then a zombie's room indexed in the fresh live
/// index: the leader's reap takes the moved index over, finds the live one not empty
/// ('retry', the entry keeps score 0), and the next round reaps the zombie's room too. No
/// record naming the instance is left.
#[test]
fn an_interrupted_reap_is_taken_over_and_a_later_entry_reaped_the_round_after() {
    let s = Server::start();
    let ks = ks(RA);
    let old = s.server_ms() - 60_000;
    let names: Vec<String> = (0..40).map(|n| format!("r{n}")).collect();
    let rooms: Vec<FakeRoom<'_>> = names
        .iter()
        .map(|r| (r.as_str(), &[("p1", None), ("p2", None)][..]))
        .collect();
    s.fabricate_dead(&ks, "d", old, None, &rooms);
    s.interrupt_reap(&ks, "d");
    // The zombie's room, indexed after the move: fabricated the same way (this also writes
    // the score back), then the score set to 0 again.
    s.fabricate_dead(&ks, "d", old, None, &[("late", &[("q1", None)][..])]);
    interrupt_score(&s, &ks, "d");
    let aside: i64 = redis::cmd("SCARD")
        .arg(ks.instance_reaping_rooms("d"))
        .query(&mut s.con())
        .unwrap();
    assert_eq!(aside, 40, "the fabricated interrupted reap");
    // `status` counts what the reap moved aside with the live index (40 + "late"). Its peer
    // count is what the instance's own heartbeat last wrote into its record: it has none.
    let st = sfu_redis::ops::status::fleet_status(&s.config(RA, "reader")).expect("status");
    let d = st.instances.iter().find(|i| i.id == "d").expect("d listed");
    assert_eq!((d.rooms, d.peers_known), (41, false), "{d:?}");
    assert_eq!(records_naming(&s, &ks, "d").len(), 81);

    let leader = s.node(RA, "leader");
    wait_for(LONG, "is_leader", || leader.is_leader().then_some(()));
    let left = wait_for(LONG, "d reaped whole", || {
        let mut keys: Vec<String> = control_keys(&ks, "d").to_vec();
        keys.extend(
            names
                .iter()
                .chain([&"late".to_owned()])
                .map(|r| ks.room(r).meta),
        );
        let left = existing(&s, &keys);
        let score: Option<f64> = redis::cmd("ZSCORE")
            .arg(ks.heartbeats())
            .arg("d")
            .query(&mut s.con())
            .unwrap();
        (left.is_empty() && score.is_none()).then_some(left)
    });
    assert!(left.is_empty());
    assert_eq!(records_naming(&s, &ks, "d"), Vec::<String>::new());
    assert_eq!(s.index_problems(&ks), Vec::<String>::new());
}

fn interrupt_score(s: &Server, ks: &KeySpace, i: &str) {
    let _: () = redis::cmd("ZADD")
        .arg(ks.heartbeats())
        .arg("XX")
        .arg(0)
        .arg(i)
        .query(&mut s.con())
        .unwrap();
}

/// An instance that registers again while a reap has its room index moved aside: its
/// registration merges it back, its clean-up of its earlier life deletes the old rooms with
/// their records, and nothing stays moved aside; a room it pins meanwhile, and a record it
/// writes there, are kept and indexed.
#[test]
fn registering_again_takes_the_moved_indexes_back() {
    let s = Server::start();
    let ks = ks(RA);
    let old = s.server_ms() - 60_000;
    let names: Vec<String> = (0..30).map(|n| format!("o{n}")).collect();
    let rooms: Vec<FakeRoom<'_>> = names
        .iter()
        .map(|r| (r.as_str(), &[("p", None)][..]))
        .collect();
    s.fabricate_dead(&ks, "back", old, None, &rooms);
    s.interrupt_reap(&ks, "back");

    let node = s.node(RA, "back");
    node.pin_room("fresh").unwrap();
    node.upsert_peer("fresh", "p", None, &[]).unwrap();
    wait_for(LONG, "the earlier life's rooms gone", || {
        let metas: Vec<String> = names.iter().map(|r| ks.room(r).meta).collect();
        existing(&s, &metas).is_empty().then_some(())
    });
    let moved = existing(
        &s,
        &[
            ks.instance_reaping_rooms("back"),
            ks.instance_reaping("back"),
        ],
    );
    assert_eq!(moved, Vec::<String>::new(), "merged back at registration");
    let live: Vec<String> = redis::cmd("SMEMBERS")
        .arg(ks.instance_rooms("back"))
        .query(&mut s.con())
        .unwrap();
    assert_eq!(live, vec!["fresh".to_owned()]);
    assert_eq!(records_naming(&s, &ks, "back"), vec![ks.peer("fresh", "p")]);
    assert_eq!(s.index_problems(&ks), Vec::<String>::new());
}

/// A member the reap cannot reap (its room's metadata is a string, not a hash) goes back into
/// the live index, where the audit reports it; nothing stays moved aside and the instance
/// leaves the sorted set ('incomplete').
#[test]
fn a_member_that_cannot_be_reaped_goes_back_to_the_live_index() {
    let s = Server::start();
    let ks = ks(RA);
    let old = s.server_ms() - 60_000;
    s.fabricate_dead(
        &ks,
        "bad",
        old,
        None,
        &[
            ("ok1", &[("p", None)][..]),
            ("ok2", &[][..]),
            ("broken", &[][..]),
        ],
    );
    let meta = ks.room("broken").meta;
    let _: () = redis::pipe()
        .del(&meta)
        .ignore()
        .set(&meta, "not a hash")
        .ignore()
        .query(&mut s.con())
        .unwrap();
    let leader = s.node(RA, "leader");
    wait_for(LONG, "is_leader", || leader.is_leader().then_some(()));
    wait_for(LONG, "bad leaves the sorted set", || {
        let score: Option<f64> = redis::cmd("ZSCORE")
            .arg(ks.heartbeats())
            .arg("bad")
            .query(&mut s.con())
            .unwrap();
        score.is_none().then_some(())
    });
    let left = existing(&s, &control_keys(&ks, "bad"));
    assert_eq!(left, vec![ks.instance_rooms("bad")]);
    let live: Vec<String> = redis::cmd("SMEMBERS")
        .arg(ks.instance_rooms("bad"))
        .query(&mut s.con())
        .unwrap();
    assert_eq!(live, vec!["broken".to_owned()]);
    let gone = existing(&s, &[ks.room("ok1").meta, ks.room("ok2").meta]);
    assert_eq!(gone, Vec::<String>::new());
    assert_eq!(records_naming(&s, &ks, "bad"), Vec::<String>::new());
}
