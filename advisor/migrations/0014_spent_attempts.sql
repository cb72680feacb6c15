-- Probe-seconds spent by attempts whose lease lapsed (their agent died or went silent): the job goes back to the
-- queue and its next claim starts it again, so its own row no longer says what the lapsed attempt may have sent.
-- Written by advisor.store.Store.recover_jobs as it re-queues the job, counted in the site's hourly budget by
-- advisor.sites (from started_at, over the window) and pruned by advisor.retention once older than the window.
CREATE TABLE spent_attempts (
    id {{ID}},
    src TEXT NOT NULL,
    job_id TEXT NOT NULL,
    started_at DOUBLE PRECISION NOT NULL,
    seconds DOUBLE PRECISION NOT NULL
);
CREATE INDEX spent_attempts_src_started ON spent_attempts (src, started_at);
