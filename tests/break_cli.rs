//! Adversarial: the `sfu-redis` binary with absurd flags, and `status` against garbage.

mod support;

use std::process::Command;
use std::time::Instant;

use sfu_redis::status::fleet_status;
use support::*;

const BIN: &str = env!("CARGO_BIN_EXE_sfu-redis");

// `--peers-per-room` accepts any u32; `plan()` (src/bin/sfu-redis/node.rs) builds every
// peer and guest id up front, so 4294967295 means ~4e9 pairs of Strings: the process aborts
// with "memory allocation of N bytes failed" (SIGABRT) instead of exiting 2 with a message
// naming the flag. (Run under `ulimit -v` so the test machine is not exhausted; memory-only
// mode, no Redis needed.)
#[test]
fn huge_peers_per_room_aborts_instead_of_a_clear_error() {
    let t = Instant::now();
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v 1000000; exec timeout 15 {BIN} node --rooms r --peers-per-room 4294967295"
        ))
        .env("RUST_BACKTRACE", "0")
        .env_remove("REDIS_URL")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(2) && stderr.contains("--peers-per-room"),
        "exit {:?} after {:?}; stderr: {stderr}",
        out.status,
        t.elapsed()
    );
}

// A wrong-typed control key (the epoch holding a hash) must not fail the whole status with a
// message that names no key ("Pipeline failure: [(Index 3, ...)]"): status reports the rest of
// the fleet and names the bad key among its problems.
#[test]
fn status_on_a_wrong_typed_control_key_names_the_key() {
    let s = Server::start();
    let ks = ks("st");
    let _: () = redis::cmd("HSET")
        .arg(ks.epoch())
        .arg("a")
        .arg("b")
        .query(&mut s.con())
        .unwrap();
    let cfg = s.config("st", "x");
    let st = fleet_status(&cfg).expect("status still answers");
    assert!(
        st.problems.iter().any(|p| p.contains(&ks.epoch())),
        "{:?}",
        st.problems
    );
}

// One instance with a garbage score (a fractional or out-of-i64-format score, e.g. written by
// another tool: `ZADD ... 1.5 x`) makes the whole `sfu-redis status` fail: nothing about the
// healthy fleet is shown, and the message ("Incompatible type - Could not convert from
// string. (value was bulk-string('"1.5"'))") names neither the key nor the member.
#[test]
fn status_fails_entirely_on_one_odd_score() {
    let s = Server::start();
    let ks = ks("st");
    let healthy = s.node("st", "healthy");
    healthy.pin_room("r").unwrap();
    let _: () = redis::cmd("ZADD")
        .arg(ks.heartbeats())
        .arg("1.5")
        .arg("odd")
        .query(&mut s.con())
        .unwrap();
    let out = Command::new(BIN)
        .args(["status", "--redis-url", &s.url(), "--stage", "st"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("healthy"),
        "exit {:?}\nstdout: {stdout}\nstderr: {stderr}",
        out.status
    );
    drop(healthy);
}
