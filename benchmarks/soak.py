"""Soak: a real `tame serve` and `tame agent` on loopback under mixed load, killed and restarted at random.

    python -m benchmarks.soak --minutes 30 --store sqlite
    python -m benchmarks.soak --minutes 30 --store postgresql   # a throwaway cluster, or TAME_SOAK_DATABASE_URL

It starts `iperf3 -s` on 127.0.0.1, `tame serve` (its worker probes that server with 1 s probes) and a
local `tame agent` on the same store, then for --minutes runs: reads (GET /v1/advice, batches),
writes (observations, pushed probe-runs), probe requests, slow clients (a header sent a byte a
second) and oversized ones (a large body without a token), while a seeded schedule SIGKILLs or
SIGTERMs the server or the agent and starts it again. It prints:

- lost acknowledged writes: every 2xx observation and pushed run must be in the store at the end,
  unless retention (advisor/retention.py) pruned it, i.e. the store holds at least its keep count
  of that destination's newer rows;
- 5xx responses: 503s within a restart window are expected; any other 5xx, or a 503 outside a window, counts;
- jobs still queued/running past their lease after the load stopped and the last restart;
- probes.iperf_worker processes of this run left without their parent (orphans);
- the server's RSS (start after warm-up, end, max; within +-20 % of start) and the store's size over time.

Everything is bounded in time: the load stops at --minutes, the drain and shutdown have deadlines.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import itertools

import httpx

from probes.lifetime import signal_on_parent_death

ROOT = Path(__file__).resolve().parents[1]
TAME = [sys.executable, "-m", "advisor"]
TOKEN = "soak-write-token"
KEEP_RUNS, KEEP_OBSERVATIONS, KEEP_FITS = 5, 200, 5
SYNTHETIC_DESTS = [f"127.0.0.{i}" for i in range(2, 6)]  # pushed runs and observations; never probed


def _die_with_parent():
    signal_on_parent_death(signal.SIGTERM)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def marked_workers(marker: str) -> list[tuple[int, int]]:
    """(pid, ppid) of probes.iperf_worker processes started by this run (its marker in their environment)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if b"probes.iperf_worker" not in f.read():
                    continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                if f"TAME_SOAK_RUN={marker}".encode() not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
            found.append((int(entry), int(stat[stat.rfind(")") + 2:].split()[1])))
        except (OSError, ValueError, IndexError):
            continue
    return found


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    statuses: dict[str, int] = field(default_factory=dict)
    errors_in_window: int = 0
    errors_outside: int = 0
    bad_5xx: list[str] = field(default_factory=list)
    ok_503: int = 0
    observations: list[tuple[str, int, float, float]] = field(default_factory=list)
    runs: list[tuple[str, int]] = field(default_factory=list)
    slow: dict[str, int] = field(default_factory=dict)
    error_examples: list[str] = field(default_factory=list)

    def count(self, kind: str, key: str) -> None:
        with self.lock:
            getattr(self, kind)[key] = getattr(self, kind).get(key, 0) + 1


class Processes:
    """The server and the agent, started and killed by the chaos schedule; restart windows recorded."""

    def __init__(self, env: dict[str, str], port: int, dest_file: Path, logs: Path):
        self.env, self.port, self.dest_file, self.logs = env, port, dest_file, logs
        self.base = f"http://127.0.0.1:{port}"
        self.server: subprocess.Popen | None = None
        self.agent: subprocess.Popen | None = None
        self.windows: list[list[float]] = []  # [start, end]; end is inf while open
        self.lock = threading.Lock()
        self.server_starts: list[tuple[int, float]] = []  # (pid, start time)
        self.last_restart = 0.0
        self.kills: dict[str, int] = {}
        self.t_start = time.monotonic()
        self.busy = threading.Lock()

    def _spawn(self, args: list[str], name: str) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "ab")
        try:
            return subprocess.Popen(TAME + args, cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        finally:
            log.close()

    def start_server(self, deadline_s: float = 60.0) -> None:
        self.server = self._spawn(["serve", "--port", str(self.port)], "serve")
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self.server.poll() is not None:
                time.sleep(0.5)  # the old socket may linger a moment: try again
                self.server = self._spawn(["serve", "--port", str(self.port)], "serve")
                continue
            try:
                if httpx.get(f"{self.base}/healthz", timeout=2).status_code == 200:
                    self.server_starts.append((self.server.pid, time.monotonic()))
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("tame serve did not come up; see its log")

    def start_agent(self) -> None:
        self.agent = self._spawn(["agent", "--dest-file", str(self.dest_file), "--interval", "5"], "agent")

    def kill(self, which: str, sig: int) -> None:
        with self.busy:
            self._kill(which, sig)

    def _kill(self, which: str, sig: int) -> None:
        proc = self.server if which == "server" else self.agent
        key = f"{which} {signal.Signals(sig).name}"
        self.kills[key] = self.kills.get(key, 0) + 1
        now = time.monotonic()
        print(f"  t={now - self.t_start:.1f}s: {key}", flush=True)
        if which == "server":
            with self.lock:
                self.windows.append([now, float("inf")])
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if which == "server":
            self.start_server()
            with self.lock:
                self.windows[-1][1] = time.monotonic() + 2.0  # requests already in flight may still see it
        else:
            time.sleep(1.0)
            self.start_agent()
        self.last_restart = time.monotonic()

    def in_window(self, t0: float, t1: float) -> bool:
        with self.lock:
            return any(t0 <= end and t1 >= start for start, end in self.windows)

    def stop(self) -> None:
        for proc in (self.agent, self.server):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in (self.agent, self.server):
            if proc is None:
                continue
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def request(procs: Processes, tally: Tally, client: httpx.Client, method: str, path: str, **kw):
    t0 = time.monotonic()
    try:
        resp = client.request(method, procs.base + path, **kw)
    except httpx.HTTPError as exc:
        in_window = procs.in_window(t0, time.monotonic())
        with tally.lock:
            if in_window:
                tally.errors_in_window += 1
            else:
                tally.errors_outside += 1
                if len(tally.error_examples) < 20:
                    tally.error_examples.append(f"{method} {path} {type(exc).__name__} {str(exc)[:60]} t={t0 - procs.t_start:.1f}s"
                                                f"+{time.monotonic() - t0:.1f}s")
        return None
    t1 = time.monotonic()
    tally.count("statuses", f"{method} {path.split('?')[0].split('/v1/probes/')[0]} {resp.status_code}")
    if resp.status_code >= 500:
        with tally.lock:
            if resp.status_code == 503 and procs.in_window(t0, t1):
                tally.ok_503 += 1
            else:
                tally.bad_5xx.append(f"{method} {path} {kw.get('params', '')} {resp.status_code} {resp.text[:120]} t={t0 - procs.t_start:.1f}s")
    return resp


def reader(procs, tally, stop, rng, probe_dest):
    dests = [probe_dest] + [f"{d}:{probe_dest.split(':')[1]}" for d in SYNTHETIC_DESTS]
    with httpx.Client(timeout=10) as client:
        while not stop.wait(0.05):
            if rng.random() < 0.9:
                request(procs, tally, client, "GET", "/v1/advice",
                        params={"dest": rng.choice(dests), "max_impact": rng.choice([0.1, 0.25, 0.5])})
            else:
                items = [{"dest": rng.choice(dests), "max_impact": rng.random()} for _ in range(20)]
                request(procs, tally, client, "POST", "/v1/advice:batch", json=items)


def writer(procs, tally, stop, rng, port, seq):
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(timeout=15, headers=headers) as client:
        while not stop.wait(0.2):
            dest = f"{rng.choice(SYNTHETIC_DESTS)}:{port}"
            if rng.random() < 0.9:
                n = rng.randint(1, 16)
                bps = round(n / (1e-16 * n * n + 4e-16) ** 0.5, 3) + next(seq) * 1e-3  # unique per write
                t_send = time.time()
                resp = request(procs, tally, client, "POST", "/v1/observations",
                               json={"dest": dest, "streams": n, "throughput_bps": bps})
                if resp is not None and 200 <= resp.status_code < 300:
                    with tally.lock:
                        tally.observations.append((resp.json()["dest"], n, bps, t_send))
            else:
                now = time.time()
                probes = [{"streams": n, "throughput_bps": n / (1e-16 * n * n + 4e-16) ** 0.5 * rng.uniform(0.95, 1.05),
                           "duration_s": 1.0, "started_at": now} for n in (1, 4, 10)]
                resp = request(procs, tally, client, "POST", "/v1/probe-runs",
                               json={"dest": dest, "idle_rtt_s": 0.001, "started_at": now, "probes": probes})
                if resp is not None and 200 <= resp.status_code < 300:
                    body = resp.json()
                    with tally.lock:
                        tally.runs.append((body["dest"], body["probe_run_id"]))


def prober(procs, tally, stop, probe_dest):
    with httpx.Client(timeout=10, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        while not stop.wait(7.0):
            resp = request(procs, tally, client, "POST", "/v1/probes", json={"dest": probe_dest})
            if resp is not None and resp.status_code == 202:
                request(procs, tally, client, "GET", f"/v1/probes/{resp.json()['id']}")


def slow_clients(procs, tally, stop, port):
    while not stop.wait(20.0):
        # A header trickle: one byte a second; the server must cut it off (408 or a close) within its deadline.
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            continue  # the server is restarting
        with sock:
            t0, outcome = time.monotonic(), "held past 30 s"
            try:
                for byte in b"GET /v1/advice?dest=127.0.0.1&max_impact=0.5 HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 60:
                    sock.sendall(bytes([byte]))
                    if stop.wait(1.0):
                        outcome = "unfinished (load stopped)"
                        break
                    if time.monotonic() - t0 > 30:
                        break
                    sock.settimeout(0.01)
                    try:
                        sock.recv(64)  # an answer (408) or b"" (closed): either way it was cut off
                        outcome = "cut off"
                        break
                    except socket.timeout:
                        pass
                    sock.settimeout(5)
            except OSError:
                outcome = "cut off"
            tally.count("slow", f"header trickle {outcome}")
        # A large body without a token: refused before it is read.
        try:
            with httpx.Client(timeout=10) as client:
                body = b"x" * (16 * 1024 * 1024)
                resp = client.post(procs.base + "/v1/probe-runs", content=body,
                                   headers={"content-type": "application/json"})
                tally.count("slow", f"16 MB body without a token: {resp.status_code}")
        except httpx.HTTPError as exc:
            tally.count("slow", f"16 MB body without a token: {type(exc).__name__} (closed early)")


def sampler(procs, stop, samples, store_size, marker, orphans):
    suspects: set[int] = set()
    while not stop.wait(5.0):
        pid = procs.server.pid if procs.server is not None else None
        samples.append((time.monotonic(), pid, rss_bytes(pid) if pid else None, store_size()))
        alive = {p.pid for p in (procs.server, procs.agent) if p is not None and p.poll() is None}
        # A worker is an orphan when it outlives its parent by a whole sample (not the instant of a kill).
        now_suspects = {wpid for wpid, ppid in marked_workers(marker) if ppid not in alive}
        orphans.update(now_suspects & suspects)
        suspects.clear()
        suspects.update(now_suspects)


def chaos(procs, stop, done, rng, start, duration_s):
    try:
        _chaos(procs, stop, rng, start, duration_s)
    finally:
        # The processes this thread restarted die with it (PR_SET_PDEATHSIG follows the thread that
        # forked them): it lives until the run is over.
        done.wait(duration_s + 600)


def _chaos(procs, stop, rng, start, duration_s):
    warmup = min(60.0, 0.2 * duration_s)
    mean_gap = max(15.0, duration_s / 12)
    at = warmup + rng.uniform(0.5, 1.5) * mean_gap
    while at < duration_s - 10 and not stop.is_set():
        if stop.wait(max(0.0, start + at - time.monotonic())):
            return
        which = rng.choice(["server", "server", "agent"])
        procs.kill(which, rng.choice([signal.SIGKILL, signal.SIGTERM]))
        at += rng.uniform(0.5, 1.5) * mean_gap


def verify(url: str, tally: Tally) -> dict[str, int]:
    """Acknowledged writes missing from the store, less those retention may have pruned."""
    from advisor.db import Database

    db = Database(url)
    lost_obs = lost_runs = pruned_obs = pruned_runs = 0
    try:
        with db.transaction() as tx:
            stored, times = set(), {}
            for dest, streams, bps, observed_at in tx.execute(
                    "SELECT d.dest, o.streams, o.throughput_bps, o.observed_at FROM observations o "
                    "JOIN destinations d ON d.id = o.destination_id").fetchall():
                times.setdefault(dest, []).append(observed_at)
                stored.add((dest, streams, bps))
            runs = {}
            for dest, run_id in tx.execute("SELECT d.dest, r.id FROM probe_runs r JOIN destinations d "
                                           "ON d.id = r.destination_id").fetchall():
                runs.setdefault(dest, []).append(run_id)
        for dest, streams, bps, t_send in tally.observations:
            if (dest, streams, bps) in stored:
                continue
            # Retention keeps a destination's newest KEEP_OBSERVATIONS: this one may go once that many came after it.
            if sum(t >= t_send for t in times.get(dest, [])) >= KEEP_OBSERVATIONS:
                pruned_obs += 1
            else:
                lost_obs += 1
        for dest, run_id in tally.runs:
            ids = runs.get(dest, [])
            if run_id in ids:
                continue
            if sum(i > run_id for i in ids) >= KEEP_RUNS:
                pruned_runs += 1
            else:
                lost_runs += 1
    finally:
        db.close()
    return {"lost observations": lost_obs, "lost pushed runs": lost_runs,
            "observations pruned by retention": pruned_obs, "runs pruned by retention": pruned_runs}


# A queued job must be claimed within this long once the server is up (a probe plan here takes seconds).
QUEUED_LIMIT_S = 120.0


def job_check(url: str) -> dict[str, int]:
    from advisor.db import Database
    from advisor.jobs import _owner_is_dead_here

    db = Database(url)
    try:
        with db.transaction() as tx:
            now = time.time()
            running = tx.execute("SELECT lease_until, owner FROM probe_jobs WHERE status = 'running'").fetchall()
            queued = tx.execute("SELECT requested_at FROM probe_jobs WHERE status = 'queued'").fetchall()
            counts = dict(tx.execute("SELECT status, count(*) FROM probe_jobs GROUP BY status").fetchall())
    finally:
        db.close()
    return {"running": len(running),
            "running past lease": sum(1 for lease, _ in running if lease is None or lease < now),
            "running with a dead owner": sum(1 for _, owner in running if _owner_is_dead_here(owner)),
            "queued": len(queued), "queued too long": sum(1 for (at,) in queued if at < now - QUEUED_LIMIT_S),
            **{f"jobs {k} (kept)": v for k, v in counts.items() if k in ("done", "failed")}}


def wait_drained(url: str, deadline_s: float) -> None:
    """Until no job is running or queued from before the load stopped (the agent may queue new ones), or the deadline."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        c = job_check(url)
        if c["running past lease"] == 0 and c["running with a dead owner"] == 0 and c["queued too long"] == 0 \
                and c["running"] + c["queued"] <= 1:
            return
        time.sleep(2.0)


def mb(n):
    return "n/a" if n is None else f"{n / 1e6:.1f} MB"


def run(args, url: str, work: Path) -> dict:
    rng = random.Random(args.seed)
    marker = uuid.uuid4().hex
    iperf_port, api_port = free_port(), free_port()
    probe_dest = f"127.0.0.1:{iperf_port}"
    dest_file = work / "dests.txt"
    dest_file.write_text(probe_dest + "\n")
    env = {**os.environ, "TAME_DATABASE_URL": url, "TAME_TOKEN": TOKEN, "TAME_MODEL": "lu",
           "TAME_PROBE_LEVELS": "1,4", "TAME_PROBE_DURATION_S": "1", "TAME_PROBE_MAX_DURATION_S": "2",
           "TAME_TTL_S": "45", "TAME_KEEP_RUNS": str(KEEP_RUNS), "TAME_KEEP_FITS": str(KEEP_FITS),
           "TAME_KEEP_OBSERVATIONS": str(KEEP_OBSERVATIONS), "TAME_PRUNE_INTERVAL_S": "10",
           "TAME_HEADER_TIMEOUT_S": "10", "TAME_SOAK_RUN": marker, "PYTHONPATH": str(ROOT)}
    env.pop("TAME_READ_TOKEN", None)
    iperf = subprocess.Popen(["iperf3", "-s", "-B", "127.0.0.1", "-p", str(iperf_port)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent)
    procs = Processes(env, api_port, dest_file, work)
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]

        def store_size():
            return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))
    else:
        import psycopg

        def store_size():
            try:
                with psycopg.connect(url, connect_timeout=5) as conn:
                    return conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]
            except psycopg.Error:
                return None

    tally, samples, orphans = Tally(), [], set()
    stop_load, stop_chaos, done = threading.Event(), threading.Event(), threading.Event()
    seq = itertools.count(1)  # one sequence for both writers: each observation's rate is unique
    duration_s = args.minutes * 60.0
    try:
        procs.start_server()
        procs.start_agent()
        start = time.monotonic()
        threads = [threading.Thread(target=reader, args=(procs, tally, stop_load, random.Random(rng.random()), probe_dest)),
                   threading.Thread(target=reader, args=(procs, tally, stop_load, random.Random(rng.random()), probe_dest)),
                   threading.Thread(target=writer, args=(procs, tally, stop_load, random.Random(rng.random()), iperf_port, seq)),
                   threading.Thread(target=writer, args=(procs, tally, stop_load, random.Random(rng.random()), iperf_port, seq)),
                   threading.Thread(target=prober, args=(procs, tally, stop_load, probe_dest)),
                   threading.Thread(target=slow_clients, args=(procs, tally, stop_load, api_port)),
                   threading.Thread(target=sampler, args=(procs, stop_chaos, samples, store_size, marker, orphans))]
        chaos_thread = threading.Thread(target=chaos, args=(procs, stop_chaos, done, random.Random(args.seed + 1), start,
                                                          duration_s))
        for t in threads + [chaos_thread]:
            t.daemon = True
            t.start()
        stop_load.wait(duration_s)
        stop_load.set()
        while procs.busy.locked():  # a restart in progress finishes first
            time.sleep(0.5)
        for t in threads[:-1]:
            t.join(60)
        # The jobs the load left must finish (or fail) within a lease of the last restart.
        wait_drained(url, deadline_s=90.0)
        jobs = job_check(url)
        stop_chaos.set()
        threads[-1].join(30)
        for wpid, ppid in marked_workers(marker):
            if ppid not in {procs.server.pid, procs.agent.pid}:
                orphans.add(wpid)
    finally:
        stop_load.set()
        stop_chaos.set()
        procs.stop()
        done.set()
        iperf.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            iperf.wait(10)
        if iperf.poll() is None:
            iperf.kill()
            iperf.wait()
    time.sleep(1.0)
    left = marked_workers(marker)  # after both stopped, none of this run's workers may live on
    orphans.update(pid for pid, _ in left)
    for pid, _ in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    lost = verify(url, tally)

    # RSS over the longest-lived server: its first sample after warm-up against its last.
    warmup = min(60.0, 0.2 * duration_s)
    by_pid: dict[int, list[tuple[float, int]]] = {}
    for t, pid, rss, _ in samples:
        if pid and rss:
            by_pid.setdefault(pid, []).append((t, rss))
    rss = {}
    if by_pid:
        pid, series = max(by_pid.items(), key=lambda kv: kv[1][-1][0] - kv[1][0][0])
        started = dict(procs.server_starts).get(pid, series[0][0])
        warm = [r for t, r in series if t - started >= warmup] or [series[-1][1]]
        rss = {"pid": pid, "lived_s": round(series[-1][0] - series[0][0]), "start": warm[0], "end": warm[-1],
               "max": max(r for _, r in series), "within_20pct": abs(warm[-1] - warm[0]) <= 0.2 * warm[0]}
    sizes = [s for *_, s in samples if s is not None]
    return {"minutes": args.minutes, "store": url.split(":")[0], "seed": args.seed, **lost,
            "acknowledged observations": len(tally.observations), "acknowledged pushed runs": len(tally.runs),
            "bad 5xx": len(tally.bad_5xx), "bad 5xx examples": tally.bad_5xx[:5], "503 in restart windows": tally.ok_503,
            "connection errors in restart windows": tally.errors_in_window,
            "connection errors outside": tally.errors_outside, "connection error examples": tally.error_examples[:8],
            "kills": procs.kills, "restart windows": len(procs.windows),
            "windows": [f"{a - procs.t_start:.1f}-{b - procs.t_start:.1f}s" for a, b in procs.windows], **jobs, "orphaned iperf workers": len(orphans),
            "rss": rss, "store size start": sizes[0] if sizes else None, "store size end": sizes[-1] if sizes else None,
            "store size max": max(sizes) if sizes else None, "slow clients": tally.slow,
            "requests": sum(tally.statuses.values()), "statuses": tally.statuses}


def report(r: dict) -> None:
    print(f"soak: {r['minutes']} min on {r['store']} (seed {r['seed']}), {r['requests']} requests")
    print(f"  lost acknowledged writes: {r['lost observations'] + r['lost pushed runs']} "
          f"({r['lost observations']} of {r['acknowledged observations']} observations, "
          f"{r['lost pushed runs']} of {r['acknowledged pushed runs']} pushed runs; "
          f"pruned by retention: {r['observations pruned by retention']} observations, {r['runs pruned by retention']} runs)")
    print(f"  stuck jobs: {r['running past lease']} running past their lease, {r['running with a dead owner']} "
          f"running with a dead owner, {r['queued too long']} queued over {QUEUED_LIMIT_S:.0f} s "
          f"(after the drain: {r['running']} running, {r['queued']} queued); "
          f"orphaned iperf workers: {r['orphaned iperf workers']}")
    print(f"  5xx other than 503 in a restart window: {r['bad 5xx']} {r['bad 5xx examples'] or ''}; "
          f"503 in restart windows: {r['503 in restart windows']}; connection errors in windows "
          f"{r['connection errors in restart windows']}, outside {r['connection errors outside']} "
          f"{r['connection error examples'] or ''}")
    print(f"  kills: {r['kills']} ({r['restart windows']} server restarts: {r['windows']})")
    rss = r["rss"]
    if rss:
        print(f"  server RSS (pid {rss['pid']}, lived {rss['lived_s']} s): start {mb(rss['start'])} after warm-up, "
              f"end {mb(rss['end'])}, max {mb(rss['max'])}; within +-20 %: {rss['within_20pct']}")
    print(f"  store size: start {mb(r['store size start'])}, end {mb(r['store size end'])}, max {mb(r['store size max'])}")
    print(f"  slow clients: {r['slow clients']}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--store", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--seed", type=int, default=31)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if not 0.5 <= args.minutes <= 24 * 60:
        parser.error("--minutes must be between 0.5 and 1440")
    work = Path(tempfile.mkdtemp(prefix="tame-soak-"))
    try:
        with contextlib.ExitStack() as stack:
            if args.store == "sqlite":
                url = f"sqlite:///{work / 'tame.sqlite3'}"
            else:
                url = os.environ.get("TAME_SOAK_DATABASE_URL")
                if not url:
                    from tests.conftest import throwaway_cluster  # run from the repository root (python -m)

                    url = stack.enter_context(throwaway_cluster())
            result = run(args, url, work)
        report(result)
        if args.json:
            args.json.write_text(json.dumps(result, indent=2, default=str))
        ok = result["lost observations"] + result["lost pushed runs"] == 0
        return 0 if ok else 1
    finally:
        if os.environ.get("TAME_SOAK_KEEP"):
            print(f"  logs and store kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
