"""Curves stored before records were kept are computed again, as curves are written now.

Migration 0004 held each old curve to its running maximum over whole stream counts, but the advice
holds a fit's impact over its 0.01 search grid (advisor.tame.held_impact), where an impact can rise
between two whole counts above both (a knee just below its plateau's end): there the schedulers' view
and GET /v1/advice disagreed. Only the program can evaluate a fit on that grid, so this migration
rebuilds each current fit without a record (stored before migration 0006) and writes its curve again.
"""

from __future__ import annotations

import json

from advisor.db import Tx


def upgrade(tx: Tx) -> None:
    from advisor.fitcodec import fit_from_legacy_record
    from advisor.store import write_curve
    from advisor.tame import stored_curve

    rows = tx.execute("SELECT id, model, params_json, regime, probe_streams_json, warnings_json, n_max "
                      "FROM current_fits WHERE record_json IS NULL").fetchall()
    for fit_id, model, params, regime, probe_streams, warnings, n_max in rows:
        fitted = fit_from_legacy_record(model, json.loads(params), regime, json.loads(probe_streams),
                                        json.loads(warnings))
        tx.execute("DELETE FROM curve_points WHERE fit_id = ?", (fit_id,))
        write_curve(tx, fit_id, stored_curve(fitted, n_max))
