#!/usr/bin/env python3
"""Check the relative links of the README and docs/: every `[text](path)` and `[text](path#anchor)`
names a file of the repository, and every anchor a heading of that file (GitHub's slugs: lower
case, punctuation but `-` and `_` dropped, spaces to `-`). Links with a scheme (https:, mailto:)
are not followed. Exit 1 with one line per broken link.

    python3 scripts/doc-links.py              # check README.md and docs/*.md
    python3 scripts/doc-links.py --self-test  # show that a planted broken link and anchor are found
"""
import os
import re
import sys
import tempfile

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*```")


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path):
    out, seen, fenced = set(), {}, False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if FENCE.match(line):
                fenced = not fenced
                continue
            m = re.match(r"^#{1,6} (.*)", line)
            if m and not fenced:
                base = slug(m.group(1))
                n = seen.get(base, 0)
                seen[base] = n + 1
                out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path):
    fenced = False
    with open(path, encoding="utf-8") as f:
        for no, line in enumerate(f, 1):
            if FENCE.match(line):
                fenced = not fenced
                continue
            if fenced:
                continue
            for m in LINK.finditer(line):
                yield no, m.group(1)


def check(root, files):
    bad = []
    for doc in files:
        for no, target in links(doc):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = doc if path == "" else os.path.normpath(os.path.join(os.path.dirname(doc), path))
            rel = os.path.relpath(doc, root)
            if not os.path.exists(dest):
                bad.append(f"{rel}:{no}: {target}: no such file")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                bad.append(f"{rel}:{no}: {target}: no heading with that anchor")
    return bad


def docs_of(root):
    files = [os.path.join(root, "README.md")]
    d = os.path.join(root, "docs")
    files += sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".md"))
    return files


def self_test():
    with tempfile.TemporaryDirectory() as t:
        os.mkdir(os.path.join(t, "docs"))
        with open(os.path.join(t, "docs", "a.md"), "w") as f:
            f.write("# A page\n\n## Dump and restore\n")
        with open(os.path.join(t, "README.md"), "w") as f:
            f.write("[ok](docs/a.md#dump-and-restore) [ok2](#x)\n# X\n"
                    "[gone](docs/missing.md) [anchor](docs/a.md#nowhere)\n"
                    "```\n[in a fence](docs/ignored.md)\n```\n")
        bad = check(t, docs_of(t))
    want = ["README.md:3: docs/missing.md: no such file",
            "README.md:3: docs/a.md#nowhere: no heading with that anchor"]
    if bad != want:
        print("self-test FAILED: found", bad, "expected", want)
        return 1
    print("self-test passed: the planted broken file and anchor are found, fenced and good links are not")
    return 0


def main():
    if "--self-test" in sys.argv:
        return self_test()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    bad = check(root, docs_of(root))
    for b in bad:
        print(b)
    if bad:
        print(f"{len(bad)} broken link(s) in README.md and docs/")
        return 1
    print("doc links: every relative link of README.md and docs/ resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
