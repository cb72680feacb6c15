"""Running an app under uvicorn, with the fast event loop and HTTP parser when they are installed,
and the limits of docs/security.md: keep-alive and header timeouts, caps on a request's head, connection limits
(in total and per client), a backlog.

uvicorn closes an idle keep-alive connection but has no deadline for a request's headers: a
connection that never sends a request, or sends it a byte at a time, is held for ever. The
protocol here adds one (``_HeaderDeadline``), caps what a request's head may take, and refuses a connection past the
limits as it opens, before it can send anything (uvicorn answers 503 only once a request's headers are complete).
"""

from __future__ import annotations

import collections
import importlib.util
import ipaddress
import logging
import socket
from typing import Sequence

import uvicorn

from advisor.destinations import canonical_address, client_key
from advisor.settings import Settings

log = logging.getLogger("tame.server")
_TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
# The most bytes a request line and headers may take, and the most header lines: no route needs more than a few
# hundred bytes (a token, an Idempotency-Key, a destination of at most 300 characters); httptools would buffer an
# endless request line whole, and keeps a Python object per header line. h11 (the fallback parser) refuses a
# head past MAX_HEADER_BYTES itself (400).
MAX_HEADER_BYTES = 16 * 1024
MAX_HEADERS = 100
# The most requests a connection may send ahead of its answers (HTTP pipelining; h11 reads none ahead).
MAX_PIPELINED = 16
_TOO_LARGE = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\nretry-after: 1\r\n"
         b"content-length: %d\r\nconnection: close\r\n\r\n%s")


def _busy(why: str) -> bytes:
    text = why.encode()
    return _BUSY % (len(text), text)


class _HeaderDeadline:
    """Mixin for uvicorn's httptools and h11 protocols: closes a connection whose request headers are
    not complete ``header_timeout_s`` after the connection opened or the request's first byte came,
    or pass MAX_HEADER_BYTES before they are (431): the deadline bounds time, this bounds memory. A connection past
    ``limit_concurrency`` open ones, or past ``max_client_connections`` from one client (client_key; none for the
    ``trusted`` proxies, whose connections carry many clients), gets 503 and is closed as it opens.

    Both protocols make a new ``self.cycle`` when a request's headers are complete; between the end
    of one response and that point the connection is waiting for headers, and the deadline runs.
    """

    header_timeout_s: float = 10.0
    max_client_connections: int | None = None
    trusted: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network] = ()
    # Open connections per client key, of one server (the class is made per server: header_deadline_protocol).
    open_per_client: collections.Counter

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._header_timer = None
        self._header_bytes = False
        self._header_byte_count = 0
        self._refused = False
        self._client_key = None
        refusal = self._over_limits()
        if refusal is not None:
            self._refuse(_busy(refusal))
            return
        self._arm_header_timer()

    def _over_limits(self) -> str | None:
        """Why this new connection is one too many, or None (counting it)."""
        limit = self.limit_concurrency
        if limit is not None and len(self.connections) > limit:
            return "this server has as many connections open as it takes; try again shortly"
        if self.max_client_connections is None or not self.client:
            return None
        host = self.client[0]
        canonical = canonical_address(host)  # an IPv4 peer of a dual-stack listener is ::ffff:a.b.c.d
        if canonical is None:
            return None
        address = ipaddress.ip_address(canonical.partition("%")[0])
        if any(address in network for network in self.trusted):
            return None
        self._client_key = client_key(host)
        self.open_per_client[self._client_key] += 1
        if self.open_per_client[self._client_key] > self.max_client_connections:
            return (f"this client has {self.max_client_connections} connections open, as many as one client may "
                    "(TAME_MAX_CLIENT_CONNECTIONS); reuse them, or close some")
        return None

    def _in_request_head(self) -> bool:
        """Whether bytes received now are a request's head (its line and headers), not a body: between a response's
        end and the next request's complete headers (the h11 protocol stops reading while a response is pending)."""
        return self.cycle is None or self.cycle.response_complete

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # the connection is closing
        # Counted as head bytes, and the count reset when a head completes while they are parsed: what is left
        # counted is the unfinished head's (up to one read's worth of a pipelined request besides).
        if self._in_request_head():
            self._header_byte_count += len(data)
        before = self.cycle
        super().data_received(data)
        if self._refused:
            return
        if self.cycle is not before and not self.cycle.response_complete:
            self._cancel_header_timer()  # a request's headers are complete; it is being served
        if self._in_request_head() and self._header_byte_count > MAX_HEADER_BYTES:
            self._refuse(_TOO_LARGE)
            return
        if self.cycle is None or self.cycle.response_complete:
            self._header_bytes = True
            self._arm_header_timer()

    def _refuse(self, answer: bytes) -> None:
        self._refused = True
        self._cancel_header_timer()
        if not self.transport.is_closing():
            if self.cycle is None or self.cycle.response_complete:
                self.transport.write(answer)
                self.transport.close()
            else:
                # An answer is being sent: this one would land inside it, and a client that does not read would keep
                # the connection open while the rest waits to be flushed. Dropped at once.
                self.transport.abort()

    def connection_lost(self, exc) -> None:
        self._cancel_header_timer()
        if self._client_key is not None:
            self.open_per_client[self._client_key] -= 1
            if not self.open_per_client[self._client_key]:
                del self.open_per_client[self._client_key]
            self._client_key = None
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        if self._header_timer is None and not self.transport.is_closing():
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timeout)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        self._header_bytes = False
        self._header_byte_count = 0

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or not (self.cycle is None or self.cycle.response_complete):
            return
        if self._header_bytes:
            self.transport.write(_TIMED_OUT)  # a partial request gets an answer; a silent connection none
        self.transport.close()


class _HttpToolsHead:
    """The head caps for httptools, which goes on parsing the next request while a response is pending (reading
    resumes whenever the app awaits ``receive``, as a streamed file does to hear of a disconnect): the bytes and
    header lines of every request's head are counted as the parser sees them, whatever the response's state, and a
    connection with MAX_PIPELINED requests waiting behind a pending answer is closed at the next."""

    def connection_made(self, transport) -> None:
        self._in_head = True  # the parser is in a request's line or headers (or between requests)
        self._head_lines = 0
        self._head_parsed = 0  # bytes of the request line and header lines parsed: a head read in one piece too
        super().connection_made(transport)

    def _in_request_head(self) -> bool:
        return self._in_head

    def _parsed(self, size: int) -> bool:
        """Count ``size`` bytes of the head as parsed; False (the connection refused) past MAX_HEADER_BYTES."""
        self._head_parsed += size
        if self._head_parsed > MAX_HEADER_BYTES:
            self._refuse(_TOO_LARGE)
            return False
        return True

    def on_url(self, url: bytes) -> None:
        if not self._refused and self._parsed(len(url)):
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._refused:
            return
        self._head_lines += 1
        if self._head_lines > MAX_HEADERS:
            self._refuse(_TOO_LARGE)
            return
        if self._parsed(len(name) + len(value) + 4):
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._refused:
            return  # refused: no request of this connection is served
        if len(self.pipeline) >= MAX_PIPELINED:
            # Each answer resumes reading, and a read can hold a thousand more small requests: queued without end.
            # An answer here would come before the pending ones', so the connection is closed without one.
            self._refuse(b"")
            return
        self._in_head = False
        self._head_lines = 0
        self._head_parsed = 0
        self._header_byte_count = 0
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_head = True
        if not self._refused:
            super().on_message_complete()


def header_deadline_protocol(http: str, header_timeout_s: float, max_client_connections: int | None = None,
                             trusted: Sequence[str] = ()) -> type:
    """uvicorn's "httptools" or "h11" protocol class with the header deadline of ``header_timeout_s``, the head caps
    and at most ``max_client_connections`` connections per client (None: no such cap; ``trusted``: proxies' CIDR
    networks, not capped), for one server."""
    if http == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
        mixins = (_HttpToolsHead, _HeaderDeadline)
    else:
        from uvicorn.protocols.http.h11_impl import H11Protocol as base
        mixins = (_HeaderDeadline,)
    return type(f"HeaderDeadline{base.__name__}", (*mixins, base), {
        "header_timeout_s": header_timeout_s, "max_client_connections": max_client_connections,
        "trusted": tuple(ipaddress.ip_network(n) for n in trusted), "open_per_client": collections.Counter()})


def uvicorn_config(app, host: str, port: int, log_level: str = "warning") -> uvicorn.Config:
    """A uvicorn config for ``app`` with the limits of the app's settings (create_app keeps them on app.state)."""
    settings = getattr(getattr(app, "state", None), "settings", None) or Settings()
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    protocol = header_deadline_protocol(http, settings.header_timeout_s, settings.max_client_connections,
                                        settings.forwarded_allow_ips)
    # uvicorn believes X-Forwarded-For from 127.0.0.1 unless told otherwise: a client on this host could name any
    # address and with it a fresh per-client probe-queue cap. Only the operator's proxies are believed, if any.
    proxies = list(settings.forwarded_allow_ips)
    return uvicorn.Config(app, host=host, port=port, loop=loop, http=protocol, access_log=False, log_level=log_level,
                          lifespan="on", timeout_graceful_shutdown=5, timeout_keep_alive=settings.keepalive_timeout_s,
                          limit_concurrency=settings.max_connections, backlog=settings.backlog,
                          h11_max_incomplete_event_size=MAX_HEADER_BYTES,
                          # No route is a WebSocket; an upgrade handed to uvicorn's WebSocket protocol would leave
                          # this protocol without its connection_lost (a client's connection slot never freed).
                          ws="none",
                          proxy_headers=bool(proxies), forwarded_allow_ips=proxies,
                          # `tame serve` writes its stderr through advisor.terminal, which shows escapes as text.
                          use_colors=False)


def http_url(host: str, port: int) -> str:
    """The URL of a server listening on host:port, an IPv6 address in brackets (http://[::1]:8080)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def bind(host: str, port: int, backlog: int) -> socket.socket:
    """A listening TCP socket on host:port; OSError (e.g. the port is in use) when it cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


def ensure_file_limit(connections: int) -> None:
    """Raise the soft open-files limit so ``connections`` sockets fit, or warn that they will not."""
    try:
        import resource
    except ImportError:  # not on this platform
        return
    needed = connections + 256  # the database, log files and the listening socket besides
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        if target < needed:
            log.warning("open-files limit %d is below TAME_MAX_CONNECTIONS + 256 = %d: past it new "
                        "connections fail instead of getting 503", target, needed)


def serve_on(app, sock: socket.socket, log_level: str = "warning") -> None:
    """Serve on the bound socket ``sock`` until SIGINT/SIGTERM."""
    host, port = sock.getsockname()[:2]
    uvicorn.Server(uvicorn_config(app, host, port, log_level)).run(sockets=[sock])


def serve(app, host: str, port: int, log_level: str = "warning") -> None:
    """Bind host:port and serve until SIGINT/SIGTERM."""
    settings = getattr(app.state, "settings", None) or Settings()
    with bind(host, port, settings.backlog) as sock:
        serve_on(app, sock, log_level)
