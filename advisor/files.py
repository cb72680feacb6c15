"""Reading a small file a user or another process named, whole: only a regular file, only up to a cap, never
waiting on a FIFO or reading a device without end."""

from __future__ import annotations

import os
import stat
from typing import Callable


class NotARegularFile(Exception):
    """The path names a FIFO, a device, a directory or a socket (a symlink is followed), not a regular file."""


class FileTooLarge(Exception):
    """The file holds more bytes than its reader's cap."""


def read_capped(path: str | os.PathLike, max_bytes: int,
                check: Callable[[os.stat_result], None] | None = None) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes``: NotARegularFile, FileTooLarge, or OSError
    when it cannot be opened or read. ``check`` sees the file's stat before it is read, and may raise."""
    # Opened first and checked by its descriptor, so what is checked is what is read; O_NONBLOCK: a FIFO is
    # refused below instead of holding the reader until something writes to it.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotARegularFile(os.fspath(path))
        if check is not None:
            check(info)
        chunks, size = [], 0
        while size <= max_bytes and (chunk := os.read(fd, max_bytes + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            raise FileTooLarge(os.fspath(path))
        return b"".join(chunks)
    finally:
        os.close(fd)
