"""Load benchmark: GET /v1/advice on a warm cache, from separate processes, on loopback.

    .venv/bin/python -m benchmarks.load_advice [--seconds 30] [--connections 32] [--client both]
        [--store sqlite|postgresql] [--database-url postgresql://...] [--url URL]
        [--replicas N] [--wrk-threads T] [--rate R] [--write-every S] [--store-cgroup [--store-cpu-shares W]]

Without --url it starts --replicas (1) `tame serve --no-worker` processes on one store: a fresh SQLite
file in a temporary folder, a throwaway PostgreSQL cluster (--store postgresql;
tests.conftest.throwaway_cluster, run from the repository root), or the database --database-url names;
stores a probe run for 127.0.0.1:5201 through POST /v1/probe-runs and warms the caches. Two clients,
each on every replica at once with --connections connections to each: wrk (`wrk -tT -cN -dS --latency`,
T = --wrk-threads, default 2; Debian's wrk, one process per replica), and a minimal HTTP/1.1 keep-alive client on asyncio in this
process (uvloop when installed). Without --rate the in-process client sends each request as soon as the
previous answer came (as wrk does); with --rate R it sends R requests/s in all, evenly spread over its
connections, and counts each latency from when the request was due (so a stall is not hidden by the
client waiting). --write-every S posts a new probe run for the path through the first replica every S
seconds while a client runs, so every replica must rebuild its advice. --store-cgroup (root) runs the throwaway
cluster in a CPU cgroup of its own, as a container or a systemd unit runs it, weighted --store-cpu-shares (cgroup
v1's cpu.shares; 1024, a container's default): which scheduling group PostgreSQL is in decides whether it keeps up
beside loaded replicas on one host (docs/advice-service.md).

A cache entry is re-read in the background from half of advisor.settings.Settings.cache_max_age_s (1 s),
so a 30 s run crosses about 60 re-reads per replica: the p99 shows whether they stall readers, and the
store reads the replicas report on /metrics (tame_advice_cache_reads_total) show whether more than one
reader re-read an entry. Prints requests/s and latency percentiles per client and replica (the total's
wrk percentiles are the worst replica's: an upper bound), for the in-process client the 100 ms window
with the worst p99 and, with --write-every, the p99 in the 1.2 s after each write; the store reads per
replica and re-read interval; whether the goal is met (>= 10,000 requests/s, p99 <= 10 ms). Every
response must be 200 or the run fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import functools
import json
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from advisor.advice_cache import _REFRESH_AHEAD as REFRESH_AHEAD
from advisor.cpu_groups import HIGHEST_CPU_SHARES, cpu_controller, weight_file
from advisor.settings import Settings

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
    # Every load client connects from 127.0.0.1: one client to the server, which must take all its connections.
    env = {**os.environ, "TAME_DATABASE_URL": database_url or f"sqlite:///{folder}/bench.sqlite3",
           "TAME_MAX_CLIENT_CONNECTIONS": os.environ.get("TAME_MAX_CONNECTIONS", "1000")}
    proc = subprocess.Popen([sys.executable, "-m", "advisor", "serve", "--no-worker", "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                if http("GET", f"{url}/healthz")[0] == 200:
                    return proc, url
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the server did not start")
            time.sleep(0.1)
    except BaseException:  # not started, or the run stopped meanwhile (Ctrl-C, SIGTERM): the caller never holds it
        proc.terminate()
        proc.wait(30)
        raise


async def worker(host: str, port: int, request: bytes, stop_at: float, samples: list, errors: list[str],
                 tag: int, due: float | None = None, interval: float | None = None):
    """One keep-alive connection: (due or sent time, latency s, tag) per answer. With ``interval`` it sends
    a request every ``interval`` s from ``due`` on (latency counted from when it was due), else back to back."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while True:
            if interval is None:
                due = time.perf_counter()
            else:
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            if due >= stop_at:
                break
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = head[9:12]
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            await reader.readexactly(length)
            samples.append((due, time.perf_counter() - due, tag))
            if status != b"200":
                errors.append(status.decode())
            if interval is not None:
                due += interval
    finally:
        writer.close()


async def hammer(urls: list[str], seconds: float, connections: int, rate_per_s: float | None):
    """Run ``connections`` workers on each URL: (samples, errors, started, elapsed)."""
    samples: list[tuple[float, float, int]] = []
    errors: list[str] = []
    total = connections * len(urls)
    interval = total / rate_per_s if rate_per_s else None
    # Paced connections open first and send from half a second on, spread over one interval each.
    started = time.perf_counter() + (0.5 if interval else 0.0)
    stop_at = started + seconds
    jobs = []
    for tag, url in enumerate(urls):
        parts = urlsplit(url)
        request = f"GET {PATH} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: keep-alive\r\n\r\n".encode()
        for i in range(connections):
            due = started + interval * (tag * connections + i) / total if interval else None
            jobs.append(worker(parts.hostname, parts.port, request, stop_at, samples, errors, tag, due, interval))
    await asyncio.gather(*jobs)
    return samples, errors, started, time.perf_counter() - started


def percentiles(latencies: list[float]) -> dict:
    latencies = sorted(latencies)
    q = statistics.quantiles(latencies, n=100)
    return {"p50_ms": q[49] * 1e3, "p90_ms": q[89] * 1e3, "p99_ms": q[98] * 1e3, "max_ms": latencies[-1] * 1e3}


def probe_store(database_url: str, stop: threading.Event, latencies: list[float], every_s: float = 0.5) -> None:
    """Time a transaction of a client of its own (BEGIN; SELECT 1; COMMIT, seconds) on the store every ``every_s``
    until ``stop``: how fast the database itself answers while the replicas are loaded (a replica's cache re-reads
    it as often)."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        while not stop.wait(every_s):
            started = time.perf_counter()
            conn.execute("BEGIN")
            conn.execute("SELECT 1").fetchall()
            conn.execute("COMMIT")
            latencies.append(time.perf_counter() - started)


def builtin_client(urls: list[str], seconds: float, connections: int, rate_per_s: float | None = None,
                   writes: list[float] | None = None) -> list[dict]:
    """requests/s and latency percentiles (ms) of the in-process client, per replica and in total (the total
    also the worst 100 ms window's p99 and, given the write times, the p99 after writes); SystemExit on a non-200."""
    try:
        import uvloop
        uvloop.install()
        loop_name = "uvloop"
    except ImportError:
        loop_name = "asyncio"
    samples, errors, started, elapsed = asyncio.run(hammer(urls, seconds, connections, rate_per_s))
    if errors:
        raise SystemExit(f"in-process client: {len(errors)} responses were not 200 (e.g. {errors[0]})")
    name = f"in-process ({loop_name}{f', {rate_per_s:g}/s paced' if rate_per_s else ''})"
    def row(client: str, mine: list[tuple[float, float, int]]) -> dict:
        out = {"client": client, "requests": len(mine), "requests_per_s": len(mine) / elapsed,
               **percentiles([latency for _, latency, _ in mine])}
        windows: dict[int, list[float]] = {}
        for due, latency, _ in mine:
            windows.setdefault(int((due - started) / 0.1), []).append(latency)
        worst = max((percentiles(w)["p99_ms"], k) for k, w in windows.items() if len(w) >= 20)
        out["worst_window"] = f"worst 100 ms window: p99 {worst[0]:.2f} ms at {worst[1] / 10:.1f} s"
        if writes:
            after = [latency for due, latency, _ in mine if any(0 <= due - w <= 1.2 for w in writes)]
            out["after_writes"] = (f"{len(writes)} writes: p99 {percentiles(after)['p99_ms']:.2f} ms, max "
                                   f"{max(after) * 1e3:.1f} ms over the {len(after)} requests due within 1.2 s after one")
        return out

    rows = [row(f"{name} replica {tag + 1}", [s for s in samples if s[2] == tag])
            for tag in range(len(urls))] if len(urls) > 1 else []
    return rows + [row(name + (" total" if len(urls) > 1 else ""), samples)]


_WRK_UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def parse_wrk(out: str) -> dict:
    """requests, requests/s and latency percentiles (ms) from `wrk --latency`'s report."""
    if "Non-2xx" in out or "Socket errors" in out:
        raise SystemExit(f"wrk saw errors:\n{out}")

    def latency(label: str) -> float:
        number, unit = re.search(rf"^\s*{label}\s+([0-9.]+)(us|ms|s)\s*$", out, re.M).groups()
        return float(number) * _WRK_UNITS_MS[unit]

    # "Latency   avg   stdev   max   +/- stdev": the third figure is the slowest request.
    worst = re.search(r"^\s*Latency\s+\S+\s+\S+\s+([0-9.]+)(us|ms|s)", out, re.M).groups()
    return {"requests": int(re.search(r"^\s*(\d+) requests in", out, re.M).group(1)),
            "requests_per_s": float(re.search(r"^Requests/sec:\s*([0-9.]+)", out, re.M).group(1)),
            "p50_ms": latency("50%"), "p90_ms": latency("90%"), "p99_ms": latency("99%"),
            "max_ms": float(worst[0]) * _WRK_UNITS_MS[worst[1]]}


def wrk_client(urls: list[str], seconds: float, connections: int, rate_per_s: float | None = None,
               writes: list[float] | None = None, threads: int = 2) -> list[dict]:
    """The same figures measured by wrk (``threads`` threads), one wrk process per replica, all at once; SystemExit
    when wrk is missing or saw errors."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (Debian package wrk; scripts/install-system-deps.sh installs it)")
    procs = [subprocess.Popen(["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds:g}s", "--latency", url + PATH],
                              stdout=subprocess.PIPE, text=True) for url in urls]
    outs = [proc.communicate(timeout=seconds + 60)[0] for proc in procs]
    if any(proc.returncode for proc in procs):
        raise SystemExit("wrk failed:\n" + "\n".join(outs))
    rows = [{"client": f"wrk -t{threads}" + (f" replica {i + 1}" if len(urls) > 1 else ""), **parse_wrk(out)}
            for i, out in enumerate(outs)]
    if len(urls) > 1:
        rows.append({"client": f"wrk -t{threads} total", "requests": sum(r["requests"] for r in rows),
                     "requests_per_s": sum(r["requests_per_s"] for r in rows),
                     **{k: max(r[k] for r in rows) for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms")}})
    return rows


def autogroup() -> str:
    """The kernel's session autogroup setting: with it on, each PostgreSQL backend (which calls setsid()) is in a
    scheduling group other than the replicas', and PostgreSQL in another group than the loaded replicas waited
    seconds for a CPU here (docs/advice-service.md)."""
    try:
        return "autogroup " + ("on" if Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
                               else "off")
    except OSError:
        return "autogroup not in this kernel"


@contextlib.contextmanager
def cpu_cgroup(parent: Path, shares: int, name: str | None = None):
    """A CPU cgroup of this run's own, ``name`` (default tame-load-advice-PID) under the cgroup folder ``parent`` (as
    a container or a systemd service with CPU accounting gets), weighted ``shares`` (cgroup v1's cpu.shares, 1024 the
    default; on v2 cpu.weight, 100 the default, scaled alike): yields its folder; on exit whatever is still in it goes
    back to ``parent`` (on v2 to the mount's top: a parent that hands cpu on may hold no process) and the group is
    removed, and cpu taken back from ``parent``'s children if this handed it and nothing else needs it."""
    group = parent / (name or f"tame-load-advice-{os.getpid()}")
    subtree = parent / "cgroup.subtree_control"  # cgroup v2: a child has a weight only if its parent hands it cpu
    handed = subtree.exists() and "cpu" not in subtree.read_text().split()
    if handed:
        subtree.write_text("+cpu")
    try:
        group.mkdir()
        try:
            file, highest = weight_file(group)
            weight = shares if file.name == "cpu.shares" else round(shares * 100 / 1024)
            file.write_text(str(min(highest, max(1, weight))))
            yield group
        finally:
            remove_cgroup(group, cpu_controller() if subtree.exists() else parent)
    finally:
        if handed:
            with contextlib.suppress(OSError):  # EBUSY: a cgroup made meanwhile hands cpu on in turn; it stays on
                subtree.write_text("-cpu")


def empty_cgroup(group: Path, into: Path) -> None:
    """Move every process still in the cgroup folder ``group`` into ``into``; one that ended meanwhile is passed over."""
    for pid in (group / "cgroup.procs").read_text().split():
        with contextlib.suppress(ProcessLookupError):
            (into / "cgroup.procs").write_text(pid)


def remove_cgroup(group: Path, into: Path) -> None:
    """Move what is left in the cgroup folder ``group`` into ``into`` and remove it, again for a moment while a
    process just forked into it or ending keeps it busy."""
    for wait in (0.05, 0.1, 0.2, 0.4, 0.8, None):
        empty_cgroup(group, into)
        try:
            group.rmdir()
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or wait is None:
                raise
            time.sleep(wait)


def _parent_pid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[1])


@contextlib.contextmanager
def _backend(database_url: str):
    """The pid of a PostgreSQL backend serving a connection of its own, held open while in the block."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        yield conn.execute("SELECT pg_backend_pid()").fetchone()[0]


def move_store(database_url: str, group: Path) -> int:
    """Move a PostgreSQL server on this host (its postmaster and every process it has started) into the cgroup
    ``group``, so the backends it starts from now on are in it too; checks that a new backend is. Returns how many
    processes were moved."""
    with _backend(database_url) as backend:
        postmaster = _parent_pid(backend)
    pids = [postmaster]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                if _parent_pid(int(entry.name)) == postmaster:
                    pids.append(int(entry.name))
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # a backend that ended meanwhile
            (group / "cgroup.procs").write_text(str(pid))
    with _backend(database_url) as backend:
        if str(backend) not in (group / "cgroup.procs").read_text().split():
            raise RuntimeError(f"a new PostgreSQL backend (pid {backend}) is not in {group}")
    return len(pids)


def cache_reads(url: str) -> dict[str, float]:
    """The replica's tame_advice_cache_reads_total by result, and its answers marked stale and not
    (tame_advice_served_total) as "stale" and "not_stale"."""
    text = http("GET", f"{url}/metrics")[1].decode()
    counts = {m[0]: float(m[1]) for m in re.findall(r'^tame_advice_cache_reads_total\{result="(\w+)"\} (\S+)$',
                                                    text, re.M)}
    for stale, value in re.findall(r'^tame_advice_served_total\{stale="(true|false)"\} (\S+)$', text, re.M):
        counts["stale" if stale == "true" else "not_stale"] = float(value)
    return counts


def seed(url: str, scale: float = 1.0) -> None:
    """Store a probe run for DEST through ``url`` (a new fit)."""
    status, body = http("POST", f"{url}/v1/probe-runs", {"dest": DEST, "idle_rtt_s": 0.01, "probes": [
        {"streams": 1, "throughput_bps": rate(1) * scale}, {"streams": 10, "throughput_bps": rate(10) * scale}]})
    if status != 201:
        raise SystemExit(f"seeding failed: {status} {body!r}")


def writer(url: str, every_s: float, stop: threading.Event, writes: list[float]) -> None:
    """A new probe run through ``url`` every ``every_s`` seconds until ``stop`` (perf_counter times in ``writes``)."""
    scale = 1.0
    while not stop.wait(every_s):
        scale = 1.5 if scale == 1.0 else 1.0
        writes.append(time.perf_counter())
        try:
            seed(url, scale)
        except OSError as exc:  # reported, and the run goes on: a slow write is a finding, not the end
            print(f"a write through {url} failed after {time.perf_counter() - writes[-1]:.1f} s: {exc}", file=sys.stderr)


def _exit_on_sigterm(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the clean-up short
    raise SystemExit(128 + signum)


def main() -> int:
    # SIGTERM (kill, timeout(1), a cancelled CI job) unwinds as Ctrl-C does, so the replicas and the throwaway cluster
    # are stopped, their folders removed and the --store-cgroup group taken out of the host's hierarchy (Python's
    # default for SIGTERM is to die at once, leaving all of them).
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--connections", type=int, default=32, help="to each replica")
    parser.add_argument("--client", choices=("wrk", "builtin", "both"), default="both")
    parser.add_argument("--store", choices=("sqlite", "postgresql"), default="sqlite",
                        help="the store of the started server: a fresh SQLite file, or a throwaway PostgreSQL cluster")
    parser.add_argument("--database-url", help="instead of --store: the database the started server uses")
    parser.add_argument("--replicas", type=int, default=1, help="`tame serve` processes started on the one store")
    parser.add_argument("--url", action="append",
                        help="an already running `tame serve` that knows 127.0.0.1:5201 (again for each replica)")
    parser.add_argument("--rate", type=float, help="the in-process client's requests/s in all, paced (default: "
                                                   "back to back)")
    parser.add_argument("--wrk-threads", type=int, default=2,
                        help="threads of each wrk process (one process per replica; default 2)")
    parser.add_argument("--write-every", type=float, help="seconds between new probe runs through the first replica")
    parser.add_argument("--store-cgroup", action="store_true",
                        help="run the throwaway PostgreSQL cluster in a CPU cgroup of its own, as a container or a "
                             "systemd service runs it (root; --store postgresql)")
    parser.add_argument("--store-cpu-shares", type=int, default=1024,
                        help=f"that cgroup's weight in cgroup v1 cpu.shares (2-{HIGHEST_CPU_SHARES}, default 1024 "
                             "as a container's; "
                             "on cgroup v2 scaled to cpu.weight)")
    args = parser.parse_args()
    if not 1 <= args.seconds <= 120:
        parser.error("--seconds must be between 1 and 120")
    if not 1 <= args.replicas <= 4:
        parser.error("--replicas must be between 1 and 4")
    if not 1 <= args.connections <= 1000:
        parser.error("--connections must be between 1 and 1000")
    if args.rate is not None and not 1 <= args.rate <= 100_000:
        parser.error("--rate must be between 1 and 100000")
    if args.write_every is not None and not 0.1 <= args.write_every <= 60:
        parser.error("--write-every must be between 0.1 and 60")
    if not 1 <= args.wrk_threads <= min(8, args.connections):
        parser.error("--wrk-threads must be between 1 and 8, and at most --connections (wrk's rule)")
    if args.url and any(urlsplit(url).hostname not in ("127.0.0.1", "localhost", "::1") for url in args.url):
        parser.error("this benchmark only targets loopback servers")
    controller = cpu_controller() if args.store_cgroup else None
    if not 2 <= args.store_cpu_shares <= HIGHEST_CPU_SHARES:
        parser.error(f"--store-cpu-shares must be between 2 and {HIGHEST_CPU_SHARES} (cgroup v1's cpu.shares range)")
    if args.store_cpu_shares != 1024 and not args.store_cgroup:
        parser.error("--store-cpu-shares weights the cgroup of --store-cgroup; give both")
    if args.store_cgroup and (args.store != "postgresql" or args.database_url or args.url):
        parser.error("--store-cgroup moves the throwaway cluster of --store postgresql; not with --database-url or --url")
    if args.store_cgroup and controller is None:
        parser.error("--store-cgroup: this host has no cgroup hierarchy with the cpu controller "
                     "(/sys/fs/cgroup/cpu on cgroup v1, or a cgroup2 mount whose cgroup.controllers has cpu)")
    if args.store_cgroup and not os.access(controller, os.W_OK):
        parser.error(f"--store-cgroup: {controller} is not writable (run as root)")
    wrk = functools.partial(wrk_client, threads=args.wrk_threads)
    clients = {"wrk": [wrk], "builtin": [builtin_client], "both": [wrk, builtin_client]}[args.client]
    results, reads = [], []
    with tempfile.TemporaryDirectory() as folder, contextlib.ExitStack() as stack:
        procs = []
        urls = args.url
        database_url = args.database_url
        if urls is None and database_url is None and args.store == "postgresql":
            from tests.conftest import throwaway_cluster  # run from the repository root (python -m)

            group = stack.enter_context(cpu_cgroup(controller, args.store_cpu_shares)) if args.store_cgroup else None
            database_url = stack.enter_context(throwaway_cluster())
            if group is not None:
                move_store(database_url, group)
                weight_path = weight_file(group)[0]
                store_weight = f"{weight_path.name} {weight_path.read_text().strip()}"
        try:
            if urls is None:
                urls = []
                for _ in range(args.replicas):
                    proc, url = start_server(folder, database_url)
                    procs.append(proc)
                    urls.append(url)
                seed(urls[0])
            for client in clients:
                for url in urls:
                    for _ in range(100):  # warm the cache
                        http("GET", url + PATH)
                before = [cache_reads(url) for url in urls]
                writes: list[float] = []
                stop = threading.Event()
                thread = threading.Thread(target=writer, args=(urls[0], args.write_every, stop, writes), daemon=True)
                if args.write_every:
                    thread.start()
                store_latencies: list[float] = []
                prober = threading.Thread(target=probe_store, args=(database_url, stop, store_latencies), daemon=True)
                if database_url and database_url.startswith(("postgresql://", "postgres://")):
                    prober.start()
                started = time.perf_counter()
                try:
                    rows = client(urls, args.seconds, args.connections, args.rate, writes)
                finally:
                    stop.set()
                    for helper in (thread, prober):
                        if helper.is_alive():
                            helper.join(30)
                elapsed = time.perf_counter() - started
                if store_latencies:
                    rows[-1]["store_probe"] = (
                        f"the store, to a client of its own (BEGIN; SELECT 1; COMMIT every 0.5 s): "
                        f"{len(store_latencies)} transactions, p50 {statistics.median(store_latencies) * 1e3:.2f} ms, "
                        f"max {max(store_latencies) * 1e3:.1f} ms, {sum(t > 0.1 for t in store_latencies)} over 100 ms")
                results.extend(rows)
                reads.append((rows[-1]["client"], elapsed, [(b, cache_reads(url)) for b, url in zip(before, urls)]))
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(30)
    store = "given server" if args.url else ("postgresql" if database_url else "sqlite")
    print(f"GET /v1/advice (warm cache, re-read from {REFRESH_AHEAD * Settings().cache_max_age_s:g} s), "
          f"{len(urls)} replica(s) x {args.connections} connections, {args.seconds:g} s per client, store {store}, "
          f"{os.cpu_count()} CPUs, {autogroup()}"
          + (f", the store in a CPU cgroup of its own ({store_weight})" if args.store_cgroup else "")
          + (f", a write every {args.write_every:g} s" if args.write_every else ""))
    print(f"{'client':<40} {'requests':>9} {'req/s':>8} {'p50 ms':>7} {'p90 ms':>7} {'p99 ms':>7} {'max ms':>7}  goal")
    for r in results:
        total = "replica" not in r["client"]
        met = r["requests_per_s"] >= GOAL_REQUESTS_PER_S and r["p99_ms"] <= GOAL_P99_MS
        print(f"{r['client']:<40} {r['requests']:>9} {r['requests_per_s']:>8.0f} {r['p50_ms']:>7.2f} "
              f"{r['p90_ms']:>7.2f} {r['p99_ms']:>7.2f} {r['max_ms']:>7.1f}  " + (
                  f"{'met' if met else 'not met'} (>= {GOAL_REQUESTS_PER_S} req/s, p99 <= {GOAL_P99_MS:g} ms)"
                  if total else ""))
        for extra in ("worst_window", "after_writes", "store_probe"):
            if extra in r:
                print(f"    {r[extra]}")
    interval_s = REFRESH_AHEAD * Settings().cache_max_age_s
    for client, elapsed, per_replica in reads:
        print(f"store reads of the cache during {client} ({elapsed:.1f} s, one key; one re-read interval is "
              f"{interval_s:g} s, so {elapsed / interval_s:.0f} intervals):")
        for i, (before, after) in enumerate(per_replica):
            got = {k: after.get(k, 0) - before.get(k, 0) for k in ("unchanged", "reloaded", "stale", "not_stale")}
            print(f"    replica {i + 1}: {got['unchanged']:.0f} unchanged + {got['reloaded']:.0f} reloaded = "
                  f"{(got['unchanged'] + got['reloaded']) / (elapsed / interval_s):.2f} per interval; "
                  f"{got['stale']:.0f} of {got['stale'] + got['not_stale']:.0f} answers marked stale "
                  f"(a re-read past the 1 s bound)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
