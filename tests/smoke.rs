mod support;
use sfu_redis::*;
use support::*;

#[test]
fn smoke_reap() {
    let s = Server::start();
    let a = s.node("t", "a");
    let b = s.node("t", "b");
    assert_eq!(a.pin_room("r1").unwrap(), PinOutcome::Pinned);
    let g = a
        .upsert_peer("r1", "p1", Some("g1"), &[("k", "v")])
        .unwrap();
    assert_eq!(b.pin_room("r2").unwrap(), PinOutcome::Pinned);
    b.upsert_peer("r2", "p2", Some("g2"), &[]).unwrap();
    println!("{:?}", s.keys("*"));
    assert!(matches!(b.pin_room("r1").unwrap(), PinOutcome::Held { .. }));
    assert_eq!(g, 1);
    // who leads?
    wait_for(LONG, "a leader", || {
        (a.is_leader() || b.is_leader()).then_some(())
    });
    let (leader, victim) = if a.is_leader() { (&a, &b) } else { (&b, &a) };
    victim.simulate_crash();
    let e = wait_event(leader, LONG, "reap", |e| {
        matches!(e, Event::InstanceReaped { .. })
    });
    println!("{e:?}");
    println!("{:?}", s.keys("*"));
}
