//! Gives the shared library a versioned SONAME, `libsfu_redis.so.<major>`, so a C or C++
//! program linked against it records `libsfu_redis.so.0` and keeps running when a compatible
//! release replaces the file (the install step, `capi/install.sh`, lays out the
//! `libsfu_redis.so.<version>` file and its `.so.<major>` / `.so` links).
//!
//! The ABI major is the package version's major. While the version is 0.x it is 0: the C ABI
//! only grows within 0.x (the committed header may only gain items, `tests/ffi_header.rs`), and
//! an incompatible change would be a 1.0 with `libsfu_redis.so.1`.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let family = std::env::var("CARGO_CFG_TARGET_FAMILY").unwrap_or_default();
    // ELF platforms only: Apple's loader uses install names, Windows has no SONAME.
    let elf = family.split(',').any(|f| f == "unix") && !matches!(os.as_str(), "macos" | "ios");
    if elf {
        let major = env!("CARGO_PKG_VERSION_MAJOR");
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libsfu_redis.so.{major}");
    }
}
