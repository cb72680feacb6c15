"""Smoke run of the controls-pruning benchmark (python -m benchmarks.prune_controls) at a tiny size, on both stores.

It only shows that the benchmark's set-up (rows copied in SQL, columns listed per dialect) and its two passes run
end to end and leave the rows the passes should; the timings that matter come from the full runs (docs/security.md).
"""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATABASES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.mark.parametrize("database", DATABASES)
def test_prune_controls_smoke_releases_all_but_each_links_first_control(database, request, tmp_path):
    url = request.getfixturevalue("pg_url") if database == "postgres" else f"sqlite:///{tmp_path}/bench.sqlite3"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.prune_controls", "--links", "10", "--observations",
                           "800", "--database-url", url], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
            for line in proc.stdout.splitlines() if line.startswith(("| idle", "| releasing"))}
    # 10 links x 8 controls, each with one run, its 2 results, a fit of 64 curve points and 10 observations (800 //
    # 80), one more from today under each control but the first; plus the template link (1 control, 1 run, 1 fit).
    # Idle releases nothing; releasing keeps only each link's first control (10 + the template's: 11 of each).
    assert rows["idle"][4] == "0" and rows["idle"][5] == "81 / 81 / 5184 / 81 / 162 / 870", proc.stdout
    assert rows["releasing"][4] == "70" and rows["releasing"][5] == "11 / 11 / 704 / 11 / 22 / 100", proc.stdout
    # Row locks are PostgreSQL's: the releasing batch locks the links it releases controls of.
    assert (rows["releasing"][3] != "-") == (database == "postgres"), proc.stdout
