"""The NFQUEUE delay line (``delayline.c``): compiled at first use into a cache directory.

The kernel has no netem, so the test bed delays packets in user space: the
router queues them with the iptables NFQUEUE target and this program holds each
verdict for a fixed delay (microseconds on its command line).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from probes.netns import TestbedCommandFailed, run

SOURCE = Path(__file__).with_name("delayline.c")
COMPILE_TIMEOUT_S = 60.0


def cache_dir() -> Path:
    """Where compiled helpers live: $TAMEPARALLEL_CACHE, else $XDG_CACHE_HOME/tameparallel, else ~/.cache/tameparallel."""
    if os.environ.get("TAMEPARALLEL_CACHE"):
        return Path(os.environ["TAMEPARALLEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tameparallel"


def binary() -> Path:
    """Path of the compiled delay line, compiling it first if the source changed or it is missing."""
    source = SOURCE.read_bytes()
    # Keyed by the source hash, so an edited delayline.c is never served by a stale binary.
    target = cache_dir() / f"delayline-{hashlib.sha256(source).hexdigest()[:16]}"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".delayline-", dir=target.parent)
    os.close(fd)
    try:
        try:
            run(
                ["gcc", "-O2", "-Wall", "-o", tmp, str(SOURCE), "-lnetfilter_queue", "-lnfnetlink"],
                timeout_s=COMPILE_TIMEOUT_S,
            )
        except TestbedCommandFailed as exc:
            raise TestbedCommandFailed(
                f"cannot compile the delay line (needs gcc and libnetfilter-queue-dev; run 'make deps'): {exc}"
            ) from exc
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)  # atomic: concurrent first uses never run a half-written binary
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
