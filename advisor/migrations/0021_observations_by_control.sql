-- Releasing a link's congestion control (advisor/retention.py) asks, for each (link, control) of link_controls,
-- whether an observation under it was made since a cut-off, and deletes a released one's observations: one seek
-- here, where (destination_id, observed_at) read every recent observation of the link under all its controls (up
-- to TAME_KEEP_OBSERVATIONS each). Its fits and runs are found by fits_destination_control and
-- probe_runs_destination_control (migration 0011), a handful per link.
CREATE INDEX observations_destination_control ON observations (destination_id, congestion_control, observed_at);
