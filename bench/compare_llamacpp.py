#!/usr/bin/env python3
"""Side-by-side speed of Ember and its peers (llama.cpp, ik_llama.cpp) on the same GGUF files and threads.

Runs `ember bench` and `llama-bench` alternately for several rounds (so machine noise hits both
alike) and prints, per model and test, the median tokens/s of each and their ratio, as a
markdown table. llama.cpp is not part of Ember: point --llama-bench at a build of your own.

  bench/compare_llamacpp.py --ember build/ember --llama-bench /path/to/llama-bench \
      [--ik-llama-bench /path/to/ik/llama-bench] --threads 2 --rounds 3 --pp 512 --tg 128 \
      MODEL.gguf [MODEL.gguf ...]

A model given as PEER_FILE=EMBER_FILE runs the peers on the first and Ember on the second (a
file `ember sparsify` made of the first: Ember sparse against the peers dense). Either peer may be left out. Ratios are per round (each tool's median of its repetitions in that
round), reported as their median and range. --ember-simd runs Ember at a lower SIMD level, to
compare with peers built for that level (GGML_NATIVE=OFF GGML_AVX2=ON GGML_FMA=ON GGML_F16C=ON).

PowerInfer's llama-bench (a llama.cpp fork) works the same way on PowerInfer-layout files; its
CPU build needs `--llama-args="-ngl 0"`, and `--ember-args="--sparse-mode oracle"` picks
Ember's sparse FFN.
"""
import argparse
import json
import os
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
    """{test: samples}, or None where the peer cannot run the file (its error goes to stderr)"""
    res = {}
    for name, p, n in ((f"pp{pp}", pp, 0), (f"tg{tg}", 0, tg)):
        if (p or n) == 0:
            continue
        run = subprocess.run([llama_bench, "-m", model, "-t", str(threads), "-p", str(p), "-n", str(n),
                              "-r", str(reps), "-o", "json", *extra], capture_output=True, text=True)
        if run.returncode != 0:
            why = (run.stderr.strip().splitlines() or ["no message"])[-1]
            print(f"{llama_bench} cannot run {model} (exit {run.returncode}: {why}); its columns stay empty",
                  file=sys.stderr)
            return None
        res[name] = json.loads(run.stdout)[0]["samples_ts"]
    return res


def spread(values):
    """median [min-max] of a list of ratios"""
    return f"{statistics.median(values):.2f}x [{min(values):.2f}-{max(values):.2f}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ember", default="build/ember")
    ap.add_argument("--llama-bench", help="llama.cpp's llama-bench")
    ap.add_argument("--ik-llama-bench", help="ik_llama.cpp's llama-bench (run with --ik-args)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3, help="repetitions inside each tool run")
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--ember-args", default="", help="extra ember bench flags, e.g. '--sparse-mode oracle'")
    ap.add_argument("--ember-simd", default="", help="EMBER_SIMD for Ember's runs (scalar, avx2, avx_vnni): "
                    "compare with peers built for that level")
    ap.add_argument("--llama-args", default="", help="extra llama-bench flags, e.g. '-ngl 0' for PowerInfer")
    ap.add_argument("--ik-args", default="-rtr 1", help="ik_llama.cpp's flags (default: its run-time repacking)")
    ap.add_argument("models", nargs="+", help="GGUF files, or PEER_FILE=EMBER_FILE")
    a = ap.parse_args()
    peers = [(name, path, args.split()) for name, path, args in
             (("llama.cpp", a.llama_bench, a.llama_args), ("ik_llama.cpp", a.ik_llama_bench, a.ik_args)) if path]
    if not peers:
        ap.error("give --llama-bench, --ik-llama-bench or both")
    if a.ember_simd:
        os.environ["EMBER_SIMD"] = a.ember_simd
    # Each round runs every tool once (reps inside); a round's ratio is of the tools' medians in
    # that round, so a drift of the machine between rounds falls on both sides of it alike.
    head = "| model | test | Ember tok/s |" + "".join(f" {n} tok/s | Ember / {n} |" for n, _, _ in peers)
    print(head)
    print("| --- | --- | ---: |" + " ---: | ---: |" * len(peers))
    for given in a.models:
        model, _, ember_model = given.partition("=")
        ember_model = ember_model or model
        rounds = []  # per round: {tool: {test: median}}
        for r in range(a.rounds):
            got = {}
            for name, path, args in peers:
                if r > 0 and rounds[0][name] is None:
                    got[name] = None
                    continue
                res = run_llama(path, model, a.threads, a.pp, a.tg, a.reps, args)
                got[name] = None if res is None else {k: statistics.median(v) for k, v in res.items()}
            got["Ember"] = {k: statistics.median(v) for k, v in
                            run_ember(a.ember, ember_model, a.threads, a.pp, a.tg, a.reps, a.ember_args.split()).items()}
            rounds.append(got)
            print(f"round {r + 1}/{a.rounds} done for {model}", file=sys.stderr)
        for test in rounds[0]["Ember"]:
            ember = statistics.median(g["Ember"][test] for g in rounds)
            label = model.split("/")[-1] + (f" (Ember: {ember_model.split('/')[-1]})" if ember_model != model else "")
            row = f"| {label} | {test} | {ember:.2f} |"
            for name, _, _ in peers:
                if rounds[0][name] is None:
                    row += " | |"
                    continue
                peer = statistics.median(g[name][test] for g in rounds)
                row += f" {peer:.2f} | {spread([g['Ember'][test] / g[name][test] for g in rounds])} |"
            print(row, flush=True)


if __name__ == "__main__":
    main()
