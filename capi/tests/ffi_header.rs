//! The committed C header is exactly what cbindgen generates from capi/src/ (rustls-ffi's
//! check), and both headers compile cleanly as C99 and as C++17.
//!
//! `SFU_UPDATE_HEADER=1 cargo test --test ffi_header` rewrites include/sfu_redis.h.

mod ffi_support;

use std::process::Command;

use ffi_support::root;

fn generate() -> Vec<u8> {
    let config = cbindgen::Config::from_file(root().join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(root().join("src/lib.rs"))
        .generate()
        .expect("cbindgen generates the header");
    let mut out = Vec::new();
    bindings.write(&mut out);
    out
}

#[test]
fn committed_header_matches_cbindgen() {
    let path = root().join("include/sfu_redis.h");
    let fresh = generate();
    let committed = std::fs::read(&path).unwrap_or_default();
    if fresh == committed {
        return;
    }
    if std::env::var_os("SFU_UPDATE_HEADER").is_some() {
        std::fs::write(&path, &fresh).expect("write include/sfu_redis.h");
        eprintln!("rewrote {}", path.display());
        return;
    }
    let fresh = String::from_utf8_lossy(&fresh);
    let committed = String::from_utf8_lossy(&committed);
    let first = fresh
        .lines()
        .zip(committed.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| fresh.lines().count().min(committed.lines().count()));
    panic!(
        "include/sfu_redis.h is stale: it differs from cbindgen's output from line {} on \
         (generated: {:?}, committed: {:?}). Run `SFU_UPDATE_HEADER=1 cargo test --test ffi_header` \
         and commit the result.",
        first + 1,
        fresh.lines().nth(first).unwrap_or("<end>"),
        committed.lines().nth(first).unwrap_or("<end>")
    );
}

fn syntax_check(compiler: &str, args: &[&str], source: &str) {
    let dir = ffi_support::out_dir();
    let file = dir.join(source);
    let st = Command::new(compiler)
        .args(args)
        .arg("-fsyntax-only")
        .arg("-Wall")
        .arg("-Wextra")
        .arg("-Werror")
        .arg("-pedantic")
        .arg("-I")
        .arg(root().join("include"))
        .arg(&file)
        .output()
        .unwrap_or_else(|e| panic!("run {compiler} (install it: apt-get install -y g++): {e}"));
    assert!(
        st.status.success(),
        "{compiler} {args:?} rejects the header:\n{}",
        String::from_utf8_lossy(&st.stderr)
    );
}

#[test]
fn headers_compile_as_c99_and_cpp17() {
    let dir = ffi_support::out_dir();
    std::fs::write(
        dir.join("header_c.c"),
        "#include \"sfu_redis.h\"\nint main(void) { return sfu_version() == 0; }\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("header_cpp.cpp"),
        "#include \"sfu_redis.hpp\"\nint main() { return sfu::version().empty(); }\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("header_c_in_cpp.cpp"),
        "#include \"sfu_redis.h\"\nint main() { return sfu_version() == nullptr; }\n",
    )
    .unwrap();
    syntax_check("gcc", &["-std=c99"], "header_c.c");
    syntax_check("g++", &["-std=c++17"], "header_cpp.cpp");
    syntax_check("g++", &["-std=c++17"], "header_c_in_cpp.cpp");
}
