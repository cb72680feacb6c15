"""The boundary (api/boundary.py) on a real server, over raw sockets: tokens before bodies, size caps, body deadlines."""

import json
import select
import socket
import sqlite3
import time
from urllib.parse import urlsplit

import pytest

from api.app import STORE_UNAVAILABLE

WRITE = {"Authorization": "Bearer s3cret"}


def connect(base):
    parts = urlsplit(base)
    return socket.create_connection((parts.hostname, parts.port), timeout=10)


def read_response(sock, timeout_s=10.0):
    """(status, headers text, body) of one response; the body read by Content-Length."""
    sock.settimeout(timeout_s)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"connection closed before a response: {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next((int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:")), 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), "\n".join(lines[1:]).lower(), body


def request_head(method, path, headers):
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_a_huge_post_without_a_token_gets_401_before_its_body_is_read(service_factory):
    base, client, app = service_factory(token="s3cret", start_worker=False)
    with connect(base) as sock:
        started = time.monotonic()
        sock.sendall(request_head("POST", "/v1/probe-runs", {"Content-Type": "application/json",
                                                               "Content-Length": str(300 * 1024 * 1024)}) + b'{"dest"')
        status, headers, body = read_response(sock)
        assert status == 401, body
        assert time.monotonic() - started < 5
        assert "TAME_TOKEN" in json.loads(body)["detail"]
        assert "connection: close" in headers
        # The server has closed: the rest of the body is not read.
        assert sock.recv(1) == b""


def test_a_site_token_on_another_site_s_path_gets_403_before_its_body_is_read(service_factory):
    base, client, app = service_factory(token="s3cret", site_tokens=(("site-a", "token-a"),), start_worker=False)
    with connect(base) as sock:
        started = time.monotonic()
        sock.sendall(request_head("PUT", "/v1/sites/site-b", {"Content-Type": "application/json",
                                                               "Authorization": "Bearer token-a",
                                                               "Content-Length": str(300 * 1024 * 1024)}) + b'{"dests"')
        status, headers, body = read_response(sock)
        assert status == 403, body
        assert time.monotonic() - started < 5
        assert json.loads(body)["detail"].startswith("this token is site-a's")
        assert "connection: close" in headers and "www-authenticate" not in headers
        assert sock.recv(1) == b""


def test_bad_json_without_a_token_gets_401_not_422(service_factory):
    base, client, app = service_factory(token="s3cret", start_worker=False)
    response = client.post("/v1/probes", content=b"{not json", headers={"Content-Type": "application/json"})
    assert response.status_code == 401, response.text
    assert client.post("/v1/probes", content=b"{not json", headers={**WRITE, "Content-Type": "application/json"}
                       ).status_code == 422


def test_a_read_token_is_checked_before_a_batch_body(service_factory):
    base, client, app = service_factory(token="s3cret", read_token="r3ad", start_worker=False)
    response = client.post("/v1/advice:batch", content=b"[garbage", headers={"Content-Type": "application/json"})
    assert response.status_code == 401 and "TAME_READ_TOKEN" in response.json()["detail"]


def test_a_batch_declared_over_its_cap_gets_413_at_once(service_factory):
    base, client, app = service_factory(start_worker=False, max_batch=1000)
    with connect(base) as sock:
        started = time.monotonic()
        sock.sendall(request_head("POST", "/v1/advice:batch", {"Content-Type": "application/json",
                                                                 "Content-Length": str(42 * 1024 * 1024)}) + b"[")
        status, headers, body = read_response(sock)
        assert status == 413, body
        assert time.monotonic() - started < 5
        assert "larger than this endpoint accepts" in json.loads(body)["detail"]


def test_a_chunked_batch_over_its_cap_gets_413_as_it_passes_the_cap(service_factory):
    # max_batch=10 gives a 10 KiB cap (api.boundary.BATCH_ITEM_BYTES a item).
    base, client, app = service_factory(start_worker=False, max_batch=10)
    item = json.dumps({"dest": "127.0.0.1", "max_impact": 0.1}).encode() + b","
    chunk = item * 100  # about 4.5 KB a chunk
    sent = 0
    with connect(base) as sock:
        sock.sendall(request_head("POST", "/v1/advice:batch", {"Content-Type": "application/json",
                                                                 "Transfer-Encoding": "chunked"}) + b"1\r\n[\r\n")
        deadline = time.monotonic() + 10
        while not select.select([sock], [], [], 0.05)[0]:
            assert sent < 2_000_000 and time.monotonic() < deadline, "no answer while the body passed its cap"
            try:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
        status, headers, body = read_response(sock)
    assert status == 413, body
    assert sent < 10 * 1024 + 4 * len(chunk)  # refused within a few chunks of the cap


def test_bodies_within_their_cap_are_passed_on_whole(service_factory):
    base, client, app = service_factory(start_worker=False, max_batch=10)
    items = [{"dest": "127.0.0.1", "max_impact": 0.1}] * 3

    def chunks():
        text = json.dumps(items).encode()
        yield text[:7]
        yield text[7:]

    for response in (client.post("/v1/advice:batch", json=items),
                     client.post("/v1/advice:batch", content=chunks(), headers={"Content-Type": "application/json"})):
        assert response.status_code == 200, response.text
        assert [r["error"]["kind"] for r in response.json()["results"]] == ["UnknownDestination"] * 3


def test_a_body_that_stalls_gets_408(service_factory):
    base, client, app = service_factory(start_worker=False, body_timeout_s=1.0)
    with connect(base) as sock:
        started = time.monotonic()
        sock.sendall(request_head("POST", "/v1/observations", {"Content-Type": "application/json",
                                                                 "Content-Length": "100"}) + b'{"dest"')
        status, headers, body = read_response(sock)
        assert status == 408, body
        assert time.monotonic() - started < 8
        assert sock.recv(1) == b""


LARGE = 2 * 1024 * 1024  # over api.boundary.LARGE_BODY_BYTES, within the probe runs' cap


def start_large(base, length=LARGE):
    """A connection that has sent a probe run's headers and the first bytes of a ``length``-byte body."""
    sock = connect(base)
    sock.sendall(request_head("POST", "/v1/probe-runs", {"Content-Type": "application/json",
                                                          "Content-Length": str(length)}) + b" " * 1000)
    return sock


def answered(socks, timeout_s):
    """The connections of ``socks`` that have an answer to read within ``timeout_s`` (a generous bound)."""
    return select.select(socks, [], [], timeout_s)[0]


def test_large_bodies_past_the_server_s_turns_wait_then_get_503_and_small_requests_pass(service_factory):
    """At most TAME_MAX_LARGE_BODIES bodies over 1 MiB are read at once: one more waits for a turn, its body unread,
    and gets 503 with Retry-After when none comes free in TAME_LARGE_BODY_WAIT_S; one that a turn comes free for is
    served. Small requests never wait for a turn."""
    base, client, app = service_factory(start_worker=False, max_large_bodies=2, large_body_wait_s=1.0)
    socks = [start_large(base) for _ in range(3)]
    try:
        # Two take the turns and wait for the rest of their bodies; the third waits its second, then is refused.
        [refused] = answered(socks, 15)
        status, headers, body = read_response(refused)
        assert status == 503, body
        assert "retry-after: 1" in headers and "connection: close" in headers
        assert "TAME_MAX_LARGE_BODIES" in json.loads(body)["detail"]
        holding = [s for s in socks if s is not refused]
        assert answered(holding, 0.5) == []
        # Meanwhile small requests, writes among them, are served at once.
        assert client.get("/healthz").status_code == 200
        assert client.post("/v1/observations", json={"dest": "127.0.0.1", "streams": 2, "throughput_bps": 1e6}
                           ).status_code == 202
        # One more waits; a holder's body completes (not JSON: 422), and its turn goes to the one waiting.
        waiting = start_large(base)
        socks.append(waiting)
        holding[0].sendall(b" " * (LARGE - 1000))
        status, _, body = read_response(holding[0])
        assert status == 422, body
        waiting.sendall(b" " * (LARGE - 1000))
        status, _, body = read_response(waiting)
        assert status == 422, body
    finally:
        for sock in socks:
            sock.close()


def send_chunked(base, size, chunk=b" " * 65536):
    """(status, headers, body) of a chunked probe run of about ``size`` bytes, sent until it is answered."""
    with connect(base) as sock:
        sock.sendall(request_head("POST", "/v1/probe-runs", {"Content-Type": "application/json",
                                                              "Transfer-Encoding": "chunked"}))
        sent = 0
        while sent < size and not answered([sock], 0):
            try:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
        if sent >= size:
            sock.sendall(b"0\r\n\r\n")
        return read_response(sock)


def test_a_chunked_body_waits_for_a_turn_once_it_passes_1_mib(service_factory):
    base, client, app = service_factory(start_worker=False, max_large_bodies=1, large_body_wait_s=0.5)
    holder = start_large(base)
    try:
        assert answered([holder], 0.2) == []
        # Under 1 MiB it needs no turn: read whole and handed on (not JSON: 422), while the holder keeps the turn.
        status, _, body = send_chunked(base, 512 * 1024)
        assert status == 422, body
        # Past 1 MiB it waits for the turn, which the holder keeps.
        status, headers, body = send_chunked(base, 3 * 1024 * 1024)
        assert status == 503 and "retry-after: 1" in headers, body
    finally:
        holder.close()


def test_a_store_error_sends_no_database_text(service_factory, tmp_path):
    base, client, app = service_factory(start_worker=False)
    assert client.get("/v1/paths").status_code == 200
    db = sqlite3.connect(tmp_path / "tame.sqlite3")
    db.execute("DROP TABLE fits")
    db.commit()
    db.close()
    response = client.get("/v1/paths")
    assert response.status_code == 503
    assert response.json() == {"detail": STORE_UNAVAILABLE}
    for word in ("fits", "table", "sqlite", "SELECT", "error:"):
        assert word not in response.text
