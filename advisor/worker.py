"""The local probe worker: threads that drain the probe queue through an injected driver.

At most ``settings.max_concurrent_probes`` probes run at once across every process sharing
the store (the claim counts running jobs in the database), never two of one destination (a
unique index on active jobs) nor two of one address (a job pins the address it resolved to;
a job whose address is busy goes back to the queue and waits). Jobs left running by a process
that died are re-queued.

A job's destination is resolved once, when it runs: that address is checked against the
allow-list, probed (as an IP literal, never the name again) and recorded with the run. A job whose name lookup
does not finish (slow DNS, or the lookups all busy) goes back to the queue uncounted and waits before it is claimed
again (advisor.store.Store.defer_attempt), as a site agent's claim does.

While it runs, a :class:`advisor.retention.Pruner` prunes the store every
``settings.retention.interval_s`` (so `tame serve` and a local `tame agent` keep it bounded).

On :meth:`ProbeWorker.stop` (a service shutting down) the driver's running probes are killed
(its ``cancel()``, when it has one) and their jobs go back to the queue, the attempt not counted.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from advisor.destinations import Destination, parse_destination
from advisor.errors import AdvisorError, LookupUnfinished, StoreError
from advisor.jobs import Job, process_owner
from advisor.plan_runner import level_chooser, plan_for
from advisor.retention import Pruner
from advisor.service import AdviceService
from probes.base import ProbeDriver
from probes.errors import ProbeError, ServerBusy
from probes.plan import PlanEvent, run_plan
from probes.result import PlanResult

log = logging.getLogger(__name__)

POLL_S = 1.0
# How often a running job's progress is written while a probe runs.
PROGRESS_INTERVAL_S = 2.0
# A re-queued job may find the iperf3 server still busy with the test its killed worker had
# started, until the server notices the dead connection: it is tried again after these waits.
BUSY_RETRY_WAITS_S = (2.0, 4.0, 8.0)
# A finished run the store could not take (a full disk, a database restarting) is kept and stored again after these
# waits, the last repeated, while the job's lease lasts: the probe is not thrown away for a passing failure.
STORE_RETRY_WAITS_S = (1.0, 2.0, 4.0, 8.0)
# What is left of the lease when the worker stops trying to store a run: its job then goes back to the queue.
STORE_RETRY_MARGIN_S = 5.0


class _RunNotStored(StoreError):
    """A finished run the store failed to take until its job's lease was nearly over."""


def probe_target(address: str, port: int) -> str:
    """HOST:PORT for the driver from an IP literal (IPv6 in brackets), as the store spells destinations."""
    return Destination(address, port).key


class JobProgress:
    """Where a running job is in its plan, from the plan's events and the time since the step began.

    ``fraction`` rises within a level as its time passes (never past the level's share), so a
    35 s probe does not sit at 0 until it ends; ``detail`` is what GET /v1/probes/ID shows.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._lock = threading.Lock()
        self._phase = "starting"
        self._level: int | None = None
        self._index = 0
        self._of = 0
        self._attempt = 0
        self._started = clock()
        self._expected_s = 0.0
        self._done = 0

    def on_event(self, event: PlanEvent) -> None:
        now = self.clock()
        with self._lock:
            self._of = max(self._of, event.total)
            if event.kind == "idle_rtt":
                self._phase, self._started, self._expected_s = "idle_rtt", now, event.expected_s or 0.0
            elif event.kind == "probe":
                self._phase, self._level, self._index, self._attempt = "probe", event.streams, event.index, 0
                self._started, self._expected_s = now, event.expected_s or 0.0
            elif event.kind in ("extend", "retry"):
                # The level runs again (longer, or at another time): its expected time grows by that run.
                self._attempt = event.attempt + (1 if event.kind == "retry" else 0)
                self._expected_s = (now - self._started) + (event.expected_s or 0.0)
            elif event.kind == "probe_done":
                self._done = max(self._done, event.index)

    def snapshot(self) -> tuple[float, dict[str, Any]]:
        """(fraction done 0-0.99, detail)."""
        now = self.clock()
        with self._lock:
            elapsed = max(0.0, now - self._started)
            fraction = 0.0
            if self._of:
                within = 0.0
                if self._phase == "probe" and self._index > self._done and self._expected_s > 0:
                    within = min(elapsed / self._expected_s, 0.95)
                fraction = 0.99 * min(1.0, (self._done + within) / self._of)
            detail = {"phase": self._phase, "level": self._level, "index": self._index, "of": self._of,
                      "attempt": self._attempt + 1, "elapsed_s": round(elapsed, 1),
                      "expected_s": round(self._expected_s, 1)}
        return round(fraction, 4), detail


class ProbeWorker:
    def __init__(self, service: AdviceService, driver: ProbeDriver, poll_s: float = POLL_S,
                 on_probe: Callable[[str, float, str | None], None] | None = None,
                 progress_interval_s: float = PROGRESS_INTERVAL_S,
                 busy_retry_waits_s: tuple[float, ...] = BUSY_RETRY_WAITS_S):
        self.service = service
        self.store = service.store
        self.settings = service.settings
        self.driver = driver
        self.poll_s = poll_s
        self.progress_interval_s = progress_interval_s
        self.busy_retry_waits_s = busy_retry_waits_s
        self.owner = process_owner()
        self.on_probe = on_probe  # (dest, seconds, error or None), for metrics
        self._wake = threading.Condition()
        self._pending = False
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._active: dict[str, JobProgress] = {}
        self._active_lock = threading.Lock()
        self.pruner = Pruner(self.store, self.settings.retention)
        service.on_enqueue(self.wake)

    def wake(self) -> None:
        with self._wake:
            self._pending = True
            self._wake.notify_all()

    def start(self) -> None:
        self.store.recover_jobs(self.settings.max_probe_attempts, local_src=self.settings.site)
        for index in range(self.settings.max_concurrent_probes):
            thread = threading.Thread(target=self._loop, name=f"tame-probe-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)
        ticker = threading.Thread(target=self._tick, name="tame-probe-progress", daemon=True)
        ticker.start()
        self._threads.append(ticker)
        self.pruner.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop claiming, kill the probes running (their jobs go back to the queue) and join the threads."""
        self._stop.set()
        cancel = getattr(self.driver, "cancel", None)
        if cancel is not None:
            cancel()
        self.wake()
        self.pruner.stop(timeout_s)
        for thread in self._threads:
            thread.join(timeout_s)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                worked = self.run_once()
            except Exception:  # keep the worker alive whatever one job does; the job is marked failed
                log.exception("probe worker error")
                worked = False
            if worked:
                continue
            with self._wake:
                if not self._pending:
                    self._wake.wait(self.poll_s)
                self._pending = False

    def _tick(self) -> None:
        # One thread (one database connection) writes the progress of every job running here.
        while not self._stop.wait(self.progress_interval_s):
            with self._active_lock:
                active = list(self._active.items())
            for job_id, progress in active:
                self._write_progress(job_id, progress)

    def _write_progress(self, job_id: str, progress: JobProgress) -> None:
        fraction, detail = progress.snapshot()
        try:
            self.store.set_progress(job_id, self.owner, fraction, detail)
        except AdvisorError as exc:  # progress is advisory; the job's own writes report a broken store
            log.warning("progress of job %s not written: %s", job_id, exc)

    def _lease_s(self, job: Job) -> float:
        return self.service.worst_case_s(job) + 60.0

    def run_once(self) -> bool:
        """Claim and run one queued job; False when there was nothing to do."""
        if self._stop.is_set():
            return False
        self.store.recover_jobs(self.settings.max_probe_attempts, local_src=self.settings.site)
        job = self.store.claim_job(self.owner, self._lease_s, self.settings.max_concurrent_probes,
                                   src=self.settings.site)
        if job is None:
            return False
        self.run_job(job)
        return True

    def run_job(self, job: Job) -> None:
        started_wall = self.service.clock()
        started = time.monotonic()
        error = None
        probed = True
        progress = JobProgress()
        try:
            dest = parse_destination(job.dest)
            # Resolved once, here: the allow-list is checked against this address and the probes go
            # to exactly it, so a name re-pointed after the check cannot send them elsewhere.
            address = self.service.probe_address(dest)
            lease_until = self.service.clock() + self._lease_s(job)
            if not self.store.pin_address(job.id, self.owner, address, lease_until):
                self.store.release_job(job.id, self.owner, f"waiting: a probe to {address} is running", address)
                probed = False
                return
            with self._active_lock:
                self._active[job.id] = progress

            def report(event: PlanEvent) -> None:
                progress.on_event(event)
                self._write_progress(job.id, progress)

            job = self.service.settle_reuse(job, self.owner)
            plan = self._run_plan(job, probe_target(address, dest.port), report)
            error = self._store_run(job, dest, plan, started_wall, address, lease_until)
        except LookupUnfinished as exc:
            # Nothing is known against the job (nothing was probed): not a failed attempt.
            waiting = self.store.defer_attempt(job.id, self.owner, job.src, str(exc), exc.retry_after_s,
                                               charged=False)
            log.warning("probe %s of %s: %s", job.id, job.dest, waiting.error if waiting else exc)
            probed = False
        except (ProbeError, AdvisorError) as exc:
            error = f"{type(exc).__name__}: {exc}"
            if self._stop.is_set():
                # Shutting down killed the probe: not the job's fault, so not a failed attempt.
                self.store.release_job(job.id, self.owner, "interrupted: the service stopped; re-queued")
            elif isinstance(exc, _RunNotStored):
                # Not the probe's fault either: the job's lease, about to end, returns it to the queue.
                log.error("job %s: the run to %s could not be stored within its lease (%s); the job goes back to the "
                          "queue when the lease ends", job.id, job.dest, exc)
            else:
                self.store.fail_job(job.id, error)
        except Exception as exc:
            error = f"unexpected error: {type(exc).__name__}: {exc}"
            self.store.fail_job(job.id, error)
            raise
        finally:
            with self._active_lock:
                self._active.pop(job.id, None)
            if self.on_probe is not None and probed:
                self.on_probe(job.dest, time.monotonic() - started, error)

    def _store_run(self, job: Job, dest: Destination, plan: PlanResult, started_wall: float, address: str,
                   lease_until: float) -> str | None:
        """Store the job's finished run and close the job (its fit error, or None). A store that fails (StoreError) is
        tried again while the job's lease lasts and the worker is not stopping; a commit whose answer was lost is told
        by the job, closed in the run's own transaction, so the run is stored once. _RunNotStored once the lease is
        nearly over, StoreError when the worker stops."""
        waits = list(STORE_RETRY_WAITS_S)
        while True:
            try:
                _, error = self.service.ingest_run(dest, plan.idle_rtt_s, plan.probes, started_wall,
                                                   source="probe", job_id=job.id, address=address,
                                                   congestion_control=self.service.job_control(job), src=job.src,
                                                   job=job)
                return error
            except StoreError as exc:
                wait_s = waits.pop(0) if len(waits) > 1 else waits[0]
                if self._stop.is_set():
                    raise
                if self.service.clock() + wait_s > lease_until - STORE_RETRY_MARGIN_S:
                    raise _RunNotStored(str(exc)) from exc
                log.warning("job %s: the run to %s could not be stored (%s); trying again in %g s", job.id,
                            job.dest, exc, wait_s)
                if self._stop.wait(wait_s):
                    raise
            try:
                stored = self.store.job(job.id)
            except StoreError:
                continue
            if stored.probe_run_id is not None:  # the failure came after the commit: the run is there
                return stored.error

    def _run_plan(self, job: Job, target: str, report: Callable[[PlanEvent], None]) -> PlanResult:
        plan = plan_for(self.settings, job.levels, job.duration_s, self.service.job_control(job),
                        reuses_adaptive=job.reuse_probe_id is not None)
        chooser = level_chooser(self.settings.model, self.settings.n_max)
        waits = list(self.busy_retry_waits_s) if job.attempts > 1 else []
        while True:
            try:
                return run_plan(self.driver, target, plan, report, chooser)
            except ServerBusy:
                if not waits or self._stop.is_set():
                    raise
                wait_s = waits.pop(0)
                log.info("job %s: %s still busy after a restart; trying again in %g s", job.id, target, wait_s)
                if self._stop.wait(wait_s):
                    raise
