"""What the llamacpp engine says to its llama-server: the request for a job, its streamed answer, token counts.

A job is one streamed ``/v1/chat/completions`` request: the whole conversation as OpenAI messages, each image as a
lossless PNG data URL of the pixels the service prepared (the same pixels give the same bytes, so llama.cpp's
image-chunk hash matches on a follow-up), ``cache_prompt`` on, so the KV of the turns the slot has already seen is
re-used and only the new turns are prefilled. Sampling is the job's: temperature 0 is greedy; top-k and min-p are
switched off so a sampled answer follows the same two knobs (temperature, top_p) as on the OpenVINO engines.

Only the standard library: the service's hosts install no HTTP client package.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import io
import json
import socket
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

from service.engine.conversation import Conversation, ResponseFormat, Sampling
from service.engine.genai import CALL_CLOSE, CALL_OPEN
from service.engine.images import PreparedImage

STALL_TIMEOUT_S = 600.0  # longest silence from llama-server (a long prefill sends nothing) before we give up
CALL_TIMEOUT_S = 30.0  # /apply-template, /tokenize, /props
_PNG_CACHE: OrderedDict[str, str] = OrderedDict()  # digest -> data URL: a follow-up re-sends the same image
_PNG_CACHE_ENTRIES = 16
_png_lock = threading.Lock()


@dataclass(frozen=True)
class Endpoint:
    """Where the running llama-server listens, and the key it wants (a fresh random one per start, so other
    processes on the host cannot use it past the service's own admission, limits and API keys)."""

    port: int
    key: str

    def headers(self, body: bool = True) -> dict[str, str]:
        auth = {"Authorization": f"Bearer {self.key}"}
        return {**auth, "Content-Type": "application/json"} if body else auth


class LlamaServerError(RuntimeError):
    """llama-server refused a request or broke off its answer; ``status`` is its HTTP status (0: no answer)."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


def image_url(img: PreparedImage) -> str:
    """The image's pixels as a PNG data URL (lossless, and the same pixels always encode to the same bytes)."""
    with _png_lock:
        if img.digest in _PNG_CACHE:
            _PNG_CACHE.move_to_end(img.digest)
            return _PNG_CACHE[img.digest]
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img.pixels[0]).save(buf, "PNG", compress_level=1)  # loopback: fast beats small
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    with _png_lock:
        _PNG_CACHE[img.digest] = url
        while len(_PNG_CACHE) > _PNG_CACHE_ENTRIES:
            _PNG_CACHE.popitem(last=False)
    return url


def messages(conv: Conversation, marker: str | None = None) -> list[dict]:
    """The conversation as OpenAI messages, images first in the turn they came with (as the OpenVINO engines tag
    them). With ``marker``, each image is that text instead (for /apply-template, which loads no images)."""
    out = []
    for turn in conv.turns:
        if turn.tool_calls:  # an assistant's calls, as OpenAI sends them (its template renders <tool_call>)
            out.append({"role": turn.role, "content": turn.text, "tool_calls": json.loads(turn.tool_calls)})
            continue
        if not turn.images:
            out.append({"role": turn.role, "content": turn.text})
            continue
        if marker is not None:
            out.append({"role": turn.role, "content": marker * len(turn.images) + turn.text})
            continue
        parts: list[dict] = [{"type": "image_url", "image_url": {"url": image_url(img)}} for img in turn.images]
        out.append({"role": turn.role, "content": [*parts, {"type": "text", "text": turn.text}]})
    return out


def request_body(conv: Conversation, sampling: Sampling) -> dict:
    body = {"messages": messages(conv), "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": sampling.max_tokens, "temperature": sampling.temperature, "top_p": sampling.top_p,
            "top_k": 0, "min_p": 0.0, "cache_prompt": True, "ignore_eos": sampling.ignore_eos}
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    fmt = sampling.response_format
    if fmt is not None:
        body["response_format"] = response_format(fmt)
    if sampling.logprobs:
        body.update(logprobs=True, top_logprobs=sampling.top_logprobs)
    return {**body, **tool_fields(conv, fmt)}


def tool_fields(conv: Conversation, fmt: ResponseFormat | None = None) -> dict:
    """The conversation's tools for llama-server (--jinja, its default, renders them with the model's template and,
    under tool_choice auto, parses a call the model writes into tool_calls).

    A forced call is not its tool_choice required: that grammar lets any text come before the call (measured: the
    tiny model's answers never reached a call within 600 tokens), and llama-server takes no assistant prefill with a
    grammar ("Failed to initialize samplers"). So the call object is its response_format (tool_choice none, which
    allows one) and the engine writes the fixed tags around it (``call_tags``)."""
    if not conv.tools:
        return {}
    forced = fmt is not None and fmt.kind == "tool_call"
    return {"tools": json.loads(conv.tools), "tool_choice": "none" if forced else "auto"}


def call_tags(sampling: Sampling) -> tuple[str, str] | None:
    """The text before and after the answer of a forced call: Qwen3-VL's <tool_call> tags."""
    fmt = sampling.response_format
    return (CALL_OPEN, CALL_CLOSE) if fmt is not None and fmt.kind == "tool_call" else None


def response_format(fmt: ResponseFormat) -> dict:
    """The format as llama-server's OpenAI endpoint takes it: it compiles the schema to a grammar (a schema it
    cannot convert is its 400, raised before it generates); json_object is any JSON object."""
    schema = json.loads(fmt.schema) if fmt.schema is not None else {"type": "object"}
    return {"type": "json_schema", "json_schema": {"schema": schema}}


def call(server: Endpoint, path: str, body: dict | None = None, timeout: float = CALL_TIMEOUT_S) -> dict:
    """One JSON request to llama-server (GET without a body, POST with one); its JSON answer."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        if body is None:
            conn.request("GET", path, headers=server.headers(body=False))
        else:
            conn.request("POST", path, json.dumps(body), server.headers())
        resp = conn.getresponse()
        data = resp.read()
    except (OSError, http.client.HTTPException) as e:
        raise LlamaServerError(f"llama-server {path}: {e}") from None
    finally:
        conn.close()
    if resp.status != 200:
        raise LlamaServerError(f"llama-server {path} answered {resp.status}: {_error_text(data)}", resp.status)
    return json.loads(data)


def _error_text(data: bytes) -> str:
    try:
        return str(json.loads(data)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return data.decode(errors="replace")[:300]


@dataclass
class Answer:
    """What the end of a streamed answer said: llama-server's timings, usage and finish reason."""

    finish_reason: str | None = None
    timings: dict = field(default_factory=dict)
    usage: dict = field(default_factory=dict)


class ChatStream:
    """A streamed chat completion; iterate for the answer's text pieces, then read ``answer``. ``cancel`` (from any
    thread) breaks the connection, which is how llama-server learns that the client has gone and stops."""

    def __init__(self, server: Endpoint, body: dict, stall_timeout: float = STALL_TIMEOUT_S,
                 tags: tuple[str, str] | None = None):
        self.answer = Answer()
        self.logprobs: list[dict] = []  # llama-server's logprobs.content entries not yet taken (take_logprobs)
        self._tags = tags  # text to put around the answer (a forced tool call's, call_tags)
        self._calls: dict[int, dict] = {}  # llama-server's parsed tool calls by index, as they stream in
        self._conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=stall_timeout)
        self._closed = threading.Event()
        try:
            self._conn.request("POST", "/v1/chat/completions", json.dumps(body), server.headers())
            self._resp = self._conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise LlamaServerError(f"llama-server did not take the request: {e}") from None
        if self._resp.status != 200:
            text = _error_text(self._resp.read())
            self.close()
            raise LlamaServerError(f"llama-server answered {self._resp.status}: {text}", self._resp.status)

    def __iter__(self) -> Iterator[str]:
        if not self._tags:
            yield from self._pieces()
            return
        opened = False
        for piece in self._pieces():  # the opening tag goes out with the first generated piece, not before it
            yield piece if opened else self._tags[0] + piece
            opened = True
        yield self._tags[1] if opened else "".join(self._tags)

    def _pieces(self) -> Iterator[str]:
        try:
            for raw in self._resp:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    break
                yield from self._chunk(json.loads(line[6:]))
            yield from self._call_text()
        except (OSError, http.client.HTTPException, ValueError) as e:
            if not self._closed.is_set():
                raise LlamaServerError(f"llama-server broke off the answer: {e}") from None

    def _chunk(self, chunk: dict) -> Iterator[str]:
        if "error" in chunk:
            error = chunk["error"]
            raise LlamaServerError(f"llama-server: {error.get('message', error) if isinstance(error, dict) else error}")
        self.answer.timings = chunk.get("timings") or self.answer.timings
        self.answer.usage = chunk.get("usage") or self.answer.usage
        for choice in chunk.get("choices") or ():
            self.answer.finish_reason = choice.get("finish_reason") or self.answer.finish_reason
            self.logprobs.extend((choice.get("logprobs") or {}).get("content") or ())
            delta = choice.get("delta") or {}
            if delta.get("content"):
                yield delta["content"]
            for call in delta.get("tool_calls") or ():
                entry = self._calls.setdefault(call.get("index", 0), {"name": "", "arguments": ""})
                function = call.get("function") or {}
                entry["name"] += function.get("name") or ""
                entry["arguments"] += function.get("arguments") or ""

    def _call_text(self) -> Iterator[str]:
        """The calls llama-server parsed out of the answer, back as the model's text (Qwen3-VL's <tool_call> blocks),
        so that every engine's answer is text that service.http.tools parses the same way (and the cache replays)."""
        for i in sorted(self._calls):
            call = self._calls[i]
            yield (f'{chr(10) if i else ""}<tool_call>\n{{"name": {json.dumps(call["name"])}, "arguments": '
                   f'{call["arguments"] or "{}"}}}\n</tool_call>')

    def take_logprobs(self) -> list[dict]:
        """The logprob entries received since the last call (those of the text yielded since)."""
        taken, self.logprobs = self.logprobs, []
        return taken

    def cancel(self) -> None:
        """Break the connection from any thread: a reader blocked in recv (the inference thread) wakes up."""
        self._closed.set()
        sock = self._conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed.set()
        self._conn.close()
