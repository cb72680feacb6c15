-- What a transfer reports beside its total (POST /v1/observations, `tame transfer`): each stream's rate
-- (bits/s), retransmitted segments and congestion control name (JSON arrays, same order; NULL when not
-- given), how many of its streams ran the tame congestion control and at which fractional multiplier,
-- the TCP-equivalent streams it opened (n*) and how long it ran (s). Only observations with
-- tame_streams = 0 (and no fractional multiplier) feed the refit (advisor/observations.py says why).
ALTER TABLE observations ADD COLUMN stream_bps TEXT;
ALTER TABLE observations ADD COLUMN stream_retransmits TEXT;
ALTER TABLE observations ADD COLUMN stream_congestion_controls TEXT;
ALTER TABLE observations ADD COLUMN tame_streams INTEGER NOT NULL DEFAULT 0;
ALTER TABLE observations ADD COLUMN fractional_multiplier DOUBLE PRECISION;
ALTER TABLE observations ADD COLUMN tcp_equivalent_streams DOUBLE PRECISION;
ALTER TABLE observations ADD COLUMN duration_s DOUBLE PRECISION;
