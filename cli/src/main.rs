//! `sfu-redis`: run an SFU instance's liveness layer (`node`), show the fleet (`status`), or
//! watch heartbeats, leader election and the two-phase reaper at work (`demo`).
//!
//! Exit codes: 0 success, 1 runtime failure (Redis unreachable, a demo check failed),
//! 2 invalid usage or configuration, 130 demo interrupted.

/// `println!` that ignores a closed stdout (`sfu-redis demo | head` must not panic: the demo
/// still has to stop its nodes and delete its keys).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

mod churn;
mod demo;
mod doctor;
mod fsck;
mod http;
mod metrics;
mod migrate;
mod node;
mod progress;
mod reap;
mod signals;
mod status;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use serde_json::Value;
use sfu_redis::{Config, ConfigBuilder, Event};

pub(crate) use signals::{signal_channel, signalled};

/// Liveness and cleanup of a multi-instance SFU's Redis metadata.
#[derive(Debug, Parser)]
#[command(name = "sfu-redis", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one SFU instance (heartbeat, lease, reaper) until SIGINT/SIGTERM, printing its events
    /// on stdout.
    Node(Box<node::NodeArgs>),
    /// Show the fleet of one prefix as Redis sees it: leader, epoch, instances.
    ///
    /// Each instance is alive (heartbeating), stopped (left cleanly, key not expired yet), late
    /// (heartbeat key expired, last heartbeat younger than its stale threshold), stale (a reap
    /// candidate) or being_reaped. Each is judged with its own stale threshold, read from its
    /// record (P:{ctl}:instance:<I>:info; the default 45000 ms without one);
    /// --heartbeat-ttl-ms / --stale-factor override it for every instance. Garbage in the
    /// control keys is listed as problems (exit 0); exit 1 when Redis cannot be reached or
    /// refuses to list the fleet (a cluster that is down), 2 on bad flags or without a Redis
    /// URL.
    Status(status::StatusArgs),
    /// Audit one prefix's keys against the data model (exit 0 clean or fully repaired, 1
    /// problems remain, 2 error); --repair fixes what is safe while nodes keep running.
    Fsck(fsck::FsckArgs),
    /// Reap one dead instance now (no stale wait, no two-phase delay, no lease), with the
    /// leader's owner-CAS scripts; safe while a leader reaps it too. Refuses an instance that
    /// still has a heartbeat key or heartbeated within its stale threshold unless --force, and
    /// one whose heartbeat key holds a live boot token always. Exit 0 reaped (or would be,
    /// --dry-run), 1 refused, 2 bad input or cannot check (malformed or unknown id, Redis
    /// unreachable).
    Reap(reap::ReapArgs),
    /// Check the Redis a fleet uses and the fleet: server version, eviction policy,
    /// persistence, replicas, ACL, latency, topology, leader and instances. Exit 0 all good
    /// (warnings included), 1 a check failed, 2 nothing could be checked (bad flags, Redis
    /// unreachable, authentication refused).
    Doctor(doctor::DoctorArgs),
    /// Bring a prefix's keys to the key schema version this release speaks: --dry-run lists
    /// the steps, --apply runs them (step 1 to 2 needs every node stopped). Exit 0 at this release's
    /// version (or the plan was listed), 1 refused (the prefix is in a version this release does
    /// not know; nothing written), 2 bad flags or Redis unreachable.
    Migrate(migrate::MigrateArgs),
    /// Run three in-process instances, crash two of them and watch the survivor clean up;
    /// checks the result and exits non-zero if a check fails. With --sentinel, through Redis
    /// Sentinel, failing the master over in between; with --cluster, on a Redis Cluster.
    Demo(demo::DemoArgs),
}

/// Where Redis is and which key prefix (`<namespace>:<stage>:<branch>`) to use.
#[derive(Debug, Clone, Args)]
pub(crate) struct RedisArgs {
    /// Redis URL: redis://[user:password@]host:port[/db], rediss://... (TLS),
    /// redis+sentinel://[user:password@]host1:port1,host2:port2/<master-name>[/db],
    /// rediss+sentinel://..., redis+cluster://[user:password@]host1:port1,host2:port2,... or
    /// rediss+cluster://...; empty means memory-only mode.
    #[arg(long, env = "REDIS_URL", hide_env_values = true, value_name = "URL")]
    pub redis_url: Option<String>,
    #[command(flatten)]
    pub transport: TransportArgs,
    /// First key prefix segment.
    #[arg(
        long,
        env = "SFU_NAMESPACE",
        hide_env_values = true,
        default_value = "sfu",
        value_name = "NAME"
    )]
    pub namespace: String,
    /// Second key prefix segment (dev, staging, prod, ...).
    #[arg(
        long,
        env = "SFU_STAGE",
        hide_env_values = true,
        default_value = "dev",
        value_name = "NAME"
    )]
    pub stage: String,
    /// Third key prefix segment.
    #[arg(
        long,
        env = "SFU_BRANCH",
        hide_env_values = true,
        default_value = "main",
        value_name = "NAME"
    )]
    pub branch: String,
}

/// How to reach the Redis of a URL: TLS files and the sentinels' own credentials (shared by
/// every subcommand that connects, the demo included).
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct TransportArgs {
    /// CA certificate file (PEM) the server must chain to (TLS URLs; default: the system's
    /// roots).
    #[arg(long, env = "SFU_TLS_CA_FILE", value_name = "FILE")]
    pub tls_ca_file: Option<PathBuf>,
    /// Client certificate file (PEM) for mutual TLS (with --tls-key-file).
    #[arg(long, env = "SFU_TLS_CERT_FILE", value_name = "FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// Private key file (PEM) of --tls-cert-file.
    #[arg(long, env = "SFU_TLS_KEY_FILE", value_name = "FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// Skip TLS certificate verification (for tests only; warned at every connect). The
    /// environment takes 1/0 (also true/false, yes/no, on/off).
    #[arg(
        long,
        env = "SFU_TLS_INSECURE",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub tls_insecure: bool,
    /// User the sentinels authenticate, when they need their own (sentinel URLs).
    #[arg(
        long,
        env = "SFU_SENTINEL_USER",
        hide_env_values = true,
        value_name = "USER"
    )]
    pub sentinel_user: Option<String>,
    /// The sentinels' own password (sentinel URLs); never printed.
    #[arg(
        long,
        env = "SFU_SENTINEL_PASSWORD",
        hide_env_values = true,
        value_name = "PASSWORD"
    )]
    pub sentinel_password: Option<String>,
}

impl RedisArgs {
    /// A config builder with these connection and prefix settings.
    pub fn builder(&self) -> ConfigBuilder {
        let b = Config::builder()
            .redis_url(self.redis_url.as_deref())
            .namespace(&self.namespace)
            .stage(&self.stage)
            .branch(&self.branch);
        self.transport.apply(b)
    }
}

impl TransportArgs {
    /// `b` with these TLS and sentinel settings.
    pub fn apply(&self, mut b: ConfigBuilder) -> ConfigBuilder {
        if let Some(f) = &self.tls_ca_file {
            b = b.tls_ca_file(f);
        }
        if let Some(f) = &self.tls_cert_file {
            b = b.tls_cert_file(f);
        }
        if let Some(f) = &self.tls_key_file {
            b = b.tls_key_file(f);
        }
        if self.tls_insecure {
            b = b.tls_insecure(true);
        }
        if let Some(u) = &self.sentinel_user {
            b = b.sentinel_user(u);
        }
        if let Some(p) = &self.sentinel_password {
            b = b.sentinel_password(p);
        }
        b
    }

    /// The flags that are set, for messages: `--tls-ca-file`, `--sentinel-password`, ...
    pub fn set_flags(&self) -> Vec<&'static str> {
        [
            (self.tls_ca_file.is_some(), "--tls-ca-file"),
            (self.tls_cert_file.is_some(), "--tls-cert-file"),
            (self.tls_key_file.is_some(), "--tls-key-file"),
            (self.tls_insecure, "--tls-insecure"),
            (self.sentinel_user.is_some(), "--sentinel-user"),
            (self.sentinel_password.is_some(), "--sentinel-password"),
        ]
        .into_iter()
        .filter_map(|(set, flag)| set.then_some(flag))
        .collect()
    }
}

/// Why a subcommand failed, and with which exit code.
#[derive(Debug)]
pub(crate) struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    /// Invalid usage or configuration: exit 2.
    pub fn usage(message: impl Into<String>) -> Self {
        Failure {
            code: 2,
            message: message.into(),
        }
    }

    /// A runtime failure: exit 1.
    pub fn runtime(message: impl Into<String>) -> Self {
        Failure {
            code: 1,
            message: message.into(),
        }
    }

    /// A failed [`sfu_redis::ConfigBuilder::build`]: exit 2, naming the flag that sets the
    /// field at fault.
    pub fn config(e: &sfu_redis::Error) -> Self {
        let mut message = e.to_string();
        if let sfu_redis::Error::InvalidConfig { field, .. } = e {
            if let Some(flag) = flag_for_field(field) {
                message.push_str(&format!(" (see {flag})"));
            }
        }
        Failure::usage(message)
    }
}

/// The command-line flag that sets a configuration field.
fn flag_for_field(field: &str) -> Option<&'static str> {
    Some(match field {
        "redis_url" => "--redis-url / REDIS_URL",
        "tls_ca_file" => "--tls-ca-file / SFU_TLS_CA_FILE",
        "tls_cert_file" => "--tls-cert-file / SFU_TLS_CERT_FILE",
        "tls_key_file" => "--tls-key-file / SFU_TLS_KEY_FILE",
        "tls_insecure" => "--tls-insecure / SFU_TLS_INSECURE",
        "sentinel_user" => "--sentinel-user / SFU_SENTINEL_USER",
        "sentinel_password" => "--sentinel-password / SFU_SENTINEL_PASSWORD",
        "namespace" => "--namespace / SFU_NAMESPACE",
        "stage" => "--stage / SFU_STAGE",
        "branch" => "--branch / SFU_BRANCH",
        "instance_id" => "--instance-id / SFU_INSTANCE_ID",
        "heartbeat_interval" => "--heartbeat-interval-ms",
        "heartbeat_ttl" => "--heartbeat-ttl-ms",
        "stale_threshold" => "--stale-factor",
        "pin_ttl" => "--pin-ttl-ms",
        "lease_ttl" => "--lease-ttl-ms",
        "lease_refresh" => "--lease-refresh-ms",
        "two_phase_delay" => "--two-phase-delay-ms",
        "reap_interval" => "--reap-interval-ms",
        "command_timeout" => "--command-timeout-ms",
        "reap_batch" => "--reap-batch",
        "reap_pace" => "--reap-pace / SFU_REAP_PACE",
        _ => return None,
    })
}

/// Parses `--stale-factor`: a finite number greater than zero.
pub(crate) fn parse_factor(s: &str) -> Result<f64, String> {
    let f: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    if f.is_finite() && f > 0.0 {
        Ok(f)
    } else {
        Err(format!("{s:?} must be a finite number greater than zero"))
    }
}

/// `ttl x factor`, rounded to whole milliseconds.
pub(crate) fn scaled(ttl: Duration, factor: f64) -> Result<Duration, Failure> {
    let ms = (ttl.as_millis() as f64 * factor).round();
    if ms.is_finite() && ms >= 0.0 && ms < u64::MAX as f64 {
        Ok(Duration::from_millis(ms as u64))
    } else {
        Err(Failure::usage(format!(
            "invalid configuration `stale_threshold`: heartbeat_ttl x {factor} is out of range (see --stale-factor)"
        )))
    }
}

/// `what: e`, adding `on <redacted url>` unless the error already names it.
pub(crate) fn with_place(what: &str, url: Option<&str>, e: &sfu_redis::Error) -> String {
    let msg = e.to_string();
    match url.map(sfu_redis::redact_url) {
        Some(safe) if !msg.contains(&safe) => format!("{what} on {safe}: {msg}"),
        _ => format!("{what}: {msg}"),
    }
}

/// An event's fields (without `event` and `instance`) as `k=v` pairs for people, in a
/// readable order: `dead=sfu-a rooms=3 peers=9 skipped_rooms=0`.
pub(crate) fn event_fields(event: &Event) -> String {
    const ORDER: [&str; 11] = [
        "dead",
        "rooms",
        "peers",
        "skipped_rooms",
        "forced",
        "room",
        "new_owner",
        "room_ids",
        "instances",
        "epoch",
        "reason",
    ];
    let Value::Object(map) = event.to_json("") else {
        return String::new();
    };
    let mut keys: Vec<&String> = map
        .keys()
        .filter(|k| *k != "event" && *k != "instance" && *k != "ts_ms")
        .collect();
    keys.sort_by_key(|k| {
        (
            ORDER.iter().position(|o| o == k).unwrap_or(ORDER.len()),
            k.as_str(),
        )
    });
    keys.iter()
        .map(|k| format!("{k}={}", plain(&map[k.as_str()])))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A JSON value for people: strings unquoted, null as `-`, lists as `[a,b]`.
fn plain(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(plain).collect::<Vec<_>>().join(",")
        ),
        other => other.to_string(),
    }
}

fn init_logging() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .target(env_logger::Target::Stderr)
        .init();
}

/// Empty environment variables count as unset, as in `Config::from_env` (an empty
/// `SFU_STAGE` means `dev`, an empty `SFU_INSTANCE_ID` a generated id). An explicitly empty
/// flag (`--stage ""`) is still refused.
fn drop_empty_env() {
    for var in sfu_redis::config::ENV_VARS {
        if std::env::var_os(var).is_some_and(|v| v.to_string_lossy().trim().is_empty()) {
            // Still single-threaded: nothing else reads the environment concurrently.
            std::env::remove_var(var);
        }
    }
}

fn main() -> ExitCode {
    // First, before any thread starts: every thread inherits the mask (signals.rs).
    if let Err(f) = signals::install() {
        eprintln!("sfu-redis: warning: {}", f.message);
    }
    drop_empty_env();
    let cli = Cli::parse();
    init_logging();
    let result = match cli.command {
        Command::Node(args) => node::run(*args),
        Command::Status(args) => status::run(args),
        Command::Fsck(args) => fsck::run(args),
        Command::Reap(args) => reap::run(args),
        Command::Doctor(args) => doctor::run(args),
        Command::Migrate(args) => migrate::run(args),
        Command::Demo(args) => demo::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("sfu-redis: error: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

/// The reader of the book's reference pages the tests share (`tests/it/support/pages.rs`).
#[cfg(test)]
#[path = "../../tests/it/support/pages.rs"]
mod pages;

/// The CLI's map from a setting to its flag and environment variable ([`flag_for_field`],
/// which the configuration errors cite) against docs/src/reference/configuration.md, both
/// ways (issue 30, item 3): each row of its Settings table names exactly the flags and
/// variables the map gives the row's settings (the settings are the library's,
/// `pages::settings`).
#[cfg(test)]
mod reference_tests {
    use std::collections::BTreeSet;

    use super::{flag_for_field, pages};

    #[test]
    fn flag_for_field_is_the_configuration_references() {
        let settings = pages::settings();
        let page = pages::Page::reference("configuration.md");
        let mut problems = Vec::new();
        for row in pages::setting_rows(&page) {
            let (mut flags, mut vars) = (BTreeSet::new(), BTreeSet::new());
            for name in row.names.iter().filter(|n| settings.contains(n)) {
                for part in flag_for_field(name).unwrap_or_default().split(" / ") {
                    if part.starts_with("--") {
                        flags.insert(part.to_owned());
                    } else if !part.is_empty() {
                        vars.insert(part.to_owned());
                    }
                }
            }
            let doc_flags: BTreeSet<String> = row.flags.iter().cloned().collect();
            let doc_vars: BTreeSet<String> = row.env_vars.iter().cloned().collect();
            if (&flags, &vars) != (&doc_flags, &doc_vars) {
                problems.push(format!(
                    "{}:{}: the CLI sets {:?} with {flags:?} and {vars:?} (cli/src/main.rs: flag_for_field); the row names {doc_flags:?} and {doc_vars:?}",
                    pages::CONFIGURATION,
                    row.line,
                    row.names
                ));
            }
        }
        assert!(
            problems.is_empty(),
            "{} difference(s) between the reference and the CLI (fix {}, or flag_for_field if the code is wrong):\n{}",
            problems.len(),
            pages::CONFIGURATION,
            problems.join("\n")
        );
    }
}
