//! Adversarial: invariant 5 ("nothing crosses a prefix") with real-world branch names.
//!
//! Each prefix segment is normalized by replacing every character outside `[A-Za-z0-9._-]`
//! with `_` (src/keys.rs `segment`). That mapping is not injective: the git branches
//! `feature/login` and `feature_login` (or `release/1.2` and `release_1.2`, `user@x` and
//! `user_x`) get the same prefix, so they see and reap each other's instances, which is exactly
//! what docs/DESIGN.md's prefix rule is meant to prevent ("dev/prod or two branches can share one
//! Redis without seeing or reaping each other").

mod support;

use std::time::Duration;

use sfu_redis::{Config, Node, Timings};
use support::*;

fn cfg(s: &Server, branch: &str, instance: &str) -> Config {
    Config::builder()
        .redis_url(Some(&s.url()))
        .stage("dev")
        .branch(branch)
        .instance_id(instance)
        .timings(Timings::fast())
        .build()
        .unwrap()
}

#[test]
fn two_distinct_branches_share_a_prefix_and_reap_each_other() {
    let s = Server::start();
    let a_cfg = cfg(&s, "feature/login", "node-on-slash-branch");
    let b_cfg = cfg(&s, "feature_login", "node-on-underscore-branch");
    let same_prefix = a_cfg.keys().prefix() == b_cfg.keys().prefix();

    // The leader runs on branch `feature_login`.
    let leader = Node::start(b_cfg).unwrap();
    let mut log = EventLog::new(&leader);
    log.wait(LONG, "leader", |e| {
        matches!(e, sfu_redis::Event::LeaderAcquired { .. })
    });
    // A node of branch `feature/login` pins a room, then crashes.
    let other = Node::start(a_cfg).unwrap();
    other.pin_room("room-of-the-slash-branch").unwrap();
    other.simulate_crash();
    let crossed = log.try_wait(Duration::from_secs(8), |e| {
        reaped(e, "node-on-slash-branch")
    });
    assert!(
        !same_prefix && crossed.is_none(),
        "branches `feature/login` and `feature_login` share one prefix ({same_prefix}); the leader of \
         `feature_login` reaped the instance of `feature/login`: {crossed:?}"
    );
}
