//! Memory-only mode (no Redis URL): the same pin/close/owner/upsert/remove rules as on Redis
//! (generations, guest supersede, NotOwner), single instance, no leader, no background work.

use sfu_redis::{Config, ErrorKind, Event, Mode, Node, PinOutcome};

fn node() -> Node {
    let c = Config::builder().instance_id("solo").build().unwrap();
    assert_eq!(c.redis_url(), None);
    Node::start(c).unwrap()
}

// DESIGN "Memory-only mode": pins live in memory; re-pin is AlreadyOurs; owner is this
// instance or nobody; close of an unknown (or already closed) room is NotOwner; nothing needs
// Redis and no worker runs (no events but `stopped`, never leader, no heartbeats).
#[test]
fn rooms_in_memory() {
    let n = node();
    assert_eq!(n.pin_room("r").unwrap(), PinOutcome::Pinned);
    assert_eq!(n.pin_room("r").unwrap(), PinOutcome::AlreadyOurs);
    assert_eq!(n.room_owner("r").unwrap().as_deref(), Some("solo"));
    assert_eq!(n.room_owner("other").unwrap(), None);
    n.close_room("r").unwrap();
    assert_eq!(n.room_owner("r").unwrap(), None);
    assert_eq!(n.close_room("r").unwrap_err().kind(), ErrorKind::NotOwner);
    assert_eq!(
        n.close_room("never").unwrap_err().kind(),
        ErrorKind::NotOwner
    );
    assert!(!n.is_leader());
    let st = n.stats();
    assert!(!st.redis);
    // The mode is visible: a host without a logger can tell it runs memory-only.
    assert_eq!((n.mode(), st.mode), (Mode::Memory, Mode::Memory));
    assert_eq!(n.mode().as_str(), "memory");
    assert!(!st.is_leader);
    assert_eq!(st.epoch, None);
    assert_eq!((st.heartbeats, st.last_heartbeat_age), (0, None));
    assert_eq!(n.instance_id(), "solo");
    assert!(n.events().try_iter().next().is_none());
    n.ready();
    assert_eq!(
        n.events().try_recv().unwrap(),
        Event::Ready { rooms: 0, peers: 0 }
    );
    n.shutdown().unwrap();
    assert_eq!(n.events().try_recv().unwrap(), Event::Stopped);
    assert_eq!(n.pin_room("r").unwrap_err().kind(), ErrorKind::Stopped);
}

// Invariant 4 in memory: upsert into an unpinned room is NotOwner; generations grow; a
// delayed remove with an older generation is a no-op; remove with the current one works once.
#[test]
fn peers_in_memory_generations() {
    let n = node();
    assert_eq!(
        n.upsert_peer("r", "p", None, &[]).unwrap_err().kind(),
        ErrorKind::NotOwner
    );
    n.pin_room("r").unwrap();
    let g1 = n.upsert_peer("r", "p", Some("g"), &[("k", "v")]).unwrap();
    let g2 = n.upsert_peer("r", "p", Some("g"), &[]).unwrap();
    assert!(g2 > g1);
    assert!(!n.remove_peer("r", "p", g1).unwrap(), "older generation");
    assert_eq!(n.stats().peers, 1);
    assert!(n.remove_peer("r", "p", g2).unwrap());
    assert!(!n.remove_peer("r", "p", g2).unwrap());
    assert!(!n.remove_peer("unknown-room", "p", 1).unwrap());
    assert_eq!(n.stats().peers, 0);
    // Reserved fields are refused here too.
    assert_eq!(
        n.upsert_peer("r", "p", None, &[("generation", "1")])
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidArgument
    );
}

// Guest supersede in memory: a guest reconnecting with a new peer id replaces its old peer
// (the old one's remove is then a no-op); a peer that changes guest releases the old guest, so
// a later peer of the old guest supersedes nothing. Stats count what is held.
#[test]
fn peers_in_memory_guests() {
    let n = node();
    n.pin_room("r").unwrap();
    let old = n.upsert_peer("r", "conn-1", Some("alice"), &[]).unwrap();
    n.upsert_peer("r", "conn-2", Some("alice"), &[]).unwrap();
    assert_eq!(n.stats().peers, 1, "conn-1 was superseded");
    assert!(!n.remove_peer("r", "conn-1", old).unwrap());
    // conn-2 switches to guest bob: alice's pointer goes with it.
    n.upsert_peer("r", "conn-2", Some("bob"), &[]).unwrap();
    n.upsert_peer("r", "conn-3", Some("alice"), &[]).unwrap();
    assert_eq!(n.stats().peers, 2, "alice no longer pointed at conn-2");
    // bob reconnects: conn-2 superseded.
    n.upsert_peer("r", "conn-4", Some("bob"), &[]).unwrap();
    assert_eq!(n.stats().peers, 2);
    n.pin_room("r2").unwrap();
    n.upsert_peer("r2", "x", Some("alice"), &[]).unwrap();
    assert_eq!(n.stats().peers, 3, "guests are per room");
    assert_eq!(n.stats().rooms, 2);
    n.close_room("r").unwrap();
    assert_eq!((n.stats().rooms, n.stats().peers), (1, 1));
}

// Ids are checked in memory mode as on Redis.
#[test]
fn invalid_ids_in_memory() {
    let n = node();
    for bad in ["", "a\u{1b}b", &"y".repeat(257)] {
        assert_eq!(n.pin_room(bad).unwrap_err().kind(), ErrorKind::InvalidId);
        assert_eq!(
            n.upsert_peer("r", bad, None, &[]).unwrap_err().kind(),
            ErrorKind::InvalidId
        );
    }
    assert_eq!(n.pin_room("a:{b}* c/방").unwrap(), PinOutcome::Pinned);
    assert_eq!(n.stats().rooms, 1);
}
