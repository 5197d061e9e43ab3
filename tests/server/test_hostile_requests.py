"""What a hostile client found in round two (issue 51), each probe as it was reported, against a
real `ember serve` started with the defaults: one small request must neither kill nor hang the
server, nor slow the others down. After every probe the server is alive and /health answers.
  - schemas: errors while sampling (a grammar too ambiguous to follow) end that request with a
    400 (or an error event ending its stream), never the process; bounds on nesting and size
    answered at once by name, with little memory;
  - JSON nested 100,000 deep (a body, a tool call's arguments, a schema's const): 400, no
    value echoed back;
  - a request under a forced tool with a deep schema does not slow a plain one beside it;
  - HTTP as RFC 9112 says: 405 for a GET on a POST route, 411 for a body without a length, 400
    for a malformed or doubled Content-Length, no 206 for a Range on a POST, pipelined requests
    answered in order, a form-encoded JSON body read as JSON past 8 KB; unguessable ids; a tool
    message that answers no call is 400;
  - chat templates (--chat-template-file, as a model file's would be) that crash, trap, spin or
    grow: `serve` starts or refuses with a message, a request they spin on ends with an error
    within the render's bounds, and SIGTERM stops the server meanwhile."""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time

import common

ember, model = common.args()
c = common.Checks("hostile_requests")


def chat(content, **kw):
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 20, **kw}


def schema_format(schema):
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def alive(srv, what):
    ok = srv.alive()
    if ok:
        try:
            ok = srv.health()["status"] == "ok"
        except OSError:
            ok = False
    c.check(ok, f"server alive and healthy after {what}")
    return ok


def post_raw(srv, path, text, timeout=60):
    return common.post(srv.url + path, text.encode(), timeout=timeout)


def stream_events(srv, path, body):
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    conn.request("POST", path, json.dumps({**body, "stream": True}), {"Content-Type": "application/json"})
    r = conn.getresponse()
    text = r.read().decode()  # whole: the stream is ended, not cut
    conn.close()
    return r.status, text


with common.Server(ember, model, ctx=2048, parallel=2) as srv:
    # 1. A grammar that breaks a bound while sampling: 5000 alternatives that start alike after
    # '{"a": '. The request gets a 400 naming the bound (an error event ending the stream, and
    # an Ollama error); the process lives on.
    ambiguous = {"type": "object", "properties": {"a": {"anyOf": [{"const": f"x{i}"} for i in range(5000)]}},
                 "required": ["a"]}
    status, resp = common.post(srv.url + "/v1/chat/completions", chat("hi", response_format=schema_format(ambiguous)))
    c.check(status == 400 and "more than 4096 readings" in resp["error"]["message"], f"ambiguous schema: {status} {resp}")
    alive(srv, "an ambiguous schema")
    status, text = stream_events(srv, "/v1/chat/completions", chat("hi", response_format=schema_format(ambiguous)))
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    c.check(status == 200 and events and "more than 4096 readings" in events[-1] and "[DONE]" not in events,
            f"ambiguous schema, streamed: {events[-1:]}")
    status, resp = common.post(srv.url + "/api/chat", {"model": srv.health()["model"], "stream": False,
                                                       "messages": [{"role": "user", "content": "hi"}], "format": ambiguous})
    c.check(status == 400 and "more than 4096 readings" in resp["error"], f"ambiguous format (Ollama): {status} {resp}")
    alive(srv, "an ambiguous format")
    # An enum of 5000 values (once "more than 4096 readings" at sampling time) is followed.
    enum = {"type": "object", "properties": {"a": {"enum": [f"v{i}" for i in range(5000)]}}, "required": ["a"]}
    status, resp = common.post(srv.url + "/v1/chat/completions", chat("hi", response_format=schema_format(enum)))
    c.check(status == 200 and json.loads(resp["choices"][0]["message"]["content"])["a"] in enum["properties"]["a"]["enum"],
            f"enum of 5000: {status} {str(resp)[:200]}")
    status, resp = common.post(srv.url + "/v1/chat/completions",
                               chat("hi", response_format=schema_format({"enum": [f"v{i}" for i in range(5000)]})))
    c.check(status == 200, f"top-level enum of 5000: {status} {str(resp)[:200]}")
    # Nesting: anyOf 258 deep is JSON 516 deep (refused as a body); a chain of 100 $refs is 100
    # schema levels (refused at 64). Both at once, by name, with a short message.
    deep = {"type": "string"}
    for _ in range(258):
        deep = {"anyOf": [deep]}
    chain = {"$ref": "#/$defs/d0", "$defs": {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(100)}}
    chain["$defs"]["d100"] = {"type": "string"}
    for name, schema, want in [("anyOf 258 deep", deep, "deeper than 128 levels"),
                               ("100 chained $refs", chain, "nests deeper than 64 levels")]:
        for path, body in [("/v1/chat/completions", chat("hi", response_format=schema_format(schema))),
                           ("/v1/chat/completions", chat("call f", tools=[{"type": "function", "function": {
                               "name": "f", "parameters": schema}}], tool_choice={"type": "function", "function": {"name": "f"}})),
                           ("/api/chat", {"model": srv.health()["model"], "messages": [{"role": "user", "content": "hi"}],
                                          "stream": False, "format": schema})]:
            status, resp = common.post(srv.url + path, body)
            text = json.dumps(resp)
            c.check(status == 400 and want in text and len(text) < 600, f"{name} to {path}: {status} {text[:300]}")
    alive(srv, "the schema probes")

    # 2. JSON nested 60,000-100,000 deep: a body, a tool call's arguments, a schema's const, a
    # /detokenize body. 400 naming the bound; nothing echoed back.
    nest = "[" * 60000 + "]" * 60000
    probes = {
        "/detokenize": '{"tokens": ' + nest + '}',
        "/v1/chat/completions": '{"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": '
                                '"json_schema", "json_schema": {"name": "x", "schema": {"const": ' + nest + '}}}}',
        "/api/chat": '{"messages": [{"role": "user", "content": "hi"}], "stream": false, "format": ' + nest + '}',
        "/v1/embeddings": '{"input": ' + nest + '}',
    }
    for path, body in probes.items():
        status, resp = post_raw(srv, path, body)
        text = json.dumps(resp)
        c.check(status == 400 and "deeper than 128 levels" in text and len(text) < 1000, f"{path} nested 60,000 deep: {status} {text[:200]}")
    # Deep tool-call arguments (a string, parsed for the template) and tool parameters: no crash.
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                                   "function": {"name": "f", "arguments": nest}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "x"}]
    status, resp = common.post(srv.url + "/v1/chat/completions", {"messages": msgs, "max_tokens": 2})
    c.check(status in (200, 400), f"deep tool-call arguments: {status} {str(resp)[:200]}")
    alive(srv, "the nesting probes")

    # 3. A 20 KB schema of 300 arrays of up to 10,000 items: refused at once (the grammar's size
    # bound), with little memory; ten of them at once too.
    wide = {"anyOf": [{"type": "array", "items": {"type": "integer"}, "maxItems": 9999 - i} for i in range(300)]}
    status, resp = common.post(srv.url + "/v1/chat/completions", chat("call f", tools=[{"type": "function", "function": {
        "name": "f", "parameters": wide}}], tool_choice={"type": "function", "function": {"name": "f"}}))
    c.check(status == 400 and "more than 262144 symbols" in resp["error"]["message"], f"large forced tool: {status} {resp}")
    rss0 = srv.rss_kib()
    t = time.time()
    results = []
    threads = [threading.Thread(target=lambda: results.append(common.post(
        srv.url + "/v1/chat/completions", chat("hi", response_format=schema_format(wide))))) for _ in range(10)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    took = time.time() - t
    c.check(all(s == 400 and "more than 262144 symbols" in r["error"]["message"] for s, r in results),
            f"300 arrays of 10,000 items: {[(s, str(r)[:100]) for s, r in results[:2]]}")
    grown = (srv.rss_kib() - rss0) / 1024
    c.check(took < 10 and grown < 300, f"ten large schemas took {took:.1f} s and {grown:.0f} MB (once 18 s and 3 GB each)")
    alive(srv, "the large schemas")

# 9. HTTP.
def exchange(port, data, timeout=5, wait_close=True):
    """Sends raw bytes; returns what comes back until the server closes or `timeout` passes."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(data)
    out, t = b"", time.time()
    try:
        while time.time() - t < timeout:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
            if not wait_close and out.count(b"\r\n\r\n") >= 1 and b"Content-Length" in out:
                break
    except socket.timeout:
        pass
    s.close()
    return out, time.time() - t


with common.Server(ember, model, ctx=512, parallel=2) as srv:
    for path in ("/v1/embeddings", "/api/embed", "/api/embeddings", "/embeddings"):
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        conn.request("GET", path)
        r = conn.getresponse()
        r.read()
        c.check(r.status == 405 and r.getheader("Allow") == "POST", f"GET {path}: {r.status} {r.getheader('Allow')}")
        conn.close()
    body = b'{"prompt": "hi", "max_tokens": 2}'
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    for name, data, want in [
            ("no Content-Length", head + b"\r\n" + body, b"HTTP/1.1 411"),
            ("Content-Length -1", head + b"Content-Length: -1\r\n\r\n" + body, b"HTTP/1.1 400"),
            ("a 20-digit Content-Length", head + b"Content-Length: 12345678901234567890\r\n\r\n" + body, b"HTTP/1.1 400"),
            ("two Content-Lengths", head + b"Content-Length: %d\r\nContent-Length: 5\r\n\r\n" % len(body) + body,
             b"HTTP/1.1 400"),
            ("Content-Length and chunked", head + b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n" % len(body)
             + body, b"HTTP/1.1 400")]:
        got, took = exchange(srv.port, data)
        c.check(got.startswith(want) and took < 3, f"{name}: {got[:60]!r} after {took:.1f} s")
    # A Range header on a POST is ignored (no 206).
    got, _ = exchange(srv.port, head + b"Range: bytes=0-5\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    c.check(got.startswith(b"HTTP/1.1 200") and b'"choices"' in got, f"Range on a POST: {got[:80]!r}")
    # Three pipelined requests on one connection, answered in order.
    one = lambda i: (b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(b'{"content": "w%d"}' % i)
                     + b'{"content": "w%d"}' % i)
    got, _ = exchange(srv.port, one(1) + one(2) + one(3) + b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
    c.check(got.count(b"HTTP/1.1 200") == 4 and got.rstrip().endswith(b"}"), f"pipelined: {got.count(b'HTTP/1.1 200')} answers")
    # curl -d sends application/x-www-form-urlencoded: the JSON body is read as JSON past 8 KB.
    big = json.dumps({"content": "x" * 9000}).encode()
    status, resp = common.post(srv.url + "/tokenize", big, headers={"Content-Type": "application/x-www-form-urlencoded"})
    c.check(status == 200 and resp["tokens"], f"a 9 KB form-encoded JSON body: {status} {str(resp)[:120]}")
    # Chunked request bodies and Expect: 100-continue (curl sends it past 1 KB).
    parts = [b'{"content"', b': "abc"}']
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
    got, _ = exchange(srv.port, b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                      + chunked)
    c.check(got.startswith(b"HTTP/1.1 200") and b'"tokens"' in got, f"a chunked body: {got[:80]!r}")
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
    s.sendall(head + b"Expect: 100-continue\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body))
    interim = s.recv(100)
    s.sendall(body)
    rest = b""
    while chunk := s.recv(65536):
        rest += chunk
    s.close()
    c.check(interim.startswith(b"HTTP/1.1 100 Continue") and rest.startswith(b"HTTP/1.1 200"), f"100-continue: {interim!r}")
    # Ids: random, not a counter.
    ids = []
    for _ in range(3):
        _, resp = common.post(srv.url + "/v1/chat/completions", chat("hi", max_tokens=1))
        ids.append(resp["id"])
    suffixes = [re.sub(r"^chatcmpl-", "", i) for i in ids]
    c.check(all(len(x) >= 24 for x in suffixes) and len({x[:16] for x in suffixes}) == 3, f"ids {ids}")
    # A tool message that answers no call.
    status, resp = common.post(srv.url + "/v1/chat/completions", {"messages": [
        {"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "nope", "content": "42"}]})
    c.check(status == 400 and resp["error"]["param"] == "messages[1].tool_call_id", f"an unanswered tool result: {status} {resp}")
    alive(srv, "the HTTP probes")

# 7. logit_bias, presence_penalty and frequency_penalty as OpenAI defines them (once ignored).
with common.Server(ember, model, ctx=1024, parallel=1) as srv:
    def answer(**kw):
        status, resp = common.post(srv.url + "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Write the word hello ten times."}], "max_tokens": 24,
            "temperature": 0, **kw})
        c.check(status == 200, f"penalties {kw}: {status} {str(resp)[:200]}")
        return resp["choices"][0]["message"]["content"] if status == 200 else ""

    plain = answer()
    status, toks = common.post(srv.url + "/tokenize", {"content": plain})
    banned = answer(logit_bias={str(t): -100 for t in toks["tokens"]})
    _, toks_b = common.post(srv.url + "/tokenize", {"content": banned})
    c.check(banned and not set(toks["tokens"][:3]) & set(toks_b["tokens"][:3]),
            f"logit_bias -100 on the plain answer's tokens: {plain!r} -> {banned!r}")
    forced = answer(logit_bias={str(toks["tokens"][0]): 100}, max_tokens=3)
    c.check(forced.startswith(plain[:len(forced)]) or forced, f"logit_bias +100: {forced!r}")
    def complete(**kw):  # greedy, this model repeats the word
        status, resp = common.post(srv.url + "/v1/completions", {"prompt": "hello hello hello hello hello hello",
                                                                  "max_tokens": 24, "temperature": 0, **kw})
        return resp["choices"][0]["text"] if status == 200 else ""

    hellos = complete().count("hello")
    for kw in [{"frequency_penalty": 2.0}, {"presence_penalty": 2.0}]:
        penalized = complete(**kw).count("hello")
        c.check(hellos >= 4 and penalized < hellos, f"{kw}: {penalized} hellos, without it {hellos}")
    for bad in [{"logit_bias": "x"}, {"logit_bias": {"x": 1}}, {"logit_bias": {"1": 500}}, {"presence_penalty": 3},
                {"frequency_penalty": "1"}]:
        status, resp = common.post(srv.url + "/v1/chat/completions", chat("hi", **bad))
        c.check(status == 400 and resp["error"]["param"] == next(iter(bad)), f"{bad}: {status} {resp}")
    status, resp = common.post(srv.url + "/api/chat", {"model": srv.health()["model"], "stream": False,
                                                       "messages": [{"role": "user", "content": "hi"}],
                                                       "options": {"presence_penalty": "x"}})
    c.check(status == 400 and "presence_penalty" in resp["error"], f"Ollama's presence_penalty 'x': {status} {resp}")

# 6. A request constrained by a forced tool whose schema nests 60 objects deep does not slow a
# plain request beside it more than an unconstrained request of the same prompt does (once
# 19.4 s instead of 1.0 s). Prompts cached first, so that only the generation is compared.
with common.Server(ember, model, ctx=2048, parallel=2, threads=2) as srv:
    nested = {"type": "string"}
    for _ in range(60):
        nested = {"type": "object", "properties": {"k": nested}, "required": ["k"]}
    tools = [{"type": "function", "function": {"name": "f", "parameters": nested}}]
    plain = {"messages": [{"role": "user", "content": "Count from 1 to 100."}], "max_tokens": 60, "temperature": 0}

    def beside(forced):
        other = {"messages": [{"role": "user", "content": "call f"}], "max_tokens": 300, "tools": tools, "temperature": 0}
        if forced:
            other["tool_choice"] = {"type": "function", "function": {"name": "f"}}
        res = {}
        th = threading.Thread(target=lambda: res.update(r=common.post(srv.url + "/v1/chat/completions", other)))
        th.start()
        time.sleep(0.3)
        t = time.time()
        status, _ = common.post(srv.url + "/v1/chat/completions", plain)
        took = time.time() - t
        th.join()
        c.check(status == 200 and res["r"][0] == 200, f"plain beside {'forced' if forced else 'free'}: {status} {res['r'][0]}")
        return took

    beside(False), beside(True)  # the prompts cached
    free = sorted(beside(False) for _ in range(3))[1]
    forced = sorted(beside(True) for _ in range(3))[1]
    c.check(forced < 2.5 * free + 0.3, f"plain beside a forced deep tool {forced:.2f} s, beside a free one {free:.2f} s")
    status, resp = common.post(srv.url + "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "A JSON object about a cat."}], "max_tokens": 38, "top_k": 0,
        "temperature": 1, "response_format": {"type": "json_object"}})
    c.check(status == 200, f"json_object at top_k 0: {status}")
    alive(srv, "the constrained requests")

# 4, 5. Hostile chat templates. Each either serves (a request it breaks on gets a 500 naming the
# bound) or `serve` exits at once with a message: never a signal, never a hang.
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPIN = ("{% set r = range(3000) %}{% for i in r %}{% for j in r %}{% for k in r %}{% endfor %}{% endfor %}{% endfor %}")
templates = {
    "100k default filters": "{{ x" + "|default(1)" * 100000 + " }}" + CHATML,
    "50k default filters": "{{ x" + "|default(1)" * 50000 + " }}" + CHATML,
    "200k terms": "{{ 1" + " + 1" * 200000 + " }}" + CHATML,
    "INT64_MIN % -1": "{{ (-9223372036854775807 - 1) % -1 }}{{ (-9223372036854775807 - 1) // -1 }}" + CHATML,
    "empty loops": SPIN + CHATML,
    "large empty loops": "{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}" + CHATML,
    "string doubling": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}" + CHATML,
    "list doubling": "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}" + CHATML,
    "replace": "{% set s = 'a' * 1000000 %}{{ s.replace('a', 'b' * 100000) | length }}" + CHATML,
    "tojson indent": "{{ messages | tojson(indent=2000000000) | length }}" + CHATML,
    "indent": "{{ ('a\n' * 1000) | indent(100000000) | length }}" + CHATML,
    "join": "{{ range(100000) | join('x' * 1000000) | length }}" + CHATML,
}
tmp = tempfile.mkdtemp(prefix="ember-hostile-")
for name, source in templates.items():
    path = os.path.join(tmp, "t.jinja")
    with open(path, "w") as f:
        f.write(source)
    t = time.time()
    try:
        with common.Server(ember, model, "--chat-template-file", path, ctx=512, parallel=1) as srv:
            status, resp = common.post(srv.url + "/v1/chat/completions", chat("hi", max_tokens=2), timeout=30)
            c.check(status in (200, 500) and srv.alive(), f"template '{name}': {status} {str(resp)[:200]}")
            alive(srv, f"template '{name}'")
    except RuntimeError as e:  # `serve` refused the template: at once, with a message, by its exit code
        log = str(e)
        c.check("exited with 1" in log and "chat template" in log and time.time() - t < 20,
                f"template '{name}' refused: {log[-300:]}")
# --chat-template-file /dev/zero: refused at once (it never ends).
t = time.time()
r = subprocess.run([ember, "serve", "-m", model, "--port", "0", "-t", "1", "--chat-template-file", "/dev/zero"],
                   capture_output=True, text=True, timeout=60)
c.check(r.returncode == 1 and "larger than 1048576 bytes" in r.stderr and time.time() - t < 20,
        f"/dev/zero as the template: {r.returncode} {r.stderr[-300:]}")

# A template that spins on some conversations (a fourth message): that request ends with a 500
# naming the bound within seconds, the others are answered meanwhile, and SIGTERM during such a
# render stops the server at once.
path = os.path.join(tmp, "t.jinja")
with open(path, "w") as f:
    f.write("{% if messages | length > 3 %}" + SPIN + "{% endif %}" + CHATML)
four = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                     {"role": "user", "content": "c"}, {"role": "user", "content": "d"}], "max_tokens": 2}
with common.Server(ember, model, "--chat-template-file", path, ctx=512, parallel=2) as srv:
    t = time.time()
    status, resp = common.post(srv.url + "/v1/chat/completions", four, timeout=60)
    took = time.time() - t
    c.check(status == 500 and ("steps" in resp["error"]["message"] or "longer than" in resp["error"]["message"]) and took < 15,
            f"spinning template: {status} after {took:.1f} s: {str(resp)[:200]}")
    res = {}
    th = threading.Thread(target=lambda: res.update(r=common.post(srv.url + "/v1/chat/completions", four, timeout=60)))
    th.start()
    time.sleep(0.5)
    status, _ = common.post(srv.url + "/v1/chat/completions", chat("hi", max_tokens=2))
    c.check(status == 200, f"a plain request beside the spinning render: {status}")
    t = time.time()
    srv.proc.send_signal(signal.SIGTERM)
    try:
        srv.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pass
    c.check(srv.proc.poll() is not None and time.time() - t < 12, f"SIGTERM during the spin: exited after {time.time() - t:.1f} s")
    th.join()
c.done()
