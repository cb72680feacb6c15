-- Each fit as its own class writes it (models.parallel.ParallelFit.to_record: its form, the record's
-- version and typed fields), so reading it back needs no guessing from which params exist. NULL for fits
-- stored before: those are read back by advisor.fitcodec.fit_from_legacy_record.
ALTER TABLE fits ADD COLUMN record_json TEXT;

-- PostgreSQL expands f.* when a view is created: make both views again so current_fits has the column.
DROP VIEW current_advice;
DROP VIEW current_fits;
CREATE VIEW current_fits AS
SELECT d.dest, f.*
FROM destinations d
JOIN fits f ON f.id = (SELECT max(f2.id) FROM fits f2 WHERE f2.destination_id = d.id);
CREATE VIEW current_advice AS
SELECT cf.dest, cf.id AS fit_id, cf.model, cf.regime, cf.fitted_at, cf.probed_at,
       c.streams, c.throughput_bps, c.impact, c.impact_bound
FROM current_fits cf
JOIN curve_points c ON c.fit_id = cf.id
WHERE c.advisable = 1;
