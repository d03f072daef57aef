//! The recent events of a prefix for the fleet page: a thread subscribed to the prefix's
//! events channel (`P:events`, docs/src/reference/key-schema.md; each message is one event's
//! `--json` line) keeps the last [`EVENT_RING`] in memory. It reconnects on any failure (with a capped,
//! doubling delay) and stops when the [`EventRing`] is dropped.
//!
//! Pub/sub is fire-and-forget: events published while the subscriber is disconnected (Redis
//! down, a failover) are not seen; the ring says since when it is subscribed.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{json, Value};
use sfu_redis::ops::conn::Redis;
use sfu_redis::{redact_url, Config};

use super::now_ms;

/// Events kept: the oldest is dropped when a new one arrives beyond this.
pub(crate) const EVENT_RING: usize = 100;

/// How long one wait for a message lasts before the stop flag is checked again.
const POLL: Duration = Duration::from_millis(500);

/// First and longest delay before resubscribing after a failure.
const RETRY_MIN: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(5);

#[derive(Debug, Default)]
struct Ring {
    events: VecDeque<Value>,
    /// Local ms since when the current subscription holds (`None` while not subscribed).
    subscribed_since_ms: Option<i64>,
    /// Why the last subscription attempt or subscription failed.
    last_error: Option<String>,
}

/// The ring and its subscriber thread; dropping it stops and joins the thread (within
/// [`POLL`] plus a Redis call's timeout).
#[derive(Debug)]
pub(crate) struct EventRing {
    ring: Arc<Mutex<Ring>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn lock(ring: &Mutex<Ring>) -> MutexGuard<'_, Ring> {
    ring.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl EventRing {
    /// Starts the subscriber of `config`'s events channel.
    pub fn start(config: &Config) -> std::io::Result<EventRing> {
        let ring = Arc::new(Mutex::new(Ring::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s, c) = (ring.clone(), stop.clone(), config.clone());
        let thread = std::thread::Builder::new()
            .name("sfu-page-events".into())
            .spawn(move || subscriber(&c, &r, &s))?;
        Ok(EventRing {
            ring,
            stop,
            thread: Some(thread),
        })
    }

    /// `{"events": [...oldest first], "subscribed_since_ms": ms|null, "error": str|null}`;
    /// each event is the published JSON plus `received_ms` (this host's clock).
    pub fn to_json(&self) -> Value {
        let r = lock(&self.ring);
        json!({
            "events": r.events,
            "subscribed_since_ms": r.subscribed_since_ms,
            "error": r.last_error,
        })
    }
}

impl Drop for EventRing {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                log::error!("the events subscriber thread panicked");
            }
        }
    }
}

/// Subscribes, reads until a failure, waits, subscribes again; until `stop`.
fn subscriber(config: &Config, ring: &Mutex<Ring>, stop: &AtomicBool) {
    let mut delay = RETRY_MIN;
    let url = config.redis_url().unwrap_or_default().to_owned();
    while !stop.load(Ordering::Relaxed) {
        let failed = subscribe_once(config, ring, stop);
        {
            let mut r = lock(ring);
            if r.subscribed_since_ms.take().is_some() {
                delay = RETRY_MIN;
            }
            if let Err(e) = failed {
                let safe = redact_url(&url);
                log::debug!("events channel: {e}");
                r.last_error = Some(if e.contains(&safe) {
                    e
                } else {
                    format!("{e} (on {safe})")
                });
            }
        }
        let deadline = std::time::Instant::now() + delay;
        while !stop.load(Ordering::Relaxed) && std::time::Instant::now() < deadline {
            std::thread::sleep(POLL.min(delay));
        }
        delay = (delay * 2).min(RETRY_MAX);
    }
}

/// One subscription: `Ok` when stopped, `Err(message)` on a failure.
fn subscribe_once(config: &Config, ring: &Mutex<Ring>, stop: &AtomicBool) -> Result<(), String> {
    let redis = Redis::from_config(config).map_err(|e| e.to_string())?;
    let mut con = redis.connect().map_err(|e| e.to_string())?;
    let channel = config.keys().events_channel();
    // A cluster propagates PUBLISH to every node: subscribing on the first master is enough.
    let mut first = true;
    let results = con
        .on_each_server(|c| {
            if !std::mem::take(&mut first) {
                return Ok(());
            }
            let mut sub = c.as_pubsub();
            sub.subscribe(&channel)
                .map_err(|e| format!("cannot subscribe to {channel}: {e}"))?;
            sub.set_read_timeout(Some(POLL))
                .map_err(|e| format!("cannot set a read timeout: {e}"))?;
            {
                let mut r = lock(ring);
                r.subscribed_since_ms = Some(now_ms());
                r.last_error = None;
            }
            while !stop.load(Ordering::Relaxed) {
                match sub.get_message() {
                    Ok(msg) => push(ring, msg.get_payload_bytes()),
                    Err(e) if e.is_timeout() => {}
                    Err(e) => return Err(format!("events channel {channel} lost: {e}")),
                }
            }
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    results.into_iter().collect()
}

/// Appends one published payload (its JSON, or `{"raw": text}` if it is not JSON) with
/// `received_ms`, dropping the oldest beyond [`EVENT_RING`].
fn push(ring: &Mutex<Ring>, payload: &[u8]) {
    let mut v = match serde_json::from_slice::<Value>(payload) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({ "raw": String::from_utf8_lossy(payload) }),
    };
    v["received_ms"] = json!(now_ms());
    let mut r = lock(ring);
    if r.events.len() >= EVENT_RING {
        r.events.pop_front();
    }
    r.events.push_back(v);
}
