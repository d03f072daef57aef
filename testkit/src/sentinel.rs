//! A private Redis Sentinel deployment for failover tests: a master, replicas and sentinels,
//! each a `redis-server` from `PATH` on a free loopback port in its own temp dir, all killed
//! (dirs removed) on `Drop`. Plaintext, or TLS only (data nodes and sentinels), with optional
//! passwords on the data nodes and on the sentinels.
//!
//! ```no_run
//! use std::time::Duration;
//! use sfu_redis_testkit::sentinel::{SentinelGroup, SentinelOptions};
//!
//! let mut group = SentinelGroup::start(SentinelOptions::default())?;
//! let url = group.url(); // redis+sentinel://127.0.0.1:<s1>,127.0.0.1:<s2>,.../mymaster
//! let (old, new) = group.failover()?; // SENTINEL FAILOVER, settled on return
//! if let Some(node) = group.server(new) {
//!     node.kill9(); // a crash: the sentinels promote another node
//! }
//! let next = group.wait_master_change(new, Duration::from_secs(20))?;
//! # Ok::<(), sfu_redis::Error>(())
//! ```
//!
//! Every query the kit makes goes through `redis-cli` (over TLS with `--tls --cacert`, and
//! the test client certificate, for a TLS group), bounded in time, so that a SIGSTOPped node
//! or sentinel delays it but never hangs it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sfu_redis::{Error, Result};

use crate::cli::{self, io, ClientTls, Proc, Target};
use crate::devserver::{LocalRedis, TlsServer};
use crate::tls::TestCerts;

/// How long one query (a `redis-cli` run) may take inside a wait.
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a query made by a public method may take.
const CLI_TIMEOUT: Duration = Duration::from_secs(10);

/// How long [`SentinelGroup::start`] waits for the sentinels to know each other and the
/// replicas, and [`SentinelGroup::failover`] for the switch and then for the group to settle.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(20);

/// Pause between two polls of a wait.
const POLL: Duration = Duration::from_millis(50);

/// Ports tried before a sentinel start gives up.
const START_ATTEMPTS: u32 = 5;

/// What [`SentinelGroup::start`] sets up. `Default`: master `mymaster`, 1 replica, 3
/// sentinels (quorum 2), `down-after-milliseconds` 500, `failover-timeout` 3000, plaintext, no
/// passwords, quick sentinel timers.
#[derive(Debug, Clone)]
pub struct SentinelOptions {
    /// The name the sentinels monitor the master under (`sentinel monitor <name> ...`).
    pub master_name: String,
    /// Replicas of the master (any number, 0 included).
    pub replicas: usize,
    /// Sentinels (at least 1). The quorum is a majority of them: `sentinels / 2 + 1`.
    pub sentinels: usize,
    /// `sentinel down-after-milliseconds`: how long a node may not answer before a sentinel
    /// deems it down (millisecond resolution).
    pub down_after: Duration,
    /// `sentinel failover-timeout` (millisecond resolution). A sentinel does not retry a
    /// failover of the same master within twice this.
    pub failover_timeout: Duration,
    /// TLS only when set: data nodes with `--port 0 --tls-port <port> --tls-replication yes`,
    /// sentinels with `port 0`, `tls-port`, `tls-replication yes` (they speak TLS to the data
    /// nodes and to each other), every process presenting [`TestCerts::server_cert`] and
    /// trusting [`TestCerts::ca`]. The files are copied into each process's dir.
    pub tls: Option<Arc<TestCerts>>,
    /// With `tls`: require client certificates (`tls-auth-clients yes`) on data nodes and
    /// sentinels; `false` (the default): `tls-auth-clients no`.
    pub tls_auth_clients: bool,
    /// `requirepass` and `masterauth` on every data node, and `sentinel auth-pass` on the
    /// sentinels. No blanks or quotes (Redis 7.0 sentinels rewrite it unquoted into their
    /// config, which then no longer loads).
    pub master_password: Option<String>,
    /// `requirepass` on the sentinels (they also authenticate to each other with it).
    pub sentinel_password: Option<String>,
    /// Sends `SENTINEL DEBUG publish-period 500 ask-period 200 info-period 1000` to each
    /// sentinel when it starts: hello messages every 500 ms instead of 2 s (sentinels find
    /// each other, and spread a new master, within a second), down-state questions to the
    /// other sentinels every 200 ms instead of 1 s, and replicas' `INFO` every 1 s instead of
    /// 10 s (role changes are seen quickly; a node that turned master on its own is turned
    /// back into a replica after 4 hello periods: 2 s instead of 8 s). Not shorter: a
    /// sentinel that has not heard of a failover within 4 hello periods turns the promoted
    /// master back into a replica of the old one, and the others then fail back to the old
    /// master; with 200 ms (0.8 s) a loaded CI machine delayed one sentinel's news by 1.1 s
    /// and `SENTINEL FAILOVER` never took (CI, stop 38: `+convert-to-slave` of the promoted
    /// node, then `+sdown` of it as a "master reporting as a replica" 8 s later).
    /// `true` by default; `false` keeps Redis's stock timers (then [`SentinelGroup::start`]
    /// takes about 2 s, and [`SentinelGroup::failover`] about 11 s: the sentinels see the old
    /// master's new role at their next 10 s `INFO`).
    pub quick_timers: bool,
}

impl Default for SentinelOptions {
    fn default() -> SentinelOptions {
        SentinelOptions {
            master_name: "mymaster".into(),
            replicas: 1,
            sentinels: 3,
            down_after: Duration::from_millis(500),
            failover_timeout: Duration::from_secs(3),
            tls: None,
            tls_auth_clients: false,
            master_password: None,
            sentinel_password: None,
            quick_timers: true,
        }
    }
}

/// One sentinel process (`redis-server <dir>/sentinel.conf --sentinel`). Killed and its dir
/// removed on `Drop`.
#[derive(Debug)]
pub struct Sentinel {
    proc: Proc,
    port: u16,
    dir: PathBuf,
    tls: Option<ClientTls>,
    password: Option<String>,
    quick_timers: bool,
}

impl Sentinel {
    /// Writes the config of a new sentinel on `port` in a new dir and starts it.
    fn start(opts: &SentinelOptions, master_port: u16, port: u16) -> Result<Sentinel> {
        let dir = std::env::temp_dir().join(format!(
            "sfu-redis-sentinel-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| io(format!("create {}", dir.display()), e))?;
        let mut s = Sentinel {
            proc: Proc::default(),
            port,
            dir,
            tls: None,
            password: opts.sentinel_password.clone(),
            quick_timers: opts.quick_timers,
        };
        let conf = s.write_conf(opts, master_port)?;
        std::fs::write(s.conf_path(), conf)
            .map_err(|e| io(format!("write {}", s.conf_path().display()), e))?;
        s.spawn()?;
        Ok(s)
    }

    /// The config file's text (and, with TLS, copies of the certificate files).
    fn write_conf(&mut self, opts: &SentinelOptions, master_port: u16) -> Result<String> {
        let name = &opts.master_name;
        let mut c = String::new();
        c.push_str("daemonize no\nbind 127.0.0.1\n");
        c.push_str(&format!("dir {}\n", quote(&self.dir.display().to_string())));
        c.push_str(&format!(
            "logfile {}\n",
            quote(&self.log_path().display().to_string())
        ));
        match &opts.tls {
            Some(certs) => {
                let tls_dir = self.dir.join("tls");
                std::fs::create_dir_all(&tls_dir)
                    .map_err(|e| io(format!("create {}", tls_dir.display()), e))?;
                let copy = |from: PathBuf, name: &str| -> Result<PathBuf> {
                    let to = tls_dir.join(name);
                    std::fs::copy(&from, &to).map_err(|e| {
                        io(format!("copy {} to {}", from.display(), to.display()), e)
                    })?;
                    Ok(to)
                };
                let ca = copy(certs.ca(), "ca.crt")?;
                let cert = copy(certs.server_cert(), "server.crt")?;
                let key = copy(certs.server_key(), "server.key")?;
                self.tls = Some(ClientTls {
                    ca: ca.clone(),
                    cert: copy(certs.client_cert(), "client.crt")?,
                    key: copy(certs.client_key(), "client.key")?,
                });
                c.push_str(&format!("port 0\ntls-port {}\n", self.port));
                c.push_str(&format!(
                    "tls-cert-file {}\n",
                    quote(&cert.display().to_string())
                ));
                c.push_str(&format!(
                    "tls-key-file {}\n",
                    quote(&key.display().to_string())
                ));
                c.push_str(&format!(
                    "tls-ca-cert-file {}\n",
                    quote(&ca.display().to_string())
                ));
                let auth = if opts.tls_auth_clients { "yes" } else { "no" };
                c.push_str(&format!("tls-auth-clients {auth}\ntls-replication yes\n"));
            }
            None => c.push_str(&format!("port {}\n", self.port)),
        }
        if let Some(pw) = &opts.sentinel_password {
            c.push_str(&format!("requirepass {}\n", quote(pw)));
        }
        let quorum = opts.sentinels / 2 + 1;
        c.push_str(&format!(
            "sentinel monitor {name} 127.0.0.1 {master_port} {quorum}\n"
        ));
        c.push_str(&format!(
            "sentinel down-after-milliseconds {name} {}\n",
            millis(opts.down_after)
        ));
        c.push_str(&format!(
            "sentinel failover-timeout {name} {}\n",
            millis(opts.failover_timeout)
        ));
        c.push_str(&format!("sentinel parallel-syncs {name} 1\n"));
        if let Some(pw) = &opts.master_password {
            c.push_str(&format!("sentinel auth-pass {name} {}\n", quote(pw)));
        }
        Ok(c)
    }

    fn spawn(&mut self) -> Result<()> {
        // Config errors go to stderr, before the log file is open.
        let stderr = cli::stderr_file(&self.dir)?;
        let child = Command::new("redis-server")
            .arg(self.conf_path())
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    io(
                        "start redis-server --sentinel: it is not on PATH; install it (Debian: apt-get install redis-server)",
                        e,
                    )
                } else {
                    io("start redis-server --sentinel", e)
                }
            })?;
        self.proc.set(child);
        self.wait_ready()?;
        if self.quick_timers {
            self.cli_within(
                &[
                    "SENTINEL",
                    "DEBUG",
                    "publish-period",
                    "500",
                    "ask-period",
                    "200",
                    "info-period",
                    "1000",
                ],
                QUERY_TIMEOUT,
            )?;
        }
        Ok(())
    }

    /// Waits (at most 10 s) until the sentinel answers `PING`.
    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(child) = self.proc.child_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(io(
                        format!(
                            "sentinel on port {} exited with {status}; its log ends:\n{}{}",
                            self.port,
                            cli::tail(&self.log_path(), 30),
                            cli::stderr_tail(&self.dir)
                        ),
                        std::io::Error::other("redis-server --sentinel exited"),
                    ));
                }
            }
            let last = match self.cli_within(&["PING"], QUERY_TIMEOUT) {
                Ok(pong) if pong == "PONG" => return Ok(()),
                Ok(other) => other,
                Err(e) => e.to_string(),
            };
            if Instant::now() > deadline {
                return Err(io(
                    format!(
                        "sentinel on port {} did not answer PING within 10 s ({last}); its log ends:\n{}",
                        self.port,
                        cli::tail(&self.log_path(), 30)
                    ),
                    std::io::Error::from(std::io::ErrorKind::TimedOut),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The sentinel's port (its TLS port in a TLS group).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The process id, `None` after [`Sentinel::kill9`].
    pub fn pid(&self) -> Option<u32> {
        self.proc.pid()
    }

    /// The sentinel's dir: `sentinel.conf` (which the sentinel rewrites with what it learns),
    /// `sentinel.log`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The sentinel's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("sentinel.log")
    }

    fn conf_path(&self) -> PathBuf {
        self.dir.join("sentinel.conf")
    }

    /// Runs `redis-cli` with `args` against this sentinel (TLS and password as the group's)
    /// and returns what it printed (raw format, trimmed). At most 10 s.
    ///
    /// # Errors
    /// [`Error::Io`] when `redis-cli` cannot connect, gets an error reply or times out.
    pub fn cli(&self, args: &[&str]) -> Result<String> {
        self.cli_within(args, CLI_TIMEOUT)
    }

    fn cli_within(&self, args: &[&str], timeout: Duration) -> Result<String> {
        cli::redis_cli(
            Target {
                port: self.port,
                tls: self.tls.as_ref(),
                password: self.password.as_deref(),
            },
            args,
            timeout,
        )
    }

    /// Kills the sentinel with SIGKILL and reaps it; its dir (and the config it rewrote) stay
    /// for [`Sentinel::start_again`]. Nothing happens when it is not running.
    pub fn kill9(&mut self) {
        self.proc.kill();
    }

    /// Starts the sentinel again, on the same port, from the config it last rewrote (so it
    /// remembers the master, replicas and sentinels it knew, and its id), and waits until it
    /// answers `PING` (the quick timers are sent again).
    ///
    /// # Errors
    /// [`Error::Io`] when it is still running, or does not come up within 10 s (the message
    /// holds the end of its log).
    pub fn start_again(&mut self) -> Result<()> {
        let port = self.port;
        self.proc
            .ensure_exited(|| format!("the sentinel on port {port}"))?;
        self.spawn()
    }

    /// Stops the sentinel with SIGSTOP. A sentinel whose timer was stopped for more than 2 s
    /// enters TILT mode when it goes on: for 30 s it watches but does not act (no failover,
    /// no votes), as a real sentinel on a paused host would.
    ///
    /// # Errors
    /// [`Error::Io`] when it is not running or `kill` fails.
    pub fn sigstop(&self) -> Result<()> {
        self.proc
            .pause(true, || format!("the sentinel on port {}", self.port))
    }

    /// Lets a sentinel stopped by [`Sentinel::sigstop`] go on (SIGCONT).
    ///
    /// # Errors
    /// [`Error::Io`] when it is not running or `kill` fails.
    pub fn sigcont(&self) -> Result<()> {
        self.proc
            .pause(false, || format!("the sentinel on port {}", self.port))
    }

    /// True between [`Sentinel::sigstop`] and [`Sentinel::sigcont`] (or a kill).
    pub fn is_stopped(&self) -> bool {
        self.proc.is_stopped()
    }

    /// True when the process runs (stopped or not).
    pub fn is_alive(&self) -> bool {
        self.proc.is_alive()
    }

    /// Alive and not stopped: it answers.
    fn is_running(&self) -> bool {
        self.is_alive() && !self.is_stopped()
    }

    /// `SENTINEL GET-MASTER-ADDR-BY-NAME <name>`.
    fn master_addr(&self, name: &str) -> Result<(String, u16)> {
        let out = self.cli_within(
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", name],
            QUERY_TIMEOUT,
        )?;
        let mut lines = out.lines().map(str::trim);
        match (
            lines.next(),
            lines.next().and_then(|p| p.parse::<u16>().ok()),
        ) {
            (Some(ip), Some(port)) if !ip.is_empty() => Ok((ip.to_owned(), port)),
            _ => Err(io(
                format!(
                    "sentinel on port {}: SENTINEL GET-MASTER-ADDR-BY-NAME {name} said {out:?}",
                    self.port
                ),
                std::io::Error::from(std::io::ErrorKind::InvalidData),
            )),
        }
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        self.kill9();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A running Sentinel deployment: data nodes (a master and its replicas, [`LocalRedis`]
/// servers) and sentinels. Everything is killed, and every dir removed, on `Drop`.
#[derive(Debug)]
pub struct SentinelGroup {
    // Sentinels first: on drop they go before the nodes they watch.
    sentinels: Vec<Sentinel>,
    nodes: Vec<LocalRedis>,
    opts: SentinelOptions,
}

impl SentinelGroup {
    /// Starts the master, then each replica (returning once it is in sync), then the
    /// sentinels, and returns when every sentinel reports the master (flags `master`), knows
    /// the other `sentinels - 1` sentinels and sees every replica healthy (flags `slave`,
    /// `master-link-status ok`): at most 20 s for that last part.
    ///
    /// Data nodes get `--repl-diskless-sync-delay 0` (a full sync starts at once), with
    /// `master_password` `--requirepass` and `--masterauth`, with TLS `--tls-replication yes`
    /// (so that any of them can be master, or replica, after a failover).
    ///
    /// # Errors
    /// [`Error::Io`] when `sentinels` is 0, the name or `master_password` is empty or holds
    /// blanks or quotes, when a
    /// process does not come up (the message holds the end of its log), or when the
    /// sentinels do not get the whole picture in time (the message says what was missing and
    /// holds the end of every sentinel's log).
    pub fn start(opts: SentinelOptions) -> Result<SentinelGroup> {
        if opts.sentinels == 0 {
            return Err(io(
                "start a sentinel group: it needs at least one sentinel",
                std::io::Error::from(std::io::ErrorKind::InvalidInput),
            ));
        }
        // Redis 7.0 sentinels write `sentinel monitor` and `sentinel auth-pass` back into their
        // config unquoted when they rewrite it: a blank or a quote there makes the config
        // unreadable at the next start (FATAL CONFIG FILE ERROR).
        let unsafe_word =
            |w: &str| w.contains(|c: char| c.is_whitespace() || c == '"' || c == '\'');
        if let Some(pw) = opts
            .master_password
            .as_deref()
            .filter(|pw| pw.is_empty() || unsafe_word(pw))
        {
            return Err(io(
                format!(
                    "start a sentinel group: master password {pw:?} is empty or holds a blank or a quote, which Redis 7.0 sentinels cannot keep in their rewritten config"
                ),
                std::io::Error::from(std::io::ErrorKind::InvalidInput),
            ));
        }
        if opts.master_name.is_empty() || unsafe_word(&opts.master_name) {
            return Err(io(
                format!(
                    "start a sentinel group: bad master name {:?}",
                    opts.master_name
                ),
                std::io::Error::from(std::io::ErrorKind::InvalidInput),
            ));
        }
        let mut base: Vec<String> = vec!["--repl-diskless-sync-delay".into(), "0".into()];
        if let Some(pw) = &opts.master_password {
            base.extend([
                "--requirepass".into(),
                pw.clone(),
                "--masterauth".into(),
                pw.clone(),
            ]);
        }
        let master = match &opts.tls {
            Some(certs) => {
                let mut extra = base.clone();
                extra.extend(["--tls-replication".into(), "yes".into()]);
                LocalRedis::start_tls(
                    certs,
                    TlsServer {
                        auth_clients: opts.tls_auth_clients,
                        plain_port: false,
                        cert: None,
                        extra,
                    },
                )?
            }
            None => {
                let extra: Vec<&str> = base.iter().map(String::as_str).collect();
                LocalRedis::start_with(&extra)?
            }
        };
        let master_port = master.port();
        let mut group = SentinelGroup {
            sentinels: Vec::new(),
            nodes: vec![master],
            opts,
        };
        let extra: Vec<&str> = base.iter().map(String::as_str).collect();
        for _ in 0..group.opts.replicas {
            let replica = LocalRedis::start_replica_of(&group.nodes[0], &extra)?;
            group.nodes.push(replica);
        }
        for _ in 0..group.opts.sentinels {
            let sentinel = group.start_sentinel(master_port)?;
            group.sentinels.push(sentinel);
        }
        group.wait_settled(master_port, SETTLE_TIMEOUT, true)?;
        Ok(group)
    }

    /// A new sentinel on a port no other process of the group has (a few tries: a port found
    /// free can be taken before the sentinel binds it).
    fn start_sentinel(&self, master_port: u16) -> Result<Sentinel> {
        let mut attempt = 1;
        loop {
            let taken: Vec<u16> = self
                .data_ports()
                .into_iter()
                .chain(self.sentinel_ports())
                .collect();
            let port = cli::free_port_not_in(&taken)?;
            match Sentinel::start(&self.opts, master_port, port) {
                Ok(s) => return Ok(s),
                Err(e) => {
                    let missing = matches!(&e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound);
                    if missing || attempt == START_ATTEMPTS {
                        return Err(e);
                    }
                }
            }
            attempt += 1;
        }
    }

    /// The group's URL: `redis+sentinel://127.0.0.1:<s1>,127.0.0.1:<s2>,.../<master name>`,
    /// `rediss+sentinel://...` with TLS, and `redis+sentinel://:<master password>@...` when
    /// `master_password` is set (percent-encoded). The sentinel password is not in it.
    pub fn url(&self) -> String {
        let scheme = if self.opts.tls.is_some() {
            "rediss+sentinel"
        } else {
            "redis+sentinel"
        };
        let auth = match &self.opts.master_password {
            Some(pw) => format!(":{}@", percent_encode(pw)),
            None => String::new(),
        };
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!(
            "{scheme}://{auth}{}/{}",
            hosts.join(","),
            self.opts.master_name
        )
    }

    /// The name the sentinels monitor the master under.
    pub fn master_name(&self) -> &str {
        &self.opts.master_name
    }

    /// The options the group was started with.
    pub fn options(&self) -> &SentinelOptions {
        &self.opts
    }

    /// The sentinels' ports, in start order (their TLS ports in a TLS group).
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.port).collect()
    }

    /// The data nodes' ports: the first master's, then the replicas', in start order (TLS
    /// ports in a TLS group). Which one is master now: [`SentinelGroup::master_addr`].
    pub fn data_ports(&self) -> Vec<u16> {
        self.nodes.iter().map(LocalRedis::port).collect()
    }

    /// The data node on `port`, to stop, kill or restart it, or to run `cli` on it.
    pub fn server(&mut self, port: u16) -> Option<&mut LocalRedis> {
        self.nodes.iter_mut().find(|n| n.port() == port)
    }

    /// The data node on `port`, or an error naming the port.
    fn node_on(&self, port: u16) -> Result<&LocalRedis> {
        self.nodes.iter().find(|n| n.port() == port).ok_or_else(|| {
            io(
                format!("no data node of the group on port {port}"),
                std::io::Error::from(std::io::ErrorKind::NotFound),
            )
        })
    }

    /// Sentinel `i` (start order, as [`SentinelGroup::sentinel_ports`]), to stop, kill or
    /// restart it.
    ///
    /// # Panics
    /// When `i` is not below the number of sentinels.
    pub fn sentinel(&mut self, i: usize) -> &mut Sentinel {
        &mut self.sentinels[i]
    }

    /// The sentinels, in start order.
    pub fn sentinels(&self) -> &[Sentinel] {
        &self.sentinels
    }

    /// The master's address as the sentinels say (`SENTINEL GET-MASTER-ADDR-BY-NAME`): the
    /// answer of the first running sentinel that gives one.
    ///
    /// # Errors
    /// [`Error::Io`] when no sentinel answers (each one's failure is in the message).
    pub fn master_addr(&self) -> Result<(String, u16)> {
        let mut failures = Vec::new();
        for s in self.sentinels.iter().filter(|s| s.is_running()) {
            match s.master_addr(&self.opts.master_name) {
                Ok(addr) => return Ok(addr),
                Err(e) => failures.push(format!("sentinel {}: {e}", s.port)),
            }
        }
        Err(io(
            format!(
                "ask the sentinels for master {}: no running sentinel answered [{}]",
                self.opts.master_name,
                failures.join("; ")
            ),
            std::io::Error::from(std::io::ErrorKind::NotConnected),
        ))
    }

    /// A forced failover: `SENTINEL FAILOVER <name>` on the first running sentinel, then waits
    /// until every running sentinel reports the same new master and its `ROLE` is `master`,
    /// then until the group settles: the old master, if it runs and is not stopped, is made
    /// a replica of the new one by hand (`REPLICAOF`, what the sentinels' `+convert-to-slave`
    /// would do a few hello periods later) and every running node replicates the new
    /// master, in sync, seen healthy by every running sentinel. Returns `(old, new)` master
    /// ports. At most 20 s for the switch and 20 s to settle.
    ///
    /// # Errors
    /// [`Error::Io`] when no sentinel answers, `SENTINEL FAILOVER` fails (`NOGOODSLAVE`: no
    /// replica to promote; `INPROG`: a failover runs), or a wait times out (the message says
    /// what each sentinel said and holds the end of their logs).
    pub fn failover(&self) -> Result<(u16, u16)> {
        let (old, new) = self.failover_unassisted()?;
        if let Some(node) = self.nodes.iter().find(|n| n.port() == old) {
            if node.is_alive() && !node.is_stopped() {
                let role = node.cli_within(&["ROLE"], QUERY_TIMEOUT)?;
                if role.lines().next() == Some("master") {
                    let to = new.to_string();
                    node.cli_within(&["REPLICAOF", "127.0.0.1", &to], QUERY_TIMEOUT)?;
                }
            }
        }
        self.wait_settled(new, SETTLE_TIMEOUT, false)?;
        Ok((old, new))
    }

    /// `SENTINEL FAILOVER <name>` as an operator sends it, leaving everything else to the
    /// sentinels: returns `(old, new)` once every running sentinel names the new master and
    /// its `ROLE` is master. Unlike [`SentinelGroup::failover`], the old master is NOT made a
    /// replica by hand: it stays a writable master, keeping its clients' connections, until
    /// the sentinels convert it (some seconds later: about 10 s with stock timers).
    ///
    /// # Errors
    /// As [`SentinelGroup::failover`].
    pub fn failover_unassisted(&self) -> Result<(u16, u16)> {
        let (_, old) = self.master_addr()?;
        let name = self.opts.master_name.clone();
        let sentinel = self
            .sentinels
            .iter()
            .find(|s| s.is_running())
            .ok_or_else(|| {
                io(
                    "SENTINEL FAILOVER: no sentinel is running",
                    std::io::Error::from(std::io::ErrorKind::NotConnected),
                )
            })?;
        let said = sentinel.cli(&["SENTINEL", "FAILOVER", &name])?;
        if said != "OK" {
            return Err(io(
                format!(
                    "SENTINEL FAILOVER {name} on sentinel {} said {said:?}",
                    sentinel.port
                ),
                std::io::Error::other("failover refused"),
            ));
        }
        let new = self.wait_master_change(old, SETTLE_TIMEOUT)?;
        Ok((old, new))
    }

    /// `SENTINEL SET <name> down-after-milliseconds <ms>` on every running sentinel: how long
    /// a node may not answer before they deem it down, from now on. After a failover a test
    /// sets it long, so a loaded machine stalling the new master for longer than a quick
    /// `down-after` does not make the sentinels fail back to the old one during the checks.
    ///
    /// # Errors
    /// [`Error::Io`] when a running sentinel does not say `OK`.
    pub fn set_down_after(&self, down_after: Duration) -> Result<()> {
        let ms = down_after.as_millis().max(1).to_string();
        let name = self.opts.master_name.as_str();
        for s in self.sentinels.iter().filter(|s| s.is_running()) {
            let said = s.cli_within(
                &["SENTINEL", "SET", name, "down-after-milliseconds", &ms],
                QUERY_TIMEOUT,
            )?;
            if said != "OK" {
                return Err(io(
                    format!("SENTINEL SET {name} down-after-milliseconds {ms} on sentinel {} said {said:?}", s.port),
                    std::io::Error::other("refused"),
                ));
            }
        }
        Ok(())
    }

    /// Waits until every running sentinel reports the same master, on a port other than
    /// `old_port`, and that node's `ROLE` says `master`; returns its port. Nothing is done
    /// to the other nodes (after a crash the sentinels reconfigure them by themselves).
    ///
    /// # Errors
    /// [`Error::Io`] after `timeout` (the message says what each sentinel said and holds
    /// the end of their logs).
    pub fn wait_master_change(&self, old_port: u16, timeout: Duration) -> Result<u16> {
        let start = Instant::now();
        let deadline = start + timeout;
        // What the wait saw, each change once with its time: the last state alone does not
        // say why a wait failed (CI, stop 38: the sentinels named a new master, then failed
        // back 8 s later, and only "still name the old one" was printed).
        let mut seen = String::new();
        let mut last = String::new();
        loop {
            let problem = match self.agreed_master() {
                Ok(port) if port == old_port => format!("the sentinels still name {port}"),
                Ok(port) => match self.node_role(port) {
                    Ok(role) if role == "master" => return Ok(port),
                    Ok(role) => format!("the sentinels name {port}, whose ROLE is {role}"),
                    Err(e) => format!("the sentinels name {port}: {e}"),
                },
                Err(e) => e,
            };
            if problem != last {
                seen.push_str(&format!(
                    "\n  +{} ms: {problem}",
                    start.elapsed().as_millis()
                ));
                last.clone_from(&problem);
            }
            if Instant::now() > deadline {
                return Err(self.timed_out(
                    &format!(
                        "wait for a master other than {old_port} ({})",
                        self.opts.master_name
                    ),
                    timeout,
                    &format!("{problem}; seen in order:{seen}"),
                ));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits until the group is healthy and returns the master's port: every running sentinel
    /// names the same master, whose `ROLE` is `master`; every other running, not stopped,
    /// data node replicates it with the link up; every running sentinel sees those replicas
    /// healthy. Use it after a scenario (a node restarted, a replica promoted by hand) to
    /// get back to a known state.
    ///
    /// # Errors
    /// [`Error::Io`] after `timeout` (the message says what was still wrong and holds the
    /// end of the sentinels' logs).
    pub fn wait_healthy(&self, timeout: Duration) -> Result<u16> {
        let deadline = Instant::now() + timeout;
        loop {
            let problem = match self.agreed_master() {
                Ok(port) => match self.settle_problem(port, false) {
                    None => return Ok(port),
                    Some(p) => p,
                },
                Err(e) => e,
            };
            if Instant::now() > deadline {
                return Err(self.timed_out("wait for a healthy group", timeout, &problem));
            }
            std::thread::sleep(POLL);
        }
    }

    /// `REPLICAOF NO ONE` on the data node on `port`: it turns master on its own, behind the
    /// sentinels' back, while client connections stay open (a "promoted by hand" scenario).
    /// The sentinels, which still know it as a replica, turn it back into one after 4 hello
    /// periods (2 s with the quick timers, 8 s without) unless their master is down.
    ///
    /// # Errors
    /// [`Error::Io`] when no data node has that port or the command fails.
    pub fn promote_by_hand(&self, port: u16) -> Result<()> {
        let said = self.node_on(port)?.cli(&["REPLICAOF", "NO", "ONE"])?;
        if said == "OK" {
            Ok(())
        } else {
            Err(io(
                format!("REPLICAOF NO ONE on port {port} said {said:?}"),
                std::io::Error::other("REPLICAOF NO ONE failed"),
            ))
        }
    }

    /// Waits until [`SentinelGroup::settle_problem`] finds nothing.
    fn wait_settled(&self, master: u16, timeout: Duration, all_sentinels: bool) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let problem = match self.settle_problem(master, all_sentinels) {
                None => return Ok(()),
                Some(p) => p,
            };
            if Instant::now() > deadline {
                return Err(self.timed_out(
                    &format!(
                        "wait for the sentinels of {} to settle on master {master}",
                        self.opts.master_name
                    ),
                    timeout,
                    &problem,
                ));
            }
            std::thread::sleep(POLL);
        }
    }

    /// What keeps the group from being settled on `master`, `None` when nothing does. With
    /// `all_sentinels`, each sentinel must also know all the others.
    fn settle_problem(&self, master: u16, all_sentinels: bool) -> Option<String> {
        let name = &self.opts.master_name;
        match self.node_role(master) {
            Ok(role) if role == "master" => {}
            Ok(role) => return Some(format!("master {master} has ROLE {role}")),
            Err(e) => return Some(format!("master {master}: {e}")),
        }
        let replicas: Vec<&LocalRedis> = self
            .nodes
            .iter()
            .filter(|n| n.port() != master && n.is_alive() && !n.is_stopped())
            .collect();
        let master_str = master.to_string();
        for r in &replicas {
            match r.cli_within(&["INFO", "replication"], QUERY_TIMEOUT) {
                Ok(info) => {
                    let role = cli::info_field(&info, "role");
                    let of = cli::info_field(&info, "master_port");
                    let link = cli::info_field(&info, "master_link_status");
                    if role != Some("slave")
                        || of != Some(master_str.as_str())
                        || link != Some("up")
                    {
                        return Some(format!(
                            "node {}: role {role:?}, master_port {of:?}, master_link_status {link:?}",
                            r.port()
                        ));
                    }
                }
                Err(e) => return Some(format!("node {}: {e}", r.port())),
            }
        }
        let others = (self.sentinels.len() - 1).to_string();
        for s in self.sentinels.iter().filter(|s| s.is_running()) {
            let view = match s.cli_within(&["SENTINEL", "MASTER", name], QUERY_TIMEOUT) {
                Ok(out) => cli::pairs(&out),
                Err(e) => return Some(format!("sentinel {}: {e}", s.port)),
            };
            let port = cli::field(&view, "port");
            let flags = cli::field(&view, "flags");
            if port != Some(master_str.as_str()) || flags != Some("master") {
                return Some(format!(
                    "sentinel {}: master port {port:?}, flags {flags:?}",
                    s.port
                ));
            }
            let known = cli::field(&view, "num-other-sentinels");
            if all_sentinels && known != Some(others.as_str()) {
                return Some(format!(
                    "sentinel {}: num-other-sentinels {known:?}, not {others}",
                    s.port
                ));
            }
            let listed = match s.cli_within(&["SENTINEL", "REPLICAS", name], QUERY_TIMEOUT) {
                Ok(out) => cli::records(&out, "name"),
                Err(e) => return Some(format!("sentinel {}: {e}", s.port)),
            };
            for r in &replicas {
                let port = r.port().to_string();
                let Some(rec) = listed
                    .iter()
                    .find(|rec| cli::field(rec, "port") == Some(port.as_str()))
                else {
                    return Some(format!("sentinel {}: does not list replica {port}", s.port));
                };
                let flags = cli::field(rec, "flags");
                let link = cli::field(rec, "master-link-status");
                let of = cli::field(rec, "master-port");
                if flags != Some("slave") || link != Some("ok") || of != Some(master_str.as_str()) {
                    return Some(format!(
                        "sentinel {}: replica {port} has flags {flags:?}, master-link-status {link:?}, master-port {of:?}",
                        s.port
                    ));
                }
            }
        }
        None
    }

    /// The master port every running sentinel names, or what is wrong.
    fn agreed_master(&self) -> std::result::Result<u16, String> {
        let name = &self.opts.master_name;
        let mut agreed: Option<u16> = None;
        let mut any = false;
        for s in self.sentinels.iter().filter(|s| s.is_running()) {
            any = true;
            match s.master_addr(name) {
                Ok((_, port)) => match agreed {
                    None => agreed = Some(port),
                    Some(p) if p == port => {}
                    Some(p) => {
                        return Err(format!(
                            "the sentinels disagree: {p}, and {port} (sentinel {})",
                            s.port
                        ))
                    }
                },
                Err(e) => return Err(format!("sentinel {}: {e}", s.port)),
            }
        }
        match agreed {
            Some(p) => Ok(p),
            None if !any => Err("no sentinel is running".into()),
            None => Err("no sentinel named a master".into()),
        }
    }

    /// The first line of `ROLE` on the data node on `port`.
    fn node_role(&self, port: u16) -> Result<String> {
        let role = self.node_on(port)?.cli_within(&["ROLE"], QUERY_TIMEOUT)?;
        Ok(role.lines().next().unwrap_or_default().to_owned())
    }

    fn timed_out(&self, what: &str, timeout: Duration, problem: &str) -> Error {
        let mut logs = String::new();
        for s in &self.sentinels {
            logs.push_str(&format!(
                "\n--- sentinel {} log ends:\n{}",
                s.port,
                cli::tail(&s.log_path(), 20)
            ));
        }
        for n in &self.nodes {
            logs.push_str(&format!(
                "\n--- data node {} log ends:\n{}",
                n.port(),
                cli::tail(&n.dir().join("redis.log"), 12)
            ));
        }
        io(
            format!(
                "{what}: not within {} ms; last: {problem}{logs}",
                timeout.as_millis()
            ),
            std::io::Error::from(std::io::ErrorKind::TimedOut),
        )
    }
}

impl Drop for SentinelGroup {
    fn drop(&mut self) {
        // Sentinels first, so that they do not react to the nodes going away.
        self.sentinels.clear();
        self.nodes.clear();
    }
}

fn millis(d: Duration) -> u128 {
    d.as_millis().max(1)
}

/// `s` as a double-quoted config-file string.
fn quote(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            '\n' => q.push_str("\\n"),
            '\r' => q.push_str("\\r"),
            '\t' => q.push_str("\\t"),
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

/// `s` percent-encoded for a URL's user info (unreserved characters kept).
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role(g: &mut SentinelGroup, port: u16) -> String {
        let node = g.server(port).expect("a data node on that port");
        let role = node.cli(&["ROLE"]).expect("ROLE");
        role.lines().next().unwrap_or_default().to_owned()
    }

    /// Polls `GET key` on the node on `port` until it says `want` (at most 5 s).
    fn wait_get(g: &mut SentinelGroup, port: u16, key: &str, want: &str) {
        let node = g.server(port).expect("a data node on that port");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let got = node.cli(&["GET", key]).expect("GET");
            if got == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "GET {key} on {port}: {got:?}, want {want:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn plaintext_group_fails_over_by_command_and_after_a_crash() {
        let t = Instant::now();
        let mut g = SentinelGroup::start(SentinelOptions::default()).expect("start group");
        eprintln!("group up in {:?}", t.elapsed());
        let data = g.data_ports();
        let sentinels = g.sentinel_ports();
        assert_eq!(data.len(), 2);
        assert_eq!(sentinels.len(), 3);
        assert!(data.iter().chain(&sentinels).all(|p| *p <= cli::MAX_PORT));
        let hosts: Vec<String> = sentinels.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        assert_eq!(
            g.url(),
            format!("redis+sentinel://{}/mymaster", hosts.join(","))
        );
        assert_eq!(g.master_name(), "mymaster");
        let (ip, master) = g.master_addr().expect("master addr");
        assert_eq!((ip.as_str(), master), ("127.0.0.1", data[0]));
        let replica = data[1];
        assert_eq!(role(&mut g, master), "master");
        assert_eq!(role(&mut g, replica), "slave");
        // Each sentinel knows the two others.
        for s in g.sentinels() {
            let listed = s
                .cli(&["SENTINEL", "SENTINELS", "mymaster"])
                .expect("SENTINEL SENTINELS");
            assert_eq!(cli::records(&listed, "name").len(), 2, "{listed}");
        }

        // A write on the master is readable on the replica.
        let node = g.server(master).expect("master node");
        assert_eq!(node.cli(&["SET", "k", "v1"]).expect("SET"), "OK");
        wait_get(&mut g, replica, "k", "v1");

        // A forced failover swaps them; settled on return.
        let t = Instant::now();
        let (old, new) = g.failover().expect("failover");
        eprintln!("failover in {:?}", t.elapsed());
        assert_eq!((old, new), (master, replica));
        assert_eq!(g.master_addr().expect("master addr").1, replica);
        assert_eq!(role(&mut g, replica), "master");
        assert_eq!(role(&mut g, master), "slave");
        let node = g.server(replica).expect("new master node");
        assert_eq!(node.cli(&["GET", "k"]).expect("GET"), "v1");
        assert_eq!(node.cli(&["SET", "k", "v2"]).expect("SET"), "OK");
        wait_get(&mut g, master, "k", "v2");

        // A crash of the new master: the sentinels promote the other node by themselves.
        let t = Instant::now();
        g.server(replica).expect("new master node").kill9();
        let next = g
            .wait_master_change(replica, Duration::from_secs(20))
            .expect("the sentinels promote the old master");
        eprintln!("crash failover in {:?}", t.elapsed());
        assert_eq!(next, master);
        assert_eq!(role(&mut g, master), "master");
        assert_eq!(
            g.master_addr().expect("master addr"),
            ("127.0.0.1".into(), master)
        );
        wait_get(&mut g, master, "k", "v2");
    }

    #[test]
    fn tls_group_with_passwords() {
        let certs = Arc::new(TestCerts::generate().expect("certs"));
        let t = Instant::now();
        let mut g = SentinelGroup::start(SentinelOptions {
            master_name: "tls-master".into(),
            tls: Some(Arc::clone(&certs)),
            master_password: Some("m:p@ss/1".into()),
            sentinel_password: Some("s-pass".into()),
            ..SentinelOptions::default()
        })
        .expect("start TLS group");
        eprintln!("TLS group up in {:?}", t.elapsed());
        let data = g.data_ports();
        let sentinels = g.sentinel_ports();
        let hosts: Vec<String> = sentinels.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        assert_eq!(
            g.url(),
            format!(
                "rediss+sentinel://:m%3Ap%40ss%2F1@{}/tls-master",
                hosts.join(",")
            )
        );
        assert_eq!(g.master_addr().expect("master addr").1, data[0]);

        // Sentinels and data nodes speak TLS only and want their passwords.
        let target = |port, tls| Target {
            port,
            tls,
            password: None,
        };
        let plain = cli::redis_cli(target(sentinels[0], None), &["PING"], QUERY_TIMEOUT);
        assert!(
            plain.is_err(),
            "plaintext PING to a TLS sentinel: {plain:?}"
        );
        let client = ClientTls {
            ca: certs.ca(),
            cert: certs.client_cert(),
            key: certs.client_key(),
        };
        for port in [sentinels[0], data[0]] {
            let noauth = cli::redis_cli(target(port, Some(&client)), &["PING"], QUERY_TIMEOUT);
            assert!(
                noauth
                    .as_ref()
                    .is_err_and(|e| e.to_string().contains("NOAUTH")),
                "PING without password to {port}: {noauth:?}"
            );
        }
        let node = g.server(data[0]).expect("master node");
        assert_eq!(node.cli(&["SET", "k", "v"]).expect("SET"), "OK");
        wait_get(&mut g, data[1], "k", "v");

        // A replica promoted by hand: the sentinels turn it back into a replica.
        g.promote_by_hand(data[1]).expect("promote by hand");
        assert_eq!(role(&mut g, data[1]), "master");
        let master = g
            .wait_healthy(Duration::from_secs(15))
            .expect("the sentinels demote it");
        assert_eq!(master, data[0]);
        assert_eq!(role(&mut g, data[1]), "slave");

        // A sentinel killed and started again remembers the group.
        g.sentinel(0).kill9();
        assert!(!g.sentinel(0).is_alive());
        assert_eq!(g.master_addr().expect("the others answer").1, data[0]);
        g.sentinel(0).start_again().expect("sentinel back");
        let view = g
            .sentinel(0)
            .cli(&["SENTINEL", "MASTER", "tls-master"])
            .expect("SENTINEL MASTER");
        let view = cli::pairs(&view);
        assert_eq!(cli::field(&view, "num-other-sentinels"), Some("2"));
        // The quick timers were sent again.
        let timers = g
            .sentinel(0)
            .cli(&["SENTINEL", "DEBUG"])
            .expect("SENTINEL DEBUG");
        let timers = cli::pairs(&timers);
        assert_eq!(
            cli::field(&timers, "PUBLISH-PERIOD"),
            Some("500"),
            "{timers:?}"
        );
        assert_eq!(
            cli::field(&timers, "INFO-PERIOD"),
            Some("1000"),
            "{timers:?}"
        );
        assert_eq!(
            cli::field(&view, "port"),
            Some(data[0].to_string().as_str())
        );

        // A forced failover over TLS, with the passwords.
        let (old, new) = g.failover().expect("TLS failover");
        assert_eq!((old, new), (data[0], data[1]));
        assert_eq!(role(&mut g, data[0]), "slave");
        wait_get(&mut g, data[0], "k", "v");
    }

    #[test]
    fn mutual_tls_group_wants_client_certificates() {
        let certs = Arc::new(TestCerts::generate().expect("certs"));
        let g = SentinelGroup::start(SentinelOptions {
            replicas: 1,
            sentinels: 2,
            tls: Some(Arc::clone(&certs)),
            tls_auth_clients: true,
            ..SentinelOptions::default()
        })
        .expect("start mutual-TLS group");
        // Up means the sentinels reached the nodes and each other with their certificates.
        assert_eq!(g.master_addr().expect("master addr").1, g.data_ports()[0]);
        for port in [g.sentinel_ports()[0], g.data_ports()[1]] {
            let mut cmd = Command::new("redis-cli");
            cmd.args(["-e", "-h", "127.0.0.1", "-p", &port.to_string(), "--tls"])
                .arg("--cacert")
                .arg(certs.ca())
                .arg("PING");
            let done = cli::run(&mut cmd, "redis-cli", "", QUERY_TIMEOUT).expect("redis-cli");
            assert!(
                !done.status.success(),
                "PING without a client certificate to {port}: {}",
                done.stdout
            );
            let with = g
                .sentinels()
                .iter()
                .find(|s| s.port() == port)
                .map(|s| s.cli(&["PING"]))
                .or_else(|| {
                    g.nodes
                        .iter()
                        .find(|n| n.port() == port)
                        .map(|n| n.cli(&["PING"]))
                });
            assert_eq!(
                with.expect("a process on that port")
                    .expect("PING with client.crt"),
                "PONG"
            );
        }
    }

    #[test]
    fn bad_options_are_refused() {
        let zero = SentinelGroup::start(SentinelOptions {
            sentinels: 0,
            ..SentinelOptions::default()
        });
        assert!(zero.is_err_and(|e| e.to_string().contains("at least one sentinel")));
        let blank = SentinelGroup::start(SentinelOptions {
            master_name: "my master".into(),
            ..SentinelOptions::default()
        });
        assert!(blank.is_err_and(|e| e.to_string().contains("bad master name")));
        let blank_pw = SentinelGroup::start(SentinelOptions {
            master_password: Some("m p".into()),
            ..SentinelOptions::default()
        });
        assert!(blank_pw.is_err_and(|e| e.to_string().contains("master password")));
    }

    #[test]
    fn url_and_config_quoting() {
        assert_eq!(percent_encode("a-b_c.d~e"), "a-b_c.d~e");
        assert_eq!(percent_encode("p@ss:w/rd"), "p%40ss%3Aw%2Frd");
        assert_eq!(quote(r#"a "b" \c"#), r#""a \"b\" \\c""#);
    }
}
