#!/usr/bin/env bash
# Installs sfu-redis for C and C++ hosts: builds the C library with cargo and lays out a prefix
# the way C and C++ builds expect it. From anywhere in the repository:
#
#   bash capi/install.sh --prefix /usr/local [--profile release|debug]
#
#   <prefix>/include/sfu_redis.h, sfu_redis.hpp
#   <prefix>/lib/libsfu_redis.so.<version>       SONAME libsfu_redis.so.<major> (capi/build.rs)
#   <prefix>/lib/libsfu_redis.so.<major>, libsfu_redis.so   -> libsfu_redis.so.<version>
#   <prefix>/lib/libsfu_redis.a
#   <prefix>/lib/pkgconfig/sfu_redis.pc                     (from capi/pkg/sfu_redis.pc.in)
#   <prefix>/lib/cmake/sfu_redis/sfu_redisConfig.cmake      (from capi/pkg/*.cmake.in)
#   <prefix>/lib/cmake/sfu_redis/sfu_redisConfigVersion.cmake
#
# --profile: the cargo profile, release (the default) or debug. DESTDIR (environment), as with
# `make install`: the files go under $DESTDIR<prefix> while the .pc file names <prefix>.
# Needs cargo (CARGO, else from PATH; CARGO_TARGET_DIR is honoured) and coreutils; nothing is
# downloaded beyond the crates cargo fetches for Cargo.lock. ELF platforms (Linux, the BSDs).
set -euo pipefail

usage() {
  # The comment block at the top of this file.
  awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0" >&2
  exit "${1:-2}"
}

prefix=/usr/local
profile=release
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) [ $# -ge 2 ] || usage; prefix=$2; shift 2 ;;
    --prefix=*) prefix=${1#--prefix=}; shift ;;
    --profile) [ $# -ge 2 ] || usage; profile=$2; shift 2 ;;
    --profile=*) profile=${1#--profile=}; shift ;;
    -h | --help) usage 0 ;;
    *) echo "install.sh: unknown argument: $1" >&2; usage ;;
  esac
done

die() {
  echo "install.sh: $*" >&2
  exit 1
}

case "$profile" in
  release) profile_args=(--release) ;;
  debug | dev) profile_args=() ;;
  *) die "--profile must be release or debug, not '$profile'" ;;
esac
[ -n "$prefix" ] || die "--prefix is empty"
case "$prefix" in
  *[[:space:]]*) die "--prefix '$prefix' holds whitespace: pkg-config and compiler flags would split it; choose a prefix without spaces" ;;
esac
case "$prefix" in
  /*) ;;
  *) prefix="$PWD/$prefix" ;;
esac
prefix=${prefix%/}
[ -n "$prefix" ] || prefix=/

capi=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$capi")
cargo=${CARGO:-cargo}

# The package version (capi/Cargo.toml) names the files; its major is the ABI major.
version=$(sed -n 's/^version = "\([0-9][0-9]*\.[0-9][0-9]*\.[0-9][0-9]*\)"$/\1/p' "$capi/Cargo.toml" | head -n1)
[ -n "$version" ] || die "no 'version = \"X.Y.Z\"' line in $capi/Cargo.toml"
major=${version%%.*}
soname="libsfu_redis.so.$major"

work=$(mktemp -d "${TMPDIR:-/tmp}/sfu_redis_install.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Build libsfu_redis.so and .a. `cargo rustc ... -- --print native-static-libs` makes rustc
# name the system libraries a program linking libsfu_redis.a needs (cargo replays the note when
# nothing is rebuilt); the JSON messages on stdout name the built files.
echo "== building libsfu_redis ($profile) with cargo" >&2
"$cargo" rustc --locked --color never --manifest-path "$root/Cargo.toml" -p sfu-redis-capi --lib \
  "${profile_args[@]}" --message-format=json-render-diagnostics -- --print native-static-libs \
  2>&1 >"$work/messages.json" | tee "$work/cargo.log" >&2

built() {
  local file
  file=$(grep -o "\"[^\"]*/$1\"" "$work/messages.json" | tail -n1 | tr -d '"')
  [ -n "$file" ] && [ -f "$file" ] || die "cargo built no $1 (this script lays out ELF shared libraries)"
  printf '%s\n' "$file"
}
so=$(built libsfu_redis.so)
a=$(built libsfu_redis.a)

native=$(sed -n 's/^.*note: native-static-libs: *//p' "$work/cargo.log" | tail -n1)
[ -n "$native" ] || die "rustc printed no native-static-libs for libsfu_redis.a"
cmake_libs=""
for flag in $native; do
  case "$flag" in
    -l*) cmake_libs="${cmake_libs:+$cmake_libs;}${flag#-l}" ;;
    *) die "unexpected native-static-libs entry '$flag' (from: $native)" ;;
  esac
done

# The pointer size the library was built for (the ELF class byte: 1 = 32-bit, 2 = 64-bit),
# so the CMake package refuses a project of the other size.
case "$(od -An -tu1 -j4 -N1 "$so" | tr -d ' ')" in
  1) bits=32 ;;
  2) bits=64 ;;
  *) die "$so is not an ELF shared library" ;;
esac

# Replacement text for sed: escape \, & and the | delimiter.
esc() { printf '%s' "$1" | sed -e 's/[\\&|]/\\&/g'; }
fill() {
  sed -e "s|@PREFIX@|$(esc "$prefix")|g" \
    -e "s|@VERSION@|$(esc "$version")|g" \
    -e "s|@MAJOR@|$(esc "$major")|g" \
    -e "s|@SONAME@|$(esc "$soname")|g" \
    -e "s|@LIBS_PRIVATE@|$(esc "$native")|g" \
    -e "s|@CMAKE_LINK_LIBS@|$(esc "$cmake_libs")|g" \
    -e "s|@POINTER_BITS@|$bits|g" \
    -e "s|@SIZEOF_VOID_P@|$((bits / 8))|g" \
    "$capi/pkg/$1.in" >"$work/$1"
  if grep -q '@[A-Z_]*@' "$work/$1"; then
    die "unfilled placeholder in capi/pkg/$1.in: $(grep -o '@[A-Z_]*@' "$work/$1" | head -n1)"
  fi
}
fill sfu_redis.pc
fill sfu_redisConfig.cmake
fill sfu_redisConfigVersion.cmake

dest="${DESTDIR:-}$prefix"
lib="$dest/lib"
echo "== installing sfu_redis $version into $dest" >&2
install -d "$dest/include" "$lib/pkgconfig" "$lib/cmake/sfu_redis"
install -m 0644 "$capi/include/sfu_redis.h" "$capi/include/sfu_redis.hpp" "$dest/include/"
install -m 0755 "$so" "$lib/libsfu_redis.so.$version"
ln -sfn "libsfu_redis.so.$version" "$lib/$soname"
ln -sfn "libsfu_redis.so.$version" "$lib/libsfu_redis.so"
install -m 0644 "$a" "$lib/libsfu_redis.a"
install -m 0644 "$work/sfu_redis.pc" "$lib/pkgconfig/sfu_redis.pc"
install -m 0644 "$work/sfu_redisConfig.cmake" "$work/sfu_redisConfigVersion.cmake" \
  "$lib/cmake/sfu_redis/"

cat >&2 <<EOF
== installed sfu_redis $version (SONAME $soname)
   pkg-config: PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs sfu_redis
   CMake:      find_package(sfu_redis CONFIG REQUIRED) with -DCMAKE_PREFIX_PATH=$prefix,
               target_link_libraries(<target> PRIVATE sfu_redis::sfu_redis)  (or ::sfu_redis_static)
   At run time the loader must find $soname in $prefix/lib: run ldconfig (as root) for a
   system directory, or link with -Wl,-rpath,$prefix/lib (CMake adds it to build trees).
EOF
