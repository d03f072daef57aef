//! Signals never break a clean stop or a call (issue 26, item 2; the crate's `signals` module
//! and the CLI's `signals.rs`).
//!
//! A blocking socket read with a timeout (every connection of the library has one) is never
//! restarted after a signal handler ran: it fails with `EINTR`. Before the fix, a burst of
//! SIGTERMs during `node --leave-on-exit` failed the leave with "Interrupted system call"
//! (8 of 10 runs of 3,000 rooms), and a host thread with a signal handler saw its calls fail.

use crate::support;

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sfu_redis::Timings;
use support::procs::cli_bin;
use support::*;

/// Runs of each scenario (the issue asks for 20, every one clean).
const RUNS: usize = 20;

/// `kill(pid, sig)`.
fn kill(pid: u32, sig: libc::c_int) -> bool {
    let pid = libc::pid_t::try_from(pid).expect("a pid");
    // SAFETY: kill(2) has no memory preconditions.
    unsafe { libc::kill(pid, sig) == 0 }
}

/// Every key of `stage` but the dataset token, the epoch counter and the schema stamp (they
/// belong to the prefix, not to a node).
fn keys_of(s: &Server, stage: &str) -> Vec<String> {
    s.keys(&format!("sfu:{stage}:*"))
        .into_iter()
        .filter(|k| {
            !k.ends_with(":{ctl}:dataset")
                && !k.ends_with(":{ctl}:epoch")
                && !k.ends_with(":{ctl}:schema")
        })
        .collect()
}

/// One `node --leave-on-exit` with `rooms` rooms (one peer each): once it is ready, SIGTERM,
/// then more SIGTERMs every 10 ms for 300 ms (inside the CLI's 1 s repeat window: the same
/// stop request delivered many times), while it closes its rooms. Returns why it was not
/// clean, if it was not.
fn leave_under_a_signal_burst(s: &Server, stage: &str, rooms: usize) -> Option<String> {
    let names: Vec<String> = (0..rooms).map(|i| format!("r{i}")).collect();
    let mut child = Command::new(cli_bin())
        .args(["node", "--json", "--leave-on-exit", "--stage", stage])
        .args(["--instance-id", stage, "--redis-url", &s.url()])
        .args(["--rooms", &names.join(","), "--peers-per-room", "0"])
        .args(procs::FAST)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sfu-redis node");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if line.contains("\"ready\"") {
                let _ = tx.send(());
            }
        }
    });
    if rx.recv_timeout(LONG * 4).is_err() {
        let _ = child.kill();
        let _ = child.wait();
        return Some("the node never became ready".into());
    }
    let pid = child.id();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(300) && kill(pid, libc::SIGTERM) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().expect("wait for the node");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Some(format!("exit {:?}: {stderr}", out.status));
    }
    let left = keys_of(s, stage);
    (!left.is_empty()).then(|| format!("{} keys left, e.g. {:?}", left.len(), &left[..1]))
}

// A burst of SIGTERMs during a leave of 2,000 rooms: every one of 20 runs exits 0 and leaves
// nothing. Before the fix: exit 1 "remove peers from instance index: ... Interrupted system
// call (os error 4)" with index keys left, in 8 of 10 runs.
#[test]
fn a_burst_of_sigterm_during_a_leave_of_thousands_of_rooms_stops_cleanly() {
    let s = Server::start();
    let failures: Vec<String> = std::thread::scope(|scope| {
        // Four at a time, each on its own stage.
        let lanes: Vec<_> = (0..4)
            .map(|lane| {
                let s = &s;
                scope.spawn(move || {
                    (lane..RUNS)
                        .step_by(4)
                        .filter_map(|run| {
                            let stage = format!("sig{run}");
                            leave_under_a_signal_burst(s, &stage, 2000)
                                .map(|why| format!("run {run}: {why}"))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        lanes
            .into_iter()
            .flat_map(|l| l.join().expect("a lane"))
            .collect()
    });
    assert!(
        failures.is_empty(),
        "{} of {RUNS} leaves under a SIGTERM burst were not clean:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// SIGUSR1s received by [`on_usr1`].
static USR1: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_usr1(_: libc::c_int) {
    USR1.fetch_add(1, Ordering::Relaxed);
}

/// Installs [`on_usr1`] for SIGUSR1 as a host would (no `SA_RESTART`: with it, a read with a
/// timeout is not restarted either).
fn install_usr1_handler() {
    // SAFETY: a zeroed sigaction is valid; the handler only touches an atomic
    // (async-signal-safe); nothing else in this test binary uses SIGUSR1.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_usr1 as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
}

// A host thread that receives signals in a loop while it calls the library (a host with its
// own handlers: the C++ example installs some): 20 rounds of pins, upserts, removes and
// closes, a SIGUSR1 sent to that very thread every 20 µs. Every call succeeds and the handler
// does run (so the signals did arrive). Before the fix calls failed with "Interrupted system
// call (os error 4)".
#[test]
fn a_host_thread_that_receives_signals_in_a_loop_loses_no_call() {
    install_usr1_handler();
    let s = Server::start();
    let node = Arc::new(s.node("sigh", "host"));
    for round in 0..RUNS {
        let (node2, done) = (Arc::clone(&node), Arc::new(AtomicBool::new(false)));
        let done2 = Arc::clone(&done);
        // SAFETY: pthread_self has no preconditions.
        let (tid_tx, tid_rx) = std::sync::mpsc::channel::<libc::pthread_t>();
        let host = std::thread::spawn(move || {
            tid_tx.send(unsafe { libc::pthread_self() }).expect("send");
            let mut errors = Vec::new();
            for i in 0..40 {
                let room = format!("room-{round}-{i}");
                let step = || -> sfu_redis::Result<()> {
                    node2.pin_room(&room)?;
                    let g = node2.upsert_peer(&room, "p1", Some("g1"), &[("k", "v")])?;
                    node2.upsert_peer(&room, "p2", None, &[])?;
                    node2.remove_peer(&room, "p1", g)?;
                    node2.close_room(&room)
                };
                if let Err(e) = step() {
                    errors.push(format!("{room}: {e}"));
                }
            }
            done2.store(true, Ordering::Release);
            errors
        });
        let tid = tid_rx.recv().expect("the host thread's id");
        let before = USR1.load(Ordering::Relaxed);
        while !done.load(Ordering::Acquire) {
            // SAFETY: the thread is alive until `done` is set (it joins below).
            unsafe { libc::pthread_kill(tid, libc::SIGUSR1) };
            std::thread::sleep(Duration::from_micros(20));
        }
        let errors = host.join().expect("the host thread");
        assert!(errors.is_empty(), "round {round}: calls failed: {errors:?}");
        assert!(
            USR1.load(Ordering::Relaxed) > before,
            "round {round}: no signal reached the host thread"
        );
    }
    assert_eq!(node.stats().rooms, 0);
    assert!(
        keys_of(&s, "sigh").iter().all(|k| !k.contains(":room:")),
        "every room closed"
    );
}

/// The threads of this process named `prefix*`, with their blocked-signal masks.
fn thread_masks(prefix: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let dir = task.expect("a task").path();
        let (Ok(comm), Ok(status)) = (
            std::fs::read_to_string(dir.join("comm")),
            std::fs::read_to_string(dir.join("status")),
        ) else {
            continue; // ended meanwhile
        };
        let name = comm.trim().to_owned();
        if !name.starts_with(prefix) {
            continue;
        }
        let mask = status
            .lines()
            .find_map(|l| l.strip_prefix("SigBlk:"))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .expect("a SigBlk line");
        out.push((name, mask));
    }
    out
}

// Every thread the library starts blocks the asynchronous signals (so a process-directed
// signal is delivered to a host thread), and never the synchronous ones.
#[test]
fn the_library_s_own_threads_block_the_asynchronous_signals() {
    let s = Server::start();
    let node = s.node_with("sigt", "masked", Timings::fast());
    let bit = |sig: libc::c_int| 1u64 << (sig - 1);
    // The library's own names (other threads of this test process are the harness's). A
    // thread names itself once it runs: poll.
    let names = ["sfu-heartbeat", "sfu-lease", "sfu-reaper"];
    let masks = wait_for(LONG, "the node's three threads", || {
        let m: Vec<_> = thread_masks("sfu-")
            .into_iter()
            .filter(|(n, _)| names.contains(&n.as_str()))
            .collect();
        names
            .iter()
            .all(|want| m.iter().any(|(n, _)| n == want))
            .then_some(m)
    });
    for (name, mask) in &masks {
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGUSR1, libc::SIGHUP] {
            assert_ne!(mask & bit(sig), 0, "{name} does not block signal {sig}");
        }
        for sig in [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE] {
            assert_eq!(mask & bit(sig), 0, "{name} blocks synchronous signal {sig}");
        }
    }
    node.shutdown().unwrap();
}

// Signals that mean nothing to the CLI never end a node without its clean stop (an
// adversarial trial: SIGUSR1, SIGUSR2 and SIGALRM ended `node` at once, exit 138/140/142, with
// a live boot token in its heartbeat key and its lease kept, before and after the sigwait
// thread came in; SIGHUP, a closed terminal, did the same with 129 once the sigwait thread
// replaced ctrlc, which had handled it). Now the three are ignored (the node keeps
// heartbeating) and SIGHUP is a stop request like SIGTERM: exit 0, heartbeat and lease
// released.
#[test]
fn stray_signals_never_end_a_node_without_its_clean_stop() {
    let s = Server::start();
    for (stage, stop) in [("sigu", libc::SIGTERM), ("sighup", libc::SIGHUP)] {
        let ks = ks(stage);
        let mut child = Command::new(cli_bin())
            .args(["node", "--json", "--stage", stage, "--instance-id", stage])
            .args(["--redis-url", &s.url()])
            .args(procs::FAST)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn sfu-redis node");
        wait_for(LONG, "the node registered", || {
            redis::cmd("EXISTS")
                .arg(ks.heartbeat(stage))
                .query::<bool>(&mut s.con())
                .ok()?
                .then_some(())
        });
        let pid = child.id();
        for sig in [libc::SIGUSR1, libc::SIGUSR2, libc::SIGALRM] {
            assert!(kill(pid, sig));
        }
        // Still running a while later, and still heartbeating.
        let before = s.server_ms();
        wait_for(LONG, "a heartbeat after the stray signals", || {
            let score: Option<f64> = redis::cmd("ZSCORE")
                .arg(ks.heartbeats())
                .arg(stage)
                .query(&mut s.con())
                .ok()?;
            score.filter(|&t| t as i64 > before).map(|_| ())
        });
        assert!(
            child.try_wait().expect("try_wait").is_none(),
            "{stage}: a stray signal ended the node"
        );
        assert!(kill(pid, stop));
        let code = wait_for(LONG, "the node's exit", || {
            child.try_wait().expect("try_wait")
        });
        assert!(code.success(), "{stage}: exit {code} after signal {stop}");
        let hb: Option<String> = redis::cmd("GET")
            .arg(ks.heartbeat(stage))
            .query(&mut s.con())
            .unwrap();
        assert_eq!(
            hb.as_deref(),
            Some("released"),
            "{stage}: heartbeat released"
        );
        let lease: bool = redis::cmd("EXISTS")
            .arg(ks.leader())
            .query(&mut s.con())
            .unwrap();
        assert!(!lease, "{stage}: lease released");
    }
}
