"""Does the Python execution match (spider_sql.py) agree with agl's evaluator?

For Spider questions selected by ``agl spider tasks`` (dev and train), it builds pairs of
(gold, predicted) SQL and scores each pair twice: with ``spider_sql.reward`` and with
``agl spider score`` (agl-spider's executor and ``execution_match``, as the built-in agent's
reward). Every verdict must agree. The predicted SQL of a question is:

- its gold SQL (must match);
- the gold SQL of another question on the same database (mostly no match);
- perturbations of its gold: ``LIMIT 1`` appended, ``DISTINCT`` added, the columns of a
  two-column select list swapped, the top-level ``ORDER BY`` removed, a misspelt table (an
  error on both sides), ``SELECT 1`` (wrong shape).

It also checks that ``spider_sql.write_messages`` gives exactly the messages agl's built-in
agent sends (``agl spider tasks --messages``).

Usage: python test_match.py --agl PATH/TO/agl [--dev-every 4] [--train-every 35]
Exit status 0 when everything agrees; the counts are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import zlib
from collections import defaultdict
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spider_sql  # noqa: E402


def tasks(agl: str, *flags: str) -> List[Dict[str, Any]]:
    out = subprocess.run([agl, "spider", "tasks", "--messages", *flags], check=True, capture_output=True, text=True)
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def perturbations(gold: str) -> Dict[str, str]:
    g = gold.strip().rstrip(";")
    out: Dict[str, str] = {"gold": g, "select_1": "SELECT 1"}
    if not re.search(r"\blimit\b", g, re.I):
        out["limit_1"] = g + " LIMIT 1"
    if re.match(r"(?is)^\s*select\s+(?!distinct\b)", g):
        out["distinct"] = re.sub(r"(?is)^\s*select\s+", "SELECT DISTINCT ", g, count=1)
    m = re.match(r"(?is)^\s*select\s+([^,()]+?)\s*,\s*([^,()]+?)\s+from\s+(.*)$", g)
    if m and not re.search(r"\bdistinct\b", m.group(1), re.I):
        out["swap_columns"] = f"SELECT {m.group(2)}, {m.group(1)} FROM {m.group(3)}"
    m = re.match(r"(?is)^(.*\S)\s+order\s+by\s+[^()]*$", g)
    if m and "(" not in g and not re.search(r"\blimit\b", g, re.I):
        out["no_order_by"] = m.group(1)
    m = re.search(r"(?i)\bfrom\s+([A-Za-z_][A-Za-z0-9_]*)", g)
    if m:
        out["bad_table"] = g[: m.start(1)] + m.group(1) + "_nope" + g[m.end(1) :]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agl", required=True)
    ap.add_argument("--dev-every", type=int, default=4)
    ap.add_argument("--train-every", type=int, default=35)
    args = ap.parse_args()

    questions = tasks(args.agl, "--split", "dev", "--every", str(args.dev_every)) + tasks(
        args.agl, "--split", "train", "--every", str(args.train_every)
    )
    prompt_mismatch = [
        t["id"] for t in questions if spider_sql.write_messages(t["schema"], t["question"]) != t["messages"]
    ]

    by_db: Dict[str, List[Dict[str, Any]]] = defaultdict(list)
    for t in questions:
        by_db[t["db_id"]].append(t)
    pairs: List[Dict[str, Any]] = []
    for t in questions:
        for kind, sql in perturbations(t["gold"]).items():
            pairs.append({"id": t["id"], "kind": kind, "db_id": t["db_id"], "db_path": t["db_path"], "gold": t["gold"], "predicted": sql})
        others = [o for o in by_db[t["db_id"]] if o["id"] != t["id"]]
        if others:
            other = others[zlib.crc32(t["id"].encode()) % len(others)]
            pairs.append({"id": t["id"], "kind": "other_gold", "db_id": t["db_id"], "db_path": t["db_path"], "gold": t["gold"], "predicted": other["gold"]})

    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for p in pairs:
            f.write(json.dumps(p) + "\n")
        path = f.name
    try:
        out = subprocess.run([args.agl, "spider", "score", "--in", path], check=True, capture_output=True, text=True)
    finally:
        os.unlink(path)
    scored = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    assert len(scored) == len(pairs), (len(scored), len(pairs))

    agree = 0
    disagreements = []
    per_kind: Dict[str, List[int]] = defaultdict(lambda: [0, 0, 0])  # pairs, agl matches, agreements
    for p, s in zip(pairs, scored):
        py_reward, py_error = spider_sql.reward(p["db_path"], p["gold"], p["predicted"])
        agl_match = bool(s["match"])
        k = per_kind[p["kind"]]
        k[0] += 1
        k[1] += int(agl_match)
        same = (py_reward == 1.0) == agl_match and ((py_error is None) == ("error" not in s))
        if same:
            agree += 1
            k[2] += 1
        else:
            disagreements.append({**p, "agl": s.get("match"), "agl_error": s.get("error"), "python": py_reward, "python_error": py_error})

    print(f"{len(questions)} questions ({len(by_db)} databases), {len(pairs)} pairs")
    print(f"{'kind':<14}{'pairs':>7}{'match (agl)':>13}{'agree':>7}")
    for kind, (n, m, a) in sorted(per_kind.items()):
        print(f"{kind:<14}{n:>7}{m:>13}{a:>7}")
    print(f"agree on {agree} of {len(pairs)} pairs (match and error); prompts equal for "
          f"{len(questions) - len(prompt_mismatch)} of {len(questions)} questions")
    for d in disagreements[:20]:
        print("DISAGREE", json.dumps(d))
    for rid in prompt_mismatch[:5]:
        print("PROMPT DIFFERS", rid)
    return 0 if not disagreements and not prompt_mismatch else 1


if __name__ == "__main__":
    sys.exit(main())
