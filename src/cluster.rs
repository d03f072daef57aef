//! Redis Cluster (`redis+cluster://`, `rediss+cluster://`): the slot map, and one connection
//! per master with every command sent to the master that serves its key's hash slot.
//!
//! Why our own routing and not the crate's `ClusterConnection` (redis 1.8): its pipeline
//! refuses `SCAN` and `SCRIPT`, never loads a script inside a pipeline, has no per-call
//! deadline (its default retries wait from ~1.3 s up to minutes) and reconnects on its own, out
//! of sight of the fences the lease and the heartbeat keep. Here a cluster connection is a set
//! of plain connections (one per master, dialled by the same `Dialer` as every other
//! connection, scripts preloaded on each), so every rule of the connection layer holds per
//! node: timeouts on every read and write, `NOSCRIPT` recovery, a connection dropped after
//! any error.
//!
//! Routing, per command (the packed bytes the driver hands to [`ClusterConn`]):
//! - a command with a key goes to the master of the key's slot (`EVAL`/`EVALSHA`: the first
//!   key; every script of the crate touches one slot, docs/DESIGN.md "Key schema");
//! - `SCRIPT ...`, `ACL ...` and `FLUSHALL`/`FLUSHDB` go to every master (the reply is the
//!   first one's);
//! - `SCAN` walks every master in turn (replicas are not scanned: no key is seen twice): the
//!   cursor handed back encodes the master and its own cursor until the last master's scan
//!   ends (`0`), so a caller's pager sees one key space;
//! - any other command without a key (`TIME`, `ROLE`, `WAIT`, `PING`, `INFO`) goes to the node
//!   of the keyed command nearest before it in the same pipeline (after it, if none), else to
//!   the node of this connection's last keyed command: `WAIT` after a lease write waits on the
//!   master that took the write.
//!
//! A pipeline is split per master; every group is written before any reply is read, so a
//! pipeline costs one round trip whatever the number of masters, and the replies are put back
//! in the pipeline's order. A `MOVED` reply (the slot moved: the command did not run) makes
//! the connection read the slot map again (`CLUSTER SLOTS`) and send that command once more to
//! the new owner; `ASK` (a slot being migrated) sends it to the target preceded by `ASKING`;
//! `TRYAGAIN` (a multi-key command during a migration) waits a little and tries again. All of
//! it stops at the deadline of one command timeout from the call's start and at 5 redirections:
//! then the last redirection is the reply. A reply that may have run is never sent again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::{Connection, ConnectionLike, RedisConnectionInfo, RedisError, RedisResult, Value};

use crate::dial::Dialer;
use crate::endpoint::{show_addr, ClusterEndpoint};

/// Hash slots of a Redis Cluster.
pub(crate) const SLOTS: usize = 16384;

/// The factor of a cluster `SCAN` cursor (`<master's cursor> x 1024 + <master index>`).
const SCAN_MASTERS: u128 = 1024;

/// Most redirections (`MOVED`, `ASK`) one command follows.
const MAX_REDIRECTS: usize = 5;

/// A slot map read less than this long ago is not read again on a `MOVED` (the owner the
/// reply names is used): a migration of many keys costs one `CLUSTER SLOTS`, not one per key.
const REFRESH_EVERY: Duration = Duration::from_millis(100);

/// The hash slot of `key`: CRC16 (XMODEM) of its hash tag (the part between the first `{` and
/// the next `}`, when not empty) or of the whole key, modulo 16384.
pub(crate) fn slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|b| *b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|b| *b == b'}')
                .map(|close| &rest[..close])
        })
        .filter(|tag| !tag.is_empty())
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(tagged) % SLOTS as u16
}

/// A node's address.
pub(crate) type Addr = (String, u16);

/// Round trips sent to each node (`host:port`) by every cluster connection of this process
/// (feature `testing`: what `perf_report --cluster` counts per tick).
#[cfg(feature = "testing")]
pub(crate) static ROUND_TRIPS: Mutex<Option<HashMap<String, u64>>> = Mutex::new(None);

/// Counts one round trip to `addr` (feature `testing`; nothing otherwise).
fn count_trip(addr: &Addr) {
    #[cfg(feature = "testing")]
    {
        *ROUND_TRIPS
            .lock()
            .get_or_insert_with(HashMap::new)
            .entry(show_addr(&addr.0, addr.1))
            .or_default() += 1;
    }
    #[cfg(not(feature = "testing"))]
    let _ = addr;
}

/// Who serves each slot, from `CLUSTER SLOTS`.
#[derive(Debug, Clone)]
pub(crate) struct SlotMap {
    /// The master (index into `nodes`) of each slot; `NONE` for a slot nobody serves.
    owner: Vec<u16>,
    /// Every master, in address order.
    nodes: Vec<Addr>,
    /// The replicas of each master (same index as `nodes`).
    replicas: Vec<Vec<Addr>>,
}

const NONE: u16 = u16::MAX;

impl SlotMap {
    /// The master serving `slot`.
    pub(crate) fn master(&self, slot: u16) -> Option<&Addr> {
        match self.owner.get(slot as usize) {
            Some(&i) if i != NONE => self.nodes.get(i as usize),
            _ => None,
        }
    }

    /// Every master, in address order.
    pub(crate) fn masters(&self) -> &[Addr] {
        &self.nodes
    }

    /// The lowest slot `addr` serves, if any: where its dataset token lives
    /// (src/shards.rs).
    pub(crate) fn first_slot_of(&self, addr: &Addr) -> Option<u16> {
        let i = self.nodes.iter().position(|n| n == addr)?;
        self.owner
            .iter()
            .position(|o| *o as usize == i)
            .map(|s| s as u16)
    }

    /// The slot ranges `addr` serves (`0-5460,10923`), for messages.
    pub(crate) fn slots_of(&self, addr: &Addr) -> String {
        let Some(i) = self.nodes.iter().position(|n| n == addr) else {
            return "none".to_owned();
        };
        let mut out: Vec<String> = Vec::new();
        let mut s = 0;
        while s < SLOTS {
            if self.owner[s] as usize != i {
                s += 1;
                continue;
            }
            let first = s;
            while s + 1 < SLOTS && self.owner[s + 1] as usize == i {
                s += 1;
            }
            out.push(if first == s {
                first.to_string()
            } else {
                format!("{first}-{s}")
            });
            s += 1;
        }
        if out.is_empty() {
            "none".to_owned()
        } else {
            out.join(",")
        }
    }

    /// Replicas listed for every master.
    pub(crate) fn replica_count(&self) -> usize {
        self.replicas.iter().map(Vec::len).sum()
    }

    /// Slots nobody serves.
    pub(crate) fn uncovered(&self) -> usize {
        self.owner.iter().filter(|o| **o == NONE).count()
    }

    /// `slot` served by `addr` now (a `MOVED` reply said so).
    fn assign(&mut self, slot: u16, addr: &Addr) {
        let i = match self.nodes.iter().position(|n| n == addr) {
            Some(i) => i,
            None => {
                self.nodes.push(addr.clone());
                self.replicas.push(Vec::new());
                self.nodes.len() - 1
            }
        };
        self.owner[slot as usize] = i as u16;
    }

    /// True when some slot's master now is a node that was no master in `before` (a replica
    /// promoted: a failover, whose new master may lack the last writes, replication being
    /// asynchronous; or a node new to the map). A slot that moved to another master that was
    /// one already is a migration: its keys moved with it.
    fn failover_since(&self, before: &SlotMap) -> bool {
        (0..SLOTS).any(|s| {
            let (Some(now), Some(was)) = (self.master(s as u16), before.master(s as u16)) else {
                return false;
            };
            now != was && !before.nodes.contains(now)
        })
    }

    /// Parses `CLUSTER SLOTS` (`[[first, last, [host, port, id, ...], replicas...], ...]`); an
    /// empty host (or `?`) means the node asked.
    fn parse(reply: Value, asked: &Addr) -> Result<SlotMap, String> {
        let bad = |what: &str| format!("unexpected CLUSTER SLOTS reply: {what}");
        let Value::Array(ranges) = reply else {
            return Err(bad("not an array"));
        };
        let node = |v: &Value| -> Result<Addr, String> {
            let Value::Array(parts) = v else {
                return Err(bad("a node is not an array"));
            };
            let host = match parts.first() {
                Some(Value::BulkString(h)) => String::from_utf8_lossy(h).into_owned(),
                Some(Value::SimpleString(h)) => h.clone(),
                Some(Value::Nil) | None => String::new(),
                _ => return Err(bad("a node's host")),
            };
            let port = match parts.get(1) {
                Some(Value::Int(p)) => u16::try_from(*p).map_err(|_| bad("a node's port"))?,
                _ => return Err(bad("a node's port")),
            };
            let host = if host.is_empty() || host == "?" {
                asked.0.clone()
            } else {
                host
            };
            Ok((host, port))
        };
        let mut map = SlotMap {
            owner: vec![NONE; SLOTS],
            nodes: Vec::new(),
            replicas: Vec::new(),
        };
        let mut parsed = Vec::new();
        for r in &ranges {
            let Value::Array(parts) = r else {
                return Err(bad("a range is not an array"));
            };
            let int = |v: Option<&Value>| match v {
                Some(Value::Int(n)) if (0..SLOTS as i64).contains(n) => Ok(*n as usize),
                _ => Err(bad("a slot number")),
            };
            let (first, last) = (int(parts.first())?, int(parts.get(1))?);
            let master = node(parts.get(2).ok_or_else(|| bad("a range without master"))?)?;
            if master.1 == 0 {
                // A master the others know no address of (after CLUSTER RESET): unserved.
                continue;
            }
            let replicas = parts[3..].iter().map(node).collect::<Result<Vec<_>, _>>()?;
            parsed.push((first, last, master, replicas));
        }
        let mut masters: Vec<Addr> = parsed.iter().map(|p| p.2.clone()).collect();
        masters.sort();
        masters.dedup();
        map.replicas = vec![Vec::new(); masters.len()];
        for (first, last, master, replicas) in parsed {
            let i = masters.binary_search(&master).expect("listed above");
            for s in first..=last.min(SLOTS - 1) {
                map.owner[s] = i as u16;
            }
            for r in replicas {
                if !map.replicas[i].contains(&r) {
                    map.replicas[i].push(r);
                }
            }
        }
        map.nodes = masters;
        Ok(map)
    }
}

/// What every cluster connection of one connector shares: the seeds, the credentials, the
/// dialer, and the slot map last read.
pub(crate) struct Cluster {
    seeds: Vec<Addr>,
    auth: RedisConnectionInfo,
    dialer: Dialer,
    timeout: Duration,
    /// Prepares a new node connection (preloads the scripts).
    prepare: fn(&mut Connection) -> RedisResult<()>,
    map: Mutex<Option<(Arc<SlotMap>, Instant)>>,
    /// Set after an I/O error or a redirection: the next connection reads the map again.
    stale: AtomicBool,
    /// Failovers seen in the slot map (a replica became the master of a slot).
    failovers: AtomicU64,
    /// When the last one was seen.
    failed_over_at: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("seeds", &self.seeds)
            .field(
                "masters",
                &self.map.lock().as_ref().map(|m| m.0.nodes.len()),
            )
            .field("failovers", &self.failovers())
            .finish_non_exhaustive()
    }
}

impl Cluster {
    pub(crate) fn new(
        ep: ClusterEndpoint,
        dialer: Dialer,
        timeout: Duration,
        prepare: fn(&mut Connection) -> RedisResult<()>,
    ) -> Cluster {
        let mut auth = RedisConnectionInfo::default();
        if let Some(u) = ep.user {
            auth = auth.set_username(u);
        }
        if let Some(p) = ep.password {
            auth = auth.set_password(p);
        }
        Cluster {
            seeds: ep.seeds,
            auth,
            dialer,
            timeout,
            prepare,
            map: Mutex::new(None),
            stale: AtomicBool::new(true),
            failovers: AtomicU64::new(0),
            failed_over_at: Mutex::new(None),
        }
    }

    /// When the last failover was seen in the slot map.
    pub(crate) fn failed_over_at(&self) -> Option<Instant> {
        *self.failed_over_at.lock()
    }

    /// Failovers seen so far (a slot's replica promoted to its master).
    pub(crate) fn failovers(&self) -> u64 {
        self.failovers.load(Ordering::Relaxed)
    }

    /// The slot map last read, if any.
    pub(crate) fn map(&self) -> Option<Arc<SlotMap>> {
        self.map.lock().as_ref().map(|m| m.0.clone())
    }

    /// Opens a connection to `addr` (timeouts set, scripts preloaded).
    fn open(&self, addr: &Addr) -> RedisResult<Connection> {
        let info = self.dialer.info(&addr.0, addr.1, self.auth.clone())?;
        let client = self.dialer.client(info)?;
        let mut con = self.dialer.open(&client)?;
        (self.prepare)(&mut con)?;
        Ok(con)
    }

    /// Stores a map just read; counts a failover when a slot's master is its former replica.
    fn store(&self, map: SlotMap) -> Arc<SlotMap> {
        let map = Arc::new(map);
        let mut last = self.map.lock();
        if let Some((before, _)) = last.as_ref() {
            if map.failover_since(before) {
                *self.failed_over_at.lock() = Some(Instant::now());
                self.failovers.fetch_add(1, Ordering::Relaxed);
                log::warn!(
                    "a Redis Cluster failover: a replica is now the master of some slots (masters now {})",
                    map.nodes
                        .iter()
                        .map(|(h, p)| show_addr(h, *p))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
        *last = Some((map.clone(), Instant::now()));
        self.stale.store(false, Ordering::Relaxed);
        map
    }

    /// A new connection: the slot map (read again when stale), no node connected yet except
    /// the one that answered `CLUSTER SLOTS`.
    ///
    /// # Errors
    /// A message for people (no password) when no node answers, a node is not a cluster node,
    /// or the map leaves slots uncovered.
    pub(crate) fn connect(self: &Arc<Self>) -> Result<ClusterConn, RedisError> {
        let current = self.map();
        let mut con = ClusterConn {
            cluster: self.clone(),
            map: current.clone().unwrap_or_else(|| {
                Arc::new(SlotMap {
                    owner: vec![NONE; SLOTS],
                    nodes: Vec::new(),
                    replicas: Vec::new(),
                })
            }),
            nodes: HashMap::new(),
            last: None,
            at: None,
            read_timeout: None,
            unanswered: Vec::new(),
        };
        if current.is_none() || self.stale.load(Ordering::Relaxed) {
            con.reload_map()?;
        }
        Ok(con)
    }
}

/// What one node's failure means, for people (no password: the driver's errors carry none):
/// [`crate::error::reason`] with what it usually means on a cluster.
fn node_reason(e: &RedisError, tls: bool) -> String {
    let why = crate::error::reason(e).replace('\n', " ");
    if e.is_timeout() && tls {
        format!("{why} (over TLS: a plaintext port never answers a TLS hello; use redis+cluster:// for plaintext nodes)")
    } else if e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("WRONGPASS" | "NOAUTH"))
    {
        format!("{why}: check the user and password of the Redis URL (a server without a password refuses one too)")
    } else if e.kind() == redis::ErrorKind::Parse {
        "answered something that is not the Redis protocol (is this a Redis port?)".to_owned()
    } else if !tls && e.is_connection_dropped() && !e.is_connection_refusal() {
        format!("{why} (closed at once: a TLS port? use rediss+cluster://; a cluster bus port? the data port is 10000 lower)")
    } else {
        why
    }
}

/// The error of a cluster connection, with `detail` for people.
fn cluster_error(detail: String) -> RedisError {
    RedisError::from((redis::ErrorKind::Client, "Redis Cluster", detail))
}

/// One command of a pipeline: its bytes, and its arguments.
struct Packed<'a> {
    bytes: &'a [u8],
    args: Vec<&'a [u8]>,
}

/// Splits packed commands (`*<n>\r\n` then `n` times `$<len>\r\n<bytes>\r\n`, what the driver
/// writes) into commands.
fn split(mut bytes: &[u8]) -> RedisResult<Vec<Packed<'_>>> {
    fn line(b: &[u8], mark: u8) -> Option<(usize, usize)> {
        if b.first() != Some(&mark) {
            return None;
        }
        let end = b.windows(2).position(|w| w == b"\r\n")?;
        let n = std::str::from_utf8(&b[1..end]).ok()?.parse().ok()?;
        Some((n, end + 2))
    }
    let bad = || cluster_error("a command could not be read back for routing".into());
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let (n, mut at) = line(bytes, b'*').ok_or_else(bad)?;
        let mut args = Vec::with_capacity(n);
        for _ in 0..n {
            let (len, head) = line(&bytes[at..], b'$').ok_or_else(bad)?;
            let start = at + head;
            let arg = bytes.get(start..start + len).ok_or_else(bad)?;
            args.push(arg);
            at = start + len + 2;
        }
        let at = at.min(bytes.len());
        out.push(Packed {
            bytes: &bytes[..at],
            args,
        });
        bytes = &bytes[at..];
    }
    Ok(out)
}

/// Where one command goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// The master of this slot.
    Slot(u16),
    /// Every master.
    All,
    /// The node of a neighbouring command (no key).
    Near,
    /// `SCAN` over every master.
    Scan,
    /// `MULTI`/`EXEC`/`DISCARD`/`WATCH`: a transaction, sent whole to the master of its one
    /// slot (the crate sends none; tests and tools do).
    Refused,
}

fn route(args: &[&[u8]]) -> Route {
    let Some(name) = args.first() else {
        return Route::Near;
    };
    let name = name.to_ascii_uppercase();
    let key_at = |i: usize| args.get(i).map_or(Route::Near, |k| Route::Slot(slot(k)));
    match name.as_slice() {
        b"EVAL" | b"EVALSHA" | b"EVAL_RO" | b"EVALSHA_RO" | b"FCALL" | b"FCALL_RO" => {
            match args
                .get(2)
                .and_then(|n| std::str::from_utf8(n).ok()?.parse::<u32>().ok())
            {
                Some(n) if n > 0 => key_at(3),
                _ => Route::Near,
            }
        }
        b"SCRIPT" | b"FUNCTION" | b"FLUSHALL" | b"FLUSHDB" | b"ACL" => Route::All,
        b"SCAN" => Route::Scan,
        b"MULTI" | b"EXEC" | b"DISCARD" | b"WATCH" => Route::Refused,
        b"OBJECT" | b"MEMORY" => key_at(2),
        b"TIME" | b"PING" | b"ROLE" | b"INFO" | b"WAIT" | b"WAITAOF" | b"CLIENT" | b"CONFIG"
        | b"DBSIZE" | b"ECHO" | b"HELLO" | b"AUTH" | b"SELECT" | b"ASKING" | b"READONLY"
        | b"READWRITE" | b"CLUSTER" | b"DEBUG" | b"COMMAND" | b"LASTSAVE" | b"SLOWLOG"
        | b"LATENCY" | b"KEYS" | b"RANDOMKEY" | b"QUIT" | b"RESET" | b"SAVE" | b"BGSAVE" => {
            Route::Near
        }
        _ => key_at(1),
    }
}

/// A redirection in a reply: `MOVED`/`ASK` with the slot's owner, or `TRYAGAIN`.
enum Redirect {
    Moved(u16, Addr),
    Ask(Addr),
    TryAgain,
}

fn redirect(v: &Value) -> Option<Redirect> {
    let Value::ServerError(e) = v else {
        return None;
    };
    let target = || {
        let mut parts = e.details()?.split_ascii_whitespace();
        let slot = parts.next()?.parse::<u16>().ok()?;
        let addr = parts.next()?;
        let (host, port) = addr.rsplit_once(':')?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        Some((slot, (host.to_owned(), port.parse().ok()?)))
    };
    match e.code() {
        "MOVED" => target().map(|(s, a)| Redirect::Moved(s, a)),
        "ASK" => target().map(|(_, a)| Redirect::Ask(a)),
        "TRYAGAIN" => Some(Redirect::TryAgain),
        _ => None,
    }
}

/// A connection to a Redis Cluster: one connection per master, made on first use.
pub(crate) struct ClusterConn {
    cluster: Arc<Cluster>,
    map: Arc<SlotMap>,
    nodes: HashMap<Addr, Connection>,
    /// The node of the last keyed command.
    last: Option<Addr>,
    /// The node of the last round trip: a timeout or a dropped connection names it.
    at: Option<Addr>,
    /// The read timeout set by the caller (`None`: the dialer's).
    read_timeout: Option<Duration>,
    /// Nodes (`host:port`) that did not answer (a timeout, a broken connection) while this
    /// connection read the slot map.
    unanswered: Vec<String>,
}

impl std::fmt::Debug for ClusterConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterConn")
            .field("masters", &self.map.nodes.len())
            .field("connected", &self.nodes.len())
            .finish()
    }
}

impl ClusterConn {
    /// The slot map this connection routes by.
    pub(crate) fn slot_map(&self) -> &SlotMap {
        &self.map
    }

    /// One round trip to `addr` about to start: counted (feature `testing`), and `addr` is
    /// the node a timeout or a dropped connection names.
    fn trip(&mut self, addr: &Addr) {
        count_trip(addr);
        self.at = Some(addr.clone());
    }

    /// The connection to `addr`, opened if needed.
    fn node(&mut self, addr: &Addr) -> RedisResult<&mut Connection> {
        if !self.nodes.contains_key(addr) {
            let con = self.cluster.open(addr).map_err(|e| {
                self.cluster.stale.store(true, Ordering::Relaxed);
                if e.code().is_some() {
                    return e;
                }
                // Name the master and what it serves: the URL's seeds may all be fine.
                cluster_error(format!(
                    "master {} (slots {}) cannot be reached: {} (down? until a replica is promoted, or for good without one, its slots are unserved: cluster_state:fail)",
                    show_addr(&addr.0, addr.1),
                    self.map.slots_of(addr),
                    node_reason(&e, self.cluster.dialer.is_tls())
                ))
            })?;
            if self.read_timeout.is_some() {
                con.set_read_timeout(self.read_timeout)?;
            }
            self.nodes.insert(addr.clone(), con);
        }
        Ok(self.nodes.get_mut(addr).expect("inserted above"))
    }

    /// Reads the slot map (`CLUSTER SLOTS`) from a node this connection has, then from the
    /// known masters and the seeds; the first full answer wins.
    fn reload_map(&mut self) -> RedisResult<()> {
        let mut tried: Vec<Addr> = self.nodes.keys().cloned().collect();
        for a in self.map.nodes.iter().chain(&self.cluster.seeds) {
            if !tried.contains(a) {
                tried.push(a.clone());
            }
        }
        let mut said = Vec::new();
        for addr in tried {
            let shown = show_addr(&addr.0, addr.1);
            count_trip(&addr);
            let reply = match self.nodes.get_mut(&addr) {
                Some(con) => redis::cmd("CLUSTER").arg("SLOTS").query::<Value>(con),
                None => self.cluster.open(&addr).and_then(|mut con| {
                    let r = redis::cmd("CLUSTER").arg("SLOTS").query::<Value>(&mut con);
                    if r.is_ok() {
                        self.nodes.insert(addr.clone(), con);
                    }
                    r
                }),
            };
            match reply {
                Ok(v) => match SlotMap::parse(v, &addr) {
                    Ok(map) if map.uncovered() == 0 => {
                        self.map = self.cluster.store(map);
                        // A connection to a node that is no master now is of no use.
                        let masters = self.map.nodes.clone();
                        self.nodes.retain(|a, _| masters.contains(a));
                        return Ok(());
                    }
                    Ok(map) => said.push(format!(
                        "{shown}: {} of 16384 slots have no master (cluster_state:fail?)",
                        map.uncovered()
                    )),
                    Err(e) => said.push(format!("{shown}: {e}")),
                },
                Err(e)
                    if e.detail()
                        .is_some_and(|d| d.contains("cluster support disabled")) =>
                {
                    said.push(format!(
                        "{shown} is not a cluster node (cluster support disabled): use redis://{shown} for a standalone server"
                    ));
                }
                Err(e) => {
                    if e.code().is_none() && (e.is_timeout() || e.is_io_error()) {
                        self.unanswered.push(shown.clone());
                    }
                    said.push(format!(
                        "{shown}: {}",
                        node_reason(&e, self.cluster.dialer.is_tls())
                    ))
                }
            }
        }
        self.cluster.stale.store(true, Ordering::Relaxed);
        Err(cluster_error(format!(
            "no node gave a full slot map ({})",
            said.join("; ")
        )))
    }

    /// After `MOVED`: reads the map again (at most every `REFRESH_EVERY` per connector),
    /// else takes the reply's word for `slot`.
    fn moved(&mut self, slot: u16, to: &Addr) -> RedisResult<()> {
        let fresh = self
            .cluster
            .map
            .lock()
            .as_ref()
            .is_some_and(|(_, at)| at.elapsed() < REFRESH_EVERY);
        if !fresh {
            self.reload_map()?;
        } else if let Some(shared) = self.cluster.map() {
            self.map = shared;
        }
        if self.map.master(slot) != Some(to) {
            Arc::make_mut(&mut self.map).assign(slot, to);
        }
        Ok(())
    }

    /// The node for a keyless command: the last keyed command's, else the first master.
    fn default_node(&self) -> RedisResult<Addr> {
        self.last
            .clone()
            .or_else(|| self.map.nodes.first().cloned())
            .ok_or_else(|| cluster_error("the slot map names no master".into()))
    }

    /// The master of `slot`.
    fn owner(&self, slot: u16) -> RedisResult<Addr> {
        self.map
            .master(slot)
            .cloned()
            .ok_or_else(|| cluster_error(format!("slot {slot} has no master")))
    }

    /// Sends one command to the master of `slot`, following redirections until `deadline`;
    /// the reply as a value (a server error included).
    fn send_slot(&mut self, slot: u16, bytes: &[u8], deadline: Instant) -> RedisResult<Value> {
        let mut asking: Option<Addr> = None;
        let mut reply = Value::Nil;
        let mut reloaded = false;
        for _ in 0..=MAX_REDIRECTS {
            let (addr, ask) = match asking.take() {
                Some(a) => (a, true),
                None => (self.owner(slot)?, false),
            };
            self.trip(&addr);
            let con = match self.node(&addr) {
                Ok(con) => con,
                // Nothing was sent: after a failover the map may still name the dead master
                // (an idle connector). Read it again once; retry if it names another owner.
                Err(e) if !ask && !reloaded && Instant::now() < deadline => {
                    reloaded = true;
                    if self.reload_map().is_ok() && self.owner(slot).ok() != Some(addr) {
                        continue;
                    }
                    return Err(e);
                }
                Err(e) => return Err(e),
            };
            reply = if ask {
                let mut b = redis::cmd("ASKING").get_packed_command();
                b.extend_from_slice(bytes);
                crate::dial::pipeline(con, &b, 1, 1)?
                    .pop()
                    .unwrap_or(Value::Nil)
            } else {
                con.req_packed_command(bytes)?
            };
            // The node that ran it (the ASK target too): a `WAIT` after a write waits there.
            self.last = Some(addr);
            if Instant::now() >= deadline {
                break;
            }
            match redirect(&reply) {
                None => break,
                Some(Redirect::Moved(s, to)) => {
                    self.cluster.stale.store(true, Ordering::Relaxed);
                    self.moved(s, &to)?;
                }
                Some(Redirect::Ask(to)) => asking = Some(to),
                Some(Redirect::TryAgain) => {
                    let wait = Duration::from_millis(25 + fastrand::u64(0..25));
                    if Instant::now() + wait >= deadline {
                        break;
                    }
                    std::thread::sleep(wait);
                }
            }
        }
        Ok(reply)
    }

    /// `SCAN <cursor> ...` over every master: the cursor handed back is
    /// `<master's cursor> x 1024 + <master index>` (`0` starts at the first master; `0` back
    /// means every master is done), so it stays a number for any pager.
    fn scan(&mut self, args: &[&[u8]]) -> RedisResult<Value> {
        let cursor = args
            .get(1)
            .and_then(|c| std::str::from_utf8(c).ok()?.parse::<u128>().ok())
            .ok_or_else(|| cluster_error("SCAN needs a numeric cursor".into()))?;
        let (i, inner) = ((cursor % SCAN_MASTERS) as usize, cursor / SCAN_MASTERS);
        let masters = self.map.nodes.clone();
        let Some(addr) = masters.get(i) else {
            return Ok(Value::Array(vec![
                Value::BulkString(b"0".to_vec()),
                Value::Array(vec![]),
            ]));
        };
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(inner.to_string());
        for a in &args[2..] {
            cmd.arg(*a);
        }
        self.trip(addr);
        let reply = self.node(addr)?.req_command(&cmd)?;
        let Value::Array(mut parts) = reply else {
            return Ok(reply);
        };
        if let Some(Value::BulkString(next)) = parts.first() {
            let next: u128 = std::str::from_utf8(next)
                .ok()
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| cluster_error("SCAN answered a cursor that is no number".into()))?;
            let shown = match (next, i + 1 < masters.len()) {
                (0, true) => (i + 1) as u128,
                (0, false) => 0,
                (c, _) => c * SCAN_MASTERS + i as u128,
            };
            parts[0] = Value::BulkString(shown.to_string().into_bytes());
        }
        Ok(Value::Array(parts))
    }

    /// Sends one command to every master; the first reply (or the first error).
    fn send_all(&mut self, bytes: &[u8]) -> RedisResult<Value> {
        let masters = self.map.nodes.clone();
        let mut first = None;
        for addr in &masters {
            self.trip(addr);
            let v = self.node(addr)?.req_packed_command(bytes)?;
            if matches!(v, Value::ServerError(_)) {
                return Ok(v);
            }
            first.get_or_insert(v);
        }
        Ok(first.unwrap_or(Value::Okay))
    }

    /// The call's deadline.
    fn deadline(&self) -> Instant {
        Instant::now() + self.cluster.timeout
    }

    /// Runs `f` on the connection to every master, in master order, as the results are
    /// consumed (a consumer that stops at the first error asks no further master).
    fn on_masters<'a, T: 'a>(
        &'a mut self,
        mut f: impl FnMut(&mut Connection) -> RedisResult<T> + 'a,
    ) -> impl Iterator<Item = RedisResult<T>> + 'a {
        let masters = self.map.nodes.clone();
        masters.into_iter().map(move |addr| {
            self.trip(&addr);
            let one = self.node(&addr).and_then(&mut f);
            self.settle(one)
        })
    }

    /// Runs `f` on the connection to every master; the results in master order; the first
    /// error ends the call.
    pub(crate) fn each_master<T>(
        &mut self,
        f: impl FnMut(&mut Connection) -> RedisResult<T>,
    ) -> RedisResult<Vec<T>> {
        self.on_masters(f).collect()
    }

    /// As [`ClusterConn::each_master`], but a master that cannot be reached (or whose `f`
    /// fails) does not stop the others: one result per master.
    pub(crate) fn each_master_apart<T>(
        &mut self,
        f: impl FnMut(&mut Connection) -> RedisResult<T>,
    ) -> Vec<RedisResult<T>> {
        self.on_masters(f).collect()
    }

    /// The nodes (`host:port`) that did not answer while this connection read the slot map.
    pub(crate) fn unanswered(&self) -> &[String] {
        &self.unanswered
    }

    /// As [`ClusterConn::each_master_apart`], but the masters `skip` names (`host:port`) are
    /// neither connected to nor given to `f`: `None` in their place.
    pub(crate) fn each_master_except<T>(
        &mut self,
        skip: impl Fn(&str) -> bool,
        mut f: impl FnMut(&mut Connection) -> RedisResult<T>,
    ) -> Vec<Option<RedisResult<T>>> {
        let masters = self.map.nodes.clone();
        masters
            .into_iter()
            .map(|addr| {
                if skip(&show_addr(&addr.0, addr.1)) {
                    return None;
                }
                self.trip(&addr);
                let one = self.node(&addr).and_then(&mut f);
                Some(self.settle(one))
            })
            .collect()
    }

    /// Sets the read timeout of every node connection, also of those opened later by this
    /// connection.
    pub(crate) fn set_read_timeout(&mut self, dur: Option<Duration>) -> RedisResult<()> {
        self.read_timeout = dur;
        for c in self.nodes.values() {
            c.set_read_timeout(dur)?;
        }
        Ok(())
    }

    fn mark_broken<T>(&self, r: RedisResult<T>) -> RedisResult<T> {
        if let Err(e) = &r {
            if e.code().is_none() || e.is_timeout() {
                self.cluster.stale.store(true, Ordering::Relaxed);
            }
        }
        r
    }

    fn pipeline(&mut self, bytes: &[u8], offset: usize, count: usize) -> RedisResult<Vec<Value>> {
        let deadline = self.deadline();
        let cmds = split(bytes)?;
        let routes: Vec<Route> = cmds.iter().map(|c| route(&c.args)).collect();
        if routes.contains(&Route::Refused) {
            // A transaction: every key in one slot, sent whole to its master.
            let mut slots = routes.iter().filter_map(|r| match r {
                Route::Slot(s) => Some(*s),
                _ => None,
            });
            let first = slots.next();
            if slots.any(|s| Some(s) != first) {
                return Err(cluster_error(
                    "a MULTI/EXEC transaction spans several hash slots (CROSSSLOT on a cluster): give its keys one hash tag".into(),
                ));
            }
            let addr = match first {
                Some(s) => self.owner(s)?,
                None => self.default_node()?,
            };
            self.trip(&addr);
            let out = crate::dial::pipeline(self.node(&addr)?, bytes, offset, count);
            return self.mark_broken(out);
        }
        // The node of each command (`None`: sent apart, `All` and `Scan`).
        let mut target: Vec<Option<Addr>> = Vec::with_capacity(cmds.len());
        for r in &routes {
            target.push(match r {
                Route::Slot(s) => Some(self.owner(*s)?),
                _ => None,
            });
        }
        // Keyless commands: the nearest keyed command's node, before then after.
        let keyed: Vec<Option<Addr>> = target.clone();
        for i in 0..cmds.len() {
            if routes[i] == Route::Near {
                let before = keyed[..i].iter().rev().flatten().next();
                let after = keyed[i..].iter().flatten().next();
                target[i] = Some(match before.or(after) {
                    Some(a) => a.clone(),
                    None => self.default_node()?,
                });
            }
        }
        let mut groups: Vec<(Addr, Vec<usize>)> = Vec::new();
        for (i, t) in target.iter().enumerate() {
            if let Some(a) = t {
                match groups.iter_mut().find(|(g, _)| g == a) {
                    Some((_, idx)) => idx.push(i),
                    None => groups.push((a.clone(), vec![i])),
                }
            }
        }
        let mut replies: Vec<Option<Value>> = vec![None; cmds.len()];
        // Write every group, then read them: one round trip for all masters.
        let mut sent = Vec::new();
        for (addr, idx) in &groups {
            let mut buf = Vec::new();
            for &i in idx {
                buf.extend_from_slice(cmds[i].bytes);
            }
            self.trip(addr);
            let out = self.node(addr)?.send_packed_command(&buf);
            self.mark_broken(out)?;
            sent.push((addr.clone(), idx.clone()));
        }
        for (addr, idx) in sent {
            self.at = Some(addr.clone());
            for &i in &idx {
                let v = self.node(&addr)?.recv_response();
                replies[i] = Some(self.mark_broken(v)?);
                if matches!(routes[i], Route::Slot(_)) {
                    self.last = Some(addr.clone());
                }
            }
        }
        // Commands for every master (a script reload: `SCRIPT LOAD` of every script): one
        // pipeline per master; a command's reply is the first master's, or an error if any
        // master refused it.
        let all: Vec<usize> = (0..cmds.len())
            .filter(|i| routes[*i] == Route::All)
            .collect();
        if !all.is_empty() {
            let mut buf = Vec::new();
            for &i in &all {
                buf.extend_from_slice(cmds[i].bytes);
            }
            for addr in self.map.nodes.clone() {
                self.trip(&addr);
                let out = crate::dial::pipeline(self.node(&addr)?, &buf, 0, all.len());
                let got = self.mark_broken(out)?;
                for (&i, v) in all.iter().zip(got) {
                    let keep = match &replies[i] {
                        None => true,
                        Some(Value::ServerError(_)) => false,
                        Some(_) => matches!(v, Value::ServerError(_)),
                    };
                    if keep {
                        replies[i] = Some(v);
                    }
                }
            }
        }
        for i in 0..cmds.len() {
            match routes[i] {
                Route::Scan => replies[i] = Some(self.scan(&cmds[i].args)?),
                // Redirected: it did not run; once more to the owner.
                Route::Slot(s) if replies[i].as_ref().and_then(redirect).is_some() => {
                    replies[i] = Some(self.send_slot(s, cmds[i].bytes, deadline)?);
                }
                _ => {}
            }
        }
        Ok(replies
            .into_iter()
            .skip(offset)
            .take(count)
            .map(|v| v.unwrap_or(Value::Nil))
            .collect())
    }
}

impl ClusterConn {
    /// After any failed call: every node connection may hold replies nobody read (a group
    /// written before another master failed, a read that timed out), so all are dropped and
    /// reopened on next use; a late reply can never answer a later command.
    fn settle<T>(&mut self, out: RedisResult<T>) -> RedisResult<T> {
        out.map_err(|e| {
            self.nodes.clear();
            self.name_node(e)
        })
    }

    /// A timeout or a dropped connection on the way to a master names that master and the
    /// slots it serves (the driver's error names no node); the error keeps its class
    /// (`is_timeout`, `is_connection_dropped`: an unknown outcome stays unknown). Other errors
    /// are as they were: a refused connection is named when it is opened.
    fn name_node(&self, e: RedisError) -> RedisError {
        let Some(addr) = &self.at else { return e };
        if !e.is_io_error() || e.code().is_some() {
            return e;
        }
        let (kind, what) = if e.is_timeout() {
            (std::io::ErrorKind::TimedOut, "did not answer in time")
        } else if e.is_connection_dropped() && !e.is_connection_refusal() {
            (
                std::io::ErrorKind::ConnectionReset,
                "dropped the connection",
            )
        } else {
            return e;
        };
        RedisError::from(std::io::Error::new(
            kind,
            format!(
                "master {} (slots {}) {what}: {e}",
                show_addr(&addr.0, addr.1),
                self.map.slots_of(addr)
            ),
        ))
    }
}

impl ConnectionLike for ClusterConn {
    fn req_packed_command(&mut self, bytes: &[u8]) -> RedisResult<Value> {
        let out = self.command(bytes);
        self.settle(out)
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let out = self.pipeline(cmd, offset, count);
        self.settle(out)
    }

    fn get_db(&self) -> i64 {
        0
    }

    fn check_connection(&mut self) -> bool {
        self.each_master(|c| redis::cmd("PING").query::<String>(c))
            .is_ok()
    }

    fn is_open(&self) -> bool {
        self.nodes.values().all(|c| c.is_open())
    }
}

impl ClusterConn {
    fn command(&mut self, bytes: &[u8]) -> RedisResult<Value> {
        let deadline = self.deadline();
        let cmds = split(bytes)?;
        let Some(cmd) = cmds.first() else {
            return Err(cluster_error("an empty command".into()));
        };
        let out = match route(&cmd.args) {
            Route::Slot(s) => self.send_slot(s, bytes, deadline),
            Route::All => self.send_all(bytes),
            Route::Scan => self.scan(&cmd.args),
            Route::Near => {
                let addr = self.default_node()?;
                self.trip(&addr);
                self.node(&addr)?.req_packed_command(bytes)
            }
            Route::Refused => Err(cluster_error(
                "MULTI/EXEC/WATCH are sent as one pipeline on a cluster connection".into(),
            )),
        };
        self.mark_broken(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_hash_tag() {
        // Values from the Redis Cluster specification's examples and redis-cli CLUSTER KEYSLOT.
        assert_eq!(slot(b"123456789"), 12739);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        assert_eq!(slot(b"foo{bar}{zap}"), slot(b"bar"));
        assert_eq!(slot(b"sfu:dev:main:room:{r1}:owner"), slot(b"r1"));
    }

    #[test]
    fn packed_commands_split_back_into_commands() {
        let mut pipe = redis::pipe();
        pipe.cmd("SET").arg("a").arg("x\r\ny");
        pipe.cmd("TIME");
        pipe.cmd("EVALSHA").arg("abc").arg(1).arg("{r}:k").arg("v");
        let bytes = pipe.get_packed_pipeline();
        let cmds = split(&bytes).unwrap();
        assert_eq!(cmds.len(), 3);
        assert_eq!(cmds[0].args, vec![&b"SET"[..], b"a", b"x\r\ny"]);
        assert_eq!(route(&cmds[0].args), Route::Slot(slot(b"a")));
        assert_eq!(route(&cmds[1].args), Route::Near);
        assert_eq!(route(&cmds[2].args), Route::Slot(slot(b"r")));
        let joined: Vec<u8> = cmds.iter().flat_map(|c| c.bytes.to_vec()).collect();
        assert_eq!(joined, bytes);
        assert!(split(b"*1\r\n$5\r\nab").is_err());
    }
}
