-- The congestion controls each link holds probe runs or observations under (NULL, not recorded, is not one): a write
-- under a control the link does not hold yet is refused once it holds advisor.limits.MAX_LINK_CONTROLS. Without it a
-- site's token could push a run or an observation under each of any number of made-up names, every one kept as a
-- current fit, a refit window and an advice alternative (a hunt stored 3,000 on one link; one advice read then took
-- 4.8 s). Filled from what the links hold now.
CREATE TABLE link_controls (
    destination_id BIGINT NOT NULL REFERENCES destinations (id),
    congestion_control TEXT NOT NULL,
    PRIMARY KEY (destination_id, congestion_control)
);
INSERT INTO link_controls (destination_id, congestion_control)
SELECT destination_id, congestion_control FROM probe_runs WHERE congestion_control IS NOT NULL
UNION
SELECT destination_id, congestion_control FROM observations WHERE congestion_control IS NOT NULL;
