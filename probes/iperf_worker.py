"""One iperf3 client run through the Python bindings, in a process of its own.

Run as ``python -m probes.iperf_worker --host H --port P --streams N --duration S --omit S
[--congestion-control NAME] [--connect-timeout-ms MS] [--bandwidth-bps BPS] [--blksize BYTES]
[--deadline-s S] [--parent-pid PID]``. It writes libiperf's JSON text (a result, or libiperf's own
``{"error": …}`` document; a host that does not resolve is reported the same way, as
``{"error": "unable to resolve host …"}``) to its original standard output and exits 0. It exits
3 with a message on stderr when the bindings themselves fail, and ends itself by SIGALRM at
``--deadline-s``. With ``--parent-pid`` (Linux) it dies with the thread of that process that
started it: it asks for SIGKILL on its parent's death first thing, then exits at once (status 4)
if its parent is no longer that process, having died before the request was made.

Two defects of the bindings (PyPI ``iperf3`` 0.1.11) are owned here rather than worked around
by callers:

* ``Client.run`` points fd 1 at an ``os.pipe()`` that it reads only after ``iperf_run_client``
  returns (with libiperf 3.1x, not at all), and libiperf writes the whole JSON document to fd 1
  at the end of the test. Past the pipe's 64 KiB (about 16 streams x 10 s of per-interval data)
  the write blocks and the run never returns. The worker swaps the write end of that pipe for an
  unlinked temporary file, so libiperf writes without limit, and reads the file afterwards.
* A ``Client`` cannot be reused and its ``__del__`` closes descriptors by number, which may by
  then belong to a later client; fd 1 is process-wide. One process per probe avoids both.

The bindings also have no congestion-control setter and no way to ask for the server's output;
libiperf's ``iperf_set_test_congestion_control`` and ``iperf_set_test_get_server_output`` are
called through ctypes with their argtypes declared.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import math
import os
import signal
import socket
import sys
import tempfile

from probes.lifetime import signal_on_parent_death

EXIT_BINDINGS_FAILED = 3
EXIT_ORPHANED = 4


def die_with_parent(parent_pid: int) -> bool:
    """Ask the kernel to SIGKILL this process when its parent exits; False if the parent is already gone.

    The request is checked against ``parent_pid`` after it is made, so a parent that died before
    it (this process then has another parent) is caught too.
    """
    signal_on_parent_death(signal.SIGKILL)
    return os.getppid() == parent_pid


def _control_name(text: str) -> str:
    from probes.controls import is_control_name

    if not is_control_name(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a congestion control's name")
    return text


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m probes.iperf_worker")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--streams", type=int, required=True)
    parser.add_argument("--duration", type=int, required=True, help="measured seconds after --omit")
    parser.add_argument("--omit", type=int, default=0, help="warm-up seconds left out of the result")
    parser.add_argument("--congestion-control", default=None, type=_control_name,
                        help="the sender's congestion control, any the kernel offers (iperf3 -C)")
    parser.add_argument("--connect-timeout-ms", type=int, default=None)
    parser.add_argument("--bandwidth-bps", type=int, default=0, help="pace each stream (0: unlimited)")
    parser.add_argument("--blksize", type=int, default=0, help="bytes per write (0: libiperf's default)")
    parser.add_argument("--deadline-s", type=float, default=None,
                        help="the worker ends itself (SIGALRM) this many seconds after it starts")
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="die with this process (the one that starts the worker)")
    return parser.parse_args(argv)


def run_client(args: argparse.Namespace) -> str:
    """Run one client test and return the JSON text libiperf wrote."""
    import iperf3  # imported here so `--help` and argument errors need no libiperf

    client = iperf3.Client()
    client.server_hostname = args.host
    client.port = args.port
    client.protocol = "tcp"
    client.num_streams = args.streams
    client.duration = args.duration
    client.omit = args.omit
    client.verbose = False
    if args.bandwidth_bps:
        client.bandwidth = args.bandwidth_bps
    if args.blksize:
        client.blksize = args.blksize
    lib = client.lib
    if args.congestion_control:
        lib.iperf_set_test_congestion_control.argtypes = (ctypes.c_void_p, ctypes.c_char_p)
        lib.iperf_set_test_congestion_control.restype = None
        # libiperf 3.12 strdup()s the name; the bytes object is kept alive across the call anyway.
        name = args.congestion_control.encode("ascii")
        lib.iperf_set_test_congestion_control(client._test, name)
    # The server's own per-interval report: the receiver's series, which the settle rule reads
    # (the sender's swings with its send buffer on a full link). Any iperf3 3.x server sends it.
    lib.iperf_set_test_get_server_output.argtypes = (ctypes.c_void_p, ctypes.c_int)
    lib.iperf_set_test_get_server_output.restype = None
    lib.iperf_set_test_get_server_output(client._test, 1)
    if args.connect_timeout_ms:
        lib.iperf_set_test_connect_timeout.argtypes = (ctypes.c_void_p, ctypes.c_int)
        lib.iperf_set_test_connect_timeout.restype = None
        lib.iperf_set_test_connect_timeout(client._test, args.connect_timeout_ms)

    with tempfile.TemporaryFile() as sink:
        # Defect (a): replace the bindings' pipe with a file, which never blocks a writer.
        os.close(client._pipe_in)
        client._pipe_in = os.dup(sink.fileno())
        try:
            fallback = client.run().text
        except ValueError:
            # TestResult could not parse what libiperf produced; the file still holds it.
            fallback = ""
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.fflush(None)  # libiperf writes through stdio; make sure the buffer reached the file
        sink.seek(0)
        text = sink.read().decode("utf-8", errors="replace")
    return text if text.strip() else fallback


def resolution_error(host: str, port: int) -> str | None:
    """libiperf's ``{"error": …}`` document for a host that does not resolve, else None.

    libiperf 3.12 reports a failed getaddrinfo() as "unable to connect to server: " followed by
    whatever errno held (often "Inappropriate ioctl for device"), which cannot be told apart
    from other failures; resolving first gives the error a name.
    """
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return json.dumps({"error": f"unable to resolve host {host}: {exc.strerror}"})
    return None


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    if args.parent_pid is not None and not die_with_parent(args.parent_pid):
        print(f"parent process {args.parent_pid} is gone; not probing", file=sys.stderr)
        return EXIT_ORPHANED
    if args.deadline_s:
        # The parent kills the worker at its deadline; this covers a parent that died first
        # (SIGKILL, OOM): SIGALRM's default action ends the process, libiperf or not.
        signal.alarm(max(1, math.ceil(args.deadline_s)))
    # The bindings take fd 1 over during the run; results leave through a private copy of it.
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    try:
        text = resolution_error(args.host, args.port) or run_client(args)
    except Exception as exc:  # the process boundary: report, never hang or dump a traceback
        print(f"iperf3 bindings failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_BINDINGS_FAILED
    if not text.strip():
        print("libiperf produced no output", file=sys.stderr)
        return EXIT_BINDINGS_FAILED
    out.write(text)
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
