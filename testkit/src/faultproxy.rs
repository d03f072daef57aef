//! A small fault-injecting TCP proxy for tests and benchmarks: it sits between a node and
//! Redis and can delay traffic, drop it (a blackhole: connections stay open, bytes vanish), in
//! one direction or both, refuse new connections, reset every open connection, or lose single
//! replies (the request runs, its answer never comes, the connection is closed).
//!
//! ```no_run
//! use std::time::Duration;
//! use sfu_redis_testkit::faultproxy::{Direction, FaultProxy};
//!
//! let proxy = FaultProxy::start("127.0.0.1:6379")?;
//! let url = proxy.url(); // point the node here
//! proxy.set_delay(Duration::from_micros(500)); // each way: 1 ms round trip
//! proxy.blackhole(Direction::Both);            // a partition
//! proxy.heal();                                // traffic flows again
//! # Ok::<(), sfu_redis::Error>(())
//! ```

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, Sender};
use parking_lot::Mutex;

use sfu_redis::{Error, Result};

/// Which way traffic flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Client to server (requests).
    Upstream,
    /// Server to client (replies).
    Downstream,
    /// Both ways.
    Both,
}

#[derive(Debug, Default)]
struct Faults {
    drop_up: bool,
    drop_down: bool,
    stall_up: bool,
    stall_down: bool,
    refuse: bool,
    delay: Duration,
    /// Armed by [`FaultProxy::lose_reply_of`]: the next request chunk holding these bytes.
    lose_reply_of: Option<Vec<u8>>,
    /// Armed by [`FaultProxy::hold_request_of`]: the next request chunk holding these bytes.
    hold_request_of: Option<Vec<u8>>,
    /// A request is held (until [`FaultProxy::heal`]).
    holding: bool,
    /// Armed by [`FaultProxy::lose_next_reply`]: how many of the next requests (whatever
    /// they hold, on whichever connection) lose their reply.
    lose_next: u32,
}

#[derive(Debug, Default)]
struct State {
    faults: Mutex<Faults>,
    conns: Mutex<Vec<TcpStream>>,
    stop: AtomicBool,
    /// Replies lost so far (connections closed instead of forwarding a reply).
    replies_lost: AtomicU64,
    /// Chunks read from clients so far (forwarded, held or dropped alike).
    requests_seen: AtomicU64,
}

/// A running proxy; stops (and closes every connection) on `Drop`.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    state: Arc<State>,
}

fn io(op: &str, e: std::io::Error) -> Error {
    Error::Io {
        op: op.to_owned(),
        source: e,
    }
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `upstream` (`host:port`).
    ///
    /// # Errors
    /// [`Error::Io`] when `upstream` does not resolve or no port can be bound.
    pub fn start(upstream: impl ToSocketAddrs) -> Result<FaultProxy> {
        let upstream = upstream
            .to_socket_addrs()
            .map_err(|e| io("resolve proxy upstream", e))?
            .next()
            .ok_or_else(|| {
                io(
                    "resolve proxy upstream",
                    std::io::ErrorKind::NotFound.into(),
                )
            })?;
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| io("bind fault proxy", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| io("bind fault proxy", e))?;
        let state = Arc::new(State::default());
        let st = Arc::clone(&state);
        std::thread::Builder::new()
            .name("fault-proxy".into())
            .spawn(move || accept_loop(&listener, upstream, &st))
            .map_err(|e| io("spawn fault proxy", e))?;
        Ok(FaultProxy { addr, state })
    }

    /// `redis://127.0.0.1:<port>` of the proxy.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// The proxy's listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Delays every chunk by `d` in each direction (a round trip gains 2 x `d`).
    pub fn set_delay(&self, d: Duration) {
        self.state.faults.lock().delay = d;
    }

    /// Drops all traffic in `dir`: bytes are read and discarded, connections stay open, so the
    /// client sees time-outs, not errors.
    pub fn blackhole(&self, dir: Direction) {
        let mut f = self.state.faults.lock();
        f.drop_up |= matches!(dir, Direction::Upstream | Direction::Both);
        f.drop_down |= matches!(dir, Direction::Downstream | Direction::Both);
    }

    /// Stops forwarding in `dir` without losing anything: bytes wait (in socket buffers) and
    /// are delivered, late, after [`FaultProxy::heal`]. A network stall rather than a loss.
    pub fn stall(&self, dir: Direction) {
        let mut f = self.state.faults.lock();
        f.stall_up |= matches!(dir, Direction::Upstream | Direction::Both);
        f.stall_down |= matches!(dir, Direction::Downstream | Direction::Both);
    }

    /// New connections are closed at once (existing ones are untouched).
    pub fn refuse_new(&self, refuse: bool) {
        self.state.faults.lock().refuse = refuse;
    }

    /// Closes every open connection (both sockets), as a reset would.
    pub fn reset_all(&self) {
        for c in self.state.conns.lock().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    /// Lets the next request that contains `marker` (within one read chunk: a script's SHA, a
    /// key name) reach the server, then closes that connection when the reply comes back,
    /// instead of forwarding it: the request ran and its answer never came (a lost reply,
    /// the case a client must not answer by sending the request again). Earlier requests on
    /// the connection got their replies. Fires once.
    pub fn lose_reply_of(&self, marker: &[u8]) {
        self.state.faults.lock().lose_reply_of = Some(marker.to_vec());
    }

    /// Loses the reply of the next request that goes through the proxy, on whichever
    /// connection, whatever it holds: the request reaches the server and runs, then its
    /// connection is closed (both sides) when the reply comes back, instead of forwarding
    /// it. The client sees a reset connection (an unknown outcome) although the write
    /// happened. Each call arms one more loss; they fire on the next requests (one per
    /// request chunk, a pipeline being one chunk). [`FaultProxy::heal`] disarms what has not
    /// fired. The chaos test calls it at random moments on random nodes' proxies ("random
    /// single-reply loss"); [`FaultProxy::replies_lost`] counts what fired.
    pub fn lose_next_reply(&self) {
        self.state.faults.lock().lose_next += 1;
    }

    /// Replies lost so far ([`FaultProxy::lose_reply_of`], [`FaultProxy::lose_next_reply`]):
    /// connections closed when the reply of a marked request came back.
    pub fn replies_lost(&self) -> u64 {
        self.state.replies_lost.load(Ordering::Relaxed)
    }

    /// Chunks of requests read from clients so far, whatever became of them (forwarded,
    /// delayed, held or dropped by a blackhole): one per request or pipeline a client sent,
    /// or more when the kernel split one. A test counts what a node sends during a fault.
    pub fn requests_seen(&self) -> u64 {
        self.state.requests_seen.load(Ordering::Relaxed)
    }

    /// True while a [`FaultProxy::lose_reply_of`] has not fired yet (no request held its
    /// marker).
    pub fn reply_loss_pending(&self) -> bool {
        self.state.faults.lock().lose_reply_of.is_some()
    }

    /// Holds back the next request that contains `marker` (within one read chunk), and
    /// everything after it on that connection, until [`FaultProxy::heal`]: the client has sent
    /// it, the server has not seen it yet. Other connections are untouched. Fires once. Lets a
    /// test act at an exact point between two round trips of a node.
    pub fn hold_request_of(&self, marker: &[u8]) {
        self.state.faults.lock().hold_request_of = Some(marker.to_vec());
    }

    /// True once a [`FaultProxy::hold_request_of`] fired and until [`FaultProxy::heal`].
    pub fn request_held(&self) -> bool {
        self.state.faults.lock().holding
    }

    /// Removes every fault: no delay, drop or stall, new connections accepted.
    pub fn heal(&self) {
        *self.state.faults.lock() = Faults::default();
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        self.reset_all();
        // Wake the accept loop so it sees `stop`.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(100));
    }
}

fn accept_loop(listener: &TcpListener, upstream: SocketAddr, st: &Arc<State>) {
    for client in listener.incoming() {
        if st.stop.load(Ordering::Relaxed) {
            break;
        }
        let Ok(client) = client else { continue };
        if st.faults.lock().refuse {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        let Ok(server) = TcpStream::connect_timeout(&upstream, Duration::from_secs(2)) else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let handles = [client.try_clone(), server.try_clone()];
        if let [Ok(c), Ok(s)] = handles {
            st.conns.lock().extend([c, s]);
        }
        let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
            continue;
        };
        // Set when a request whose reply must be lost went up this connection.
        let cut = Arc::new(AtomicBool::new(false));
        pump(client, s2, true, Arc::clone(st), Arc::clone(&cut));
        pump(server, c2, false, Arc::clone(st), cut);
    }
}

/// Sets `cut` when `chunk` holds the armed marker of [`FaultProxy::lose_reply_of`] (and
/// disarms it: it fires once), or when a [`FaultProxy::lose_next_reply`] is pending (one
/// fewer then). A connection already cut takes no second loss.
fn arm_cut(st: &State, chunk: &[u8], cut: &AtomicBool) {
    if cut.load(Ordering::SeqCst) {
        return;
    }
    let mut f = st.faults.lock();
    if f.lose_next > 0 {
        f.lose_next -= 1;
        cut.store(true, Ordering::SeqCst);
        return;
    }
    let hit = f
        .lose_reply_of
        .as_ref()
        .is_some_and(|m| !m.is_empty() && chunk.windows(m.len()).any(|w| w == m.as_slice()));
    if hit {
        f.lose_reply_of = None;
        cut.store(true, Ordering::SeqCst);
    }
}

/// True when `chunk` holds the armed marker of [`FaultProxy::hold_request_of`] (it is then
/// disarmed, and the proxy is holding until healed).
fn arm_hold(st: &State, chunk: &[u8]) -> bool {
    let mut f = st.faults.lock();
    let hit = f
        .hold_request_of
        .as_ref()
        .is_some_and(|m| !m.is_empty() && chunk.windows(m.len()).any(|w| w == m.as_slice()));
    if hit {
        f.hold_request_of = None;
        f.holding = true;
    }
    hit
}

/// A chunk of bytes and when it is due at the other side.
type Chunk = (Instant, Vec<u8>);

/// Copies `from` -> `to` through a delay line: a reader thread stamps each chunk with its due
/// time, a writer thread sends it then (so a delay adds latency without serializing traffic).
/// The reader polls (20 ms read timeout) so a stall or stop takes effect between chunks.
/// `cut`: shared by the connection's two pumps; set upstream by [`FaultProxy::lose_reply_of`],
/// it makes the downstream pump close the connection instead of forwarding the next reply.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    upstream: bool,
    st: Arc<State>,
    cut: Arc<AtomicBool>,
) {
    let (tx, rx): (Sender<Chunk>, Receiver<Chunk>) = unbounded();
    let _ = from.set_read_timeout(Some(Duration::from_millis(20)));
    // The other side, for a cut (the writer thread owns `to`).
    let other = to.try_clone().ok();
    let _ = std::thread::Builder::new()
        .name("fault-proxy-read".into())
        .spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            let faults = |st: &State| {
                let f = st.faults.lock();
                if upstream {
                    (f.drop_up, f.stall_up, f.delay)
                } else {
                    (f.drop_down, f.stall_down, f.delay)
                }
            };
            while !st.stop.load(Ordering::Relaxed) {
                // A stall stops reading (bytes wait in the socket buffers).
                if faults(&st).1 {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
                let n = match from.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) =>
                    {
                        continue
                    }
                    Err(_) => break,
                };
                if upstream {
                    st.requests_seen.fetch_add(1, Ordering::Relaxed);
                }
                // The faults as they are now, after the read (a fault set while the read was
                // waiting applies to what it returned): a stall holds the chunk back, a drop
                // discards it.
                let (dropped, delay) = loop {
                    let (dropped, stalled, delay) = faults(&st);
                    if !stalled || st.stop.load(Ordering::Relaxed) {
                        break (dropped, delay);
                    }
                    std::thread::sleep(Duration::from_millis(5));
                };
                if dropped {
                    continue;
                }
                if upstream && arm_hold(&st, &buf[..n]) {
                    while st.faults.lock().holding && !st.stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                if upstream {
                    arm_cut(&st, &buf[..n], &cut);
                } else if cut.load(Ordering::SeqCst) {
                    // The reply of the marked request: lost, with its connection.
                    st.replies_lost.fetch_add(1, Ordering::Relaxed);
                    let _ = from.shutdown(Shutdown::Both);
                    if let Some(o) = &other {
                        let _ = o.shutdown(Shutdown::Both);
                    }
                    break;
                }
                if tx
                    .send((Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
                {
                    break;
                }
            }
            let _ = from.shutdown(Shutdown::Read);
        });
    let _ = std::thread::Builder::new()
        .name("fault-proxy-write".into())
        .spawn(move || {
            for (due, chunk) in rx {
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                if to.write_all(&chunk).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        });
}
