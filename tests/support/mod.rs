//! Test support: a real `redis-server` per test on a random port (see
//! `sfu_redis::devserver::LocalRedis`), whose log is printed when the test panics, plus
//! helpers to build nodes with fast timings and poll with deadlines.
#![allow(dead_code, unreachable_pub)]

use std::time::{Duration, Instant};

use sfu_redis::devserver::LocalRedis;
use sfu_redis::{Config, Event, Node, Timings};

/// A private server for one test; prints its log if the test panics.
pub struct Server {
    pub redis: LocalRedis,
}

impl Server {
    pub fn start() -> Server {
        let _ = env_logger::builder().is_test(true).try_init();
        Server {
            redis: LocalRedis::start().expect("start redis-server"),
        }
    }

    pub fn url(&self) -> String {
        self.redis.url()
    }

    pub fn con(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .expect("connect to test redis")
    }

    /// A config for this server with fast timings.
    pub fn config(&self, stage: &str, instance: &str) -> Config {
        self.config_with(stage, instance, Timings::fast())
    }

    pub fn config_with(&self, stage: &str, instance: &str, t: Timings) -> Config {
        Config::builder()
            .redis_url(Some(&self.url()))
            .stage(stage)
            .instance_id(instance)
            .timings(t)
            .build()
            .expect("valid config")
    }

    pub fn node(&self, stage: &str, instance: &str) -> Node {
        Node::start(self.config(stage, instance)).expect("start node")
    }

    /// Every key of the server (tests use small data sets).
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg(pattern)
            .query(&mut self.con())
            .unwrap();
        keys.sort();
        keys
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- redis-server log ({}) ----\n{}",
                self.url(),
                self.redis.log()
            );
        }
    }
}

/// Polls `f` until it returns `Some`, or panics after `timeout` with `what`.
pub fn wait_for<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for an event matching `pred` on `node`'s channel; returns it.
pub fn wait_event(
    node: &Node,
    timeout: Duration,
    what: &str,
    pred: impl Fn(&Event) -> bool,
) -> Event {
    let rx = node.events();
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(e) if pred(&e) => return e,
            Ok(_) => {}
            Err(_) => panic!("timed out after {timeout:?} waiting for event: {what}"),
        }
    }
}

/// Generous bound for anything that takes a few reap cycles with `Timings::fast()`.
pub const LONG: Duration = Duration::from_secs(30);
