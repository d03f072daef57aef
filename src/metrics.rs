//! Metrics and health of a node: what [`crate::Node::metrics`] renders in the Prometheus text
//! format (or OpenMetrics) and what [`crate::Node::health`] says.
//!
//! Recording is cheap and lock-free: the counters are the node's existing relaxed atomics
//! (`state::Counters`, shared with [`crate::Stats`], so nothing is counted twice) and the two
//! duration histograms are arrays of atomics ([`DurationHistogram`]). All the work happens
//! at scrape time: a [`Snapshot`] of the values is taken and encoded with the
//! `prometheus-client` crate's text encoders. A leaf module: it imports only `error`.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use crate::error::Error;

/// Upper bounds (s) of the tick-duration histogram's buckets: a tick is two round trips, a
/// millisecond on a LAN; past `heartbeat_interval / 2` it counts as slow.
pub(crate) const TICK_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Upper bounds (s) of the reap-duration histogram's buckets: one dead instance's reap, from
/// a few rooms (milliseconds) to 100 000 rooms (tens of seconds; docs/src/performance.md).
pub(crate) const REAP_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// The values of the `kind` label of `sfu_redis_redis_errors_total`, in the order of
/// [`redis_error_kind`]'s indexes.
pub(crate) const REDIS_ERROR_KINDS: [&str; 4] = ["timeout", "connection", "reply", "other"];

/// The index in [`REDIS_ERROR_KINDS`] of an error a worker met: `timeout` (a call timed
/// out), `connection` (refused, dropped, broken), `reply` (the server answered with an error:
/// `READONLY`, `OOM`, `NOAUTH`, a script error...), `other` (anything else).
pub(crate) fn redis_error_kind(e: &Error) -> usize {
    match e {
        _ if e.is_timeout() => 0,
        _ if e.is_connection_error() => 1,
        Error::Redis { source, .. } if source.code().is_some() => 2,
        _ => 3,
    }
}

/// A histogram of durations made of atomics: one counter per bucket and the sum in
/// nanoseconds. [`DurationHistogram::observe`] is a few relaxed `fetch_add`s, no lock.
#[derive(Debug)]
pub(crate) struct DurationHistogram {
    /// Upper bounds (s), increasing.
    bounds: &'static [f64],
    /// Observations per bucket (not cumulative); the last one is above every bound.
    buckets: Box<[AtomicU64]>,
    sum_ns: AtomicU64,
}

/// A [`DurationHistogram`] read at one moment.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HistogramSnapshot {
    /// `(upper bound in s, observations in that bucket)`, not cumulative; the last bound is
    /// `+Inf`.
    pub buckets: Vec<(f64, u64)>,
    pub count: u64,
    /// Sum of the observations, s.
    pub sum: f64,
}

impl DurationHistogram {
    pub(crate) fn new(bounds: &'static [f64]) -> Self {
        DurationHistogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
        }
    }

    /// Records one duration.
    pub(crate) fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = self
            .bounds
            .iter()
            .position(|&b| s <= b)
            .unwrap_or(self.bounds.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The buckets, their total and the sum. Read without a lock while observations go on:
    /// the count is the total of the buckets as read, so the exposition is self-consistent
    /// (the sum may include an observation the buckets do not yet show).
    pub(crate) fn snapshot(&self) -> HistogramSnapshot {
        let buckets: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(self.buckets.iter().map(|b| b.load(Ordering::Relaxed)))
            .collect();
        HistogramSnapshot {
            count: buckets.iter().map(|(_, n)| n).sum(),
            sum: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
            buckets,
        }
    }
}

/// Whether a node is healthy ([`crate::Node::health`]; what `GET /healthz` of
/// `sfu-redis node --metrics-addr` answers: 200 when `ok`, 503 otherwise, `reason` as body).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// True when the last successful heartbeat is younger than `heartbeat_ttl` (the
    /// instance's heartbeat key still lives, so other instances see it alive), or in
    /// memory-only mode (there is no heartbeat to miss). False once the node stopped.
    pub ok: bool,
    /// Why, in one line: the heartbeat's age against the TTL, and when unhealthy the last
    /// error seen (never a password).
    pub reason: String,
}

/// The text formats [`crate::Node::metrics_as`] renders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MetricsFormat {
    /// The Prometheus text exposition format 0.0.4: what every Prometheus-compatible
    /// scraper reads. [`crate::Node::metrics`] renders this.
    Prometheus,
    /// OpenMetrics 1.0 text: units in `# UNIT` lines, counters typed without their `_total`
    /// suffix, `# EOF` at the end (a truncated scrape is detected).
    OpenMetrics,
}

impl MetricsFormat {
    /// The HTTP `Content-Type` of this format.
    pub fn content_type(self) -> &'static str {
        match self {
            MetricsFormat::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
            MetricsFormat::OpenMetrics => {
                "application/openmetrics-text; version=1.0.0; charset=utf-8"
            }
        }
    }

    /// The format a scraper asks for in its HTTP `Accept` header: OpenMetrics when it names
    /// `application/openmetrics-text` (as Prometheus does), else the Prometheus text format.
    pub fn from_accept(accept: &str) -> MetricsFormat {
        if accept
            .to_ascii_lowercase()
            .contains("application/openmetrics-text")
        {
            MetricsFormat::OpenMetrics
        } else {
            MetricsFormat::Prometheus
        }
    }
}

/// Every value a scrape reports, read from the node at one moment (`Node::metrics_as`).
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub instance: String,
    pub mode: &'static str,
    pub prefix: String,
    pub healthy: bool,
    pub heartbeat_age: Option<Duration>,
    pub heartbeats: u64,
    pub heartbeat_failures: u64,
    pub slow_ticks: u64,
    pub tick: HistogramSnapshot,
    pub is_leader: bool,
    /// The current term's epoch, 0 when not leading.
    pub leader_epoch: u64,
    /// The highest epoch this node has seen.
    pub epoch_seen: u64,
    pub leadership_terms: u64,
    pub candidates: u64,
    pub reaps: u64,
    pub reaped_rooms: u64,
    pub reaped_peers: u64,
    pub skipped_rooms: u64,
    pub reap: HistogramSnapshot,
    /// Per [`REDIS_ERROR_KINDS`].
    pub redis_errors: [u64; 4],
    pub bad_data: u64,
    pub reconnects: u64,
    pub script_reloads: u64,
    pub master_switches: u64,
    pub events_dropped: u64,
    pub data_losses: u64,
    pub reaped_self: u64,
    pub rooms: u64,
    pub peers: u64,
}

/// Writes one metric without labels.
fn one(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    metric: &impl EncodeMetric,
) -> fmt::Result {
    let m = enc.encode_descriptor(name, help, unit, metric.metric_type())?;
    metric.encode(m)
}

fn counter(enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: u64) -> fmt::Result {
    one(enc, name, help, None, &ConstCounter::new(v))
}

fn gauge(enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: u64) -> fmt::Result {
    one(enc, name, help, None, &ConstGauge::new(v))
}

fn histogram(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    h: &HistogramSnapshot,
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Histogram)?;
    m.encode_histogram::<prometheus_client::encoding::NoLabelSet>(h.sum, h.count, &h.buckets, None)
}

impl Collector for Snapshot {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> fmt::Result {
        let e = &mut enc;
        {
            let mut m = e.encode_descriptor(
                "sfu_redis_node",
                "This node: instance id, mode (redis or memory) and key prefix; always 1.",
                None,
                MetricType::Gauge,
            )?;
            let labels = [
                ("instance_id", self.instance.as_str()),
                ("mode", self.mode),
                ("prefix", self.prefix.as_str()),
            ];
            ConstGauge::new(1u64).encode(m.encode_family(&labels)?)?;
        }
        gauge(
            e,
            "sfu_redis_healthy",
            "1 when the last successful heartbeat is younger than heartbeat_ttl (or in memory-only mode), else 0: what /healthz answers.",
            u64::from(self.healthy),
        )?;
        // NaN before any heartbeat (memory-only mode): no age to report.
        let age = self.heartbeat_age.map_or(f64::NAN, |d| d.as_secs_f64());
        one(
            e,
            "sfu_redis_heartbeat_age",
            "Time since the last successful heartbeat tick.",
            Some(&Unit::Seconds),
            &ConstGauge::new(age),
        )?;
        counter(
            e,
            "sfu_redis_heartbeats",
            "Successful heartbeat ticks.",
            self.heartbeats,
        )?;
        counter(
            e,
            "sfu_redis_heartbeat_failures",
            "Failed heartbeat ticks (each is retried with backoff).",
            self.heartbeat_failures,
        )?;
        counter(
            e,
            "sfu_redis_slow_ticks",
            "Heartbeat ticks longer than heartbeat_interval / 2 (the leader skips a reap round in which it saw one).",
            self.slow_ticks,
        )?;
        histogram(
            e,
            "sfu_redis_tick_duration",
            "Duration of each heartbeat tick (heartbeat script, pin refresh, settlements), failed ones included.",
            &self.tick,
        )?;
        gauge(
            e,
            "sfu_redis_is_leader",
            "1 while this node holds the reaper lease (its local deadline has not passed), else 0.",
            u64::from(self.is_leader),
        )?;
        gauge(
            e,
            "sfu_redis_leader_epoch",
            "Epoch (fencing token) of this node's current leadership term; 0 when not leading.",
            self.leader_epoch,
        )?;
        gauge(
            e,
            "sfu_redis_epoch_seen",
            "Highest epoch this node has seen (its terms and the heartbeat replies).",
            self.epoch_seen,
        )?;
        counter(
            e,
            "sfu_redis_leadership_terms",
            "Leadership terms this node began (reaper lease acquired).",
            self.leadership_terms,
        )?;
        counter(
            e,
            "sfu_redis_reap_candidates",
            "Stale instances found by this node's reap rounds (each round's candidates counted once; re-checked before any reap).",
            self.candidates,
        )?;
        counter(
            e,
            "sfu_redis_reaps",
            "Dead instances this node reaped.",
            self.reaps,
        )?;
        counter(
            e,
            "sfu_redis_reaped_rooms",
            "Rooms deleted by this node's reaps.",
            self.reaped_rooms,
        )?;
        counter(
            e,
            "sfu_redis_reaped_peers",
            "Peer records deleted by this node's reaps.",
            self.reaped_peers,
        )?;
        counter(
            e,
            "sfu_redis_skipped_rooms",
            "Rooms of reaped instances left alone because a live instance owned them by then (owner CAS).",
            self.skipped_rooms,
        )?;
        histogram(
            e,
            "sfu_redis_reap_duration",
            "Duration of each dead instance's reap (re-check, rooms, peers).",
            &self.reap,
        )?;
        {
            let mut m = e.encode_descriptor(
                "sfu_redis_redis_errors",
                "Redis errors met by the worker threads, by kind: timeout, connection (refused, dropped, broken), reply (an error reply such as READONLY or OOM), other.",
                None,
                MetricType::Counter,
            )?;
            for (kind, n) in REDIS_ERROR_KINDS.iter().zip(self.redis_errors) {
                let labels = [("kind", *kind)];
                ConstCounter::new(n).encode(m.encode_family(&labels)?)?;
            }
        }
        counter(
            e,
            "sfu_redis_bad_data",
            "Keys of the wrong type or malformed records met by the worker threads (see fsck).",
            self.bad_data,
        )?;
        counter(
            e,
            "sfu_redis_reconnects",
            "Connections made again after one was dropped (error, timeout, failover, dead idle connection).",
            self.reconnects,
        )?;
        counter(
            e,
            "sfu_redis_script_reloads",
            "Script-cache reloads after a NOSCRIPT reply (SCRIPT FLUSH, a restarted server).",
            self.script_reloads,
        )?;
        counter(
            e,
            "sfu_redis_master_switches",
            "Times a new connection reached another master than the last one (a failover or a restart).",
            self.master_switches,
        )?;
        counter(
            e,
            "sfu_redis_events_dropped",
            "Events dropped because the node's event channel was full.",
            self.events_dropped,
        )?;
        counter(
            e,
            "sfu_redis_data_losses",
            "Times this node found Redis had lost its data (its record gone and the dataset token changed; on a cluster one master's token, per master) and restored what it holds.",
            self.data_losses,
        )?;
        counter(
            e,
            "sfu_redis_reaped_self",
            "Times this node found it had been reaped while unresponsive (a zombie): its rooms were lost; it registered again.",
            self.reaped_self,
        )?;
        gauge(e, "sfu_redis_rooms", "Rooms this node owns.", self.rooms)?;
        gauge(
            e,
            "sfu_redis_peers",
            "Peers this node upserted and has not removed.",
            self.peers,
        )
    }
}

/// The exposition of `snapshot` in `format`.
pub(crate) fn render(snapshot: Snapshot, format: MetricsFormat) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(snapshot));
    let mut out = String::with_capacity(8 * 1024);
    let written = match format {
        MetricsFormat::Prometheus => {
            prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)
        }
        MetricsFormat::OpenMetrics => {
            prometheus_client::encoding::text::encode(&mut out, &registry)
        }
    };
    // Writing to a String cannot fail; an encoder error would be a bug of ours (say, an
    // invalid name): report it in the exposition rather than panic in a scrape.
    if let Err(e) = written {
        log::error!("cannot encode the metrics: {e}");
        out.push_str("# sfu-redis: the metrics could not be encoded\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_counts_each_duration_in_its_bucket_and_sums_them() {
        let h = DurationHistogram::new(&[0.001, 0.01]);
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_millis(1));
        h.observe(Duration::from_millis(5));
        h.observe(Duration::from_secs(2));
        let s = h.snapshot();
        assert_eq!(s.buckets, vec![(0.001, 2), (0.01, 1), (f64::INFINITY, 1)]);
        assert_eq!(s.count, 4);
        assert!((s.sum - 2.0065).abs() < 1e-9, "sum {}", s.sum);
    }

    #[test]
    fn the_accept_header_picks_the_format() {
        let prom = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5";
        assert_eq!(MetricsFormat::from_accept(prom), MetricsFormat::OpenMetrics);
        assert_eq!(MetricsFormat::from_accept("*/*"), MetricsFormat::Prometheus);
        assert_eq!(MetricsFormat::from_accept(""), MetricsFormat::Prometheus);
    }
}
