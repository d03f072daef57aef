//! `sfu-redis doctor`: checks the Redis a fleet uses (version, eviction policy, persistence,
//! replicas, ACL, latency, topology) and the fleet itself, each as `{name, status, detail}`.
//!
//! Every server-level check runs on each master (one server: on it; a cluster: every master,
//! each with its own configuration). A check whose command is refused (`CONFIG` renamed away,
//! `INFO` or `ACL` denied) says `could not tell: <reason>` with status `warn`, and the other
//! checks still run. A master that cannot be reached or stops answering fails that check and
//! every later one (`not checked: <master> did not answer in check <name>`) without being
//! waited for again ([`servers`]), so a paused master costs about two command timeouts in all.
//! On a terminal (stderr, not with `--json`) a progress line names the check under way.
//! Exit 0 when no check fails (warnings included), 1 when one fails, 2 when nothing can be
//! checked (bad flags, Redis unreachable, authentication refused).

mod acl;
mod fleet;
mod server;
mod servers;

use std::collections::BTreeSet;
use std::io::Write;
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;
use sfu_redis::ops::conn::Redis;
use sfu_redis::{Config, Timings};

use crate::{Failure, RedisArgs};

use fleet::{topology, Fleet};
use server::{latency, maxmemory_policy, persistence, replicas, server_version};
use servers::{Servers, Steps};

#[derive(Debug, Args)]
pub(crate) struct DoctorArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// The command timeout the fleet runs with, for the connection and the latency check
    /// [default: the smallest in the instances' records, else 2000].
    #[arg(long, value_name = "MS", value_parser = parse_ms)]
    command_timeout_ms: Option<u64>,
    /// PINGs per server for the latency check (10 to 100000).
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

/// One check: a fixed name (the table of docs/src/deploy/doctor.md), a status and one line of
/// detail.
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
///
/// Every check runs on one connection (the connect check's), and a master that stopped
/// answering in one check is left out of the later ones (`servers`); the fleet is read after
/// the server checks (its records give the latency check's timeout) and not at all when the
/// master holding `{ctl}` is down. The report keeps the order of the table in
/// docs/src/deploy/doctor.md.
fn checks(config: &Config, args: &DoctorArgs) -> (Vec<Check>, bool) {
    let steps = Steps::new(!args.json, 9);
    steps.check("connect", &[], &[]);
    let started = Instant::now();
    let connected = Redis::from_config(config).and_then(|r| r.connect().map(|c| (r, c)));
    let (redis, mut con) = match connected {
        Ok(rc) => rc,
        Err(e) => {
            let detail = format!("cannot connect: {e}");
            return (vec![check("connect", (Status::Fail, detail))], false);
        }
    };
    let mut connect = (
        Status::Ok,
        format!(
            "{} ({}) in {} ms",
            redis.safe_url(),
            redis.describe(),
            started.elapsed().as_millis()
        ),
    );
    // Cluster nodes that did not answer while the slot map was read: the masters among them
    // are left out of every check (each says so and fails), not waited for again.
    let masters = con.cluster_masters();
    let unanswered: Vec<String> = con
        .cluster_unanswered()
        .into_iter()
        .filter(|n| masters.contains(n))
        .collect();
    if !unanswered.is_empty() {
        connect.0 = Status::Warn;
        connect.1.push_str(&format!(
            "; master(s) {} did not answer (left out of the checks below)",
            unanswered.join(" ")
        ));
    }
    let keys = config.keys().clone();
    let cluster = con.is_cluster();
    let ctl = con
        .cluster_master_of(&keys.leader())
        .or_else(|| redis.route().master)
        .unwrap_or_else(|| redis.safe_url().to_owned());
    let one = redis
        .route()
        .master
        .unwrap_or_else(|| redis.safe_url().to_owned());
    let mut servers = Servers::new(&mut con, one, &steps);
    for m in &unanswered {
        servers.mark_down(m, "connect");
    }
    let version = servers.run("server_version", &server_version);
    let policy = servers.run("maxmemory_policy", &maxmemory_policy);
    let persistence = servers.run("persistence", &persistence);
    let replicas = servers.run("replicas", &|c| replicas(c, cluster));
    let acl = servers.run("acl", &|c| acl::acl(c, &keys, cluster));
    servers.step("fleet");
    let fleet = match servers.down_note(&ctl) {
        Some(note) => Fleet::not_read(note),
        None => {
            let fleet = Fleet::read(config, servers.con());
            // One server that stopped answering mid-read leaves the connection out of step
            // (it refuses every later request): the later checks skip that server, as after
            // any check it did not answer.
            if !servers.con().is_cluster() && !redis::ConnectionLike::is_open(servers.con()) {
                if let Some(one) = servers.labels().first() {
                    servers.mark_down(one, "fleet");
                }
            }
            fleet
        }
    };
    let timeout = args
        .command_timeout_ms
        .map(Duration::from_millis)
        .or(fleet.command_timeout())
        .unwrap_or(config.timings().command_timeout);
    let latency = servers.run("latency", &|c| latency(c, args.pings, timeout));
    let topology = topology(&redis, &mut servers, config);
    drop(servers);
    steps.finish();
    let checks = vec![
        check("connect", connect),
        check("server_version", version),
        check("maxmemory_policy", policy),
        check("persistence", persistence),
        check("replicas", replicas),
        check("acl", acl),
        check("latency", latency),
        check("topology", topology),
        check("fleet", fleet.judge()),
        check("schema", fleet.schema()),
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
