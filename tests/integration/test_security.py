"""API keys, the warning for public binds, and the SSRF guard on image URLs."""

from __future__ import annotations

import pytest
import requests
from openai import AuthenticationError, OpenAI

from service.http.image_source import _domain_allowed
from tests import servers
from tests.integration.conftest import image_message

KEY = "vlf-test-key-6e1f0c2b9d"  # planted: must never show up in logs


@pytest.fixture(scope="module")
def keyed(tiny_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("keys")
    keys = tmp / "api-keys"
    keys.write_text(f"# one key per line\n{KEY}\nsecond-key-abc\n")
    keys.chmod(0o600)
    server = servers.start(tiny_model, tmp, VLFLEET_API_KEYS_FILE=str(keys),
                           VLFLEET_IMAGE_URL_DOMAINS="localhost,example.test")
    yield server
    server.stop()


@pytest.mark.parametrize("path", ["/v1/models", "/metrics", "/openapi.json", "/"])
def test_endpoints_need_a_key(keyed, path):
    none = requests.get(keyed.url + path, timeout=10)
    assert none.status_code == 401 and none.json()["error"]["code"] == "missing_api_key"
    wrong = requests.get(keyed.url + path, headers={"Authorization": "Bearer nope"}, timeout=10)
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    for key in (KEY, "second-key-abc"):  # every key in the file opens it, not only the first
        assert requests.get(keyed.url + path, headers={"Authorization": f"Bearer {key}"}, timeout=10).status_code == 200


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_probes_stay_open(keyed, path):
    assert requests.get(keyed.url + path, timeout=10).status_code == 200


def test_openai_client_with_and_without_key(keyed):
    good = OpenAI(base_url=keyed.url + "/v1", api_key=KEY, max_retries=0)
    answer = good.chat.completions.create(model="qwen3-vl-2b-instruct", messages=[image_message()], max_tokens=2,
                                          extra_body={"ignore_eos": True})
    assert answer.model == "qwen3-vl-2b-instruct"
    assert answer.choices[0].finish_reason == "length" and answer.usage.completion_tokens == 2
    with pytest.raises(AuthenticationError) as refused:
        OpenAI(base_url=keyed.url + "/v1", api_key="wrong", max_retries=0).models.list()
    assert refused.value.status_code == 401
    assert refused.value.body["code"] == "invalid_api_key"


def test_key_never_logged(keyed):
    ids = {"accepted": "key-log-accepted", "refused": "key-log-refused"}
    ok = requests.get(keyed.url + "/v1/models", timeout=10,
                      headers={"Authorization": f"Bearer {KEY}", "X-Request-Id": ids["accepted"]})
    bad = requests.get(keyed.url + "/v1/models", timeout=10,
                       headers={"Authorization": f"Bearer {KEY}x", "X-Request-Id": ids["refused"]})
    assert (ok.status_code, bad.status_code) == (200, 401)
    # Both requests are in the log (it is not merely empty), and the key is not.
    servers.wait_for(lambda: all(f'"request_id": "{i}"' in keyed.log() for i in ids.values()), 10,
                     "both requests to be logged")
    assert KEY not in keyed.log()


def test_image_url_to_loopback_is_refused_even_when_allow_listed(keyed):
    body = {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"http://localhost:{keyed.port}/static/style.css"}}]}]}
    r = requests.post(keyed.url + "/v1/chat/completions", json=body, timeout=10,
                      headers={"Authorization": f"Bearer {KEY}"})
    error = r.json()["error"]
    assert r.status_code == 403 and error["code"] == "image_url_forbidden"
    assert error["message"] == "image host localhost resolves to a non-public address; refused"


def test_image_url_from_other_domain_is_refused(keyed):
    body = {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://evil.example/cat.png"}}]}]}
    r = requests.post(keyed.url + "/v1/chat/completions", json=body, timeout=10,
                      headers={"Authorization": f"Bearer {KEY}"})
    error = r.json()["error"]
    assert r.status_code == 403 and error["code"] == "image_url_forbidden"
    assert error["message"] == "image URLs from evil.example are not allowed; send a data: URL"


def test_domain_allow_list_matches_subdomains_only():
    allowed = ("example.test",)
    assert _domain_allowed("example.test", allowed) is True
    assert _domain_allowed("img.example.test", allowed) is True
    assert _domain_allowed("badexample.test", allowed) is False
    assert _domain_allowed("example.test.evil", allowed) is False


def test_public_bind_without_keys_warns(tiny_model, tmp_path, keyed):
    warning = "binding 0.0.0.0 without API keys: anyone who can reach this address can use the model"
    server = servers.start(tiny_model, tmp_path, VLFLEET_HOST="0.0.0.0")
    try:
        assert warning in server.log()
    finally:
        server.stop()
    assert "without API keys" not in keyed.log()  # loopback with keys: no warning
