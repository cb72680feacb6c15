"""`tame advise` and `tame curve` against a live server (TAME_URL), as a user at another host would."""

import json
import os
import re
import sqlite3
import subprocess
import sys
import threading
import time

from numpy.testing import assert_allclose

from tests.api.conftest import A, json_server


def tame(base, *args, env_extra=None):
    env = {k: v for k, v in os.environ.items() if k not in ("TAME_TOKEN", "TAME_READ_TOKEN")}
    env.update(TAME_URL=base, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "advisor", *args], env=env, capture_output=True, text=True,
                          timeout=180)


def push_run(client, app, dest):
    """A probe run of ``dest`` pushed to the server under its default control: 40 Mbit/s on 1 stream, 90 on 10."""
    pushed = client.post("/v1/probe-runs", json={"dest": dest, "idle_rtt_s": 0.01,
                                                 "congestion_control": app.state.settings.congestion_control,
                                                 "probes": [{"streams": 1, "throughput_bps": 40e6},
                                                            {"streams": 10, "throughput_bps": 90e6}]})
    assert pushed.status_code == 201, pushed.text


def test_advise_via_server_requests_a_probe_when_the_path_is_unknown(service_factory):
    base, client, app = service_factory()
    done = tame(base, "advise", "127.0.0.1", "--max-impact", "0.5", "--json")
    assert done.returncode == 0, done.stderr
    assert "requesting a probe" in done.stderr
    advice = json.loads(done.stdout)
    # The server probed with its fake path (a' = A, b' = 4A); with the margin, impact(n) <= 0.48/1.15
    # up to n* = 2.790 (tests/api/test_advice.py).
    assert advice["dest"] == "127.0.0.1:5201" and advice["num_flows"] == 2
    assert_allclose(advice["params"]["a_prime"], A, rtol=1e-6)
    # Known now: answered from the store without another probe, and the curve is there too.
    again = tame(base, "advise", "127.0.0.1", "--max-impact", "0.5", "--json")
    assert again.returncode == 0 and "requesting" not in again.stderr
    curve = json.loads(tame(base, "curve", "127.0.0.1", "--json").stdout)
    assert curve["curve"][0]["streams"] == 1 and curve["model"] == advice["model"]


def test_advise_via_server_outside_the_allow_list_fails_clearly(service_factory):
    base, client, app = service_factory()
    done = tame(base, "advise", "192.0.2.1", "--max-impact", "0.1")
    assert done.returncode == 2
    assert "TAME_ALLOWED_DESTINATIONS" in done.stderr and done.stdout == ""


def test_advise_via_server_asks_for_the_plan_given_and_reads_with_the_read_token(service_factory):
    base, client, app = service_factory(token="w", read_token="r")
    done = tame(base, "advise", "127.0.0.1", "--max-impact", "0.5", "--levels", "1,4", "--duration", "2",
                env_extra={"TAME_TOKEN": "w"})
    assert done.returncode == 0, done.stderr
    with app.state.service.store.db.transaction() as tx:
        levels, duration = tx.execute("SELECT levels_json, duration_s FROM probe_jobs").fetchone()
    assert json.loads(levels) == [1, 4] and duration == 2.0  # not silently the server's defaults
    # A scheduler holding only the read token reads the advice the server now has.
    read = tame(base, "advise", "127.0.0.1", "--max-impact", "0.5", "--json", env_extra={"TAME_READ_TOKEN": "r"})
    assert read.returncode == 0, read.stderr


def test_advise_via_server_says_the_probe_waits_for_its_name_lookup_and_until_when(service_factory, clock):
    # It printed "probe queued (0%)" every 2 s for the whole wait: a probe held back for its name lookup looked like
    # one nobody took.
    base, client, app = service_factory(start_worker=False)
    assert client.put("/v1/sites/dtn2", json={"dests": ["127.0.0.1:5201"], "owner": "agent-1"}).status_code == 200
    job = client.post("/v1/sites/dtn2/claims", json={"owner": "agent-1"}).json()["job"]
    for wait_s in (5, 10):
        back = client.post(f"/v1/sites/dtn2/claims/{job['id']}/release",
                           json={"owner": "agent-1", "lookup_error": "dest host 'x' did not resolve within 5 s"})
        assert back.status_code == 200, back.text
        clock.advance(wait_s)
        assert client.post("/v1/sites/dtn2/claims", json={"owner": "agent-1"}).json()["job"]["id"] == job["id"]
    client.post(f"/v1/sites/dtn2/claims/{job['id']}/release", json={"owner": "agent-1", "lookup_error": "slow"})
    env = {k: v for k, v in os.environ.items() if k not in ("TAME_TOKEN", "TAME_READ_TOKEN")}
    advise = subprocess.Popen([sys.executable, "-m", "advisor", "advise", "127.0.0.1", "--max-impact", "0.5",
                               "--src", "dtn2"], env={**env, "TAME_URL": base}, stderr=subprocess.PIPE, text=True)
    killer = threading.Timer(120, advise.kill)  # the command polls for 900 s: a line never said must not hang here
    killer.start()
    try:
        lines = []
        for line in advise.stderr:
            lines.append(line)
            if "probe queued" in line:
                break
        # Its third wait, 20 s (5 s, twice as long each time more), from the service's clock.
        until = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(clock() + 20))
        assert lines[-1] == (f"tame advise: probe queued (0%): waiting for a name lookup until {until} (wait 3 of 11; "
                             "the 12th fails the probe)\n"), lines
        app.state.service.store.fail_job(job["id"], "given up by the test")
        assert advise.wait(60) == 1
        assert "the server's probe failed: given up by the test" in advise.stderr.read()
    finally:
        killer.cancel()
        advise.kill()
        advise.wait()


def test_curve_via_server_of_a_bare_ipv6_destination(service_factory):
    # `tame curve ::1` named the link in the URL's path as it was given: httpx refused a relative path starting with
    # ':' and the command died with a traceback, while GET /v1/advice, `tame advise ::1` and `tame curve ::1` on the
    # store itself answered. Every spelling of the destination gives the one link's curve and advice.
    base, client, app = service_factory(start_worker=False)
    push_run(client, app, "::1")
    advice = client.get("/v1/advice", params={"dest": "::1", "max_impact": 0.5}).json()
    for spelling in ("::1", "[::1]", "[0:0::1]:5201"):
        done = tame(base, "curve", spelling, "--max-impact", "0.5", "--json")
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        curve = json.loads(done.stdout)
        assert curve["dest"] == "[::1]:5201" == advice["dest"]
        assert (curve["num_flows"], curve["tcp_equivalent_streams"], curve["fractional_multiplier"]) == (
            advice["num_flows"], advice["tcp_equivalent_streams"], advice["fractional_multiplier"])


def test_curve_of_a_links_other_congestion_control_on_the_server_and_on_the_store(service_factory, tmp_path):
    # Advice is kept per (link, control) and GET /v1/advice and /v1/paths/DEST/curve take ?cc=; `tame curve` had no
    # way to name one, so it could show only the default control's curve and advice. Two controls on one link, with
    # different numbers: each is the HTTP answer, through the server (TAME_URL) and from the store itself.
    base, client, app = service_factory(start_worker=False)
    default = app.state.settings.congestion_control
    other = "reno" if default != "reno" else "cubic"
    for control, rates in ((default, (40e6, 90e6)), (other, (10e6, 95e6))):
        pushed = client.post("/v1/probe-runs", json={"dest": "127.0.0.1", "idle_rtt_s": 0.01, "congestion_control": control,
                                                     "probes": [{"streams": 1, "throughput_bps": rates[0]},
                                                                {"streams": 10, "throughput_bps": rates[1]}]})
        assert pushed.status_code == 201, pushed.text
    database = {"TAME_DATABASE_URL": app.state.settings.database_url, "TAME_CONGESTION_CONTROL": default}
    for control in (default, other):
        advice = client.get("/v1/advice", params={"dest": "127.0.0.1", "max_impact": 0.3, "cc": control}).json()
        curve = client.get("/v1/paths/127.0.0.1/curve", params={"cc": control}).json()
        for where, env_extra in (("server", None), ("store", database)):
            args = ("curve", "127.0.0.1", "--max-impact", "0.3", "--json", "--congestion-control", control)
            if where == "server":
                done = tame(base, *args)
            else:
                env = {k: v for k, v in os.environ.items() if k not in ("TAME_TOKEN", "TAME_READ_TOKEN", "TAME_URL")}
                done = subprocess.run([sys.executable, "-m", "advisor", *args], env={**env, **env_extra},
                                      capture_output=True, text=True, timeout=180)
            assert done.returncode == 0, (where, done.stderr)
            shown = json.loads(done.stdout)
            assert shown["congestion_control"] == control, where
            assert shown["curve"] == curve["curve"], where
            assert (shown["num_flows"], shown["tcp_equivalent_streams"], shown["fractional_multiplier"]) == (
                advice["num_flows"], advice["tcp_equivalent_streams"], advice["fractional_multiplier"]), where


def test_paths_names_each_links_source_and_control_on_the_server_and_on_the_store(service_factory, tmp_path):
    # `tame paths` read the local store even with TAME_URL set (tame advise and tame curve ask the server), and its
    # table showed neither the source nor the control: one destination probed from two sites, or under two controls,
    # was rows alike. Here three fits of one destination: each row names its link and control, as GET /v1/paths does.
    base, client, app = service_factory(start_worker=False)
    default = app.state.settings.congestion_control
    other = "reno" if default != "reno" else "cubic"
    own = app.state.settings.site
    for src, control in ((own, default), (own, other), ("site-b", default)):
        pushed = client.post("/v1/probe-runs", json={"src": src, "dest": "127.0.0.1", "idle_rtt_s": 0.01,
                                                     "congestion_control": control,
                                                     "probes": [{"streams": 1, "throughput_bps": 40e6},
                                                                {"streams": 10, "throughput_bps": 90e6}]})
        assert pushed.status_code == 201, pushed.text
    served = client.get("/v1/paths").json()["paths"]
    links = sorted((p["src"], p["dest"], p["congestion_control"]) for p in served)
    assert links == sorted([(own, "127.0.0.1:5201", default), (own, "127.0.0.1:5201", other),
                            ("site-b", "127.0.0.1:5201", default)])
    elsewhere = {"TAME_DATABASE_URL": f"sqlite:///{tmp_path}/elsewhere.sqlite3"}  # not the server's store
    listed = tame(base, "paths", "--json", env_extra=elsewhere)
    assert listed.returncode == 0, listed.stderr
    assert sorted((p["src"], p["dest"], p["congestion_control"]) for p in json.loads(listed.stdout)["paths"]) == links
    env = {k: v for k, v in os.environ.items() if k not in ("TAME_TOKEN", "TAME_READ_TOKEN", "TAME_URL")}
    for done in (tame(base, "paths", env_extra=elsewhere),
                 subprocess.run([sys.executable, "-m", "advisor", "paths"], capture_output=True, text=True, timeout=180,
                                env={**env, "TAME_DATABASE_URL": app.state.settings.database_url})):
        assert done.returncode == 0, done.stderr
        rows = sorted(tuple(line.split()[:3]) for line in done.stdout.splitlines()[1:])
        assert rows == links, done.stdout
    only_b = tame(base, "paths", "--json", "--src", "site-b", env_extra=elsewhere)
    assert [(p["src"], p["congestion_control"]) for p in json.loads(only_b.stdout)["paths"]] == [("site-b", default)]


def test_advise_via_server_says_the_link_and_whether_its_advice_is_stale_as_the_api_does(service_factory, clock):
    # GET /v1/advice says stale: true once the evidence is older than TAME_TTL_S; `tame advise` printed the same
    # advice under the bare destination with no word of its link or its age, as if it were fresh.
    base, client, app = service_factory(start_worker=False)
    push_run(client, app, "127.0.0.1")
    seen = []
    for step in (30.0, app.state.settings.ttl_s):  # fresh, then past the TTL
        clock.advance(step)
        api = client.get("/v1/advice", params={"dest": "127.0.0.1", "max_impact": 0.5}).json()
        done = tame(base, "advise", "127.0.0.1", "--max-impact", "0.5")
        assert done.returncode == 0, done.stderr
        first = done.stdout.splitlines()[0]
        assert first.startswith(f"{api['src']} -> {api['dest']} (advice {api['age_s']:.0f} s old, "), first
        # how many streams of one control scale to n* at the advice's RTT, as the API says
        assert api["open"]["max_aggregate_streams"] >= 1
        assert (f"N streams of one control:   at most {api['open']['max_aggregate_streams']} scale to n* "
                "(tame transfer --streams N)\n") in done.stdout
        seen.append((api["stale"], "STALE" in first, "fresh" in first))
    assert seen == [(False, False, True), (True, True, False)]


def test_advise_and_curve_via_server_show_the_api_s_n_star_and_fm_not_rounded_up(service_factory):
    # At this budget the API's n* is 1.8755 and its FM 1.244; the CLI printed n* 1.88 and FM 1.24 (two decimals):
    # an n* above the advice's, which `tame cc apply --tcp-equivalent` would take as given and pass the budget.
    base, client, app = service_factory(start_worker=False)
    push_run(client, app, "127.0.0.1")
    api = client.get("/v1/advice", params={"dest": "127.0.0.1", "max_impact": 0.341}).json()
    n_star, fm = api["tcp_equivalent_streams"], api["fractional_multiplier"]
    assert round(n_star, 2) > n_star and fm is not None and round(fm, 2) != fm, api  # what two decimals got wrong
    advise = tame(base, "advise", "127.0.0.1", "--max-impact", "0.341")
    curve = tame(base, "curve", "127.0.0.1", "--max-impact", "0.341")
    assert advise.returncode == curve.returncode == 0, (advise.stderr, curve.stderr)
    shown = re.search(r"^TCP-equivalent streams n\*: +(\S+)$", advise.stdout, re.M)
    assert shown and float(shown[1]) == n_star, advise.stdout
    at_budget = re.search(r"^at budget .* at FM (\S+), .*\(n\* (\S+)\)$", curve.stdout, re.M)
    assert at_budget and (float(at_budget[1]), float(at_budget[2])) == (fm, n_star), curve.stdout


def test_curve_says_its_link_how_old_it_is_and_whether_it_is_stale_on_the_server_and_on_the_store(service_factory,
                                                                                                  clock, tmp_path):
    # `tame curve DEST` printed the table of a fit with no word of its age: a curve past TAME_TTL_S read as fresh
    # (only --json said stale, and nothing said how old). Its first line names the link and says both, as GET
    # /v1/paths does for that fit: through the server (its clock) and from the store itself (this host's clock).
    ttl_s = 600.0
    clock.now = time.time()  # the store's times are the real clock's, which the store's own reader judges them by
    base, client, app = service_factory(start_worker=False, ttl_s=ttl_s)
    push_run(client, app, "127.0.0.1")
    env = {k: v for k, v in os.environ.items() if k not in ("TAME_TOKEN", "TAME_READ_TOKEN", "TAME_URL")}
    env.update(TAME_DATABASE_URL=app.state.settings.database_url, TAME_TTL_S=f"{ttl_s:g}",
               TAME_CONGESTION_CONTROL=app.state.settings.congestion_control)

    def on_store(*args):
        done = subprocess.run([sys.executable, "-m", "advisor", "curve", "127.0.0.1", *args], env=env,
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr
        return done.stdout

    stale_text = "STALE: its evidence is older than the service's TAME_TTL_S; asking for its advice queues a probe)"
    for step, word in ((30.0, "fresh)"), (ttl_s, stale_text)):
        clock.advance(step)
        (path,) = client.get("/v1/paths").json()["paths"]
        done = tame(base, "curve", "127.0.0.1")
        assert done.returncode == 0, done.stderr
        first, header = done.stdout.splitlines()[:2]
        assert first == f"{path['src']} -> {path['dest']} (curve {path['age_s']:.0f} s old, {word}", first
        assert header.split()[:2] == ["streams", "throughput"]
        shown = json.loads(tame(base, "curve", "127.0.0.1", "--json").stdout)
        assert (shown["age_s"], shown["stale"]) == (path["age_s"], path["stale"])
        # The curve's own answer says both, by the rule GET /v1/paths and /v1/advice judge them by.
        served = client.get("/v1/paths/127.0.0.1:5201/curve").json()
        assert (served["age_s"], served["stale"]) == (path["age_s"], path["stale"])
    said = re.fullmatch(rf"{path['src']} -> 127\.0\.0\.1:5201 \(curve ([0-9]+) s old, fresh\)",
                        on_store().splitlines()[0])
    assert said and int(said[1]) < 60, said
    with sqlite3.connect(app.state.settings.database_url[len("sqlite:///"):]) as conn:
        conn.execute("UPDATE fits SET probed_at = probed_at - ?, fitted_at = fitted_at - ?", (2 * ttl_s, 2 * ttl_s))
    said = re.fullmatch(rf"{path['src']} -> 127\.0\.0\.1:5201 \(curve ([0-9]+) s old, {re.escape(stale_text)}",
                        on_store().splitlines()[0])
    assert said and 2 * ttl_s <= int(said[1]) < 2 * ttl_s + 60, said
    shown = json.loads(on_store("--json"))
    assert shown["stale"] is True and shown["age_s"] >= 2 * ttl_s


def test_curve_reads_its_age_from_the_curve_alone_and_shows_none_from_a_server_that_sends_none(service_factory,
                                                                                                  clock):
    # `tame curve DEST` asked GET /v1/paths (every link of the site) for the age of the curve it had just read,
    # matching the row of the same fit and reading both again when the fit was replaced. The curve says its age
    # itself now: a server answering the curve and nothing else (here a stand-in serving the real server's answer)
    # is enough, and one older than age_s gets the table with no age rather than an error.
    base, client, app = service_factory(start_worker=False)
    push_run(client, app, "127.0.0.1")
    clock.advance(42.0)
    curve_path = "/v1/paths/127.0.0.1/curve"  # as `tame curve 127.0.0.1` asks for it
    answer = client.get(curve_path).json()
    assert answer["age_s"] == 42.0 and answer["stale"] is False
    asked, served = [], [answer]

    def curve_only(path):
        asked.append(path)
        return (200, served[-1]) if path.split("?")[0] == curve_path else (404, {"detail": "not here"})

    link = f"{answer['src']} -> 127.0.0.1:5201"
    with json_server(curve_only) as stand_in:
        done = tame(stand_in, "curve", "127.0.0.1")
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[0] == f"{link} (curve 42 s old, fresh)", done.stdout
        assert {p.split("?")[0] for p in asked} == {curve_path}, asked
        served.append({k: v for k, v in answer.items() if k != "age_s"})  # a server from before age_s
        done = tame(stand_in, "curve", "127.0.0.1")
        assert done.returncode == 0, done.stderr
        first, header = done.stdout.splitlines()[:2]
        assert first == link and header.split()[:2] == ["streams", "throughput"], done.stdout
