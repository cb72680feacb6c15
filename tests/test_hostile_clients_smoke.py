"""Smoke run of the hostile-clients benchmark (python -m benchmarks.hostile_clients) with 2 s attacks: it runs end to
end against a real tame serve, every attack is refused as docs/security.md says, and another address is answered
throughout. The figures come from the full run (`--seconds 20`, benchmarks/results/hostile_clients.md)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(180)
def test_hostile_clients_smoke(tmp_path):
    out = tmp_path / "hostile.md"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.hostile_clients", "--seconds", "2", "--output", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[-1].rstrip(" |")
            for line in out.read_text().splitlines() if line.startswith("| ") and "---" not in line}
    assert "1300 HTTP/1.1 503" in rows["1,400 unfinished 64 KB heads"], rows
    idle = rows["one address holding 1,000 idle connections"]
    answered, asked = idle.split("another address: ")[1].split(" answered")[0].split(" of ")
    assert answered == asked and int(asked) > 0, idle
    assert rows["endless line behind an unread streamed answer"].startswith(("ConnectionResetError",
                                                                              "BrokenPipeError")), rows
    assert "Afterwards another address's /healthz: 200." in out.read_text()
