//! Status codes, the thread-local last error, the panic boundary and argument checks.

use std::cell::{Cell, RefCell};
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use sfu_redis::{Error, ErrorKind};

/// The result of every fallible C call. The numbers are stable: a code is never renumbered or
/// reused, and new codes get new numbers.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum SfuStatus {
    /// Success.
    SFU_OK = 0,
    /// A required pointer argument was NULL (the message names it).
    SFU_ERR_NULL = 1,
    /// A string argument is not valid UTF-8.
    SFU_ERR_UTF8 = 2,
    /// A room, peer, guest or instance id is empty, longer than 256 bytes or holds a control
    /// character.
    SFU_ERR_INVALID_ID = 3,
    /// A configuration value is malformed or contradicts another one (the message names the
    /// field).
    SFU_ERR_INVALID_CONFIG = 4,
    /// Another argument is unusable: an unknown configuration key, a reserved, empty or
    /// control-character peer field name, more than 64 peer fields.
    SFU_ERR_INVALID_ARGUMENT = 5,
    /// Redis could not be reached, timed out, or answered with an error.
    SFU_ERR_REDIS = 6,
    /// Redis answered with data this library did not write (a key of the wrong type, a
    /// malformed record).
    SFU_ERR_BAD_DATA = 7,
    /// The room (or peer record) belongs to another instance, or to nobody.
    SFU_ERR_NOT_OWNER = 8,
    /// The operation needs the reaper lease and this node does not hold it.
    SFU_ERR_NOT_LEADER = 9,
    /// The node was stopped (`sfu_node_stop` / `sfu_node_leave`); start a new one.
    SFU_ERR_STOPPED = 10,
    /// A local resource could not be set up (for example a thread could not be spawned).
    SFU_ERR_IO = 11,
    /// `sfu_node_next_event`: no event arrived within the timeout. Not a failure; poll again.
    SFU_ERR_TIMEOUT = 12,
    /// `sfu_node_next_event`: the event stream has ended (the `SFU_EVENT_STOPPED` event was
    /// delivered); no event will follow.
    SFU_ERR_CLOSED = 13,
    /// `sfu_node_next_event` was called while an event callback is registered: the callback
    /// receives every event.
    SFU_ERR_CALLBACK_REGISTERED = 14,
    /// Refused because the call was made from inside an event callback (or its finalizer), where
    /// it could deadlock: `sfu_node_free`, `sfu_node_stop`, `sfu_node_leave`,
    /// `sfu_node_set_event_callback` and `sfu_node_next_event`. Nothing was done.
    SFU_ERR_IN_CALLBACK = 15,
    /// The library panicked (a bug): the call did nothing observable, or its effect is unknown
    /// if it was a Redis write. The message holds the panic's text.
    SFU_ERR_PANIC = 16,
    /// The prefix is laid out in a key schema version this release does not speak (the
    /// message names both versions): `sfu_node_start` (nothing was written), or a write of a
    /// node parked after its re-registration was refused (docs/src/ops/schema.md "Key schema versions").
    SFU_ERR_SCHEMA = 17,
}

impl SfuStatus {
    /// The code's name, as in the header (`"SFU_ERR_REDIS"`).
    pub(crate) fn name(self) -> &'static CStr {
        match self {
            SfuStatus::SFU_OK => c"SFU_OK",
            SfuStatus::SFU_ERR_NULL => c"SFU_ERR_NULL",
            SfuStatus::SFU_ERR_UTF8 => c"SFU_ERR_UTF8",
            SfuStatus::SFU_ERR_INVALID_ID => c"SFU_ERR_INVALID_ID",
            SfuStatus::SFU_ERR_INVALID_CONFIG => c"SFU_ERR_INVALID_CONFIG",
            SfuStatus::SFU_ERR_INVALID_ARGUMENT => c"SFU_ERR_INVALID_ARGUMENT",
            SfuStatus::SFU_ERR_REDIS => c"SFU_ERR_REDIS",
            SfuStatus::SFU_ERR_BAD_DATA => c"SFU_ERR_BAD_DATA",
            SfuStatus::SFU_ERR_NOT_OWNER => c"SFU_ERR_NOT_OWNER",
            SfuStatus::SFU_ERR_NOT_LEADER => c"SFU_ERR_NOT_LEADER",
            SfuStatus::SFU_ERR_STOPPED => c"SFU_ERR_STOPPED",
            SfuStatus::SFU_ERR_IO => c"SFU_ERR_IO",
            SfuStatus::SFU_ERR_TIMEOUT => c"SFU_ERR_TIMEOUT",
            SfuStatus::SFU_ERR_CLOSED => c"SFU_ERR_CLOSED",
            SfuStatus::SFU_ERR_CALLBACK_REGISTERED => c"SFU_ERR_CALLBACK_REGISTERED",
            SfuStatus::SFU_ERR_IN_CALLBACK => c"SFU_ERR_IN_CALLBACK",
            SfuStatus::SFU_ERR_PANIC => c"SFU_ERR_PANIC",
            SfuStatus::SFU_ERR_SCHEMA => c"SFU_ERR_SCHEMA",
        }
    }

    const ALL: [SfuStatus; 18] = [
        SfuStatus::SFU_OK,
        SfuStatus::SFU_ERR_NULL,
        SfuStatus::SFU_ERR_UTF8,
        SfuStatus::SFU_ERR_INVALID_ID,
        SfuStatus::SFU_ERR_INVALID_CONFIG,
        SfuStatus::SFU_ERR_INVALID_ARGUMENT,
        SfuStatus::SFU_ERR_REDIS,
        SfuStatus::SFU_ERR_BAD_DATA,
        SfuStatus::SFU_ERR_NOT_OWNER,
        SfuStatus::SFU_ERR_NOT_LEADER,
        SfuStatus::SFU_ERR_STOPPED,
        SfuStatus::SFU_ERR_IO,
        SfuStatus::SFU_ERR_TIMEOUT,
        SfuStatus::SFU_ERR_CLOSED,
        SfuStatus::SFU_ERR_CALLBACK_REGISTERED,
        SfuStatus::SFU_ERR_IN_CALLBACK,
        SfuStatus::SFU_ERR_PANIC,
        SfuStatus::SFU_ERR_SCHEMA,
    ];

    fn from_u32(code: u32) -> Option<SfuStatus> {
        SfuStatus::ALL.iter().copied().find(|s| *s as u32 == code)
    }
}

/// The status of a library error: one code per `ErrorKind`.
pub(crate) fn status_of(kind: ErrorKind) -> SfuStatus {
    match kind {
        ErrorKind::InvalidId => SfuStatus::SFU_ERR_INVALID_ID,
        ErrorKind::InvalidConfig => SfuStatus::SFU_ERR_INVALID_CONFIG,
        ErrorKind::InvalidArgument => SfuStatus::SFU_ERR_INVALID_ARGUMENT,
        ErrorKind::Redis => SfuStatus::SFU_ERR_REDIS,
        ErrorKind::BadData => SfuStatus::SFU_ERR_BAD_DATA,
        ErrorKind::NotOwner => SfuStatus::SFU_ERR_NOT_OWNER,
        ErrorKind::Stopped => SfuStatus::SFU_ERR_STOPPED,
        ErrorKind::NotLeader => SfuStatus::SFU_ERR_NOT_LEADER,
        ErrorKind::Io => SfuStatus::SFU_ERR_IO,
        ErrorKind::Schema => SfuStatus::SFU_ERR_SCHEMA,
        // `ErrorKind` is non-exhaustive: a kind without its own code yet is a bug of this
        // layer (every kind gets a new, never reused number), reported as such.
        _ => SfuStatus::SFU_ERR_PANIC,
    }
}

/// A failed C call: its status and the message `sfu_last_error_message` returns.
#[derive(Debug)]
pub(crate) struct Fail {
    pub(crate) status: SfuStatus,
    pub(crate) message: String,
}

impl Fail {
    pub(crate) fn new(status: SfuStatus, message: impl Into<String>) -> Fail {
        Fail {
            status,
            message: message.into(),
        }
    }
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        Fail::new(status_of(e.kind()), e.to_string())
    }
}

thread_local! {
    static LAST_ERROR: RefCell<(SfuStatus, CString)> =
        RefCell::new((SfuStatus::SFU_OK, CString::default()));
    /// True on the event thread while it runs a user callback or finalizer.
    static IN_CALLBACK: Cell<bool> = const { Cell::new(false) };
}

/// A C string from `s`, with any NUL byte written as `\0` (error texts may quote anything).
pub(crate) fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', "\\0")).unwrap_or_default()
}

/// `s` as a string the caller owns (release with `sfu_string_free`).
pub(crate) fn owned_c_string(s: &str) -> *mut c_char {
    c_string(s).into_raw()
}

fn set_last(status: SfuStatus, message: &str) {
    // During thread teardown the slot may be gone; the status still reaches the caller.
    let _ = LAST_ERROR.try_with(|slot| {
        if let Ok(mut slot) = slot.try_borrow_mut() {
            *slot = (status, c_string(message));
        }
    });
}

/// Runs `f` inside the panic boundary, records the outcome as the thread's last error and
/// returns its status.
pub(crate) fn boundary<F>(f: F) -> SfuStatus
where
    F: FnOnce() -> Result<(), Fail>,
{
    let outcome = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => Err(Fail::new(
            SfuStatus::SFU_ERR_PANIC,
            format!("sfu-redis panicked: {}", panic_text(&*payload)),
        )),
    };
    match outcome {
        Ok(()) => {
            set_last(SfuStatus::SFU_OK, "");
            SfuStatus::SFU_OK
        }
        Err(fail) => {
            set_last(fail.status, &fail.message);
            fail.status
        }
    }
}

/// Runs `f` inside the panic boundary for a function that returns nothing (`_free`, `_clear`):
/// a panic is swallowed (and printed by the panic hook), the last error is left alone.
pub(crate) fn boundary_void<F: FnOnce()>(f: F) {
    let _ = catch_unwind(AssertUnwindSafe(f));
}

pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".to_owned()
    }
}

pub(crate) fn in_callback() -> bool {
    IN_CALLBACK.try_with(Cell::get).unwrap_or(false)
}

/// Marks the current thread as running a user callback while `f` runs.
pub(crate) fn as_callback<R>(f: impl FnOnce() -> R) -> R {
    let _ = IN_CALLBACK.try_with(|c| c.set(true));
    let r = f();
    let _ = IN_CALLBACK.try_with(|c| c.set(false));
    r
}

/// Refuses a call made from inside an event callback.
pub(crate) fn refuse_in_callback(what: &str) -> Result<(), Fail> {
    if in_callback() {
        return Err(Fail::new(
            SfuStatus::SFU_ERR_IN_CALLBACK,
            format!("{what} cannot be called from inside an event callback or finalizer (it could deadlock); call it from another thread"),
        ));
    }
    Ok(())
}

/// Fails with `SFU_ERR_NULL` when `p` is NULL.
pub(crate) fn not_null<T>(p: *const T, name: &str) -> Result<(), Fail> {
    if p.is_null() {
        Err(Fail::new(
            SfuStatus::SFU_ERR_NULL,
            format!("argument `{name}` is NULL"),
        ))
    } else {
        Ok(())
    }
}

/// The UTF-8 string at `p`, borrowed for the call.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that outlives the call.
pub(crate) unsafe fn arg_str<'a>(p: *const c_char, name: &str) -> Result<&'a str, Fail> {
    not_null(p, name)?;
    // SAFETY: non-NULL and NUL-terminated per the caller's contract.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map_err(|e| {
        Fail::new(
            SfuStatus::SFU_ERR_UTF8,
            format!(
                "argument `{name}` is not valid UTF-8 (at byte {})",
                e.valid_up_to()
            ),
        )
    })
}

/// Like [`arg_str`], with NULL meaning `None`.
///
/// # Safety
/// As [`arg_str`].
pub(crate) unsafe fn arg_opt_str<'a>(
    p: *const c_char,
    name: &str,
) -> Result<Option<&'a str>, Fail> {
    if p.is_null() {
        Ok(None)
    } else {
        // SAFETY: forwarded contract.
        unsafe { arg_str(p, name) }.map(Some)
    }
}

/// Writes `v` to the optional out-parameter `p` (nothing when NULL).
///
/// # Safety
/// `p` is NULL or valid for a write of `T`.
pub(crate) unsafe fn write_opt<T>(p: *mut T, v: T) {
    if !p.is_null() {
        // SAFETY: valid for writes per the caller's contract.
        unsafe { p.write(v) };
    }
}

/// Frees a string returned by this library in an out-parameter (`out_owner`,
/// `out_instance_id`, `out_replaced`, ...). NULL is a no-op. Never pass a string from
/// anywhere else, nor the strings inside an `SfuEvent` or `SfuStats` (use `sfu_event_clear` /
/// `sfu_stats_clear`), nor the ones `sfu_last_error_message`, `sfu_status_name` or
/// `sfu_version` return.
///
/// # Safety
/// `s` is NULL or a string this library returned and that was not freed yet.
#[no_mangle]
pub unsafe extern "C" fn sfu_string_free(s: *mut c_char) {
    boundary_void(|| {
        if !s.is_null() {
            // SAFETY: allocated by `CString::into_raw` in this library, per the contract.
            drop(unsafe { CString::from_raw(s) });
        }
    });
}

/// The message of the last status-returning call made on this thread: empty after `SFU_OK`,
/// otherwise a sentence for people (it never contains a Redis password). Owned by the library:
/// valid until the next status-returning call on this thread; copy it to keep it. Never NULL.
#[no_mangle]
pub extern "C" fn sfu_last_error_message() -> *const c_char {
    catch_unwind(|| {
        LAST_ERROR
            .try_with(|slot| {
                // The CString lives in the thread-local until the next status-returning call.
                slot.try_borrow().map(|s| s.1.as_ptr()).ok()
            })
            .ok()
            .flatten()
    })
    .ok()
    .flatten()
    .unwrap_or(c"".as_ptr())
}

/// The status of the last status-returning call made on this thread (`SFU_OK` if none).
#[no_mangle]
pub extern "C" fn sfu_last_error_status() -> SfuStatus {
    catch_unwind(|| {
        LAST_ERROR
            .try_with(|slot| slot.try_borrow().map(|s| s.0).unwrap_or(SfuStatus::SFU_OK))
            .unwrap_or(SfuStatus::SFU_OK)
    })
    .unwrap_or(SfuStatus::SFU_ERR_PANIC)
}

/// The name of a status code (`"SFU_ERR_REDIS"`), or `"SFU_ERR_UNKNOWN"` for a number this
/// version does not know. A static string: do not free it.
#[no_mangle]
pub extern "C" fn sfu_status_name(status: u32) -> *const c_char {
    catch_unwind(|| match SfuStatus::from_u32(status) {
        Some(s) => s.name().as_ptr(),
        None => c"SFU_ERR_UNKNOWN".as_ptr(),
    })
    .unwrap_or(c"SFU_ERR_UNKNOWN".as_ptr())
}

/// The library's version (`"0.1.0"`). A static string: do not free it.
#[no_mangle]
pub extern "C" fn sfu_version() -> *const c_char {
    const VERSION: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(v) => v,
            Err(_) => c"unknown",
        };
    // A constant: nothing here can panic, but every extern "C" body sits in the boundary.
    catch_unwind(|| VERSION.as_ptr()).unwrap_or(c"unknown".as_ptr())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_own_code_and_names_match() {
        for s in SfuStatus::ALL {
            assert_eq!(SfuStatus::from_u32(s as u32), Some(s));
            assert_eq!(s.name().to_str().unwrap(), format!("{s:?}"));
        }
        assert_eq!(SfuStatus::from_u32(9999), None);
        // Never renumber: these are the published values.
        assert_eq!(SfuStatus::SFU_ERR_NULL as u32, 1);
        assert_eq!(SfuStatus::SFU_ERR_PANIC as u32, 16);
    }

    #[test]
    fn panics_become_a_status_and_a_message() {
        let st = boundary(|| panic!("boom"));
        assert_eq!(st, SfuStatus::SFU_ERR_PANIC);
        assert_eq!(sfu_last_error_status(), SfuStatus::SFU_ERR_PANIC);
        // SAFETY: the library's own NUL-terminated string.
        let msg = unsafe { CStr::from_ptr(sfu_last_error_message()) };
        assert!(msg.to_str().unwrap().contains("boom"));
        assert_eq!(boundary(|| Ok(())), SfuStatus::SFU_OK);
        // SAFETY: as above.
        let msg = unsafe { CStr::from_ptr(sfu_last_error_message()) };
        assert!(msg.to_bytes().is_empty());
    }
}
