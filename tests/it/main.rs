//! The library's integration tests, one binary (each file under `tests/it/` is a module; one
//! link of the crate instead of one per file, and the long suites run beside the short ones).
//! Every test starts its own private `redis-server` (`support`).
//!
//! Day to day: `cargo test --test it rooms::` runs one module; `cargo quick` (an alias in
//! `.cargo/config.toml`) skips the two long suites, `chaos::` and `reliability::`.

mod support;

mod bad_data;
mod chaos;
mod cluster;
mod cluster_processes;
mod config;
mod demo;
mod deploy_kit;
mod doctor;
mod faults;
mod fleet_page;
mod fsck;
mod ids;
mod keys_prop;
mod lease;
mod memory;
mod metrics;
mod peers;
mod prefix;
mod reap_aside;
mod reap_cmd;
mod reap_pace;
mod reaper;
mod reference;
mod regress_aside;
mod regress_failover;
mod regress_faults;
mod regress_inputs;
mod regress_orphans;
mod regress_ownidx;
mod regress_races;
mod regress_reaper;
mod regress_transport;
mod reliability;
mod restart;
mod rooms;
mod schema;
mod sentinel;
mod signals;
mod status;
mod tls;
