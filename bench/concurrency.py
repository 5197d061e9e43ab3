#!/usr/bin/env python3
"""Aggregate generated tokens/s and time to first token at 1, 2, 4 and 8 concurrent streaming
clients (the real `openai` package), for `ember serve --parallel N` builds and llama.cpp's
`llama-server -np N` side by side: rounds alternate the servers, medians over rounds.

    bench/concurrency.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
        --ember new=build/ember [--ember old=/path/ember] [--llama-server /path/llama-server] \
        [--clients 1,2,4,8] [--rounds 3] [--requests 2] [--max-tokens 96] [--threads 2]

Each of N clients sends --requests chat requests one after another (greedy, different questions,
streamed with usage); a server gets N sequences of --ctx tokens each (llama-server: -c N*ctx, its
context is shared by the slots). Tokens/s = all completion tokens / wall time of the run."""
import argparse
import concurrent.futures
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "server"))
import common  # noqa: E402  (the test suite's server runner)

TOPICS = ["the sea", "a lighthouse keeper", "a robot learning to paint", "the first snow", "a lost key",
          "an old library", "a night train", "a garden in spring", "a city at dawn", "a chess game",
          "a mountain village", "a small bakery", "a storm at sea", "a forgotten letter", "a desert road",
          "a music box"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """llama-server on a free port, as common.Server runs ember."""

    def __init__(self, binary, model, ctx, threads, parallel):
        self.cmd = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(free_port()), "-c",
                    str(ctx * parallel), "-t", str(threads), "-tb", str(threads), "-np", str(parallel), "-cb",
                    "--no-webui", "-a", "model"]
        self.url = f"http://127.0.0.1:{self.cmd[self.cmd.index('--port') + 1]}"

    def __enter__(self):
        env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(self.cmd[0]))
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        for _ in range(600):
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return self
            except Exception:
                time.sleep(0.1)
        raise RuntimeError("llama-server did not start")

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def run_clients(url, n_clients, n_requests, max_tokens):
    """(tokens/s over the run, median TTFT in s, [(topic, text)] of every request)."""
    import openai

    # Clients are made (and have asked for the model's id) before the clock starts: the run times
    # the server, not the construction of Python objects (the first in a process takes ~0.2 s).
    clients = [openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
               for _ in range(n_clients)]
    model_id = clients[0].models.list().data[0].id

    def client_run(c):
        client = clients[c]
        out = []
        for r in range(n_requests):
            topic = TOPICS[(c * n_requests + r) % len(TOPICS)]
            t0 = time.perf_counter()
            first, n_tokens, text = None, 0, []
            for chunk in client.chat.completions.create(
                    model=model_id, messages=[{"role": "user", "content": f"Write a short story about {topic}."}],
                    temperature=0, max_tokens=max_tokens, stream=True, stream_options={"include_usage": True}):
                if chunk.usage:
                    n_tokens = chunk.usage.completion_tokens
                for ch in chunk.choices:
                    if ch.delta.content:
                        if first is None:
                            first = time.perf_counter() - t0
                        text.append(ch.delta.content)
            out.append((first, n_tokens, "".join(text), topic))
        return out

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(n_clients) as ex:
        results = list(ex.map(client_run, range(n_clients)))
    wall = time.perf_counter() - t0
    tokens = sum(n for res in results for _, n, _, _ in res)
    ttft = statistics.median(f for res in results for f, _, _, _ in res if f is not None)
    texts = [(topic, t) for res in results for _, _, t, topic in res]
    return tokens / wall, ttft, texts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--ember", action="append", default=[], help="NAME=path/to/ember")
    ap.add_argument("--llama-server", default="")
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=512)
    a = ap.parse_args()
    servers = [(name, path) for name, path in (e.split("=", 1) for e in a.ember)]
    if a.llama_server:
        servers.append(("llama-server", a.llama_server))
    clients = [int(c) for c in a.clients.split(",")]
    rate = {(s, c): [] for s, _ in servers for c in clients}
    ttft = {(s, c): [] for s, _ in servers for c in clients}
    first_text = {}  # (server, topic): the greedy text first seen (batching should not change it)
    for r in range(a.rounds):
        for c in clients:
            for name, path in servers:
                if name == "llama-server":
                    srv = LlamaServer(path, a.model, a.ctx, a.threads, c)
                else:
                    srv = common.Server(path, a.model, ctx=a.ctx, threads=a.threads, parallel=c, queue=16)
                with srv:
                    tps, t1, texts = run_clients(srv.url, c, a.requests, a.max_tokens)
                rate[(name, c)].append(tps)
                ttft[(name, c)].append(t1)
                same = 0
                for topic, t in texts:
                    same += first_text.setdefault((name, topic), t) == t
                print(f"round {r + 1} {name} x{c}: {tps:.1f} tokens/s, TTFT {t1 * 1e3:.0f} ms, "
                      f"{same}/{len(texts)} texts as first seen", flush=True)
    print("\nclients | " + " | ".join(f"{name} tokens/s (TTFT ms)" for name, _ in servers))
    for c in clients:
        cells = [f"{statistics.median(rate[(s, c)]):.1f} ({statistics.median(ttft[(s, c)]) * 1e3:.0f})" for s, _ in servers]
        print(f"{c} | " + " | ".join(cells))
    if len(servers) >= 2:
        base = servers[-1][0]
        for name, _ in servers[:-1]:
            print(f"{name} / {base}: " + ", ".join(
                f"x{c} {statistics.median(rate[(name, c)]) / statistics.median(rate[(base, c)]):.2f}" for c in clients))
    for name, _ in servers:
        one = statistics.median(rate[(name, clients[0])])
        print(f"{name} scaling over {clients[0]} client(s): " +
              ", ".join(f"x{c} {statistics.median(rate[(name, c)]) / one:.2f}" for c in clients))


if __name__ == "__main__":
    main()
