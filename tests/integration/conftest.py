"""The real service on the tiny model, started once per session (plus small variants for overload tests)."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from tests import servers


@pytest.fixture(scope="session")
def service(tiny_model, tmp_path_factory):
    # A high token cap so tests can hold the inference thread busy with ignore_eos requests; follow-ups carry such
    # answers, so the prompt limit is raised too (tests/integration/test_prompt_limits.py tests the limits).
    # The answer cache is on (its default), and consulted before the engine with a key that ignores `stream` and the
    # web UI's session: a test that compares one answer with another makes each one its own key (a seed, which
    # greedy decoding ignores) and asserts X-Cache: miss on both (test_api_clients.generated).
    server = servers.start(tiny_model, tmp_path_factory.mktemp("service"), VLFLEET_MAX_TOKENS="4096",
                           VLFLEET_MAX_INPUT_TOKENS="65536")
    yield server
    server.stop()


def start_engine(name: str, request, tmp_path_factory, **env: str) -> servers.Server:
    """The service on engine ``name``: over the tiny model, or for llamacpp over its GGUF with the project's
    llama-server (the requesting module imports test_llamacpp_engine's tiny_gguf and llama_server fixtures)."""
    log_dir = tmp_path_factory.mktemp(f"{request.module.__name__.rsplit('.', 1)[-1]}-{name}")
    if name == "llamacpp":
        gguf, binary = request.getfixturevalue("tiny_gguf"), request.getfixturevalue("llama_server")
        return servers.start(gguf, log_dir, VLFLEET_ENGINE="llamacpp", VLFLEET_LLAMACPP_SERVER=str(binary),
                             VLFLEET_LLAMACPP_START_TIMEOUT="120", **env)
    return servers.start(request.getfixturevalue("tiny_model"), log_dir, VLFLEET_ENGINE=name, **env)


def chat_text(client, stream: bool, **kwargs) -> tuple[str, str | None]:
    """A chat completion's text and finish reason with the openai SDK, streamed or not."""
    if not stream:
        out = client.chat.completions.create(**kwargs)
        return out.choices[0].message.content, out.choices[0].finish_reason
    text, finish = [], None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    return "".join(text), finish


def png_bytes(size=(96, 64), color=(200, 40, 40), mode="RGB", fmt="PNG") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, color).save(buf, fmt)
    return buf.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def image_message(question: str = "What is in this image?", data: bytes | None = None) -> dict:
    return {"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(data or png_bytes())}},
        {"type": "text", "text": question},
    ]}
