"""The local probe worker: threads that drain the probe queue through an injected driver.

At most ``settings.max_concurrent_probes`` probes run at once across every process sharing
the store (the claim counts running jobs in the database), never two of one destination (a
unique index on active jobs). Jobs left running by a process that died are re-queued.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from advisor.destinations import parse_destination
from advisor.errors import AdvisorError
from advisor.plan_runner import level_chooser, plan_for
from probes.plan import run_plan
from advisor.service import AdviceService
from advisor.store import Job, process_owner
from probes.base import ProbeDriver
from probes.errors import ProbeError

log = logging.getLogger(__name__)

POLL_S = 1.0


class ProbeWorker:
    def __init__(self, service: AdviceService, driver: ProbeDriver, poll_s: float = POLL_S,
                 on_probe: Callable[[str, float, str | None], None] | None = None):
        self.service = service
        self.store = service.store
        self.settings = service.settings
        self.driver = driver
        self.poll_s = poll_s
        self.owner = process_owner()
        self.on_probe = on_probe  # (dest, seconds, error or None), for metrics
        self._wake = threading.Condition()
        self._pending = False
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        service.on_enqueue(self.wake)

    def wake(self) -> None:
        with self._wake:
            self._pending = True
            self._wake.notify_all()

    def start(self) -> None:
        self.store.recover_jobs(self.settings.max_probe_attempts)
        for index in range(self.settings.max_concurrent_probes):
            thread = threading.Thread(target=self._loop, name=f"tame-probe-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self.wake()
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

    def _lease_s(self, job: Job) -> float:
        return plan_for(self.settings, job.levels, job.duration_s).worst_case_s + 60.0

    def run_once(self) -> bool:
        """Claim and run one queued job; False when there was nothing to do."""
        self.store.recover_jobs(self.settings.max_probe_attempts)
        job = self.store.claim_job(self.owner, self._lease_s, self.settings.max_concurrent_probes)
        if job is None:
            return False
        self.run_job(job)
        return True

    def run_job(self, job: Job) -> None:
        started_wall = self.service.clock()
        started = time.monotonic()
        error = None
        try:
            dest = parse_destination(job.dest)
            # Checked again at run time: the allow-list may have changed, or the name now resolves elsewhere.
            self.service.check_allowed(dest)
            def progress(event) -> None:
                if event.kind == "probe_done":
                    self.store.set_progress(job.id, self.owner, round(0.99 * event.index / event.total, 4))

            plan = run_plan(self.driver, dest.key, plan_for(self.settings, job.levels, job.duration_s), progress,
                            level_chooser(self.settings.model, self.settings.n_max))
            _, error = self.service.ingest_run(dest, plan.idle_rtt_s, plan.probes, started_wall,
                                               source="probe", job_id=job.id)
        except (ProbeError, AdvisorError) as exc:
            error = f"{type(exc).__name__}: {exc}"
            self.store.fail_job(job.id, error)
        except Exception as exc:
            error = f"unexpected error: {type(exc).__name__}: {exc}"
            self.store.fail_job(job.id, error)
            raise
        finally:
            if self.on_probe is not None:
                self.on_probe(job.dest, time.monotonic() - started, error)
