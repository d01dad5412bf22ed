#!/usr/bin/env python3
"""The module import graph of src/: no cycle, and none of the arrows that
docs/architecture.md says must never exist.

A module is a file (src/a/b.rs or src/a/b/mod.rs is `a::b`). An arrow
a -> b is any `crate::b...` path written in a (in a `use` or inline), or
`super::`/`self::` resolved the same way. An arrow from a module to one of
its own ancestors is left out: a module may use what its parent declares
(the parent, in turn, declares it). Exit 1 with the cycles or forbidden
arrows found, each on a line.
"""
import re
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

# (from prefix, to prefix, why): a module under `from` may not name one under `to`.
NEVER = [
    ("python", "attach", "python/ reads memory it is handed; attaching is the caller's job"),
    ("python", "acquire", "python/ walks what it is handed, however the instant was made"),
    ("python", "session", "python/ knows no session"),
    ("python", "native", "python/ knows nothing of C stacks"),
    ("python", "kernel", "python/ walks what it is handed, however the instant was made"),
    ("process", "acquire", "process/ is the target as the kernel shows it; deciding instants is above it"),
    ("process", "python", "process/ knows no CPython"),
    ("stack", "acquire", "the sampled stack is shared by readers and consumers"),
    ("offsets", "attach", "offsets are data: finding them in a target is attach's job"),
    ("offsets", "binary::elf", "offsets are data: no file I/O"),
    ("offsets", "process::maps", "offsets are data: no maps I/O"),
    ("offsets", "python", "offsets describe CPython; reading it is python/'s job"),
    ("output", "acquire", "writers read the profile model only"),
    ("output", "session", "writers read the profile model only"),
    ("profile", "acquire", "the model knows nothing of sampling"),
    ("record", "acquire", "commands choose a sampler by name, never by its types"),
    ("top", "acquire", "commands choose a sampler by name, never by its types"),
    ("agent", "acquire", "commands choose a sampler by name, never by its types"),
    ("dump", "acquire", "commands choose a sampler by name, never by its types"),
    ("cli", "acquire", "commands choose a sampler by name, never by its types"),
]
# Only the acquirer may stop a thread.
ONLY = [("acquire::ptrace", "acquire", "nothing but the acquirer stops a thread")]


def modules():
    mods = {}
    for f in SRC.rglob("*.rs"):
        rel = f.relative_to(SRC).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "mod":
            parts = parts[:-1]
        if parts in (["lib"], ["main"]):
            parts = []
        mods["::".join(parts)] = f
    return mods


PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
GROUP = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^;]*?)\}\s*;", re.S)


def strip(text):
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def resolve(mod, root, rest, mods, is_mod_file):
    here = mod.split("::") if mod else []
    if root == "crate":
        base = []
    elif root == "self":
        base = here  # `self` is the module the file is
    else:  # `super`: the parent of the module the file is
        base = here[:-1]
    parts = base + [p for p in rest.split("::") if p]
    # Longest prefix that is a module.
    for n in range(len(parts), -1, -1):
        cand = "::".join(parts[:n])
        if cand in mods:
            return cand
    return None


def edges(mods):
    out = {m: set() for m in mods}
    for m, f in mods.items():
        text = strip(f.read_text())
        is_mod_file = f.name in ("mod.rs", "lib.rs", "main.rs")
        found = []
        for g in GROUP.finditer(text):
            for item in re.split(r",", g.group(3)):
                item = item.strip().split(" as ")[0].strip()
                if item and item != "self":
                    found.append((g.group(1), g.group(2) + "::" + item.split("::{")[0]))
                elif item == "self":
                    found.append((g.group(1), g.group(2)))
        for p in PATH.finditer(text):
            found.append((p.group(1), p.group(2)))
        for root, rest in found:
            t = resolve(m, root, rest, mods, is_mod_file)
            if t is None or t == m or t == "":
                continue
            if m.startswith(t + "::"):
                continue  # a module may use its ancestors
            out[m].add(t)
    return out


def cycles(g):
    index, low, on, stack, sccs, n = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in g[v]:
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
                sccs.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(g):
        if v not in index:
            visit(v)
    return sccs


def under(m, prefix):
    return m == prefix or m.startswith(prefix + "::")


def main():
    mods = modules()
    g = edges(mods)
    bad = []
    for comp in cycles(g):
        inner = [f"{a} -> {b}" for a in comp for b in sorted(g[a]) if b in comp]
        bad.append("cycle: " + ", ".join(inner))
    for a in sorted(g):
        for b in sorted(g[a]):
            for frm, to, why in NEVER:
                if under(a, frm) and under(b, to):
                    bad.append(f"forbidden: {a} -> {b} ({why})")
            for target, allowed, why in ONLY:
                if under(b, target) and not under(a, allowed):
                    bad.append(f"forbidden: {a} -> {b} ({why})")
    if "--dot" in sys.argv:
        print("digraph imports {")
        for a in sorted(g):
            for b in sorted(g[a]):
                print(f'  "{a}" -> "{b}";')
        print("}")
    for line in bad:
        print(line)
    arrows = sum(len(v) for v in g.values())
    print(f"check-imports: {len(mods)} modules, {arrows} arrows, {len(bad)} problems", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
