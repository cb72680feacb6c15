-- The advice store, version 1. Same schema on SQLite and PostgreSQL: {{ID}} becomes the
-- dialect's auto-increment primary key. Times are Unix seconds (UTC); throughputs bits/s;
-- impacts fractions 0-1; *_json columns hold JSON text.

-- One row per probe target, keyed "host:port" (IPv6 as "[addr]:port").
CREATE TABLE destinations (
    id {{ID}},
    dest TEXT NOT NULL UNIQUE,
    host TEXT NOT NULL,
    port INTEGER NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
);

-- Probe requests and their life cycle: queued -> running -> done | failed.
-- A running job has an owner (host:pid:nonce) and a lease; a job whose owner died is
-- re-queued (attempts counts tries) so a killed agent never leaves a job running forever.
CREATE TABLE probe_jobs (
    id TEXT PRIMARY KEY,
    dest TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('queued', 'running', 'done', 'failed')),
    levels_json TEXT NOT NULL,
    duration_s DOUBLE PRECISION NOT NULL,
    requested_at DOUBLE PRECISION NOT NULL,
    started_at DOUBLE PRECISION,
    finished_at DOUBLE PRECISION,
    progress DOUBLE PRECISION NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    owner TEXT,
    lease_until DOUBLE PRECISION,
    error TEXT,
    probe_run_id BIGINT
);
-- Never two probes of one destination at once (queued or running).
CREATE UNIQUE INDEX probe_jobs_one_active_per_dest ON probe_jobs (dest) WHERE status IN ('queued', 'running');
CREATE INDEX probe_jobs_status ON probe_jobs (status, requested_at);

-- One completed run of a probe plan; written in the same transaction as its fit.
CREATE TABLE probe_runs (
    id {{ID}},
    destination_id BIGINT NOT NULL REFERENCES destinations (id),
    job_id TEXT,
    source TEXT NOT NULL,
    idle_rtt_s DOUBLE PRECISION,
    started_at DOUBLE PRECISION NOT NULL,
    finished_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX probe_runs_destination ON probe_runs (destination_id, id);

-- Each probe of a run (one stream count), with the driver's raw output kept.
CREATE TABLE probe_results (
    id {{ID}},
    probe_run_id BIGINT NOT NULL REFERENCES probe_runs (id),
    streams INTEGER NOT NULL,
    throughput_bps DOUBLE PRECISION NOT NULL,
    sender_bps DOUBLE PRECISION,
    retransmits INTEGER,
    rtt_mean_s DOUBLE PRECISION,
    duration_s DOUBLE PRECISION,
    omit_s DOUBLE PRECISION,
    throughput_stderr_bps DOUBLE PRECISION,
    started_at DOUBLE PRECISION,
    raw TEXT
);
CREATE INDEX probe_results_run ON probe_results (probe_run_id);

-- Throughput reported by finished transfers (POST /v1/observations).
CREATE TABLE observations (
    id {{ID}},
    destination_id BIGINT NOT NULL REFERENCES destinations (id),
    streams INTEGER NOT NULL,
    throughput_bps DOUBLE PRECISION NOT NULL,
    observed_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX observations_destination ON observations (destination_id, observed_at);

-- A fitted model. params_json: the model's coefficients ({"a_prime": .., "b_prime": ..} in
-- (s/bit)^2); the advice for any budget is recomputed from (model, params, regime,
-- probe_streams). probed_at is when the probes behind it ran: freshness (stale) is judged by it.
CREATE TABLE fits (
    id {{ID}},
    destination_id BIGINT NOT NULL REFERENCES destinations (id),
    probe_run_id BIGINT REFERENCES probe_runs (id),
    model TEXT NOT NULL,
    params_json TEXT NOT NULL,
    regime TEXT NOT NULL,
    warnings_json TEXT NOT NULL,
    probe_streams_json TEXT NOT NULL,
    probes_json TEXT NOT NULL,
    observations_used INTEGER NOT NULL DEFAULT 0,
    idle_rtt_s DOUBLE PRECISION,
    n_max INTEGER NOT NULL,
    fitted_at DOUBLE PRECISION NOT NULL,
    probed_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX fits_destination ON fits (destination_id, id);

-- The predicted curve of a fit for n = 1 .. n_max. advisable = 1 for the n TameParallelTCP may
-- choose (not past the predicted throughput peak, nor past the highest probe when no congestion
-- was seen).
CREATE TABLE curve_points (
    fit_id BIGINT NOT NULL REFERENCES fits (id),
    streams INTEGER NOT NULL,
    throughput_bps DOUBLE PRECISION NOT NULL,
    impact DOUBLE PRECISION NOT NULL,
    advisable INTEGER NOT NULL,
    PRIMARY KEY (fit_id, streams)
);

-- The newest fit of each destination.
CREATE VIEW current_fits AS
SELECT d.dest, f.*
FROM destinations d
JOIN fits f ON f.id = (SELECT max(f2.id) FROM fits f2 WHERE f2.destination_id = d.id);

-- What a scheduler reads with plain SQL: the advisable curve of each destination's newest fit.
-- The number of streams for a budget B is
--   SELECT coalesce(max(streams), 1) FROM current_advice WHERE dest = 'host:5201' AND impact <= B;
-- (the same num_flows as GET /v1/advice), and its predicted throughput is throughput_bps of that row.
CREATE VIEW current_advice AS
SELECT cf.dest, cf.id AS fit_id, cf.model, cf.regime, cf.fitted_at, cf.probed_at,
       c.streams, c.throughput_bps, c.impact
FROM current_fits cf
JOIN curve_points c ON c.fit_id = cf.id
WHERE c.advisable = 1;
