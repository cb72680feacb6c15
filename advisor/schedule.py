"""A reference scheduler's core: a queue of transfers over several links, read and checked; the schedulers'
SQL read of the advice; and running the transfers concurrently.

A link is (source site, destination): ``src`` names the site a transfer leaves from (None: the advice
service's own site), ``dest`` is HOST:PORT. Each source has a command prefix that runs a program on it
(``ip netns exec NS`` on the test bed, ``[]`` for this host); the transfer's iperf3 clients run through it.
The command that wires these to the service and to iperf3 is `tame schedule` (advisor/commands/schedule.py).
"""

from __future__ import annotations

import json
import math
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar

from advisor.db import Database, check_database_url
from advisor.destinations import Destination, parse_destination
from advisor.errors import DuplicateKey, InvalidRequest, StoreError, UnknownDestination
from advisor.freshness import Freshness, evidence_at
from advisor.limits import check_congestion_control, check_site, parse_number, unique_keys
from advisor.links import advised, same_control

# A queue is the operator's file: bounded so that a wrong file fails fast rather than filling memory.
MAX_QUEUE_BYTES = 1 << 20
MAX_TRANSFERS = 1000
MAX_SOURCES = 100
MAX_PREFIX_ARGS = 32
MAX_ARG_CHARS = 4096
MAX_DURATION_S = 86400.0  # iperf3 runs a test for at most a day
MAX_BYTES = 2**50
_TRANSFER_KEYS = {"src", "dest", "max_impact", "duration_s", "bytes", "cc"}


class QueueError(InvalidRequest):
    """A queue file is malformed: the message names the line or entry and the field."""


@dataclass(frozen=True)
class Transfer:
    """One queued transfer: from site ``src`` (None: the service's own) to ``dest``, within ``max_impact``
    (fraction above 0, at most 1), for ``duration_s`` seconds or ``bytes`` bytes, its standard streams under
    ``cc`` (None: the service's default control)."""

    index: int
    src: str | None
    dest: Destination
    max_impact: float
    duration_s: float | None = None
    bytes: int | None = None
    cc: str | None = None

    @property
    def link(self) -> tuple[str | None, str]:
        return (self.src, self.dest.key)

    @property
    def link_name(self) -> str:
        return f"{self.src} -> {self.dest.key}" if self.src else self.dest.key


@dataclass(frozen=True)
class Queue:
    """The transfers in file order, and each source site's command prefix (``()``: this host)."""

    transfers: tuple[Transfer, ...]
    sources: Mapping[str, tuple[str, ...]]

    def prefix(self, transfer: Transfer) -> tuple[str, ...]:
        return () if transfer.src is None else self.sources[transfer.src]


def parse_queue(text: str, sources: Mapping[str, Sequence[str]] | None = None) -> Queue:
    """A queue from a file's text: JSON (``{"sources": {SITE: [ARGV...]}, "transfers": [...]}`` or a list of
    transfers) or lines of ``key=value`` fields (``src=SITE dest=HOST:PORT max_impact=0.1 duration_s=30``;
    ``#`` starts a comment). ``sources`` add to (and override) the file's. QueueError says what to fix."""
    if len(text.encode("utf-8", errors="replace")) > MAX_QUEUE_BYTES:
        raise QueueError(f"the queue file is larger than {MAX_QUEUE_BYTES} bytes")
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        entries, file_sources = _json_entries(stripped)
    else:
        entries, file_sources = _line_entries(text), {}
    # The options' sources override the file's; within either, two names for one site cannot be told apart.
    merged = {**_sources(file_sources, "the queue file's \"sources\""),
              **_sources({site: _prefix(argv, f"source {site!r}") for site, argv in (sources or {}).items()},
                         "the --netns options")}
    if len(merged) > MAX_SOURCES:
        raise QueueError(f"the queue names {len(merged)} sources; at most {MAX_SOURCES}")
    if not entries:
        raise QueueError("the queue holds no transfers")
    if len(entries) > MAX_TRANSFERS:
        raise QueueError(f"the queue holds {len(entries)} transfers; at most {MAX_TRANSFERS} a run")
    transfers = tuple(_transfer(i, where, entry) for i, (where, entry) in enumerate(entries))
    for transfer in transfers:
        if transfer.src is not None and transfer.src not in merged:
            raise QueueError(f"transfer {transfer.index + 1} ({transfer.link_name}): no way to run a command on "
                             f"source {transfer.src!r}; give it in the file's \"sources\" (e.g. "
                             f"\"{transfer.src}\": [\"ip\", \"netns\", \"exec\", \"NS\"], or [] for this host) "
                             f"or with --netns {transfer.src}=NS")
    return Queue(transfers, merged)


def _json_entries(text: str) -> tuple[list[tuple[str, Any]], dict[str, tuple[str, ...]]]:
    try:
        doc = json.loads(text, object_pairs_hook=unique_keys("the queue file"))
    except DuplicateKey as exc:  # the line form refuses a key given twice too
        raise QueueError(str(exc)) from None
    except ValueError as exc:
        raise QueueError(f"the queue file is not valid JSON: {exc}") from None
    except RecursionError:  # the parser recurses per nesting level: a queue is three levels deep
        raise QueueError("the queue file nests lists or objects too deeply to be a queue; it holds \"sources\" "
                         "and \"transfers\", a list of objects") from None
    sources: dict[str, tuple[str, ...]] = {}
    if isinstance(doc, dict):
        unknown = set(doc) - {"sources", "transfers"}
        if unknown:
            raise QueueError(f"unknown key(s) {', '.join(sorted(map(repr, unknown)))} at the top of the queue; "
                             "it holds \"sources\" and \"transfers\"")
        raw_sources = doc.get("sources", {})
        if not isinstance(raw_sources, dict):
            raise QueueError("\"sources\" must map each site to its command prefix, e.g. "
                             "{\"siteA\": [\"ip\", \"netns\", \"exec\", \"ns-a\"]}")
        sources = {site: _prefix(argv, f"source {site!r}") for site, argv in raw_sources.items()}
        doc = doc.get("transfers")
    if not isinstance(doc, list):
        raise QueueError("\"transfers\" must be a list of transfers")
    return [(f"transfer {i + 1}", entry) for i, entry in enumerate(doc)], sources


def _sources(given: Mapping[Any, tuple[str, ...]], where: str) -> dict[str, tuple[str, ...]]:
    """``given`` keyed by each site's canonical name (check_site); QueueError for two names of one site."""
    sources: dict[str, tuple[str, ...]] = {}
    named: dict[str, Any] = {}
    for site, argv in given.items():
        key = _site(site, f"source {site!r:.80}")
        if key in sources:
            raise QueueError(f"{where} name site {key!r} twice ({named[key]!r:.80} and {site!r:.80}); give each "
                             "source once")
        sources[key], named[key] = argv, site
    return sources


def _line_entries(text: str) -> list[tuple[str, Any]]:
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields: dict[str, str] = {}
        for token in line.split():
            key, sep, value = token.partition("=")
            if not sep or not key or not value:
                raise QueueError(f"line {number}: {token!r} is not key=value (e.g. src=siteA dest=10.0.0.1:5201 "
                                 "max_impact=0.1 duration_s=30)")
            if key in fields:
                raise QueueError(f"line {number}: {key} is given twice")
            fields[key] = value
        for key in ("max_impact", "duration_s"):
            if key in fields:
                fields[key] = _float(fields[key], f"line {number}: {key}")
        if "bytes" in fields:
            fields["bytes"] = _int(fields["bytes"], f"line {number}: bytes")
        entries.append((f"line {number}", fields))
    return entries


def _float(text: str, where: str) -> float:
    try:
        return parse_number(text)
    except ValueError:
        raise QueueError(f"{where}: {text!r:.40} is not a number; write it in ASCII digits, e.g. 0.1 or 30") from None


def _int(text: str, where: str) -> int:
    try:
        return parse_number(text, int)
    except ValueError:
        raise QueueError(f"{where}: {text!r:.40} is not a whole number; write it in ASCII digits, e.g. 1000000") \
            from None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _site(value: Any, where: str) -> str:
    try:
        return check_site(value, "a source site")
    except InvalidRequest as exc:
        raise QueueError(f"{where}: {exc}") from None


def _prefix(argv: Any, where: str) -> tuple[str, ...]:
    if not isinstance(argv, (list, tuple)) or len(argv) > MAX_PREFIX_ARGS or not all(
            isinstance(a, str) and a and len(a) <= MAX_ARG_CHARS and "\0" not in a for a in argv):
        raise QueueError(f"{where}: the command prefix must be a list of at most {MAX_PREFIX_ARGS} non-empty "
                         "strings, e.g. [\"ip\", \"netns\", \"exec\", \"ns-a\"] ([] for this host)")
    return tuple(argv)


def _transfer(index: int, where: str, entry: Any) -> Transfer:
    if not isinstance(entry, dict):
        raise QueueError(f"{where}: a transfer is an object with src, dest, max_impact and duration_s or bytes")
    unknown = set(entry) - _TRANSFER_KEYS
    if unknown:
        raise QueueError(f"{where}: unknown field(s) {', '.join(sorted(repr(k)[:40] for k in unknown))}; "
                         f"a transfer has {', '.join(sorted(_TRANSFER_KEYS))}")
    src = entry.get("src")
    if src is not None:
        src = _site(src, f"{where}: src")
    if "dest" not in entry:
        raise QueueError(f"{where}: dest is missing (HOST:PORT)")
    try:
        dest = parse_destination(entry["dest"])
    except InvalidRequest as exc:
        raise QueueError(f"{where}: dest: {exc}") from None
    budget = entry.get("max_impact")
    if not _number(budget) or not 0.0 < budget <= 1.0:
        raise QueueError(f"{where}: max_impact must be a fraction above 0 and at most 1 (0.1 for 10 %), "
                         f"got {budget!r:.40}")
    duration_s, size = entry.get("duration_s"), entry.get("bytes")
    if (duration_s is None) == (size is None):
        raise QueueError(f"{where}: give exactly one of duration_s (seconds) and bytes")
    if duration_s is not None and (not _number(duration_s) or not 1.0 <= duration_s <= MAX_DURATION_S):
        raise QueueError(f"{where}: duration_s must be 1..{MAX_DURATION_S:g} seconds, got {duration_s!r:.40}")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= MAX_BYTES):
        raise QueueError(f"{where}: bytes must be a whole number 1..2**50, got {size!r:.40}")
    control = entry.get("cc")
    if control is not None:
        try:
            control = check_congestion_control(control)
        except InvalidRequest as exc:
            raise QueueError(f"{where}: cc: {exc}") from None
    return Transfer(index, src, dest, float(budget), None if duration_s is None else float(duration_s), size, control)


# --- the schedulers' SQL read --------------------------------------------------------------------


@dataclass(frozen=True)
class LinkAdvice:
    """What the schedulers' SQL read gives for a link, control and budget: the whole standard streams, and the age of
    the newest evidence behind the current fit and whether it is stale, as GET /v1/advice's age_s and stale."""

    streams: int
    age_s: float
    stale: bool


class SqlAdvice:
    """The stream count for a link and budget, read from the advice store's ``current_advice`` view as a
    scheduler on another machine would (docs/advice-service.md, "The store"): whole standard streams. A link
    without a source is ``own_site``'s, as the service takes a request that names none; rows stored before
    controls were recorded stand for ``default_control`` (the service's, TAME_CONGESTION_CONTROL or the host's)
    and for no other, as the service answers from them. ``freshness`` is the service's (its TAME_TTL_S), and
    ``clock`` gives Unix seconds: the advice's staleness is judged as the service judges it."""

    def __init__(self, database_url: str, own_site: str, default_control: str, freshness: Freshness,
                 clock: Callable[[], float] = time.time):
        self.own_site = own_site
        self.default_control = default_control
        self.freshness = freshness
        self.clock = clock
        check_database_url(database_url)
        # A reader never creates a store: a mistyped SQLite path is an error, not a new empty file.
        if database_url.startswith("sqlite:///") and not Path(database_url[len("sqlite:///"):]).is_file():
            raise StoreError(f"no SQLite advice store at {database_url[len('sqlite:///'):]}")
        self._db = Database(database_url)
        self._has_src: bool | None = None

    def close(self) -> None:
        self._db.close()

    def has_src(self) -> bool:
        """Whether the view keys advice by source site (a ``src`` column)."""
        if self._has_src is None:
            try:
                with self._db.transaction() as tx:
                    tx.execute("SELECT src FROM current_advice WHERE 1 = 0").fetchall()
                self._has_src = True
            except StoreError:
                self._has_src = False
        return self._has_src

    def advice(self, src: str | None, dest_key: str, control: str, max_impact: float) -> LinkAdvice:
        """``coalesce(max(streams), 1)`` for the link under ``control`` (for the default control, of the rows recorded
        under it or of those not recorded with a control, as advisor.links.advised takes them), with the current
        fit's age and staleness; UnknownDestination when the store has no fit for it."""
        where, params = "dest = ?", [dest_key]
        if self.has_src():
            src = src or self.own_site
            where, params = where + " AND src = ?", params + [src]
        elif src is not None:
            raise UnknownDestination(f"the advice store has no source sites (its current_advice has no src "
                                     f"column, a store older than advice per link), so it has no advice for "
                                     f"{src} -> {dest_key}")
        with self._db.transaction() as tx:
            # One current fit per control (the link's; in a store without src, the destination's).
            fits = tx.execute(f"SELECT congestion_control, probed_at, fitted_at, observations_used FROM current_fits "
                              f"WHERE {where}", params).fetchall()
            fit = advised(((row[0], row[1], row) for row in fits), control, self.default_control)
            if fit is not None:
                control_clause, control_params = same_control("congestion_control", fit[0])
                streams = int(tx.execute(
                    "SELECT coalesce(max(streams), 1) FROM current_advice "
                    f"WHERE {where} AND {control_clause} AND impact_bound <= ?",
                    params + list(control_params) + [max_impact]).fetchone()[0])
                newest, now = evidence_at(*fit[1:]), self.clock()
                return LinkAdvice(streams, self.freshness.age_s(newest, now), self.freshness.stale(newest, now))
        raise UnknownDestination(f"the advice store has no advice for {'%s -> ' % src if src else ''}{dest_key} "
                                 f"under {control}" + (" (a link without src is this host's site, TAME_SITE: name "
                                                       "its src in the queue)" if src == self.own_site else ""))


# --- running ------------------------------------------------------------------------------------

T = TypeVar("T")
R = TypeVar("R")


def run_concurrently(items: Sequence[T], run: Callable[[T], R], limit: int,
                     key: Callable[[T], Any] = lambda item: None, cancel: threading.Event | None = None) -> list[R]:
    """``run(item)`` for each item, at most ``limit`` at once, never two items with one non-None ``key`` at
    once (one destination's iperf3 server serves one test at a time), otherwise in the items' order; the
    results in that order. An exception in ``run`` or here (KeyboardInterrupt) starts nothing more, sets
    ``cancel`` (which ``run`` is to heed) and is re-raised when every started item has finished."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit!r}")
    results: dict[int, R] = {}
    waiting = list(range(len(items)))
    running: dict[Future, int] = {}
    with ThreadPoolExecutor(max_workers=limit, thread_name_prefix="transfer") as pool:
        try:
            _drive(items, run, limit, key, pool, waiting, running, results)
        except BaseException:
            if cancel is not None:
                cancel.set()
            raise
    return [results[i] for i in range(len(items))]


def _drive(items, run, limit, key, pool, waiting: list[int], running: dict[Future, int],
           results: dict[int, Any]) -> None:
    busy: set[Any] = set()
    while waiting or running:
        for i in list(waiting):
            if len(running) >= limit:
                break
            k = key(items[i])
            if k is not None and k in busy:
                continue
            waiting.remove(i)
            if k is not None:
                busy.add(k)
            running[pool.submit(run, items[i])] = i
        done, _ = wait(list(running), return_when=FIRST_COMPLETED)
        for future in done:
            i = running.pop(future)
            busy.discard(key(items[i]))
            results[i] = future.result()
