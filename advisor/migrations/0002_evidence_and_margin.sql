-- The segment size of each probe, so that a stored run can be refitted with the evidence the
-- 'auto' model reads (retransmissions per segment against the Reno rate, Padhye's).
ALTER TABLE probe_results ADD COLUMN mss_bytes INTEGER;

-- The predicted impact raised by the advisor's margin for the prediction's error
-- (advisor.tame.ImpactMargin): the number TameParallelTCP compares with the budget.
ALTER TABLE curve_points ADD COLUMN impact_bound DOUBLE PRECISION;
UPDATE curve_points SET impact_bound = impact;

-- What a scheduler reads with plain SQL: the advisable curve of each destination's newest fit.
-- The number of streams for a budget B is
--   SELECT coalesce(max(streams), 1) FROM current_advice WHERE dest = 'host:5201' AND impact_bound <= B;
-- (the same num_flows as GET /v1/advice), and its predicted throughput and impact are
-- throughput_bps and impact of that row.
DROP VIEW current_advice;
CREATE VIEW current_advice AS
SELECT cf.dest, cf.id AS fit_id, cf.model, cf.regime, cf.fitted_at, cf.probed_at,
       c.streams, c.throughput_bps, c.impact, c.impact_bound
FROM current_fits cf
JOIN curve_points c ON c.fit_id = cf.id
WHERE c.advisable = 1;
