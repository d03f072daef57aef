#!/usr/bin/env python3
"""Import circles among the library's top-level modules (src/*.rs and src/*/ folders): every
`crate::x` path and `use crate::{x, y::..}` group outside #[cfg(test)] is an edge. Prints the
edges and every elementary cycle; exits 1 when there is one (issue 10: shared state lives in
leaf modules, nothing imports "up"). Usage: python3 .ci/circles.py [src]"""
import os, re, sys
src = sys.argv[1] if len(sys.argv) > 1 else "src"
mods = {}
for f in os.listdir(src):
    p = os.path.join(src, f)
    if f.endswith(".rs") and f not in ("lib.rs", "main.rs"):
        mods[f[:-3]] = [p]
    elif os.path.isdir(p) and f != "bin":
        mods[f] = [os.path.join(d, x) for d, _, fs in os.walk(p) for x in fs if x.endswith(".rs")]
E = {m: set() for m in mods}
for m, fs in mods.items():
    for p in fs:
        t = re.split(r"#\[cfg\(test\)\]", open(p, encoding="utf-8").read())[0]
        names = set(re.findall(r"crate::(\w+)", t))
        for grp in re.findall(r"crate::\{([^}]*)\}", t, re.S):
            names |= {x.strip().split("::")[0] for x in grp.split(",") if x.strip()}
        E[m] |= {d for d in names if d in mods and d != m}
cycles = set()
def dfs(start, u, path):
    for v in E[u]:
        if v == start:
            cycles.add(tuple(path))
        elif v not in path and v > start:
            dfs(start, v, path + [v])
for m in sorted(mods):
    dfs(m, m, [m])
for m in sorted(E):
    print(f"{m} -> {', '.join(sorted(E[m])) or '-'}")
print(f"cycles: {len(cycles)}")
for c in sorted(cycles)[:20]:
    print("  " + " -> ".join(c + (c[0],)))
sys.exit(1 if cycles else 0)
