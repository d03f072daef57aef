//! `sfu-redis demo` through Redis Sentinel, as a user runs it (the CLI binary): with
//! `--sentinel` it starts its own group and fails the master over mid-show; with `REDIS_URL`
//! naming someone else's sentinel group it runs through it and never fails it over; with
//! `--sentinel` and a plain URL it refuses before starting anything. `demo --svg FILE` draws
//! the run (checked on the `--sentinel` run, the one with the most to draw), and refuses a
//! FILE it cannot write before starting anything.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use sfu_redis_testkit::sentinel::{SentinelGroup, SentinelOptions};

use crate::support::procs::cli_bin;

/// A demo run that takes longer than this is killed and fails the test (a run takes about
/// 10 s; the group's start and failover add a few).
const WATCHDOG: Duration = Duration::from_secs(150);

/// The settings a developer's shell may hold (every variable the library reads, and the log
/// filter); each test sets what it means to.
fn scrubbed() -> impl Iterator<Item = &'static str> {
    sfu_redis::config::ENV_VARS.into_iter().chain(["RUST_LOG"])
}

struct Run {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    took: Duration,
}

impl Run {
    fn show(&self) -> String {
        format!(
            "exit {:?} after {:.1} s\n--- stdout:\n{}\n--- stderr:\n{}",
            self.status.code(),
            self.took.as_secs_f64(),
            self.stdout,
            self.stderr
        )
    }

    /// The one stdout line that contains `needle`.
    fn line(&self, needle: &str) -> &str {
        let found: Vec<&str> = self.stdout.lines().filter(|l| l.contains(needle)).collect();
        assert_eq!(
            found.len(),
            1,
            "lines with {needle:?}: {found:?}\n{}",
            self.show()
        );
        found[0]
    }
}

/// Runs `sfu-redis <args>` with `env` (and nothing of the caller's Redis settings), killing it
/// after [`WATCHDOG`].
fn run_cli(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(cli_bin());
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for var in scrubbed() {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    let start = Instant::now();
    let mut child = cmd.spawn().expect("spawn sfu-redis");
    let pipe = |r: Option<Box<dyn Read + Send>>| {
        let mut r = r.expect("piped");
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = pipe(child.stdout.take().map(|p| Box::new(p) as _));
    let err = pipe(child.stderr.take().map(|p| Box::new(p) as _));
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait for sfu-redis") {
            break st;
        }
        if start.elapsed() > WATCHDOG {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "sfu-redis {args:?} still running after {} s; stdout:\n{}\nstderr:\n{}",
                WATCHDOG.as_secs(),
                out.join().unwrap_or_default(),
                err.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Run {
        status,
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
        took: start.elapsed(),
    }
}

/// The text between `from` and the next `to` after it, in `line`.
fn between<'a>(line: &'a str, from: &str, to: &str) -> &'a str {
    let rest = &line[line
        .find(from)
        .unwrap_or_else(|| panic!("{from:?} in {line:?}"))
        + from.len()..];
    &rest[..rest
        .find(to)
        .unwrap_or_else(|| panic!("{to:?} after {from:?} in {line:?}"))]
}

/// `127.0.0.1:<port>`.
fn is_addr(s: &str) -> bool {
    s.strip_prefix("127.0.0.1:")
        .is_some_and(|p| p.parse::<u16>().is_ok_and(|p| p > 0))
}

/// The count of `all N checks passed` on the last line; fails on any FAIL line.
fn all_passed(run: &Run) -> usize {
    let fails: Vec<&str> = run
        .stdout
        .lines()
        .filter(|l| l.starts_with("  FAIL  ") || l.contains("FAILED"))
        .collect();
    assert!(
        fails.is_empty(),
        "failed checks: {fails:#?}\n{}",
        run.show()
    );
    let last = run.stdout.lines().last().unwrap_or_default();
    let n = between(last, ": all ", " checks passed");
    n.parse()
        .unwrap_or_else(|_| panic!("{last:?}\n{}", run.show()))
}

/// A fresh directory under the system's temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "sfu-redis-demo-test-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::create_dir_all(&dir).expect("create a temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The timeline's lines of `event`: (instance, the line with a space after it). The
/// narration above the timeline names events too, as `<instance>: <event> ...`.
fn timeline(run: &Run, event: &str) -> Vec<(String, String)> {
    run.stdout
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace().skip(1);
            let who = words.next().filter(|w| !w.ends_with(':'))?;
            (words.next() == Some(event)).then(|| (who.to_owned(), format!("{l} ")))
        })
        .collect()
}

/// The timeline's `instance_reaped` lines: dead instance -> the instance that reaped it.
fn reaps(run: &Run) -> BTreeMap<String, String> {
    timeline(run, "instance_reaped")
        .into_iter()
        .map(|(reaper, line)| (between(&line, " dead=", " ").to_owned(), reaper))
        .collect()
}

/// The timeline's `leader_acquired` lines: (instance, epoch).
fn terms(run: &Run) -> Vec<(String, u64)> {
    timeline(run, "leader_acquired")
        .into_iter()
        .map(|(who, line)| {
            let epoch = between(&line, " epoch=", " ").parse().expect("an epoch");
            (who, epoch)
        })
        .collect()
}

/// The `<g class=..>` marks of `class` on instance `id`'s lane (legend samples excluded).
fn marks<'a, 'i>(
    doc: &'a roxmltree::Document<'i>,
    class: &str,
    id: &str,
) -> Vec<roxmltree::Node<'a, 'i>> {
    doc.descendants()
        .filter(|n| {
            n.has_tag_name("g")
                && n.attribute("class") == Some(class)
                && n.attribute("data-instance") == Some(id)
        })
        .collect()
}

/// Every text under `node` (its `<title>` included), joined.
fn all_text(node: roxmltree::Node) -> String {
    node.descendants()
        .filter_map(|n| n.text())
        .collect::<Vec<_>>()
        .join(" | ")
}

/// `demo --svg`'s file, read back with a strict XML parser and held against the run's own
/// timeline: a lane named after each instance, with its heartbeats; a bar per leadership term
/// with its epoch; one crash, one two-phase wait of at least the delay, and one reap (naming
/// the reaper) on each reaped instance's lane; the failover line; the legend's samples.
fn check_picture(path: &Path, run: &Run) {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read {}: {e}\n{}", path.display(), run.show()));
    let doc = roxmltree::Document::parse(&text)
        .unwrap_or_else(|e| panic!("{} is not well-formed XML: {e}\n{text}", path.display()));
    let root = doc.root_element();
    assert!(
        root.has_tag_name(("http://www.w3.org/2000/svg", "svg")),
        "root element {:?}",
        root.tag_name()
    );
    run.line(&format!("picture: wrote {} (3 lanes, ", path.display()));
    let reaped = reaps(run);
    assert_eq!(reaped.len(), 2, "{reaped:?}\n{}", run.show());
    for id in ["sfu-a", "sfu-b", "sfu-c"] {
        let labels = doc
            .descendants()
            .filter(|n| n.has_tag_name("text") && n.text() == Some(id))
            .count();
        assert_eq!(labels, 1, "the lane label {id}\n{text}");
        let beats = marks(&doc, "beat", id).len();
        assert!(beats >= 3, "{id}: {beats} heartbeat ticks\n{text}");
        let (crashes, reaps) = (marks(&doc, "crash", id), marks(&doc, "reap", id));
        let waits = marks(&doc, "two-phase-wait", id);
        match reaped.get(id) {
            Some(reaper) => {
                assert_eq!(
                    (crashes.len(), reaps.len(), waits.len()),
                    (1, 1, 1),
                    "{id}\n{text}"
                );
                let reap = all_text(reaps[0]);
                assert!(
                    reap.contains(&format!("reaped by {reaper}: 3 rooms, 9 peers")),
                    "{reap}"
                );
                let wait = all_text(waits[0]);
                let secs: f64 = between(&wait, "two-phase wait ", " s")
                    .parse()
                    .unwrap_or_else(|_| panic!("{wait}"));
                // Timings::fast(): 1200 ms, stamped by the reaper as it emitted the events
                // (so never less), drawn to 10 ms (so 5 ms of rounding).
                assert!(secs >= 1.195, "{wait}");
                assert!(!marks(&doc, "candidate", id).is_empty(), "{id}\n{text}");
            }
            None => assert_eq!((crashes.len(), reaps.len()), (0, 0), "{id}\n{text}"),
        }
    }
    let terms = terms(run);
    assert!(terms.len() >= 2, "{terms:?}\n{}", run.show());
    for (id, epoch) in terms {
        let bars: Vec<String> = marks(&doc, "term", &id).into_iter().map(all_text).collect();
        let label = format!("leader, epoch {epoch}");
        assert!(
            bars.iter().any(|b| b.contains(&label)),
            "{label} on {id}: {bars:?}"
        );
    }
    let failover = marks(&doc, "failover", "redis");
    assert!(
        failover
            .iter()
            .any(|f| all_text(*f).contains("SENTINEL FAILOVER mymaster")),
        "{text}"
    );
    let legend = doc
        .descendants()
        .find(|n| n.attribute("id") == Some("legend"))
        .expect("a legend");
    for (mark, says) in [("crash", "crash"), ("reap", "reap"), ("beat", "heartbeat")] {
        let item = legend
            .descendants()
            .find(|n| n.attribute("data-mark") == Some(mark))
            .unwrap_or_else(|| panic!("legend item {mark}\n{text}"));
        assert!(all_text(item).contains(says), "{}", all_text(item));
    }
}

#[test]
fn demo_sentinel_fails_its_own_master_over_and_every_check_passes_on_the_new_one() {
    let dir = TempDir::new();
    let svg = dir.0.join("demo.svg");
    let svg_arg = svg.to_str().expect("a UTF-8 temp path");
    let run = run_cli(&["demo", "--sentinel", "--svg", svg_arg], &[]);
    eprintln!("demo --sentinel: {:.1} s", run.took.as_secs_f64());
    assert!(run.status.success(), "{}", run.show());
    check_picture(&svg, &run);
    assert!(
        run.stdout.starts_with(
            "sfu-redis demo: three SFU instances share one Redis, through Redis Sentinel\n"
        ),
        "{}",
        run.show()
    );
    // The group as the header shows it: the master, then its replica.
    let header = run.line("private sentinel group \"mymaster\"");
    let (old, replica) = (
        between(header, ": master ", ","),
        between(header, "replica ", ","),
    );
    assert!(
        is_addr(old) && is_addr(replica) && old != replica,
        "{header}"
    );
    // The failover, named with both masters, and the sentinel that named the new one.
    let sent = run.line("SENTINEL FAILOVER sent to sentinel 127.0.0.1:");
    assert!(
        sent.contains(&format!("master {old} (named by sentinel 127.0.0.1:")),
        "{sent}"
    );
    let promoted = run.line("): promoted, reached ");
    assert!(
        promoted.contains(&format!(
            "new master {replica} (named by sentinel 127.0.0.1:"
        )),
        "{promoted}"
    );
    let check = run.line("PASS  the sentinels promoted the replica");
    assert!(
        check.contains(&format!("master {old} -> {replica}")),
        "{check}"
    );
    // Every node heartbeats on the new master, measured.
    let beat = run.line(&format!(
        "every node heartbeats on the new master {replica}: "
    ));
    let took: f64 = between(beat, &format!("{replica}: "), " s after SENTINEL FAILOVER")
        .parse()
        .unwrap_or_else(|_| panic!("{beat}"));
    assert!(took > 0.0 && took < 30.0, "{beat}");
    // Two survivors at the failover (one node was reaped before it), each with its three
    // checks there, plus the leftovers of the dead one and the rest of the scan.
    let on_new = format!("on the new master {replica} (");
    let checked: Vec<&str> = run
        .stdout
        .lines()
        .filter(|l| l.starts_with("  PASS  ") && l.contains(&on_new))
        .collect();
    assert_eq!(checked.len(), 8, "{checked:#?}\n{}", run.show());
    assert!(
        checked
            .iter()
            .any(|l| l.contains("nothing under the prefix refers to the crashed instance")),
        "{checked:#?}"
    );
    assert!(run.stdout.contains("all 9 passed"), "{}", run.show());
    // The final status table and checks were read on the new master too.
    let table = run.line("redis      redis+sentinel://127.0.0.1:");
    assert!(
        table.contains(&format!(
            "(sentinel, master {replica} of \"mymaster\" via sentinel 127.0.0.1:"
        )),
        "{table}"
    );
    run.line(&format!(
        "checks (read back from Redis on master {replica} with SCAN MATCH"
    ));
    assert!(all_passed(&run) >= 24, "{}", run.show());
}

#[test]
fn demo_runs_through_someone_elses_sentinel_group_without_failing_it_over() {
    const MASTER_PASSWORD: &str = "dem0-master-pw";
    const SENTINEL_PASSWORD: &str = "dem0-sentinel-pw";
    let mut group = SentinelGroup::start(SentinelOptions {
        master_password: Some(MASTER_PASSWORD.into()),
        sentinel_password: Some(SENTINEL_PASSWORD.into()),
        ..SentinelOptions::default()
    })
    .expect("start a sentinel group");
    let (_, master) = group.master_addr().expect("the sentinels name a master");
    let url = group.url();
    assert!(url.contains(MASTER_PASSWORD), "{url}");
    // `--sentinel` with a sentinel URL: used as it is; the sentinels' own password through
    // its environment variable (the demo's own connections need it as much as the nodes).
    let run = run_cli(
        &["demo", "--sentinel"],
        &[
            ("REDIS_URL", &url),
            ("SFU_SENTINEL_PASSWORD", SENTINEL_PASSWORD),
        ],
    );
    eprintln!(
        "demo on REDIS_URL=<sentinel group>: {:.1} s",
        run.took.as_secs_f64()
    );
    assert!(run.status.success(), "{}", run.show());
    for pw in [MASTER_PASSWORD, SENTINEL_PASSWORD] {
        assert!(
            !run.stdout.contains(pw) && !run.stderr.contains(pw),
            "a password shows in the output:\n{}",
            run.show()
        );
    }
    assert!(
        run.stdout.starts_with(
            "sfu-redis demo: three SFU instances share one Redis, through Redis Sentinel\n"
        ),
        "{}",
        run.show()
    );
    run.line("(from REDIS_URL / --redis-url, sentinel)");
    let route = run.line("every connection asks the sentinels for master \"mymaster\"");
    assert!(
        route.contains(&format!(
            "now 127.0.0.1:{master}, named by sentinel 127.0.0.1:"
        )),
        "{route}"
    );
    assert!(!run.stdout.contains("SENTINEL FAILOVER"), "{}", run.show());
    let table = run.line("redis      redis+sentinel://:***@127.0.0.1:");
    assert!(
        table.contains(&format!("master 127.0.0.1:{master} of \"mymaster\"")),
        "{table}"
    );
    assert!(
        run.stdout.contains("\nremoved the demo's "),
        "{}",
        run.show()
    );
    assert!(all_passed(&run) >= 14, "{}", run.show());
    // Not failed over, and nothing of the demo left on it.
    assert_eq!(group.master_addr().expect("master").1, master);
    let node = group.server(master).expect("the master");
    assert_eq!(
        node.cli(&["ROLE"]).expect("ROLE").lines().next(),
        Some("master")
    );
    assert_eq!(node.cli(&["DBSIZE"]).expect("DBSIZE"), "0");
}

/// `--svg` to a path that cannot be opened for writing (a missing directory, a directory):
/// refused before the demo starts anything (no output, exit 2), naming the path.
#[test]
fn demo_svg_to_an_unwritable_path_is_a_usage_error() {
    let dir = TempDir::new();
    let missing = dir.0.join("no-such-dir").join("demo.svg");
    let is_dir = dir.0.clone();
    for path in [&missing, &is_dir] {
        let arg = path.to_str().expect("a UTF-8 temp path");
        let run = run_cli(&["demo", "--svg", arg], &[]);
        assert_eq!(run.status.code(), Some(2), "{}", run.show());
        assert!(run.stdout.is_empty(), "{}", run.show());
        assert!(
            run.stderr.contains(&format!(
                "demo --svg {arg}: cannot write the picture there: "
            )),
            "{}",
            run.show()
        );
        assert!(!run.stderr.contains("panicked"), "{}", run.show());
    }
    assert!(!missing.exists() && is_dir.is_dir());
}

#[test]
fn demo_sentinel_with_a_plain_url_is_a_usage_error() {
    let run = run_cli(
        &["demo", "--sentinel"],
        &[("REDIS_URL", "redis://:s3cret-pw@127.0.0.1:1/0")],
    );
    assert_eq!(run.status.code(), Some(2), "{}", run.show());
    assert!(run.stdout.is_empty(), "{}", run.show());
    assert!(
        run.stderr.contains("redis+sentinel://")
            && run.stderr.contains("redis://:***@127.0.0.1:1/0")
            && !run.stderr.contains("s3cret-pw"),
        "{}",
        run.show()
    );
    assert!(run.took < Duration::from_secs(10), "{}", run.show());
}

// `demo --cluster` without a URL: a private 3-master Redis Cluster; the whole show and every
// check pass on it, the status table names its masters and the control plane's master.
// Someone else's cluster (REDIS_URL=redis+cluster://...): the demo runs on it and leaves no
// key behind on any master.
#[test]
fn demo_cluster_runs_the_show_on_its_own_cluster_and_on_someone_elses() {
    let run = run_cli(&["demo", "--cluster"], &[]);
    eprintln!("demo --cluster: {:.1} s", run.took.as_secs_f64());
    assert!(run.status.success(), "{}", run.show());
    run.line("private Redis Cluster of 3 masters at 127.0.0.1:");
    let table = run.line("redis      redis+cluster://127.0.0.1:");
    assert!(
        table.contains("(cluster, 3 masters 127.0.0.1:")
            && table.contains("control plane on 127.0.0.1:"),
        "{table}"
    );
    assert!(all_passed(&run) >= 14, "{}", run.show());

    let cluster = sfu_redis_testkit::cluster::LocalCluster::start(3, 0).expect("a cluster");
    let run = run_cli(&["demo", "--cluster"], &[("REDIS_URL", &cluster.url())]);
    assert!(run.status.success(), "{}", run.show());
    assert!(
        run.stdout.contains("\nremoved the demo's "),
        "{}",
        run.show()
    );
    assert!(all_passed(&run) >= 14, "{}", run.show());
    for port in cluster.master_ports() {
        let mut con = redis::Client::open(format!("redis://127.0.0.1:{port}"))
            .unwrap()
            .get_connection()
            .unwrap();
        let n: i64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
        assert_eq!(n, 0, "master {port} kept demo keys");
    }
}

#[test]
fn demo_cluster_with_a_plain_url_is_a_usage_error() {
    let run = run_cli(
        &["demo", "--cluster"],
        &[("REDIS_URL", "redis://:s3cret-pw@127.0.0.1:1/0")],
    );
    assert_eq!(run.status.code(), Some(2), "{}", run.show());
    assert!(
        run.stderr.contains("redis+cluster://") && !run.stderr.contains("s3cret-pw"),
        "{}",
        run.show()
    );
}
