-- Where a retention pass stopped going through a table in key order (advisor/retention.py), per step: the next pass,
-- of this replica or another one on the same store, goes on after it. No row: from the first. The controls step
-- keeps the last (link id, control) of link_controls it went through; the link may be gone since, as a key the
-- position still orders.
CREATE TABLE prune_positions (
    step TEXT PRIMARY KEY,
    destination_id BIGINT NOT NULL,
    congestion_control TEXT NOT NULL
);
