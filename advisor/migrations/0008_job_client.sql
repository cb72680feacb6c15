-- Who asked for a probe job (the API's remote address; NULL for the service's own re-probes and the
-- agent's), so that no one client can fill the queue (TAME_MAX_QUEUED_PROBES_PER_CLIENT).
ALTER TABLE probe_jobs ADD COLUMN client TEXT;
CREATE INDEX probe_jobs_client ON probe_jobs (client, status);
