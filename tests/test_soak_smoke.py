"""Smoke run of the soak benchmark (python -m benchmarks.soak): one minute on SQLite, not a soak.

It only shows that the benchmark runs end to end (real tame serve, tame agent, iperf3 -s on
loopback, kills and restarts) and that no acknowledged write is lost; the figures that matter
come from the full runs (`python -m benchmarks.soak --minutes 30`).
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.iperf
@pytest.mark.timeout(150)
def test_soak_smoke_one_minute_loses_no_acknowledged_write(tmp_path):
    if shutil.which("iperf3") is None:
        pytest.skip("iperf3 is not installed")
    out = tmp_path / "soak.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.soak", "--minutes", "1", "--store", "sqlite",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=140)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    figures = json.loads(out.read_text())
    assert figures["lost observations"] == 0 and figures["lost pushed runs"] == 0, proc.stdout
    assert figures["acknowledged observations"] > 0 and figures["acknowledged pushed runs"] > 0, proc.stdout
    assert figures["orphaned iperf workers"] == 0, proc.stdout
    assert "lost acknowledged writes: 0" in proc.stdout
