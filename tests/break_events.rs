//! Adversarial: the event channel.

use sfu_redis::{Config, Event, Node, EVENT_CAPACITY};

fn memory_node() -> Node {
    Node::start(Config::builder().instance_id("ev").build().unwrap()).unwrap()
}

// Overflow: nobody reads; events beyond the capacity are dropped and counted, nothing blocks.
// (Holds up.)
#[test]
fn overflow_is_dropped_and_counted() {
    let n = memory_node();
    for _ in 0..EVENT_CAPACITY + 10 {
        n.ready();
    }
    assert_eq!(n.stats().events_dropped, 10);
}

// `Event::Stopped` is documented as "The node shut down; no event follows", but `Node::ready()`
// still emits `Ready` after shutdown (it does not check that the node is running, unlike every
// other host call, which returns `Error::Stopped`).
#[test]
fn an_event_follows_stopped() {
    let n = memory_node();
    let rx = n.events();
    n.shutdown().unwrap();
    n.ready();
    let events: Vec<Event> = rx.try_iter().collect();
    let after: Vec<&Event> = events
        .iter()
        .skip_while(|e| !matches!(e, Event::Stopped))
        .skip(1)
        .collect();
    assert!(after.is_empty(), "events after Stopped: {after:?}");
}
