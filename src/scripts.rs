//! The Lua scripts (one file each under `lua/`), compiled in with `include_str!`. Loading them
//! (preload on connect) and `NOSCRIPT` recovery belong to the connection layer (`conn`).

use std::sync::LazyLock;

use redis::Script;

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
    /// Every script, for preloading.
    pub(crate) fn all(&self) -> [&Script; 18] {
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
