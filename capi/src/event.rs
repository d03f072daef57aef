//! `SfuEvent`: a node's events as a C struct, and the event thread that runs a host callback.

use std::ffi::{c_char, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use crossbeam_channel::{select, Receiver};

use crate::error::{as_callback, boundary_void, c_string, panic_text};
use sfu_redis::{Event, LeaderLostReason};

/// What an `SfuEvent` reports. Numbers are stable and never reused.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum SfuEventKind {
    /// No event: a zeroed or cleared `SfuEvent`.
    SFU_EVENT_NONE = 0,
    /// `sfu_node_ready` was called: `rooms` and `peers` are the counts held then.
    SFU_EVENT_READY = 1,
    /// This node holds the reaper lease: `epoch` is the term's fencing token.
    SFU_EVENT_LEADER_ACQUIRED = 2,
    /// This node stopped being the leader: `reason` says why.
    SFU_EVENT_LEADER_LOST = 3,
    /// The leader found instances with stale heartbeats (not yet reaped): their ids are in
    /// `ids` / `ids_len`.
    SFU_EVENT_CANDIDATES = 4,
    /// A dead instance was reaped: `instance` is its id; `rooms`, `peers` and `skipped_rooms`
    /// what was removed (or left to the instance that took a room over).
    SFU_EVENT_INSTANCE_REAPED = 5,
    /// A room this node owned is no longer its own: `room`, and `new_owner` (NULL if none).
    /// Tear its media down.
    SFU_EVENT_ROOM_LOST = 6,
    /// This node found it had been reaped while unresponsive: every room it held is lost
    /// (`rooms` = count, `ids` / `ids_len` = the room ids); it registered again as a new
    /// instance.
    SFU_EVENT_REAPED_SELF = 7,
    /// The node stopped. It is the last event: the stream ends after it.
    SFU_EVENT_STOPPED = 8,
}

/// Why a node stopped being the leader (`SFU_EVENT_LEADER_LOST`). Numbers are stable.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum SfuLeaderLostReason {
    /// Not a `SFU_EVENT_LEADER_LOST` event.
    SFU_LEADER_LOST_NONE = 0,
    /// A lease refresh failed (Redis error or timeout).
    SFU_LEADER_LOST_REFRESH_FAILED = 1,
    /// The local deadline passed before a refresh confirmed the lease.
    SFU_LEADER_LOST_DEADLINE_PASSED = 2,
    /// The lease holds another instance's id.
    SFU_LEADER_LOST_LEASE_TAKEN = 3,
    /// The node shut down and released the lease.
    SFU_LEADER_LOST_SHUTDOWN = 4,
}

/// One event. Filled by `sfu_node_next_event` (the caller then owns its strings and releases
/// them with `sfu_event_clear`) or lent to a callback (valid during the call only; the library
/// clears it afterwards).
///
/// Fields that do not apply to `kind` are 0 / NULL. Every string is NUL-terminated UTF-8; ids are
/// the callers' ids (not the Redis wire form). Do not modify the pointers or `ids_len` before
/// `sfu_event_clear`. Initialise a struct with `SfuEvent ev = {0};` (C) or
/// `SfuEvent ev{};` (C++).
#[repr(C)]
#[derive(Debug)]
pub struct SfuEvent {
    /// What happened.
    pub kind: SfuEventKind,
    /// `SFU_EVENT_LEADER_ACQUIRED`: the term's epoch (strictly increasing per prefix).
    pub epoch: u64,
    /// `SFU_EVENT_LEADER_LOST`: why.
    pub reason: SfuLeaderLostReason,
    /// `SFU_EVENT_READY`: rooms held; `SFU_EVENT_INSTANCE_REAPED`: rooms deleted;
    /// `SFU_EVENT_REAPED_SELF`: rooms lost.
    pub rooms: u64,
    /// `SFU_EVENT_READY`: peers held; `SFU_EVENT_INSTANCE_REAPED`: peer records deleted.
    pub peers: u64,
    /// `SFU_EVENT_INSTANCE_REAPED`: rooms of the dead instance that another instance had taken
    /// over (left alone).
    pub skipped_rooms: u64,
    /// `SFU_EVENT_INSTANCE_REAPED`: the dead instance's id.
    pub instance: *mut c_char,
    /// `SFU_EVENT_ROOM_LOST`: the room.
    pub room: *mut c_char,
    /// `SFU_EVENT_ROOM_LOST`: the room's owner now, or NULL if none.
    pub new_owner: *mut c_char,
    /// `SFU_EVENT_CANDIDATES`: instance ids; `SFU_EVENT_REAPED_SELF`: room ids. `ids_len`
    /// entries, none NULL.
    pub ids: *mut *mut c_char,
    /// The number of entries of `ids`.
    pub ids_len: usize,
    /// Every event: the JSON object `sfu-redis node --json` prints, on one line
    /// (`{"event":"room_lost","instance":"<this node>","room":"r1","new_owner":null}`).
    pub json: *mut c_char,
}

impl SfuEvent {
    /// An event with no content (`SFU_EVENT_NONE`).
    pub(crate) fn empty() -> SfuEvent {
        SfuEvent {
            kind: SfuEventKind::SFU_EVENT_NONE,
            epoch: 0,
            reason: SfuLeaderLostReason::SFU_LEADER_LOST_NONE,
            rooms: 0,
            peers: 0,
            skipped_rooms: 0,
            instance: ptr::null_mut(),
            room: ptr::null_mut(),
            new_owner: ptr::null_mut(),
            ids: ptr::null_mut(),
            ids_len: 0,
            json: ptr::null_mut(),
        }
    }

    /// `e` as C data; `instance` is this node's id (for the JSON).
    pub(crate) fn from_event(e: &Event, instance: &str) -> SfuEvent {
        let own = |s: &str| c_string(s).into_raw();
        let list = |ids: &[String]| -> (*mut *mut c_char, usize) {
            if ids.is_empty() {
                return (ptr::null_mut(), 0);
            }
            let v: Box<[*mut c_char]> = ids.iter().map(|s| own(s)).collect();
            let len = v.len();
            (Box::into_raw(v).cast::<*mut c_char>(), len)
        };
        let mut out = SfuEvent::empty();
        match e {
            Event::Ready { rooms, peers, .. } => {
                out.kind = SfuEventKind::SFU_EVENT_READY;
                out.rooms = *rooms as u64;
                out.peers = *peers as u64;
            }
            Event::LeaderAcquired { epoch } => {
                out.kind = SfuEventKind::SFU_EVENT_LEADER_ACQUIRED;
                out.epoch = *epoch;
            }
            Event::LeaderLost { reason } => {
                out.kind = SfuEventKind::SFU_EVENT_LEADER_LOST;
                out.reason = match reason {
                    LeaderLostReason::RefreshFailed => {
                        SfuLeaderLostReason::SFU_LEADER_LOST_REFRESH_FAILED
                    }
                    LeaderLostReason::DeadlinePassed => {
                        SfuLeaderLostReason::SFU_LEADER_LOST_DEADLINE_PASSED
                    }
                    LeaderLostReason::LeaseTaken => {
                        SfuLeaderLostReason::SFU_LEADER_LOST_LEASE_TAKEN
                    }
                    LeaderLostReason::Shutdown => SfuLeaderLostReason::SFU_LEADER_LOST_SHUTDOWN,
                };
            }
            Event::Candidates { instances } => {
                out.kind = SfuEventKind::SFU_EVENT_CANDIDATES;
                (out.ids, out.ids_len) = list(instances);
            }
            Event::InstanceReaped {
                dead,
                rooms,
                peers,
                skipped_rooms,
                // A node's reap is never forced (`forced` is in `json`).
                ..
            } => {
                out.kind = SfuEventKind::SFU_EVENT_INSTANCE_REAPED;
                out.instance = own(dead);
                out.rooms = *rooms;
                out.peers = *peers;
                out.skipped_rooms = *skipped_rooms;
            }
            Event::RoomLost { room, new_owner } => {
                out.kind = SfuEventKind::SFU_EVENT_ROOM_LOST;
                out.room = own(room);
                out.new_owner = new_owner.as_deref().map_or(ptr::null_mut(), own);
            }
            Event::ReapedSelf { rooms, room_ids } => {
                out.kind = SfuEventKind::SFU_EVENT_REAPED_SELF;
                out.rooms = *rooms as u64;
                (out.ids, out.ids_len) = list(room_ids);
            }
            Event::Stopped => out.kind = SfuEventKind::SFU_EVENT_STOPPED,
            // An event kind newer than this C layer: SFU_EVENT_NONE with its JSON.
            _ => {}
        }
        out.json = own(&e.to_json(instance).to_string());
        out
    }
}

/// Frees what `event` owns and zeroes it (`kind` becomes `SFU_EVENT_NONE`).
///
/// # Safety
/// `event` is NULL or points to an `SfuEvent` that is zeroed or was filled by this library.
pub(crate) unsafe fn clear(event: *mut SfuEvent) {
    if event.is_null() {
        return;
    }
    // Only the pointer fields are read (through raw places, never a reference to the whole
    // struct): a `kind` or `reason` a C caller scribbled on is never looked at.
    // SAFETY: `event` is valid per the contract; each pointer is NULL or ours.
    unsafe {
        let free = |p: *mut c_char| {
            if !p.is_null() {
                drop(CString::from_raw(p));
            }
        };
        free(ptr::addr_of!((*event).instance).read());
        free(ptr::addr_of!((*event).room).read());
        free(ptr::addr_of!((*event).new_owner).read());
        free(ptr::addr_of!((*event).json).read());
        let ids = ptr::addr_of!((*event).ids).read();
        let len = ptr::addr_of!((*event).ids_len).read();
        if !ids.is_null() {
            let all = Box::from_raw(ptr::slice_from_raw_parts_mut(ids, len));
            for p in all.iter() {
                free(*p);
            }
        }
        event.write(SfuEvent::empty());
    }
}

/// Releases every string `event` owns and zeroes it (`kind` = `SFU_EVENT_NONE`), so it can be
/// filled again. NULL and an already cleared or zero-initialised event are no-ops. Only for
/// events filled by `sfu_node_next_event` (never for the one a callback receives).
///
/// # Safety
/// `event` is NULL or points to an `SfuEvent` that is zeroed or was filled by this library and
/// not modified since.
#[no_mangle]
pub unsafe extern "C" fn sfu_event_clear(event: *mut SfuEvent) {
    // SAFETY: forwarded contract.
    boundary_void(|| unsafe { clear(event) });
}

/// Called by the library's event thread for each event: `user_data` as registered, `event`
/// borrowed for the call only. Must return quickly, must not block, and must not let a C++
/// exception (or a longjmp) escape: that aborts the process.
pub type SfuEventCallback =
    Option<unsafe extern "C" fn(user_data: *mut c_void, event: *const SfuEvent)>;

/// Called once with `user_data` when a registered callback will not be called again.
pub type SfuFinalizer = Option<unsafe extern "C" fn(user_data: *mut c_void)>;

/// A host callback with its data and finalizer (wasmtime c-api style): moved to the event
/// thread, whose exit drops it and so runs the finalizer.
#[derive(Debug)]
pub(crate) struct ForeignCallback {
    pub(crate) callback: unsafe extern "C" fn(*mut c_void, *const SfuEvent),
    pub(crate) user_data: *mut c_void,
    pub(crate) finalizer: SfuFinalizer,
    /// False until the registration succeeded: a failed registration never runs the finalizer.
    pub(crate) armed: bool,
}

// SAFETY: the registration contract requires `user_data` and both functions to be usable from
// the library's event thread; they are only ever used from one thread at a time.
unsafe impl Send for ForeignCallback {}

impl ForeignCallback {
    fn call(&self, e: &Event, instance: &str) {
        let mut ev = SfuEvent::from_event(e, instance);
        let (cb, data) = (self.callback, self.user_data);
        let r = as_callback(|| {
            // SAFETY: the host registered `cb` for this `user_data` and the event outlives the
            // call. C callbacks cannot unwind into Rust (documented); a Rust one that panics
            // is caught here.
            catch_unwind(AssertUnwindSafe(|| unsafe { cb(data, &ev) }))
        });
        if let Err(p) = r {
            log::error!("sfu-redis event callback panicked: {}", panic_text(&*p));
        }
        // SAFETY: filled by `from_event` just above.
        unsafe { clear(&mut ev) };
    }
}

impl Drop for ForeignCallback {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Some(fin) = self.finalizer {
            let data = self.user_data;
            // SAFETY: registered by the host for this `user_data`; run once.
            let r = as_callback(|| catch_unwind(AssertUnwindSafe(|| unsafe { fin(data) })));
            if let Err(p) = r {
                log::error!("sfu-redis event finalizer panicked: {}", panic_text(&*p));
            }
        }
    }
}

/// The event thread's loop: delivers every event until the stream ends (after `Stopped`) or
/// `stop` is dropped, then drops `cb` (running its finalizer).
pub(crate) fn dispatch(
    cb: ForeignCallback,
    events: &Receiver<Event>,
    stop: &Receiver<()>,
    instance: &str,
) {
    loop {
        select! {
            recv(stop) -> _ => break,
            recv(events) -> msg => match msg {
                Ok(e) => cb.call(&e, instance),
                Err(_) => break,
            },
        }
    }
    drop(cb);
}
