//! The committed C header is exactly what cbindgen generates from capi/src/ (rustls-ffi's
//! check), both headers compile cleanly as C99 and as C++17, and the header's version macros
//! equal the package version and the library's `sfu_version()`.
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

#[test]
fn version_macros_match_the_package_and_sfu_version() {
    // The committed header's macros, as text: one per component, and the string.
    let header = std::fs::read_to_string(root().join("include/sfu_redis.h")).unwrap();
    let define = |name: &str| -> String {
        header
            .lines()
            .find_map(|l| l.strip_prefix(&format!("#define {name} ")))
            .unwrap_or_else(|| panic!("no #define {name} in include/sfu_redis.h"))
            .trim()
            .to_owned()
    };
    let package = env!("CARGO_PKG_VERSION");
    let bump = "update after_includes in capi/cbindgen.toml with the package version, then \
                `SFU_UPDATE_HEADER=1 cargo test -p sfu-redis-capi --test ffi_header`";
    assert_eq!(
        define("SFU_REDIS_VERSION_MAJOR"),
        env!("CARGO_PKG_VERSION_MAJOR"),
        "{bump}"
    );
    assert_eq!(
        define("SFU_REDIS_VERSION_MINOR"),
        env!("CARGO_PKG_VERSION_MINOR"),
        "{bump}"
    );
    assert_eq!(
        define("SFU_REDIS_VERSION_PATCH"),
        env!("CARGO_PKG_VERSION_PATCH"),
        "{bump}"
    );
    assert_eq!(
        define("SFU_REDIS_VERSION"),
        format!("\"{package}\""),
        "{bump}"
    );

    // Compiled into a C program and next to the library's sfu_version() at run time.
    let src = ffi_support::out_dir().join("version_macros.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n#include \"sfu_redis.h\"\n\
         #if SFU_REDIS_VERSION_MAJOR < 0 || SFU_REDIS_VERSION_MINOR < 0 || SFU_REDIS_VERSION_PATCH < 0\n\
         #error \"version macros are not numbers\"\n#endif\n\
         int main(void) {\n\
             printf(\"%d.%d.%d %s %s\\n\", SFU_REDIS_VERSION_MAJOR, SFU_REDIS_VERSION_MINOR,\n\
                    SFU_REDIS_VERSION_PATCH, SFU_REDIS_VERSION, sfu_version());\n\
             return 0;\n\
         }\n",
    )
    .unwrap();
    let exe = ffi_support::build("gcc", "version_macros", &[src], &["-std=c99", "-pedantic"]);
    let r = ffi_support::run(&exe, &[], false, &[]);
    assert!(r.output.status.success(), "{}", r.describe());
    assert_eq!(
        r.stdout().trim(),
        format!("{package} {package} {package}"),
        "macros MAJOR.MINOR.PATCH, SFU_REDIS_VERSION, sfu_version()"
    );
}
