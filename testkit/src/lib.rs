//! Test kit of sfu-redis: what the tests, the benchmarks, the examples and the demo share, kept
//! out of the library a host depends on.
//!
//! - [`devserver`]: a private `redis-server` on a free port, in a temp dir, killed on drop;
//!   with TLS ([`devserver::LocalRedis::start_tls`]), as a replica, stopped (SIGSTOP), killed
//!   (SIGKILL) and started again.
//! - [`tls`]: throw-away certificates (a CA, server, client, wrong-CA and wrong-name ones)
//!   made with the `openssl` command.
//! - [`sentinel`]: a Redis Sentinel deployment (master, replicas, sentinels), plaintext or
//!   TLS, with forced failovers, crashes and waits for the sentinels to agree.
//! - [`faultproxy`]: a fault-injecting TCP proxy (stalls, blackholes, resets) in front of Redis.
//! - [`faultroute`]: one client's path to a sentinel group through fault proxies (the
//!   sentinels' answers translated to the proxies' addresses), for faults under failovers.
//! - [`data`]: a dead instance's data written as the library writes it, dumps of every key,
//!   and the places a dump still names something.
//! - [`fixture`]: a prefix dumped as JSON by a release's own processes (`tests/fixtures/`),
//!   loaded into a test server (a Redis Cluster too).
//!
//! Depending on this crate enables the `testing` feature of `sfu-redis` (test hooks on `Node`).

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod cli;
pub mod cluster;
pub mod data;
pub mod devserver;
pub mod faultproxy;
pub mod faultroute;
pub mod fixture;
pub mod sentinel;
pub mod tls;
