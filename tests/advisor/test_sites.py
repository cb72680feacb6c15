"""Sites and claims (advisor/sites.py) on SQLite and PostgreSQL: a site's budget (probes, streams, probe-seconds
an hour) is never exceeded, no job is claimed twice even by many agents at once, a lease that runs out hands
the job to another agent of the site, and one site's claims never take another's jobs."""

import pytest

import advisor.db
from advisor.destinations import parse_destination
from advisor.errors import BudgetConflict, InvalidRequest
from advisor.sites import (BUDGET_HOLD_S, SiteBudget, SiteUse, claim_job, holds, register_site, site_budget,
                           site_use)
from advisor.store import Store
from tests.api.conftest import Clock
from tests.together import run_together

DESTS = [parse_destination(f"127.0.0.{i}:5201") for i in range(1, 11)]


def worst(job):
    return 100.0


def queue(store, site, dests=DESTS, levels=(1, 10)):
    for dest in dests:
        store.enqueue_job(dest, list(levels), 30.0, src=site)
        store.clock.advance(0.001)  # queued in this order


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/s.sqlite3"
    else:
        url = request.getfixturevalue("pg_url")
    clock = Clock()
    store = Store.open(url, clock=clock)
    yield store
    store.close()


def test_a_site_s_probes_at_once_are_held_to_its_budget(store):
    register_site(store, "a", SiteBudget(max_probes=2, max_streams=64, probe_seconds_per_hour=3600), DESTS)
    queue(store, "a")
    first = claim_job(store, "a", "agent-1", max_streams=16, adaptive=True, worst_case_s=worst)
    second = claim_job(store, "a", "agent-2", max_streams=16, adaptive=True, worst_case_s=worst)
    third = claim_job(store, "a", "agent-1", max_streams=16, adaptive=True, worst_case_s=worst)
    assert first.job is not None and second.job is not None and first.job.id != second.job.id
    assert third.job is None and "2 probe(s) of a running, at most 2" in third.waiting
    # Oldest first, each capped at the agent's 16 streams (above the job's highest level, 10).
    assert (first.job.dest, second.job.dest) == (DESTS[0].key, DESTS[1].key)
    assert first.streams == 16 and first.lease_until == store.clock() + 100.0 + 15.0
    assert site_use(store, "a").probes == 2 and site_use(store, "a").streams == 32


def test_streams_at_once_are_held_to_the_budget(store):
    register_site(store, "a", SiteBudget(max_probes=2, max_streams=24, probe_seconds_per_hour=36000), DESTS, "x")
    queue(store, "a")
    claims = [claim_job(store, "a", "x", max_streams=16, adaptive=True, worst_case_s=worst) for _ in range(2)]
    # An adaptive probe may open its share of the budget (24 / 2 probes), never less than its highest level (10).
    assert [c.streams for c in claims] == [12, 12]
    # The agent that set the budget changes it (another agent could not while the site's probes run).
    register_site(store, "a", SiteBudget(max_probes=3, max_streams=24, probe_seconds_per_hour=36000), DESTS, "x")
    third = claim_job(store, "a", "x", max_streams=16, adaptive=True, worst_case_s=worst)
    assert third.job is None and "24 of a's 24 streams are probing; the next probe needs 10" in third.waiting
    assert site_use(store, "a").streams == 24


def test_a_probe_without_an_adaptive_level_holds_its_highest_level(store):
    register_site(store, "a", SiteBudget(max_probes=4, max_streams=25, probe_seconds_per_hour=36000), DESTS)
    queue(store, "a")
    claims = [claim_job(store, "a", "x", max_streams=64, adaptive=False, worst_case_s=worst) for _ in range(3)]
    assert [c.streams for c in claims[:2]] == [10, 10] and claims[2].job is None
    assert site_use(store, "a").streams == 20


def test_probe_seconds_in_an_hour_are_held_to_the_budget(store):
    register_site(store, "a", SiteBudget(max_probes=8, max_streams=1000, probe_seconds_per_hour=250), DESTS)
    queue(store, "a")
    claimed = [claim_job(store, "a", "x", max_streams=10, adaptive=True, worst_case_s=worst) for _ in range(3)]
    assert [c.job is not None for c in claimed] == [True, True, False]
    assert "200 of a's 250 probe-seconds" in claimed[2].waiting
    # A finished probe counts what it took; an hour later it no longer counts.
    store.record_run(parse_destination(claimed[0].job.dest), src="a", source="push", idle_rtt_s=None, results=[],
                     started_at=store.clock(), fit=None, job_id=claimed[0].job.id)
    assert claim_job(store, "a", "x", max_streams=10, adaptive=True, worst_case_s=worst).job is not None  # 0 + 100 + 100 s
    store.clock.advance(3601)
    store.recover_jobs(3)  # the running ones' leases ran out: back in the queue
    assert site_use(store, "a").seconds == 0
    assert claim_job(store, "a", "x", max_streams=10, adaptive=True, worst_case_s=worst).job is not None


def test_a_lapsed_lease_goes_to_another_agent_of_the_site(store):
    register_site(store, "a", SiteBudget(max_probes=1), DESTS[:1])
    queue(store, "a", DESTS[:1])
    first = claim_job(store, "a", "agent-gone", max_streams=64, adaptive=True, worst_case_s=worst)
    assert holds(store, first.job.id, "agent-gone", "a", DESTS[0].key)
    assert claim_job(store, "a", "agent-2", max_streams=64, adaptive=True, worst_case_s=worst).job is None
    store.clock.advance(116)  # past 100 s + 15 s of slack
    assert store.recover_jobs(3, owner_is_dead=lambda owner: False) == 1
    second = claim_job(store, "a", "agent-2", max_streams=64, adaptive=True, worst_case_s=worst)
    assert second.job.id == first.job.id and second.job.attempts == 2
    assert not holds(store, first.job.id, "agent-gone", "a", DESTS[0].key)
    assert holds(store, first.job.id, "agent-2", "a", DESTS[0].key)
    assert not holds(store, first.job.id, "agent-2", "b", DESTS[0].key)


def _claim(store, site):
    return claim_job(store, site, f"agent-{site}", max_streams=64, adaptive=True, worst_case_s=worst)


def _finish(store, claim):
    store.record_run(parse_destination(claim.job.dest), src=claim.job.src, source="push", idle_rtt_s=None, results=[],
                     started_at=store.clock(), fit=None, job_id=claim.job.id)


def test_sites_never_take_each_other_s_jobs(store):
    register_site(store, "a", SiteBudget(max_probes=4), DESTS[:2])
    register_site(store, "b", SiteBudget(max_probes=4), DESTS[:2])
    queue(store, "a", DESTS[:2])
    claims = [_claim(store, "b") for _ in range(2)]
    assert all(c.job is None and c.waiting == "no queued probe" for c in claims)
    queue(store, "b", DESTS[2:3])
    got = _claim(store, "b")
    assert (got.job.src, got.job.dest) == ("b", DESTS[2].key)
    assert site_use(store, "a").probes == 0


def test_sites_take_turns_at_a_destination_they_share(store):
    for site in ("a", "b"):
        register_site(store, site, SiteBudget(max_probes=4), DESTS[:1])
    queue(store, "a", DESTS[:1])
    queue(store, "b", DESTS[:1])
    # Neither probed it yet: the one queued first goes first, and b's waits, told why.
    waiting = _claim(store, "b")
    assert waiting.job is None and "1 queued probe(s) of b wait" in waiting.waiting
    first = _claim(store, "a")
    assert first.job.src == "a"
    assert _claim(store, "b").job is None  # the destination is being probed
    _finish(store, first)
    # a probed it last and queues it again at once; b's turn comes first all the same.
    queue(store, "a", DESTS[:1])
    assert _claim(store, "a").job is None
    second = _claim(store, "b")
    assert second.job.src == "b"
    # An agent of a that claims and never finishes holds the destination one lease at a time: when it lapses, b
    # (whose turn is now older) goes first again.
    _finish(store, second)
    queue(store, "b", DESTS[:1])
    held = _claim(store, "a")
    assert held.job.src == "a"
    store.clock.advance(116)
    assert store.recover_jobs(3, owner_is_dead=lambda owner: False) == 1
    register_site(store, "a", SiteBudget(max_probes=4), DESTS[:1])
    register_site(store, "b", SiteBudget(max_probes=4), DESTS[:1])
    assert _claim(store, "a").job is None
    assert _claim(store, "b").job.src == "b"


def test_a_site_whose_agents_went_quiet_does_not_hold_others_turn(store):
    for site in ("a", "b"):
        register_site(store, site, SiteBudget(max_probes=4), DESTS[:1])
    queue(store, "a", DESTS[:1])
    queue(store, "b", DESTS[:1])
    assert _claim(store, "b").job is None
    store.clock.advance(BUDGET_HOLD_S + 1)  # a's agents have not been seen since; b's registers
    register_site(store, "b", SiteBudget(max_probes=4), DESTS[:1])
    assert _claim(store, "b").job.src == "b"


def test_an_unregistered_site_cannot_claim(store):
    with pytest.raises(InvalidRequest, match="not registered"):
        claim_job(store, "nowhere", "x", max_streams=64, adaptive=True, worst_case_s=worst)


@pytest.mark.parametrize("fields, named", [
    ((0, 64, 100.0), "max_probes"), ((65, 64, 100.0), "max_probes"), ((True, 64, 100.0), "max_probes"),
    ((1, 0, 100.0), "max_streams"), ((1, 2.5, 100.0), "max_streams"),
    ((1, 64, float("nan")), "probe_seconds_per_hour"), ((1, 64, 0.5), "probe_seconds_per_hour"),
    ((1, 64, "3600"), "probe_seconds_per_hour"),
])
def test_a_bad_budget_names_its_field(fields, named):
    with pytest.raises(InvalidRequest, match=named):
        SiteBudget.checked(*fields)


@pytest.mark.postgres
def test_many_agents_claiming_at_once_never_share_a_job_nor_pass_the_budget(pg_url):
    """20 agents of one site (and 10 of another) claim at once on PostgreSQL: each job is claimed once, and
    the running probes of each site never pass its budget."""
    stores = [Store.open(pg_url, clock=Clock()) for _ in range(30)]
    try:
        register_site(stores[0], "a", SiteBudget(max_probes=5, max_streams=1000, probe_seconds_per_hour=36000), DESTS)
        register_site(stores[0], "b", SiteBudget(max_probes=3, max_streams=1000, probe_seconds_per_hour=36000), DESTS)
        # Destinations of their own: on a shared one the sites take turns (test_sites_take_turns_...).
        queue(stores[0], "a", DESTS[:6])
        queue(stores[0], "b", DESTS[6:])
        sites = ["a"] * 20 + ["b"] * 10
        claims = run_together(lambda i, _: claim_job(stores[i], sites[i], f"agent-{i}", max_streams=10, adaptive=True,
                                                     worst_case_s=worst), 30)
        won = [(sites[i], c.job.id) for i, c in enumerate(claims) if c.job is not None]
        assert len(won) == len(set(won)) == 5 + 3
        assert site_use(stores[0], "a").probes == 5 and site_use(stores[0], "b").probes == 3
    finally:
        for s in stores:
            s.close()


def test_a_lapsed_attempt_s_probe_seconds_count_in_the_hour_it_started(store):
    """An agent that dies mid-probe may have sent traffic until its lease ran out: that attempt counts from its start
    to its lease's end (100 s plan + 15 s slack = 115 s), though the job goes back to the queue and its next claim
    starts it again; so agents that keep dying cannot pass the site's probe-seconds."""
    register_site(store, "a", SiteBudget(max_probes=1, max_streams=64, probe_seconds_per_hour=250), DESTS[:1])
    queue(store, "a", DESTS[:1])
    started = store.clock()
    first = claim_job(store, "a", "agent-1", max_streams=64, adaptive=True, worst_case_s=worst)
    store.clock.advance(116)
    assert store.recover_jobs(3, owner_is_dead=lambda owner: False) == 1
    assert store.job(first.job.id).status == "queued"
    assert site_use(store, "a").seconds == pytest.approx(115)
    # 115 s spent + 100 s for the next attempt fit in 250.
    second = claim_job(store, "a", "agent-2", max_streams=64, adaptive=True, worst_case_s=worst)
    assert second.job.id == first.job.id and site_use(store, "a").seconds == pytest.approx(215)
    store.clock.advance(116)
    assert store.recover_jobs(3, owner_is_dead=lambda owner: False) == 1
    assert site_use(store, "a").seconds == pytest.approx(230)
    third = claim_job(store, "a", "agent-3", max_streams=64, adaptive=True, worst_case_s=worst)
    assert third.job is None and "230 of a's 250 probe-seconds" in third.waiting
    # Each attempt leaves the window an hour after it started.
    store.clock.now = started + 3600.5
    assert site_use(store, "a").seconds == pytest.approx(115)
    assert claim_job(store, "a", "agent-3", max_streams=64, adaptive=True, worst_case_s=worst).job is not None


def test_a_job_failed_after_its_last_attempt_counts_that_attempt_to_its_lease_s_end(store):
    """The last attempt of a job given up on counts as the others do (started_at to lease_until, 115 s), not until
    whenever the lapse was noticed; the job's finished_at says when its lease ran out."""
    register_site(store, "a", SiteBudget(max_probes=1, max_streams=64, probe_seconds_per_hour=3600), DESTS[:1])
    queue(store, "a", DESTS[:1])
    first = claim_job(store, "a", "agent-1", max_streams=64, adaptive=True, worst_case_s=worst)
    store.clock.advance(116)
    store.recover_jobs(2, owner_is_dead=lambda owner: False)
    last = claim_job(store, "a", "agent-2", max_streams=64, adaptive=True, worst_case_s=worst)
    store.clock.advance(1000)  # noticed long after the lease ran out
    assert store.recover_jobs(2, owner_is_dead=lambda owner: False) == 1
    job = store.job(first.job.id)
    assert job.status == "failed" and "giving up" in job.error and job.finished_at == last.lease_until
    assert site_use(store, "a").seconds == pytest.approx(115 + 115)


def test_an_attempt_whose_owner_died_here_counts_until_it_was_found_dead(store):
    """The service's own site's worker judges its owners on this host: one found dead before its lease ran out is
    counted up to then (it sent nothing after dying)."""
    register_site(store, "a", SiteBudget(max_probes=1, max_streams=64, probe_seconds_per_hour=3600), DESTS[:1])
    queue(store, "a", DESTS[:1])
    claim_job(store, "a", "agent-1", max_streams=64, adaptive=True, worst_case_s=worst)
    store.clock.advance(40)
    assert store.recover_jobs(3, owner_is_dead=lambda owner: True) == 1
    assert site_use(store, "a").seconds == pytest.approx(40)


# -- a site's budget is the one its live agents run with ---------------------------------------------------------

BUDGET = SiteBudget(max_probes=2, max_streams=64, probe_seconds_per_hour=1800)
OTHER = SiteBudget(max_probes=4, max_streams=64, probe_seconds_per_hour=1800)


def test_another_agent_s_different_budget_is_refused_while_the_site_s_agents_are_alive(store):
    register_site(store, "a", BUDGET, DESTS[:1], owner="agent-1")
    with pytest.raises(BudgetConflict) as refused:
        register_site(store, "a", OTHER, DESTS[1:2], owner="agent-2")
    says = str(refused.value)
    for part in ("max_probes=2", "max_streams=64", "probe_seconds_per_hour=1800", "'agent-1'", "max_probes=4",
                 "same budget", "stop the other"):
        assert part in says, (part, says)
    assert site_budget(store, "a") == BUDGET
    # The same budget from any agent is fine (and keeps the site alive); an agent that gives no owner never set it.
    store.clock.advance(BUDGET_HOLD_S / 2)
    register_site(store, "a", BUDGET, DESTS[1:2], owner="agent-2")
    with pytest.raises(BudgetConflict, match="agent-1"):
        register_site(store, "a", OTHER, DESTS[:1])
    store.clock.advance(BUDGET_HOLD_S - 1)
    with pytest.raises(BudgetConflict, match=r"in 1 s"):
        register_site(store, "a", OTHER, DESTS[:1], owner="agent-3")
    # Quiet for the hold: the new budget takes over, and now holds against the old one.
    store.clock.advance(1)
    register_site(store, "a", OTHER, DESTS[:1], owner="agent-3")
    assert site_budget(store, "a") == OTHER
    with pytest.raises(BudgetConflict, match="agent-3"):
        register_site(store, "a", BUDGET, DESTS[:1], owner="agent-1")
    assert site_budget(store, "a") == OTHER


def test_the_agent_that_set_a_budget_may_change_it(store):
    register_site(store, "a", BUDGET, DESTS[:1], owner="agent-1")
    register_site(store, "a", OTHER, DESTS[:1], owner="agent-1")
    assert site_budget(store, "a") == OTHER


def test_a_budget_held_above_a_lowered_ceiling_gives_way_to_one_within_it(store):
    """The operator lowered the ceiling below the budget agent-1 set: the service refuses that budget now, so it
    holds nothing, and agent-2 with a budget within the ceiling takes over at once, while agent-1 looks alive."""
    register_site(store, "a", OTHER, DESTS[:1], owner="agent-1")
    with pytest.raises(BudgetConflict, match="agent-1"):
        register_site(store, "a", BUDGET, DESTS[:1], owner="agent-2")
    lowered = SiteBudget(2, 4096, 3600)
    register_site(store, "a", BUDGET, DESTS[:1], owner="agent-2", ceiling=lowered)
    assert site_budget(store, "a") == BUDGET
    # A budget within the ceiling holds as ever.
    with pytest.raises(BudgetConflict, match="agent-2"):
        register_site(store, "a", SiteBudget(1, 64, 1800), DESTS[:1], owner="agent-3", ceiling=lowered)


def test_a_ceiling_lowered_after_registration_holds_the_site_s_claims(store):
    """A budget stored before the operator lowered the ceiling never takes effect above it: claims are held to the
    smaller of the two, field by field, and the claim says which budget is in force."""
    register_site(store, "a", SiteBudget(max_probes=4, max_streams=64, probe_seconds_per_hour=3600), DESTS)
    queue(store, "a")
    ceiling = SiteBudget(max_probes=2, max_streams=24, probe_seconds_per_hour=250)
    claims = [claim_job(store, "a", "x", max_streams=64, adaptive=True, worst_case_s=worst, ceiling=ceiling)
              for _ in range(3)]
    # The adaptive probe's share is the ceiling's 24 streams over its 2 probes, not the site's 64 over 4.
    assert [c.streams for c in claims[:2]] == [12, 12]
    assert claims[2].job is None and "2 probe(s) of a running, at most 2" in claims[2].waiting
    assert all(c.budget == SiteBudget(2, 24, 250) for c in claims)
    # The seconds: 2 probes of 100 s hold 200 of the ceiling's 250.
    roomy = SiteBudget(max_probes=64, max_streams=4096, probe_seconds_per_hour=250)
    spent = claim_job(store, "a", "x", max_streams=10, adaptive=False, worst_case_s=worst, ceiling=roomy)
    assert spent.job is None and "200 of a's 250 probe-seconds this hour are spent" in spent.waiting
    assert spent.budget == SiteBudget(4, 64, 250)
    # Under the hard caps the stored budget is the one in force: a third probe is claimed.
    third = claim_job(store, "a", "x", max_streams=10, adaptive=False, worst_case_s=worst)
    assert third.job is not None and third.budget == SiteBudget(4, 64, 3600)
    assert site_budget(store, "a") == SiteBudget(4, 64, 3600)  # the stored budget is left as its agent set it


@pytest.mark.parametrize("before_claim_s, plan_s, after_claim_s", [
    # The claim is the sign of life: its lease (10 s + 15 s) ran out long before the hold does.
    (BUDGET_HOLD_S - 10, 10.0, BUDGET_HOLD_S - 1),
    # The probe runs under its lease long after the claim: a second before the lease (1,000 s + 15 s) runs out.
    (0.0, 1000.0, 1000.0 + 15.0 - 1),
], ids=["claimed", "running"])
def test_a_claimed_or_running_probe_keeps_the_site_s_budget_held(store, before_claim_s, plan_s, after_claim_s):
    register_site(store, "a", BUDGET, DESTS[:1], owner="agent-1")
    queue(store, "a", DESTS[:1])
    store.clock.advance(before_claim_s)
    claim_job(store, "a", "agent-1", max_streams=64, adaptive=False, worst_case_s=lambda job: plan_s)
    store.clock.advance(after_claim_s)
    with pytest.raises(BudgetConflict, match="in 1 s"):
        register_site(store, "a", OTHER, DESTS[:1], owner="agent-2")
    store.clock.advance(1)
    register_site(store, "a", OTHER, DESTS[:1], owner="agent-2")
    assert site_budget(store, "a") == OTHER


def test_a_refused_registration_stores_nothing(store):
    register_site(store, "a", BUDGET, DESTS[:1], owner="agent-1")
    with store.db.transaction() as tx:
        before = tx.execute("SELECT * FROM sites").fetchall(), tx.execute("SELECT count(*) FROM destinations").fetchone()
    store.clock.advance(5)
    with pytest.raises(BudgetConflict):
        register_site(store, "a", OTHER, DESTS[1:], owner="agent-2")
    with store.db.transaction() as tx:
        after = tx.execute("SELECT * FROM sites").fetchall(), tx.execute("SELECT count(*) FROM destinations").fetchone()
    assert after == before  # not its links, and not a sign of life either


@pytest.mark.postgres
def test_agents_registering_different_budgets_at_once_leave_one(pg_url):
    """12 agents of a new site register 12 different budgets at once on PostgreSQL: one sets it, the others are
    refused, and the site keeps the budget of the one that set it."""
    stores = [Store.open(pg_url, clock=Clock()) for _ in range(12)]

    def register(i, _):
        try:
            register_site(stores[i], "a", SiteBudget(max_probes=i + 1), DESTS[:2], owner=f"agent-{i}")
            return i
        except BudgetConflict:
            return None

    try:
        won = [i for i in run_together(register, 12) if i is not None]
        assert len(won) == 1
        assert site_budget(stores[0], "a") == SiteBudget(max_probes=won[0] + 1)
    finally:
        for s in stores:
            s.close()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_a_site_registered_before_setters_were_kept_holds_its_budget(tmp_path, request, monkeypatch, backend):
    """Migration 0015 on a store with a site registered before it: who set the budget is not known, and the budget
    is held as any other while the site's agents are alive."""
    url = f"sqlite:///{tmp_path}/s.sqlite3" if backend == "sqlite" else request.getfixturevalue("pg_url")
    clock = Clock()
    everything = advisor.db.migrations()
    monkeypatch.setattr(advisor.db, "migrations", lambda: {v: m for v, m in everything.items() if v < 15})
    old = advisor.db.Database(url)
    old.migrate()
    with old.transaction(write=True) as tx:
        tx.execute("INSERT INTO sites (name, max_probes, max_streams, probe_seconds_per_hour, registered_at, "
                   "last_seen_at) VALUES ('a', 2, 64, 1800, ?, ?)", (clock() - 100, clock() - 10))
    old.close()
    monkeypatch.setattr(advisor.db, "migrations", lambda: everything)
    store = Store(advisor.db.Database(url), clock=clock)
    try:
        assert store.db.migrate() == [v for v in sorted(everything) if v >= 15]
        with pytest.raises(BudgetConflict, match=r"max_probes=2, .* set by an agent that gave no owner, and its agents "
                                                 r"are alive \(last seen 10 s ago\)"):
            register_site(store, "a", OTHER, DESTS[:1], owner="agent-1")
        register_site(store, "a", BUDGET, DESTS[:1], owner="agent-1")
    finally:
        store.close()


# -- a queued job the budget in force could never give ---------------------------------------------------------

def test_a_budget_names_each_field_short_of_what_a_probe_needs():
    budget = SiteBudget(max_probes=1, max_streams=10, probe_seconds_per_hour=860.0)
    assert budget.shortfalls(10, 860.0) == []  # exactly what it has fits
    assert budget.shortfalls(11, 860.5) == [("max_streams", 11, 10), ("probe_seconds_per_hour", 860.5, 860.0)]
    assert budget.shortfalls(1, 861.0) == [("probe_seconds_per_hour", 861.0, 860.0)]


def test_a_job_above_the_budget_in_force_fails_saying_why_and_the_next_is_claimed(store):
    """A job needing more streams (or probe-seconds) than the site's budget could give with nothing else running
    would block the site's queue for ever: it fails, naming what limits it, and the same claim takes the job behind."""
    register_site(store, "a", SiteBudget(max_probes=2, max_streams=64, probe_seconds_per_hour=3600), DESTS)
    queue(store, "a", DESTS[:1], levels=(1, 200))
    queue(store, "a", DESTS[1:2], levels=(1, 10))
    claim = claim_job(store, "a", "x", max_streams=16, adaptive=False, worst_case_s=worst)
    assert claim.job is not None and claim.job.dest == DESTS[1].key
    with store.db.transaction() as tx:
        status, error = tx.execute("SELECT status, error FROM probe_jobs WHERE dest = ?", (DESTS[0].key,)).fetchone()
    assert status == "failed"
    assert error == ("never run: it needs 200 streams; site a's budget in force allows 64 (its agents' tame agent "
                     "--max-streams): request it with fewer streams or levels, or raise the budget")
    # The probe-seconds an hour likewise: 100 s of 3600 fits, 5000 s never does.
    queue(store, "a", DESTS[2:4])
    long = claim_job(store, "a", "x", max_streams=16, adaptive=False, ceiling=SiteBudget(2, 64, 3600),
                     worst_case_s=lambda job: 5000.0 if job.dest == DESTS[2].key else 100.0)
    assert long.job is not None and long.job.dest == DESTS[3].key
    with store.db.transaction() as tx:
        error = tx.execute("SELECT error FROM probe_jobs WHERE dest = ?", (DESTS[2].key,)).fetchone()[0]
    assert "needs 5000 probe-seconds in an hour; site a's budget in force allows 3600" in error


def test_a_job_that_waits_for_running_probes_is_not_failed(store):
    register_site(store, "a", SiteBudget(max_probes=2, max_streams=24, probe_seconds_per_hour=250), DESTS)
    queue(store, "a", DESTS[:3], levels=(1, 20))
    first = claim_job(store, "a", "x", max_streams=16, adaptive=False, worst_case_s=worst)
    streams = claim_job(store, "a", "x", max_streams=16, adaptive=False, worst_case_s=worst)
    assert first.job is not None and streams.job is None
    assert "20 of a's 24 streams are probing; the next probe needs 20" in streams.waiting
    # Streams free again, but the hour's seconds are spent: 100 of 250, and the next may take 200.
    store.clock.advance(100.0)
    store.fail_job(first.job.id, "done with")
    seconds = claim_job(store, "a", "x", max_streams=16, adaptive=False, worst_case_s=lambda job: 200.0)
    assert seconds.job is None and "the next probe may take 200" in seconds.waiting
    with store.db.transaction() as tx:
        assert tx.execute("SELECT count(*) FROM probe_jobs WHERE status = 'queued'").fetchone()[0] == 2


def test_a_lowered_ceiling_fails_a_queued_job_that_no_longer_fits(store):
    register_site(store, "a", SiteBudget(max_probes=2, max_streams=64, probe_seconds_per_hour=3600), DESTS)
    queue(store, "a", DESTS[:1], levels=(1, 48))
    queue(store, "a", DESTS[1:2], levels=(1, 10))
    lowered = SiteBudget(max_probes=2, max_streams=32, probe_seconds_per_hour=3600)
    claim = claim_job(store, "a", "x", max_streams=16, adaptive=False, worst_case_s=worst, ceiling=lowered)
    assert claim.job is not None and claim.job.dest == DESTS[1].key
    with store.db.transaction() as tx:
        status, error = tx.execute("SELECT status, error FROM probe_jobs WHERE dest = ?", (DESTS[0].key,)).fetchone()
    assert status == "failed"
    assert "needs 48 streams; site a's budget in force allows 32 (the operator's TAME_MAX_SITE_STREAMS)" in error


def test_a_registration_of_many_new_links_counts_the_site_s_links_once(tmp_path, monkeypatch):
    # Counting them again for each new link read a growing set per link: 2000 new links, some 4 million rows, all
    # under the write lock.
    statements = []
    connect = advisor.db.Database._connect

    def traced(db):
        conn = connect(db)
        conn.set_trace_callback(statements.append)
        return conn

    monkeypatch.setattr(advisor.db.Database, "_connect", traced)
    store = Store.open(f"sqlite:///{tmp_path}/s.sqlite3", clock=Clock())
    try:
        dests = [parse_destination(f"10.0.{i // 250}.{i % 250 + 1}:5201") for i in range(500)]
        statements.clear()
        assert register_site(store, "a", BUDGET, dests, max_links=500) == []
        counts = [sql for sql in statements if "count(*) FROM (SELECT dest FROM destinations" in sql]
        assert len(counts) == 1, len(counts)
        with store.db.transaction() as tx:
            assert tx.execute("SELECT count(*) FROM destinations WHERE src = 'a'").fetchone()[0] == 500
    finally:
        store.close()


def test_a_registration_past_the_link_cap_makes_links_up_to_it_and_refuses_the_rest(store):
    # Two links already: one made by a registration, one held by a queued probe (no row of destinations yet).
    register_site(store, "a", BUDGET, DESTS[:1])
    store.enqueue_job(DESTS[1], [1, 10], 30.0, src="a")
    # The existing two again, four new ones, one of them twice: two fit under the cap of 4.
    asked = [DESTS[0], DESTS[2], DESTS[1], DESTS[3], DESTS[2], DESTS[4], DESTS[5]]
    refused = register_site(store, "a", BUDGET, asked, max_links=4)
    assert [dest for dest, _ in refused] == [DESTS[4], DESTS[5]]
    for dest, why in refused:
        assert "site a has 4 links" in why and f"{dest.key} would be another" in why, why
    with store.db.transaction() as tx:
        made = {r[0] for r in tx.execute("SELECT dest FROM destinations WHERE src = 'a'").fetchall()}
    assert made == {DESTS[0].key, DESTS[1].key, DESTS[2].key, DESTS[3].key}
    # Another site's links are counted apart, in the same way.
    assert register_site(store, "b", BUDGET, DESTS[:4], max_links=4) == []


def test_a_fractional_budget_is_named_as_given_when_a_probe_never_fits():
    from advisor.sites import SITE_HARD_CAPS, never_fits

    # 3600.5 probe-seconds allow no probe of 3600.7: the message gives 3600.5, not a rounded 3601 or 3600.
    error = never_fits("a", 10, 3600.7, SiteBudget(1, 64, 3600.5), SITE_HARD_CAPS)
    assert "needs 3601 probe-seconds in an hour; site a's budget in force allows 3600.5 (" in error


def test_this_service_s_worker_waits_for_a_destination_another_site_probes(store):
    """The worker's own claim (Store.claim_job) skips a destination an agent of another site is probing: two probes
    through one bottleneck would measure each other, and iperf3 refuses the second as busy."""
    register_site(store, "a", SiteBudget(max_probes=4), DESTS[:1])
    queue(store, "a", DESTS[:1])
    remote = _claim(store, "a")
    assert remote.job is not None
    queue(store, "local", DESTS[:1])
    assert store.claim_job("worker-1", lambda job: 100.0, 4, src="local") is None
    _finish(store, remote)
    assert store.claim_job("worker-1", lambda job: 100.0, 4, src="local").dest == DESTS[0].key


@pytest.mark.postgres
def test_sites_claiming_one_destination_at_once_never_probe_it_twice(pg_url):
    """Four sites whose agents were last seen long ago (so no turn orders them) each have a probe of one destination
    queued, and claim at the same moment on PostgreSQL, from separate connections: one claim takes it."""
    stores = [Store.open(pg_url, clock=Clock()) for _ in range(4)]
    sites = ["a", "b", "c", "d"]
    try:
        for trial in range(20):
            with stores[0].db.transaction(write=True) as tx:
                tx.execute("DELETE FROM probe_jobs")
            for site in sites:
                register_site(stores[0], site, SiteBudget(max_probes=4), DESTS[:1])
                stores[0].enqueue_job(DESTS[0], [1, 10], 30.0, src=site)
            for store in stores:
                store.clock.advance(BUDGET_HOLD_S + 1)  # no site's agents seen lately: none waits for a turn
            claims = run_together(lambda i, _: _claim(stores[i], sites[i]), 4)
            assert sum(c.job is not None for c in claims) == 1, (trial, [c.waiting for c in claims])
    finally:
        for store in stores:
            store.close()


def test_pruning_keeps_the_jobs_a_site_s_hourly_budget_counts(store):
    """An agent that re-probes one link over and over within the hour: retention keeps the newest TAME_KEEP_RUNS
    finished jobs of a link, but not one its site's budget still counts, or the budget would never fill."""
    from advisor.retention import Retention, prune

    register_site(store, "a", SiteBudget(max_probes=1, max_streams=64, probe_seconds_per_hour=2550), DESTS[:1])
    for _ in range(25):
        queue(store, "a", DESTS[:1])
        claim = _claim(store, "a")
        store.clock.advance(100)
        _finish(store, claim)
    spent = site_use(store, "a").seconds
    assert spent == pytest.approx(25 * 100)
    prune(store, Retention(keep_runs=5))
    assert site_use(store, "a").seconds == pytest.approx(spent)
    queue(store, "a", DESTS[:1])
    refused = _claim(store, "a")
    assert refused.job is None and "2500 of a's 2550 probe-seconds" in refused.waiting
    # An hour after they started, they are history like any other job: pruned down to the newest 5.
    store.clock.advance(3700)
    prune(store, Retention(keep_runs=5))
    with store.db.transaction() as tx:
        assert tx.execute("SELECT count(*) FROM probe_jobs WHERE status = 'done'").fetchone()[0] == 5


def test_a_queued_job_that_fails_without_running_counts_no_probe_seconds(store):
    """A job whose attempt lapsed (its seconds kept as a spent attempt) and which later fails at a claim without
    running (the budget lowered under it): its time in the queue is not counted as probing."""
    register_site(store, "a", SiteBudget(max_probes=1, max_streams=64, probe_seconds_per_hour=3600), DESTS[:1],
                  owner="agent-1")
    queue(store, "a", DESTS[:1])
    first = _claim(store, "a")
    store.clock.advance(116)
    assert store.recover_jobs(3, owner_is_dead=lambda owner: False) == 1
    assert site_use(store, "a").seconds == pytest.approx(115)
    register_site(store, "a", SiteBudget(max_probes=1, max_streams=2, probe_seconds_per_hour=3600), DESTS[:1],
                  owner="agent-1")
    store.clock.advance(3000)
    assert _claim(store, "a").job is None
    failed = store.job(first.job.id)
    assert failed.status == "failed" and "never run" in failed.error
    assert site_use(store, "a").seconds == pytest.approx(115)



def test_a_failure_reported_after_the_lease_lapsed_counts_the_attempt_once(store):
    register_site(store, "a", SiteBudget(max_probes=1, max_streams=64, probe_seconds_per_hour=3600), DESTS[:1])
    queue(store, "a", DESTS[:1])
    claim = _claim(store, "a")
    store.clock.advance(116)
    assert store.recover_jobs(3, owner_is_dead=lambda owner: False) == 1
    assert store.fail_attempt(claim.job.id, "agent-a", "a", "refused", 3) is None  # no longer its claim
    assert site_use(store, "a").seconds == pytest.approx(115)


def test_a_job_handed_back_is_queued_at_once_in_its_place_charged_what_it_took_and_not_counted(store):
    """An agent that stops hands its claim back: the job is queued now (not when its 115 s lease ends), ahead of the
    jobs queued after it, with its attempts as before the claim, and the site's hour holds the 12 s it probed. Only
    the holder can: another agent's hand-back, or one after the lease lapsed, changes nothing."""
    register_site(store, "a", SiteBudget(max_probes=1, max_streams=64, probe_seconds_per_hour=3600), DESTS[:2])
    queue(store, "a", DESTS[:2])
    claim = _claim(store, "a")
    store.clock.advance(12)
    assert store.release_attempt(claim.job.id, "agent-b", "a", "stopped") is None  # not its claim
    released = store.release_attempt(claim.job.id, "agent-a", "a", "handed back; re-queued")
    assert (released.status, released.attempts, released.error) == ("queued", 0, "handed back; re-queued")
    assert site_use(store, "a") == SiteUse(0, 0, 12.0)
    again = _claim(store, "a")  # first in the queue still, and the next attempt is its first
    assert again.job.id == claim.job.id and again.job.attempts == 1
    store.clock.advance(116)
    assert store.recover_jobs(3, owner_is_dead=lambda owner: False) == 1
    assert store.release_attempt(claim.job.id, "agent-a", "a", "late") is None  # its lease lapsed: counted already
    assert site_use(store, "a").seconds == pytest.approx(12 + 115)


def test_a_site_whose_budget_is_spent_does_not_hold_another_s_turn(store):
    """Site b's hour is spent, so it cannot take the destination it shares with a (idle, b's turn older): a claim
    of b refused for its budget lets a go on instead of waiting for b's hour to end."""
    register_site(store, "a", SiteBudget(max_probes=1, max_streams=64, probe_seconds_per_hour=3600), DESTS[:1])
    register_site(store, "b", SiteBudget(max_probes=1, max_streams=64, probe_seconds_per_hour=180), DESTS[:2])
    queue(store, "a", DESTS[:1])
    first = _claim(store, "a")
    store.clock.advance(90)
    _finish(store, first)  # a probed the shared destination; b never did
    queue(store, "b", DESTS[1:2])
    spend = _claim(store, "b")
    store.clock.advance(90)
    _finish(store, spend)  # b has spent 90 of its 180 s
    queue(store, "b", DESTS[:1])
    queue(store, "a", DESTS[:1])
    assert _claim(store, "a").job is None  # b's turn at it is older, and b may take it, as far as a claim knows
    refused = _claim(store, "b")
    assert refused.job is None and "90 of b's 180 probe-seconds" in refused.waiting
    granted = _claim(store, "a")
    assert granted.job is not None and granted.job.dest == DESTS[0].key
    # Once b's hour frees, its claims are granted again.
    _finish(store, granted)
    queue(store, "a", DESTS[:1])
    store.clock.advance(3600)
    assert _claim(store, "b").job.dest == DESTS[0].key


def test_a_job_handed_back_for_its_name_lookup_waits_behind_the_site_s_others_uncounted(store):
    # Store.defer_attempt (a claim whose job's name lookup did not finish): the job goes behind the site's other
    # probes, its attempt not counted and the seconds it held charged to the site, and no claim gives it until its
    # wait is over, the claim's waiting saying when.
    register_site(store, "a", SiteBudget(max_probes=4), DESTS[:2])
    queue(store, "a", DESTS[:2])
    first = _claim(store, "a")
    assert first.job.dest == DESTS[0].key
    store.clock.advance(2)
    back = store.defer_attempt(first.job.id, "agent-a", "a", "dest host 'x' did not resolve within 5 s", 5.0)
    assert (back.status, back.attempts, back.error) == (
        "queued", 0, "not started: dest host 'x' did not resolve within 5 s; re-queued, tried again in 5 s")
    assert site_use(store, "a").seconds == 2.0
    assert store.defer_attempt(first.job.id, "agent-a", "a", "again", 5.0) is None  # no longer held
    assert _claim(store, "a").job.dest == DESTS[1].key
    waiting = _claim(store, "a")
    assert waiting.job is None and waiting.waiting.endswith(
        "their name lookups did not finish as they were to start (the first is tried again in 5 s)"), waiting.waiting
    store.clock.advance(5)
    again = _claim(store, "a")
    assert (again.job.id, again.job.attempts) == (first.job.id, 1)


def test_a_job_waiting_for_its_name_lookup_does_not_hold_another_site_s_turn(store):
    # b's job of the shared destination waits for its name lookup (Store.defer_attempt: not claimed before
    # retry_at), so b cannot take the destination now, as a site whose budget is spent cannot: a's probe of it,
    # though its turn is the newer, goes on instead of waiting, the destination idle, until b's wait is over.
    for site in ("a", "b"):
        register_site(store, site, SiteBudget(max_probes=4), DESTS[:1])
    queue(store, "b", DESTS[:1])
    slow = _claim(store, "b")
    assert store.defer_attempt(slow.job.id, "agent-b", "b", "dest host 'x' did not resolve within 5 s",
                               600.0).status == "queued"
    store.clock.advance(1)
    queue(store, "a", DESTS[:1])
    first = _claim(store, "a")  # b's turn (its claim) is newer than a's (none)
    assert first.job.src == "a"
    _finish(store, first)
    queue(store, "a", DESTS[:1])  # a probed it last, but b's job cannot be claimed for 598 s more
    again = _claim(store, "a")
    assert again.job is not None and again.job.src == "a", again.waiting
    # Once b's wait is over, b's turn (the older) comes first again.
    _finish(store, again)
    queue(store, "a", DESTS[:1])
    store.clock.advance(600)
    register_site(store, "a", SiteBudget(max_probes=4), DESTS[:1])
    register_site(store, "b", SiteBudget(max_probes=4), DESTS[:1])
    assert _claim(store, "a").job is None
    assert _claim(store, "b").job.src == "b"



def test_a_lookup_wait_outlasts_no_clock_set_back(store):
    # A job's retry_at is never more than LOOKUP_RETRY_MAX_S ahead of the clock that set it: one further ahead was
    # set before this clock was set back (or by a replica whose clock runs ahead), and waiting for it would hold the
    # job a day (for ever, after a reset by years) where its wait is at most an hour.
    register_site(store, "a", SiteBudget(max_probes=4), DESTS[:1])
    queue(store, "a", DESTS[:1])
    first = _claim(store, "a")
    store.defer_attempt(first.job.id, "agent-a", "a", "dest host 'x' did not resolve within 5 s", 5.0)
    assert _claim(store, "a").job is None  # its 5 s are not over
    store.clock.advance(-86400)  # the clock set back a day
    again = _claim(store, "a")
    assert again.job is not None and again.job.id == first.job.id, again.waiting


def test_the_worker_s_claim_outlasts_no_clock_set_back_either(store):
    # Store.claim_job (this service's own worker) reads retry_at as a site's claim does.
    store.enqueue_job(DESTS[0], [1, 10], 30.0, src="a")
    first = store.claim_job("worker", worst, 1, src="a")
    store.defer_attempt(first.id, "worker", "a", "dest host 'x' did not resolve within 5 s", 5.0, charged=False)
    assert store.claim_job("worker", worst, 1, src="a") is None
    store.clock.advance(-86400)
    assert store.claim_job("worker", worst, 1, src="a").id == first.id
