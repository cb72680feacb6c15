"""Running commands for the namespace test bed: argv lists only, every call with a deadline (seconds).

This is the one seam through which the test bed touches the system; it maps
subprocess failures to :class:`TestbedError` subclasses.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Sequence

DEFAULT_TIMEOUT_S = 10.0


class TestbedError(Exception):
    """Base class: the test bed could not be built, inspected or removed."""

    __test__ = False  # not a pytest test class despite the name


class TestbedCommandFailed(TestbedError):
    """A system command (ip, tc, nft, iptables, ethtool, gcc) failed or passed its deadline."""


class TestbedExists(TestbedError):
    """A test bed with that name (or namespaces with its names) already exists."""


class TestbedNotOwned(TestbedError):
    """The named test bed, or one of its namespaces, was not created by this tool; nothing was touched."""


def exec_in(ns: str, argv: Sequence[str]) -> list[str]:
    """``argv`` prefixed so that it runs inside network namespace ``ns``."""
    return ["ip", "netns", "exec", ns, *argv]


def run(argv: Sequence[str], timeout_s: float = DEFAULT_TIMEOUT_S, input_text: str | None = None) -> str:
    """Run ``argv`` to completion within ``timeout_s`` seconds and return its stdout; raise on failure."""
    argv = list(argv)
    try:
        done = subprocess.run(
            argv, input=input_text, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise TestbedCommandFailed(f"{' '.join(argv)}: no answer within {timeout_s:g} s") from exc
    except OSError as exc:
        raise TestbedCommandFailed(f"{argv[0]}: cannot run ({exc.strerror}); run 'make deps'") from exc
    if done.returncode != 0:
        raise TestbedCommandFailed(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def netns_inode(ns: str) -> int | None:
    """Inode of the named network namespace (identifies it across renames and re-creations), or None."""
    try:
        return os.stat(f"/run/netns/{ns}").st_ino
    except FileNotFoundError:
        return None


def netns_pids(ns: str) -> list[int]:
    """Process ids running inside namespace ``ns``."""
    out = run(["ip", "netns", "pids", ns])
    return [int(tok) for tok in out.split()]


def process_start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (field 22 of /proc/PID/stat), or None if gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name may contain spaces and parentheses; the fields after the last ')' are fixed.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def stop_process(pid: int, start_ticks: int | None, grace_s: float = 2.0) -> None:
    """Terminate ``pid`` if it is still the process that started at ``start_ticks``; SIGKILL after ``grace_s``."""
    if start_ticks is None or process_start_ticks(pid) != start_ticks:
        return  # never seen alive, gone, or the pid now belongs to someone else: not ours to signal
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, grace_s)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            _reap(pid)
            if process_start_ticks(pid) is None:
                return
            time.sleep(0.02)
    raise TestbedCommandFailed(f"process {pid} did not exit after SIGKILL")


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
