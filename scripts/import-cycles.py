#!/usr/bin/env python3
"""Fails when the modules of src/ import each other in a cycle.

    scripts/import-cycles.py [SRC_DIR]      (default: src/ of this repository)
    scripts/import-cycles.py --self-test    shows that the check finds a cycle it must find
                                            (and none where there is none)

A module is a file (src/a/b.rs and src/a/b/mod.rs are module a::b). An edge A -> B is a path
that names B in A's code: `use crate::...`, `crate::...::x` written inline, `super::...`, or
`self::...`, resolved to the longest module prefix that exists. A `mod x;` declaration is not
an edge, and neither is a child naming its own ancestors (a parent module is its children's
interface: `target::table` may use `target::Target`), but a parent naming a child is.
Comments, strings and `#[cfg(test)]` modules of their own files (`*tests.rs`) are read too:
tests are code. Prints each cycle (a strongly connected set of two or more modules, with one
cycle through it) and exits 1; prints the layer order and exits 0 when there is none.
"""
import os
import re
import sys


def modules(src):
    mods = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(root, f)
            rel = os.path.relpath(path, src)[:-3].split(os.sep)
            if rel[-1] in ("mod", "lib", "main"):
                rel = rel[:-1]
            mods[tuple(rel)] = path
    return mods


PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+|::\{)")
USE_GROUP = re.compile(r"\buse\s+(crate|super|self)::([^;]*);", re.S)


def strip(code):
    # Line and block comments, then string literals (a path in a message is not an import).
    code = re.sub(r"//[^\n]*", "", code)
    code = re.sub(r"/\*.*?\*/", "", code, flags=re.S)
    code = re.sub(r'r#*"(?:.|\n)*?"#*', '""', code)
    code = re.sub(r'"(?:\\.|[^"\\])*"', '""', code)
    return code


def expand(prefix, tail):
    """Paths of a use tree `a::{b, c::{d}}` (tail without the leading `crate::`)."""
    out = []
    tail = tail.strip()
    m = re.match(r"^([A-Za-z0-9_:]*?)(?:::)?\{(.*)\}$", tail, re.S)
    if not m:
        out.append(prefix + [p for p in tail.split("::") if p and p not in ("*",) and " as " not in p])
        return out
    head = [p for p in m.group(1).split("::") if p]
    depth, cur, parts = 0, "", []
    for ch in m.group(2):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    for p in parts:
        p = p.strip()
        if p:
            out.extend(expand(prefix + head, re.sub(r"\s+as\s+\w+$", "", p)))
    return out


def resolve(mods, path):
    for n in range(len(path), -1, -1):
        if tuple(path[:n]) in mods:
            return tuple(path[:n])
    return ()


def edges(mods, me, code):
    out = set()
    base = {"crate": [], "self": list(me), "super": list(me[:-1])}

    def add(kind, rest):
        start = list(base[kind])
        while rest and rest[0] == "super":
            start, rest = start[:-1], rest[1:]
        target = resolve(mods, start + rest)
        if target != me and me[: len(target)] != target:
            out.add(target)

    for m in USE_GROUP.finditer(code):
        for p in expand([], m.group(2)):
            add(m.group(1), [x.strip() for x in p if x.strip() and x.strip() != "self"])
    for m in PATH.finditer(USE_GROUP.sub("", code)):
        rest = [p for p in m.group(2).split("::") if p and p != "{"]
        add(m.group(1), rest)
    return out


def sccs(graph):
    index, low, on, stack, out, n = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
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
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def cycle_in(graph, comp):
    comp = set(comp)
    start = sorted(comp)[0]
    path, seen = [start], {start}
    # Depth-first search for a path back to start within the component.
    def dfs(v):
        for w in sorted(graph[v]):
            if w == start and len(path) > 1:
                return True
            if w in comp and w not in seen:
                seen.add(w)
                path.append(w)
                if dfs(w):
                    return True
                path.pop()
        return False
    dfs(start)
    return path + [start]


def name(m):
    return "::".join(m) or "crate"


def cycles(src):
    mods = modules(src)
    graph = {}
    for m, path in mods.items():
        with open(path, encoding="utf-8") as f:
            graph[m] = edges(mods, m, strip(f.read()))
    return mods, graph, [c for c in sccs(graph) if len(c) > 1]


def self_test():
    """A tree with a cycle hidden in each way a path can name a module, and its fixed form."""
    import tempfile

    cases = {
        # a -> b by `use crate::`, b -> a by an inline `crate::` path.
        "use": {"lib.rs": "mod a; mod b;", "a.rs": "use crate::b::f;", "b.rs": "fn g() { crate::a::h() }"},
        # Siblings through `super::` and a use group.
        "super": {"lib.rs": "mod w;", "w/mod.rs": "mod x; mod y;",
                  "w/x.rs": "use super::{y::Y, z};", "w/y.rs": "fn f() { super::x::g() }"},
        # A parent naming its child, the child naming a sibling that names the parent's child.
        "parent": {"lib.rs": "mod s; mod t;", "s/mod.rs": "mod k; fn f() { k::g() } use crate::t;",
                   "s/k.rs": "use crate::t::T;", "t.rs": "use crate::s::k::K;"},
    }
    clean = {"lib.rs": "mod a; mod b;", "a.rs": "use crate::b::f; // crate::a::x\n",
             "b.rs": 'fn g() { let s = "crate::a::h"; } use super::b;'}
    ok = True
    for label, files in list(cases.items()) + [("clean", clean)]:
        with tempfile.TemporaryDirectory() as d:
            for rel, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
                with open(os.path.join(d, rel), "w") as f:
                    f.write(text)
            found = cycles(d)[2]
            want = label != "clean"
            if bool(found) != want:
                print(f"self-test {label}: {'missed the cycle' if want else 'found a cycle that is not there'}")
                ok = False
    print("self-test: " + ("every cycle found, none invented" if ok else "FAILED"))
    return ok


def main():
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(0 if self_test() else 1)
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "src")
    mods, graph, bad = cycles(src)
    if bad:
        for c in bad:
            print(f"import cycle among {len(c)} modules: {', '.join(sorted(name(m) for m in c))}")
            print("  for example: " + " -> ".join(name(m) for m in cycle_in(graph, c)))
        sys.exit(1)
    print(f"no import cycle among {len(mods)} modules of {os.path.normpath(src)}")


if __name__ == "__main__":
    main()
