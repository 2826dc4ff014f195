"""The real service on the tiny model, started once per session (plus small variants for overload tests)."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import pytest
from PIL import Image

from tests import servers
from tests.prereq import require_tools


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


@pytest.fixture(scope="session")
def llama_server() -> Path:
    """The cached test build, or a build now (once per machine and CPU)."""
    from ops.llamacpp import build

    config = build.test_config()
    if build.find(config) is None:
        require_tools("cmake", "c++", "make")
    return build.build(config).binary("llama-server")


@pytest.fixture(scope="session")
def tiny_gguf(tiny_checkpoint) -> Path:
    """The tiny checkpoint as the default GGUF artifact (Q4_0 language model, q8_0 vision projector)."""
    from ops.llamacpp import build, gguf

    return gguf.cached("tiny", build_config=build.test_config())


@pytest.fixture(scope="session")
def llama_lib(llama_server) -> Path:
    """The hybrid engine's libvlfleet_llama.so, compiled against the test build of llama.cpp."""
    from ops.llamacpp import build, shim

    return shim.shim(build.find(build.test_config()))


def start_engine(name: str, request, tmp_path_factory, wait: bool = True, **env: str) -> servers.Server:
    """The service on engine ``name``: over the tiny model, or for llamacpp over its GGUF with the project's
    llama-server, or for hybrid over both (the IR's vision, the GGUF's language model)."""
    log_dir = tmp_path_factory.mktemp(f"{request.module.__name__.rsplit('.', 1)[-1]}-{name}")
    if name == "hybrid":
        gguf, lib = request.getfixturevalue("tiny_gguf"), request.getfixturevalue("llama_lib")
        env = {"VLFLEET_LLAMACPP_MODEL_DIR": str(gguf), "VLFLEET_LLAMACPP_LIB": str(lib), **env}
        return servers.start(request.getfixturevalue("tiny_model"), log_dir, wait, VLFLEET_ENGINE="hybrid", **env)
    if name == "llamacpp":
        gguf, binary = request.getfixturevalue("tiny_gguf"), request.getfixturevalue("llama_server")
        return servers.start(gguf, log_dir, wait, VLFLEET_ENGINE="llamacpp", VLFLEET_LLAMACPP_SERVER=str(binary),
                             VLFLEET_LLAMACPP_START_TIMEOUT="120", **env)
    return servers.start(request.getfixturevalue("tiny_model"), log_dir, wait, VLFLEET_ENGINE=name, **env)


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
