"""Processes that must not outlive the one that started them."""

from __future__ import annotations

import ctypes
import signal
import sys

_PR_SET_PDEATHSIG = 1


def signal_on_parent_death(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent (the thread that started it) exits.

    Linux only (prctl PR_SET_PDEATHSIG); elsewhere it does nothing. Meant for a child's first act, or as
    a ``preexec_fn``. OSError if the kernel refuses.
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
