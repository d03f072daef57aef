//! A private Redis Cluster for cluster tests: `masters` masters (at least 3), each with
//! `replicas` replicas, every node a [`LocalRedis`] (`redis-server` from `PATH` on a free
//! loopback port below 55535, so that its cluster bus, the port + 10000, fits, in its own temp
//! dir holding its `nodes.conf`) started with `--cluster-enabled yes`, joined with
//! `redis-cli --cluster create`, all killed (dirs removed) on `Drop`.
//!
//! ```no_run
//! use std::time::Duration;
//! use sfu_redis_testkit::cluster::LocalCluster;
//!
//! let mut cluster = LocalCluster::start(3, 1)?; // 3 masters, 1 replica each; settled
//! let url = cluster.url(); // redis+cluster://127.0.0.1:<m1>,127.0.0.1:<m2>,127.0.0.1:<m3>
//! let moved = cluster.migrate_slot(42, cluster.master_ports()[1])?;
//! if let Some(owner) = cluster.master_of_slot(42) {
//!     cluster.kill9(owner); // a crash: its replica takes over
//! }
//! assert!(cluster.wait_ok(Duration::from_secs(30)));
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! Nodes run with `cluster-node-timeout 1000` (a dead master is failed over within a few
//! seconds), `cluster-require-full-coverage yes`, `cluster-replica-validity-factor 0` (a
//! replica always may take over, however long its link was down), `repl-diskless-sync-delay
//! 0`, no persistence, `protected-mode no`. Every check talks to the nodes with a `redis`
//! connection per query (connect within 1 s, replies within 2 s) and skips nodes that are
//! killed or SIGSTOPped, so that a stopped node never hangs the harness.
//!
//! [`LocalCluster::start_tls`] starts a TLS-only cluster: every node with `--port 0
//! --tls-port <port>` (certificates of a [`TestCerts`], `tls-auth-clients no`),
//! `--tls-cluster yes` (cluster bus and `MIGRATE` over TLS; `CLUSTER SLOTS`, `CLUSTER NODES`
//! and redirections name the TLS ports) and `--tls-replication yes`. Its ports are TLS ports,
//! its [`LocalCluster::url`] is `rediss+cluster://...`, and the checks speak TLS, trusting
//! the test CA, on one connection per node kept between queries rather than one per query
//! (a new TLS client is slow in a debug build), with the same time limits.
//!
//! ```no_run
//! use std::sync::Arc;
//! use sfu_redis_testkit::cluster::LocalCluster;
//! use sfu_redis_testkit::tls::TestCerts;
//!
//! let certs = Arc::new(TestCerts::generate().map_err(std::io::Error::other)?);
//! let cluster = LocalCluster::start_tls(3, 0, Arc::clone(&certs))?;
//! let url = cluster.url(); // rediss+cluster://127.0.0.1:<tls port 1>,...; trust certs.ca()
//! # Ok::<(), std::io::Error>(())
//! ```

use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::Value;

use crate::cli;
use crate::devserver::{LocalRedis, TlsServer};
use crate::tls::TestCerts;

/// Hash slots of a Redis Cluster.
const SLOTS: u16 = 16384;

/// `cluster-node-timeout`, in milliseconds.
const NODE_TIMEOUT_MS: u32 = 1000;

/// How long [`LocalCluster::start`] may take once the nodes run: the create, then the wait.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a connection to a node may take to set up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How long one reply may take.
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);

/// How long one `MIGRATE` may take (its own timeout, given to the source, is a bit less).
const MIGRATE_QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// The `timeout` argument of `MIGRATE` (milliseconds).
const MIGRATE_TIMEOUT_MS: u32 = 8000;

/// Keys per `CLUSTER GETKEYSINSLOT` / `MIGRATE ... KEYS` batch.
const MIGRATE_BATCH: usize = 100;

/// Pause between two polls of a wait.
const POLL: Duration = Duration::from_millis(100);

/// Log lines of each node put in an error.
const LOG_LINES: usize = 8;

/// A running Redis Cluster of [`LocalRedis`] nodes. Everything is killed, and every dir
/// removed, on `Drop`.
#[derive(Debug)]
pub struct LocalCluster {
    /// Masters first (as created), then replicas, in start order.
    nodes: Vec<LocalRedis>,
    /// How many of `nodes` were created masters.
    masters: usize,
    /// How the harness reaches the nodes (TLS for a [`LocalCluster::start_tls`] cluster).
    dial: Dial,
}

/// A run of slots `start..=end` and the port of the master serving them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SlotRange {
    start: u16,
    end: u16,
    port: u16,
}

/// An open migration of `slot`: the source (its current master) and the target.
#[derive(Debug)]
struct Migration {
    slot: u16,
    from: u16,
    to: u16,
    to_id: String,
}

impl LocalCluster {
    /// Starts `masters` masters (at least 3) and `masters * replicas` replicas, each on a free
    /// port below 55535 with `cluster-enabled yes` in its own temp dir, joins them with
    /// `redis-cli --cluster create <addrs> --cluster-replicas <replicas> --cluster-yes`, and
    /// returns once, within 60 s, every node says `cluster_state:ok` in `CLUSTER INFO`, every
    /// node's `CLUSTER SLOTS` covers the 16384 slots with the same owners, every node knows
    /// every other (`CLUSTER NODES`: no handshake, no failure flags, links connected) and
    /// every replica's link to its master is up.
    ///
    /// # Errors
    /// [`io::ErrorKind::InvalidInput`] with fewer than 3 masters; otherwise an error naming
    /// the node and what failed: a node that does not start (the message holds its log), a
    /// failed `redis-cli --cluster create` (its output and the ends of the nodes' logs), or
    /// a cluster that does not settle in time (what was still wrong, and the logs' ends).
    pub fn start(masters: usize, replicas: usize) -> io::Result<LocalCluster> {
        Self::start_nodes(masters, replicas, None)
    }

    /// Like [`LocalCluster::start`], every node TLS only: started with
    /// [`LocalRedis::start_tls`] (`--port 0`, `--tls-port <port>`, the certificates of
    /// `certs`, copied into each node's dir, `--tls-auth-clients no`), plus `--tls-cluster yes`
    /// (the cluster bus, at the TLS port + 10000, speaks TLS, as does `MIGRATE` between
    /// nodes, and `CLUSTER SLOTS` / `CLUSTER NODES` name the TLS ports) and
    /// `--tls-replication yes` (replicas sync over TLS); joined with `redis-cli --tls --cacert
    /// <ca> --cluster create ...`.
    ///
    /// Every port of the cluster ([`LocalCluster::ports`], [`LocalCluster::master_ports`],
    /// [`LocalCluster::master_of_slot`], the `to` of [`LocalCluster::migrate_slot`]) is then a
    /// TLS port; [`LocalCluster::url`] is `rediss+cluster://...` (trust [`TestCerts::ca`];
    /// no client certificate is needed). The harness's own checks speak TLS, trusting
    /// `certs.ca()` (read once here: `certs` may be dropped once this returns).
    ///
    /// # Errors
    /// As [`LocalCluster::start`]; also when `certs.ca()` cannot be read or a node cannot
    /// copy the certificates.
    pub fn start_tls(
        masters: usize,
        replicas: usize,
        certs: Arc<TestCerts>,
    ) -> io::Result<LocalCluster> {
        Self::start_nodes(masters, replicas, Some(&certs))
    }

    fn start_nodes(
        masters: usize,
        replicas: usize,
        certs: Option<&TestCerts>,
    ) -> io::Result<LocalCluster> {
        if masters < 3 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("start a Redis Cluster: it needs at least 3 masters, not {masters}"),
            ));
        }
        let total = masters * (1 + replicas);
        let timeout = NODE_TIMEOUT_MS.to_string();
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &timeout,
            "--cluster-require-full-coverage",
            "yes",
            "--cluster-replica-validity-factor",
            "0",
            "--repl-diskless-sync-delay",
            "0",
            "--protected-mode",
            "no",
        ];
        let dial = match certs {
            None => Dial::default(),
            Some(certs) => {
                args.extend(["--tls-cluster", "yes", "--tls-replication", "yes"]);
                let ca = std::fs::read(certs.ca()).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("read the test CA {}: {e}", certs.ca().display()),
                    )
                })?;
                Dial {
                    ca: Some(ca),
                    idle: Mutex::default(),
                }
            }
        };
        let mut cluster = LocalCluster {
            nodes: Vec::with_capacity(total),
            masters,
            dial,
        };
        let kind = if certs.is_some() {
            "redis-server --cluster-enabled yes --tls-cluster yes, TLS only"
        } else {
            "redis-server --cluster-enabled yes"
        };
        for i in 0..total {
            // LocalRedis retries other ports when one (or its bus port) is taken.
            let node = match certs {
                None => LocalRedis::start_with(&args),
                Some(certs) => LocalRedis::start_tls(
                    certs,
                    TlsServer {
                        extra: args.iter().map(|a| (*a).to_owned()).collect(),
                        ..TlsServer::default()
                    },
                ),
            }
            .map_err(|e| {
                from_kit(
                    format!("start cluster node {} of {total} ({kind})", i + 1),
                    e,
                )
            })?;
            cluster.nodes.push(node);
        }
        let deadline = Instant::now() + START_TIMEOUT;
        cluster.create(replicas, certs.map(|c| c.ca()), deadline)?;
        cluster.wait_settled(deadline)?;
        cluster.order_masters_first()?;
        Ok(cluster)
    }

    /// `redis-cli --cluster create` over every node (`--tls --cacert <ca>` with `ca`).
    fn create(&self, replicas: usize, ca: Option<PathBuf>, deadline: Instant) -> io::Result<()> {
        let addrs: Vec<String> = self
            .ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let mut cmd = Command::new("redis-cli");
        let mut tls = String::new();
        if let Some(ca) = &ca {
            cmd.arg("--tls").arg("--cacert").arg(ca);
            tls = format!(" --tls --cacert {}", ca.display());
        }
        cmd.args(["--cluster", "create"]).args(&addrs).args([
            "--cluster-replicas",
            &replicas.to_string(),
            "--cluster-yes",
        ]);
        let what = format!(
            "redis-cli{tls} --cluster create {} --cluster-replicas {replicas} --cluster-yes",
            addrs.join(" ")
        );
        let done = cli::run(
            &mut cmd,
            &what,
            "install it (Debian: apt-get install redis-tools)",
            deadline.saturating_duration_since(Instant::now()),
        )
        .map_err(|e| from_kit(String::new(), e))?;
        let out = format!("{}\n{}", done.stdout.trim(), done.stderr.trim());
        if !done.status.success() || out.contains("[ERR]") {
            let end = tail_text(&out, 30);
            return Err(io::Error::other(format!(
                "{what} failed ({}); it printed:\n{end}{}",
                done.status,
                self.logs()
            )));
        }
        Ok(())
    }

    /// Waits until [`LocalCluster::problem`] (with the start-up checks) finds nothing.
    fn wait_settled(&self, deadline: Instant) -> io::Result<()> {
        loop {
            let problem = match self.problem(true) {
                None => return Ok(()),
                Some(p) => p,
            };
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "wait for the Redis Cluster on ports {:?} to settle: not within {} s; last: {problem}{}",
                        self.ports(),
                        START_TIMEOUT.as_secs(),
                        self.logs()
                    ),
                ));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Puts the nodes `ROLE` calls masters first (start order kept within each part):
    /// `redis-cli --cluster create` makes the first ones masters, this checks it.
    fn order_masters_first(&mut self) -> io::Result<()> {
        let mut is_master = Vec::with_capacity(self.nodes.len());
        for port in self.ports() {
            is_master.push(self.dial.role(port)?.0 == "master");
        }
        let found = is_master.iter().filter(|m| **m).count();
        if found != self.masters {
            return Err(io::Error::other(format!(
                "redis-cli --cluster create made {found} masters of ports {:?}, not {}",
                self.ports(),
                self.masters
            )));
        }
        let mut nodes: Vec<(bool, LocalRedis)> =
            is_master.into_iter().zip(self.nodes.drain(..)).collect();
        nodes.sort_by_key(|(master, _)| !*master);
        self.nodes = nodes.into_iter().map(|(_, n)| n).collect();
        Ok(())
    }

    /// The cluster's URL: `redis+cluster://127.0.0.1:<p1>,127.0.0.1:<p2>,...`, the ports of
    /// the masters as created (start order), whatever their role now; for a TLS cluster
    /// ([`LocalCluster::start_tls`]) `rediss+cluster://...` with the TLS ports.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.nodes[..self.masters]
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let scheme = if self.is_tls() {
            "rediss+cluster"
        } else {
            "redis+cluster"
        };
        format!("{scheme}://{}", hosts.join(","))
    }

    /// True for a cluster started with [`LocalCluster::start_tls`].
    pub fn is_tls(&self) -> bool {
        self.dial.ca.is_some()
    }

    /// Every node's data port: the masters as created, then the replicas, in start order
    /// (killed nodes included). Which ones are masters now: [`LocalCluster::master_ports`].
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(LocalRedis::port).collect()
    }

    /// The current masters' ports, sorted: the running nodes whose `ROLE` says master, and
    /// the SIGSTOPped nodes a running node's `CLUSTER NODES` flags `master` but not `fail`.
    /// Killed nodes are never in it.
    pub fn master_ports(&self) -> Vec<u16> {
        let mut masters = Vec::new();
        let mut view: Option<Option<String>> = None;
        for node in self.nodes.iter().filter(|n| n.is_alive()) {
            let port = node.port();
            if !node.is_stopped() {
                if self.dial.role(port).is_ok_and(|(r, _)| r == "master") {
                    masters.push(port);
                }
                continue;
            }
            let nodes = view.get_or_insert_with(|| {
                self.answering()
                    .into_iter()
                    .find_map(|p| self.dial.query::<String>(p, &cluster_cmd(&["NODES"])).ok())
            });
            let flagged = nodes.as_deref().is_some_and(|text| {
                parse_nodes(text)
                    .iter()
                    .any(|(p, flags, _)| *p == port && has(flags, "master") && !has(flags, "fail"))
            });
            if flagged {
                masters.push(port);
            }
        }
        masters.sort_unstable();
        masters
    }

    /// The port of the master serving `slot` now, by `CLUSTER SLOTS`: the running node that
    /// names itself for it, or else (its owner stopped or dead, not yet replaced) the owner
    /// most running nodes name. `None` when no running node maps the slot (or `slot` is not
    /// below 16384).
    pub fn master_of_slot(&self, slot: u16) -> Option<u16> {
        if slot >= SLOTS {
            return None;
        }
        let mut named: Vec<u16> = Vec::new();
        for port in self.answering() {
            let Ok(map) = self.dial.slot_map(port) else {
                continue;
            };
            if let Some(owner) = owner_in(&map, slot) {
                if owner == port {
                    return Some(port);
                }
                named.push(owner);
            }
        }
        named
            .iter()
            .max_by_key(|p| named.iter().filter(|q| q == p).count())
            .copied()
    }

    /// Kills the node on `port` with SIGKILL (a stopped one too) and reaps it. It stays dead;
    /// its dir stays until the cluster is dropped.
    ///
    /// # Panics
    /// When no node of the cluster has that port.
    pub fn kill9(&mut self, port: u16) {
        self.node_mut(port).kill9();
        self.dial.forget(port);
    }

    /// Kills the node on `port` with SIGKILL and starts it again on the same port and dir:
    /// its `nodes.conf` is kept (it rejoins with the same id, role and slots), its data is not
    /// (no persistence): a master without replica comes back serving its slots, empty. Returns
    /// once every node says the cluster is ok again (within `timeout`).
    ///
    /// # Errors
    /// When the node does not start again, or the cluster is not ok within `timeout`.
    ///
    /// # Panics
    /// When no node of the cluster has that port.
    pub fn restart_empty(&mut self, port: u16, timeout: Duration) -> io::Result<()> {
        self.dial.forget(port);
        let node = self.node_mut(port);
        node.kill9();
        node.start_again()
            .map_err(|e| from_kit(format!("start cluster node {port} again"), e))?;
        if self.wait_ok(timeout) {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the cluster is not ok within {timeout:?} of restarting node {port}: {}{}",
                    self.problem(false).unwrap_or_default(),
                    self.logs()
                ),
            ))
        }
    }

    /// Stops the node on `port` with SIGSTOP: it keeps its connections but answers nothing,
    /// and after `cluster-node-timeout` the others deem it failed (a master's replica takes
    /// over).
    ///
    /// # Panics
    /// When no node of the cluster has that port, or it is not running (killed).
    pub fn pause(&self, port: u16) {
        if let Err(e) = self.node(port).sigstop() {
            panic!("pause the cluster node on port {port}: {e}");
        }
    }

    /// Lets a node stopped by [`LocalCluster::pause`] go on (SIGCONT).
    ///
    /// # Panics
    /// When no node of the cluster has that port, or it is not running (killed).
    pub fn resume(&self, port: u16) {
        if let Err(e) = self.node(port).sigcont() {
            panic!("resume the cluster node on port {port}: {e}");
        }
    }

    /// Waits (at most `timeout`) until every running, not stopped, node says
    /// `cluster_state:ok` and all of them report the same owners for the 16384 slots in
    /// `CLUSTER SLOTS`, every owner one of those nodes (not a killed or stopped one). True
    /// when that happened, false after `timeout` (or when no node runs).
    pub fn wait_ok(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.problem(false).is_none() {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(POLL);
        }
    }

    /// Moves `slot` from its current master to the master on `to`: `CLUSTER SETSLOT <slot>
    /// IMPORTING <source id>` on the target, `CLUSTER SETSLOT <slot> MIGRATING <target id>` on
    /// the source, `CLUSTER GETKEYSINSLOT` and `MIGRATE 127.0.0.1 <to> "" 0 <timeout> REPLACE
    /// KEYS ...` in batches of 100 until the slot is empty at the source, then `CLUSTER
    /// SETSLOT <slot> NODE <target id>` on the target, the source and every other running
    /// master. Returns the number of keys moved (0, and nothing done, when `to` already
    /// serves the slot). The replicas learn the new owner by gossip.
    ///
    /// # Errors
    /// When `slot` is not below 16384, `to` is not a running master of the cluster, no
    /// running node serves the slot, or a command fails (the message names the node and the
    /// command).
    pub fn migrate_slot(&self, slot: u16, to: u16) -> io::Result<usize> {
        if self.serving(slot)? == to {
            return Ok(0);
        }
        let m = self.open_migration(slot, to)?;
        let moved = self.move_keys(&m, usize::MAX)?;
        self.close_migration(&m)?;
        Ok(moved)
    }

    /// The first half of [`LocalCluster::migrate_slot`]: `SETSLOT IMPORTING` on the target,
    /// `SETSLOT MIGRATING` on the source, and `MIGRATE` of at most `keys` of the slot's keys.
    /// The slot stays open: the source still serves it, answering `-ASK <slot> <target>` for
    /// the keys it no longer has, and the target serves those only after `ASKING`. Returns
    /// the number of keys moved. Close it with [`LocalCluster::finish_migration`].
    ///
    /// # Errors
    /// As [`LocalCluster::migrate_slot`]; also when the master on `to` already serves the
    /// slot.
    pub fn begin_migration(&self, slot: u16, to: u16, keys: usize) -> io::Result<usize> {
        let m = self.open_migration(slot, to)?;
        self.move_keys(&m, keys)
    }

    /// The second half of [`LocalCluster::migrate_slot`] after
    /// [`LocalCluster::begin_migration`]: the states are set again (a no-op when they are
    /// still open), the slot's remaining keys migrated, then `SETSLOT NODE` on the target,
    /// the source and every other running master. Returns the number of keys moved by this
    /// call (0, and nothing done, when `to` already serves the slot).
    ///
    /// # Errors
    /// As [`LocalCluster::migrate_slot`].
    pub fn finish_migration(&self, slot: u16, to: u16) -> io::Result<usize> {
        self.migrate_slot(slot, to)
    }

    /// Checks `slot` and `to`, learns the ids, and sets IMPORTING on the target, then
    /// MIGRATING on the source.
    fn open_migration(&self, slot: u16, to: u16) -> io::Result<Migration> {
        let from = self.serving(slot)?;
        if from == to {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("migrate slot {slot} to the node on port {to}: it already serves it"),
            ));
        }
        let node = self.nodes.iter().find(|n| n.port() == to).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "migrate slot {slot} to port {to}: no node of the cluster (ports {:?}) has that port",
                    self.ports()
                ),
            )
        })?;
        if !node.is_alive() || node.is_stopped() {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                format!("migrate slot {slot} to the node on port {to}: it is killed or stopped"),
            ));
        }
        let (r, _) = self.dial.role(to)?;
        if r != "master" {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "migrate slot {slot} to the node on port {to}: its ROLE is {r}, not master"
                ),
            ));
        }
        let from_id = self.dial.query::<String>(from, &cluster_cmd(&["MYID"]))?;
        let to_id = self.dial.query::<String>(to, &cluster_cmd(&["MYID"]))?;
        let s = slot.to_string();
        self.dial
            .expect_ok(to, &cluster_cmd(&["SETSLOT", &s, "IMPORTING", &from_id]))?;
        self.dial
            .expect_ok(from, &cluster_cmd(&["SETSLOT", &s, "MIGRATING", &to_id]))?;
        Ok(Migration {
            slot,
            from,
            to,
            to_id,
        })
    }

    /// `MIGRATE`s at most `limit` keys of the slot, in batches; returns how many were sent
    /// (keys that expired between the listing and the `MIGRATE` included, unless none of a
    /// batch was left: `NOKEY`).
    fn move_keys(&self, m: &Migration, limit: usize) -> io::Result<usize> {
        let s = m.slot.to_string();
        let mut moved = 0;
        while moved < limit {
            let batch = MIGRATE_BATCH.min(limit - moved);
            let list = cluster_cmd(&["GETKEYSINSLOT", &s, &batch.to_string()]);
            let keys: Vec<Vec<u8>> = self.dial.query(m.from, &list)?;
            if keys.is_empty() {
                break;
            }
            let mut migrate = redis::cmd("MIGRATE");
            migrate
                .arg("127.0.0.1")
                .arg(m.to)
                .arg("")
                .arg(0)
                .arg(MIGRATE_TIMEOUT_MS)
                .arg("REPLACE")
                .arg("KEYS")
                .arg(&keys);
            let said: String = self
                .dial
                .query_within(m.from, &migrate, MIGRATE_QUERY_TIMEOUT)?;
            if said != "OK" && said != "NOKEY" {
                return Err(io::Error::other(format!(
                    "node {}: MIGRATE of {} keys of slot {} to port {} said {said:?}",
                    m.from,
                    keys.len(),
                    m.slot,
                    m.to
                )));
            }
            if said == "OK" {
                moved += keys.len();
            }
        }
        Ok(moved)
    }

    /// `SETSLOT NODE` on the target, the source, then every other running master.
    fn close_migration(&self, m: &Migration) -> io::Result<()> {
        let assign = cluster_cmd(&["SETSLOT", &m.slot.to_string(), "NODE", &m.to_id]);
        self.dial.expect_ok(m.to, &assign)?;
        self.dial.expect_ok(m.from, &assign)?;
        for port in self.master_ports() {
            if port != m.to && port != m.from && self.is_answering(port) {
                self.dial.expect_ok(port, &assign)?;
            }
        }
        Ok(())
    }

    /// The running node that serves `slot`, by its own `CLUSTER SLOTS`.
    fn serving(&self, slot: u16) -> io::Result<u16> {
        if slot >= SLOTS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("slot {slot}: a cluster has slots 0 to {}", SLOTS - 1),
            ));
        }
        match self.master_of_slot(slot) {
            Some(port) if self.is_answering(port) => Ok(port),
            Some(port) => Err(io::Error::new(
                io::ErrorKind::NotConnected,
                format!("slot {slot}: its master, the node on port {port}, is killed or stopped"),
            )),
            None => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("slot {slot}: no running node of the cluster maps it"),
            )),
        }
    }

    /// What keeps the cluster from being ok, `None` when nothing does. With `start`, also
    /// what [`LocalCluster::start`] waits for: every node known to every node and every
    /// replica's link up.
    fn problem(&self, start: bool) -> Option<String> {
        let live = self.answering();
        if live.is_empty() {
            return Some("no node of the cluster is running".into());
        }
        let mut first: Option<(u16, Vec<SlotRange>)> = None;
        for &port in &live {
            let info = match self.dial.query::<String>(port, &cluster_cmd(&["INFO"])) {
                Ok(info) => info,
                Err(e) => return Some(e.to_string()),
            };
            let state = cli::info_field(&info, "cluster_state");
            if state != Some("ok") {
                return Some(format!("node {port}: cluster_state {state:?}"));
            }
            let map = match self.dial.slot_map(port) {
                Ok(map) => map,
                Err(e) => return Some(e.to_string()),
            };
            let covered: usize = map.iter().map(|r| usize::from(r.end - r.start) + 1).sum();
            if covered != usize::from(SLOTS) {
                return Some(format!(
                    "node {port}: CLUSTER SLOTS covers {covered} of {SLOTS} slots: {}",
                    show(&map)
                ));
            }
            if let Some(r) = map.iter().find(|r| !live.contains(&r.port)) {
                return Some(format!(
                    "node {port}: slots {}-{} are served by {}, which is killed or stopped",
                    r.start, r.end, r.port
                ));
            }
            match &first {
                None => first = Some((port, map)),
                Some((p0, m0)) if *m0 != map => {
                    return Some(format!(
                        "nodes {p0} and {port} disagree on the slot owners: {} / {}",
                        show(m0),
                        show(&map)
                    ))
                }
                Some(_) => {}
            }
            if start {
                if let Some(p) = self.dial.start_problem(port, self.nodes.len()) {
                    return Some(p);
                }
            }
        }
        None
    }

    /// The ports of the nodes that run and are not stopped.
    fn answering(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.is_alive() && !n.is_stopped())
            .map(LocalRedis::port)
            .collect()
    }

    fn is_answering(&self, port: u16) -> bool {
        self.nodes
            .iter()
            .any(|n| n.port() == port && n.is_alive() && !n.is_stopped())
    }

    fn node(&self, port: u16) -> &LocalRedis {
        match self.nodes.iter().find(|n| n.port() == port) {
            Some(n) => n,
            None => panic!(
                "no node of the cluster (ports {:?}) on port {port}",
                self.ports()
            ),
        }
    }

    fn node_mut(&mut self, port: u16) -> &mut LocalRedis {
        let ports = self.ports();
        match self.nodes.iter_mut().find(|n| n.port() == port) {
            Some(n) => n,
            None => panic!("no node of the cluster (ports {ports:?}) on port {port}"),
        }
    }

    /// The ends of every node's log, each under a heading.
    fn logs(&self) -> String {
        let mut logs = String::new();
        for n in &self.nodes {
            logs.push_str(&format!(
                "\n--- node {} log ends:\n{}",
                n.port(),
                cli::tail(&n.dir().join("redis.log"), LOG_LINES)
            ));
        }
        logs
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        // All dead first, so that none reacts to the others going away; each `LocalRedis`
        // then removes its dir as the vector drops.
        for n in &mut self.nodes {
            n.kill9();
        }
    }
}

/// `CLUSTER <args...>`.
fn cluster_cmd(args: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd("CLUSTER");
    for a in args {
        cmd.arg(*a);
    }
    cmd
}

/// The command's name and arguments, for messages (arguments past 6 elided).
fn describe(cmd: &redis::Cmd) -> String {
    let args: Vec<String> = cmd
        .args_iter()
        .map(|a| match a {
            redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
            _ => "<arg>".into(),
        })
        .collect();
    if args.len() > 6 {
        format!("{} ... ({} arguments)", args[..6].join(" "), args.len())
    } else {
        args.join(" ")
    }
}

/// How the harness's own checks reach the nodes: plaintext, a new connection per query; or
/// TLS (no client certificate) trusting the CA of the cluster's [`TestCerts`], one
/// connection per node kept between queries (a new TLS client costs ~30 ms in a debug build:
/// redis-rs loads the system's root certificates for each one) and dropped on any error but
/// an error reply.
///
/// TLS uses `redis::Client::build_with_tls`, there since this workspace builds `redis` with
/// `tls-rustls` (the default `tls` feature of `sfu-redis`, which this crate depends on).
#[derive(Default)]
struct Dial {
    /// The CA (PEM) the nodes' certificates are signed by; `None`: plaintext.
    ca: Option<Vec<u8>>,
    /// TLS only: the idle connection to each node, by port.
    idle: Mutex<HashMap<u16, redis::Connection>>,
}

impl std::fmt::Debug for Dial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut idle: Vec<u16> = self.idle.lock().keys().copied().collect();
        idle.sort_unstable();
        f.debug_struct("Dial")
            .field("tls", &self.ca.is_some())
            .field("idle", &idle)
            .finish()
    }
}

impl Dial {
    /// A client for the node on `port`: `redis://127.0.0.1:<port>/`, or
    /// `rediss://127.0.0.1:<port>/` trusting only the CA.
    fn client(&self, port: u16) -> redis::RedisResult<redis::Client> {
        match &self.ca {
            None => redis::Client::open(format!("redis://127.0.0.1:{port}/")),
            Some(ca) => redis::Client::build_with_tls(
                format!("rediss://127.0.0.1:{port}/"),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(ca.clone()),
                },
            ),
        }
    }

    /// A new connection to the node on `port`: set up within 1 s, each read and write (the
    /// TLS handshake included) within `timeout`.
    fn connect(&self, port: u16, timeout: Duration) -> redis::RedisResult<redis::Connection> {
        let con = self
            .client(port)?
            .get_connection_with_timeout(CONNECT_TIMEOUT)?;
        con.set_read_timeout(Some(timeout))?;
        con.set_write_timeout(Some(timeout))?;
        Ok(con)
    }

    /// Sends `cmd` to the node on `port` on a new connection (set up within 1 s, reply
    /// within 2 s).
    fn query<T: redis::FromRedisValue>(&self, port: u16, cmd: &redis::Cmd) -> io::Result<T> {
        self.query_within(port, cmd, QUERY_TIMEOUT)
    }

    fn query_within<T: redis::FromRedisValue>(
        &self,
        port: u16,
        cmd: &redis::Cmd,
        timeout: Duration,
    ) -> io::Result<T> {
        let fail = |e: redis::RedisError| {
            let kind = if e.is_timeout() {
                io::ErrorKind::TimedOut
            } else if e.is_connection_refusal() || e.is_io_error() {
                io::ErrorKind::NotConnected
            } else {
                io::ErrorKind::Other
            };
            io::Error::new(kind, format!("node {port}: {}: {e}", describe(cmd)))
        };
        if self.ca.is_none() {
            let mut con = self.connect(port, timeout).map_err(fail)?;
            return cmd.query(&mut con).map_err(fail);
        }
        let idle = self.idle.lock().remove(&port);
        let reused = idle.is_some();
        let mut con = match idle {
            Some(con) => {
                con.set_read_timeout(Some(timeout)).map_err(fail)?;
                con.set_write_timeout(Some(timeout)).map_err(fail)?;
                con
            }
            None => self.connect(port, timeout).map_err(fail)?,
        };
        let mut said = cmd.query(&mut con);
        // An idle connection may have died with its node (or been closed by it): once more
        // on a new one. Not after a timeout (a stopped node), which would double the wait.
        if reused && matches!(&said, Err(e) if e.is_connection_dropped() && !e.is_timeout()) {
            con = self.connect(port, timeout).map_err(fail)?;
            said = cmd.query(&mut con);
        }
        // After anything but a reply (a timeout, a broken stream) the connection's state is
        // unknown: it goes.
        let clean = match &said {
            Ok(_) => true,
            Err(e) => e.code().is_some(),
        };
        if clean && redis::ConnectionLike::is_open(&con) {
            self.idle.lock().insert(port, con);
        }
        said.map_err(fail)
    }

    /// Drops the idle connection to the node on `port`, if any.
    fn forget(&self, port: u16) {
        self.idle.lock().remove(&port);
    }

    /// Sends `cmd` and fails unless the reply is `OK`.
    fn expect_ok(&self, port: u16, cmd: &redis::Cmd) -> io::Result<()> {
        let said: String = self.query(port, cmd)?;
        if said == "OK" {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "node {port}: {} said {said:?}",
                describe(cmd)
            )))
        }
    }

    /// `ROLE` of the node on `port`: `master`, `slave` (with its master's port) or
    /// `sentinel`.
    fn role(&self, port: u16) -> io::Result<(String, Option<u16>)> {
        let reply: Value = self.query(port, &redis::cmd("ROLE"))?;
        let parts = match &reply {
            Value::Array(parts) => parts.as_slice(),
            _ => &[],
        };
        let name = parts.first().and_then(text).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("node {port}: ROLE said {reply:?}"),
            )
        })?;
        let master = match name.as_str() {
            "slave" => parts
                .get(2)
                .and_then(int)
                .and_then(|p| u16::try_from(p).ok()),
            _ => None,
        };
        Ok((name, master))
    }

    /// The node on `port`'s `CLUSTER SLOTS`, as sorted ranges with adjacent runs of the same
    /// master merged.
    fn slot_map(&self, port: u16) -> io::Result<Vec<SlotRange>> {
        let reply: Value = self.query(port, &cluster_cmd(&["SLOTS"]))?;
        parse_slots(&reply).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("node {port}: CLUSTER SLOTS said {reply:?}"),
            )
        })
    }

    /// What [`LocalCluster::start`] still waits for on the node on `port`: it knows `total`
    /// nodes, none in handshake or failed, all links connected; a replica's link is up.
    fn start_problem(&self, port: u16, total: usize) -> Option<String> {
        let text = match self.query::<String>(port, &cluster_cmd(&["NODES"])) {
            Ok(text) => text,
            Err(e) => return Some(e.to_string()),
        };
        let known = parse_nodes(&text);
        if known.len() != total {
            return Some(format!(
                "node {port}: CLUSTER NODES lists {} nodes, not {total}",
                known.len()
            ));
        }
        let bad = ["handshake", "noaddr", "fail", "fail?"];
        if let Some((p, flags, link)) = known
            .iter()
            .find(|(_, flags, link)| bad.iter().any(|b| has(flags, b)) || link != "connected")
        {
            return Some(format!(
                "node {port}: CLUSTER NODES says node {p} has flags {flags}, link {link}"
            ));
        }
        let myself = known.iter().find(|(_, flags, _)| has(flags, "myself"));
        if myself.is_some_and(|(_, flags, _)| has(flags, "slave")) {
            let info = match self.query::<String>(port, redis::cmd("INFO").arg("replication")) {
                Ok(info) => info,
                Err(e) => return Some(e.to_string()),
            };
            let link = cli::info_field(&info, "master_link_status");
            if link != Some("up") {
                return Some(format!("replica {port}: master_link_status {link:?}"));
            }
        }
        None
    }
}

/// `CLUSTER SLOTS` (`[[start, end, [ip, port, id, ...], replicas...], ...]`) as sorted,
/// merged ranges; `None` when it has another shape.
fn parse_slots(reply: &Value) -> Option<Vec<SlotRange>> {
    let Value::Array(entries) = reply else {
        return None;
    };
    let mut ranges = Vec::with_capacity(entries.len());
    for entry in entries {
        let Value::Array(parts) = entry else {
            return None;
        };
        let start = u16::try_from(int(parts.first()?)?).ok()?;
        let end = u16::try_from(int(parts.get(1)?)?).ok()?;
        let Value::Array(master) = parts.get(2)? else {
            return None;
        };
        let port = u16::try_from(int(master.get(1)?)?).ok()?;
        ranges.push(SlotRange { start, end, port });
    }
    ranges.sort_by_key(|r| r.start);
    let mut merged: Vec<SlotRange> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match merged.last_mut() {
            Some(last) if last.port == r.port && last.end.checked_add(1) == Some(r.start) => {
                last.end = r.end;
            }
            _ => merged.push(r),
        }
    }
    Some(merged)
}

/// The master `map` names for `slot`.
fn owner_in(map: &[SlotRange], slot: u16) -> Option<u16> {
    map.iter()
        .find(|r| r.start <= slot && slot <= r.end)
        .map(|r| r.port)
}

/// A slot map in a line: `0-5460@7000 5461-10922@7001 ...`.
fn show(map: &[SlotRange]) -> String {
    let parts: Vec<String> = map
        .iter()
        .map(|r| format!("{}-{}@{}", r.start, r.end, r.port))
        .collect();
    parts.join(" ")
}

/// `CLUSTER NODES` lines as (port, flags, link state).
fn parse_nodes(text: &str) -> Vec<(u16, String, String)> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // <id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> ...
            let addr = fields.get(1)?;
            let port = addr
                .split('@')
                .next()?
                .rsplit_once(':')?
                .1
                .parse::<u16>()
                .ok()?;
            Some((
                port,
                (*fields.get(2)?).to_owned(),
                (*fields.get(7)?).to_owned(),
            ))
        })
        .collect()
}

/// True when the comma-separated `flags` hold `flag`.
fn has(flags: &str, flag: &str) -> bool {
    flags.split(',').any(|f| f == flag)
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::Okay => Some("OK".into()),
        _ => None,
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        other => text(other)?.parse().ok(),
    }
}

/// The last `lines` lines of `s`.
fn tail_text(s: &str, lines: usize) -> String {
    let all: Vec<&str> = s.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A kit error as an `io::Error` (its kind kept), `what` before its text.
fn from_kit(what: String, e: sfu_redis::Error) -> io::Error {
    let kind = match &e {
        sfu_redis::Error::Io { source, .. } => source.kind(),
        _ => io::ErrorKind::Other,
    };
    if what.is_empty() {
        io::Error::new(kind, e.to_string())
    } else {
        io::Error::new(kind, format!("{what}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `CLUSTER KEYSLOT key`, asked of the node on `port`.
    fn keyslot(d: &Dial, port: u16, key: &str) -> u16 {
        let slot: i64 = d
            .query(port, &cluster_cmd(&["KEYSLOT", key]))
            .expect("CLUSTER KEYSLOT");
        u16::try_from(slot).expect("a slot")
    }

    /// `GET key` on the node on `port` (after `ASKING` with `asking`), the error kept.
    fn get(d: &Dial, port: u16, key: &str, asking: bool) -> redis::RedisResult<Option<String>> {
        let mut con = d.connect(port, QUERY_TIMEOUT)?;
        if asking {
            redis::cmd("ASKING").query::<()>(&mut con)?;
        }
        redis::cmd("GET").arg(key).query(&mut con)
    }

    fn set(d: &Dial, port: u16, key: &str, value: &str) {
        let said: String = d
            .query(port, redis::cmd("SET").arg(key).arg(value))
            .expect("SET");
        assert_eq!(said, "OK");
    }

    #[test]
    fn cluster_is_send_and_sync() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<LocalCluster>();
    }

    #[test]
    fn cluster_refuses_fewer_than_3_masters() {
        let e = LocalCluster::start(2, 0).expect_err("2 masters");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("at least 3 masters"), "{e}");
    }

    #[test]
    fn cluster_replies_are_parsed() {
        let node = |port: i64| {
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
                Value::Array(vec![]),
            ])
        };
        let range = |a: i64, b: i64, port: i64| {
            Value::Array(vec![Value::Int(a), Value::Int(b), node(port)])
        };
        let reply = Value::Array(vec![
            range(5461, 10922, 7001),
            range(0, 99, 7000),
            range(100, 5460, 7000),
            range(10923, 16383, 7002),
        ]);
        let map = parse_slots(&reply).expect("parsed");
        assert_eq!(show(&map), "0-5460@7000 5461-10922@7001 10923-16383@7002");
        assert_eq!(owner_in(&map, 5461), Some(7001));
        assert_eq!(owner_in(&map, 16383), Some(7002));
        assert!(parse_slots(&Value::Int(1)).is_none());

        let nodes = "a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n\
                     b2 127.0.0.1:7001@17001,host master,fail - 0 0 2 disconnected\n";
        let parsed = parse_nodes(nodes);
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed[1].0, 7001);
        assert!(has(&parsed[1].1, "fail") && !has(&parsed[0].1, "fail"));
        assert!(!has(&parsed[0].1, "fail?"));
        assert_eq!(parsed[1].2, "disconnected");
    }

    #[test]
    fn cluster_of_3_serves_keys_and_migrates_a_slot() {
        let t = Instant::now();
        let cluster = LocalCluster::start(3, 0).expect("start a 3-master cluster");
        eprintln!("3-master cluster up in {:?}", t.elapsed());
        let ports = cluster.ports();
        assert_eq!(ports.len(), 3);
        assert!(ports.iter().all(|p| *p <= cli::MAX_PORT));
        let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        assert_eq!(
            cluster.url(),
            format!("redis+cluster://{}", hosts.join(","))
        );
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        assert_eq!(cluster.master_ports(), sorted);
        assert!(cluster.wait_ok(Duration::from_secs(1)));

        // A key SET on the node owning its slot is readable there; elsewhere it is MOVED.
        let slot = keyslot(&cluster.dial, ports[0], "{mig}0");
        let from = cluster.master_of_slot(slot).expect("an owner");
        for i in 0..250 {
            set(
                &cluster.dial,
                from,
                &format!("{{mig}}{i}"),
                &format!("v{i}"),
            );
        }
        assert_eq!(
            get(&cluster.dial, from, "{mig}7", false)
                .expect("GET")
                .as_deref(),
            Some("v7")
        );
        let to = *ports.iter().find(|p| **p != from).expect("another node");
        let moved = get(&cluster.dial, to, "{mig}7", false).expect_err("GET on a non-owner");
        assert_eq!(moved.code(), Some("MOVED"), "{moved}");

        // migrate_slot moves its 250 keys (3 batches) and the slot.
        let t = Instant::now();
        let n = cluster.migrate_slot(slot, to).expect("migrate_slot");
        eprintln!("slot {slot} with 250 keys migrated in {:?}", t.elapsed());
        assert_eq!(n, 250);
        assert_eq!(cluster.master_of_slot(slot), Some(to));
        let third = *ports
            .iter()
            .find(|p| **p != from && **p != to)
            .expect("a third");
        for port in [from, to, third] {
            let map = cluster.dial.slot_map(port).expect("CLUSTER SLOTS");
            assert_eq!(owner_in(&map, slot), Some(to), "the view of {port}");
        }
        assert_eq!(
            get(&cluster.dial, to, "{mig}249", false)
                .expect("GET")
                .as_deref(),
            Some("v249")
        );
        let moved = get(&cluster.dial, from, "{mig}0", false).expect_err("GET on the old owner");
        assert_eq!(moved.code(), Some("MOVED"), "{moved}");
        assert!(cluster.wait_ok(Duration::from_secs(10)));
        // Already there: nothing to do, and no migration to open.
        assert_eq!(cluster.migrate_slot(slot, to).expect("again"), 0);
        assert!(cluster.begin_migration(slot, to, 1).is_err());
        assert!(cluster.migrate_slot(SLOTS, to).is_err());
    }

    #[test]
    fn cluster_open_migration_answers_ask() {
        let cluster = LocalCluster::start(3, 0).expect("start a 3-master cluster");
        let ports = cluster.ports();
        let slot = keyslot(&cluster.dial, ports[0], "{ask}0");
        let from = cluster.master_of_slot(slot).expect("an owner");
        let to = *ports.iter().find(|p| **p != from).expect("another node");
        let keys: Vec<String> = (0..5).map(|i| format!("{{ask}}{i}")).collect();
        for k in &keys {
            set(&cluster.dial, from, k, &format!("value of {k}"));
        }

        assert_eq!(cluster.begin_migration(slot, to, 2).expect("begin"), 2);
        // The source still serves the slot: its keys, and ASK for the 2 it gave away.
        assert_eq!(cluster.master_of_slot(slot), Some(from));
        let mut asked = Vec::new();
        for k in &keys {
            match get(&cluster.dial, from, k, false) {
                Ok(v) => assert_eq!(v, Some(format!("value of {k}"))),
                Err(e) => {
                    assert_eq!(e.code(), Some("ASK"), "GET {k} at the source: {e}");
                    assert_eq!(
                        e.redirect_node(),
                        Some((format!("127.0.0.1:{to}").as_str(), slot))
                    );
                    asked.push(k.clone());
                }
            }
        }
        assert_eq!(asked.len(), 2, "{asked:?}");
        // The target serves a moved key after ASKING only.
        let no_ask = get(&cluster.dial, to, &asked[0], false).expect_err("GET without ASKING");
        assert_eq!(no_ask.code(), Some("MOVED"), "{no_ask}");
        let with_ask = get(&cluster.dial, to, &asked[0], true).expect("GET after ASKING");
        assert_eq!(with_ask, Some(format!("value of {}", asked[0])));

        assert_eq!(cluster.finish_migration(slot, to).expect("finish"), 3);
        assert_eq!(cluster.master_of_slot(slot), Some(to));
        for k in &keys {
            assert_eq!(
                get(&cluster.dial, to, k, false).expect("GET"),
                Some(format!("value of {k}"))
            );
        }
        assert_eq!(cluster.finish_migration(slot, to).expect("finished"), 0);
        assert!(cluster.wait_ok(Duration::from_secs(10)));
    }

    #[test]
    fn cluster_replica_takes_over_a_killed_master() {
        let t = Instant::now();
        let mut cluster = LocalCluster::start(3, 1).expect("start 3 masters + 3 replicas");
        eprintln!("3+3 cluster up in {:?}", t.elapsed());
        let ports = cluster.ports();
        assert_eq!(ports.len(), 6);
        assert_eq!(cluster.url().matches("127.0.0.1:").count(), 3);
        let mut masters = ports[..3].to_vec();
        masters.sort_unstable();
        assert_eq!(cluster.master_ports(), masters);

        let victim = ports[0];
        let replica = ports[3..]
            .iter()
            .copied()
            .find(|p| cluster.dial.role(*p).expect("ROLE").1 == Some(victim))
            .expect("a replica of the first master");
        let map = cluster.dial.slot_map(victim).expect("CLUSTER SLOTS");
        let slot = map.iter().find(|r| r.port == victim).expect("a slot").start;

        let t = Instant::now();
        cluster.kill9(victim);
        assert!(
            cluster.wait_ok(Duration::from_secs(30)),
            "not ok within 30 s: {:?}",
            cluster.problem(false)
        );
        eprintln!("failover settled in {:?}", t.elapsed());
        let now = cluster.master_ports();
        assert!(now.contains(&replica), "{now:?} lacks {replica}");
        assert!(!now.contains(&victim), "{now:?}");
        assert_eq!(now.len(), 3);
        assert_eq!(cluster.master_of_slot(slot), Some(replica));

        // A paused master is failed over too; resumed, it comes back as a replica.
        let paused = *now.iter().find(|p| **p != replica).expect("another master");
        let t = Instant::now();
        cluster.pause(paused);
        assert!(
            cluster.wait_ok(Duration::from_secs(30)),
            "not ok within 30 s of the pause: {:?}",
            cluster.problem(false)
        );
        eprintln!("failover of a paused master settled in {:?}", t.elapsed());
        let after = cluster.master_ports();
        assert!(!after.contains(&paused), "{after:?}");
        assert_eq!(after.len(), 3, "{after:?}");
        cluster.resume(paused);
        let deadline = Instant::now() + Duration::from_secs(15);
        while cluster.dial.role(paused).map(|r| r.0).ok().as_deref() != Some("slave") {
            assert!(Instant::now() < deadline, "{paused} not demoted");
            std::thread::sleep(POLL);
        }
        assert!(cluster.wait_ok(Duration::from_secs(15)));
        assert_eq!(cluster.master_ports(), after);
    }

    #[test]
    fn cluster_over_tls_serves_keys_and_migrates_a_slot() {
        let certs = Arc::new(TestCerts::generate().expect("test certificates"));
        let t = Instant::now();
        let cluster = LocalCluster::start_tls(3, 0, Arc::clone(&certs))
            .expect("start a 3-master TLS cluster");
        eprintln!("3-master TLS cluster up in {:?}", t.elapsed());
        drop(certs); // the nodes have their copies, the harness its CA
        assert!(cluster.is_tls());
        let ports = cluster.ports();
        assert_eq!(ports.len(), 3);
        assert!(ports.iter().all(|p| *p <= cli::MAX_PORT));
        let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let url = cluster.url();
        assert!(url.starts_with("rediss+cluster://"), "{url}");
        assert_eq!(url, format!("rediss+cluster://{}", hosts.join(",")));
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        assert_eq!(cluster.master_ports(), sorted);
        assert!(cluster.wait_ok(Duration::from_secs(1)));

        // TLS only: a plaintext client gets nowhere.
        let plain = Dial::default().query::<String>(ports[0], &redis::cmd("PING"));
        assert!(plain.is_err(), "plaintext PING answered: {plain:?}");
        // CLUSTER SLOTS and CLUSTER NODES name the TLS ports (tls-cluster yes), the bus at
        // the TLS port + 10000.
        let map = cluster.dial.slot_map(ports[0]).expect("CLUSTER SLOTS");
        let mut owners: Vec<u16> = map.iter().map(|r| r.port).collect();
        owners.sort_unstable();
        owners.dedup();
        assert_eq!(owners, sorted, "{}", show(&map));
        let nodes: String = cluster
            .dial
            .query(ports[0], &cluster_cmd(&["NODES"]))
            .expect("CLUSTER NODES");
        for p in &ports {
            let addr = format!("127.0.0.1:{p}@{}", u32::from(*p) + 10000);
            assert!(nodes.contains(&addr), "{addr} not in {nodes}");
        }

        // A key SET over TLS on the owner of its slot is readable there; elsewhere MOVED to
        // the owner's TLS port.
        let slot = keyslot(&cluster.dial, ports[0], "{tls}0");
        let from = cluster.master_of_slot(slot).expect("an owner");
        for i in 0..120 {
            set(
                &cluster.dial,
                from,
                &format!("{{tls}}{i}"),
                &format!("v{i}"),
            );
        }
        assert_eq!(
            get(&cluster.dial, from, "{tls}7", false)
                .expect("GET")
                .as_deref(),
            Some("v7")
        );
        let to = *ports.iter().find(|p| **p != from).expect("another node");
        let moved = get(&cluster.dial, to, "{tls}7", false).expect_err("GET on a non-owner");
        assert_eq!(moved.code(), Some("MOVED"), "{moved}");
        assert_eq!(
            moved.redirect_node(),
            Some((format!("127.0.0.1:{from}").as_str(), slot))
        );

        // migrate_slot: MIGRATE between TLS nodes (2 batches), then the slot.
        let t = Instant::now();
        let n = cluster
            .migrate_slot(slot, to)
            .expect("migrate_slot over TLS");
        eprintln!(
            "TLS slot {slot} with 120 keys migrated in {:?}",
            t.elapsed()
        );
        assert_eq!(n, 120);
        assert_eq!(cluster.master_of_slot(slot), Some(to));
        for port in &ports {
            let map = cluster.dial.slot_map(*port).expect("CLUSTER SLOTS");
            assert_eq!(owner_in(&map, slot), Some(to), "the view of {port}");
        }
        assert_eq!(
            get(&cluster.dial, to, "{tls}119", false)
                .expect("GET")
                .as_deref(),
            Some("v119")
        );
        let moved = get(&cluster.dial, from, "{tls}0", false).expect_err("GET on the old owner");
        assert_eq!(moved.code(), Some("MOVED"), "{moved}");
        assert!(cluster.wait_ok(Duration::from_secs(10)));
    }
}
