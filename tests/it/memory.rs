//! Memory-only mode (no Redis URL): the same pin/close/owner/upsert/remove rules as on Redis
//! (generations, guest supersede, NotOwner), single instance, no leader, no background work.

use crate::support;

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
        Event::Ready {
            rooms: 0,
            peers: 0,
            mode: Mode::Memory
        }
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

// A new user's trip (issue 10, item 8): with no Redis URL the CLI runs memory-only and must say
// so once on stderr (the library logs it at info, not a second warning), and the `ready`
// event carries `"mode": "memory"`.
#[test]
fn cli_without_a_url_says_memory_only_once_and_the_ready_event_carries_the_mode() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let mut child = Command::new(support::procs::cli_bin())
        .args(["node", "--json", "--rooms", "r1", "--peers-per-room", "1"])
        .env_remove("REDIS_URL")
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sfu-redis node");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    let ready = loop {
        line.clear();
        assert!(
            stdout.read_line(&mut line).expect("read stdout") > 0,
            "the node exited before its ready event"
        );
        let v: serde_json::Value = serde_json::from_str(&line).expect("a JSON event line");
        if v["event"] == "ready" {
            break v;
        }
    };
    assert_eq!(ready["mode"], "memory", "{ready}");
    assert_eq!(
        (ready["rooms"].as_u64(), ready["peers"].as_u64()),
        (Some(1), Some(1))
    );
    support::procs::signal(child.id(), "TERM");
    let out = child.wait_with_output().expect("wait for the node");
    assert!(out.status.success(), "exit {:?}", out.status);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("memory-only").count(),
        1,
        "one memory-only line on stderr, got: {stderr}"
    );
}
