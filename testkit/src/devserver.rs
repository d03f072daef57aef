//! A private `redis-server` for demos, tests and benchmarks: started from `PATH` on a free
//! loopback port, in a temp dir, with no persistence (`--save ""`, `--appendonly no`), and
//! killed (its dir removed) on `Drop`. Modeled on redis-rs's `redis-test` server.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sfu_redis::{Error, Result};

/// Ports tried before [`LocalRedis::start`] gives up (a port found free can be taken before
/// the server binds it).
const START_ATTEMPTS: u32 = 5;

/// A running private `redis-server`.
#[derive(Debug)]
pub struct LocalRedis {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
}

fn io(op: impl Into<String>, e: std::io::Error) -> Error {
    Error::Io {
        op: op.into(),
        source: e,
    }
}

impl LocalRedis {
    /// Starts a server on a free port and waits until it answers `PING` (at most 10 s).
    ///
    /// # Errors
    /// [`Error::Io`] when `redis-server` is not on `PATH` (the message says how to install it)
    /// or does not come up.
    pub fn start() -> Result<LocalRedis> {
        Self::start_with(&[])
    }

    /// Like [`LocalRedis::start`], with extra `redis-server` arguments (for example
    /// `["--maxmemory", "100mb"]`).
    ///
    /// # Errors
    /// As [`LocalRedis::start`].
    pub fn start_with(extra: &[&str]) -> Result<LocalRedis> {
        // A port found free can be taken before the server binds it; try a few. Each attempt
        // has its own dir (a failed attempt's `Drop` removes it).
        let mut attempt = 1;
        loop {
            let dir = std::env::temp_dir().join(format!(
                "sfu-redis-{}-{:08x}",
                std::process::id(),
                fastrand::u32(..)
            ));
            std::fs::create_dir_all(&dir)
                .map_err(|e| io(format!("create {}", dir.display()), e))?;
            let mut server = LocalRedis {
                child: None,
                port: free_port()?,
                dir,
                extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            };
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(e) => {
                    let not_installed = matches!(&e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound);
                    if not_installed || attempt == START_ATTEMPTS {
                        return Err(e);
                    }
                }
            }
            attempt += 1;
        }
    }

    fn spawn(&mut self) -> Result<()> {
        let log = self.dir.join("redis.log");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(&log)
            .args(["--enable-debug-command", "local"])
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    io(
                        "start redis-server: it is not on PATH; install it (Debian: apt-get install redis-server) or set REDIS_URL",
                        e,
                    )
                } else {
                    io("start redis-server", e)
                }
            })?;
        self.child = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let client = redis::Client::open(self.url().as_str()).map_err(|source| Error::Redis {
            op: "connect to local redis-server".into(),
            source,
        })?;
        loop {
            if let Some(child) = &mut self.child {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(io(
                        format!("redis-server exited with {status}; log:\n{}", self.log()),
                        std::io::Error::other("redis-server exited"),
                    ));
                }
            }
            if let Ok(mut con) = client.get_connection_with_timeout(Duration::from_millis(200)) {
                match redis::cmd("PING").query::<String>(&mut con) {
                    // An error reply (NOAUTH with --requirepass) also means it is up.
                    Ok(_) => return Ok(()),
                    Err(e) if e.code().is_some() => return Ok(()),
                    Err(_) => {}
                }
            }
            if Instant::now() > deadline {
                return Err(io(
                    format!(
                        "redis-server did not answer within 10 s; log:\n{}",
                        self.log()
                    ),
                    std::io::Error::from(std::io::ErrorKind::TimedOut),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id (for SIGSTOP/SIGCONT in fault tests).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The server's working directory (holds `redis.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }

    /// Kills the server (SIGKILL) and starts a new one on the same port, with no data: what a
    /// restart without persistence looks like to clients.
    ///
    /// # Errors
    /// [`Error::Io`] when it does not come back within 10 s.
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn()
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| io("find a free port", e))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| io("find a free port", e))
}
