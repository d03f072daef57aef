//! Test kit of sfu-redis: what the tests, the benchmarks, the examples and the demo share, kept
//! out of the library a host depends on.
//!
//! - [`devserver`]: a private `redis-server` on a free port, in a temp dir, killed on drop.
//! - [`faultproxy`]: a fault-injecting TCP proxy (stalls, blackholes, resets) in front of Redis.
//!
//! Depending on this crate enables the `testing` feature of `sfu-redis` (test hooks on `Node`).

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

pub mod devserver;
pub mod faultproxy;
