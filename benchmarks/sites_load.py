"""Many agents claiming links from one PostgreSQL: does every link stay fresh, is any link probed twice at once,
does any site pass its budget, and what does it cost the database?

    python -m benchmarks.sites_load                       # 1,000 links, 5 sites x 2 agents, TTL 60 s, 180 s
    python -m benchmarks.sites_load --ttl 600 --seconds 900   # the issue's TTL of 10 minutes

Starts a throwaway PostgreSQL cluster (tests.conftest.throwaway_cluster; run from the repository root) or uses
--database-url, one `tame serve --no-worker` on it, and the agents as processes of their own: each is
advisor.site_agent.SiteAgent (what `tame agent --site` runs) with probes.fake.FakeDriver standing in for iperf3
(each probe takes --probe-s seconds of wall time, no traffic). Links are 10.x addresses that are never
contacted. A monitor samples every link's state from the database each second: a link is counted fresh while
its newest fit is younger than the TTL, and stale otherwise (the API marks it so). Reports claims/s, the
claim round trip, every site's peak use against its budget, overlapping probes of one link (there must be none),
and the database's transactions/s and its processes' CPU. Writes benchmarks/results/sites_load.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def rate(n: int) -> float:
    """A path of Lu's form (bits/s at n streams)."""
    return n / (1e-16 * n * n + 4e-16) ** 0.5


def agent_main(site: str, server: str, dests_file: str, seconds: float, probe_s: float, max_probes: int,
               max_streams: int, probe_seconds_per_hour: float, interval_s: float, out: str) -> None:
    """One agent process: SiteAgent rounds against ``server`` for ``seconds``; writes its claim timings to ``out``."""
    from advisor.settings import Settings
    from advisor.site_agent import SiteAgent
    from advisor.sites import SiteBudget
    from advisor.jobs import process_owner
    from api.client import TameClient
    from probes.fake import FakeDriver

    settings = Settings.from_env()
    dests = Path(dests_file).read_text().split()
    timings: list[float] = []
    pushed = [0]
    with TameClient(server, timeout_s=60) as client:
        claim = client.claim

        def timed_claim(*args, **kwargs):
            started = time.perf_counter()
            try:
                return claim(*args, **kwargs)
            finally:
                timings.append(time.perf_counter() - started)

        client.claim = timed_claim

        def push(payload):
            client.push_probe_run(payload)
            pushed[0] += 1
            return True

        agent = SiteAgent(client, site, process_owner(), SiteBudget(max_probes, max_streams, probe_seconds_per_hour),
                          settings, FakeDriver(rate, rtt_s=0.02, delay_s=probe_s / 2), push=push, clock=time.time,
                          log=lambda line: None)
        stop_at = time.monotonic() + seconds
        signal.signal(signal.SIGTERM, lambda *_: agent.stop.set())
        while time.monotonic() < stop_at and not agent.stop.is_set():
            agent.round(dests)
            agent.stop.wait(interval_s)
    Path(out).write_text(json.dumps({"claims_s": timings, "pushed": pushed[0]}))


def _monitor(database_url: str, ttl_s: float, sites: list[str], stop: threading.Event, samples: list) -> None:
    """Each second: how many links are fresh (advisor.store.FitRow.evidence_at, as the service judges it) and what
    each site's probes hold of its budget (advisor.sites.site_use, as a claim counts it)."""
    from advisor.sites import site_use
    from advisor.store import Store

    store = Store.open(database_url)
    try:
        while not stop.is_set():
            now = time.time()
            newest: dict[tuple[str, str], float] = {}
            for row in store.current_fits():
                if row.src in sites:
                    newest[(row.src, row.dest)] = max(newest.get((row.src, row.dest), 0.0), row.evidence_at)
            with store.db.transaction() as tx:
                links = tx.execute("SELECT count(*) FROM destinations WHERE src <> 'central'").fetchone()[0]
                xacts = tx.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                                   "WHERE datname = current_database()").fetchone()[0]
            use = {site: site_use(store, site) for site in sites}
            samples.append({"t": now, "fresh": sum(1 for at in newest.values() if now - at <= ttl_s),
                            "links": links, "never": links - len(newest),
                            "use": {site: (u.probes, u.streams) for site, u in use.items()},
                            "seconds": {site: u.seconds for site, u in use.items()}, "xacts": xacts})
            stop.wait(1.0)
    finally:
        store.close()


def _overlaps(database_url: str) -> int:
    """Pairs of probes of one link whose running times overlapped (from the finished jobs)."""
    import psycopg

    with psycopg.connect(database_url) as conn:
        return conn.execute(
            "SELECT count(*) FROM probe_jobs a JOIN probe_jobs b ON a.src = b.src AND a.dest = b.dest AND a.id < b.id "
            "WHERE a.started_at IS NOT NULL AND b.started_at IS NOT NULL "
            "AND a.started_at < coalesce(b.finished_at, 1e12) AND b.started_at < coalesce(a.finished_at, 1e12)"
        ).fetchone()[0]


def _cpu_s(pids: list[int]) -> float:
    total = 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks
        except (OSError, IndexError, ValueError):
            pass
    return total


def _postgres_pids() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "postgres":
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--links", type=int, default=1000)
    parser.add_argument("--sites", type=int, default=5)
    parser.add_argument("--agents-per-site", type=int, default=2)
    parser.add_argument("--ttl", type=float, default=60.0, help="TAME_TTL_S of the service (default 60)")
    parser.add_argument("--seconds", type=float, default=180.0, help="how long the agents run (default 180)")
    parser.add_argument("--probe-s", type=float, default=0.1, help="wall seconds one fake probe plan takes")
    parser.add_argument("--max-probes", type=int, default=4)
    parser.add_argument("--max-streams", type=int, default=64)
    parser.add_argument("--probe-seconds-per-hour", type=float, default=100_000.0)
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between an agent's rounds")
    parser.add_argument("--database-url")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "sites_load.md")
    args = parser.parse_args()
    if args.links % args.sites:
        parser.error("--links must be a multiple of --sites")

    budgets = {f"site-{k}": (args.max_probes, args.max_streams) for k in range(args.sites)}
    with ExitStack() as stack, tempfile.TemporaryDirectory() as folder:
        database_url = args.database_url
        if database_url is None:
            sys.path.insert(0, str(ROOT))
            from tests.conftest import throwaway_cluster

            database_url = stack.enter_context(throwaway_cluster())
        from benchmarks.load_advice import free_port, http

        port = free_port()
        env = {**os.environ, "TAME_DATABASE_URL": database_url, "TAME_SITE": "central", "TAME_TTL_S": str(args.ttl),
               "TAME_ALLOWED_DESTINATIONS": "10.0.0.0/8", "TAME_PROBE_LEVELS": "1,10", "TAME_MODEL": "lu",
               "TAME_PROBE_DURATION_S": "1", "TAME_PROBE_MAX_DURATION_S": "1", "TAME_MAX_QUEUED_PROBES": "100000",
               "TAME_MAX_QUEUED_PROBES_PER_CLIENT": "100000", "TAME_PRUNE_INTERVAL_S": "0"}
        env.pop("TAME_TOKEN", None)
        server = subprocess.Popen([sys.executable, "-m", "advisor", "serve", "--no-worker", "--port", str(port)],
                                  env=env, stdout=subprocess.DEVNULL, stderr=open(f"{folder}/serve.err", "wb"))
        stack.callback(lambda: (server.terminate(), server.wait(30)))
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if http("GET", f"{url}/healthz")[0] == 200:
                    break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(Path(f"{folder}/serve.err").read_text())
            time.sleep(0.2)

        per_site = args.links // args.sites
        agents = []
        for k in range(args.sites):
            dests = Path(folder) / f"site-{k}.txt"
            dests.write_text("\n".join(f"10.{k}.{i // 250}.{i % 250 + 1}:5201" for i in range(per_site)))
            for a in range(args.agents_per_site):
                out = Path(folder) / f"agent-{k}-{a}.json"
                agents.append((out, subprocess.Popen(
                    [sys.executable, "-m", "benchmarks.sites_load", "--agent", f"site-{k}", url, str(dests),
                     str(args.seconds), str(args.probe_s), str(args.max_probes), str(args.max_streams),
                     str(args.probe_seconds_per_hour), str(args.interval), str(out)],
                    env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(f"{out}.err", "wb"))))
        samples: list[dict] = []
        stop = threading.Event()
        monitor = threading.Thread(target=_monitor, args=(database_url, args.ttl, list(budgets), stop, samples), daemon=True)
        pg = _postgres_pids()
        cpu_before, started = _cpu_s(pg), time.monotonic()
        monitor.start()
        for out, proc in agents:
            proc.wait(args.seconds + 600)
        elapsed = time.monotonic() - started
        cpu = _cpu_s(pg) - cpu_before
        stop.set()
        monitor.join(10)
        overlaps = _overlaps(database_url)
        claims, pushed = [], 0
        for out, proc in agents:
            if proc.returncode != 0 or not out.exists():
                raise SystemExit(f"agent {out.name} failed: {Path(f'{out}.err').read_text()[-2000:]}")
            record = json.loads(out.read_text())
            claims += record["claims_s"]
            pushed += record["pushed"]

    warm = [s for s in samples if s["links"] == args.links and s["never"] == 0]
    warm = samples[samples.index(warm[0]):] if warm else []
    first_all = warm[0]["t"] - samples[0]["t"] if warm else None
    fresh_share = (sum(s["fresh"] / s["links"] for s in warm) / len(warm)) if warm else 0.0
    min_fresh = min((s["fresh"] for s in warm), default=0)
    peak = {site: (max((s["use"].get(site, (0, 0))[0] for s in samples), default=0),
                   max((s["use"].get(site, (0, 0))[1] for s in samples), default=0),
                   max((s["seconds"].get(site, 0) for s in samples), default=0)) for site in budgets}
    xacts = (samples[-1]["xacts"] - samples[0]["xacts"]) / (samples[-1]["t"] - samples[0]["t"]) if len(samples) > 1 else 0
    claims.sort()
    p = lambda q: claims[min(len(claims) - 1, int(q * len(claims)))] * 1000 if claims else float("nan")
    over = [site for site, (probes, streams, seconds) in peak.items()
            if probes > args.max_probes or streams > args.max_streams or seconds > args.probe_seconds_per_hour]
    lines = [
        "# Sites and claims under load (PostgreSQL)", "",
        f"Command: `python -m benchmarks.sites_load --links {args.links} --sites {args.sites} --agents-per-site "
        f"{args.agents_per_site} --ttl {args.ttl:g} --seconds {args.seconds:g} --probe-s {args.probe_s:g} "
        f"--max-probes {args.max_probes}`", "",
        f"{args.links} links, {args.sites} sites x {args.agents_per_site} agents = {len(agents)} agent processes, "
        f"TTL {args.ttl:g} s, fake probes of {args.probe_s:g} s, {elapsed:.0f} s wall clock on {os.cpu_count()} cores.", "",
        "| measure | value |", "|---|---|",
        f"| probes run (runs pushed) | {pushed} |",
        f"| claims (round trips, with and without a job) | {len(claims)} ({len(claims) / elapsed:.1f}/s) |",
        f"| claim round trip p50 / p99 | {p(0.5):.1f} / {p(0.99):.1f} ms |",
        f"| every link first fresh after | {first_all:.1f} s |" if first_all is not None else "| every link first fresh | never |",
        f"| links fresh (within the TTL) after that: mean share / fewest at once | {fresh_share:.3f} / {min_fresh} of {args.links} |",
        f"| probes of one link overlapping in time | {overlaps} |",
        f"| sites past their budget (probes {args.max_probes}, streams {args.max_streams}, "
        f"{args.probe_seconds_per_hour:g} probe-s/h) | {len(over)} |",
        f"| peak use per site (probes, streams, probe-s in the hour) | "
        + "; ".join(f"{s} {v[0]}, {v[1]}, {v[2]:.0f}" for s, v in peak.items()) + " |",
        f"| database transactions/s | {xacts:.0f} |",
        f"| database CPU (all postgres processes) | {cpu:.1f} s of {elapsed:.0f} s ({100 * cpu / elapsed:.0f} % of one core) |",
        "", "A link that is not fresh is served with `stale: true` and its re-probe is queued at the next "
        "registration of its site (every agent round).", "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 1 if overlaps or over else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--agent":
        site, server, dests, seconds, probe_s, max_probes, max_streams, per_hour, interval, out = sys.argv[2:12]
        agent_main(site, server, dests, float(seconds), float(probe_s), int(max_probes), int(max_streams),
                   float(per_hour), float(interval), out)
    else:
        sys.exit(main())
