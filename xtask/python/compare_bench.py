#!/usr/bin/env python3
"""Two `cargo xtask bench` runs side by side, row by row, as one Markdown table.

    python3 xtask/python/compare_bench.py BEFORE.json AFTER.json [--names before after]

For each row both runs measured (shape, mask, model, call, phase): each run's median time of
ours and its ratio to the fastest reference of the same run (as the bench's own table computes
them), then after / before of ours. A ratio is only
ever taken inside one run, between sides measured in turns on the same threads; the last
column compares two runs, so it carries the machine's drift between them.
"""

import argparse
import json
import sys


def rows(path):
    """{(shape, mask, model, call, phase): (ours ms, ours / fastest reference)} of one run, as the
    bench's own table computes them: ours' median over all its samples, and the fastest of the
    reference's medians for the same case and phase."""
    with open(path) as f:
        run = json.load(f)
    references = (run.get("reference") or {}).get("results") or []
    found = {}
    for row in run["rows"]:
        if row["series"] != "sweep":
            continue
        case = row["case"]
        s = case["shape"]
        shape = f"{s['batch']},{s['seq_len']},{s['features']},{s['heads']}x{s['key_dim']}"
        ours = row["timing"]["median_ms"]
        times = [r["median_ms"] for r in references
                 if r.get("case") == case and r.get("phase") == row["phase"] and r.get("median_ms")]
        key = (shape, case["mask"], case["model"], case["call"], row["phase"])
        found[key] = (ours, ours / min(times) if times else None)
    return found, run.get("processor", {}).get("model", "?")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--names", nargs=2, default=["before", "after"])
    args = parser.parse_args()
    (a, model_a), (b, model_b) = rows(args.before), rows(args.after)
    if model_a != model_b:
        print(f"note: the runs name two processors: {model_a!r} and {model_b!r}", file=sys.stderr)
    first, second = args.names
    print(f"| shape | mask | model | phase | {first} ms | {first} / fastest | {second} ms | {second} / fastest | {second} / {first} |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|")
    ratio = lambda r: "-" if r is None else f"{r:.2f}"
    for key in sorted(set(a) & set(b), key=lambda k: (list(a).index(k))):
        shape, mask, model, call, phase = key
        (ms_a, r_a), (ms_b, r_b) = a[key], b[key]
        label = model if call == "plain" else f"{model} {call}"
        print(f"| {shape} | {mask} | {label} | {phase} | {ms_a:.2f} | {ratio(r_a)} | {ms_b:.2f} | {ratio(r_b)} | {ms_b / ms_a:.2f} |")


if __name__ == "__main__":
    main()
