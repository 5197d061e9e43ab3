"""Ollama's API against its own Python client (the `ollama` package): list, show, ps, version,
chat and generate (streaming and not, raw, a system message), Ollama's option names, structured
`format` (json and a JSON schema), errors; the same greedy answer as OpenAI's route. Then the
operations a deployment needs: /metrics in Prometheus' text format, /tokenize and /detokenize,
/props (the model's recommended sampling), an API key (401 without it, /health open, the openai
and ollama clients with it), CORS headers and preflight."""
import json
import re
import urllib.request

import common

ember, model = common.args()
ollama, openai = common.clients("ollama", "openai")

c = common.Checks("ollama")
M = "SmolLM2-135M-Instruct.Q4_1"
Q = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]

with common.Server(ember, model, ctx=1024) as srv:
    client = ollama.Client(host=srv.url)
    listed = client.list().models
    c.check(len(listed) == 1 and listed[0].model == M + ":latest" and listed[0].details.family == "llama" and
            listed[0].details.quantization_level == "Q4_1" and listed[0].size > 90_000_000, f"list {listed}")
    shown = client.show(M)
    c.check("temperature 0.2" in shown.parameters and "im_start" in shown.template and
            shown.modelinfo["general.architecture"] == "llama", f"show {str(shown)[:300]}")
    running = client.ps().models
    c.check(len(running) == 1 and running[0].model == M + ":latest", f"ps {running}")
    with urllib.request.urlopen(srv.url + "/api/version") as r:
        c.check(re.match(r"\d+\.\d+\.\d+$", json.loads(r.read())["version"]) is not None, "version")

    # Chat, not streaming and streaming: the greedy answer, as OpenAI's route gives it.
    r = client.chat(model=M, messages=Q, options={"temperature": 0, "num_predict": 24})
    answer = r.message.content
    c.check("Paris" in answer and r.message.role == "assistant" and r.done and r.done_reason == "stop",
            f"chat {r}")
    c.check(r.eval_count > 0 and r.prompt_eval_count > 10 and r.total_duration > 0 and r.eval_duration > 0,
            f"counts and durations {r}")
    chunks = list(client.chat(model=M, messages=Q, options={"temperature": 0, "num_predict": 24}, stream=True))
    c.check("".join(ch.message.content for ch in chunks) == answer and chunks[-1].done and
            not any(ch.done for ch in chunks[:-1]), f"streamed chat {[ch.message.content for ch in chunks]}")
    oa = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
    same = oa.chat.completions.create(model=M, messages=Q, temperature=0, max_tokens=24).choices[0].message.content
    c.check(same == answer, f"OpenAI's route gives the same greedy answer: {same!r} vs {answer!r}")

    # Generate: through the template with a system message, raw, num_predict, stop.
    g = client.generate(model=M, prompt="What is the capital of France?", system="Answer in one word.",
                        options={"temperature": 0, "num_predict": 16})
    c.check("Paris" in g.response and g.done, f"generate {g.response!r}")
    raw = client.generate(model=M, prompt="The capital of France is", raw=True, options={"temperature": 0, "num_predict": 8})
    c.check("Paris" in raw.response and raw.done_reason == "length" and raw.eval_count == 8, f"raw {raw}")
    pieces = list(client.generate(model=M, prompt="The capital of France is", raw=True, stream=True,
                                  options={"temperature": 0, "num_predict": 8}))
    c.check("".join(p.response for p in pieces) == raw.response, "streamed generate")
    stopped = client.generate(model=M, prompt="1, 2, 3, 4,", raw=True, options={"temperature": 0, "num_predict": 24, "stop": ["7"]})
    c.check("7" not in stopped.response and "6" in stopped.response, f"stop {stopped.response!r}")

    # Structured output: "json", and a schema the answer validates against.
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "population": {"type": "integer"}},
              "required": ["city", "population"]}
    s = client.chat(model=M, messages=[{"role": "user", "content": "Describe Paris as JSON."}], format=schema,
                    options={"temperature": 0, "num_predict": 200})
    doc = json.loads(s.message.content)
    c.check(isinstance(doc.get("city"), str) and isinstance(doc.get("population"), int), f"schema output {doc}")
    j = client.generate(model=M, prompt="Reply in JSON.", format="json", options={"temperature": 0, "num_predict": 120})
    c.check(j.response.lstrip().startswith("{"), f"json output {j.response[:80]!r}")

    # Errors: an unknown model (404), a bad option (400), too small a context (400).
    for call, status, needle in [
            (lambda: client.chat(model="llama3", messages=Q), 404, "not found"),
            (lambda: client.generate(model=M, prompt="x", options={"temperature": "hot"}), 400, "temperature"),
            (lambda: client.generate(model=M, prompt="word " * 300, options={"num_ctx": 64}), 400, "num_ctx")]:
        try:
            call()
            c.check(False, f"accepted; expected {status}")
        except ollama.ResponseError as e:
            c.check(e.status_code == status and needle in e.error, f"error {e.status_code} {e.error}")

    # Operations: /tokenize and /detokenize, /props, /metrics.
    status, tok = common.post(srv.url + "/tokenize", {"content": "Hello world", "with_pieces": True})
    c.check(status == 200 and [t["piece"] for t in tok["tokens"]] == ["Hello", " world"], f"tokenize {tok}")
    status, back = common.post(srv.url + "/detokenize", {"tokens": [t["id"] for t in tok["tokens"]]})
    c.check(status == 200 and back["content"] == "Hello world", f"detokenize {back}")
    status, bad = common.post(srv.url + "/detokenize", {"tokens": [10**9]})
    c.check(status == 400 and bad["error"]["param"] == "tokens", f"detokenize out of range {bad}")
    with urllib.request.urlopen(srv.url + "/props") as r:
        props = json.loads(r.read())
    c.check(abs(props["default_generation_settings"]["temperature"] - 0.2) < 1e-6 and props["total_slots"] == 2,
            f"props {props}")
    with urllib.request.urlopen(srv.url + "/metrics") as r:
        text = r.read().decode()
        c.check(r.headers["Content-Type"].startswith("text/plain"), "metrics content type")
    samples = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        m = re.match(r'^([a-z_]+)(\{[^}]*\})? (-?[0-9.e+]+|\+Inf)$', line)
        c.check(m is not None, f"a Prometheus sample line: {line!r}")
        if m:
            samples[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    gen = samples.get(f'ember_generations_total{{model="{M}"}}', 0)
    c.check(gen >= 9, f"generations counted: {gen}")
    c.check(samples.get(f'ember_requests_total{{model="{M}",status="404"}}', 0) >= 1, "404s counted")
    c.check(samples.get(f'ember_time_to_first_token_seconds_count{{model="{M}"}}', 0) >= 9, "time to first token counted")
    c.check(samples.get(f'ember_generated_tokens_total{{model="{M}"}}', 0) > 50, "tokens counted")
    c.check(0 < samples.get(f'ember_kv_cache_usage_ratio{{model="{M}"}}', 0) <= 1, "KV cache use")

    # CORS, as Ollama allows it by default: a local page's preflight and the header on answers;
    # a page of another origin is refused (--cors names more, below).
    def cors(origin, method="OPTIONS", url="/v1/chat/completions"):
        req = urllib.request.Request(srv.url + url, method=method,
                                     headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
        try:
            with urllib.request.urlopen(req) as r:
                return r.status, dict(r.headers)
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers)

    status, h = cors("http://localhost:3000")
    c.check(status == 204 and "POST" in h.get("Access-Control-Allow-Methods", "") and
            "Authorization" in h.get("Access-Control-Allow-Headers", "") and
            h.get("Access-Control-Allow-Origin") == "http://localhost:3000", f"local preflight {status} {h}")
    status, h = cors("http://127.0.0.1:5173", "GET", "/v1/models")
    c.check(status == 200 and h.get("Access-Control-Allow-Origin") == "http://127.0.0.1:5173", f"CORS header on answers {h}")
    status, h = cors(srv.url, "GET", "/v1/models")
    c.check(status == 200, f"the server's own origin {status}")
    for origin in ("http://example.com", "null", "http://127.0.0.1.example.com"):
        status, h = cors(origin)
        c.check(status == 403 and "Access-Control-Allow-Origin" not in h, f"preflight from {origin}: {status} {h}")
        status, _ = cors(origin, "GET", "/v1/models")
        c.check(status == 403, f"GET from {origin}: {status}")
    status, resp = common.post(srv.url + "/v1/completions", b'{"prompt": "x", "max_tokens": 1}',
                               headers={"Origin": "http://example.com", "Content-Type": "text/plain"})
    c.check(status == 403 and resp["error"]["code"] == "origin_not_allowed", f"a simple cross-origin POST: {status} {resp}")

with common.Server(ember, model, "--cors", "http://example.com", ctx=512) as srv:
    req = urllib.request.Request(srv.url + "/v1/models", headers={"Origin": "http://example.com"})
    with urllib.request.urlopen(req) as r:
        c.check(r.headers["Access-Control-Allow-Origin"] == "http://example.com", "--cors names an origin")

# An API key: everything but /health and the page needs it, as a Bearer token.
with common.Server(ember, model, "--api-key", "s3cret", ctx=512) as srv:
    for path in ("/health", "/"):
        with urllib.request.urlopen(srv.url + path) as r:
            c.check(r.status == 200, f"{path} without a key")
    status, resp = common.post(srv.url + "/v1/completions", {"prompt": "x", "max_tokens": 1})
    c.check(status == 401 and resp["error"]["code"] == "invalid_api_key", f"no key: {status} {resp}")
    status, resp = common.post(srv.url + "/v1/completions", {"prompt": "x", "max_tokens": 1},
                               headers={"Authorization": "Bearer wrong"})
    c.check(status == 401 and "not valid" in resp["error"]["message"], f"wrong key: {status} {resp}")
    oa = openai.OpenAI(base_url=srv.url + "/v1", api_key="s3cret", max_retries=0)
    c.check(oa.completions.create(model=M, prompt="Hi", max_tokens=2).usage.completion_tokens == 2, "openai with the key")
    ok_client = ollama.Client(host=srv.url, headers={"Authorization": "Bearer s3cret"})
    c.check(ok_client.generate(model=M, prompt="Hi", options={"num_predict": 2}).eval_count == 2, "ollama with the key")
    try:
        ollama.Client(host=srv.url).list()
        c.check(False, "ollama without the key was accepted")
    except ollama.ResponseError as e:
        c.check(e.status_code == 401, f"ollama without the key: {e.status_code}")
c.done()
