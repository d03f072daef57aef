#!/usr/bin/env python3
"""Mutation check of the Lua scripts' guards (issue 32).

Each mutation in .ci/mutations.toml is one small text edit of one lua/*.lua file (drop a
guard, invert a comparison, skip a re-check). For each, this runner copies lua/ to a temporary
directory, applies the edit to the copy (the tree's own files are never written), and runs the
test filters named for it with SFU_TEST_LUA_DIR pointing at the copy: the library built with
its `testing` feature (every test build of this workspace) then runs the copy's scripts, in the
test process and in every node process the tests start (src/scripts.rs). A mutation is killed
when at least one of its tests fails; a survivor fails the run.

Two runs guard the guard: the filters of every mutation first pass over an unmodified copy
(a mutation killed by a flaky test proves nothing), and a canary mutation that breaks every
script must be killed (proves the copy is what runs).

Mutations run SFU_MUTANTS_JOBS (default 3) at a time, each test binary run directly (no cargo
lock between them).

Usage: python3 .ci/mutants.py [--all] [--no-baseline] [NAME ...]
  --all          also the mutations marked `ci = false` (slower; on demand)
  --no-baseline  skip the baseline run (.ci/run: the whole suite has just passed)
  NAME    only the mutations whose name contains NAME
Prints a table: mutation, tests run, killed by. Exit 1 on a survivor or a failed baseline.
"""

import json
import os
from concurrent.futures import ThreadPoolExecutor
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 600
JOBS = int(os.environ.get("SFU_MUTANTS_JOBS", "3"))


def load(args):
    with open(os.path.join(ROOT, ".ci", "mutations.toml"), "rb") as f:
        spec = tomllib.load(f)
    run_all = "--all" in args
    names = [a for a in args if not a.startswith("--")]
    out = []
    for m in spec["mutation"]:
        if not run_all and not m.get("ci", True):
            continue
        if names and not any(n in m["name"] for n in names):
            continue
        out.append(m)
    return out


def copy_lua(tmp):
    dst = os.path.join(tmp, "lua")
    shutil.copytree(os.path.join(ROOT, "lua"), dst)
    return dst


def apply(lua_dir, m):
    """Applies mutation `m` to the copy; returns an error string or None."""
    path = os.path.join(lua_dir, m["file"])
    with open(path) as f:
        text = f.read()
    if m.get("whole"):
        text = m["to"]
    else:
        n = text.count(m["from"])
        want = m.get("count", 1)
        if n != want:
            return f"{m['file']}: the text to replace occurs {n} times, not {want}: {m['from']!r}"
        text = text.replace(m["from"], m["to"])
    with open(path, "w") as f:
        f.write(text)
    return None


def test_binaries():
    """Builds the library's test binaries (reused from the suite's run when up to date): the
    integration tests `it` and the unit tests `lib`; their paths by those names."""
    out = subprocess.run(
        ["cargo", "test", "-q", "-p", "sfu-redis", "--lib", "--test", "it", "--no-run",
         "--message-format=json"],
        cwd=ROOT, check=True, capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if msg["target"]["name"] == "it":
            found["it"] = msg["executable"]
        elif "lib" in msg["target"]["kind"]:
            found["lib"] = msg["executable"]
    if set(found) != {"it", "lib"}:
        raise SystemExit(f"test binaries not found in cargo's output: {found}")
    return found


def run_tests(binary, lua_dir, filters):
    """Runs the integration tests matching `filters`; returns (ok, failed test names, log)."""
    env = dict(os.environ, SFU_TEST_LUA_DIR=lua_dir)
    try:
        p = subprocess.run([binary, *filters], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"") + (e.stderr or b"")
        return False, ["<timeout>"], out.decode(errors="replace")
    log = p.stdout + p.stderr
    failed = re.findall(r"^test (\S+) \.\.\. FAILED", log, re.M)
    ran = re.findall(r"test result: \w+\. (\d+) passed; (\d+) failed", log)
    count = sum(int(a) + int(b) for a, b in ran)
    if count == 0:
        return False, [], log + "\n(no test matched the filters)"
    return p.returncode == 0, sorted(set(failed)), log


def excerpt(log):
    """The panics of a test log (the servers' own log lines left out), or its tail."""
    lines = [l for l in log.splitlines() if not re.match(r"^\d+:[MCXS] ", l)]
    out = []
    for i, l in enumerate(lines):
        if "panicked at" in l:
            out += lines[i:i + 6]
    return "\n".join(out[-60:]) if out else "\n".join(lines[-40:])


def main(args):
    mutations = load(args)
    if not mutations:
        print("no mutation selected")
        return 1
    print("== building the integration tests (reused when up to date)", flush=True)
    binaries = test_binaries()
    # The CLI the tests start, built now rather than by the first test that needs it.
    subprocess.run(["cargo", "build", "-q", "-p", "sfu-redis-cli"], cwd=ROOT, check=True)

    with tempfile.TemporaryDirectory(prefix="sfu-mutants-") as tmp:
        pristine = copy_lua(os.path.join(tmp, "pristine"))
        t0 = time.time()
        for name, binary in sorted(binaries.items()):
            if "--no-baseline" in args:
                break
            filters = sorted({f for m in mutations if m.get("binary", "it") == name
                              for f in m["tests"]})
            if not filters:
                continue
            print(f"== baseline: {len(filters)} filters of `{name}` over the unmodified scripts",
                  flush=True)
            ok, failed, log = run_tests(binary, pristine, filters)
            if not ok and failed:
                # One retry of what failed: a test that fails on the unmodified scripts cannot
                # show a mutation's effect, but one slow moment on a busy machine must not
                # fail CI.
                print(excerpt(log))
                print(f"   baseline: {', '.join(failed)} failed; once more", flush=True)
                ok, failed, log = run_tests(binary, pristine, failed)
            if not ok:
                print(excerpt(log))
                print(f"baseline failed ({', '.join(failed) or 'see above'}): fix the suite first")
                return 1
        if "--no-baseline" not in args:
            print(f"   passed in {time.time() - t0:.0f} s", flush=True)

        # Each mutation gets its own copy; JOBS of them run at once (the tests mostly wait on
        # timers and each starts its own redis-server on a free port).
        for i, m in enumerate(mutations):
            lua_dir = copy_lua(os.path.join(tmp, f"m{i}"))
            err = apply(lua_dir, m)
            if err:
                print(err)
                return 1
            m["_dir"] = lua_dir

        def one(m):
            t0 = time.time()
            binary = binaries[m.get("binary", "it")]
            ok, failed, log = run_tests(binary, m["_dir"], m["tests"])
            took = time.time() - t0
            killed = not ok and bool(failed)
            if not ok and not failed:
                # A failure that names no test (a crash, no match) is not a kill.
                print(excerpt(log))
            print(f"   {'killed  ' if killed else 'SURVIVED'} {m['name']} ({took:.0f} s)",
                  flush=True)
            return (m["name"], " ".join(m["tests"]),
                    ", ".join(failed) if killed else "SURVIVED", took)

        t0 = time.time()
        with ThreadPoolExecutor(max_workers=JOBS) as pool:
            rows = list(pool.map(one, mutations))
        wall = time.time() - t0

    survivors = sum(1 for r in rows if r[2] == "SURVIVED")
    w = max(len(r[0]) for r in rows)
    print()
    print(f"{'mutation':<{w}}  {'s':>4}  tests run -> killed by")
    for name, tests, by, took in rows:
        print(f"{name:<{w}}  {took:>4.0f}  {tests} -> {by}")
    print(f"\n{len(rows) - survivors} of {len(rows)} mutations killed ({wall:.0f} s, {JOBS} at a time)")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
