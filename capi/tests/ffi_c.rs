//! The C test of every function of include/sfu_redis.h (tests/c/ffi_test.c), compiled with
//! `gcc` against the built `libsfu_redis.so` and run against a private redis-server under
//! valgrind memcheck: zero errors and no definite leak.

mod ffi_support;
#[path = "../../tests/it/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ffi_support::{assert_memcheck_clean, build, root, run};

/// Built once per test process (the tests run in parallel).
fn c_test() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        build(
            "gcc",
            "ffi_test",
            &[root().join("tests/c/ffi_test.c")],
            &["-std=c11", "-pedantic"],
        )
    })
}

fn assert_passed(name: &str, r: &ffi_support::Run) {
    assert!(
        r.output.status.success() && r.stdout().contains(" 0 failed"),
        "{name} failed\n{}",
        r.describe()
    );
}

/// Stamps the prefix of stage `ffi-c-schema` with key schema version 2, which this release
/// does not speak: the C test's `sfu_node_start` on it must fail with `SFU_ERR_SCHEMA`.
fn stamp_another_schema(url: &str) {
    let mut con = redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .expect("connect to the test redis");
    let _: () = redis::cmd("SET")
        .arg("sfu:ffi-c-schema:main:{ctl}:schema")
        .arg("99")
        .query(&mut con)
        .expect("SET the schema stamp");
}

#[test]
fn c_test_of_every_function_under_valgrind() {
    let exe = c_test();
    let server = support::Server::start();
    let url = server.url();
    stamp_another_schema(&url);
    let r = run(exe, &[&url], true, &[]);
    assert_passed("ffi_test (memory-only and Redis)", &r);
    println!("{}", r.stdout().trim());
    assert_memcheck_clean("ffi_test", &r);
}

#[test]
fn c_test_runs_natively_too() {
    // Without valgrind's serialising of threads, the races between the event thread and the
    // caller are exercised at full speed.
    let exe = c_test();
    let server = support::Server::start();
    let url = server.url();
    stamp_another_schema(&url);
    for _ in 0..3 {
        let r = run(exe, &[&url], false, &[]);
        assert_passed("ffi_test (native)", &r);
    }
}
