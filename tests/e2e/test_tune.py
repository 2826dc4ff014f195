"""`vlfleet tune` on one host of the shared converged staging fleet: c1 only, short answers (16 tokens, 2 runs of 2
answers asked at once, so the batching engine is a candidate too). The converge shipped the tiny model as a GGUF
artifact and llama-server in the wheelhouse, so llamacpp is measured beside the OpenVINO engines.

The module's fixture runs the real command once over SSH; the tests then check its record (an engine, a score for
every engine), that c1's service restarted on the chosen engine (/readyz, the override file, `vlfleet status`), that
it answers through nginx on lb1 again, and that the checklist's ENGINE-TUNED check passes on it; then a pin runs
llamacpp from the shipped runtime. At the end c1 is put back as the converge left it (override and record removed,
restarted on the release's engine, in nginx), so later modules see the standard fleet.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ops.preflight.results import ChecklistRun
from service.runtime.contract import ENGINE_ENV_FILE, ENGINES, TUNED_FILE
from tests.e2e.hostcmd import sudo as _sudo

pytestmark = [pytest.mark.fleet, pytest.mark.slow]

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
HOST = "c1"
TOKENS, RUNS, CLIENTS = 16, 2, 2
RUN_TIMEOUT = 1200  # the whole tune of one host: a few restarts of the tiny model and 2 x 16 tokens per engine


def _vlfleet(*args: str, timeout: float = RUN_TIMEOUT) -> subprocess.CompletedProcess:
    started = time.monotonic()
    done = subprocess.run([str(BIN / "vlfleet"), *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    print(f"\n[tune] vlfleet {args[0]} took {time.monotonic() - started:.1f} s (exit {done.returncode})\n"
          + done.stdout[-4000:] + done.stderr[-2000:])
    return done


def _readyz(host: dict, timeout: float = 10) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(host["ansible_host"], 8000, timeout=timeout)
    try:
        conn.request("GET", "/readyz")
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    except (OSError, ValueError):
        return 0, {}
    finally:
        conn.close()


def _wait_ready(host: dict, timeout: float = 600) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # bounded: one look every 3 s
        status, body = _readyz(host)
        if status == 200:
            return body
        time.sleep(3)
    pytest.fail(f"{host['ansible_host']}: /readyz not 200 within {timeout:.0f} s")


@pytest.fixture(scope="module")
def hosts(staging_fleet) -> dict[str, dict]:
    from ops.staging.inventory import hosts_of

    return hosts_of(Path(staging_fleet.inventory_path))


@pytest.fixture(scope="module")
def tuned(converged_inventory, hosts, tmp_path_factory) -> dict:
    """`vlfleet tune --limit c1` once; afterwards c1 back on the release's engine, untuned, in nginx."""
    from ops.fleet import Fleet, load_inventory

    host = hosts[HOST]
    before = _wait_ready(host)
    out = tmp_path_factory.mktemp("tune")
    started = time.monotonic()
    try:
        done = _vlfleet("tune", "--inventory", str(converged_inventory), "--limit", HOST, "--tokens", str(TOKENS),
                        "--runs", str(RUNS), "--clients", str(CLIENTS), "--out", str(out), "--yes")
        yield {"done": done, "out": out, "before": before, "seconds": time.monotonic() - started}
    finally:
        _sudo(host, f"rm -f {ENGINE_ENV_FILE} {TUNED_FILE} && systemctl restart vlfleet", timeout=300)
        after = _wait_ready(host)
        with Fleet(load_inventory(converged_inventory), limit=[HOST], echo=None) as fleet:
            fleet.set_drained([], [HOST])  # a tune that failed half-way may have left it drained
        assert after.get("engine") == before.get("engine"), f"{HOST} not back on {before.get('engine')}: {after}"


@pytest.fixture(scope="module")
def record(tuned) -> dict:
    assert tuned["done"].returncode == 0, tuned["done"].stdout[-3000:] + tuned["done"].stderr[-2000:]
    return json.loads((tuned["out"] / f"tune-{HOST}.json").read_text())


def test_record_names_an_engine_and_scores_every_candidate(record, hosts):
    assert record["engine"] in ENGINES and record["host"] == HOST
    assert (record["tokens"], record["runs"], record["clients"], record["pinned"]) == (TOKENS, RUNS, CLIENTS, False)
    # the converge shipped the GGUF artifact and llama-server (in the release venv), and --clients makes batching a
    # candidate: every engine runs, hybrid included (the IR's vision with the GGUF's language model)
    assert set(record["candidates"]) == set(ENGINES) and not record["skipped"], record
    for engine, c in record["candidates"].items():
        assert c["status"] in ("ok", "over budget"), f"{engine}: {c}"
        assert c["score_s"] > 0 and len(c["totals_s"]) == RUNS * CLIENTS and c["peak_rss_bytes"] > 0, f"{engine}: {c}"
    assert record["cpu"]["model"] and "avx2" in record["cpu"]["isa"]
    # the host keeps the same record as the controller
    assert json.loads(_sudo(hosts[HOST], f"cat {TUNED_FILE}")) == record


def test_service_restarted_on_the_chosen_engine(record, tuned, hosts, converged_inventory):
    status, body = _readyz(hosts[HOST])
    assert status == 200 and body["engine"] == record["engine"], body
    assert body["uptime_s"] < tuned["seconds"], body  # a process tune started, not the converge's
    assert f"VLFLEET_ENGINE={record['engine']}" in _sudo(hosts[HOST], f"cat {ENGINE_ENV_FILE}").splitlines()
    done = _vlfleet("status", "--inventory", str(converged_inventory), "--only", HOST, timeout=300)
    assert done.returncode == 0 and f" {record['engine']}* " in done.stdout


def test_answers_through_nginx_again(record, hosts):
    lb = next(h for h in hosts.values() if "lb" in h["groups"])
    site = _sudo(lb, "cat /etc/nginx/sites-enabled/vlfleet")
    assert f"# {HOST}\n" in site, site  # not `# c1 (drained)`
    vlm = [h for h in hosts.values() if "vlm" in h["groups"]]
    for n in range(len(vlm)):  # round robin: one answer from each host, c1 included
        body = json.dumps({"messages": [{"role": "user", "content": f"Say hello to tuned host {n}."}],
                           "max_tokens": 4, "ignore_eos": True})
        conn = http.client.HTTPConnection(lb["ansible_host"], 80, timeout=120)
        try:
            conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            answer = json.loads(resp.read())
        finally:
            conn.close()
        assert resp.status == 200 and answer["usage"]["completion_tokens"] == 4, answer


def test_checklist_finds_the_tuned_engine_running(record, converged_inventory, tmp_path):
    done = _vlfleet("preflight", "--inventory", str(converged_inventory), "--hosts", HOST, "--json",
                    str(tmp_path / "report.json"), "--logs", str(tmp_path / "logs"))
    assert (tmp_path / "report.json").is_file(), done.stdout[-2000:] + done.stderr[-2000:]
    result = ChecklistRun.from_json(json.loads((tmp_path / "report.json").read_text())).get(HOST, "ENGINE-TUNED")
    assert result.status == "pass", result.message
    assert record["engine"] in result.message


def test_a_pin_runs_llamacpp_from_the_release_venv_on_its_gguf_artifact(record, hosts, converged_inventory,
                                                                         tmp_path):
    """The shipped llama.cpp runtime for real: pinned, c1 serves from the venv's llama-server and the GGUF artifact
    the env file names, and answers through nginx (the module's teardown puts c1 back)."""
    done = _vlfleet("tune", "--inventory", str(converged_inventory), "--limit", HOST, "--engine", "llamacpp",
                    "--tokens", "4", "--runs", "1", "--out", str(tmp_path), "--yes")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    pinned = json.loads((tmp_path / f"tune-{HOST}.json").read_text())
    assert (pinned["engine"], pinned["pinned"]) == ("llamacpp", True), pinned
    env = dict(line.split("=", 1) for line in _sudo(hosts[HOST], "cat /opt/vlfleet/current/vlfleet.env").splitlines()
               if "=" in line and not line.startswith("#"))
    gguf = json.loads(_sudo(hosts[HOST], f"cat {env['VLFLEET_LLAMACPP_MODEL_DIR']}/manifest.json"))
    status, body = _readyz(hosts[HOST])
    assert status == 200 and body["engine"] == "llamacpp" and body["artifact_id"] == gguf["artifact_id"], body
    children = _sudo(hosts[HOST], "ps -eo args | grep '[l]lama-server'")
    assert "/venv/lib/" in children and "vlfleet_llama_server/bin/llama-server" in children, children
    assert env["VLFLEET_LLAMACPP_MODEL_DIR"] in children, children
    test_answers_through_nginx_again(pinned, hosts)
