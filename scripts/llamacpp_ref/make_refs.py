#!/usr/bin/env python3
"""llama.cpp's logits on Ember's synthetic models of every architecture: the test data of
tests/test_llamacpp_synth.cpp (docs/agreement.md says how and with which llama.cpp).

llama.cpp is not part of Ember. Build a llama.cpp of your own (CPU backend; the commit used
for the stored data is in each file and in docs/agreement.md) and point --llama-cpp at its
source tree with the build in build/. This script compiles Ember's small dump program
(dump_logits.cpp, beside it) against that build's libllama, writes each model with
`ember synth` and runs the dump twice: with llama.cpp's default F16 KV cache (the reference)
and with an F32 one and flash attention off (its most precise attention: how much llama.cpp moves
by itself, which sets the tests' tolerance; with flash attention on, its CPU path gives the same
bits for an F16 and an F32 cache).

  scripts/llamacpp_ref/make_refs.py --llama-cpp ~/llama.cpp --ember build/ember \
      --out tests/data/llamacpp_synth [--only qwen3]
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

# (name, synth flags). Dimensions that every type's block size divides (K-quants: 256).
BASE = {"--n-embd": "256", "--n-ff": "512", "--n-layer": "2", "--n-head": "4", "--n-head-kv": "2",
        "--n-vocab": "300", "--ctx": "2048", "--seed": "7"}
ARCHS = [
    ("llama", ["--arch", "llama"]),
    ("llama-tied", ["--arch", "llama", "--tied", ""]),
    ("llama3", ["--arch", "llama", "--rope-freqs", "", "--rope-base", "500000"]),
    ("qwen2", ["--arch", "qwen2"]),
    ("qwen3", ["--arch", "qwen3", "--head-dim", "128"]),
    ("phi3", ["--arch", "phi3"]),
    # Original context 256 (context_length 1024): llama.cpp's 512-token context takes the long
    # LongRoPE factors.
    ("phi3-long", ["--arch", "phi3", "--ctx", "256"]),
    ("falcon-7b", ["--arch", "falcon", "--n-head-kv", "1"]),
    ("falcon-40b", ["--arch", "falcon"]),
    ("mixtral", ["--arch", "llama", "--n-expert", "4", "--n-expert-used", "2", "--n-ff", "256"]),
    ("qwen3moe", ["--arch", "qwen3moe", "--head-dim", "128", "--n-expert", "8", "--n-expert-used", "2",
                  "--n-ff", "256"]),
]
TYPES = ["f32", "f16", "q8_0", "q4_k"]


# Pre-tokenizers (tokenizer.ggml.pre) checked on a synth vocabulary that merges digits,
# whitespace and punctuation (ember synth --pre X --symbol-merges), so that every split shows.
PRE_TOKENIZERS = ["default", "llama-bpe", "qwen2", "falcon", "gpt-2", "smollm"]
FIXED_STRINGS = [
    "", " ", "  ", "\n", "\n\n\n", "\t\tx", " \n \n", "hello world", " hello  world ", "Hello, World!",
    "don't you're we'll I'd they've it's", "DON'T YOU'RE", "1", "12", "123", "1234", "1234567", " 12 345 6789",
    "3.14159 2,718 -42 +7 1e-5", "x1 y22 z333 w4444", "$100.00 (approx.)", "a`b `code` ``x``", "a--b__c::d;;e",
    "foo(bar, baz[0]) -> int {\n\treturn x == y ? 1 : 0;\n}", "def f(x):\n    return x**2  # square\n",
    "<html><body>Hi!</body></html>", "naïve café résumé Ångström", "Grüße, Straße!", "Привет, мир!",
    "こんにちは世界", "你好，世界。", "안녕하세요", "مرحبا بالعالم", "١٢٣٤ ٥٦", "😀 👍🏽 🇫🇷 ❤️", "emoji😀in😀text",
    "   leading", "trailing   ", "mixed \t tabs\t\tand  spaces", "line1\r\nline2\rline3", "!!!???...,,,",
    "''''", "\"quoted\" 'single'", "x\u00a0y\u2003z", "ℕ ∑ ∫ √2 ≈ 1.414", "#1 @user https://example.com/a?b=1&c=2",
]
FRAGMENTS = ["the", " the", "The", " quick", "brown", " fox", "'s", "'ll", "'RE", " 7", "42", " 2024", "123456",
             "3.5", " ", "  ", "   ", "\n", "\n\n", "\t", ".", ",", "!", "?", "...", "$", "(", ")", "-", "_", ":",
             "`", "\"", "é", "ü", "中文", "日本", "😀", "ß", "Ω", " x", "y", "__init__", "i++", "==", "->", "0x1F"]


def tokenizer_strings(seed):
    """The fixed strings and 250 random concatenations of fragments."""
    rng = random.Random(seed)
    out = list(FIXED_STRINGS)
    for _ in range(250):
        out.append("".join(rng.choice(FRAGMENTS) for _ in range(rng.randrange(1, 9))))
    return out


def sequences(n_vocab, seed):
    """Token sequences: (n_prompt, tokens). A batched prompt then decode steps, and a one-token
    prompt then decode steps (every position a decode)."""
    rng = random.Random(seed)
    pick = lambda n: [rng.randrange(n_vocab) for _ in range(n)]
    return [(10, pick(16)), (1, pick(8))]


def dump(tool, model, kv, fa, seqs, threads):
    text = "".join(f"{p} {' '.join(map(str, t))}\n" for p, t in seqs)
    out = subprocess.run([tool, model, kv, fa, str(threads)], input=text, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", required=True, help="llama.cpp source tree with its build in build/")
    ap.add_argument("--ember", default="build/ember")
    ap.add_argument("--out", default="tests/data/llamacpp_synth")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", help="only the cases whose name starts with this")
    a = ap.parse_args()

    lc = os.path.abspath(a.llama_cpp)
    commit = subprocess.run(["git", "-C", lc, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    if not commit and os.path.exists(os.path.join(lc, "COMMIT")):
        commit = open(os.path.join(lc, "COMMIT")).read().strip()
    work = tempfile.mkdtemp(prefix="ember-refs-")
    tool = os.path.join(work, "dump_logits")
    lib = os.path.join(lc, "build", "bin")
    subprocess.run(["g++", "-O2", "-std=c++17", f"-I{lc}/include", f"-I{lc}/ggml/include",
                    os.path.join(HERE, "dump_logits.cpp"), f"-L{lib}", "-lllama", "-lggml", "-lggml-base",
                    f"-Wl,-rpath,{lib}", "-o", tool], check=True)
    os.makedirs(a.out, exist_ok=True)
    for pre in PRE_TOKENIZERS:
        case = f"tokenizer_{pre}"
        if a.only and not case.startswith(a.only):
            continue
        model = os.path.join(work, case + ".gguf")
        synth = ["--preset", "tiny", "--n-vocab", "1200", "--pre", pre, "--symbol-merges"]
        subprocess.run([a.ember, "synth", *synth, "-o", model], check=True, capture_output=True)
        strings = tokenizer_strings(7)
        text = "".join(s.encode().hex() + "\n" for s in strings)
        out = subprocess.run([tool, model, "tokenize"], input=text, capture_output=True, text=True, check=True)
        ids = [[int(x) for x in line.split()] for line in out.stdout.split("\n")[:len(strings)]]
        path = os.path.join(a.out, case + ".json")
        with open(path, "w") as f:
            json.dump({"llama_cpp_commit": commit, "synth": synth,
                       "cases": [{"text": s, "ids": i} for s, i in zip(strings, ids)]}, f, ensure_ascii=False, indent=0)
        print(f"{case}: {len(strings)} strings, {sum(map(len, ids))} tokens", flush=True)
    for name, flags in ARCHS:
        for ty in TYPES:
            case = f"{name}_{ty}"
            if a.only and not case.startswith(a.only):
                continue
            model = os.path.join(work, case + ".gguf")
            opts = dict(BASE)
            opts.update(zip(flags[0::2], flags[1::2]))
            opts["--type"] = ty
            synth = [x for kv in opts.items() for x in kv if x != ""]
            subprocess.run([a.ember, "synth", *synth, "-o", model], check=True, capture_output=True)
            seqs = sequences(300, sum(map(ord, case)))
            ref = dump(tool, model, "f16", "auto", seqs, a.threads)
            f32 = dump(tool, model, "f32", "off", seqs, a.threads)
            kv_diff, kv_top1 = 0.0, 0
            for s16, s32 in zip(ref["sequences"], f32["sequences"]):
                for l16, l32 in zip(s16["logits"], s32["logits"]):
                    kv_diff = max(kv_diff, max(abs(x - y) for x, y in zip(l16, l32)))
                    kv_top1 += l16.index(max(l16)) != l32.index(max(l32))
            data = {"llama_cpp_commit": commit, "synth": synth, "n_vocab": ref["n_vocab"],
                    "f32_kv_no_fa_max_abs_diff": kv_diff, "f32_kv_no_fa_top1_changes": kv_top1,
                    "sequences": [{"n_prompt": s["n_prompt"], "tokens": s["tokens"],
                                   "logits": [[float(f"{x:.5g}") for x in l] for l in s["logits"]]}
                                  for s in ref["sequences"]]}
            path = os.path.join(a.out, case + ".json")
            with open(path, "w") as f:
                json.dump(data, f, separators=(",", ":"))
            print(f"{case}: {os.path.getsize(path) // 1024} KiB, llama.cpp default vs F32 KV without flash attention: max |diff| {kv_diff:.3g}, "
                  f"top-1 changes {kv_top1}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
