-- Indexes retention (advisor/retention.py) prunes by: whether a fit rests on a run, each
-- destination's newest observations by id, and each destination's finished jobs by time.
CREATE INDEX fits_probe_run ON fits (probe_run_id);
CREATE INDEX observations_destination_id ON observations (destination_id, id);
CREATE INDEX probe_jobs_dest_finished ON probe_jobs (dest, finished_at);
