"""API fuzzing from the service's own OpenAPI document: no 5xx, errors in the documented shape, still ready.

Cases come from schemathesis' strategies for each operation, driven by hypothesis directly (schemathesis'
pytest plugin does not load under this pytest).
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests import servers

EXAMPLES_PER_OPERATION = 40


@pytest.fixture(scope="module")
def fuzz_server(tiny_model, tmp_path_factory):
    # Default token cap (128) so generated requests stay short; a small queue so overload paths are exercised too.
    server = servers.start(tiny_model, tmp_path_factory.mktemp("fuzz"), VLFLEET_QUEUE_SIZE="4")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def operations(fuzz_server):
    schema = schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")
    return {f"{op.method.upper()} {op.path}": op for op in (r.ok() for r in schema.get_all_operations())}


# Every documented operation but GET /openapi.json itself, which schemathesis leaves out as the schema's source.
OPERATIONS = ["POST /v1/chat/completions", "POST /chat", "GET /v1/models", "GET /healthz", "GET /readyz",
              "GET /metrics", "GET /"]


@pytest.mark.parametrize("name", OPERATIONS)
def test_operation_never_fails_on_the_server_side(operations, name):
    assert set(operations) == set(OPERATIONS), "the OpenAPI document and this list disagree"
    seen: list[int] = []

    @given(case=operations[name].as_strategy())
    @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, suppress_health_check=list(HealthCheck),
              derandomize=True, database=None)
    def check(case):
        response = case.call(timeout=120)
        seen.append(response.status_code)
        assert response.status_code < 500, response.text[:500]
        if response.status_code >= 400:
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert error["message"]

    check()
    # Operations without inputs have one distinct case; the others must really have been fuzzed.
    assert len(seen) >= (EXAMPLES_PER_OPERATION // 2 if name.startswith("POST") else 1)
    print(name, {code: seen.count(code) for code in sorted(set(seen))})


def test_still_ready_after_fuzzing(fuzz_server):
    assert servers.get(fuzz_server.url + "/readyz")[0] == 200
