//! Master discovery through Redis Sentinel (`redis+sentinel://`), following the Sentinel
//! client specification: ask the sentinels in turn for the master's address
//! (`SENTINEL GET-MASTER-ADDR-BY-NAME`), connect to it and confirm with `ROLE` that it is a
//! master; the sentinel that answered is asked first next time.
//!
//! Every step is bounded by the command timeout (connect, TLS handshake, each reply), so an
//! unreachable, paused or lying sentinel costs at most one timeout and is skipped: a sentinel
//! that is down, does not know the master name, or names a node that is not (or no longer) a
//! master. redis-rs's own sync `Sentinel` client is not used because it opens its connections
//! without any timeout (a paused sentinel would block a heartbeat thread for good); this module
//! uses redis-rs's connections and commands with ours.
//!
//! When no sentinel answers, the master found last is tried again (with the `ROLE` check):
//! sentinels that are all down do not stop a fleet whose master is fine.

use parking_lot::Mutex;
use redis::{Connection, RedisConnectionInfo, Value};

use crate::dial::Dialer;
use crate::endpoint::{show_addr, SentinelEndpoint};
use crate::error::{reason, Error, Result};

/// Credentials of the sentinels themselves (`sentinel_user`, `sentinel_password`).
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct SentinelAuth {
    pub user: Option<String>,
    pub password: Option<String>,
}

impl std::fmt::Debug for SentinelAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelAuth")
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

/// A master found through the sentinels, with a connection to it whose `ROLE` said master.
pub(crate) struct Found {
    pub con: Connection,
    /// The master's `host:port`.
    pub master: String,
    /// The sentinel that named it (`host:port`), `None` when every sentinel failed and the last
    /// known master was tried again.
    pub via: Option<String>,
    /// Replicas connected to the master, from its `ROLE` reply (0 when `ROLE` was refused).
    pub replicas: usize,
}

/// The sentinels of one sentinel URL and what discovery learnt. Its `Debug` shows no user
/// info (a user info without `:` may be a password).
pub(crate) struct Sentinels {
    ep: SentinelEndpoint,
    sentinel_info: RedisConnectionInfo,
    node_info: RedisConnectionInfo,
    state: Mutex<State>,
    /// The connection of [`Sentinels::probe`].
    probe_con: Mutex<Option<Connection>>,
}

#[derive(Debug, Default)]
struct State {
    /// Indexes into `ep.sentinels`, the one to ask first at the front.
    order: Vec<usize>,
    /// The master found last, `(host, port)`.
    last: Option<(String, u16)>,
}

impl std::fmt::Debug for Sentinels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sentinels")
            .field("sentinels", &self.ep.sentinels)
            .field("master", &self.ep.master)
            .field("tls", &self.ep.tls)
            .field("db", &self.ep.db)
            .finish_non_exhaustive()
    }
}

impl Sentinels {
    pub(crate) fn new(ep: SentinelEndpoint, auth: &SentinelAuth) -> Sentinels {
        let mut sentinel_info = RedisConnectionInfo::default().set_skip_set_lib_name();
        if let Some(u) = &auth.user {
            sentinel_info = sentinel_info.set_username(u);
        }
        if let Some(p) = &auth.password {
            sentinel_info = sentinel_info.set_password(p);
        }
        let mut node_info = RedisConnectionInfo::default().set_db(ep.db);
        if let Some(u) = &ep.user {
            node_info = node_info.set_username(u);
        }
        if let Some(p) = &ep.password {
            node_info = node_info.set_password(p);
        }
        let order = (0..ep.sentinels.len()).collect();
        Sentinels {
            ep,
            sentinel_info,
            node_info,
            state: Mutex::new(State { order, last: None }),
            probe_con: Mutex::new(None),
        }
    }

    /// The master name.
    pub(crate) fn master_name(&self) -> &str {
        &self.ep.master
    }

    /// True when some sentinel that answers names another master than `master` (`host:port`):
    /// during a failover the sentinels disagree for a moment, and a master any of them no
    /// longer names may be deposed (it takes writes until its demotion undoes them). Asks
    /// each sentinel once (each bounded by the timeout); a sentinel that does not answer or
    /// does not know the name is not counted.
    pub(crate) fn any_names_another(&self, dialer: &Dialer, master: &str) -> bool {
        self.ep.sentinels.iter().any(|(host, port)| {
            self.open_sentinel(dialer, host, *port)
                .and_then(|mut con| self.master_addr(&mut con))
                .ok()
                .flatten()
                .is_some_and(|(h, p)| show_addr(&h, p) != master)
        })
    }

    /// How many replicas of the master the first sentinel that answers (the preferred one
    /// first) could promote: `SENTINEL REPLICAS <name>` entries not flagged `s_down`, `o_down`
    /// or `disconnected`, and not of `slave-priority` 0. `None` when no sentinel answers.
    ///
    /// A master's `ROLE` lists only replicas in sync: one that is resyncing, or that a
    /// failover under way has just detached (`SENTINEL FAILOVER` sends it `REPLICAOF NO ONE`
    /// while the old master still takes writes), is missing there but may still be promoted,
    /// without the last writes. A lease write confirmed by "no replica" would then be lost,
    /// and its epoch handed out again (chaos run, seed 14985523334794421937: epoch 10 twice).
    pub(crate) fn promotable_replicas(&self, dialer: &Dialer) -> Option<usize> {
        let order = self.state.lock().order.clone();
        order.iter().find_map(|&i| {
            let (host, port) = &self.ep.sentinels[i];
            let mut con = self.open_sentinel(dialer, host, *port).ok()?;
            let v: Value = redis::cmd("SENTINEL")
                .arg("REPLICAS")
                .arg(&self.ep.master)
                .query(&mut con)
                .ok()?;
            Some(count_promotable(&v))
        })
    }

    /// The master (`host:port`) the preferred sentinel (the one that answered last) names
    /// now, over a connection kept for these probes; `None` when it cannot tell (down, does
    /// not know the name: the next connect's discovery deals with that). The heartbeat asks
    /// every tick, so a node whose connections stay open to an old master that still accepts
    /// writes (a `SENTINEL FAILOVER` demotes it only some seconds later) moves to the new one
    /// within a tick.
    pub(crate) fn probe(&self, dialer: &Dialer) -> Option<String> {
        let i = *self.state.lock().order.first()?;
        let (host, port) = &self.ep.sentinels[i];
        let mut cached = self.probe_con.lock();
        if cached.is_none() {
            *cached = self.open_sentinel(dialer, host, *port).ok();
        }
        let con = cached.as_mut()?;
        match self.master_addr(con) {
            Ok(Some((h, p))) => Some(show_addr(&h, p)),
            Ok(None) => None,
            Err(_) => {
                *cached = None;
                None
            }
        }
    }

    /// Finds the master and connects to it. Each sentinel is asked in turn (the one that
    /// answered last first); a sentinel that fails, does not know the name, or names a node
    /// whose `ROLE` is not master is skipped. When none yields a master, the last master found
    /// is tried again.
    ///
    /// # Errors
    /// [`Error::Redis`] listing what each sentinel answered (no password in it).
    pub(crate) fn connect(&self, dialer: &Dialer) -> Result<Found> {
        let order = self.state.lock().order.clone();
        let mut tried = Vec::new();
        // A master address that failed is not tried again in the same discovery (a frozen
        // master named by every sentinel would cost a timeout per sentinel).
        let mut failed: Vec<(String, u16)> = Vec::new();
        for i in order {
            let (host, port) = &self.ep.sentinels[i];
            let sentinel = show_addr(host, *port);
            match self.ask(dialer, host, *port) {
                Err(why) => tried.push(format!("sentinel {sentinel}: {why}")),
                Ok(None) => tried.push(format!(
                    "sentinel {sentinel}: does not know master {:?}",
                    self.ep.master
                )),
                Ok(Some((mh, mp))) if failed.contains(&(mh.clone(), mp)) => tried.push(format!(
                    "sentinel {sentinel} named {} too",
                    show_addr(&mh, mp)
                )),
                Ok(Some((mh, mp))) => match self.open_master(dialer, &mh, mp) {
                    Ok((con, replicas)) => {
                        let mut st = self.state.lock();
                        st.order.retain(|&j| j != i);
                        st.order.insert(0, i);
                        st.last = Some((mh.clone(), mp));
                        return Ok(Found {
                            con,
                            master: show_addr(&mh, mp),
                            via: Some(sentinel),
                            replicas,
                        });
                    }
                    Err(why) => {
                        tried.push(format!(
                            "sentinel {sentinel} named {}: {why}",
                            show_addr(&mh, mp)
                        ));
                        failed.push((mh, mp));
                    }
                },
            }
        }
        let last = self.state.lock().last.clone();
        if let Some((mh, mp)) = last.filter(|m| !failed.contains(m)) {
            match self.open_master(dialer, &mh, mp) {
                Ok((con, replicas)) => {
                    log::warn!(
                        "no sentinel answered for master {:?} ({}); using the last known master {}",
                        self.ep.master,
                        tried.join("; "),
                        show_addr(&mh, mp)
                    );
                    return Ok(Found {
                        con,
                        master: show_addr(&mh, mp),
                        via: None,
                        replicas,
                    });
                }
                Err(why) => tried.push(format!("last known master {}: {why}", show_addr(&mh, mp))),
            }
        }
        Err(Error::Redis {
            op: format!("find master {:?} through the sentinels", self.ep.master).into(),
            source: redis::RedisError::from((
                redis::ErrorKind::Io,
                "no sentinel named a reachable master",
                tried.join("; "),
            )),
        })
    }

    /// `SENTINEL GET-MASTER-ADDR-BY-NAME` on one sentinel: `Ok(None)` when it does not know
    /// the name. The error is a short reason for people.
    fn ask(
        &self,
        dialer: &Dialer,
        host: &str,
        port: u16,
    ) -> std::result::Result<Option<(String, u16)>, String> {
        let mut con = self.open_sentinel(dialer, host, port)?;
        self.master_addr(&mut con)
    }

    /// A connection to one sentinel, with the sentinels' credentials.
    fn open_sentinel(
        &self,
        dialer: &Dialer,
        host: &str,
        port: u16,
    ) -> std::result::Result<Connection, String> {
        let why = |e: redis::RedisError| sentinel_reason(&e, dialer.is_tls());
        let info = dialer
            .info(host, port, self.sentinel_info.clone())
            .map_err(why)?;
        let client = dialer.client(info).map_err(why)?;
        dialer.open(&client).map_err(why)
    }

    /// The master address `con`'s sentinel names (`None`: it does not know the name).
    fn master_addr(
        &self,
        con: &mut Connection,
    ) -> std::result::Result<Option<(String, u16)>, String> {
        let reply: Value = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&self.ep.master)
            .query(con)
            .map_err(|e| sentinel_reason(&e, false))?;
        match reply {
            Value::Nil => Ok(None),
            v => {
                let (h, p): (String, String) =
                    redis::from_redis_value(v).map_err(|e| format!("unexpected reply: {e}"))?;
                let p: u16 = p.parse().map_err(|_| format!("unexpected port {p:?}"))?;
                Ok(Some((h, p)))
            }
        }
    }

    /// Connects to a data node and checks with `ROLE` that it is a master; returns the
    /// connection and its connected replicas. A `ROLE` refused by the ACL (`NOPERM`) is taken
    /// on the sentinel's word (replicas unknown: 0).
    fn open_master(
        &self,
        dialer: &Dialer,
        host: &str,
        port: u16,
    ) -> std::result::Result<(Connection, usize), String> {
        let info = dialer
            .info(host, port, self.node_info.clone())
            .map_err(|e| reason(&e))?;
        let client = dialer.client(info).map_err(|e| reason(&e))?;
        let mut con = dialer.open(&client).map_err(|e| reason(&e))?;
        match role(&mut con) {
            Ok(Role::Master { replicas }) => Ok((con, replicas)),
            Ok(Role::Other(r)) => Err(format!("its ROLE is {r:?}, not master")),
            Err(e) if e.code() == Some("NOPERM") => Ok((con, 0)),
            Err(e) => Err(reason(&e)),
        }
    }
}

/// What `ROLE` said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Role {
    /// A master, with this many connected replicas.
    Master { replicas: usize },
    /// `slave`, `sentinel` or anything else.
    Other(String),
}

/// Sends `ROLE`.
pub(crate) fn role<C: redis::ConnectionLike>(con: &mut C) -> redis::RedisResult<Role> {
    let v: Value = redis::cmd("ROLE").query(con)?;
    Ok(parse_role(&v))
}

/// Reads a `ROLE` reply: `["master", offset, [[ip, port, offset], ...]]`, `["slave", ...]`,
/// `["sentinel", [...]]`.
pub(crate) fn parse_role(v: &Value) -> Role {
    let Value::Array(items) = v else {
        return Role::Other(format!("{v:?}"));
    };
    let name = match items.first() {
        Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
        Some(Value::SimpleString(s)) => s.clone(),
        other => format!("{other:?}"),
    };
    if name == "master" {
        let replicas = match items.get(2) {
            Some(Value::Array(r)) => r.len(),
            _ => 0,
        };
        Role::Master { replicas }
    } else {
        Role::Other(name)
    }
}

/// Counts the entries of a `SENTINEL REPLICAS` reply (each a flat field/value array, or a
/// map in RESP3) that a failover could promote: flags without `s_down`, `o_down` or
/// `disconnected`, and a `slave-priority` other than 0.
pub(crate) fn count_promotable(v: &Value) -> usize {
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        other => format!("{other:?}"),
    };
    let Value::Array(replicas) = v else {
        return 0;
    };
    replicas
        .iter()
        .filter(|r| {
            let pairs: Vec<(String, String)> = match r {
                Value::Array(items) => items
                    .chunks(2)
                    .filter(|c| c.len() == 2)
                    .map(|c| (text(&c[0]), text(&c[1])))
                    .collect(),
                Value::Map(items) => items.iter().map(|(k, v)| (text(k), text(v))).collect(),
                _ => return false,
            };
            let field = |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.as_str())
            };
            let flags = field("flags").unwrap_or("");
            let down = flags
                .split(',')
                .any(|f| matches!(f, "s_down" | "o_down" | "disconnected"));
            !down && field("slave-priority") != Some("0")
        })
        .count()
}

/// [`reason`] for a sentinel, with what that usually means there.
fn sentinel_reason(e: &redis::RedisError, tls: bool) -> String {
    let why = reason(e);
    if e.is_timeout() && tls {
        format!("{why} (over TLS: a plaintext sentinel never answers a TLS hello; use redis+sentinel:// for plaintext sentinels)")
    } else if e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("WRONGPASS" | "NOAUTH"))
    {
        format!("{why}: the sentinels need their own password: sentinel_password (--sentinel-password, SFU_SENTINEL_PASSWORD); the URL's user info is the data nodes'")
    } else if e.to_string().contains("unknown command") {
        format!("{why} (is this a sentinel? a sentinel listens on 26379 by default)")
    } else {
        why
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn replica(flags: &str, priority: &str) -> Value {
        Value::Array(
            [
                "name",
                "127.0.0.1:6380",
                "flags",
                flags,
                "slave-priority",
                priority,
            ]
            .iter()
            .map(|s| bulk(s))
            .collect(),
        )
    }

    #[test]
    fn promotable_replicas_are_the_healthy_ones_of_nonzero_priority() {
        let v = Value::Array(vec![
            replica("slave", "100"),
            replica("slave,promoted", "100"),
            replica("s_down,slave", "100"),
            replica("slave,disconnected", "100"),
            replica("o_down,s_down,slave", "100"),
            replica("slave", "0"),
        ]);
        assert_eq!(count_promotable(&v), 2);
        let map = Value::Array(vec![Value::Map(vec![
            (bulk("flags"), bulk("slave")),
            (bulk("slave-priority"), bulk("100")),
        ])]);
        assert_eq!(count_promotable(&map), 1);
        assert_eq!(count_promotable(&Value::Array(vec![])), 0);
        assert_eq!(count_promotable(&Value::Nil), 0);
    }

    #[test]
    fn role_replies_parse() {
        let master = Value::Array(vec![
            bulk("master"),
            Value::Int(100),
            Value::Array(vec![Value::Array(vec![
                bulk("127.0.0.1"),
                bulk("6380"),
                bulk("100"),
            ])]),
        ]);
        assert_eq!(parse_role(&master), Role::Master { replicas: 1 });
        let replica = Value::Array(vec![bulk("slave"), bulk("127.0.0.1"), Value::Int(6379)]);
        assert_eq!(parse_role(&replica), Role::Other("slave".into()));
        assert!(matches!(parse_role(&Value::Nil), Role::Other(_)));
    }
}
