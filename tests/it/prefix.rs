//! Key prefixes on a real redis-server: two stages (and two branches) sharing one Redis never
//! see or reap each other (invariant 5, pitfall "keys or channels without the prefix leak
//! between dev/prod and between branches"), also when their names differ only in characters
//! that prefix escaping rewrites (`feature/login` / `feature_login`).

use crate::support;

use std::collections::BTreeMap;

use sfu_redis::keys::KeySpace;
use sfu_redis::{Config, Event, Node, Timings};
use support::*;

fn stage_keys(s: &Server, prefix: &str) -> BTreeMap<String, Val> {
    s.dump(&format!("{prefix}:*"))
}

/// The content of `keys` that belongs to rooms and indexes (heartbeat values, the lease, the
/// sorted-set scores and the `peers` count each heartbeat writes into an instance's record
/// move on their own).
fn stable(keys: &BTreeMap<String, Val>) -> BTreeMap<String, Val> {
    keys.iter()
        .filter(|(k, _)| k.contains(":room:") || k.contains(":instance:"))
        .map(|(k, v)| {
            let v = match v {
                Val::Hash(h) if k.ends_with(":info") => {
                    let mut h = h.clone();
                    h.remove("peers");
                    Val::Hash(h)
                }
                v => v.clone(),
            };
            (k.clone(), v)
        })
        .collect()
}

fn populate(n: &Node, rooms: &[&str]) {
    for (i, r) in rooms.iter().enumerate() {
        n.pin_room(r).unwrap();
        n.upsert_peer(r, &format!("peer-{i}"), Some(&format!("guest-{i}")), &[])
            .unwrap();
    }
}

// Protects invariant 5. Stage A and stage B share one Redis and use the SAME instance ids and
// room ids. Every key stage A writes starts with `sfu:A:main:` (checked before B exists, so
// each key can only be A's). Then one instance of each stage crashes: each stage's leader
// reaps its own dead instance only; neither leader ever lists the other stage's instances as
// candidates, and the surviving twin in the other stage keeps every key unchanged. Without the
// prefix on every key (or with a scan / candidate query across prefixes) the crashed
// "twin" of one stage would take the other stage's "twin" rooms with it, or a leader would list
// instances of the other stage.
#[test]
fn two_stages_never_see_or_reap_each_other() {
    let s = Server::start();
    let t = Timings::fast();
    let (a_lead, mut a_log) = s.leader("A", "lead", t);
    let a_twin = s.node("A", "twin");
    let a_ghost = s.node("A", "ghost");
    populate(&a_twin, &["room-1", "room-2"]);
    populate(&a_ghost, &["ghost-room"]);
    let all = s.keys("*");
    assert!(!all.is_empty());
    for k in &all {
        assert!(k.starts_with("sfu:A:main:"), "stage A wrote {k:?}");
    }

    let (b_lead, mut b_log) = s.leader("B", "lead", t);
    let b_twin = s.node("B", "twin");
    populate(&b_twin, &["room-1", "room-2"]);
    for k in s.keys("*") {
        assert!(
            k.starts_with("sfu:A:main:") || k.starts_with("sfu:B:main:"),
            "{k:?}"
        );
    }
    let a_twin_before = stable(&stage_keys(&s, "sfu:A:main"));

    // B's twin and A's ghost crash.
    b_twin.simulate_crash();
    a_ghost.simulate_crash();
    b_log.wait(LONG, "B reaps its twin", |e| reaped(e, "twin"));
    a_log.wait(LONG, "A reaps its ghost", |e| reaped(e, "ghost"));

    let a_events = a_log.drain().to_vec();
    let b_events = b_log.drain().to_vec();
    assert!(
        !a_events
            .iter()
            .any(|e| candidates_with(e, "twin") || reaped(e, "twin")),
        "stage A's leader saw stage B's dead twin: {a_events:?}"
    );
    assert!(
        !b_events
            .iter()
            .any(|e| candidates_with(e, "ghost") || reaped(e, "ghost")),
        "stage B's leader saw stage A's dead ghost: {b_events:?}"
    );
    // Stage A keeps its twin intact: everything but the ghost's keys is unchanged (the ghost's
    // reap tombstone, kept a day by design, is the one key its reap adds).
    let mut expected = a_twin_before;
    expected.retain(|k, _| !k.contains("ghost"));
    let mut after = stable(&stage_keys(&s, "sfu:A:main"));
    assert!(
        after
            .remove("sfu:A:main:{ctl}:instance:ghost:reaped")
            .is_some(),
        "the ghost's reap left its tombstone"
    );
    assert_eq!(after, expected);
    assert_eq!(
        a_twin.room_owner("room-1").unwrap().as_deref(),
        Some("twin")
    );
    // Stage B has nothing of its twin left, only its leader.
    let b_left = references(
        &stage_keys(&s, "sfu:B:main"),
        &["twin".into(), "room-".into()],
    );
    assert!(b_left.is_empty(), "{b_left:#?}");
    // Stage A has nothing of its ghost left.
    let a_left = references(&stage_keys(&s, "sfu:A:main"), &["ghost".into()]);
    assert!(a_left.is_empty(), "{a_left:#?}");
    // Each stage has its own lease and epoch.
    assert!(a_lead.is_leader() && b_lead.is_leader());
    assert!(!a_twin
        .events()
        .try_iter()
        .any(|e| matches!(e, Event::RoomLost { .. } | Event::ReapedSelf { .. })));
}

// Invariant 5 between branches of one stage: `sfu:dev:main` and `sfu:dev:main-2` (a branch
// whose name starts with the other's). A crashed instance of `main-2` is reaped by `main-2`'s
// leader only; `main`'s same-named instance and its rooms are untouched, and `main`'s leader
// never lists it. Fails if a pattern or query matched `sfu:dev:main*` instead of
// `sfu:dev:main:*`.
#[test]
fn branches_sharing_a_name_prefix_are_separate() {
    let s = Server::start();
    let cfg = |branch: &str, id: &str| {
        Config::builder()
            .redis_url(s.url())
            .stage("dev")
            .branch(branch)
            .instance_id(id)
            .timings(Timings::fast())
            .build()
            .unwrap()
    };
    let main_lead = Node::start(cfg("main", "lead")).unwrap();
    let mut main_log = EventLog::new(&main_lead);
    main_log.wait(LONG, "main leads", |e| {
        matches!(e, Event::LeaderAcquired { .. })
    });
    let other_lead = Node::start(cfg("main-2", "lead")).unwrap();
    let mut other_log = EventLog::new(&other_lead);
    other_log.wait(LONG, "main-2 leads", |e| {
        matches!(e, Event::LeaderAcquired { .. })
    });
    let keeper = Node::start(cfg("main", "same")).unwrap();
    let doomed = Node::start(cfg("main-2", "same")).unwrap();
    populate(&keeper, &["room"]);
    populate(&doomed, &["room"]);
    let main_before = stable(&stage_keys(&s, "sfu:dev:main"));
    assert!(!main_before.is_empty());
    for k in main_before.keys() {
        assert!(k.starts_with("sfu:dev:main:"), "{k}");
    }
    doomed.simulate_crash();
    other_log.wait(LONG, "main-2 reaps", |e| reaped(e, "same"));
    assert_eq!(stable(&stage_keys(&s, "sfu:dev:main")), main_before);
    assert!(!main_log
        .drain()
        .iter()
        .any(|e| candidates_with(e, "same") || reaped(e, "same")));
    let left = references(&stage_keys(&s, "sfu:dev:main-2"), &["same".into()]);
    assert!(left.is_empty(), "{left:#?}");
}

/// A node of branch `branch` of stage `dev` on `s`, with fast timings.
fn branch_node(s: &Server, branch: &str, id: &str) -> Node {
    let config = Config::builder()
        .redis_url(s.url())
        .stage("dev")
        .branch(branch)
        .instance_id(id)
        .timings(Timings::fast())
        .build()
        .unwrap();
    Node::start(config).unwrap()
}

/// Like `Server::leader` for branch `branch`: starts a node and waits until it leads.
fn branch_leader(s: &Server, branch: &str, id: &str) -> (Node, EventLog) {
    let node = branch_node(s, branch, id);
    let mut log = EventLog::new(&node);
    log.wait(LONG, &format!("{branch} leads"), |e| {
        matches!(e, Event::LeaderAcquired { .. })
    });
    wait_for(LONG, "is_leader", || node.is_leader().then_some(()));
    (node, log)
}

// Invariant 5 between branches whose names differ only in a character the prefix escapes:
// `feature/login` and `feature_login` (the old normalization turned both into
// `feature_login`, so the two branches shared every key, one lease and each other's
// instances). With injective escaping they live under `sfu:dev:feature_2Flogin` and
// `sfu:dev:feature__login`: each branch gets its own leader, its keys stay under its own
// prefix, and a crashed instance of one branch is reaped by that branch's leader only, while
// the same-named instance of the other branch keeps every key. Then the other way round.
// Fails if the two names shared a prefix (the second leader never acquires, the keys mix,
// or a leader lists or reaps the other branch's instance).
#[test]
fn branches_differing_only_in_escaped_characters_are_separate() {
    let s = Server::start();
    let slash = KeySpace::new("sfu", "dev", "feature/login").unwrap();
    let under = KeySpace::new("sfu", "dev", "feature_login").unwrap();
    assert_eq!(slash.prefix(), "sfu:dev:feature_2Flogin");
    assert_eq!(under.prefix(), "sfu:dev:feature__login");
    let keys_of = |ks: &KeySpace| stage_keys(&s, ks.prefix());

    let (slash_lead, mut slash_log) = branch_leader(&s, "feature/login", "lead");
    let slash_twin = branch_node(&s, "feature/login", "twin");
    populate(&slash_twin, &["room-1", "room-2"]);
    let all = s.keys("*");
    assert!(!all.is_empty());
    for k in &all {
        assert!(k.starts_with("sfu:dev:feature_2Flogin:"), "{k:?}");
    }
    let (under_lead, mut under_log) = branch_leader(&s, "feature_login", "lead");
    let under_twin = branch_node(&s, "feature_login", "twin");
    populate(&under_twin, &["room-1", "room-2"]);
    for k in s.keys("*") {
        assert!(
            k.starts_with("sfu:dev:feature_2Flogin:") || k.starts_with("sfu:dev:feature__login:"),
            "{k:?}"
        );
    }
    assert!(slash_lead.is_leader() && under_lead.is_leader());
    assert_eq!(
        slash_twin.room_owner("room-1").unwrap().as_deref(),
        Some("twin")
    );

    // `feature_login`'s twin crashes: only `feature_login`'s leader reaps it.
    let slash_before = stable(&keys_of(&slash));
    assert!(!slash_before.is_empty());
    let slash_mark = slash_log.mark();
    under_twin.simulate_crash();
    under_log.wait(LONG, "feature_login reaps its twin", |e| reaped(e, "twin"));
    assert_eq!(stable(&keys_of(&slash)), slash_before);
    assert!(
        !slash_log
            .since(slash_mark)
            .iter()
            .any(|e| candidates_with(e, "twin") || reaped(e, "twin")),
        "feature/login's leader saw feature_login's dead twin"
    );
    let left = references(&keys_of(&under), &["twin".into(), "room-".into()]);
    assert!(left.is_empty(), "{left:#?}");
    assert_eq!(
        slash_twin.room_owner("room-1").unwrap().as_deref(),
        Some("twin")
    );
    assert!(!slash_twin
        .events()
        .try_iter()
        .any(|e| matches!(e, Event::RoomLost { .. } | Event::ReapedSelf { .. })));

    // A new twin in `feature_login`; now `feature/login`'s twin crashes.
    let under_twin = branch_node(&s, "feature_login", "twin");
    populate(&under_twin, &["room-1", "room-2"]);
    let under_before = stable(&keys_of(&under));
    assert!(!under_before.is_empty());
    let under_mark = under_log.mark();
    slash_twin.simulate_crash();
    slash_log.wait(LONG, "feature/login reaps its twin", |e| reaped(e, "twin"));
    assert_eq!(stable(&keys_of(&under)), under_before);
    assert!(
        !under_log
            .since(under_mark)
            .iter()
            .any(|e| candidates_with(e, "twin") || reaped(e, "twin")),
        "feature_login's leader saw feature/login's dead twin"
    );
    let left = references(&keys_of(&slash), &["twin".into(), "room-".into()]);
    assert!(left.is_empty(), "{left:#?}");
    assert_eq!(
        under_twin.room_owner("room-2").unwrap().as_deref(),
        Some("twin")
    );
    assert!(slash_lead.is_leader() && under_lead.is_leader());
}
