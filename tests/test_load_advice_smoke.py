"""Smoke runs of the advice load benchmark (python -m benchmarks.load_advice) with the store in a CPU cgroup of its
own (--store-cgroup): a real PostgreSQL cluster and a real `tame serve`, for a second. The figures that matter come
from the full runs (docs/advice-service.md); these show that the store is really moved (the benchmark checks that a
new backend is in the group, or fails), that the group is gone afterwards, and that a setting it cannot honour is
refused before anything starts.
"""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from advisor.cpu_groups import cpu_controller
from benchmarks.load_advice import remove_cgroup

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.load_advice", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=240)


def _replicas(run: str) -> set[int]:
    """Pids of the `tame serve --no-worker` processes that the benchmark run started with TAME_SMOKE_RUN=``run`` in its
    environment (which they inherit): this test's own, wherever the kernel reparented them."""
    found = set()
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if (entry.name.isdigit() and b"advisor\0serve\0--no-worker" in (entry / "cmdline").read_bytes()
                    and f"TAME_SMOKE_RUN={run}".encode() in (entry / "environ").read_bytes().split(b"\0")):
                found.add(int(entry.name))
    return found


def _groups(controller: Path) -> set[str]:
    return {p.name for p in controller.iterdir() if p.name.startswith("tame-load-advice-")}


@pytest.mark.postgres
def test_the_store_runs_in_a_cpu_cgroup_of_its_own_which_is_removed_afterwards():
    controller = cpu_controller()
    if controller is None or os.geteuid() != 0:
        pytest.skip("needs root and a cgroup hierarchy with the cpu controller")
    before = _groups(controller)
    proc = _run("--store", "postgresql", "--store-cgroup", "--seconds", "1", "--client", "wrk",
                "--connections", "4", "--wrk-threads", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "the store in a CPU cgroup of its own" in proc.stdout.splitlines()[0], proc.stdout
    assert any(line.startswith("wrk -t1 ") for line in proc.stdout.splitlines()), proc.stdout
    assert _groups(controller) == before


@pytest.mark.parametrize("args, says", [
    (["--store", "sqlite", "--store-cgroup"], "--store-cgroup moves the throwaway cluster of --store postgresql"),
    (["--store", "postgresql", "--database-url", "postgresql://127.0.0.1:1/x", "--store-cgroup"],
     "not with --database-url or --url"),
    (["--url", "http://127.0.0.1:1", "--store-cgroup"], "not with --database-url or --url"),
    (["--store", "postgresql", "--store-cgroup", "--store-cpu-shares", "1"], "between 2 and 262144"),
    (["--store", "postgresql", "--store-cgroup", "--store-cpu-shares", "262145"], "between 2 and 262144"),
    (["--store", "postgresql", "--store-cgroup", "--store-cpu-shares", "1e9"], "invalid int value: '1e9'"),
    (["--store", "postgresql", "--store-cpu-shares", "2048"], "weights the cgroup of --store-cgroup; give both"),
])
def test_a_store_cgroup_it_cannot_make_is_refused_before_anything_starts(args, says):
    controller = cpu_controller()
    before = _groups(controller) if controller else set()
    proc = _run(*args, "--seconds", "1")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert says in proc.stderr, proc.stderr
    assert proc.stdout == ""
    assert (_groups(controller) if controller else set()) == before


@pytest.mark.postgres
def test_a_run_stopped_by_sigterm_removes_its_cgroup_and_stops_its_store():
    # SIGTERM (kill, timeout(1), a CI job cancelled) ended the run at once, with no cleanup: the cgroup stayed in the
    # host's hierarchy (and the throwaway cluster's folder in /tmp), as Ctrl-C's KeyboardInterrupt did not leave them.
    controller = cpu_controller()
    if controller is None or os.geteuid() != 0:
        pytest.skip("needs root and a cgroup hierarchy with the cpu controller")
    run = f"{os.getpid()}-{time.monotonic_ns()}"
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.load_advice", "--store", "postgresql", "--store-cgroup",
                             "--seconds", "5", "--client", "wrk", "--connections", "2", "--wrk-threads", "1"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "TAME_SMOKE_RUN": run})
    group = controller / f"tame-load-advice-{proc.pid}"
    try:
        deadline = time.monotonic() + 120
        # Once its first replica has started (the store is in its group by then), stop the run as `kill` would: the
        # signal lands while the run waits for the replica's /healthz.
        while not _replicas(run):
            assert proc.poll() is None and time.monotonic() < deadline, f"the run ended first: {proc.returncode}"
            time.sleep(0.02)
        stored = [int(pid) for pid in (group / "cgroup.procs").read_text().split()]
        assert stored, "the store was not in the run's cgroup when its replica started"
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        assert not group.exists()
        assert proc.returncode == 128 + signal.SIGTERM
        assert not [pid for pid in stored if Path(f"/proc/{pid}").exists()]  # the cluster was shut down
        assert not _replicas(run)  # the replica it was starting is stopped too
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in _replicas(run):  # what the run left running
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        if group.exists():  # what the run left: its processes back to the root, the group removed
            remove_cgroup(group, controller)
