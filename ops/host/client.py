"""The one client of the service's HTTP API: a chat request, its answer (streamed or not), its error, /readyz and
other GETs, for every program that asks the service something: on the controller the bench, load, demo, report and
tune (they import it from here), on a host the start gate's smoke answer, status and the probes.

Part of the host program, so standard library only; the clock must not depend on a third-party client's
buffering. A streamed answer's first token is its first non-empty content delta (the role chunk before it carries no
text); every read is bounded.
"""

from __future__ import annotations

import base64
import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

MAX_LINES = 100_000  # SSE lines one answer may take: a stream that never ends is an error, not a hang
LOAD_FAILED = "model failed to load"  # service/engine/base.py's /readyz reason: the engine will not retry


class ChatError(RuntimeError):
    """A chat request that did not give an answer: HTTP status and the JSON error's message, a stream error
    event, a stream without [DONE] within its bound, or the transport's error."""


class NotReady(RuntimeError):
    """/readyz did not answer 200 within the bound (or the engine said it never will)."""


def describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def user_turn(image_url: str, text: str, detail: str | None = None) -> dict:
    """One OpenAI user message: an image (a data URL or an http one) and a question."""
    image = {"url": image_url} | ({"detail": detail} if detail else {})
    return {"role": "user", "content": [{"type": "image_url", "image_url": image}, {"type": "text", "text": text}]}


def error_message(status: int, body: bytes) -> str:
    """``HTTP 400: <the JSON error's message>`` (the body's start when it is not the OpenAI error shape)."""
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body.decode(errors="replace").strip()[:300]
    return f"HTTP {status}: {message}"


@dataclass
class Answer:
    """One chat answer as the client saw it. Times are seconds since the request was sent (None: not reached)."""

    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)  # X-Served-By, X-Cache, X-Vlfleet-Route, X-Request-Id, ...
    text: str = ""
    chunks: int = 0  # non-empty content deltas
    first_token_s: float | None = None
    last_token_s: float | None = None
    finish_s: float | None = None  # the first choice's finish_reason
    total_s: float | None = None  # [DONE], the stream's end, or the whole non-streamed body
    done: bool = False  # the stream said [DONE]
    usage: dict = field(default_factory=dict)  # the usage chunk's (stream_options.include_usage) or the body's
    timings: dict = field(default_factory=dict)  # llama-server's own ``timings`` (its last chunk's)
    body: Any = None  # a non-streamed answer's JSON
    error: str | None = None

    @property
    def tokens(self) -> int | None:
        return self.usage.get("completion_tokens")

    def check(self) -> Answer:
        """This answer, or ChatError when it has an error or (streamed) no text."""
        if self.error:
            raise ChatError(self.error)
        if self.body is None and self.first_token_s is None:
            raise ChatError("stream ended without tokens")
        return self


def server_timings(chunk: dict) -> dict:
    """llama-server's ``timings`` of a stream chunk (prompt_n, prompt_ms, predicted_n, predicted_per_token_ms, ...),
    numbers only; {} for a chunk without them (the vlfleet service sends none)."""
    timings = chunk.get("timings")
    if not isinstance(timings, dict):
        return {}
    return {k: v for k, v in timings.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class Events:
    """The JSON events of an SSE answer, until ``data: [DONE]`` (then ``done``). ChatError on an error event, or
    when the bound (``bound`` seconds since ``started``, ``max_lines`` lines) runs out before [DONE]."""

    def __init__(self, resp, started: float, bound: float | None = None, max_lines: int = MAX_LINES) -> None:
        self.resp, self.started, self.bound, self.max_lines = resp, started, bound, max_lines
        self.done = False

    def __iter__(self) -> Iterator[dict]:
        for n, raw in enumerate(self.resp):
            if n > self.max_lines:
                raise ChatError(f"no [DONE] within {self.max_lines} lines")
            if self.bound is not None and time.perf_counter() - self.started > self.bound:
                raise ChatError(f"no [DONE] within {self.bound:g} s")
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                self.done = True
                return
            event = json.loads(data)
            if "error" in event:
                error = event["error"]
                raise ChatError("stream error: " + str(error.get("message") if isinstance(error, dict) else error))
            yield event


def _read_stream(answer: Answer, events: Events, on_text: Callable[[str], None] | None) -> None:
    pieces: list[str] = []
    try:
        for event in events:
            answer.usage = event.get("usage") or answer.usage
            answer.timings = server_timings(event) or answer.timings
            for choice in event.get("choices") or ():
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    now = time.perf_counter() - events.started
                    answer.last_token_s = now
                    if answer.first_token_s is None:
                        answer.first_token_s = now
                    answer.chunks += 1
                    pieces.append(piece)
                    if on_text:
                        on_text(piece)
                if choice.get("finish_reason") and answer.finish_s is None:
                    answer.finish_s = time.perf_counter() - events.started
    finally:  # what came before a broken stream's error is part of the answer
        answer.text, answer.done = "".join(pieces), events.done


def chat(url: str, body: dict, timeout: float = 600, bound: float | None = None, key: str | None = None,
         headers: dict[str, str] | None = None, on_text: Callable[[str], None] | None = None) -> Answer:
    """POST ``body`` to ``url``'s /v1/chat/completions on a fresh connection (like a browser tab: no keepalive to
    race nginx's worker reload) and read the answer, streamed when ``body["stream"]``. Never raises for what the
    server or the network did: that is ``answer.error`` (``answer.check()`` raises it). ``timeout`` bounds each
    socket read, ``bound`` the whole stream; ``on_text`` gets each piece of text as it arrives."""
    answer = Answer()
    sent = {"Content-Type": "application/json", "Accept": "text/event-stream" if body.get("stream") else
            "application/json", **({"Authorization": "Bearer " + key} if key else {}), **(headers or {})}
    started = time.perf_counter()
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), sent)
        resp = conn.getresponse()
        answer.status, answer.headers = resp.status, dict(resp.getheaders())
        if resp.status != 200:
            answer.error = error_message(resp.status, resp.read(4096))
        elif body.get("stream"):
            _read_stream(answer, Events(resp, started, bound), on_text)
        else:
            answer.body = json.loads(resp.read())
            answer.usage = answer.body.get("usage") or {}
            choice = (answer.body.get("choices") or [{}])[0]
            answer.text = (choice.get("message") or {}).get("content") or ""
    except ChatError as e:
        answer.error = str(e)
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError, http.client.HTTPException) as e:
        answer.error = describe(e)
    finally:
        conn.close()
        answer.total_s = time.perf_counter() - started
    return answer


def base_url(host: str, port: int) -> str:
    """http://host:port, an IPv6 address in brackets."""
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}"


def first_key(keys_file: str | None) -> str | None:
    """The first key of a service's API keys file (read as root on the host), so a request passes where keys are
    required; None without a file. OSError when the file named cannot be read: a probe given one says so."""
    if not keys_file:
        return None
    with open(keys_file) as f:
        return next((line.strip() for line in f if line.strip() and not line.startswith("#")), None)


def api_key(env: dict[str, str]) -> str | None:
    """``first_key`` of an env file's VLFLEET_API_KEYS_FILE; None when it cannot be read (the request then shows
    whether the service wanted a key)."""
    try:
        return first_key(env.get("VLFLEET_API_KEYS_FILE"))
    except OSError:
        return None


def get(url: str, timeout: float = 10, key: str | None = None) -> tuple[int, bytes]:
    """GET ``url``: (status, body); (0, b"") when it did not answer."""
    request = urllib.request.Request(url, headers={"Authorization": "Bearer " + key} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, _error_body(e)
    except (OSError, http.client.HTTPException):
        return 0, b""


def _error_body(e: urllib.error.HTTPError) -> bytes:
    """An error answer's body; b"" when only its status came in time (a service busy loading its model can send
    the headers of a 503 and the body seconds later): the status is the answer, not a timeout raised past it."""
    try:
        return e.read()
    except (OSError, http.client.HTTPException):
        return b""


def readyz(url: str, timeout: float = 15) -> dict[str, Any]:
    """GET ``url`` (a /readyz URL): {"status": int|None, "body": JSON or text, "error": str|None}."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return {"status": r.status, "body": json.loads(r.read() or b"null"), "error": None}
    except urllib.error.HTTPError as e:
        raw = _error_body(e)
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw.decode(errors="replace")[:300]
        return {"status": e.code, "body": body, "error": None}
    except Exception as e:  # the error is the answer
        return {"status": None, "body": None, "error": describe(e)}


def wait_ready(url: str, timeout: float, interval: float = 0.25, alive: Callable[[], str | None] | None = None,
               accept: Callable[[dict], bool] | None = None) -> tuple[float, dict]:
    """Wait (bounded) for ``url``/readyz to answer 200 with a body ``accept`` takes (any, without it): the seconds it
    took and that body. NotReady when ``timeout`` runs out, when the engine says it gave up, or when ``alive()``
    names why the server is gone."""
    started = time.monotonic()
    while True:
        if alive and (gone := alive()):
            raise NotReady(gone)
        last = readyz(url + "/readyz", timeout=min(5.0, max(0.5, timeout)))
        body = last["body"] if isinstance(last["body"], dict) else {}
        if last["status"] == 200 and (accept is None or accept(body)):
            return time.monotonic() - started, body
        # the engine says it will not turn ready (a release from before /readyz "failed" names the load): no use waiting
        if body.get("failed") is True or str(body.get("reason", "")).startswith(LOAD_FAILED):
            raise NotReady(f"{url} will not become ready: {body.get('reason')}")
        if time.monotonic() - started + interval > timeout:
            seen = last["error"] or f"HTTP {last['status']}: {json.dumps(last['body'])[:200]}"
            raise NotReady(f"{url} not ready after {timeout:g} s (last /readyz: {seen})")
        time.sleep(interval)
