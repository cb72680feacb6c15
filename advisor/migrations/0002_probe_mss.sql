-- The segment size of each probe, so that a stored run can be refitted with the evidence the
-- 'auto' model reads (retransmissions per segment against the Mathis rate).
ALTER TABLE probe_results ADD COLUMN mss_bytes INTEGER;
