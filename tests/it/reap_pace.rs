//! The reaper's pace (issue 14, item 6, `ConfigBuilder::reap_pace`): a paced reap still
//! removes everything a dead instance left, and a pause never holds up a shutdown, neither
//! the reaper thread's nor a host's `Node::reap_now`.
//!
//! Promises covered: docs/DESIGN.md invariant 2 (a dead instance leaves nothing behind) with
//! pauses between batches, and the bounded shutdown of docs/src/design/reaping.md "Reap pace".

use crate::support;

use std::time::{Duration, Instant};

use sfu_redis::keys::IdKind;
use sfu_redis::{Config, Error, Event, Node, Timings};
use support::*;

const STAGE: &str = "pace";

/// A config of stage [`STAGE`] for `url` with the given reap batch and pace.
fn paced(url: &str, instance: &str, t: Timings, batch: usize, pace: f64) -> Config {
    Config::builder()
        .redis_url(url)
        .stage(STAGE)
        .instance_id(instance)
        .timings(t)
        .reap_batch(batch)
        .reap_pace(pace)
        .build()
        .expect("valid config")
}

/// Writes a dead instance `dead` with `rooms` rooms (ids `<dead>-r<k>`), each with the peers
/// `peers`.
fn fabricate(s: &Server, dead: &str, rooms: usize, peers: &[(&str, Option<&str>)]) {
    let names: Vec<String> = (0..rooms).map(|r| format!("{dead}-r{r}")).collect();
    let rooms: Vec<FakeRoom<'_>> = names.iter().map(|r| (r.as_str(), peers)).collect();
    s.fabricate_dead(
        &ks(STAGE),
        dead,
        s.server_ms() - 10_000,
        Some(600_000),
        &rooms,
    );
}

fn dbsize(s: &Server) -> i64 {
    redis::cmd("DBSIZE").query(&mut s.con()).unwrap()
}

/// Drops `node` and waits until the server has no client connection left but the one asking:
/// every thread of the node has ended (a thread keeps its connection while it lives, a
/// reaper pausing between batches too). After that the reap cannot go on.
fn drop_and_wait_for_its_connections_to_close(s: &Server, node: Node) {
    drop(node);
    wait_for(
        LONG,
        "the node's connections closed (a thread that outlives shutdown keeps one)",
        || {
            let list: String = redis::cmd("CLIENT")
                .arg("LIST")
                .arg("TYPE")
                .arg("normal")
                .query(&mut s.con())
                .unwrap();
            (list.lines().count() == 1).then_some(())
        },
    );
}

/// Starts `config`'s node and waits until it leads.
fn leader(config: Config) -> (Node, EventLog) {
    let node = Node::start(config).expect("start leader");
    let mut log = EventLog::new(&node);
    log.wait(LONG, "leader_acquired", |e| {
        matches!(e, Event::LeaderAcquired { .. })
    });
    wait_for(LONG, "is_leader", || node.is_leader().then_some(()));
    (node, log)
}

// Protects: invariant 2 with a pace. Fault: none; 120 rooms of 2 peers (one with a guest)
// reaped by the reaper thread in batches of 10 with a pause of 3 times each batch's duration.
// Protection: the pause sits between batches only; every batch still runs, and the last one's
// index clean-up is still sent. Fails if a pause skipped a batch or ended the reap early (keys
// of the dead instance left, an index naming a deleted record, counts short).
#[test]
fn a_paced_reap_removes_everything() {
    let s = Server::start();
    let (leader, mut log) = leader(paced(&s.url(), "leader", Timings::fast(), 10, 3.0));
    fabricate(&s, "dead-paced", 120, &[("p1", Some("g1")), ("p2", None)]);
    let got = log.wait(LONG, "instance_reaped of dead-paced", |e| {
        reaped(e, "dead-paced")
    });
    let Event::InstanceReaped { rooms, peers, .. } = got else {
        unreachable!()
    };
    assert_eq!((rooms, peers), (120, 240));
    let dead = wire(IdKind::Instance, "dead-paced");
    let left: Vec<String> = s
        .keys(&format!("sfu:{STAGE}:*"))
        .into_iter()
        .filter(|k| k.contains("dead-paced"))
        .collect();
    assert!(left.is_empty(), "keys of the dead instance left: {left:?}");
    let score: Option<f64> = redis::cmd("ZSCORE")
        .arg(ks(STAGE).heartbeats())
        .arg(&dead)
        .query(&mut s.con())
        .unwrap();
    assert_eq!(score, None, "its heartbeats entry is left");
    assert_eq!(s.index_problems(&ks(STAGE)), Vec::<String>::new());
    leader.shutdown().unwrap();
}

// Protects: the bounded shutdown with the largest pace. Fault: Node::shutdown while the reaper
// thread pauses between batches of 1000 rooms (through a proxy adding 10 ms each way) at pace
// 100: each pause lasts at least 100 x 20 ms = 2 s, and the reap has four batches.
// Protection: the pause waits on the worker's shutdown channel, and the leadership check that
// follows it sees the shutdown, so the thread ends at once. Fails with a pause that sleeps
// (shutdown would wait for the rest of it: seconds) or a reap that goes on after it (the key
// count changes before the node's last connection closes).
#[test]
fn shutdown_during_a_paced_reap_returns_promptly() {
    let s = Server::start_with(&[]);
    let proxy = s.proxy();
    proxy.set_delay(Duration::from_millis(10));
    let (leader, _log) = leader(paced(&proxy.url(), "leader", Timings::fast(), 1000, 100.0));
    fabricate(&s, "dead-big", 4000, &[("p1", None)]);
    let full = dbsize(&s);
    wait_for(LONG, "the first reap batch", || {
        (dbsize(&s) < full).then_some(())
    });
    // Let the batch's replies come back: the reaper is in its pause now.
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    leader.shutdown().unwrap();
    let took = t.elapsed();
    let after = dbsize(&s);
    assert!(
        took < Duration::from_secs(2),
        "shutdown took {took:?}: it waited for the reaper's pause"
    );
    assert!(
        after > 1,
        "the reap finished before the shutdown ({after} keys left): the test saw no pause"
    );
    drop_and_wait_for_its_connections_to_close(&s, leader);
    assert_eq!(dbsize(&s), after, "the reap went on after shutdown");
}

// Protects: the bounded shutdown during a host's paced `Node::reap_now` (the host call waits
// in the pause, and shutdown waits for host calls). Fault: Node::shutdown from another thread
// while reap_now reaps 4000 rooms in batches of 1000 at pace 100 (pauses of seconds; the
// leader's own reaper thread never runs a round). Protection: shutdown wakes waiting host calls
// before it waits for them; the reap then stops before its next batch and reap_now returns
// Error::Stopped. Fails if shutdown waited for the pauses (seconds) or the reap went on.
#[test]
fn shutdown_ends_a_paced_reap_now() {
    let s = Server::start();
    let mut t = Timings::fast();
    t.two_phase_delay = Duration::from_secs(3600);
    t.reap_interval = Duration::from_secs(3600);
    let (leader, _log) = leader(paced(&s.url(), "leader", t, 1000, 100.0));
    fabricate(&s, "dead-host", 4000, &[("p1", None)]);
    let full = dbsize(&s);
    std::thread::scope(|scope| {
        let reap = scope.spawn(|| leader.reap_now("dead-host"));
        wait_for(LONG, "the first reap batch", || {
            (dbsize(&s) < full).then_some(())
        });
        std::thread::sleep(Duration::from_millis(300));
        let t = Instant::now();
        leader.shutdown().unwrap();
        let took = t.elapsed();
        let out = reap.join().expect("reap_now thread");
        assert!(
            took < Duration::from_secs(2),
            "shutdown took {took:?}: it waited for reap_now's pauses"
        );
        assert!(matches!(out, Err(Error::Stopped)), "reap_now gave {out:?}");
    });
    let after = dbsize(&s);
    assert!(after > 1, "the reap finished ({after} keys left)");
    drop_and_wait_for_its_connections_to_close(&s, leader);
    assert_eq!(dbsize(&s), after, "the reap went on after shutdown");
}
