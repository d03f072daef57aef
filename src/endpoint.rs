//! Where Redis is: the URL forms a configuration accepts, parsed into the server (or the
//! sentinels) to reach. Used by the configuration (validation at build), the connector
//! (`conn::Redis`) and URL redaction.
//!
//! | form | meaning |
//! |---|---|
//! | `redis://[user:pass@]host:port[/db]` | one server, plaintext (also the other forms redis-rs reads: `valkey://`, `redis+unix://`, `unix://`) |
//! | `rediss://[user:pass@]host:port[/db]` | one server over TLS |
//! | `redis+sentinel://[user:pass@]h1:p1,h2:p2,.../<master-name>[/db]` | the master a set of sentinels names; the user info authenticates to the data nodes |
//! | `rediss+sentinel://...` | the same, with TLS to the sentinels and to the data nodes |
//! | `redis+cluster://[user:pass@]h1:p1,h2:p2,...` | a Redis Cluster; the hosts are seeds (any nodes of it: the slot map names the rest), the user info authenticates to every node; database 0 only |
//! | `rediss+cluster://...` | the same, over TLS to every node |
//!
//! A sentinel's port defaults to 26379, a cluster seed's to 6379. Hosts may be IPv6 literals in brackets
//! (`[::1]:26379`). The sentinels' own credentials, when they need any, are configured apart
//! (`sentinel_user`, `sentinel_password`): a URL carries one user info.

use percent_encoding::percent_decode_str;
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};

/// Default port of a sentinel when a sentinel URL names none.
pub(crate) const SENTINEL_PORT: u16 = 26379;

/// A parsed Redis URL.
#[derive(Debug, Clone)]
pub(crate) enum Endpoint {
    /// One server (`redis://`, `rediss://`, ...). `tls` is true for `rediss://`.
    Direct { info: ConnectionInfo, tls: bool },
    /// The master named by a set of sentinels.
    Sentinel(SentinelEndpoint),
    /// A Redis Cluster reached through seed nodes.
    Cluster(ClusterEndpoint),
}

/// `redis+cluster://` / `rediss+cluster://`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct ClusterEndpoint {
    /// `(host, port)` of each seed node, in the URL's order.
    pub seeds: Vec<(String, u16)>,
    /// TLS to every node.
    pub tls: bool,
    /// Credentials of every node (the URL's user info), percent-decoded.
    pub user: Option<String>,
    pub password: Option<String>,
}

impl std::fmt::Debug for ClusterEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterEndpoint")
            .field("seeds", &self.seeds)
            .field("tls", &self.tls)
            .field("user", &self.user.as_ref().map(|_| "***"))
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

/// `redis+sentinel://` / `rediss+sentinel://`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SentinelEndpoint {
    /// `(host, port)` of each sentinel, in the URL's order.
    pub sentinels: Vec<(String, u16)>,
    /// The master name the sentinels monitor (`sentinel monitor <name> ...`).
    pub master: String,
    /// TLS to the sentinels and to the data nodes.
    pub tls: bool,
    /// Credentials of the data nodes (the URL's user info), percent-decoded.
    pub user: Option<String>,
    pub password: Option<String>,
    /// Database number on the data nodes.
    pub db: i64,
}

impl std::fmt::Debug for SentinelEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelEndpoint")
            .field("sentinels", &self.sentinels)
            .field("master", &self.master)
            .field("tls", &self.tls)
            .field("user", &self.user.as_ref().map(|_| "***"))
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("db", &self.db)
            .finish()
    }
}

impl Endpoint {
    /// True for `rediss://` and `rediss+sentinel://`.
    pub(crate) fn tls(&self) -> bool {
        match self {
            Endpoint::Direct { tls, .. } => *tls,
            Endpoint::Sentinel(s) => s.tls,
            Endpoint::Cluster(c) => c.tls,
        }
    }

    /// `plain`, `tls`, `sentinel` or `sentinel+tls`: the transport, for logs and status.
    pub(crate) fn transport(&self) -> &'static str {
        match self {
            Endpoint::Direct { tls: false, .. } => "plain",
            Endpoint::Direct { tls: true, .. } => "tls",
            Endpoint::Sentinel(SentinelEndpoint { tls: false, .. }) => "sentinel",
            Endpoint::Sentinel(SentinelEndpoint { tls: true, .. }) => "sentinel+tls",
            Endpoint::Cluster(ClusterEndpoint { tls: false, .. }) => "cluster",
            Endpoint::Cluster(ClusterEndpoint { tls: true, .. }) => "cluster+tls",
        }
    }
}

/// The scheme of `url`, lower-cased, if it has one (`scheme://...`).
fn scheme_of(url: &str) -> Option<String> {
    url.trim()
        .split_once("://")
        .map(|(s, _)| s.to_ascii_lowercase())
}

/// True when `url` is a sentinel URL (`redis+sentinel://`, `rediss+sentinel://`, or the
/// `valkey` spellings).
pub(crate) fn is_sentinel_url(url: &str) -> bool {
    matches!(
        scheme_of(url).as_deref(),
        Some("redis+sentinel" | "rediss+sentinel" | "valkey+sentinel" | "valkeys+sentinel")
    )
}

/// True when `url` is a cluster URL (`redis+cluster://`, `rediss+cluster://`, or the
/// `valkey` spellings).
pub(crate) fn is_cluster_url(url: &str) -> bool {
    matches!(
        scheme_of(url).as_deref(),
        Some("redis+cluster" | "rediss+cluster" | "valkey+cluster" | "valkeys+cluster")
    )
}

/// Parses `url`. The error is a sentence for people that holds no password.
pub(crate) fn parse(url: &str) -> Result<Endpoint, String> {
    if is_sentinel_url(url) {
        return parse_sentinel(url.trim()).map(Endpoint::Sentinel);
    }
    if is_cluster_url(url) {
        return parse_cluster(url.trim()).map(Endpoint::Cluster);
    }
    if cfg!(not(feature = "tls")) && matches!(scheme_of(url).as_deref(), Some("rediss" | "valkeys"))
    {
        return Err(
            "this build of sfu-redis has no TLS support (cargo feature `tls`, on by default)"
                .into(),
        );
    }
    let info = url.into_connection_info().map_err(|e| {
        // What is wrong, in the URL parser's words where it has some (they quote no input).
        let why = if !url.contains("://") {
            "it has no scheme: write redis://host:port".to_owned()
        } else if let Err(pe) = url::Url::parse(url.trim()) {
            format!("it does not parse: {pe}")
        } else {
            e.detail().unwrap_or("it does not parse").to_owned()
        };
        format!(
            "{why} ({}); expected redis://[user:password@]host:port[/db], rediss://... (TLS), redis+sentinel://[user:password@]host1:port1,host2:port2/<master-name>[/db] or redis+cluster://[user:password@]host1:port1,host2:port2,...",
            e.category()
        )
    })?;
    let tls = match info.addr() {
        ConnectionAddr::TcpTls { insecure: true, .. } => {
            return Err(
                "the URL fragment #insecure is not honoured: set tls_insecure (--tls-insecure, SFU_TLS_INSECURE=1) to skip certificate verification"
                    .into(),
            )
        }
        ConnectionAddr::TcpTls { .. } => true,
        _ => false,
    };
    Ok(Endpoint::Direct { info, tls })
}

/// The parts every multi-host URL (sentinel, cluster) shares: TLS, the hosts, the user info
/// (percent-decoded) and the path after the first `/`.
struct MultiHost<'a> {
    tls: bool,
    hosts: Vec<(String, u16)>,
    user: Option<String>,
    password: Option<String>,
    path: &'a str,
}

/// `scheme://[user[:pass]@]h1[:p1][,h2[:p2]...][/path]`; `kind` names the URL in errors,
/// `port` is the hosts' default port.
fn parse_multi<'a>(
    url: &'a str,
    kind: &str,
    port: u16,
    shape: &str,
) -> Result<MultiHost<'a>, String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("no `://` after the scheme; {shape}"))?;
    let tls = scheme.to_ascii_lowercase().starts_with("rediss")
        || scheme.to_ascii_lowercase().starts_with("valkeys");
    if rest.contains(['?', '#']) {
        return Err(format!(
            "a {kind} URL takes no query or fragment (percent-encode `?` and `#` in a password); {shape}"
        ));
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, ""),
    };
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
        None => (None, authority),
    };
    if path.contains('@') {
        return Err(format!(
            "it holds an `@` after the hosts (percent-encode `@`, `/`, `?` and `#` in a password); {shape}"
        ));
    }
    let (user, password) = match userinfo {
        None => (None, None),
        Some(info) => {
            let (u, p) = match info.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (info, None),
            };
            let u = decode("user name", u)?;
            let p = p.map(|p| decode("password", p)).transpose()?;
            (Some(u).filter(|u| !u.is_empty()), p)
        }
    };
    let hosts = hosts
        .split(',')
        .map(|h| host_port(h, kind, port))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(MultiHost {
        tls,
        hosts,
        user,
        password,
        path,
    })
}

/// `[redis|rediss]+cluster://[user[:pass]@]h1[:p1][,h2[:p2]...][/0]`.
fn parse_cluster(url: &str) -> Result<ClusterEndpoint, String> {
    const SHAPE: &str = "expected redis+cluster://[user:password@]host1:port1,host2:port2,...";
    let m = parse_multi(url, "cluster", 6379, SHAPE)?;
    if !matches!(m.path, "" | "0" | "0/") {
        return Err(format!(
            "a Redis Cluster has database 0 only (the path {:?} is not allowed); {SHAPE}",
            m.path
        ));
    }
    if cfg!(not(feature = "tls")) && m.tls {
        return Err(
            "this build of sfu-redis has no TLS support (cargo feature `tls`, on by default)"
                .into(),
        );
    }
    Ok(ClusterEndpoint {
        seeds: m.hosts,
        tls: m.tls,
        user: m.user,
        password: m.password,
    })
}

/// `[redis|rediss]+sentinel://[user[:pass]@]h1[:p1][,h2[:p2]...]/<master-name>[/db]`.
fn parse_sentinel(url: &str) -> Result<SentinelEndpoint, String> {
    const SHAPE: &str =
        "expected redis+sentinel://[user:password@]host1:port1,host2:port2,.../<master-name>[/db]";
    let MultiHost {
        tls,
        hosts: sentinels,
        user,
        password,
        path,
    } = parse_multi(url, "sentinel", SENTINEL_PORT, SHAPE)?;
    let mut segments = path.split('/');
    let master = decode("master name", segments.next().unwrap_or(""))?;
    if master.is_empty() {
        return Err(format!("the master name is missing; {SHAPE}"));
    }
    let db = match segments.next() {
        None | Some("") => 0,
        Some(d) => d
            .parse::<i64>()
            .ok()
            .filter(|d| *d >= 0)
            .ok_or_else(|| format!("database {d:?} is not a number >= 0; {SHAPE}"))?,
    };
    if segments.any(|s| !s.is_empty()) {
        return Err(format!("too many path segments; {SHAPE}"));
    }
    Ok(SentinelEndpoint {
        sentinels,
        master,
        tls,
        user,
        password,
        db,
    })
}

/// Percent-decodes one URL part as UTF-8.
fn decode(what: &str, raw: &str) -> Result<String, String> {
    percent_decode_str(raw)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| format!("the {what} is not UTF-8 once percent-decoded"))
}

/// `host[:port]` or `[v6]:port` of one sentinel or seed (`kind`), `default` when it names no
/// port.
fn host_port(s: &str, kind: &str, default: u16) -> Result<(String, u16), String> {
    let s = s.trim();
    if s.is_empty() {
        return Err(format!(
            "a {kind} address is empty (two commas, or none before the `/`)"
        ));
    }
    let (host, port) =
        if let Some(rest) = s.strip_prefix('[') {
            let (h, after) = rest
                .split_once(']')
                .ok_or_else(|| format!("{kind} address {s:?}: `[` without `]`"))?;
            match after {
                "" => (h, None),
                a => (
                    h,
                    Some(a.strip_prefix(':').ok_or_else(|| {
                        format!("{kind} address {s:?}: expected `:port` after `]`")
                    })?),
                ),
            }
        } else {
            match s.rsplit_once(':') {
                Some((h, _)) if h.contains(':') => {
                    return Err(format!(
                        "{kind} address {s:?}: an IPv6 address goes in brackets ([::1]:{default})"
                    ))
                }
                Some((h, p)) => (h, Some(p)),
                None => (s, None),
            }
        };
    if host.is_empty() || host.contains(['/', '@', ' ']) {
        return Err(format!("{kind} address {s:?}: bad host"));
    }
    let port = match port {
        None => default,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("{kind} address {s:?}: port {p:?} is not 1 to 65535"))?,
    };
    Ok((host.to_owned(), port))
}

/// A sentinel or cluster URL with its password replaced by `***` (and a user info without
/// `:` hidden whole, as `redact_url` does), or `None` when it does not parse (the caller
/// shows a placeholder then).
pub(crate) fn redact_multi_host(url: &str) -> Option<String> {
    // Only a URL that parses is shown: everything after its authority is then a master name
    // and a db.
    if is_cluster_url(url) {
        parse_cluster(url.trim()).ok()?;
    } else {
        parse_sentinel(url.trim()).ok()?;
    }
    let (scheme, rest) = url.trim().split_once("://")?;
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let shown = match authority.rfind('@') {
        None => authority.to_owned(),
        Some(i) => {
            let info = &authority[..i];
            let hidden = match info.split_once(':') {
                Some((u, _)) => format!("{u}:***"),
                None => "***".to_owned(),
            };
            format!("{hidden}@{}", &authority[i + 1..])
        }
    };
    Some(format!(
        "{}://{}{}",
        scheme.to_ascii_lowercase(),
        shown,
        &rest[authority_end..]
    ))
}

/// `host:port` for messages (IPv6 hosts in brackets).
pub(crate) fn show_addr(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sentinel(url: &str) -> SentinelEndpoint {
        match parse(url) {
            Ok(Endpoint::Sentinel(s)) => s,
            other => panic!("{url}: {other:?}"),
        }
    }

    #[test]
    fn a_url_without_scheme_or_with_a_bad_port_says_so() {
        let e = parse("127.0.0.1:6379").unwrap_err();
        assert!(
            e.starts_with("it has no scheme: write redis://host:port"),
            "{e}"
        );
        let e = parse("redis://:pw@127.0.0.1:99999").unwrap_err();
        assert!(
            e.starts_with("it does not parse: invalid port number"),
            "{e}"
        );
        assert!(!e.contains("pw"), "{e}");
    }

    #[test]
    fn sentinel_urls_parse() {
        let s = sentinel("redis+sentinel://u:p%40ss@10.0.0.1:26380,[::1],h3/mymaster/2");
        assert_eq!(
            s.sentinels,
            vec![
                ("10.0.0.1".to_owned(), 26380),
                ("::1".to_owned(), SENTINEL_PORT),
                ("h3".to_owned(), SENTINEL_PORT)
            ]
        );
        assert_eq!(s.master, "mymaster");
        assert_eq!(s.db, 2);
        assert_eq!(s.user.as_deref(), Some("u"));
        assert_eq!(s.password.as_deref(), Some("p@ss"));
        assert!(!s.tls);
        let t = sentinel("rediss+sentinel://:pw@h:1/m");
        assert!(t.tls);
        assert_eq!(t.user, None);
        assert_eq!(t.password.as_deref(), Some("pw"));
        assert_eq!(t.db, 0);
        assert_eq!(sentinel("redis+sentinel://h/m%2Fx").master, "m/x");
    }

    #[test]
    fn bad_sentinel_urls_name_the_problem() {
        let cases = [
            ("redis+sentinel://h1:1,h2:2", "master name is missing"),
            ("redis+sentinel://h1:1,h2:2/", "master name is missing"),
            ("redis+sentinel://h1:1,,h2:2/m", "empty"),
            ("redis+sentinel://h1:0/m", "not 1 to 65535"),
            ("redis+sentinel://h1:x/m", "not 1 to 65535"),
            ("redis+sentinel://h1/m/x", "not a number"),
            ("redis+sentinel://h1/m/1/2", "too many"),
            ("redis+sentinel://h1/m?db=1", "no query"),
            ("redis+sentinel://u:s3cret@h1/m@x", "`@`"),
            ("redis+sentinel://[::1/m", "without `]`"),
            ("redis+sentinel://::1/m", "in brackets"),
            ("redis+sentinel://fe80::1:26379/m", "in brackets"),
        ];
        for (url, want) in cases {
            let e = parse(url).expect_err(url);
            assert!(e.contains(want), "{url}: {e}");
            assert!(!e.contains("s3cret"), "{url}: {e}");
        }
    }

    #[test]
    fn direct_urls_keep_redis_rs_parsing_and_refuse_the_insecure_fragment() {
        assert!(matches!(
            parse("redis://127.0.0.1:6379/1"),
            Ok(Endpoint::Direct { tls: false, .. })
        ));
        assert!(matches!(
            parse("rediss://h:6380"),
            Ok(Endpoint::Direct { tls: true, .. })
        ));
        let e = parse("rediss://h:6380/#insecure").unwrap_err();
        assert!(e.contains("tls_insecure"), "{e}");
        assert!(parse("http://h").is_err());
    }

    #[test]
    fn cluster_urls_parse_and_bad_ones_name_the_problem() {
        let Ok(Endpoint::Cluster(c)) =
            parse("redis+cluster://u:p%40ss@10.0.0.1:7000,[::1],h3:7002")
        else {
            panic!("not a cluster endpoint");
        };
        assert_eq!(
            c.seeds,
            vec![
                ("10.0.0.1".to_owned(), 7000),
                ("::1".to_owned(), 6379),
                ("h3".to_owned(), 7002)
            ]
        );
        assert_eq!(c.user.as_deref(), Some("u"));
        assert_eq!(c.password.as_deref(), Some("p@ss"));
        assert!(!c.tls);
        assert!(matches!(
            parse("rediss+cluster://h:1/0"),
            Ok(Endpoint::Cluster(ClusterEndpoint { tls: true, .. }))
        ));
        for (url, want) in [
            ("redis+cluster://h1:1/2", "database 0 only"),
            ("redis+cluster://h1:1,,h2", "cluster address is empty"),
            ("redis+cluster://h1:99999", "not 1 to 65535"),
            ("redis+cluster://u:s3cret@h1?x=1", "no query"),
            ("redis+cluster://fe80::1:7000", "in brackets ([::1]:6379)"),
        ] {
            let e = parse(url).expect_err(url);
            assert!(e.contains(want), "{url}: {e}");
            assert!(!e.contains("s3cret"), "{url}: {e}");
        }
        assert_eq!(
            redact_multi_host("redis+cluster://u:s3cret@h1:1,h2:2").as_deref(),
            Some("redis+cluster://u:***@h1:1,h2:2")
        );
    }

    #[test]
    fn sentinel_redaction_hides_the_password() {
        assert_eq!(
            redact_multi_host("redis+sentinel://u:s3cret@h1:1,h2:2/m/0").as_deref(),
            Some("redis+sentinel://u:***@h1:1,h2:2/m/0")
        );
        assert_eq!(
            redact_multi_host("rediss+sentinel://s3cret@h1/m").as_deref(),
            Some("rediss+sentinel://***@h1/m")
        );
        assert_eq!(redact_multi_host("redis+sentinel://u:s3cret@h1"), None);
    }
}
