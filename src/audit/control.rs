//! Control-plane keys: the registry (members of the heartbeat sorted set), the lease, the
//! epoch, the heartbeat keys' TTLs, and instances with a room index (live or moved aside), an
//! info hash or a heartbeat key but no entry in the sorted set (`unregistered_instance`).

use std::collections::BTreeSet;

use redis::{RedisResult, Value};

use super::findings::Fix;
use super::read::{get, is_id, pager, text, Scan};
use super::snapshot::{InstanceSeen, Seen};
use super::ProblemKind::{MalformedLease, MalformedValue, UnregisteredInstance};
use crate::error::Result;
use crate::scan::Scan as ScanOf;

/// Replies of the control pipeline before the heartbeat keys' `PTTL`s: lease value, lease
/// `PTTL`, epoch value.
const HEAD: usize = 3;

impl Scan<'_> {
    /// The registered instances (members of the heartbeat sorted set, any score); `None` when
    /// that key holds the wrong type or cannot be read, which disables the checks that depend
    /// on registration (`orphaned_room`, `unregistered_instance`).
    pub(super) fn registry(&mut self, seen: &Seen) -> Result<Option<BTreeSet<String>>> {
        if seen.heartbeats == Some(false) {
            return Ok(None);
        }
        let key = self.ks.heartbeats();
        let mut pager = pager(vec![key.clone()], ScanOf::sorted_set);
        let mut registered = BTreeSet::new();
        while let Some(pages) = self.pages(&mut pager)? {
            for (_, items) in pages {
                let Some(items) = items else {
                    return Ok(None);
                };
                for member in items.into_iter().step_by(2) {
                    match text(member) {
                        Ok(m) if is_id(&m) => {
                            registered.insert(m);
                        }
                        Ok(m) | Err(m) => {
                            let detail = format!("member {m:?} is not an instance id");
                            self.malformed(&key, &m, detail);
                        }
                    }
                }
            }
        }
        Ok(Some(registered))
    }

    /// The lease, the epoch, heartbeat keys' TTLs, and instances with a room index, an info
    /// hash or a heartbeat key but no entry in the sorted set.
    pub(super) fn control(
        &mut self,
        seen: &Seen,
        registry: Option<&BTreeSet<String>>,
    ) -> Result<()> {
        let ks = self.ks;
        let mut pipe = redis::pipe();
        pipe.get(ks.leader()).pttl(ks.leader()).get(ks.epoch());
        let hbs = seen.instances_with(|s| s.hb);
        for i in &hbs {
            pipe.pttl(ks.heartbeat(i));
        }
        let r = self.exec(&mut pipe)?;
        if seen.leader {
            self.lease(&r);
        }
        if seen.epoch {
            self.epoch(&r);
        }
        for (n, i) in hbs.iter().enumerate() {
            if get::<i64>(r.get(HEAD + n)) == Some(-1) {
                let detail = format!("heartbeat key of {i} has no TTL: it can never be seen dead");
                self.found(MalformedValue, &ks.heartbeat(i), "ttl", detail, None);
            }
        }
        if let Some(registry) = registry {
            self.unregistered(seen, registry);
        }
        Ok(())
    }

    /// The lease value must be an instance id and the lease must have a TTL.
    fn lease(&mut self, r: &[RedisResult<Value>]) {
        let key = self.ks.leader();
        if let Some(Some(v)) = get::<Option<Vec<u8>>>(r.first()) {
            let value = String::from_utf8_lossy(&v).into_owned();
            if !is_id(&value) {
                let detail = format!(
                    "holds {value:?}, not an instance id in wire form; elections wait for it to expire"
                );
                self.found(MalformedLease, &key, "value", detail, None);
            }
        }
        if get::<i64>(r.get(1)) == Some(-1) {
            let detail =
                "has no TTL: no instance could ever be elected (the next acquire replaces it)"
                    .to_owned();
            self.found(MalformedLease, &key, "ttl", detail, None);
        }
    }

    /// The epoch must be a number.
    fn epoch(&mut self, r: &[RedisResult<Value>]) {
        if let Some(Some(v)) = get::<Option<Vec<u8>>>(r.get(2)) {
            if String::from_utf8_lossy(&v).parse::<u64>().is_err() {
                let detail = format!(
                    "holds {:?}, not a number: no lease can be acquired",
                    String::from_utf8_lossy(&v)
                );
                self.malformed(&self.ks.epoch(), "", detail);
            }
        }
    }

    /// Instances with a room index (live or moved aside), an info hash or a heartbeat key but
    /// no entry in the sorted set.
    fn unregistered(&mut self, seen: &Seen, registry: &BTreeSet<String>) {
        for (i, s) in &seen.instances {
            if registry.contains(i) || !(s.hb || s.rooms || s.info || s.reaping) {
                continue;
            }
            let (detail, fix) = self.unregistered_finding(i, s);
            let key = if s.rooms {
                self.ks.instance_rooms(i)
            } else if s.reaping && !s.hb {
                self.ks.instance_reaping_rooms(i)
            } else if s.info && !s.hb {
                self.ks.instance_info(i)
            } else {
                self.ks.heartbeat(i)
            };
            self.found(UnregisteredInstance, &key, "", detail, fix);
        }
    }

    /// Detail and fix of an unregistered instance: handed to the reaper unless its heartbeat
    /// key lives.
    fn unregistered_finding(&self, i: &str, s: &InstanceSeen) -> (String, Option<Fix>) {
        let zset = self.ks.heartbeats();
        if s.hb {
            let detail = format!(
                "instance {i} has a heartbeat key but no entry in {zset}; not handed to the reaper while the key lives"
            );
            return (detail, None);
        }
        let detail = if s.rooms {
            format!("instance {i} has a room index but no entry in {zset} (sets but no heartbeat)")
        } else if s.reaping {
            format!(
                "instance {i} has a room index an interrupted reap moved aside but no entry in {zset}"
            )
        } else {
            format!("instance {i} has an info hash but no entry in {zset} (info but no heartbeat)")
        };
        let fix = Fix::Enqueue {
            instance: i.to_owned(),
        };
        (detail, Some(fix))
    }
}
