//! Restarts with the same instance id on a real redis-server: a live duplicate is refused, a
//! gracefully stopped id restarts at once, an earlier life's rooms are cleared at registration.

use crate::support;

use std::time::{Duration, Instant};

use redis::Commands;
use sfu_redis::{ErrorKind, Node, PinOutcome, Timings};
use support::*;

const STAGE: &str = "restart";

fn get(s: &Server, key: &str) -> Option<String> {
    s.con().get(key).unwrap()
}

// Two live processes must never share an instance id (each would refresh the other's pins and
// a reap of one would take the other's rooms). A second start with the id of a running node
// waits for the heartbeat to expire, sees it renewed, and is refused naming `instance_id`;
// the running node's registration and rooms are untouched. Fails if the boot-token check in
// heartbeat.lua's 'register' were removed (the second start would succeed).
#[test]
fn a_live_duplicate_instance_id_is_refused() {
    let s = Server::start();
    let ks = ks(STAGE);
    // Seconds, not the fast milliseconds: a stalled heartbeat thread on a loaded machine must
    // not let a's key expire while b waits.
    let t = Timings::from_heartbeat(Duration::from_secs(1), Duration::from_secs(4));
    let a = s.node_with(STAGE, "dup", t);
    a.pin_room("room").unwrap();
    let token = get(&s, &ks.heartbeat("dup")).expect("a's heartbeat key");
    let e = Node::start(s.config_with(STAGE, "dup", t)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{e}");
    assert!(e.to_string().contains("instance_id"), "{e}");
    assert_eq!(get(&s, &ks.heartbeat("dup")), Some(token));
    assert_eq!(get(&s, &ks.room("room").owner).as_deref(), Some("dup"));
    assert_eq!(a.pin_room("room").unwrap(), PinOutcome::AlreadyOurs);
}

// A graceful stop marks the heartbeat released (keeping its TTL), so a restart with the same
// id (a rolling deploy with stable ids) registers at once instead of waiting up to
// heartbeat_ttl, and clears the rooms its earlier life left. With the default timings the
// restart would take at least the 30 s TTL without the release, and a heartbeat interval
// (10 s) when the registration over a released key was taken for a duplicate (a new user's
// trial, issue 26); the bound here is half an interval.
#[test]
fn a_gracefully_stopped_id_restarts_at_once_and_clears_its_earlier_rooms() {
    let s = Server::start();
    let ks = ks(STAGE);
    let t = Timings::default();
    let a = s.node_with(STAGE, "rolling", t);
    a.pin_room("old-room").unwrap();
    a.shutdown().unwrap();
    assert_eq!(
        get(&s, &ks.heartbeat("rolling")).as_deref(),
        Some("released")
    );
    let pttl: i64 = s.con().pttl(ks.heartbeat("rolling")).unwrap();
    assert!(pttl > 0, "the released key keeps its TTL ({pttl})");
    let started = Instant::now();
    let b = s.node_with(STAGE, "rolling", t);
    let took = started.elapsed();
    assert!(took < t.heartbeat_interval / 2, "restart took {took:?}");
    let token = get(&s, &ks.heartbeat("rolling")).expect("b's heartbeat key");
    assert_ne!(token, "released");
    assert_eq!(get(&s, &ks.room("old-room").owner), None);
    assert_eq!(b.pin_room("new-room").unwrap(), PinOutcome::Pinned);
    b.shutdown().unwrap();
}

// The release is an owner CAS on the boot token: a stopping node never marks a key that
// another process's registration holds now (written over it here, between two of the node's
// ticks: default timings, so no tick runs before the stop). Fails if the release did not
// compare the boot token.
#[test]
fn a_stop_never_releases_another_process_registration() {
    let s = Server::start();
    let ks = ks(STAGE);
    let b = s.node_with(STAGE, "cas", Timings::default());
    let _: () = s
        .con()
        .set_ex(ks.heartbeat("cas"), "someone-else", 60)
        .unwrap();
    b.shutdown().unwrap();
    assert_eq!(
        get(&s, &ks.heartbeat("cas")).as_deref(),
        Some("someone-else")
    );
}

// After a tick found another process's boot token under its id (two live processes share the
// id: a paused one that came back, say), a stop must not mark the key released: the other
// process may be the live one, and a third start would register over it and clear its rooms.
// Fails if the release only compared the boot token (the tick wrote ours back over theirs).
#[test]
fn a_stop_after_seeing_a_duplicate_does_not_release() {
    let s = Server::start();
    let ks = ks(STAGE);
    let a = s.node(STAGE, "twice");
    let _: () = s
        .con()
        .set_ex(ks.heartbeat("twice"), "other-process-boot", 60)
        .unwrap();
    let beats = a.stats().heartbeats;
    wait_for(LONG, "two more ticks", || {
        (a.stats().heartbeats >= beats + 2).then_some(())
    });
    a.shutdown().unwrap();
    let now = get(&s, &ks.heartbeat("twice"));
    assert_ne!(now.as_deref(), Some("released"));
}

// An operator's Ctrl-C must work at every moment. Fault: `sfu-redis node` started with the id
// of a running node waits (up to that node's heartbeat TTL and an interval, 40 s here) for the
// id to be free; SIGINT arrives during the wait. Protection: the start-up runs on a thread of
// its own and the signal ends the command at once (exit 130, nothing registered: the running
// node's heartbeat key is untouched). Fails if the signal is only seen once the start returns:
// the command is given a minute to exit, past its 40 s wait, so the bound below decides.
// The signal is sent once the command says it is waiting (its warning on stderr).
#[test]
fn sigint_during_a_start_up_wait_exits_at_once() {
    let s = Server::start();
    let ks = ks(STAGE);
    let t = Timings::from_heartbeat(Duration::from_secs(10), Duration::from_secs(30));
    let a = s.node_with(STAGE, "busy", t);
    let token = get(&s, &ks.heartbeat("busy")).expect("a's heartbeat key");
    let mut child = std::process::Command::new(procs::cli_bin())
        .args([
            "node",
            "--stage",
            STAGE,
            "--redis-url",
            &s.url(),
            "--instance-id",
            "busy",
        ])
        .args([
            "--heartbeat-interval-ms",
            "10000",
            "--heartbeat-ttl-ms",
            "30000",
        ])
        .env_remove("REDIS_URL")
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn sfu-redis node");
    let (tx, lines) = std::sync::mpsc::channel::<String>();
    let stderr = child.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut err = String::new();
    wait_for(LONG, "the command waiting for the id", || {
        while let Ok(line) = lines.try_recv() {
            err.push_str(&line);
            err.push('\n');
        }
        err.contains("waiting for its heartbeat to expire")
            .then_some(())
    });
    assert!(child.try_wait().unwrap().is_none(), "still waiting: {err}");
    let sent = Instant::now();
    let kill = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = wait_for(Duration::from_secs(60), "the node command to exit", || {
        child.try_wait().unwrap()
    });
    let took = sent.elapsed();
    // The reader sees the end of stderr once the command has exited.
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(5)) {
        err.push_str(&line);
        err.push('\n');
    }
    assert!(
        took < Duration::from_secs(10),
        "the command exited {took:?} after SIGINT: the signal waited for the start-up: {err}"
    );
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted during start-up"), "{err}");
    assert_eq!(get(&s, &ks.heartbeat("busy")), Some(token));
    drop(a);
}

// A crashed process's heartbeat key expires on its own TTL, which may be longer than the
// restarting node's (the fleet changed its timings): the start waits for the key's remaining
// TTL as read when first met, not only for its own heartbeat TTL. Here the crashed life ran
// with a 6 s TTL and the new one has 1 s: it registers once the old key expired (some 6 s),
// where it used to give up after 1.3 s naming instance_id.
#[test]
fn a_restart_waits_for_the_crashed_life_s_longer_heartbeat_ttl() {
    let s = Server::start();
    let ks = ks(STAGE);
    let old = Timings::from_heartbeat(Duration::from_secs(2), Duration::from_secs(6));
    let a = s.node_with(STAGE, "longer", old);
    a.pin_room("kept-by-the-old-life").unwrap();
    a.simulate_crash();
    let pttl: i64 = s.con().pttl(ks.heartbeat("longer")).unwrap();
    assert!(
        pttl > 3000,
        "the crashed life's key has most of its TTL left ({pttl} ms)"
    );
    let new = Timings::from_heartbeat(Duration::from_millis(300), Duration::from_secs(1));
    let started = Instant::now();
    let b =
        Node::start(s.config_with(STAGE, "longer", new)).expect("start after the old key expired");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1500),
        "registered after {took:?}, before the old key expired?"
    );
    let token = get(&s, &ks.heartbeat("longer")).expect("b's heartbeat key");
    assert_ne!(token, "released");
    // The earlier life's room was cleared at registration.
    assert_eq!(get(&s, &ks.room("kept-by-the-old-life").owner), None);
    b.shutdown().unwrap();
}
