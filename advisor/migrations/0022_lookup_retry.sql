-- A probe job whose destination's name lookup did not finish as it was to start (advisor.errors.LookupUnfinished: the
-- name slow to resolve, or the lookups all busy) goes back to the queue, the attempt not counted, and is not claimed
-- again before retry_at (Unix seconds; NULL: whenever its turn comes). lookup_waits counts those hand-backs: each
-- waits twice as long as the one before, and the last fails the job (advisor.store.Store.defer_attempt).
ALTER TABLE probe_jobs ADD COLUMN retry_at DOUBLE PRECISION;
ALTER TABLE probe_jobs ADD COLUMN lookup_waits INTEGER NOT NULL DEFAULT 0;
