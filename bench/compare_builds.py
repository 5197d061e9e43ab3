#!/usr/bin/env python3
"""Two (or more) Ember builds side by side: `ember bench` of each configuration in turn, round by
round (so machine noise hits all alike), then per configuration the median generation tokens/s
over the rounds (or prompt tokens/s with --pp), and per round the ratio of each configuration to the first one of its group
(configurations with the same GROUP compare with each other), with the median of those ratios.

  bench/compare_builds.py --rounds 6 --tg 64 -t 2 \\
      --config "dense/old=/tmp/base/build/ember::-m s11b.gguf" \\
      --config "dense/new=build/ember::-m s11b.gguf"

A configuration is GROUP/NAME=BINARY::FLAGS (FLAGS: ember bench flags, -m included).
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
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=2, help="ember bench -r per round")
    ap.add_argument("--tg", type=int, default=64)
    ap.add_argument("--pp", type=int, default=0, help="measure prompt processing of this many tokens instead")
    ap.add_argument("--config", action="append", required=True, help="GROUP/NAME=BINARY::FLAGS")
    a = ap.parse_args()
    configs = []
    for c in a.config:
        label, _, rest = c.partition("=")
        binary, _, flags = rest.partition("::")
        group, _, _ = label.partition("/")
        if not binary or not label:
            sys.exit(f"compare_builds: bad --config '{c}' (GROUP/NAME=BINARY::FLAGS)")
        configs.append((label, group, binary, shlex.split(flags)))
    speed = {label: [] for label, *_ in configs}
    for r in range(a.rounds):
        for label, _, binary, flags in configs:
            with tempfile.NamedTemporaryFile(suffix=".json") as js:
                pp, tg = (a.pp, 0) if a.pp > 0 else (0, a.tg)
                cmd = [binary, "bench", "-p", str(pp), "-n", str(tg), "-r", str(a.reps), "-t", str(a.threads),
                       "--json", js.name] + flags
                p = subprocess.run(cmd, capture_output=True, text=True)
                if p.returncode != 0:
                    sys.exit(f"compare_builds: {' '.join(cmd)} failed:\n{p.stderr[-2000:]}")
                d = json.load(open(js.name))
                # With --seqs N the decode test is tg<n>x<N> (tokens/s of all N together).
                key = f"pp{a.pp}" if a.pp > 0 else next(k for k in d if k == f"tg{a.tg}" or k.startswith(f"tg{a.tg}x"))
                speed[label].append(d[key]["median"])
        print(f"round {r + 1}: " + "  ".join(f"{l} {speed[l][-1]:.2f}" for l, *_ in configs), flush=True)
    print()
    first = {}
    for label, group, *_ in configs:
        first.setdefault(group, label)
    print("| configuration | median tok/s | ratio to its group's first (median of rounds) | per round |")
    print("| --- | ---: | ---: | --- |")
    for label, group, *_ in configs:
        base = speed[first[group]]
        ratios = [s / b for s, b in zip(speed[label], base)]
        print(f"| {label} | {statistics.median(speed[label]):.2f} | {statistics.median(ratios):.3f}x | "
              + " ".join(f"{x:.3f}" for x in ratios) + " |")


if __name__ == "__main__":
    main()
