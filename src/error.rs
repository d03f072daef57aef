//! The one error type of the crate.
//!
//! Every fallible call returns [`Result<T>`]. Match on [`Error::kind`] rather than on the
//! variants' fields: kinds are stable, messages are for people. No message ever contains a
//! Redis password (see `config::redact_url`).

use std::borrow::Cow;
use std::fmt;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, as a stable, matchable category.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// An id (room, peer, guest, instance) is empty, longer than 256 bytes or holds a control
    /// character.
    InvalidId,
    /// A configuration value is missing, malformed or contradicts another one.
    InvalidConfig,
    /// An argument other than an id is unusable (for example a reserved peer field name).
    InvalidArgument,
    /// Redis could not be reached, timed out, or answered with an error.
    Redis,
    /// Redis answered, but with data this crate did not write (a key of the wrong type, a
    /// malformed lease or record, an unexpected script reply).
    BadData,
    /// The room is owned by another instance (or by nobody) and this instance tried to act as
    /// its owner.
    NotOwner,
    /// The node has been shut down; start a new one.
    Stopped,
    /// The operation needs the reaper lease and this node does not (or no longer) hold it.
    NotLeader,
    /// A local resource (a child process, a temp dir, a port) could not be set up.
    Io,
    /// The prefix is laid out in a key schema version this release does not speak
    /// ([`crate::SCHEMA_VERSION`]): run a release that speaks it, or migrate the prefix
    /// (`sfu-redis migrate`).
    Schema,
}

/// The crate's error. Its `Display` says what happened and, where it helps, what to do.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// See [`ErrorKind::InvalidId`].
    InvalidId {
        /// Which id: `"room"`, `"peer"`, `"guest"` or `"instance"`.
        what: &'static str,
        /// Why it was refused.
        reason: String,
    },
    /// See [`ErrorKind::InvalidConfig`].
    InvalidConfig {
        /// The configuration field (or environment variable) at fault.
        field: &'static str,
        /// Why it was refused.
        reason: String,
    },
    /// See [`ErrorKind::InvalidArgument`].
    InvalidArgument {
        /// The argument at fault.
        what: &'static str,
        /// Why it was refused.
        reason: String,
    },
    /// See [`ErrorKind::Redis`].
    Redis {
        /// What the crate was doing (`"pin room"`, `"heartbeat"`, ...).
        op: Cow<'static, str>,
        /// The driver's error. Its text never contains the URL's password.
        source: redis::RedisError,
    },
    /// See [`ErrorKind::BadData`].
    BadData {
        /// What the crate was doing.
        op: String,
        /// What was found.
        detail: String,
    },
    /// See [`ErrorKind::NotOwner`].
    NotOwner {
        /// The room (caller's id).
        room: String,
        /// Its current owner, if any.
        owner: Option<String>,
    },
    /// A peer record belongs to another instance (kind [`ErrorKind::NotOwner`]): only the
    /// instance that hosts a peer removes it.
    NotPeerOwner {
        /// The room (caller's id).
        room: String,
        /// The peer (caller's id).
        peer: String,
        /// The instance its record names.
        owner: String,
    },
    /// See [`ErrorKind::Stopped`].
    Stopped,
    /// See [`ErrorKind::NotLeader`].
    NotLeader,
    /// See [`ErrorKind::Io`].
    Io {
        /// What the crate was doing.
        op: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// See [`ErrorKind::Schema`]: a registration was refused and nothing was written. Also the
    /// error of every host call of a node parked after a re-registration was refused (after
    /// it was reaped, or Redis lost its data, under a foreign stamp).
    Schema {
        /// The prefix (`<namespace>:<stage>:<branch>`).
        prefix: String,
        /// What `P:{ctl}:schema` holds (a version number, or whatever else was found there).
        found: String,
        /// The version this release speaks ([`crate::SCHEMA_VERSION`]).
        speaks: u32,
    },
}

impl Error {
    /// The stable category of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidId { .. } => ErrorKind::InvalidId,
            Error::InvalidConfig { .. } => ErrorKind::InvalidConfig,
            Error::InvalidArgument { .. } => ErrorKind::InvalidArgument,
            Error::Redis { .. } => ErrorKind::Redis,
            Error::BadData { .. } => ErrorKind::BadData,
            Error::NotOwner { .. } | Error::NotPeerOwner { .. } => ErrorKind::NotOwner,
            Error::Stopped => ErrorKind::Stopped,
            Error::NotLeader => ErrorKind::NotLeader,
            Error::Io { .. } => ErrorKind::Io,
            Error::Schema { .. } => ErrorKind::Schema,
        }
    }

    /// True when the error is a Redis call that timed out.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Redis { source, .. } if source.is_timeout())
    }

    /// True when the connection to Redis was refused, dropped or broken (the call may be
    /// retried on a new connection).
    pub fn is_connection_error(&self) -> bool {
        matches!(self, Error::Redis { source, .. }
            if source.is_io_error() || source.is_connection_dropped() || source.is_connection_refusal())
    }

    /// False when a request may or may not have run: it was sent and the connection timed out
    /// or broke before the reply. A server's error reply, bad data or a refusal before
    /// anything was sent are known outcomes.
    pub(crate) fn outcome_known(&self) -> bool {
        match self {
            Error::Redis { source, .. } => source.code().is_some() && !source.is_timeout(),
            _ => true,
        }
    }

    pub(crate) fn redis(op: impl Into<Cow<'static, str>>, source: redis::RedisError) -> Self {
        let op = op.into();
        // A server-side WRONGTYPE means somebody else's data sits on one of our keys.
        if source.code() == Some("WRONGTYPE") {
            return Error::BadData {
                op: op.into_owned(),
                detail: format!("a key holds the wrong type of value: {source}"),
            };
        }
        Error::Redis { op, source }
    }

    /// This error with `context` put before what the crate was doing (`"<context>: <op>"`);
    /// the kind, the driver's error and the outcome stay as they were.
    pub(crate) fn within(self, context: &str) -> Self {
        match self {
            Error::Redis { op, source } => Error::Redis {
                op: format!("{context}: {op}").into(),
                source,
            },
            Error::BadData { op, detail } => Error::BadData {
                op: format!("{context}: {op}"),
                detail,
            },
            Error::Io { op, source } => Error::Io {
                op: format!("{context}: {op}"),
                source,
            },
            other => other,
        }
    }

    pub(crate) fn bad_data(op: &str, detail: impl Into<String>) -> Self {
        Error::BadData {
            op: op.to_owned(),
            detail: detail.into(),
        }
    }

    pub(crate) fn config(field: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidConfig {
            field,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidId { what, reason } => write!(f, "invalid {what} id: {reason}"),
            Error::InvalidConfig { field, reason } => {
                write!(f, "invalid configuration `{field}`: {reason}")
            }
            Error::InvalidArgument { what, reason } => write!(f, "invalid {what}: {reason}"),
            Error::Redis { op, source } => {
                write!(f, "{op}: Redis call failed: {source}")?;
                if source.is_timeout() {
                    write!(f, " (timed out; is Redis overloaded or unreachable?)")?;
                } else if source.is_connection_refusal() {
                    write!(
                        f,
                        " (connection refused; is Redis running at the configured URL?)"
                    )?;
                } else if source.code() == Some("NOPERM") {
                    write!(
                        f,
                        " (permission denied by the Redis ACL: the user must be allowed this prefix's keys `~<prefix>:*`, its channel `&<prefix>:*` and the scripting commands)"
                    )?;
                } else if source.kind() == redis::ErrorKind::AuthenticationFailed
                    || matches!(source.code(), Some("WRONGPASS" | "NOAUTH"))
                {
                    write!(
                        f,
                        " (authentication failed; check the user and password of the Redis URL: a server without a password refuses one too)"
                    )?;
                } else if let Some(hint) = tls_hint(&source.to_string()) {
                    write!(f, " ({hint})")?;
                }
                Ok(())
            }
            Error::BadData { op, detail } => write!(f, "{op}: unexpected data in Redis: {detail}"),
            Error::NotOwner { room, owner } => match owner {
                Some(o) => write!(
                    f,
                    "room {room:?} is owned by instance {o:?}, not by this one"
                ),
                None => write!(f, "room {room:?} is not pinned by this instance"),
            },
            Error::NotPeerOwner { room, peer, owner } => write!(
                f,
                "peer {peer:?} of room {room:?} belongs to instance {owner:?}, not to this one"
            ),
            Error::Stopped => write!(f, "the node has been shut down"),
            Error::NotLeader => write!(f, "this node does not hold the reaper lease (any more)"),
            Error::Io { op, source } => write!(f, "{op}: {source}"),
            Error::Schema {
                prefix,
                found,
                speaks,
            } => {
                write!(
                    f,
                    "prefix {prefix} is laid out in key schema version {:?} ({prefix}:{{ctl}}:schema) but this release speaks version {speaks}: ",
                    stamp_shown(found)
                )?;
                match stamp_version(found) {
                    Some(v) if v > *speaks => write!(
                        f,
                        "run a release that speaks version {v} (this one cannot move a prefix back)"
                    )?,
                    Some(v) => write!(
                        f,
                        "stop every node on the prefix (moving from version {v} needs the whole fleet stopped: no node of the older release may run during or after the move), then run `sfu-redis migrate --apply` and start the fleet on this release"
                    )?,
                    None => write!(
                        f,
                        "that is not a version number; find out who wrote it (`sfu-redis status`), and if the keys are in this release's layout delete the key (a node writes a missing stamp)"
                    )?,
                }
                write!(f, " (docs/src/ops/schema.md \"Key schema versions\")")
            }
        }
    }
}

/// A key schema stamp for people: at most 64 characters (then `...`), whatever an operator
/// left in the key, so that a message stays one short line.
pub(crate) fn stamp_shown(found: &str) -> String {
    if found.chars().count() > 64 {
        found.chars().take(64).chain("...".chars()).collect()
    } else {
        found.to_owned()
    }
}

/// The version a key schema stamp names: a decimal number written the one way a release writes
/// it (`"1"`; not `"01"`, `"+1"` or `" 1"`, which no node accepts either: `heartbeat.lua`
/// compares the exact string).
pub(crate) fn stamp_version(found: &str) -> Option<u32> {
    found.parse::<u32>().ok().filter(|v| v.to_string() == found)
}

/// A driver error in a few words for people (`timed out`, `connection refused`,
/// `authentication failed (...)`, else its text): what a list of per-node answers shows. The
/// driver's errors carry no password.
pub(crate) fn reason(e: &redis::RedisError) -> String {
    if e.is_timeout() {
        "timed out".to_owned()
    } else if e.is_connection_refusal() {
        "connection refused".to_owned()
    } else if e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("WRONGPASS" | "NOAUTH"))
    {
        format!("authentication failed ({e})")
    } else {
        e.to_string()
    }
}

/// What to do about a TLS failure, from the driver's (rustls') message.
fn tls_hint(msg: &str) -> Option<&'static str> {
    Some(
        if msg.contains("NotValidForName") || msg.contains("not valid for name") {
            "TLS: the server's certificate does not name the host of the URL; connect by a name or address the certificate holds"
        } else if msg.contains("UnknownIssuer") || msg.contains("invalid peer certificate") {
            "TLS: the server's certificate is not trusted; set tls_ca_file to the CA that signed it (without it the system's roots are used)"
        } else if msg.contains("CertificateRequired")
            || msg.contains("BadCertificate") && msg.contains("alert")
        {
            "TLS: the server wants a client certificate it trusts (mutual TLS); set tls_cert_file and tls_key_file"
        } else if msg.contains("alert") && msg.contains("UnknownCA") {
            "TLS: the server does not trust the client certificate (tls_cert_file): it must be signed by a CA in the server's tls-ca-cert-file"
        } else if msg.contains("corrupt message") || msg.contains("InvalidContentType") {
            "TLS: the server did not answer in TLS; is this a plaintext port? use redis:// for it"
        } else {
            return None;
        },
    )
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Redis { source, .. } => Some(source),
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
