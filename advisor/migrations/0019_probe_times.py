"""Each probe run keeps when its probes ended (probe_runs.probed_at), and a link's current fit is the one on the
newest probes, not the newest stored.

A run an agent held back (measured_ago_s) was dated by its probes in its fit, but an observation's refit on that
run read the run's finished_at (when it reached the store): a run measured 30 h ago and refitted by one transfer
became probed now, and the link was no longer due for a probe. A run stored before this takes its own fit's
probed_at (what the service dated its probes by), else its finished_at.

A run delivered late (from an agent's spool) replaced newer advice with older probes, since the current fit was the
highest id: current_fits now takes, per link and control, the fit with the newest probed_at (the highest id among
equals: a refit on the same run), and an observation refits on the run with the newest probes.
"""

from __future__ import annotations

import importlib

from advisor.db import Tx

# Per link and control (NULL, not recorded, is a group of its own), the fit on the newest probes; of fits on the same
# probes, the newest stored.
CURRENT_FITS = """CREATE VIEW current_fits AS
SELECT d.src, d.dest, f.*
FROM destinations d
JOIN fits f ON f.destination_id = d.id
WHERE f.id = (SELECT f2.id FROM fits f2
              WHERE f2.destination_id = d.id
                AND (f2.congestion_control = f.congestion_control
                     OR (f2.congestion_control IS NULL AND f.congestion_control IS NULL))
              ORDER BY f2.probed_at DESC, f2.id DESC LIMIT 1)"""


# The run a refit (fits row) was made on, as refits were dated before this: same link and control, and the refit's
# probed_at is the run's finished_at.
_BASE_RUN = ("r.destination_id = fits.destination_id AND r.finished_at = fits.probed_at AND "
             "(r.congestion_control = fits.congestion_control OR "
             "(r.congestion_control IS NULL AND fits.congestion_control IS NULL))")


def upgrade(tx: Tx) -> None:
    tx.execute("ALTER TABLE probe_runs ADD COLUMN probed_at DOUBLE PRECISION")
    tx.execute("UPDATE probe_runs SET probed_at = coalesce((SELECT min(f.probed_at) FROM fits f "
               "WHERE f.probe_run_id = probe_runs.id), finished_at)")
    # A refit stored before this was dated by its run's finished_at: it takes the run's probed_at too, or the
    # link's next refit (dated by probed_at, earlier) would be older than it and never become current.
    tx.execute(f"UPDATE fits SET probed_at = (SELECT r.probed_at FROM probe_runs r WHERE {_BASE_RUN} "
               f"ORDER BY r.id DESC LIMIT 1) WHERE probe_run_id IS NULL AND observations_used > 0 "
               f"AND EXISTS (SELECT 1 FROM probe_runs r WHERE {_BASE_RUN})")
    tx.execute("CREATE INDEX fits_destination_probed ON fits (destination_id, probed_at, id)")
    tx.execute("DROP VIEW current_advice")
    tx.execute("DROP VIEW current_fits")
    tx.execute(CURRENT_FITS)
    tx.execute(importlib.import_module("advisor.migrations.0012_links").VIEWS[1])  # current_advice, as it was
    # A fit current now that was not at 0018 (newer probes, stored earlier) may hold an older curve: its curve_version
    # says so, and Store.open writes it again after the migrations (advisor.curves).
