//! Opening one connection to one server: its address and credentials, TLS (verification,
//! client certificates), and the timeouts (connect, TLS handshake, read, write). Every
//! connection of the library is dialled here: to a standalone server, to a sentinel, to the
//! master a sentinel named. And how a pipeline is read on one of them ([`pipeline`]).

use std::time::Duration;

use redis::{Client, Connection, ConnectionAddr, ConnectionInfo, ConnectionLike};
use redis::{IntoConnectionInfo, RedisConnectionInfo, RedisResult, Value};

#[cfg(not(feature = "tls"))]
use crate::error::Error;
use crate::error::Result;
use crate::tls::TlsOptions;

/// How to open a connection: plaintext or TLS (with the configured certificates), and the
/// timeout of each step.
#[derive(Clone)]
pub(crate) struct Dialer {
    tls: Option<Tls>,
    timeout: Duration,
}

#[derive(Clone)]
struct Tls {
    insecure: bool,
    #[cfg(feature = "tls")]
    certs: Option<redis::TlsCertificates>,
}

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dialer")
            .field("tls", &self.tls.as_ref().map(|t| t.insecure))
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Dialer {
    /// A dialer for plaintext (`tls` false) or TLS connections. With TLS the certificate files
    /// of `options` are read now (errors name the field).
    pub(crate) fn new(tls: bool, options: &TlsOptions, timeout: Duration) -> Result<Dialer> {
        if !tls {
            return Ok(Dialer { tls: None, timeout });
        }
        Ok(Dialer {
            tls: Some(Tls::new(options)?),
            timeout,
        })
    }

    /// True for TLS connections.
    pub(crate) fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The connection info of `host:port` with `redis` (credentials, db), over TLS when this
    /// dialer is.
    pub(crate) fn info(
        &self,
        host: &str,
        port: u16,
        redis: RedisConnectionInfo,
    ) -> RedisResult<ConnectionInfo> {
        let addr = match &self.tls {
            None => ConnectionAddr::Tcp(host.to_owned(), port),
            Some(t) => ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: t.insecure,
                tls_params: None,
            },
        };
        Ok(addr.into_connection_info()?.set_redis_settings(redis))
    }

    /// A connection info parsed from a URL, with this dialer's TLS settings applied.
    pub(crate) fn adapt(&self, info: ConnectionInfo) -> ConnectionInfo {
        match (info.addr().clone(), &self.tls) {
            (ConnectionAddr::TcpTls { host, port, .. }, Some(t)) => {
                info.set_addr(ConnectionAddr::TcpTls {
                    host,
                    port,
                    insecure: t.insecure,
                    tls_params: None,
                })
            }
            _ => info,
        }
    }

    /// A client for `info` (with the certificates when TLS has any).
    pub(crate) fn client(&self, info: ConnectionInfo) -> RedisResult<Client> {
        match &self.tls {
            #[cfg(feature = "tls")]
            Some(Tls {
                certs: Some(certs), ..
            }) => Client::build_with_tls(info, certs.clone()),
            _ => Client::open(info),
        }
    }

    /// Opens a connection with connect, handshake, read and write timeouts.
    pub(crate) fn open(&self, client: &Client) -> RedisResult<Connection> {
        if self.tls.as_ref().is_some_and(|t| t.insecure) {
            log::warn!(
                "TLS certificate verification is OFF (tls_insecure): anyone on the path to {} can read and change this connection",
                addr_of(client)
            );
        }
        let con = client.get_connection_with_timeout(self.timeout)?;
        con.set_read_timeout(Some(self.timeout))?;
        con.set_write_timeout(Some(self.timeout))?;
        Ok(con)
    }
}

/// `host:port` of a client's address, for messages.
pub(crate) fn addr_of(client: &Client) -> String {
    match client.get_connection_info().addr() {
        ConnectionAddr::Tcp(h, p)
        | ConnectionAddr::TcpTls {
            host: h, port: p, ..
        } => crate::endpoint::show_addr(h, *p),
        ConnectionAddr::Unix(path) => path.display().to_string(),
        _ => "the server".to_owned(),
    }
}

impl Tls {
    #[cfg(feature = "tls")]
    fn new(options: &TlsOptions) -> Result<Tls> {
        crate::tls::install_provider();
        let loaded = options.load()?;
        Ok(Tls {
            insecure: options.insecure,
            certs: loaded.certificates(),
        })
    }

    #[cfg(not(feature = "tls"))]
    fn new(_: &TlsOptions) -> Result<Tls> {
        Err(Error::config(
            "redis_url",
            "this build of sfu-redis has no TLS support (cargo feature `tls`); use redis:// or build with the default features",
        ))
    }
}

/// Sends a pipeline (`bytes`: its commands packed; the first `offset` replies read and dropped,
/// the next `count` returned) on `con` and reads the replies, giving up at the first I/O error
/// (a timeout, a broken connection). A server's error reply is a reply: it takes its
/// command's place, and reading goes on.
///
/// redis-rs's own pipeline read goes on after a timeout too, waiting one more full read
/// timeout for each reply left: a pipeline of 500 pin refreshes sent to a Redis that froze
/// (SIGSTOP, a stalled VM) would block its thread for 500 command timeouts, and a node's stop
/// with it. Here it blocks for one ("no hang past a timeout"). After an I/O error the
/// connection is out of step with its replies (the ones left unread would answer the next
/// requests): the caller drops it (`conn::keep_connection`, `ClusterConn::settle`), and a
/// one-server `Conn` refuses every later request.
pub(crate) fn pipeline(
    con: &mut Connection,
    bytes: &[u8],
    offset: usize,
    count: usize,
) -> RedisResult<Vec<Value>> {
    pipeline_in_step(con, bytes, offset, count).0
}

/// [`pipeline`], and whether the connection is still in step with its replies: false after
/// a send that failed (a command may be half written) or an I/O error with replies left
/// unread. A timeout on the last reply leaves it in step: redis-rs skips that late reply
/// when the next request reads.
pub(crate) fn pipeline_in_step(
    con: &mut Connection,
    bytes: &[u8],
    offset: usize,
    count: usize,
) -> (RedisResult<Vec<Value>>, bool) {
    if let Err(e) = con.send_packed_command(bytes) {
        return (Err(e), false);
    }
    let mut out = Vec::with_capacity(count);
    // A command refused while a transaction was queued (before `offset`): the first such
    // error fails the pipeline (redis-rs answers `EXECABORT` listing them all).
    let mut refused = None;
    let mut failed = None;
    let mut i = 0;
    while i < offset + count {
        match con.recv_response() {
            // RESP3 push data is no command's reply.
            Ok(Value::Push { .. }) => continue,
            Ok(Value::ServerError(e)) if i < offset => {
                refused.get_or_insert(e);
            }
            Ok(v) if i >= offset => out.push(v),
            Ok(_) => {}
            Err(e) if e.is_io_error() => return (Err(e), i + 1 == offset + count),
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
        i += 1;
    }
    if let Some(e) = refused {
        return (Err(e.into()), true);
    }
    (failed.map_or(Ok(out), Err), true)
}

/// A raw connection whose pipelines are read by [`pipeline`]: for the pipelines sent before
/// the connection is wrapped in a `Conn` (the script preload of a new connection).
pub(crate) struct Bounded<'a>(pub(crate) &'a mut Connection);

impl ConnectionLike for Bounded<'_> {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        self.0.req_packed_command(cmd)
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        pipeline(self.0, cmd, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.0.get_db()
    }

    fn check_connection(&mut self) -> bool {
        self.0.check_connection()
    }

    fn is_open(&self) -> bool {
        self.0.is_open()
    }
}
