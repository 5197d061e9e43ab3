"""The server against real clients: the official `openai` Python package (streaming and not,
chat and completions, usage, stop strings, seeds, errors) and curl."""
import json
import shutil
import subprocess
import time

import common

ember, model = common.args()
try:
    import openai
except ImportError:
    common.skip("the `openai` Python package is not installed (scripts/setup.sh --tests installs it into .venv)")

c = common.Checks("openai")
with common.Server(ember, model) as srv:
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=60)
    model_id = client.models.list().data[0].id
    c.check(model_id == "SmolLM2-135M-Instruct.Q4_1", f"model id {model_id}")

    # Chat, not streaming: the greedy answer, usage counts, finish reason.
    r = client.chat.completions.create(model=model_id, temperature=0, max_tokens=24, messages=[
        {"role": "user", "content": "What is the capital of France? Answer in one word."}])
    answer = r.choices[0].message.content
    c.check("Paris" in answer, f"chat answer names Paris: {answer!r}")
    c.check(r.choices[0].message.role == "assistant", "role is assistant")
    c.check(r.choices[0].finish_reason == "stop", f"finish_reason stop (EOG): {r.choices[0].finish_reason}")
    c.check(r.usage.prompt_tokens > 10 and 0 < r.usage.completion_tokens <= 24 and
            r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, f"usage {r.usage}")
    c.check(r.object == "chat.completion" and r.id.startswith("chatcmpl-"), "object and id")

    # Chat, streaming: the same text arrives in pieces, then a finish chunk and a usage chunk.
    stream = client.chat.completions.create(model=model_id, temperature=0, max_tokens=24, stream=True,
                                            stream_options={"include_usage": True}, messages=[
        {"role": "user", "content": "What is the capital of France? Answer in one word."}])
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            if ch.delta.content:
                pieces.append(ch.delta.content)
            if ch.finish_reason:
                finish = ch.finish_reason
    c.check("".join(pieces) == answer, f"streamed text equals the non-streamed one: {''.join(pieces)!r}")
    c.check(finish == "stop", f"stream finish_reason {finish}")
    c.check(usage is not None and usage.completion_tokens == r.usage.completion_tokens, f"stream usage {usage}")

    # Completions, length limit; streaming and not agree.
    r = client.completions.create(model=model_id, prompt="The capital of France is", max_tokens=8, temperature=0)
    text = r.choices[0].text
    c.check("Paris" in text, f"completion {text!r}")
    c.check(r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 8, f"length finish {r}")
    streamed = "".join(ch.choices[0].text for ch in client.completions.create(
        model=model_id, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True) if ch.choices)
    c.check(streamed == text, f"streamed completion {streamed!r} == {text!r}")

    # Stop strings: the output ends before the stop string, also when it spans tokens.
    full = client.completions.create(model=model_id, prompt="1, 2, 3, 4,", max_tokens=24, temperature=0).choices[0].text
    cut = full.find(" 7")
    if c.check(cut > 0, f"counting continuation {full!r}"):
        for stream_mode in (False, True):
            kw = dict(model=model_id, prompt="1, 2, 3, 4,", max_tokens=24, temperature=0, stop=[" 7", "xyz"])
            if stream_mode:
                chunks = list(client.completions.create(stream=True, **kw))
                got = "".join(ch.choices[0].text for ch in chunks if ch.choices)
                fin = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
            else:
                res = client.completions.create(**kw)
                got, fin = res.choices[0].text, [res.choices[0].finish_reason]
            c.check(got == full[:cut], f"stop (stream={stream_mode}): {got!r} != {full[:cut]!r}")
            c.check(fin == ["stop"], f"stop finish reason {fin}")
        # "6, 7" spans several tokens: the stop string matches across token boundaries.
        got = client.completions.create(model=model_id, prompt="1, 2, 3, 4,", max_tokens=24, temperature=0,
                                        stop=["6, 7"]).choices[0].text
        c.check(got == full[:full.find("6, 7")], f"multi-token stop: {got!r}")

    # Seeds: same seed, same text; sampling at temperature 1.
    kw = dict(model=model_id, prompt="Once upon a time", max_tokens=16, temperature=1.0, seed=1234)
    a = client.completions.create(**kw).choices[0].text
    b = client.completions.create(**kw).choices[0].text
    c.check(a == b, f"same seed, same text: {a!r} vs {b!r}")

    # Errors come back as the client's typed exceptions with OpenAI's error body.
    try:
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}])
        c.check(False, "unknown model accepted")
    except openai.NotFoundError as e:
        c.check(e.status_code == 404 and "gpt-4" in str(e), f"unknown model error: {e}")
    try:
        client.chat.completions.create(model=model_id, max_tokens=10**9, messages=[{"role": "user", "content": "hi"}])
        c.check(False, "absurd max_tokens accepted")
    except openai.BadRequestError as e:
        c.check(e.body.get("param") == "max_tokens", f"max_tokens error body {e.body}")
    try:
        client.completions.create(model=model_id, prompt="word " * 600, max_tokens=4)
        c.check(False, "prompt over the context accepted")
    except openai.BadRequestError as e:
        c.check(e.body.get("code") == "context_length_exceeded", f"context error body {e.body}")
    try:
        client.chat.completions.create(model=model_id, n=2, messages=[{"role": "user", "content": "hi"}])
        c.check(False, "n=2 accepted")
    except openai.BadRequestError as e:
        c.check(e.body.get("param") == "n", f"n error {e.body}")

    # Multi-turn chat with a system message.
    r = client.chat.completions.create(model=model_id, temperature=0, max_tokens=16, messages=[
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris"},
        {"role": "user", "content": "And of Germany?"}])
    # (A 135M model's answer is not reliable here; check that the whole conversation went in.)
    c.check(r.choices[0].message.content.strip() != "" and r.usage.prompt_tokens > 30,
            f"multi-turn: {r.choices[0].message.content!r}, usage {r.usage}")

    # Log-probabilities (chat: logprobs + top_logprobs; completions: logprobs N), streamed and not.
    q = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    r = client.chat.completions.create(model=model_id, temperature=0, max_tokens=12, messages=q, logprobs=True,
                                       top_logprobs=3)
    content = r.choices[0].logprobs.content
    c.check("".join(t.token for t in content) == r.choices[0].message.content,
            f"chat logprobs tokens spell the answer: {[t.token for t in content]}")
    c.check(all(len(t.top_logprobs) == 3 and t.top_logprobs[0].token == t.token and t.logprob <= 0 and
                t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob and
                bytes(t.bytes).decode("utf-8", "replace") == t.token for t in content),
            f"chat logprobs entries: {content[:2]}")
    streamed = []
    for chunk in client.chat.completions.create(model=model_id, temperature=0, max_tokens=12, messages=q,
                                                logprobs=True, top_logprobs=3, stream=True):
        for ch in chunk.choices:
            if ch.logprobs and ch.logprobs.content:
                streamed += [(t.token, round(t.logprob, 4)) for t in ch.logprobs.content]
    c.check(streamed == [(t.token, round(t.logprob, 4)) for t in content], f"streamed logprobs {streamed[:4]}")
    r = client.completions.create(model=model_id, prompt="The capital of France is", max_tokens=6, temperature=0,
                                  logprobs=2)
    lp = r.choices[0].logprobs
    c.check("".join(lp.tokens) == r.choices[0].text and len(lp.token_logprobs) == len(lp.tokens) and
            all(1 <= len(t) <= 2 for t in lp.top_logprobs) and lp.text_offset == sorted(lp.text_offset),
            f"completion logprobs {lp}")
    c.check(client.chat.completions.create(model=model_id, max_tokens=2, messages=q).choices[0].logprobs is None,
            "no logprobs unless asked")

    # The prompt cache: a chat's next turn reuses the session that holds the conversation so far
    # (usage.prompt_tokens_details.cached_tokens), and the answer is the same as without it.
    turn = [{"role": "user", "content": "Name a large city in Italy."}]
    r1 = client.chat.completions.create(model=model_id, temperature=0, max_tokens=12, messages=turn)
    turn += [{"role": "assistant", "content": r1.choices[0].message.content},
             {"role": "user", "content": "And one in Spain?"}]
    r2 = client.chat.completions.create(model=model_id, temperature=0, max_tokens=12, messages=turn)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    c.check(r1.usage.prompt_tokens <= cached < r2.usage.prompt_tokens,
            f"second turn: {cached} of {r2.usage.prompt_tokens} prompt tokens cached (first turn {r1.usage.prompt_tokens})")
    r3 = client.chat.completions.create(model=model_id, temperature=0, max_tokens=12, messages=turn)
    c.check(r3.usage.prompt_tokens_details.cached_tokens == r2.usage.prompt_tokens - 1 and
            r3.choices[0].message.content == r2.choices[0].message.content,
            f"the same turn again: {r3.usage} {r3.choices[0].message.content!r}")

    # curl: streaming SSE ends with [DONE]; /health; the chat page.
    if shutil.which("curl"):
        out = subprocess.run(["curl", "-sN", srv.url + "/v1/chat/completions", "-H", "Content-Type: application/json",
                              "-d", json.dumps({"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8,
                                                "stream": True})], capture_output=True, text=True, timeout=60).stdout
        events = [l[6:] for l in out.split("\n") if l.startswith("data: ")]
        c.check(len(events) >= 3 and events[-1] == "[DONE]", f"curl SSE events end with [DONE]: {out[-200:]!r}")
        c.check(all(json.loads(e)["object"] == "chat.completion.chunk" for e in events[:-1]), "curl chunks are JSON")
        out = subprocess.run(["curl", "-s", "-w", "%{http_code}", srv.url + "/v1/completions", "-d", "{oops"],
                             capture_output=True, text=True, timeout=30).stdout
        c.check(out.endswith("400") and '"invalid_request_error"' in out, f"curl bad JSON: {out}")
        out = subprocess.run(["curl", "-s", srv.url + "/health"], capture_output=True, text=True, timeout=30).stdout
        c.check(json.loads(out)["status"] == "ok", f"curl /health {out}")
        out = subprocess.run(["curl", "-s", srv.url + "/"], capture_output=True, text=True, timeout=30).stdout
        c.check("<script>" in out and "/v1/chat/completions" in out, "chat page served at /")
    else:
        print("note: curl not installed; skipping the curl checks")
    c.check(srv.alive(), "server still running")
c.done()
