"""Start-up wiring shared by `tame serve` and `tame agent`: settings, store and the default probe driver."""

from __future__ import annotations

import logging
import sys

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


def open_store(settings: Settings) -> Store:
    try:
        return Store.open(settings.database_url, pool_size=settings.db_pool_size)
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
