-- Each stream's rate and retransmitted segments over a probe's window (JSON arrays, same order),
-- so that a stored run refits with the evidence 'auto' reads from them: whether the drops were
-- random (models.evidence.loss_dispersion). NULL for runs stored before, or drivers without them.
ALTER TABLE probe_results ADD COLUMN stream_bps TEXT;
ALTER TABLE probe_results ADD COLUMN stream_retransmits TEXT;
