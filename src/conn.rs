//! The connection layer: every Redis access of the library goes through here (public:
//! [`Redis`], the connector, and [`server_time_ms`]; the rest is the library's own). It owns
//! connecting (timeouts on connect, read and write), preloading the Lua scripts on every new
//! connection, `NOSCRIPT` recovery (single calls and pipelines), sending pipelines, decoding
//! replies, reading the server clock, one thread's connection (`Link`), the host threads'
//! pool (`Pool`), and the capped, jittered backoff of the workers' retries (`Backoff`).
//!
//! The production topologies (docs/DESIGN.md "Deployment topologies"):
//! - **TLS** (`rediss://`, `rediss+sentinel://`): every connection is dialled by one
//!   `Dialer` (TLS with verification on, the CA file or the system roots, client certificates
//!   for mutual TLS; the crate's TLS module says which crypto provider and why).
//! - **Sentinel** (`redis+sentinel://h1,h2,h3/<master>`): every new connection asks the
//!   sentinels for the current master and checks its `ROLE` (the crate's sentinel module); a
//!   reply that says the server is no master (`READONLY`, `MASTERDOWN`, `LOADING`) drops the
//!   connection (`keep_connection`) and `Pool::run` retries that refused call once on a new
//!   one, so the next connection finds the new master. [`Redis::master_switches`] counts the
//!   times a new connection reached another master: the heartbeat then restores what the node
//!   holds (writes the last moment before a failover can be lost: replication is
//!   asynchronous).
//! - **Cluster** (`redis+cluster://h1,h2,...`): a [`Conn`] is either one connection or a
//!   cluster connection (the crate's cluster module: one connection per master, every command
//!   sent to the master of its key's slot, a pipeline split per master and its replies put
//!   back in order, redirections followed within the command timeout), behind the same
//!   `Link::run` / `Pool::run`, `call` and `exec` functions. A failover in the slot map (a
//!   replica now master of some slots) counts as a master switch.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use std::sync::Arc;

use redis::{
    Connection, ConnectionLike, FromRedisValue, Pipeline, RedisResult, ScriptInvocation, Value,
};

use crate::cluster::{Cluster, ClusterConn};
use crate::config::{redact_url, Config};
use crate::dial::{Bounded, Dialer};
use crate::endpoint::{self, Endpoint};
use crate::error::{Error, Result};
use crate::scripts::SCRIPTS;
use crate::sentinel::{SentinelAuth, Sentinels};
use crate::signals::Masked;
use crate::tls::TlsOptions;

/// Most members one `SADD` or `SREM` carries; longer lists are split into several commands
/// (of one pipeline), so no single command holds the server for long.
pub(crate) const MEMBERS_PER_COMMAND: usize = 1000;

/// Where Redis is and how long any call may take: the connector every connection of the
/// library comes from (node threads, host calls, `status`, `fsck`), and the one the CLI's
/// demo and the benchmarks use.
///
/// It speaks every URL form of [`crate::config::ConfigBuilder::redis_url`]: one server in
/// plaintext or over TLS, or the master a set of sentinels names (discovered on every new
/// connection, `ROLE`-checked; the crate's `sentinel` discovery). A new connection to a
/// standalone server is `ROLE`-checked too: a replica is refused at connect (its writes would
/// fail with `READONLY`).
///
/// ```no_run
/// use std::time::Duration;
/// use sfu_redis::conn::{server_time_ms, Redis};
///
/// let redis = Redis::new("redis://127.0.0.1:6379", Duration::from_secs(2))?;
/// let mut con = redis.connect()?; // timeouts set, scripts preloaded
/// println!("server time {} ms", server_time_ms(&mut con)?);
/// # Ok::<(), sfu_redis::Error>(())
/// ```
pub struct Redis {
    target: Target,
    dialer: Dialer,
    /// The URL with its password redacted, for messages.
    safe_url: String,
    transport: &'static str,
    route: Mutex<Route>,
    /// How many times a new connection reached another master than the one before (a
    /// failover through the sentinels).
    switches: AtomicU64,
    /// When the last switch was found.
    switched_at: Mutex<Option<Instant>>,
    /// When the current master was last seen with a replica connected (reset by a switch).
    replica_seen: Mutex<Option<(Instant, Option<String>)>>,
    /// Reconnects and script reloads of every connection made by this connector (a node's
    /// metrics).
    stats: Arc<ConnStats>,
}

/// What the connection layer counts for a node's metrics: connections made again after one
/// broke, and script-cache reloads after `NOSCRIPT`. Shared by a connector and every
/// connection it made; relaxed atomics, so counting costs no lock.
#[derive(Debug, Default)]
pub(crate) struct ConnStats {
    reconnects: AtomicU64,
    script_reloads: AtomicU64,
}

impl ConnStats {
    /// Connections made to replace one that was dropped (an error, a timeout, a failover,
    /// a dead idle connection), by the worker threads and the host calls' pool.
    pub(crate) fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    /// Times the scripts were loaded again after a `NOSCRIPT` reply (the server's script
    /// cache was flushed, or the server restarted), in a single call or a pipeline.
    pub(crate) fn script_reloads(&self) -> u64 {
        self.script_reloads.load(Ordering::Relaxed)
    }

    fn reconnected(&self) {
        self.reconnects.fetch_add(1, Ordering::Relaxed);
    }

    fn reloaded(&self) {
        self.script_reloads.fetch_add(1, Ordering::Relaxed);
    }
}

// One per connector: the variants' sizes (which depend on the `tls` feature) do not matter.
#[allow(clippy::large_enum_variant)]
enum Target {
    Direct(redis::Client),
    Sentinel(Sentinels),
    Cluster(Arc<Cluster>),
}

/// A connection of the library: to one server (standalone, or the master the sentinels name)
/// or to a Redis Cluster (one connection per master, each command routed by its key's hash
/// slot; see the crate's cluster module). It is a [`redis::ConnectionLike`]: commands,
/// pipelines and scripts are sent through it as through a driver connection. Timeouts are set
/// and the scripts preloaded on every server connection it holds.
pub struct Conn(Inner, Arc<ConnStats>, OutOfStep);

/// True once a pipeline on one server stopped at an I/O error with replies left unread, or
/// failed to send (`dial::pipeline_in_step`): those replies would answer the next requests,
/// so every later request on the connection fails at once ([`out_of_step`]). A cluster
/// connection drops its server connections after any failed call instead
/// (`ClusterConn::settle`).
#[derive(Default)]
struct OutOfStep(bool);

/// The error of a request on a connection left [`OutOfStep`].
fn out_of_step() -> redis::RedisError {
    std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        "this connection stopped reading a pipeline at a timed-out or broken reply and is out of step with the server: open a new one",
    )
    .into()
}

enum Inner {
    One(Connection),
    Cluster(Box<ClusterConn>),
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Inner::One(_) if self.2 .0 => f.write_str("Conn(one server, out of step)"),
            Inner::One(_) => f.write_str("Conn(one server)"),
            Inner::Cluster(c) => write!(f, "Conn({c:?})"),
        }
    }
}

impl Conn {
    /// True for a connection to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.0, Inner::Cluster(_))
    }

    /// The masters of a cluster connection's slot map (`host:port`), in address order; empty
    /// for one server.
    pub fn cluster_masters(&self) -> Vec<String> {
        match &self.0 {
            Inner::One(_) => Vec::new(),
            Inner::Cluster(c) => c
                .slot_map()
                .masters()
                .iter()
                .map(|(h, p)| endpoint::show_addr(h, *p))
                .collect(),
        }
    }

    /// Runs `f` on the plain connection to each master (one server: on it), in the order of
    /// [`Conn::cluster_masters`], and returns what `f` returned for each: for per-server
    /// checks (`sfu-redis doctor`: version, memory policy, ACL, latency), where every master
    /// of a cluster has its own configuration. A command `f` sends is never routed or
    /// redirected; its errors are `f`'s to handle.
    ///
    /// # Errors
    /// [`Error::Redis`] when the connection to a master cannot be opened.
    pub fn on_each_server<T>(&mut self, mut f: impl FnMut(&mut Connection) -> T) -> Result<Vec<T>> {
        let _masked = Masked::new();
        self.each_master(|c| Ok(f(c)))
            .map_err(|e| Error::redis("connect to every master", e))
    }

    /// As [`Conn::on_each_server`], but a master that cannot be reached does not stop the
    /// others: one result per master, in the order of [`Conn::cluster_masters`], an error
    /// naming the master for each that could not be reached (`sfu-redis doctor` checks the
    /// masters that answer and fails the one that does not).
    pub fn on_each_server_apart<T>(
        &mut self,
        mut f: impl FnMut(&mut Connection) -> T,
    ) -> Vec<Result<T>> {
        let _masked = Masked::new();
        let results = match &mut self.0 {
            Inner::One(_) if self.2 .0 => vec![Err(out_of_step())],
            Inner::One(c) => vec![Ok(f(c))],
            Inner::Cluster(c) => c.each_master_apart(|c| Ok(f(c))),
        };
        results
            .into_iter()
            .map(|r| r.map_err(|e| Error::redis("connect to the master", e)))
            .collect()
    }

    /// As [`Conn::on_each_server_apart`], but a master for which `skip(host:port)` is true (as
    /// [`Conn::cluster_masters`] names it) is neither connected to nor given to `f`: `None` in
    /// its place. A caller that saw a master fail leaves it out of its later calls instead of
    /// waiting for it again (`sfu-redis doctor`). One server is never skipped (`skip` is not
    /// asked: the caller decides whether to call at all).
    ///
    /// `f` may fail (a server that stopped answering): its error, like a failed connect, is
    /// that master's result, and on a cluster this connection then drops its server
    /// connections (as after any failed call: a late reply is never read as another's); a
    /// timeout or a dropped connection names the master.
    pub fn on_each_server_except<T>(
        &mut self,
        skip: impl Fn(&str) -> bool,
        mut f: impl FnMut(&mut Connection) -> RedisResult<T>,
    ) -> Vec<Option<Result<T>>> {
        let results = match &mut self.0 {
            Inner::One(_) if self.2 .0 => vec![Some(Err(out_of_step()))],
            Inner::One(c) => vec![Some(f(c))],
            Inner::Cluster(c) => c.each_master_except(skip, f),
        };
        results
            .into_iter()
            .map(|r| r.map(|r| r.map_err(|e| Error::redis("check the master", e))))
            .collect()
    }

    /// The nodes (`host:port`) of a cluster that did not answer (a timeout, a broken
    /// connection) while this connection read the slot map, in the order tried; empty for one
    /// server or when each node asked answered. `sfu-redis doctor` leaves them out of its
    /// checks instead of waiting for them again.
    pub fn cluster_unanswered(&self) -> Vec<String> {
        match &self.0 {
            Inner::One(_) => Vec::new(),
            Inner::Cluster(c) => c.unanswered().to_vec(),
        }
    }

    /// Sets the read timeout of the server connection(s) this connection holds now.
    pub(crate) fn set_read_timeout(&mut self, dur: Option<Duration>) -> RedisResult<()> {
        match &mut self.0 {
            Inner::One(c) => c.set_read_timeout(dur),
            Inner::Cluster(c) => c.set_read_timeout(dur),
        }
    }

    /// The replicas the slot map lists for all masters (0 for one server).
    pub fn cluster_replicas(&self) -> usize {
        match &self.0 {
            Inner::One(_) => 0,
            Inner::Cluster(c) => c.slot_map().replica_count(),
        }
    }

    /// The master (`host:port`) that serves `key`'s hash slot on a cluster; `None` for one
    /// server.
    pub fn cluster_master_of(&self, key: &str) -> Option<String> {
        match &self.0 {
            Inner::One(_) => None,
            Inner::Cluster(c) => c
                .slot_map()
                .master(crate::cluster::slot(key.as_bytes()))
                .map(|(h, p)| endpoint::show_addr(h, *p)),
        }
    }

    /// The slot map a cluster connection routes by; `None` for one server.
    pub(crate) fn slot_map(&self) -> Option<&crate::cluster::SlotMap> {
        match &self.0 {
            Inner::One(_) => None,
            Inner::Cluster(c) => Some(c.slot_map()),
        }
    }

    /// Runs `f` on the connection to every master (one server: on it); the results in
    /// master order.
    pub(crate) fn each_master<T>(
        &mut self,
        mut f: impl FnMut(&mut Connection) -> RedisResult<T>,
    ) -> RedisResult<Vec<T>> {
        let _masked = Masked::new();
        match &mut self.0 {
            Inner::One(_) if self.2 .0 => Err(out_of_step()),
            Inner::One(c) => Ok(vec![f(c)?]),
            Inner::Cluster(c) => c.each_master(f),
        }
    }
}

/// Every request blocks the asynchronous signals on the calling thread while it runs (the
/// crate's signals module): a host's signal handler cannot cut a read short with `EINTR`.
impl ConnectionLike for Conn {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        let _masked = Masked::new();
        match &mut self.0 {
            Inner::One(_) if self.2 .0 => Err(out_of_step()),
            Inner::One(c) => c.req_packed_command(cmd),
            Inner::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let _masked = Masked::new();
        match &mut self.0 {
            Inner::One(_) if self.2 .0 => Err(out_of_step()),
            Inner::One(c) => {
                let (out, in_step) = crate::dial::pipeline_in_step(c, cmd, offset, count);
                self.2 .0 = !in_step;
                out
            }
            Inner::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.0 {
            Inner::One(c) => c.get_db(),
            Inner::Cluster(c) => c.get_db(),
        }
    }

    fn check_connection(&mut self) -> bool {
        let _masked = Masked::new();
        match &mut self.0 {
            Inner::One(_) if self.2 .0 => false,
            Inner::One(c) => c.check_connection(),
            Inner::Cluster(c) => c.check_connection(),
        }
    }

    fn is_open(&self) -> bool {
        match &self.0 {
            Inner::One(_) if self.2 .0 => false,
            Inner::One(c) => c.is_open(),
            Inner::Cluster(c) => c.is_open(),
        }
    }
}

/// Shows the URL without its password (and without a user info that may be one), the
/// transport and the last route: never the driver's connection info.
impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redis")
            .field("url", &self.safe_url)
            .field("transport", &self.transport)
            .field("route", &*self.route.lock())
            .field("switches", &self.master_switches())
            .finish_non_exhaustive()
    }
}

/// Where the last connection went.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Route {
    /// The master's `host:port` (sentinel URLs), `None` for a standalone URL.
    pub master: Option<String>,
    /// The sentinel that named it (`host:port`); `None` if the last known master was used
    /// because no sentinel answered, or for a standalone URL.
    pub via: Option<String>,
    /// Replicas connected to the server, from its `ROLE` / `INFO replication` at that connect
    /// (0 when unknown: both refused by the ACL).
    pub replicas: usize,
    /// The server's replication ID (`INFO replication` `master_replid`): it changes when a
    /// replica is promoted or a server restarts empty, so a master switch is seen also behind
    /// one address. `None` when `INFO` was refused.
    pub replication_id: Option<String>,
}

impl Redis {
    /// A connector for `url` whose connect, TLS handshake, read and write each time out after
    /// `timeout`. TLS (`rediss://`) verifies the server against the system's roots; use
    /// [`Redis::from_config`] for a CA file, client certificates or sentinel credentials.
    /// Nothing is sent yet.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] (`redis_url`) when the URL cannot be used (the message shows
    /// the URL without its password); [`Error::InvalidArgument`] for a zero `timeout`.
    pub fn new(url: &str, timeout: Duration) -> Result<Self> {
        Self::build(
            url,
            &TlsOptions::default(),
            &SentinelAuth::default(),
            timeout,
        )
    }

    /// The connector of `config`: its URL, TLS files, sentinel credentials and command
    /// timeout.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] in memory-only mode (no Redis URL), or when a TLS file cannot
    /// be read; as [`Redis::new`] otherwise.
    pub fn from_config(config: &Config) -> Result<Self> {
        let url = config.redis_url().ok_or_else(|| {
            Error::config(
                "redis_url",
                "no Redis URL (memory-only mode); set REDIS_URL",
            )
        })?;
        Self::build(
            url,
            config.tls(),
            config.sentinel_auth(),
            config.timings().command_timeout,
        )
    }

    fn build(url: &str, tls: &TlsOptions, auth: &SentinelAuth, timeout: Duration) -> Result<Self> {
        if timeout.is_zero() {
            return Err(Error::InvalidArgument {
                what: "command timeout",
                reason: "must be longer than 0 ms".to_owned(),
            });
        }
        let safe_url = redact_url(url);
        let endpoint = endpoint::parse(url).map_err(|why| {
            Error::config(
                "redis_url",
                format!("{safe_url} is not a usable Redis URL: {why}"),
            )
        })?;
        let dialer = Dialer::new(endpoint.tls(), tls, timeout)?;
        let transport = endpoint.transport();
        let target = match endpoint {
            Endpoint::Direct { info, .. } => {
                Target::Direct(dialer.client(dialer.adapt(info)).map_err(|e| {
                    Error::config(
                        "redis_url",
                        format!("{safe_url} is not a usable Redis URL: {}", e.category()),
                    )
                })?)
            }
            Endpoint::Sentinel(ep) => Target::Sentinel(Sentinels::new(ep, auth)),
            Endpoint::Cluster(ep) => {
                Target::Cluster(Arc::new(Cluster::new(
                    ep,
                    dialer.clone(),
                    timeout,
                    reload_bounded,
                )))
            }
        };
        Ok(Redis {
            target,
            dialer,
            safe_url,
            transport,
            route: Mutex::new(Route::default()),
            switches: AtomicU64::new(0),
            switched_at: Mutex::new(None),
            replica_seen: Mutex::new(None),
            stats: Arc::default(),
        })
    }

    /// A new connection with connect/read/write timeouts and every script preloaded. Through
    /// sentinels, the master is discovered first (see the crate's sentinel discovery).
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis cannot be reached in time or refuses (authentication,
    /// ACL, TLS verification), when a standalone server is a replica, or when no sentinel
    /// names a reachable master (the message lists what each sentinel answered); the message
    /// names the URL without its password.
    pub fn connect(&self) -> Result<Conn> {
        self.connect_counted().map(|(con, _)| con)
    }

    /// [`Redis::connect`], with the master-switch count as this connection's own route left
    /// it (what a term confirmed over this connection is stamped with).
    pub(crate) fn connect_counted(&self) -> Result<(Conn, u64)> {
        // Dialling, the TLS handshake, the sentinels' answers and the script preload are
        // reads too: no signal handler cuts them short.
        let _masked = Masked::new();
        let wrap = |e: redis::RedisError| {
            Error::redis(format!("connect to Redis at {}", self.safe_url), e)
        };
        let (mut con, route) = match &self.target {
            Target::Cluster(c) => {
                let con = c.connect().map_err(wrap)?;
                return Ok((
                    Conn(
                        Inner::Cluster(Box::new(con)),
                        Arc::clone(&self.stats),
                        OutOfStep::default(),
                    ),
                    self.master_switches(),
                ));
            }
            Target::Direct(client) => {
                let con = self.dialer.open(client).map_err(|e| {
                    if e.is_timeout() && self.dialer.is_tls() {
                        // A plaintext server never answers a TLS hello: say so.
                        Error::redis(
                            format!(
                                "connect to Redis at {} (the TLS handshake got no answer: is this a plaintext port? use redis:// for it)",
                                self.safe_url
                            ),
                            e,
                        )
                    } else if !self.dialer.is_tls()
                        && e.is_connection_dropped()
                        && !e.is_connection_refusal()
                    {
                        // A TLS port drops a plaintext hello at once.
                        Error::redis(
                            format!(
                                "connect to Redis at {} (the server closed the connection at once: is this a TLS port? use rediss:// for it)",
                                self.safe_url
                            ),
                            e,
                        )
                    } else {
                        wrap(e)
                    }
                })?;
                (con, None)
            }
            Target::Sentinel(s) => {
                let found = s.connect(&self.dialer)?;
                let route = Route {
                    master: Some(found.master),
                    via: found.via,
                    replicas: found.replicas,
                    replication_id: None,
                };
                (found.con, Some(route))
            }
        };
        // INFO replication (refused by some ACLs: then nothing is known of the server).
        let replication = preload(&mut Bounded(&mut con), true).map_err(wrap)?;
        let mut route = route.unwrap_or_default();
        if let Some(r) = replication {
            if r.cluster {
                return Err(wrap(redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "the server is a Redis Cluster node",
                    "most keys would get MOVED replies here: use redis+cluster://host:port (any nodes of the cluster, comma-separated)".to_owned(),
                ))));
            }
            if r.role != "master" {
                return Err(wrap(redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "the server is not a master",
                    format!(
                        "its role is {:?}: its writes would fail with READONLY; point the URL at the master, or use redis+sentinel:// to follow failovers",
                        r.role
                    ),
                ))));
            }
            route.replication_id = r.replid;
            route.replicas = route.replicas.max(r.replicas);
        }
        let switches = self.note_route(route);
        Ok((
            Conn(Inner::One(con), Arc::clone(&self.stats), OutOfStep::default()),
            switches,
        ))
    }

    /// Counts a master switch when this connection reached another master than the last one:
    /// another replication ID (also behind one address: a managed endpoint, a floating IP),
    /// or, when that is unknown, another address named by the sentinels.
    fn note_route(&self, route: Route) -> u64 {
        let mut last = self.route.lock();
        let moved = match (&last.replication_id, &route.replication_id) {
            (Some(was), Some(now)) => was != now,
            _ => matches!((&last.master, &route.master), (Some(was), Some(now)) if was != now),
        };
        if moved {
            *self.switched_at.lock() = Some(Instant::now());
            // A promoted replica starts its own history.
            *self.replica_seen.lock() = None;
            self.switches.fetch_add(1, Ordering::Relaxed);
            match (&last.master, &route.master) {
                (Some(was), Some(now)) if was != now => log::warn!(
                    "the master of {} is now {now} (was {was}), named by {}",
                    self.safe_url,
                    route
                        .via
                        .as_deref()
                        .unwrap_or("no sentinel (last known master)")
                ),
                _ => log::warn!(
                    "the server behind {} is another master now (its replication ID changed): a failover or a restart",
                    self.safe_url
                ),
            }
        }
        self.note_replicas(route.replicas, None);
        *last = route;
        self.master_switches()
    }

    /// The reconnects and script reloads of this connector's connections.
    pub(crate) fn stats(&self) -> &ConnStats {
        &self.stats
    }

    /// Records that the master listed `replicas` connected replicas (now). `master`: on a
    /// cluster, the master (`host:port`) that answered, whose history this is; `None` for one
    /// server, whose history a master switch resets (`note_route`).
    pub(crate) fn note_replicas(&self, replicas: usize, master: Option<String>) {
        if replicas > 0 {
            *self.replica_seen.lock() = Some((Instant::now(), master));
        }
    }

    /// Whether the current master (`master` on a cluster, as given to `note_replicas`) listed
    /// a replica within the last `d`. On a cluster a failover makes another node the master of
    /// the slot: a promoted replica starts its own history, as behind sentinels (without
    /// this, every node that had seen the old master's replica refused to lead for 10 lease
    /// TTLs after the control slot's failover).
    pub(crate) fn replica_seen_within(&self, d: Duration, master: Option<&str>) -> bool {
        self.replica_seen
            .lock()
            .as_ref()
            .is_some_and(|(t, m)| t.elapsed() < d && m.as_deref() == master)
    }

    /// The URL without its password ([`crate::redact_url`]).
    pub fn safe_url(&self) -> &str {
        &self.safe_url
    }

    /// `plain`, `tls`, `sentinel` or `sentinel+tls`.
    pub fn transport(&self) -> &'static str {
        self.transport
    }

    /// Where the last connection went (master, sentinel, replicas).
    pub fn route(&self) -> Route {
        self.route.lock().clone()
    }

    /// How many times a new connection reached another master than the one before (a
    /// cluster: failovers seen in the slot map).
    pub fn master_switches(&self) -> u64 {
        let cluster = match &self.target {
            Target::Cluster(c) => c.failovers(),
            _ => 0,
        };
        self.switches.load(Ordering::Relaxed) + cluster
    }

    /// Whether this connector speaks to a Redis Cluster (`redis+cluster://`).
    pub fn is_cluster(&self) -> bool {
        matches!(self.target, Target::Cluster(_))
    }

    /// When a connection last found another master (see [`Redis::master_switches`]).
    pub fn switched_at(&self) -> Option<Instant> {
        let own = *self.switched_at.lock();
        let cluster = match &self.target {
            Target::Cluster(c) => c.failed_over_at(),
            _ => None,
        };
        own.max(cluster)
    }

    /// Sentinel URLs: true when the sentinels name another master than the one the last
    /// connection reached (see the sentinel probe): the caller should reconnect.
    pub(crate) fn sentinels_moved(&self) -> bool {
        let Target::Sentinel(s) = &self.target else {
            return false;
        };
        let current = self.route.lock().master.clone();
        match (s.probe(&self.dialer), current) {
            (Some(named), Some(current)) => named != current,
            _ => false,
        }
    }

    /// Sentinel URLs: how many replicas of the master the sentinels could promote
    /// ([`crate::sentinel::Sentinels::promotable_replicas`]); `None` for other URLs or when
    /// no sentinel answers.
    pub(crate) fn sentinel_promotable_replicas(&self) -> Option<usize> {
        let Target::Sentinel(s) = &self.target else {
            return None;
        };
        s.promotable_replicas(&self.dialer)
    }

    /// Sentinel URLs: true when any sentinel that answers names another master than the one
    /// the last connection reached (what a lease write needs before it counts).
    pub(crate) fn sentinels_disagree(&self) -> bool {
        let Target::Sentinel(s) = &self.target else {
            return false;
        };
        let current = self.route.lock().master.clone();
        current.is_some_and(|m| s.any_names_another(&self.dialer, &m))
    }

    /// The master name of a sentinel URL.
    pub fn master_name(&self) -> Option<&str> {
        match &self.target {
            Target::Sentinel(s) => Some(s.master_name()),
            Target::Direct(_) | Target::Cluster(_) => None,
        }
    }

    /// Whether connections use TLS.
    pub fn is_tls(&self) -> bool {
        self.dialer.is_tls()
    }

    /// The transport and, through sentinels, where the last connection went, for people:
    /// `plain`, `tls`, `sentinel: master 10.0.0.2:6379 of "mymaster" via sentinel
    /// 10.0.0.5:26379`.
    pub fn describe(&self) -> String {
        let route = self.route();
        match (self.master_name(), &route.master) {
            (Some(name), Some(master)) => format!(
                "{}: master {master} of {name:?} via {}",
                self.transport,
                route
                    .via
                    .map(|v| format!("sentinel {v}"))
                    .unwrap_or_else(|| "no sentinel (last known master)".into())
            ),
            _ => self.transport.to_owned(),
        }
    }
}

/// One thread's connection, made on first use and dropped after any error (a timed-out
/// connection may still deliver a late reply, so it is never reused), and dropped too when
/// another connection has found a new master meanwhile (a failover: this one may still point
/// at the old master, which may still accept writes until the sentinels demote it).
pub(crate) struct Link {
    /// The connection and [`Redis::master_switches`] when it was made.
    con: Option<(Conn, u64)>,
    /// A connection was made before: the next one is a reconnect (metrics).
    connected_before: bool,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("connected", &self.con.is_some())
            .finish()
    }
}

impl Link {
    pub(crate) fn new() -> Self {
        Link {
            con: None,
            connected_before: false,
        }
    }

    /// Drops the connection: the next call makes a new one.
    pub(crate) fn reset(&mut self) {
        self.con = None;
    }

    /// Runs `f` on the connection, connecting first if needed.
    pub(crate) fn run<T>(
        &mut self,
        redis: &Redis,
        mut f: impl FnMut(&mut Conn) -> Result<T>,
    ) -> Result<T> {
        self.run_fenced(redis, |con, _| f(con))
    }

    /// [`Link::run`], telling `f` the master-switch count ([`Redis::master_switches`]) under
    /// which the connection was made: what the lease thread stamps on the term it confirms.
    /// A call refused because the server is no master (`READONLY`, `MASTERDOWN`, `LOADING`:
    /// it did not run) is sent once more on a new connection, which finds the new master (a
    /// planned failover must not end a term or fail a tick).
    pub(crate) fn run_fenced<T>(
        &mut self,
        redis: &Redis,
        mut f: impl FnMut(&mut Conn, u64) -> Result<T>,
    ) -> Result<T> {
        let _masked = Masked::new();
        let out = self.run_once(redis, &mut f);
        if matches!(&out, Err(Error::Redis { source, .. }) if is_not_master(source)) {
            return self.run_once(redis, &mut f);
        }
        out
    }

    fn run_once<T>(
        &mut self,
        redis: &Redis,
        f: &mut impl FnMut(&mut Conn, u64) -> Result<T>,
    ) -> Result<T> {
        let switches = redis.master_switches();
        if self.con.as_ref().is_some_and(|(_, seen)| *seen != switches) {
            self.con = None;
        }
        let (con, made) = match &mut self.con {
            Some(c) => c,
            None => {
                let fresh = redis.connect_counted()?;
                if std::mem::replace(&mut self.connected_before, true) {
                    redis.stats.reconnected();
                }
                self.con.insert(fresh)
            }
        };
        let out = f(con, *made);
        if let Err(e) = &out {
            if keep_connection(e) {
                return out;
            }
            self.con = None;
        }
        out
    }
}

/// A server's error reply leaves the connection in sync; anything else (I/O, timeout, parse)
/// does not. A reply saying the server is no master (`READONLY`, `MASTERDOWN`, `LOADING`: a
/// failover happened behind the address, or a restarted server is still loading) keeps the
/// connection in sync but pointing at the wrong server: it is dropped, so the next connection
/// finds the new master (through the sentinels, or behind the same address).
fn keep_connection(e: &Error) -> bool {
    match e {
        Error::Redis { source, .. } => {
            source.code().is_some() && !source.is_timeout() && !is_not_master(source)
        }
        Error::BadData { .. }
        | Error::NotOwner { .. }
        | Error::NotPeerOwner { .. }
        | Error::Schema { .. } => true,
        _ => false,
    }
}

/// `READONLY` / `MASTERDOWN` / `LOADING`: the command was refused, so it did not run.
fn is_not_master(e: &redis::RedisError) -> bool {
    matches!(e.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
}

/// A small pool of idle connections for host threads' calls.
pub(crate) struct Pool {
    /// Idle connections, when each was put back, and [`Redis::master_switches`] when each was
    /// made (one made before a failover is dropped).
    idle: Mutex<Vec<(Conn, Instant, u64)>>,
    max_idle: usize,
    /// A connection was dropped (broken, dead when idle, made before a failover) since the
    /// last connection was made: the next one made counts as a reconnect (metrics).
    dropped: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("idle", &self.idle.lock().len())
            .field("max_idle", &self.max_idle)
            .finish()
    }
}

/// A connection idle longer than this is checked with `PING` before it carries a request, so
/// a server restarted (or a connection closed) meanwhile costs a reconnect, not a failed call.
const PROBE_AFTER: Duration = Duration::from_secs(1);

impl Pool {
    pub(crate) fn new(max_idle: usize) -> Self {
        Pool {
            idle: Mutex::new(Vec::new()),
            max_idle,
            dropped: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// An idle connection that answers, or a new one; with the master switch count it was
    /// made under.
    fn checkout(&self, redis: &Redis) -> Result<(Conn, u64)> {
        loop {
            let switches = redis.master_switches();
            let taken = self.idle.lock().pop();
            let Some((mut con, since, made)) = taken else {
                return self.connect(redis);
            };
            if made != switches {
                // Made before a failover: the others are older still.
                self.idle.lock().clear();
                self.note_dropped();
                continue;
            }
            if since.elapsed() < PROBE_AFTER || redis::cmd("PING").query::<String>(&mut con).is_ok()
            {
                return Ok((con, made));
            }
            // Dead (server restarted, connection closed): the others are likely dead too.
            self.idle.lock().clear();
            self.note_dropped();
        }
    }

    /// A new connection; a reconnect (counted) if one was dropped since the last one made.
    fn connect(&self, redis: &Redis) -> Result<(Conn, u64)> {
        let made = redis.connect_counted()?;
        if self.dropped.swap(false, Ordering::Relaxed) {
            redis.stats.reconnected();
        }
        Ok(made)
    }

    fn note_dropped(&self) {
        self.dropped.store(true, Ordering::Relaxed);
    }

    /// Runs `f` on a pooled (or new) connection; the connection goes back to the pool unless
    /// the call broke it. A request is never sent twice after it may have run: the only
    /// retry is after `READONLY`/`MASTERDOWN`/`LOADING` (a failover: the command was
    /// refused), on a new connection, with every idle one dropped.
    pub(crate) fn run<T>(
        &self,
        redis: &Redis,
        mut f: impl FnMut(&mut Conn) -> Result<T>,
    ) -> Result<T> {
        // One guard for the whole call (checkout, its round trips): the ones inside are free.
        let _masked = Masked::new();
        let (mut con, mut made) = self.checkout(redis)?;
        let mut out = f(&mut con);
        if matches!(&out, Err(Error::Redis { source, .. }) if is_not_master(source)) {
            self.idle.lock().clear();
            self.note_dropped();
            (con, made) = self.connect(redis)?;
            out = f(&mut con);
        }
        let keep = match &out {
            Ok(_) => true,
            Err(e) => keep_connection(e),
        };
        if keep {
            let mut idle = self.idle.lock();
            if idle.len() < self.max_idle {
                idle.push((con, Instant::now(), made));
            }
        } else {
            self.note_dropped();
            if matches!(&out, Err(e) if e.is_connection_error()) {
                self.idle.lock().clear();
            }
        }
        out
    }
}

/// Capped, jittered exponential backoff: `base`, doubling up to `cap`, each delay drawn
/// uniformly from [d/2, d].
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    base: Duration,
    cap: Duration,
    next: Duration,
}

impl Backoff {
    pub(crate) fn new(base: Duration, cap: Duration) -> Self {
        let base = base.max(Duration::from_millis(1)).min(cap);
        Backoff {
            base,
            cap,
            next: base,
        }
    }

    /// The next delay to wait.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.cap);
        jitter(d)
    }

    /// After a success: start again from `base`.
    pub(crate) fn reset(&mut self) {
        self.next = self.base;
    }
}

/// A duration drawn uniformly from [d/2, d].
pub(crate) fn jitter(d: Duration) -> Duration {
    let ms = d.as_millis().max(2) as u64;
    Duration::from_millis(ms / 2 + fastrand::u64(0..=ms / 2))
}

/// Loads every script into the server's script cache (`SCRIPT LOAD`, pipelined), and with
/// `role` asks the server's `ROLE` in the same round trip (`None` when it was refused, for
/// example by the ACL).
fn preload<C: ConnectionLike>(con: &mut C, info: bool) -> RedisResult<Option<Replication>> {
    let mut pipe = redis::pipe();
    for s in SCRIPTS.all() {
        pipe.load_script(s);
    }
    if info {
        pipe.cmd("INFO").arg("replication");
        pipe.cmd("INFO").arg("cluster");
    }
    pipe.ignore_errors();
    let mut replies: Vec<RedisResult<Value>> = pipe.query(con)?;
    let replication = if info {
        let text = |r: Option<RedisResult<Value>>| {
            r.and_then(|r| r.ok())
                .and_then(|v| redis::from_redis_value::<String>(v).ok())
        };
        let cluster = text(replies.pop()).unwrap_or_default();
        text(replies.pop()).map(|t| {
            let mut r = Replication::parse(&t);
            r.cluster = cluster.lines().any(|l| l.trim_end() == "cluster_enabled:1");
            r
        })
    } else {
        None
    };
    if let Some(e) = replies.into_iter().find_map(|r| r.err()) {
        return Err(e);
    }
    Ok(replication)
}

/// Reloads every script (after `NOSCRIPT`; on every new node connection of a cluster).
fn reload<C: ConnectionLike>(con: &mut C) -> RedisResult<()> {
    preload(con, false).map(|_| ())
}

/// [`reload`] on a new cluster node connection, its pipeline read by `dial::pipeline`.
fn reload_bounded(con: &mut Connection) -> RedisResult<()> {
    reload(&mut Bounded(con))
}

/// What `INFO replication` says of a server: its role, its connected replicas and its
/// replication ID. The replication ID names a dataset's history: a replica promoted to master
/// and a server restarted empty each start a new one, so a new ID behind the same address is
/// a failover (or a restart) the address hides.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Replication {
    role: String,
    replicas: usize,
    replid: Option<String>,
    /// `INFO cluster` says `cluster_enabled:1`.
    cluster: bool,
}

impl Replication {
    fn parse(text: &str) -> Replication {
        let field = |name: &str| {
            text.lines().find_map(|l| {
                l.trim_end()
                    .strip_prefix(name)
                    .and_then(|rest| rest.strip_prefix(':'))
                    .map(str::to_owned)
            })
        };
        Replication {
            role: field("role").unwrap_or_default(),
            replicas: field("connected_slaves")
                .and_then(|n| n.parse().ok())
                .unwrap_or(0),
            replid: field("master_replid").filter(|id| !id.is_empty()),
            cluster: false,
        }
    }
}

fn is_noscript(e: &redis::RedisError) -> bool {
    e.code() == Some("NOSCRIPT")
}

/// Sends `pipe` (one round trip) and returns one result per command; a failed command does
/// not fail the others. If any command failed with `NOSCRIPT` (the script cache was flushed,
/// maybe halfway through the pipeline), every script is reloaded and only those commands are
/// sent again, their new replies taking their places: a reply of a command that did run is
/// kept, since it may be the only record of what it deleted (issue 11: no clean-up that only a
/// lost reply knows). A pipeline with ignored commands is sent whole again (each is
/// idempotent). An `Err` means a round trip itself failed (I/O, timeout).
pub(crate) fn exec(con: &mut Conn, pipe: &mut Pipeline) -> RedisResult<Vec<RedisResult<Value>>> {
    if pipe.is_empty() {
        return Ok(Vec::new());
    }
    pipe.ignore_errors();
    let mut results: Vec<RedisResult<Value>> = pipe.query(con)?;
    // A flush can land again between the reload and the resend (a storm): up to 3 reloads.
    for _ in 0..3 {
        let flushed: Vec<usize> = results
            .iter()
            .enumerate()
            .filter(|(_, r)| matches!(r, Err(e) if is_noscript(e)))
            .map(|(i, _)| i)
            .collect();
        if flushed.is_empty() {
            return Ok(results);
        }
        log::info!("script cache was flushed; reloading scripts");
        con.1.reloaded();
        reload(con)?;
        if pipe.is_transaction() || results.len() != pipe.len() {
            // Replies do not map one to one onto commands (ignored ones): send it all again
            // (no caller derives a clean-up from such a pipeline's replies).
            results = pipe.query(con)?;
            continue;
        }
        // Only the commands that found no script: the others ran, and their replies may be
        // the only record of what they did (a reap script's deleted records, whose index
        // entries must go). Sending them again would replace those replies with "nothing
        // left".
        let mut again = redis::pipe();
        again.ignore_errors();
        for (i, cmd) in pipe.cmd_iter().enumerate() {
            if flushed.binary_search(&i).is_ok() {
                again.add_command(cmd.clone());
            }
        }
        let replies: Vec<RedisResult<Value>> = again.query(con)?;
        for (i, reply) in flushed.into_iter().zip(replies) {
            results[i] = reply;
        }
    }
    // Still flushed after 3 reloads (a flush keeps landing between a reload and the resend):
    // the commands that found no script go as `EVAL` with the script's source, which cannot
    // meet `NOSCRIPT`.
    let flushed: Vec<usize> = results
        .iter()
        .enumerate()
        .filter(|(_, r)| matches!(r, Err(e) if is_noscript(e)))
        .map(|(i, _)| i)
        .collect();
    if flushed.is_empty() || pipe.is_transaction() || results.len() != pipe.len() {
        return Ok(results);
    }
    let mut again = redis::pipe();
    again.ignore_errors();
    for (i, cmd) in pipe.cmd_iter().enumerate() {
        if flushed.binary_search(&i).is_ok() {
            again.add_command(as_eval(cmd).unwrap_or_else(|| cmd.clone()));
        }
    }
    let replies: Vec<RedisResult<Value>> = again.query(con)?;
    for (i, reply) in flushed.into_iter().zip(replies) {
        results[i] = reply;
    }
    Ok(results)
}

/// `EVALSHA <sha> ...` of one of the crate's scripts as `EVAL <source> ...` (the same keys and
/// arguments): the last resort when the script cache keeps being flushed between a reload
/// and the call. `None` for any other command.
fn as_eval(cmd: &redis::Cmd) -> Option<redis::Cmd> {
    let mut args = cmd.args_iter().map(|a| match a {
        redis::Arg::Simple(bytes) => bytes,
        _ => b"0".as_slice(), // a cursor: no script invocation carries one
    });
    if !args.next()?.eq_ignore_ascii_case(b"EVALSHA") {
        return None;
    }
    let source = SCRIPTS.source_of(args.next()?)?;
    let mut eval = redis::cmd("EVAL");
    eval.arg(source);
    for a in args {
        eval.arg(a);
    }
    Some(eval)
}

/// Sends one script invocation (reloading on `NOSCRIPT`) and decodes its reply.
pub(crate) fn call<T: FromRedisValue>(
    con: &mut Conn,
    op: &'static str,
    inv: &ScriptInvocation<'_>,
) -> Result<T> {
    // `invoke` loads the script and retries once on NOSCRIPT; a flush landing between that
    // load and the retry is survived by sending the script's source (`EVAL`), which cannot
    // meet NOSCRIPT (a script that got NOSCRIPT did not run, so nothing runs twice).
    // (`ScriptInvocation::invoke`'s steps, spelled out so that the reload is counted.)
    let evalsha = redis::Cmd::invoke_script(inv);
    let first = match evalsha.query(con) {
        Err(e) if is_noscript(&e) => {
            con.1.reloaded();
            match inv.load(con) {
                Ok(_) => evalsha.query(con),
                Err(e) => Err(e),
            }
        }
        out => out,
    };
    match first {
        Err(e) if is_noscript(&e) => {
            let eval = as_eval(&evalsha).ok_or_else(|| Error::redis(op, e))?;
            eval.query(con).map_err(|e| Error::redis(op, e))
        }
        out => out.map_err(|e| Error::redis(op, e)),
    }
}

/// Decodes one pipelined reply.
pub(crate) fn decode<T: FromRedisValue>(op: &'static str, r: RedisResult<Value>) -> Result<T> {
    let v = r.map_err(|e| Error::redis(op, e))?;
    redis::from_redis_value(v).map_err(|e| Error::bad_data(op, format!("unexpected reply: {e}")))
}

/// Round trips every cluster connection of this process has sent to each node
/// (`host:port`) so far: what `perf_report --cluster` counts per tick. Feature `testing`.
#[cfg(feature = "testing")]
pub fn cluster_round_trips() -> std::collections::BTreeMap<String, u64> {
    crate::cluster::ROUND_TRIPS
        .lock()
        .as_ref()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), *v)).collect())
        .unwrap_or_default()
}

/// Redis server time (`TIME`), in ms. Liveness uses server time only (docs/DESIGN.md "Server
/// time only"): never this host's clock.
///
/// # Errors
/// [`Error::Redis`] when the call fails; [`Error::BadData`] for a reply that is not `TIME`'s.
pub fn server_time_ms<C: ConnectionLike>(con: &mut C) -> Result<i64> {
    let reply = redis::cmd("TIME")
        .query::<Value>(con)
        .map_err(|e| Error::redis("read server time", e))?;
    time_reply_ms(&reply)
}

/// Redis server time in microseconds (the start of a clean-up: of an earlier life, of a
/// reap). On a cluster, the earliest of every master's clock: a room's `pinned_us` comes from
/// the clock of the master holding it, and a write made after this call must count as newer
/// on every master, whatever the skew between their clocks (invariant 1: a new life's room is
/// never taken for a leftover).
pub(crate) fn server_time_us(con: &mut Conn) -> Result<i64> {
    let replies = con
        .each_master(|c| redis::cmd("TIME").query::<Value>(c))
        .map_err(|e| Error::redis("read server time", e))?;
    let mut earliest = None;
    for reply in replies {
        let us = redis::from_redis_value_ref::<(i64, i64)>(&reply)
            .map(|(s, us)| s * 1_000_000 + us)
            .map_err(|e| {
                Error::bad_data("read server time", format!("unexpected TIME reply: {e}"))
            })?;
        earliest = Some(earliest.map_or(us, |e: i64| e.min(us)));
    }
    earliest.ok_or_else(|| Error::bad_data("read server time", "no master answered TIME"))
}

/// `TIME`'s reply (seconds, microseconds), e.g. from a pipeline, as server ms.
pub(crate) fn time_reply_ms(reply: &Value) -> Result<i64> {
    redis::from_redis_value_ref::<(i64, i64)>(reply)
        .map(|(s, us)| s * 1000 + us / 1000)
        .map_err(|e| Error::bad_data("read server time", format!("unexpected TIME reply: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sfu_redis_testkit::devserver::LocalRedis;

    /// A script cache flushed halfway through a pipeline: only the commands that found no
    /// script are sent again; the replies of those that ran are kept (sending everything again
    /// would run the first script twice and replace its reply with the second run's).
    #[test]
    fn noscript_halfway_resends_only_what_did_not_run() {
        let server = LocalRedis::start().expect("start redis-server");
        let redis = Redis::new(&server.url(), std::time::Duration::from_secs(2)).unwrap();
        let mut con = redis.connect().unwrap();
        let _: () = redis::cmd("MSET")
            .arg("a")
            .arg("x")
            .arg("b")
            .arg("x")
            .query(&mut con)
            .unwrap();
        // lease_release.lua deletes its key when it holds the caller's id: 1 the first time,
        // 0 on a second run.
        let release = |key: &str| {
            let mut inv = SCRIPTS.lease_release.prepare_invoke();
            inv.key(key).arg("x");
            inv
        };
        let mut pipe = redis::pipe();
        pipe.invoke_script(&release("a"));
        pipe.cmd("SCRIPT").arg("FLUSH");
        pipe.invoke_script(&release("b"));
        let replies = exec(&mut con, &mut pipe).unwrap();
        let got: Vec<Option<i64>> = replies
            .into_iter()
            .map(|r| r.ok().and_then(|v| redis::from_redis_value::<i64>(v).ok()))
            .collect();
        // Sent whole again, the first script would run twice (its reply then 0, "nothing
        // deleted") and the third would find no script again.
        assert_eq!(got, vec![Some(1), None, Some(1)]);
        let left: i64 = redis::cmd("EXISTS")
            .arg("a")
            .arg("b")
            .query(&mut con)
            .unwrap();
        assert_eq!(left, 0);
    }

    /// The last resort of a flush storm: an `EVALSHA` of one of the crate's scripts, sent as
    /// `EVAL` with its source, runs with the same keys and arguments on a server whose cache
    /// is empty (an `EVALSHA` would meet `NOSCRIPT` there).
    #[test]
    fn an_evalsha_sent_as_eval_runs_without_the_script_cache() {
        let server = LocalRedis::start().expect("start redis-server");
        let redis = Redis::new(&server.url(), std::time::Duration::from_secs(2)).unwrap();
        let mut con = redis.connect().unwrap();
        let _: () = redis::cmd("SET").arg("a").arg("x").query(&mut con).unwrap();
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut con).unwrap();
        let mut inv = SCRIPTS.lease_release.prepare_invoke();
        inv.key("a").arg("x");
        let evalsha = redis::Cmd::invoke_script(&inv);
        let err = evalsha.query::<i64>(&mut con).unwrap_err();
        assert!(is_noscript(&err), "{err}");
        let removed: i64 = as_eval(&evalsha).expect("an EVAL").query(&mut con).unwrap();
        assert_eq!(removed, 1);
        let left: i64 = redis::cmd("EXISTS").arg("a").query(&mut con).unwrap();
        assert_eq!(left, 0);
        assert!(as_eval(&redis::cmd("GET").arg("k").to_owned()).is_none());
    }
}
