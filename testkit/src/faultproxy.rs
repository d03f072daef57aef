//! A small fault-injecting TCP proxy for tests and benchmarks: it sits between a node and
//! Redis and can delay traffic, drop it (a blackhole: connections stay open, bytes vanish), in
//! one direction or both, refuse new connections, or reset every open connection.
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
use std::sync::atomic::{AtomicBool, Ordering};
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
}

#[derive(Debug, Default)]
struct State {
    faults: Mutex<Faults>,
    conns: Mutex<Vec<TcpStream>>,
    stop: AtomicBool,
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
        pump(client, s2, true, Arc::clone(st));
        pump(server, c2, false, Arc::clone(st));
    }
}

/// A chunk of bytes and when it is due at the other side.
type Chunk = (Instant, Vec<u8>);

/// Copies `from` -> `to` through a delay line: a reader thread stamps each chunk with its due
/// time, a writer thread sends it then (so a delay adds latency without serializing traffic).
/// The reader polls (20 ms read timeout) so a stall or stop takes effect between chunks.
fn pump(mut from: TcpStream, mut to: TcpStream, upstream: bool, st: Arc<State>) {
    let (tx, rx): (Sender<Chunk>, Receiver<Chunk>) = unbounded();
    let _ = from.set_read_timeout(Some(Duration::from_millis(20)));
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
