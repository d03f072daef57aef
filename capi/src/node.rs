//! `SfuNode`: a started node, its calls, its stats and its events.

use std::ffi::{c_char, c_void};
use std::ptr;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;

use crate::config::SfuConfig;
use crate::error::{
    arg_opt_str, arg_str, boundary, not_null, owned_c_string, refuse_in_callback, write_opt, Fail,
    SfuStatus,
};
use crate::event::{dispatch, ForeignCallback, SfuEvent, SfuEventCallback, SfuFinalizer};
use sfu_redis::Error;
use sfu_redis::Event;
use sfu_redis::Node;
use sfu_redis::PinOutcome;

/// A started node (opaque): one SFU instance's handle on the shared Redis (or on memory in
/// memory-only mode). Start it with `sfu_node_start`; release it with `sfu_node_free`. Usable
/// from any number of threads at once; `sfu_node_free` must be the last call.
#[derive(Debug)]
pub struct SfuNode {
    node: Node,
    events: Receiver<Event>,
    /// Held while polling and while (un)registering a callback: a poll and a callback never
    /// take events from the stream at the same time.
    dispatch: Mutex<Option<EventThread>>,
}

#[derive(Debug)]
struct EventThread {
    /// Dropping it stops the thread after the event it is delivering, if any.
    stop: Sender<()>,
    handle: JoinHandle<()>,
}

impl EventThread {
    /// Stops the thread (it finishes the callback in progress) and waits for it.
    fn stop(self) {
        drop(self.stop);
        join(self.handle);
    }

    /// Waits until the thread has delivered every event left (the stream ends after
    /// `Stopped`), then until it exits.
    fn drain(self) {
        let EventThread { stop, handle } = self;
        join(handle);
        drop(stop);
    }
}

fn join(handle: JoinHandle<()>) {
    if handle.join().is_err() {
        log::error!("the sfu-redis event thread panicked");
    }
}

/// How `sfu_node_pin_room` went. Numbers are stable and never reused.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum SfuPinOutcome {
    /// The room was free; this instance owns it now.
    SFU_PIN_PINNED = 1,
    /// This instance already owned it (the pin was refreshed).
    SFU_PIN_ALREADY_OURS = 2,
    /// The previous owner's pin had expired or its heartbeat was gone; this instance took the
    /// room over (`out_owner` = the previous owner).
    SFU_PIN_TOOK_OVER = 3,
    /// Another live instance owns the room; nothing was written (`out_owner` = that owner).
    /// Send the client there.
    SFU_PIN_HELD = 4,
}

/// One host field of a peer record: name and value, both borrowed for the call.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SfuField {
    /// 1 to 256 bytes of UTF-8 without control characters; not `instance`, `guest`,
    /// `generation`, `updated_ms` or `updated_us` (reserved).
    pub name: *const c_char,
    /// Any UTF-8 string.
    pub value: *const c_char,
}

/// A snapshot of a node's state and counters (`sfu_node_stats`). The two strings are owned by
/// the struct: release them with `sfu_stats_clear`. Initialise with `SfuStats s = {0};`.
#[repr(C)]
#[derive(Debug)]
pub struct SfuStats {
    /// This instance's id.
    pub instance_id: *mut c_char,
    /// False in memory-only mode.
    pub redis: bool,
    /// Whether this node holds the reaper lease now.
    pub is_leader: bool,
    /// The current term's epoch when leading, else 0 (epochs start at 1).
    pub epoch: u64,
    /// Rooms this node owns.
    pub rooms: u64,
    /// Peers this node upserted and has not removed.
    pub peers: u64,
    /// Successful heartbeat ticks.
    pub heartbeats: u64,
    /// Failed heartbeat ticks.
    pub heartbeat_failures: u64,
    /// Milliseconds since the last successful heartbeat, or -1 if none yet (memory-only mode).
    pub last_heartbeat_age_ms: i64,
    /// Redis errors seen by the worker threads.
    pub redis_errors: u64,
    /// Bad data met by the worker threads (keys of the wrong type, malformed records).
    pub bad_data: u64,
    /// The last error or bad data the worker threads saw, or NULL (never contains a password).
    pub last_error: *mut c_char,
    /// Dead instances this node reaped.
    pub instances_reaped: u64,
    /// Rooms deleted by those reaps.
    pub rooms_reaped: u64,
    /// Peer records deleted by those reaps.
    pub peers_reaped: u64,
    /// Events dropped because the event queue (4096) was full.
    pub events_dropped: u64,
}

/// The node behind `node`, or `SFU_ERR_NULL`.
///
/// # Safety
/// `node` is NULL or a live node.
unsafe fn node_ref<'a>(node: *const SfuNode) -> Result<&'a SfuNode, Fail> {
    not_null(node, "node")?;
    // SAFETY: non-NULL and live per the contract.
    Ok(unsafe { &*node })
}

/// Starts a node from `config` (copied: free or change it afterwards as you like) and writes it
/// to `*out_node`; release it with `sfu_node_free`. With a Redis URL: connects, registers the
/// first heartbeat (an unreachable Redis or a wrong password fails here, `SFU_ERR_REDIS`) and
/// starts the heartbeat, lease and reaper threads. Without one: memory-only mode, no threads.
/// `SFU_ERR_INVALID_CONFIG` names the field at fault.
///
/// **It may wait.** If a heartbeat of the same instance id is still live in Redis (a previous
/// process with this id that crashed less than `heartbeat_ttl_ms` ago; one stopped with
/// `sfu_node_stop` or `sfu_node_leave` does not count), this call waits until that heartbeat
/// expires (at most `heartbeat_ttl_ms`, or that heartbeat's own longer TTL up to 10 times
/// `heartbeat_ttl_ms`, plus one heartbeat interval, 40 s by default), then
/// starts; if the heartbeat keeps being renewed (the
/// id is live in another process) it fails with `SFU_ERR_INVALID_CONFIG` naming `instance_id`.
/// The default instance id is new at each start and never waits. On a brand-new dataset no
/// node is granted the reaper lease for `lease_ttl_ms` (90 s by default): no
/// `SFU_EVENT_LEADER_ACQUIRED` before then.
///
/// # Safety
/// `config` is NULL or a live config; `out_node` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn sfu_node_start(
    config: *const SfuConfig,
    out_node: *mut *mut SfuNode,
) -> SfuStatus {
    boundary(|| {
        not_null(config, "config")?;
        not_null(out_node, "out_node")?;
        // SAFETY: non-NULL and live per the contract.
        let config = unsafe { &*config }.build()?;
        let node = Node::start(config)?;
        let events = node.events();
        let node = Box::into_raw(Box::new(SfuNode {
            node,
            events,
            dispatch: Mutex::new(None),
        }));
        // SAFETY: checked non-NULL; valid for writes per the contract.
        unsafe { out_node.write(node) };
        Ok(())
    })
}

/// Writes this instance's id to `*out_instance_id` (owned by the caller: `sfu_string_free`).
///
/// # Safety
/// `node` is NULL or a live node; `out_instance_id` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn sfu_node_instance_id(
    node: *const SfuNode,
    out_instance_id: *mut *mut c_char,
) -> SfuStatus {
    boundary(|| {
        // SAFETY: per the contract.
        let n = unsafe { node_ref(node)? };
        not_null(out_instance_id, "out_instance_id")?;
        // SAFETY: checked non-NULL; valid for writes per the contract.
        unsafe { out_instance_id.write(owned_c_string(n.node.instance_id())) };
        Ok(())
    })
}

/// Pins `room` for this instance: a free room is taken (`SFU_PIN_PINNED`), an owned one
/// refreshed (`SFU_PIN_ALREADY_OURS`), one whose owner's pin expired or heartbeat is gone taken
/// over (`SFU_PIN_TOOK_OVER`); a live owner's pin is left alone (`SFU_PIN_HELD`). Owned rooms
/// are refreshed by every heartbeat.
///
/// `out_owner` may be NULL; otherwise it receives the other instance's id for
/// `SFU_PIN_HELD` (the owner) and `SFU_PIN_TOOK_OVER` (the previous owner), else NULL; a
/// non-NULL string is owned by the caller (`sfu_string_free`).
///
/// Errors: `SFU_ERR_INVALID_ID`, `SFU_ERR_REDIS`, `SFU_ERR_BAD_DATA`, `SFU_ERR_STOPPED`.
///
/// # Safety
/// `node` is NULL or a live node; `room` is NULL or a NUL-terminated string; the out-parameters
/// are NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn sfu_node_pin_room(
    node: *const SfuNode,
    room: *const c_char,
    out_outcome: *mut SfuPinOutcome,
    out_owner: *mut *mut c_char,
) -> SfuStatus {
    boundary(|| {
        // SAFETY: per the contract.
        let n = unsafe { node_ref(node)? };
        // SAFETY: per the contract.
        let room = unsafe { arg_str(room, "room")? };
        not_null(out_outcome, "out_outcome")?;
        let (outcome, other) = match n.node.pin_room(room)? {
            PinOutcome::Pinned => (SfuPinOutcome::SFU_PIN_PINNED, None),
            PinOutcome::AlreadyOurs => (SfuPinOutcome::SFU_PIN_ALREADY_OURS, None),
            PinOutcome::TookOver { previous } => (SfuPinOutcome::SFU_PIN_TOOK_OVER, Some(previous)),
            PinOutcome::Held { owner } => (SfuPinOutcome::SFU_PIN_HELD, Some(owner)),
            other => {
                return Err(Fail::new(
                    SfuStatus::SFU_ERR_PANIC,
                    format!("pin outcome {other:?} has no C value"),
                ))
            }
        };
        // SAFETY: valid for writes per the contract (the optional one may be NULL).
        unsafe {
            out_outcome.write(outcome);
            // The string is made only when it has somewhere to go (no leak for a NULL).
            if !out_owner.is_null() {
                out_owner.write(other.as_deref().map_or(ptr::null_mut(), owned_c_string));
            }
        }
        Ok(())
    })
}

/// Deletes `room`, its metadata and all its peers, if this instance owns it
/// (`SFU_ERR_NOT_OWNER` otherwise). Errors: `SFU_ERR_INVALID_ID`, `SFU_ERR_NOT_OWNER`,
/// `SFU_ERR_REDIS`, `SFU_ERR_BAD_DATA`, `SFU_ERR_STOPPED`.
///
/// # Safety
/// `node` is NULL or a live node; `room` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn sfu_node_close_room(
    node: *const SfuNode,
    room: *const c_char,
) -> SfuStatus {
    boundary(|| {
        // SAFETY: per the contract.
        let n = unsafe { node_ref(node)? };
        // SAFETY: per the contract.
        let room = unsafe { arg_str(room, "room")? };
        n.node.close_room(room)?;
        Ok(())
    })
}

/// Writes the instance whose pin `room` carries to `*out_owner`: a string owned by the caller
/// (`sfu_string_free`), or NULL when the room is not pinned. Errors: `SFU_ERR_INVALID_ID`,
/// `SFU_ERR_REDIS`, `SFU_ERR_BAD_DATA`, `SFU_ERR_STOPPED`.
///
/// # Safety
/// `node` is NULL or a live node; `room` is NULL or a NUL-terminated string; `out_owner` is
/// NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn sfu_node_room_owner(
    node: *const SfuNode,
    room: *const c_char,
    out_owner: *mut *mut c_char,
) -> SfuStatus {
    boundary(|| {
        // SAFETY: per the contract.
        let n = unsafe { node_ref(node)? };
        // SAFETY: per the contract.
        let room = unsafe { arg_str(room, "room")? };
        not_null(out_owner, "out_owner")?;
        let owner = n.node.room_owner(room)?;
        // SAFETY: checked non-NULL; valid for writes per the contract.
        unsafe { out_owner.write(owner.as_deref().map_or(ptr::null_mut(), owned_c_string)) };
        Ok(())
    })
}

/// Writes peer `peer` of `room` (which this instance must own) with `fields_len` host fields
/// and its guest (`guest` may be NULL), and writes the record's generation to
/// `*out_generation`: unique within the room; pass it to `sfu_node_remove_peer`.
///
/// `fields` may be NULL only when `fields_len` is 0; at most 64 fields. `out_replaced` may be
/// NULL; otherwise it receives the id of another peer of the same guest that this upsert
/// replaced (its record is gone: tear its transport down), owned by the caller
/// (`sfu_string_free`), or NULL.
///
/// Errors: `SFU_ERR_NOT_OWNER` (the room is not this instance's), `SFU_ERR_INVALID_ID`,
/// `SFU_ERR_INVALID_ARGUMENT` (a reserved, empty or control-character field name, too many
/// fields), `SFU_ERR_REDIS`, `SFU_ERR_BAD_DATA`, `SFU_ERR_STOPPED`.
///
/// # Safety
/// `node` is NULL or a live node; the strings are NULL or NUL-terminated; `fields` is NULL or
/// points to `fields_len` entries; the out-parameters are NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn sfu_node_upsert_peer(
    node: *const SfuNode,
    room: *const c_char,
    peer: *const c_char,
    guest: *const c_char,
    fields: *const SfuField,
    fields_len: usize,
    out_generation: *mut u64,
    out_replaced: *mut *mut c_char,
) -> SfuStatus {
    boundary(|| {
        // SAFETY: per the contract.
        let n = unsafe { node_ref(node)? };
        // SAFETY: per the contract.
        let (room, peer, guest) = unsafe {
            (
                arg_str(room, "room")?,
                arg_str(peer, "peer")?,
                arg_opt_str(guest, "guest")?,
            )
        };
        not_null(out_generation, "out_generation")?;
        let fields: &[SfuField] = if fields_len == 0 {
            &[]
        } else {
            not_null(fields, "fields")?;
            // SAFETY: non-NULL and `fields_len` entries per the contract.
            unsafe { std::slice::from_raw_parts(fields, fields_len) }
        };
        let mut pairs = Vec::with_capacity(fields.len());
        for (i, f) in fields.iter().enumerate() {
            // SAFETY: each entry's strings are NULL or NUL-terminated per the contract.
            let (k, v) = unsafe {
                (
                    arg_str(f.name, &format!("fields[{i}].name"))?,
                    arg_str(f.value, &format!("fields[{i}].value"))?,
                )
            };
            pairs.push((k, v));
        }
        let up = n.node.upsert_peer_detailed(room, peer, guest, &pairs)?;
        // SAFETY: valid for writes per the contract (the optional one may be NULL).
        unsafe {
            out_generation.write(up.generation);
            if !out_replaced.is_null() {
                out_replaced.write(
                    up.replaced
                        .as_deref()
                        .map_or(ptr::null_mut(), owned_c_string),
                );
            }
        }
        Ok(())
    })
}

/// Removes peer `peer` of `room` if its record still carries `generation`. `*out_removed`
/// (`out_removed` may be NULL) becomes false when it was a no-op: a late remove of an older
/// connection, or a peer already gone. Errors: `SFU_ERR_NOT_OWNER` (the record belongs to
/// another instance), `SFU_ERR_INVALID_ID`, `SFU_ERR_REDIS`, `SFU_ERR_BAD_DATA`,
/// `SFU_ERR_STOPPED`.
///
/// # Safety
/// `node` is NULL or a live node; the strings are NULL or NUL-terminated; `out_removed` is NULL
/// or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn sfu_node_remove_peer(
    node: *const SfuNode,
    room: *const c_char,
    peer: *const c_char,
    generation: u64,
    out_removed: *mut bool,
) -> SfuStatus {
    boundary(|| {
        // SAFETY: per the contract.
        let n = unsafe { node_ref(node)? };
        // SAFETY: per the contract.
        let (room, peer) = unsafe { (arg_str(room, "room")?, arg_str(peer, "peer")?) };
        let removed = n.node.remove_peer(room, peer, generation)?;
        // SAFETY: NULL or valid for writes per the contract.
        unsafe { write_opt(out_removed, removed) };
        Ok(())
    })
}

/// Writes whether this node holds the reaper lease now (its local deadline has not passed) to
/// `*out_is_leader`. Always false in memory-only mode and after `sfu_node_stop`.
///
/// # Safety
/// `node` is NULL or a live node; `out_is_leader` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn sfu_node_is_leader(
    node: *const SfuNode,
    out_is_leader: *mut bool,
) -> SfuStatus {
    boundary(|| {
        // SAFETY: per the contract.
        let n = unsafe { node_ref(node)? };
        not_null(out_is_leader, "out_is_leader")?;
        let leader = n.node.is_leader();
        // SAFETY: checked non-NULL; valid for writes per the contract.
        unsafe { out_is_leader.write(leader) };
        Ok(())
    })
}

/// Fills `*out_stats` with a snapshot of the node's state and counters. It overwrites the
/// struct without freeing what it held: pass a zeroed or cleared one, and release it with
/// `sfu_stats_clear`. Works on a stopped node too.
///
/// # Safety
/// `node` is NULL or a live node; `out_stats` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn sfu_node_stats(
    node: *const SfuNode,
    out_stats: *mut SfuStats,
) -> SfuStatus {
    boundary(|| {
        // SAFETY: per the contract.
        let n = unsafe { node_ref(node)? };
        not_null(out_stats, "out_stats")?;
        let s = n.node.stats();
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let out = SfuStats {
            instance_id: owned_c_string(&s.instance_id),
            redis: s.redis,
            is_leader: s.is_leader,
            epoch: s.epoch.unwrap_or(0),
            rooms: s.rooms as u64,
            peers: s.peers as u64,
            heartbeats: s.heartbeats,
            heartbeat_failures: s.heartbeat_failures,
            last_heartbeat_age_ms: s.last_heartbeat_age.map_or(-1, ms),
            redis_errors: s.redis_errors,
            bad_data: s.bad_data,
            last_error: s
                .last_error
                .as_deref()
                .map_or(ptr::null_mut(), owned_c_string),
            instances_reaped: s.instances_reaped,
            rooms_reaped: s.rooms_reaped,
            peers_reaped: s.peers_reaped,
            events_dropped: s.events_dropped,
        };
        // SAFETY: checked non-NULL; valid for writes per the contract.
        unsafe { out_stats.write(out) };
        Ok(())
    })
}

/// Writes the node's metrics in the Prometheus text exposition format 0.0.4 (content type
/// `text/plain; version=0.0.4; charset=utf-8`) to `*out_text`, for a host to serve on its own
/// `/metrics` endpoint. The string is owned by the caller: release it with `sfu_string_free`.
/// Every name starts with `sfu_redis_`; the list is in docs/src/reference/metrics.md. Rendered now,
/// from counters the node keeps anyway (no Redis call); works in memory-only mode and after
/// `sfu_node_stop`.
///
/// Errors: `SFU_ERR_NULL` (`*out_text` is left alone).
///
/// # Safety
/// `node` is NULL or a live node; `out_text` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn sfu_node_metrics(
    node: *const SfuNode,
    out_text: *mut *mut c_char,
) -> SfuStatus {
    boundary(|| {
        // SAFETY: per the contract.
        let n = unsafe { node_ref(node)? };
        not_null(out_text, "out_text")?;
        let text = owned_c_string(&n.node.metrics());
        // SAFETY: checked non-NULL; valid for writes per the contract.
        unsafe { out_text.write(text) };
        Ok(())
    })
}

/// Writes whether the node is healthy to `*out_ok` and why to `*out_reason` (may be NULL;
/// otherwise owned by the caller: `sfu_string_free`): healthy when the last successful
/// heartbeat is younger than `heartbeat_ttl_ms` (always in memory-only mode), not after
/// `sfu_node_stop`. What a host's `/healthz` should answer (200 / 503 with the reason).
///
/// Errors: `SFU_ERR_NULL` (nothing is written).
///
/// # Safety
/// `node` is NULL or a live node; `out_ok` is NULL or valid for a write; `out_reason` is NULL
/// or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn sfu_node_health(
    node: *const SfuNode,
    out_ok: *mut bool,
    out_reason: *mut *mut c_char,
) -> SfuStatus {
    boundary(|| {
        // SAFETY: per the contract.
        let n = unsafe { node_ref(node)? };
        not_null(out_ok, "out_ok")?;
        let health = n.node.health();
        // SAFETY: checked non-NULL; valid for writes per the contract.
        unsafe { out_ok.write(health.ok) };
        if !out_reason.is_null() {
            // SAFETY: non-NULL; valid for writes per the contract.
            unsafe { out_reason.write(owned_c_string(&health.reason)) };
        }
        Ok(())
    })
}

/// Releases the strings `stats` owns and zeroes it. NULL and a zeroed struct are no-ops.
///
/// # Safety
/// `stats` is NULL or points to an `SfuStats` that is zeroed or was filled by `sfu_node_stats`
/// and whose pointers were not modified.
#[no_mangle]
pub unsafe extern "C" fn sfu_stats_clear(stats: *mut SfuStats) {
    crate::error::boundary_void(|| {
        if stats.is_null() {
            return;
        }
        // SAFETY: valid per the contract; only the pointer fields are read (raw places), and
        // each is NULL or a string of this library.
        unsafe {
            for p in [
                ptr::addr_of!((*stats).instance_id).read(),
                ptr::addr_of!((*stats).last_error).read(),
            ] {
                if !p.is_null() {
                    drop(std::ffi::CString::from_raw(p));
                }
            }
            ptr::write_bytes(stats, 0, 1);
        }
    });
}

/// Emits `SFU_EVENT_READY` with the current room and peer counts. Call it once the start-up
/// pins and peers are written; operators' tooling waits for it. A no-op on a stopped node.
///
/// # Safety
/// `node` is NULL or a live node.
#[no_mangle]
pub unsafe extern "C" fn sfu_node_ready(node: *const SfuNode) -> SfuStatus {
    boundary(|| {
        // SAFETY: per the contract.
        let n = unsafe { node_ref(node)? };
        n.node.ready();
        Ok(())
    })
}

/// Stops the node: stops its threads, releases the reaper lease (owner CAS) and emits
/// `SFU_EVENT_STOPPED`, the last event. Pins and peers stay in Redis (the reaper removes them
/// once this instance is seen dead; `sfu_node_leave` removes them now). Idempotent. Afterwards
/// node calls fail with `SFU_ERR_STOPPED`, events already queued can still be read, and the
/// node must still be freed. Refused from inside an event callback (`SFU_ERR_IN_CALLBACK`).
///
/// # Safety
/// `node` is NULL or a live node.
#[no_mangle]
pub unsafe extern "C" fn sfu_node_stop(node: *const SfuNode) -> SfuStatus {
    boundary(|| {
        // SAFETY: per the contract.
        let n = unsafe { node_ref(node)? };
        refuse_in_callback("sfu_node_stop")?;
        n.node.shutdown()?;
        Ok(())
    })
}

/// Leaves the cluster for good: stops like `sfu_node_stop`, then closes every room this node
/// owns with their peers, removes its other peer records and its heartbeat registration, so
/// other instances can pin its rooms at once. Only the first of `sfu_node_stop` /
/// `sfu_node_leave` acts. A clean-up that fails stops at the first call that cannot reach
/// Redis and keeps the node registered (heartbeat released): a leader reaps what is left once
/// this instance is stale. Returns that first error, whose message counts what was left. Refused from inside an event callback (`SFU_ERR_IN_CALLBACK`).
///
/// # Safety
/// `node` is NULL or a live node.
#[no_mangle]
pub unsafe extern "C" fn sfu_node_leave(node: *const SfuNode) -> SfuStatus {
    boundary(|| {
        // SAFETY: per the contract.
        let n = unsafe { node_ref(node)? };
        refuse_in_callback("sfu_node_leave")?;
        n.node.leave()?;
        Ok(())
    })
}

/// Waits up to `timeout_ms` (0: do not wait) for the node's next event and moves it into
/// `*event`, which then owns its strings: release them with `sfu_event_clear` before reusing
/// or dropping the struct (this call overwrites it without freeing). Events are queued (4096;
/// overflow is dropped and counted in `SfuStats.events_dropped`) and each is delivered once:
/// poll from one thread.
///
/// Returns `SFU_ERR_TIMEOUT` when no event came in time (poll again), `SFU_ERR_CLOSED` once the
/// stream has ended (`SFU_EVENT_STOPPED` was delivered), `SFU_ERR_CALLBACK_REGISTERED` while an
/// event callback is registered (it receives every event) and `SFU_ERR_IN_CALLBACK` from inside
/// a callback. A poll in progress delays a callback registration until it returns.
///
/// # Safety
/// `node` is NULL or a live node; `event` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn sfu_node_next_event(
    node: *const SfuNode,
    timeout_ms: u32,
    event: *mut SfuEvent,
) -> SfuStatus {
    boundary(|| {
        // SAFETY: per the contract.
        let n = unsafe { node_ref(node)? };
        not_null(event, "event")?;
        refuse_in_callback("sfu_node_next_event")?;
        let registered = n.dispatch.lock();
        if registered.is_some() {
            return Err(Fail::new(
                SfuStatus::SFU_ERR_CALLBACK_REGISTERED,
                "an event callback is registered and receives every event; remove it with sfu_node_set_event_callback(node, NULL, NULL, NULL) to poll",
            ));
        }
        let e =
            match n
                .events
                .recv_timeout(Duration::from_millis(u64::from(timeout_ms)))
            {
                Ok(e) => e,
                Err(RecvTimeoutError::Timeout) => {
                    return Err(Fail::new(
                        SfuStatus::SFU_ERR_TIMEOUT,
                        format!("no event within {timeout_ms} ms"),
                    ))
                }
                Err(RecvTimeoutError::Disconnected) => return Err(Fail::new(
                    SfuStatus::SFU_ERR_CLOSED,
                    "the event stream has ended: the node stopped and its last event was delivered",
                )),
            };
        drop(registered);
        let out = SfuEvent::from_event(&e, n.node.instance_id());
        // SAFETY: checked non-NULL; valid for writes per the contract.
        unsafe { event.write(out) };
        Ok(())
    })
}

/// Registers `callback` to receive every event of the node, replacing the previous one (whose
/// finalizer then runs), or removes the current one when `callback` is NULL (`user_data` and
/// `finalizer` are then ignored).
///
/// **Which thread.** The callback runs on a thread the library starts for this registration
/// (named `sfu-ffi-events`), one event at a time, in order; never on the caller's thread.
/// `event` is borrowed for the call only: copy what you need.
///
/// **Rules.** The callback must return quickly and must not block (it holds up the events
/// after it, and `sfu_node_free` waits for it); it must not throw a C++ exception or
/// `longjmp` out (catch everything inside): an exception reaching the library's frame aborts
/// the process (Rust does not unwind foreign exceptions through `extern "C"`). It may call the node's other functions (pin,
/// upsert, stats, ...), but `sfu_node_free`, `sfu_node_stop`, `sfu_node_leave`,
/// `sfu_node_set_event_callback` and `sfu_node_next_event` (on any node) are refused there with
/// `SFU_ERR_IN_CALLBACK` instead of deadlocking: ask another thread to do it.
///
/// **Polling.** While a callback is registered, `sfu_node_next_event` fails with
/// `SFU_ERR_CALLBACK_REGISTERED`; events the callback did not take stay queued for polling
/// after it is removed.
///
/// **Finalizer.** If this call returns `SFU_OK`, `finalizer` (may be NULL) is called exactly once
/// with `user_data`, on the event thread, after the last call of the callback: when the callback
/// is replaced or removed, when the stream ends (after `SFU_EVENT_STOPPED`), or at
/// `sfu_node_free` at the latest. If the call fails, neither is ever called, `user_data`
/// stays yours and the previous registration (if any) stays in place. `user_data` must be
/// usable from the event thread.
///
/// `sfu_node_free` delivers the events still queued (ending with `SFU_EVENT_STOPPED`) before it
/// returns; removing or replacing a callback stops its thread after the event in progress (a
/// replacement receives the events after it, in order).
///
/// # Safety
/// `node` is NULL or a live node; `callback` and `finalizer` are NULL or functions safe to call
/// from another thread with `user_data`.
#[no_mangle]
pub unsafe extern "C" fn sfu_node_set_event_callback(
    node: *const SfuNode,
    callback: SfuEventCallback,
    user_data: *mut c_void,
    finalizer: SfuFinalizer,
) -> SfuStatus {
    boundary(|| {
        // SAFETY: per the contract.
        let n = unsafe { node_ref(node)? };
        refuse_in_callback("sfu_node_set_event_callback")?;
        let mut slot = n.dispatch.lock();
        let Some(callback) = callback else {
            if let Some(t) = slot.take() {
                t.stop();
            }
            return Ok(());
        };
        let cb = ForeignCallback {
            callback,
            user_data,
            finalizer,
            armed: false,
        };
        // The new thread gets the callback only once it is running and the old one has
        // stopped, so a failed spawn keeps it here, unarmed (its finalizer never runs), and
        // leaves the previous registration in place.
        let (hand_tx, hand_rx) = bounded::<ForeignCallback>(1);
        let (stop_tx, stop_rx) = bounded::<()>(0);
        let events = n.events.clone();
        let instance = n.node.instance_id().to_owned();
        // Like the library's own threads, it blocks the asynchronous signals for its life: the
        // host's handlers run on the host's threads, never in the middle of a callback.
        let handle = sfu_redis::signals::spawn(
            std::thread::Builder::new().name("sfu-ffi-events".into()),
            move || {
                if let Ok(cb) = hand_rx.recv() {
                    dispatch(cb, &events, &stop_rx, &instance);
                }
            },
        )
        .map_err(|e| Error::Io {
            op: "spawn the event callback thread".into(),
            source: e,
        })?;
        // The old thread finishes its event in progress before the new one starts: events
        // keep their order across a replacement.
        if let Some(old) = slot.take() {
            old.stop();
        }
        let mut cb = cb;
        cb.armed = true;
        if let Err(e) = hand_tx.send(cb) {
            // The thread cannot have exited before receiving; never run a finalizer twice.
            let mut cb = e.into_inner();
            cb.armed = false;
            join(handle);
            return Err(Fail::new(
                SfuStatus::SFU_ERR_IO,
                "the event callback thread exited before it started",
            ));
        }
        *slot = Some(EventThread {
            stop: stop_tx,
            handle,
        });
        Ok(())
    })
}

/// Stops the node if it is still running (as `sfu_node_stop`), lets a registered callback
/// receive the events still queued (ending with `SFU_EVENT_STOPPED`) and its finalizer run,
/// then releases the node. NULL is a no-op (`SFU_OK`). No other call may be in progress on the
/// node or made after.
///
/// From inside an event callback or finalizer this returns `SFU_ERR_IN_CALLBACK` and frees
/// nothing (it would wait for its own thread): free the node from another thread.
///
/// # Safety
/// `node` is NULL or a node from `sfu_node_start` not freed yet, with no call in progress.
#[no_mangle]
pub unsafe extern "C" fn sfu_node_free(node: *mut SfuNode) -> SfuStatus {
    boundary(|| {
        if node.is_null() {
            return Ok(());
        }
        refuse_in_callback("sfu_node_free")?;
        // SAFETY: allocated by `sfu_node_start` and not freed yet, per the contract.
        let n = unsafe { Box::from_raw(node) };
        let stopped = n.node.shutdown();
        if let Some(t) = n.dispatch.lock().take() {
            t.drain();
        }
        drop(n);
        stopped.map_err(Fail::from)
    })
}
