"""The curves the store keeps (curve_points), equal to what the service computes from each current fit.

The schedulers' view (current_advice) reads a fit's stored curve; the API and `tame advise` compute the advice from
the fit's record. They agree only while the stored curve is :func:`advisor.tame.stored_curve` of the fit as the
service rebuilds it, so each fit records the :data:`advisor.tame.CURVE_VERSION` its curve was written under, and a
store opened by a program with a newer version writes its current fits' older curves again, a batch of fits a
transaction (migration 0009 did it once; this does it for 0018, 0019 and every later change of the curve's computation).
"""

from __future__ import annotations

import json
import logging
from typing import Any, Callable, Mapping, Sequence

from advisor.advice import CurvePoint
from advisor.db import Database, Tx
from advisor.fitcodec import fit_from_stored
from advisor.locks import MIGRATION_LOCK
from advisor.tame import CURVE_VERSION, stored_curve

Curve = Sequence[tuple[CurvePoint, bool]]
log = logging.getLogger("tame")
# Current fits whose curves one start-up transaction writes again.
REBUILD_BATCH = 100
# Current fits whose curve was written under an older version than this program's, or none recorded (stored before
# migration 0018, or by a program older than it). A newer program's curves are left alone: an older replica
# beside it must not write them back.
_OUTDATED = "curve_version IS NULL OR curve_version < ?"


def curve_of(record: Mapping[str, Any], n_max: int) -> list[tuple[CurvePoint, bool]]:
    """The curve the store keeps of the fit whose record (advisor.fitcodec.fit_to_record's form) is ``record``: the
    one the advice reads, of the fit rebuilt from that record."""
    return stored_curve(fit_from_stored(**record), n_max)


def write_curve(tx: Tx, fit_id: int, curve: Curve, halfway: Callable[[], None] | None = None) -> None:
    """Store a fit's curve, (point, advisable) for n = 1 .. n_max, in its curve_points rows: two statements of many
    rows each (a statement a row made rebuilding many curves slow), ``halfway`` called between them."""
    middle = len(curve) // 2
    for index, part in enumerate((curve[:middle], curve[middle:])):
        if index == 1 and halfway is not None:
            halfway()
        if not part:
            continue
        values = [v for point, advisable in part for v in
                  (fit_id, point.streams, point.throughput_bps, point.impact, point.impact_bound, 1 if advisable else 0)]
        tx.execute("INSERT INTO curve_points (fit_id, streams, throughput_bps, impact, impact_bound, advisable) "
                   "VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?)"] * len(part)), values)


def rebuild_curves(tx: Tx, limit: int) -> int:
    """Write again, in ``tx``, the curves of at most ``limit`` of the current fits stored under an older
    CURVE_VERSION or none, from their records, and mark them with this one. Returns how many were written."""
    rows = tx.execute("SELECT id, model, params_json, regime, probe_streams_json, warnings_json, record_json, n_max "
                      f"FROM current_fits WHERE {_OUTDATED} ORDER BY id LIMIT ?", (CURVE_VERSION, limit)).fetchall()
    for fit_id, model, params_json, regime, probe_streams, warnings, record, n_max in rows:
        curve = curve_of({"model": model, "params": json.loads(params_json), "regime": regime,
                          "probe_streams": json.loads(probe_streams), "warnings": json.loads(warnings),
                          "fit": json.loads(record) if record else None}, n_max)
        tx.execute("DELETE FROM curve_points WHERE fit_id = ?", (fit_id,))
        write_curve(tx, fit_id, curve)
        tx.execute("UPDATE fits SET curve_version = ? WHERE id = ?", (CURVE_VERSION, fit_id))
    return len(rows)


def rebuild_outdated_curves(db: Database, batch: int = REBUILD_BATCH) -> int:
    """At start-up, after the migrations: :func:`rebuild_curves` for the current fits written under an older
    CURVE_VERSION or none, ``batch`` fits a transaction (one read when there are none). Returns how many curves were
    written. Each fit's curve is written whole in one transaction, so a crash leaves the rest outdated for the next
    start; a short transaction holds no other writer back for long."""
    with db.transaction() as tx:
        if tx.execute(f"SELECT 1 FROM current_fits WHERE {_OUTDATED} LIMIT 1", (CURVE_VERSION,)).fetchone() is None:
            return 0
    written = 0
    while True:
        with db.transaction(write=True) as tx:
            if tx.dialect == "postgresql":
                tx.execute(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})")
            done = rebuild_curves(tx, batch)
        written += done
        if done:
            log.info("curves of %d current fits written again under curve version %d", written, CURVE_VERSION)
        # Fewer than a batch: none was left (a fit an older replica stores meanwhile waits for the next start).
        if done < batch:
            return written
