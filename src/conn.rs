//! Blocking connections: timeouts on every call, scripts preloaded on connect, reconnect with
//! capped, jittered exponential backoff.

use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::Connection;

use crate::config::redact_url;
use crate::error::{Error, Result};
use crate::scripts;

/// Where Redis is and how long any call may take.
#[derive(Debug)]
pub(crate) struct Redis {
    client: redis::Client,
    timeout: Duration,
    /// The URL with its password redacted, for messages.
    safe_url: String,
}

impl Redis {
    pub(crate) fn new(url: &str, timeout: Duration) -> Result<Self> {
        let client = redis::Client::open(url).map_err(|e| {
            Error::config(
                "redis_url",
                format!(
                    "{} is not a usable Redis URL: {}",
                    redact_url(url),
                    e.category()
                ),
            )
        })?;
        Ok(Redis {
            client,
            timeout,
            safe_url: redact_url(url),
        })
    }

    /// A new connection with connect/read/write timeouts and every script preloaded.
    pub(crate) fn connect(&self) -> Result<Connection> {
        let wrap = |e: redis::RedisError| {
            Error::redis(format!("connect to Redis at {}", self.safe_url), e)
        };
        let mut con = self
            .client
            .get_connection_with_timeout(self.timeout)
            .map_err(wrap)?;
        con.set_read_timeout(Some(self.timeout)).map_err(wrap)?;
        con.set_write_timeout(Some(self.timeout)).map_err(wrap)?;
        scripts::preload(&mut con).map_err(wrap)?;
        Ok(con)
    }

    /// The URL without its password.
    pub(crate) fn safe_url(&self) -> &str {
        &self.safe_url
    }
}

/// One thread's connection, made on first use and dropped after any error (a timed-out
/// connection may still deliver a late reply, so it is never reused).
pub(crate) struct Link {
    con: Option<Connection>,
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
        Link { con: None }
    }

    /// Runs `f` on the connection, connecting first if needed.
    pub(crate) fn run<T>(
        &mut self,
        redis: &Redis,
        f: impl FnOnce(&mut Connection) -> Result<T>,
    ) -> Result<T> {
        let con = match &mut self.con {
            Some(c) => c,
            None => self.con.insert(redis.connect()?),
        };
        let out = f(con);
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
/// does not. A reply saying the server is no master (`READONLY`, `MASTERDOWN`: a failover
/// happened behind the address) keeps the connection in sync but pointing at the wrong
/// server: it is dropped, so the next connection finds the new master.
fn keep_connection(e: &Error) -> bool {
    match e {
        Error::Redis { source, .. } => {
            source.code().is_some() && !source.is_timeout() && !is_not_master(source)
        }
        Error::BadData { .. } | Error::NotOwner { .. } | Error::NotPeerOwner { .. } => true,
        _ => false,
    }
}

/// `READONLY` / `MASTERDOWN`: the command was refused, so it did not run.
fn is_not_master(e: &redis::RedisError) -> bool {
    matches!(e.code(), Some("READONLY" | "MASTERDOWN"))
}

/// A small pool of idle connections for host threads' calls.
pub(crate) struct Pool {
    idle: Mutex<Vec<(Connection, Instant)>>,
    max_idle: usize,
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
        }
    }

    /// An idle connection that answers, or a new one.
    fn checkout(&self, redis: &Redis) -> Result<Connection> {
        loop {
            let taken = self.idle.lock().pop();
            let Some((mut con, since)) = taken else {
                return redis.connect();
            };
            if since.elapsed() < PROBE_AFTER || redis::cmd("PING").query::<String>(&mut con).is_ok()
            {
                return Ok(con);
            }
            // Dead (server restarted, connection closed): the others are likely dead too.
            self.idle.lock().clear();
        }
    }

    /// Runs `f` on a pooled (or new) connection; the connection goes back to the pool unless
    /// the call broke it. A request is never sent twice after it may have run: the only
    /// retry is after `READONLY`/`MASTERDOWN` (a failover: the command was refused), on a new
    /// connection, with every idle one dropped.
    pub(crate) fn run<T>(
        &self,
        redis: &Redis,
        mut f: impl FnMut(&mut Connection) -> Result<T>,
    ) -> Result<T> {
        let mut con = self.checkout(redis)?;
        let mut out = f(&mut con);
        if matches!(&out, Err(Error::Redis { source, .. }) if is_not_master(source)) {
            self.idle.lock().clear();
            con = redis.connect()?;
            out = f(&mut con);
        }
        let keep = match &out {
            Ok(_) => true,
            Err(e) => keep_connection(e),
        };
        if keep {
            let mut idle = self.idle.lock();
            if idle.len() < self.max_idle {
                idle.push((con, Instant::now()));
            }
        } else if matches!(&out, Err(e) if e.is_connection_error()) {
            self.idle.lock().clear();
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
