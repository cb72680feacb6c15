-- Sites an agent probes from (tame agent --site NAME --server URL), each with its probe budget: probes at once,
-- streams at once, probe-seconds in any hour. Registering again (PUT /v1/sites/NAME) replaces the budget.
CREATE TABLE sites (
    name TEXT PRIMARY KEY,
    max_probes INTEGER NOT NULL,
    max_streams INTEGER NOT NULL,
    probe_seconds_per_hour DOUBLE PRECISION NOT NULL,
    registered_at DOUBLE PRECISION NOT NULL,
    last_seen_at DOUBLE PRECISION NOT NULL
);

-- What a running job holds of its site's budget while it runs: its most streams at once and its longest
-- possible run (seconds; a finished job counts what it took, finished_at - started_at).
ALTER TABLE probe_jobs ADD COLUMN streams_reserved INTEGER;
ALTER TABLE probe_jobs ADD COLUMN seconds_reserved DOUBLE PRECISION;
CREATE INDEX probe_jobs_site_status ON probe_jobs (src, status, requested_at);
