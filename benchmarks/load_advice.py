"""Load benchmark: GET /v1/advice on a warm cache, from this (separate) process, on loopback.

    .venv/bin/python -m benchmarks.load_advice [--seconds 15] [--connections 32] [--url URL]

Without --url it starts `tame serve --no-worker` on a fresh SQLite file in a temporary folder,
stores a probe run for 127.0.0.1:5201 through POST /v1/probe-runs and warms the cache. The
client is a minimal HTTP/1.1 keep-alive client on asyncio (uvloop when installed), so the
client costs as little CPU as possible on a small machine. Prints requests/s and latency
percentiles; every response must be 200 or the run fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from urllib.parse import urlsplit

DEST = "127.0.0.1:5201"


def rate(n: float) -> float:
    return n / math.sqrt(1e-16 * n * n + 4e-16)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http(method: str, url: str, body: dict | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def start_server(folder: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "TAME_DATABASE_URL": f"sqlite:///{folder}/bench.sqlite3"}
    proc = subprocess.Popen([sys.executable, "-m", "advisor", "serve", "--no-worker", "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if http("GET", f"{url}/healthz")[0] == 200:
                return proc, url
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the server did not start")
        time.sleep(0.1)


async def worker(host: str, port: int, request: bytes, stop_at: float, latencies: list[float], errors: list[str]):
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = head[9:12]
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - started)
            if status != b"200":
                errors.append(status.decode())
    finally:
        writer.close()


async def hammer(url: str, seconds: float, connections: int) -> tuple[list[float], list[str], float]:
    parts = urlsplit(url)
    path = f"/v1/advice?dest={DEST}&max_impact=0.1"
    request = f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: keep-alive\r\n\r\n".encode()
    latencies: list[float] = []
    errors: list[str] = []
    started = time.perf_counter()
    stop_at = started + seconds
    await asyncio.gather(*(worker(parts.hostname, parts.port, request, stop_at, latencies, errors)
                           for _ in range(connections)))
    return latencies, errors, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--url", help="an already running `tame serve` that knows 127.0.0.1:5201")
    args = parser.parse_args()
    if not 1 <= args.seconds <= 120:
        parser.error("--seconds must be between 1 and 120")
    if args.url and urlsplit(args.url).hostname not in ("127.0.0.1", "localhost", "::1"):
        parser.error("this benchmark only targets loopback servers")
    try:
        import uvloop
        uvloop.install()
        loop_name = "uvloop"
    except ImportError:
        loop_name = "asyncio"
    with tempfile.TemporaryDirectory() as folder:
        proc = None
        url = args.url
        if url is None:
            proc, url = start_server(folder)
            status, body = http("POST", f"{url}/v1/probe-runs", {"dest": DEST, "idle_rtt_s": 0.01, "probes": [
                {"streams": 1, "throughput_bps": rate(1)}, {"streams": 10, "throughput_bps": rate(10)}]})
            if status != 201:
                raise SystemExit(f"seeding failed: {status} {body!r}")
        try:
            for _ in range(100):  # warm the cache
                http("GET", f"{url}/v1/advice?dest={DEST}&max_impact=0.1")
            latencies, errors, elapsed = asyncio.run(hammer(url, args.seconds, args.connections))
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(30)
    latencies.sort()
    quantiles = statistics.quantiles(latencies, n=100) if len(latencies) >= 100 else [float("nan")] * 99
    print(f"GET /v1/advice (warm cache), {args.connections} connections, {elapsed:.1f} s, client loop {loop_name}, "
          f"{os.cpu_count()} CPUs")
    print(f"requests: {len(latencies)}  errors: {len(errors)}")
    print(f"requests/s: {len(latencies) / elapsed:.0f}")
    print(f"latency p50: {quantiles[49] * 1e3:.2f} ms  p90: {quantiles[89] * 1e3:.2f} ms  "
          f"p99: {quantiles[98] * 1e3:.2f} ms  max: {latencies[-1] * 1e3:.2f} ms")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
