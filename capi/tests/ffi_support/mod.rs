//! Support for the C ABI tests: build `libsfu_redis.so` with cargo, compile C and C++ programs
//! against it with the system compilers, and run them (optionally under valgrind memcheck).
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Where built test programs go.
pub fn out_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ffi");
    std::fs::create_dir_all(&d).expect("create the output directory");
    d
}

/// `<target>/<profile>`, the directory of this test binary's profile.
pub fn profile_dir() -> PathBuf {
    // This test binary lives in <target>/<profile>/deps/.
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("test binary in <target>/<profile>/deps")
        .to_path_buf()
}

/// Whether this test binary was built with the release profile.
pub fn is_release() -> bool {
    profile_dir().file_name().is_some_and(|n| n == "release")
}

/// The cargo that runs the tests (`CARGO`), else `cargo` from `PATH`.
pub fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// The shared library's SONAME: `libsfu_redis.so.<major>` (see `capi/build.rs`).
pub fn soname() -> String {
    format!("libsfu_redis.so.{}", env!("CARGO_PKG_VERSION_MAJOR"))
}

/// The directory holding `libsfu_redis.so` / `.a` (`target/<profile>`), built once per test
/// process with `cargo build --lib` and the profile of this test binary, so a plain `cargo
/// test` from a clean clone works. It also gets the `libsfu_redis.so.<major>` link that
/// programs linked against the library look for at run time (its SONAME; the install step
/// makes the same link in `<prefix>/lib`).
pub fn lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let profile_dir = profile_dir();
        let target_dir = profile_dir.parent().expect("<target>").to_path_buf();
        let release = is_release();
        let mut cmd = Command::new(cargo());
        cmd.arg("build")
            .arg("--lib")
            .arg("--manifest-path")
            .arg(root().join("Cargo.toml"))
            .arg("--target-dir")
            .arg(&target_dir);
        if release {
            cmd.arg("--release");
        }
        let st = cmd.status().expect("run cargo build --lib");
        assert!(st.success(), "cargo build --lib failed");
        assert!(
            profile_dir.join("libsfu_redis.so").exists(),
            "no libsfu_redis.so in {}",
            profile_dir.display()
        );
        let link = profile_dir.join(soname());
        if std::fs::read_link(&link).ok().as_deref() != Some(Path::new("libsfu_redis.so")) {
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink("libsfu_redis.so", &link)
                .unwrap_or_else(|e| panic!("link {} to libsfu_redis.so: {e}", link.display()));
        }
        profile_dir
    })
}

/// Fails the test, naming the package to install, when `tool --version` does not run: these
/// tests never pass silently for want of a tool.
pub fn need(tool: &str, debian_packages: &str) {
    let ok = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "`{tool}` is needed by the C/C++ tests: install it (Debian: apt-get install -y {debian_packages})"
    );
}

/// Compiles `sources` with `compiler` (`gcc` or `g++`) and `flags` into `out_dir()/name`,
/// linked against the shared library (with an rpath, so it runs in place), as
/// docs/src/c/install.md says.
pub fn build(compiler: &str, name: &str, sources: &[PathBuf], flags: &[&str]) -> PathBuf {
    let lib = lib_dir();
    let link = [
        "-L".to_owned(),
        lib.display().to_string(),
        format!("-Wl,-rpath,{}", lib.display()),
        "-lsfu_redis".to_owned(),
    ];
    compile(compiler, name, sources, flags, &link)
}

/// Like [`build`], linked statically against `libsfu_redis.a` with the system libraries that
/// `cargo rustc -- --print native-static-libs` lists.
pub fn build_static(compiler: &str, name: &str, sources: &[PathBuf], flags: &[&str]) -> PathBuf {
    let lib = lib_dir().join("libsfu_redis.a");
    let mut link = vec![lib.display().to_string()];
    link.extend(["-lpthread", "-ldl", "-lm"].map(String::from));
    compile(compiler, name, sources, flags, &link)
}

fn compile(
    compiler: &str,
    name: &str,
    sources: &[PathBuf],
    flags: &[&str],
    link: &[String],
) -> PathBuf {
    need(compiler, "gcc g++ valgrind");
    let exe = out_dir().join(name);
    let out = Command::new(compiler)
        .args(flags)
        .arg("-g")
        .arg("-Wall")
        .arg("-Wextra")
        .arg("-Werror")
        .arg("-I")
        .arg(root().join("include"))
        .args(sources)
        .arg("-o")
        .arg(&exe)
        .args(link)
        .output()
        .expect("run the compiler");
    assert!(
        out.status.success(),
        "{compiler} failed for {name}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Whether valgrind runs: required when `CI` is set (CI installs it); elsewhere a missing
/// valgrind runs the programs natively, with a notice.
pub fn valgrind_available() -> bool {
    let found = Command::new("valgrind")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "valgrind is required in CI (apt-get install -y valgrind)"
        );
        eprintln!(
            "NOTE: valgrind not found; running without memcheck (install valgrind to check memory)"
        );
    }
    found
}

/// Memcheck options: any error fails the run (exit 1), definite leaks count as errors.
pub const MEMCHECK: [&str; 6] = [
    "--error-exitcode=1",
    "--leak-check=full",
    "--errors-for-leak-kinds=definite",
    "--show-leak-kinds=definite",
    "--track-origins=yes",
    "--quiet",
];

/// A program run's output; `valgrind` adds the memcheck summary lines (from its log).
pub struct Run {
    pub output: Output,
    pub valgrind_log: Option<String>,
}

impl Run {
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    pub fn describe(&self) -> String {
        format!(
            "status {:?}\n--- stdout\n{}\n--- stderr\n{}\n--- valgrind\n{}",
            self.output.status,
            self.stdout(),
            self.stderr(),
            self.valgrind_log
                .as_deref()
                .unwrap_or("(not run under valgrind)")
        )
    }

    /// The ERROR SUMMARY and LEAK SUMMARY lines of valgrind's log.
    pub fn summary(&self) -> String {
        self.valgrind_log
            .as_deref()
            .unwrap_or("")
            .lines()
            .filter(|l| {
                l.contains("ERROR SUMMARY")
                    || l.contains("definitely lost")
                    || l.contains("indirectly lost")
                    || l.contains("possibly lost")
                    || l.contains("still reachable")
                    || l.contains("LEAK SUMMARY")
                    || l.contains("All heap blocks were freed")
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Runs `exe args`, under valgrind memcheck when `memcheck` is set (and valgrind exists); the
/// full valgrind log (with its summary) goes to a file read back into [`Run::valgrind_log`].
pub fn run(exe: &Path, args: &[&str], memcheck: bool, env: &[(&str, &str)]) -> Run {
    let use_valgrind = memcheck && valgrind_available();
    let log = exe.with_extension(format!("valgrind.{}.log", std::process::id()));
    let mut cmd = if use_valgrind {
        let mut c = Command::new("valgrind");
        c.args(MEMCHECK.iter().filter(|a| **a != "--quiet"))
            .arg(format!("--log-file={}", log.display()))
            .arg(exe);
        c
    } else {
        Command::new(exe)
    };
    cmd.args(args).stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let output = cmd.output().expect("run the test program");
    let valgrind_log = use_valgrind.then(|| std::fs::read_to_string(&log).unwrap_or_default());
    Run {
        output,
        valgrind_log,
    }
}

/// Asserts a valgrind run found no error and no definite leak (valgrind's exit code 1 already
/// says so; the summary lines are checked too, and printed for the record).
pub fn assert_memcheck_clean(name: &str, r: &Run) {
    let Some(log) = &r.valgrind_log else {
        return;
    };
    println!("valgrind summary of {name}:\n{}", r.summary());
    assert!(
        log.contains("ERROR SUMMARY: 0 errors"),
        "{name}: valgrind found errors\n{}",
        r.describe()
    );
    let definite = log
        .lines()
        .find(|l| l.contains("definitely lost:"))
        .unwrap_or("");
    assert!(
        definite.is_empty() || definite.contains("definitely lost: 0 bytes"),
        "{name}: valgrind found a definite leak\n{}",
        r.describe()
    );
}

/// A finished command's status, stdout and stderr, for a failure message.
pub fn output_text(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `cmd`, asserts it succeeded, returns its stdout.
pub fn ok(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
    assert!(out.status.success(), "{what} failed\n{}", output_text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The install command of docs/src/c/install.md (`bash capi/install.sh --prefix
/// DIR`), with this test binary's profile and target directory.
pub fn install_command(prefix: &Path) -> Command {
    let mut cmd = Command::new("bash");
    cmd.arg(root().join("install.sh"))
        .arg("--prefix")
        .arg(prefix)
        .arg("--profile")
        .arg(if is_release() { "release" } else { "debug" })
        .env("CARGO", cargo())
        .env(
            "CARGO_TARGET_DIR",
            profile_dir().parent().expect("<target>"),
        );
    cmd
}
