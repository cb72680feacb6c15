"""GET /v1/advice (the fast path and the route), POST /v1/advice:batch and the schedulers' SQL (advisor.schedule.SqlAdvice,
`tame schedule --database-url`'s read, and the documented staleness query) give one answer per link, control and
budget: streams, control, src, stale, age, or no advice. Over real HTTP, on a real SQLite file and on PostgreSQL, for a
link holding fits under bbr and reno and one that recorded no control, from the service's site and another, named
with and without its src, in upper case, with the destination spelt four ways, fresh, past the TTL, and refitted
by transfers; and for the default control, from whichever of its recorded fit and an unrecorded one is on the newer
probes."""

import itertools

import pytest

from advisor.destinations import parse_destination
from advisor.errors import UnknownDestination
from advisor.schedule import SqlAdvice
from advisor.site_desk import fresh_destinations
from tests.api.conftest import rate
from tests.api.test_site_links import AS_A, DATABASES, SITE_TOKENS, url_for
from tests.sites import SITE

AS_SERVICE = {"Authorization": f"Bearer {SITE_TOKENS['token']}"}
DEST = "127.0.0.2:5201"
SPELLINGS = (DEST, "127.0.0.2", "::ffff:127.0.0.2", "[::FFFF:127.0.0.2]:5201")
TTL_S = 3600.0
# docs/advice-service.md, "The store": the API's stale in SQL, on the fit the advice reads, and its streams.
STALE = ("SELECT ? - CASE WHEN observations_used > 0 AND fitted_at > probed_at THEN fitted_at ELSE probed_at END > ? "
         "FROM current_fits WHERE src = ? AND dest = ? AND ")
STREAMS = ("SELECT coalesce(max(streams), 1) FROM current_advice WHERE fit_id = (SELECT id FROM current_fits "
           "WHERE src = ? AND dest = ? AND {fit}) AND impact_bound <= ?")
# The fit a scheduler of a control reads: of the default (cubic), the recorded or unrecorded one on the newer probes.
DEFAULT_FIT = ("(congestion_control = ? OR congestion_control IS NULL) "
               "ORDER BY probed_at DESC, congestion_control IS NULL LIMIT 1")


def _sql(sql, store, now, src, dest, control, budget):
    """(streams, control, src, stale, age_s) as a scheduler reads them with SQL (SqlAdvice; its stale is the
    documented query's), or False: no advice."""
    src = (src or SITE).lower()
    try:
        advice = sql.advice(src, parse_destination(dest).key, control, budget)
    except UnknownDestination:
        return False
    fit = DEFAULT_FIT if control == "cubic" else "congestion_control = ?"
    with store.db.transaction() as tx:
        stale = tx.execute(STALE + fit, (now, TTL_S, src, DEST, control)).fetchone()
        streams = tx.execute(STREAMS.format(fit=fit), (src, DEST, control, budget)).fetchone()
    assert (advice.stale, advice.streams) == (bool(stale[0]), streams[0]), (src, dest, control)
    return advice.streams, control, src, advice.stale, advice.age_s


def _answers(client, sql, store, now):
    """The one answer of every query, each (streams, control, src, stale, age_s) or False (no advice); AssertionError
    naming the queries answered otherwise by one of the reads."""
    agreed, out = set(), []
    for src, cc, budget, dest in itertools.product((None, SITE, "site-a", "SITE-A"), (None, "cubic", "bbr", "reno", "vegas"),
                                                   (0.0, 1e-9, 0.2, 1.0), SPELLINGS):
        query = {"dest": dest, "max_impact": budget, **({"cc": cc} if cc else {}), **({"src": src} if src else {})}
        answers = []
        for _ in range(2):  # a miss (the route), then the cached entry (the fast path)
            got = client.get("/v1/advice", params=query, headers=AS_SERVICE)
            answers.append(got.status_code == 200 and got.json())
        item = client.post("/v1/advice:batch", json=[query], headers=AS_SERVICE).json()["results"][0]["advice"]
        answers = [(a["num_flows"], a["congestion_control"], a["src"], a["stale"], a["age_s"]) if a else False
                   for a in answers + [item]]
        answers.append(_sql(sql, store, now, src, dest, cc or "cubic", budget))
        if len(set(answers)) != 1:
            out.append((query, answers))
        agreed.update(answers)
    assert out == []
    return agreed


@pytest.mark.parametrize("database", DATABASES)
def test_http_batch_and_sql_give_one_answer(database, request, tmp_path, service_factory, clock):
    url = url_for(database, request, tmp_path)
    base, client, app = service_factory(start_worker=False, url=url, congestion_control="cubic", ttl_s=TTL_S,
                                        **SITE_TOKENS)
    store = app.state.service.store
    for src, headers in ((None, AS_SERVICE), ("site-a", AS_A)):
        for control, scale in (("bbr", 1.0), (None, 0.7), ("reno", 0.9)):  # None: a run that recorded no control
            run = {"dest": DEST, "probes": [{"streams": n, "throughput_bps": rate(n) * scale} for n in (1, 10)],
                   **({"congestion_control": control} if control else {}), **({"src": src} if src else {})}
            assert client.post("/v1/probe-runs", json=run, headers=headers).status_code == 201
    sql = SqlAdvice(url, SITE, "cubic", app.state.settings.freshness, clock=clock)
    try:
        clock.advance(100)
        fresh = _answers(client, sql, store, clock())
        # Advice and none, 1 stream to many, every control the link holds, both sites: not a vacuous agreement.
        assert False in fresh and len({a[0] for a in fresh if a}) > 1 and {a[3] for a in fresh if a} == {False}
        assert {a[1:3] for a in fresh if a} == {(c, s) for c in ("cubic", "bbr", "reno") for s in (SITE, "site-a")}
        clock.advance(TTL_S)
        assert {a[3] for a in _answers(client, sql, store, clock()) if a} == {True}
        # Transfers refit the default control from the run that recorded none, and bbr at site-a.
        for src, headers, control in ((None, AS_SERVICE, "cubic"), ("site-a", AS_A, "bbr")):
            observation = {"dest": DEST, "streams": 4, "throughput_bps": rate(4) * 0.8, "congestion_control": control,
                           **({"src": src} if src else {})}
            refit = client.post("/v1/observations", json=observation, headers=headers)
            assert refit.status_code == 202 and refit.json()["refit"], refit.text
        clock.advance(5)
        refitted = _answers(client, sql, store, clock())
        assert {a[1:4] for a in refitted if a and not a[3]} == {("cubic", SITE, False), ("bbr", "site-a", False)}
    finally:
        sql.close()


@pytest.mark.parametrize("database", DATABASES)
def test_the_default_control_is_answered_from_its_newest_probes_recorded_or_not(database, request, tmp_path,
                                                                                 service_factory, clock):
    url = url_for(database, request, tmp_path)
    base, client, app = service_factory(start_worker=False, url=url, congestion_control="cubic", ttl_s=TTL_S,
                                        **SITE_TOKENS)
    store = app.state.service.store
    # The service's site: an old run under cubic, then a client keeps pushing runs without their control. Site-a:
    # the other way round. A recorded fit on older probes answered the default before the newer unrecorded one.
    order = {None: ("cubic", None), "site-a": (None, "cubic")}
    for step in range(2):
        for src, headers in ((None, AS_SERVICE), ("site-a", AS_A)):
            control = order[src][step]
            run = {"dest": DEST, "probes": [{"streams": n, "throughput_bps": rate(n) * (1.0, 0.5)[step]}
                                            for n in (1, 10)],
                   **({"congestion_control": control} if control else {}), **({"src": src} if src else {})}
            assert client.post("/v1/probe-runs", json=run, headers=headers).status_code == 201
        clock.advance(TTL_S + 400)
    clock.advance(-TTL_S)  # the newer runs 400 s old, the older ones past the TTL
    sql = SqlAdvice(url, SITE, "cubic", app.state.settings.freshness, clock=clock)
    try:
        answers = _answers(client, sql, store, clock())
        cubic = {a[2]: a for a in answers if a and a[1] == "cubic"}
        # Both links answer cubic from their newer probes, 400 s old and fresh: the site's from the unrecorded fit.
        assert {src: a[3:] for src, a in cubic.items()} == {SITE: (False, 400.0), "site-a": (False, 400.0)}
        advice = client.get("/v1/advice", params={"dest": DEST, "max_impact": 0.2}, headers=AS_SERVICE).json()
        assert advice["probed_at"] == clock() - 400
        assert "did not record their congestion control" in advice["warnings"][-1]
        for src, headers in ((SITE, AS_SERVICE), ("site-a", AS_A)):
            paths = client.get("/v1/paths", params={"src": src}, headers=headers).json()["paths"]
            assert fresh_destinations(paths, "cubic", "cubic") == {DEST}, src
        # A transfer under cubic refits on the run behind the advice (the unrecorded one at the service's site): the
        # refit records cubic, on probes as new as the unrecorded fit's, and answers.
        observation = {"dest": DEST, "streams": 4, "throughput_bps": rate(4) * 0.4, "congestion_control": "cubic"}
        refit = client.post("/v1/observations", json=observation, headers=AS_SERVICE)
        assert refit.status_code == 202 and refit.json()["refit"], refit.text
        clock.advance(5)
        advice = client.get("/v1/advice", params={"dest": DEST, "max_impact": 0.2}, headers=AS_SERVICE).json()
        assert (advice["congestion_control"], advice["observations_used"], advice["probed_at"], advice["stale"]) == \
            ("cubic", 1, clock() - 405, False)
        assert {a[2]: a[3:] for a in _answers(client, sql, store, clock()) if a and a[1] == "cubic"} == \
            {SITE: (False, 5.0), "site-a": (False, 405.0)}
    finally:
        sql.close()
