"""API fuzzing from the service's own OpenAPI document, with schemathesis' CLI as users run it.

`st run /openapi.json --max-examples 100` on the tiny model: no 5xx; every answer, error and SSE event matches
the documented schema; what the schema forbids is refused (JSON API); and no warning, in particular none that
says the schema and the validation disagree ("schema validation mismatch": generated valid requests mostly
rejected; "missing test data": mostly 404). The schema is generated from the models that validate requests.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests import servers

# Every documented operation but GET /openapi.json itself, which schemathesis leaves out as the schema's source.
OPERATIONS = {"POST /v1/chat/completions", "POST /chat", "GET /v1/models", "GET /healthz", "GET /readyz",
              "GET /metrics", "GET /"}
# schemathesis' checks (all are on by default) but positive_data_acceptance, as a schema can neither make a random
# data: URL a decodable image nor say that the last message is the user's, and those for auth and resources this API
# does not have. On /chat, "wrong type"
# mutations of a text field arrive as text all the same (a form has no numbers), so what the schema forbids is
# refused on the JSON API only.
CONFIG = """
[checks]
positive_data_acceptance.enabled = false
use_after_free.enabled = false
ensure_resource_availability.enabled = false
ignored_auth.enabled = false
object_level_authorization.enabled = false

[[operations]]
include-path = "/chat"
checks.negative_data_rejection.enabled = false
"""


@pytest.fixture(scope="module")
def fuzz_server(tiny_model, tmp_path_factory):
    # A small token cap so the requests it accepts stay short.
    server = servers.start(tiny_model, tmp_path_factory.mktemp("fuzz"), VLFLEET_MAX_TOKENS="32")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def report(fuzz_server, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("schemathesis")
    (out / "schemathesis.toml").write_text(CONFIG)
    cmd = [str(Path(sys.executable).with_name("st")), "--config-file", str(out / "schemathesis.toml"), "run",
           fuzz_server.url + "/openapi.json", "--max-examples", "100", "--seed", "1", "--workers", "1",
           "--request-timeout", "120", "--continue-on-failure", "--report", "json", "--report-dir", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=out, timeout=900)
    output = run.stdout[-6000:] + run.stderr[-2000:]
    found = list(out.glob("*.json"))
    assert len(found) == 1, f"no report from {' '.join(cmd)}:\n{output}"
    return {**json.loads(found[0].read_text()), "output": output}


def test_no_failures_and_no_errors(report):
    assert report["complete"] and report["exit_code"] == 0, report["output"]
    assert (report["failures"], report["errors"]) == ([], []), report["output"]
    assert report["operations"]["tested"] == len(OPERATIONS)


def test_no_warnings(report):
    raised = {name: ops for name, ops in report["warnings"].items() if ops}
    assert raised == {}, report["output"]


def test_valid_requests_are_served_in_every_phase(report):
    # Not one accepted positive case is what "schema validation mismatch" warns about; here each phase has some.
    assert set(report["valid_rates"]) == OPERATIONS
    for operation in ("POST /v1/chat/completions", "POST /chat"):
        phases = report["valid_rates"][operation]
        assert set(phases) == {"coverage", "fuzzing"}, phases
        assert all(rate["accepted"] >= 5 and rate["unreachable"] == 0 for rate in phases.values()), phases
    assert report["test_cases"]["generated"] >= 500  # really fuzzed, not cut short


def test_still_ready_after_fuzzing(fuzz_server, report):
    assert servers.get(fuzz_server.url + "/readyz")[0] == 200
