//! `sfu-redis node --json` processes for end-to-end tests: spawn (optionally under a wrapper
//! such as `faketime`), collect their JSON events on one channel, send signals.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The `Timings::fast()` values as node flags.
pub const FAST: [&str; 14] = [
    "--heartbeat-interval-ms",
    "200",
    "--heartbeat-ttl-ms",
    "600",
    "--lease-ttl-ms",
    "1800",
    "--lease-refresh-ms",
    "600",
    "--two-phase-delay-ms",
    "1200",
    "--reap-interval-ms",
    "300",
    "--command-timeout-ms",
    "400",
];

/// One node process.
pub struct NodeProc {
    pub id: String,
    pub rooms: Vec<String>,
    pub child: Child,
}

impl NodeProc {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `sig` (`"STOP"`, `"CONT"`, `"TERM"`, ...) with kill(1).
    pub fn signal(&self, sig: &str) {
        signal(self.child.id(), sig);
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) {
        self.child.kill().expect("SIGKILL");
        let _ = self.child.wait();
    }
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `sfu-redis <sub> --stage <stage> --redis-url <url> <args>`, run to its end, with none of
/// the library's environment variables (`REDIS_URL`, `SFU_*`) of the test's own environment.
/// A finished command for an assertion message: its exit code, stdout and stderr.
pub fn output_text(o: &std::process::Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

pub fn cli_output(sub: &str, stage: &str, url: &str, args: &[&str]) -> std::process::Output {
    let mut c = Command::new(cli_bin());
    c.arg(sub)
        .args(["--stage", stage, "--redis-url", url])
        .args(args);
    for var in sfu_redis::config::ENV_VARS {
        c.env_remove(var);
    }
    c.output().expect("run sfu-redis")
}

/// The `sfu-redis` binary of the `cli` package, built once per test process with the profile
/// of this test binary (the CLI is its own package, so `CARGO_BIN_EXE_*` does not reach the
/// library's tests; a plain `cargo test --test X` from a clean clone still works).
pub fn cli_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        // This test binary lives in <target>/<profile>/deps/.
        let exe = std::env::current_exe().expect("current_exe");
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("test binary in <target>/<profile>/deps")
            .to_path_buf();
        let target_dir = profile_dir.parent().expect("<target>").to_path_buf();
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let manifest = [root.join("cli/Cargo.toml"), root.join("../cli/Cargo.toml")]
            .into_iter()
            .find(|p| p.exists())
            .expect("cli/Cargo.toml beside the test's package");
        let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.args(["build", "--quiet", "--bin", "sfu-redis", "--manifest-path"])
            .arg(&manifest)
            .arg("--target-dir")
            .arg(&target_dir);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let st = cmd.status().expect("run cargo build --bin sfu-redis");
        assert!(st.success(), "cargo build --bin sfu-redis failed");
        let bin = profile_dir.join("sfu-redis");
        assert!(bin.exists(), "no sfu-redis in {}", profile_dir.display());
        bin
    })
}

pub fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(st.success(), "kill -{sig} {pid} failed");
}

/// Builder for a node process.
pub struct Spawn<'a> {
    pub url: &'a str,
    pub stage: &'a str,
    pub id: &'a str,
    pub rooms: &'a [&'a str],
    pub peers_per_room: u32,
    pub extra: &'a [&'a str],
    /// Run under libfaketime with this offset (`"+10m"`, `"-10m"`): `LD_PRELOAD` and
    /// `FAKETIME` are set on the node itself (the `faketime` wrapper forks, so killing it would
    /// orphan the node).
    pub faketime: Option<&'a str>,
}

impl<'a> Spawn<'a> {
    pub fn new(url: &'a str, stage: &'a str, id: &'a str, rooms: &'a [&'a str]) -> Self {
        Spawn {
            url,
            stage,
            id,
            rooms,
            peers_per_room: 3,
            extra: &FAST,
            faketime: None,
        }
    }

    pub fn run(&self, tx: mpsc::Sender<(String, Value)>) -> NodeProc {
        let bin = cli_bin();
        let mut cmd = Command::new(bin);
        if let Some(offset) = self.faketime {
            let lib = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
            assert!(
                std::path::Path::new(lib).exists(),
                "{lib} is missing: install the Debian package faketime (.ci/run does)"
            );
            // Only the wall clock is skewed (what an NTP-less host looks like); a faked
            // monotonic clock would also break futex deadlines, which libfaketime cannot see.
            cmd.env("LD_PRELOAD", lib)
                .env("FAKETIME", offset)
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                .env("FAKETIME_NO_CACHE", "1");
        }
        cmd.args([
            "node",
            "--json",
            "--stage",
            self.stage,
            "--instance-id",
            self.id,
        ])
        .args(["--redis-url", self.url])
        .args(["--peers-per-room", &self.peers_per_room.to_string()])
        .args(self.extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
        if !self.rooms.is_empty() {
            cmd.args(["--rooms", &self.rooms.join(",")]);
        }
        let mut child = cmd.spawn().expect("spawn sfu-redis node");
        let stdout = child.stdout.take().expect("stdout");
        let name = self.id.to_owned();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let v: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("{name}: stdout line is not JSON ({e}): {line}"));
                if tx.send((name.clone(), v)).is_err() {
                    break;
                }
            }
        });
        NodeProc {
            id: self.id.to_owned(),
            rooms: self.rooms.iter().map(|r| (*r).to_owned()).collect(),
            child,
        }
    }
}

/// The events of several node processes; `expect` waits for one matching `pred`.
pub struct Events {
    pub rx: mpsc::Receiver<(String, Value)>,
    pub seen: Vec<(String, Value)>,
}

impl Events {
    pub fn new(rx: mpsc::Receiver<(String, Value)>) -> Self {
        Events {
            rx,
            seen: Vec::new(),
        }
    }

    /// Reads what has arrived so far without waiting.
    pub fn pump(&mut self) {
        while let Ok((i, v)) = self.rx.try_recv() {
            self.seen.push((i, v));
        }
    }

    /// The first event (already seen or arriving within `timeout`) matching `pred`.
    pub fn expect_within(
        &mut self,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&str, &Value) -> bool,
    ) -> (String, Value) {
        if let Some(hit) = self.seen.iter().find(|(i, v)| pred(i, v)) {
            return hit.clone();
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok((i, v)) => {
                    assert_eq!(
                        v["instance"],
                        Value::from(i.as_str()),
                        "event carries its instance"
                    );
                    self.seen.push((i.clone(), v.clone()));
                    if pred(&i, &v) {
                        return (i, v);
                    }
                }
                Err(_) => panic!("timed out waiting for {what}; seen: {:#?}", self.seen),
            }
        }
    }

    pub fn expect(&mut self, what: &str, pred: impl Fn(&str, &Value) -> bool) -> (String, Value) {
        self.expect_within(super::LONG, what, pred)
    }

    /// Every event seen so far from `instance` named `event`.
    pub fn all(&mut self, instance: &str, event: &str) -> Vec<Value> {
        self.pump();
        self.seen
            .iter()
            .filter(|(i, v)| i == instance && is(v, event))
            .map(|(_, v)| v.clone())
            .collect()
    }
}

pub fn is(v: &Value, event: &str) -> bool {
    v["event"] == event
}

/// A `sfu-redis node --metrics-addr 127.0.0.1:0` process; killed on drop.
pub struct MetricsNode {
    pub child: Child,
    /// Where it serves its metrics (read from the stderr line it prints).
    pub addr: std::net::SocketAddr,
}

impl Drop for MetricsNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Spawns a node serving metrics on a port the kernel picked, with the [`FAST`] timings,
/// `extra` flags and none of the node's environment variables. With `events`, it runs with
/// `--json` and each stdout line goes there as `(id, event)`. Its stderr is passed through.
pub fn spawn_metrics_node(
    url: &str,
    stage: &str,
    id: &str,
    extra: &[&str],
    events: Option<mpsc::Sender<(String, Value)>>,
) -> MetricsNode {
    let mut cmd = Command::new(cli_bin());
    cmd.args(["node", "--stage", stage, "--instance-id", id])
        .args(["--redis-url", url, "--metrics-addr", "127.0.0.1:0"])
        .args(FAST)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for var in sfu_redis::config::ENV_VARS {
        cmd.env_remove(var);
    }
    cmd.env_remove("SFU_METRICS_ADDR");
    if events.is_some() {
        cmd.arg("--json").stdout(Stdio::piped());
    }
    let mut child = cmd.spawn().expect("spawn sfu-redis node");
    if let Some(tx) = events {
        let stdout = child.stdout.take().expect("stdout");
        let name = id.to_owned();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let v: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line}"));
                if tx.send((name.clone(), v)).is_err() {
                    break;
                }
            }
        });
    }
    // The address line, then the rest of stderr passed through (the node's logs).
    let (addr_tx, addr_rx) = mpsc::channel();
    let stderr = child.stderr.take().expect("stderr");
    let name = id.to_owned();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("sfu-redis: serving http://") {
                let _ = addr_tx.send(rest.split('/').next().unwrap_or_default().to_owned());
            }
            eprintln!("[metrics node {name}] {line}");
        }
    });
    let addr = addr_rx
        .recv_timeout(super::LONG)
        .expect("the node prints its metrics address on stderr")
        .parse()
        .expect("a socket address");
    MetricsNode { child, addr }
}
