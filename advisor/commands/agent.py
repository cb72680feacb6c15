"""`tame agent`: keep the destinations listed in a file fresh, locally or pushing to a remote `tame serve`."""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from pathlib import Path

from advisor.cli import UsageError
from advisor.commands.runtime import default_driver, load_settings, open_store, setup_logging
from advisor.destinations import parse_destination
from advisor.errors import AdvisorError
from advisor.plan_runner import level_chooser, plan_for
from probes.plan import run_plan
from advisor.service import AdviceService
from advisor.worker import ProbeWorker
from probes.errors import ProbeError


def register(subparsers) -> None:
    parser = subparsers.add_parser("agent", help="keep the destinations in a file fresh (re-probe past the TTL)")
    parser.add_argument("--dest-file", required=True, type=Path, help="one HOST[:PORT] per line; '#' starts a comment")
    parser.add_argument("--push", metavar="URL", help="probe here and send the results to this `tame serve` "
                                                      "(uses TAME_TOKEN); default: the local store")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between freshness checks (default 60)")
    parser.add_argument("--once", action="store_true", help="one round: probe what is missing or stale, then exit")
    parser.set_defaults(handler=run)


def read_destinations(path: Path) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UsageError(f"cannot read --dest-file {path}: {exc.strerror}") from exc
    dests = []
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            dests.append(parse_destination(text).key)
        except AdvisorError as exc:
            raise UsageError(f"{path}:{number}: {exc}") from exc
    return dests


def run(args) -> int:
    setup_logging()
    settings = load_settings()
    driver = default_driver()
    if driver is None:
        raise UsageError("no probe driver is available on this machine, so the agent cannot probe")
    if args.push:
        return _run_push(args, settings, driver)
    store = open_store(settings)
    service = AdviceService(store, settings)
    worker = ProbeWorker(service, driver)
    try:
        if args.once:
            _enqueue_due(service, read_destinations(args.dest_file))
            store.recover_jobs(settings.max_probe_attempts)
            while worker.run_once():
                pass
            return 0
        worker.start()
        while True:
            _enqueue_due(service, read_destinations(args.dest_file))
            time.sleep(args.interval)
    finally:
        worker.stop()
        store.close()


def _enqueue_due(service: AdviceService, dests: list[str]) -> None:
    fresh = {p["dest"] for p in service.paths() if not p["stale"]}
    for dest in dests:
        if dest in fresh:
            continue
        try:
            job, created = service.request_probe(dest)
            print(f"tame agent: {dest}: probe {job.id} {'queued' if created else job.status}", flush=True)
        except AdvisorError as exc:
            print(f"tame agent: {dest}: {exc}", file=sys.stderr, flush=True)


def _run_push(args, settings, driver) -> int:
    from api.client import TameClient, TameError

    stop = threading.Event()
    with TameClient(args.push, token=settings.token, timeout_s=30) as client:
        while not stop.is_set():
            try:
                fresh = {p["dest"] for p in client.paths() if not p["stale"]}
            except TameError as exc:
                print(f"tame agent: {exc}", file=sys.stderr, flush=True)
                fresh = set()
            for dest in read_destinations(args.dest_file):
                if dest in fresh:
                    continue
                try:
                    settings.allowed.check(parse_destination(dest))
                    started = time.time()
                    plan = run_plan(driver, dest, plan_for(settings, settings.default_levels, settings.default_duration_s),
                                    next_level=level_chooser(settings.model, settings.n_max))
                    answer = client.push_probe_run({
                        "dest": dest, "idle_rtt_s": plan.idle_rtt_s, "started_at": started,
                        "probes": [{k: v for k, v in dataclasses.asdict(p).items()
                                    if k not in ("dest", "stream_rtts", "interval_bps", "interval_side", "settled",
                                                 "window_throughput_bps", "congestion_control", "rtt_min_s", "rtt_max_s")}
                                   for p in plan.probes],
                    })
                    print(f"tame agent: {dest}: pushed run {answer['probe_run_id']} (fitted: {answer['fitted']})",
                          flush=True)
                except (AdvisorError, ProbeError, TameError) as exc:
                    print(f"tame agent: {dest}: {exc}", file=sys.stderr, flush=True)
            if args.once:
                break
            stop.wait(args.interval)
    return 0
