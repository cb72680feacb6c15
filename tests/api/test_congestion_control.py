"""The congestion control is part of the advice: a parameter of probes, pushed runs, observations and advice.

A real `tame serve` app (uvicorn on 127.0.0.1) over a real SQLite file (and PostgreSQL where marked); runs
are pushed with POST /v1/probe-runs as an agent pushes them, so each control's path is exactly Lu's model.
"""

import math
import sqlite3

import pytest
from numpy.testing import assert_allclose

from advisor.tame import tame_parallel_tcp
from models.parallel import ProbePoint
from tests.api.conftest import probe_and_wait
from tests.sites import SITE

DEST = "127.0.0.1:5201"
B = 4e-16
# Lu's model p'(n) = A n^2 + B, so BW(n) = n / sqrt(A n^2 + B) and impact(n) = 1 - sqrt(B / (A n^2 + B)).
# Budget 0.1 under the default margin holds 1.15 impact + 0.02 <= 0.1, i.e. impact <= 0.069565:
# A n^2 / B = 1 / (1 - 0.069565)^2 - 1 = 0.15510, so n* (whole streams) = sqrt(0.15510 B / A).
# BBR-like path (A = B): n* = 0.394, even one stream is over budget; CUBIC-like (A = B / 100): n* = 3.94.
A_BY_CONTROL = {"bbr": B, "cubic": B / 100}
BUDGET = 0.1


def rate(a, n):
    return n / math.sqrt(a * n * n + B)


def push(client, control, a, dest=DEST, **extra):
    body = {"dest": dest, "idle_rtt_s": 0.04, "probes": [{"streams": n, "throughput_bps": rate(a, n)} for n in (1, 10)],
            **extra}
    if control is not None:
        body["congestion_control"] = control
    response = client.post("/v1/probe-runs", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def counts(db_path):
    with sqlite3.connect(db_path) as conn:
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("destinations", "probe_jobs", "probe_runs", "probe_results", "fits", "observations")}


BAD_NAMES = ["BBR", "bbr!", "", "a" * 16, "1cubic", "cubic\n", "../cubic", "bbr;drop table fits", "cübic", " bbr"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_bad_control_name_is_refused_on_every_input_and_nothing_is_stored(service_factory, tmp_path, name):
    base, client, app = service_factory(congestion_control="bbr")
    before = counts(tmp_path / "tame.sqlite3")
    probes = [{"streams": 1, "throughput_bps": 1e7}, {"streams": 10, "throughput_bps": 5e7}]
    answers = [
        client.get("/v1/advice", params={"dest": DEST, "max_impact": 0.1, "cc": name}),
        client.post("/v1/advice:batch", json=[{"dest": DEST, "max_impact": 0.1, "cc": name}]),
        client.post("/v1/advice:batch", params={"cc": name}, json=[{"dest": DEST, "max_impact": 0.1}]),
        client.get(f"/v1/paths/{DEST}/curve", params={"cc": name}),
        client.post("/v1/probes", json={"dest": DEST, "congestion_control": name}),
        client.post("/v1/probe-runs", json={"dest": DEST, "congestion_control": name, "probes": probes}),
        client.post("/v1/observations", json={"dest": DEST, "streams": 2, "throughput_bps": 1e7,
                                              "congestion_control": name}),
    ]
    for response in answers:
        assert response.status_code == 422, (response.request.url, response.text)
        detail = response.json()["detail"]
        assert "congestion control" in detail and "lowercase" in detail, detail
    assert counts(tmp_path / "tame.sqlite3") == before


def test_a_control_given_as_a_number_or_list_is_refused(service_factory, tmp_path):
    base, client, app = service_factory(congestion_control="bbr")
    for value in (5, ["cubic"], {"name": "cubic"}, True):
        response = client.post("/v1/probes", json={"dest": DEST, "congestion_control": value})
        assert response.status_code == 422, response.text
    assert counts(tmp_path / "tame.sqlite3")["probe_jobs"] == 0


def test_a_probe_under_a_control_this_kernel_lacks_is_refused(service_factory, tmp_path):
    base, client, app = service_factory(congestion_control="bbr")
    app.state.service.controls = lambda: ("reno", "cubic", "bbr")
    response = client.post("/v1/probes", json={"dest": DEST, "congestion_control": "vegas"})
    assert response.status_code == 422
    assert "not available in this kernel" in response.json()["detail"]
    assert "reno, cubic, bbr" in response.json()["detail"]
    assert counts(tmp_path / "tame.sqlite3")["probe_jobs"] == 0


def test_a_probe_job_runs_under_its_control_and_is_stored_under_it(service_factory, tmp_path):
    base, client, app = service_factory(congestion_control="bbr")
    status = probe_and_wait(client, congestion_control="reno")
    assert status["status"] == "done" and status["congestion_control"] == "reno"
    assert status["result"]["congestion_control"] == "reno"
    with sqlite3.connect(tmp_path / "tame.sqlite3") as conn:
        assert conn.execute("SELECT congestion_control FROM probe_runs").fetchall() == [("reno",)]
        assert conn.execute("SELECT congestion_control FROM fits").fetchall() == [("reno",)]
    assert client.get("/v1/advice", params={"dest": DEST, "max_impact": 0.3, "cc": "reno"}).status_code == 200
    # The default control (bbr) was not probed: its advice does not come from reno's fit.
    missing = client.get("/v1/advice", params={"dest": DEST, "max_impact": 0.3})
    assert missing.status_code == 404
    assert "under bbr" in missing.json()["detail"] and "probed under reno" in missing.json()["detail"]
    # A second request under another control is a job of its own, not reno's.
    other = client.post("/v1/probes", json={"dest": DEST, "congestion_control": "cubic"}).json()
    assert other["congestion_control"] == "cubic" and other["created"] is True


def test_advice_is_kept_per_control(service_factory):
    base, client, app = service_factory(congestion_control="bbr")
    for control, a in A_BY_CONTROL.items():
        assert push(client, control, a)["congestion_control"] == control
    for control, a in A_BY_CONTROL.items():
        advice = client.get("/v1/advice", params={"dest": DEST, "max_impact": 0.3, "cc": control}).json()
        probes = [ProbePoint(n, rate(a, n)) for n in (1, 10)]
        expected = tame_parallel_tcp(probes, 0.3, idle_rtt_s=0.04, model="lu", standard_control=control)
        assert advice["congestion_control"] == control
        assert_allclose(advice["params"]["a_prime"], a, rtol=1e-6)
        assert advice["num_flows"] == expected.num_flows
        assert advice["fractional_multiplier"] == expected.fractional_multiplier
    # Without cc, the service's default control (bbr) answers.
    default = client.get("/v1/advice", params={"dest": DEST, "max_impact": 0.3}).json()
    assert default["congestion_control"] == "bbr"
    assert_allclose(default["params"]["a_prime"], A_BY_CONTROL["bbr"], rtol=1e-6)
    # reno was never probed: no advice, and the answer says which controls were.
    missing = client.get("/v1/advice", params={"dest": DEST, "max_impact": 0.3, "cc": "reno"})
    assert missing.status_code == 404 and "bbr, cubic" in missing.json()["detail"]
    # The batch takes cc per item, and ?cc= for the items that name none.
    results = client.post("/v1/advice:batch", params={"cc": "cubic"},
                          json=[{"dest": DEST, "max_impact": 0.3}, {"dest": DEST, "max_impact": 0.3, "cc": "bbr"},
                                {"dest": DEST, "max_impact": 0.3, "cc": "reno"}]).json()["results"]
    assert [r["advice"] and r["advice"]["congestion_control"] for r in results[:2]] == ["cubic", "bbr"]
    assert results[2]["error"]["kind"] == "UnknownDestination"
    curve = client.get(f"/v1/paths/{DEST}/curve", params={"cc": "cubic"}).json()
    assert curve["congestion_control"] == "cubic"
    assert sorted(p["congestion_control"] for p in client.get("/v1/paths").json()["paths"]) == ["bbr", "cubic"]


def test_an_observation_refits_only_its_own_control(service_factory):
    base, client, app = service_factory(congestion_control="bbr")
    for control, a in A_BY_CONTROL.items():
        push(client, control, a)
    bbr_before = client.get("/v1/advice", params={"dest": DEST, "max_impact": 0.3}).json()
    answer = client.post("/v1/observations", json={"dest": DEST, "streams": 5, "throughput_bps": rate(B / 100, 5),
                                                   "congestion_control": "cubic"})
    assert answer.status_code == 202 and answer.json() == {"src": SITE, "dest": DEST, "congestion_control": "cubic",
                                                          "accepted": True, "refit": True, "id": 1, "feeds_fit": True}
    cubic = client.get("/v1/advice", params={"dest": DEST, "max_impact": 0.3, "cc": "cubic"}).json()
    bbr = client.get("/v1/advice", params={"dest": DEST, "max_impact": 0.3}).json()
    assert cubic["observations_used"] == 1 and bbr["observations_used"] == 0
    assert bbr["fitted_at"] == bbr_before["fitted_at"]


def view_streams(db_path, dest, control, budget):
    where = "congestion_control IS NULL" if control is None else "congestion_control = ?"
    with sqlite3.connect(db_path) as conn:
        return conn.execute(f"SELECT coalesce(max(streams), 1) FROM current_advice WHERE dest = ? AND {where} "
                            "AND impact_bound <= ?", (dest, *(() if control is None else (control,)), budget)).fetchone()[0]


def test_the_schedulers_view_gives_the_http_answer_per_control(service_factory, tmp_path):
    base, client, app = service_factory(congestion_control="bbr")
    for control, a in A_BY_CONTROL.items():
        push(client, control, a)
    # A run pushed without its control (an older agent) is kept as not recorded, on a destination of its own,
    # and on DEST, where the recorded bbr fit keeps answering the default control.
    push(client, None, B / 10, dest="127.0.0.2:5201")
    push(client, None, B / 10)
    db = tmp_path / "tame.sqlite3"
    for budget in (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0):
        for control in A_BY_CONTROL:
            http = client.get("/v1/advice", params={"dest": DEST, "max_impact": budget, "cc": control}).json()
            assert view_streams(db, DEST, control, budget) == http["num_flows"], (control, budget)
        legacy = client.get("/v1/advice", params={"dest": "127.0.0.2:5201", "max_impact": budget}).json()
        assert view_streams(db, "127.0.0.2:5201", None, budget) == legacy["num_flows"], budget
        assert any("did not record their congestion control" in w for w in legacy["warnings"])
    default = client.get("/v1/advice", params={"dest": DEST, "max_impact": 0.3}).json()
    assert_allclose(default["params"]["a_prime"], A_BY_CONTROL["bbr"], rtol=1e-6)


def test_alternatives_come_from_the_fits_stored_under_other_controls(service_factory):
    base, client, app = service_factory(congestion_control="bbr")
    app.state.service.controls = lambda: ("reno", "cubic", "bbr", "tame")
    push(client, "bbr", A_BY_CONTROL["bbr"])
    alone = client.get("/v1/advice", params={"dest": DEST, "max_impact": BUDGET}).json()
    assert alone["tcp_equivalent_streams"] < 1
    kinds = {a["congestion_control"]: a["kind"] for a in alone["alternatives"]}
    # Nothing else measured: the tame control at n*, and the probes that would tell for cubic and reno.
    assert kinds == {"tame": "tame", "cubic": "probe", "reno": "probe"}
    cubic_probe = next(a for a in alone["alternatives"] if a["congestion_control"] == "cubic")
    assert cubic_probe["request"]["body"] == {"dest": DEST, "congestion_control": "cubic"}
    assert "--congestion-control cubic" in cubic_probe["command"]

    push(client, "cubic", A_BY_CONTROL["cubic"])
    advice = client.get("/v1/advice", params={"dest": DEST, "max_impact": BUDGET}).json()
    first = advice["alternatives"][0]
    # cubic's fit: n* = sqrt(0.15510 x 100) = 3.94 whole streams (the fractional margin gives the opened n*).
    cubic_alone = client.get("/v1/advice", params={"dest": DEST, "max_impact": BUDGET, "cc": "cubic"}).json()
    assert first["congestion_control"] == "cubic" and first["kind"] == "measured" and first["meets_budget"] is True
    assert first["tcp_equivalent_streams"] == cubic_alone["tcp_equivalent_streams"]
    assert first["num_flows"] == cubic_alone["num_flows"] == 3
    tame = next(a for a in advice["alternatives"] if a["kind"] == "tame")
    assert tame["tcp_equivalent_streams"] == advice["tcp_equivalent_streams"]
    assert tame["fractional_multiplier"] == advice["fractional_multiplier"] and tame["beside"] == "bbr"
    # how to open it is the advice's open object: the tame stream at that FM, its command naming bbr
    assert advice["open"]["fractional_multiplier"] == advice["fractional_multiplier"]
    assert "--standard-control bbr" in advice["open"]["command"]
    assert {a["congestion_control"] for a in advice["alternatives"]} == {"cubic", "tame", "reno"}
    # Under cubic the budget is met: no alternatives.
    assert cubic_alone["alternatives"] == []


@pytest.mark.postgres
def test_advice_per_control_on_postgres(pg_url, service_factory):
    import psycopg

    base, client, app = service_factory(url=pg_url, congestion_control="bbr")
    for control, a in A_BY_CONTROL.items():
        push(client, control, a)
    with psycopg.connect(pg_url) as conn:
        for budget in (0.05, 0.1, 0.3, 0.6):
            for control in A_BY_CONTROL:
                http = client.get("/v1/advice", params={"dest": DEST, "max_impact": budget, "cc": control}).json()
                (view,) = conn.execute("SELECT coalesce(max(streams), 1) FROM current_advice WHERE dest = %s "
                                       "AND congestion_control = %s AND impact_bound <= %s",
                                       (DEST, control, budget)).fetchone()
                assert view == http["num_flows"], (control, budget)
    response = client.post("/v1/probes", json={"dest": DEST, "congestion_control": "Cubic"})
    assert response.status_code == 422
