"""Schemathesis against the app's own OpenAPI schema through a live server: for any generated input,
no 5xx, and every response is what the schema says (its status documented, its content type and body
valid against the documented response)."""

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (content_type_conformance, not_a_server_error, response_headers_conformance,
                                 response_schema_conformance, status_code_conformance)

from tests.api.conftest import probe_and_wait

CHECKS = (not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance)


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
def test_every_generated_request_gets_a_response_the_schema_describes(case):
    case.call_and_validate(checks=CHECKS, timeout=30)
