//! TLS (`rediss://`) on real `redis-server --tls-port` processes with certificates this test
//! generates (`sfu_redis_testkit::tls::TestCerts`): a node, `status` and `fsck` through a test
//! CA; mutual TLS; and every failure an operator meets, each a clear error within the connect
//! timeout and never a hang: wrong CA, server name mismatch, a missing, unreadable or non-PEM
//! file, TLS to a plaintext port, plaintext to a TLS port, TLS settings with a plaintext URL.

use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use sfu_redis::ops::audit::{audit, AuditOptions};
use sfu_redis::ops::conn::Redis;
use sfu_redis::ops::status::{fleet_status, InstanceState};
use sfu_redis::{Config, ConfigBuilder, ErrorKind, Node, Timings};
use sfu_redis_testkit::devserver::{LocalRedis, TlsServer};
use sfu_redis_testkit::tls::TestCerts;

use crate::support::procs::cli_bin;
use crate::support::{ks, wait_for, LONG};

const STAGE: &str = "tls";

/// One set of certificates for the whole module (generation runs `openssl` a dozen times).
fn certs() -> &'static TestCerts {
    static CERTS: OnceLock<TestCerts> = OnceLock::new();
    CERTS.get_or_init(|| TestCerts::generate().expect("generate test certificates"))
}

fn tls_server(opts: TlsServer) -> LocalRedis {
    let _ = env_logger::builder().is_test(true).try_init();
    LocalRedis::start_tls(certs(), opts).expect("start a TLS redis-server")
}

fn builder(url: &str, instance: &str) -> ConfigBuilder {
    Config::builder()
        .redis_url(url)
        .stage(STAGE)
        .instance_id(instance)
        .timings(Timings::fast())
}

/// A connection failure must come back within the connect timeout (plus scheduling slack on a
/// loaded 2-core machine), never hang.
const WITHIN: Duration = Duration::from_secs(5);

fn start_fails(config: Config, wants: &[&str]) -> String {
    let t = Instant::now();
    let e = Node::start(config).expect_err("the node must not start");
    let took = t.elapsed();
    let msg = e.to_string();
    assert_eq!(e.kind(), ErrorKind::Redis, "{msg}");
    assert!(took < WITHIN, "took {took:?}: {msg}");
    for w in wants {
        assert!(msg.contains(w), "{msg:?} should contain {w:?}");
    }
    eprintln!("refused in {took:?}: {msg}");
    msg
}

#[test]
fn a_node_status_and_fsck_work_over_tls_with_a_test_ca() {
    let server = tls_server(TlsServer::default());
    let url = server.tls_url();
    let config = builder(&url, "tls-a")
        .tls_ca_file(certs().ca())
        .build()
        .unwrap();
    let node = Node::start(config.clone()).expect("start over TLS");
    node.pin_room("room-1").unwrap();
    node.upsert_peer("room-1", "peer-1", Some("guest-1"), &[("name", "Ada")])
        .unwrap();
    node.ready();

    // The keys are there (read over TLS too: the server has no plaintext port).
    let redis = Redis::from_config(&config).unwrap();
    assert_eq!(redis.transport(), "tls");
    let mut con = redis.connect().unwrap();
    let owner: Option<String> = redis::cmd("GET")
        .arg(ks(STAGE).room("room-1").owner)
        .query(&mut con)
        .unwrap();
    assert_eq!(owner.as_deref(), Some("tls-a"));

    let st = fleet_status(&config).unwrap();
    assert_eq!(st.route.transport, "tls");
    let me = st
        .instances
        .iter()
        .find(|i| i.id == "tls-a")
        .expect("listed");
    assert_eq!(me.state, InstanceState::Alive);
    let report = audit(&config, &AuditOptions::default()).unwrap();
    assert!(report.clean(), "{report:?}");

    // The CLI takes the same settings as flags.
    let ca = certs().ca();
    for (what, args) in [
        ("status", vec!["status", "--json"]),
        ("fsck", vec!["fsck", "--json", "--settle-ms", "0"]),
    ] {
        let out = Command::new(cli_bin())
            .args(&args)
            .args(["--redis-url", &url, "--stage", STAGE])
            .arg("--tls-ca-file")
            .arg(&ca)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{what}: {stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        if what == "status" {
            assert_eq!(v["redis"]["transport"], "tls", "{v}");
            assert_eq!(v["instances"][0]["id"], "tls-a", "{v}");
        } else {
            assert_eq!(v["clean"], true, "{v}");
        }
    }
    node.shutdown().unwrap();
}

#[test]
fn mutual_tls_needs_the_client_certificate() {
    let server = tls_server(TlsServer {
        auth_clients: true,
        ..TlsServer::default()
    });
    let url = server.tls_url();
    // Without a client certificate the server ends the handshake.
    let without = builder(&url, "mtls-a")
        .tls_ca_file(certs().ca())
        .build()
        .unwrap();
    start_fails(without, &["connect to Redis at rediss://127.0.0.1"]);
    // With it, the node runs.
    let with = builder(&url, "mtls-a")
        .tls_ca_file(certs().ca())
        .tls_cert_file(certs().client_cert())
        .tls_key_file(certs().client_key())
        .build()
        .unwrap();
    let node = Node::start(with).expect("start with a client certificate");
    node.pin_room("room-m").unwrap();
    wait_for(LONG, "a heartbeat over mutual TLS", || {
        (node.stats().heartbeats > 1).then_some(())
    });
    node.shutdown().unwrap();
}

#[test]
fn a_server_certificate_from_another_ca_is_refused() {
    let server = tls_server(TlsServer::default());
    let config = builder(&server.tls_url(), "wrong-ca")
        .tls_ca_file(certs().other_ca())
        .build()
        .unwrap();
    start_fails(config, &["not trusted", "tls_ca_file"]);
    // Without any CA file the system's roots are used: the test CA is not among them.
    let system = builder(&server.tls_url(), "wrong-ca").build().unwrap();
    start_fails(system, &["not trusted"]);
}

#[test]
fn a_server_certificate_for_another_name_is_refused() {
    let server = tls_server(TlsServer {
        cert: Some((certs().wrong_name_cert(), certs().wrong_name_key())),
        ..TlsServer::default()
    });
    let config = builder(&server.tls_url(), "wrong-name")
        .tls_ca_file(certs().ca())
        .build()
        .unwrap();
    start_fails(config, &["does not name the host"]);
}

#[test]
fn tls_insecure_skips_verification_and_says_so() {
    let server = tls_server(TlsServer {
        cert: Some((certs().wrong_name_cert(), certs().wrong_name_key())),
        ..TlsServer::default()
    });
    // The CLI logs the warning at every connect; `status` connects once.
    let out = Command::new(cli_bin())
        .args(["status", "--json", "--stage", STAGE])
        .args(["--redis-url", &server.tls_url()])
        .arg("--tls-insecure")
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("verification is OFF"), "{stderr}");
    // The URL fragment redis-rs would honour is refused: only the setting turns it off.
    let e = builder(&format!("{}/#insecure", server.tls_url()), "x")
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("tls_insecure"), "{e}");
}

#[test]
fn tls_to_a_plaintext_port_and_plaintext_to_a_tls_port_fail_fast() {
    let server = tls_server(TlsServer {
        plain_port: true,
        ..TlsServer::default()
    });
    let plain_port = server.port();
    let tls_port = server.tls_port().unwrap();
    // TLS spoken to the plaintext port.
    let config = builder(&format!("rediss://127.0.0.1:{plain_port}"), "mix-a")
        .tls_ca_file(certs().ca())
        .build()
        .unwrap();
    start_fails(config, &["plaintext port"]);
    // Plaintext spoken to the TLS port.
    let config = builder(&format!("redis://127.0.0.1:{tls_port}"), "mix-b")
        .build()
        .unwrap();
    start_fails(config, &["is this a TLS port"]);
}

#[test]
fn bad_tls_files_and_settings_are_named_at_config_build() {
    let dir = std::env::temp_dir();
    let missing = dir.join("sfu-redis-no-such-ca.pem");
    let url = "rediss://127.0.0.1:1";
    let cases: Vec<(ConfigBuilder, &str, String)> = vec![
        (
            builder(url, "x").tls_ca_file(&missing),
            "tls_ca_file",
            missing.display().to_string(),
        ),
        (
            // A directory cannot be read as a file (the tests run as root, so a chmod 000
            // file would still be readable).
            builder(url, "x").tls_ca_file(&dir),
            "tls_ca_file",
            "cannot read".into(),
        ),
        (
            builder(url, "x").tls_ca_file(certs().not_pem()),
            "tls_ca_file",
            "holds no PEM certificate".into(),
        ),
        (
            builder(url, "x")
                .tls_cert_file(certs().client_cert())
                .tls_key_file(certs().not_pem()),
            "tls_key_file",
            "holds no PEM private key".into(),
        ),
        (
            builder(url, "x").tls_cert_file(certs().client_cert()),
            "tls_key_file",
            "is missing".into(),
        ),
        (
            // A key that is not the certificate's.
            builder(url, "x")
                .tls_cert_file(certs().client_cert())
                .tls_key_file(certs().server_key()),
            "tls_key_file",
            "cannot be used together".into(),
        ),
        (
            builder("redis://127.0.0.1:1", "x").tls_ca_file(certs().ca()),
            "tls_ca_file",
            "is plaintext".into(),
        ),
        (
            builder("redis://127.0.0.1:1", "x").tls_insecure(true),
            "tls_insecure",
            "is plaintext".into(),
        ),
        (
            // Verification off makes the CA file do nothing: a mistake, not a setting.
            builder(url, "x")
                .tls_ca_file(certs().ca())
                .tls_insecure(true),
            "tls_ca_file",
            "would do nothing".into(),
        ),
    ];
    for (b, field, text) in cases {
        let e = b.build().expect_err(field);
        let msg = e.to_string();
        assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{msg}");
        assert!(msg.contains(field), "{msg:?} should name {field}");
        assert!(msg.contains(&text), "{msg:?} should contain {text:?}");
    }
}
