"""Every refusal the service makes is one its OpenAPI schema documents, with the documented body.

Fuzzing (tests/api/test_fuzz.py) rarely reaches these: a full probe queue, a body over its cap, a
destination outside the allow-list, a missing token. Each case here makes the refusal happen on a
live server, asserts it is the status meant, and has schemathesis validate the response against the
operation's documented responses (status, content type, headers, body).
"""

import pytest
import schemathesis

from api.boundary import OBSERVATION_BODY_BYTES

from tests.api.test_fuzz import CHECKS



def case(name, method, path, status, *, body=None, headers=None, settings=None, before=None, path_parameters=None):
    return pytest.param(method, path, status, body, headers or {}, settings or {}, before, path_parameters or {},
                        id=name)


SITE_TOKENS = {"token": "w", "site_tokens": (("site-a", "token-a"),)}


def fill_queue(client):
    assert client.post("/v1/probes", json={"dest": "127.0.0.1:5201"}).status_code == 202


def make_one_link(client):
    assert client.post("/v1/observations", json={"dest": "127.0.0.1", "streams": 1, "throughput_bps": 1e6}
                       ).status_code == 202


def hold_budget(client):
    assert client.put("/v1/sites/dtn2", json={"dests": ["127.0.0.1:5201"], "owner": "agent-1"}).status_code == 200


CASES = [
    case("read-without-token", "GET", "/v1/paths", 401, settings={"token": "w", "read_token": "r"}),
    case("write-without-token", "POST", "/v1/observations", 401,
         body={"dest": "127.0.0.1", "streams": 1, "throughput_bps": 1e6}, settings={"token": "w"}),
    case("metrics-without-token", "GET", "/metrics", 401, settings={"token": "w", "read_token": "r"}),
    case("probe-not-allowed", "POST", "/v1/probes", 403, body={"dest": "evil.test"}),
    case("observation-not-allowed", "POST", "/v1/observations", 403,
         body={"dest": "evil.test", "streams": 1, "throughput_bps": 1e6}),
    case("probe-queue-full", "POST", "/v1/probes", 429, body={"dest": "127.0.0.2:5201"},
         settings={"max_queued_probes": 1}, before=fill_queue),
    case("batch-too-large", "POST", "/v1/advice:batch", 413,
         body=[{"dest": "127.0.0.1", "max_impact": 0.1}] * 3, settings={"max_batch": 2}),
    case("observation-body-over-cap", "POST", "/v1/observations", 413,
         body={"dest": "127.0.0.1", "streams": 1, "throughput_bps": 1e6, "pad": "x" * (OBSERVATION_BODY_BYTES + 1)}),
    case("site-token-for-another-site-s-observation", "POST", "/v1/observations", 403,
         body={"src": "site-b", "dest": "127.0.0.1", "streams": 1, "throughput_bps": 1e6},
         headers={"Authorization": "Bearer token-a"}, settings=SITE_TOKENS),
    case("site-token-for-another-site-s-claims", "POST", "/v1/sites/{site}/claims", 403, body={"owner": "a"},
         headers={"Authorization": "Bearer token-a"}, settings=SITE_TOKENS, path_parameters={"site": "site-b"}),
    case("probe-run-not-allowed", "POST", "/v1/probe-runs", 403,
         body={"dest": "evil.test", "probes": [{"streams": 1, "throughput_bps": 1e6},
                                               {"streams": 10, "throughput_bps": 5e6}]}),
    case("observation-past-the-site-s-link-cap", "POST", "/v1/observations", 422,
         body={"dest": "127.0.0.2", "streams": 1, "throughput_bps": 1e6}, settings={"max_site_links": 1},
         before=make_one_link),
    case("site-budget-conflict", "PUT", "/v1/sites/{site}", 409, path_parameters={"site": "dtn2"},
         body={"dests": ["127.0.0.1:5201"], "max_probes": 2, "owner": "agent-2"}, before=hold_budget),
]


@pytest.mark.parametrize("method, path, status, body, headers, overrides, before, path_parameters", CASES)
def test_a_refusal_is_documented(service_factory, method, path, status, body, headers, overrides, before,
                                 path_parameters):
    base, client, app = service_factory(start_worker=False, **overrides)
    if before is not None:
        before(client)
    api = schemathesis.from_uri(f"{base}/openapi.json", base_url=base, force_schema_version="30",
                                headers={"Authorization": "Bearer r"} if overrides.get("read_token") else {})
    made = api[path][method].make_case(body=body, headers=headers, media_type="application/json",
                                       path_parameters=path_parameters)
    response = made.call(timeout=30)
    assert response.status_code == status, response.text
    made.validate_response(response, checks=CHECKS)


@pytest.mark.parametrize("method, path, body, path_parameters", [
    ("POST", "/v1/probes", '{"dest": "127.0.0.1:5201", "dest": "127.0.0.2:5201"}', {}),
    ("POST", "/v1/observations", '{"dest": "127.0.0.1", "streams": 1, "throughput_bps": 1e6, "streams": 2}', {}),
    ("POST", "/v1/probe-runs", '{"dest": "127.0.0.1", "probes": [{"streams": 1, "streams": 2, "throughput_bps": 1e6}]}',
     {}),
    ("POST", "/v1/advice:batch", '[{"dest": "127.0.0.1", "max_impact": 0.1, "max_impact": 1}]', {}),
    ("PUT", "/v1/sites/{site}", '{"dests": [], "owner": "a", "owner": "b"}', {"site": "dtn2"}),
    ("POST", "/v1/sites/{site}/claims", '{"owner": "a", "owner": "b"}', {"site": "dtn2"}),
], ids=["probe", "observation", "probe-run", "batch", "site", "claim"])
def test_a_key_given_twice_is_a_documented_refusal(service_factory, method, path, body, path_parameters):
    # A body a schema-made case cannot hold (its body is a dict): the case is sent with the raw text instead.
    base, client, app = service_factory(start_worker=False)
    api = schemathesis.from_uri(f"{base}/openapi.json", base_url=base, force_schema_version="30")
    made = api[path][method].make_case(body={}, media_type="application/json", path_parameters=path_parameters)
    response = made.call(timeout=30, data=body.encode())
    assert response.status_code == 422 and "twice in one object" in response.json()["detail"], response.text
    made.validate_response(response, checks=CHECKS)


@pytest.mark.parametrize("body, says", [
    (b'{"dest": "127.0.0.1", "streams": 1, "throughput_bps": 1e6, "src": "\xff"}', "not UTF-8"),
    (b'{"dest": "127.0.0.1", "streams": 1, "throughput_bps": 1e6, "src": ' + b"[" * 5000 + b"}", "too deeply"),
    (b'{"dest": "127.0.0.1", "throughput_bps": 1e6, "streams": ' + b"1" * 5000 + b"}", "digits"),
], ids=["not-utf-8", "nested-5000-deep", "5000-digit-number"])
def test_a_body_the_parser_cannot_read_is_a_documented_refusal(service_factory, tmp_path, body, says):
    # Were answered 400 "There was an error parsing the body", a status the schema does not document.
    base, client, app = service_factory(start_worker=False)
    api = schemathesis.from_uri(f"{base}/openapi.json", base_url=base, force_schema_version="30")
    made = api["/v1/observations"]["POST"].make_case(body={}, media_type="application/json")
    response = made.call(timeout=30, data=body)
    assert response.status_code == 422 and says in response.json()["detail"], response.text
    made.validate_response(response, checks=CHECKS)
    assert client.get("/v1/links").json()["links"] == []


def test_a_name_the_service_s_busy_lookups_never_started_is_a_503_to_send_again_not_a_422(service_factory):
    # Refused as a LookupTimedOut (422, "did not resolve within 5 s"), though never looked up: tame agent set such a
    # pushed run aside for good, as a 4xx is the request's own fault. A 503 with Retry-After it keeps and sends again.
    from api.client import TameError

    base, client, app = service_factory(start_worker=False)
    response = client.post("/v1/probe-runs", json={"dest": "busy.test", "probes": [
        {"streams": 1, "throughput_bps": 1e6}, {"streams": 10, "throughput_bps": 5e6}]})
    assert response.status_code == 503 and response.headers["Retry-After"] == "5"
    assert response.json()["detail"] == ("dest host 'busy.test' was not looked up: this service's 8 name lookups were "
                                         "all busy for 5 s: try again later, or give its address")
    assert TameError(503, response.json()["detail"]).retryable
    # Documented (the CHECKS of the cases above take any 5xx for a server error, so it is checked here).
    for path in ("/v1/probes", "/v1/probe-runs", "/v1/observations"):
        documented = client.get("/openapi.json").json()["paths"][path]["post"]["responses"]["503"]
        assert "name lookups were all busy" in documented["description"] and "Retry-After" in documented["headers"]


def test_a_name_that_did_not_resolve_in_time_is_a_503_and_tame_agent_keeps_the_run_to_send_again(service_factory,
                                                                                                  tmp_path, capsys):
    # A lookup past its deadline (LookupTimedOut) was an InvalidRequest, 422, though its message said "try again
    # later": tame agent --push set the run aside in its spool's rejected/ for good when the service's DNS was slow
    # once. Now it is a 503 with Retry-After, and the run stays in the spool, sent again next round.
    from advisor.commands.agent import _push
    from api.client import TameClient

    base, client, app = service_factory(start_worker=False)
    run = {"dest": "slow.test", "probes": [{"streams": 1, "throughput_bps": 1e6}, {"streams": 10, "throughput_bps": 5e6}]}
    response = client.post("/v1/probe-runs", json=run)
    assert response.status_code == 503 and response.headers["Retry-After"] == "5", response.text
    assert response.json()["detail"] == "dest host 'slow.test' did not resolve within 5 s: try again later, or give its address"
    spool = tmp_path / "spool"
    with TameClient(base) as remote:
        assert _push(remote, run, spool) is False
    assert len(list(spool.glob("*.json"))) == 1 and not (spool / "rejected").exists()
    assert "kept in" in capsys.readouterr().err
    for path in ("/v1/probes", "/v1/probe-runs", "/v1/observations"):
        documented = client.get("/openapi.json").json()["paths"][path]["post"]["responses"]["503"]
        assert "did not resolve within 5 s" in documented["description"] and "Retry-After" in documented["headers"]
