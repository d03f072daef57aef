//! A private `redis-server` for demos, tests and benchmarks: started from `PATH` on a free
//! loopback port, in a temp dir, with no persistence (`--save ""`, `--appendonly no`), and
//! killed (its dir removed) on `Drop`. Modeled on redis-rs's `redis-test` server.
//!
//! Also: TLS servers ([`LocalRedis::start_tls`], certificates from [`crate::tls::TestCerts`]),
//! replicas ([`LocalRedis::start_replica_of`]), and process faults ([`LocalRedis::sigstop`],
//! [`LocalRedis::sigcont`], [`LocalRedis::kill9`] then [`LocalRedis::start_again`]).
//!
//! ```no_run
//! use sfu_redis_testkit::devserver::{LocalRedis, TlsServer};
//! use sfu_redis_testkit::tls::TestCerts;
//!
//! let certs = TestCerts::generate()?;
//! let master = LocalRedis::start_tls(&certs, TlsServer::default())?; // TLS only
//! let replica = LocalRedis::start_replica_of(&master, &[])?;       // in sync on return
//! assert_eq!(master.cli(&["SET", "k", "v"])?, "OK");
//! # Ok::<(), sfu_redis::Error>(())
//! ```

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sfu_redis::{Error, Result};

use crate::cli::{self, free_port, io, ClientTls, Proc, Target};
use crate::tls::TestCerts;

/// Ports tried before [`LocalRedis::start`] gives up (a port found free can be taken before
/// the server binds it).
const START_ATTEMPTS: u32 = 5;

/// How long a [`LocalRedis::cli`] call may take.
const CLI_TIMEOUT: Duration = Duration::from_secs(10);

/// How [`LocalRedis::start_tls`] sets up TLS. The default: TLS only (`--port 0`), clients
/// need no certificate (`--tls-auth-clients no`), the server presents
/// [`TestCerts::server_cert`].
#[derive(Debug, Clone, Default)]
pub struct TlsServer {
    /// Require client certificates signed by the CA (`--tls-auth-clients yes`) instead of
    /// accepting clients without one (`--tls-auth-clients no`).
    pub auth_clients: bool,
    /// Also listen on a plaintext port (then [`LocalRedis::port`] and [`LocalRedis::url`] are
    /// that port's).
    pub plain_port: bool,
    /// The certificate and key the server presents instead of the test server's (for
    /// example `(certs.wrong_name_cert(), certs.wrong_name_key())`).
    pub cert: Option<(PathBuf, PathBuf)>,
    /// More `redis-server` arguments (for example `["--requirepass", "pw"]`).
    pub extra: Vec<String>,
}

/// The TLS files of a TLS server, copied into its dir (so that [`LocalRedis::start_again`]
/// works after the [`TestCerts`] are gone).
#[derive(Debug, Clone)]
struct TlsFiles {
    cert: PathBuf,
    key: PathBuf,
    /// The CA, and the client certificate `redis-cli` presents.
    client: ClientTls,
    auth_clients: bool,
}

impl TlsFiles {
    /// Copies the files into `<dir>/tls/`.
    fn copy(
        dir: &Path,
        ca: &Path,
        cert: &Path,
        key: &Path,
        client_cert: &Path,
        client_key: &Path,
        auth_clients: bool,
    ) -> Result<TlsFiles> {
        let tls = dir.join("tls");
        std::fs::create_dir_all(&tls).map_err(|e| io(format!("create {}", tls.display()), e))?;
        let copy = |from: &Path, name: &str| -> Result<PathBuf> {
            let to = tls.join(name);
            std::fs::copy(from, &to)
                .map_err(|e| io(format!("copy {} to {}", from.display(), to.display()), e))?;
            Ok(to)
        };
        Ok(TlsFiles {
            cert: copy(cert, "server.crt")?,
            key: copy(key, "server.key")?,
            client: ClientTls {
                ca: copy(ca, "ca.crt")?,
                cert: copy(client_cert, "client.crt")?,
                key: copy(client_key, "client.key")?,
            },
            auth_clients,
        })
    }

    fn from_certs(dir: &Path, certs: &TestCerts, opts: &TlsServer) -> Result<TlsFiles> {
        let (cert, key) = opts
            .cert
            .clone()
            .unwrap_or_else(|| (certs.server_cert(), certs.server_key()));
        TlsFiles::copy(
            dir,
            &certs.ca(),
            &cert,
            &key,
            &certs.client_cert(),
            &certs.client_key(),
            opts.auth_clients,
        )
    }

    /// Another server's files, copied into `dir`.
    fn recopy(&self, dir: &Path) -> Result<TlsFiles> {
        TlsFiles::copy(
            dir,
            &self.client.ca,
            &self.cert,
            &self.key,
            &self.client.cert,
            &self.client.key,
            self.auth_clients,
        )
    }
}

/// A running private `redis-server`.
#[derive(Debug)]
pub struct LocalRedis {
    proc: Proc,
    /// The plaintext port; 0 for a TLS-only server.
    port: u16,
    tls_port: Option<u16>,
    tls: Option<TlsFiles>,
    dir: PathBuf,
    extra: Vec<String>,
}

fn new_dir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "sfu-redis-{}-{:08x}",
        std::process::id(),
        fastrand::u32(..)
    ));
    std::fs::create_dir_all(&dir).map_err(|e| io(format!("create {}", dir.display()), e))?;
    Ok(dir)
}

fn not_installed(e: &Error) -> bool {
    matches!(e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
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
            let dir = new_dir()?;
            let mut server = LocalRedis {
                proc: Proc::default(),
                port: free_port()?,
                tls_port: None,
                tls: None,
                dir,
                extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            };
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(e) => {
                    if not_installed(&e) || attempt == START_ATTEMPTS {
                        return Err(e);
                    }
                }
            }
            attempt += 1;
        }
    }

    /// Starts a TLS server: `--tls-port` on a free port with the certificates of `certs`
    /// (copied into the server's dir, so `certs` may be dropped while it runs), `--port 0`
    /// unless `opts.plain_port`, and waits until it is up (its log says "Ready to accept
    /// connections" and the TLS port takes a TCP connection; at most 10 s).
    ///
    /// Ports: [`LocalRedis::tls_port`] is the TLS port; [`LocalRedis::port`] and
    /// [`LocalRedis::url`] are the plaintext port's with `plain_port`, and the TLS port's
    /// (`url()` = [`LocalRedis::tls_url`]) for a TLS-only server, so that both always name a
    /// port the server listens on. [`LocalRedis::cli`] speaks TLS to a TLS-only server,
    /// presenting [`TestCerts::client_cert`].
    ///
    /// # Errors
    /// [`Error::Io`] when `redis-server` is not on `PATH`, a certificate file cannot be
    /// copied, or the server does not come up (the message holds the end of its log; a
    /// `redis-server` built without TLS says so there).
    pub fn start_tls(certs: &TestCerts, opts: TlsServer) -> Result<LocalRedis> {
        let mut attempt = 1;
        loop {
            let dir = new_dir()?;
            let port = if opts.plain_port { free_port()? } else { 0 };
            let tls_port = cli::free_port_not_in(&[port])?;
            let mut server = LocalRedis {
                proc: Proc::default(),
                port,
                tls_port: Some(tls_port),
                tls: None,
                dir,
                extra: opts.extra.clone(),
            };
            server.tls = Some(TlsFiles::from_certs(&server.dir, certs, &opts)?);
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(e) => {
                    if not_installed(&e) || attempt == START_ATTEMPTS {
                        return Err(e);
                    }
                }
            }
            attempt += 1;
        }
    }

    /// Starts a replica of `master` (`--replicaof 127.0.0.1 <master's port>`, then `extra`)
    /// and waits until its `INFO replication` says `master_link_status:up` (at most 10 s).
    ///
    /// The replica is set up like the master: with the master's TLS files and options when the
    /// master has TLS, plus `--tls-replication yes` when the master is TLS-only (it then
    /// replicates over TLS, from the master's TLS port). When the master was started with
    /// `--requirepass <pw>` and `extra` has no `--masterauth`, `--masterauth <pw>` is added.
    ///
    /// The first sync waits for the master's `repl-diskless-sync-delay` (5 s by default in
    /// Redis 7): start the master with `["--repl-diskless-sync-delay", "0"]` for a quick one.
    ///
    /// # Errors
    /// [`Error::Io`] when the replica does not come up or does not get in sync within 10 s
    /// (the message holds the end of its log).
    pub fn start_replica_of(master: &LocalRedis, extra: &[&str]) -> Result<LocalRedis> {
        let master_port = master.port();
        let mut args: Vec<String> = vec!["--replicaof".into(), "127.0.0.1".into()];
        args.push(master_port.to_string());
        if master.port == 0 && master.tls.is_some() {
            args.extend(["--tls-replication".into(), "yes".into()]);
        }
        if !extra.contains(&"--masterauth") {
            if let Some(pw) = master.password() {
                args.extend(["--masterauth".into(), pw.to_owned()]);
            }
        }
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let mut attempt = 1;
        let replica = loop {
            let dir = new_dir()?;
            let port = if master.port != 0 {
                cli::free_port_not_in(&[master_port])?
            } else {
                0
            };
            let tls_port = match master.tls {
                Some(_) => Some(cli::free_port_not_in(&[port, master_port])?),
                None => None,
            };
            let mut server = LocalRedis {
                proc: Proc::default(),
                port,
                tls_port,
                tls: None,
                dir,
                extra: args.clone(),
            };
            if let Some(tls) = &master.tls {
                server.tls = Some(tls.recopy(&server.dir)?);
            }
            match server.spawn() {
                Ok(()) => break server,
                Err(e) => {
                    if not_installed(&e) || attempt == START_ATTEMPTS {
                        return Err(e);
                    }
                }
            }
            attempt += 1;
        };
        replica.wait_link_up(master_port, Duration::from_secs(10))?;
        Ok(replica)
    }

    /// Waits until `INFO replication` says this server replicates `master_port` with the link
    /// up.
    pub(crate) fn wait_link_up(&self, master_port: u16, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match self.cli_within(&["INFO", "replication"], Duration::from_secs(2)) {
                Ok(info) => {
                    let port = master_port.to_string();
                    if cli::info_field(&info, "master_port") == Some(port.as_str())
                        && cli::info_field(&info, "master_link_status") == Some("up")
                    {
                        return Ok(());
                    }
                    info
                }
                Err(e) => e.to_string(),
            };
            if Instant::now() > deadline {
                return Err(io(
                    format!(
                        "replica on port {} not in sync with 127.0.0.1:{master_port} within {} ms; last INFO replication:\n{}\nits log ends:\n{}",
                        self.port(),
                        timeout.as_millis(),
                        last.trim(),
                        cli::tail(&self.log_path(), 30)
                    ),
                    std::io::Error::from(std::io::ErrorKind::TimedOut),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn spawn(&mut self) -> Result<()> {
        let log = self.dir.join("redis.log");
        // Where this run's lines begin (a restart appends to the same log).
        let log_from = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(&log)
            .args(["--enable-debug-command", "local"]);
        if let (Some(tls), Some(tls_port)) = (&self.tls, self.tls_port) {
            cmd.args(["--tls-port", &tls_port.to_string()])
                .arg("--tls-cert-file")
                .arg(&tls.cert)
                .arg("--tls-key-file")
                .arg(&tls.key)
                .arg("--tls-ca-cert-file")
                .arg(&tls.client.ca)
                .args([
                    "--tls-auth-clients",
                    if tls.auth_clients { "yes" } else { "no" },
                ]);
        }
        let child = cmd
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // Config errors go to stderr, before the log file is open.
            .stderr(cli::stderr_file(&self.dir)?)
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
        self.proc.set(child);
        if self.port == 0 {
            self.wait_ready_tls(log_from)
        } else {
            self.wait_ready()
        }
    }

    /// Waits (at most 10 s) until this run's log says "Ready to accept connections" and the
    /// TLS port takes a TCP connection: no TLS client needed.
    fn wait_ready_tls(&mut self, log_from: u64) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let addr = SocketAddr::from(([127, 0, 0, 1], self.tls_port.unwrap_or(0)));
        loop {
            if let Some(child) = self.proc.child_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(io(
                        format!(
                            "redis-server (TLS port {}) exited with {status}; its log ends:\n{}{}",
                            addr.port(),
                            cli::tail(&self.log_path(), 30),
                            cli::stderr_tail(&self.dir)
                        ),
                        std::io::Error::other("redis-server exited"),
                    ));
                }
            }
            let log = std::fs::read(self.log_path()).unwrap_or_default();
            let this_run = log.get(log_from as usize..).unwrap_or_default();
            let ready = String::from_utf8_lossy(this_run).contains("Ready to accept connections");
            if ready && TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(io(
                    format!(
                        "redis-server (TLS port {}) not ready within 10 s; its log ends:\n{}",
                        addr.port(),
                        cli::tail(&self.log_path(), 30)
                    ),
                    std::io::Error::from(std::io::ErrorKind::TimedOut),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let client = redis::Client::open(self.url().as_str()).map_err(|source| Error::Redis {
            op: "connect to local redis-server".into(),
            source,
        })?;
        loop {
            if let Some(child) = self.proc.child_mut() {
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

    /// `redis://127.0.0.1:<port>`; for a TLS-only server (no plaintext port), the same as
    /// [`LocalRedis::tls_url`].
    pub fn url(&self) -> String {
        match self.tls_port {
            Some(_) if self.port == 0 => self.tls_url(),
            _ => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// The TCP port: the plaintext one, or for a TLS-only server the TLS one (a server always
    /// listens on the port this returns; the sentinels of a TLS group know nodes by it).
    pub fn port(&self) -> u16 {
        match self.tls_port {
            Some(tls) if self.port == 0 => tls,
            _ => self.port,
        }
    }

    /// The TLS port, `None` for a server without TLS.
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    /// `rediss://127.0.0.1:<TLS port>` (trust [`TestCerts::ca`]); for a server without TLS
    /// the port is 0, an address nothing listens on.
    pub fn tls_url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.tls_port.unwrap_or(0))
    }

    /// Runs `redis-cli` with `args` against this server and returns what it printed (raw
    /// format: one line per reply element, trimmed). It speaks TLS to a TLS-only server
    /// (trusting the test CA, presenting the test client certificate) and authenticates with
    /// the `--requirepass` the server was started with, if any. At most 10 s.
    ///
    /// # Errors
    /// [`Error::Io`] when `redis-cli` is not on `PATH`, cannot connect, gets an error reply
    /// (the message holds it) or takes longer than 10 s (a SIGSTOPped server).
    pub fn cli(&self, args: &[&str]) -> Result<String> {
        self.cli_within(args, CLI_TIMEOUT)
    }

    pub(crate) fn cli_within(&self, args: &[&str], timeout: Duration) -> Result<String> {
        let tls_only = self.port == 0;
        let target = Target {
            port: self.port(),
            tls: self.tls.as_ref().map(|t| &t.client).filter(|_| tls_only),
            password: self.password(),
        };
        cli::redis_cli(target, args, timeout)
    }

    /// The `--requirepass` this server was started with.
    fn password(&self) -> Option<&str> {
        let at = self.extra.iter().rposition(|a| a == "--requirepass")?;
        self.extra.get(at + 1).map(String::as_str)
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("redis.log")
    }

    /// The server's process id (for SIGSTOP/SIGCONT in fault tests).
    pub fn pid(&self) -> Option<u32> {
        self.proc.pid()
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
    /// restart without persistence looks like to clients. The same as [`LocalRedis::kill9`]
    /// then [`LocalRedis::start_again`] (same ports, same arguments, TLS included).
    ///
    /// # Errors
    /// [`Error::Io`] when it does not come back within 10 s.
    pub fn restart(&mut self) -> Result<()> {
        self.kill9();
        self.start_again()
    }

    /// Kills the server with SIGKILL (a stopped one too) and reaps it; its dir and log stay,
    /// for [`LocalRedis::start_again`]. Nothing happens when it is not running.
    pub fn kill9(&mut self) {
        self.kill();
    }

    /// Starts the server again after [`LocalRedis::kill9`] (or after it exited by itself): the
    /// same ports and arguments (a replica replicates the same master port again), no data.
    /// Waits until it is up, as the first start did.
    ///
    /// # Errors
    /// [`Error::Io`] when it is still running (kill it first), or does not come up within
    /// 10 s (the port was taken meanwhile, say; the message holds the end of its log).
    pub fn start_again(&mut self) -> Result<()> {
        let port = self.port();
        self.proc
            .ensure_exited(|| format!("redis-server on port {port}"))?;
        self.spawn()
    }

    /// Stops the server with SIGSTOP: it keeps its connections but answers nothing (the
    /// kernel still accepts new connections), as a hung or paused host would.
    ///
    /// # Errors
    /// [`Error::Io`] when it is not running or `kill` fails.
    pub fn sigstop(&self) -> Result<()> {
        self.proc
            .pause(true, || format!("redis-server on port {}", self.port()))
    }

    /// Lets a server stopped by [`LocalRedis::sigstop`] go on (SIGCONT).
    ///
    /// # Errors
    /// [`Error::Io`] when it is not running or `kill` fails.
    pub fn sigcont(&self) -> Result<()> {
        self.proc
            .pause(false, || format!("redis-server on port {}", self.port()))
    }

    /// True between [`LocalRedis::sigstop`] and [`LocalRedis::sigcont`] (or a kill).
    pub fn is_stopped(&self) -> bool {
        self.proc.is_stopped()
    }

    /// True when the process runs (stopped or not): started, not killed, not exited.
    pub fn is_alive(&self) -> bool {
        self.proc.is_alive()
    }

    fn kill(&mut self) {
        self.proc.kill();
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Finished;

    /// `redis-cli` with exactly these connection arguments, then `PING`.
    fn ping(port: u16, flags: &[&str]) -> Result<String> {
        let mut cmd = Command::new("redis-cli");
        cmd.args(["-e", "-h", "127.0.0.1", "-p", &port.to_string()])
            .args(flags)
            .arg("PING");
        let done: Finished = cli::run(&mut cmd, "redis-cli", "", Duration::from_secs(5))?;
        if done.status.success() {
            Ok(done.stdout.trim().to_owned())
        } else {
            Err(io(
                format!("{}{}", done.stdout.trim(), done.stderr.trim()),
                std::io::Error::other("redis-cli failed"),
            ))
        }
    }

    fn s(p: &Path) -> &str {
        p.to_str().expect("utf-8 temp path")
    }

    /// `openssl s_client` against `port`, checking the chain against `ca` and the name
    /// against IP 127.0.0.1: true when the handshake verifies.
    fn verifies_as_127(port: u16, ca: &Path) -> bool {
        let mut cmd = Command::new("openssl");
        cmd.args(["s_client", "-connect", &format!("127.0.0.1:{port}")])
            .arg("-CAfile")
            .arg(ca)
            .args(["-verify_ip", "127.0.0.1", "-verify_return_error"]);
        let done = cli::run(&mut cmd, "openssl", "", Duration::from_secs(10)).expect("s_client");
        done.status.success()
    }

    #[test]
    fn tls_server_speaks_tls_only() {
        let certs = TestCerts::generate().expect("certs");
        let server = LocalRedis::start_tls(&certs, TlsServer::default()).expect("start tls");
        let tls_port = server.tls_port().expect("a TLS port");
        assert_eq!(server.port(), tls_port);
        assert_eq!(server.url(), format!("rediss://127.0.0.1:{tls_port}"));
        assert_eq!(server.tls_url(), server.url());
        assert!(tls_port <= cli::MAX_PORT);

        let ca = certs.ca();
        assert_eq!(
            ping(tls_port, &["--tls", "--cacert", s(&ca)]).expect("TLS PING"),
            "PONG"
        );
        // A plaintext client on the TLS port gets no answer.
        let plain = ping(tls_port, &[]);
        assert!(plain.is_err(), "plaintext PING answered: {plain:?}");
        // A client trusting another CA refuses the server.
        let other = certs.other_ca();
        let wrong_ca = ping(tls_port, &["--tls", "--cacert", s(&other)]);
        assert!(wrong_ca.is_err(), "PING trusting other-ca: {wrong_ca:?}");
        // The server's certificate is valid for 127.0.0.1.
        assert!(verifies_as_127(tls_port, &ca));
        // And `cli` speaks TLS.
        assert_eq!(server.cli(&["SET", "k", "v"]).expect("SET"), "OK");
        assert_eq!(server.cli(&["GET", "k"]).expect("GET"), "v");
    }

    #[test]
    fn mutual_tls_needs_a_client_certificate() {
        let certs = TestCerts::generate().expect("certs");
        let server = LocalRedis::start_tls(
            &certs,
            TlsServer {
                auth_clients: true,
                ..TlsServer::default()
            },
        )
        .expect("start mutual tls");
        let port = server.port();
        let ca = certs.ca();
        let without = ping(port, &["--tls", "--cacert", s(&ca)]);
        assert!(without.is_err(), "PING without a client cert: {without:?}");
        let (cert, key) = (certs.client_cert(), certs.client_key());
        let with = ping(
            port,
            &[
                "--tls",
                "--cacert",
                s(&ca),
                "--cert",
                s(&cert),
                "--key",
                s(&key),
            ],
        );
        assert_eq!(with.expect("PING with client.crt"), "PONG");
    }

    #[test]
    fn tls_with_a_plain_port_and_a_wrong_name_certificate() {
        let certs = TestCerts::generate().expect("certs");
        let server = LocalRedis::start_tls(
            &certs,
            TlsServer {
                plain_port: true,
                cert: Some((certs.wrong_name_cert(), certs.wrong_name_key())),
                extra: vec!["--requirepass".into(), "pw".into()],
                ..TlsServer::default()
            },
        )
        .expect("start tls with a plain port");
        let tls_port = server.tls_port().expect("a TLS port");
        assert_ne!(server.port(), tls_port);
        assert_eq!(server.url(), format!("redis://127.0.0.1:{}", server.port()));
        // The plain port speaks plaintext, with the password.
        let noauth = ping(server.port(), &[]);
        assert!(
            noauth
                .as_ref()
                .is_err_and(|e| e.to_string().contains("NOAUTH")),
            "{noauth:?}"
        );
        assert_eq!(
            server.cli(&["PING"]).expect("PING with the password"),
            "PONG"
        );
        // The TLS port presents the wrong-name certificate: the chain is good, the name not.
        assert!(!verifies_as_127(tls_port, &certs.ca()));
        let ca = certs.ca();
        let chain_only = ping(tls_port, &["--tls", "--cacert", s(&ca), "--pass", "pw"]);
        assert_eq!(chain_only.expect("PING, chain checked only"), "PONG");
    }

    #[test]
    fn restart_kill9_sigstop_and_tls_replica() {
        let certs = TestCerts::generate().expect("certs");
        let mut master = LocalRedis::start_tls(
            &certs,
            TlsServer {
                extra: vec!["--repl-diskless-sync-delay".into(), "0".into()],
                ..TlsServer::default()
            },
        )
        .expect("start tls master");
        drop(certs); // the server has its own copies
        let port = master.port();
        assert_eq!(master.cli(&["SET", "k", "v"]).expect("SET"), "OK");

        // A replica over TLS, in sync on return.
        let replica = LocalRedis::start_replica_of(&master, &[]).expect("start tls replica");
        assert!(replica.tls_port().is_some());
        let info = replica.cli(&["INFO", "replication"]).expect("INFO");
        assert_eq!(cli::info_field(&info, "role"), Some("slave"), "{info}");
        assert_eq!(
            cli::info_field(&info, "master_port"),
            Some(port.to_string().as_str()),
            "{info}"
        );
        assert_eq!(replica.cli(&["GET", "k"]).expect("GET on replica"), "v");

        // SIGSTOP: no answer; SIGCONT: answers again.
        master.sigstop().expect("sigstop");
        assert!(master.is_stopped() && master.is_alive());
        let stopped = master.cli_within(&["PING"], Duration::from_millis(500));
        assert!(stopped.is_err(), "a stopped server answered: {stopped:?}");
        master.sigcont().expect("sigcont");
        assert_eq!(master.cli(&["PING"]).expect("PING after SIGCONT"), "PONG");

        // kill9: gone; start_again: same port, same TLS, no data.
        master.kill9();
        assert!(!master.is_alive());
        assert!(master
            .cli_within(&["PING"], Duration::from_secs(2))
            .is_err());
        assert!(master.dir().join("redis.log").is_file(), "the dir stays");
        master.start_again().expect("start again");
        assert!(master.start_again().is_err(), "start_again while running");
        assert_eq!(master.port(), port);
        assert_eq!(master.cli(&["EXISTS", "k"]).expect("EXISTS"), "0");
        master.restart().expect("restart");
        assert_eq!(master.port(), port);
        assert_eq!(master.cli(&["PING"]).expect("PING after restart"), "PONG");
        // The replica re-syncs from the restarted master (an empty data set).
        replica
            .wait_link_up(port, Duration::from_secs(10))
            .expect("replica back in sync");
    }
}
