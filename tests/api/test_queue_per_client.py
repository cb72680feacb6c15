"""One client cannot fill the probe queue: queued jobs are bounded per remote address as well as in total."""

import sqlite3

import httpx
import pytest

from advisor.errors import ConfigError
from advisor.settings import Settings
from tests.api.procs import start_serve, stop


def queued_by_client(app):
    with app.state.service.store.db.transaction() as tx:
        return dict(tx.execute("SELECT client, count(*) FROM probe_jobs WHERE status = 'queued' "
                               "GROUP BY client").fetchall())


def test_a_client_gets_429_past_its_share_and_others_still_queue(service_factory):
    base, client, app = service_factory(start_worker=False, max_queued_probes_per_client=2)
    for n in (1, 2):
        assert client.post("/v1/probes", json={"dest": f"127.0.0.{n}"}).status_code == 202
    full = client.post("/v1/probes", json={"dest": "127.0.0.3"})
    assert full.status_code == 429 and "per client" in full.json()["detail"]
    assert int(full.headers["Retry-After"]) >= 1
    # Asking again for a destination already queued is not a new job: still answered.
    assert client.post("/v1/probes", json={"dest": "127.0.0.1"}).json()["created"] is False
    # Another client (another source address on loopback) has a share of its own.
    other = httpx.Client(base_url=base, timeout=30, transport=httpx.HTTPTransport(local_address="127.0.0.2"))
    try:
        assert other.post("/v1/probes", json={"dest": "127.0.0.3"}).status_code == 202
    finally:
        other.close()
    assert queued_by_client(app) == {"127.0.0.1": 2, "127.0.0.2": 1}


# -- the client is the address that connected, unless the operator names its proxies (TAME_FORWARDED_ALLOW_IPS) ----

def post_probes_as(base, count):
    """``count`` probe requests from loopback, each for its own destination and claiming its own X-Forwarded-For."""
    with httpx.Client(base_url=base, timeout=30) as client:
        return [client.post("/v1/probes", json={"dest": f"127.0.0.{n}"},
                            headers={"X-Forwarded-For": f"203.0.113.{n}"}).status_code for n in range(1, count + 1)]


def clients_in(db_path):
    with sqlite3.connect(db_path) as conn:
        return dict(conn.execute("SELECT client, count(*) FROM probe_jobs GROUP BY client").fetchall())


@pytest.mark.parametrize("trusted, statuses, clients", [
    # By default no header is believed: 60 requests from one address are one client, capped at 50.
    ("", [202] * 50 + [429] * 10, {"127.0.0.1": 50}),
    # The operator's proxy (here loopback) is believed: each request is the client its header names.
    ("127.0.0.1", [202] * 60, {f"203.0.113.{n}": 1 for n in range(1, 61)}),
])
def test_x_forwarded_for_counts_only_from_a_trusted_proxy(tmp_path, monkeypatch, trusted, statuses, clients):
    monkeypatch.delenv("FORWARDED_ALLOW_IPS", raising=False)  # uvicorn's own variable, which tame serve ignores
    db_path = tmp_path / "t.sqlite3"
    proc, base = start_serve(tmp_path, db_path, env={"TAME_FORWARDED_ALLOW_IPS": trusted}, args=("--no-worker",))
    try:
        assert post_probes_as(base, 60) == statuses
    finally:
        stop(proc)
    assert clients_in(db_path) == clients


# Spellings of one client, as a proxy may write them in X-Forwarded-For; each group holds 3 requests, one past the cap
# of 2. A host that is not an address is kept as the header gives it.
SPELLINGS = [("10.0.0.5", "::ffff:10.0.0.5", "[::FFFF:a00:5]:4321"), ("::1", "0:0::1", "0000:0000:0000::0001"),
             ("2001:DB8::7", "2001:db8:0:0::7", "[2001:db8::0:7]"), ("gateway", "gateway", "gateway"),
             # Three addresses of one IPv6 /64: one client, as a host may take any address of its /64.
             ("2001:db8:0:1::1", "2001:db8:0:1::2", "2001:db8:0:1:ffff::9")]


def test_a_client_behind_a_trusted_proxy_cannot_escape_its_cap_by_spelling_its_address_again(tmp_path, monkeypatch):
    monkeypatch.delenv("FORWARDED_ALLOW_IPS", raising=False)
    db_path = tmp_path / "t.sqlite3"
    proc, base = start_serve(tmp_path, db_path, args=("--no-worker",),
                             env={"TAME_FORWARDED_ALLOW_IPS": "127.0.0.1", "TAME_MAX_QUEUED_PROBES_PER_CLIENT": "2"})
    try:
        with httpx.Client(base_url=base, timeout=30) as client:
            statuses = [[client.post("/v1/probes", json={"dest": f"127.0.{group}.{n}"},
                                     headers={"X-Forwarded-For": spelling}).status_code
                         for n, spelling in enumerate(spellings, 1)] for group, spellings in enumerate(SPELLINGS)]
    finally:
        stop(proc)
    assert statuses == [[202, 202, 429]] * len(SPELLINGS)
    # An IPv6 client is its /64 (but ::1).
    assert clients_in(db_path) == {"10.0.0.5": 2, "::1": 2, "2001:db8::/64": 2, "gateway": 2, "2001:db8:0:1::/64": 2}


def test_a_dual_stack_listener_counts_an_ipv4_client_under_its_ipv4_address(tmp_path):
    # Listening on ::, the kernel hands IPv4 connections over as ::ffff:127.0.0.1; no header is involved.
    db_path = tmp_path / "t.sqlite3"
    proc, base = start_serve(tmp_path, db_path, args=("--no-worker", "--host", "::"),
                             env={"TAME_MAX_QUEUED_PROBES_PER_CLIENT": "2"})
    try:
        with httpx.Client(timeout=30) as client:
            statuses = [client.post(f"{root}/v1/probes", json={"dest": f"127.0.0.{n}"}).status_code
                        for n, root in enumerate([base, base, base.replace("127.0.0.1", "[::1]"), base], 1)]
    finally:
        stop(proc)
    assert statuses == [202, 202, 202, 429]
    assert clients_in(db_path) == {"127.0.0.1": 2, "::1": 1}


@pytest.mark.parametrize("value, says", [
    ("*", "would let every client say who it is"),
    ("10.0.0.1/8", "is not an address or CIDR network of a trusted proxy"),
    ("proxy.example.org", "is not an address or CIDR network"),
])
def test_a_bad_forwarded_allow_ips_is_refused_naming_the_variable(value, says):
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({"TAME_FORWARDED_ALLOW_IPS": value})
    assert str(raised.value).startswith(f"TAME_FORWARDED_ALLOW_IPS: {value!r}") and says in str(raised.value)


def test_forwarded_allow_ips_are_read_as_networks():
    assert Settings.from_env({}).forwarded_allow_ips == ()
    assert Settings.from_env({"TAME_FORWARDED_ALLOW_IPS": " 127.0.0.1, 10.0.0.0/24,::1,"}).forwarded_allow_ips == (
        "127.0.0.1/32", "10.0.0.0/24", "::1/128")
