//! `sfu-redis node --metrics-addr HOST:PORT`: the node's metrics and health over HTTP, served by
//! the CLI's own bounded server ([`crate::http`]: a thread per connection up to a cap, read
//! and write deadlines, head and body caps, one request per connection):
//!
//! - `GET /metrics`: [`Node::metrics_as`], OpenMetrics when the scraper's `Accept` names it
//!   (Prometheus does), else the Prometheus text format 0.0.4;
//! - `GET /healthz`: [`Node::health`], 200 when healthy, 503 otherwise, the reason as a
//!   one-line plain-text body;
//! - anything else: 404 (405 for another method on those two paths).
//!
//! No `Host` check: a scraper names its target as it likes, and no browser page is served.
//! The listener is bound before the node starts, so a bad address fails at once (exit 2).
//! Stopping the node stops the accept loop and never waits for a connection (a client that
//! never reads cannot delay the node's stop).

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;

use sfu_redis::{MetricsFormat, Node};

use crate::http::{self, Limits, Request, Response, Stopper};
use crate::Failure;

/// The bound listener, not yet serving.
pub(crate) struct MetricsServer {
    server: http::Server,
}

/// Parses `--metrics-addr` (`HOST:PORT`; port 0 picks a free one) into socket addresses.
pub(crate) fn parse_addr(s: &str) -> Result<String, String> {
    // A bare port is loopback, as `status --serve PORT` takes it.
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return match s.parse::<u16>() {
            Ok(port) => Ok(format!("127.0.0.1:{port}")),
            Err(_) => Err(format!("{s:?}: a port is 0 to 65535")),
        };
    }
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
        let server = http::Server::bind(addr, Limits::CLI, "metrics").map_err(|e| {
            Failure::usage(format!("--metrics-addr {addr}: cannot listen there: {e}"))
        })?;
        Ok(MetricsServer { server })
    }

    /// The address bound (the port the kernel picked for port 0).
    pub(crate) fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// Serves `node` on a thread of its own until [`Stopper::stop`].
    ///
    /// # Errors
    /// The accept thread could not be started (the message says /metrics is not served).
    pub(crate) fn spawn(self, node: Arc<Node>) -> Result<Stopper, String> {
        self.server
            .spawn(Arc::new(move |rq: &Request| respond(&node, rq)))
            .map_err(|e| format!("cannot start the metrics thread: {e}; /metrics is not served"))
    }
}

fn respond(node: &Node, rq: &Request) -> Response {
    let path = rq.path();
    let known = matches!(path, "/metrics" | "/healthz");
    if !known {
        Response::text(404, "not found: try /metrics or /healthz")
    } else if !rq.is_get() {
        Response::text(405, "method not allowed: use GET").with_header("Allow", "GET, HEAD")
    } else if path == "/metrics" {
        let format = MetricsFormat::from_accept(rq.header("Accept").unwrap_or_default());
        Response::new(200, format.content_type(), node.metrics_as(format))
    } else {
        let health = node.health();
        Response::text(if health.ok { 200 } else { 503 }, &health.reason)
    }
}

#[cfg(test)]
mod tests {
    use super::parse_addr;

    #[test]
    fn a_bare_port_is_loopback_and_bad_ports_are_named() {
        assert_eq!(parse_addr("9464").as_deref(), Ok("127.0.0.1:9464"));
        assert_eq!(parse_addr("0").as_deref(), Ok("127.0.0.1:0"));
        assert_eq!(parse_addr("[::1]:9464").as_deref(), Ok("[::1]:9464"));
        assert!(parse_addr("70000").unwrap_err().contains("0 to 65535"));
        assert!(parse_addr("nohost").unwrap_err().contains("HOST:PORT"));
    }
}
