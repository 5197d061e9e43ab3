#!/usr/bin/env python3
"""Decode speed with and without structured output over `ember serve` (SmolLM2, one client, the
`openai` package): the same chat request plain, with a json_schema and with json_object, rounds
alternating, medians of completion tokens / request time.

    bench/structured.py [path/to/ember] [model]"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "server"))
import common, openai
SCHEMA = {"type": "object", "properties": {"title": {"type": "string", "maxLength": 200}, "lines": {"type": "array", "items": {"type": "string", "maxLength": 200}}}, "required": ["title", "lines"], "additionalProperties": False}
EMBER = sys.argv[1] if len(sys.argv) > 1 else "build/ember"
MODEL = sys.argv[2] if len(sys.argv) > 2 else "models/SmolLM2-135M-Instruct.Q4_1.gguf"
with common.Server(EMBER, MODEL, ctx=1024, threads=2, parallel=1) as srv:
    cl = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=300)
    mid = cl.models.list().data[0].id
    msgs = [{"role": "user", "content": "Write a long poem about the sea as JSON with a title and lines."}]
    res = {"plain": [], "json_schema": [], "json_object": []}
    for r in range(5):
        for kind in res:
            kw = {}
            if kind == "json_schema": kw["response_format"] = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}
            if kind == "json_object": kw["response_format"] = {"type": "json_object"}
            t0 = time.perf_counter()
            x = cl.chat.completions.create(model=mid, messages=msgs, temperature=0.7, seed=r, max_tokens=160, **kw)
            dt = time.perf_counter() - t0
            res[kind].append(x.usage.completion_tokens / dt)
    for k, v in res.items():
        print(k, f"{statistics.median(v):.1f} tokens/s", [round(a) for a in v])
