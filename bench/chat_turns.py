#!/usr/bin/env python3
"""Time to first token of each turn of a chat over `ember serve`, for two builds side by side
(e.g. with and without the prompt cache): rounds alternate the builds, medians per turn.

    bench/chat_turns.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
        --build old=/path/to/old/ember --build new=build/ember [--turns 5] [--rounds 3]

Each turn streams a reply of at most --max-tokens tokens with the real `openai` package (greedy),
then the next question is appended to the conversation, as a chat client does."""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "server"))
import common  # noqa: E402  (the test suite's server runner)

SYSTEM = ("You are a helpful assistant for a travel agency. You answer questions about cities, their history, "
          "food, museums and transport in a friendly, concise way, with practical tips for visitors.")
QUESTIONS = ["Tell me about Paris.", "What should I eat there?", "Which museums are worth it?",
             "How do I get around?", "What about a day trip nearby?", "Any tips for the evening?",
             "And where should I stay?", "What is the best season to visit?"]


def chat(client, model_id, turns, max_tokens):
    """TTFT in seconds and prompt / cached token counts per turn."""
    messages = [{"role": "system", "content": SYSTEM}]
    out = []
    for q in QUESTIONS[:turns]:
        messages.append({"role": "user", "content": q})
        t0 = time.perf_counter()
        first, text, usage = None, [], None
        for chunk in client.chat.completions.create(model=model_id, messages=messages, temperature=0,
                                                    max_tokens=max_tokens, stream=True,
                                                    stream_options={"include_usage": True}):
            if chunk.usage:
                usage = chunk.usage
            for ch in chunk.choices:
                if ch.delta.content:
                    if first is None:
                        first = time.perf_counter() - t0
                    text.append(ch.delta.content)
        details = getattr(usage, "prompt_tokens_details", None)
        cached = getattr(details, "cached_tokens", 0) if details else 0
        out.append((first or float("nan"), usage.prompt_tokens, cached or 0))
        messages.append({"role": "assistant", "content": "".join(text)})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--build", action="append", required=True, help="NAME=path/to/ember (two or more)")
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    import openai
    builds = [b.split("=", 1) for b in a.build]
    ttft = {name: [[] for _ in range(a.turns)] for name, _ in builds}
    tokens = {}
    for r in range(a.rounds):
        for name, ember in builds:
            with common.Server(ember, a.model, ctx=2048, threads=a.threads, parallel=1) as srv:
                client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=300)
                model_id = client.models.list().data[0].id
                for i, (t, n_prompt, n_cached) in enumerate(chat(client, model_id, a.turns, a.max_tokens)):
                    ttft[name][i].append(t)
                    tokens[(name, i)] = (n_prompt, n_cached)
            print(f"round {r + 1} {name}: " + " ".join(f"{ttft[name][i][-1] * 1e3:.0f}" for i in range(a.turns)) +
                  " ms", flush=True)
    print("\nturn | " + " | ".join(f"{name} TTFT ms (prompt / cached tokens)" for name, _ in builds))
    for i in range(a.turns):
        cells = []
        for name, _ in builds:
            n_prompt, n_cached = tokens[(name, i)]
            cells.append(f"{statistics.median(ttft[name][i]) * 1e3:.0f} ({n_prompt} / {n_cached})")
        print(f"{i + 1} | " + " | ".join(cells))
    if len(builds) == 2:
        (n0, _), (n1, _) = builds
        print("\n" + " ".join(f"turn {i + 1}: {n0}/{n1} {statistics.median(ttft[n0][i]) / statistics.median(ttft[n1][i]):.2f}x"
                              for i in range(a.turns)))


if __name__ == "__main__":
    main()
