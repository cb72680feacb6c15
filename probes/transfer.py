"""A data transfer, stood in for by iperf3 clients run at once: the process side of `tame transfer`.

iperf3 gives all the streams of one client one congestion control (-C), so a transfer that mixes controls
(standard streams beside a tame one) runs one client per control, each to its own server port, started
together. Every client is an argument list with a deadline; all of them are killed and reaped when the
deadline passes, when one fails (the others would run on alone), or on any exception in the caller,
KeyboardInterrupt included; each also dies with this process (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import math
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Sequence

from probes.errors import ProbeDeadlineExceeded, TransferCancelled, TransferFailed
from probes.iperf_parse import parse_iperf_json
from probes.lifetime import signal_on_parent_death
from probes.result import ProbeResult

# How long a client may take to connect, and to finish beyond its nominal duration, seconds.
CONNECT_TIMEOUT_S = 10.0
_POLL_S = 0.05


@dataclass(frozen=True)
class ClientSpec:
    """One iperf3 client of a transfer: ``streams`` streams of ``congestion_control`` to ``port``, moving
    ``bytes`` bytes in all (None: for the transfer's duration)."""

    port: int
    streams: int
    congestion_control: str
    bytes: int | None = None


@dataclass(frozen=True)
class TransferResult:
    """What each client measured (``results``, in the order of the specs) and the transfer's totals: the
    receiver's rate summed over the clients (bits/s), the longest client's duration (s), and each stream's
    rate (bits/s), retransmitted segments and congestion control as iperf3 reported them, client after
    client (the rates and retransmissions empty unless every client reported them for every stream)."""

    specs: tuple[ClientSpec, ...]
    results: tuple[ProbeResult, ...]

    @property
    def throughput_bps(self) -> float:
        return sum(r.throughput_bps for r in self.results)

    @property
    def duration_s(self) -> float:
        return max(r.duration_s for r in self.results)

    @property
    def streams(self) -> int:
        return sum(s.streams for s in self.specs)

    @property
    def stream_bps(self) -> tuple[float, ...]:
        if any(len(r.stream_bps) != s.streams for s, r in zip(self.specs, self.results)):
            return ()
        return tuple(bps for r in self.results for bps in r.stream_bps)

    @property
    def stream_retransmits(self) -> tuple[int, ...]:
        if not self.stream_bps or any(len(r.stream_retransmits) != s.streams for s, r in zip(self.specs, self.results)):
            return ()
        return tuple(n for r in self.results for n in r.stream_retransmits)

    @property
    def stream_congestion_controls(self) -> tuple[str, ...]:
        return tuple(r.congestion_control for s, r in zip(self.specs, self.results) for _ in range(s.streams))


def client_argv(address: str, spec: ClientSpec, duration_s: float | None) -> list[str]:
    """The iperf3 client's argument list (JSON output; whole seconds, as iperf3 takes them)."""
    argv = ["iperf3", "-c", address, "-p", str(spec.port), "-P", str(spec.streams), "-C", spec.congestion_control,
            "-J", "--connect-timeout", str(int(CONNECT_TIMEOUT_S * 1000))]
    if spec.bytes is not None:
        return argv + ["-n", str(spec.bytes)]
    return argv + ["-t", str(math.ceil(duration_s))]


def run_transfer(address: str, specs: Sequence[ClientSpec], duration_s: float | None,
                 deadline_s: float, prefix: Sequence[str] = (),
                 cancel: threading.Event | None = None) -> TransferResult:
    """Run the clients at once to ``address`` and return what they measured; nothing outlives the call.

    ``duration_s`` is the length of the clients without ``bytes``; ``deadline_s`` the wall-clock budget of
    the whole transfer from the call. ``prefix`` runs each client through a command that must exec it in
    the same process (e.g. ``ip netns exec NS``: the client runs on that namespace's host). Setting
    ``cancel`` stops the clients (TransferCancelled), for a caller in another thread. Raises
    ProbeDeadlineExceeded past the deadline, TransferFailed (or the ProbeError iperf3's error names, e.g.
    NothingListening) when a client fails."""
    if not specs:
        raise ValueError("a transfer needs at least one client")
    if not (math.isfinite(deadline_s) and deadline_s > 0):
        raise ValueError(f"deadline_s must be > 0, got {deadline_s!r}")
    argvs = [[*prefix, *client_argv(address, spec, duration_s)] for spec in specs]
    outputs = [tempfile.TemporaryFile() for _ in specs]
    procs: list[subprocess.Popen] = []
    try:
        for argv, out in zip(argvs, outputs):
            try:
                procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                              start_new_session=True, preexec_fn=signal_on_parent_death))
            except OSError as exc:
                raise TransferFailed(f"cannot start {argv[0]} ({exc.strerror})"
                                     + ("; run 'make deps'" if argv[0] == "iperf3" else "")) from exc
        failed = _wait_all(procs, specs, address, deadline_s, cancel)
        texts = []
        for out in outputs:
            out.seek(0)
            texts.append(out.read().decode("utf-8", errors="replace"))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for out in outputs:
            out.close()
    if failed is not None:  # its error, not the others' (killed because of it, their output is cut short)
        where = f"{address} port {specs[failed].port}"
        parse_iperf_json(texts[failed], where)
        raise TransferFailed(f"iperf3 to {where} exited with status {procs[failed].returncode}")
    results = []
    for spec, proc, text in zip(specs, procs, texts):
        where = f"{address} port {spec.port}"
        result = parse_iperf_json(text, where)
        if proc.returncode != 0:
            raise TransferFailed(f"iperf3 to {where} exited with status {proc.returncode}")
        if result.congestion_control != spec.congestion_control:
            raise TransferFailed(f"iperf3 to {where} asked for {spec.congestion_control} and ran "
                                 f"{result.congestion_control or 'an unreported control'}")
        results.append(result)
    return TransferResult(tuple(specs), tuple(results))


def _wait_all(procs: list[subprocess.Popen], specs: Sequence[ClientSpec], address: str,
              deadline_s: float, cancel: threading.Event | None) -> int | None:
    """Until every client has exited (None) or one failed (its index; the caller kills the rest); raises
    ProbeDeadlineExceeded when the deadline passes first."""
    deadline = time.monotonic() + deadline_s
    while True:
        codes = [proc.poll() for proc in procs]
        failed = [i for i, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            return failed[0]
        if all(code is not None for code in codes):
            return None
        if cancel is not None and cancel.is_set():
            raise TransferCancelled(f"the transfer to {address} was cancelled and stopped")
        if time.monotonic() > deadline:
            running = [str(s.port) for s, code in zip(specs, codes) if code is None]
            raise ProbeDeadlineExceeded(f"the transfer to {address} did not finish within {deadline_s:g} s "
                                        f"(port(s) {', '.join(running)} still running) and was stopped")
        time.sleep(_POLL_S)
