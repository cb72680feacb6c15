-- A queued probe may re-use the adaptive probe of the link's last probing instead of measuring that level again
-- (advisor.store.Store.choose_reuse): the job keeps the probe it re-uses (probe_results.id; NULL: the whole plan),
-- and its run keeps a copy of that probe whose reused_from names the original (NULL: measured in this run), so the
-- next probe of the link measures the whole plan again.
ALTER TABLE probe_jobs ADD COLUMN reuse_probe_id BIGINT;
ALTER TABLE probe_results ADD COLUMN reused_from BIGINT;
