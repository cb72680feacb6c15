-- A predicted impact never falls as streams are added (advisor.tame.held_impact): curves stored
-- before held a fit's own impact, which could dip (a knee's fell to 0 at its plateau's end) and
-- made `max(streams) ... WHERE impact_bound <= B` disagree with GET /v1/advice. Hold each stored
-- curve to its running maximum over the stream counts, as curves are now written.
UPDATE curve_points SET
    impact = (SELECT max(c2.impact) FROM curve_points c2
              WHERE c2.fit_id = curve_points.fit_id AND c2.streams <= curve_points.streams),
    impact_bound = (SELECT max(c2.impact_bound) FROM curve_points c2
                    WHERE c2.fit_id = curve_points.fit_id AND c2.streams <= curve_points.streams);
