//! Test kit of sfu-redis: what the tests, the benchmarks, the examples and the demo share, kept
//! out of the library a host depends on.
//!
//! - [`devserver`]: a private `redis-server` on a free port, in a temp dir, killed on drop.
//! - [`faultproxy`]: a fault-injecting TCP proxy (stalls, blackholes, resets) in front of Redis.
//! - [`data`]: a dead instance's data written as the library writes it, dumps of every key,
//!   and the places a dump still names something.
//!
//! Depending on this crate enables the `testing` feature of `sfu-redis` (test hooks on `Node`).

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

pub mod data;
pub mod devserver;
pub mod faultproxy;
