"""Load benchmark: GET /v1/advice on a warm cache, from separate processes, on loopback.

    .venv/bin/python -m benchmarks.load_advice [--seconds 30] [--connections 32] [--client both]
        [--store sqlite|postgresql] [--database-url postgresql://...] [--url URL]

Without --url it starts `tame serve --no-worker` on a fresh SQLite file in a temporary folder, on a
throwaway PostgreSQL cluster (--store postgresql; tests.conftest.throwaway_cluster, run from the
repository root), or on the database --database-url names, stores a probe run for 127.0.0.1:5201 through POST
/v1/probe-runs and warms the cache. Two clients: wrk (`wrk -t2 -cN -dS --latency`, Debian's wrk),
and a minimal HTTP/1.1 keep-alive client on asyncio in this process (uvloop when installed). The
cache expires every second (advisor.settings.Settings.cache_max_age_s, so that other processes' writes
show up), so a
30 s run crosses about 30 expiries: the p99 shows whether they stall readers. Prints requests/s and
latency percentiles per client and whether they meet the goal (>= 10,000 requests/s, p99 <= 10 ms);
every response must be 200 or the run fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from urllib.parse import urlsplit

DEST = "127.0.0.1:5201"
PATH = f"/v1/advice?dest={DEST}&max_impact=0.1"
GOAL_REQUESTS_PER_S = 10_000
GOAL_P99_MS = 10.0


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


def start_server(folder: str, database_url: str | None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "TAME_DATABASE_URL": database_url or f"sqlite:///{folder}/bench.sqlite3"}
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
    request = f"GET {PATH} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: keep-alive\r\n\r\n".encode()
    latencies: list[float] = []
    errors: list[str] = []
    started = time.perf_counter()
    stop_at = started + seconds
    await asyncio.gather(*(worker(parts.hostname, parts.port, request, stop_at, latencies, errors)
                           for _ in range(connections)))
    return latencies, errors, time.perf_counter() - started


def builtin_client(url: str, seconds: float, connections: int) -> dict:
    """requests/s and latency percentiles (ms) of the in-process client; SystemExit on a non-200."""
    try:
        import uvloop
        uvloop.install()
        loop_name = "uvloop"
    except ImportError:
        loop_name = "asyncio"
    latencies, errors, elapsed = asyncio.run(hammer(url, seconds, connections))
    if errors:
        raise SystemExit(f"in-process client: {len(errors)} responses were not 200 (e.g. {errors[0]})")
    latencies.sort()
    quantiles = statistics.quantiles(latencies, n=100)
    return {"client": f"in-process ({loop_name})", "requests": len(latencies), "requests_per_s": len(latencies) / elapsed,
            "p50_ms": quantiles[49] * 1e3, "p90_ms": quantiles[89] * 1e3, "p99_ms": quantiles[98] * 1e3,
            "max_ms": latencies[-1] * 1e3}


_WRK_UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def wrk_client(url: str, seconds: float, connections: int) -> dict:
    """The same figures measured by wrk (two threads); SystemExit when wrk is missing or saw errors."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (Debian package wrk; scripts/install-system-deps.sh installs it)")
    out = subprocess.run(["wrk", "-t2", f"-c{connections}", f"-d{seconds:g}s", "--latency", url + PATH],
                         capture_output=True, text=True, timeout=seconds + 60, check=True).stdout
    if "Non-2xx" in out or "Socket errors" in out:
        raise SystemExit(f"wrk saw errors:\n{out}")

    def latency(label: str) -> float:
        number, unit = re.search(rf"^\s*{label}\s+([0-9.]+)(us|ms|s)\s*$", out, re.M).groups()
        return float(number) * _WRK_UNITS_MS[unit]

    requests = int(re.search(r"^\s*(\d+) requests in", out, re.M).group(1))
    # "Latency   avg   stdev   max   +/- stdev": the third figure is the slowest request.
    worst = re.search(r"^\s*Latency\s+\S+\s+\S+\s+([0-9.]+)(us|ms|s)", out, re.M).groups()
    return {"client": "wrk -t2", "requests": requests,
            "requests_per_s": float(re.search(r"^Requests/sec:\s*([0-9.]+)", out, re.M).group(1)),
            "p50_ms": latency("50%"), "p90_ms": latency("90%"), "p99_ms": latency("99%"),
            "max_ms": float(worst[0]) * _WRK_UNITS_MS[worst[1]]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--client", choices=("wrk", "builtin", "both"), default="both")
    parser.add_argument("--store", choices=("sqlite", "postgresql"), default="sqlite",
                        help="the store of the started server: a fresh SQLite file, or a throwaway PostgreSQL cluster")
    parser.add_argument("--database-url", help="instead of --store: the database the started server uses")
    parser.add_argument("--url", help="an already running `tame serve` that knows 127.0.0.1:5201")
    args = parser.parse_args()
    if not 1 <= args.seconds <= 120:
        parser.error("--seconds must be between 1 and 120")
    if not 1 <= args.connections <= 1000:
        parser.error("--connections must be between 1 and 1000")
    if args.url and urlsplit(args.url).hostname not in ("127.0.0.1", "localhost", "::1"):
        parser.error("this benchmark only targets loopback servers")
    clients = {"wrk": [wrk_client], "builtin": [builtin_client], "both": [wrk_client, builtin_client]}[args.client]
    results = []
    with tempfile.TemporaryDirectory() as folder, contextlib.ExitStack() as stack:
        proc = None
        url = args.url
        database_url = args.database_url
        if url is None and database_url is None and args.store == "postgresql":
            from tests.conftest import throwaway_cluster  # run from the repository root (python -m)

            database_url = stack.enter_context(throwaway_cluster())
        if url is None:
            proc, url = start_server(folder, database_url)
            status, body = http("POST", f"{url}/v1/probe-runs", {"dest": DEST, "idle_rtt_s": 0.01, "probes": [
                {"streams": 1, "throughput_bps": rate(1)}, {"streams": 10, "throughput_bps": rate(10)}]})
            if status != 201:
                raise SystemExit(f"seeding failed: {status} {body!r}")
        try:
            for client in clients:
                for _ in range(100):  # warm the cache
                    http("GET", url + PATH)
                results.append(client(url, args.seconds, args.connections))
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(30)
    store = "given server" if args.url else ("postgresql" if database_url else "sqlite")
    print(f"GET /v1/advice (warm cache, expiring every second), {args.connections} connections, {args.seconds:g} s "
          f"per client, store {store}, {os.cpu_count()} CPUs")
    print(f"{'client':<22} {'requests':>9} {'req/s':>8} {'p50 ms':>7} {'p90 ms':>7} {'p99 ms':>7} {'max ms':>7}  goal")
    for r in results:
        met = r["requests_per_s"] >= GOAL_REQUESTS_PER_S and r["p99_ms"] <= GOAL_P99_MS
        print(f"{r['client']:<22} {r['requests']:>9} {r['requests_per_s']:>8.0f} {r['p50_ms']:>7.2f} "
              f"{r['p90_ms']:>7.2f} {r['p99_ms']:>7.2f} {r['max_ms']:>7.1f}  {'met' if met else 'not met'} "
              f"(>= {GOAL_REQUESTS_PER_S} req/s, p99 <= {GOAL_P99_MS:g} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
