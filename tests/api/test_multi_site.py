"""The multi-site shape of docker-compose.yml, run as processes: one PostgreSQL, two `tame serve` replicas without
workers, two `tame agent --site` processes at different sites probing two real `iperf3 -s`, each through its
own replica, each with its own site's token. Each site's link is probed by its own agent only, both replicas give
the same advice for it, and the SQL view agrees; a site's token is refused for the other site's links; an agent
killed mid-probe loses its claim to the next agent of its site."""

import os
import signal
import subprocess
import time

import httpx
import pytest

from tests.api.conftest import free_port, wait_for
from tests.api.procs import TAME, start_iperf3, start_serve, stop

pytestmark = [pytest.mark.iperf, pytest.mark.postgres]

# Short plans (two 1 s probes after iperf3's 5 s warm-up, never extended, no adaptive probe): about 15 s each.
PLAN_ENV = {"TAME_PROBE_DURATION_S": "1", "TAME_PROBE_MAX_DURATION_S": "1", "TAME_PROBE_OMIT_S": "0", "TAME_MODEL": "lu",
            "TAME_PROBE_LEVELS": "1,2", "TAME_ALLOWED_DESTINATIONS": "127.0.0.0/8"}
# The replicas' tokens: the operator's for every site, and one for each site's agents.
TOKENS = {"site-a": "token-a-0123456789abcdef", "site-b": "token-b-0123456789abcdef"}
TOKEN_ENV = {"TAME_TOKEN": "operator-token", "TAME_SITE_TOKENS": ",".join(f"{s}:{t}" for s, t in TOKENS.items())}


def start_agent(tmp_path, name, site, server, dests, *extra):
    dest_file = tmp_path / f"{name}.dests"
    dest_file.write_text("\n".join(dests) + "\n")
    log = (tmp_path / f"{name}.log").open("wb")
    # The agent's TAME_TOKEN is its site's token.
    env = {**os.environ, **PLAN_ENV, "XDG_STATE_HOME": str(tmp_path / name), "TAME_TOKEN": TOKENS[site]}
    env.pop("TAME_SITE_TOKENS", None)
    proc = subprocess.Popen([TAME, "agent", "--site", site, "--server", server, "--dest-file", str(dest_file),
                             "--interval", "1", *extra], env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    log.close()
    return proc


def test_two_sites_two_replicas_one_database(tmp_path, pg_url):
    ports = [free_port(), free_port()]
    for k in range(2):
        (tmp_path / f"i{k}").mkdir()
    iperfs = [start_iperf3(tmp_path / f"i{k}", port) for k, port in enumerate(ports)]
    dests = [f"127.0.0.1:{p}" for p in ports]
    env = {**PLAN_ENV, **TOKEN_ENV, "TAME_DATABASE_URL": pg_url, "TAME_SITE": "central"}
    replicas, agents = [], []
    try:
        for k in range(2):
            (tmp_path / f"r{k}").mkdir()
            replicas.append(start_serve(tmp_path / f"r{k}", tmp_path / "unused.sqlite3", env=env, args=("--no-worker",)))
        agents = [start_agent(tmp_path, "agent-a", "site-a", replicas[0][1], [dests[0]], "--once"),
                  start_agent(tmp_path, "agent-b", "site-b", replicas[1][1], [dests[1]], "--once")]
        for k, agent in enumerate(agents):
            assert agent.wait(180) == 0, (tmp_path / f"agent-{'ab'[k]}.log").read_text()
        answers = []
        for _, base in replicas:
            with httpx.Client(base_url=base, timeout=30) as http:
                links = http.get("/v1/links").json()
                assert links["site"] == "central"
                assert sorted((l["src"], l["dest"], l["stale"]) for l in links["links"]) == [
                    ("site-a", dests[0], False), ("site-b", dests[1], False)]
                answers.append([http.get("/v1/advice", params={"src": src, "dest": dest, "max_impact": 0.2}).json()
                                for src, dest in (("site-a", dests[0]), ("site-b", dests[1]))])
                # Neither site probed the other's destination, nor did the central site probe anything.
                assert http.get("/v1/advice", params={"src": "site-a", "dest": dests[1], "max_impact": 0.2}).status_code == 404
                assert http.get("/v1/advice", params={"dest": dests[0], "max_impact": 0.2}).status_code == 404
        strip = lambda a: {k: v for k, v in a.items() if k != "age_s"}
        assert [strip(a) for a in answers[0]] == [strip(a) for a in answers[1]]
        # site-a's token writes nothing for site-b, nor without naming its site; the jobs and runs below are unchanged.
        run = {"dest": dests[1], "probes": [{"streams": 1, "throughput_bps": 1e9}, {"streams": 2, "throughput_bps": 1e9}]}
        site_a = {"Authorization": f"Bearer {TOKENS['site-a']}"}
        with httpx.Client(base_url=replicas[0][1], timeout=30, headers=site_a) as http:
            for method, path, body in (("PUT", "/v1/sites/site-b", {"dests": [dests[1]]}),
                                       ("POST", "/v1/sites/site-b/claims", {"owner": "intruder"}),
                                       ("POST", "/v1/probe-runs", {**run, "src": "site-b"}),
                                       ("POST", "/v1/probe-runs", run),
                                       ("POST", "/v1/observations", {"src": "site-b", "dest": dests[1], "streams": 2,
                                                                     "throughput_bps": 1e9})):
                refused = http.request(method, path, json=body)
                assert refused.status_code == 403 and "this token is site-a's" in refused.json()["detail"], refused.text
            assert http.request("PUT", "/v1/sites/site-b", json={"dests": [dests[1]]},
                                headers={"Authorization": "Bearer token-c"}).status_code == 401
        import psycopg

        with psycopg.connect(pg_url) as conn:
            for advice in answers[0]:
                (flows,) = conn.execute(
                    "SELECT coalesce(max(streams), 1) FROM current_advice WHERE src = %s AND dest = %s "
                    "AND congestion_control = %s AND impact_bound <= 0.2",
                    (advice["src"], advice["dest"], advice["congestion_control"])).fetchone()
                assert flows == advice["num_flows"]
            jobs = conn.execute("SELECT src, dest, status, attempts FROM probe_jobs ORDER BY src").fetchall()
            runs = conn.execute("SELECT d.src, d.dest, count(*) FROM probe_runs r JOIN destinations d "
                                "ON d.id = r.destination_id GROUP BY d.src, d.dest ORDER BY d.src").fetchall()
            (observations,) = conn.execute("SELECT count(*) FROM observations").fetchone()
        assert jobs == [("site-a", dests[0], "done", 1), ("site-b", dests[1], "done", 1)]
        assert runs == [("site-a", dests[0], 1), ("site-b", dests[1], 1)] and observations == 0
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait(30)
        for proc, _ in replicas:
            stop(proc)
        for iperf in iperfs:
            stop(iperf)


def test_a_killed_agent_s_claim_goes_to_the_next_agent_of_its_site(tmp_path, pg_url):
    port = free_port()
    iperf = start_iperf3(tmp_path, port)
    dest = f"127.0.0.1:{port}"
    (tmp_path / "r").mkdir()
    serve, base = start_serve(tmp_path / "r", tmp_path / "unused.sqlite3",
                              env={**PLAN_ENV, **TOKEN_ENV, "TAME_DATABASE_URL": pg_url}, args=("--no-worker",))
    first = second = None
    try:
        first = start_agent(tmp_path, "first", "site-a", base, [dest])
        with httpx.Client(base_url=base, timeout=30) as http:
            import psycopg

            def running():
                with psycopg.connect(pg_url) as conn:
                    return conn.execute("SELECT id, owner, started_at, lease_until FROM probe_jobs "
                                        "WHERE src = 'site-a' AND status = 'running'").fetchone()

            job_id, owner, started_at, lease_until = wait_for(running, timeout_s=60, what="the first agent's claim")
            assert f":{first.pid}:" in owner
            first.send_signal(signal.SIGKILL)
            first.wait(30)
            # The lease (the plan's longest time plus 15 s: over two minutes) runs out now, as time would end it.
            lease_until = time.time()
            with psycopg.connect(pg_url) as conn:
                conn.execute("UPDATE probe_jobs SET lease_until = %s WHERE id = %s", (lease_until, job_id))
            second = start_agent(tmp_path, "second", "site-a", base, [dest])

            def finished():
                assert second.poll() is None, (tmp_path / "second.log").read_text()
                with psycopg.connect(pg_url) as conn:
                    row = conn.execute("SELECT status, attempts FROM probe_jobs WHERE id = %s", (job_id,)).fetchone()
                return row if row[0] in ("done", "failed") else None

            # A remote agent's claim is judged by its lease alone.
            status, attempts = wait_for(finished, timeout_s=120, what="the second agent to finish the job")
            # The same job, claimed a second time (the dead agent's attempt counted) and finished by the second agent.
            assert (status, attempts) == ("done", 2)
            # The dead agent's attempt still counts in the site's probe-seconds: from its start to its lease's end.
            with psycopg.connect(pg_url) as conn:
                spent = conn.execute("SELECT src, started_at, seconds FROM spent_attempts WHERE job_id = %s",
                                     (job_id,)).fetchall()
            assert spent == [("site-a", started_at, pytest.approx(lease_until - started_at))]
            assert http.get("/v1/advice", params={"src": "site-a", "dest": dest, "max_impact": 0.2}).status_code == 200
    finally:
        for agent in (first, second):
            if agent is not None and agent.poll() is None:
                agent.kill()
                agent.wait(30)
        stop(serve)
        stop(iperf)
