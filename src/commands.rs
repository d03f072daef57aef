//! Every Redis command the library sends, directly or from its Lua scripts, and for whom: what
//! a Redis ACL must permit the configured user. `sfu-redis doctor` checks each one with
//! `ACL DRYRUN` ([`acl_probes`]).
//!
//! Commands a script runs (`redis.call`) are checked by Redis against the calling user's ACL
//! like commands sent directly, so they are listed too. A unit test keeps [`COMMANDS`] in step
//! with every `redis.call` of `lua/*.lua`, and `tests/it/doctor.rs` with what a node, `status`
//! and `fsck` send to a real server (`INFO commandstats`).

use crate::keys::KeySpace;
use crate::scripts::SCRIPTS;

/// Who needs a command, and what it costs if the ACL refuses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// A node cannot work without it (heartbeats, pins, peers, the lease or the reap fail).
    Node,
    /// A node works without it, degraded as the text says (the library tolerates a refusal).
    Degrades(&'static str),
    /// Only on a Redis Cluster (slot map, `ASK` redirections): like [`Need::Node`] there.
    Cluster,
    /// Only the operator's tools (`status`, `fsck`, `doctor`), never a node.
    Tools,
}

/// One command of the library: its name and sample arguments for `ACL DRYRUN`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Command {
    /// The command as sent (`SET`, `SCRIPT LOAD`, ...; upper case).
    pub name: &'static str,
    /// Sample arguments after the name, space-separated: `$K` is a key under the prefix
    /// (probed with one control-plane key and one room key), `$C` the events channel, `$P`
    /// the prefix's `SCAN` pattern.
    pub args: &'static str,
    /// Who needs it.
    pub need: Need,
}

const fn c(name: &'static str, args: &'static str, need: Need) -> Command {
    Command { name, args, need }
}

const NO_INFO: Need = Need::Degrades(
    "without INFO a connect cannot tell a replica or a cluster node, nor count replicas or see a failover behind one address",
);
const NO_ROLE: Need = Need::Degrades(
    "without ROLE a lease write counts the replicas seen at connect, and a sentinel-named master is not checked",
);
const NO_WAIT: Need = Need::Degrades(
    "without WAIT lease writes are not confirmed on a replica: a failover can lose the lease and make a second leader",
);
const NO_PUBLISH: Need = Need::Degrades(
    "without PUBLISH the P:events channel stays silent (events are still returned by Node::events)",
);

/// Every command the library sends (including `redis.call`s of its scripts), with sample
/// arguments and who needs it. Scripts themselves (`EVALSHA`/`EVAL` with their keys) are
/// probed by [`acl_probes`] from their headers.
pub const COMMANDS: &[Command] = &[
    // Node: sent directly and/or from the scripts.
    c("EVALSHA", "", Need::Node),
    c("EVAL", "", Need::Node),
    c("SCRIPT LOAD", "return", Need::Node),
    c("PING", "", Need::Node),
    c("TIME", "", Need::Node),
    c("DEL", "$K", Need::Node),
    c("EXISTS", "$K", Need::Node),
    c("GET", "$K", Need::Node),
    c("SET", "$K v PX 1000", Need::Node),
    c("PEXPIRE", "$K 1000 GT", Need::Node),
    c("PTTL", "$K", Need::Node),
    c("TYPE", "$K", Need::Node),
    c("INCR", "$K", Need::Node),
    c("HGET", "$K f", Need::Node),
    c("HMGET", "$K f g", Need::Node),
    c("MGET", "$K", Need::Node),
    c("HSET", "$K f v", Need::Node),
    c("HSETNX", "$K f v", Need::Node),
    c("HDEL", "$K f", Need::Node),
    c("HEXISTS", "$K f", Need::Node),
    c("HINCRBY", "$K f 1", Need::Node),
    c("SADD", "$K m", Need::Node),
    c("SREM", "$K m", Need::Node),
    c("SCARD", "$K", Need::Node),
    c("SMEMBERS", "$K", Need::Node),
    c("SUNIONSTORE", "$K $K $K", Need::Node),
    c("RENAME", "$K $K", Need::Node),
    c("UNLINK", "$K", Need::Node),
    c("SSCAN", "$K 0 COUNT 1000", Need::Node),
    c("SRANDMEMBER", "$K 1000", Need::Node),
    c("ZADD", "$K 0 m", Need::Node),
    c("ZREM", "$K m", Need::Node),
    c("ZSCORE", "$K m", Need::Node),
    c("ZRANGEBYSCORE", "$K 0 1 LIMIT 0 1000", Need::Node),
    c("INFO", "replication", NO_INFO),
    c("ROLE", "", NO_ROLE),
    c("WAIT", "1 1000", NO_WAIT),
    c("PUBLISH", "$C x", NO_PUBLISH),
    c("CLUSTER SLOTS", "", Need::Cluster),
    c("ASKING", "", Need::Cluster),
    // Tools: status and fsck.
    c("SCAN", "0 MATCH $P COUNT 1000", Need::Tools),
    c("ZSCAN", "$K 0 COUNT 1000", Need::Tools),
    c("HSCAN", "$K 0 COUNT 1000", Need::Tools),
    c("HGETALL", "$K", Need::Tools),
    c("SISMEMBER", "$K m", Need::Tools),
];

/// One `ACL DRYRUN` to send: `ACL DRYRUN <user> <argv...>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// What it checks, for messages: `SET on sfu:dev:main:{ctl}:heartbeats`,
    /// `EVALSHA heartbeat.lua`.
    pub what: String,
    /// The command and its arguments.
    pub argv: Vec<String>,
    /// Who needs it.
    pub need: Need,
}

/// The sample ids the probes' keys are built with.
const SAMPLE: &str = "doctor-probe";

/// Every `ACL DRYRUN` that checks the library's needs under `keys`' prefix: each command of
/// [`COMMANDS`] (a keyed one twice: on the control plane's `P:{ctl}:heartbeats` and on a room's
/// `P:room:{doctor-probe}:meta`), and each script as `EVALSHA` and as `EVAL` with the keys its
/// header declares (`-- KEYS[n] <key pattern>`; sample ids `doctor-probe`).
pub fn acl_probes(keys: &KeySpace) -> Vec<Probe> {
    let ctl = keys.heartbeats();
    let room = keys.room(SAMPLE).meta;
    let mut out = Vec::new();
    for cmd in COMMANDS {
        if matches!(cmd.name, "EVALSHA" | "EVAL") {
            continue;
        }
        let targets: &[&str] = if cmd.args.contains("$K") {
            &[&ctl, &room]
        } else {
            &[""]
        };
        for key in targets {
            let mut argv: Vec<String> = cmd.name.split(' ').map(str::to_owned).collect();
            argv.extend(cmd.args.split_whitespace().map(|a| match a {
                "$K" => (*key).to_owned(),
                "$C" => keys.events_channel(),
                "$P" => keys.scan_pattern(),
                other => other.to_owned(),
            }));
            let what = if key.is_empty() {
                cmd.name.to_owned()
            } else {
                format!("{} on {key}", cmd.name)
            };
            out.push(Probe {
                what,
                argv,
                need: cmd.need,
            });
        }
    }
    for (name, source) in SCRIPTS.sources() {
        // The audit's scripts and the operator's reap (`sfu-redis fsck`, `sfu-redis reap`)
        // are the tools'; a node never sends them.
        let need = if name.starts_with("audit_") || name == "reap_force_begin" {
            Need::Tools
        } else {
            Need::Node
        };
        let script_keys = header_keys(source, keys);
        for (verb, body) in [
            ("EVALSHA", redis::Script::new(source).get_hash().to_owned()),
            ("EVAL", source.to_owned()),
        ] {
            let mut argv = vec![verb.to_owned(), body, script_keys.len().to_string()];
            argv.extend(script_keys.iter().cloned());
            out.push(Probe {
                what: format!("{verb} {name}.lua"),
                argv,
                need,
            });
        }
    }
    out
}

/// The keys a script's header declares (`-- KEYS[n] P:{ctl}:hb:<I>  ...`), in order, under
/// `keys`' prefix with the sample ids.
fn header_keys(source: &str, keys: &KeySpace) -> Vec<String> {
    source
        .lines()
        .filter_map(|l| l.strip_prefix("-- KEYS["))
        .filter_map(|l| l.split_once(']'))
        .filter_map(|(_, rest)| rest.split_whitespace().next())
        .map(|pattern| {
            let p = pattern.strip_prefix("P:").unwrap_or(pattern);
            let p = p
                .replace("{R}", &format!("{{{SAMPLE}}}"))
                .replace("<I>", SAMPLE)
                .replace("<D>", SAMPLE)
                .replace("<p>", SAMPLE);
            format!("{}:{p}", keys.prefix())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `redis.call` of every script is a listed command (a new one cannot be forgotten
    /// by the ACL check).
    #[test]
    fn every_script_command_is_listed() {
        for (name, source) in SCRIPTS.sources() {
            let calls = source.replace("redis.pcall(", "redis.call(");
            for part in calls.split("redis.call(").skip(1) {
                let Some(cmd) = part
                    .trim_start()
                    .strip_prefix('\'')
                    .and_then(|p| p.split('\'').next())
                else {
                    panic!("{name}.lua: a redis.call without a literal command name");
                };
                let cmd = cmd.to_ascii_uppercase();
                assert!(
                    COMMANDS.iter().any(|c| c.name == cmd),
                    "{name}.lua calls {cmd}, which COMMANDS does not list"
                );
            }
        }
    }

    #[test]
    fn probes_use_the_prefix_and_the_header_keys() {
        let ks = KeySpace::new("sfu", "prod", "main").unwrap();
        let probes = acl_probes(&ks);
        let hb = probes
            .iter()
            .find(|p| p.what == "EVALSHA heartbeat.lua")
            .expect("heartbeat probe");
        assert_eq!(hb.argv[2], "10");
        assert_eq!(hb.argv[3], "sfu:prod:main:{ctl}:heartbeats");
        assert_eq!(hb.argv[4], "sfu:prod:main:{ctl}:hb:doctor-probe");
        assert_eq!(hb.argv[7], "sfu:prod:main:{ctl}:instance:doctor-probe:info");
        assert_eq!(hb.argv[11], "sfu:prod:main:{ctl}:schema");
        let up = probes
            .iter()
            .find(|p| p.what == "EVAL upsert_peer.lua")
            .expect("upsert probe");
        assert_eq!(
            up.argv[3],
            "sfu:prod:main:room:{doctor-probe}:peer:doctor-probe"
        );
        // Every script declares its keys, and every key parses as one of the schema.
        for p in probes.iter().filter(|p| p.argv[0] == "EVALSHA") {
            let n: usize = p.argv[2].parse().unwrap();
            assert!(n > 0, "{} declares no keys", p.what);
            assert_eq!(p.argv.len(), 3 + n, "{}", p.what);
            for k in &p.argv[3..] {
                assert!(ks.parse(k).is_some(), "{}: {k} is not a schema key", p.what);
            }
        }
        let set = probes
            .iter()
            .filter(|p| p.argv[0] == "SET")
            .collect::<Vec<_>>();
        assert_eq!(set.len(), 2);
        assert_eq!(set[1].argv[1], "sfu:prod:main:room:{doctor-probe}:meta");
        let publish = probes.iter().find(|p| p.argv[0] == "PUBLISH").unwrap();
        assert_eq!(publish.argv[1], "sfu:prod:main:events");
    }
}
