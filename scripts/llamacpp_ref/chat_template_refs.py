#!/usr/bin/env python3
"""llama.cpp's --jinja rendering of chats, as token ids: the reference of Ember's Jinja chat
templates (tests/test_chat_jinja.cpp). For each shipped model it starts the llama-server of a
llama.cpp you built yourself (never part of this repository) with --jinja (Gemma 3's GGUF carries no
template: tests/data/chat_templates/google-gemma-3-it.jinja, Google's, is given with --chat-template-file),
sends each conversation to /apply-template and the prompt to /tokenize (with the BOS the model adds,
as its completions tokenize), and writes both.

  scripts/llamacpp_ref/chat_template_refs.py --llama-server ~/llama.cpp/build/bin/llama-server \
      --commit $(git -C ~/llama.cpp rev-parse HEAD) --out tests/data/llamacpp_chat_templates.json
"""
import argparse
import json
import os
import socket
import subprocess
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = [("smollm2", "models/SmolLM2-135M-Instruct.Q4_1.gguf", None),
          ("gemma3", "models/gemma-3-270m-q4_k_m.gguf", "tests/data/chat_templates/google-gemma-3-it.jinja")]
CHATS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"},
     {"role": "user", "content": "  And 3+3?  "}],
    [{"role": "system", "content": "Be nice.\nAlways."}, {"role": "user", "content": "a"},
     {"role": "assistant", "content": "b"}, {"role": "user", "content": "Ça va? 日本語 \"quotes\" <b>tags</b>"}],
]


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    out = {"llama_cpp_commit": a.commit, "models": {}}
    for name, model, template in MODELS:
        port = free_port()
        cmd = [a.llama_server, "-m", os.path.join(ROOT, model), "--jinja", "--port", str(port), "-c", "512", "-t", "1"]
        if template:
            cmd += ["--chat-template-file", os.path.join(ROOT, template)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}"
            for _ in range(600):
                try:
                    with urllib.request.urlopen(url + "/health", timeout=1) as r:
                        if r.status == 200:
                            break
                except OSError:
                    time.sleep(0.1)
            chats = []
            for msgs in CHATS:
                prompt = post(url + "/apply-template", {"messages": msgs})["prompt"]
                tokens = post(url + "/tokenize", {"content": prompt, "add_special": True})["tokens"]
                chats.append({"messages": msgs, "prompt": prompt, "tokens": tokens})
            out["models"][name] = {"model": model, "template_file": template, "chats": chats}
        finally:
            proc.terminate()
            proc.wait()
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
