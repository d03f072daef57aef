//! The ACL check: `ACL DRYRUN` of every command and script the library sends.

use std::collections::BTreeSet;

use redis::{ConnectionLike, Value};
use sfu_redis::keys::KeySpace;
use sfu_redis::ops::commands::{acl_probes, Need, Probe};

use super::server::reason;
use super::{could_not_tell, Status};

pub(super) fn acl(c: &mut dyn ConnectionLike, keys: &KeySpace, cluster: bool) -> (Status, String) {
    let user: String = match redis::cmd("ACL").arg("WHOAMI").query(c) {
        Ok(u) => u,
        Err(e) => return could_not_tell(format!("ACL WHOAMI refused ({})", reason(&e))),
    };
    // A first dry run of PING tells whether the user may dry-run at all.
    let dry = |c: &mut dyn ConnectionLike, argv: &[String]| -> redis::RedisResult<Value> {
        redis::cmd("ACL")
            .arg("DRYRUN")
            .arg(&user)
            .arg(argv)
            .query(c)
    };
    if let Err(e) = dry(c, &["PING".to_owned()]) {
        return could_not_tell(format!(
            "ACL DRYRUN refused for user {user} ({}); the user needs every command of sfu_redis::ops::commands::COMMANDS and the scripts (EVALSHA, EVAL) on the keys {}:*",
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
        (Status::Warn, " (status, fsck or doctor need them)"),
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
