#!/usr/bin/env python3
"""Fails when a function in src/ is longer than LIMIT lines without a reason at its head.

    scripts/long-functions.py [--limit N] [SRC_DIR]     (default: 120 lines, src/)
    scripts/long-functions.py --self-test

A function's length runs from its `fn` line to its closing brace. A reason is a comment line
starting with `Long:` (`/// Long: ...` or `// Long: ...`) among the comment and attribute lines
right above it. Prints each long function without one (file:line, name, length) and exits 1;
prints the longest ones and exits 0 otherwise.
"""
import os
import re
import sys

FN = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?(?:extern\s+(?:\"[^\"]*\"\s*)?)?fn\s+([A-Za-z_][A-Za-z0-9_]*)")


def code_only(line, state):
    """The line with strings, chars and comments blanked; `state` carries a block comment."""
    out, i, n = [], 0, len(line)
    while i < n:
        if state["block"]:
            j = line.find("*/", i)
            if j < 0:
                return "".join(out)
            state["block"], i = False, j + 2
            continue
        c = line[i]
        if line.startswith("//", i):
            break
        if line.startswith("/*", i):
            state["block"], i = True, i + 2
            continue
        if c == '"' or (c == "r" and re.match(r'r#*"', line[i:])):
            m = re.match(r'r(#*)"', line[i:])
            if m:
                end = '"' + m.group(1)
                j = line.find(end, i + len(m.group(0)))
                if j < 0:
                    state["raw"] = end
                    return "".join(out)
                i = j + len(end)
                continue
            j = i + 1
            while j < n and line[j] != '"':
                j += 2 if line[j] == "\\" else 1
            if j >= n:
                state["str"] = True
                return "".join(out)
            i = j + 1
            continue
        if c == "'" and re.match(r"'(\\.|[^\\'])'", line[i:]):
            i += len(re.match(r"'(\\.|[^\\'])'", line[i:]).group(0))
            continue
        out.append(c)
        i += 1
    return "".join(out)


def functions(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    state = {"block": False, "str": False, "raw": None}
    code = []
    for line in lines:
        if state["raw"]:
            j = line.find(state["raw"])
            if j < 0:
                code.append("")
                continue
            line, state["raw"] = line[j + len(state["raw"]):], None
        if state["str"]:
            j = 0
            while j < len(line) and line[j] != '"':
                j += 2 if line[j] == "\\" else 1
            if j >= len(line):
                code.append("")
                continue
            line, state["str"] = line[j + 1:], False
        code.append(code_only(line, state))
    out = []
    for i, line in enumerate(lines):
        m = FN.match(code[i]) if code[i].strip() else None
        if not m:
            continue
        depth, started, end = 0, False, None
        for j in range(i, len(lines)):
            for ch in code[j]:
                if ch == "{":
                    depth, started = depth + 1, True
                elif ch == "}":
                    depth -= 1
                elif ch == ";" and not started and depth == 0:
                    end = j  # a declaration without a body
                    break
            if end is not None or (started and depth == 0):
                end = j
                break
        if end is None or not started:
            continue
        head, k = [], i - 1
        while k >= 0 and (lines[k].strip().startswith(("///", "//", "#[")) or lines[k].strip() == ""):
            if lines[k].strip() == "":
                break
            head.append(lines[k].strip())
            k -= 1
        reason = any(re.match(r"^//+!?\s*Long:", h) for h in head)
        out.append((path, i + 1, m.group(1), end - i + 1, reason))
    return out


def scan(src, limit):
    found = []
    for root, _, files in os.walk(src):
        for f in sorted(files):
            if f.endswith(".rs"):
                found.extend(functions(os.path.join(root, f)))
    return [f for f in found if f[3] > limit], found


def self_test():
    import tempfile

    body = "\n".join(f'    let s{i} = "{{ not a brace }}"; // }} nor this' for i in range(10))
    src = (
        "fn short() {\n    let c = '}';\n}\n\n"
        f"/// Long: a reason.\nfn excused() {{\n{body}\n}}\n\n"
        f'#[inline]\npub extern "C-unwind" fn long() {{\n{body}\n}}\n'
    )
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "a.rs"), "w") as f:
            f.write(src)
        bad, all_fns = scan(d, 8)
    unexcused = [b[2] for b in bad if not b[4]]
    ok = unexcused == ["long"] and {f[2]: f[3] for f in all_fns} == {"short": 3, "excused": 12, "long": 12}
    print("self-test: " + ("the long function found, the excused and the short ones not" if ok else f"FAILED: {bad} {all_fns}"))
    return ok


def main():
    args = sys.argv[1:]
    if args == ["--self-test"]:
        sys.exit(0 if self_test() else 1)
    limit = 120
    if args[:1] == ["--limit"]:
        limit, args = int(args[1]), args[2:]
    src = args[0] if args else os.path.join(os.path.dirname(__file__), "..", "src")
    bad, found = scan(src, limit)
    unexcused = [b for b in bad if not b[4]]
    for path, line, name, n, _ in sorted(unexcused, key=lambda b: -b[3]):
        print(f"{os.path.relpath(path)}:{line}: fn {name} is {n} lines (limit {limit}; give a reason at its head with a `Long:` comment, or split it)")
    if unexcused:
        sys.exit(1)
    longest = sorted(found, key=lambda f: -f[3])[:5]
    print(f"no function over {limit} lines without a reason; longest: " + ", ".join(f"{f[2]} {f[3]}{' (excused)' if f[4] else ''}" for f in longest))


if __name__ == "__main__":
    main()
