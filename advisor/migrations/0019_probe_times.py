"""Each probe run keeps when its probes ended (probe_runs.probed_at), not only when the store took it.

A run an agent held back (measured_ago_s) was dated by its probes in its fit, but an observation's refit on that
run read the run's finished_at (when it reached the store): a run measured 30 h ago and refitted by one transfer
became probed now, and the link was no longer due for a probe. A run stored before this takes its own fit's
probed_at (what the service dated its probes by), else its finished_at.
"""

from __future__ import annotations

from advisor.db import Tx


def upgrade(tx: Tx) -> None:
    tx.execute("ALTER TABLE probe_runs ADD COLUMN probed_at DOUBLE PRECISION")
    tx.execute("UPDATE probe_runs SET probed_at = coalesce((SELECT min(f.probed_at) FROM fits f "
               "WHERE f.probe_run_id = probe_runs.id), finished_at)")
