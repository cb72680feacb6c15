-- The congestion control a probe's streams ran under is part of the advice (a BBR stream takes far
-- more from CUBIC cross traffic than a CUBIC stream does): runs, fits, jobs and observations record it,
-- and fits and advice are per (destination, congestion_control). NULL: not recorded (rows stored
-- before); the service answers its default control's queries from them until a probe under that
-- control is stored (advisor/service.py).
ALTER TABLE probe_runs ADD COLUMN congestion_control TEXT;
ALTER TABLE fits ADD COLUMN congestion_control TEXT;
ALTER TABLE probe_jobs ADD COLUMN congestion_control TEXT;
ALTER TABLE observations ADD COLUMN congestion_control TEXT;

CREATE INDEX fits_destination_control ON fits (destination_id, congestion_control, id);
CREATE INDEX probe_runs_destination_control ON probe_runs (destination_id, congestion_control, id);

-- Never two probes of one destination under one control at once (queued or running); two controls'
-- probes of one destination never run together either, as they go to one address (probe_jobs.address).
DROP INDEX probe_jobs_one_active_per_dest;
CREATE UNIQUE INDEX probe_jobs_one_active_per_dest_control ON probe_jobs (dest, coalesce(congestion_control, ''))
    WHERE status IN ('queued', 'running');

-- The newest fit of each destination under each control (NULL, not recorded, is a group of its own).
-- What a scheduler reads with plain SQL: the number of streams for a budget B under control CC is
--   SELECT coalesce(max(streams), 1) FROM current_advice
--   WHERE dest = 'host:5201' AND congestion_control = 'cubic' AND impact_bound <= B;
-- (the same num_flows as GET /v1/advice?dest=host:5201&max_impact=B&cc=cubic). Advice stored before
-- controls were recorded reads WHERE congestion_control IS NULL.
DROP VIEW current_advice;
DROP VIEW current_fits;
CREATE VIEW current_fits AS
SELECT d.dest, f.*
FROM destinations d
JOIN fits f ON f.destination_id = d.id
WHERE f.id = (SELECT max(f2.id) FROM fits f2
              WHERE f2.destination_id = d.id
                AND (f2.congestion_control = f.congestion_control
                     OR (f2.congestion_control IS NULL AND f.congestion_control IS NULL)));
CREATE VIEW current_advice AS
SELECT cf.dest, cf.congestion_control, cf.id AS fit_id, cf.model, cf.regime, cf.fitted_at, cf.probed_at,
       c.streams, c.throughput_bps, c.impact, c.impact_bound
FROM current_fits cf
JOIN curve_points c ON c.fit_id = cf.id
WHERE c.advisable = 1;
