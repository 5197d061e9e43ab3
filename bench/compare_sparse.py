#!/usr/bin/env python3
"""Decode speed of Ember's FFN modes side by side: runs `ember bench` for each configuration in
turn, round by round (so machine noise hits all alike), and prints the median generation
tokens/s of each over all repetitions of all rounds, its ratio to the first configuration, and
the FFN sparsity the sparse runs measured.

  bench/compare_sparse.py --ember build/ember -m MODEL --rounds 5 --reps 3 --tg 64 -t 2 \
      --config dense= \
      --config "t50=--sparse-mode threshold --sparse-profile M.profile.gguf --sparsity 0.5"
"""
import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ember", required=True)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tg", type=int, default=64)
    ap.add_argument("--config", action="append", required=True,
                    help="NAME=FLAGS (extra ember flags; the first config is the baseline)")
    a = ap.parse_args()
    configs = []
    for c in a.config:
        name, _, flags = c.partition("=")
        configs.append((name, shlex.split(flags)))
    samples = {n: [] for n, _ in configs}
    sparsity = {n: [] for n, _ in configs}
    for r in range(a.rounds):
        for name, flags in configs:
            with tempfile.NamedTemporaryFile(suffix=".json") as js:
                cmd = [a.ember, "bench", "-m", a.model, "-p", "0", "-n", str(a.tg), "-r", str(a.reps),
                       "-t", str(a.threads), "--json", js.name] + flags
                p = subprocess.run(cmd, capture_output=True, text=True)
                if p.returncode != 0:
                    sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr}")
                d = json.load(open(js.name))
            samples[name] += d[f"tg{a.tg}"]["samples"]
            if "ffn_sparsity" in d:
                sparsity[name].append(d["ffn_sparsity"])
            print(f"round {r + 1}/{a.rounds} {name}: median {statistics.median(d[f'tg{a.tg}']['samples']):.2f} tok/s",
                  file=sys.stderr, flush=True)
    base = statistics.median(samples[configs[0][0]])
    print(f"| config | tg{a.tg} tok/s (median of {a.rounds}x{a.reps}) | min | max | vs {configs[0][0]} | FFN sparsity |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, _ in configs:
        s = samples[name]
        sp = f"{statistics.mean(sparsity[name]):.3f}" if sparsity[name] else "-"
        print(f"| {name} | {statistics.median(s):.2f} | {min(s):.2f} | {max(s):.2f} | "
              f"{statistics.median(s) / base:.3f}x | {sp} |")


if __name__ == "__main__":
    main()
