"""Smoke runs of the advice load benchmark (python -m benchmarks.load_advice) with the store in a CPU cgroup of its
own (--store-cgroup): a real PostgreSQL cluster and a real `tame serve`, for a second. The figures that matter come
from the full runs (docs/advice-service.md); these show that the store is really moved (the benchmark checks that a
new backend is in the group, or fails), that the group is gone afterwards, and that a setting it cannot honour is
refused before anything starts.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.load_advice import cpu_controller

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.load_advice", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=240)


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
])
def test_a_store_cgroup_it_cannot_make_is_refused_before_anything_starts(args, says):
    controller = cpu_controller()
    before = _groups(controller) if controller else set()
    proc = _run(*args, "--seconds", "1")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert says in proc.stderr, proc.stderr
    assert proc.stdout == ""
    assert (_groups(controller) if controller else set()) == before
