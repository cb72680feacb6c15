"""Every current fit's curve is written again from its record, and each fit records the curve's version.

The schedulers' view reads stored curves; the advice is computed from the fit. Migration 0009 wrote again only the
curves of fits stored before records (0006), but curves written by later programs went out of date too when the
curve's computation changed (impacts at or below advisor.tame.NO_IMPACT are rounding and get no margin): a store
written at schemas 6 to 8 gave 1 stream in the view where the API gave 8. Each fit now records the
advisor.tame.CURVE_VERSION its curve was computed under (NULL: not known), and a program whose version is newer
writes the current fits' curves again when it opens the store (advisor.curves), after this migration.
"""

from __future__ import annotations

import importlib

from advisor.db import Tx


def upgrade(tx: Tx) -> None:
    tx.execute("ALTER TABLE fits ADD COLUMN curve_version INTEGER")
    # PostgreSQL expands f.* when a view is made: both views are made again so current_fits has the column.
    tx.execute("DROP VIEW current_advice")
    tx.execute("DROP VIEW current_fits")
    for view in importlib.import_module("advisor.migrations.0012_links").VIEWS:
        tx.execute(view)
    # Every curve_version is NULL now: Store.open writes the current fits' curves again after the migrations, a batch
    # a transaction, so this one (which locks fits) stays short.
