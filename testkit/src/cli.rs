//! Shared plumbing of [`crate::devserver`], [`crate::tls`] and [`crate::sentinel`]: `redis-cli`
//! and other subprocesses with a time limit, free ports, log tails.

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use sfu_redis::{Error, Result};

/// Highest port handed out (a cluster bus port is the port + 10000, and must fit in 16 bits).
pub(crate) const MAX_PORT: u16 = 55534;

pub(crate) fn io(op: impl Into<String>, e: std::io::Error) -> Error {
    Error::Io {
        op: op.into(),
        source: e,
    }
}

/// A free loopback port below [`MAX_PORT`] (the kernel picks; picks above are retried).
pub(crate) fn free_port() -> Result<u16> {
    for _ in 0..64 {
        let l = TcpListener::bind("127.0.0.1:0").map_err(|e| io("find a free port", e))?;
        let port = l
            .local_addr()
            .map(|a| a.port())
            .map_err(|e| io("find a free port", e))?;
        if port <= MAX_PORT {
            return Ok(port);
        }
    }
    // The ephemeral range is entirely above MAX_PORT: probe below it.
    for _ in 0..256 {
        let port = fastrand::u16(20_000..=MAX_PORT);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(io(
        format!("find a free port at or below {MAX_PORT}"),
        std::io::Error::from(std::io::ErrorKind::AddrNotAvailable),
    ))
}

/// A free port not in `taken` (ports found free are only released when a server binds them,
/// so two picks in a row can return the same one).
pub(crate) fn free_port_not_in(taken: &[u16]) -> Result<u16> {
    for _ in 0..32 {
        let p = free_port()?;
        if !taken.contains(&p) {
            return Ok(p);
        }
    }
    Err(io(
        "find a free port not already picked",
        std::io::Error::from(std::io::ErrorKind::AddrNotAvailable),
    ))
}

/// The last `lines` lines of the file at `path` (empty when it cannot be read).
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    let from = all.len().saturating_sub(lines);
    all[from..].join("\n")
}

/// The TLS files a client presents: the CA it trusts and its own certificate and key.
#[derive(Debug, Clone)]
pub(crate) struct ClientTls {
    pub(crate) ca: PathBuf,
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
}

/// Where `redis-cli` connects to, and how.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target<'a> {
    pub(crate) port: u16,
    pub(crate) tls: Option<&'a ClientTls>,
    pub(crate) password: Option<&'a str>,
}

/// Output of a finished subprocess.
pub(crate) struct Finished {
    pub(crate) status: ExitStatus,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

/// Runs `cmd` (its stdout and stderr captured) and kills it after `timeout`.
///
/// `what` names the program in errors; `install` says how to get it when it is missing.
pub(crate) fn run(
    cmd: &mut Command,
    what: &str,
    install: &str,
    timeout: Duration,
) -> Result<Finished> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                io(format!("run {what}: it is not on PATH; {install}"), e)
            } else {
                io(format!("run {what}"), e)
            }
        })?;
    let out = reader(&mut child, true);
    let err = reader(&mut child, false);
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(io(format!("wait for {what}"), e));
            }
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(io(
                format!("{what} did not finish within {} ms", timeout.as_millis()),
                std::io::Error::from(std::io::ErrorKind::TimedOut),
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    Ok(Finished {
        status,
        stdout: out.and_then(|h| h.join().ok()).unwrap_or_default(),
        stderr: err.and_then(|h| h.join().ok()).unwrap_or_default(),
    })
}

fn reader(child: &mut Child, stdout: bool) -> Option<std::thread::JoinHandle<String>> {
    let mut pipe: Box<dyn Read + Send> = if stdout {
        Box::new(child.stdout.take()?)
    } else {
        Box::new(child.stderr.take()?)
    };
    std::thread::Builder::new()
        .name("testkit-pipe".into())
        .spawn(move || {
            let mut buf = Vec::new();
            let _ = pipe.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        })
        .ok()
}

/// Runs `redis-cli` against `t` with `args` and returns what it printed (trimmed), failing
/// when it cannot connect, the reply is an error (`-e`) or it takes longer than `timeout`.
pub(crate) fn redis_cli(t: Target<'_>, args: &[&str], timeout: Duration) -> Result<String> {
    let mut cmd = Command::new("redis-cli");
    cmd.args(["-e", "-h", "127.0.0.1", "-p", &t.port.to_string()]);
    if let Some(tls) = t.tls {
        cmd.arg("--tls")
            .arg("--cacert")
            .arg(&tls.ca)
            .arg("--cert")
            .arg(&tls.cert)
            .arg("--key")
            .arg(&tls.key);
    }
    // The password goes through the environment: not on the command line, no warning.
    cmd.env_remove("REDISCLI_AUTH");
    if let Some(pw) = t.password {
        cmd.env("REDISCLI_AUTH", pw);
    }
    cmd.args(args);
    let scheme = if t.tls.is_some() { " --tls" } else { "" };
    let what = format!("redis-cli{scheme} -p {} {}", t.port, args.join(" "));
    let done = run(
        &mut cmd,
        &what,
        "install it (Debian: apt-get install redis-tools)",
        timeout,
    )?;
    if !done.status.success() {
        let said = format!("{}{}", done.stdout.trim(), done.stderr.trim());
        return Err(io(
            format!("{what} failed ({}): {said}", done.status),
            std::io::Error::other("redis-cli failed"),
        ));
    }
    Ok(done.stdout.trim().to_owned())
}

/// Splits a flat `redis-cli` listing of field/value lines (as `SENTINEL MASTER` prints) into
/// pairs.
pub(crate) fn pairs(out: &str) -> Vec<(String, String)> {
    let lines: Vec<&str> = out.lines().map(|l| l.trim_end_matches('\r')).collect();
    lines
        .chunks(2)
        .filter(|c| c.len() == 2)
        .map(|c| (c[0].to_owned(), c[1].to_owned()))
        .collect()
}

/// Splits the flat listing of several field/value records (as `SENTINEL REPLICAS` prints),
/// each beginning with the field `first`, into records.
pub(crate) fn records(out: &str, first: &str) -> Vec<Vec<(String, String)>> {
    let mut all: Vec<Vec<(String, String)>> = Vec::new();
    for (k, v) in pairs(out) {
        if k == first || all.is_empty() {
            all.push(Vec::new());
        }
        if let Some(last) = all.last_mut() {
            last.push((k, v));
        }
    }
    all
}

/// The value of `field` in `record`.
pub(crate) fn field<'a>(record: &'a [(String, String)], field: &str) -> Option<&'a str> {
    record
        .iter()
        .find(|(k, _)| k == field)
        .map(|(_, v)| v.as_str())
}

/// The value of `field` in an `INFO` text (`field:value` lines).
pub(crate) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == field).then(|| v.trim_end_matches('\r'))
    })
}

/// Sends `sig` (`STOP`, `CONT`) to `pid` with the `kill` command.
pub(crate) fn signal(pid: u32, sig: &str) -> Result<()> {
    let done = run(
        Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(pid.to_string()),
        "kill",
        "install procps",
        Duration::from_secs(5),
    )?;
    if done.status.success() {
        Ok(())
    } else {
        Err(io(
            format!("kill -{sig} {pid}: {}", done.stderr.trim()),
            std::io::Error::other("kill failed"),
        ))
    }
}

/// True when process `pid` exists and has not exited (a zombie, exited but not yet reaped,
/// counts as exited). Reads `/proc`, so it needs no `&mut Child` and reaps nothing.
pub(crate) fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state letter follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// `<dir>/stderr.log`, opened for appending: where a server's stderr goes.
pub(crate) fn stderr_file(dir: &Path) -> Result<std::fs::File> {
    let path = dir.join("stderr.log");
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| io(format!("open {}", path.display()), e))
}

/// The end of `<dir>/stderr.log` after a heading, or nothing when it is empty.
pub(crate) fn stderr_tail(dir: &Path) -> String {
    let t = tail(&dir.join("stderr.log"), 15);
    if t.trim().is_empty() {
        String::new()
    } else {
        format!("\nits stderr ends:\n{t}")
    }
}

/// A child process of the kit (a `redis-server`, a sentinel) with its SIGSTOP mark: the
/// process control [`crate::devserver::LocalRedis`] and [`crate::sentinel::Sentinel`] share.
#[derive(Debug, Default)]
pub(crate) struct Proc {
    child: Option<Child>,
    stopped: std::sync::atomic::AtomicBool,
}

impl Proc {
    /// The process just spawned.
    pub(crate) fn set(&mut self, child: Child) {
        self.child = Some(child);
        self.mark_stopped(false);
    }

    fn mark_stopped(&self, stopped: bool) {
        self.stopped
            .store(stopped, std::sync::atomic::Ordering::SeqCst);
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The child, to poll it while it starts.
    pub(crate) fn child_mut(&mut self) -> Option<&mut Child> {
        self.child.as_mut()
    }

    /// SIGKILL (a stopped process too) and reap; nothing when it is not running.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.mark_stopped(false);
    }

    /// Forgets a process that exited; an error naming `what` when it still runs.
    pub(crate) fn ensure_exited(&mut self, what: impl FnOnce() -> String) -> Result<()> {
        if let Some(child) = &mut self.child {
            match child.try_wait() {
                Ok(Some(_)) => self.child = None,
                _ => {
                    return Err(io(
                        format!(
                            "start {} again: it is still running (kill9 it first)",
                            what()
                        ),
                        std::io::Error::from(std::io::ErrorKind::AlreadyExists),
                    ))
                }
            }
        }
        Ok(())
    }

    /// SIGSTOP (`stop`) or SIGCONT; an error naming `what` when it is not running.
    pub(crate) fn pause(&self, stop: bool, what: impl FnOnce() -> String) -> Result<()> {
        let sig = if stop { "STOP" } else { "CONT" };
        let pid = self.pid().ok_or_else(|| {
            io(
                format!("SIG{sig} {}: not running", what()),
                std::io::Error::from(std::io::ErrorKind::NotFound),
            )
        })?;
        signal(pid, sig)?;
        self.mark_stopped(stop);
        Ok(())
    }

    pub(crate) fn is_stopped(&self) -> bool {
        self.stopped.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Running (stopped or not): started, not killed, not exited.
    pub(crate) fn is_alive(&self) -> bool {
        self.child.as_ref().is_some_and(|c| alive(c.id()))
    }
}
