-- The address a run's probes went to: the worker resolves the destination once, checks that
-- address against the allow-list and probes exactly it. NULL for runs stored before, and for
-- runs pushed by an agent (POST /v1/probe-runs), whose address the service never saw.
ALTER TABLE probe_runs ADD COLUMN address TEXT;

-- The address a job resolved to when it last ran: never two running probes to one address
-- (two names or spellings of one host), and a queued job whose address is busy waits.
ALTER TABLE probe_jobs ADD COLUMN address TEXT;

-- Where a running job is in its plan (JSON: phase, level, index, of, attempt, elapsed_s,
-- expected_s), written every few seconds beside the progress fraction.
ALTER TABLE probe_jobs ADD COLUMN progress_detail TEXT;
