"""The real iperf3 driver against real `iperf3 -s` servers on 127.0.0.1 (no mocks of iperf3).

Whole file: about 90 s of wall time, most of it the 60 s probe.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from probes.errors import HostUnresolvable, NothingListening, ProbeDeadlineExceeded, ProbeError, ServerBusy
from probes.iperf import IperfDriver

pytestmark = pytest.mark.iperf


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_line(path, needle, proc, what):
    # Polls a log file; bounded so a broken set-up fails the test instead of hanging it.
    for _ in range(300):
        if needle in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited early: {path.read_text(errors='replace')}")
        time.sleep(0.1)
    raise RuntimeError(f"{what} never printed {needle!r}: {path.read_text(errors='replace')}")


def stop(proc):
    proc.kill()
    proc.wait()


@pytest.fixture
def server(tmp_path):
    """`iperf3 -s` on a free loopback port, serving one test after another; yields "127.0.0.1:PORT"."""
    assert shutil.which("iperf3"), "iperf3 is not installed; run scripts/install-system-deps.sh"
    port = free_port()
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        # Output to a file, not a pipe nobody reads: a chatty server would block on a full pipe.
        proc = subprocess.Popen(
            ["iperf3", "-s", "-B", "127.0.0.1", "-p", str(port), "--forceflush"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
    try:
        wait_for_line(log, "Server listening", proc, "iperf3 server")
        yield f"127.0.0.1:{port}"
    finally:
        stop(proc)


def assert_reaped(pid):
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_32_streams_for_10_s_completes(server):
    result = IperfDriver().run(server, streams=32, duration_s=10, omit_s=0, deadline_s=120)
    assert result.streams == 32 and len(result.stream_rtts) == 32
    assert result.throughput_bps > 0 and result.sender_bps > 0
    assert len(result.stream_bps) == 32  # the whole report came through, past the pipe buffer the bindings would block on


def test_the_interval_series_is_the_receiver_s_from_the_server_s_output(server):
    # The worker asks the plain `iperf3 -s` for its report; its intervals carry the receiver's total
    # (to the three significant digits of the server's text, well inside 2 %).
    result = IperfDriver().run(server, streams=3, duration_s=4, omit_s=1, deadline_s=60)
    assert result.interval_side == "receiver"
    assert len(result.interval_bps) >= 3
    mean_bps = sum(result.interval_bps) / len(result.interval_bps)
    assert abs(mean_bps - result.throughput_bps) <= 0.02 * result.throughput_bps


def test_60_s_probe_at_16_streams_completes(server):
    # About 4 KiB of JSON per stream and 10 s: 16 streams x 60 s is several times the 64 KiB
    # pipe buffer on which the bare bindings block forever.
    result = IperfDriver().run(server, streams=16, duration_s=60, omit_s=0, deadline_s=180)
    assert result.streams == 16
    assert len(result.interval_bps) >= 59
    assert len(result.stream_bps) == 16  # the whole report came through the pipe


def test_two_probes_in_a_row_in_one_process_both_succeed(server):
    driver = IperfDriver()
    first = driver.run(server, streams=2, duration_s=2, omit_s=0, deadline_s=60)
    second = driver.run(server, streams=3, duration_s=2, omit_s=1, deadline_s=60)
    assert (first.streams, second.streams) == (2, 3)
    assert first.throughput_bps > 0 and second.throughput_bps > 0
    assert second.omit_s == 1


def test_idle_rtt_is_a_small_positive_number(server):
    rtt_s = IperfDriver().idle_rtt(server, deadline_s=60)
    assert rtt_s is not None and 0 < rtt_s < 0.1  # loopback: microseconds, far under 100 ms


def test_congestion_control_reno_is_applied(server):
    result = IperfDriver(congestion_control="reno").run(server, streams=1, duration_s=2, omit_s=0, deadline_s=60)
    assert result.congestion_control == "reno"


def test_nothing_listening_raises_within_the_deadline():
    driver = IperfDriver()
    with pytest.raises(NothingListening, match="nothing listening"):
        driver.run(f"127.0.0.1:{free_port()}", streams=1, duration_s=2, omit_s=0, deadline_s=30)
    assert_reaped(driver.last_worker_pid)


def test_unresolvable_host_raises_host_unresolvable():
    with pytest.raises(HostUnresolvable, match="nonexistent.invalid"):
        IperfDriver().run("nonexistent.invalid:5201", streams=1, duration_s=2, omit_s=0, deadline_s=30)


def test_busy_server_raises_server_busy(server, tmp_path):
    port = server.rsplit(":", 1)[1]
    log = tmp_path / "occupier.log"
    with log.open("wb") as out:
        occupier = subprocess.Popen(
            ["iperf3", "-c", "127.0.0.1", "-p", port, "-t", "60", "--forceflush"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
    try:
        wait_for_line(log, " connected to ", occupier, "occupying iperf3 client")
        with pytest.raises(ServerBusy, match="busy"):
            IperfDriver().run(server, streams=1, duration_s=2, omit_s=0, deadline_s=30)
    finally:
        stop(occupier)


def test_deadline_passed_raises_and_the_worker_is_gone(server):
    driver = IperfDriver()
    with pytest.raises(ProbeDeadlineExceeded, match="deadline"):
        driver.run(server, streams=1, duration_s=30, omit_s=0, deadline_s=2)
    assert driver.last_worker_pid is not None
    assert_reaped(driver.last_worker_pid)


def test_keyboard_interrupt_kills_the_worker(server):
    driver = IperfDriver()
    main = threading.main_thread().ident

    def interrupt_once_running():
        for _ in range(300):
            if driver.last_worker_pid is not None:
                break
            time.sleep(0.05)
        time.sleep(1.0)  # let the caller reach its wait on the worker
        signal.pthread_kill(main, signal.SIGINT)

    # Python leaves SIGINT ignored when it was started ignoring it, as a background job (`make test &`)
    # is; Ctrl-C's KeyboardInterrupt is what this test sends, whatever started the test run.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    helper = threading.Thread(target=interrupt_once_running)
    helper.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            driver.run(server, streams=1, duration_s=30, omit_s=0, deadline_s=60)
    finally:
        helper.join()
        signal.signal(signal.SIGINT, previous)
    assert_reaped(driver.last_worker_pid)


def test_bad_arguments_raise_value_error_before_any_process():
    driver = IperfDriver()
    for kwargs in ({"streams": 0}, {"streams": 129}, {"duration_s": 0}, {"omit_s": -1}, {"deadline_s": 0}):
        args = {"dest": "127.0.0.1:5201", "streams": 1, "duration_s": 1, "omit_s": 0, "deadline_s": 5, **kwargs}
        with pytest.raises(ValueError):
            driver.run(**args)
    assert driver.last_worker_pid is None
    with pytest.raises(ValueError, match="congestion_control"):
        IperfDriver(congestion_control="vegas!")


def test_worker_ends_itself_at_its_deadline_when_nobody_kills_it(server):
    # What protects the path when the parent died without killing its worker.
    host, port = server.rsplit(":", 1)
    argv = [sys.executable, "-m", "probes.iperf_worker", "--host", host, "--port", port,
            "--streams", "1", "--duration", "30", "--deadline-s", "1"]  # fmt: skip
    worker = subprocess.run(argv, capture_output=True, timeout=60)
    assert worker.returncode == -signal.SIGALRM


def test_a_server_that_speaks_first_is_not_reported_busy():
    # libiperf takes a first byte 0xff for a busy iperf3 server's ACCESS_DENIED; this server sends it
    # (and more) to anyone who connects, before they speak: it is not an iperf3 server at all.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(30)
    port = listener.getsockname()[1]
    stop = threading.Event()

    def babble():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.sendall(b"\xff" * 64)
                    time.sleep(0.2)
                except OSError:
                    pass

    thread = threading.Thread(target=babble, daemon=True)
    thread.start()
    try:
        with pytest.raises(ProbeError, match="not an iperf3 server: it answers a new connection with") as raised:
            IperfDriver().run(f"127.0.0.1:{port}", streams=1, duration_s=1, omit_s=0, deadline_s=30)
        assert not isinstance(raised.value, ServerBusy)
    finally:
        stop.set()
        listener.close()
        thread.join(5)
