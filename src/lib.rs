//! # sfu-redis
//!
//! Keeps the Redis metadata of a multi-instance SFU (WebRTC media server, mediasoup-style)
//! alive and clean: per-instance heartbeats, one leader elected through a Redis lease, and a
//! reaper that removes what dead instances left behind without ever touching a live instance's
//! rooms. Synchronous and threaded: no async runtime.
//!
//! - [`Node`]: start one per SFU process from a [`Config`]; pin rooms, upsert and remove peers,
//!   read [`Event`]s and [`Stats`].
//! - [`keys`]: the key schema (prefix `<namespace>:<stage>:<branch>`, hash tags, id encoding).
//! - [`signals`]: threads that block the asynchronous signals, as the library's own do.
//! - `ops` (feature `unstable-ops`, not covered by semver): the building blocks of the
//!   `sfu-redis` operator commands: the fleet as Redis sees it (`status`), the consistency check
//!   (`audit`, `sfu-redis fsck`), an operator's reap (`reap`), the commands the library sends
//!   (`commands`, for `doctor`'s ACL check), the connection layer (`conn`), instance records
//!   (`info`), the key schema version (`schema`) and the one pager (`scan`). The CLI turns it
//!   on; a host never needs it.
//!
//! Without a Redis URL the node runs in memory-only mode (single instance, no threads);
//! [`Node::mode`] and [`Stats::mode`] tell which mode a node runs in.
//!
//! The rules each part protects are numbered in `docs/DESIGN.md` (invariants 1-6) and named in the
//! Lua scripts' headers (`lua/*.lua`).

#![deny(missing_docs)]
#![warn(missing_debug_implementations, unreachable_pub)]
// Without `unstable-ops` the operator modules are private: what only the CLI reaches is then
// unused or unreachable here, by design.
#![cfg_attr(
    not(feature = "unstable-ops"),
    allow(dead_code, unused_imports, unreachable_pub)
)]

// The operator modules: public (hidden here, documented as `ops`) with `unstable-ops`,
// private without it.
macro_rules! operator_modules {
    ($($m:ident),*) => {
        $(
            #[cfg(feature = "unstable-ops")]
            #[doc(hidden)]
            pub mod $m;
            #[cfg(not(feature = "unstable-ops"))]
            mod $m;
        )*
    };
}
operator_modules!(audit, commands, conn, info, reap, scan, schema, status);
mod cluster;
pub mod config;
mod dial;
mod endpoint;
mod error;
mod event;
mod heartbeat;
pub mod keys;
mod leader;
mod lease;
mod memory;
mod metrics;
mod node;
mod pause;
mod peers;
mod reaper;
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod replay;

/// The building blocks of the `sfu-redis` operator commands (`status`, `fsck`, `reap`,
/// `doctor`, `migrate`). Feature `unstable-ops`: the CLI turns it on; its API may change in
/// any release (semver covers the key schema and the CLI's output, not this module). A host
/// embedding the library needs none of it.
#[cfg(feature = "unstable-ops")]
pub mod ops {
    #[doc(inline)]
    pub use crate::audit;
    #[doc(inline)]
    pub use crate::commands;
    #[doc(inline)]
    pub use crate::conn;
    #[doc(inline)]
    pub use crate::info;
    #[doc(inline)]
    pub use crate::reap;
    #[doc(inline)]
    pub use crate::scan;
    #[doc(inline)]
    pub use crate::schema;
    #[doc(inline)]
    pub use crate::status;
}
mod rooms;
mod scripts;
mod sentinel;
mod shards;
pub mod signals;
mod state;
mod store;
mod tls;
mod worker;

pub use config::{
    redact_url, Config, ConfigBuilder, IntoRedisUrl, Mode, Timings, TlsOptions, MAX_REAP_BATCH,
    MAX_REAP_PACE, PACED_REAP_BATCH, REAP_PACE,
};
/// The receiver of [`Node::events`] (re-exported so a host that stores it needs no
/// `crossbeam-channel` dependency of its own).
pub use crossbeam_channel::Receiver;
pub use error::{Error, ErrorKind, Result};
pub use event::{EmittedEvent, Event, LeaderLostReason, EMITTED_HISTORY};
pub use keys::SCHEMA_VERSION;
pub use leader::TermRecord;
pub use metrics::{Health, MetricsFormat};
pub use node::{Node, Stats, EVENT_CAPACITY};
pub use peers::{Upserted, MAX_PEER_FIELDS, RESERVED_PEER_FIELDS};
pub use reaper::{ReapCounts, REAP_BATCH};
pub use rooms::PinOutcome;

/// Compiles the README's Rust examples as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// Compiles the Rust examples of the book (`docs/src/`) as doctests: every page with a
/// `rust` block is listed here (`tests/docs.rs` checks the list).
#[cfg(doctest)]
mod book_doctests {
    #[doc = include_str!("../docs/src/rust/index.md")]
    struct RustHost;
    #[doc = include_str!("../docs/src/rust/start.md")]
    struct Start;
    #[doc = include_str!("../docs/src/rust/rooms.md")]
    struct Rooms;
    #[doc = include_str!("../docs/src/rust/peers.md")]
    struct Peers;
    #[doc = include_str!("../docs/src/rust/events.md")]
    struct Events;
    #[doc = include_str!("../docs/src/rust/errors.md")]
    struct Errors;
    #[doc = include_str!("../docs/src/rust/observe.md")]
    struct Observe;
    #[doc = include_str!("../docs/src/deploy/tls.md")]
    struct Tls;
}
