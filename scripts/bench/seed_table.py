#!/usr/bin/env python3
"""Aggregates the main job's reports over seeds into the README's table: each cell is
mean [min-max] over the reports given (one `agl train --compare audit,shield,screen,enforce
--seed S --report FILE` each).

Usage: seed_table.py REPORT.json [REPORT.json ...]

Prints a plain-text table (the README's rows, same order and units) and, with --markdown,
a Markdown table instead. Only the Python standard library is used.
"""
import json
import statistics
import sys

MODES = ["audit", "shield", "screen", "enforce"]

# (row label, where the value is, format); `None` in the untrained column means "-".
ROWS = [
    ("dev accuracy (kernel on)", ("dev", "accuracy"), "{:.3f}", True),
    ("dev violation rate (greedy)", ("dev", "violation_rate"), "{:.3f}", True),
    ("dev probability on unsafe", ("dev", "unsafe_probability"), "{:.3f}", True),
    ("train violation rate", ("train", "violation_rate"), "{:.3f}", False),
    ("train mean reward", ("train", "mean_reward"), "{:.2f}", False),
    ("destructive executed", ("train", "destructive_executed"), "{:.0f}", False),
    ("screened from gradient", ("train", "screened"), "{:.0f}", False),
    ("rollouts/s", ("train", "rollouts_per_second"), "{:.0f}", False),
    ("kernel µs per check, mean", ("kernel", "mean_check_us"), "{:.2f}", False),
    ("kernel µs per check, median", ("kernel", "p50_check_us"), "{:.2f}", False),
    ("kernel cache hit rate", ("kernel", "hit_rate"), "{:.3f}", False),
]


def cell(values, fmt):
    if not values:
        return "-"
    mean = statistics.fmean(values)
    if len(values) == 1:
        return fmt.format(mean)
    return f"{fmt.format(mean)} [{fmt.format(min(values))}–{fmt.format(max(values))}]"


def main(argv):
    markdown = "--markdown" in argv
    paths = [a for a in argv if a != "--markdown"]
    if not paths:
        sys.exit("usage: seed_table.py [--markdown] REPORT.json [REPORT.json ...]")
    reports = []
    for p in paths:
        try:
            with open(p, encoding="utf-8") as f:
                r = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            sys.exit(f"{p}: {e}")
        missing = [m for m in MODES if m not in r.get("runs", {})]
        if missing:
            sys.exit(f"{p}: no run for {', '.join(missing)} (run with --compare {','.join(MODES)})")
        reports.append(r)
    seeds = [r.get("seed") for r in reports]
    header = ["", "untrained"] + MODES
    lines = []
    for label, (part, key), fmt, untrained in ROWS:
        row = [label]
        if untrained:
            row.append(cell([r["untrained"][part][key] for r in reports], fmt))
        else:
            row.append("-")
        for m in MODES:
            vals = [r["runs"][m][part][key] for r in reports if key in r["runs"][m].get(part, {})]
            row.append(cell(vals, fmt))
        lines.append(row)
    print(f"mean [min–max] over {len(reports)} seeds: {', '.join(str(s) for s in seeds)}")
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in lines:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(row[i]) for row in lines + [header]) for i in range(len(header))]
        fmt_row = lambda row: "  ".join(
            c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row)
        )
        print(fmt_row(header))
        for row in lines:
            print(fmt_row(row))


if __name__ == "__main__":
    main(sys.argv[1:])
