"""What a hostile but fair client found (issue 44), each as it was reproduced, against a real
`ember serve`: non-streaming requests whose clients hang up stop generating; a second server on
a busy port is an error naming it; shutdown lets running requests finish within --shutdown-grace
and says so where it cuts one off (503 error, an error event ending the stream); a left-recursive
JSON schema is a 400 before any sequence is taken; slow connections (a header line every half
second, a body shorter than its Content-Length) get 408 after --read-timeout while /health stays
answerable; GET on a POST route is 405 with Allow; a type error in max_tokens says so."""
import http.client
import json
import re
import socket
import subprocess
import threading
import time
import urllib.request

import common

ember, model = common.args()
c = common.Checks("hostile")
LONG = {"messages": [{"role": "user", "content": "Write a very long story."}], "max_tokens": 1900}


def health(srv):
    try:
        with urllib.request.urlopen(srv.url + "/health", timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def raw_request(port, body, path="/v1/chat/completions"):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    data = json.dumps(body).encode()
    s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
              % (path.encode(), len(data)) + data)
    return s


def wait_for(pred, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


with common.Server(ember, model, "--read-timeout", "3", ctx=2048, parallel=4, queue=4) as srv:
    # 1. Four non-streaming requests whose clients leave after 1.5 s stop at once (not after 3000 tokens).
    socks = [raw_request(srv.port, LONG) for _ in range(4)]
    c.check(wait_for(lambda: health(srv)[1]["slots_busy"] == 4, 10), "four requests generating")
    time.sleep(1.0)
    before = health(srv)[1]["cancelled"]
    for s in socks:
        s.close()
    t0 = time.time()
    freed = wait_for(lambda: health(srv)[1]["slots_busy"] == 0, 10)
    # Uncancelled, they would generate for many seconds more (3000 tokens); 3 s leaves room for a
    # box whose two cores the other ctest job shares.
    c.check(freed and time.time() - t0 < 3.0, f"hung-up requests freed their sequences in {time.time() - t0:.2f} s")
    c.check(health(srv)[1]["cancelled"] == before + 4, f"four cancelled: {health(srv)[1]}")
    c.check("generated 1900 (length)" not in srv.read_log(), "no hung-up request ran to its limit")

    # 2. A second server on the same port is an error that names it.
    r = subprocess.run([ember, "serve", "-m", model, "--host", "127.0.0.1", "--port", str(srv.port), "-t", "1"],
                       capture_output=True, text=True, timeout=60)
    c.check(r.returncode != 0 and "port is in use" in r.stderr, f"second server: {r.returncode} {r.stderr[-300:]}")

    # 3. A recursive schema: 400 naming the path, before a sequence is taken.
    n_slot_lines = srv.read_log().count("slot ")
    schema = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}
    status, resp = common.post(srv.url + "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
    c.check(status == 400 and "left recursion" in resp["error"]["message"] and "#/$defs/a" in resp["error"]["message"],
            f"recursive schema: {status} {resp}")
    c.check(srv.read_log().count("slot ") == n_slot_lines, "the recursive schema took no sequence")

    # 4. Smaller: 405 with Allow; a type error in max_tokens says only that.
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    conn.request("GET", "/v1/chat/completions")
    r = conn.getresponse()
    body = json.loads(r.read())
    c.check(r.status == 405 and r.getheader("Allow") == "POST" and "takes POST" in body["error"]["message"],
            f"GET on a POST route: {r.status} {r.getheader('Allow')} {body}")
    conn.request("POST", "/health")
    r = conn.getresponse()
    r.read()
    c.check(r.status == 405 and "GET" in (r.getheader("Allow") or ""), f"POST on /health: {r.status}")
    conn.close()
    status, resp = common.post(srv.url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                                  "max_tokens": "5"})
    c.check(status == 400 and resp["error"]["message"] == "'max_tokens' must be an integer, got a string",
            f"max_tokens as a string: {resp}")

    # 5. Forty connections that send a header line every half second: /health answers at once
    # meanwhile, and each gets 408 after --read-timeout (3 s); so does a body shorter than its
    # Content-Length.
    slow = [socket.create_connection(("127.0.0.1", srv.port), timeout=30) for _ in range(40)]
    for s in slow:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    short = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    short.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{\"prompt\": ")
    stop = threading.Event()

    def drip():
        while not stop.is_set():
            for s in slow:
                try:
                    s.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    pass
            time.sleep(0.5)

    th = threading.Thread(target=drip)
    th.start()
    worst = 0.0
    for _ in range(8):
        t = time.time()
        status, h = health(srv)
        worst = max(worst, time.time() - t)
        time.sleep(0.5)
    # Starved workers would hold /health until --read-timeout (3 s) frees one (as in test_load.py).
    c.check(worst < 2.0, f"/health took up to {worst:.2f} s while 40 connections were held")
    stop.set()
    th.join()
    c.check(wait_for(lambda: health(srv)[1]["timed_out_connections"] >= 41, 6),
            f"slow connections closed: {health(srv)[1]['timed_out_connections']}")
    first = slow[0].recv(4096)
    c.check(first.startswith(b"HTTP/1.1 408") and b'"code":"timeout"' in first, f"slow connection got {first[:80]!r}")
    t = time.time()
    got = short.recv(4096)
    c.check(got.startswith(b"HTTP/1.1 408"), f"short body got {got[:80]!r} after {time.time() - t:.1f} s")
    for s in slow + [short]:
        s.close()
    c.check(srv.alive() and health(srv)[1]["status"] == "ok", "server fine after the slow clients")

# 6. Shutdown. With time to spare, running requests finish: the answer is whole, new requests and
# /health get 503 meanwhile, and the server exits once they are done.
with common.Server(ember, model, "--shutdown-grace", "60", ctx=2048, parallel=2) as srv:
    results = {}

    def short_request():
        results["short"] = common.post(srv.url + "/v1/completions",
                                       {"prompt": "Once upon a time", "max_tokens": 150, "temperature": 0})

    th = threading.Thread(target=short_request)
    th.start()
    c.check(wait_for(lambda: health(srv)[1]["slots_busy"] == 1, 10), "a request generating")
    srv.proc.send_signal(15)
    c.check(wait_for(lambda: health(srv)[0] == 503, 5), "draining: /health 503")
    status, h = health(srv)
    c.check(h.get("status") == "shutting_down", f"/health while draining: {h}")
    status, resp = common.post(srv.url + "/v1/completions", {"prompt": "x", "max_tokens": 2})
    c.check(status == 503 and resp["error"]["code"] == "server_shutting_down", f"new request while draining: {resp}")
    th.join()
    status, resp = results["short"]
    c.check(status == 200 and resp["choices"][0]["finish_reason"] == "length" and resp["usage"]["completion_tokens"] == 150,
            f"the running request finished whole: {status} {str(resp)[:200]}")
    c.check(wait_for(lambda: srv.proc.poll() is not None, 10), "the server exits once idle")

# Past the grace, answers are cut off and say so: a 503 error for a plain request, an error event
# (and no [DONE]) ending a stream; neither a 200 that looks complete.
with common.Server(ember, model, "--shutdown-grace", "1", ctx=2048, parallel=2) as srv:
    results = {}

    def plain():
        results["plain"] = common.post(srv.url + "/v1/chat/completions", LONG)

    def stream():
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
        conn.request("POST", "/v1/chat/completions", json.dumps({**LONG, "stream": True}),
                     {"Content-Type": "application/json"})
        results["stream"] = conn.getresponse().read().decode()

    threads = [threading.Thread(target=plain), threading.Thread(target=stream)]
    for t in threads:
        t.start()
    c.check(wait_for(lambda: health(srv)[1]["slots_busy"] == 2, 10), "two requests generating")
    srv.proc.send_signal(15)
    for t in threads:
        t.join()
    status, resp = results["plain"]
    c.check(status == 503 and resp["error"]["code"] == "server_shutting_down" and
            "before the answer was complete" in resp["error"]["message"], f"cut-off request: {status} {resp}")
    events = [line[6:] for line in results["stream"].splitlines() if line.startswith("data: ")]
    c.check(events and "server_shutting_down" in events[-1] and "[DONE]" not in events and
            not any('"finish_reason":"stop"' in e for e in events), f"cut-off stream ends with {events[-1:]}")
c.done()
