"""Every kind of bad input gets a 4xx in OpenAI's error shape that says what to fix, and the service stays ready."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import urllib.request

import pytest
import requests
from PIL import Image

from tests import servers
from tests.integration.conftest import data_url, image_message, png_bytes

CHAT = "/v1/chat/completions"


def post(service, path: str, body: bytes, content_type: str = "application/json") -> tuple[int, dict]:
    request = urllib.request.Request(service.url + path, data=body, method="POST",
                                     headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def chat(service, body) -> tuple[int, dict]:
    return post(service, CHAT, json.dumps(body).encode())


def image_body(data: bytes, mime: str = "image/png") -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(data, mime)}},
                                                      {"type": "text", "text": "What is it?"}]}], "max_tokens": 2}


def truncated_png() -> bytes:
    return png_bytes((300, 200))[:200]


def bomb_png() -> bytes:
    buf = io.BytesIO()
    Image.new("1", (10_000, 10_000)).save(buf, "PNG")  # 100 M pixels, a few kB compressed
    return buf.getvalue()


def tiff_bytes() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (10, 10)).save(buf, "TIFF")
    return buf.getvalue()


CASES = {
    "not json": (lambda: b"{not json", 400, "invalid_json"),
    "json array": (lambda: b"[1, 2]", 400, "invalid_json"),
    "no messages": (lambda: json.dumps({"max_tokens": 3}).encode(), 400, "invalid_type"),
    "unknown field": (lambda: json.dumps({"messages": [image_message()], "frobnicate": 1}).encode(), 400,
                      "unknown_parameter"),
    "n over 8": (lambda: json.dumps({"messages": [image_message()], "n": 9}).encode(), 400, "invalid_value"),
    "top_logprobs over 20": (lambda: json.dumps({"messages": [image_message()], "logprobs": True,
                                                 "top_logprobs": 21}).encode(), 400, "invalid_value"),
    "functions": (lambda: json.dumps({"messages": [image_message()], "functions": [{"name": "f"}]}).encode(), 400,
                  "unsupported_parameter"),
    "tool without function": (lambda: json.dumps({"messages": [image_message()], "tools": [{"type": "function"}]})
                              .encode(), 400, "invalid_type"),
    "wrong role": (lambda: json.dumps({"messages": [{"role": "robot", "content": "x"}]}).encode(), 400,
                   "invalid_value"),
    "orphan tool result": (lambda: json.dumps({"messages": [{"role": "tool", "content": "x", "tool_call_id": "c"}]})
                           .encode(), 400, "invalid_value"),
    "last not user": (lambda: json.dumps({"messages": [image_message(), {"role": "assistant", "content": "x"}]})
                      .encode(), 400, "invalid_value"),
    "empty prompt": (lambda: json.dumps({"messages": [{"role": "user", "content": "   "}]}).encode(), 400,
                     "empty_prompt"),
    "runtime image tag in text": (lambda: json.dumps({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is <ov_genai_image_3>?"}]}]}).encode(), 400, "reserved_tag"),
    "bad temperature": (lambda: json.dumps({"messages": [image_message()], "temperature": 9}).encode(), 400,
                        "invalid_value"),
    "max_tokens zero": (lambda: json.dumps({"messages": [image_message()], "max_tokens": 0}).encode(), 400,
                        "invalid_value"),
    "stream_options without stream": (lambda: json.dumps({"messages": [image_message()],
                                                          "stream_options": {"include_usage": True}}).encode(),
                                      400, "invalid_value"),
    "wrong model": (lambda: json.dumps({"model": "gpt-9", "messages": [image_message()]}).encode(), 404,
                    "model_not_found"),
    "too many images": (lambda: json.dumps({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(png_bytes())}}] * 5}]}).encode(), 400, "too_many_images"),
    "not base64": (lambda: json.dumps({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@@"}}]}]}).encode(), 400, "invalid_image"),
    "http url disabled": (lambda: json.dumps({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}}]}]}).encode(), 400,
                          "image_url_disabled"),
    "zero-byte image": (lambda: json.dumps(image_body(b"")).encode(), 400, "invalid_image"),
    "undecodable image": (lambda: json.dumps(image_body(b"hello, not an image")).encode(), 415,
                          "unsupported_image_format"),
    "truncated png": (lambda: json.dumps(image_body(truncated_png())).encode(), 400, "invalid_image"),
    "unsupported format": (lambda: json.dumps(image_body(tiff_bytes(), "image/tiff")).encode(), 415,
                           "unsupported_image_format"),
    "decompression bomb": (lambda: json.dumps(image_body(bomb_png())).encode(), 413, "image_too_large"),
    "image over byte limit": (lambda: json.dumps(image_body(b"\x89PNG" + b"\0" * (11 * 1024 * 1024))).encode(),
                              413, "image_too_large"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_chat_request_gets_clear_4xx(service, case):
    make, status, code = CASES[case]
    got, body = post(service, CHAT, make())
    assert got == status, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    assert len(error["message"]) > 10


def test_wrong_content_type_is_415(service):
    got, body = post(service, CHAT, json.dumps({"messages": [image_message()]}).encode(), "text/plain")
    assert got == 415 and "application/json" in body["error"]["message"]


def test_body_over_limit_is_413(service, tmp_path):
    # curl, because the server answers before the upload ends and a naive client only sees the broken pipe.
    big = tmp_path / "big.json"
    big.write_bytes(b"x" * (25 * 1024 * 1024))
    out = subprocess.run(["curl", "-sS", "--max-time", "60", "-H", "Content-Type: application/json",
                          "--data-binary", f"@{big}", "-w", "\n%{http_code}", service.url + CHAT],
                         capture_output=True, text=True).stdout
    body, _, status = out.rpartition("\n")
    assert status == "413"
    assert "VLFLEET_MAX_BODY_BYTES" in json.loads(body)["error"]["message"]


def test_unknown_endpoint_is_json_404(service):
    status, body = servers.get(service.url + "/v2/nothing")
    assert status == 404 and body["error"]["code"] == "not_found"


@pytest.mark.parametrize("mode", ["CMYK", "P", "LA", "I;16"])
def test_odd_image_modes_are_accepted(service, mode):
    fmt = "JPEG" if mode == "CMYK" else "PNG"
    buf = io.BytesIO()
    Image.new(mode, (40, 30)).save(buf, fmt)
    got, body = chat(service, image_body(buf.getvalue(), f"image/{fmt.lower()}"))
    assert got == 200, body


def test_animated_gif_uses_first_frame(service):
    frames = [Image.new("RGB", (32, 32), c) for c in ((255, 0, 0), (0, 255, 0))]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:])

    def ask(data: bytes, mime: str) -> requests.Response:
        body = image_body(data, mime)
        body["messages"][0]["content"][1]["text"] = "Which frame of the GIF is this?"  # its own answer-cache key
        return requests.post(service.url + CHAT, json=body, timeout=60)

    gif = ask(buf.getvalue(), "image/gif")
    assert gif.status_code == 200, gif.text
    # The answer cache is keyed by the pixels the model got: the first frame's as a PNG hits, the second's misses.
    first, second = (ask(png_bytes((32, 32), color), "image/png") for color in ((255, 0, 0), (0, 255, 0)))
    assert (gif.headers["X-Cache"], first.headers["X-Cache"], second.headers["X-Cache"]) == ("miss", "hit", "miss")
    assert first.json()["choices"][0]["message"]["content"] == gif.json()["choices"][0]["message"]["content"]


def test_chat_endpoint_rejects_bad_forms(service):
    got, body = post(service, "/chat", b"question=hi", "application/x-www-form-urlencoded")
    assert got == 415 and "multipart/form-data" in body["error"]["message"]
    boundary = "XyZ"
    form = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"question\"\r\n\r\nhello\r\n--{boundary}--\r\n")
    got, body = post(service, "/chat", form.encode(), f"multipart/form-data; boundary={boundary}")
    assert got == 400 and body["error"]["code"] == "missing_image"


def _multipart(boundary: str, **fields: str) -> bytes:
    parts = [f"--{boundary}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n" for k, v in fields.items()]
    return ("".join(parts) + f"--{boundary}--\r\n").encode()


@pytest.mark.parametrize(("response_format", "param", "code"), [
    ("{not json", "response_format", "invalid_json"),
    ('{"type": "xml"}', "response_format.type", "invalid_value"),
    ('{"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}', "response_format.json_schema.name",
     "invalid_value"),
    ('{"type": "json_schema"}', "response_format.json_schema", "invalid_type"),
])
def test_chat_endpoint_names_a_bad_response_format(service, response_format, param, code):
    boundary = "XyZ"
    form = _multipart(boundary, question="hello", session="abc", response_format=response_format)
    got, body = post(service, "/chat", form, f"multipart/form-data; boundary={boundary}")
    assert got == 400, body
    assert (body["error"]["param"], body["error"]["code"]) == (param, code), body


def test_service_still_ready_after_abuse(service):
    status, ready = servers.get(service.url + "/readyz")
    assert status == 200 and ready["ready"] is True
    got, body = chat(service, {"messages": [image_message()], "max_tokens": 2})
    assert got == 200 and body["choices"][0]["message"]["content"] is not None


def test_base64_helper_roundtrip():
    # Guards the test helper itself: data URLs carry the exact bytes.
    raw = png_bytes()
    assert base64.b64decode(data_url(raw).split(",", 1)[1]) == raw
