//! A connection can die after the server executed a request but before the reply arrived
//! (here: the reply is held by a FaultProxy, then the connection is reset). Such a call must not
//! be re-sent (close_room / remove_peer are not idempotent in what they report); it fails with
//! an error saying so, and the node's state converges: the heartbeat finishes what may have run,
//! and nothing is written back later.

mod support;

use std::sync::Arc;
use std::time::Duration;

use sfu_redis::{Node, Timings};
use support::*;

const STAGE: &str = "rt";

/// Runs `f` with replies held back, then resets every connection once the request has run.
fn run_and_lose_the_reply<T: Send + 'static>(
    proxy: &FaultProxy,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    proxy.stall(Direction::Downstream);
    let h = std::thread::spawn(f);
    std::thread::sleep(Duration::from_millis(100));
    proxy.reset_all();
    proxy.heal();
    h.join().unwrap()
}

// The close ran but its reply was lost: close_room must not report NotOwner (a re-sent close
// would); it reports an unknown outcome, and the room ends up closed, without a `room_lost`.
#[test]
fn close_room_with_a_lost_reply_is_not_resent_and_the_room_ends_closed() {
    let s = Server::start();
    let ks = ks(STAGE);
    let proxy = s.proxy();
    let a = Arc::new(Node::start(config_for(&proxy.url(), STAGE, "a", Timings::fast())).unwrap());
    a.pin_room("r").unwrap();
    a.upsert_peer("r", "p", None, &[]).unwrap();
    let mut log = EventLog::new(&a);
    let a2 = Arc::clone(&a);
    let out = run_and_lose_the_reply(&proxy, move || a2.close_room("r"));
    assert!(
        !matches!(&out, Err(e) if e.kind() == sfu_redis::ErrorKind::NotOwner),
        "close_room was re-sent: {out:?}"
    );
    wait_for(LONG, "the room is closed", || {
        s.keys(&format!("{}:room:{{r}}:*", ks.prefix()))
            .is_empty()
            .then_some(())
    });
    assert_eq!(a.stats().rooms, 0);
    std::thread::sleep(Timings::fast().heartbeat_interval * 3);
    assert!(
        log.drain()
            .iter()
            .all(|e| !matches!(e, sfu_redis::Event::RoomLost { .. })),
        "a closed room was reported lost"
    );
}

// The remove ran but its reply was lost: remove_peer must not report Ok(false) ("a newer
// generation exists", what a re-sent remove says), and the node must forget the peer.
#[test]
fn remove_peer_with_a_lost_reply_is_not_resent_and_the_peer_is_forgotten() {
    let s = Server::start();
    let ks = ks(STAGE);
    let proxy = s.proxy();
    let a = Arc::new(Node::start(config_for(&proxy.url(), STAGE, "b", Timings::fast())).unwrap());
    a.pin_room("r").unwrap();
    let generation = a.upsert_peer("r", "p", None, &[]).unwrap();
    let a2 = Arc::clone(&a);
    let out = run_and_lose_the_reply(&proxy, move || a2.remove_peer("r", "p", generation));
    let record: bool = redis::cmd("EXISTS")
        .arg(ks.peer("r", "p"))
        .query(&mut s.con())
        .unwrap();
    assert!(!record, "the remove ran");
    assert!(
        !matches!(out, Ok(false)),
        "remove_peer was re-sent: {out:?}"
    );
    assert_eq!(a.stats().peers, 0, "the node forgot the peer");
}

// The consequence: after such a lost reply, the removed peer stays in the node's local state,
// and when Redis later loses its data the node's restore writes the removed peer back: a peer
// whose client disconnected reappears in the room (invariant 4, stale mapping).
#[test]
fn removed_peer_comes_back_after_a_later_data_loss() {
    let mut s = Server::start();
    let ks = ks(STAGE);
    let proxy = s.proxy();
    let a = Arc::new(Node::start(config_for(&proxy.url(), STAGE, "c", Timings::fast())).unwrap());
    a.pin_room("r").unwrap();
    let generation = a.upsert_peer("r", "gone-peer", None, &[]).unwrap();
    a.upsert_peer("r", "kept-peer", None, &[]).unwrap();
    let a2 = Arc::clone(&a);
    let _ = run_and_lose_the_reply(&proxy, move || a2.remove_peer("r", "gone-peer", generation));
    s.redis.restart().unwrap();
    let peer_key = ks.peer("r", "kept-peer");
    wait_for(LONG, "restore after data loss", || {
        redis::cmd("EXISTS")
            .arg(&peer_key)
            .query::<bool>(&mut s.con())
            .ok()
            .filter(|e| *e)
    });
    let resurrected: bool = redis::cmd("EXISTS")
        .arg(ks.peer("r", "gone-peer"))
        .query(&mut s.con())
        .unwrap();
    assert!(
        !resurrected,
        "the removed peer was written back after the data loss"
    );
}
