"""`tame transfer` against a live server (TAME_URL): the advice comes from it and the observation goes to it.

The transfer is real (iperf3 over loopback to a server this test starts); its advice is one without a tame
stream, so no root is needed. The tame forms: tests/probes/test_transfer.py."""

import json
import os
import subprocess
import sys
import time

from tests.api.conftest import free_port, probe_and_wait


def _iperf3_server(port: int) -> subprocess.Popen:
    proc = subprocess.Popen(["iperf3", "-s", "-B", "127.0.0.1", "-p", str(port), "--idle-timeout", "30"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True,
                             timeout=10).stdout.strip():
        assert proc.poll() is None and time.monotonic() < deadline, "iperf3 -s did not start"
        time.sleep(0.05)
    return proc


def _transfer(port: int, dest: str, budget: float, env: dict) -> subprocess.CompletedProcess:
    """`tame transfer DEST --json` for 1 s against an iperf3 server on ``port`` that lives for the call."""
    server = _iperf3_server(port)
    try:
        return subprocess.run([sys.executable, "-m", "advisor", "transfer", dest, "--max-impact", str(budget),
                               "--duration", "1", "--json"], env=env, capture_output=True, text=True, timeout=120)
    finally:
        server.kill()
        server.wait(timeout=10)


def test_a_transfer_via_the_server_reports_its_observation_there(service_factory):
    base, client, app = service_factory(token="w")
    port = free_port()
    dest = f"127.0.0.1:{port}"
    probe_and_wait(client, dest=dest, headers={"Authorization": "Bearer w"})
    budget = 0.37  # the fake path's n* is whole here (2): standard streams alone, no tame one
    advice = client.get("/v1/advice", params={"dest": dest, "max_impact": budget}).json()
    assert advice["fractional_multiplier"] is None and advice["open"]["form"] == "standard"
    assert advice["num_flows"] == advice["tcp_equivalent_streams"] == 2
    env = {k: v for k, v in os.environ.items() if not k.startswith("TAME_")}
    env.update(TAME_URL=base)
    # Without the write token the transfer still runs and prints, but says its observation was not stored
    # (first: a stored observation refits the curve, and the loopback's rate would change the advice).
    done = _transfer(port, dest, budget, env)
    assert done.returncode == 1 and "not stored" in done.stderr and "401" in done.stderr
    assert json.loads(done.stdout)["observation_id"] is None

    env.update(TAME_TOKEN="w")
    done = _transfer(port, dest, budget, env)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["opened"]["fractional_multiplier"] is None and got["opened"]["streams"] == advice["num_flows"]
    assert got["advice"]["open"] == advice["open"]
    _, _, _, observed = app.state.service.store.observation(got["observation_id"])
    assert observed.streams == advice["num_flows"] and observed.tame_streams == 0
    assert observed.throughput_bps == got["throughput_bps"] > 0
    assert len(observed.stream_congestion_controls) == advice["num_flows"]
