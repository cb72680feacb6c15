"""Records the libiperf JSON files under tests/probes/data/ from real runs on 127.0.0.1.

Run from the project root with `.venv/bin/python scripts/record_iperf_fixtures.py`. Each file is
what probes.iperf_worker (libiperf through the Python bindings) printed, the server's own output
included (text from a plain `iperf3 -s`, JSON from `iperf3 -s -J`); the parser tests read them.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

DATA = Path(__file__).resolve().parent.parent / "tests" / "probes" / "data"
RUNS = {
    "tcp_1stream_5s.json": ["--streams", "1", "--duration", "5", "--omit", "0"],
    "tcp_10streams_10s_omit2.json": ["--streams", "10", "--duration", "10", "--omit", "2"],
    "tcp_32streams_10s_reno.json": ["--streams", "32", "--duration", "10", "--omit", "1", "--congestion-control", "reno"],
}
RUNS_JSON_SERVER = {
    "tcp_3streams_6s_omit1_json_server.json": ["--streams", "3", "--duration", "6", "--omit", "1"],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(port: int, *extra: str, host: str = "127.0.0.1") -> str:
    argv = [sys.executable, "-m", "probes.iperf_worker", "--host", host, "--port", str(port), *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True).stdout


@contextmanager
def loopback_server(*flags: str) -> Iterator[int]:
    """`iperf3 -s` with ``flags`` on a free 127.0.0.1 port for the duration of the block; yields the port."""
    port = free_port()
    server = subprocess.Popen(["iperf3", "-s", *flags, "-B", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        yield port
    finally:
        server.kill()
        server.wait()


def main() -> None:
    DATA.mkdir(parents=True, exist_ok=True)
    with loopback_server() as port:
        for name, extra in RUNS.items():
            (DATA / name).write_text(worker(port, *extra))
        (DATA / "error_refused.json").write_text(worker(free_port(), "--streams", "1", "--duration", "1"))
        (DATA / "error_unresolvable.json").write_text(
            worker(port, "--streams", "1", "--duration", "1", host="nonexistent.invalid")
        )
        # A second client while the iperf3 CLI runs a 5 s test: the server answers "busy".
        occupier = subprocess.Popen(["iperf3", "-c", "127.0.0.1", "-p", str(port), "-t", "5"], stdout=subprocess.DEVNULL)
        time.sleep(1.5)
        (DATA / "error_busy.json").write_text(worker(port, "--streams", "1", "--duration", "1"))
        occupier.wait()
    # A server run as `iperf3 -s -J` sends its output to the client as JSON instead of text.
    with loopback_server("-J") as port:
        for name, extra in RUNS_JSON_SERVER.items():
            (DATA / name).write_text(worker(port, *extra))


if __name__ == "__main__":
    main()
