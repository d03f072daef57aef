//! The checks of one server: version, eviction policy, persistence, replicas, latency.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use redis::{ConnectionLike, Value};

use super::{could_not_tell, Status};

/// The latency check's thresholds: p99 above this share of the command timeout is a warning,
/// above the second a failure.
const LATENCY_WARN: f64 = 0.10;
const LATENCY_FAIL: f64 = 0.50;

/// `INFO <section>` as `field -> value`.
pub(super) fn info(
    c: &mut dyn ConnectionLike,
    section: &str,
) -> redis::RedisResult<BTreeMap<String, String>> {
    let text: String = redis::cmd("INFO").arg(section).query(c)?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect())
}

/// `CONFIG GET <names...>` as `name -> value`.
fn config_get(
    c: &mut dyn ConnectionLike,
    names: &[&str],
) -> redis::RedisResult<BTreeMap<String, String>> {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg(names);
    let pairs: Vec<String> = cmd.query(c)?;
    Ok(pairs
        .chunks(2)
        .filter_map(|p| Some((p.first()?.clone(), p.get(1)?.clone())))
        .collect())
}

/// A refused command's reason, one line.
pub(super) fn reason(e: &redis::RedisError) -> String {
    e.to_string().lines().next().unwrap_or_default().to_owned()
}

pub(super) fn server_version(c: &mut dyn ConnectionLike) -> (Status, String) {
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

pub(super) fn maxmemory_policy(c: &mut dyn ConnectionLike) -> (Status, String) {
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

/// What a restart costs after losing everything (docs/src/design/failures.md "Redis lost its
/// data").
const RESTORE: &str = "live instances see the data loss and register again, re-pin their rooms and write back their peers within two ticks (rooms taken by another instance meanwhile: room_lost), no lease is granted for a lease TTL, and what dead instances left is gone with the rest";

/// What a restart costs after losing the last writes only.
const PARTIAL: &str = "the next tick re-writes heartbeats and the pins whose room metadata survived; rooms and peers created since stay missing unless the instances see a data loss (docs/src/design/failures.md \"Redis lost its data\"), and instances reaped since reappear stale and are reaped again";

pub(super) fn persistence(c: &mut dyn ConnectionLike) -> (Status, String) {
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
    let status = if !aof && save.is_empty() {
        Status::Warn
    } else {
        Status::Ok
    };
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
    (status, detail)
}

pub(super) fn replicas(c: &mut dyn ConnectionLike, cluster: bool) -> (Status, String) {
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
            Status::Warn,
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

pub(super) fn latency(c: &mut dyn ConnectionLike, n: usize, timeout: Duration) -> (Status, String) {
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
}
