"""The real probe driver: iperf3 through the Python bindings, one worker process per probe.

Each probe runs ``python -m probes.iperf_worker`` (an argument list, never a shell string) in a
new session, with a hard wall-clock budget. The worker is killed and reaped when the budget runs
out, on any exception in the caller (KeyboardInterrupt included), and by :meth:`IperfDriver.cancel`
(a service shutting down). It dies with its parent: it asks the kernel for SIGKILL when the
thread that started it exits (PR_SET_PDEATHSIG), and that thread is the one blocked waiting for
it here, so it exits only after the worker is reaped, or when the whole process dies (SIGKILL,
OOM, a crash), which is when the worker must go too. See :mod:`probes.iperf_worker` for the
bindings' defects the worker owns.
"""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

from probes.destination import Destination, parse_destination
from probes.errors import ProbeDeadlineExceeded, ProbeError, ServerBusy
from probes.controls import is_control_name
from probes.iperf_parse import parse_iperf_json
from probes.result import ProbeResult

MAX_STREAMS = 128  # libiperf 3.12 refuses more parallel streams than this

_PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)


class IperfDriver:
    """ProbeDriver over the ``iperf3`` bindings (libiperf 3.x).

    ``deadline_s`` in :meth:`run` and :meth:`idle_rtt` is a wall-clock budget in seconds from
    the call; nothing started by the call outlives it. iperf3 takes whole seconds, so
    ``duration_s`` and ``omit_s`` are rounded up. ``congestion_control`` (any control the kernel
    offers, by name: :data:`probes.controls.CONTROL_NAME`) is set on the sender through libiperf
    (``iperf3 -C``), for every probe or per :meth:`run`; None keeps the kernel's default. The result
    records the control iperf3 reports its streams used. ``dest`` is ``HOST[:PORT]``
    (:func:`probes.destination.parse_destination`).
    """

    def __init__(
        self,
        *,
        congestion_control: str | None = None,
        python: str = sys.executable,
        idle_rate_bps: int = 1_000_000,
        idle_duration_s: int = 2,
    ) -> None:
        _check_control(congestion_control)
        if idle_rate_bps <= 0 or idle_duration_s < 1:
            raise ValueError("idle_rate_bps must be > 0 and idle_duration_s >= 1")
        self.congestion_control = congestion_control
        self.python = python
        self.idle_rate_bps = int(idle_rate_bps)
        self.idle_duration_s = int(idle_duration_s)
        #: Process id of the most recent worker (already reaped when a call returns or raises).
        self.last_worker_pid: int | None = None
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen[bytes]] = set()
        self._cancelled = False

    def cancel(self) -> None:
        """Kill every worker running now and refuse new probes (each call in flight raises ProbeError)."""
        with self._lock:
            self._cancelled = True
            running = list(self._running)
        for proc in running:
            proc.kill()  # the calling thread reaps it

    def run(
        self,
        dest: str,
        streams: int,
        duration_s: float,
        omit_s: float,
        deadline_s: float,
        attempt: int = 0,
        congestion_control: str | None = None,
    ) -> ProbeResult:
        """Run one probe of ``streams`` parallel TCP streams to ``dest`` (``attempt``: a re-run is another time
        anyway) under ``congestion_control`` (None: the driver's, else the kernel's default)."""
        _check_control(congestion_control)
        if not isinstance(streams, int) or not 1 <= streams <= MAX_STREAMS:
            raise ValueError(f"streams must be an integer from 1 to {MAX_STREAMS}, got {streams!r}")
        if not (math.isfinite(duration_s) and duration_s > 0):
            raise ValueError(f"duration_s must be > 0, got {duration_s!r}")
        if not (math.isfinite(omit_s) and omit_s >= 0):
            raise ValueError(f"omit_s must be >= 0, got {omit_s!r}")
        target = parse_destination(dest)
        extra = ["--streams", str(streams), "--duration", str(math.ceil(duration_s)), "--omit", str(math.ceil(omit_s))]
        control = congestion_control or self.congestion_control
        if control:
            extra += ["--congestion-control", control]
        return _parse(self._run_worker(target, extra, deadline_s), target)

    def idle_rtt(self, dest: str, deadline_s: float) -> float | None:
        """Smallest smoothed RTT of one stream paced at ``idle_rate_bps``, in seconds.

        Why a paced probe and not TCP connect time: an iperf3 server takes every connection to
        its port as a test, so a bare connect makes it log an error, and a ``-s -1`` server exits
        on it. A single stream at 1 Mbit/s in 8 KiB writes for 2 s builds no queue on any path
        worth probing, so the kernel's smoothed RTT (tcp_info, which iperf3 samples) stays near
        the path's idle RTT; taking the minimum over the samples discards those a delayed ACK
        inflated. It costs one short test on the server, run before the real probes, never
        beside them. Returns None when the kernel reported no RTT.
        """
        target = parse_destination(dest)
        extra = [
            "--streams", "1", "--duration", str(self.idle_duration_s), "--omit", "0",
            "--bandwidth-bps", str(self.idle_rate_bps), "--blksize", "8192",
        ]  # fmt: skip
        result = _parse(self._run_worker(target, extra, deadline_s), target)
        return result.rtt_min_s

    def _run_worker(self, target: Destination, extra: list[str], deadline_s: float) -> str:
        if not (math.isfinite(deadline_s) and deadline_s > 0):
            raise ValueError(f"deadline_s must be > 0, got {deadline_s!r}")
        argv = [
            self.python, "-m", "probes.iperf_worker",
            "--host", target.host, "--port", str(target.port),
            # libiperf gives up connecting on its own before the hard kill, with a clearer error.
            "--connect-timeout-ms", str(max(1, int(deadline_s * 1000 * 0.8))),
            # Should this process die without killing the worker, the worker still ends itself.
            "--deadline-s", str(math.ceil(deadline_s) + 1),
            # The worker dies with this process (PR_SET_PDEATHSIG), and exits at once if it is already gone.
            "--parent-pid", str(os.getpid()),
            *extra,
        ]  # fmt: skip
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PROJECT_ROOT, env.get("PYTHONPATH")) if p)
        with self._lock:
            if self._cancelled:
                raise ProbeError(f"iperf3 probe to {target} not started: the driver was cancelled")
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=env,
                    start_new_session=True,  # a Ctrl-C in the terminal reaches us, and we kill it
                )
            except OSError as exc:
                raise ProbeError(f"cannot start the iperf3 worker ({self.python}): {exc}") from exc
            self._running.add(proc)
        try:
            self.last_worker_pid = proc.pid
            out, err = proc.communicate(timeout=deadline_s)
        except subprocess.TimeoutExpired as exc:
            _kill(proc)
            raise ProbeDeadlineExceeded(
                f"iperf3 probe to {target} did not finish within its {deadline_s:g} s deadline and was stopped"
            ) from exc
        except BaseException:
            _kill(proc)
            raise
        finally:
            with self._lock:
                self._running.discard(proc)
        if self._cancelled:
            raise ProbeError(f"iperf3 probe to {target} stopped: the driver was cancelled")
        if proc.returncode != 0:
            detail = err.decode("utf-8", errors="replace").strip().splitlines()
            reason = detail[-1] if detail else f"exit status {proc.returncode}"
            raise ProbeError(f"iperf3 probe to {target} failed in its worker: {reason}")
        return out.decode("utf-8", errors="replace")


def _check_control(name: str | None) -> None:
    if name is not None and not is_control_name(name):
        raise ValueError(f"congestion_control must be a kernel congestion control's name (lowercase letters, "
                         f"digits, underscore, at most 15 characters) or None, got {name!r}")


# How long a server that libiperf read "busy" from is watched for what it sends to a new connection.
BUSY_CHECK_WAIT_S = 0.5
# What a busy iperf3 server sends to a new connection before closing it: ACCESS_DENIED, one byte.
_ACCESS_DENIED = b"\xff"


def _parse(text: str, target: Destination) -> ProbeResult:
    """The probe's result; a "busy" answer from something that is not an iperf3 server is said to be that."""
    try:
        return parse_iperf_json(text, str(target))
    except ServerBusy as exc:
        # libiperf reads any first byte 0xff as ACCESS_DENIED; a busy iperf3 server sends that one byte
        # and closes, so a server that sends anything else to a new connection is something else.
        greeting = _greeting(target, BUSY_CHECK_WAIT_S)
        if greeting and greeting != _ACCESS_DENIED:
            raise ProbeError(f"{target} is not an iperf3 server: it answers a new connection with "
                             f"{greeting[:16]!r} (check the destination's host and port)") from exc
        raise


def _greeting(target: Destination, wait_s: float) -> bytes | None:
    """What the server at ``target`` sends to a new connection, unasked, up to 64 bytes or until it closes
    within ``wait_s`` (empty: it sent nothing, e.g. an idle iperf3 server waiting for a client); None when
    it cannot be reached."""
    received = b""
    try:
        with socket.create_connection((target.host, target.port), timeout=wait_s) as conn:
            conn.settimeout(wait_s)
            while len(received) < 64:
                chunk = conn.recv(64 - len(received))
                if not chunk:
                    break
                received += chunk
    except (TimeoutError, socket.timeout):
        return received
    except OSError:
        return None
    return received


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """Kill the worker and reap it, so no process and no pipe outlives the call."""
    proc.kill()
    proc.communicate()
