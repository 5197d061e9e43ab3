#!/usr/bin/env python3
"""Side-by-side speed of Ember and llama.cpp on the same GGUF files and thread count.

Runs `ember bench` and `llama-bench` alternately for several rounds (so machine noise hits both
alike) and prints, per model and test, the median tokens/s of each and their ratio, as a
markdown table. llama.cpp is not part of Ember: point --llama-bench at a build of your own.

  bench/compare_llamacpp.py --ember build/ember --llama-bench /path/to/llama-bench \
      --threads 2 --rounds 3 --pp 512 --tg 128 MODEL.gguf [MODEL.gguf ...]

PowerInfer's llama-bench (a llama.cpp fork) works the same way on PowerInfer-layout files; its
CPU build needs `--llama-args="-ngl 0"`, and `--ember-args="--sparse-mode oracle"` picks
Ember's sparse FFN.
"""
import argparse
import json
import statistics
import subprocess
import sys


def run_ember(ember, model, threads, pp, tg, reps, extra=()):
    out = subprocess.run([ember, "bench", "-m", model, "-t", str(threads), "-p", str(pp), "-n", str(tg),
                          "-r", str(reps), *extra], capture_output=True, text=True, check=True).stdout
    data = json.loads(out.strip().splitlines()[-1])
    res = {}
    if pp:
        res[f"pp{pp}"] = data[f"pp{pp}"]["samples"]
    if tg:
        res[f"tg{tg}"] = data[f"tg{tg}"]["samples"]
    return res


def run_llama(llama_bench, model, threads, pp, tg, reps, extra=()):
    res = {}
    for name, p, n in ((f"pp{pp}", pp, 0), (f"tg{tg}", 0, tg)):
        if (p or n) == 0:
            continue
        out = subprocess.run([llama_bench, "-m", model, "-t", str(threads), "-p", str(p), "-n", str(n),
                              "-r", str(reps), "-o", "json", *extra], capture_output=True, text=True, check=True).stdout
        rows = json.loads(out)
        res[name] = rows[0]["samples_ts"]
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ember", default="build/ember")
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3, help="repetitions inside each tool run")
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--ember-args", default="", help="extra ember bench flags, e.g. '--sparse-mode oracle'")
    ap.add_argument("--llama-args", default="", help="extra llama-bench flags, e.g. '-ngl 0' for PowerInfer")
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    print("| model | test | llama.cpp tok/s (median) | Ember tok/s (median) | Ember / llama.cpp |")
    print("| --- | --- | ---: | ---: | ---: |")
    for model in a.models:
        ember, llama = {}, {}
        for r in range(a.rounds):
            for k, v in run_llama(a.llama_bench, model, a.threads, a.pp, a.tg, a.reps, a.llama_args.split()).items():
                llama.setdefault(k, []).extend(v)
            for k, v in run_ember(a.ember, model, a.threads, a.pp, a.tg, a.reps, a.ember_args.split()).items():
                ember.setdefault(k, []).extend(v)
            print(f"round {r + 1}/{a.rounds} done for {model}", file=sys.stderr)
        for test in llama:
            lm, em = statistics.median(llama[test]), statistics.median(ember[test])
            print(f"| {model.split('/')[-1]} | {test} | {lm:.2f} | {em:.2f} | {em / lm:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
