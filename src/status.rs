//! The fleet as Redis sees it: the leader and epoch, and each registered instance with its
//! heartbeat age on server time, alive or stale, and its room and peer counts. What
//! `sfu-redis status` prints.

use redis::Connection;
use serde_json::{json, Value};

use crate::config::Config;
use crate::conn::Redis;
use crate::error::{Error, Result};
use crate::keys::decode_id;

/// One registered instance.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct InstanceStatus {
    /// Its id (wire form if it does not decode).
    pub id: String,
    /// Server ms of its last heartbeat (0 while it is being reaped).
    pub last_heartbeat_ms: i64,
    /// Server time minus that, ms.
    pub age_ms: i64,
    /// Its heartbeat key exists and its last heartbeat is within the stale threshold.
    pub alive: bool,
    /// A leader started reaping it (score 0) and has not finished.
    pub being_reaped: bool,
    /// Members of its room index.
    pub rooms: u64,
    /// Members of its peer index.
    pub peers: u64,
}

/// The fleet of one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FleetStatus {
    /// `<namespace>:<stage>:<branch>`.
    pub prefix: String,
    /// Redis server time, ms.
    pub server_ms: i64,
    /// The lease holder, if any (its raw value if it is not an instance id).
    pub leader: Option<String>,
    /// Remaining lease TTL, ms.
    pub leader_ttl_ms: Option<i64>,
    /// The last epoch handed out.
    pub epoch: u64,
    /// Registered instances, by id.
    pub instances: Vec<InstanceStatus>,
}

impl FleetStatus {
    /// The JSON object printed by `sfu-redis status --json`.
    pub fn to_json(&self) -> Value {
        json!({
            "prefix": self.prefix,
            "server_ms": self.server_ms,
            "leader": self.leader,
            "leader_ttl_ms": self.leader_ttl_ms,
            "epoch": self.epoch,
            "instances": self.instances.iter().map(|i| json!({
                "id": i.id,
                "last_heartbeat_ms": i.last_heartbeat_ms,
                "age_ms": i.age_ms,
                "alive": i.alive,
                "being_reaped": i.being_reaped,
                "rooms": i.rooms,
                "peers": i.peers,
            })).collect::<Vec<_>>(),
        })
    }
}

/// Reads the fleet status of `config`'s prefix from `config`'s Redis.
///
/// # Errors
/// [`Error::InvalidConfig`] in memory-only mode (no Redis URL); [`Error::Redis`];
/// [`Error::BadData`] when a control key has the wrong type.
pub fn fleet_status(config: &Config) -> Result<FleetStatus> {
    let url = config
        .redis_url()
        .ok_or_else(|| Error::config("redis_url", "status needs a Redis URL (set REDIS_URL)"))?;
    let redis = Redis::new(url, config.timings().command_timeout)?;
    let mut con = redis.connect()?;
    read(config, &mut con)
}

fn read(config: &Config, con: &mut Connection) -> Result<FleetStatus> {
    let op = "read fleet status";
    let ks = config.keys();
    let wrap = |e| Error::redis(op, e);
    type Head = (
        (i64, i64),
        Option<String>,
        i64,
        Option<u64>,
        Vec<(String, i64)>,
    );
    let ((secs, micros), leader, ttl, epoch, members): Head = redis::pipe()
        .cmd("TIME")
        .get(ks.leader())
        .pttl(ks.leader())
        .get(ks.epoch())
        .zrange_withscores(ks.heartbeats(), 0, -1)
        .query(con)
        .map_err(wrap)?;
    let now = secs * 1000 + micros / 1000;
    let mut pipe = redis::pipe();
    for (id, _) in &members {
        pipe.exists(ks.heartbeat(id))
            .scard(ks.instance_rooms(id))
            .scard(ks.instance_peers(id));
    }
    let counts: Vec<(bool, u64, u64)> = if members.is_empty() {
        Vec::new()
    } else {
        let flat: Vec<redis::Value> = pipe.query(con).map_err(wrap)?;
        flat.chunks(3)
            .map(|c| {
                let get = |v: &redis::Value| redis::from_redis_value_ref::<u64>(v).unwrap_or(0);
                (get(&c[0]) == 1, get(&c[1]), get(&c[2]))
            })
            .collect()
    };
    let stale = config.timings().stale_threshold.as_millis() as i64;
    let instances = members
        .into_iter()
        .zip(counts)
        .map(|((id, score), (hb, rooms, peers))| InstanceStatus {
            id: decode_id(&id).unwrap_or(id),
            last_heartbeat_ms: score,
            age_ms: now - score,
            alive: hb && now - score <= stale,
            being_reaped: score == 0,
            rooms,
            peers,
        })
        .collect();
    Ok(FleetStatus {
        prefix: ks.prefix().to_owned(),
        server_ms: now,
        leader: leader.map(|l| decode_id(&l).unwrap_or(l)),
        leader_ttl_ms: (ttl >= 0).then_some(ttl),
        epoch: epoch.unwrap_or(0),
        instances,
    })
}
