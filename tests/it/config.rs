//! Configuration validation: nonsensical timings are refused naming the field, bad ids are
//! refused with `InvalidId` without disturbing anything else, and a Redis password never shows
//! up in an error, a `Debug` print or a log line.

use crate::support;

use std::time::Duration;

use sfu_redis::{Config, Error, ErrorKind, Node, PinOutcome, Timings};
use support::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Selects one field of a `Timings`.
type FieldOf = fn(&mut Timings) -> &mut Duration;
/// Breaks one rule of a `Timings`.
type Tweak = fn(&mut Timings);

/// Asserts that `t` is refused by both `Timings::validate` and `ConfigBuilder::build` with
/// InvalidConfig naming `field`.
fn refused(t: Timings, field: &str, case: &str) {
    for e in [
        t.validate().unwrap_err(),
        Config::builder().timings(t).build().unwrap_err(),
    ] {
        assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{case}: {e}");
        assert!(
            matches!(&e, Error::InvalidConfig { field: f, .. } if *f == field),
            "{case}: {e:?} should name {field}"
        );
        assert!(e.to_string().contains(field), "{case}: {e}");
    }
}

// Protects timing validation (docs/DESIGN.md "Timings ... nonsensical combinations are
// rejected with an error that names the field"): each rule broken alone is refused, naming the
// field at fault. Fails if any rule were missing (the case would validate) or named another
// field.
#[test]
fn nonsensical_timings_are_refused_naming_the_field() {
    let base = Timings::fast();
    base.validate().unwrap();
    let fields: [(&str, FieldOf); 9] = [
        ("heartbeat_interval", |t| &mut t.heartbeat_interval),
        ("heartbeat_ttl", |t| &mut t.heartbeat_ttl),
        ("stale_threshold", |t| &mut t.stale_threshold),
        ("pin_ttl", |t| &mut t.pin_ttl),
        ("lease_ttl", |t| &mut t.lease_ttl),
        ("lease_refresh", |t| &mut t.lease_refresh),
        ("two_phase_delay", |t| &mut t.two_phase_delay),
        ("reap_interval", |t| &mut t.reap_interval),
        ("command_timeout", |t| &mut t.command_timeout),
    ];
    for (name, field) in fields {
        let mut t = base;
        *field(&mut t) = Duration::ZERO;
        refused(t, name, &format!("{name} = 0"));
        let mut t = Timings::default();
        *field(&mut t) = Duration::from_secs(8 * 24 * 3600);
        refused(t, name, &format!("{name} = 8 days"));
    }
    let cases: [(&str, &str, Tweak); 8] = [
        ("interval == ttl", "heartbeat_interval", |t| {
            t.heartbeat_interval = t.heartbeat_ttl
        }),
        ("interval > ttl", "heartbeat_interval", |t| {
            t.heartbeat_interval = t.heartbeat_ttl + ms(1)
        }),
        ("stale < ttl", "stale_threshold", |t| {
            t.stale_threshold = t.heartbeat_ttl - ms(1)
        }),
        ("pin_ttl == interval", "pin_ttl", |t| {
            t.pin_ttl = t.heartbeat_interval
        }),
        ("refresh == lease_ttl / 2", "lease_refresh", |t| {
            t.lease_refresh = t.lease_ttl / 2
        }),
        ("refresh >= lease_ttl", "lease_refresh", |t| {
            t.lease_refresh = t.lease_ttl
        }),
        ("command_timeout >= lease_refresh", "command_timeout", |t| {
            t.lease_ttl = Duration::from_secs(10);
            t.lease_refresh = ms(500);
            t.command_timeout = ms(500);
        }),
        ("command_timeout >= heartbeat_ttl", "command_timeout", |t| {
            t.command_timeout = t.heartbeat_ttl
        }),
    ];
    for (case, name, f) in cases {
        let mut t = base;
        f(&mut t);
        refused(t, name, case);
    }
    // Edges that are fine.
    for f in [
        |t: &mut Timings| t.stale_threshold = t.heartbeat_ttl,
        |t: &mut Timings| t.lease_refresh = t.lease_ttl / 2 - ms(1),
        |t: &mut Timings| t.pin_ttl = t.heartbeat_interval + ms(1),
    ] {
        let mut t = base;
        f(&mut t);
        t.validate().unwrap();
    }
    Timings::default().validate().unwrap();
    Timings::from_heartbeat(Duration::from_secs(1), Duration::from_secs(3))
        .validate()
        .unwrap();
}

// The reap batch size is validated when the config is built, naming the field: 0 and more
// than MAX_REAP_BATCH are refused; the bounds themselves are accepted.
#[test]
fn reap_batch_is_validated() {
    assert_eq!(
        Config::builder().build().unwrap().reap_batch(),
        sfu_redis::REAP_BATCH
    );
    for bad in [0, sfu_redis::MAX_REAP_BATCH + 1] {
        let e = Config::builder().reap_batch(bad).build().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidConfig);
        assert!(e.to_string().contains("reap_batch"), "{e}");
    }
    for good in [1, sfu_redis::MAX_REAP_BATCH] {
        let c = Config::builder().reap_batch(good).build().unwrap();
        assert_eq!(c.reap_batch(), good);
        assert_eq!(c.to_builder().build().unwrap().reap_batch(), good);
    }
}

// The reaper's pace (issue 14, item 6) is validated when the config is built, naming the
// field: negative, above MAX_REAP_PACE, NaN and infinite values are refused with an error
// that says what is allowed; the bounds and a fraction are accepted and survive to_builder.
#[test]
fn reap_pace_is_validated() {
    assert_eq!(
        Config::builder().build().unwrap().reap_pace(),
        sfu_redis::REAP_PACE
    );
    let too_big = sfu_redis::MAX_REAP_PACE + 0.5;
    for bad in [-0.1, too_big, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let e = Config::builder().reap_pace(bad).build().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{bad}");
        let msg = e.to_string();
        assert!(
            msg.contains("reap_pace") && msg.contains("allowed 0 to"),
            "{msg}"
        );
    }
    for good in [0.0, 0.25, 1.0, sfu_redis::MAX_REAP_PACE] {
        let c = Config::builder().reap_pace(good).build().unwrap();
        assert_eq!(c.reap_pace(), good);
        assert_eq!(c.to_builder().build().unwrap().reap_pace(), good);
    }
    // -0 is 0 (and compares equal to a config built with 0).
    let zero = Config::builder()
        .reap_pace(0.0)
        .instance_id("z")
        .build()
        .unwrap();
    let minus_zero = Config::builder()
        .reap_pace(-0.0)
        .instance_id("z")
        .build()
        .unwrap();
    assert_eq!(zero, minus_zero);
    assert!(minus_zero.reap_pace().is_sign_positive());
}

// Prefix segments and the instance id are validated when the config is built, naming the
// field: an empty segment, an oversized one, and invalid instance ids are refused; other
// characters are escaped (`_` -> `__`, other bytes -> `_XX`) so the prefix stays three
// `[A-Za-z0-9._-]` segments and distinct names keep distinct prefixes.
#[test]
fn prefix_and_instance_id_are_validated() {
    for (stage, field) in [("", "stage"), ("   ", "stage")] {
        let e = Config::builder().stage(stage).build().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidConfig);
        assert!(e.to_string().contains(field), "{e}");
    }
    let e = Config::builder()
        .branch(&"b".repeat(65))
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("branch"), "{e}");
    let e = Config::builder().namespace("").build().unwrap_err();
    assert!(e.to_string().contains("namespace"), "{e}");
    let c = Config::builder()
        .stage("prod{1}")
        .branch("feature/x y:z*")
        .build()
        .unwrap();
    assert_eq!(c.keys().prefix(), "sfu:prod_7B1_7D:feature_2Fx_20y_3Az_2A");
    // The limit is on the name as given (64 bytes), not on its escaped form.
    let c = Config::builder().branch(&"/".repeat(64)).build().unwrap();
    assert_eq!(c.keys().prefix(), format!("sfu:dev:{}", "_2F".repeat(64)));
    let e = Config::builder()
        .stage(&"/".repeat(65))
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("stage"), "{e}");
    // Names that the old `_` replacement merged stay apart.
    let prefix = |branch: &str| {
        Config::builder()
            .branch(branch)
            .build()
            .unwrap()
            .keys()
            .prefix()
            .to_owned()
    };
    assert_eq!(prefix("feature/login"), "sfu:dev:feature_2Flogin");
    assert_eq!(prefix("feature_login"), "sfu:dev:feature__login");
    assert_eq!(prefix(" feature_login "), "sfu:dev:feature__login");
    // `to_builder` keeps the names, not their escaped forms.
    let c = Config::builder().stage("prod_eu").build().unwrap();
    assert_eq!(c.to_builder().build().unwrap().keys(), c.keys());
    for bad in ["", "a\nb", "\u{0}", &"x".repeat(257)] {
        let e = Config::builder().instance_id(bad).build().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{bad:?}");
        assert!(e.to_string().contains("instance_id"), "{e}");
    }
    // Default ids carry a per-boot nonce: two configs, two identities.
    let a = Config::builder().build().unwrap();
    let b = Config::builder().build().unwrap();
    assert_ne!(a.instance_id(), b.instance_id());
    // An empty URL means memory-only mode.
    assert_eq!(
        Config::builder()
            .redis_url(Some("  "))
            .build()
            .unwrap()
            .redis_url(),
        None
    );
}

// Invalid ids (empty, > 256 bytes, control characters) are refused with InvalidId by every
// Node method, naming which id, and nothing in Redis changes: the node's other rooms and peers
// are untouched and keep working. Fails if an id were sent to Redis unchecked (a control
// character or an empty id would become a key) or if a refusal disturbed other rooms.
#[test]
fn invalid_ids_are_refused_and_disturb_nothing() {
    let s = Server::start();
    let ks = ks("c");
    let n = s.node("c", "inst");
    n.pin_room("room").unwrap();
    n.upsert_peer("room", "peer", Some("guest"), &[]).unwrap();
    let rooms_and_indexes = || {
        s.dump(&ks.scan_pattern())
            .into_iter()
            .filter(|(k, _)| k.contains(":room:") || k.contains(":instance:"))
            .collect::<Vec<_>>()
    };
    let before = rooms_and_indexes();
    let long = "x".repeat(257);
    let bads = [
        "",
        "a\nb",
        "tab\there",
        "nul\u{0}",
        "del\u{7f}",
        "\u{85}",
        &long,
    ];
    for bad in bads {
        let check = |r: sfu_redis::Result<()>, what: &str| {
            let e = r.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidId, "{bad:?}");
            assert!(
                e.to_string().contains(&format!("invalid {what} id")),
                "{bad:?}: {e}"
            );
        };
        check(n.pin_room(bad).map(drop), "room");
        check(n.close_room(bad), "room");
        check(n.room_owner(bad).map(drop), "room");
        check(n.upsert_peer(bad, "p", None, &[]).map(drop), "room");
        check(n.upsert_peer("room", bad, None, &[]).map(drop), "peer");
        check(
            n.upsert_peer("room", "p", Some(bad), &[]).map(drop),
            "guest",
        );
        check(n.remove_peer(bad, "peer", 1).map(drop), "room");
        check(n.remove_peer("room", bad, 1).map(drop), "peer");
    }
    assert_eq!(rooms_and_indexes(), before);
    assert_eq!((n.stats().rooms, n.stats().peers), (1, 1));
    assert_eq!(n.pin_room("room").unwrap(), PinOutcome::AlreadyOurs);
    assert_eq!(n.pin_room("room-2").unwrap(), PinOutcome::Pinned);
    // 256 bytes is the limit, and it works end to end (3-byte Korean characters).
    let max = format!("{}x", "방".repeat(85));
    assert_eq!(max.len(), 256);
    assert_eq!(n.pin_room(&max).unwrap(), PinOutcome::Pinned);
    n.upsert_peer(&max, &max, Some(&max), &[]).unwrap();
    assert_eq!(n.room_owner(&max).unwrap().as_deref(), Some("inst"));
    assert!(s.index_problems(&ks).is_empty());
}

const SECRET: &str = "S3cretPassw0rd";

fn no_secret(what: &str, text: &str) {
    assert!(!text.contains(SECRET), "{what} shows the password: {text}");
    assert!(
        !text.contains("S3cret"),
        "{what} shows part of the password: {text}"
    );
}

fn start_error_text(url: &str) -> Option<(String, String)> {
    let t = Timings::from_heartbeat(ms(200), ms(600));
    let cfg = Config::builder()
        .redis_url(Some(url))
        .instance_id("x")
        .timings(t);
    match cfg.build() {
        Err(e) => Some((e.to_string(), format!("{e:?}"))),
        Ok(c) => {
            no_secret("Config Debug", &format!("{c:?}"));
            match Node::start(c) {
                Err(e) => Some((e.to_string(), format!("{e:?}"))),
                Ok(_) => None,
            }
        }
    }
}

// No Redis password in error texts, `Debug` prints or logs: a URL with a password that cannot
// be used (refused port, unparsable URL, wrong password on a server with a password) fails
// with an error whose Display and Debug hide the password; the right password works. Fails if
// any message printed the URL unredacted.
#[test]
fn password_never_shows_in_errors() {
    // (LocalRedis's readiness PING cannot authenticate, so the password is set afterwards.)
    let s = Server::start_with(&[]); // one server: its process or the fault proxy
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(SECRET)
        .query(&mut s.con())
        .unwrap();
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let urls = [
        format!("redis://user:{SECRET}@127.0.0.1:{closed}"),
        format!("redis://:{SECRET}@127.0.0.1:{closed}/0"),
        format!("redis://{SECRET}@127.0.0.1:{closed}"),
        format!("redis://user:{SECRET}@127.0.0.1:99999"),
        format!("redis://:{SECRET}@[not-a-host"),
        format!("redis://:{SECRET}@127.0.0.1:{closed}/notadb"),
        format!("redis://:{SECRET}x@127.0.0.1:{}", s.redis().port()),
        format!("redis://default:{SECRET}x@127.0.0.1:{}", s.redis().port()),
        format!("not a url {SECRET}"),
    ];
    for url in &urls {
        let (display, debug) = start_error_text(url).unwrap_or_else(|| panic!("{url} worked"));
        no_secret(url, &display);
        no_secret(url, &debug);
    }
    // The wrong password is reported as such (the kind says Redis, not config).
    let e = Node::start(
        Config::builder()
            .redis_url(format!("redis://:wrong@127.0.0.1:{}", s.redis().port()))
            .build()
            .unwrap(),
    )
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Redis, "{e}");
    // The right password works, and the node's stats never show it.
    let url = format!("redis://:{SECRET}@127.0.0.1:{}", s.redis().port());
    let n = Node::start(Config::builder().redis_url(&url).build().unwrap()).unwrap();
    n.pin_room("r").unwrap();
    no_secret("stats", &format!("{:?}", n.stats()));
    no_secret("node", &format!("{n:?}"));
}

// Same rule for passwords holding URL delimiters that were not percent-encoded (`/`, `#`,
// `?`): such a URL does not parse, and the error must still not print the password.
#[test]
fn password_with_url_delimiters_never_shows_in_errors() {
    for sep in ["/", "#", "?"] {
        let url = format!("redis://user:S3cret{sep}Passw0rd@127.0.0.1:6379");
        let (display, debug) = start_error_text(&url).expect("refused");
        for text in [display, debug] {
            assert!(!text.contains("Passw0rd"), "{url}: {text}");
        }
    }
}

// redis-rs also takes the password of a Unix-socket URL in the query string
// (`redis+unix:///path?pass=...`, `unix:///path?pass=...`), after percent-decoding the
// parameter name (`p%61ss`); it must be hidden like any other, also when it holds `@`, `/`,
// `?` or `#`, and in the `Debug` of a `ConfigBuilder`.
#[test]
fn unix_socket_password_never_shows() {
    for url in [
        format!("redis+unix:///tmp/no-such-redis.sock?pass={SECRET}"),
        format!("unix:///tmp/no-such-redis.sock?user=u&pass={SECRET}"),
        format!("redis+unix:///tmp/no-such-redis.sock?pass={SECRET}@TAIL"),
        format!("redis+unix:///tmp/no-such-redis.sock?pass={SECRET}@/?#{SECRET}&db=0"),
        format!("redis+unix:///tmp/no-such-redis.sock?p%61ss={SECRET}"),
        format!("unix:///tmp/no-such-redis.sock?db=0&%70ass={SECRET}"),
        format!("unix:///tmp/no-such-redis.sock?PASSWORD={SECRET}"),
    ] {
        let (display, debug) = start_error_text(&url).expect("refused");
        no_secret(&url, &display);
        no_secret(&url, &debug);
        let builder = Config::builder().redis_url(&url);
        no_secret("ConfigBuilder Debug", &format!("{builder:?}"));
        no_secret("redact_url", &sfu_redis::redact_url(&url));
    }
}

// `redact_url` and the `Debug` of `Config` and `ConfigBuilder` hide the password of every
// URL shape: user info with and without a user name, a bare user info (`redis://pw@host`),
// `%40`, unencoded `@`, `/`, `?`, `#` in the password, IPv6 hosts; URLs without a password
// are shown whole.
#[test]
fn redaction_hides_every_password_shape() {
    let cases = [
        (
            format!("redis://user:{SECRET}@127.0.0.1:6379/0"),
            Some("redis://user:***@127.0.0.1:6379/0"),
        ),
        (
            format!("redis://:{SECRET}@[::1]:6379"),
            Some("redis://:***@[::1]:6379"),
        ),
        (format!("redis://{SECRET}@host"), Some("redis://***@host")),
        (
            "redis://user:S3cret%40Passw0rd@host".to_owned(),
            Some("redis://user:***@host"),
        ),
        (
            "redis://user:S3cret@Passw0rd@host:1".to_owned(),
            Some("redis://user:***@host:1"),
        ),
        ("redis://user:S3cret/Passw0rd@host".to_owned(), None),
        ("redis://user:1234/S3cretPassw0rd@host".to_owned(), None),
        ("redis://user:1234?S3cretPassw0rd@host".to_owned(), None),
        ("redis://user:1234#S3cretPassw0rd@host".to_owned(), None),
        (
            "redis://[::1]:6379/2".to_owned(),
            Some("redis://[::1]:6379/2"),
        ),
        (
            "redis://127.0.0.1:6379".to_owned(),
            Some("redis://127.0.0.1:6379"),
        ),
    ];
    for (url, want) in &cases {
        let shown = sfu_redis::redact_url(url);
        no_secret(url, &shown);
        assert!(!shown.contains("1234"), "{url}: {shown}");
        match want {
            Some(want) => assert_eq!(&shown, want, "{url}"),
            None => assert!(shown.starts_with("<redis:// URL"), "{url}: {shown}"),
        }
        let builder = Config::builder().redis_url(url);
        no_secret("ConfigBuilder Debug", &format!("{builder:?}"));
        match builder.build() {
            Ok(c) => no_secret("Config Debug", &format!("{c:?}")),
            Err(e) => {
                no_secret("build error", &e.to_string());
                no_secret("build error", &format!("{e:?}"));
            }
        }
    }
}

// `Config::from_env` reads REDIS_URL, SFU_NAMESPACE/STAGE/BRANCH and SFU_INSTANCE_ID, treats an
// empty REDIS_URL as memory-only, and names the variable's field when a value is invalid.
// The environment is changed in a process of its own (this test binary, run for the one
// ignored test below): in this process it would reach the node processes other tests spawn.
#[test]
fn from_env_reads_the_variables() {
    let out = std::process::Command::new(std::env::current_exe().expect("current_exe"))
        .args(["--exact", "config::from_env_in_a_process_of_its_own"])
        .args(["--ignored", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .expect("run this test binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Set by `from_env_reads_the_variables` for its child process.
const CHILD: &str = "SFU_TEST_FROM_ENV_CHILD";

#[test]
#[ignore = "changes the process environment: run alone by from_env_reads_the_variables"]
fn from_env_in_a_process_of_its_own() {
    if std::env::var_os(CHILD).is_none() {
        // `--include-ignored` in the shared test process: the environment is not ours to change.
        eprintln!("not run: from_env_reads_the_variables runs it in a process of its own");
        return;
    }
    let vars = [
        ("REDIS_URL", "redis://127.0.0.1:6379"),
        ("SFU_NAMESPACE", "acme"),
        ("SFU_STAGE", "prod"),
        ("SFU_BRANCH", "feat/x"),
        ("SFU_INSTANCE_ID", "sfu-7"),
        ("SFU_REAP_PACE", " 2.5 "),
    ];
    for (k, v) in vars {
        std::env::set_var(k, v);
    }
    let c = Config::from_env().unwrap();
    assert_eq!(c.redis_url(), Some("redis://127.0.0.1:6379"));
    assert_eq!(c.keys().prefix(), "acme:prod:feat_2Fx");
    assert_eq!(c.instance_id(), "sfu-7");
    assert_eq!(c.reap_pace(), 2.5);
    // The builder's setter wins over the variable.
    let set = sfu_redis::ConfigBuilder::from_env()
        .reap_pace(0.0)
        .build()
        .unwrap();
    assert_eq!(set.reap_pace(), 0.0);
    for bad in ["gentle", "-1", "1000", "NaN"] {
        std::env::set_var("SFU_REAP_PACE", bad);
        let e = Config::from_env().unwrap_err();
        assert!(e.to_string().contains("reap_pace"), "{bad}: {e}");
    }
    std::env::set_var("SFU_REAP_PACE", "");
    assert_eq!(
        Config::from_env().unwrap().reap_pace(),
        sfu_redis::REAP_PACE
    );
    std::env::set_var("REDIS_URL", "");
    assert_eq!(Config::from_env().unwrap().redis_url(), None);
    std::env::set_var("SFU_INSTANCE_ID", "bad\nid");
    let e = Config::from_env().unwrap_err();
    assert!(e.to_string().contains("instance_id"), "{e}");
    for (k, _) in vars {
        std::env::remove_var(k);
    }
}

// A new user's trip (issue 10, item 8): `redis_url` takes the URL as it comes (`&str`, `String`,
// `&String`) or an `Option` of it, as before (`Some(&url)`); blank means memory-only.
#[test]
fn redis_url_takes_plain_and_optional_urls() {
    let url = String::from(" redis://127.0.0.1:6379 ");
    let want = Some("redis://127.0.0.1:6379");
    let built = |b: sfu_redis::ConfigBuilder| b.build().unwrap().redis_url().map(str::to_owned);
    assert_eq!(
        built(Config::builder().redis_url("redis://127.0.0.1:6379")).as_deref(),
        want
    );
    assert_eq!(
        built(Config::builder().redis_url(url.clone())).as_deref(),
        want
    );
    assert_eq!(built(Config::builder().redis_url(&url)).as_deref(), want);
    assert_eq!(
        built(Config::builder().redis_url(Some(&url))).as_deref(),
        want
    );
    assert_eq!(
        built(Config::builder().redis_url(Some(url.as_str()))).as_deref(),
        want
    );
    assert_eq!(built(Config::builder().redis_url(None::<&str>)), None);
    assert_eq!(built(Config::builder().redis_url("  ")), None);
    let memory = Config::builder().redis_url("").build().unwrap();
    assert_eq!(memory.mode(), sfu_redis::Mode::Memory);
}
