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

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.load_advice", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=240)


def _replicas() -> set[int]:
    """Pids of the `tame serve --no-worker` processes the benchmark starts, wherever they are."""
    found = set()
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and b"advisor\0serve\0--no-worker" in (entry / "cmdline").read_bytes():
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
    servers_before = _replicas()
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.load_advice", "--store", "postgresql", "--store-cgroup",
                             "--seconds", "5", "--client", "wrk", "--connections", "2", "--wrk-threads", "1"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    group = controller / f"tame-load-advice-{proc.pid}"
    try:
        deadline = time.monotonic() + 120
        # Once the store is in its group (the run's cluster moved there), stop the run as `kill` would.
        while not (group.is_dir() and (group / "cgroup.procs").read_text().split()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr and proc.stderr.read()
            time.sleep(0.05)
        stored = [int(pid) for pid in (group / "cgroup.procs").read_text().split()]
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        assert not group.exists()
        assert proc.returncode == 128 + signal.SIGTERM, proc.stderr.read()
        assert not [pid for pid in stored if Path(f"/proc/{pid}").exists()]  # the cluster was shut down
        # The replica it was starting when stopped (the signal lands while it waits for /healthz) is stopped too.
        assert _replicas() <= servers_before
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in _replicas() - servers_before:  # what the run left running
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        if group.exists():  # what the run left: its processes back to the root, the group removed
            for pid in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    (controller / "cgroup.procs").write_text(pid)
            group.rmdir()
