#!/usr/bin/env python3
"""Sums ncu's per-launch kernel times by kernel (scripts/gpu_run.sh's profile step):
    ncu_table.py NCU_CSV
NCU_CSV: `ncu --csv --metrics gpu__time_duration.sum ...` output. Prints a table of every kernel
(launches, total and mean microseconds, share of the total, grid x block of its largest launch)
and the totals per decode token, counting tokens by the RoPE + KV store kernel (one launch per
layer and token in a one-sequence decode) over the layers whose attention ran."""
import csv
import re
import sys
from collections import defaultdict

rows = []
with open(sys.argv[1], newline="") as f:
    lines = [l for l in f if l.startswith('"')]  # ncu prints its own lines before the CSV
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    value = float(r["Metric Value"].replace(",", ""))
    unit = r.get("Metric Unit", "nsecond")
    us = value / 1000 if unit.startswith("n") else value * 1000 if unit.startswith("m") else value
    name = r["Kernel Name"].replace("(anonymous namespace)::", "").replace("ember::cuda::", "")
    name = re.sub(r"^void ", "", re.sub(r"\(.*", "", name)).strip()
    rows.append((name, us, r.get("Grid Size", ""), r.get("Block Size", "")))
if not rows:
    print("no kernel times in", sys.argv[1])
    sys.exit(1)
by = defaultdict(lambda: [0, 0.0, "", 0])
for name, us, grid, block in rows:
    k = by[name]
    k[0] += 1
    k[1] += us
    size = 1
    for d in re.findall(r"\d+", grid):
        size *= int(d)
    if size >= k[3]:
        k[2], k[3] = f"{grid} x {block}", size
total = sum(k[1] for k in by.values())
print("| kernel | launches | total us | mean us | share | largest grid x block |")
print("| --- | ---: | ---: | ---: | ---: | --- |")
for name, (n, us, shape, _) in sorted(by.items(), key=lambda kv: -kv[1][1]):
    print(f"| {name} | {n} | {us:.1f} | {us / n:.2f} | {100 * us / total:.1f} % | {shape} |")
print(f"| total | {len(rows)} | {total:.1f} | | 100 % | |")
ropes = sum(n for name, (n, _, _, _) in by.items() if "rope_store" in name)
# Tokens: the RoPE + KV store launches over the layers of one token (every layer's attention is
# on the GPU when all of the model is); ask the caller for the layer count otherwise.
n_layer = int(sys.argv[2]) if len(sys.argv) > 2 else 32
tokens = ropes / n_layer if ropes else 0
if tokens:
    print(f"per token ({tokens:.2f} tokens of {n_layer} layers in the window): {total / tokens:.1f} us of kernels, "
          f"{len(rows) / tokens:.0f} launches")
