//! The Lua scripts (one file each under `lua/`), compiled in with `include_str!`. Loading them
//! (preload on connect) and `NOSCRIPT` recovery belong to the connection layer (`conn`).

use std::sync::LazyLock;

use redis::Script;

/// Declares [`Scripts`] (one field per script), [`SCRIPTS`] (each loaded from
/// `lua/<name>.lua`) and [`Scripts::all`], from one list of names.
macro_rules! scripts {
    ($($name:ident),+ $(,)?) => {
        /// Every script of the crate, compiled in with `include_str!`: the field `x` is
        /// `lua/x.lua`.
        #[allow(missing_docs)]
        #[derive(Debug)]
        pub(crate) struct Scripts {
            $(pub $name: Script,)+
            /// Every script's name and source, in the order of the list.
            sources: Vec<(&'static str, &'static str)>,
        }

        pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| {
            let sources = vec![$((
                stringify!($name),
                source(stringify!($name), include_str!(concat!("../lua/", stringify!($name), ".lua"))),
            )),+];
            let mut each = sources.iter().map(|(_, source)| Script::new(source));
            Scripts {
                $($name: each.next().expect("one source per script"),)+
                sources,
            }
        });

        impl Scripts {
            /// The script `name` of the list.
            fn by_name(&self, name: &str) -> &Script {
                match name {
                    $(stringify!($name) => &self.$name,)+
                    _ => unreachable!("{name} is not a script of the list"),
                }
            }
        }
    };
}

impl Scripts {
    /// Every script, for preloading.
    pub(crate) fn all(&self) -> Vec<&Script> {
        let mut all = Vec::with_capacity(self.sources.len());
        for (name, _) in &self.sources {
            all.push(self.by_name(name));
        }
        all
    }

    /// Every script's name (`heartbeat` for `lua/heartbeat.lua`) and source.
    pub(crate) fn sources(&self) -> Vec<(&'static str, &'static str)> {
        self.sources.clone()
    }

    /// The source of the script whose SHA1 is `sha` (an `EVALSHA` turned into an `EVAL` when
    /// the script cache keeps being flushed).
    pub(crate) fn source_of(&self, sha: &[u8]) -> Option<&'static str> {
        self.sources
            .iter()
            .find(|(name, _)| self.by_name(name).get_hash().as_bytes() == sha)
            .map(|(_, source)| *source)
    }
}

/// The source of script `name`: the compiled-in one, or with the `testing` feature and
/// `SFU_TEST_LUA_DIR` set, `<dir>/<name>.lua` read at first use. The mutation check
/// (`.ci/mutants.py`) runs the suite's processes over a copy of `lua/` with one guard broken,
/// without rebuilding; a host's build (no `testing`) always runs what it was compiled with.
fn source(name: &str, compiled: &'static str) -> &'static str {
    #[cfg(feature = "testing")]
    if let Some(dir) = std::env::var_os("SFU_TEST_LUA_DIR") {
        let path = std::path::Path::new(&dir).join(format!("{name}.lua"));
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                log::warn!(
                    "SFU_TEST_LUA_DIR: {name} runs {} (a test override)",
                    path.display()
                );
                return Box::leak(text.into_boxed_str());
            }
            Err(e) => panic!("SFU_TEST_LUA_DIR: cannot read {}: {e}", path.display()),
        }
    }
    let _ = name;
    compiled
}

scripts!(
    heartbeat,
    heartbeat_release,
    deregister,
    index_add,
    pin_room,
    pin_refresh,
    close_room,
    upsert_peer,
    remove_peer,
    lease_acquire,
    lease_refresh,
    lease_release,
    candidates,
    reap_begin,
    reap_force_begin,
    reap_room,
    reap_finish,
    reap_putback,
    reaper_paused,
    audit_room_index,
    audit_delete_room,
    audit_enqueue,
);

/// One room's part of a `reap_room.lua` reply: status, peer cursor, records deleted, records
/// of the instance kept as written at or after t0.
pub(crate) type RoomReply = (String, String, u64, u64);

/// A `reap_room.lua` reply: one [`RoomReply`] per room the call reached, in order. On the wire
/// one flat array: a room reaped whole in the call with nothing kept is one integer (its
/// records deleted; status `reaped`, cursor `0`), any other room four elements (status,
/// cursor, deleted, late).
pub(crate) struct RoomReplies(pub(crate) Vec<RoomReply>);

impl redis::FromRedisValue for RoomReplies {
    fn from_redis_value(v: redis::Value) -> std::result::Result<Self, redis::ParsingError> {
        let redis::Value::Array(items) = v else {
            return Err(format!("reap_room.lua replied {v:?}, not an array").into());
        };
        let mut rooms = Vec::with_capacity(items.len());
        let mut items = items.into_iter();
        while let Some(first) = items.next() {
            if let redis::Value::Int(deleted) = first {
                let deleted = u64::try_from(deleted)
                    .map_err(|_| format!("reap_room.lua: {deleted} records deleted"))?;
                rooms.push(("reaped".to_owned(), "0".to_owned(), deleted, 0));
                continue;
            }
            let (Some(cursor), Some(deleted), Some(late)) =
                (items.next(), items.next(), items.next())
            else {
                return Err("reap_room.lua: a room's reply is short".into());
            };
            rooms.push((
                redis::from_redis_value(first)?,
                redis::from_redis_value(cursor)?,
                redis::from_redis_value(deleted)?,
                redis::from_redis_value(late)?,
            ));
        }
        Ok(RoomReplies(rooms))
    }
}

#[cfg(test)]
mod tests {
    use super::SCRIPTS;

    /// Every file under `lua/` is a script of the list (none forgotten by the preload).
    /// Every script's source is found by its SHA1 (the `EVAL` fallback of `conn`).
    #[test]
    fn every_source_is_found_by_its_hash() {
        for script in SCRIPTS.all() {
            let source = SCRIPTS
                .source_of(script.get_hash().as_bytes())
                .expect("source");
            assert_eq!(redis::Script::new(source).get_hash(), script.get_hash());
        }
        assert_eq!(SCRIPTS.source_of(b"0000"), None);
    }

    /// `reap_room.lua`'s reply: an integer is a room reaped whole with nothing kept, any other
    /// room four elements; a short or negative entry is an error, not a guess.
    #[test]
    fn room_replies_decode_both_shapes() {
        use redis::Value::{Array, BulkString, Int};
        let s = |t: &str| BulkString(t.as_bytes().to_vec());
        let reply = Array(vec![Int(4), s("skipped"), s("17"), Int(1), Int(2), Int(0)]);
        let super::RoomReplies(rooms) = redis::from_redis_value(reply).expect("decodes");
        assert_eq!(
            rooms,
            [
                ("reaped".into(), "0".into(), 4, 0),
                ("skipped".into(), "17".into(), 1, 2),
                ("reaped".into(), "0".into(), 0, 0),
            ]
        );
        let short = Array(vec![Int(1), s("error"), s("WRONGTYPE")]);
        assert!(redis::from_redis_value::<super::RoomReplies>(short).is_err());
        assert!(redis::from_redis_value::<super::RoomReplies>(Array(vec![Int(-1)])).is_err());
        assert!(redis::from_redis_value::<super::RoomReplies>(Int(1)).is_err());
    }

    #[test]
    fn every_lua_file_is_listed() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/lua");
        let files = std::fs::read_dir(dir).expect("lua/").count();
        assert_eq!(SCRIPTS.all().len(), files, "lua/ holds {files} files");
    }
}
