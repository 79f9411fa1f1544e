#!/usr/bin/env python3
"""Why the LLM agent's answers fail: classes of the wrong answers in `agl eval --rows` reports.

Each question of a report (`questions[]`, written by `agl eval --agent llm --rows`) is one of:
right; flagged (a violation); ran but answered wrong (it has a schema-linking score); or did not
run. A final query that did not run is executed again here, read-only, on its Spider database
(Python's sqlite3), and classed by SQLite's error: `no such column` with a qualified name
(`T2.name`: the column is in another table of the join than the alias names), `no such column`
unqualified, `no such table`, `misuse of aggregate`, `interrupted` (still running after
--sql-timeout seconds), and the rest by their message up to its first `:` or `(`.

Usage: eval_error_classes.py REPORT.json [REPORT.json ...] [--data DIR] [--examples N]
       [--sql-timeout SECONDS]
`--data` is the Spider directory (`database/<db_id>/<db_id>.sqlite`; default: $AGL_DATA, else
./data/spider). Exits 1 with a message on a missing or malformed report or data directory.
"""

import argparse
import collections
import json
import os
import re
import sqlite3
import sys
import time


def load_rows(path):
    try:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"eval_error_classes: {path}: {e}")
    rows = report.get("questions") if isinstance(report, dict) else None
    if not isinstance(rows, list):
        sys.exit(f"eval_error_classes: {path}: no `questions` rows (run `agl eval` with --rows)")
    return rows


def sqlite_error(data, db_id, sql, timeout):
    """SQLite's error for `sql` on `db_id`, or None when it runs; a statement still running after
    `timeout` seconds is interrupted (as `agl eval --sql-timeout` does) and reported as such."""
    db = os.path.join(data, "database", db_id, f"{db_id}.sqlite")
    if not os.path.isfile(db):
        return f"database not found: {db}"
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    deadline = time.monotonic() + timeout
    con.set_progress_handler(lambda: time.monotonic() > deadline, 10_000)
    try:
        con.execute(sql).fetchall()
        return None
    except sqlite3.Error as e:
        return str(e)
    finally:
        con.close()


def error_class(message):
    if message.startswith("no such column"):
        name = message.split(":", 1)[-1].strip()
        return "no such column, qualified (alias or table mix-up)" if "." in name else (
            "no such column, unqualified")
    for known in ("no such table", "misuse of aggregate", "interrupted"):
        if message.startswith(known):
            return known
    return re.sub(r"[:(].*", "", message).strip() or message


def classify(rows, data, timeout):
    classes = collections.Counter()
    examples = collections.defaultdict(list)
    for row in rows:
        if row.get("correct"):
            classes["right"] += 1
        elif row.get("sql_violations") or row.get("llm_violations"):
            classes["flagged (violation)"] += 1
        elif row.get("schema_linking") is not None:
            classes["ran, wrong answer"] += 1
        elif not row.get("final_sql"):
            classes["did not run: no query"] += 1
        else:
            message = sqlite_error(data, row.get("db_id", ""), row["final_sql"], timeout)
            key = "did not run: " + (error_class(message) if message else "runs here")
            classes[key] += 1
            examples[key].append((row.get("index"), message, row["final_sql"]))
    return classes, examples


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+")
    parser.add_argument("--data", default=os.environ.get("AGL_DATA", "data/spider"))
    parser.add_argument("--examples", type=int, default=1, help="examples printed per class")
    parser.add_argument("--sql-timeout", type=float, default=2.0,
                        help="seconds before a statement is interrupted (agl's default: 2)")
    args = parser.parse_args()
    if not os.path.isdir(os.path.join(args.data, "database")):
        sys.exit(f"eval_error_classes: {args.data}: not a Spider directory (no database/)")
    for path in args.reports:
        rows = load_rows(path)
        classes, examples = classify(rows, args.data, args.sql_timeout)
        print(f"{path}: {len(rows)} questions")
        for key, n in sorted(classes.items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"  {n:5}  {n / max(len(rows), 1):6.1%}  {key}")
            for index, message, sql in examples.get(key, [])[: args.examples]:
                one_line = " ".join(sql.split())
                print(f"           e.g. dev #{index}: {message}: {one_line[:110]}")


if __name__ == "__main__":
    main()
