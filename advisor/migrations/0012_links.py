"""Advice per link: a (source site, destination) pair, not a destination alone.

The same destination seen from two sites has two bottlenecks, so each row of ``destinations`` becomes a
link: it gains ``src`` (the site the probes and transfers ran from), and (src, dest) is unique instead of
dest. Probe runs, fits, observations and curves keep pointing at their row, so they carry their link.
Probe jobs gain ``src`` (the site whose agent must run them). Every existing row is a link from the site
this process speaks for (TAME_SITE, else "local": advisor.settings.default_site), the one that probed it:
nothing is lost. The schedulers' view ``current_advice`` gains ``src``.
"""

from __future__ import annotations

import os

from advisor.db import Tx

VIEWS = (
    # The newest fit of each link under each control (NULL, not recorded, is a group of its own).
    """CREATE VIEW current_fits AS
SELECT d.src, d.dest, f.*
FROM destinations d
JOIN fits f ON f.destination_id = d.id
WHERE f.id = (SELECT max(f2.id) FROM fits f2
              WHERE f2.destination_id = d.id
                AND (f2.congestion_control = f.congestion_control
                     OR (f2.congestion_control IS NULL AND f.congestion_control IS NULL)))""",
    # What a scheduler reads with plain SQL: the number of streams from site S to D for a budget B under
    # control CC is
    #   SELECT coalesce(max(streams), 1) FROM current_advice
    #   WHERE src = 'S' AND dest = 'host:5201' AND congestion_control = 'cubic' AND impact_bound <= B;
    # (the same num_flows as GET /v1/advice?src=S&dest=host:5201&max_impact=B&cc=cubic).
    """CREATE VIEW current_advice AS
SELECT cf.src, cf.dest, cf.congestion_control, cf.id AS fit_id, cf.model, cf.regime, cf.fitted_at, cf.probed_at,
       c.streams, c.throughput_bps, c.impact, c.impact_bound
FROM current_fits cf
JOIN curve_points c ON c.fit_id = cf.id
WHERE c.advisable = 1""",
)


def upgrade(tx: Tx) -> None:
    from advisor.settings import default_site

    site = default_site(os.environ)
    tx.execute("DROP VIEW current_advice")
    tx.execute("DROP VIEW current_fits")
    if tx.dialect == "sqlite":
        # SQLite cannot drop a column's UNIQUE: the table is made again with the same ids, foreign keys off
        # (advisor.db.Database.migrate), so the rows pointing at it point at the new one.
        tx.execute("CREATE TABLE destinations_new (id INTEGER PRIMARY KEY AUTOINCREMENT, src TEXT NOT NULL, "
                   "dest TEXT NOT NULL, host TEXT NOT NULL, port INTEGER NOT NULL, "
                   "created_at DOUBLE PRECISION NOT NULL, UNIQUE (src, dest))")
        tx.execute("INSERT INTO destinations_new (id, src, dest, host, port, created_at) "
                   "SELECT id, ?, dest, host, port, created_at FROM destinations ORDER BY id", (site,))
        tx.execute("DROP TABLE destinations")
        tx.execute("ALTER TABLE destinations_new RENAME TO destinations")
    else:
        tx.execute("ALTER TABLE destinations ADD COLUMN src TEXT")
        tx.execute("UPDATE destinations SET src = ?", (site,))
        tx.execute("ALTER TABLE destinations ALTER COLUMN src SET NOT NULL")
        tx.execute("ALTER TABLE destinations DROP CONSTRAINT destinations_dest_key")
        tx.execute("ALTER TABLE destinations ADD CONSTRAINT destinations_src_dest_key UNIQUE (src, dest)")
    tx.execute("ALTER TABLE probe_jobs ADD COLUMN src TEXT")
    tx.execute("UPDATE probe_jobs SET src = ?", (site,))
    # Never two probes of one link under one control at once (queued or running).
    tx.execute("DROP INDEX probe_jobs_one_active_per_dest_control")
    tx.execute("CREATE UNIQUE INDEX probe_jobs_one_active_per_link_control ON probe_jobs "
               "(src, dest, coalesce(congestion_control, '')) WHERE status IN ('queued', 'running')")
    for view in VIEWS:
        tx.execute(view)
