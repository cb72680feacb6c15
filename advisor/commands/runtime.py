"""Start-up wiring shared by the long-running commands: settings, store, the default probe driver, stop signals."""

from __future__ import annotations

import logging
import signal
import sys
from contextlib import contextmanager
from typing import Callable, Iterator

from advisor.cli import UsageError
from advisor.errors import ConfigError, StoreError
from advisor.settings import Settings
from advisor.store import Store

log = logging.getLogger("tame")


def load_settings() -> Settings:
    try:
        return Settings.from_env()
    except ConfigError as exc:
        raise UsageError(str(exc)) from exc


def open_store(settings: Settings, create: bool = True) -> Store:
    """The store of TAME_DATABASE_URL; ``create``: make a SQLite store that is not there (a command that only reads
    it says there is none instead, exit 2)."""
    try:
        return Store.open(settings.database_url, pool_size=settings.db_pool_size, create=create)
    except StoreError as exc:
        raise UsageError(str(exc)) from exc


def default_driver():
    """probes.iperf.IperfDriver when the probe layer provides it, else None (probes stay queued)."""
    try:
        from probes.iperf import IperfDriver
    except ImportError:
        print("tame: no probe driver available (probes.iperf is missing): probes will stay queued",
              file=sys.stderr)
        return None
    return IperfDriver()


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")


# A plain kill (SIGTERM: systemctl stop, docker stop) and a hang-up (SIGHUP: the terminal or SSH session went).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextmanager
def on_stop_signals(handler: Callable[[int, object], None],
                    signums: tuple[signal.Signals, ...] = STOP_SIGNALS) -> Iterator[None]:
    """``handler(signum, frame)`` runs on ``signums`` while inside, then the previous handlers are back; a signal the
    caller set to be ignored (nohup) stays ignored."""
    previous = {signum: signal.signal(signum, handler) for signum in signums
                if signal.getsignal(signum) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
