#!/usr/bin/env python3
"""Decode speed of Ember's sparse FFN modes against Ember dense and llama.cpp dense, side by side.

Each round runs llama-bench (dense), then `ember bench` once per configuration, on the same GGUF
file and thread count, so machine noise hits all alike; the table gives the median tokens/s over
all repetitions of all rounds and each configuration's ratio to Ember dense and to llama.cpp.
llama.cpp is not part of Ember: point --llama-bench at a build of your own (or omit it).

  bench/compare_sparse_llama.py --llama-bench /path/to/llama-bench --threads 2 --rounds 3 --tg 64 \
      --config dense= --config "predictor=--sparse-mode predictor --predictor M.pred.gguf" M.gguf
"""
import argparse
import json
import shlex
import statistics
import subprocess


def run_ember(ember, model, threads, tg, reps, extra):
    cmd = [ember, "bench", "-m", model, "-t", str(threads), "-p", "0", "-n", str(tg), "-r", str(reps)] + extra
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    data = json.loads(out.strip().splitlines()[-1])
    return data[f"tg{tg}"]["samples"], data.get("ffn_sparsity")


def run_llama(llama_bench, model, threads, tg, reps):
    out = subprocess.run([llama_bench, "-m", model, "-t", str(threads), "-p", "0", "-n", str(tg), "-r", str(reps),
                          "-o", "json"], capture_output=True, text=True, check=True).stdout
    return json.loads(out)[0]["samples_ts"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ember", default="build/ember")
    ap.add_argument("--llama-bench")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3, help="repetitions inside each tool run")
    ap.add_argument("--tg", type=int, default=64)
    ap.add_argument("--config", action="append", default=[],
                    help="NAME=EMBER FLAGS (repeatable; the first named 'dense' is the Ember baseline)")
    ap.add_argument("model")
    a = ap.parse_args()
    configs = [(c.split("=", 1)[0], shlex.split(c.split("=", 1)[1])) for c in (a.config or ["dense="])]
    samples = {name: [] for name, _ in configs}
    sparsity = {}
    llama = []
    for r in range(a.rounds):
        if a.llama_bench:
            llama += run_llama(a.llama_bench, a.model, a.threads, a.tg, a.reps)
        for name, extra in configs:
            s, sp = run_ember(a.ember, a.model, a.threads, a.tg, a.reps, extra)
            samples[name] += s
            sparsity[name] = sp
        print(f"round {r + 1}/{a.rounds} done", flush=True)
    med = {k: statistics.median(v) for k, v in samples.items()}
    l_med = statistics.median(llama) if llama else None
    dense = med.get("dense")
    print(f"| {a.model} tg{a.tg} | tok/s (median) | vs Ember dense | vs llama.cpp dense | FFN sparsity |")
    print("| --- | ---: | ---: | ---: | ---: |")
    if l_med:
        print(f"| llama.cpp dense | {l_med:.2f} | {l_med / dense:.2f}x |" if dense else f"| llama.cpp dense | {l_med:.2f} | - |",
              "1.00x | - |")
    for name, _ in configs:
        vs_d = f"{med[name] / dense:.2f}x" if dense else "-"
        vs_l = f"{med[name] / l_med:.2f}x" if l_med else "-"
        sp = f"{100 * sparsity[name]:.1f}%" if sparsity.get(name) is not None else "-"
        print(f"| Ember {name} | {med[name]:.2f} | {vs_d} | {vs_l} | {sp} |")
    print(json.dumps({"llama": llama, "ember": samples}))


if __name__ == "__main__":
    main()
