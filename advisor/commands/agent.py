"""`tame agent`: keep the destinations listed in a file fresh, locally or pushing to a remote `tame serve`."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import signal
import stat
import sys
import threading
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any, Callable, Iterator

from advisor.allowlist import AGENT, agent_resolver
from advisor.cli import UsageError
from advisor.commands.probe import add_control_option, control_from_args
from advisor.commands.runtime import (STOP_SIGNALS, default_driver, load_settings, on_stop_signals, open_store,
                                      setup_logging)
from advisor.destinations import parse_destination
from advisor.errors import AdvisorError, InvalidRequest
from advisor.files import FileTooLarge, NotARegularFile, read_capped
from advisor.idempotency import check_key
from advisor.limits import MAX_MEASURED_AGO_S
from advisor.plan_runner import level_chooser, plan_for
from advisor.tame import plan_control
from probes.plan import run_plan
from advisor.service import AdviceService
from advisor.site_desk import fresh_destinations
from advisor.site_agent import SiteAgent, run_payload
from advisor.sites import SiteBudget
from advisor.jobs import process_owner
from advisor.commands.common import number_between, service_url, site_name, whole_number
from advisor.limits import MAX_SITE_PROBE_SECONDS_PER_HOUR, MAX_SITE_PROBES, MAX_SITE_STREAMS
from advisor.worker import ProbeWorker, probe_target
from probes.errors import ProbeError


class _ServiceURL(argparse.Action):
    """--push / --server URL, remembering which of the two was typed (push_flag) so an error names it."""

    def __call__(self, parser, namespace, values, option_string=None):
        typed = getattr(namespace, "push_flag", None)
        if typed is not None and typed != option_string:
            # Two names for one setting: which of two URLs was meant cannot be told.
            raise argparse.ArgumentError(self, f"{typed} and {option_string} are the same option: give one URL")
        namespace.push, namespace.push_flag = values, option_string


# Between rounds, seconds: under a second, a round that finds nothing to do (or a service that refuses at once) turns
# into a busy loop of requests; a day apart, advice whose TTL is shorter goes stale between rounds.
MIN_INTERVAL_S = 1.0
MAX_INTERVAL_S = 86400.0


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
    parser.add_argument("--interval", type=number_between(MIN_INTERVAL_S, MAX_INTERVAL_S, "a number of seconds"),
                        default=60.0, metavar="SECONDS",
                        help=f"seconds between freshness checks, {MIN_INTERVAL_S:g} to {MAX_INTERVAL_S:g} (default 60)")
    parser.add_argument("--once", action="store_true", help="one round: probe what is missing or stale, then exit")
    parser.add_argument("--spool", type=Path, default=None, metavar="DIR",
                        help="with --push: where runs the service did not take (unreachable, 5xx, 408, 429) wait to "
                             "be sent again, first thing each round; runs it refused (other 4xx) are set aside in "
                             "DIR/rejected (default: $XDG_STATE_HOME/tame/spool, else ~/.local/state/tame/spool)")
    add_control_option(parser, "the probes run under, and the advice is kept for; one this kernel offers")
    parser.set_defaults(handler=run)


# A --dest-file is read whole each round: MAX_SITE_LINKS lines of a destination and a comment fit well inside this.
MAX_DEST_FILE_BYTES = 1 << 20


def read_destinations(path: Path) -> list[str]:
    what = f"--dest-file {path}"
    try:
        lines = read_capped(path, MAX_DEST_FILE_BYTES).decode("utf-8").splitlines()
    except NotARegularFile:
        raise UsageError(f"{what} is not a regular file: give a file of HOST[:PORT] lines") from None
    except FileTooLarge:
        raise UsageError(f"{what} is larger than {MAX_DEST_FILE_BYTES} bytes: give a file of HOST[:PORT] lines, "
                         "one destination a line") from None
    except UnicodeDecodeError:
        # Not the decoder's message: it quotes a byte of the file.
        raise UsageError(f"{what} is not UTF-8 text: give a file of HOST[:PORT] lines") from None
    except OSError as exc:
        raise UsageError(f"cannot read {what}: {exc.strerror or exc}") from exc
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
    if args.spool is not None and not args.push:
        raise UsageError("--spool is where a pushing agent keeps the runs its service did not take: give --push or "
                         "--server too (without them the runs are stored here, with nothing to spool)")
    read_destinations(args.dest_file)  # a file that cannot be read stops the agent before anything is done
    if args.site is not None:
        return _run_site(args, settings, driver)
    if args.push:
        return _run_push(args, settings, driver)
    store = open_store(settings)
    service = AdviceService(store, settings, resolver=agent_resolver, who=AGENT)
    stop = threading.Event()

    def said(dest: str, seconds: float, error: str | None) -> None:
        # The job's error is stored with it; say it here too, as a pushing agent does (a probe its stop killed is
        # re-queued, not failed: the stop is said after).
        if error is not None and not stop.is_set():
            print(f"tame agent: {dest}: probe failed: {error}", file=sys.stderr, flush=True)

    worker = ProbeWorker(service, driver, on_probe=said)
    try:
        # Stopped, the worker kills its probes and puts their jobs back in the queue, the attempts not counted.
        with _stopped_by_signals(stop, worker.stop):
            if args.once:
                _enqueue_due(service, read_destinations(args.dest_file))
                store.recover_jobs(settings.max_probe_attempts, local_src=settings.site)
                while not stop.is_set() and worker.run_once():
                    pass
                return 0
            worker.start()
            while not stop.is_set():
                _enqueue_due(service, read_destinations(args.dest_file))
                stop.wait(args.interval)
            return 0
    finally:
        worker.stop()
        store.close()


@contextlib.contextmanager
def _stopped_by_signals(stop: threading.Event, cancel: Callable[[], None]) -> Iterator[None]:
    """On SIGTERM, SIGHUP (:data:`advisor.commands.runtime.STOP_SIGNALS`) or a first SIGINT (Ctrl-C) inside: set
    ``stop`` and run ``cancel`` (kill the probes), off the main thread, which may hold a lock ``cancel`` takes; says
    so after. A second SIGINT interrupts at once (KeyboardInterrupt), as Ctrl-C pressed again is meant to."""
    caught: list[int] = []

    def handler(signum, frame) -> None:
        if signum == signal.SIGINT and signal.SIGINT in caught:
            raise KeyboardInterrupt
        caught.append(signum)
        stop.set()
        threading.Thread(target=cancel, name="tame-agent-stop", daemon=True).start()

    with on_stop_signals(handler, (*STOP_SIGNALS, signal.SIGINT)):
        yield
    if caught:
        print(f"tame agent: stopped by {signal.Signals(caught[0]).name}", file=sys.stderr, flush=True)


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
# A spool record's own fields around the run it keeps (_spool_record).
SPOOL_FIELDS_BYTES = 4 * 1024
# The most runs an agent holds in memory when its spool cannot be written (each a few kB): past it, the oldest goes.
MAX_HELD_RUNS = 1000
_SPOOL_FIX = "free space there, make it writable by this user, or give --spool another directory"
_NOT_A_FOLDER = ("{rejected}, where runs that are refused or unreadable are set aside, is not a directory: move it "
                 "away, or give --spool another directory")


def default_spool_dir(env=os.environ) -> Path:
    """$XDG_STATE_HOME/tame/spool, else ~/.local/state/tame/spool (the XDG default for state)."""
    base = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "tame" / "spool"


def check_spool(spool: Path) -> None:
    """UsageError unless this process can create and remove files in ``spool`` (made if missing): an agent whose
    spool cannot be written would lose every run the service cannot take, and one that cannot remove a delivered
    run would send it again at every start."""
    check = spool / f".write-check-{os.getpid()}"
    if os.path.lexists(spool) and not spool.is_dir():
        raise UsageError(f"--spool {spool} is not a directory: give --spool a directory (made if missing)")
    try:
        spool.mkdir(parents=True, exist_ok=True)
        os.close(os.open(check, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
        check.unlink()
    except OSError as exc:
        raise UsageError(f"the spool directory {spool} cannot be written ({exc.strerror or exc}): {_SPOOL_FIX}") \
            from exc
    rejected = spool / "rejected"
    if os.path.lexists(rejected) and not rejected.is_dir():
        raise UsageError(_NOT_A_FOLDER.format(rejected=rejected))


def _spool_record(payload: dict[str, Any], key: str) -> dict[str, Any]:
    # spooled_at: when the run was first sent, just after its probes ended (by this host's clock); delivered later,
    # the run says how long ago that was (measured_ago_s), so its advice is as old as its probes.
    return {"form": SPOOL_FORM, "payload": payload, "spooled_at": time.time(), "idempotency_key": key}


# How long tame agent waits for the service's answer to a request, seconds (a registration's is the longest:
# advisor.site_desk.REGISTRATION_LOOKUPS_S).
SERVICE_TIMEOUT_S = 30.0


# A spooled run's temporary file (_spool) this much older than now was left by a writer stopped before it renamed
# it (SIGKILL, power loss); a younger one may be another agent's, sharing the spool, being written now. Seconds.
LEFTOVER_AGE_S = 600.0


def _adopt_leftovers(spool: Path) -> None:
    """Give each temporary file a stopped writer left in ``spool`` (:data:`LEFTOVER_AGE_S`) its record's name, so
    the run in it is delivered as a spooled one is, or, written only in part, set aside as unreadable."""
    for tmp in sorted(spool.glob(".*.json.tmp")):
        record = tmp.with_name(tmp.name[1:-len(".tmp")])
        try:
            info = tmp.lstat()
            if 0 <= time.time() - info.st_mtime < LEFTOVER_AGE_S:  # one dated ahead: the clock went back since
                continue
            # _spool writes only regular files, under names no other record has: anything else is no run of an
            # agent's, and renamed it would replace the run (or raise out of the agent's loop at every start).
            if not stat.S_ISREG(info.st_mode) or os.path.lexists(record):
                why = "not a regular file" if not stat.S_ISREG(info.st_mode) else f"{record.name} is there already"
                print(f"tame agent: {tmp} is no run an agent left ({why}); {_set_aside(tmp)}", file=sys.stderr,
                      flush=True)
                continue
            os.replace(tmp, record)
        except FileNotFoundError:  # its writer, or another agent sharing the spool, got to it first
            continue
        except OSError as exc:  # another user's, in a shared spool
            print(f"tame agent: {tmp} cannot be taken up ({exc.strerror or exc}) and stays; {_SPOOL_FIX}",
                  file=sys.stderr, flush=True)
            continue
        print(f"tame agent: {tmp} was left by an agent stopped while spooling a run; it goes with the spooled runs",
              file=sys.stderr, flush=True)


def _spool(spool: Path, record: dict[str, Any]) -> Path:
    """Write a run that was not delivered to ``spool`` (atomically: a reader never sees half a file), with the
    Idempotency-Key it was sent under: a run the service stored without its answer arriving is not stored twice.
    OSError when it cannot (a full or read-only disk): nothing of it is left in ``spool`` then."""
    spool.mkdir(parents=True, exist_ok=True)
    name = f"{time.time_ns()}-{uuid.uuid4().hex[:8]}.json"
    tmp = spool / f".{name}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(record))
            fh.flush()
            os.fsync(fh.fileno())  # on disk before its name is: a host that loses power keeps the run, or no file
        os.replace(tmp, spool / name)
    finally:
        tmp.unlink(missing_ok=True)  # gone when replaced; a half-written one would stay for ever
    folder = os.open(spool, os.O_RDONLY)
    try:
        os.fsync(folder)  # and the new name with it
    finally:
        os.close(folder)
    return spool / name


def _set_aside(path: Path) -> str:
    """Move a spooled run the service refused (or that cannot be read) to DIR/rejected; what became of it."""
    rejected = path.parent / "rejected"
    try:
        rejected.mkdir(exist_ok=True)
        os.replace(path, rejected / path.name)
    except (FileExistsError, NotADirectoryError):
        return f"it cannot be set aside and stays in {path}: {_NOT_A_FOLDER.format(rejected=rejected)}"
    except OSError as exc:
        return f"it cannot be set aside ({exc.strerror or exc}) and stays in {path}: {_SPOOL_FIX}"
    return f"set aside in {rejected / path.name}"


class HeldRuns:
    """Runs kept in this process's memory because the spool could not be written, oldest first, as the spool keeps
    them (:func:`_spool_record`). A site agent's probe threads add to it while its main loop sends them."""

    def __init__(self, limit: int = MAX_HELD_RUNS):
        self._runs: deque[dict[str, Any]] = deque()
        self._limit = limit
        self._lock = threading.Lock()

    def add(self, record: dict[str, Any]) -> None:
        with self._lock:
            self._runs.append(record)
            lost = self._runs.popleft() if len(self._runs) > self._limit else None
        if lost is not None:
            print(f"tame agent: {lost['payload'].get('dest')}: {self._limit} runs are held in memory already; the "
                  "oldest is dropped", file=sys.stderr, flush=True)

    def oldest(self) -> dict[str, Any] | None:
        with self._lock:
            return self._runs[0] if self._runs else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._runs)

    def discard(self, record: dict[str, Any]) -> None:
        with self._lock:
            if self._runs and self._runs[0] is record:
                self._runs.popleft()


def _keep(spool: Path, record: dict[str, Any], held: HeldRuns | None) -> str:
    """Keep a run the service could not take now: in ``spool``, else (it cannot be written) in ``held``, this
    process's memory, sent again from there until the process ends; where it is kept."""
    try:
        return str(_spool(spool, record))
    except OSError as exc:
        problem = f"the spool directory {spool} cannot be written ({exc.strerror or exc}): {_SPOOL_FIX}"
    if held is None:
        return f"nowhere: {problem}; the run is lost"
    held.add(record)
    return f"memory until this agent stops ({problem})"


def _push(client, payload: dict[str, Any], spool: Path, path: Path | None = None, key: str | None = None,
          held: HeldRuns | None = None, from_memory: bool = False) -> bool:
    """POST one run under Idempotency-Key ``key`` (None: a new run, a new key). A new run is written to ``spool``
    before it is sent, and stays there until the service takes it (or, when the spool cannot be written, is held
    in ``held`` if not taken); one from the spool (``path``) or from memory (``from_memory``) stays there. False
    when the service could not take it now."""
    from api.client import TameError

    dest = payload.get("dest")
    key = key or uuid.uuid4().hex
    new = path is None and not from_memory
    if new:
        # Kept before it is sent: an agent killed while the service has not answered (a slow one holds a request
        # for the client's 30 s) finds the run in its spool at its next start and sends it again under its key.
        try:
            path = _spool(spool, _spool_record(payload, key))
        except OSError:
            pass  # said below if the service does not take it either
    try:
        answer = client.push_probe_run(payload, idempotency_key=key)
    except TameError as exc:
        # 401: this agent's token, not the run, was refused; the run waits for the token to be put right.
        if exc.retryable or exc.status == 401:
            where = path or ("memory" if from_memory else _keep(spool, _spool_record(payload, key), held))
            print(f"tame agent: {dest}: not delivered ({exc}); kept in {where}, sent again "
                  + ("once the agent's token (TAME_TOKEN) is one the service takes" if exc.status == 401
                     else "next round"), file=sys.stderr, flush=True)
            return False
        if path is None:  # kept aside as spooled runs the service refused are, for whoever looks into why
            try:
                path = _spool(spool, _spool_record(payload, key))
            except OSError as error:
                fate = f"not kept (the spool directory {spool} cannot be written: {error.strerror or error})"
        if path is not None:
            fate = _set_aside(path)
        print(f"tame agent: {dest}: the service refused the run ({exc}); {fate}, not sent again", file=sys.stderr,
              flush=True)
        return True
    if path is not None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass  # delivered by another agent sharing the spool too: stored once, by its key
        except OSError as exc:
            # Sent again next round, which stores nothing new: the run carries its Idempotency-Key.
            print(f"tame agent: {dest}: delivered {path} but cannot remove it ({exc.strerror or exc}): it will be sent "
                  f"again (stored once); {_SPOOL_FIX}", file=sys.stderr, flush=True)
    print(f"tame agent: {dest}: pushed run {answer['probe_run_id']} (fitted: {answer['fitted']})"
          f"{' from the spool' if path is not None and not new else ' from memory' if from_memory else ''}",
          flush=True)
    return True


def _unspooled(record: Any) -> tuple[dict[str, Any], str | None]:
    """The payload to send for a kept run and its Idempotency-Key (None: a record spooled before keys were kept);
    ValueError (or KeyError, TypeError, AttributeError) for a record that is not one, or that could not be sent: a
    payload that is not an object, a key that cannot go in a header (advisor.idempotency.check_key)."""
    if record.get("form") != SPOOL_FORM:
        raise ValueError(f"form {record.get('form')!r} is not {SPOOL_FORM!r}")
    payload = record["payload"]
    if not isinstance(payload, dict):
        raise ValueError(f"its payload {json.dumps(payload)[:40]} is not a JSON object")
    key = record.get("idempotency_key")
    if key is not None:
        _sendable_key(key)
    spooled_at = record.get("spooled_at")  # a record spooled before it was kept has none
    if isinstance(spooled_at, (int, float)) and not isinstance(spooled_at, bool) and math.isfinite(spooled_at):
        payload = {**payload, "measured_ago_s": min(max(0.0, time.time() - spooled_at), MAX_MEASURED_AGO_S)}
    return payload, key


def _sendable_key(key: Any) -> str:
    """``key`` when it can be sent as an Idempotency-Key (advisor.idempotency.check_key); ValueError otherwise."""
    if not isinstance(key, str):
        raise ValueError(f"idempotency_key {key!r:.60} is not a string")
    try:
        check_key(key)
    except InvalidRequest as exc:
        raise ValueError(f"idempotency_key {key!r:.60}: {exc}") from None
    return key


def _no_constant(name: str) -> None:
    """json.loads' parse_constant: a spooled run holds no NaN or Infinity (JSON has none, and httpx sends none)."""
    raise ValueError(f"it holds {name}, which is no JSON number")


def _flush_held(spool: Path, held: HeldRuns) -> None:
    """Move the runs held in memory to ``spool``, oldest first, as they were kept (key, spooled_at), while it can be
    written: a run there outlives this process."""
    while (record := held.oldest()) is not None:
        try:
            _spool(spool, record)
        except OSError:
            return
        held.discard(record)


def _deliver_spooled(client, spool: Path, held: HeldRuns | None = None) -> None:
    """Send the runs held in memory (first moved to the spool when it can be written again), then the spooled runs,
    oldest first, until the service cannot take one."""
    if held is not None:
        _flush_held(spool, held)
    while held is not None and (record := held.oldest()) is not None:
        payload, key = _unspooled(record)
        if not _push(client, payload, spool, key=key, from_memory=True):
            return
        held.discard(record)
    if not spool.is_dir():
        return
    _adopt_leftovers(spool)
    from api.boundary import PROBE_RUN_BYTES  # a record larger than the service takes is no run of this agent's

    for path in sorted(spool.glob("*.json")):
        try:
            payload, key = _unspooled(json.loads(read_capped(path, PROBE_RUN_BYTES + SPOOL_FIELDS_BYTES),
                                                 parse_constant=_no_constant))
            # A record spooled before keys were kept has none: its file's name, which stays as long as it does.
            key = _sendable_key(key or f"spool-{path.stem}")
        except NotARegularFile:
            problem = "not a regular file"
        except FileTooLarge:
            problem = f"larger than {PROBE_RUN_BYTES + SPOOL_FIELDS_BYTES} bytes"
        except RecursionError:  # JSON nested deeper than the parser goes
            problem = "nested too deeply"
        except OSError as exc:
            problem = exc.strerror or str(exc)
        except (ValueError, KeyError, AttributeError, TypeError) as exc:
            problem = str(exc)
        else:
            if not _push(client, payload, spool, path, key):
                return
            continue
        print(f"tame agent: spooled run {path} is unreadable ({problem:.200}); {_set_aside(path)}", file=sys.stderr,
              flush=True)


def hand_back_claim(client, site: str, owner: str, job_id: str, lookup_error: str | None = None) -> None:
    """Hand agent ``owner``'s claimed probe ``job_id`` back to the service (TameClient.release_claim), with the error of
    its name lookup that did not finish, if that is why. A service older than lookup_error refuses the field as a key
    it does not take (TameError.refused_unknown_key): the lookup is reported as a failed claim then
    (TameClient.fail_claim), as agents of that service's version reported it, an attempt counted (three fail the job,
    saying why), and the agent says so; any other refusal (of the field's value, say) is raised as it is. Handed back
    without the field, the job would be queued again in its place, claimed again at once and its name looked up
    again and again, each time charged to the site's hour; left unreported, it would stay the agent's until its lease
    ran out, the whole lease charged, and come back as an interrupted attempt. TameError when the service takes
    neither."""
    from api.client import TameError  # the CLI is where the layers are wired together

    try:
        client.release_claim(site, job_id, owner, lookup_error)
        return
    except TameError as exc:
        if lookup_error is None or not exc.refused_unknown_key("lookup_error"):
            raise
        refused = exc.detail
    print(f"tame agent: site {site}: the service refused probe {job_id} handed back for its name lookup ({refused:.200};"
          " a service older than lookup_error): reported as a failed attempt instead", file=sys.stderr, flush=True)
    client.fail_claim(site, job_id, owner, lookup_error)


def _run_site(args, settings, driver) -> int:
    from api.client import TameClient, TameError

    spool = args.spool or default_spool_dir()
    check_spool(spool)
    held = HeldRuns()
    budget = SiteBudget(args.max_probes, args.max_streams, float(args.probe_seconds_per_hour))
    with TameClient(args.push, token=settings.token, timeout_s=SERVICE_TIMEOUT_S) as client:
        owner = process_owner()

        def tell(job_id: str, what: str, call: Callable[[], Any]) -> None:
            try:
                call()
            except TameError as exc:
                print(f"tame agent: site {args.site}: could not {what} {job_id} ({exc}); its lease will return it to "
                      "the queue", file=sys.stderr, flush=True)

        agent = SiteAgent(client, args.site, owner, budget, settings, driver,
                          push=lambda payload: _push(client, payload, spool, held=held), clock=time.time,
                          report_failure=lambda job_id, error: tell(job_id, "report the failed probe", lambda: (
                              client.fail_claim(args.site, job_id, owner, error))),
                          hand_back=lambda job_id, lookup_error=None: tell(job_id, "hand back the probe", lambda: (
                              hand_back_claim(client, args.site, owner, job_id, lookup_error))))
        with _stopped_by_signals(agent.stop, getattr(driver, "cancel", lambda: None)):
            while not agent.stop.is_set():
                _deliver_spooled(client, spool, held)
                try:
                    agent.round(read_destinations(args.dest_file))
                except TameError as exc:
                    # Refused (a bad token, another budget the site's agents run with: 409): asking again cannot help.
                    refused = not exc.retryable
                    print(f"tame agent: site {args.site}: {exc}" + ("; stopping" if refused else ""), file=sys.stderr,
                          flush=True)
                    if refused:
                        return _lost(held, spool, 2)
                if args.once:
                    break
                agent.stop.wait(args.interval)
    return _lost(held, spool, 0)


def _lost(held: HeldRuns, spool: Path, status: int) -> int:
    """``status``, once the runs held in memory are moved to ``spool`` where it can be written, and any left are
    reported lost."""
    _flush_held(spool, held)
    if len(held):
        print(f"tame agent: {len(held)} run(s) the service did not take and the spool could not keep are lost",
              file=sys.stderr, flush=True)
    return status


def _run_push(args, settings, driver) -> int:
    from api.client import TameClient, TameError

    spool = args.spool or default_spool_dir()
    check_spool(spool)
    held = HeldRuns()
    stop = threading.Event()
    server_site = None  # the site the runs are pushed as (they name none): the server's own, learnt from it
    with TameClient(args.push, token=settings.token, timeout_s=SERVICE_TIMEOUT_S) as client, \
            _stopped_by_signals(stop, getattr(driver, "cancel", lambda: None)):
        while not stop.is_set():
            # What could not be delivered before goes first: it is older, and it may make a probe unnecessary.
            _deliver_spooled(client, spool, held)
            try:
                server_site = server_site or client.own_site()
                # The server's default control is not known here: fits that recorded none do not count as fresh.
                fresh = fresh_destinations(client.paths(server_site), settings.congestion_control, None)
            except TameError as exc:
                print(f"tame agent: {exc}", file=sys.stderr, flush=True)
                fresh = set()
            for dest in read_destinations(args.dest_file):
                if stop.is_set():
                    break
                if dest in fresh:
                    continue
                try:
                    # Resolved once: the probes go to the address checked, never to the name again.
                    parsed = parse_destination(dest)
                    target = probe_target(settings.allowed.checked_address(parsed, agent_resolver, AGENT), parsed.port)
                    started = time.time()
                    plan = run_plan(driver, target, plan_for(settings, settings.default_levels, settings.default_duration_s),
                                    next_level=level_chooser(settings.model, settings.n_max))
                    control = plan_control(plan.probes, settings.congestion_control)
                except (AdvisorError, ProbeError, ValueError) as exc:
                    if not stop.is_set():  # else stopping killed it
                        print(f"tame agent: {dest}: {exc}", file=sys.stderr, flush=True)
                    continue
                _push(client, run_payload(dest, plan, started, control), spool, held=held)
            if args.once:
                break
            stop.wait(args.interval)
    return _lost(held, spool, 0)
