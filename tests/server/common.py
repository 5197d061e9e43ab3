"""Shared helpers of the server tests: start `ember serve` on a free loopback port, wait until
it answers, stop it (never leaving it running), read its resident memory, skip cleanly."""
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

SKIP = 77  # ctest SKIP_RETURN_CODE
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(SKIP)


def clients(*names):
    """Imports the client packages a test drives (`openai`, `ollama`, ...), or skips the test."""
    import importlib
    try:
        return [importlib.import_module(n) for n in names]
    except ImportError as e:
        skip(f"the Python package {e.name!r} is not installed (scripts/setup.sh --tests installs the clients into .venv)")


def args():
    if len(sys.argv) < 3:
        print(f"usage: {sys.argv[0]} path/to/ember models-dir", file=sys.stderr)
        sys.exit(2)
    ember, models = sys.argv[1], sys.argv[2]
    model = os.path.join(models, MODEL_FILE)
    if not os.path.isfile(model):
        skip(f"{model} is not installed (scripts/setup.sh downloads it)")
    return ember, model


class Server:
    """`ember serve` on 127.0.0.1 with --port 0; the bound port is read from its log."""

    def __init__(self, ember, model, *extra, ctx=512, threads=1, parallel=2, queue=16):
        self.log_path = f"/tmp/ember-serve-test-{os.getpid()}-{time.monotonic_ns()}.log"
        self.log = open(self.log_path, "w+")
        cmd = [ember, "serve", "-m", model, "--host", "127.0.0.1", "--port", "0", "-c", str(ctx), "-t", str(threads),
               "--parallel", str(parallel), "--queue", str(queue), *extra]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.port = None
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.read_log()}")
            m = re.search(r"on http://127\.0\.0\.1:(\d+)", self.read_log())
            if m:
                self.port = int(m.group(1))
                break
            time.sleep(0.05)
        if self.port is None:
            self.stop()
            raise RuntimeError("server did not start: " + self.read_log())
        self.url = f"http://127.0.0.1:{self.port}"
        # listen() may run a moment after the log line.
        for _ in range(100):
            try:
                self.health()
                break
            except OSError:
                time.sleep(0.05)

    def read_log(self):
        with open(self.log_path) as f:
            return f.read()

    def health(self):
        with urllib.request.urlopen(self.url + "/health", timeout=10) as r:
            return json.loads(r.read())

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        if self.proc.poll() is None:
            # The first SIGTERM drains (running requests may finish, --shutdown-grace); a second
            # one stops at once.
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        self.log.close()
        rc = self.proc.returncode
        if rc not in (0, -signal.SIGTERM):
            print(self.read_log()[-3000:])
        os.unlink(self.log_path)
        return rc

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def wait_idle(srv, timeout=10):
    """Waits until no request runs or waits (or the timeout); returns /health's answer."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        h = srv.health()
        if h["slots_busy"] == 0 and h["queued"] == 0:
            return h
        time.sleep(0.05)
    return srv.health()


def _answer(req, timeout):
    """(status, parsed JSON or raw text) of a request, error statuses included."""
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def post(url, body, headers=None, timeout=60):
    """POSTs bytes or a JSON-able object; returns (status, parsed JSON or raw text)."""
    data = body if isinstance(body, (bytes, bytearray)) else json.dumps(body).encode()
    return _answer(urllib.request.Request(url, data=data, method="POST",
                                          headers={"Content-Type": "application/json", **(headers or {})}), timeout)


def get(url, timeout=60):
    """GETs a URL; returns (status, parsed JSON or raw text)."""
    return _answer(url, timeout)


class Checks:
    """Counts passes and failures; prints each failure; exit code at the end."""

    def __init__(self, name):
        self.name, self.passed, self.failed = name, 0, 0

    def check(self, cond, what):
        if cond:
            self.passed += 1
        else:
            self.failed += 1
            print(f"FAIL: {what}", flush=True)
        return cond

    def done(self):
        print(f"{self.name}: {self.passed} passed, {self.failed} failed", flush=True)
        sys.exit(1 if self.failed else 0)
