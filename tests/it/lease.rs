//! The reaper lease on a real redis-server: refresh and release only touch our own lease
//! (owner CAS), refresh never recreates an expired lease, at most one leader at a time, and a
//! released lease is free at once.

use crate::support;

use std::time::{Duration, Instant};

use sfu_redis::{Event, LeaderLostReason, Node, Timings};
use support::*;

const STAGE: &str = "l";

fn get(s: &Server, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(&mut s.con()).unwrap()
}

fn pttl(s: &Server, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(&mut s.con()).unwrap()
}

fn epoch(s: &Server) -> u64 {
    get(s, &ks(STAGE).epoch()).unwrap().parse().unwrap()
}

// Protects the release CAS (pitfall "lease refresh/release must only touch our own lease, or
// two leaders appear"): a non-leader's shutdown runs the release script, which must leave the
// leader's lease alone. Without the CAS the DEL would free the lease while the leader still
// acts: the key would be gone (or held by someone else) right after the shutdown, and the
// leader would then lose its lease.
#[test]
fn release_by_a_non_owner_leaves_the_lease_intact() {
    let s = Server::start();
    let lease = ks(STAGE).leader();
    let (_leader, mut log) = s.leader(STAGE, "owner", Timings::fast());
    let other = s.node(STAGE, "other");
    assert!(!other.is_leader());
    other.shutdown().unwrap();
    assert_eq!(get(&s, &lease).as_deref(), Some("owner"));
    assert!(pttl(&s, &lease) > 0);
    // A few refresh periods later the lease still names the leader, which never found it
    // taken (a DEL by the other node would make its next refresh report `lease_taken`).
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1500) {
        let lost = log.try_wait(Duration::from_millis(100), |e| {
            *e == Event::LeaderLost {
                reason: LeaderLostReason::LeaseTaken,
            }
        });
        assert!(lost.is_none(), "the leader's lease was taken");
    }
    assert_eq!(get(&s, &lease).as_deref(), Some("owner"));
}

// Protects the refresh CAS: a lease key holding someone else's id (another holder took it) is
// neither overwritten nor extended by the old leader's refresh; the old leader demotes at once
// with `lease_taken` and does not get the lease back while the other holder's TTL runs.
// Without the CAS the refresh would PEXPIRE the foreign lease to lease_ttl (1.8 s, while we set
// 60 s) or overwrite it, and the old leader would keep leading: two leaders.
#[test]
fn foreign_lease_value_demotes_the_leader_without_overwrite() {
    let s = Server::start();
    let lease = ks(STAGE).leader();
    let (leader, mut log) = s.leader(STAGE, "owner", Timings::fast());
    let term_epoch = epoch(&s);
    let _: () = redis::cmd("SET")
        .arg(&lease)
        .arg("intruder")
        .arg("PX")
        .arg(60_000)
        .query(&mut s.con())
        .unwrap();
    let e = log.wait(LONG, "leader_lost", |e| {
        matches!(e, Event::LeaderLost { .. })
    });
    assert_eq!(
        e,
        Event::LeaderLost {
            reason: LeaderLostReason::LeaseTaken
        }
    );
    assert!(!leader.is_leader());
    // Several refresh/acquire periods (600 ms each) later: still the intruder's lease, with
    // the intruder's TTL, and no new term was started.
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(2000) {
        assert!(log
            .try_wait(Duration::from_millis(100), |e| matches!(
                e,
                Event::LeaderAcquired { .. }
            ))
            .is_none());
        assert!(!leader.is_leader());
    }
    assert_eq!(get(&s, &lease).as_deref(), Some("intruder"));
    assert!(
        pttl(&s, &lease) > 50_000,
        "the foreign lease's TTL was changed"
    );
    assert_eq!(epoch(&s), term_epoch);
    assert_eq!(leader.stats().epoch, None);
}

// Protects "refresh never recreates the lease": when the lease has expired (here: the key is
// gone), the leader's refresh finds nothing, demotes with `lease_taken`, and the lease comes
// back only through a new acquire, i.e. a new term with a higher epoch. A refresh that
// recreated the key (SET instead of compare-and-PEXPIRE) would keep the old term alive
// without any leader_lost, and the epoch would not move.
#[test]
fn refresh_never_recreates_an_expired_lease() {
    let s = Server::start();
    let lease = ks(STAGE).leader();
    let (leader, mut log) = s.leader(STAGE, "owner", Timings::fast());
    let first = epoch(&s);
    assert_eq!(leader.stats().epoch, Some(first));
    let _: () = redis::cmd("DEL").arg(&lease).query(&mut s.con()).unwrap();
    let e = log.wait(LONG, "leader_lost", |e| {
        matches!(e, Event::LeaderLost { .. } | Event::LeaderAcquired { .. })
    });
    assert_eq!(
        e,
        Event::LeaderLost {
            reason: LeaderLostReason::LeaseTaken
        }
    );
    let e = log.wait(LONG, "a new term", |e| {
        matches!(e, Event::LeaderAcquired { .. })
    });
    assert_eq!(e, Event::LeaderAcquired { epoch: first + 1 });
    assert_eq!(epoch(&s), first + 1);
    assert_eq!(get(&s, &lease).as_deref(), Some("owner"));
}

// Protects invariant 3 (at most one leader): three nodes start at once; sampled every few ms
// for 3 s, never more than one believes it leads, and exactly one acquired (epochs unique and
// distinct). Fails if acquire were not `SET NX` (several winners).
#[test]
fn at_most_one_leader_among_many() {
    let s = Server::start();
    let nodes: Vec<Node> = ["n1", "n2", "n3"]
        .iter()
        .map(|i| s.node(STAGE, i))
        .collect();
    wait_for(LONG, "a leader", || {
        nodes.iter().any(|n| n.is_leader()).then_some(())
    });
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        let leaders = nodes.iter().filter(|n| n.is_leader()).count();
        assert!(leaders <= 1, "{leaders} leaders at once");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut epochs: Vec<u64> = nodes
        .iter()
        .flat_map(|n| {
            n.events()
                .try_iter()
                .filter_map(|e| match e {
                    Event::LeaderAcquired { epoch } => Some(epoch),
                    _ => None,
                })
                .collect::<Vec<_>>()
        })
        .collect();
    // Normally one term (epoch 1); a refresh that times out on a loaded machine may start
    // another, but no two terms ever share an epoch.
    let n = epochs.len();
    epochs.sort_unstable();
    epochs.dedup();
    assert!(
        n >= 1 && epochs.len() == n,
        "epochs {epochs:?} of {n} terms"
    );
}

// Protects release on shutdown: the leader's shutdown deletes its lease at once (owner CAS
// DEL) and reports `leader_lost { shutdown }`; another node then takes over with a higher
// epoch, without waiting for the TTL. Fails if shutdown did not release (the key would still
// name the old leader right after shutdown returned).
#[test]
fn shutdown_releases_the_lease() {
    let s = Server::start();
    let lease = ks(STAGE).leader();
    let (leader, mut log) = s.leader(STAGE, "first", Timings::fast());
    let first = epoch(&s);
    let next = s.node(STAGE, "second");
    let mut next_log = EventLog::new(&next);
    leader.shutdown().unwrap();
    assert_ne!(get(&s, &lease).as_deref(), Some("first"));
    log.wait(LONG, "leader_lost shutdown", |e| {
        *e == Event::LeaderLost {
            reason: LeaderLostReason::Shutdown,
        }
    });
    log.wait(LONG, "stopped", |e| *e == Event::Stopped);
    let e = next_log.wait(LONG, "second acquires", |e| {
        matches!(e, Event::LeaderAcquired { .. })
    });
    assert!(matches!(e, Event::LeaderAcquired { epoch } if epoch > first));
    assert_eq!(get(&s, &lease).as_deref(), Some("second"));
    assert_eq!(
        leader.pin_room("r").unwrap_err().kind(),
        sfu_redis::ErrorKind::Stopped
    );
}

// Protects invariant 3 through a network stall of the leader: the leader's connections stall
// (fault proxy); it must stop acting as leader before the other node can acquire the expired
// lease. Sampled every few ms: never two leaders. Then the stalled node comes back as a
// follower. Here the timed-out refresh (400 ms command timeout) demotes it; the local deadline
// is only a backstop for a lease thread that cannot run at all, which cannot be produced
// in-process (a mutation that ignores the deadline survives this test; a process-level
// SIGSTOP test of the binary can cover it).
#[test]
fn stalled_leader_steps_down_before_another_takes_over() {
    let s = Server::start_with(&[]); // one server: its process or the fault proxy
    let proxy = s.proxy();
    let old = Node::start(config_for(&proxy.url(), STAGE, "stalled", Timings::fast())).unwrap();
    let mut old_log = EventLog::new(&old);
    old_log.wait(LONG, "stalled node leads", |e| {
        matches!(e, Event::LeaderAcquired { .. })
    });
    let new = s.node(STAGE, "fresh");
    proxy.stall(Direction::Both);
    let deadline = Instant::now() + LONG;
    while !new.is_leader() {
        assert!(!(old.is_leader() && new.is_leader()), "two leaders at once");
        assert!(Instant::now() < deadline, "no takeover");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(
        !old.is_leader(),
        "the stalled leader still believes it leads"
    );
    let e = old_log.wait(LONG, "leader_lost", |e| {
        matches!(e, Event::LeaderLost { .. })
    });
    assert!(matches!(
        e,
        Event::LeaderLost {
            reason: LeaderLostReason::RefreshFailed | LeaderLostReason::DeadlinePassed
        }
    ));
    proxy.heal();
    // Back as a follower: its heartbeat resumes, it does not take the lease.
    let beats = old.stats().heartbeats;
    wait_for(LONG, "the stalled node heartbeats again", || {
        (old.stats().heartbeats > beats + 2).then_some(())
    });
    assert!(new.is_leader());
    assert!(!old.is_leader());
}

// A lease key that this protocol did not write (a hash without TTL) would block every election
// forever: acquire replaces it. A foreign key with a TTL is waited out, not replaced.
#[test]
fn lease_key_of_the_wrong_type() {
    let s = Server::start();
    let lease = ks(STAGE).leader();
    let _: () = redis::cmd("HSET")
        .arg(&lease)
        .arg("junk")
        .arg("1")
        .query(&mut s.con())
        .unwrap();
    let n = s.node(STAGE, "n");
    wait_for(LONG, "lease repaired and acquired", || {
        n.is_leader().then_some(())
    });
    assert_eq!(get(&s, &lease).as_deref(), Some("n"));
    drop(n);

    let s = Server::start();
    let _: () = redis::pipe()
        .cmd("HSET")
        .arg(&lease)
        .arg("junk")
        .arg("1")
        .ignore()
        .cmd("PEXPIRE")
        .arg(&lease)
        .arg(1500)
        .ignore()
        .query(&mut s.con())
        .unwrap();
    let n = s.node(STAGE, "n");
    std::thread::sleep(Duration::from_millis(500)); // nothing must happen: TTL still runs
    assert!(!n.is_leader());
    wait_for(LONG, "acquired after the foreign TTL", || {
        n.is_leader().then_some(())
    });
}

// Protects lease safety across a failover (issue 12, docs/src/deploy/failover.md "Failover: what is guaranteed"):
// on a master with a replica, a lease write no replica acknowledged (`WAIT 1`) starts no
// term, so a failover right after it cannot hand a second node the lease while this one
// leads. Fault: the replica is SIGSTOPped (connected, never acknowledging). Without the WAIT
// the node would lead at once on the unreplicated lease. Once the replica answers again the
// node leads.
#[test]
fn a_lease_no_replica_acknowledged_starts_no_term() {
    let s = Server::start_with(&["--repl-diskless-sync-delay", "0"]);
    let replica = sfu_redis_testkit::devserver::LocalRedis::start_replica_of(s.redis(), &[])
        .expect("replica");
    replica.sigstop().expect("SIGSTOP the replica");
    let node = s.node(STAGE, "waits");
    let mut log = EventLog::new(&node);
    // A few acquire attempts (every lease_refresh, 600 ms) all go unacknowledged.
    let early = log.try_wait(Duration::from_secs(3), |e| {
        matches!(e, Event::LeaderAcquired { .. })
    });
    assert!(early.is_none(), "led on an unreplicated lease: {early:?}");
    assert!(!node.is_leader());
    // Each unacknowledged acquire gives the lease back (an attempt may hold it while its
    // WAIT is pending: poll for a moment between attempts; never released, it would stay).
    wait_for(LONG, "the unacknowledged lease given back", || {
        get(&s, &ks(STAGE).leader()).is_none().then_some(())
    });
    assert!(!node.is_leader());
    replica.sigcont().expect("SIGCONT the replica");
    log.wait(LONG, "leader_acquired once the replica acknowledges", |e| {
        matches!(e, Event::LeaderAcquired { .. })
    });
    assert_eq!(get(&s, &ks(STAGE).leader()).as_deref(), Some("waits"));
}

// The same master, with a user that may not run WAIT (an ACL, or a proxy that does not know
// it): the node still leads (no reaps at all would be worse), and says so in its log.
#[test]
fn a_user_refused_wait_still_leads() {
    let s = Server::start_with(&["--repl-diskless-sync-delay", "0"]);
    let _replica = sfu_redis_testkit::devserver::LocalRedis::start_replica_of(s.redis(), &[])
        .expect("replica");
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("nowait")
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg("-wait")
        .query(&mut s.con())
        .unwrap();
    let url = format!("redis://nowait:pw@127.0.0.1:{}", s.redis().port());
    let node = Node::start(config_for(&url, STAGE, "nowait-node", Timings::fast())).unwrap();
    let mut log = EventLog::new(&node);
    log.wait(LONG, "leader_acquired without WAIT", |e| {
        matches!(e, Event::LeaderAcquired { .. })
    });
}
