//! The CLI's small synchronous HTTP/1.1 server, shared by `node --metrics-addr` (metrics.rs)
//! and `status --serve` (status/serve.rs), built to hold under abuse (issue 26 item 1).
//!
//! Our own accept loop over a std `TcpListener`; the request head is parsed by the `httparse`
//! crate. A library such as tiny_http 0.12 hides the accepted socket, so it can set no socket
//! timeout, cap no request head and bound no write: one client that never reads stalls it.
//! Here every rule below is ours and tested (tests/it/metrics.rs, tests/it/fleet_page.rs):
//!
//! - one thread per connection, at most [`Limits::max_connections`] open at once; a new
//!   connection beyond that takes the place of the one that has waited longest for its
//!   request to arrive (it is closed: a client that holds connections open without finishing
//!   its requests, however many, cannot keep a prompt client such as a liveness probe out);
//!   only when every open connection is answering is the new one refused (a best-effort short
//!   503, then closed);
//! - the whole request (head and body) must arrive within [`Limits::read_timeout`] of the
//!   accept: a trickle of bytes (slowloris) does not extend it; past it, 408 and close;
//! - the head (request line and headers) is at most [`Limits::max_head`] bytes (431 past it,
//!   without reading more) and [`MAX_HEADERS`] headers (431);
//! - a body is at most [`Limits::max_body`] bytes (413, judged from `Content-Length` before
//!   reading it); `Transfer-Encoding` is refused (501), conflicting `Content-Length`s too (400);
//! - an HTTP/1.1 request needs exactly one `Host` (400 otherwise; RFC 9112 section 3.2), an
//!   HTTP/1.0 one at most one; `Origin` and `Sec-Fetch-Site` at most once each (400: a
//!   handler checks them); an absolute-form target (`http://host/path`) is taken as its path
//!   when its authority is the `Host` (400 otherwise);
//! - one request per connection: every response says `Connection: close`, the rest of what
//!   the client sent (pipelined requests) is never parsed, so requests cannot pile up;
//! - the response must be written within [`Limits::write_timeout`]: it is written in chunks,
//!   the socket's write timeout set to the time left before each; a client that does not read
//!   loses its connection, never a thread for longer;
//! - after the response, the server half-closes and reads (and drops) what the client still
//!   sends for at most [`LINGER`] / [`LINGER_BYTES`], so the client sees the response rather
//!   than a reset (the "lingering close" of RFC 9112 section 9.6), then closes.
//!
//! So memory is bounded (a connection holds at most its head, its body and its response) and
//! no client can delay another's request, only take one of the connection slots for at most
//! `read_timeout + write_timeout + LINGER`. Stopping a server ([`Stopper::stop`]) ends its
//! accept loop and never waits for a connection.

use std::io::{self, ErrorKind, Read, Write};
use std::net::ToSocketAddrs;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Most headers in one request (431 past it).
pub(crate) const MAX_HEADERS: usize = 64;

/// Most time spent reading (and dropping) what a client still sends after its response.
pub(crate) const LINGER: Duration = Duration::from_secs(1);

/// Most bytes read (and dropped) after a response before the connection is closed.
pub(crate) const LINGER_BYTES: usize = 64 * 1024;

/// Stack of a connection thread (a handler builds one small text or JSON document).
const STACK: usize = 512 * 1024;

/// Most bytes handed to one `write` call.
const WRITE_CHUNK: usize = 16 * 1024;

/// The limits of one server.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Most connections open at once (each has its thread).
    pub max_connections: usize,
    /// Most bytes of the request line and headers, with their line ends.
    pub max_head: usize,
    /// Most bytes of a request body (`Content-Length`).
    pub max_body: usize,
    /// Time from the accept for the whole request (head and body) to arrive.
    pub read_timeout: Duration,
    /// Time for the whole response to be written.
    pub write_timeout: Duration,
}

impl Limits {
    /// The CLI's limits: 32 connections, an 8 KiB head (as nginx's default
    /// `large_client_header_buffers` line), a 4 KiB body (no endpoint reads one), 5 s to send
    /// the request, 10 s to take the response (Prometheus' default scrape timeout).
    pub(crate) const CLI: Limits = Limits {
        max_connections: 32,
        max_head: 8 * 1024,
        max_body: 4 * 1024,
        read_timeout: Duration::from_secs(5),
        write_timeout: Duration::from_secs(10),
    };
}

/// One parsed request.
#[derive(Debug)]
pub(crate) struct Request {
    /// The method as sent (`GET`, `POST`, ...).
    pub method: String,
    /// The request target as sent (`/metrics?x=1`).
    pub target: String,
    /// The headers as sent (name, value; a value that is not UTF-8 is read lossily). The
    /// body (at most [`Limits::max_body`] bytes) is read and dropped: no endpoint takes one.
    headers: Vec<(String, String)>,
}

impl Request {
    /// The target without its query string.
    pub(crate) fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }

    /// The first value of header `name` (case-insensitive).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Every value of header `name` (case-insensitive), in order.
    pub(crate) fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// True for `GET` and `HEAD` (a `HEAD` is answered as a `GET` without the body).
    pub(crate) fn is_get(&self) -> bool {
        matches!(self.method.as_str(), "GET" | "HEAD")
    }
}

/// One response. `Content-Length` and `Connection: close` are added when it is written.
#[derive(Debug)]
pub(crate) struct Response {
    /// The status code.
    pub status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    /// A response with this status, `Content-Type` and body.
    pub(crate) fn new(status: u16, content_type: &str, body: impl Into<Vec<u8>>) -> Response {
        Response {
            status,
            headers: vec![("Content-Type".into(), content_type.into())],
            body: body.into(),
        }
    }

    /// A plain-text response: `message` and a line end.
    pub(crate) fn text(status: u16, message: &str) -> Response {
        Response::new(status, "text/plain; charset=utf-8", format!("{message}\n"))
            .with_header("X-Content-Type-Options", "nosniff")
    }

    /// Adds a header. Names and values are the handlers' own, never a client's raw bytes:
    /// a CR or LF in them is replaced by a space.
    pub(crate) fn with_header(mut self, name: &str, value: &str) -> Response {
        let clean = |s: &str| s.replace(['\r', '\n'], " ");
        self.headers.push((clean(name), clean(value)));
        self
    }

    /// The bytes sent: status line, headers, and the body unless `head_only`.
    fn to_bytes(&self, head_only: bool) -> Vec<u8> {
        let mut out = format!("HTTP/1.1 {} {}\r\n", self.status, reason(self.status));
        for (n, v) in &self.headers {
            out.push_str(&format!("{n}: {v}\r\n"));
        }
        out.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            self.body.len()
        ));
        let mut bytes = out.into_bytes();
        if !head_only {
            bytes.extend_from_slice(&self.body);
        }
        bytes
    }
}

/// The reason phrase of the codes this server sends (RFC 9110 section 15).
fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        202 => "Accepted",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// What answers requests: called on the connection's thread, once per connection.
pub(crate) type Handler = dyn Fn(&Request) -> Response + Send + Sync;

/// A bound listener, not yet serving.
pub(crate) struct Server {
    listener: TcpListener,
    addr: SocketAddr,
    limits: Limits,
    /// Names the threads and the log lines (`metrics`, `fleet page`).
    name: &'static str,
}

/// Ends a [`Server::spawn`]ed server's accept loop.
pub(crate) struct Stopper {
    stop: Arc<AtomicBool>,
    addr: SocketAddr,
}

impl Server {
    /// Binds `addr` (port 0 picks a free one).
    ///
    /// # Errors
    /// The OS error (address in use, permission denied, not an address of this host, a name
    /// that does not resolve).
    pub(crate) fn bind(
        addr: impl ToSocketAddrs,
        limits: Limits,
        name: &'static str,
    ) -> io::Result<Server> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        Ok(Server {
            listener,
            addr,
            limits,
            name,
        })
    }

    /// The address bound (the port the kernel picked for port 0).
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves on this thread, for ever.
    pub(crate) fn serve(self, handler: Arc<Handler>) {
        self.accept_loop(&handler, &AtomicBool::new(false));
    }

    /// Serves on a thread of its own until [`Stopper::stop`].
    ///
    /// # Errors
    /// The thread could not be started.
    pub(crate) fn spawn(self, handler: Arc<Handler>) -> io::Result<Stopper> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopper = Stopper {
            stop: stop.clone(),
            addr: self.addr,
        };
        std::thread::Builder::new()
            .name(format!("sfu-http-{}", self.name.replace(' ', "-")))
            .spawn(move || self.accept_loop(&handler, &stop))?;
        Ok(stopper)
    }

    fn accept_loop(self, handler: &Arc<Handler>, stop: &AtomicBool) {
        let open = Arc::new(Open::default());
        loop {
            let accepted = self.listener.accept();
            if stop.load(Ordering::Acquire) {
                return;
            }
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors, or a connection reset before its accept: wait a
                    // little rather than spin.
                    log::warn!("{}: cannot accept a connection: {e}", self.name);
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
            };
            let Some(slot) = Open::admit(&open, &stream, self.limits.max_connections) else {
                refuse_busy(stream, self.limits.max_connections);
                log::debug!(
                    "{}: {} connections open, all answering; one more refused with 503",
                    self.name,
                    self.limits.max_connections
                );
                continue;
            };
            let (limits, handler) = (self.limits, handler.clone());
            let spawned = std::thread::Builder::new()
                .name("sfu-http-conn".into())
                .stack_size(STACK)
                .spawn(move || connection(stream, &slot, &limits, &*handler));
            if let Err(e) = spawned {
                // The closure (the stream and its slot) is dropped: the connection closes.
                log::warn!("{}: cannot start a connection thread: {e}", self.name);
            }
        }
    }
}

impl Stopper {
    /// Stops accepting: sets the flag and wakes the accept loop with a connection of its own
    /// (at most 200 ms). Connections in progress end by their own deadlines; nothing waits
    /// for them.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake.ip() {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
            });
        }
        let _ = TcpStream::connect_timeout(&wake, Duration::from_millis(200));
    }
}

/// The open connections of one server.
#[derive(Default)]
struct Open {
    conns: Mutex<Vec<Entry>>,
    /// The next connection's id (ids are never reused within a server's life).
    next: AtomicU64,
}

struct Entry {
    id: u64,
    /// A handle to shut the connection down when another takes its place.
    stream: Option<TcpStream>,
    accepted: Instant,
    /// Still waiting for its request (false once it is being answered).
    reading: bool,
}

impl Open {
    fn lock(&self) -> MutexGuard<'_, Vec<Entry>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for `stream` under `cap`: when all are taken, the connection that has waited
    /// longest for its request is shut down and its place given to this one; `None` when every
    /// open connection is being answered.
    fn admit(open: &Arc<Open>, stream: &TcpStream, cap: usize) -> Option<Slot> {
        let mut conns = open.lock();
        // Connections already shut down to make room are on their way out: not counted.
        let counted = conns.iter().filter(|e| e.stream.is_some()).count();
        if counted >= cap {
            let oldest = conns
                .iter_mut()
                .filter(|e| e.reading && e.stream.is_some())
                .min_by_key(|e| e.accepted)?;
            if let Some(s) = oldest.stream.take() {
                let _ = s.shutdown(Shutdown::Both);
            }
            log::debug!(
                "{cap} connections open; the one waiting longest for its request was closed for a new one"
            );
        }
        let id = open.next.fetch_add(1, Ordering::Relaxed);
        conns.push(Entry {
            id,
            stream: stream.try_clone().ok(),
            accepted: Instant::now(),
            reading: true,
        });
        Some(Slot {
            open: open.clone(),
            id,
        })
    }
}

/// An open connection's place under [`Limits::max_connections`], given back on drop (also
/// when a handler panics).
struct Slot {
    open: Arc<Open>,
    id: u64,
}

impl Slot {
    /// Its request has arrived: it is being answered and no new connection takes its place.
    fn answering(&self) {
        if let Some(e) = self.open.lock().iter_mut().find(|e| e.id == self.id) {
            e.reading = false;
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.open.lock().retain(|e| e.id != self.id);
    }
}

/// Over the cap: a short 503 written without waiting (a fresh socket's send buffer takes
/// it), then closed.
fn refuse_busy(mut stream: TcpStream, cap: usize) {
    let resp = Response::text(
        503,
        &format!("too many connections ({cap} open); try again later"),
    );
    let _ = stream.set_nonblocking(true);
    let _ = stream.write(&resp.to_bytes(false));
    let _ = stream.shutdown(Shutdown::Both);
}

/// Why no request was read.
enum ReadFailure {
    /// The client closed or reset the connection, or sent nothing before its deadline:
    /// nothing to answer.
    Gone,
    /// The request is refused with this response.
    Refused(Response),
}

/// One connection: read one request, answer it, close.
fn connection(mut stream: TcpStream, slot: &Slot, limits: &Limits, handler: &Handler) {
    let _ = stream.set_nodelay(true);
    let read_deadline = Instant::now() + limits.read_timeout;
    let read = read_request(&mut stream, limits, read_deadline);
    slot.answering();
    let (response, head_only) = match read {
        Ok(req) => (handler(&req), req.method == "HEAD"),
        Err(ReadFailure::Gone) => return,
        Err(ReadFailure::Refused(resp)) => (resp, false),
    };
    let write_deadline = Instant::now() + limits.write_timeout;
    if write_by(&mut stream, &response.to_bytes(head_only), write_deadline).is_ok() {
        linger(&mut stream);
    }
}

/// Reads into `buf` before `deadline`: the byte count (0 at end of stream).
fn read_by(stream: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> io::Result<usize> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ErrorKind::TimedOut.into());
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(buf) {
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Err(ErrorKind::TimedOut.into()),
            r => return r,
        }
    }
}

/// Writes all of `data` before `deadline`, in chunks, the write timeout set to the time left.
fn write_by(stream: &mut TcpStream, mut data: &[u8], deadline: Instant) -> io::Result<()> {
    while !data.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ErrorKind::TimedOut.into());
        }
        stream.set_write_timeout(Some(left))?;
        match stream.write(&data[..data.len().min(WRITE_CHUNK)]) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Half-closes, then reads and drops what the client still sends (at most [`LINGER`] and
/// [`LINGER_BYTES`]), so closing with unread bytes does not reset the response away.
fn linger(stream: &mut TcpStream) {
    if stream.shutdown(Shutdown::Write).is_err() {
        return;
    }
    let deadline = Instant::now() + LINGER;
    let mut buf = [0u8; 4096];
    let mut dropped = 0;
    while dropped < LINGER_BYTES {
        match read_by(stream, &mut buf, deadline) {
            Ok(0) | Err(_) => return,
            Ok(n) => dropped += n,
        }
    }
}

/// A refusal: plain text naming the problem.
fn refused(status: u16, message: &str) -> ReadFailure {
    ReadFailure::Refused(Response::text(status, message))
}

/// The parts of a complete head, owned.
struct Head {
    len: usize,
    method: String,
    target: String,
    version: u8,
    headers: Vec<(String, String)>,
}

/// Parses `buf`: `Ok(None)` while the head is incomplete.
fn parse_head(buf: &[u8]) -> Result<Option<Head>, ReadFailure> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Partial) => Ok(None),
        Ok(httparse::Status::Complete(len)) => Ok(Some(Head {
            len,
            method: req.method.unwrap_or_default().to_owned(),
            target: req.path.unwrap_or_default().to_owned(),
            version: req.version.unwrap_or(1),
            headers: req
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_owned(),
                        String::from_utf8_lossy(h.value).into_owned(),
                    )
                })
                .collect(),
        })),
        Err(httparse::Error::TooManyHeaders) => Err(refused(
            431,
            &format!("request header fields too large: more than {MAX_HEADERS} headers"),
        )),
        Err(e) => Err(refused(400, &format!("malformed request: {e}"))),
    }
}

/// Reads one request: its head (at most `max_head` bytes) and its body, all before
/// `deadline`.
fn read_request(
    stream: &mut TcpStream,
    limits: &Limits,
    deadline: Instant,
) -> Result<Request, ReadFailure> {
    let timed_out = || {
        refused(
            408,
            &format!(
                "request timeout: the request must arrive within {} s",
                limits.read_timeout.as_secs_f64()
            ),
        )
    };
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let head = loop {
        if !buf.is_empty() {
            if let Some(head) = parse_head(&buf)? {
                break head;
            }
        }
        if buf.len() >= limits.max_head {
            return Err(refused(
                431,
                &format!(
                    "request header fields too large: the request line and headers are limited to {} bytes",
                    limits.max_head
                ),
            ));
        }
        let want = (limits.max_head - buf.len()).min(chunk.len());
        match read_by(stream, &mut chunk[..want], deadline) {
            Ok(0) => return Err(ReadFailure::Gone),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::TimedOut && !buf.is_empty() => return Err(timed_out()),
            Err(_) => return Err(ReadFailure::Gone),
        }
    };
    let count = |name: &str| {
        head.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .count()
    };
    if count("Transfer-Encoding") > 0 {
        return Err(refused(
            501,
            "Transfer-Encoding is not supported: send a Content-Length",
        ));
    }
    match count("Host") {
        0 if head.version >= 1 => {
            return Err(refused(
                400,
                "bad request: an HTTP/1.1 request needs a Host header",
            ))
        }
        0 | 1 => {}
        n => {
            return Err(refused(
                400,
                &format!("bad request: {n} Host headers; send one"),
            ))
        }
    }
    for name in ["Origin", "Sec-Fetch-Site"] {
        let n = count(name);
        if n > 1 {
            return Err(refused(
                400,
                &format!("bad request: {n} {name} headers; send at most one"),
            ));
        }
    }
    let target = origin_form(&head.target, &head.headers)?;
    let mut length: Option<u64> = None;
    for (_, v) in head
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("Content-Length"))
    {
        let v = v.trim();
        let n = (!v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
            .then(|| v.parse::<u64>().ok())
            .flatten();
        match (n, length) {
            (None, _) => return Err(refused(400, "bad request: Content-Length is not a number")),
            (Some(n), Some(l)) if n != l => {
                return Err(refused(
                    400,
                    "bad request: conflicting Content-Length headers",
                ))
            }
            (Some(n), _) => length = Some(n),
        }
    }
    let length = length.unwrap_or(0);
    if length > limits.max_body as u64 {
        return Err(refused(
            413,
            &format!(
                "content too large: a request body is limited to {} bytes",
                limits.max_body
            ),
        ));
    }
    // The body is read (the request is complete only then) and dropped.
    let mut missing = (length as usize).saturating_sub(buf.len() - head.len);
    while missing > 0 {
        let want = missing.min(chunk.len());
        match read_by(stream, &mut chunk[..want], deadline) {
            Ok(0) => return Err(ReadFailure::Gone),
            Ok(n) => missing -= n,
            Err(e) if e.kind() == ErrorKind::TimedOut => return Err(timed_out()),
            Err(_) => return Err(ReadFailure::Gone),
        }
    }
    Ok(Request {
        method: head.method,
        target,
        headers: head.headers,
    })
}

/// The request target in origin form (`/path?query`): an absolute-form target
/// (`http://host/path`, RFC 9112 section 3.2.2) is taken as its path when its authority is the
/// `Host` header's value, so the Host a handler checks is the one the request is for.
fn origin_form(target: &str, headers: &[(String, String)]) -> Result<String, ReadFailure> {
    let lower = target.to_ascii_lowercase();
    let Some(rest) = ["http://", "https://"]
        .iter()
        .find_map(|scheme| lower.starts_with(scheme).then(|| &target[scheme.len()..]))
    else {
        return Ok(target.to_owned());
    };
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let host = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("Host"))
        .map(|(_, v)| v.trim());
    if host.is_some_and(|h| h.eq_ignore_ascii_case(authority)) {
        Ok(if path.starts_with('?') {
            format!("/{path}")
        } else {
            path.to_owned()
        })
    } else {
        Err(refused(
            400,
            "bad request: an absolute-form target's authority must be the Host header",
        ))
    }
}

/// The Host header's name part, lower case, without a port or a trailing dot; IPv6 literals
/// keep their brackets off (`[::1]:8080` gives `::1`).
///
/// # Errors
/// A value that is no `host[:port]`.
pub(crate) fn host_name(host: &str) -> Result<String, String> {
    let host = host.trim();
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        let (v6, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("Host {host:?}: an IPv6 address needs its closing ]"))?;
        if v6.parse::<Ipv6Addr>().is_err() {
            return Err(format!(
                "Host {host:?}: not an IPv6 address between [ and ]"
            ));
        }
        let port = match after {
            "" => None,
            _ => Some(
                after
                    .strip_prefix(':')
                    .ok_or_else(|| format!("Host {host:?}: only a :port may follow the ]"))?,
            ),
        };
        (v6, port)
    } else {
        match host.split_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (host, None),
        }
    };
    if let Some(p) = port {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) || p.parse::<u16>().is_err() {
            return Err(format!("Host {host:?}: the port is not a number"));
        }
    }
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    if name.is_empty() {
        return Err(format!("Host {host:?}: no host name"));
    }
    Ok(name)
}

/// True when `name` (from [`host_name`]) is an IP address literal.
pub(crate) fn is_ip_literal(name: &str) -> bool {
    name.parse::<IpAddr>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names() {
        assert_eq!(host_name("LocalHost:8080").unwrap(), "localhost");
        assert_eq!(host_name("[::1]:80").unwrap(), "::1");
        assert_eq!(host_name("[::1]").unwrap(), "::1");
        assert_eq!(host_name("127.0.0.1").unwrap(), "127.0.0.1");
        assert_eq!(host_name("fleet.example.").unwrap(), "fleet.example");
        assert!(host_name("").is_err());
        assert!(host_name("a:b").is_err());
        assert!(host_name("a:99999").is_err());
        assert!(host_name("[::1").is_err());
        assert!(host_name("[::1]evil.example").is_err());
        assert!(host_name("[localhost]").is_err());
        assert!(host_name("[fleet.example]:1").is_err());
        assert!(is_ip_literal("::1") && is_ip_literal("10.1.2.3"));
        assert!(!is_ip_literal("localhost"));
    }

    #[test]
    fn absolute_form_targets_are_their_path_when_the_authority_is_the_host() {
        let h = |v: &str| vec![("Host".to_owned(), v.to_owned())];
        let ok = |t: &str, host: &str| origin_form(t, &h(host)).ok();
        assert_eq!(ok("/metrics", "a:1").as_deref(), Some("/metrics"));
        assert_eq!(ok("http://a:1/healthz", "a:1").as_deref(), Some("/healthz"));
        assert_eq!(ok("HTTP://A:1", "a:1").as_deref(), Some("/"));
        assert_eq!(ok("http://a:1?x=1", "a:1").as_deref(), Some("/?x=1"));
        assert!(ok("http://evil/healthz", "a:1").is_none());
    }

    #[test]
    fn responses_never_carry_a_line_break_in_a_header() {
        let r = Response::text(200, "x").with_header("X-A", "a\r\nSet-Cookie: b");
        let s = String::from_utf8(r.to_bytes(false)).unwrap();
        assert!(s.contains("X-A: a  Set-Cookie: b\r\n"), "{s}");
        assert!(s.contains("Content-Length: 2\r\nConnection: close\r\n\r\nx\n"));
        let head = String::from_utf8(r.to_bytes(true)).unwrap();
        assert!(head.ends_with("\r\n\r\n"), "{head}");
    }
}
