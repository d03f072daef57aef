//! How an instance describes itself in Redis: `P:{ctl}:instance:<I>:info`, a hash written with
//! the instance's registration (`heartbeat.lua`: at the first heartbeat of a life, after Redis
//! lost its data, and whenever the key is found missing) and removed by its reap
//! (`reap_finish.lua`) and by [`Node::leave`](crate::Node::leave).
//!
//! Operators' tools read it so that they judge each instance with its own timings instead of
//! asking the operator for the fleet's (`sfu-redis status`, `fsck`, `doctor`), and so that a
//! fleet running mixed versions or mixed timings is visible.
//!
//! | field | value |
//! |---|---|
//! | `version` | the library version (`CARGO_PKG_VERSION`, e.g. `0.1.0`) |
//! | `host` | the host name (`/proc/sys/kernel/hostname`, else `$HOSTNAME`) |
//! | `pid` | the process id |
//! | `started_ms` | Redis server time (ms) this life began: its registration's clean-up boundary, at or just before the registration |
//! | `heartbeat_interval_ms`, `heartbeat_ttl_ms`, `stale_threshold_ms`, `pin_ttl_ms`, `lease_ttl_ms`, `lease_refresh_ms`, `two_phase_delay_ms`, `reap_interval_ms`, `command_timeout_ms` | its [`Timings`], ms |
//! | `reap_batch` | index members per reap batch |
//! | `reap_pace` | the reaper's pace: its pause after each batch, in multiples of the batch's duration (a decimal number; `ConfigBuilder::reap_pace`) |
//! | `transport` | `plain`, `tls`, `sentinel`, `sentinel+tls`, `cluster` or `cluster+tls` |
//! | `reaper_paused` | only while this instance, as the leader, skips reap rounds (`src/pause.rs`, `lua/reaper_paused.lua`): `slow_ticks` (heartbeat ticks longer than half the interval), `redis_errors`, or `slow_ticks,redis_errors`, what it saw during the last round's two-phase wait |
//! | `reaper_paused_ms`, `reaper_paused_since_ms` | with it: server ms of the last skipped round, and of the first of the skipped rounds in a row |
//! | `reaper_paused_rounds` | with it: rounds skipped in a row |
//! | `reaper_paused_tick_ms`, `reaper_paused_slow_ms` | with `slow_ticks`: the last slow tick, and the threshold it passed (half the heartbeat interval), ms |
//!
//! The `reaper_paused*` fields are written by the leader's reaper thread into its existing
//! record (never creating one) and deleted when a round runs again, finds nothing to reap,
//! or the instance no longer leads; a registration rewrites the record without them.
//!
//! Readers tolerate what they do not know: a missing or unparsable field is `None` (and named
//! in the problems [`InstanceInfo::from_fields`] returns), an unknown field is ignored, so a
//! fleet can run two versions during a rolling upgrade.

use std::time::Duration;

use crate::config::{Config, Timings};

/// `version`, the library version every record carries.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// One instance's self-description, as read from its info hash. Every field is optional: a
/// record written by another version, or edited by hand, may lack any of them.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct InstanceInfo {
    /// Library version.
    pub version: Option<String>,
    /// Host name.
    pub host: Option<String>,
    /// Process id.
    pub pid: Option<u32>,
    /// Server time (ms) of the registration of this life.
    pub started_ms: Option<i64>,
    /// Its timings, each in ms, in [`TIMING_FIELDS`] order.
    pub timings_ms: [Option<u64>; 9],
    /// Index members per reap batch.
    pub reap_batch: Option<u64>,
    /// The reaper's pace (pause after each batch, in multiples of its duration). `None` also
    /// for records of versions that had no pace (not reported as a problem).
    pub reap_pace: Option<f64>,
    /// How it reaches Redis.
    pub transport: Option<String>,
    /// Present while this instance, as the leader, skips reap rounds (the `reaper_paused*`
    /// fields): why.
    pub reaper_paused: Option<ReaperPaused>,
}

/// Why a leader skips its reap rounds, from the `reaper_paused*` fields of its record (module
/// docs; `src/pause.rs` writes them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReaperPaused {
    /// The last round's two-phase wait saw heartbeat ticks slower than
    /// [`slow_after_ms`](Self::slow_after_ms).
    pub slow_ticks: bool,
    /// It saw Redis errors.
    pub redis_errors: bool,
    /// The last slow tick, ms (with `slow_ticks`).
    pub tick_ms: Option<u64>,
    /// Ticks longer than this are slow (half the heartbeat interval), ms (with `slow_ticks`).
    pub slow_after_ms: Option<u64>,
    /// Server ms of the last skipped round.
    pub at_ms: Option<i64>,
    /// Server ms of the first skipped round in a row.
    pub since_ms: Option<i64>,
    /// Rounds skipped in a row.
    pub rounds: Option<u64>,
    /// The `reaper_paused` value as found (`slow_ticks`, `redis_errors`, both
    /// comma-separated, or what a newer writer put there).
    pub reason: String,
}

impl ReaperPaused {
    /// One line for people: `reaper paused: ticks slower than 500 ms (last 812 ms)`,
    /// `reaper paused: Redis errors during the two-phase wait`, or both joined by `and`.
    pub fn message(&self) -> String {
        let mut why = Vec::new();
        if self.slow_ticks {
            let ms = |v: Option<u64>| v.map_or_else(|| "?".to_owned(), |v| v.to_string());
            why.push(format!(
                "ticks slower than {} ms (last {} ms)",
                ms(self.slow_after_ms),
                ms(self.tick_ms)
            ));
        }
        if self.redis_errors {
            why.push("Redis errors during the two-phase wait".to_owned());
        }
        if why.is_empty() {
            why.push(self.reason.clone());
        }
        format!("reaper paused: {}", why.join(" and "))
    }

    /// [`message`](Self::message), with how long it has lasted on server time `now_ms`:
    /// `...; 3 round(s) skipped in a row, the first 40 s ago, the last 2 s ago`.
    pub fn message_at(&self, now_ms: i64) -> String {
        let ago = |t: Option<i64>| {
            t.map_or_else(
                || "?".to_owned(),
                |t| {
                    format!(
                        "{:.1} s ago",
                        now_ms.saturating_sub(t).max(0) as f64 / 1000.0
                    )
                },
            )
        };
        format!(
            "{}; {} round(s) skipped in a row, the first {}, the last {}",
            self.message(),
            self.rounds
                .map_or_else(|| "?".to_owned(), |r| r.to_string()),
            ago(self.since_ms),
            ago(self.at_ms)
        )
    }

    /// Reads the fields from a record's pairs; `None` without `reaper_paused`.
    fn from_fields(get: &dyn Fn(&str) -> Option<String>) -> Option<ReaperPaused> {
        let reason = get("reaper_paused")?;
        let num = |f: &str| get(f).and_then(|v| v.trim().parse::<u64>().ok());
        let parts: Vec<&str> = reason.split(',').map(str::trim).collect();
        Some(ReaperPaused {
            slow_ticks: parts.contains(&"slow_ticks"),
            redis_errors: parts.contains(&"redis_errors"),
            tick_ms: num("reaper_paused_tick_ms"),
            slow_after_ms: num("reaper_paused_slow_ms"),
            at_ms: num("reaper_paused_ms").and_then(|v| i64::try_from(v).ok()),
            since_ms: num("reaper_paused_since_ms").and_then(|v| i64::try_from(v).ok()),
            rounds: num("reaper_paused_rounds"),
            reason,
        })
    }
}

/// The fields of [`ReaperPaused`], in the record.
pub const REAPER_PAUSED_FIELDS: [&str; 6] = [
    "reaper_paused",
    "reaper_paused_ms",
    "reaper_paused_since_ms",
    "reaper_paused_rounds",
    "reaper_paused_tick_ms",
    "reaper_paused_slow_ms",
];

/// The timing fields of the record, in the order of [`InstanceInfo::timings_ms`].
pub const TIMING_FIELDS: [&str; 9] = [
    "heartbeat_interval_ms",
    "heartbeat_ttl_ms",
    "stale_threshold_ms",
    "pin_ttl_ms",
    "lease_ttl_ms",
    "lease_refresh_ms",
    "two_phase_delay_ms",
    "reap_interval_ms",
    "command_timeout_ms",
];

fn timing_values(t: &Timings) -> [Duration; 9] {
    [
        t.heartbeat_interval,
        t.heartbeat_ttl,
        t.stale_threshold,
        t.pin_ttl,
        t.lease_ttl,
        t.lease_refresh,
        t.two_phase_delay,
        t.reap_interval,
        t.command_timeout,
    ]
}

/// This host's name, as the record's `host` field gives it (`/proc/sys/kernel/hostname`, else
/// `$HOSTNAME`, else `unknown`), trimmed.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// The fields this process writes (all but `started_ms`, which the script sets from the
/// server clock), as `(name, value)` pairs.
pub(crate) fn fields(config: &Config, transport: &str) -> Vec<(&'static str, String)> {
    let mut f = vec![
        ("version", VERSION.to_owned()),
        ("host", host_name()),
        ("pid", std::process::id().to_string()),
    ];
    for (name, d) in TIMING_FIELDS.iter().zip(timing_values(config.timings())) {
        f.push((name, d.as_millis().to_string()));
    }
    f.push(("reap_batch", config.reap_batch().to_string()));
    f.push(("reap_pace", config.reap_pace().to_string()));
    f.push(("transport", transport.to_owned()));
    f
}

impl InstanceInfo {
    /// Reads a record from its `HGETALL` pairs. Returns the record and what is wrong with it
    /// (one sentence per missing or unparsable field; unknown fields are ignored).
    pub fn from_fields(pairs: &[(String, String)]) -> (InstanceInfo, Vec<String>) {
        let get = |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let mut problems = Vec::new();
        let mut number = |name: &str| -> Option<u64> {
            match get(name).map(|v| v.trim().parse::<u64>()) {
                Some(Ok(n)) => Some(n),
                Some(Err(_)) => {
                    problems.push(format!("field {name} is not a whole number"));
                    None
                }
                None => {
                    problems.push(format!("field {name} is missing"));
                    None
                }
            }
        };
        let pid = number("pid").and_then(|p| u32::try_from(p).ok());
        let started_ms = number("started_ms").and_then(|s| i64::try_from(s).ok());
        let mut timings_ms = [None; 9];
        for (slot, name) in timings_ms.iter_mut().zip(TIMING_FIELDS) {
            *slot = number(name);
        }
        let reap_batch = number("reap_batch");
        // Optional: records of earlier versions have none.
        let reap_pace = match get("reap_pace").map(|v| v.trim().parse::<f64>()) {
            Some(Ok(p)) if p.is_finite() && p >= 0.0 => Some(p),
            Some(_) => {
                problems.push("field reap_pace is not a number from 0 up".to_owned());
                None
            }
            None => None,
        };
        let text = |name: &str| get(name).map(str::to_owned);
        let info = InstanceInfo {
            version: text("version"),
            host: text("host"),
            pid,
            started_ms,
            timings_ms,
            reap_batch,
            reap_pace,
            transport: text("transport"),
            // Optional: only while the leader skips rounds.
            reaper_paused: ReaperPaused::from_fields(&text),
        };
        for name in ["version", "host", "transport"] {
            if get(name).is_none() {
                problems.push(format!("field {name} is missing"));
            }
        }
        (info, problems)
    }

    /// One timing of the record, by field name (`heartbeat_interval_ms`, ...).
    pub fn timing(&self, field: &str) -> Option<Duration> {
        let i = TIMING_FIELDS.iter().position(|f| *f == field)?;
        self.timings_ms[i].map(Duration::from_millis)
    }

    /// Its stale threshold.
    pub fn stale_threshold(&self) -> Option<Duration> {
        self.timing("stale_threshold_ms")
    }

    /// Its heartbeat interval.
    pub fn heartbeat_interval(&self) -> Option<Duration> {
        self.timing("heartbeat_interval_ms")
    }

    /// Its command timeout.
    pub fn command_timeout(&self) -> Option<Duration> {
        self.timing("command_timeout_ms")
    }

    /// Its timings as one line (`heartbeat 10000/30000 ms, stale 45000 ms, ...`): equal lines
    /// mean equal timings, so a fleet whose records give more than one runs mixed timings.
    pub fn timings_summary(&self) -> String {
        let ms = |i: usize| {
            self.timings_ms[i]
                .map(|v| v.to_string())
                .unwrap_or_else(|| "?".into())
        };
        format!(
            "heartbeat {}/{} ms, stale {} ms, pin {} ms, lease {}/{} ms, two-phase {} ms, reap every {} ms, timeout {} ms",
            ms(0),
            ms(1),
            ms(2),
            ms(3),
            ms(4),
            ms(5),
            ms(6),
            ms(7),
            ms(8)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(config: &Config) -> Vec<(String, String)> {
        let mut p: Vec<(String, String)> = fields(config, "plain")
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        p.push(("started_ms".into(), "1700000000000".into()));
        p
    }

    #[test]
    fn a_written_record_reads_back_whole() {
        let config = Config::builder()
            .redis_url(Some("redis://127.0.0.1:1"))
            .build()
            .unwrap();
        let (info, problems) = InstanceInfo::from_fields(&pairs(&config));
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(info.version.as_deref(), Some(VERSION));
        assert_eq!(info.pid, Some(std::process::id()));
        assert_eq!(info.started_ms, Some(1_700_000_000_000));
        assert_eq!(info.stale_threshold(), Some(Duration::from_secs(45)));
        assert_eq!(info.heartbeat_interval(), Some(Duration::from_secs(10)));
        assert_eq!(info.command_timeout(), Some(Duration::from_secs(2)));
        assert_eq!(info.reap_batch, Some(500));
        assert_eq!(info.reap_pace, Some(crate::REAP_PACE));
        assert_eq!(info.transport.as_deref(), Some("plain"));
    }

    #[test]
    fn missing_and_garbage_fields_are_named() {
        let p = vec![
            ("version".to_owned(), "9.9.9".to_owned()),
            ("pid".to_owned(), "many".to_owned()),
            ("extra".to_owned(), "ignored".to_owned()),
            ("reap_pace".to_owned(), "fast".to_owned()),
        ];
        let (info, problems) = InstanceInfo::from_fields(&p);
        assert_eq!(info.version.as_deref(), Some("9.9.9"));
        assert_eq!(info.pid, None);
        assert!(problems
            .iter()
            .any(|p| p == "field pid is not a whole number"));
        assert!(problems.iter().any(|p| p == "field host is missing"));
        assert_eq!(info.reap_pace, None);
        assert!(problems.iter().any(|p| p.contains("reap_pace")));
        assert!(problems
            .iter()
            .any(|p| p == "field stale_threshold_ms is missing"));
        assert!(info.timings_summary().contains("stale ? ms"));
        assert_eq!(info.reaper_paused, None);
    }

    #[test]
    fn a_pause_note_reads_back_as_one_line() {
        let mut p = pairs(
            &Config::builder()
                .redis_url(Some("redis://127.0.0.1:1"))
                .build()
                .unwrap(),
        );
        for (k, v) in [
            ("reaper_paused", "slow_ticks"),
            ("reaper_paused_ms", "1700000010000"),
            ("reaper_paused_since_ms", "1700000000000"),
            ("reaper_paused_rounds", "4"),
            ("reaper_paused_tick_ms", "812"),
            ("reaper_paused_slow_ms", "500"),
        ] {
            p.push((k.to_owned(), v.to_owned()));
        }
        let (info, problems) = InstanceInfo::from_fields(&p);
        assert!(problems.is_empty(), "{problems:?}");
        let paused = info.reaper_paused.expect("the note");
        assert!(paused.slow_ticks && !paused.redis_errors);
        assert_eq!(
            paused.message(),
            "reaper paused: ticks slower than 500 ms (last 812 ms)"
        );
        assert_eq!(
            paused.message_at(1_700_000_012_500),
            "reaper paused: ticks slower than 500 ms (last 812 ms); 4 round(s) skipped in a row, the first 12.5 s ago, the last 2.5 s ago"
        );
        let errors = ReaperPaused::from_fields(&|f: &str| {
            (f == "reaper_paused").then(|| "redis_errors".to_owned())
        })
        .unwrap();
        assert_eq!(
            errors.message(),
            "reaper paused: Redis errors during the two-phase wait"
        );
    }
}
