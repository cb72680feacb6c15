"""`tame agent --site` refuses bad input before it probes or registers anything, and stops when the server refuses
it (a wrong token, another budget the site's agents run with): exit status 2 and a message that says what to do."""

import json
import os
import sqlite3
import subprocess
import threading

import httpx
import psycopg
import pytest

import advisor.allowlist as allowlist
from advisor.cli import main
from advisor.commands.agent import hand_back_claim
from api.client import TameClient, TameError
from tests.api.conftest import free_port, live_server, wait_for
from tests.api.procs import TAME, TOKEN_VARIABLES, start_iperf3, start_serve, stop


@pytest.mark.parametrize("argv, says", [
    (["--site", "dtn1"], "--site needs --server"),
    (["--site", "bad site", "--server", "http://127.0.0.1:9"], "must name a site"),
    (["--site", "-dtn", "--server", "http://127.0.0.1:9"], "--site"),
    (["--site", "x" * 65, "--server", "http://127.0.0.1:9"], "at most 64"),
    (["--max-probes", "2"], "give --site"),
    (["--site", "dtn1", "--server", "http://127.0.0.1:9", "--max-probes", "0"], "--max-probes"),
    (["--site", "dtn1", "--server", "http://127.0.0.1:9", "--max-streams", "1e9"], "--max-streams"),
    (["--site", "dtn1", "--server", "http://127.0.0.1:9", "--probe-seconds-per-hour", "nan"], "--probe-seconds-per-hour"),
])
def test_bad_site_options_exit_2_and_nothing_runs(tmp_path, argv, says):
    dests = tmp_path / "dests"
    dests.write_text("127.0.0.1:5201\n")
    env = {**os.environ, "TAME_DATABASE_URL": f"sqlite:///{tmp_path}/never.sqlite3"}
    done = subprocess.run([TAME, "agent", "--dest-file", str(dests), "--once", *argv], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
    assert not (tmp_path / "never.sqlite3").exists()


@pytest.mark.parametrize("token, site, says", [
    ("wrong", "dtn1", ["401"]),
    # The agent's TAME_TOKEN is its site's token: with site-a's it cannot register as site-b.
    ("token-a", "site-b", ["403", "this token is site-a's", "/v1/sites/site-a"]),
])
def test_a_server_that_refuses_the_agent_stops_it_with_2(tmp_path, service_factory, token, site, says):
    """A wrong token, or another site's: the registration is refused, the agent says so and exits 2 rather than
    trying again forever; nothing is stored."""
    base, client, app = service_factory(start_worker=False, token="s3cret", site_tokens=(("site-a", "token-a"),))
    dests = tmp_path / "dests"
    dests.write_text("127.0.0.1:5201\n")
    env = {**os.environ, "TAME_TOKEN": token}
    done = subprocess.run([TAME, "agent", "--site", site, "--server", base, "--dest-file", str(dests)],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert all(word in done.stderr for word in says), done.stderr
    assert client.get("/v1/links").json()["links"] == []
    assert app.state.service.store.job_counts() == {}


def test_a_destination_the_server_refuses_is_reported_and_the_agent_goes_on(tmp_path, service_factory):
    base, client, app = service_factory(start_worker=False)
    dests = tmp_path / "dests"
    dests.write_text("192.0.2.1:5201\n")
    env = {**os.environ}
    env.pop("TAME_TOKEN", None)
    done = subprocess.run([TAME, "agent", "--site", "dtn1", "--server", base, "--dest-file", str(dests), "--once"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "192.0.2.1:5201 left out" in done.stderr and "allow" in done.stderr
    assert client.get("/v1/links").json()["links"] == []


def test_an_agent_whose_budget_conflicts_with_the_site_s_stops_with_2(tmp_path, service_factory):
    """Another agent of the site runs with max_probes 2: this one, started with the default budget, is told so
    (409: the budget in force, who set it, what to do) and exits 2 rather than overwriting it every round; the
    site's budget and links are as they were."""
    base, client, app = service_factory(start_worker=False)
    held = client.put("/v1/sites/dtn1", json={"dests": ["127.0.0.1:5201"], "max_probes": 2, "owner": "dtn1-agent-a"})
    assert held.status_code == 200
    dests = tmp_path / "dests"
    dests.write_text("127.0.0.2:5201\n")
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    env.pop("TAME_TOKEN", None)
    done = subprocess.run([TAME, "agent", "--site", "dtn1", "--server", base, "--dest-file", str(dests),
                           "--interval", "1"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "HTTP 409" in done.stderr and "max_probes=2" in done.stderr and "'dtn1-agent-a'" in done.stderr
    assert "same budget" in done.stderr and "stopping" in done.stderr
    again = client.put("/v1/sites/dtn1", json={"dests": ["127.0.0.1:5201"], "max_probes": 2, "owner": "dtn1-agent-a"})
    assert again.json()["budget"]["max_probes"] == 2 and again.json()["links"] == 1
    with sqlite3.connect(tmp_path / "tame.sqlite3") as conn:
        assert conn.execute("SELECT src, dest FROM destinations").fetchall() == [("dtn1", "127.0.0.1:5201")]
        assert conn.execute("SELECT max_probes, budget_set_by FROM sites").fetchall() == [(2, "dtn1-agent-a")]


def test_an_agent_asking_for_more_than_the_operator_s_ceiling_stops_with_2(tmp_path):
    """`tame serve` with TAME_MAX_SITE_PROBES=2: an agent started with --max-probes 4 is refused (422 naming the
    field, the ceiling and the variable) and exits 2 rather than asking again every round; nothing of its
    registration is stored. Started within the ceiling, it registers (no link: it has nothing to probe here)."""
    (tmp_path / "serve").mkdir()
    db = tmp_path / "tame.sqlite3"
    serve, base = start_serve(tmp_path / "serve", db, env={"TAME_MAX_SITE_PROBES": "2"}, args=("--no-worker",))
    dests = tmp_path / "dests"
    dests.write_text("127.0.0.1:5201\n")
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    env.pop("TAME_TOKEN", None)
    nothing = tmp_path / "nothing"
    nothing.write_text("# no destination\n")
    agent = [TAME, "agent", "--site", "dtn1", "--server", base, "--interval", "1"]
    try:
        done = subprocess.run([*agent, "--dest-file", str(dests), "--max-probes", "4"], env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert "HTTP 422" in done.stderr and "max_probes 4 is above 2" in done.stderr, done.stderr
        assert "(TAME_MAX_SITE_PROBES, set by its operator): give at most 2 (tame agent --max-probes)" in done.stderr
        assert "stopping" in done.stderr
        with sqlite3.connect(db) as conn:
            assert [conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                    for t in ("sites", "destinations")] == [0, 0]
        within = subprocess.run([*agent, "--dest-file", str(nothing), "--max-probes", "2", "--once"], env=env,
                                capture_output=True, text=True, timeout=60)
        assert within.returncode == 0, within.stderr
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT name, max_probes FROM sites").fetchall() == [("dtn1", 2)]
    finally:
        stop(serve)


@pytest.mark.postgres
def test_two_agents_of_a_site_with_different_budgets_through_tame_serve(tmp_path, pg_url):
    """The multi-site shape as processes: `tame serve` on PostgreSQL, one `tame agent` of site-a running with
    --max-probes 2, then a second started with the default budget: the second is refused and exits 2 naming the
    first, which runs on with the site's budget unchanged."""
    (tmp_path / "serve").mkdir()
    serve, base = start_serve(tmp_path / "serve", tmp_path / "unused.sqlite3", env={"TAME_DATABASE_URL": pg_url},
                              args=("--no-worker",))
    dests = tmp_path / "dests"
    dests.write_text("# nothing to probe: the agents only register and claim\n")
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    env.pop("TAME_TOKEN", None)
    agent = [TAME, "agent", "--site", "site-a", "--server", base, "--dest-file", str(dests), "--interval", "1"]
    first = subprocess.Popen([*agent, "--max-probes", "2"], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)

    def site():
        with psycopg.connect(pg_url) as conn:
            return conn.execute("SELECT max_probes, budget_set_by FROM sites WHERE name = 'site-a'").fetchone()

    try:
        max_probes, set_by = wait_for(site, timeout_s=60, what="the first agent's registration")
        assert max_probes == 2 and f":{first.pid}:" in set_by
        second = subprocess.run(agent, env=env, capture_output=True, text=True, timeout=60)
        assert second.returncode == 2, second.stderr
        assert "HTTP 409" in second.stderr and "max_probes=2" in second.stderr and repr(set_by) in second.stderr
        assert first.poll() is None
        assert site() == (2, set_by)
    finally:
        first.kill()
        first.wait(30)
        stop(serve)


# Probes of a second at two levels, no adaptive level: a plan of a few seconds.
SHORT_PROBES = {"TAME_PROBE_LEVELS": "1,2", "TAME_PROBE_DURATION_S": "1", "TAME_PROBE_MAX_DURATION_S": "1",
                "TAME_PROBE_OMIT_S": "0", "TAME_MODEL": "lu"}


def short_probe_site(tmp_path, dests, agent_env=None):
    """(tame serve --no-worker over tmp_path/tame.sqlite3 with SHORT_PROBES, its URL, a destination file listing
    ``dests``, the environment of an agent of it: SHORT_PROBES and ``agent_env``, no token)."""
    (tmp_path / "serve").mkdir()
    serve, base = start_serve(tmp_path / "serve", tmp_path / "tame.sqlite3", env=SHORT_PROBES, args=("--no-worker",))
    dest_file = tmp_path / "dests"
    dest_file.write_text("".join(f"{dest}\n" for dest in dests))
    env = {**os.environ, **SHORT_PROBES, **(agent_env or {}), "XDG_STATE_HOME": str(tmp_path / "state")}
    env.pop("TAME_TOKEN", None)
    return serve, base, dest_file, env


@pytest.mark.iperf
def test_a_destination_that_refuses_probes_neither_blocks_the_site_nor_spends_its_budget(tmp_path):
    """A real agent with two links, one where nothing listens: each failed claim is reported at once, so the live
    link is probed in the same round, the dead link's job fails after TAME_MAX_PROBE_ATTEMPTS attempts, and the
    site's hour holds the seconds they took, not three leases' worth (the budget would be spent by the dead link)."""
    live_port, dead_port = free_port(), free_port()
    iperf = start_iperf3(tmp_path, live_port)
    serve, base, dests, env = short_probe_site(tmp_path, [f"127.0.0.1:{dead_port}", f"127.0.0.1:{live_port}"])
    try:
        done = subprocess.run([TAME, "agent", "--site", "dtn1", "--server", base, "--dest-file", str(dests), "--once",
                               "--probe-seconds-per-hour", "600"], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        with sqlite3.connect(tmp_path / "tame.sqlite3") as conn:
            jobs = dict(conn.execute("SELECT dest, status FROM probe_jobs").fetchall())
            dead_error = conn.execute("SELECT error FROM probe_jobs WHERE dest = ?",
                                      (f"127.0.0.1:{dead_port}",)).fetchone()[0]
            runs = conn.execute("SELECT d.dest FROM probe_runs r JOIN destinations d ON d.id = r.destination_id"
                                ).fetchall()
        assert jobs == {f"127.0.0.1:{dead_port}": "failed", f"127.0.0.1:{live_port}": "done"}, (jobs, done.stderr)
        assert "failed 3 times" in dead_error, dead_error
        assert runs == [(f"127.0.0.1:{live_port}",)]
        use = httpx.post(f"{base}/v1/sites/dtn1/claims", json={"owner": "x"}, timeout=30).json()["use"]
        assert use["probe_seconds"] < 60, use  # a few seconds of probing, not 3 x 875 s of leases
    finally:
        stop(serve)
        stop(iperf)


@pytest.mark.iperf
def test_a_claim_whose_answer_was_lost_is_probed_in_the_agent_s_next_round(tmp_path):
    """The service commits a claim and the network loses its answer: the job was held in the agent's name for the
    whole lease (139 s for this plan, 875 s by default), the site's only probe slot with it, and the lease charged
    to its hour. The agent's next claim names the probes it runs, and gets that job back."""
    from tests.api.dropping_proxy import DroppingProxy

    port = free_port()
    iperf = start_iperf3(tmp_path, port)
    serve, base, dests, env = short_probe_site(tmp_path, [f"127.0.0.1:{port}"])
    agent = None
    try:
        with DroppingProxy(("127.0.0.1", int(base.rsplit(":", 1)[1])), b"POST /v1/sites/dtn1/claims") as proxy:
            agent = subprocess.Popen([TAME, "agent", "--site", "dtn1", "--server", proxy.url, "--dest-file", str(dests),
                                      "--interval", "1"], env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)

            def probed():
                with sqlite3.connect(tmp_path / "tame.sqlite3") as conn:
                    return conn.execute("SELECT count(*) FROM probe_runs").fetchone()[0] > 0
            wait_for(probed, timeout_s=60, what="the claimed link's run")
            assert proxy.dropped == 1
        with sqlite3.connect(tmp_path / "tame.sqlite3") as conn:
            assert conn.execute("SELECT status, attempts FROM probe_jobs").fetchall() == [("done", 1)]
            # Charged the seconds it sat claimed until the next round, not the lapsed lease's 139 s.
            assert conn.execute("SELECT coalesce(sum(seconds), 0) FROM spent_attempts").fetchone()[0] < 60
    finally:
        stop(agent, serve, iperf)


def test_an_agent_whose_plan_could_outlast_its_lease_does_not_probe(tmp_path):
    """The lease is the service's plan's worst case: an agent configured for longer probes would still be probing
    when its job went to another agent (the link probed twice at once). It probes nothing and reports why."""
    serve, base, dests, env = short_probe_site(tmp_path, [f"127.0.0.1:{free_port()}"],
                                               agent_env={"TAME_PROBE_MAX_DURATION_S": "600"})
    try:
        done = subprocess.run([TAME, "agent", "--site", "dtn1", "--server", base, "--dest-file", str(dests), "--once"],
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert "longer than the" in done.stderr and "TAME_PROBE_MAX_DURATION_S" in done.stderr, done.stderr
        with sqlite3.connect(tmp_path / "tame.sqlite3") as conn:
            assert conn.execute("SELECT status FROM probe_jobs").fetchall() == [("failed",)]
            assert conn.execute("SELECT count(*) FROM probe_runs").fetchone() == (0,)
    finally:
        stop(serve)


# How a service from before lookup_error refused it: its body model took no such key (extra="forbid"), and the
# service words such a key as it does now (test_a_current_service_words_an_unknown_hand_back_key_as_the_older_one).
OLDER_REFUSAL = "lookup_error: Extra inputs are not permitted"


def _before_lookup_error(app):
    """``app`` as a service from before POST /v1/sites/NAME/claims/ID/release took lookup_error: a release naming it
    is refused as that service's body model (extra="forbid") refused it; all else is ``app``'s (whose own server runs
    its lifespan)."""
    async def older(scope, receive, send):
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] == "http" and scope["path"].endswith("/release"):
            messages = [await receive()]
            while messages[-1].get("more_body"):
                messages.append(await receive())
            if b'"lookup_error"' in b"".join(m.get("body", b"") for m in messages):
                body = json.dumps({"detail": OLDER_REFUSAL}).encode()
                await send({"type": "http.response.start", "status": 422,
                            "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": body})
                return

            async def replay():
                return messages.pop(0) if messages else await receive()
            await app(scope, replay, send)
            return
        await app(scope, receive, send)

    return older


def test_an_agent_whose_lookup_did_not_finish_reports_it_failed_to_a_service_older_than_lookup_error(
        tmp_path, service_factory, monkeypatch, capsys):
    """Such a service answers the hand-back 422: the agent said it "could not hand back the probe" and left the job
    running in its name until its lease ran out (the whole lease charged to the site's hour), to come back as an
    interrupted attempt. It reports the lookup as a failed claim instead, as agents of that service's version did,
    and says so: each attempt counted, the third fails the job, saying why."""
    base, client, app = service_factory(start_worker=False)
    slots = threading.BoundedSemaphore(1)
    slots.acquire()  # every lookup slot of the agent taken: its lookup of localhost never starts
    monkeypatch.setattr(allowlist, "_lookup_slots", slots)
    monkeypatch.setattr(allowlist, "RESOLVE_TIMEOUT_S", 0.01)
    for name in TOKEN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    dests = tmp_path / "dests"
    dests.write_text("localhost:5201\n")
    with live_server(_before_lookup_error(app)) as older:
        assert main(["agent", "--site", "dtn2", "--server", older, "--dest-file", str(dests), "--once",
                     "--spool", str(tmp_path / "spool")]) == 0
    err = capsys.readouterr().err
    with app.state.service.store.db.transaction() as tx:
        [(job_id,)] = tx.execute("SELECT id FROM probe_jobs").fetchall()
    shown = client.get(f"/v1/probes/{job_id}").json()
    busy = ("dest host 'localhost' was not looked up: this agent's 8 name lookups were all busy for 0.01 s: try again "
            "later, or give its address")
    assert (shown["status"], shown["attempts"]) == ("failed", 3), shown
    assert shown["error"] == f"failed 3 times; giving up. Last: {busy}"
    assert err.count("a service older than lookup_error): reported as a failed attempt instead") == 3, err
    assert "could not hand back" not in err


def _claimed_job(client) -> str:
    assert client.put("/v1/sites/dtn2", json={"dests": ["127.0.0.1:5201"], "owner": "agent-1"}).status_code == 200
    job = client.post("/v1/sites/dtn2/claims", json={"owner": "agent-1"}).json()["job"]
    assert job is not None
    return job["id"]


def test_a_current_service_words_an_unknown_hand_back_key_as_the_older_one(service_factory):
    base, client, app = service_factory(start_worker=False)
    job_id = _claimed_job(client)
    told = client.post(f"/v1/sites/dtn2/claims/{job_id}/release", json={"owner": "agent-1", "retry_after_s": 0})
    assert told.status_code == 422, told.text
    assert told.json()["detail"] == OLDER_REFUSAL.replace("lookup_error", "retry_after_s")


@pytest.mark.parametrize("lookup_error, says", [
    ("", "lookup_error: String should have at least 1 character"),
    ("a\x00b", "lookup_error: the body holds a NUL"),
])
def test_a_current_service_s_refusal_of_a_lookup_error_value_is_raised_not_reported_as_a_failed_attempt(
        service_factory, capsys, lookup_error, says):
    """The 422 names lookup_error, but for its value, not as a key the service does not take: the agent reported it
    as a failed claim, "a service older than lookup_error", and raised that claim's own refusal (of ``error``).
    It raises the hand-back's refusal, and the job is as it was, its attempt not counted."""
    base, client, app = service_factory(start_worker=False)
    job_id = _claimed_job(client)
    before = client.get(f"/v1/probes/{job_id}").json()
    with TameClient(base) as remote, pytest.raises(TameError) as refused:
        hand_back_claim(remote, "dtn2", "agent-1", job_id, lookup_error)
    assert refused.value.status == 422 and refused.value.detail.startswith(says), refused.value
    assert "older than lookup_error" not in capsys.readouterr().err
    after = client.get(f"/v1/probes/{job_id}").json()
    assert [after[k] for k in ("status", "attempts", "error")] == ["running", before["attempts"], None], after
