//! The one `SCAN` pager: `SCAN` over the key space and `SSCAN`/`HSCAN`/`ZSCAN` over one
//! collection, with `MATCH` and `COUNT`, one page per call (never `KEYS`, `SMEMBERS` or
//! `HGETALL` on data of unknown size: no single command blocks Redis for long).
//!
//! - [`Scan`] says what to page through; [`Cursor`] walks one scan, either on its own
//!   connection ([`Cursor::next_page`]) or inside a caller's pipeline ([`Cursor::add_to`],
//!   then [`Cursor::advance`] with the reply), so a page can ride along with other commands.
//! - [`Pager`] walks many collections at once, their next pages pipelined together.
//! - [`collect`] reads a whole (small) scan into memory.
//!
//! ```no_run
//! use sfu_redis::scan::{collect, items_as, Cursor, Scan};
//!
//! # fn main() -> redis::RedisResult<()> {
//! let mut con = redis::Client::open("redis://127.0.0.1/")?.get_connection()?;
//! // Every key of one prefix (small data sets only: it is all kept in memory).
//! let keys = collect(&mut con, Scan::keys("sfu:dev:main:*"))?;
//! // One page of a set, 500 members at most per call, resumed from a saved cursor; the
//! // position to save next is `None` once the set is done.
//! let index = "sfu:dev:main:{ctl}:instance:sfu-a:rooms";
//! let mut cursor = Cursor::at(Scan::set(index).count(500), "0");
//! if let Some(items) = cursor.next_page(&mut con)? {
//!     let rooms: Vec<String> = items_as(items)?;
//!     println!("{} keys; rooms {rooms:?}; next {:?}", keys.len(), cursor.position());
//! }
//! # Ok(())
//! # }
//! ```
//!
//! This module is a leaf: it imports no other module of the crate, takes any driver
//! connection ([`redis::ConnectionLike`]: a [`crate::conn::Conn`], a `redis::Connection`), and
//! returns the driver's [`redis::RedisResult`] so each caller names its own operation in its
//! errors. On a cluster connection a key-space `SCAN` walks every master in turn (its cursor
//! names the master).

use std::collections::VecDeque;

use redis::{ConnectionLike, FromRedisValue, Pipeline, RedisResult, Value};

/// `COUNT` of every `SCAN`, `SSCAN`, `HSCAN` and `ZSCAN` call unless [`Scan::count`] says
/// otherwise: 1000 items per page.
pub const SCAN_COUNT: usize = 1000;

/// Most point look-ups (or items) per pipelined round trip of the readers that page with this
/// module (the audit, the fleet status): 500, so no round trip holds Redis for long.
pub const LOOKUP_BATCH: usize = 500;

/// Collections whose next pages a [`Pager`] fetches in one pipelined round trip (so at most
/// `PAGE_KEYS x SCAN_COUNT` items are in memory at once).
pub const PAGE_KEYS: usize = 100;

/// The cursor every scan starts at and ends with.
const START: &str = "0";

/// Which command pages through what.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScanKind {
    /// `SCAN cursor [MATCH p] COUNT n`: key names of the whole database.
    Keys,
    /// `SSCAN key cursor ...`: members of a set.
    Set,
    /// `HSCAN key cursor ...`: fields and values of a hash, alternating.
    Hash,
    /// `ZSCAN key cursor ...`: members and scores of a sorted set, alternating.
    SortedSet,
}

impl ScanKind {
    /// The command name (`SCAN`, `SSCAN`, `HSCAN`, `ZSCAN`).
    pub fn command(self) -> &'static str {
        match self {
            ScanKind::Keys => "SCAN",
            ScanKind::Set => "SSCAN",
            ScanKind::Hash => "HSCAN",
            ScanKind::SortedSet => "ZSCAN",
        }
    }
}

/// What to page through: the command, the key (none for [`ScanKind::Keys`]), an optional
/// `MATCH` pattern and the `COUNT` (default [`SCAN_COUNT`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scan {
    kind: ScanKind,
    key: String,
    pattern: Option<String>,
    count: usize,
}

impl Scan {
    fn new(kind: ScanKind, key: String) -> Scan {
        Scan {
            kind,
            key,
            pattern: None,
            count: SCAN_COUNT,
        }
    }

    /// `SCAN ... MATCH pattern`: key names matching `pattern` (e.g.
    /// [`KeySpace::scan_pattern`](crate::keys::KeySpace::scan_pattern)).
    pub fn keys(pattern: impl Into<String>) -> Scan {
        Scan::new(ScanKind::Keys, String::new()).matching(pattern)
    }

    /// `SSCAN key`: the members of a set.
    pub fn set(key: impl Into<String>) -> Scan {
        Scan::new(ScanKind::Set, key.into())
    }

    /// `HSCAN key`: a hash's fields and values, alternating.
    pub fn hash(key: impl Into<String>) -> Scan {
        Scan::new(ScanKind::Hash, key.into())
    }

    /// `ZSCAN key`: a sorted set's members and scores, alternating.
    pub fn sorted_set(key: impl Into<String>) -> Scan {
        Scan::new(ScanKind::SortedSet, key.into())
    }

    /// Adds `MATCH pattern`.
    pub fn matching(mut self, pattern: impl Into<String>) -> Scan {
        self.pattern = Some(pattern.into());
        self
    }

    /// Sets `COUNT` (a hint to Redis of the items per page; at least 1).
    pub fn count(mut self, count: usize) -> Scan {
        self.count = count.max(1);
        self
    }

    /// The command.
    pub fn kind(&self) -> ScanKind {
        self.kind
    }

    /// The collection's key (empty for [`ScanKind::Keys`]).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The call for one page, from `cursor` (`"0"` for the first).
    pub fn cmd(&self, cursor: &str) -> redis::Cmd {
        let mut cmd = redis::cmd(self.kind.command());
        if self.kind != ScanKind::Keys {
            cmd.arg(&self.key);
        }
        cmd.arg(cursor);
        if let Some(p) = &self.pattern {
            cmd.arg("MATCH").arg(p);
        }
        cmd.arg("COUNT").arg(self.count);
        cmd
    }
}

/// A page reply: `(next cursor, items)`; the next cursor is `"0"` after the last page.
///
/// # Errors
/// A type error when the reply is not `[cursor, [items...]]`.
pub fn parse_page(reply: Value) -> RedisResult<(String, Vec<Value>)> {
    Ok(redis::from_redis_value(reply)?)
}

/// Items of a page as `T` (e.g. `Vec<Vec<u8>>` for raw members); a type error when one
/// item does not convert.
///
/// # Errors
/// A type error when an item is not a `T`.
pub fn items_as<T: FromRedisValue>(items: Vec<Value>) -> RedisResult<T> {
    Ok(redis::from_redis_value(Value::Array(items))?)
}

/// One scan in progress: where it stands, and how to get the next page.
#[derive(Debug, Clone)]
pub struct Cursor {
    scan: Scan,
    /// The cursor of the next call; `None` once the last page was read.
    next: Option<String>,
}

impl Cursor {
    /// A scan from the start.
    pub fn new(scan: Scan) -> Cursor {
        Cursor::at(scan, START)
    }

    /// A scan resumed at `cursor` (as a previous page returned it; `"0"` starts over).
    pub fn at(scan: Scan, cursor: impl Into<String>) -> Cursor {
        Cursor {
            scan,
            next: Some(cursor.into()),
        }
    }

    /// What this cursor pages through.
    pub fn scan(&self) -> &Scan {
        &self.scan
    }

    /// The cursor of the next call; `None` once the scan is complete.
    pub fn position(&self) -> Option<&str> {
        self.next.as_deref()
    }

    /// True once the last page was read (or a reply could not be used).
    pub fn done(&self) -> bool {
        self.next.is_none()
    }

    /// Appends the call for the next page to `pipe` (nothing when done); pass its reply to
    /// [`Cursor::advance`].
    pub fn add_to(&self, pipe: &mut Pipeline) {
        if let Some(c) = &self.next {
            pipe.add_command(self.scan.cmd(c));
        }
    }

    /// Takes the reply of the call [`Cursor::add_to`] added: returns the page's items and
    /// moves to the next page.
    ///
    /// # Errors
    /// A type error when the reply is not a page; the scan is then done.
    pub fn advance(&mut self, reply: Value) -> RedisResult<Vec<Value>> {
        match parse_page(reply) {
            Ok((next, items)) => {
                self.next = (next != START).then_some(next);
                Ok(items)
            }
            Err(e) => {
                self.next = None;
                Err(e)
            }
        }
    }

    /// Reads the next page on `con`; `None` once the scan is complete.
    ///
    /// # Errors
    /// The call failed (I/O, an error reply such as `WRONGTYPE`) or the reply is not a page.
    pub fn next_page<C: ConnectionLike>(&mut self, con: &mut C) -> RedisResult<Option<Vec<Value>>> {
        let Some(c) = &self.next else {
            return Ok(None);
        };
        let reply: Value = self.scan.cmd(c).query(con)?;
        self.advance(reply).map(Some)
    }
}

/// Every item of one scan, as raw bytes (members, or fields and values alternating, or
/// members and scores alternating). For scans known to be small.
///
/// # Errors
/// As [`Cursor::next_page`], or a type error for an item that is not a string.
pub fn collect<C: ConnectionLike>(con: &mut C, scan: Scan) -> RedisResult<Vec<Vec<u8>>> {
    let mut cursor = Cursor::new(scan);
    let mut out = Vec::new();
    while let Some(items) = cursor.next_page(con)? {
        out.extend(items_as::<Vec<Vec<u8>>>(items)?);
    }
    Ok(out)
}

/// One page of one of a [`Pager`]'s scans: its index in the list given to [`Pager::new`],
/// and its items, or the error that ended that scan (an error reply such as `WRONGTYPE`, or
/// a reply that is not a page).
pub type PagerPage = (usize, RedisResult<Vec<Value>>);

/// Pages through many scans at once: each round trip pipelines the next page of up to
/// [`PAGE_KEYS`] of them (cursors of unfinished scans go to the back of the queue).
#[derive(Debug)]
pub struct Pager {
    cursors: Vec<Cursor>,
    pending: VecDeque<usize>,
    per_trip: usize,
}

impl Pager {
    /// A pager over `scans`, each from the start.
    pub fn new(scans: Vec<Scan>) -> Pager {
        let pending = (0..scans.len()).collect();
        Pager {
            cursors: scans.into_iter().map(Cursor::new).collect(),
            pending,
            per_trip: PAGE_KEYS,
        }
    }

    /// Scans paged per round trip (default [`PAGE_KEYS`], at least 1).
    pub fn per_trip(mut self, n: usize) -> Pager {
        self.per_trip = n.max(1);
        self
    }

    /// Scan `i` of the list given to [`Pager::new`].
    pub fn scan(&self, i: usize) -> &Scan {
        self.cursors[i].scan()
    }

    /// The next pages, one round trip; `None` once every scan is complete. A scan whose
    /// call fails with an error reply ends with that error as its page.
    ///
    /// # Errors
    /// The round trip itself failed (I/O, timeout).
    pub fn next<C: ConnectionLike>(&mut self, con: &mut C) -> RedisResult<Option<Vec<PagerPage>>> {
        if self.pending.is_empty() {
            return Ok(None);
        }
        let take = self.pending.len().min(self.per_trip);
        let batch: Vec<usize> = self.pending.drain(..take).collect();
        let mut pipe = redis::pipe();
        for &i in &batch {
            self.cursors[i].add_to(&mut pipe);
        }
        pipe.ignore_errors();
        let replies: Vec<RedisResult<Value>> = pipe.query(con)?;
        let mut pages = Vec::with_capacity(batch.len());
        for (i, reply) in batch.into_iter().zip(replies) {
            let cursor = &mut self.cursors[i];
            let page = reply.and_then(|r| cursor.advance(r));
            if page.is_ok() && !cursor.done() {
                self.pending.push_back(i);
            }
            pages.push((i, page));
        }
        Ok(Some(pages))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(cmd: &redis::Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => "<cursor>".to_owned(),
            })
            .collect()
    }

    #[test]
    fn commands() {
        assert_eq!(
            args(&Scan::keys("P:*").cmd("0")),
            ["SCAN", "0", "MATCH", "P:*", "COUNT", "1000"]
        );
        assert_eq!(
            args(&Scan::set("s").count(7).cmd("12")),
            ["SSCAN", "s", "12", "COUNT", "7"]
        );
        assert_eq!(args(&Scan::hash("h").cmd("0"))[0], "HSCAN");
        assert_eq!(
            args(&Scan::sorted_set("z").matching("a*").cmd("0")),
            ["ZSCAN", "z", "0", "MATCH", "a*", "COUNT", "1000"]
        );
    }

    #[test]
    fn advance_moves_and_ends() {
        let page = |next: &str, items: &[&str]| {
            Value::Array(vec![
                Value::BulkString(next.as_bytes().to_vec()),
                Value::Array(
                    items
                        .iter()
                        .map(|i| Value::BulkString(i.as_bytes().to_vec()))
                        .collect(),
                ),
            ])
        };
        let mut c = Cursor::new(Scan::set("s"));
        assert_eq!(c.position(), Some("0"));
        let items = c.advance(page("42", &["a", "b"])).unwrap();
        assert_eq!(items_as::<Vec<String>>(items).unwrap(), ["a", "b"]);
        assert_eq!(c.position(), Some("42"));
        c.advance(page("0", &[])).unwrap();
        assert!(c.done());
        let mut bad = Cursor::new(Scan::set("s"));
        assert!(bad.advance(Value::Int(3)).is_err());
        assert!(bad.done());
    }
}
