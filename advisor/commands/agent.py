"""`tame agent`: keep the destinations listed in a file fresh, locally or pushing to a remote `tame serve`."""

from __future__ import annotations

import argparse

import dataclasses
import json
import math
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from advisor.cli import UsageError
from advisor.commands.probe import add_control_option, control_from_args
from advisor.commands.runtime import default_driver, load_settings, open_store, setup_logging
from advisor.destinations import parse_destination
from advisor.errors import AdvisorError
from advisor.limits import MAX_MEASURED_AGO_S
from advisor.plan_runner import level_chooser, plan_for
from advisor.tame import plan_control
from probes.plan import run_plan
from advisor.service import AdviceService, fresh_destinations
from advisor.site_agent import SiteAgent, run_payload
from advisor.sites import SiteBudget
from advisor.store import process_owner
from advisor.commands.common import service_url, site_name, whole_number
from advisor.limits import MAX_SITE_PROBE_SECONDS_PER_HOUR, MAX_SITE_PROBES, MAX_SITE_STREAMS
from advisor.worker import ProbeWorker, probe_target
from probes.errors import ProbeError


class _ServiceURL(argparse.Action):
    """--push / --server URL, remembering which of the two was typed (push_flag) so an error names it."""

    def __call__(self, parser, namespace, values, option_string=None):
        namespace.push, namespace.push_flag = values, option_string


def register(subparsers) -> None:
    parser = subparsers.add_parser("agent", help="keep the destinations in a file fresh (re-probe past the TTL)")
    parser.add_argument("--dest-file", required=True, type=Path, help="one HOST[:PORT] per line; '#' starts a comment")
    parser.add_argument("--push", "--server", dest="push", metavar="URL", action=_ServiceURL,
                        help="probe here and send the results to this `tame serve` (uses TAME_TOKEN); default: the "
                             "local store")
    parser.add_argument("--site", type=site_name, metavar="NAME",
                        help="with --server: the site this agent probes from; it registers the site's links (the "
                             "--dest-file) and budget with the server and claims the site's due probes, with the "
                             "site's other agents, all with the same budget (the server refuses another while they "
                             "are alive, and the agent stops with exit status 2); its TAME_TOKEN is the site's token "
                             "(the server's TAME_SITE_TOKENS)")
    parser.add_argument("--max-probes", type=whole_number(1, MAX_SITE_PROBES), default=SiteBudget.max_probes,
                        metavar="N", help=f"with --site: the site's probes at once (default {SiteBudget.max_probes})")
    parser.add_argument("--max-streams", type=whole_number(1, MAX_SITE_STREAMS), default=SiteBudget.max_streams,
                        metavar="N", help=f"with --site: the site's probe streams at once (default "
                                          f"{SiteBudget.max_streams}; an adaptive probe is capped to fit)")
    parser.add_argument("--probe-seconds-per-hour", type=whole_number(1, int(MAX_SITE_PROBE_SECONDS_PER_HOUR)),
                        default=int(SiteBudget.probe_seconds_per_hour), metavar="S",
                        help=f"with --site: the site's probe-seconds in any hour (default "
                             f"{SiteBudget.probe_seconds_per_hour:g})")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between freshness checks (default 60)")
    parser.add_argument("--once", action="store_true", help="one round: probe what is missing or stale, then exit")
    parser.add_argument("--spool", type=Path, default=None, metavar="DIR",
                        help="with --push: where runs the service did not take (unreachable, 5xx, 408, 429) wait to "
                             "be sent again, first thing each round; runs it refused (other 4xx) are set aside in "
                             "DIR/rejected (default: $XDG_STATE_HOME/tame/spool, else ~/.local/state/tame/spool)")
    add_control_option(parser, "the probes run under, and the advice is kept for; one this kernel offers")
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
    args.push = service_url(args.push, getattr(args, "push_flag", "--server"))
    setup_logging()
    settings = load_settings()
    settings = dataclasses.replace(settings, congestion_control=control_from_args(args, local=True,
                                                                                   default=settings.congestion_control))
    driver = default_driver()
    if driver is None:
        raise UsageError("no probe driver is available on this machine, so the agent cannot probe")
    budget_given = (args.max_probes, args.max_streams, args.probe_seconds_per_hour) != (
        SiteBudget.max_probes, SiteBudget.max_streams, int(SiteBudget.probe_seconds_per_hour))
    if args.site is not None and not args.push:
        raise UsageError("--site needs --server URL: the central service the site's agents claim probes from")
    if args.site is None and budget_given:
        raise UsageError("--max-probes, --max-streams and --probe-seconds-per-hour are a site's budget: give --site "
                         "and --server too")
    if args.site is not None:
        return _run_site(args, settings, driver)
    if args.push:
        return _run_push(args, settings, driver)
    store = open_store(settings)
    service = AdviceService(store, settings)
    worker = ProbeWorker(service, driver)
    try:
        if args.once:
            _enqueue_due(service, read_destinations(args.dest_file))
            store.recover_jobs(settings.max_probe_attempts, local_src=settings.site)
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
    control = service.settings.congestion_control
    fresh = fresh_destinations(service.paths(service.settings.site), control, control)
    for dest in dests:
        if dest in fresh:
            continue
        try:
            job, created = service.request_probe(dest)
            print(f"tame agent: {dest}: probe {job.id} {'queued' if created else job.status}", flush=True)
        except AdvisorError as exc:
            print(f"tame agent: {dest}: {exc}", file=sys.stderr, flush=True)


SPOOL_FORM = "tame-agent-spool/1"


def default_spool_dir(env=os.environ) -> Path:
    """$XDG_STATE_HOME/tame/spool, else ~/.local/state/tame/spool (the XDG default for state)."""
    base = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "tame" / "spool"


def _spool(spool: Path, payload: dict[str, Any], key: str) -> Path:
    """Write a run that was not delivered to ``spool`` (atomically: a reader never sees half a file), with the
    Idempotency-Key it was sent under: a run the service stored without its answer arriving is not stored twice."""
    spool.mkdir(parents=True, exist_ok=True)
    name = f"{time.time_ns()}-{uuid.uuid4().hex[:8]}.json"
    tmp = spool / f".{name}.tmp"
    # spooled_at: when the run was first sent, just after its probes ended (by this host's clock); delivered later,
    # the run says how long ago that was (measured_ago_s), so its advice is as old as its probes.
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(json.dumps({"form": SPOOL_FORM, "payload": payload, "spooled_at": time.time(),
                             "idempotency_key": key}))
        fh.flush()
        os.fsync(fh.fileno())  # on disk before its name is: a host that loses power keeps the run, or no file
    os.replace(tmp, spool / name)
    folder = os.open(spool, os.O_RDONLY)
    try:
        os.fsync(folder)  # and the new name with it
    finally:
        os.close(folder)
    return spool / name


def _set_aside(path: Path) -> Path:
    rejected = path.parent / "rejected"
    rejected.mkdir(exist_ok=True)
    os.replace(path, rejected / path.name)
    return rejected / path.name


def _push(client, payload: dict[str, Any], spool: Path, path: Path | None = None, key: str | None = None) -> bool:
    """POST one run under Idempotency-Key ``key`` (None: a new run, a new key); a run not taken goes to (or stays
    in) ``spool``. False when the service could not take it now."""
    from api.client import TameError

    dest = payload.get("dest")
    key = key or uuid.uuid4().hex
    try:
        answer = client.push_probe_run(payload, idempotency_key=key)
    except TameError as exc:
        if exc.retryable:
            where = path or _spool(spool, payload, key)
            print(f"tame agent: {dest}: not delivered ({exc}); kept in {where}, sent again next round",
                  file=sys.stderr, flush=True)
            return False
        if path is None:
            path = _spool(spool, payload, key)
        print(f"tame agent: {dest}: the service refused the run ({exc}); set aside in {_set_aside(path)}, "
              f"not sent again", file=sys.stderr, flush=True)
        return True
    if path is not None:
        path.unlink()
    print(f"tame agent: {dest}: pushed run {answer['probe_run_id']} (fitted: {answer['fitted']})"
          f"{' from the spool' if path is not None else ''}", flush=True)
    return True


def _deliver_spooled(client, spool: Path) -> None:
    """Send the spooled runs, oldest first, until the service cannot take one."""
    if not spool.is_dir():
        return
    for path in sorted(spool.glob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            if record.get("form") != SPOOL_FORM:
                raise ValueError(f"form {record.get('form')!r} is not {SPOOL_FORM!r}")
            payload = record["payload"]
            # A record spooled before keys were kept has none: its file's name, which stays as long as it does.
            key = record.get("idempotency_key", f"spool-{path.stem}")
            if not isinstance(key, str):
                raise ValueError(f"idempotency_key {key!r} is not a string")
            spooled_at = record.get("spooled_at")  # a record spooled before it was kept has none
            if isinstance(spooled_at, (int, float)) and not isinstance(spooled_at, bool) and math.isfinite(spooled_at):
                payload = {**payload, "measured_ago_s": min(max(0.0, time.time() - spooled_at), MAX_MEASURED_AGO_S)}
        except (OSError, ValueError, KeyError, AttributeError, TypeError) as exc:
            print(f"tame agent: spooled run {path} is unreadable ({exc}); set aside in {_set_aside(path)}",
                  file=sys.stderr, flush=True)
            continue
        if not _push(client, payload, spool, path, key):
            return


def _run_site(args, settings, driver) -> int:
    from api.client import TameClient, TameError

    spool = args.spool or default_spool_dir()
    budget = SiteBudget(args.max_probes, args.max_streams, float(args.probe_seconds_per_hour))
    with TameClient(args.push, token=settings.token, timeout_s=30) as client:
        owner = process_owner()

        def report_failure(job_id: str, error: str) -> None:
            try:
                client.fail_claim(args.site, job_id, owner, error)
            except TameError as exc:
                print(f"tame agent: site {args.site}: could not report the failed probe {job_id} ({exc}); its lease "
                      "will return it to the queue", file=sys.stderr, flush=True)

        agent = SiteAgent(client, args.site, owner, budget, settings, driver,
                          push=lambda payload: _push(client, payload, spool), clock=time.time,
                          report_failure=report_failure)
        while not agent.stop.is_set():
            _deliver_spooled(client, spool)
            try:
                agent.round(read_destinations(args.dest_file))
            except TameError as exc:
                # Refused (a bad token, another budget the site's agents run with: 409): asking again cannot help.
                refused = not exc.retryable
                print(f"tame agent: site {args.site}: {exc}" + ("; stopping" if refused else ""), file=sys.stderr,
                      flush=True)
                if refused:
                    return 2
            if args.once:
                break
            agent.stop.wait(args.interval)
    return 0


def _run_push(args, settings, driver) -> int:
    from api.client import TameClient, TameError

    spool = args.spool or default_spool_dir()
    stop = threading.Event()
    server_site = None  # the site the runs are pushed as (they name none): the server's own, learnt from it
    with TameClient(args.push, token=settings.token, timeout_s=30) as client:
        while not stop.is_set():
            # What could not be delivered before goes first: it is older, and it may make a probe unnecessary.
            _deliver_spooled(client, spool)
            try:
                server_site = server_site or client.links()["site"]
                # The server's default control is not known here: fits that recorded none do not count as fresh.
                fresh = fresh_destinations(client.paths(server_site), settings.congestion_control, None)
            except TameError as exc:
                print(f"tame agent: {exc}", file=sys.stderr, flush=True)
                fresh = set()
            for dest in read_destinations(args.dest_file):
                if dest in fresh:
                    continue
                try:
                    # Resolved once: the probes go to the address checked, never to the name again.
                    parsed = parse_destination(dest)
                    target = probe_target(settings.allowed.checked_address(parsed), parsed.port)
                    started = time.time()
                    plan = run_plan(driver, target, plan_for(settings, settings.default_levels, settings.default_duration_s),
                                    next_level=level_chooser(settings.model, settings.n_max))
                    control = plan_control(plan.probes, settings.congestion_control)
                except (AdvisorError, ProbeError, ValueError) as exc:
                    print(f"tame agent: {dest}: {exc}", file=sys.stderr, flush=True)
                    continue
                _push(client, run_payload(dest, plan, started, control), spool)
            if args.once:
                break
            stop.wait(args.interval)
    return 0
