"""Bad input never crashes the server: random bytes, truncated JSON, wrong types, a 10 MB body,
raw non-HTTP bytes on the socket each get a 4xx (or a closed connection), and /health answers
afterwards. Also: the bounded queue answers 503 past its limit, and a client that disconnects
mid-stream (or while queued) frees its session."""
import http.client
import json
import random
import socket
import threading
import time

import common

ember, model = common.args()
c = common.Checks("robustness")


def wait_idle(srv, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        h = srv.health()
        if h["slots_busy"] == 0 and h["queued"] == 0:
            return h
        time.sleep(0.05)
    return srv.health()


with common.Server(ember, model, "--max-body", "4") as srv:
    url = srv.url
    chat = url + "/v1/chat/completions"
    comp = url + "/v1/completions"
    rng = random.Random(7)

    # Random bytes, truncated JSON, wrong types.
    good = json.dumps({"model": "SmolLM2-135M-Instruct.Q4_1", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 4, "stop": ["x"]})
    bodies = [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400))) for _ in range(30)]
    bodies += [good[:i].encode() for i in range(0, len(good), 7)]
    bodies += [b"\xff\xfe{}", b"{\"messages\": \"\xc3\x28\"}", b"null", b"[]", b"123", b"\"str\"", b"{}" * 100]
    wrong = [{"messages": 1}, {"messages": [{"role": "user", "content": 5}]}, {"messages": [None]},
             {"messages": [{"role": "user", "content": "x"}], "max_tokens": -5},
             {"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**20},
             {"messages": [{"role": "user", "content": "x"}], "temperature": [1]},
             {"messages": [{"role": "user", "content": "x"}], "stop": [[]]},
             {"messages": [{"role": "user", "content": "x"}], "stream": 1},
             {"messages": [{"role": "user", "content": "x"}], "seed": 1.5},
             {"messages": [{"role": "user", "content": "x"}], "model": "nope"},
             {"messages": [{"role": "user", "content": "x"}], "model": None, "top_p": 7}]
    bodies += [json.dumps(w).encode() for w in wrong]
    statuses = set()
    for i, body in enumerate(bodies):
        for target in (chat, comp):
            status, resp = common.post(target, body)
            statuses.add(status)
            ok = 400 <= status < 500 and isinstance(resp, dict) and isinstance(resp.get("error", {}).get("message"), str)
            c.check(ok, f"garbage #{i} to {target}: {status} {str(resp)[:200]}")
    c.check(statuses <= {400, 404}, f"statuses {statuses}")

    # A 10 MB body: refused with 413 (or the connection closed while sending), never a crash.
    big = b'{"prompt": "' + b"a" * (10 << 20) + b'"}'
    try:
        status, resp = common.post(comp, big)
        c.check(status == 413, f"10 MB body: {status} {str(resp)[:200]}")
    except (ConnectionError, OSError) as e:
        c.check(True, "")
        print(f"note: 10 MB body: connection closed while sending ({e})")
    # A body just over --max-body (4 KiB) gets 413 with a JSON error.
    status, resp = common.post(comp, b'{"prompt": "' + b"a" * 5000 + b'"}')
    c.check(status == 413 and "more than 4096 (see --max-body)" in resp["error"]["message"], f"5 KB body: {status} {resp}")

    # Raw bytes that are not HTTP, a header line without end, a wrong method, an unknown path.
    for raw in [bytes(rng.randrange(256) for _ in range(2000)), b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X: y" * 5000,
                b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n{",
                b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"]:
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        try:
            s.sendall(raw)
            s.shutdown(socket.SHUT_WR)
            s.recv(4096)
        except OSError:
            pass
        s.close()
    status, resp = common.post(url + "/v1/nowhere", {})
    c.check(status == 404 and "error" in resp, f"unknown path {status} {resp}")
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    conn.request("GET", "/v1/chat/completions")
    r = conn.getresponse()
    c.check(400 <= r.status < 500, f"GET on a POST endpoint: {r.status}")
    conn.close()

    h = srv.health()
    c.check(h["status"] == "ok" and srv.alive(), f"/health after garbage: {h}")

    # A client that disconnects mid-stream stops its generation and frees its session.
    before = srv.health()["cancelled"]
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    conn.request("POST", "/v1/completions", json.dumps({"prompt": "Once upon a time", "max_tokens": 400,
                                                        "stream": True, "temperature": 1}),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    got = resp.readline()
    c.check(got.startswith(b"data: "), f"first stream line {got!r}")
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    h = wait_idle(srv)
    c.check(h["slots_busy"] == 0 and h["cancelled"] == before + 1, f"disconnect freed the session: {h}")

with common.Server(ember, model, parallel=1, queue=2) as srv:
    # Queue limit: 1 generating + 2 waiting; the rest get 503 at once with a clear message.
    body = {"prompt": "Once upon a time", "max_tokens": 60, "temperature": 0}
    results = []
    lock = threading.Lock()

    def worker():
        r = common.post(srv.url + "/v1/completions", body)
        with lock:
            results.append(r)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
        time.sleep(0.02)
    for t in threads:
        t.join()
    codes = sorted(s for s, _ in results)
    c.check(codes == [200, 200, 200, 503, 503, 503], f"queue limit statuses {codes}")
    busy = [r for s, r in results if s == 503]
    c.check(all("busy" in r["error"]["message"] and r["error"]["code"] == "server_busy" for r in busy),
            f"503 message {busy[:1]}")
    h = srv.health()
    c.check(h["rejected"] == 3 and h["slots_busy"] == 0, f"health after the burst {h}")

    # A streaming client that gives up while queued leaves the line.
    long_req = json.dumps({"prompt": "Once upon a time", "max_tokens": 200, "temperature": 0, "stream": True})
    first = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    first.request("POST", "/v1/completions", long_req, {"Content-Type": "application/json"})
    first_resp = first.getresponse()
    first_resp.readline()
    second = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    second.request("POST", "/v1/completions", long_req, {"Content-Type": "application/json"})
    second.getresponse()
    time.sleep(0.3)
    c.check(srv.health()["queued"] == 1, "second stream is queued")
    second.sock.shutdown(socket.SHUT_RDWR)
    second.close()
    deadline = time.time() + 5
    while time.time() < deadline and srv.health()["queued"] != 0:
        time.sleep(0.05)
    c.check(srv.health()["queued"] == 0, f"queued client that left is gone: {srv.health()}")
    first.sock.shutdown(socket.SHUT_RDWR)
    first.close()
    h = wait_idle(srv)
    c.check(h["slots_busy"] == 0, f"all free at the end {h}")
    c.check(srv.alive(), "server alive")
c.done()
