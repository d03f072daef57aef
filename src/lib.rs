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
//! - [`status`]: the fleet as Redis sees it (what `sfu-redis status` prints).
//! - [`audit`]: the consistency check of one prefix, with safe repairs (`sfu-redis fsck`);
//!   [`audit::scan`] is one scan of it.
//! - [`reap`]: an operator's reap of one instance, now (`sfu-redis reap`).
//! - [`commands`]: every Redis command the library sends, for ACL checks (`sfu-redis doctor`).
//! - [`scan`]: the one `SCAN`/`SSCAN`/`HSCAN`/`ZSCAN` pager.
//! - [`conn`]: the connection layer; [`conn::Redis`] is the connector (timeouts, preloaded
//!   scripts) and [`conn::server_time_ms`] the server clock.
//!
//! Without a Redis URL the node runs in memory-only mode (single instance, no threads);
//! [`Node::mode`] and [`Stats::mode`] tell which mode a node runs in.
//!
//! The rules each part protects are numbered in `docs/DESIGN.md` (invariants 1-6) and named in the
//! Lua scripts' headers (`lua/*.lua`).

#![deny(missing_docs)]
#![warn(missing_debug_implementations, unreachable_pub)]

pub mod audit;
mod cluster;
pub mod commands;
pub mod config;
pub mod conn;
mod dial;
mod endpoint;
mod error;
mod event;
mod heartbeat;
pub mod info;
pub mod keys;
mod leader;
mod lease;
mod memory;
mod metrics;
mod node;
mod pause;
mod peers;
pub mod reap;
mod reaper;
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod replay;
mod rooms;
pub mod scan;
pub mod schema;
mod scripts;
mod sentinel;
mod shards;
pub mod signals;
mod state;
pub mod status;
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
