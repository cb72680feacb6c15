"""The PostgreSQL advisory lock keys the advice store's transactions take, all in one place so no two uses share one
by mistake. Each is held to the end of its transaction (pg_advisory_xact_lock, pg_try_advisory_xact_lock); SQLite
needs none of them, as it runs one write transaction at a time.

A key alone (one bigint) and a pair of keys (two int4s) are different locks, so LINK_COUNT_LOCK's pairs never meet
MIGRATION_LOCK."""

# Migrations, and the start-up rebuild of outdated curves after them (advisor.db.Database.migrate,
# advisor.curves.rebuild_outdated_curves): processes starting at once on one store apply each migration and write
# each curve once.
MIGRATION_LOCK = 7315
# The link count, one per site (the pair: this key and hashtext(site)): two transactions adding a site's last allowed
# link must not both count one less than the cap and insert (advisor.links.Links.check_new_link).
LINK_COUNT_LOCK = 7316
# Every claim of a probe job (this service's worker and the sites' agents, advisor.jobs.lock_claims): a claim checks
# that no probe of the job's destination runs, from any site, and marks the job running; two claims at once from
# different sites would both see the destination idle.
CLAIM_LOCK = 7317
# Each batch of a retention pass (advisor.retention.prune), taken without waiting: one replica prunes at a time, and
# a replica that finds it taken ends its pass.
PRUNE_LOCK = 7318
# The site count, taken after the new site's LINK_COUNT_LOCK pair (advisor.links.Links.check_new_site): two
# transactions making the last allowed site must not both count one less than the cap.
SITE_COUNT_LOCK = 7319
