//! Configuration: where Redis is, which prefix to use, who this instance is, and the timings.
//!
//! Every duration is a [`Duration`]. Values are validated when a [`Config`] is built; an error
//! names the field at fault (docs/DESIGN.md "Timings").

use std::time::Duration;

use crate::endpoint::{self, Endpoint};
use crate::error::{Error, Result};
use crate::keys::{encode_id, IdKind, KeySpace};
use crate::sentinel::SentinelAuth;
pub use crate::tls::TlsOptions;

/// The timings of heartbeats, pins, the lease and the reaper.
///
/// Defaults are the seed's: heartbeat every 10 s with a 30 s TTL, stale after 45 s (1.5 x TTL),
/// pins live 90 s (3 x TTL), a 90 s lease refreshed every 30 s, a 60 s two-phase delay and a reap
/// round every 15 s. Redis calls time out after 2 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// How often each instance heartbeats and refreshes its pins.
    pub heartbeat_interval: Duration,
    /// TTL of the per-instance heartbeat key.
    pub heartbeat_ttl: Duration,
    /// An instance whose last heartbeat (server time) is older than this is a reap candidate.
    pub stale_threshold: Duration,
    /// TTL of a room pin; refreshed on every heartbeat tick.
    pub pin_ttl: Duration,
    /// TTL of the reaper lease.
    pub lease_ttl: Duration,
    /// How often the leader refreshes the lease and non-leaders try to acquire it.
    pub lease_refresh: Duration,
    /// How long the leader waits between finding candidates and re-checking them. Keep it at
    /// least `stale_threshold` (the defaults: 60 s and 45 s): after a failover that lost a
    /// live instance's last heartbeats or its registration, the new master's stale copy lists
    /// it, and only its heartbeats during this wait save it (docs/src/deploy/failover.md
    /// "Not guaranteed"; model check findings 5 and 12).
    pub two_phase_delay: Duration,
    /// How often the leader runs a reap round.
    pub reap_interval: Duration,
    /// Connect, read and write timeout of every Redis call.
    pub command_timeout: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Timings::from_heartbeat(Duration::from_secs(10), Duration::from_secs(30))
    }
}

impl Timings {
    /// Timings derived from a heartbeat interval and TTL with the seed's ratios: stale threshold
    /// 1.5 x TTL, pin TTL 3 x TTL, lease TTL 3 x TTL refreshed every TTL, two-phase delay 2 x TTL,
    /// reap interval TTL / 2, command timeout min(2 s, interval / 2).
    ///
    /// `from_heartbeat(10 s, 30 s)` gives the defaults (command timeout 2 s).
    pub fn from_heartbeat(interval: Duration, ttl: Duration) -> Self {
        Timings {
            heartbeat_interval: interval,
            heartbeat_ttl: ttl,
            stale_threshold: ttl * 3 / 2,
            pin_ttl: ttl * 3,
            lease_ttl: ttl * 3,
            lease_refresh: ttl,
            two_phase_delay: ttl * 2,
            reap_interval: ttl / 2,
            command_timeout: (interval / 2).min(Duration::from_secs(2)),
        }
    }

    /// Millisecond-scale timings for tests and demos: `from_heartbeat(200 ms, 600 ms)` (stale
    /// after 900 ms, 1.8 s pins and lease refreshed every 600 ms, 1.2 s two-phase delay, a reap
    /// round every 300 ms) with a 400 ms command timeout. A dead instance is reaped about 2.5 s
    /// after its last heartbeat.
    pub fn fast() -> Self {
        let mut t = Timings::from_heartbeat(Duration::from_millis(200), Duration::from_millis(600));
        t.command_timeout = Duration::from_millis(400);
        t
    }

    /// Checks the rules below; the error names the first field that breaks one.
    ///
    /// - every duration is non-zero;
    /// - `heartbeat_interval < heartbeat_ttl` (a heartbeat must land before the last one expires);
    /// - `stale_threshold >= heartbeat_ttl` (a live instance's score must not look stale);
    /// - `pin_ttl > heartbeat_interval` (pins are refreshed on each tick);
    /// - `lease_refresh < lease_ttl / 2` (two refreshes fit in one lease);
    /// - `heartbeat_interval + command_timeout < lease_ttl` (after Redis lost its data every
    ///   live node heartbeats, writing back the highest epoch it knows, before a new lease can
    ///   be granted);
    /// - `command_timeout < lease_refresh` and `command_timeout < heartbeat_ttl` (a hung call
    ///   must fail before the deadline it serves, docs/DESIGN.md "Lessons from other systems").
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the field.
    pub fn validate(&self) -> Result<()> {
        let fields = [
            ("heartbeat_interval", self.heartbeat_interval),
            ("heartbeat_ttl", self.heartbeat_ttl),
            ("stale_threshold", self.stale_threshold),
            ("pin_ttl", self.pin_ttl),
            ("lease_ttl", self.lease_ttl),
            ("lease_refresh", self.lease_refresh),
            ("two_phase_delay", self.two_phase_delay),
            ("reap_interval", self.reap_interval),
            ("command_timeout", self.command_timeout),
        ];
        for (name, d) in fields {
            if d.is_zero() {
                return Err(Error::config(name, "must be greater than zero"));
            }
            if d > Duration::from_secs(7 * 24 * 3600) {
                return Err(Error::config(name, "must be at most 7 days"));
            }
        }
        let ms = |d: Duration| d.as_millis();
        if self.heartbeat_interval >= self.heartbeat_ttl {
            return Err(Error::config(
                "heartbeat_interval",
                format!(
                    "{} ms must be shorter than heartbeat_ttl ({} ms)",
                    ms(self.heartbeat_interval),
                    ms(self.heartbeat_ttl)
                ),
            ));
        }
        if self.heartbeat_interval + self.command_timeout >= self.lease_ttl {
            // After Redis lost its data, every live node must heartbeat (and so write back the
            // highest epoch it knows) before a new lease can be granted, a lease TTL later.
            return Err(Error::config(
                "lease_ttl",
                format!(
                    "{} ms must be longer than heartbeat_interval + command_timeout ({} ms)",
                    ms(self.lease_ttl),
                    ms(self.heartbeat_interval + self.command_timeout)
                ),
            ));
        }
        if self.stale_threshold < self.heartbeat_ttl {
            return Err(Error::config(
                "stale_threshold",
                format!(
                    "{} ms must be at least heartbeat_ttl ({} ms)",
                    ms(self.stale_threshold),
                    ms(self.heartbeat_ttl)
                ),
            ));
        }
        if self.pin_ttl <= self.heartbeat_interval {
            return Err(Error::config(
                "pin_ttl",
                format!(
                    "{} ms must be longer than heartbeat_interval ({} ms)",
                    ms(self.pin_ttl),
                    ms(self.heartbeat_interval)
                ),
            ));
        }
        if self.lease_refresh * 2 >= self.lease_ttl {
            return Err(Error::config(
                "lease_refresh",
                format!(
                    "{} ms must be shorter than half of lease_ttl ({} ms)",
                    ms(self.lease_refresh),
                    ms(self.lease_ttl)
                ),
            ));
        }
        if self.command_timeout >= self.lease_refresh || self.command_timeout >= self.heartbeat_ttl
        {
            return Err(Error::config(
                "command_timeout",
                format!(
                    "{} ms must be shorter than lease_refresh ({} ms) and heartbeat_ttl ({} ms)",
                    ms(self.command_timeout),
                    ms(self.lease_refresh),
                    ms(self.heartbeat_ttl)
                ),
            ));
        }
        Ok(())
    }
}

/// Everything a [`crate::Node`] needs. Build one with [`Config::builder`] or
/// [`Config::from_env`]; both validate.
#[derive(Clone, PartialEq, Eq)]
pub struct Config {
    redis_url: Option<String>,
    tls: TlsOptions,
    sentinel: SentinelAuth,
    /// Namespace, stage and branch as given (trimmed), before escaping: [`Config::to_builder`]
    /// needs them, since escaping an escaped segment again would give another prefix.
    segments: [String; 3],
    keys: KeySpace,
    instance_id: String,
    timings: Timings,
    reap_batch: usize,
    reap_pace: Pace,
    metrics: bool,
}

/// A validated [`ConfigBuilder::reap_pace`]: finite, so equality is total.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Pace(f64);

impl Eq for Pace {}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("redis_url", &self.redis_url.as_deref().map(redact_url))
            .field("tls", &self.tls)
            .field("sentinel", &self.sentinel)
            .field("prefix", &self.keys.prefix())
            .field("instance_id", &self.instance_id)
            .field("timings", &self.timings)
            .field("reap_batch", &self.reap_batch)
            .field("reap_pace", &self.reap_pace.0)
            .field("metrics", &self.metrics)
            .finish()
    }
}

impl Config {
    /// A builder with the defaults: memory-only, prefix `sfu:dev:main`, a generated instance
    /// id, [`Timings::default`].
    pub fn builder() -> ConfigBuilder {
        ConfigBuilder::default()
    }

    /// Reads the environment:
    ///
    /// | variable | default | meaning |
    /// |---|---|---|
    /// | `REDIS_URL` | unset | unset or empty: memory-only mode |
    /// | `SFU_NAMESPACE` | `sfu` | first prefix segment |
    /// | `SFU_STAGE` | `dev` | second prefix segment |
    /// | `SFU_BRANCH` | `main` | third prefix segment |
    /// | `SFU_INSTANCE_ID` | host name, pid, per-boot nonce | this instance's id |
    /// | `SFU_REAP_PACE` | [`REAP_PACE`] | the reaper's pace ([`ConfigBuilder::reap_pace`]) |
    ///
    /// Timings are the defaults; change them with [`Config::to_builder`].
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the variable at fault.
    pub fn from_env() -> Result<Config> {
        ConfigBuilder::from_env().build()
    }

    /// A builder holding this configuration, to change some of it.
    pub fn to_builder(&self) -> ConfigBuilder {
        let [namespace, stage, branch] = self.segments.clone();
        ConfigBuilder {
            redis_url: self.redis_url.clone(),
            tls: self.tls.clone(),
            sentinel: self.sentinel.clone(),
            tls_insecure_env: None,
            namespace,
            stage,
            branch,
            instance_id: Some(self.instance_id.clone()),
            timings: self.timings,
            reap_batch: self.reap_batch,
            reap_pace: self.reap_pace.0,
            reap_pace_env: None,
            metrics: self.metrics,
        }
    }

    /// The Redis URL, or `None` in memory-only mode. It may hold a password: print it only
    /// through [`redact_url`].
    pub fn redis_url(&self) -> Option<&str> {
        self.redis_url.as_deref()
    }

    /// The TLS settings (files and `insecure`); they apply to `rediss://` and
    /// `rediss+sentinel://` URLs.
    pub fn tls(&self) -> &TlsOptions {
        &self.tls
    }

    /// The user the sentinels authenticate (sentinel URLs only); the sentinel password is
    /// never shown.
    pub fn sentinel_user(&self) -> Option<&str> {
        self.sentinel.user.as_deref()
    }

    pub(crate) fn sentinel_auth(&self) -> &SentinelAuth {
        &self.sentinel
    }

    /// [`Mode::Memory`] without a Redis URL, else [`Mode::Redis`].
    pub fn mode(&self) -> Mode {
        if self.redis_url.is_some() {
            Mode::Redis
        } else {
            Mode::Memory
        }
    }

    /// The key space (prefix `<namespace>:<stage>:<branch>`).
    pub fn keys(&self) -> &KeySpace {
        &self.keys
    }

    /// This instance's id, as given (not in wire form).
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// The timings.
    pub fn timings(&self) -> &Timings {
        &self.timings
    }

    /// Rooms of a dead instance's index the reaper handles per batch.
    pub fn reap_batch(&self) -> usize {
        self.reap_batch
    }

    /// The reaper's pace: after each batch it pauses this many times the batch's measured
    /// duration (0 = no pause; see [`ConfigBuilder::reap_pace`]).
    pub fn reap_pace(&self) -> f64 {
        self.reap_pace.0
    }

    /// Whether the node records the duration histograms of its metrics
    /// ([`ConfigBuilder::metrics`]; default true).
    pub fn metrics(&self) -> bool {
        self.metrics
    }
}

/// Builds a [`Config`]; [`ConfigBuilder::build`] validates.
///
/// Its `Debug` shows the Redis URL through [`redact_url`], like [`Config`]'s.
#[derive(Clone)]
pub struct ConfigBuilder {
    redis_url: Option<String>,
    tls: TlsOptions,
    sentinel: SentinelAuth,
    /// `SFU_TLS_INSECURE` as read by `from_env`, checked at build.
    tls_insecure_env: Option<String>,
    namespace: String,
    stage: String,
    branch: String,
    instance_id: Option<String>,
    timings: Timings,
    reap_batch: usize,
    reap_pace: f64,
    /// `SFU_REAP_PACE` as read by `from_env`, parsed and checked at build.
    reap_pace_env: Option<String>,
    metrics: bool,
}

impl std::fmt::Debug for ConfigBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigBuilder")
            .field("redis_url", &self.redis_url.as_deref().map(redact_url))
            .field("tls", &self.tls)
            .field("sentinel", &self.sentinel)
            .field("namespace", &self.namespace)
            .field("stage", &self.stage)
            .field("branch", &self.branch)
            .field("instance_id", &self.instance_id)
            .field("timings", &self.timings)
            .field("reap_batch", &self.reap_batch)
            .field("reap_pace", &self.reap_pace)
            .field("metrics", &self.metrics)
            .finish()
    }
}

impl Default for ConfigBuilder {
    fn default() -> Self {
        ConfigBuilder {
            redis_url: None,
            tls: TlsOptions::default(),
            sentinel: SentinelAuth::default(),
            tls_insecure_env: None,
            namespace: "sfu".into(),
            stage: "dev".into(),
            branch: "main".into(),
            instance_id: None,
            timings: Timings::default(),
            reap_batch: REAP_BATCH,
            reap_pace: REAP_PACE,
            reap_pace_env: None,
            metrics: true,
        }
    }
}

impl ConfigBuilder {
    /// Defaults overridden by the environment variables of [`Config::from_env`].
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let mut b = ConfigBuilder {
            redis_url: var("REDIS_URL"),
            ..ConfigBuilder::default()
        };
        if let Some(v) = var("SFU_NAMESPACE") {
            b.namespace = v;
        }
        if let Some(v) = var("SFU_STAGE") {
            b.stage = v;
        }
        if let Some(v) = var("SFU_BRANCH") {
            b.branch = v;
        }
        b.instance_id = var("SFU_INSTANCE_ID");
        b.tls.ca_file = var("SFU_TLS_CA_FILE").map(Into::into);
        b.tls.cert_file = var("SFU_TLS_CERT_FILE").map(Into::into);
        b.tls.key_file = var("SFU_TLS_KEY_FILE").map(Into::into);
        b.tls_insecure_env = var("SFU_TLS_INSECURE");
        b.sentinel.user = var("SFU_SENTINEL_USER");
        b.sentinel.password = var("SFU_SENTINEL_PASSWORD");
        b.reap_pace_env = var("SFU_REAP_PACE");
        b
    }

    /// CA certificate file (PEM) the server's certificate must chain to (`rediss://` and
    /// `rediss+sentinel://`; without one, the system's roots). Environment `SFU_TLS_CA_FILE`.
    /// An empty path unsets it (as for the other TLS files).
    pub fn tls_ca_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.tls.ca_file = non_empty(path.into());
        self
    }

    /// Client certificate file (PEM) for mutual TLS; needs [`ConfigBuilder::tls_key_file`].
    /// Environment `SFU_TLS_CERT_FILE`.
    pub fn tls_cert_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.tls.cert_file = non_empty(path.into());
        self
    }

    /// Private key file (PEM: PKCS#8, PKCS#1 or SEC1) of the client certificate. Environment
    /// `SFU_TLS_KEY_FILE`.
    pub fn tls_key_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.tls.key_file = non_empty(path.into());
        self
    }

    /// Skip TLS certificate verification (default false). Every connect then logs a warning;
    /// nothing else turns verification off (a URL's `#insecure` fragment is refused).
    /// Environment `SFU_TLS_INSECURE=1`.
    pub fn tls_insecure(mut self, insecure: bool) -> Self {
        self.tls.insecure = insecure;
        self.tls_insecure_env = None;
        self
    }

    /// All TLS settings at once.
    pub fn tls(mut self, tls: TlsOptions) -> Self {
        self.tls = tls;
        self.tls_insecure_env = None;
        self
    }

    /// The user the sentinels authenticate, when they need their own credentials (sentinel
    /// URLs only; the URL's user info authenticates to the data nodes). Environment
    /// `SFU_SENTINEL_USER`.
    pub fn sentinel_user(mut self, user: &str) -> Self {
        self.sentinel.user = Some(user.to_owned()).filter(|u| !u.is_empty());
        self
    }

    /// The sentinels' password (sentinel URLs only). Never printed. Environment
    /// `SFU_SENTINEL_PASSWORD`.
    pub fn sentinel_password(mut self, password: &str) -> Self {
        self.sentinel.password = Some(password.to_owned()).filter(|p| !p.is_empty());
        self
    }

    /// The Redis URL (`redis://[user:pass@]host:port[/db]`): a `&str`, `String` or `&String`, or
    /// an `Option` of one (`Some(&url)` as before; a bare `None` is written `None::<&str>`). `None` or an empty string means memory-only mode (see
    /// [`crate::Node::mode`]).
    ///
    /// ```
    /// let c = sfu_redis::Config::builder().redis_url("redis://127.0.0.1:6379").build()?;
    /// assert_eq!(c.redis_url(), Some("redis://127.0.0.1:6379"));
    /// let m = sfu_redis::Config::builder().redis_url(None::<&str>).build()?;
    /// assert_eq!(m.redis_url(), None);
    /// # Ok::<(), sfu_redis::Error>(())
    /// ```
    pub fn redis_url(mut self, url: impl IntoRedisUrl) -> Self {
        self.redis_url = url.into_redis_url().and_then(|u| {
            let u = u.trim();
            (!u.is_empty()).then(|| u.to_owned())
        });
        self
    }

    /// First prefix segment (default `sfu`). Each segment is trimmed and escaped into
    /// `[A-Za-z0-9._-]` so that distinct names never share a prefix (see [`KeySpace::new`]).
    pub fn namespace(mut self, v: &str) -> Self {
        v.clone_into(&mut self.namespace);
        self
    }

    /// Second prefix segment (default `dev`).
    pub fn stage(mut self, v: &str) -> Self {
        v.clone_into(&mut self.stage);
        self
    }

    /// Third prefix segment (default `main`).
    pub fn branch(mut self, v: &str) -> Self {
        v.clone_into(&mut self.branch);
        self
    }

    /// This instance's id (default: [`default_instance_id`]).
    pub fn instance_id(mut self, v: &str) -> Self {
        self.instance_id = Some(v.to_owned());
        self
    }

    /// The timings (default [`Timings::default`]).
    pub fn timings(mut self, t: Timings) -> Self {
        self.timings = t;
        self
    }

    /// Rooms of a dead instance's index the reaper handles per batch: one `SSCAN` page and one
    /// pipelined round trip of `reap_room.lua` calls, each room with its peer records (default
    /// [`REAP_BATCH`] = 500, allowed 1 to [`MAX_REAP_BATCH`]). Larger batches reap faster on a
    /// slow network; smaller ones keep other clients' latency lower while a big instance is
    /// reaped (measured trade-off: docs/src/performance.md "Batch size", docs/src/deploy/sizing.md).
    pub fn reap_batch(mut self, n: usize) -> Self {
        self.reap_batch = n;
        self
    }

    /// The reaper's pace, so that a big reap leaves Redis to the SFU's own traffic: a paced
    /// reap's batches hold at most [`PACED_REAP_BATCH`] (32) members (one pipelined round trip
    /// each: another client waits behind at most one such batch), and after each batch the
    /// reaper pauses `pace` times the batch's measured duration before the next one. Redis is
    /// then busy with the reap at most `1 / (1 + pace)` of the time and a reap takes about
    /// `1 + pace` times as long as with batches of that size; the pause adapts to the server's
    /// speed and the network (a slow batch is followed by a long pause). 0 = no pause and
    /// batches of [`ConfigBuilder::reap_batch`] (the fastest reap).
    ///
    /// Default [`REAP_PACE`] = 1, allowed 0 to [`MAX_REAP_PACE`], any finite number in
    /// between (measured trade-off: docs/src/design/reaping.md "Reap pace"). Environment `SFU_REAP_PACE`.
    ///
    /// A pause never follows the last batch, ends at once on shutdown, and the lease is
    /// re-checked after it: a reaper whose lease's local deadline passed during a pause stops
    /// before its next batch (invariant 3). Only leader reaps are paced (the reaper thread and
    /// `Node::reap_now`, feature `testing`); an instance clearing its own earlier life's leftovers at
    /// registration is not.
    pub fn reap_pace(mut self, pace: f64) -> Self {
        self.reap_pace = pace;
        self.reap_pace_env = None;
        self
    }

    /// Whether the node records the duration histograms of its metrics (tick and reap
    /// durations, `Node::metrics`); default true. Off, each tick and reap skips its two clock
    /// reads and its histogram update; the counters ([`crate::Stats`]) are kept either way,
    /// and `Node::metrics` still renders (with empty histograms). For measuring what the
    /// recording costs (`examples/perf_report.rs`: tick with metrics on vs off).
    pub fn metrics(mut self, on: bool) -> Self {
        self.metrics = on;
        self
    }

    /// Validates and builds.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the field: an unparsable Redis URL, an empty or
    /// oversized prefix segment, an invalid instance id, timings that break
    /// [`Timings::validate`], a reap batch or a reap pace out of range (`reap_pace`: not a
    /// finite number from 0 to [`MAX_REAP_PACE`], or an `SFU_REAP_PACE` that is no number).
    pub fn build(mut self) -> Result<Config> {
        if let Some(v) = self.tls_insecure_env.take() {
            self.tls.insecure = parse_switch(&v).ok_or_else(|| {
                Error::config(
                    "tls_insecure",
                    format!(
                        "SFU_TLS_INSECURE={v:?}: expected 1 or 0 (also true/false, yes/no, on/off)"
                    ),
                )
            })?;
        }
        self.check_transport()?;
        let keys = KeySpace::new(&self.namespace, &self.stage, &self.branch)?;
        let instance_id = match self.instance_id {
            Some(id) => id,
            None => default_instance_id(),
        };
        encode_id(IdKind::Instance, &instance_id)
            .map_err(|e| Error::config("instance_id", e.to_string()))?;
        self.timings.validate()?;
        if let Some(v) = self.reap_pace_env.take() {
            self.reap_pace = v.trim().parse().map_err(|_| {
                Error::config(
                    "reap_pace",
                    format!("SFU_REAP_PACE={v:?} is not a number; expected 0 to {MAX_REAP_PACE}"),
                )
            })?;
        }
        check_reap_pace(self.reap_pace)?;
        if !(1..=MAX_REAP_BATCH).contains(&self.reap_batch) {
            return Err(Error::config(
                "reap_batch",
                format!(
                    "{} is out of range; allowed 1 to {MAX_REAP_BATCH}",
                    self.reap_batch
                ),
            ));
        }
        Ok(Config {
            redis_url: self.redis_url,
            tls: self.tls,
            sentinel: self.sentinel,
            segments: [self.namespace, self.stage, self.branch].map(|s| s.trim().to_owned()),
            keys,
            instance_id,
            timings: self.timings,
            reap_batch: self.reap_batch,
            // `+ 0.0` turns -0 into 0.
            reap_pace: Pace(self.reap_pace + 0.0),
            metrics: self.metrics,
        })
    }
}

/// `pace` is finite and within 0 to [`MAX_REAP_PACE`].
fn check_reap_pace(pace: f64) -> Result<()> {
    if pace.is_finite() && (0.0..=MAX_REAP_PACE).contains(&pace) {
        Ok(())
    } else {
        Err(Error::config(
            "reap_pace",
            format!("{pace} is out of range; allowed 0 to {MAX_REAP_PACE} (a finite number: the pause after each reap batch, in multiples of the batch's duration)"),
        ))
    }
}

impl ConfigBuilder {
    /// The URL parses, and the TLS and sentinel settings fit it: TLS files only with a TLS
    /// URL, readable and PEM; sentinel credentials only with a sentinel URL.
    fn check_transport(&self) -> Result<()> {
        let sentinel_field = if self.sentinel.password.is_some() {
            Some("sentinel_password")
        } else if self.sentinel.user.is_some() {
            Some("sentinel_user")
        } else {
            None
        };
        let Some(url) = &self.redis_url else {
            if let Some(f) = self.tls.first_set().or(sentinel_field) {
                return Err(Error::config(
                    f,
                    "is set but there is no Redis URL (memory-only mode)",
                ));
            }
            return Ok(());
        };
        let safe = redact_url(url);
        let ep = endpoint::parse(url).map_err(|why| {
            Error::config(
                "redis_url",
                format!("{safe} is not a usable Redis URL: {why}"),
            )
        })?;
        if ep.tls() {
            if cfg!(not(feature = "tls")) {
                return Err(Error::config(
                    "redis_url",
                    format!(
                        "{safe}: this build of sfu-redis has no TLS support (cargo feature `tls`)"
                    ),
                ));
            }
            self.tls.check()?;
            if self.tls.insecure && self.tls.ca_file.is_some() {
                return Err(Error::config(
                    "tls_ca_file",
                    "is set with tls_insecure, which skips verification: the CA file would do nothing; drop one of them",
                ));
            }
        } else if let Some(f) = self.tls.first_set() {
            return Err(Error::config(
                f,
                format!("is set but {safe} is plaintext; TLS settings apply to rediss://, rediss+sentinel:// and rediss+cluster:// URLs"),
            ));
        }
        if let (Some(f), Endpoint::Direct { .. } | Endpoint::Cluster(_)) = (sentinel_field, &ep) {
            return Err(Error::config(
                f,
                format!("is set but {safe} is not a sentinel URL (redis+sentinel://host1:port1,.../<master-name>)"),
            ));
        }
        Ok(())
    }
}

/// An on/off setting as text (`SFU_TLS_INSECURE`, the C key `tls_insecure`): `1`, `true`,
/// `yes`, `on`, `y`, `t` or `0`, `false`, `no`, `off`, `n`, `f`, in any case (the values the
/// CLI's flags take from the environment); `None` for anything else.
pub fn parse_switch(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" | "y" | "t" => Some(true),
        "0" | "false" | "no" | "off" | "n" | "f" => Some(false),
        _ => None,
    }
}

/// `None` for an empty path (unset, as an empty environment variable is).
fn non_empty(p: std::path::PathBuf) -> Option<std::path::PathBuf> {
    (!p.as_os_str().is_empty()).then_some(p)
}

/// Every environment variable [`Config::from_env`] (and [`ConfigBuilder::from_env`]) reads.
pub const ENV_VARS: [&str; 12] = [
    "REDIS_URL",
    "SFU_NAMESPACE",
    "SFU_STAGE",
    "SFU_BRANCH",
    "SFU_INSTANCE_ID",
    "SFU_TLS_CA_FILE",
    "SFU_TLS_CERT_FILE",
    "SFU_TLS_KEY_FILE",
    "SFU_TLS_INSECURE",
    "SFU_SENTINEL_USER",
    "SFU_SENTINEL_PASSWORD",
    "SFU_REAP_PACE",
];

/// Default of [`ConfigBuilder::reap_batch`]: index members per reap batch, tuned with
/// `examples/perf_report.rs --reap-batch` (docs/src/performance.md "Batch size").
pub const REAP_BATCH: usize = 500;

/// Largest [`ConfigBuilder::reap_batch`]: bounds the work of one pipelined round trip.
pub const MAX_REAP_BATCH: usize = 10_000;

/// Default of [`ConfigBuilder::reap_pace`]: the reaper pauses as long as each batch took,
/// tuned with `examples/perf_report.rs --pace` (docs/src/performance.md "Reap pace").
pub const REAP_PACE: f64 = 1.0;

/// Most index members of one batch of a paced reap ([`ConfigBuilder::reap_pace`] > 0; a
/// smaller [`ConfigBuilder::reap_batch`] is kept). Redis runs a pipeline's commands without
/// serving other clients in between for as long as one read of its input holds (16 KB, some 50
/// `reap_room.lua` calls, about 2 ms): a smaller batch bounds what another client waits behind
/// the reap, whatever the pause. Measured with `examples/perf_report.rs --pace-sweep`
/// (docs/src/performance.md "Reap pace").
pub const PACED_REAP_BATCH: usize = 32;

/// Largest [`ConfigBuilder::reap_pace`]: a reap at most 101 times as long as unpaced.
pub const MAX_REAP_PACE: f64 = 100.0;

/// `<host>-<pid>-<nonce>`: the host name, the process id and 8 random hex digits drawn at each
/// call, so a restarted process with the same host and pid is a new identity (docs/DESIGN.md
/// "Lessons from other systems").
pub fn default_instance_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into());
    format!("{host}-{}-{:08x}", std::process::id(), fastrand::u32(..))
}

/// The URL schemes redis-rs accepts; only these are echoed in a placeholder.
const KNOWN_SCHEMES: [&str; 15] = [
    "redis",
    "rediss",
    "valkey",
    "valkeys",
    "redis+unix",
    "valkey+unix",
    "unix",
    "redis+sentinel",
    "rediss+sentinel",
    "valkey+sentinel",
    "valkeys+sentinel",
    "redis+cluster",
    "rediss+cluster",
    "valkey+cluster",
    "valkeys+cluster",
];

/// `url` with every password replaced by `***`, for logs and messages
/// (`redis://user:***@host:6379/0`).
///
/// The URL is parsed with the `url` crate, the parser redis-rs itself uses, so what is hidden
/// is what redis-rs would send as a password:
///
/// - the password of the user info (`user:***@`); a user info without `:` (`redis://secret@host`)
///   is hidden whole (`***@`), as some clients read it as a password;
/// - the value of every query parameter whose percent-decoded name is `pass` or `password`, in
///   any case (`redis+unix:///tmp/r.sock?p%61ss=***`; redis-rs reads `pass` on Unix sockets);
/// - a fragment other than `#insecure` (a password holding an unencoded `#` ends up there);
/// - in a sentinel URL (`redis+sentinel://u:p@h1,h2/m`), the password of its one user info.
///
/// A URL that does not parse, has a scheme redis-rs does not know, has no `//` authority, or
/// holds an `@` outside its user info
/// (a password with an unencoded `/`, `?`, `#` or `@` that moved part of it into the host,
/// path or query) is replaced whole by a placeholder that holds no part of the input except
/// a known scheme (`<redis:// URL not shown: ...>`).
pub fn redact_url(url: &str) -> String {
    let placeholder = |scheme: Option<&str>, why: &str| match scheme {
        Some(s) if KNOWN_SCHEMES.contains(&s) => format!("<{s}:// URL not shown: {why}>"),
        _ => format!("<Redis URL not shown: {why}>"),
    };
    if endpoint::is_sentinel_url(url) || endpoint::is_cluster_url(url) {
        let scheme = url
            .trim()
            .split_once("://")
            .map(|(s, _)| s.to_ascii_lowercase());
        let kind = if endpoint::is_cluster_url(url) {
            "it does not parse as a cluster URL"
        } else {
            "it does not parse as a sentinel URL"
        };
        return endpoint::redact_multi_host(url)
            .unwrap_or_else(|| placeholder(scheme.as_deref(), kind));
    }
    let mut u = match url::Url::parse(url) {
        Ok(u) => u,
        Err(_) => {
            let scheme = url
                .trim()
                .split_once("://")
                .map(|(s, _)| s.to_ascii_lowercase());
            return placeholder(scheme.as_deref(), "it does not parse");
        }
    };
    let scheme = u.scheme().to_owned();
    let scheme = Some(scheme.as_str());
    if !KNOWN_SCHEMES.contains(&u.scheme()) {
        return placeholder(
            None,
            "its scheme is not redis, rediss, valkey, valkeys or unix (or their +sentinel and +cluster forms)",
        );
    }
    if u.cannot_be_a_base() {
        return placeholder(scheme, "it has no `//` after the scheme");
    }
    const MOVED: &str =
        "it holds an `@` outside the user info (percent-encode `@`, `/`, `?` and `#` in a password)";
    let has_host = u.host_str().is_some_and(|h| !h.is_empty());
    if u.path().contains('@')
        || u.fragment().is_some_and(|f| f.contains('@'))
        || (has_host && u.query().is_some_and(|q| q.contains('@')))
    {
        return placeholder(scheme, MOVED);
    }
    if u.password().is_some() {
        if u.set_password(Some("***")).is_err() {
            return placeholder(scheme, "its user info cannot be redacted");
        }
    } else if !u.username().is_empty() && u.set_username("***").is_err() {
        return placeholder(scheme, "its user info cannot be redacted");
    }
    if let Some(query) = u.query() {
        let query = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, _)) if is_password_parameter(name) => format!("{name}=***"),
                _ => pair.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("&");
        if query.contains('@') {
            return placeholder(scheme, MOVED);
        }
        u.set_query(Some(&query));
    }
    if u.fragment().is_some_and(|f| f != "insecure") {
        u.set_fragment(Some("***"));
    }
    u.to_string()
}

/// Whether a raw (percent-encoded) query parameter name decodes, as redis-rs decodes it
/// (`application/x-www-form-urlencoded`), to `pass` or `password` in any case.
fn is_password_parameter(raw_name: &str) -> bool {
    // `raw_name` holds no `&` or `=`: it is one name, decoded whole.
    url::form_urlencoded::parse(raw_name.as_bytes())
        .next()
        .is_some_and(|(name, _)| {
            name.eq_ignore_ascii_case("pass") || name.eq_ignore_ascii_case("password")
        })
}

/// Where a node keeps its rooms and peers ([`Config::mode`], [`crate::Node::mode`], the
/// `mode` of [`crate::Event::Ready`]). The seed's rule: no Redis URL means memory-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mode {
    /// In the shared Redis, with heartbeat, lease and reaper threads.
    Redis,
    /// In this process's memory only: no Redis URL was configured (single instance; no
    /// heartbeat, lease or reaper).
    Memory,
}

impl Mode {
    /// `redis` or `memory`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Redis => "redis",
            Mode::Memory => "memory",
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What [`ConfigBuilder::redis_url`] takes: a URL (`&str`, `String`, `&String`) or an
/// `Option` of one (`None` means memory-only mode).
pub trait IntoRedisUrl {
    /// The URL, if any (not yet trimmed).
    fn into_redis_url(self) -> Option<String>;
}

impl IntoRedisUrl for &str {
    fn into_redis_url(self) -> Option<String> {
        Some(self.to_owned())
    }
}

impl IntoRedisUrl for String {
    fn into_redis_url(self) -> Option<String> {
        Some(self)
    }
}

impl IntoRedisUrl for &String {
    fn into_redis_url(self) -> Option<String> {
        Some(self.clone())
    }
}

/// `None` (memory-only mode) or `Some(url)`, for every URL form above. A bare `None` needs its
/// type (`None::<&str>`); leaving the URL unset is the same.
impl<T: IntoRedisUrl> IntoRedisUrl for Option<T> {
    fn into_redis_url(self) -> Option<String> {
        self.and_then(IntoRedisUrl::into_redis_url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_seeds() {
        let t = Timings::default();
        assert_eq!(t.heartbeat_interval, Duration::from_secs(10));
        assert_eq!(t.heartbeat_ttl, Duration::from_secs(30));
        assert_eq!(t.stale_threshold, Duration::from_secs(45));
        assert_eq!(t.pin_ttl, Duration::from_secs(90));
        assert_eq!(t.lease_ttl, Duration::from_secs(90));
        assert_eq!(t.lease_refresh, Duration::from_secs(30));
        assert_eq!(t.two_phase_delay, Duration::from_secs(60));
        assert_eq!(t.reap_interval, Duration::from_secs(15));
        t.validate().unwrap();
        Timings::fast().validate().unwrap();
    }

    #[test]
    fn redaction_hides_passwords() {
        let cases = [
            ("redis://u:s3cret@h:1/0", "redis://u:***@h:1/0"),
            ("redis://:s3cret@h:1", "redis://:***@h:1"),
            ("redis://s3cret@h", "redis://***@h"),
            ("redis://h:1", "redis://h:1"),
            ("redis://127.0.0.1:6379/2", "redis://127.0.0.1:6379/2"),
            ("redis://[::1]:6379", "redis://[::1]:6379"),
            (
                "redis://u:s3cret@[::1]:6379/3",
                "redis://u:***@[::1]:6379/3",
            ),
            ("redis://:s3cret@[fe80::1]", "redis://:***@[fe80::1]"),
            // Percent-encoded delimiters in the password.
            ("redis://u:s3%40cr%2Fe%3Ft%23@h:1", "redis://u:***@h:1"),
            // An unencoded `@` in the password: the user info runs to the last `@`.
            ("redis://u:s3c@ret@h:1/0", "redis://u:***@h:1/0"),
            ("redis://s3c@ret@h", "redis://***@h"),
            ("redis://h:1/?protocol=resp3", "redis://h:1/?protocol=resp3"),
            ("redis://h#insecure", "redis://h#insecure"),
            ("redis://h#s3cret", "redis://h#***"),
            // Unix sockets: the password is the `pass` query parameter.
            ("redis+unix:///tmp/r.sock", "redis+unix:///tmp/r.sock"),
            (
                "redis+unix:///tmp/r.sock?db=1&pass=s3cret",
                "redis+unix:///tmp/r.sock?db=1&pass=***",
            ),
            (
                "redis+unix:///tmp/r.sock?pass=abc@TAIL",
                "redis+unix:///tmp/r.sock?pass=***",
            ),
            (
                "redis+unix:///tmp/r.sock?pass=s3/cr?et@x&db=2",
                "redis+unix:///tmp/r.sock?pass=***&db=2",
            ),
            (
                "unix:///tmp/r.sock?user=u&p%61ss=s3cret",
                "unix:///tmp/r.sock?user=u&p%61ss=***",
            ),
            (
                "unix:///tmp/r.sock?PASSWORD=s3cret&Pass=s3cret&pass=",
                "unix:///tmp/r.sock?PASSWORD=***&Pass=***&pass=***",
            ),
            (
                "unix:///tmp/r.sock?pass=s3c#ret",
                "unix:///tmp/r.sock?pass=***#***",
            ),
            (
                "valkey+unix:///tmp/r.sock?pa%73%73word=s3cret",
                "valkey+unix:///tmp/r.sock?pa%73%73word=***",
            ),
        ];
        for (url, want) in cases {
            assert_eq!(redact_url(url), want, "{url}");
        }
    }

    /// URLs that cannot be shown in part: a placeholder, with at most a known scheme.
    #[test]
    fn redaction_of_broken_urls_is_a_placeholder() {
        let cases = [
            "garbage s3cret",
            "s3cret",
            "",
            "redis://u:s3c/ret@h:1/0",
            "redis://u:s3c?ret@h:1/0",
            "redis://u:s3c#ret@h:1/0",
            "redis://u:123/s3cret@h",
            "redis://u:123?s3cret@h",
            "redis://u:123#s3cret@h",
            "redis://s3c/ret@h",
            "redis://h/?x=s3cret@h",
            "redis:s3cret@h",
            "redis:///s3cret@h",
            "redis://:s3cret@[not-a-host",
            "redis://:s3cret@",
            "unix:///tmp/s3cret@x",
            "unix:///tmp/r.sock?user=s3cret@x",
            "s3cret://u:p@h",
            "http://u:s3cret@h?pass=s3cret",
        ];
        for url in cases {
            let shown = redact_url(url);
            assert!(
                shown.starts_with('<') && shown.ends_with('>'),
                "{url}: {shown}"
            );
            for part in ["s3c", "ret", "123", "not-a-host", "u:", "@x", "@h", "tmp"] {
                assert!(!shown.contains(part), "{url}: {shown}");
            }
        }
        assert!(redact_url("redis://u:s3c/ret@h").starts_with("<redis:// URL"));
        assert!(redact_url("garbage s3cret").starts_with("<Redis URL"));
    }

    /// Whatever redis-rs would send as the password never shows up.
    #[test]
    fn redaction_hides_what_redis_rs_reads_as_the_password() {
        let urls = [
            "redis://u:pw-1@h:1/0",
            "redis://:pw%40-2@h",
            "redis://u:pw@-3@h",
            "redis://[::1]:1?pass=pw-x&password=pw-y",
            "redis+unix:///tmp/r.sock?pass=pw-4@T",
            "redis+unix:///tmp/r.sock?p%61ss=pw-5",
            "unix:///tmp/r.sock?db=0&pass=pw/6?x",
            "unix:///tmp/r.sock?pass=pw-7&pass=pw-8",
            "unix:///tmp/r.sock?pass=pw+9",
        ];
        for url in urls {
            let info = redis::IntoConnectionInfo::into_connection_info(url).unwrap();
            let shown = redact_url(url);
            if let Some(password) = info.redis_settings().password() {
                assert!(!shown.contains(password), "{url}: {shown}");
            }
            assert!(!shown.contains("pw"), "{url}: {shown}");
        }
    }

    #[test]
    fn debug_prints_hide_the_password() {
        let url = "redis://u:s3cret@127.0.0.1:6379/0";
        let b = Config::builder().redis_url(Some(url)).stage("a/b");
        let shown = format!("{b:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("u:***@127.0.0.1"), "{shown}");
        let c = b.build().unwrap();
        assert!(!format!("{c:?}").contains("s3cret"));
        assert!(!format!("{:?}", c.to_builder()).contains("s3cret"));
    }

    #[test]
    fn to_builder_keeps_the_prefix() {
        let c = Config::builder()
            .namespace(" acme ")
            .stage("prod_eu")
            .branch("feature/login")
            .build()
            .unwrap();
        assert_eq!(c.keys().prefix(), "acme:prod__eu:feature_2Flogin");
        let again = c.to_builder().build().unwrap();
        assert_eq!(again.keys(), c.keys());
        assert_eq!(again, c);
    }
}
