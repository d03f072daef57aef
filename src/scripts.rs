//! The Lua scripts (one file each under `lua/`), loading, and `NOSCRIPT` recovery.
//!
//! Single calls go through [`redis::ScriptInvocation::invoke`], which sends `EVALSHA` and, on
//! `NOSCRIPT` (after a restart or `SCRIPT FLUSH`), loads the script and retries once. Pipelines
//! do not retry by themselves, so [`exec`] reloads every script and re-sends the pipeline. Every new connection preloads all scripts ([`preload`]).

use std::sync::LazyLock;

use redis::{Connection, FromRedisValue, Pipeline, RedisResult, Script, ScriptInvocation, Value};

use crate::error::{Error, Result};

/// Every script of the crate, compiled in with `include_str!`.
#[allow(missing_docs)]
#[derive(Debug)]
pub(crate) struct Scripts {
    pub heartbeat: Script,
    pub heartbeat_release: Script,
    pub pin_room: Script,
    pub pin_refresh: Script,
    pub close_room: Script,
    pub upsert_peer: Script,
    pub remove_peer: Script,
    pub lease_acquire: Script,
    pub lease_refresh: Script,
    pub lease_release: Script,
    pub candidates: Script,
    pub reap_begin: Script,
    pub reap_room: Script,
    pub reap_peer: Script,
    pub reap_finish: Script,
    pub audit_room_index: Script,
    pub audit_delete_room: Script,
    pub audit_enqueue: Script,
}

pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    heartbeat: Script::new(include_str!("../lua/heartbeat.lua")),
    heartbeat_release: Script::new(include_str!("../lua/heartbeat_release.lua")),
    pin_room: Script::new(include_str!("../lua/pin_room.lua")),
    pin_refresh: Script::new(include_str!("../lua/pin_refresh.lua")),
    close_room: Script::new(include_str!("../lua/close_room.lua")),
    upsert_peer: Script::new(include_str!("../lua/upsert_peer.lua")),
    remove_peer: Script::new(include_str!("../lua/remove_peer.lua")),
    lease_acquire: Script::new(include_str!("../lua/lease_acquire.lua")),
    lease_refresh: Script::new(include_str!("../lua/lease_refresh.lua")),
    lease_release: Script::new(include_str!("../lua/lease_release.lua")),
    candidates: Script::new(include_str!("../lua/candidates.lua")),
    reap_begin: Script::new(include_str!("../lua/reap_begin.lua")),
    reap_room: Script::new(include_str!("../lua/reap_room.lua")),
    reap_peer: Script::new(include_str!("../lua/reap_peer.lua")),
    reap_finish: Script::new(include_str!("../lua/reap_finish.lua")),
    audit_room_index: Script::new(include_str!("../lua/audit_room_index.lua")),
    audit_delete_room: Script::new(include_str!("../lua/audit_delete_room.lua")),
    audit_enqueue: Script::new(include_str!("../lua/audit_enqueue.lua")),
});

impl Scripts {
    fn all(&self) -> [&Script; 18] {
        [
            &self.heartbeat,
            &self.heartbeat_release,
            &self.pin_room,
            &self.pin_refresh,
            &self.close_room,
            &self.upsert_peer,
            &self.remove_peer,
            &self.lease_acquire,
            &self.lease_refresh,
            &self.lease_release,
            &self.candidates,
            &self.reap_begin,
            &self.reap_room,
            &self.reap_peer,
            &self.reap_finish,
            &self.audit_room_index,
            &self.audit_delete_room,
            &self.audit_enqueue,
        ]
    }
}

/// Loads every script into the server's script cache (`SCRIPT LOAD`, pipelined).
pub(crate) fn preload(con: &mut Connection) -> RedisResult<()> {
    let mut pipe = redis::pipe();
    for s in SCRIPTS.all() {
        pipe.load_script(s).ignore();
    }
    pipe.exec(con)
}

pub(crate) fn is_noscript(e: &redis::RedisError) -> bool {
    e.code() == Some("NOSCRIPT")
}

/// Sends `pipe` (one round trip) and returns one result per command; a failed command does
/// not fail the others. If any command failed with `NOSCRIPT`, every script is reloaded and the
/// whole pipeline is sent once more: every pipeline this crate builds is safe to repeat (its
/// plain commands are idempotent and its scripts either did not run or are idempotent batches).
/// An `Err` means the round trip itself failed (I/O, timeout).
pub(crate) fn exec(
    con: &mut Connection,
    pipe: &mut Pipeline,
) -> RedisResult<Vec<RedisResult<Value>>> {
    if pipe.is_empty() {
        return Ok(Vec::new());
    }
    pipe.ignore_errors();
    let results: Vec<RedisResult<Value>> = pipe.query(con)?;
    if results
        .iter()
        .any(|r| matches!(r, Err(e) if is_noscript(e)))
    {
        log::info!("script cache was flushed; reloading scripts");
        preload(con)?;
        return pipe.query(con);
    }
    Ok(results)
}

/// Sends one script invocation (reloading on `NOSCRIPT`) and decodes its reply.
pub(crate) fn call<T: FromRedisValue>(
    con: &mut Connection,
    op: &'static str,
    inv: &ScriptInvocation<'_>,
) -> Result<T> {
    // `invoke` loads the script and retries once on NOSCRIPT; a flush landing between that
    // load and the retry is survived by trying again (a script that got NOSCRIPT did not run).
    let mut attempts = 0;
    loop {
        match inv.invoke(con) {
            Err(e) if is_noscript(&e) && attempts < 3 => attempts += 1,
            out => return out.map_err(|e| Error::redis(op, e)),
        }
    }
}

/// Decodes one pipelined reply.
pub(crate) fn decode<T: FromRedisValue>(op: &'static str, r: RedisResult<Value>) -> Result<T> {
    let v = r.map_err(|e| Error::redis(op, e))?;
    redis::from_redis_value(v).map_err(|e| Error::bad_data(op, format!("unexpected reply: {e}")))
}
