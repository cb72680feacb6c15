"""Schemathesis against the app's own OpenAPI schema through a live server: no 5xx for any generated input."""

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from tests.api.conftest import probe_and_wait


@pytest.fixture
def api_schema(service_factory):
    base, client, app = service_factory()
    probe_and_wait(client)  # one known destination, so some generated reads reach the advice code
    app.state.worker.stop()  # generated probe requests stay queued: no traffic
    # FastAPI emits OpenAPI 3.1; schemathesis 3 fuzzes it as 3.0 when told to.
    return schemathesis.from_uri(f"{base}/openapi.json", base_url=base, force_schema_version="30")


schema = schemathesis.from_pytest_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_generated_request_gets_a_5xx(case):
    response = case.call(timeout=30)
    assert response.status_code < 500, f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text}"
