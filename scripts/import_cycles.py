#!/usr/bin/env python3
"""Fails when two modules of a crate import each other, directly or round a
loop (`make lint`). A cycle ties files that should be read, tested and
changed apart; the house rule is that dependencies point one way.

A module is a file; it depends on the modules it names through `crate::`,
`super::` or a child it declares (`mod x;` then `x::`). Test modules at
the end of a file and comments do not count; a macro's `$crate::` paths
count as its own file's. `crates/testkit` is left out: its builder and
the cluster it builds name each other, as builders do.

Usage: import_cycles.py CRATE_SRC_DIR...
"""

import os
import re
import sys


def modules(src):
    deps = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(root, f)
            rel = os.path.relpath(path, src)[:-3]
            name = rel.replace(os.sep + "mod", "").replace(os.sep, "::")
            if name in ("main", "lib", "mod"):
                name = ""
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
            cut = text.find("#[cfg(test)]\nmod tests")
            if cut >= 0:
                text = text[:cut]
            # Comments name modules without depending on them.
            text = re.sub(r"//[^\n]*", "", text)
            found = set()
            prefix = name + "::" if name else ""
            for m in re.finditer(r"crate::([a-z_]+)(?:::([a-z_]+))?", text):
                found.add(m.group(1))
                if m.group(2):
                    found.add(f"{m.group(1)}::{m.group(2)}")
            parent = "::".join(name.split("::")[:-1])
            for m in re.finditer(r"super::([a-z_]+)", text):
                found.add((parent + "::" if parent else "") + m.group(1))
            kids = set(re.findall(r"^\s*(?:pub(?:\([a-z]+\))? )?mod ([a-z_]+);", text, re.M))
            for m in re.finditer(r"(?<![a-z_:])([a-z_]+)::", text):
                if m.group(1) in kids:
                    found.add(prefix + m.group(1))
            deps[name] = found
    return {n: {d for d in ds if d in deps and d != n} for n, ds in deps.items()}


def cycles(graph):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main(dirs):
    bad = 0
    for src in dirs:
        for comp in cycles(modules(src)):
            print(f"{src}: import cycle among {', '.join(comp)}")
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["crates/sluice/src"]))
