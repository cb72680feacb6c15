-- When a site's latest claim was refused for its budget (probes, streams or probe-seconds in use; NULL: its latest
-- claim was not): such a site could not take a destination now, so it does not hold other sites' turn at one
-- (advisor.sites._TURN_WAITS) until a claim of its own is granted again.
ALTER TABLE sites ADD COLUMN budget_refused_at DOUBLE PRECISION;
