#!/usr/bin/env python3
"""Writes tests/data/tokenizer_<model>.json: reference token ids from llama.cpp's tokenizer.

Usage: scripts/gen_tokenizer_refs.py LLAMA_TOKENIZE MODEL.gguf [OUT.json] [LLAMA_CPP_COMMIT]

  SmolLM2: llama.cpp c392e509 (the default commit).
  Gemma 3 (a model file named gemma*): a newer llama.cpp that knows gemma3, e.g. d32676d7; the
  chat-markup cases use Gemma's control tokens instead of SmolLM2's.

Each text is written to a temporary file and passed with -f --no-escape, so the bytes reach the
tokenizer unchanged. llama-tokenize adds BOS when the model's add_bos_token says so (SmolLM2: no),
which is what Ember's encode(text, add_special=true, ...) does; parse_special is on unless
--no-parse-special is given.
"""
import json, os, subprocess, sys, tempfile

LLAMA_CPP_COMMIT = "c392e5094deaf2d1a7c18683214f007fad3fe42b"

CASES = [
    ("", True),
    (" ", True),
    ("Hello world", True),
    ("Hello, world! How are you today?", True),
    ("The quick brown fox jumps over the lazy dog.", True),
    ("  leading spaces and trailing spaces   ", True),
    ("trailing space ", True),
    ("multiple     spaces    inside", True),
    ("line one\nline two\n\nline four\n", True),
    ("\n\n\n", True),
    ("\t\ttabs\tand\t spaces \t", True),
    ("def foo(x):\n    return x * 2\n\nif __name__ == '__main__':\n\tprint(foo(21))\n", True),
    ("for (int i = 0; i < n; ++i) {\n        sum += a[i];\n}", True),
    ("1234567", True),
    ("3.14159", True),
    ("1,000 and 1,000,000 people", True),
    ("Version 2.0.1-beta released on 2024-05-17.", True),
    ("café naïve Ångström résumé coöperate", True),
    ("Der schnelle braune Fuchs springt über den faulen Hund. Straße, Größe, Äpfel.", True),
    ("Le cœur a ses raisons que la raison ne connaît point. Où est l'hôtel ?", True),
    ("¿Dónde está la biblioteca? ¡Mañana será otro día!", True),
    ("中文测试：你好，世界！", True),
    ("日本語のテキストです。カタカナ、ひらがな、漢字。", True),
    ("한국어 문장입니다. 안녕하세요!", True),
    ("Emoji: 😀 🎉 👍🏽 ❤️", True),
    ("Family: 👨‍👩‍👧‍👦 and flags 🇫🇷 🇯🇵 🇺🇸", True),
    ("It's John's book; they're here, we've gone, I'm sure, you'll see, he'd know.", True),
    ("SHOUTING: IT'S, THEY'RE, WE'LL, I'D", True),
    ("don't can't won't shouldn't", True),
    ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", True),
    ("<|im_start|>user\nhi<|im_end|>", False),
    ("text before<|endoftext|>text after", True),
    ("Math: x² + y² = z², ∑ᵢ aᵢ ≥ 0, π ≈ 3.14, ½ ¾", True),
    ("Symbols: @#$%^&*()_+-=[]{}|;':\",./<>?`~", True),
    ("URL: https://example.com/path?query=1&b=2#frag", True),
    ("Mixed123numbers456and789letters", True),
    ("Ελληνικά και Русский текст, also עברית and العربية.", True),
    ("\u00a0non-breaking\u00a0space and\u2003em space and\u3000ideographic", True),
    ("a\r\nb\r\n", True),
    ("   \n   ", True),
    ("Zero\u200bwidth joiner and combining e\u0301 accent", True),
]


GEMMA_CASES = [
    ("<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n", True),
    ("<start_of_turn>user\nhi<end_of_turn>", False),
    ("text before<eos>text after", True),
    ("<bos>already a bos", True),
    ("Bytes beyond the vocabulary: \u0007\u0001 and \U0001F9EC\U0001FAE0", True),
    ("    indented code\n        more", True),
]


def tokenize(exe, model, text, parse_special):
    with tempfile.NamedTemporaryFile("wb", delete=False) as f:
        f.write(text.encode("utf-8"))
        path = f.name
    try:
        cmd = [exe, "-m", model, "-f", path, "--no-escape", "--ids", "--log-disable"]
        if not parse_special:
            cmd.append("--no-parse-special")
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.path.dirname(exe) + ":" + env.get("LD_LIBRARY_PATH", "")
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    line = [l for l in out.splitlines() if l.startswith("[")][-1]
    return json.loads(line)


def main():
    exe, model = sys.argv[1], sys.argv[2]
    out = sys.argv[3] if len(sys.argv) > 3 else "tests/data/tokenizer_smollm2.json"
    commit = sys.argv[4] if len(sys.argv) > 4 else LLAMA_CPP_COMMIT
    texts = CASES
    if os.path.basename(model).lower().startswith("gemma"):
        texts = [c for c in CASES if "<|" not in c[0]] + GEMMA_CASES
    cases = [{"text": t, "parse_special": ps, "ids": tokenize(exe, model, t, ps)} for t, ps in texts]
    doc = {
        "model": os.path.basename(model),
        "generator": "llama.cpp llama-tokenize -f FILE --no-escape --ids (add_special as the model says)",
        "llama_cpp_commit": commit,
        "cases": cases,
    }
    # One case per line keeps the file short and diffs readable.
    head = {k: v for k, v in doc.items() if k != "cases"}
    with open(out, "w", encoding="utf-8") as f:
        f.write(json.dumps(head, ensure_ascii=False, indent=1)[:-2] + ',\n "cases": [\n')
        f.write(",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in cases))
        f.write("\n ]\n}\n")
    print(f"wrote {len(cases)} cases to {out}")


if __name__ == "__main__":
    main()
