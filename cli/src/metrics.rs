//! `sfu-redis node --metrics-addr HOST:PORT`: a small synchronous HTTP server (tiny_http) on a
//! thread of its own, serving the node's metrics and health:
//!
//! - `GET /metrics`: [`Node::metrics_as`], OpenMetrics when the scraper's `Accept` names it
//!   (Prometheus does), else the Prometheus text format 0.0.4;
//! - `GET /healthz`: [`Node::health`], 200 when healthy, 503 otherwise, the reason as a
//!   one-line plain-text body;
//! - anything else: 404 (405 for another method on those two paths).
//!
//! The listener is bound before the node starts, so a bad address fails at once (exit 2); the
//! thread ends when the node stops.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sfu_redis::{MetricsFormat, Node};
use tiny_http::{Header, Method, Request, Response, Server};

use crate::Failure;

/// The bound listener, not yet serving.
pub(crate) struct MetricsServer {
    server: Server,
    addr: SocketAddr,
    stopping: AtomicBool,
}

/// Parses `--metrics-addr` (`HOST:PORT`; port 0 picks a free one) into socket addresses.
pub(crate) fn parse_addr(s: &str) -> Result<String, String> {
    match s.to_socket_addrs().map(|mut a| a.next()) {
        Ok(Some(_)) => Ok(s.to_owned()),
        Ok(None) => Err(format!("{s:?} resolves to no address")),
        Err(e) => Err(format!(
            "{s:?} is not HOST:PORT (for example 127.0.0.1:9464 or [::]:9464): {e}"
        )),
    }
}

impl MetricsServer {
    /// Binds `addr`.
    ///
    /// # Errors
    /// A usage failure (exit 2) naming the address and the OS error (address in use,
    /// permission denied, not an address of this host).
    pub(crate) fn bind(addr: &str) -> Result<MetricsServer, Failure> {
        let server = Server::http(addr).map_err(|e| {
            Failure::usage(format!("--metrics-addr {addr}: cannot listen there: {e}"))
        })?;
        let bound = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| Failure::usage(format!("--metrics-addr {addr}: not a TCP address")))?;
        Ok(MetricsServer {
            server,
            addr: bound,
            stopping: AtomicBool::new(false),
        })
    }

    /// The address bound (the port the kernel picked for port 0).
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves requests until [`MetricsServer::stop`]; run it on its own thread.
    pub(crate) fn serve(&self, node: &Node) {
        loop {
            match self.server.recv() {
                Ok(rq) => respond(node, rq),
                Err(_) if self.stopping.load(Ordering::Acquire) => return,
                Err(e) => {
                    log::warn!("metrics server: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }

    /// Makes [`MetricsServer::serve`] return (after the request it is answering, if any).
    pub(crate) fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        self.server.unblock();
    }
}

fn header(name: &str, value: &str) -> Option<Header> {
    Header::from_bytes(name.as_bytes(), value.as_bytes()).ok()
}

fn respond(node: &Node, rq: Request) {
    let path = rq.url().split('?').next().unwrap_or("").to_owned();
    let known = matches!(path.as_str(), "/metrics" | "/healthz");
    let get = matches!(rq.method(), Method::Get | Method::Head);
    let (status, content_type, body) = if !known {
        (
            404,
            "text/plain; charset=utf-8",
            "not found: try /metrics or /healthz\n".to_owned(),
        )
    } else if !get {
        (
            405,
            "text/plain; charset=utf-8",
            "method not allowed: use GET\n".to_owned(),
        )
    } else if path == "/metrics" {
        let accept = rq
            .headers()
            .iter()
            .find(|h| h.field.equiv("Accept"))
            .map(|h| h.value.as_str().to_owned())
            .unwrap_or_default();
        let format = MetricsFormat::from_accept(&accept);
        (200, format.content_type(), node.metrics_as(format))
    } else {
        let health = node.health();
        let status = if health.ok { 200 } else { 503 };
        (
            status,
            "text/plain; charset=utf-8",
            format!("{}\n", health.reason),
        )
    };
    let mut response = Response::from_string(body).with_status_code(status);
    if let Some(h) = header("Content-Type", content_type) {
        response.add_header(h);
    }
    if known && !get {
        if let Some(h) = header("Allow", "GET, HEAD") {
            response.add_header(h);
        }
    }
    if let Err(e) = rq.respond(response) {
        log::debug!("metrics server: could not answer {path}: {e}");
    }
}
