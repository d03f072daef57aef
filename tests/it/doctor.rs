//! `sfu-redis doctor` on private redis-servers: a good server passes (exit 0, one JSON object
//! with every check), an evicting policy fails naming the keys at risk, a server that refuses
//! `CONFIG` / `INFO` / `ACL` gets "could not tell" on those checks while the rest run, a user
//! missing `EVALSHA` fails the ACL check, Redis down exits 2; no password in any output. And
//! the list of commands the ACL check probes (`sfu_redis::ops::commands::COMMANDS`) holds every
//! command a fleet, `status` and `fsck` really send. Sentinel and cluster URLs work.

use crate::support;

use std::collections::BTreeSet;
use std::process::Output;
use std::time::Duration;

use serde_json::Value;
use sfu_redis::ops::audit::{audit, AuditOptions};
use sfu_redis::ops::commands::COMMANDS;
use sfu_redis::ops::status::fleet_status;
use sfu_redis::{PinOutcome, Timings};
use sfu_redis_testkit::devserver::LocalRedis;
use sfu_redis_testkit::sentinel::{SentinelGroup, SentinelOptions};
use support::*;

const STAGE: &str = "doctor";
const LONG: Duration = Duration::from_secs(30);

/// The check names, in output order (a contract: docs/src/deploy/doctor.md).
const NAMES: [&str; 10] = [
    "connect",
    "server_version",
    "maxmemory_policy",
    "persistence",
    "replicas",
    "acl",
    "latency",
    "topology",
    "fleet",
    "schema",
];

fn doctor(url: &str, args: &[&str]) -> Output {
    support::procs::cli_output("doctor", STAGE, url, args)
}

fn text(o: &Output) -> String {
    support::procs::output_text(o)
}

/// The one JSON object of `--json`.
fn json_of(o: &Output) -> Value {
    let out = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1, "one JSON object expected: {}", text(o));
    serde_json::from_str(lines[0]).expect("valid JSON")
}

/// The `(status, detail)` of check `name`.
fn get(report: &Value, name: &str) -> (String, String) {
    let checks = report["checks"].as_array().expect("checks");
    let c = checks
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name} in {report}"));
    (
        c["status"].as_str().expect("status").to_owned(),
        c["detail"].as_str().expect("detail").to_owned(),
    )
}

fn names(report: &Value) -> Vec<String> {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .map(|c| c["name"].as_str().expect("name").to_owned())
        .collect()
}

fn cli(s: &Server, args: &[&str]) -> String {
    s.redis().cli(args).expect("redis-cli")
}

// A default server with a running leader: exit 0, `--json` is one object naming the ten
// checks in order, each ok or warn (the schema check ok: the leader stamped the prefix); the fleet check names the leader and the version. A second
// instance whose record says another version makes the fleet check warn (mixed versions),
// still exit 0. The text report names every check.
#[test]
fn a_good_server_passes_and_json_names_every_check() {
    let s = Server::start_with(&[]);
    let (_leader, _log) = s.leader(STAGE, "doc-leader", Timings::fast());
    let o = doctor(&s.url(), &["--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = json_of(&o);
    assert_eq!(names(&r), NAMES, "{r}");
    for name in NAMES {
        let (status, _) = get(&r, name);
        assert!(status == "ok" || status == "warn", "{name}: {r}");
    }
    for name in [
        "connect",
        "server_version",
        "maxmemory_policy",
        "acl",
        "fleet",
        "schema",
    ] {
        assert_eq!(get(&r, name).0, "ok", "{name}: {r}");
    }
    assert_eq!(r["prefix"], "sfu:doctor:main");
    let (_, fleet) = get(&r, "fleet");
    assert!(fleet.contains("leader doc-leader"), "{fleet}");
    assert!(
        fleet.contains(&format!("version {}", sfu_redis::ops::info::VERSION)),
        "{fleet}"
    );
    let (_, persistence) = get(&r, "persistence");
    assert!(
        persistence.contains("a restart empties Redis"),
        "{persistence}"
    );
    let (_, latency) = get(&r, "latency");
    assert!(latency.contains("over 300 samples"), "{latency}");

    // Another instance, registered by hand, whose record says another version.
    let ks = ks(STAGE);
    let now = s.server_ms();
    cli(
        &s,
        &["ZADD", &ks.heartbeats(), &now.to_string(), "doc-other"],
    );
    cli(
        &s,
        &["SET", &ks.heartbeat("doc-other"), "t", "PX", "600000"],
    );
    cli(
        &s,
        &[
            "HSET",
            &ks.instance_info("doc-other"),
            "version",
            "0.0.1-old",
        ],
    );
    let o = doctor(&s.url(), &["--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let (status, fleet) = get(&json_of(&o), "fleet");
    assert_eq!(status, "warn", "{fleet}");
    assert!(fleet.contains("mixed versions"), "{fleet}");
    assert!(fleet.contains("0.0.1-old"), "{fleet}");

    let o = doctor(&s.url(), &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for name in NAMES {
        assert!(out.lines().any(|l| l.starts_with(name)), "{name}: {out}");
    }
}

// `--maxmemory 100mb --maxmemory-policy allkeys-lru`, no RDB, no AOF: exit 1, the policy
// check fails naming the heartbeat, lease and pin keys; the persistence check says a restart
// empties Redis. volatile-lru fails too (the keys with a TTL); with maxmemory 0 it only warns
// (nothing is evicted until a maxmemory is set): exit 0.
#[test]
fn an_evicting_policy_fails_naming_the_keys_at_risk() {
    let s = Server::start_with(&[
        "--maxmemory",
        "100mb",
        "--maxmemory-policy",
        "allkeys-lru",
        "--save",
        "",
        "--appendonly",
        "no",
    ]);
    let o = doctor(&s.url(), &["--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let r = json_of(&o);
    assert_eq!(r["status"], "fail");
    let (status, detail) = get(&r, "maxmemory_policy");
    assert_eq!(status, "fail", "{detail}");
    for key in [
        "P:{ctl}:hb:<I>",
        "P:{ctl}:leader",
        "P:room:{<R>}:owner",
        "allkeys-lru",
        "every key",
    ] {
        assert!(detail.contains(key), "{key} not in {detail}");
    }
    assert!(get(&r, "persistence").1.contains("none (no RDB, no AOF)"));
    assert!(String::from_utf8_lossy(&o.stderr).contains("maxmemory_policy"));

    cli(&s, &["CONFIG", "SET", "maxmemory-policy", "volatile-lru"]);
    let o = doctor(&s.url(), &["--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let (status, detail) = get(&json_of(&o), "maxmemory_policy");
    assert_eq!(status, "fail", "{detail}");
    assert!(
        detail.contains("P:{ctl}:leader") && !detail.contains("every key"),
        "{detail}"
    );

    cli(&s, &["CONFIG", "SET", "maxmemory", "0"]);
    let o = doctor(&s.url(), &["--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let (status, detail) = get(&json_of(&o), "maxmemory_policy");
    assert_eq!(status, "warn", "{detail}");
    assert!(detail.contains("maxmemory 0"), "{detail}");
}

// `rename-command CONFIG ""`: the persistence check could not tell (and says why), the policy
// is still read from INFO, every other check runs; exit 0. A user refused INFO, CONFIG and ACL
// (-@admin -info): the policy, replica and ACL checks could not tell, connect, version (HELLO),
// latency and fleet still run; exit 0.
#[test]
fn refused_commands_are_could_not_tell_and_the_rest_runs() {
    let s = Server::start_with(&["--rename-command", "CONFIG", ""]);
    let o = doctor(&s.url(), &["--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = json_of(&o);
    assert_eq!(names(&r), NAMES);
    let (status, detail) = get(&r, "persistence");
    assert_eq!(status, "warn", "{detail}");
    assert!(
        detail.starts_with("could not tell: CONFIG GET refused"),
        "{detail}"
    );
    assert_eq!(get(&r, "maxmemory_policy").0, "ok", "{r}");
    for name in ["connect", "server_version", "acl", "latency", "fleet"] {
        assert_eq!(get(&r, name).0, "ok", "{name}: {r}");
    }

    cli(
        &s,
        &[
            "ACL",
            "SETUSER",
            "limited",
            "on",
            ">lim-pw-4471",
            "~*",
            "&*",
            "+@all",
            "-@admin",
            "-info",
        ],
    );
    let url = s.url().replace("redis://", "redis://limited:lim-pw-4471@");
    let o = doctor(&url, &["--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = json_of(&o);
    for name in ["maxmemory_policy", "replicas", "acl"] {
        let (status, detail) = get(&r, name);
        assert_eq!(status, "warn", "{name}: {detail}");
        assert!(detail.starts_with("could not tell: "), "{name}: {detail}");
    }
    assert!(get(&r, "acl")
        .1
        .contains("ACL DRYRUN refused for user limited"));
    for name in ["connect", "server_version", "latency", "fleet"] {
        assert_eq!(get(&r, name).0, "ok", "{name}: {r}");
    }
    assert!(!text(&o).contains("lim-pw-4471"), "{}", text(&o));
}

// A user that may run everything but EVALSHA: the ACL check fails naming EVALSHA and the
// scripts, exit 1; the password appears nowhere (stdout, stderr; text and JSON).
#[test]
fn a_user_without_evalsha_fails_the_acl_check() {
    let s = Server::start_with(&[]);
    cli(
        &s,
        &[
            "ACL",
            "SETUSER",
            "sfuapp",
            "on",
            ">app-pw-90210",
            "~sfu:*",
            "&*",
            "+@all",
            "-evalsha",
        ],
    );
    let url = s.url().replace("redis://", "redis://sfuapp:app-pw-90210@");
    let o = doctor(&url, &["--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let r = json_of(&o);
    let (status, detail) = get(&r, "acl");
    assert_eq!(status, "fail", "{detail}");
    assert!(
        detail.contains("user sfuapp may not run EVALSHA (every script) (nodes need them)"),
        "{detail}"
    );
    assert!(!detail.contains("EVAL "), "EVAL is permitted: {detail}");
    assert!(!text(&o).contains("app-pw-90210"), "{}", text(&o));
    let o = doctor(&url, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("redis://sfuapp:***@"));
    assert!(!text(&o).contains("app-pw-90210"), "{}", text(&o));

    // The same user with the right commands passes.
    cli(&s, &["ACL", "SETUSER", "sfuapp", "+evalsha"]);
    let o = doctor(&url, &["--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(get(&json_of(&o), "acl").0, "ok");
}

// Redis down, or a wrong password: exit 2, one JSON object with only the failed connect check,
// and stderr says it cannot check and why; no password anywhere.
#[test]
fn redis_down_or_refused_exits_2() {
    let port = {
        let r = LocalRedis::start().expect("start redis-server");
        r.port()
    };
    let o = doctor(
        &format!("redis://u:down-pw-3141@127.0.0.1:{port}"),
        &["--json"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let r = json_of(&o);
    assert_eq!(names(&r), ["connect"]);
    assert_eq!(get(&r, "connect").0, "fail");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cannot check Redis"), "{err}");
    assert!(err.contains("connection refused"), "{err}");
    assert!(!text(&o).contains("down-pw-3141"), "{}", text(&o));

    let s = Server::start_with(&[]);
    cli(
        &s,
        &[
            "ACL",
            "SETUSER",
            "someone",
            "on",
            ">right-pw-777",
            "+@all",
            "~*",
        ],
    );
    let url = s.url().replace("redis://", "redis://someone:wrong-pw-555@");
    let o = doctor(&url, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("authentication failed"), "{}", text(&o));
    assert!(!text(&o).contains("wrong-pw-555"), "{}", text(&o));
    // A password sent to a server without one: Redis refuses it too, and the driver says no
    // more than "Password authentication failed"; the hint names that case.
    let s = Server::start_with(&[]);
    let url = s.url().replace("redis://", "redis://:stray-pw-2718@");
    let o = doctor(&url, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("a server without a password refuses one too"),
        "{}",
        text(&o)
    );
    assert!(!text(&o).contains("stray-pw-2718"), "{}", text(&o));
}

// What a fleet (heartbeats, pins, peers, the lease, a reap), `status` and `fsck` send, read back
// from the server's INFO commandstats, is all in sfu_redis::ops::commands::COMMANDS: the ACL check
// probes every command the library needs. Fails when a new command is sent but not listed.
#[test]
fn every_command_a_fleet_sends_is_listed() {
    let s = Server::start_with(&[]);
    cli(&s, &["CONFIG", "RESETSTAT"]);
    let (leader, mut log) = s.leader(STAGE, "cmd-keeper", Timings::fast());
    let victim = s.node(STAGE, "cmd-victim");
    assert_eq!(victim.pin_room("cmd-room").unwrap(), PinOutcome::Pinned);
    victim
        .upsert_peer("cmd-room", "cmd-peer", Some("cmd-guest"), &[("k", "v")])
        .unwrap();
    victim
        .upsert_peer("cmd-room", "cmd-peer-2", None, &[])
        .unwrap();
    assert_eq!(leader.pin_room("kept-room").unwrap(), PinOutcome::Pinned);
    let generation = leader
        .upsert_peer("kept-room", "kept-peer", None, &[])
        .unwrap();
    assert!(leader
        .remove_peer("kept-room", "kept-peer", generation)
        .unwrap());
    leader.close_room("kept-room").unwrap();
    victim.simulate_crash();
    log.wait(LONG, "victim reaped", |e| reaped(e, "cmd-victim"));
    let config = s.config(STAGE, "cmd-reader");
    fleet_status(&config).unwrap();
    audit(
        &config,
        &AuditOptions {
            repair: false,
            settle: Duration::ZERO,
        },
    )
    .unwrap();
    leader.shutdown().unwrap();

    let stats = cli(&s, &["INFO", "commandstats"]);
    let listed: BTreeSet<&str> = COMMANDS.iter().map(|c| c.name).collect();
    // Sent by this test or the driver, not by the library.
    let ignored = [
        "CONFIG RESETSTAT",
        "CONFIG SET",
        "INFO",
        "CLIENT SETINFO",
        "HELLO",
    ];
    let mut sent = BTreeSet::new();
    for line in stats.lines() {
        let Some(rest) = line.strip_prefix("cmdstat_") else {
            continue;
        };
        let name = rest.split(':').next().unwrap_or("").replace('|', " ");
        sent.insert(name.to_ascii_uppercase());
    }
    assert!(sent.contains("EVALSHA") && sent.contains("SET"), "{stats}");
    let missing: Vec<&String> = sent
        .iter()
        .filter(|c| !listed.contains(c.as_str()) && !ignored.contains(&c.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "sent but not in COMMANDS: {missing:?}\n{stats}"
    );
}

// Through sentinels (a master with one replica): the topology names the master and the
// sentinel, the replica check counts the replica. On a 3-master cluster every server check
// runs on each master (one detail "(every master)" when they agree) and the topology lists the
// masters and the one serving {ctl}. Both pass (exit 0).
#[test]
fn sentinel_and_cluster_urls_are_checked() {
    let group = SentinelGroup::start(SentinelOptions::default()).expect("sentinel group");
    let o = doctor(&group.url(), &["--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = json_of(&o);
    let (status, topology) = get(&r, "topology");
    assert_eq!(status, "ok", "{topology}");
    assert!(
        topology.starts_with("sentinel: master ") && topology.contains("\"mymaster\""),
        "{topology}"
    );
    let (_, replicas) = get(&r, "replicas");
    assert!(replicas.starts_with("1 replica(s)"), "{replicas}");
    drop(group);

    let s = Server::cluster(3, 0);
    let o = doctor(&s.url(), &["--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = json_of(&o);
    let (_, topology) = get(&r, "topology");
    assert!(topology.starts_with("cluster: 3 master(s)"), "{topology}");
    assert!(
        topology.contains("control plane ({ctl}) on 127.0.0.1:"),
        "{topology}"
    );
    for name in ["server_version", "maxmemory_policy", "acl"] {
        let (status, detail) = get(&r, name);
        assert_eq!(status, "ok", "{name}: {detail}");
        assert!(detail.ends_with("(every master)"), "{name}: {detail}");
    }
}

/// The server checks of the report, each of which must name a master that did not answer.
const SERVER_CHECKS: [&str; 7] = [
    "server_version",
    "maxmemory_policy",
    "persistence",
    "replicas",
    "acl",
    "latency",
    "topology",
];

// Issue 26 item 3: doctor remembers a master that did not answer. Fault: one master of a
// 3-master cluster is stopped with SIGSTOP (it accepts connections but answers nothing): first
// the URL's first seed (the connect's slot-map read meets it), then the master holding `{ctl}`
// (or another one). Protection: the run waits for it once, about two command timeouts in all
// (measured against a bound of 6 x the 1 s timeout; the old code opened a new connection per
// check and waited 2 timeouts each time: 16 to 30 timeouts), every server check fails naming
// it (the first it met with the error, the later ones with "not checked: <master> did not
// answer in check <name>"), the report is one JSON object and stderr only says which checks
// failed (no progress output into a pipe), exit 1. On a terminal (`script`'s pseudo-terminal)
// a progress line names the check under way; with --json there is none.
#[test]
fn a_paused_master_is_waited_for_once_and_named_by_every_check() {
    let s = Server::cluster(3, 0);
    let cluster = s.nodes().expect("a cluster");
    let url = s.url();
    let first = url
        .split("://")
        .nth(1)
        .and_then(|hosts| hosts.split(',').next())
        .and_then(|h| h.rsplit_once(':'))
        .and_then(|(_, p)| p.parse::<u16>().ok())
        .expect("the URL's first seed");
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(ks(STAGE).leader())
        .query(&mut s.con())
        .unwrap();
    let ctl = cluster.master_of_slot(slot).expect("the {ctl} master");
    let other = if ctl != first {
        ctl
    } else {
        *cluster
            .master_ports()
            .iter()
            .find(|p| **p != first)
            .expect("another master")
    };
    let timeout = Duration::from_millis(1000);
    let ms = timeout.as_millis().to_string();
    support::procs::cli_bin(); // built before the clock starts
    for paused in [first, other] {
        assert!(cluster.wait_ok(LONG), "the cluster is ok before the pause");
        cluster.pause(paused);
        let t = std::time::Instant::now();
        let o = doctor(&url, &["--json", "--command-timeout-ms", &ms]);
        let took = t.elapsed();
        let r = json_of(&o);
        cluster.resume(paused);
        let name = format!("127.0.0.1:{paused}");
        eprintln!("doctor with {name} paused took {took:?}");
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(
            took < timeout * 6,
            "doctor with {name} paused took {took:?}, over 6 x the {timeout:?} timeout"
        );
        for check in SERVER_CHECKS {
            let (status, detail) = get(&r, check);
            assert_eq!(status, "fail", "{check}: {detail}");
            assert!(detail.contains(&name), "{check} names {name}: {detail}");
        }
        let skipped = SERVER_CHECKS
            .iter()
            .filter(|c| {
                get(&r, c)
                    .1
                    .contains(&format!("not checked: {name} did not answer in check "))
            })
            .count();
        assert!(skipped >= SERVER_CHECKS.len() - 1, "{r}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(
            err.lines().count(),
            1,
            "only the verdict on stderr: {err:?}"
        );
        assert!(
            err.starts_with("sfu-redis: error: ")
                && err.contains("check(s) failed: server_version, maxmemory_policy"),
            "{err}"
        );
    }

    // On a terminal: a progress line, none with --json.
    assert!(cluster.wait_ok(LONG), "the cluster is ok again");
    let run = |json: bool| {
        cluster.pause(other);
        let cmd = format!(
            "'{}' doctor --stage {STAGE} --redis-url '{url}' --command-timeout-ms {ms}{}",
            support::procs::cli_bin().display(),
            if json { " --json" } else { "" }
        );
        let o = std::process::Command::new("script")
            .args(["-qfec", &cmd, "/dev/null"])
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run script(1) (util-linux) for a pseudo-terminal");
        cluster.resume(other);
        assert!(cluster.wait_ok(LONG), "the cluster is ok again");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let tty = run(false);
    assert!(
        tty.contains("[2/9] server_version on ") && tty.contains("[9/9] topology on "),
        "{tty:?}"
    );
    assert!(
        tty.contains(&format!("skipped: 127.0.0.1:{other}")),
        "{tty:?}"
    );
    let tty = run(true);
    assert!(!tty.contains("/9]"), "{tty:?}");
    assert!(tty.contains("\"checks\""), "{tty:?}");
}
