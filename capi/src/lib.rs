//! The C ABI: `libsfu_redis.so` / `libsfu_redis.a` with the header `include/sfu_redis.h`
//! (generated from this module by cbindgen; `tests/ffi_header.rs` fails when it is stale) and
//! the header-only C++17 wrapper `include/sfu_redis.hpp`.
//!
//! # Conventions
//!
//! - Names are `sfu_<type>_<verb>`; every type is `Sfu<Type>`. Opaque handles (`SfuConfig`,
//!   `SfuNode`) come from a `_new`/`_start` function and go back to their `_free` function;
//!   `_free(NULL)` is a no-op.
//! - Every function that can fail returns an `SfuStatus`: `SFU_OK` (0) or a numbered error code.
//!   Codes are stable and never reused or renumbered; new ones get new numbers.
//! - Each such call also sets the calling thread's **last error**: `sfu_last_error_message()`
//!   returns its text (empty after `SFU_OK`) and `sfu_last_error_status()` its code.
//! - A `NULL` where a pointer is required fails with `SFU_ERR_NULL`, naming the argument;
//!   arguments documented as "may be NULL" are optional. Strings are NUL-terminated UTF-8
//!   (`SFU_ERR_UTF8` otherwise).
//! - **Out-parameters are written only on `SFU_OK`**; on an error they are left untouched.
//! - Every `extern "C"` body runs inside `std::panic::catch_unwind`: a panic in the library
//!   becomes `SFU_ERR_PANIC`, never an unwind into C.
//!
//! # String ownership
//!
//! - `const char *` arguments are **borrowed** for the duration of the call only.
//! - `char *` written to an out-parameter (`out_owner`, `out_instance_id`, ...) is **owned by
//!   the caller**: release it with `sfu_string_free` (not `free`).
//! - Strings inside an `SfuEvent` or `SfuStats` are owned by that struct: release them all with
//!   `sfu_event_clear` / `sfu_stats_clear`. An event passed to a callback is borrowed for the
//!   call only (the library clears it afterwards).
//! - `sfu_last_error_message`, `sfu_status_name` and `sfu_version` return strings owned by the
//!   library: do not free them. The last-error text stays valid until the next call of a
//!   status-returning function on the same thread.
//!
//! # Events
//!
//! A node's events (`Event` in Rust) reach C either by **polling** with
//! `sfu_node_next_event` or through a **callback** registered with
//! `sfu_node_set_event_callback`, never both: while a callback is registered,
//! `sfu_node_next_event` fails with `SFU_ERR_CALLBACK_REGISTERED`, so no event is taken by a
//! poller the callback then misses. See [`sfu_node_set_event_callback`] for the callback's
//! thread and rules.
//!
//! # Threads
//!
//! An `SfuNode *` may be used from any number of threads at once, except `sfu_node_free`,
//! which must be the last call on it. An `SfuConfig *` is internally locked as well.

mod config;
mod error;
mod event;
mod node;

pub use config::*;
pub use error::*;
pub use event::*;
pub use node::*;
