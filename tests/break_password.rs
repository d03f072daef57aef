//! Adversarial: Redis passwords in URL forms that `redact_url` gets wrong.
//!
//! `redact_url` first splits the user-info at the LAST `@` of the whole URL, then redacts
//! `pass=` query parameters by their raw (still percent-encoded) name. redis-rs reads the
//! password of a Unix-socket URL from the query (`?pass=`), decoded by the `url` crate, so:
//! - a `pass=` value holding `@` (common in generated passwords) is cut at that `@`: what
//!   follows is printed as if it were the host (`redis+unix://***@<rest of the password>`);
//! - a percent-encoded parameter name (`p%61ss=`) is the password for redis-rs, but not for
//!   `redact_url`, which prints it verbatim.

mod support;

use std::process::Command;
use std::time::Duration;

use sfu_redis::{redact_url, Config, Node, Timings};

const TAIL: &str = "Xq7TailOfPassw0rd";

fn error_texts(url: &str) -> Vec<String> {
    let t = Timings::from_heartbeat(Duration::from_millis(200), Duration::from_millis(600));
    let cfg = Config::builder()
        .redis_url(Some(url))
        .instance_id("x")
        .timings(t);
    let mut texts = vec![redact_url(url)];
    match cfg.build() {
        Err(e) => {
            texts.push(e.to_string());
            texts.push(format!("{e:?}"));
        }
        Ok(c) => {
            texts.push(format!("{c:?}"));
            match Node::start(c) {
                Err(e) => {
                    texts.push(e.to_string());
                    texts.push(format!("{e:?}"));
                }
                Ok(_) => panic!("{url} connected"),
            }
        }
    }
    texts
}

#[test]
fn unix_socket_password_with_at_sign_is_partly_printed() {
    let url = format!("redis+unix:///tmp/sfu-no-such-redis.sock?pass=abc@{TAIL}");
    let leaks: Vec<String> = error_texts(&url)
        .into_iter()
        .filter(|t| t.contains(TAIL))
        .collect();
    assert!(leaks.is_empty(), "password tail printed: {leaks:#?}");
}

#[test]
fn unix_socket_password_under_percent_encoded_name_is_printed() {
    // First prove that redis-rs really uses `p%61ss=` as the password: a server on a Unix
    // socket with requirepass accepts it.
    let dir = std::env::temp_dir().join(format!("sfu-break-pw-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("r.sock");
    let s = support::Server::start_with(&["--unixsocket", sock.to_str().unwrap()]);
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(TAIL)
        .query(&mut s.con())
        .unwrap();
    let good = format!("redis+unix://{}?p%61ss={TAIL}", sock.display());
    let cfg = Config::builder()
        .redis_url(Some(&good))
        .instance_id("y")
        .build()
        .unwrap();
    let shown = format!("{cfg:?}");
    let node = Node::start(cfg).expect("p%61ss= is the password for redis-rs");
    drop(node);
    assert!(
        !shown.contains(TAIL),
        "Config Debug shows the password: {shown}"
    );

    let url = format!("redis+unix:///tmp/sfu-no-such-redis.sock?p%61ss={TAIL}");
    let leaks: Vec<String> = error_texts(&url)
        .into_iter()
        .filter(|t| t.contains(TAIL))
        .collect();
    assert!(leaks.is_empty(), "password printed: {leaks:#?}");
}

// The same through the binary, with RUST_LOG=debug: stderr shows the password tail.
#[test]
fn cli_prints_the_password_tail_on_stderr() {
    let url = format!("redis+unix:///tmp/sfu-no-such-redis.sock?pass=abc@{TAIL}");
    let out = Command::new(env!("CARGO_BIN_EXE_sfu-redis"))
        .args([
            "node",
            "--redis-url",
            &url,
            "--heartbeat-interval-ms",
            "200",
            "--heartbeat-ttl-ms",
            "600",
        ])
        .env("RUST_LOG", "debug")
        .output()
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !all.contains(TAIL),
        "exit {:?}; output shows the password tail:\n{all}",
        out.status
    );
}
