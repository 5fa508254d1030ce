#!/usr/bin/env python3
"""Fails when two modules of a crate import each other, directly or round a
loop (`make lint`). A cycle ties files that should be read, tested and
changed apart; the house rule is that dependencies point one way.

A module is a file; it depends on the modules it names through `crate::`,
`super::` or a child it declares (`mod x;` then `x::`): on the longest
prefix of the path that is a module (`crate::admin::show::pools` names
`admin::show`). A file's use of its own ancestors does not count: a module
split into files (`pool/lease.rs` using `pool/mod.rs`'s types, which
re-exports them) is one module, not a loop. Test modules at the end of a
file and comments do not count; a macro's `$crate::` paths count as its
own file's. `crates/testkit` is left out: its builder and the cluster it
builds name each other, as builders do.

Usage: import_cycles.py CRATE_SRC_DIR...
"""

import os
import re
import sys


def modules(src):
    named = {}
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
            here = name.split("::") if name else []
            paths = []
            for m in re.finditer(r"(?<![a-z_:])crate((?:::[a-z_]+)*)", text):
                paths.append(m.group(1).split("::")[1:])
            for m in re.finditer(r"(?<![a-z_:])((?:super::)+)((?:[a-z_]+::)*[a-z_]+)?", text):
                up = m.group(1).count("super::")
                base = here[: max(len(here) - up, 0)]
                paths.append(base + (m.group(2).split("::") if m.group(2) else []))
            kids = set(re.findall(r"^\s*(?:pub(?:\([a-z]+\))? )?mod ([a-z_]+);", text, re.M))
            for m in re.finditer(r"(?<![a-z_:])([a-z_]+)((?:::[a-z_]+)*)::", text):
                if m.group(1) in kids:
                    paths.append(here + [m.group(1)] + m.group(2).split("::")[1:])
            named[name] = paths
    deps = {}
    for name, paths in named.items():
        here = name.split("::") if name else []
        found = set()
        for segs in paths:
            # The longest prefix that is a module.
            for n in range(len(segs), 0, -1):
                module = "::".join(segs[:n])
                if module in named:
                    break
            else:
                continue
            # Its own ancestors: the module this file is a part of.
            if here[: n] == segs[:n] and n < len(here):
                continue
            if module != name:
                found.add(module)
        deps[name] = found
    return deps


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
