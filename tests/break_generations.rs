//! Adversarial: invariant 4, "A delayed remove of an old connection (older generation) is a
//! no-op". Generations come from the room's counter `peer_seq` in `P:room:{R}:meta`; closing
//! (or reaping) the room deletes the meta, so the next life of the same room id counts from 1
//! again. A remove of a connection from the room's previous life, delivered late, then
//! carries the same generation as the new connection of the same peer id and deletes it.

mod support;

use sfu_redis::{Config, Node};
use support::*;

const STAGE: &str = "gen";

fn scenario(n: &Node) -> (u64, u64, bool) {
    n.pin_room("room").unwrap();
    let old = n.upsert_peer("room", "alice", None, &[]).unwrap();
    // The room empties and is closed; later a new session starts in the same room and the
    // same peer id joins again.
    n.close_room("room").unwrap();
    n.pin_room("room").unwrap();
    let new = n.upsert_peer("room", "alice", None, &[]).unwrap();
    // The old connection's remove arrives late.
    let removed = n.remove_peer("room", "alice", old).unwrap();
    (old, new, removed)
}

#[test]
fn late_remove_from_a_previous_life_of_the_room_deletes_the_new_connection() {
    let s = Server::start();
    let n = s.node(STAGE, "a");
    let (old, new, removed) = scenario(&n);
    let exists: bool = redis::cmd("EXISTS")
        .arg(ks(STAGE).peer("room", "alice"))
        .query(&mut s.con())
        .unwrap();
    assert!(
        !removed && exists,
        "old generation {old}, new generation {new}: the late remove returned {removed} and the new \
         connection's record exists: {exists}"
    );
}

#[test]
fn same_in_memory_only_mode() {
    let n = Node::start(Config::builder().instance_id("m").build().unwrap()).unwrap();
    let (old, new, removed) = scenario(&n);
    assert!(
        !removed,
        "old generation {old}, new generation {new}: the late remove deleted the new connection"
    );
}
