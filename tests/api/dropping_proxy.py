"""A TCP relay on loopback that loses the answers to chosen requests: the request reaches the real server, which
stores it and answers, and the relay then closes the client's connection instead of passing the answer on, as a
network that fails after the server committed. Everything else is relayed byte for byte."""

from __future__ import annotations

import socket
import threading


class DroppingProxy:
    """Relays 127.0.0.1:``port`` to ``target`` (host, port); the answers to the first ``drops`` requests whose
    request line starts with ``drop_prefix`` (e.g. b"POST /v1/probe-runs") are lost. ``dropped``: how many were."""

    def __init__(self, target: tuple[str, int], drop_prefix: bytes, drops: int = 1):
        self.target = target
        self.drop_prefix = drop_prefix
        self.drops = drops
        self.dropped = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._closed.set()
        self._listener.close()

    def __enter__(self) -> "DroppingProxy":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            # The request line of the newest request sent on this connection, and whether its answer is to go.
            state = {"drop": False}
            threading.Thread(target=self._upstream, args=(client, server, state), daemon=True).start()
            threading.Thread(target=self._downstream, args=(server, client, state), daemon=True).start()

    def _upstream(self, client: socket.socket, server: socket.socket, state: dict) -> None:
        try:
            while data := client.recv(65536):
                if data.startswith(self.drop_prefix):
                    with self._lock:
                        if self.dropped < self.drops:
                            self.dropped += 1
                            state["drop"] = True
                server.sendall(data)
        except OSError:
            pass
        finally:
            _shut(server)

    def _downstream(self, server: socket.socket, client: socket.socket, state: dict) -> None:
        try:
            while data := server.recv(65536):
                if state["drop"]:
                    # The server has answered, so it has stored the request: the client never hears of it.
                    client.shutdown(socket.SHUT_RDWR)
                    return
                client.sendall(data)
        except OSError:
            pass
        finally:
            _shut(client)
            _shut(server)


def _shut(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass
