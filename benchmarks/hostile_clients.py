"""Hostile clients against a real `tame serve` on loopback: what they cost the server and other clients.

    .venv/bin/python -m benchmarks.hostile_clients [--seconds 20] [--output FILE]

Starts `tame serve --no-worker` on a fresh SQLite file with both tokens set (the attacks carry none, as an outsider's
would, except the keyed writes, which carry the write token as a site's own agent would) and runs, one after another:

- unfinished heads: 1,400 connections at once, each sending 64 KB of header lines and never ending its head;
- idle connections: one address keeps 1,000 connections open, opening a new one as each is closed, while another
  address asks /healthz every 0.4 s;
- an endless request line pipelined behind a streamed answer the client does not read;
- 40,000 pipelined requests sent ahead of their answers, then an endless request line;
- keyed writes: observations of one link, each under a new Idempotency-Key, with pruning every 5 s.

It prints, per attack, the server's RSS (MiB: before, highest, after), what the attackers were answered, and for the
idle connections how many of the other address's requests were answered 200; for the keyed writes the stored
observations and keys. Bounded in time: each attack stops after --seconds at most.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter

from benchmarks.load_advice import free_port

TOKEN, READ_TOKEN = "hostile-bench-write-token", "hostile-bench-read-token"


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return float("nan")


class Watch:
    """The server's RSS sampled every 0.2 s while an attack runs: (before, highest, after), MiB."""

    def __init__(self, pid: int):
        self.pid, self.before, self.highest = pid, rss_mib(pid), rss_mib(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            self.highest = max(self.highest, rss_mib(self.pid))

    def done(self) -> tuple[float, float, float]:
        self._stop.set()
        self._thread.join()
        after = rss_mib(self.pid)
        return self.before, max(self.highest, after), after


def status_from(port: int, source: str, timeout_s: float = 5.0) -> str:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s, source_address=(source, 0)) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            head = sock.recv(4096)
            return head.split()[1].decode() if head else "closed"
    except OSError as exc:
        return type(exc).__name__


async def unfinished_heads(port: int, count: int, hold_s: float) -> Counter:
    async def one():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError as exc:
            return type(exc).__name__
        head = b"GET /v1/paths HTTP/1.1\r\nhost: x\r\n"
        try:
            writer.write(head + b"ab:\r\n" * ((65000 - len(head)) // 5))
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(40), hold_s + 20)
            return " ".join(answer.split(b"\r\n")[0].decode(errors="replace").split()[:2]) or "closed"
        except (OSError, asyncio.TimeoutError) as exc:
            return type(exc).__name__
        finally:
            writer.close()

    return Counter(await asyncio.gather(*(one() for _ in range(count))))


async def idle_connections(port: int, count: int, seconds: float, source: str) -> int:
    opened = 0

    async def holder():
        nonlocal opened
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
                opened += 1
                await asyncio.wait_for(reader.read(100), max(0.1, end - time.monotonic()))
                writer.close()
            except (OSError, asyncio.TimeoutError):
                await asyncio.sleep(0.1)

    await asyncio.gather(*(holder() for _ in range(count)))
    return opened


def endless_line(port: int, first: bytes, limit_bytes: int, seconds: float) -> str:
    """Send ``first`` then an endless request line without reading; how far it got before the server dropped it."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(5)
    sock.connect(("127.0.0.1", port))
    sent, end = 0, time.monotonic() + seconds
    try:
        sock.sendall(first + b"GET /")
        while sent < limit_bytes and time.monotonic() < end:
            sock.sendall(b"A" * 65536)
            sent += 65536
        outcome = f"still open after {sent >> 20} MiB"
    except OSError as exc:
        outcome = f"{type(exc).__name__} after {sent >> 20} MiB"
    finally:
        sock.close()
    return outcome


def keyed_writes(port: int, seconds: float, connections: int = 4) -> Counter:
    codes: Counter = Counter()

    async def worker():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        end = time.monotonic() + seconds
        body = json.dumps({"dest": "127.0.0.1:5201", "streams": 4, "throughput_bps": 1e8}).encode()
        while time.monotonic() < end:
            head = (f"POST /v1/observations HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                    f"content-length: {len(body)}\r\nauthorization: Bearer {TOKEN}\r\n"
                    f"idempotency-key: {uuid.uuid4().hex}{uuid.uuid4().hex}\r\n\r\n").encode()
            writer.write(head + body)
            await writer.drain()
            status = (await reader.readline()).split()[1].decode()
            length = 0
            while (line := await reader.readline()) != b"\r\n":
                if line.lower().startswith(b"content-length"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            codes[status] += 1
        writer.close()

    async def main():
        await asyncio.gather(*(worker() for _ in range(connections)))

    asyncio.run(main())
    return codes


def stored_rows(db_path: str) -> dict[str, int]:
    import sqlite3

    with sqlite3.connect(db_path) as conn:
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("observations", "request_keys")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="the longest each attack runs")
    parser.add_argument("--output", help="also write the report to this file")
    args = parser.parse_args()
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 20000), hard))  # the attackers' own sockets
    folder = tempfile.mkdtemp(prefix="tame-hostile-")
    db_path = os.path.join(folder, "hostile.sqlite3")
    port = free_port()
    env = {**os.environ, "TAME_DATABASE_URL": f"sqlite:///{db_path}", "TAME_TOKEN": TOKEN,
           "TAME_READ_TOKEN": READ_TOKEN, "TAME_PRUNE_INTERVAL_S": "5", "TAME_ALLOWED_DESTINATIONS": "127.0.0.0/8"}
    server = subprocess.Popen([sys.executable, "-m", "advisor", "serve", "--no-worker", "--port", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lines = [f"# Hostile clients against one `tame serve` (`python -m benchmarks.hostile_clients --seconds "
             f"{args.seconds:g}`)", "",
             "| attack | server RSS MiB (before / highest / after) | outcome |", "|---|---|---|"]
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("tame serve did not start")
                time.sleep(0.2)

        def row(name: str, watch: Watch, outcome: str) -> None:
            before, highest, after = watch.done()
            lines.append(f"| {name} | {before:.0f} / {highest:.0f} / {after:.0f} | {outcome} |")
            print(lines[-1], flush=True)

        watch = Watch(server.pid)
        answers = asyncio.run(unfinished_heads(port, 1400, min(args.seconds, 10)))
        row("1,400 unfinished 64 KB heads", watch, ", ".join(f"{n} {a}" for a, n in answers.most_common()))

        watch = Watch(server.pid)
        other: Counter = Counter()
        stop = threading.Event()

        def ask():
            time.sleep(0.5)  # the attack's connections are opening
            while not stop.wait(0.4):
                other[status_from(port, "127.0.0.2")] += 1

        asker = threading.Thread(target=ask, daemon=True)
        asker.start()
        opened = asyncio.run(idle_connections(port, 1000, args.seconds, "127.0.0.3"))
        stop.set()
        asker.join()
        row("one address holding 1,000 idle connections", watch,
            f"{opened} opened; another address: {other.get('200', 0)} of {sum(other.values())} answered 200")

        watch = Watch(server.pid)
        outcome = endless_line(port, b"GET /docs/assets/swagger-ui-bundle.js HTTP/1.1\r\nhost: x\r\n\r\n", 1 << 30,
                               args.seconds)
        row("endless line behind an unread streamed answer", watch, outcome)

        watch = Watch(server.pid)
        outcome = endless_line(port, b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n" * 40000, 1 << 30, args.seconds)
        row("40,000 pipelined requests, then an endless line", watch, outcome)

        watch = Watch(server.pid)
        codes = keyed_writes(port, args.seconds)
        time.sleep(6)  # a pruning pass
        rows = stored_rows(db_path)
        row("observations of one link, each under a new Idempotency-Key", watch,
            f"{sum(codes.values())} answered ({dict(codes)}); stored: {rows['observations']} observations, "
            f"{rows['request_keys']} keys")
        lines += ["", f"Afterwards another address's /healthz: {status_from(port, '127.0.0.2')}."]
    finally:
        server.terminate()
        server.wait(30)
    report = "\n".join(lines) + "\n"
    print(report)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(report)


if __name__ == "__main__":
    main()
