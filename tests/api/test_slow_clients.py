"""The server's timeouts and connection limit (api/server.py), with short values configured.

Bounds on time are generous upper limits (a closed connection must close well within them),
never speed assertions.
"""

import select
import socket
import threading
import time
from contextlib import contextmanager
from urllib.parse import urlsplit

import pytest
import uvicorn

from api.server import MAX_HEADER_BYTES, MAX_HEADERS, MAX_PIPELINED, bind, header_deadline_protocol
from tests.api.conftest import free_port, wait_for

HEALTH = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@contextmanager
def bare_server(app, http, header_timeout_s):
    """``app`` under uvicorn with the header-deadline protocol over ``http`` (httptools or h11): its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_level="warning",
                                           http=header_deadline_protocol(http, header_timeout_s),
                                           timeout_keep_alive=30))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, timeout_s=30, what="uvicorn start")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def connect(base):
    parts = urlsplit(base)
    return socket.create_connection((parts.hostname, parts.port), timeout=10)


def wait_closed(sock, within_s):
    """Seconds until the server closes ``sock`` (reading and discarding what it sends)."""
    started = time.monotonic()
    sock.settimeout(within_s)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    except socket.timeout:
        raise AssertionError(f"still open after {within_s} s") from None
    return time.monotonic() - started


def status_of(base, request=HEALTH):
    with connect(base) as sock:
        sock.sendall(request)
        head = b""
        while b"\r\n" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                return None
            head += chunk
        return int(head.split()[1])


def test_an_idle_keep_alive_connection_is_closed_after_the_keep_alive_timeout(service_factory):
    base, client, app = service_factory(start_worker=False, keepalive_timeout_s=1.0, header_timeout_s=30.0)
    with connect(base) as sock:
        sock.sendall(HEALTH)
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        wait_closed(sock, within_s=4)  # uvicorn's own default is 5 s: this is the setting at work


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(service_factory):
    base, client, app = service_factory(start_worker=False, keepalive_timeout_s=30.0, header_timeout_s=1.0)
    with connect(base) as sock:
        assert wait_closed(sock, within_s=10) < 10


def test_headers_sent_a_byte_at_a_time_are_cut_off_at_the_header_timeout(service_factory):
    base, client, app = service_factory(start_worker=False, keepalive_timeout_s=30.0, header_timeout_s=1.0)
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200 + b"\r\n\r\n"
    with connect(base) as sock:
        started = time.monotonic()
        for byte in request:  # one byte each 0.2 s: 45 s for the whole request
            assert time.monotonic() - started < 15, "the trickle was not cut off"
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            if select.select([sock], [], [], 0.2)[0]:
                break
        else:
            raise AssertionError("the whole request trickled in")
        try:
            answer = sock.recv(4096)
        except ConnectionResetError:
            answer = b""
        assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer
    # A prompt client on a second connection is served meanwhile and after.
    assert status_of(base) == 200


def test_a_keep_alive_connection_that_trickles_its_next_request_is_cut_off(service_factory):
    base, client, app = service_factory(start_worker=False, keepalive_timeout_s=5.0, header_timeout_s=1.0)
    with connect(base) as sock:
        sock.sendall(HEALTH)
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /hea")
        assert wait_closed(sock, within_s=10) < 10


def test_past_the_connection_limit_new_requests_get_503_until_connections_close(service_factory):
    base, client, app = service_factory(start_worker=False, max_connections=4, header_timeout_s=60.0)
    held = [connect(base) for _ in range(3)]
    try:
        # The three idle connections and this one make four: the limit.
        wait_for(lambda: status_of(base) == 503, timeout_s=10, what="503 past the connection limit")
    finally:
        for sock in held:
            sock.close()
    wait_for(lambda: status_of(base) == 200, timeout_s=10, what="service once the connections closed")


@pytest.mark.parametrize("http", ["httptools", "h11"])
def test_the_header_deadline_works_with_either_http_parser(http):
    # uvicorn_config picks httptools when it is installed; h11 is the fallback.
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    with bare_server(app, http, header_timeout_s=1.0) as base:
        with connect(base) as silent, connect(base) as trickle, connect(base) as kept:
            trickle.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
            kept.sendall(HEALTH)
            assert kept.recv(4096).startswith(b"HTTP/1.1 200")
            kept.sendall(b"GET / HT")
            for sock in (silent, trickle, kept):
                wait_closed(sock, within_s=10)
        assert status_of(base) == 200


@pytest.mark.parametrize("http", ["httptools", "h11"])
def test_an_endless_request_line_gets_431_at_the_header_byte_cap(http):
    # The header deadline bounds time only: at link speed a client could send tens of megabytes of request
    # line before it, which httptools buffers whole. MAX_HEADER_BYTES bounds what is taken.
    async def app(scope, receive, send):
        body = b"x" * 100_000 if scope["method"] == "POST" else b"ok"
        if scope["method"] == "POST":
            while (await receive()).get("more_body"):
                pass
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    with bare_server(app, http, header_timeout_s=30.0) as base:
        with connect(base) as sock:
            sock.sendall(b"GET /" + b"a" * 8192)
            sent, answer = 8197, b""
            try:
                while sent < 4 * MAX_HEADER_BYTES and not answer:
                    sock.sendall(b"a" * 8192)
                    sent += 8192
                    if select.select([sock], [], [], 0)[0]:
                        answer = sock.recv(4096)
            except (BrokenPipeError, ConnectionResetError):
                pass
            answer = answer or sock.recv(4096)
            # h11 refuses an incomplete event over its own 16 KiB first (400); httptools has no cap of its own.
            assert answer.startswith(b"HTTP/1.1 431" if http == "httptools" else b"HTTP/1.1 400"), answer[:80]
            wait_closed(sock, within_s=10)
        # Headers within the cap and a body far larger than it pass on one connection, twice.
        with connect(base) as sock:
            for _ in range(2):
                body = b"y" * 300_000
                sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                head = sock.recv(4096)
                assert head.startswith(b"HTTP/1.1 200"), head[:80]
                received = len(head.partition(b"\r\n\r\n")[2])
                while received < 100_000:
                    received += len(sock.recv(65536))
        assert status_of(base) == 200


def connect_from(base, source_host):
    """A connection to ``base`` from the local address ``source_host`` (any 127.x.y.z works on loopback)."""
    parts = urlsplit(base)
    return socket.create_connection((parts.hostname, parts.port), timeout=10, source_address=(source_host, 0))


def refused_at_once(sock) -> bytes:
    """What the server sent a connection it refused as it opened, before any request: its 503, then EOF."""
    answer = b""
    sock.settimeout(10)
    try:
        while chunk := sock.recv(4096):
            answer += chunk
    except ConnectionResetError:
        pass
    return answer


def test_one_client_cannot_hold_more_than_its_share_of_connections(service_factory):
    """One address holding TAME_MAX_CLIENT_CONNECTIONS idle connections gets 503 on the next as it opens, while
    another address is served; the limit on all connections refuses as the connection opens too."""
    base, client, app = service_factory(start_worker=False, max_connections=6, max_client_connections=3,
                                        header_timeout_s=60.0)
    held = [connect_from(base, "127.0.0.5") for _ in range(3)]
    try:
        with connect_from(base, "127.0.0.5") as one_too_many:
            answer = refused_at_once(one_too_many)
            assert answer.startswith(b"HTTP/1.1 503") and b"TAME_MAX_CLIENT_CONNECTIONS" in answer, answer
        assert status_of(base) == 200  # 127.0.0.1, another client
        # Six open in all (three each from two more addresses): the seventh is refused before it sends a byte.
        held += [connect_from(base, "127.0.0.6") for _ in range(3)]
        with connect_from(base, "127.0.0.7") as seventh:
            assert refused_at_once(seventh).startswith(b"HTTP/1.1 503")
    finally:
        for sock in held:
            sock.close()
    wait_for(lambda: status_of(base) == 200, timeout_s=10, what="service once the connections closed")
    with connect_from(base, "127.0.0.5") as again:
        again.sendall(HEALTH)
        assert again.recv(4096).startswith(b"HTTP/1.1 200")


def test_a_head_of_more_header_lines_than_the_cap_gets_431(service_factory):
    base, client, app = service_factory(start_worker=False)
    lines = b"".join(b"x-%d: 1\r\n" % i for i in range(MAX_HEADERS - 1))  # with Host: MAX_HEADERS lines
    assert status_of(base, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + lines + b"\r\n") == 200
    assert status_of(base, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + lines + b"x-last: 1\r\n\r\n") == 431


def test_a_pipelined_head_is_capped_while_a_response_is_pending(service_factory):
    """A client that does not read a streamed file's response and sends an endless next request line: the app
    awaits receive() for a disconnect, which lets the parser read on; the head cap holds whatever the response's
    state, so the server drops the connection mid-answer instead of buffering the request line."""
    base, client, app = service_factory(start_worker=False, header_timeout_s=60.0)
    asset = "/docs/assets/swagger-ui-bundle.js"
    whole = len(client.get(asset).content)
    parts = urlsplit(base)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect((parts.hostname, parts.port))
    with sock:
        sock.sendall(f"GET {asset} HTTP/1.1\r\nHost: x\r\n\r\nGET /".encode())
        try:
            for _ in range(16):  # 8 times the cap
                sock.sendall(b"a" * 8192)
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            pass
        received = 0
        try:
            while chunk := sock.recv(65536):
                received += len(chunk)
        except ConnectionResetError:
            pass
    assert received < whole, f"the whole {whole}-byte answer was sent: the endless line was read along"
    assert status_of(base) == 200


def answers_to(base, request: bytes, count: int) -> int:
    """How many answers the server sends to ``count`` copies of ``request`` sent at once (HTTP pipelining)."""
    with connect(base) as sock:
        sock.sendall(request * count)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
                if received.count(b"HTTP/1.1 200") == count:
                    break
        except (ConnectionResetError, socket.timeout):
            pass
    return received.count(b"HTTP/1.1 200")


def test_pipelined_requests_are_answered_up_to_the_pipelining_cap(service_factory):
    # Each answer lets the parser read on, and one read holds a thousand small requests: without a cap a client
    # that sends faster than it reads queues them without end.
    base, client, app = service_factory(start_worker=False)
    assert answers_to(base, HEALTH, MAX_PIPELINED) == MAX_PIPELINED
    assert answers_to(base, HEALTH, 2000) < 2000  # the connection is closed once MAX_PIPELINED wait
    assert status_of(base) == 200


def test_websocket_upgrades_do_not_keep_a_client_s_connection_slots(service_factory):
    # No route is a WebSocket: an upgrade handed to uvicorn's WebSocket protocol never gave its slot back.
    base, client, app = service_factory(start_worker=False, max_client_connections=3)
    upgrade = (b"GET /healthz HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    for _ in range(5):
        with connect_from(base, "127.0.0.9") as sock:
            sock.sendall(upgrade)
            sock.recv(4096)
    wait_for(lambda: status_of_from(base, "127.0.0.9") == 200, timeout_s=10, what="a slot for 127.0.0.9")


def status_of_from(base, source_host, request=HEALTH):
    with connect_from(base, source_host) as sock:
        sock.sendall(request)
        head = sock.recv(4096)
        return int(head.split()[1]) if head else None


def test_a_head_read_in_one_piece_is_capped_too(service_factory):
    base, client, app = service_factory(start_worker=False)
    big = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(b"x-%d: %s\r\n" % (i, b"v" * 1000) for i in range(40))
    assert status_of(base, big + b"\r\n") == 431


def test_a_trusted_proxy_on_a_dual_stack_listener_is_not_capped():
    """Listening on ::, an IPv4 proxy connects as ::ffff:127.0.0.1: still the trusted 127.0.0.1."""
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    port = free_port()
    protocol = header_deadline_protocol("httptools", 30.0, max_client_connections=2, trusted=("127.0.0.1/32",))
    server = uvicorn.Server(uvicorn.Config(app, host="::", port=port, lifespan="off", log_level="warning",
                                           http=protocol))
    listener = bind("::", port, 16)  # as tame serve --host :: binds: dual-stack
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, timeout_s=30, what="uvicorn start")
        base = f"http://127.0.0.1:{port}"
        held = [connect(base) for _ in range(3)]
        try:
            assert status_of(base) == 200
        finally:
            for sock in held:
                sock.close()
    finally:
        server.should_exit = True
        thread.join(10)
        listener.close()
