//! The topology and fleet checks.

use std::collections::BTreeSet;
use std::time::Duration;

use sfu_redis::ops::conn::{Conn, Redis};
use sfu_redis::ops::info::InstanceInfo;
use sfu_redis::ops::status::{fleet_status_on, FleetStatus, InstanceState};
use sfu_redis::{Config, Timings};

use super::server::info;
use super::servers::Servers;
use super::{could_not_tell, Status};

pub(super) fn topology(
    redis: &Redis,
    servers: &mut Servers<'_>,
    config: &Config,
) -> (Status, String) {
    let route = redis.route();
    if servers.con().is_cluster() {
        let con = servers.con();
        let masters = con.cluster_masters();
        let ctl = con
            .cluster_master_of(&config.keys().leader())
            .unwrap_or_else(|| "no master".into());
        let shape = format!(
            "cluster: {} master(s) {}, control plane ({{ctl}}) on {ctl}, {} replica(s)",
            masters.len(),
            masters.join(" "),
            con.cluster_replicas()
        );
        // Every master must answer and say `cluster_state:ok`: a master down without a
        // replica to promote leaves its slots unserved, and with the default
        // `cluster-require-full-coverage yes` the others refuse every command (CLUSTERDOWN).
        // (An ACL that refuses `CLUSTER INFO` leaves the state unchecked: a warning.)
        let judged: Vec<(Status, String)> = servers
            .each("topology", &|c| match cluster_state(c) {
                Ok(st) if st == "ok" => (Status::Ok, String::new()),
                Ok(st) => (Status::Fail, format!("says cluster_state:{st}")),
                Err(e) if e.code() == Some("NOPERM") => (
                    Status::Warn,
                    format!("CLUSTER INFO refused, cluster_state not checked: {e}"),
                ),
                Err(e) => (Status::Fail, format!("CLUSTER INFO failed: {e}")),
            })
            .into_iter()
            .filter(|(_, (st, _))| *st != Status::Ok)
            .map(|(m, (st, detail))| {
                let sep = if detail.starts_with("says ") {
                    " "
                } else {
                    ": "
                };
                (st, format!("{m}{sep}{detail}"))
            })
            .collect();
        let Some(status) = judged.iter().map(|j| j.0).max() else {
            return (Status::Ok, shape);
        };
        let details: Vec<&str> = judged.iter().map(|j| j.1.as_str()).collect();
        return (status, format!("{shape}; {}", details.join("; ")));
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
    let replication = servers.each("topology", &|c| match info(c, "replication") {
        Ok(i) => (
            Status::Ok,
            format!(
                "standalone: role {}, {} replica(s)",
                i.get("role").cloned().unwrap_or_default(),
                i.get("connected_slaves").cloned().unwrap_or_default()
            ),
        ),
        Err(e) if e.code().is_some() => (
            Status::Ok,
            format!(
                "standalone ({} replica(s) seen at connect; INFO refused)",
                route.replicas
            ),
        ),
        Err(e) => (Status::Fail, format!("INFO replication failed: {e}")),
    });
    replication
        .into_iter()
        .next()
        .map(|(_, judged)| judged)
        .unwrap_or_else(|| (Status::Fail, "no server".into()))
}

/// `cluster_state` from `CLUSTER INFO` (`ok` or `fail`).
fn cluster_state(c: &mut dyn redis::ConnectionLike) -> redis::RedisResult<String> {
    let text: String = redis::cmd("CLUSTER").arg("INFO").query(c)?;
    Ok(text
        .lines()
        .find_map(|l| l.trim().strip_prefix("cluster_state:"))
        .unwrap_or("unknown")
        .to_owned())
}

/// The fleet as Redis shows it: the status and each instance's record.
pub(super) struct Fleet {
    status: Result<FleetStatus, String>,
    records: Vec<(String, Option<InstanceInfo>)>,
    /// Server ms the dataset token was written at (`P:{ctl}:dataset` = `<random>:<ms>`).
    dataset_ms: Option<i64>,
    /// Not read at all ([`Fleet::not_read`]): the check fails.
    not_read: bool,
}

impl Fleet {
    /// Reads the fleet with [`fleet_status_on`] on `con` (the checks' connection: no new
    /// slot-map read), which also reads each instance's record and the dataset token.
    pub(super) fn read(config: &Config, con: &mut Conn) -> Fleet {
        let status = fleet_status_on(config, con).map_err(|e| e.to_string());
        let (records, dataset_ms) = match &status {
            Ok(st) => (
                st.instances
                    .iter()
                    .map(|i| (i.id.clone(), i.info.clone()))
                    .collect(),
                st.dataset_created_ms,
            ),
            Err(_) => (Vec::new(), None),
        };
        Fleet {
            status,
            records,
            dataset_ms,
            not_read: false,
        }
    }

    /// The fleet was not read: the master holding `{ctl}` did not answer earlier (`why`).
    pub(super) fn not_read(why: String) -> Fleet {
        Fleet {
            status: Err(why),
            records: Vec::new(),
            dataset_ms: None,
            not_read: true,
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
    pub(super) fn command_timeout(&self) -> Option<Duration> {
        self.records
            .iter()
            .filter_map(|(_, r)| r.as_ref()?.command_timeout())
            .min()
    }

    /// The prefix's key schema version (`P:{ctl}:schema`) against this release's: ok when
    /// they match, a warning without a stamp (layout 1, stamped by the next registration or
    /// `sfu-redis migrate --apply`), a failure when another version (or garbage) is there:
    /// this release's nodes refuse to register on it.
    pub(super) fn schema(&self) -> (Status, String) {
        let st = match &self.status {
            Ok(st) => st,
            Err(e) if self.not_read => return (Status::Fail, e.clone()),
            Err(e) => return could_not_tell(e),
        };
        let speaks = sfu_redis::SCHEMA_VERSION;
        match &st.schema {
            Some(v) if *v == speaks.to_string() => (
                Status::Ok,
                format!("key schema version {v} (this release speaks {speaks})"),
            ),
            Some(v) => (
                Status::Fail,
                format!(
                    "key schema version {v:?}, but this release speaks {speaks}: its nodes refuse to register on this prefix (docs/src/ops/schema.md \"Key schema versions\")"
                ),
            ),
            None => match &st.schema_type {
                Some(t) => (
                    Status::Warn,
                    format!(
                        "{}:{{ctl}}:schema holds a {t}, not a version: the next heartbeat replaces it with version {speaks} (see fsck)",
                        st.prefix
                    ),
                ),
                None => (
                    Status::Warn,
                    format!(
                        "no key schema stamp ({}:{{ctl}}:schema): a new prefix (the next node to register stamps it) or, beside a dataset token, one written before versions existed in layout version 1 (nodes of this release refuse it: stop the fleet and run `sfu-redis migrate --apply`)",
                        st.prefix
                    ),
                ),
            },
        }
    }

    pub(super) fn judge(&self) -> (Status, String) {
        let st = match &self.status {
            Ok(st) => st,
            Err(e) if self.not_read => return (Status::Fail, e.clone()),
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
        if let Some(note) = &st.reaper_note {
            status = Status::Warn;
            parts.push(note.clone());
        }
        parts.push(format!(
            "{} instance(s): {alive} alive, {} stopped, {} late, {} stale, {} being reaped",
            st.instances.len(),
            count(InstanceState::Stopped),
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
