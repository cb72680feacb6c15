-- Who set a site's budget (the owner the registering agent gave; NULL: none given, or set before this was kept)
-- and when (NULL: set before this was kept). A registration with another budget from another agent is refused
-- while the site's agents are alive (advisor.sites.register_site).
ALTER TABLE sites ADD COLUMN budget_set_by TEXT;
ALTER TABLE sites ADD COLUMN budget_set_at DOUBLE PRECISION;
