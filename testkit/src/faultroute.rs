//! One client's own faulty path to a [`SentinelGroup`](crate::sentinel::SentinelGroup): with
//! sentinel discovery a client connects to the address the sentinels name, so a
//! [`FaultProxy`] in front of one `redis-server` is bypassed. A [`FaultRoute`] puts every byte
//! of one client behind proxies again, without changing what the sentinels say or do:
//!
//! ```text
//! client --> FaultProxy --> translator --> sentinel i        (one chain per sentinel)
//! client --> FaultProxy --> data node p                      (one proxy per data node)
//! ```
//!
//! A translator forwards every command to its real sentinel byte for byte and every reply
//! back, changing one thing: in the reply to `SENTINEL GET-MASTER-ADDR-BY-NAME` the address of
//! a data node of the group (`127.0.0.1:<p>`) becomes the address of this route's proxy in
//! front of that node. The client then follows the sentinels' answers (and so every
//! failover) exactly as it would directly, through its proxies: a master switch is a switch
//! of proxy address, `ROLE` is the real node's answer. The faults apply to the whole route
//! (blackholes: every proxy, a partition of that client from sentinels and data nodes alike),
//! or to the master the sentinels named to it last (single-reply losses).
//!
//! Plaintext groups only (no TLS, no sentinel password: the translator does not terminate
//! TLS). One difference from a direct connection: a proxy accepts before it connects
//! upstream, so a data node that is down shows as a connection closed at once (EOF) rather
//! than refused.
//!
//! ```no_run
//! use sfu_redis_testkit::faultproxy::Direction;
//! use sfu_redis_testkit::faultroute::FaultRoute;
//! use sfu_redis_testkit::sentinel::{SentinelGroup, SentinelOptions};
//!
//! let group = SentinelGroup::start(SentinelOptions::default())?;
//! let route = FaultRoute::for_group(&group)?;
//! let url = route.url(); // redis+sentinel://127.0.0.1:<t1>,.../mymaster: give it to a client
//! route.lose_next_reply();          // of the master it was named last
//! route.blackhole(Direction::Both); // cut off from sentinels and data nodes
//! route.heal();
//! # Ok::<(), sfu_redis::Error>(())
//! ```

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use sfu_redis::Result;

use crate::cli::io;
use crate::faultproxy::{Direction, FaultProxy};
use crate::sentinel::SentinelGroup;

/// How long a translator waits to reach its sentinel, and for one reply of it.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(5);

/// A client's path to a sentinel group through fault proxies (see the module docs). Stops
/// every proxy and translator, closing their connections, on `Drop`.
#[derive(Debug)]
pub struct FaultRoute {
    master_name: String,
    /// In front of each translator, in the group's sentinel order.
    sentinel_proxies: Vec<FaultProxy>,
    translators: Vec<Translator>,
    /// `(data node port, the proxy in front of it)`.
    data_proxies: Vec<(u16, FaultProxy)>,
    /// The data node the translators named last (0: none yet).
    named: Arc<AtomicU16>,
}

impl FaultRoute {
    /// A route to `group` (its sentinels, data nodes and master name).
    ///
    /// # Errors
    /// As [`FaultRoute::start`].
    pub fn for_group(group: &SentinelGroup) -> Result<FaultRoute> {
        FaultRoute::start(
            &group.sentinel_ports(),
            &group.data_ports(),
            group.master_name(),
        )
    }

    /// A route to the plaintext sentinels on `sentinel_ports` (loopback) monitoring
    /// `master_name`, whose data nodes listen on `data_ports` (loopback).
    ///
    /// # Errors
    /// [`sfu_redis::Error::Io`] when a port cannot be bound.
    pub fn start(
        sentinel_ports: &[u16],
        data_ports: &[u16],
        master_name: &str,
    ) -> Result<FaultRoute> {
        let data_proxies = data_ports
            .iter()
            .map(|p| Ok((*p, FaultProxy::start(("127.0.0.1", *p))?)))
            .collect::<Result<Vec<_>>>()?;
        let map: Vec<(u16, u16)> = data_proxies
            .iter()
            .map(|(p, proxy)| (*p, proxy.addr().port()))
            .collect();
        let named = Arc::new(AtomicU16::new(0));
        let mut translators = Vec::new();
        let mut sentinel_proxies = Vec::new();
        for port in sentinel_ports {
            let t = Translator::start(
                SocketAddr::from(([127, 0, 0, 1], *port)),
                map.clone(),
                Arc::clone(&named),
            )?;
            sentinel_proxies.push(FaultProxy::start(t.addr)?);
            translators.push(t);
        }
        Ok(FaultRoute {
            master_name: master_name.to_owned(),
            sentinel_proxies,
            translators,
            data_proxies,
            named,
        })
    }

    /// `redis+sentinel://127.0.0.1:<p1>,127.0.0.1:<p2>,.../<master name>`: the group's
    /// sentinels as seen through this route.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinel_proxies
            .iter()
            .map(|p| p.addr().to_string())
            .collect();
        format!("redis+sentinel://{}/{}", hosts.join(","), self.master_name)
    }

    /// Drops all traffic in `dir` on every proxy of the route ([`FaultProxy::blackhole`]):
    /// to and from the sentinels and every data node.
    pub fn blackhole(&self, dir: Direction) {
        for p in self.proxies() {
            p.blackhole(dir);
        }
    }

    /// Removes every fault of every proxy of the route ([`FaultProxy::heal`]).
    pub fn heal(&self) {
        for p in self.proxies() {
            p.heal();
        }
    }

    /// [`FaultProxy::lose_next_reply`] on the proxy of the data node the sentinels named to
    /// this route last (the master the client uses). Returns `false` when none was named yet.
    pub fn lose_next_reply(&self) -> bool {
        match self.named_master().and_then(|p| self.data_proxy(p)) {
            Some(proxy) => {
                proxy.lose_next_reply();
                true
            }
            None => false,
        }
    }

    /// Replies lost so far by the data nodes' proxies ([`FaultProxy::replies_lost`]).
    pub fn replies_lost(&self) -> u64 {
        self.data_proxies
            .iter()
            .map(|(_, p)| p.replies_lost())
            .sum()
    }

    /// The data node port the sentinels named to this route last.
    pub fn named_master(&self) -> Option<u16> {
        Some(self.named.load(Ordering::SeqCst)).filter(|p| *p != 0)
    }

    /// The proxy in front of the data node on `port`.
    pub fn data_proxy(&self, port: u16) -> Option<&FaultProxy> {
        self.data_proxies
            .iter()
            .find(|(p, _)| *p == port)
            .map(|(_, proxy)| proxy)
    }

    /// `GET-MASTER-ADDR-BY-NAME` replies translated so far.
    pub fn translated(&self) -> u64 {
        self.translators
            .iter()
            .map(|t| t.state.translated.load(Ordering::Relaxed))
            .sum()
    }

    fn proxies(&self) -> impl Iterator<Item = &FaultProxy> {
        self.sentinel_proxies
            .iter()
            .chain(self.data_proxies.iter().map(|(_, p)| p))
    }
}

#[derive(Debug, Default)]
struct TranslatorState {
    stop: AtomicBool,
    /// Open connections (client and sentinel side), by connection number, for `Drop`.
    conns: Mutex<Vec<(u64, TcpStream)>>,
    next_conn: AtomicU64,
    translated: AtomicU64,
}

/// Forwards to one sentinel, translating data node addresses in master-address replies.
#[derive(Debug)]
struct Translator {
    addr: SocketAddr,
    state: Arc<TranslatorState>,
}

impl Translator {
    fn start(
        sentinel: SocketAddr,
        map: Vec<(u16, u16)>,
        named: Arc<AtomicU16>,
    ) -> Result<Translator> {
        let listener =
            TcpListener::bind("127.0.0.1:0").map_err(|e| io("bind a sentinel translator", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| io("bind a sentinel translator", e))?;
        let state = Arc::new(TranslatorState::default());
        let st = Arc::clone(&state);
        std::thread::Builder::new()
            .name("sentinel-translator".into())
            .spawn(move || {
                for client in listener.incoming() {
                    if st.stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(client) = client else { continue };
                    let (st, map, named) = (Arc::clone(&st), map.clone(), Arc::clone(&named));
                    let _ = std::thread::Builder::new()
                        .name("sentinel-translator-conn".into())
                        .spawn(move || serve(client, sentinel, &map, &named, &st));
                }
            })
            .map_err(|e| io("spawn a sentinel translator", e))?;
        Ok(Translator { addr, state })
    }
}

impl Drop for Translator {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        for (_, c) in self.state.conns.lock().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
        // Wake the accept loop so it sees `stop`.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(100));
    }
}

/// One client connection: each command to the sentinel, each reply back (translated when it
/// answers `SENTINEL GET-MASTER-ADDR-BY-NAME`). Ends when either side closes or fails.
fn serve(
    client: TcpStream,
    sentinel: SocketAddr,
    map: &[(u16, u16)],
    named: &AtomicU16,
    st: &TranslatorState,
) {
    let Ok(upstream) = TcpStream::connect_timeout(&sentinel, UPSTREAM_TIMEOUT) else {
        // The sentinel is down: the client sees its connection closed.
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let _ = upstream.set_read_timeout(Some(UPSTREAM_TIMEOUT));
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let n = st.next_conn.fetch_add(1, Ordering::Relaxed);
    st.conns.lock().extend(
        [client.try_clone(), upstream.try_clone()]
            .into_iter()
            .flatten()
            .map(|c| (n, c)),
    );
    let (Ok(mut client_w), Ok(mut upstream_w)) = (client.try_clone(), upstream.try_clone()) else {
        st.conns.lock().retain(|(m, _)| *m != n);
        return;
    };
    let mut from_client = BufReader::new(client);
    let mut from_sentinel = BufReader::new(upstream);
    loop {
        if st.stop.load(Ordering::Relaxed) {
            break;
        }
        let mut request = Vec::new();
        let Ok(command) = read_frame(&mut from_client, &mut request) else {
            break;
        };
        if upstream_w.write_all(&request).is_err() {
            break;
        }
        let mut reply = Vec::new();
        let Ok(answer) = read_frame(&mut from_sentinel, &mut reply) else {
            break;
        };
        if is_master_addr_query(&command) {
            if let Some(port) = master_port(&answer) {
                if let Some((_, proxy)) = map.iter().find(|(p, _)| *p == port) {
                    named.store(port, Ordering::SeqCst);
                    let p = proxy.to_string();
                    reply =
                        format!("*2\r\n$9\r\n127.0.0.1\r\n${}\r\n{p}\r\n", p.len()).into_bytes();
                    st.translated.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if client_w.write_all(&reply).is_err() {
            break;
        }
    }
    let _ = client_w.shutdown(Shutdown::Both);
    let _ = upstream_w.shutdown(Shutdown::Both);
    st.conns.lock().retain(|(m, _)| *m != n);
}

/// One RESP frame (RESP2 and the RESP3 types), as far as the translator needs to look into it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Frame {
    /// A one-line frame (`+`, `-`, `:`, `,`, `#`, `_`, `(`) or an inline command: its line.
    Line(Vec<u8>),
    /// A bulk string (`$`, `!`, `=`); `None` for a null one.
    Bulk(Option<Vec<u8>>),
    /// An aggregate (`*`, `~`, `>`, `%`, `|`; a map's keys and values in order); `None` for a
    /// null array.
    Many(Option<Vec<Frame>>),
}

/// Reads one whole frame from `r`, appending its exact bytes to `raw`.
fn read_frame(r: &mut impl BufRead, raw: &mut Vec<u8>) -> std::io::Result<Frame> {
    let line = read_line(r, raw)?;
    let Some((&kind, rest)) = line.split_first() else {
        // An empty inline command.
        return Ok(Frame::Line(line));
    };
    let count = || -> std::io::Result<i64> {
        std::str::from_utf8(rest)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidData))
    };
    match kind {
        b'$' | b'!' | b'=' => {
            let n = count()?;
            if n < 0 {
                return Ok(Frame::Bulk(None));
            }
            let mut body = vec![0u8; n as usize + 2];
            r.read_exact(&mut body)?;
            raw.extend_from_slice(&body);
            body.truncate(n as usize);
            Ok(Frame::Bulk(Some(body)))
        }
        b'*' | b'~' | b'>' | b'%' | b'|' => {
            let n = count()?;
            if n < 0 {
                return Ok(Frame::Many(None));
            }
            let n = if matches!(kind, b'%' | b'|') {
                n * 2
            } else {
                n
            };
            let mut items = Vec::with_capacity(n as usize);
            for _ in 0..n {
                items.push(read_frame(r, raw)?);
            }
            Ok(Frame::Many(Some(items)))
        }
        // One-line types, and inline commands (`PING\r\n`).
        _ => Ok(Frame::Line(line)),
    }
}

/// Reads up to and including `\r\n` (appended to `raw`); returns the line without it.
fn read_line(r: &mut impl BufRead, raw: &mut Vec<u8>) -> std::io::Result<Vec<u8>> {
    let mut line = Vec::new();
    let n = r.read_until(b'\n', &mut line)?;
    if n == 0 || !line.ends_with(b"\n") {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    raw.extend_from_slice(&line);
    line.pop();
    if line.ends_with(b"\r") {
        line.pop();
    }
    Ok(line)
}

/// `SENTINEL GET-MASTER-ADDR-BY-NAME <name>` (any case).
fn is_master_addr_query(f: &Frame) -> bool {
    let Frame::Many(Some(args)) = f else {
        return false;
    };
    let arg = |i: usize| match args.get(i) {
        Some(Frame::Bulk(Some(b))) => Some(b.as_slice()),
        _ => None,
    };
    arg(0).is_some_and(|a| a.eq_ignore_ascii_case(b"SENTINEL"))
        && arg(1).is_some_and(|a| a.eq_ignore_ascii_case(b"GET-MASTER-ADDR-BY-NAME"))
}

/// The port of a `[127.0.0.1, <port>]` reply.
fn master_port(f: &Frame) -> Option<u16> {
    let Frame::Many(Some(items)) = f else {
        return None;
    };
    match items.as_slice() {
        [Frame::Bulk(Some(host)), Frame::Bulk(Some(port))] if host == b"127.0.0.1" => {
            std::str::from_utf8(port).ok()?.parse().ok()
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sentinel::SentinelOptions;
    use std::time::Instant;

    fn frame(bytes: &[u8]) -> (Frame, Vec<u8>) {
        let mut raw = Vec::new();
        let f = read_frame(&mut &bytes[..], &mut raw).expect("a whole frame");
        (f, raw)
    }

    #[test]
    fn frames_are_read_whole_and_kept_byte_for_byte() {
        let query = b"*3\r\n$8\r\nSENTINEL\r\n$23\r\nget-master-addr-by-name\r\n$8\r\nmymaster\r\n";
        let (f, raw) = frame(query);
        assert_eq!(raw, query);
        assert!(is_master_addr_query(&f));
        let (f, _) = frame(b"*2\r\n$8\r\nSENTINEL\r\n$7\r\nMASTERS\r\n");
        assert!(!is_master_addr_query(&f));
        let reply = b"*2\r\n$9\r\n127.0.0.1\r\n$5\r\n16379\r\n";
        let (f, raw) = frame(reply);
        assert_eq!(raw, reply);
        assert_eq!(master_port(&f), Some(16379));
        assert_eq!(master_port(&frame(b"*-1\r\n").0), None);
        assert_eq!(frame(b"$-1\r\n").0, Frame::Bulk(None));
        // RESP3 map with a nested array, an error, an inline command.
        let map = b"%1\r\n+k\r\n*2\r\n:1\r\n_\r\n";
        let (f, raw) = frame(map);
        assert_eq!(raw, map);
        assert!(matches!(f, Frame::Many(Some(ref v)) if v.len() == 2));
        assert_eq!(frame(b"-ERR x\r\n").0, Frame::Line(b"-ERR x".to_vec()));
        assert_eq!(frame(b"PING\r\n").0, Frame::Line(b"PING".to_vec()));
        let mut raw = Vec::new();
        assert!(read_frame(&mut &b"$5\r\nab"[..], &mut raw).is_err());
    }

    fn master_addr(url_port: u16, name: &str) -> (String, u16) {
        let mut con = redis::Client::open(format!("redis://127.0.0.1:{url_port}"))
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(2))
            .expect("connect through the route");
        con.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(name)
            .query::<(String, u16)>(&mut con)
            .expect("GET-MASTER-ADDR-BY-NAME")
    }

    #[test]
    fn a_route_names_its_proxies_follows_failovers_and_cuts_off() {
        let g = SentinelGroup::start(SentinelOptions::default()).expect("start group");
        let route = FaultRoute::for_group(&g).expect("route");
        let (data, sentinels) = (g.data_ports(), g.sentinel_ports());
        let entry = |i: usize| route.sentinel_proxies[i].addr().port();
        assert_eq!(
            route.url(),
            format!(
                "redis+sentinel://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}/mymaster",
                entry(0),
                entry(1),
                entry(2)
            )
        );
        assert!(sentinels
            .iter()
            .all(|s| !route.url().contains(&s.to_string())));
        let proxy_of = |p: u16| route.data_proxy(p).expect("a proxy").addr().port();
        // Each entry names the proxy of the master; other commands pass untouched.
        for i in 0..3 {
            assert_eq!(
                master_addr(entry(i), "mymaster"),
                ("127.0.0.1".into(), proxy_of(data[0]))
            );
        }
        assert_eq!(route.named_master(), Some(data[0]));
        assert_eq!(route.translated(), 3);
        let mut con = redis::Client::open(format!("redis://127.0.0.1:{}", entry(0)))
            .unwrap()
            .get_connection()
            .unwrap();
        let unknown: Option<Vec<String>> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg("nosuch")
            .query(&mut con)
            .unwrap();
        assert_eq!(unknown, None);
        let pong: String = redis::cmd("PING").query(&mut con).unwrap();
        assert_eq!(pong, "PONG");
        // The proxy reaches the master itself.
        let mut master = redis::Client::open(format!("redis://127.0.0.1:{}", proxy_of(data[0])))
            .unwrap()
            .get_connection()
            .unwrap();
        let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut master).unwrap();
        assert_eq!(role[0], redis::Value::BulkString(b"master".to_vec()));
        // A reply loss fires on the named master's proxy.
        assert!(route.lose_next_reply());
        let lost = redis::cmd("PING").query::<String>(&mut master);
        assert!(lost.is_err(), "{lost:?}");
        assert_eq!(route.replies_lost(), 1);

        // After a failover the route names the other proxy.
        let (old, new) = g.failover().expect("failover");
        assert_eq!((old, new), (data[0], data[1]));
        assert_eq!(
            master_addr(entry(1), "mymaster"),
            ("127.0.0.1".into(), proxy_of(data[1]))
        );
        assert_eq!(route.named_master(), Some(data[1]));

        // A blackhole cuts the sentinels off too; heal lets everything through again.
        route.blackhole(Direction::Both);
        let t = Instant::now();
        let cut = redis::Client::open(format!("redis://127.0.0.1:{}", entry(2)))
            .unwrap()
            .get_connection_with_timeout(Duration::from_millis(500))
            .and_then(|mut c| {
                c.set_read_timeout(Some(Duration::from_millis(500)))?;
                redis::cmd("PING").query::<String>(&mut c)
            });
        assert!(cut.is_err(), "{cut:?}");
        assert!(t.elapsed() < Duration::from_secs(3));
        route.heal();
        assert_eq!(
            master_addr(entry(2), "mymaster"),
            ("127.0.0.1".into(), proxy_of(data[1]))
        );
    }
}
