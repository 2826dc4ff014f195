"""Security on the staging fleet: no planted secret leaks anywhere an operator or an attacker could read it, the
artifact and the release are read-only to the service user, env files are 0640, the unit's exposure is <= 3.0.

Planted secrets: a fake hub token in HF_TOKEN for a fetch and for a converge, and an API key that one host (the
first service host) is made to require through the role (that converge: limited to the host, with
vlm_service_api_keys set, on the fleet the session's site.yml run converged). After requests without, with a wrong
and with the right key, the test greps the fetch and Ansible output, the checklist's report, every host's journal,
nginx's logs and process lists (hosts and controller) for both strings. A last limited converge without keys puts
the host back (file removed, API open).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from tests.e2e.hostcmd import sudo as _sudo
from tests.e2e.site_vars import converge, site_vars
from tests.reports import record

pytestmark = [pytest.mark.fleet, pytest.mark.slow]

HUB_TOKEN = "hf_vlfleetPLANTEDtoken7Q2x9ZkWm4"
API_KEY = "vlf-planted-key-3c9e1a7f5b2d"
ENV_FILE = "/opt/vlfleet/current/vlfleet.env"
BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]


def _request(address: str, port: int, method: str, path: str, key: str | None = None,
             body: dict | None = None) -> int:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    conn = http.client.HTTPConnection(address, port, timeout=120)
    try:
        conn.request(method, path, json.dumps(body) if body else None, headers)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def _wait_ready(address: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # bounded: one probe every 2 s
        try:
            if _request(address, 8000, "GET", "/readyz") == 200:
                return
        except OSError:
            pass
        time.sleep(2)
    pytest.fail(f"{address}: /readyz not 200 within {timeout:.0f} s")


@pytest.fixture(scope="module")
def hosts(request) -> dict[str, dict]:
    from ops.staging.inventory import hosts_of

    return hosts_of(_inventory_path(request))


def _inventory_path(request) -> Path:
    # VLFLEET_FAULTS_INVENTORY=PATH runs these against another staging fleet (as tests/e2e/test_faults.py does).
    given = os.environ.get("VLFLEET_FAULTS_INVENTORY")
    return Path(given) if given else Path(request.getfixturevalue("converged_inventory"))


@pytest.fixture(scope="module")
def planted(request, hosts, tiny_checkpoint: Path, tiny_model: Path, tmp_path_factory):
    """Plant both secrets, converge, fetch, make requests; yields what the controller saw. Restores the host."""
    from ops.playbook import run_playbook
    from ops.preflight.runner import Options, run_host

    inventory = _inventory_path(request)
    converge(inventory, tiny_model)  # the session's converge (a no-op here when it already ran)
    tmp = tmp_path_factory.mktemp("secrets")
    env = {**os.environ, "HF_TOKEN": HUB_TOKEN}
    # A fetch with the token in the environment (a local tarball: no network; the token must still stay quiet).
    tarball = tmp / "checkpoint.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(tiny_checkpoint, arcname="checkpoint")
    fetch = subprocess.run([str(BIN / "vlfleet"), "model.fetch", "--source", str(tarball), "--out", str(tmp / "ckpt")],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert fetch.returncode == 0, fetch.stdout + fetch.stderr
    name = next(n for n, h in hosts.items() if "vlm" in h["groups"])
    host = hosts[name]
    lb = next(h for h in hosts.values() if "lb" in h["groups"])
    extra = site_vars(tiny_model)
    old = os.environ.get("HF_TOKEN")
    os.environ["HF_TOKEN"] = HUB_TOKEN  # the converge runs with the token in the controller's environment
    try:
        keyed = run_playbook(inventory, "site.yml", {**extra, "vlm_service_api_keys": [API_KEY]}, limit=name,
                             timeout=1800, echo=None)
    finally:
        if old is None:
            os.environ.pop("HF_TOKEN", None)
        else:
            os.environ["HF_TOKEN"] = old
    try:
        assert keyed.ok, keyed.summary()
        _wait_ready(host["ansible_host"])
        chat = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2}
        statuses = {
            "no key": _request(host["ansible_host"], 8000, "POST", "/v1/chat/completions", None, chat),
            "wrong key": _request(host["ansible_host"], 8000, "POST", "/v1/chat/completions", API_KEY + "x", chat),
            "right key": _request(host["ansible_host"], 8000, "POST", "/v1/chat/completions", API_KEY, chat),
            "readyz": _request(host["ansible_host"], 8000, "GET", "/readyz"),
            # nginx sees a key too (its logs are grepped below); any upstream may answer.
            "through lb, wrong key": _request(lb["ansible_host"], 80, "GET", "/v1/models", API_KEY + "x"),
        }
        checklist = run_host(name, inventory, Options(), tmp)
        seen = {"fetch output": fetch.stdout + fetch.stderr, "ansible output": keyed.output,
                "checklist report": (tmp / f"{name}.json").read_text() + (tmp / f"{name}.log").read_text(),
                "controller process list": subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True,
                                                          timeout=30).stdout}
        for n, h in hosts.items():
            seen[f"{n} journal"] = _sudo(h, "journalctl --no-pager -o cat --since '-2h'", timeout=300)
            seen[f"{n} process list"] = _sudo(h, "ps -eo args")
            seen[f"{n} /var/log"] = _sudo(h, "grep -rIh -e vlf-planted -e hf_vlfleet /var/log /opt/vlfleet/current "
                                             "/var/cache/vlfleet 2>/dev/null || true")
        yield {"name": name, "statuses": statuses, "seen": seen, "checklist": checklist}
    finally:
        restored = run_playbook(inventory, "site.yml", extra, limit=name, timeout=1800, echo=None)
        assert restored.ok, restored.summary()
        _wait_ready(host["ansible_host"])


def test_keys_are_enforced_on_the_keyed_host(planted):
    s = planted["statuses"]
    assert (s["no key"], s["wrong key"], s["right key"], s["readyz"]) == (401, 401, 200, 200), s


def test_checklist_stream_check_uses_the_key_on_the_host(planted):
    stream = planted["checklist"].get(planted["name"], "SVC-STREAM")
    assert stream is not None and stream.status == "pass", stream


@pytest.mark.parametrize("secret", [HUB_TOKEN, API_KEY], ids=["hub token", "api key"])
def test_planted_secret_appears_nowhere(planted, secret):
    leaks = {where: text[max(0, text.find(secret) - 120):text.find(secret) + 60]
             for where, text in planted["seen"].items() if secret in text}
    assert not leaks, f"{secret[:8]}... found in: {leaks}"


def test_artifact_and_release_read_only_to_the_service_user(planted, hosts):
    for name, host in hosts.items():
        if "vlm" not in host["groups"]:
            continue
        env = _sudo(host, f"cat {ENV_FILE}")
        model_dir = re.search(r"^VLFLEET_MODEL_DIR=(.*)$", env, re.M).group(1)
        release = _sudo(host, "readlink -f /opt/vlfleet/current").strip()
        # As the service user: nothing in the artifact or the release may be writable (files or directories).
        writable = _sudo(host, f"setpriv --reuid=vlfleet --regid=vlfleet --init-groups find {model_dir} {release} "
                               "-writable -print -quit 2>/dev/null; true").strip()
        assert not writable, f"{name}: {writable} is writable by the service user"
        modes = _sudo(host, "stat -c '%a %U:%G %n' /opt/vlfleet/releases/*/vlfleet.env").splitlines()
        assert modes and all(m.startswith("640 root:vlfleet ") for m in modes), f"{name}: {modes}"


def test_unit_exposure_at_most_3(planted, hosts):
    levels = {}
    for name, host in hosts.items():
        if "vlm" in host["groups"]:
            report = _sudo(host, "systemd-analyze security --no-pager vlfleet.service")
            levels[name] = float(re.search(r"Overall exposure level for vlfleet.service: ([0-9.]+)", report).group(1))
    print(f"\n[security] systemd-analyze security exposure: {levels}")
    assert levels and max(levels.values()) <= 3.0, levels
    record("security-exposure", {"levels": levels, "limit": 3.0})  # docs/reliability.md is generated from it
