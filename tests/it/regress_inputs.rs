//! Regression tests: hostile inputs. Ids at the size limit made of every odd character,
//! branch names that differ only by characters the prefix escapes, Redis passwords in URL
//! forms that are easy to redact wrongly, absurd CLI flags, garbage under the keys `status`
//! reads, and the event channel's contract.
//!
//! Promises covered: docs/DESIGN.md "ids are data, not syntax", invariants 2 and 5 (nothing of a
//! reaped instance remains; nothing crosses a prefix), and docs/src/rust/errors.md's "no error or log line
//! ever contains the password of a Redis URL", `status` robustness and the events contract.

use crate::support;

use std::process::Command;
use std::time::{Duration, Instant};

use sfu_redis::keys::{encode_id, IdKind};
use sfu_redis::ops::status::fleet_status;
use sfu_redis::{redact_url, Config, Event, Node, PinOutcome, Timings, EVENT_CAPACITY};
use support::*;

// ---------------------------------------------------------------------------------------------
// Ids
// ---------------------------------------------------------------------------------------------

/// Stage of the id tests.
const IDS: &str = "bid";

/// An id of exactly `len` bytes built from `alphabet` (cycled, cut at a char boundary and
/// padded with 'x').
fn id_of(alphabet: &str, len: usize) -> String {
    let mut s = String::new();
    for c in alphabet.chars().cycle() {
        if s.len() + c.len_utf8() > len {
            break;
        }
        s.push(c);
    }
    while s.len() < len {
        s.push('x');
    }
    s
}

// Protects: "ids are data, not syntax" (any non-empty UTF-8 id up to 256 bytes works) end to
// end, with invariants 2 and 4.
// Fault: room, peer, guest and instance ids of exactly 256 bytes built from `:`, `{}`, `*`,
// `/`, `%`, bidi and zero-width characters, key-like text (`{ctl}:heartbeats`), already
// percent-encoded text; a full life (pin, upsert with guests, a reconnect with a new peer id,
// the old connection's late remove), a room of the leader whose id is the escaped form of one
// of the victim's, then a crash and the reap.
// Protection: ids are percent-encoded wherever they appear in a key or a joined value, so they
// can neither collide nor break the hash tag. Without it, a pin, an index check or the reap
// goes wrong: index problems, leftovers naming the victim, or the lookalike room of the leader
// reaped (or owned by the wrong node).
#[test]
fn odd_ids_at_the_limit_survive_a_full_life_and_reap() {
    let s = Server::start();
    let ks = ks(IDS);
    let alphabets = [
        ":{}*/ %?#[]\\\"'`~!@$^&()+=|<>,;",
        "방🙂\u{202E}\u{200F}\u{FEFF}\u{200B}é́ñ",
        "%25%3A%7B%7D",
        "{ctl}:heartbeats",
        "a/b/c/../..//",
        "*?[^]-",
        "\u{00A0}\u{2028}\u{2029}\u{FFFD}",
    ];
    let leader_id = id_of("leader {ctl}:*/", 256);
    let (leader, mut log) = s.leader(IDS, &leader_id, Timings::fast());
    let victim_id = id_of("victim:{x}/ 방%", 256);
    let victim = Node::start(s.config(IDS, &victim_id)).unwrap();
    let mut victim_rooms = Vec::new();
    for (i, a) in alphabets.iter().enumerate() {
        let room = id_of(&format!("{i}{a}"), 256);
        let peer = id_of(&format!("p{i}{a}"), 256);
        let peer2 = id_of(&format!("q{i}{a}"), 256);
        let guest = id_of(&format!("g{i}{a}"), 256);
        assert_eq!(
            victim.pin_room(&room).unwrap(),
            PinOutcome::Pinned,
            "{room:?}"
        );
        let g1 = victim
            .upsert_peer(&room, &peer, Some(&guest), &[("n", a)])
            .unwrap();
        // The guest reconnects with a new peer id; the old connection's remove is a no-op.
        victim
            .upsert_peer(&room, &peer2, Some(&guest), &[])
            .unwrap();
        assert!(!victim.remove_peer(&room, &peer, g1).unwrap());
        assert_eq!(
            victim.room_owner(&room).unwrap().as_deref(),
            Some(victim_id.as_str())
        );
        victim_rooms.push(room);
    }
    // The leader pins a room whose id differs only by escaping from one of the victim's.
    let lookalike = encode_id(IdKind::Room, &victim_rooms[0]).unwrap();
    if lookalike.len() <= 256 {
        assert_eq!(leader.pin_room(&lookalike).unwrap(), PinOutcome::Pinned);
    }
    assert!(
        s.index_problems(&ks).is_empty(),
        "{:#?}",
        s.index_problems(&ks)
    );
    victim.simulate_crash();
    log.wait(LONG, "victim reaped", |e| reaped(e, &victim_id));
    std::thread::sleep(Duration::from_millis(300));
    let dump = s.dump(&ks.scan_pattern());
    let mut needles = vec![wire(IdKind::Instance, &victim_id)];
    for r in &victim_rooms {
        needles.push(format!("{{{}}}", wire(IdKind::Room, r)));
    }
    let left = references(&dump, &needles);
    assert!(left.is_empty(), "leftovers of the reaped victim: {left:#?}");
    if lookalike.len() <= 256 {
        assert_eq!(
            leader.room_owner(&lookalike).unwrap().as_deref(),
            Some(leader_id.as_str())
        );
    }
    assert!(
        s.index_problems(&ks).is_empty(),
        "{:#?}",
        s.index_problems(&ks)
    );
}

// Protects: the id rule's other side: empty, oversized or control-character ids get
// `Error::InvalidId` and nothing is written.
// Fault: ids one byte over the limit (multi-byte characters up to 255 bytes, then 2 more),
// a BEL as the last character of a 256-byte id, C1 controls (NEL, U+009F) and a CR.
// Protection: validation by bytes (not chars) and over the whole id, including C1 controls.
// A check by char count or of ASCII controls only would let some of these through, and they
// would be written under the room's keys.
#[test]
fn ids_over_the_limit_or_with_controls_are_refused() {
    let s = Server::start();
    let n = s.node(IDS, "n");
    for bad in [
        id_of("방", 255) + "xx", // 257 bytes
        id_of("a", 255) + "\u{7}",
        "a\u{85}b".to_owned(), // NEL (C1 control)
        "\u{9F}".to_owned(),
        "a\rb".to_owned(),
    ] {
        let e = n.pin_room(&bad).unwrap_err();
        assert_eq!(e.kind(), sfu_redis::ErrorKind::InvalidId, "{bad:?}: {e}");
    }
    assert_eq!(s.keys("sfu:bid:main:room:*"), Vec::<String>::new());
}

// ---------------------------------------------------------------------------------------------
// Prefixes
// ---------------------------------------------------------------------------------------------

fn branch_config(s: &Server, branch: &str, instance: &str) -> Config {
    Config::builder()
        .redis_url(s.url())
        .stage("dev")
        .branch(branch)
        .instance_id(instance)
        .timings(Timings::fast())
        .build()
        .unwrap()
}

// Protects: invariant 5 ("nothing crosses a prefix": dev/prod or two branches share one Redis
// without seeing or reaping each other) with real-world branch names.
// Fault: git branches `feature/login` and `feature_login` on one Redis; the leader runs on
// `feature_login`, a node of `feature/login` pins a room and crashes.
// Protection: prefix segments are escaped injectively (`_` becomes `__`, other bytes outside
// `[A-Za-z0-9.-]` become `_XX`). A lossy normalization (every other character to `_`) would give
// both branches one prefix, and the leader of `feature_login` would reap the instance of
// `feature/login`.
#[test]
fn branches_differing_only_by_escaped_characters_never_reap_each_other() {
    let s = Server::start();
    let a_cfg = branch_config(&s, "feature/login", "node-on-slash-branch");
    let b_cfg = branch_config(&s, "feature_login", "node-on-underscore-branch");
    let same_prefix = a_cfg.keys().prefix() == b_cfg.keys().prefix();

    // The leader runs on branch `feature_login`.
    let leader = Node::start(b_cfg).unwrap();
    let mut log = EventLog::new(&leader);
    log.wait(LONG, "leader", |e| {
        matches!(e, Event::LeaderAcquired { .. })
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
        "branches `feature/login` and `feature_login` must get distinct prefixes (same: {same_prefix}) \
         and the leader of `feature_login` must not reap the instance of `feature/login`: {crossed:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Passwords
// ---------------------------------------------------------------------------------------------

/// The part of each test password that must never be printed.
const TAIL: &str = "Xq7TailOfPassw0rd";

/// Every text a user may see for `url`: its redaction, the config error or the config's Debug,
/// and the error of a start that cannot connect.
fn error_texts(url: &str) -> Vec<String> {
    let t = Timings::from_heartbeat(Duration::from_millis(200), Duration::from_millis(600));
    let cfg = Config::builder()
        .redis_url(Some(url))
        .instance_id("x")
        .timings(t);
    let mut texts = vec![redact_url(url)];
    match cfg.build() {
        Err(e) => {
            texts.push(e.to_string());
            texts.push(format!("{e:?}"));
        }
        Ok(c) => {
            texts.push(format!("{c:?}"));
            match Node::start(c) {
                Err(e) => {
                    texts.push(e.to_string());
                    texts.push(format!("{e:?}"));
                }
                Ok(_) => panic!("{url} connected"),
            }
        }
    }
    texts
}

// Protects: docs/src/rust/errors.md: "no error or log line ever contains the password of a Redis URL".
// Fault: a Unix-socket URL whose password (read by redis-rs from the `?pass=` query) holds an
// `@`, common in generated passwords.
// Protection: redact_url parses the URL with the `url` crate and redacts the password
// wherever redis-rs reads it. Splitting the user info at the last `@` of the whole URL would
// cut the password there and print the rest as if it were the host
// (`redis+unix://***@<rest of the password>`).
#[test]
fn unix_socket_password_with_an_at_sign_is_never_printed() {
    let url = format!("redis+unix:///tmp/sfu-no-such-redis.sock?pass=abc@{TAIL}");
    let leaks: Vec<String> = error_texts(&url)
        .into_iter()
        .filter(|t| t.contains(TAIL))
        .collect();
    assert!(leaks.is_empty(), "password tail printed: {leaks:#?}");
}

// Protects: the same promise for a percent-encoded parameter name.
// Fault: `?p%61ss=<password>`, which redis-rs decodes to `pass` and uses as the password; the
// test first proves that with a real server on a Unix socket with requirepass.
// Protection: query parameter names are compared after percent-decoding. Comparing raw names,
// the Config's Debug and every error would print the password verbatim.
#[test]
fn unix_socket_password_under_a_percent_encoded_name_is_never_printed() {
    let dir = std::env::temp_dir().join(format!("sfu-regress-pw-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("r.sock");
    let s = Server::start_with(&["--unixsocket", sock.to_str().unwrap()]);
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(TAIL)
        .query(&mut s.con())
        .unwrap();
    let good = format!("redis+unix://{}?p%61ss={TAIL}", sock.display());
    let cfg = Config::builder()
        .redis_url(&good)
        .instance_id("y")
        .build()
        .unwrap();
    let shown = format!("{cfg:?}");
    let node = Node::start(cfg).expect("p%61ss= is the password for redis-rs");
    drop(node);
    assert!(
        !shown.contains(TAIL),
        "Config Debug shows the password: {shown}"
    );

    let url = format!("redis+unix:///tmp/sfu-no-such-redis.sock?p%61ss={TAIL}");
    let leaks: Vec<String> = error_texts(&url)
        .into_iter()
        .filter(|t| t.contains(TAIL))
        .collect();
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(leaks.is_empty(), "password printed: {leaks:#?}");
}

// Protects: the same promise through the binary, with debug logging on.
// Fault: `sfu-redis node` with the `pass=abc@<tail>` Unix-socket URL and RUST_LOG=debug (the
// connection fails; every log line and the error go to stderr).
// Protection: the binary and the library print only redacted URLs. A single unredacted log
// line or error would show the password tail in the output.
#[test]
fn cli_never_prints_the_password_even_with_debug_logging() {
    let url = format!("redis+unix:///tmp/sfu-no-such-redis.sock?pass=abc@{TAIL}");
    let out = Command::new(support::procs::cli_bin())
        .args([
            "node",
            "--redis-url",
            &url,
            "--heartbeat-interval-ms",
            "200",
            "--heartbeat-ttl-ms",
            "600",
        ])
        .env("RUST_LOG", "debug")
        .output()
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !all.contains(TAIL),
        "exit {:?}; output shows the password tail:\n{all}",
        out.status
    );
}

// ---------------------------------------------------------------------------------------------
// CLI flags and `status` against garbage
// ---------------------------------------------------------------------------------------------

/// Stage of the status tests.
const ST: &str = "st";

// Protects: the CLI's usage contract (a bad flag exits 2 with a message naming it) and the
// host's memory.
// Fault: `sfu-redis node --rooms r --peers-per-room 4294967295` (any u32 parses), run under
// `ulimit -v 1000000` so a runaway allocation cannot exhaust the test machine; memory-only
// mode, no Redis needed.
// Protection: the start-up plan is checked against limits (at most 100 000 peers per room,
// 1 000 000 in all) before anything is built. Building every peer and guest id up front, the
// process would abort with "memory allocation of N bytes failed" (SIGABRT) instead.
#[test]
fn huge_peers_per_room_is_refused_with_exit_2_naming_the_flag() {
    let bin = support::procs::cli_bin().display().to_string();
    let t = Instant::now();
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v 1000000; exec timeout 15 {bin} node --rooms r --peers-per-room 4294967295"
        ))
        .env("RUST_BACKTRACE", "0")
        .env_remove("REDIS_URL")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(2) && stderr.contains("--peers-per-room"),
        "expected exit 2 naming --peers-per-room; got exit {:?} after {:?}; stderr: {stderr}",
        out.status,
        t.elapsed()
    );
}

// Protects: `status` robustness: bad data is reported by key, the rest of the fleet is still
// shown.
// Fault: the epoch control key holds a hash (written by another tool).
// Protection: status reads each control key's type first and judges each reply of its
// pipeline on its own, turning a wrong type into a problem that names the key. If one error
// reply failed the whole read, status would fail with a message naming no key
// ("Pipeline failure: [(Index 3, ...)]").
#[test]
fn status_on_a_wrong_typed_control_key_names_the_key() {
    let s = Server::start();
    let ks = ks(ST);
    let _: () = redis::cmd("HSET")
        .arg(ks.epoch())
        .arg("a")
        .arg("b")
        .query(&mut s.con())
        .unwrap();
    let cfg = s.config(ST, "x");
    let st = fleet_status(&cfg).expect("status still answers");
    assert!(
        st.problems.iter().any(|p| p.contains(&ks.epoch())),
        "no problem names {}: {:?}",
        ks.epoch(),
        st.problems
    );
}

// Protects: `status` robustness for the heartbeats sorted set, through the binary.
// Fault: one member with a fractional score (`ZADD ... 1.5 odd`, written by another tool) next
// to a healthy node holding a room.
// Protection: each score is read as Redis sent it and judged on its own (an odd one becomes a
// problem line). Decoding every score as an integer, `sfu-redis status` would fail entirely
// with a conversion error naming neither the key nor the member, and show nothing of the
// healthy fleet.
#[test]
fn status_survives_an_odd_score_and_shows_the_healthy_fleet() {
    let s = Server::start();
    let ks = ks(ST);
    let healthy = s.node(ST, "healthy");
    healthy.pin_room("r").unwrap();
    let _: () = redis::cmd("ZADD")
        .arg(ks.heartbeats())
        .arg("1.5")
        .arg("odd")
        .query(&mut s.con())
        .unwrap();
    let out = Command::new(support::procs::cli_bin())
        .args(["status", "--redis-url", &s.url(), "--stage", ST])
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

// ---------------------------------------------------------------------------------------------
// Events
// ---------------------------------------------------------------------------------------------

fn memory_node() -> Node {
    Node::start(Config::builder().instance_id("ev").build().unwrap()).unwrap()
}

// Protects: the events contract of docs/src/rust/events.md: the channel is bounded (EVENT_CAPACITY); overflow is
// dropped and counted, nothing blocks.
// Fault: nobody reads while EVENT_CAPACITY + 10 events are emitted.
// Protection: a non-blocking send that counts what it drops. A blocking send would hang this
// test (and a host's threads); an uncounted drop would leave events_dropped at 0.
#[test]
fn overflow_is_dropped_and_counted() {
    let n = memory_node();
    for _ in 0..EVENT_CAPACITY + 10 {
        n.ready();
    }
    assert_eq!(n.stats().events_dropped, 10);
}

// Protects: `Event::Stopped`'s contract "the node shut down; no event follows".
// Fault: the host calls `Node::ready()` after shutdown.
// Protection: `ready()` checks that the node is running (like every other host call) and emits
// nothing after shutdown. Without the check, a `Ready` would follow `Stopped`.
#[test]
fn no_event_follows_stopped() {
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
