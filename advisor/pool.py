"""A bounded pool of database connections, shared by every thread of one process.

Connections are opened on demand in the thread that asks, so an error opening one reaches that caller at once, as
the driver raised it, and reused newest first. However many threads come and go (anyio retires idle worker
threads and starts new ones for the next burst), at most ``size`` connections are open.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Generic, TypeVar

from advisor.errors import StoreError

C = TypeVar("C")


class ConnectionPool(Generic[C]):
    """At most ``size`` connections made by ``connect``; a caller finding all of them in use waits up to ``wait_s``
    seconds for one, then gets StoreError."""

    def __init__(self, connect: Callable[[], C], close: Callable[[C], None], size: int, wait_s: float,
                 alive: Callable[[C], bool] = lambda conn: True):
        if size < 1:
            raise ValueError(f"size must be at least 1, not {size}")
        self._connect = connect
        self._close = close
        self._alive = alive  # whether an idle connection can still be used, told without a round trip
        self.size = size
        self.wait_s = wait_s
        self._idle: list[C] = []  # open and not in use; the newest last
        self._open = 0  # idle, in use, or being opened: never above size
        self._closed = False
        self._changed = threading.Condition(threading.Lock())

    @property
    def open_count(self) -> int:
        """Connections open now (idle, in use or being opened)."""
        with self._changed:
            return self._open

    def acquire(self) -> C:
        """An idle connection, else a new one while fewer than ``size`` are open, else the first one released."""
        deadline = time.monotonic() + self.wait_s
        dead: list[C] = []  # idle connections the server closed (a restart, an idle timeout): closed, not handed out
        try:
            with self._changed:
                # What is free is taken before the deadline is looked at: a waiter woken as its wait timed out may
                # have been handed the notice of a release, which no other waiter then gets.
                while True:
                    if self._closed:
                        raise StoreError("the advice store is closed")
                    while self._idle:
                        conn = self._idle.pop()
                        if self._alive(conn):
                            return conn
                        dead.append(conn)
                        self._open -= 1
                    if self._open < self.size:
                        self._open += 1
                        break
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise StoreError(f"advice store unavailable: all {self.size} of its connections stayed in "
                                         f"use for {self.wait_s:g} s (TAME_DB_POOL_SIZE)")
                    self._changed.wait(remaining)
        finally:
            for conn in dead:
                self._discard(conn)
        try:
            return self._connect()
        except BaseException:
            self._forget()
            raise

    def release(self, conn: C, broken: bool = False) -> None:
        """Give back a connection ``acquire`` returned; a broken one, or any after close(), is closed instead."""
        with self._changed:
            keep = not broken and not self._closed
            if keep:
                self._idle.append(conn)
                self._changed.notify()
        if not keep:
            self._discard(conn)
            self._forget()

    def close(self) -> None:
        """Close the idle connections now and those in use when they are released; acquire() fails from now on."""
        with self._changed:
            self._closed = True
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            self._changed.notify_all()
        for conn in idle:
            self._discard(conn)

    def _forget(self) -> None:
        with self._changed:
            self._open -= 1
            self._changed.notify()

    def _discard(self, conn: C) -> None:
        try:
            self._close(conn)
        except Exception:  # closing a broken connection may fail too; it is gone either way
            pass
