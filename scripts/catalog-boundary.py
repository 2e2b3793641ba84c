#!/usr/bin/env python3
"""Fails when SQL on pg_tide's own tables is written outside src/catalog/ (issue 48).

    scripts/catalog-boundary.py [SRC_DIR]      (default: src/ of this repository)
    scripts/catalog-boundary.py --self-test    shows that the check finds what it must (and
                                               nothing where there is nothing)

`catalog/mod.rs` promises that every statement on pg_tide's tables goes through `catalog/`.
pg_tide's tables are the ones `schema/*.sql` creates (`CREATE TABLE tide.x`). A violation is a
string literal of a `.rs` file outside `catalog/` and `schema/` (where the DDL lives) in which such a table
follows FROM, JOIN, INTO, UPDATE, TABLE or DELETE FROM (in capitals, as pg_tide writes SQL:
"the table tide.outbox" in a message is prose). Not counted: comments; a line that
builds a hint or a remedy for the user (`.hint(`, `remedy`), whose SQL is advice, not a
statement; test modules (from a `mod tests {` line on, and `*tests.rs` files).
Prints each violation (file:line, table) and exits 1; exits 0 when there is none.
"""
import os
import re
import sys

SQL = r"(?:FROM|JOIN|INTO|UPDATE|TABLE|DELETE\s+FROM)\s+tide\.({names})\b"


def tables(src):
    """pg_tide's tables, from the DDL of schema/*.sql."""
    d = os.path.join(src, "schema")
    text = "".join(
        open(os.path.join(d, f), encoding="utf-8").read() for f in sorted(os.listdir(d)) if f.endswith(".sql")
    )
    return sorted(set(re.findall(r"CREATE\s+(?:UNLOGGED\s+)?TABLE\s+tide\.([a-z_]+)", text)))


def strings_of(line, state):
    """The text inside string literals on this line (a literal may span lines: `state`)."""
    out, i, n = [], 0, len(line)
    while i < n:
        if state.get("in"):
            end = state["in"]
            j = i
            while j < n:
                if end == '"' and line[j] == "\\":
                    j += 2
                    continue
                if line.startswith(end, j):
                    break
                j += 1
            out.append(line[i:j])
            if j >= n:
                return " ".join(out)
            state["in"], i = None, j + len(end)
            continue
        if line.startswith("//", i):
            break
        m = re.match(r'r(#*)"', line[i:])
        if m:
            state["in"], i = '"' + m.group(1), i + len(m.group(0))
            continue
        if line[i] == '"':
            state["in"], i = '"', i + 1
            continue
        if line[i] == "'" and re.match(r"'(\\.|[^\\'])'", line[i:]):
            i += len(re.match(r"'(\\.|[^\\'])'", line[i:]).group(0))
            continue
        i += 1
    return " ".join(out)


def violations(src):
    names = tables(src)
    if not names:
        return [("schema/", 0, "no CREATE TABLE tide.x found")]
    pattern = re.compile(SQL.format(names="|".join(names)))
    found = []
    for root, _, files in os.walk(src):
        for f in sorted(files):
            path = os.path.join(root, f)
            rel = os.path.relpath(path, src)
            if not f.endswith(".rs") or f.endswith("tests.rs"):
                continue
            if rel.split(os.sep)[0] in ("catalog", "schema"):
                continue
            state = {}
            for no, line in enumerate(open(path, encoding="utf-8"), 1):
                if re.match(r"\s*(pub(\([^)]*\))?\s+)?mod tests\s*\{", line):
                    break
                text = strings_of(line, state)
                if ".hint(" in line or "remedy" in line:
                    continue
                for m in pattern.finditer(text):
                    found.append((rel, no, "tide." + m.group(1)))
    return found


def self_test():
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "catalog"))
        os.makedirs(os.path.join(d, "api"))
        os.makedirs(os.path.join(d, "schema"))
        open(os.path.join(d, "schema", "catalog.sql"), "w").write(
            "CREATE TABLE tide.pipeline (name text); CREATE UNLOGGED TABLE tide.outbox ();\n"
        )
        open(os.path.join(d, "catalog", "pipelines.rs"), "w").write(
            'sql::one("SELECT 1 FROM tide.pipeline");\n'
        )
        open(os.path.join(d, "api", "good.rs"), "w").write(
            "// SELECT * FROM tide.pipeline in a comment\n"
            'e.hint("run DELETE FROM tide.outbox WHERE pipeline = \'p\'");\n'
            'sql::one("SELECT tide.pipeline_row_count()");\n'
            "mod tests {\n"
            'sql::one("SELECT 1 FROM tide.pipeline");\n'
            "}\n"
        )
        if violations(d):
            print("self-test: a violation found where there is none:", violations(d))
            return 1
        open(os.path.join(d, "api", "bad.rs"), "w").write(
            'sql::exec(\n    "DELETE FROM tide.outbox WHERE pipeline = $1",\n);\n'
            'sql::one(r#"SELECT n\n   FROM tide.pipeline p"#);\n'
        )
        got = sorted((f, n, t) for f, n, t in violations(d))
        want = [
            (os.path.join("api", "bad.rs"), 2, "tide.outbox"),
            (os.path.join("api", "bad.rs"), 5, "tide.pipeline"),
        ]
        if got != want:
            print("self-test: found", got, "expected", want)
            return 1
    print("self-test: ok (finds SQL on pg_tide's tables outside catalog/, and nothing else)")
    return 0


def main():
    args = sys.argv[1:]
    if args == ["--self-test"]:
        return self_test()
    src = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    found = violations(src)
    for f, n, t in found:
        print(f"{f}:{n}: SQL on {t} outside catalog/ (move the statement into src/catalog/)")
    if found:
        return 1
    print(f"every statement on pg_tide's tables ({len(tables(src))}) is in catalog/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
