import json
import math
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import uvicorn

from advisor.allowlist import AllowList
from advisor.settings import Settings
from advisor.store import Store
from api.app import create_app
from api.server import uvicorn_config
from probes.fake import FakeDriver

# A path that follows Lu's model exactly: p'(n) = A n^2 + B, so BW(n) = n / sqrt(A n^2 + B).
A, B = 1e-16, 4e-16


def rate(n):
    return n / math.sqrt(A * n * n + B)


class Clock:
    """Injected time: tests move it instead of sleeping."""

    def __init__(self, start=1_700_000_000.0):
        self.now = start

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def live_server(app):
    """A real uvicorn server on 127.0.0.1 running ``app`` in a thread."""
    port = free_port()
    server = uvicorn.Server(uvicorn_config(app, "127.0.0.1", port))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@contextmanager
def json_server(answer):
    """A real HTTP server on 127.0.0.1 standing in for a service (an older one, a hostile one, one in the way):
    ``answer(path)`` gives each GET's (status, JSON body). Yields its URL."""

    class Answer(BaseHTTPRequestHandler):
        def do_GET(self):
            status, body = answer(self.path)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def resolver(host):
    table = {"localhost": ["127.0.0.1"], "lo.test": ["127.0.0.2"], "evil.test": ["198.51.100.7"],
             "mixed.test": ["127.0.0.3", "203.0.113.9"]}
    if host == "busy.test":  # as advisor.allowlist.system_resolver refuses a name when its lookup slots stay taken
        from advisor.errors import LookupsBusy
        raise LookupsBusy(f"dest host {host!r} was not looked up: this service's 8 name lookups were all busy for 5 s: "
                          "try again later, or give its address", retry_after_s=5.0)
    if host == "slow.test":  # as advisor.allowlist.system_resolver refuses a name that does not resolve in time
        from advisor.errors import LookupTimedOut
        raise LookupTimedOut(f"dest host {host!r} did not resolve within 5 s: try again later, or give its address",
                             retry_after_s=5.0)
    if host not in table:
        from advisor.errors import InvalidRequest
        raise InvalidRequest(f"dest host {host!r} does not resolve")
    return table[host]


def wait_for(predicate, timeout_s=60.0, what="condition"):
    """Poll until predicate() is truthy (a generous bound, not a speed assertion)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def service_factory(tmp_path, clock):
    """make(**settings) -> (base_url, client, app) of a live server over a fresh SQLite file."""
    stack = []

    def make(driver=FakeDriver(rate, rtt_s=0.01), start_worker=True, url=None, **overrides):
        # The fake path follows Lu's model exactly, so the service fits Lu's model unless a test says otherwise.
        overrides.setdefault("model", "lu")
        settings = replace(Settings(database_url=url or f"sqlite:///{tmp_path}/tame.sqlite3",
                                    allowed=AllowList.parse("127.0.0.0/8,::1/128,localhost"),
                                    default_duration_s=1.0), **overrides)
        store = Store.open(settings.database_url, clock=clock)
        app = create_app(settings, store, driver, clock=clock, resolver=resolver, start_worker=start_worker)
        ctx = live_server(app)
        base = ctx.__enter__()
        client = httpx.Client(base_url=base, timeout=30)
        stack.append((ctx, client, store))
        return base, client, app

    yield make
    for ctx, client, store in reversed(stack):
        client.close()
        ctx.__exit__(None, None, None)
        store.close()


def probe_and_wait(client, dest="127.0.0.1:5201", headers=None, **body):
    response = client.post("/v1/probes", json={"dest": dest, **body}, headers=headers or {})
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    return wait_for(lambda: (lambda s: s if s["status"] in ("done", "failed") else None)(
        client.get(f"/v1/probes/{job_id}").json()), what=f"probe {job_id}")
