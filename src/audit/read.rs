//! Reading helpers of the audit: the scan in progress ([`Scan`]), pipelined replies, pages of
//! many collections (through the crate's one pager, [`crate::scan`]), text and ids.

use redis::{FromRedisValue, RedisResult, Value};

use super::findings::{self, Findings, Fix};
use super::{ProblemKind, OP};
use crate::conn::{self, Conn};
use crate::error::{Error, Result};
use crate::keys::{decode_id, KeySpace};
use crate::scan::{items_as, Pager, Scan as ScanOf};

/// One scan in progress: the prefix, the connection and what was found so far. Each check
/// (one file of this folder each) is a method of it.
pub(super) struct Scan<'a> {
    pub(super) ks: &'a KeySpace,
    pub(super) con: &'a mut Conn,
    pub(super) out: Findings,
}

/// One page of one of a pager's collections: the collection's index and its items, `None`
/// when the call failed with an error reply (the key holds another type, reported by its
/// own check).
pub(super) type BytesPage = (usize, Option<Vec<Vec<u8>>>);

impl Scan<'_> {
    /// Records a finding (see [`findings::add`]).
    pub(super) fn found(
        &mut self,
        kind: ProblemKind,
        key: &str,
        item: &str,
        detail: String,
        fix: Option<Fix>,
    ) {
        findings::add(&mut self.out, kind, key, item, detail, fix);
    }

    /// A `malformed_value` finding: a member, field or value this crate never writes.
    pub(super) fn malformed(&mut self, key: &str, item: &str, detail: String) {
        self.found(ProblemKind::MalformedValue, key, item, detail, None);
    }

    /// Sends `pipe`; one reply per command, error replies kept in place.
    pub(super) fn exec(&mut self, pipe: &mut redis::Pipeline) -> Result<Vec<RedisResult<Value>>> {
        exec(self.con, pipe)
    }

    /// The next pages of `pager`, one round trip; `None` once every collection is done.
    pub(super) fn pages(&mut self, pager: &mut Pager) -> Result<Option<Vec<BytesPage>>> {
        let Some(pages) = pager.next(self.con).map_err(|e| Error::redis(OP, e))? else {
            return Ok(None);
        };
        let bytes = |items: Vec<Value>| items_as::<Vec<Vec<u8>>>(items).ok();
        Ok(Some(
            pages
                .into_iter()
                .map(|(i, page)| (i, page.ok().and_then(bytes)))
                .collect(),
        ))
    }
}

/// A pager over collections `keys`, all read with the same command (`scan` builds one
/// collection's [`ScanOf`], e.g. `ScanOf::set`).
pub(super) fn pager(keys: Vec<String>, scan: fn(String) -> ScanOf) -> Pager {
    Pager::new(keys.into_iter().map(scan).collect())
}

pub(super) fn exec(con: &mut Conn, pipe: &mut redis::Pipeline) -> Result<Vec<RedisResult<Value>>> {
    conn::exec(con, pipe).map_err(|e| Error::redis(OP, e))
}

/// A pipelined reply as `T`; `None` on an error reply (a wrong-typed key, reported by its own
/// check) or an unexpected shape.
pub(super) fn get<T: FromRedisValue>(r: Option<&RedisResult<Value>>) -> Option<T> {
    r.and_then(|r| r.as_ref().ok())
        .and_then(|v| redis::from_redis_value_ref(v).ok())
}

/// Bytes as text; `Err` with the lossy text when they are not UTF-8.
pub(super) fn text(bytes: Vec<u8>) -> std::result::Result<String, String> {
    String::from_utf8(bytes).map_err(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// True when `wire` is the wire form of an id.
pub(super) fn is_id(wire: &str) -> bool {
    decode_id(wire).is_ok()
}

/// True when a room index entry of `inst` is right: the pin names it, or there is no pin and
/// the metadata names it.
pub(super) fn room_names(pin: Option<&str>, meta: Option<&str>, inst: &str) -> bool {
    match pin {
        Some(p) => p == inst,
        None => meta == Some(inst),
    }
}
