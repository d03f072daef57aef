//! `sfu-redis doctor`: checks the Redis a fleet uses (version, eviction policy, persistence,
//! replicas, ACL, latency, topology) and the fleet itself, each as `{name, status, detail}`.
//!
//! Every server-level check runs on each master (one server: on it; a cluster: every master,
//! each with its own configuration). A check whose command is refused (`CONFIG` renamed away,
//! `INFO` or `ACL` denied) says `could not tell: <reason>` with status `warn`, and the other
//! checks still run. Exit 0 when no check fails (warnings included), 1 when one fails, 2 when
//! nothing can be checked (bad flags, Redis unreachable, authentication refused).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::time::{Duration, Instant};

use clap::Args;
use redis::{Connection, Value};
use serde_json::json;
use sfu_redis::commands::{acl_probes, Need, Probe};
use sfu_redis::conn::{Conn, Redis};
use sfu_redis::info::InstanceInfo;
use sfu_redis::keys::{encode_id, IdKind, KeySpace};
use sfu_redis::status::{fleet_status, FleetStatus, InstanceState};
use sfu_redis::{Config, Timings};

use crate::{Failure, RedisArgs};

#[derive(Debug, Args)]
pub(crate) struct DoctorArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// The command timeout the fleet runs with, for the connection and the latency check
    /// [default: the smallest in the instances' records, else 2000].
    #[arg(long, value_name = "MS", value_parser = parse_ms)]
    command_timeout_ms: Option<u64>,
    /// PINGs per server for the latency check.
    #[arg(long, value_name = "N", default_value_t = 300, value_parser = parse_pings)]
    pings: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

fn parse_ms(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(ms) if ms >= 1 => Ok(ms),
        Ok(_) => Err("must be at least 1 (milliseconds)".into()),
        Err(_) => Err(format!("{s:?} is not a whole number of milliseconds")),
    }
}

fn parse_pings(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (10..=100_000).contains(&n) => Ok(n),
        _ => Err(format!("{s:?} is not a whole number from 10 to 100000")),
    }
}

/// A check's outcome; the order is the severity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Status {
    Ok,
    Warn,
    Fail,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One check: a fixed name (the README's table), a status and one line of detail.
#[derive(Debug, Clone)]
pub(crate) struct Check {
    name: &'static str,
    status: Status,
    detail: String,
}

fn check(name: &'static str, (status, detail): (Status, String)) -> Check {
    Check {
        name,
        status,
        detail,
    }
}

fn could_not_tell(why: impl std::fmt::Display) -> (Status, String) {
    (Status::Warn, format!("could not tell: {why}"))
}

/// The latency check's thresholds: p99 above this share of the command timeout is a warning,
/// above the second a failure.
const LATENCY_WARN: f64 = 0.10;
const LATENCY_FAIL: f64 = 0.50;

pub(crate) fn run(args: DoctorArgs) -> Result<(), Failure> {
    let base = args
        .redis
        .builder()
        .build()
        .map_err(|e| Failure::config(&e))?;
    let Some(url) = base.redis_url().map(str::to_owned) else {
        return Err(Failure::usage(
            "doctor checks a Redis: pass --redis-url or set REDIS_URL",
        ));
    };
    let secrets = secrets(&url, &args);
    let mut timings = Timings::default();
    if let Some(ms) = args.command_timeout_ms {
        timings.command_timeout = Duration::from_millis(ms);
    }
    let config = args
        .redis
        .builder()
        .timings(timings)
        .build()
        .map_err(|e| Failure::config(&e))?;
    let (checks, connected) = checks(&config, &args);
    let report = Report {
        url: sfu_redis::redact_url(&url),
        prefix: config.keys().prefix().to_owned(),
        checks,
    };
    let text = if args.json {
        report.to_json().to_string()
    } else {
        report.to_text()
    };
    let text = scrub(&text, &secrets);
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")
        .and_then(|()| out.flush())
        .map_err(|e| Failure::runtime(format!("cannot write to stdout: {e}")))?;
    if !connected {
        let detail = report.checks.first().map(|c| c.detail.as_str());
        return Err(Failure {
            code: 2,
            message: scrub(
                &format!("cannot check Redis: {}", detail.unwrap_or("no connection")),
                &secrets,
            ),
        });
    }
    match report.status() {
        Status::Fail => Err(Failure::runtime(format!(
            "{} check(s) failed: {}",
            report.count(Status::Fail),
            report
                .checks
                .iter()
                .filter(|c| c.status == Status::Fail)
                .map(|c| c.name)
                .collect::<Vec<_>>()
                .join(", ")
        ))),
        _ => Ok(()),
    }
}

/// Runs every check; `false` when Redis could not be reached (only `connect` is returned).
fn checks(config: &Config, args: &DoctorArgs) -> (Vec<Check>, bool) {
    let started = Instant::now();
    let connected = Redis::from_config(config).and_then(|r| r.connect().map(|c| (r, c)));
    let (redis, mut con) = match connected {
        Ok(rc) => rc,
        Err(e) => {
            let detail = format!("cannot connect: {e}");
            return (vec![check("connect", (Status::Fail, detail))], false);
        }
    };
    let connect = (
        Status::Ok,
        format!(
            "{} ({}) in {} ms",
            redis.safe_url(),
            redis.describe(),
            started.elapsed().as_millis()
        ),
    );
    let labels = con.cluster_masters();
    let fleet = Fleet::read(config, &mut con);
    let timeout = args
        .command_timeout_ms
        .map(Duration::from_millis)
        .or(fleet.command_timeout())
        .unwrap_or(config.timings().command_timeout);
    // Each check on a connection of its own: a timed-out read may still deliver its reply
    // late, which must not be taken for the answer to another check's command.
    let per_server = |f: &dyn Fn(&mut Connection) -> (Status, String)| match redis
        .connect()
        .and_then(|mut own| own.on_each_server(|c| f(c)))
    {
        Ok(results) => merge(&labels, results),
        Err(e) => could_not_tell(e),
    };
    let keys = config.keys().clone();
    let cluster = con.is_cluster();
    let checks = vec![
        check("connect", connect),
        check("server_version", per_server(&server_version)),
        check("maxmemory_policy", per_server(&maxmemory_policy)),
        check("persistence", per_server(&persistence)),
        check("replicas", per_server(&|c| replicas(c, cluster))),
        check("acl", per_server(&|c| acl(c, &keys, cluster))),
        check("latency", per_server(&|c| latency(c, args.pings, timeout))),
        check("topology", topology(&redis, &mut con, config)),
        check("fleet", fleet.judge()),
    ];
    (checks, true)
}

/// One result per server into one: the worst status; one detail when every server said the
/// same, else `host:port: detail` for each.
fn merge(labels: &[String], results: Vec<(Status, String)>) -> (Status, String) {
    let status = results.iter().map(|r| r.0).max().unwrap_or(Status::Ok);
    let details: BTreeSet<&String> = results.iter().map(|r| &r.1).collect();
    if labels.len() != results.len() || results.len() < 2 {
        let detail = results.first().map(|r| r.1.clone()).unwrap_or_default();
        return (status, detail);
    }
    if details.len() == 1 {
        return (status, format!("{} (every master)", results[0].1));
    }
    let parts: Vec<String> = labels
        .iter()
        .zip(&results)
        .map(|(l, (_, d))| format!("{l}: {d}"))
        .collect();
    (status, parts.join("; "))
}

/// `INFO <section>` as `field -> value`.
fn info(c: &mut Connection, section: &str) -> redis::RedisResult<BTreeMap<String, String>> {
    let text: String = redis::cmd("INFO").arg(section).query(c)?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect())
}

/// `CONFIG GET <names...>` as `name -> value`.
fn config_get(c: &mut Connection, names: &[&str]) -> redis::RedisResult<BTreeMap<String, String>> {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg(names);
    let pairs: Vec<String> = cmd.query(c)?;
    Ok(pairs
        .chunks(2)
        .filter_map(|p| Some((p.first()?.clone(), p.get(1)?.clone())))
        .collect())
}

/// A refused command's reason, one line.
fn reason(e: &redis::RedisError) -> String {
    e.to_string().lines().next().unwrap_or_default().to_owned()
}

fn server_version(c: &mut Connection) -> (Status, String) {
    let version = match info(c, "server") {
        Ok(i) => i.get("redis_version").cloned(),
        Err(e) if e.code().is_none() => return could_not_tell(format!("INFO: {}", reason(&e))),
        Err(e) => {
            // HELLO without a protocol version answers the server's fields without switching.
            let hello: redis::RedisResult<Vec<Value>> = redis::cmd("HELLO").query(c);
            match hello {
                Ok(fields) => hello_version(&fields),
                Err(h) => {
                    return could_not_tell(format!(
                        "INFO refused ({}) and HELLO refused ({})",
                        reason(&e),
                        reason(&h)
                    ))
                }
            }
        }
    };
    let Some(version) = version else {
        return could_not_tell("the server did not say its version");
    };
    let major = version
        .split('.')
        .next()
        .and_then(|m| m.parse::<u32>().ok());
    match major {
        Some(m) if m >= 7 => (
            Status::Ok,
            format!("Redis {version} (7.0 or later: PEXPIRE ... GT, script flags)"),
        ),
        Some(_) => (
            Status::Fail,
            format!("Redis {version}: the library needs 7.0 or later (PEXPIRE ... GT, script flags, ACL DRYRUN)"),
        ),
        None => could_not_tell(format!("version {version:?} is not a number")),
    }
}

fn hello_version(fields: &[Value]) -> Option<String> {
    let mut it = fields.iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        let k: String = redis::from_redis_value(k.clone()).ok()?;
        if k == "version" {
            return redis::from_redis_value(v.clone()).ok();
        }
    }
    None
}

/// The keys an eviction policy can remove under maxmemory, from the key schema.
const TTL_KEYS: &str = "P:{ctl}:hb:<I> (heartbeats: a live instance looks dead and is reaped), P:{ctl}:leader (the lease: a second leader), P:room:{<R>}:owner (pins: live rooms look orphaned)";

fn maxmemory_policy(c: &mut Connection) -> (Status, String) {
    let (policy, maxmemory) = match info(c, "memory") {
        Ok(i) if i.contains_key("maxmemory_policy") => (
            i.get("maxmemory_policy").cloned(),
            i.get("maxmemory").cloned(),
        ),
        Err(e) if e.code().is_none() => return could_not_tell(format!("INFO: {}", reason(&e))),
        other => {
            let info_err = match other {
                Err(e) => format!("INFO refused ({})", reason(&e)),
                Ok(_) => "INFO memory has no maxmemory_policy".to_owned(),
            };
            match config_get(c, &["maxmemory-policy", "maxmemory"]) {
                Ok(m) => (
                    m.get("maxmemory-policy").cloned(),
                    m.get("maxmemory").cloned(),
                ),
                Err(e) => {
                    return could_not_tell(format!(
                        "{info_err} and CONFIG GET refused ({})",
                        reason(&e)
                    ))
                }
            }
        }
    };
    let (Some(policy), Some(maxmemory)) = (policy, maxmemory) else {
        return could_not_tell("the server did not say its maxmemory and policy");
    };
    let limit: u64 = maxmemory.parse().unwrap_or(0);
    judge_policy(&policy, limit)
}

fn judge_policy(policy: &str, maxmemory: u64) -> (Status, String) {
    if policy == "noeviction" {
        let limit = if maxmemory == 0 {
            "no maxmemory".to_owned()
        } else {
            format!(
                "maxmemory {}: writes fail with OOM when full",
                bytes(maxmemory)
            )
        };
        return (
            Status::Ok,
            format!("noeviction ({limit}): no key is ever evicted"),
        );
    }
    let at_risk = if policy.starts_with("allkeys-") {
        format!("every key of the schema, the TTL-less room metadata, peers and indexes included, and first of all {TTL_KEYS}")
    } else {
        TTL_KEYS.to_owned()
    };
    if maxmemory == 0 {
        return (
            Status::Warn,
            format!("{policy} with maxmemory 0: nothing is evicted now, but once a maxmemory is set it can evict {at_risk}; set maxmemory-policy noeviction"),
        );
    }
    (
        Status::Fail,
        format!(
            "{policy} with maxmemory {} can evict {at_risk}; set maxmemory-policy noeviction",
            bytes(maxmemory)
        ),
    )
}

/// `104857600 bytes (100.0 MiB)`.
fn bytes(n: u64) -> String {
    format!("{n} bytes ({:.1} MiB)", n as f64 / (1024.0 * 1024.0))
}

/// What a restart costs after losing everything (README "How a dead instance is reaped":
/// Redis lost its data).
const RESTORE: &str = "live instances see the data loss and register again, re-pin their rooms and write back their peers within two ticks (rooms taken by another instance meanwhile: room_lost), no lease is granted for a lease TTL, and what dead instances left is gone with the rest";

/// What a restart costs after losing the last writes only.
const PARTIAL: &str = "the next tick re-writes heartbeats and the pins whose room metadata survived; rooms and peers created since stay missing unless the instances see a data loss (README \"Redis lost its data\"), and instances reaped since reappear stale and are reaped again";

fn persistence(c: &mut Connection) -> (Status, String) {
    let conf = match config_get(c, &["save", "appendonly", "appendfsync"]) {
        Ok(m) => m,
        Err(e) if e.code().is_none() => {
            return could_not_tell(format!("CONFIG GET: {}", reason(&e)))
        }
        Err(e) => {
            let aof = info(c, "persistence")
                .ok()
                .and_then(|i| i.get("aof_enabled").cloned());
            let aof = match aof.as_deref() {
                Some("1") => "; INFO says AOF is on",
                Some(_) => "; INFO says AOF is off",
                None => "",
            };
            return could_not_tell(format!(
                "CONFIG GET refused ({}): the RDB schedule is unknown{aof}",
                reason(&e)
            ));
        }
    };
    let save = conf.get("save").map(|s| s.trim()).unwrap_or("");
    let aof = conf.get("appendonly").is_some_and(|v| v == "yes");
    let fsync = conf.get("appendfsync").map(String::as_str).unwrap_or("?");
    let detail = match (aof, save.is_empty()) {
        (true, _) => format!(
            "AOF on (appendfsync {fsync}): a restart replays the log and loses at most the writes not yet synced (about 1 s with everysec, none with always); {PARTIAL}"
        ),
        (false, false) => format!(
            "RDB snapshots only (save \"{save}\"): a restart loads the last snapshot and loses every write since; {PARTIAL}"
        ),
        (false, true) => format!(
            "none (no RDB, no AOF): a restart empties Redis; {RESTORE}"
        ),
    };
    (Status::Ok, detail)
}

fn replicas(c: &mut Connection, cluster: bool) -> (Status, String) {
    let i = match info(c, "replication") {
        Ok(i) => i,
        Err(e) => return could_not_tell(format!("INFO refused ({})", reason(&e))),
    };
    let n: usize = i
        .get("connected_slaves")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let min_write = config_get(c, &["min-replicas-to-write"])
        .ok()
        .and_then(|m| m.get("min-replicas-to-write").cloned())
        .unwrap_or_default();
    let fence = if n > 0 && (min_write.is_empty() || min_write == "0") {
        " (min-replicas-to-write 0: a partitioned old master keeps accepting writes until demoted)"
    } else {
        ""
    };
    let how = if cluster {
        "the cluster promotes one"
    } else {
        "the sentinels promote one (a redis:// URL never follows it: use redis+sentinel://)"
    };
    if n == 0 {
        return (
            Status::Ok,
            "no replica: a failover is not possible, and losing this server loses the data (as a restart without persistence)".to_owned(),
        );
    }
    (
        Status::Ok,
        format!(
            "{n} replica(s): on a failover {how}; writes of the last moments may be missing there and each instance restores its rooms and peers within two ticks of reaching the new master, lease writes were confirmed on a replica (WAIT) so no second leader{fence}"
        ),
    )
}

fn acl(c: &mut Connection, keys: &KeySpace, cluster: bool) -> (Status, String) {
    let user: String = match redis::cmd("ACL").arg("WHOAMI").query(c) {
        Ok(u) => u,
        Err(e) => return could_not_tell(format!("ACL WHOAMI refused ({})", reason(&e))),
    };
    // A first dry run of PING tells whether the user may dry-run at all.
    let dry = |c: &mut Connection, argv: &[String]| -> redis::RedisResult<Value> {
        redis::cmd("ACL")
            .arg("DRYRUN")
            .arg(&user)
            .arg(argv)
            .query(c)
    };
    if let Err(e) = dry(c, &["PING".to_owned()]) {
        return could_not_tell(format!(
            "ACL DRYRUN refused for user {user} ({}); the user needs every command of sfu_redis::commands::COMMANDS and the scripts (EVALSHA, EVAL) on the keys {}:*",
            reason(&e),
            keys.prefix()
        ));
    }
    let probes: Vec<Probe> = acl_probes(keys)
        .into_iter()
        .filter(|p| cluster || p.need != Need::Cluster)
        .collect();
    let mut denied = Vec::new();
    for p in &probes {
        let why = match dry(c, &p.argv) {
            Ok(Value::Okay) => continue,
            Ok(Value::SimpleString(s)) if s == "OK" => continue,
            Ok(v) => redis::from_redis_value::<String>(v).unwrap_or_else(|_| "denied".into()),
            // A timeout or a dropped connection: the later replies cannot be trusted.
            Err(e) if e.code().is_none() => {
                return could_not_tell(format!("ACL DRYRUN {}: {}", p.what, reason(&e)))
            }
            // A command renamed away: "unknown command".
            Err(e) => reason(&e),
        };
        denied.push((p, why));
    }
    let class = |n: Need| match n {
        Need::Node | Need::Cluster => 0,
        Need::Degrades(_) => 1,
        Need::Tools => 2,
    };
    let mut parts = Vec::new();
    let mut status = Status::Ok;
    for (k, (worst, whom)) in [
        (Status::Fail, " (nodes need them)"),
        (Status::Warn, ""),
        (Status::Warn, " (status and fsck need them)"),
    ]
    .into_iter()
    .enumerate()
    {
        let these: Vec<&(&Probe, String)> =
            denied.iter().filter(|(p, _)| class(p.need) == k).collect();
        if these.is_empty() {
            continue;
        }
        status = status.max(worst);
        let all: Vec<&Probe> = probes.iter().filter(|p| class(p.need) == k).collect();
        let mut reasons: Vec<String> = Vec::new();
        for (_, why) in &these {
            // "... no permissions to access the '<key>' key": one line for all keys.
            let why = if why.contains("access the '") {
                format!("the keys are not permitted, e.g. {why:?}")
            } else {
                why.clone()
            };
            if !reasons
                .iter()
                .any(|r| r.starts_with("the keys") && why.starts_with("the keys"))
                && !reasons.contains(&why)
            {
                reasons.push(why);
            }
        }
        let costs: Vec<&str> = these
            .iter()
            .filter_map(|(p, _)| match p.need {
                Need::Degrades(cost) => Some(cost),
                _ => None,
            })
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let cost = if costs.is_empty() {
            String::new()
        } else {
            format!(": {}", costs.join("; "))
        };
        parts.push(format!(
            "user {user} may not run {}{whom}{cost} [{}]",
            denied_groups(&these.iter().map(|(p, _)| *p).collect::<Vec<_>>(), &all),
            reasons.join("; ")
        ));
    }
    if parts.is_empty() {
        parts.push(format!(
            "user {user} may run every command and script the library sends on {}:* ({} ACL DRYRUN probes)",
            keys.prefix(),
            probes.len()
        ));
    }
    (status, parts.join("; "))
}

/// The denied probes by command: `SET` when every probe of it was denied (`EVALSHA (every
/// script)` for a script verb), else the probes denied (`SET on <key>`, `EVALSHA x.lua`).
fn denied_groups(denied: &[&Probe], all: &[&Probe]) -> String {
    let group = |p: &Probe| -> String {
        match p.what.split_once(' ') {
            Some((verb, rest)) if rest.ends_with(".lua") => verb.to_owned(),
            _ => p.what.split(" on ").next().unwrap_or(&p.what).to_owned(),
        }
    };
    let mut order: Vec<String> = Vec::new();
    for p in denied {
        let g = group(p);
        if !order.contains(&g) {
            order.push(g);
        }
    }
    order
        .iter()
        .map(|g| {
            let of = |ps: &[&Probe]| ps.iter().filter(|p| group(p) == *g).count();
            let (n, total) = (of(denied), of(all));
            let scripts = denied
                .iter()
                .any(|p| group(p) == *g && p.what.ends_with(".lua"));
            if n == total && scripts {
                format!("{g} (every script)")
            } else if n == total {
                g.clone()
            } else {
                denied
                    .iter()
                    .filter(|p| group(p) == *g)
                    .map(|p| p.what.clone())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn latency(c: &mut Connection, n: usize, timeout: Duration) -> (Status, String) {
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        if let Err(e) = redis::cmd("PING").query::<String>(c) {
            return (
                Status::Fail,
                format!("PING {} of {n} failed: {}", i + 1, reason(&e)),
            );
        }
        samples.push(t.elapsed());
    }
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    let (p50, p99, max) = (at(0.5), at(0.99), samples[samples.len() - 1]);
    let ms = |d: Duration| format!("{:.2}", d.as_secs_f64() * 1000.0);
    let share = p99.as_secs_f64() / timeout.as_secs_f64();
    let status = if share > LATENCY_FAIL {
        Status::Fail
    } else if share > LATENCY_WARN {
        Status::Warn
    } else {
        Status::Ok
    };
    (
        status,
        format!(
            "PING p50 {} ms, p99 {} ms, max {} ms over {n} samples; p99 is {:.2}% of the {} ms command timeout (warn above {}%, fail above {}%)",
            ms(p50),
            ms(p99),
            ms(max),
            share * 100.0,
            timeout.as_millis(),
            LATENCY_WARN * 100.0,
            LATENCY_FAIL * 100.0
        ),
    )
}

fn topology(redis: &Redis, con: &mut Conn, config: &Config) -> (Status, String) {
    let route = redis.route();
    if con.is_cluster() {
        let masters = con.cluster_masters();
        let ctl = con
            .cluster_master_of(&config.keys().leader())
            .unwrap_or_else(|| "no master".into());
        return (
            Status::Ok,
            format!(
                "cluster: {} master(s) {}, control plane ({{ctl}}) on {ctl}, {} replica(s)",
                masters.len(),
                masters.join(" "),
                con.cluster_replicas()
            ),
        );
    }
    if let Some(name) = redis.master_name() {
        let master = route.master.unwrap_or_else(|| "?".into());
        return match route.via {
            Some(s) => (
                Status::Ok,
                format!(
                    "sentinel: master {master} of {name:?} named by sentinel {s}, {} replica(s)",
                    route.replicas
                ),
            ),
            None => (
                Status::Warn,
                format!("sentinel: no sentinel answered; the last known master {master} of {name:?} was used"),
            ),
        };
    }
    let replicas = con
        .on_each_server(|c| info(c, "replication").ok())
        .ok()
        .and_then(|v| v.into_iter().next().flatten());
    match replicas {
        Some(i) => {
            let n = i.get("connected_slaves").cloned().unwrap_or_default();
            let role = i.get("role").cloned().unwrap_or_default();
            (
                Status::Ok,
                format!("standalone: role {role}, {n} replica(s)"),
            )
        }
        None => (
            Status::Ok,
            format!(
                "standalone ({} replica(s) seen at connect; INFO refused)",
                route.replicas
            ),
        ),
    }
}

/// The fleet as Redis shows it: the status and each instance's record.
struct Fleet {
    status: Result<FleetStatus, String>,
    records: Vec<(String, Option<InstanceInfo>)>,
    /// Server ms the dataset token was written at (`P:{ctl}:dataset` = `<random>:<ms>`).
    dataset_ms: Option<i64>,
}

impl Fleet {
    fn read(config: &Config, con: &mut Conn) -> Fleet {
        let status = fleet_status(config).map_err(|e| e.to_string());
        let keys = config.keys();
        let mut records = Vec::new();
        if let Ok(st) = &status {
            for i in &st.instances {
                let info = encode_id(IdKind::Instance, &i.id)
                    .ok()
                    .and_then(|w| {
                        redis::cmd("HGETALL")
                            .arg(keys.instance_info(&w))
                            .query::<Vec<(String, String)>>(con)
                            .ok()
                    })
                    .filter(|pairs| !pairs.is_empty())
                    .map(|pairs| InstanceInfo::from_fields(&pairs).0);
                records.push((i.id.clone(), info));
            }
        }
        let dataset_ms = redis::cmd("GET")
            .arg(keys.dataset())
            .query::<Option<String>>(con)
            .ok()
            .flatten()
            .and_then(|v| v.rsplit_once(':')?.1.parse().ok());
        Fleet {
            status,
            records,
            dataset_ms,
        }
    }

    /// The longest lease TTL the records give, else the default.
    fn lease_ttl(&self) -> Duration {
        self.records
            .iter()
            .filter_map(|(_, r)| r.as_ref()?.timing("lease_ttl_ms"))
            .max()
            .unwrap_or(Timings::default().lease_ttl)
    }

    /// The smallest command timeout the records give.
    fn command_timeout(&self) -> Option<Duration> {
        self.records
            .iter()
            .filter_map(|(_, r)| r.as_ref()?.command_timeout())
            .min()
    }

    fn judge(&self) -> (Status, String) {
        let st = match &self.status {
            Ok(st) => st,
            Err(e) => return could_not_tell(e),
        };
        if st.instances.is_empty() {
            return (
                Status::Ok,
                format!("no instance registered under {} yet", st.prefix),
            );
        }
        let mut status = Status::Ok;
        let mut parts = Vec::new();
        let count = |s: InstanceState| st.instances.iter().filter(|i| i.state == s).count();
        let alive = count(InstanceState::Alive);
        match &st.leader {
            Some(l) if st.leader_alive => parts.push(format!("leader {l} (epoch {})", st.epoch)),
            Some(l) => {
                status = Status::Warn;
                parts.push(format!(
                    "leader {l} is not heartbeating (its lease runs out on its own)"
                ));
            }
            None => {
                let ttl = self.lease_ttl();
                let age = self.dataset_ms.map(|d| st.server_ms.saturating_sub(d));
                match age {
                    Some(age) if (0..ttl.as_millis() as i64).contains(&age) => {
                        parts.push(format!(
                            "no leader yet: the dataset is {} s old and no lease is granted within a lease TTL ({} s) of its creation",
                            age / 1000,
                            ttl.as_secs()
                        ));
                    }
                    _ => {
                        status = Status::Warn;
                        parts.push("no leader (nothing is reaped until one is elected)".into());
                    }
                }
            }
        }
        parts.push(format!(
            "{} instance(s): {alive} alive, {} late, {} stale, {} being reaped",
            st.instances.len(),
            count(InstanceState::Late),
            count(InstanceState::Stale),
            count(InstanceState::BeingReaped)
        ));
        let versions: BTreeSet<String> = self
            .records
            .iter()
            .filter_map(|(_, r)| r.as_ref()?.version.clone())
            .collect();
        let timings: BTreeSet<String> = self
            .records
            .iter()
            .filter_map(|(_, r)| r.as_ref().map(InstanceInfo::timings_summary))
            .collect();
        let missing = self.records.iter().filter(|(_, r)| r.is_none()).count();
        match versions.len() {
            0 => {}
            1 => parts.push(format!(
                "version {}",
                versions.iter().next().unwrap_or(&String::new())
            )),
            _ => {
                status = Status::Warn;
                parts.push(format!(
                    "mixed versions {}",
                    versions.into_iter().collect::<Vec<_>>().join(", ")
                ));
            }
        }
        match timings.len() {
            0 => {}
            1 => parts.push(format!(
                "timings {}",
                timings.iter().next().unwrap_or(&String::new())
            )),
            _ => {
                status = Status::Warn;
                parts.push(format!(
                    "mixed timings: {}",
                    timings.into_iter().collect::<Vec<_>>().join(" | ")
                ));
            }
        }
        if missing > 0 {
            parts.push(format!(
                "{missing} without an info record (an older version, or registering)"
            ));
        }
        let problems =
            st.problems.len() + st.instances.iter().map(|i| i.problems.len()).sum::<usize>();
        if problems > 0 {
            status = Status::Warn;
            parts.push(format!(
                "{problems} problem(s) in the control keys: see sfu-redis status and fsck"
            ));
        }
        (status, parts.join("; "))
    }
}

struct Report {
    url: String,
    prefix: String,
    checks: Vec<Check>,
}

impl Report {
    fn status(&self) -> Status {
        self.checks
            .iter()
            .map(|c| c.status)
            .max()
            .unwrap_or(Status::Ok)
    }

    fn count(&self, s: Status) -> usize {
        self.checks.iter().filter(|c| c.status == s).count()
    }

    fn to_json(&self) -> serde_json::Value {
        json!({
            "redis": self.url,
            "prefix": self.prefix,
            "status": self.status().as_str(),
            "checks": self.checks.iter().map(|c| json!({
                "name": c.name,
                "status": c.status.as_str(),
                "detail": c.detail,
            })).collect::<Vec<_>>(),
        })
    }

    fn to_text(&self) -> String {
        let mut out = format!(
            "redis             {}\nprefix            {}\n\n",
            self.url, self.prefix
        );
        for c in &self.checks {
            out.push_str(&format!(
                "{:<17} {:<4}  {}\n",
                c.name,
                c.status.as_str(),
                c.detail
            ));
        }
        out.push_str(&format!(
            "\nstatus            {} ({} ok, {} warn, {} fail)",
            self.status().as_str(),
            self.count(Status::Ok),
            self.count(Status::Warn),
            self.count(Status::Fail)
        ));
        out
    }
}

/// The passwords the output must never hold: the URL's and the sentinels'.
fn secrets(url: &str, args: &DoctorArgs) -> Vec<String> {
    let mut out = Vec::new();
    if let Some((_, rest)) = url.split_once("://") {
        let authority = rest.split('/').next().unwrap_or("");
        if let Some((userinfo, _)) = authority.rsplit_once('@') {
            if let Some((_, password)) = userinfo.split_once(':') {
                out.push(password.to_owned());
            } else {
                out.push(userinfo.to_owned());
            }
        }
    }
    out.extend(args.redis.transport.sentinel_password.clone());
    out.retain(|s| s.len() >= 3);
    out
}

/// `text` with every secret replaced by `***`.
fn scrub(text: &str, secrets: &[String]) -> String {
    secrets
        .iter()
        .fold(text.to_owned(), |t, s| t.replace(s.as_str(), "***"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_are_judged() {
        assert_eq!(judge_policy("noeviction", 0).0, Status::Ok);
        assert_eq!(judge_policy("noeviction", 1 << 20).0, Status::Ok);
        let (s, d) = judge_policy("volatile-lru", 1 << 20);
        assert_eq!(s, Status::Fail);
        assert!(
            d.contains("P:{ctl}:hb:<I>") && d.contains("P:{ctl}:leader"),
            "{d}"
        );
        assert!(d.contains("P:room:{<R>}:owner"), "{d}");
        let (s, d) = judge_policy("allkeys-lru", 1 << 20);
        assert_eq!(s, Status::Fail);
        assert!(d.contains("every key"), "{d}");
        assert_eq!(judge_policy("allkeys-lru", 0).0, Status::Warn);
    }

    #[test]
    fn merged_results_name_each_master_when_they_differ() {
        let labels = vec!["a:1".to_owned(), "b:2".to_owned()];
        let same = vec![(Status::Ok, "x".to_owned()), (Status::Ok, "x".to_owned())];
        assert_eq!(
            merge(&labels, same),
            (Status::Ok, "x (every master)".into())
        );
        let differ = vec![(Status::Ok, "x".to_owned()), (Status::Fail, "y".to_owned())];
        assert_eq!(
            merge(&labels, differ),
            (Status::Fail, "a:1: x; b:2: y".into())
        );
        assert_eq!(
            merge(&[], vec![(Status::Warn, "z".into())]),
            (Status::Warn, "z".into())
        );
    }

    #[test]
    fn secrets_are_scrubbed() {
        let s = vec!["s3cret".to_owned()];
        assert_eq!(scrub("a s3cret b s3cret", &s), "a *** b ***");
    }
}
