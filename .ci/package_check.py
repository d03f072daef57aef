#!/usr/bin/env python3
"""Checks what `cargo package --list -p sfu-redis` puts in the published crate (issue 30):
every Lua script the library compiles in, the README (the crate docs include it), the
changelog and both license files; nothing outside src/, lua/ and those files."""
import pathlib
import subprocess
import sys

listed = subprocess.run(
    ["cargo", "package", "--list", "-p", "sfu-redis", "--allow-dirty", "--quiet"],
    check=True, capture_output=True, text=True,
).stdout.split()
files = set(listed)
root = pathlib.Path(__file__).resolve().parent.parent
required = {"README.md", "CHANGELOG.md", "LICENSE-MIT", "LICENSE-APACHE", "Cargo.toml", "src/lib.rs"}
required |= {f"lua/{p.name}" for p in (root / "lua").glob("*.lua")}
missing = sorted(required - files)
# Cargo's own files beside ours.
cargo_own = {"Cargo.toml", "Cargo.toml.orig", "Cargo.lock", ".cargo_vcs_info.json"}
stray = sorted(
    f for f in files
    if f not in cargo_own and f not in required and not f.startswith("src/")
)
if missing or stray:
    print(f"package: missing {missing}, not meant to ship {stray}")
    sys.exit(1)
print(f"package: {len(files)} files, {len([f for f in files if f.startswith('lua/')])} Lua scripts, README, CHANGELOG, licenses")
