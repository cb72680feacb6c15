"""Running an app under uvicorn, with the fast event loop and HTTP parser when they are installed,
and the limits of docs/security.md: keep-alive and header timeouts, a connection limit, a backlog.

uvicorn closes an idle keep-alive connection but has no deadline for a request's headers: a
connection that never sends a request, or sends it a byte at a time, is held for ever. The
protocol here adds one (``_HeaderDeadline``).
"""

from __future__ import annotations

import importlib.util
import logging
import socket

import uvicorn

from advisor.settings import Settings

log = logging.getLogger("tame.server")
_TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
# The most bytes a request line and headers may take: no route needs more than a few hundred (a token,
# a destination of at most 300 characters); httptools would buffer an endless request line whole.
MAX_HEADER_BYTES = 64 * 1024
_TOO_LARGE = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class _HeaderDeadline:
    """Mixin for uvicorn's httptools and h11 protocols: closes a connection whose request headers are
    not complete ``header_timeout_s`` after the connection opened or the request's first byte came,
    or pass MAX_HEADER_BYTES before they are (431): the deadline bounds time, this bounds memory.

    Both protocols make a new ``self.cycle`` when a request's headers are complete; between the end
    of one response and that point the connection is waiting for headers, and the deadline runs.
    """

    header_timeout_s: float = 10.0

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._header_timer = None
        self._header_bytes = False
        self._header_byte_count = 0
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        before = self.cycle
        if (before is None or before.response_complete) and self._header_byte_count > MAX_HEADER_BYTES:
            return  # refused already; the connection is closing
        super().data_received(data)
        if self.cycle is not before and not self.cycle.response_complete:
            self._cancel_header_timer()  # a request's headers are complete; it is being served
        if self.cycle is None or self.cycle.response_complete:
            self._header_bytes = True
            self._header_byte_count += len(data)
            if self._header_byte_count > MAX_HEADER_BYTES:
                if not self.transport.is_closing():
                    self.transport.write(_TOO_LARGE)
                    self.transport.close()
                return
            self._arm_header_timer()

    def connection_lost(self, exc) -> None:
        self._cancel_header_timer()
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


def header_deadline_protocol(http: str, header_timeout_s: float) -> type:
    """uvicorn's "httptools" or "h11" protocol class with the header deadline of ``header_timeout_s``."""
    if http == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    else:
        from uvicorn.protocols.http.h11_impl import H11Protocol as base
    return type(f"HeaderDeadline{base.__name__}", (_HeaderDeadline, base), {"header_timeout_s": header_timeout_s})


def uvicorn_config(app, host: str, port: int, log_level: str = "warning") -> uvicorn.Config:
    """A uvicorn config for ``app`` with the limits of the app's settings (create_app keeps them on app.state)."""
    settings = getattr(getattr(app, "state", None), "settings", None) or Settings()
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    protocol = header_deadline_protocol(http, settings.header_timeout_s)
    # uvicorn believes X-Forwarded-For from 127.0.0.1 unless told otherwise: a client on this host could name any
    # address and with it a fresh per-client probe-queue cap. Only the operator's proxies are believed, if any.
    proxies = list(settings.forwarded_allow_ips)
    return uvicorn.Config(app, host=host, port=port, loop=loop, http=protocol, access_log=False, log_level=log_level,
                          lifespan="on", timeout_graceful_shutdown=5, timeout_keep_alive=settings.keepalive_timeout_s,
                          limit_concurrency=settings.max_connections, backlog=settings.backlog,
                          proxy_headers=bool(proxies), forwarded_allow_ips=proxies)


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
