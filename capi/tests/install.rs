//! The install step of docs/src/c/install.md, `bash capi/install.sh --prefix DIR`,
//! run into a temp prefix with the profile of this test binary (debug under `cargo test`):
//!
//! - the prefix holds the headers, `libsfu_redis.so.<version>` with SONAME
//!   `libsfu_redis.so.<major>` and its two links, `libsfu_redis.a`, `sfu_redis.pc` and the CMake
//!   package, whose version file follows the same-major rule;
//! - the example host (`capi/examples/cpp`) builds with `pkg-config --cflags --libs sfu_redis`,
//!   and with CMake (`find_package(sfu_redis CONFIG REQUIRED)`) against a copy of the prefix in
//!   another place, once with `sfu_redis::sfu_redis` and once with `sfu_redis::sfu_redis_static`;
//! - each build runs against a real `redis-server`: it pins its rooms under the namespace set
//!   with `Config::namespace_`, becomes leader, reports `ready`, and on SIGTERM releases the
//!   lease, reports `stopped` and exits 0.
//!
//! `cmake` and `pkg-config` are required: without them the tests fail and say what to install.

mod ffi_host;
mod ffi_support;
#[path = "../../tests/it/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use sfu_redis::keys::KeySpace;

use ffi_host::Host;
use ffi_support::{install_command, need, ok, output_text, root, soname};
use support::{Server, LONG};

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Where this test binary's files go, emptied once per process.
fn work_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("install");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the work directory");
        dir
    })
}

/// The prefix, installed once per test process.
fn prefix() -> &'static Path {
    static PREFIX: OnceLock<PathBuf> = OnceLock::new();
    PREFIX.get_or_init(|| {
        let prefix = work_dir().join("prefix");
        ok(&mut install_command(&prefix), "capi/install.sh");
        prefix
    })
}

fn tools() {
    need("cmake", "cmake");
    need("make", "make");
    need("pkg-config", "pkg-config");
    need("readelf", "binutils");
}

/// The dynamic section of an ELF file (`readelf -d`).
fn dynamic(file: &Path) -> String {
    ok(Command::new("readelf").arg("-d").arg(file), "readelf -d")
}

fn get(server: &Server, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(&mut server.con()).unwrap()
}

/// Runs a build of the example host on a real redis-server as instance `variant` of stage
/// `variant` under the namespace `inst` and checks what it does from start to SIGTERM.
fn run_host(exe: &Path, variant: &str) {
    let server = Server::start();
    let url = server.url();
    let ks = KeySpace::new("inst", variant, "main").unwrap();
    let args = [
        "--redis-url",
        &url,
        "--namespace",
        "inst",
        "--stage",
        variant,
        "--instance",
        variant,
        "--timings",
        "fast",
        "--rooms",
        "r1,r2",
        "--peers",
        "2",
    ];
    let mut host = Host::spawn(exe, variant, &args);
    // The header it was compiled with and the library it loaded are this package's.
    host.line(LONG, "version line", |l| {
        l == format!("version header={VERSION} library={VERSION}")
    });
    host.line(LONG, "pinned r1", |l| l == "pinned r1 pinned");
    host.event("ready", |v| v["rooms"] == 2 && v["peers"] == 4);
    host.event("leader_acquired", |v| v["epoch"].as_u64().is_some());
    // The namespace set through Config::namespace_ is the keys' first part.
    assert_eq!(get(&server, &ks.room("r1").owner).as_deref(), Some(variant));
    assert_eq!(get(&server, &ks.room("r2").owner).as_deref(), Some(variant));
    assert_eq!(get(&server, &ks.leader()).as_deref(), Some(variant));
    assert!(
        server.keys("sfu:*").is_empty(),
        "keys outside the namespace: {:?}",
        server.keys("sfu:*")
    );

    support::procs::signal(host.child.id(), "TERM");
    host.event("leader_lost", |v| v["reason"] == "shutdown");
    host.event("stopped", |_| true);
    assert_eq!(host.exit_code(LONG), Some(0), "{}", host.transcript());
    assert!(
        host.seen.iter().any(|l| l == "exit 0"),
        "{}",
        host.transcript()
    );
    assert_eq!(get(&server, &ks.leader()), None, "lease released");
}

#[test]
fn install_lays_out_the_prefix() {
    tools();
    let prefix = prefix();
    let lib = prefix.join("lib");
    let real = format!("libsfu_redis.so.{VERSION}");

    for file in [
        "include/sfu_redis.h",
        "include/sfu_redis.hpp",
        "lib/libsfu_redis.a",
        "lib/pkgconfig/sfu_redis.pc",
        "lib/cmake/sfu_redis/sfu_redisConfig.cmake",
        "lib/cmake/sfu_redis/sfu_redisConfigVersion.cmake",
    ] {
        assert!(
            prefix.join(file).is_file(),
            "no {file} in {}",
            prefix.display()
        );
    }
    for header in ["sfu_redis.h", "sfu_redis.hpp"] {
        assert_eq!(
            std::fs::read(prefix.join("include").join(header)).unwrap(),
            std::fs::read(root().join("include").join(header)).unwrap(),
            "installed {header} differs from capi/include/{header}"
        );
    }
    let so = lib.join(&real);
    let meta = std::fs::symlink_metadata(&so).unwrap();
    assert!(meta.file_type().is_file(), "{real} is a regular file");
    for link in [soname(), "libsfu_redis.so".to_owned()] {
        assert_eq!(
            std::fs::read_link(lib.join(&link)).ok(),
            Some(PathBuf::from(&real)),
            "lib/{link} links to {real}"
        );
    }
    let d = dynamic(&so);
    let line = d
        .lines()
        .find(|l| l.contains("(SONAME)"))
        .unwrap_or_else(|| panic!("no SONAME in {real}:\n{d}"));
    assert!(line.ends_with(&format!("[{}]", soname())), "{line}");
    println!("{real}: {}", line.trim());

    // pkg-config reads the installed file.
    let pc = |args: &[&str]| -> String {
        ok(
            Command::new("pkg-config")
                .args(args)
                .arg("sfu_redis")
                .env("PKG_CONFIG_PATH", lib.join("pkgconfig")),
            "pkg-config",
        )
        .trim()
        .to_owned()
    };
    assert_eq!(pc(&["--modversion"]), VERSION);
    let p = prefix.display();
    assert_eq!(
        pc(&["--cflags", "--libs"]),
        format!("-I{p}/include -L{p}/lib -lsfu_redis")
    );
    let static_libs = pc(&["--static", "--libs"]);
    assert!(
        static_libs.starts_with(&format!("-L{p}/lib -lsfu_redis -l"))
            && static_libs.contains("-lpthread"),
        "Libs.private: {static_libs}"
    );

    // The CMake version file: same major, no older than asked; ranges inside and starting in
    // the same major.
    let check = work_dir().join("version_check.cmake");
    std::fs::write(&check, VERSION_CHECK).unwrap();
    let version_file = lib.join("cmake/sfu_redis/sfu_redisConfigVersion.cmake");
    let major: u64 = env!("CARGO_PKG_VERSION_MAJOR").parse().unwrap();
    let minor: u64 = env!("CARGO_PKG_VERSION_MINOR").parse().unwrap();
    let cases = [
        (String::new(), true),
        (format!("{major}"), true),
        (format!("{major}.{minor}"), true),
        (VERSION.to_owned(), true),
        (format!("{major}.{}", minor + 1), false),
        (format!("{}.0", major + 1), false),
        (format!("{major}.{minor}...<{}", major + 1), true),
        (format!("{major}.{}...<{}", minor + 1, major + 1), false),
        (format!("{major}.0...<{VERSION}"), false),
    ];
    for (asked, expected) in cases {
        let out = ok(
            Command::new("cmake")
                .arg(format!("-DFILE={}", version_file.display()))
                .arg(format!("-DASKED={asked}"))
                .arg("-P")
                .arg(&check),
            "cmake -P version_check.cmake",
        );
        assert!(
            out.contains(&format!(
                "compatible={}",
                if expected { "TRUE" } else { "FALSE" }
            )),
            "find_package(sfu_redis {asked}) against {VERSION}: {out}"
        );
    }

    // A bad argument is refused with a message, nothing built.
    let out = Command::new("bash")
        .arg(root().join("install.sh"))
        .args(["--prefix", "/nonexistent", "--profile", "fastest"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", output_text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--profile must be release or debug"),
        "{}",
        output_text(&out)
    );
    // A prefix with whitespace would split in the .pc file's flags: refused, naming it.
    let out = Command::new("bash")
        .arg(root().join("install.sh"))
        .args(["--prefix", "/tmp/my sfu"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", output_text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("'/tmp/my sfu' holds whitespace"),
        "{}",
        output_text(&out)
    );
}

/// `cmake -DFILE=<version file> -DASKED=<version or range> -P`: sets what find_package sets
/// for the version file, includes it, prints `compatible=<TRUE|FALSE>`.
const VERSION_CHECK: &str = r#"
if(ASKED MATCHES "^(.*)\\.\\.\\.(<?)(.*)$")
  set(PACKAGE_FIND_VERSION_RANGE "${ASKED}")
  set(PACKAGE_FIND_VERSION_MIN "${CMAKE_MATCH_1}")
  set(PACKAGE_FIND_VERSION_MAX "${CMAKE_MATCH_3}")
  if(CMAKE_MATCH_2 STREQUAL "<")
    set(PACKAGE_FIND_VERSION_RANGE_MAX EXCLUDE)
  else()
    set(PACKAGE_FIND_VERSION_RANGE_MAX INCLUDE)
  endif()
  string(REGEX MATCH "^[0-9]+" PACKAGE_FIND_VERSION_MIN_MAJOR "${PACKAGE_FIND_VERSION_MIN}")
  set(PACKAGE_FIND_VERSION "${PACKAGE_FIND_VERSION_MIN}")
  set(PACKAGE_FIND_VERSION_MAJOR "${PACKAGE_FIND_VERSION_MIN_MAJOR}")
elseif(NOT ASKED STREQUAL "")
  set(PACKAGE_FIND_VERSION "${ASKED}")
  string(REGEX MATCH "^[0-9]+" PACKAGE_FIND_VERSION_MAJOR "${ASKED}")
endif()
include("${FILE}")
message(STATUS "compatible=${PACKAGE_VERSION_COMPATIBLE}")
"#;

#[test]
fn example_builds_with_pkg_config_and_runs() {
    tools();
    let prefix = prefix();
    let pkgconfig = prefix.join("lib/pkgconfig");
    let pc = |args: &[&str]| -> Vec<String> {
        ok(
            Command::new("pkg-config")
                .args(args)
                .arg("sfu_redis")
                .env("PKG_CONFIG_PATH", &pkgconfig),
            "pkg-config",
        )
        .split_whitespace()
        .map(str::to_owned)
        .collect()
    };
    let flags = pc(&["--cflags", "--libs"]);
    let libdir = pc(&["--variable=libdir"]).concat();
    let exe = work_dir().join("sfu_host_pkg_config");
    // g++ -std=c++17 sfu_host.cpp -o sfu_host $(pkg-config --cflags --libs sfu_redis) -Wl,-rpath,...
    ok(
        Command::new("g++")
            .args(["-std=c++17", "-Wall", "-Wextra", "-Werror"])
            .arg(root().join("examples/cpp/sfu_host.cpp"))
            .arg("-o")
            .arg(&exe)
            .args(&flags)
            .arg(format!("-Wl,-rpath,{libdir}")),
        "g++ with pkg-config flags",
    );
    let d = dynamic(&exe);
    assert!(d.contains(&format!("[{}]", soname())), "{d}");
    run_host(&exe, "pkgconfig");
}

#[test]
fn example_builds_with_cmake_shared_and_static_from_a_moved_prefix_and_runs() {
    tools();
    // A copy of the installed tree in another place: the CMake package finds itself there.
    let moved = work_dir().join("moved/elsewhere");
    std::fs::create_dir_all(moved.parent().unwrap()).unwrap();
    ok(
        Command::new("cp").arg("-a").arg(prefix()).arg(&moved),
        "cp -a prefix",
    );

    for (variant, static_link) in [("cmake-shared", false), ("cmake-static", true)] {
        let build = work_dir().join(format!("build-{variant}"));
        let configure = ok(
            Command::new("cmake")
                .arg("-S")
                .arg(root().join("examples/cpp"))
                .arg("-B")
                .arg(&build)
                .arg(format!("-DCMAKE_PREFIX_PATH={}", moved.display()))
                .arg(format!(
                    "-DSFU_REDIS_STATIC={}",
                    if static_link { "ON" } else { "OFF" }
                )),
            "cmake configure",
        );
        assert!(
            configure.contains(&format!(
                "sfu_redis {VERSION} from {}/lib/cmake/sfu_redis",
                moved.display()
            )),
            "{configure}"
        );
        ok(
            Command::new("cmake").arg("--build").arg(&build),
            "cmake --build",
        );
        let exe = build.join("sfu_host");
        let d = dynamic(&exe);
        if static_link {
            assert!(!d.contains("libsfu_redis"), "linked statically:\n{d}");
        } else {
            assert!(d.contains(&format!("[{}]", soname())), "{d}");
            assert!(
                d.contains(&format!("{}/lib", moved.display())),
                "run path in the moved prefix:\n{d}"
            );
        }
        run_host(&exe, variant);
    }
}
