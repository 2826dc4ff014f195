"""The llamacpp engine: a private llama-server child answers each job, behind the service's queue and API.

Everything in front of the engine is shared with the OpenVINO engines (admission, the bounded queue, the answer
cache, sessions, metrics, the per-inference log line, SSE); only generation differs. The inference thread takes
one job at a time and makes it one streamed chat request to llama-server (``llamacpp_api``), which runs as a child
process on loopback (``llamacpp_child``). Why a child process and not llama.cpp in-process: the project builds
llama-server already (the bench's peer), a crash in native code takes the child down instead of the service, and
the engine can restart it while the service reports itself unready.

Follow-ups: every request carries ``cache_prompt``, so llama-server re-uses the KV of the longest prefix its one slot
has already seen (images included: llama.cpp keys image chunks by a hash of their pixels) and prefills only the
rest. llama-server reports how many prompt tokens came from that cache (``cache_n``): it is counted in
``vlfleet_reused_prompt_tokens`` and kept in the Done event's ``timings.extra``.

A dead child is noticed within WATCH_INTERVAL_S: the service turns unready (/readyz 503 with the reason), the child
is restarted with a bounded wait and back-off, at most VLFLEET_LLAMACPP_RESTARTS times in a row, and the service
turns ready again; a job that was running fails with 503 (retry).

A child that dies while loading (before /health 200, or in the warm-up answer) is not tried again: the same binary
on the same model on the same CPU dies the same way (llama.cpp's AMX kernels on a Xeon with AMX: SIGSEGV, issue 30).
The engine gives up at once, /readyz 503 with ``failed`` and a reason that names the signal or exit code, so the
start gate, `vlfleet tune` and the bench stop waiting for it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import re
import secrets
import subprocess
import threading
import time

from service.engine.base import Engine, warmup_conversation
from service.engine.conversation import Conversation, Sampling, Timings
from service.engine.errors import APIError, Overloaded
from service.engine.events import Started, Token
from service.engine.genai import TOOLS_PARAM, number_bound
from service.engine.job import FINISHED, RUNNING, Job
from service.engine.llamacpp_api import (
    Answer,
    ChatStream,
    Endpoint,
    LlamaServerError,
    call,
    call_tags,
    messages,
    request_body,
    tool_fields,
)
from service.engine.llamacpp_child import (
    ChildError,
    LlamaServerChild,
    describe_exit,
    died_while_loading,
    server_command,
)
from service.engine.logprobs import from_llama
from service.engine.prompt_limits import VISION_WRAP, PromptLimits, VisionGrid

log = logging.getLogger("vlfleet.engine")

WATCH_INTERVAL_S = 1.0  # how often an idle inference thread checks that llama-server still runs
CANCEL_POLL_S = 0.1
MAX_BACKOFF_S = 30.0


class LlamaVisionGrid(VisionGrid):
    """llama.cpp's Qwen-VL image preprocessing (tools/mtmd: clip.cpp, mtmd-image.cpp): the Hugging Face smart
    resize, but its first rounding is C's round (half away from zero) where Python's rounds half to even: a
    448x336 image is 14x11 merged patches there, not 14x10."""

    @staticmethod
    def _round(x: float) -> int:
        return math.floor(x + 0.5)


# Qwen3-VL's 16-px patches merged 2x2, and llama.cpp's bounds for Qwen-VL: 8 to 4096 image tokens.
LLAMA_GRID = LlamaVisionGrid(patch=16, merge=2, min_pixels=8 * 32 * 32, max_pixels=4096 * 32 * 32)


class LlamaPromptLimits(PromptLimits):
    """The prompt limits counted as llama-server will see the prompt: its chat template (/apply-template), its
    tokenizer (/tokenize, text cut at each image as llama.cpp's mtmd cuts it) and llama.cpp's image grid."""

    def __init__(self, settings, server):
        super().__init__(settings, render=None)
        self.grid = LLAMA_GRID
        self._server = server  # () -> llama-server's Endpoint, or None while it is not running
        self._marker = f"<__vlfleet_image_{secrets.token_hex(8)}__>"  # no client text can hold it

    def count(self, conv: Conversation) -> int:
        server = self._server()
        if server is None:
            raise Overloaded("llama-server is not running (restarting); retry", 503, retry_after=5)
        try:
            prompt = call(server, "/apply-template", {"messages": messages(conv, self._marker),
                                                      **tool_fields(conv)})["prompt"]
            text = sum(len(call(server, "/tokenize", {"content": piece, "add_special": i == 0, "parse_special": True})
                           ["tokens"]) for i, piece in enumerate(prompt.split(self._marker)) if piece)
        except (LlamaServerError, KeyError, ValueError) as e:
            raise Overloaded(f"could not count the prompt's tokens: {e}; retry", 503, retry_after=5) from None
        return text + sum(self.grid.tokens(*img.size) + VISION_WRAP for img in conv.images)


class LlamaCppEngine(Engine):
    """Jobs answered one at a time by a llama-server child that the engine starts, watches and restarts."""

    constrains_output = True  # llama-server compiles response_format's schema to a grammar (llama_api.request_body)
    top_logprobs = 20  # llama-server's OpenAI endpoint computes them (service.engine.logprobs.from_llama)
    format_limits = "bounds on a non-integer number (its grammar ignores them)"

    def check_format(self, fmt) -> None:
        if keyword := unenforced_keyword(fmt):
            param = TOOLS_PARAM if fmt.kind == "tool_call" else "response_format.json_schema.schema"
            raise APIError(f"'{param}' cannot be enforced here: llama-server's grammar ignores {keyword} on a number "
                           f"(bounds hold on integers; the direct engine enforces them on numbers)",
                           param=param, code="unsupported_schema")

    def __init__(self, settings, metrics=None, pipeline_factory=None, model_id: str = "", memory=None):
        super().__init__(settings, metrics, pipeline_factory, model_id, memory)
        self.limits = LlamaPromptLimits(settings, self._endpoint)
        self.restarts = None
        if metrics is not None:
            from prometheus_client import Counter

            self.restarts = Counter("vlfleet_engine_restarts", "Times the llamacpp engine restarted its llama-server",
                                    registry=metrics.registry)
        atexit.register(self._stop_child)

    def _load(self) -> LlamaServerChild:
        child = LlamaServerChild(server_command(self.settings))
        child.start(self.settings.llamacpp_start_timeout)
        return child

    def _endpoint(self) -> Endpoint | None:
        child = self.pipeline
        return child.endpoint() if child is not None else None

    def _stop_child(self) -> None:
        if self.pipeline is not None:
            self.pipeline.stop()

    def _warmup(self) -> None:
        try:
            self._generate(Job(warmup_conversation(), Sampling(max_tokens=2), "warmup"))
        except Exception as e:
            with contextlib.suppress(subprocess.TimeoutExpired):  # a child that is dying: let it finish
                self.pipeline.proc.wait(timeout=1)
            if self.pipeline.alive():
                raise
            code = self.pipeline.exit_code()  # its first real image and prompt killed it: name how
            raise ChildError(died_while_loading(code, self.pipeline.last_lines()) + " (in the warm-up answer)",
                             exit_code=code) from e

    def _serve(self) -> None:
        while True:
            job = self._next_job(timeout=WATCH_INTERVAL_S)
            if not self.pipeline.alive():
                if job is not None:
                    self._fail_and_close(job, self._child_gone())
                if not self._restart():
                    self._refuse_queued()
                    return
                continue
            if job is not None:
                self._run_job(job)

    def _failure(self, error: Exception) -> Exception:
        return error if self.pipeline.alive() else self._child_gone()

    def _fail_and_close(self, job: Job, error: APIError) -> None:
        self._fail(job, error)
        job._transition(RUNNING, FINISHED)

    def _child_gone(self) -> Overloaded:
        return Overloaded(f"llama-server stopped ({describe_exit(self.pipeline.exit_code())}); the engine is "
                          "restarting it: retry", 503, retry_after=5)

    def _restart(self) -> bool:
        """Restart the dead child (bounded tries, back-off); True once it serves again. A try whose child dies while
        loading ends the tries at once (see the module doc)."""
        code, tries = self.pipeline.exit_code(), self.settings.llamacpp_restarts
        self.ready.clear()
        log.error("llama-server died", extra={"exit_code": code, "last_lines": self.pipeline.last_lines()})
        stopped = describe_exit(code)
        error = stopped
        for attempt in range(1, tries + 1):
            self.failed = f"llama-server died ({error}); restarting it (attempt {attempt} of {tries})"
            time.sleep(min(MAX_BACKOFF_S, 2.0 ** (attempt - 1) - 1))  # 0, 1, 3, 7, 15, 30 s
            try:
                self.pipeline.start(self.settings.llamacpp_start_timeout)
            except (ChildError, OSError) as e:
                error = str(e)
                log.warning("llama-server restart failed", extra={"attempt": attempt, "error": error})
                if isinstance(e, ChildError) and e.died:
                    self._give_up(f"{error}; it had stopped while serving ({stopped}), and restart {attempt} of "
                                  f"{tries} died while loading, so it is not tried again: restart the service")
                    log.error(self.failed)
                    return False
                continue
            if self.restarts is not None:
                self.restarts.inc()
            log.info("llama-server restarted", extra={"attempt": attempt, "pid": self.pipeline.proc.pid})
            self.failed = None
            self.ready.set()
            return True
        self._give_up(f"llama-server died and did not come back after {tries} restarts ({error}); restart the service")
        log.error(self.failed)
        return False

    def _refuse_queued(self) -> None:
        error = Overloaded(self.failed or "llama-server is not running", 503, retry_after=30)
        while (job := self._next_job(timeout=0.01)) is not None:
            self._fail_and_close(job, error)

    def _generate(self, job: Job) -> None:
        started = time.monotonic()
        conv, reused = self._resolve(job)
        timings = Timings(queued_s=started - job.enqueued_at, reused_session=reused)
        job.put(Started(reused_session=reused, images=len(conv.images), cache="miss"))
        pieces: list[str] = []
        try:
            stream = ChatStream(self.pipeline.endpoint(), request_body(conv, job.sampling),
                                tags=call_tags(job.sampling))
        except LlamaServerError as e:
            if e.status == 400:
                raise _client_error(e, job.sampling) from None
            raise
        finished = threading.Event()
        threading.Thread(target=_cancel_on_hangup, args=(job, stream, finished), daemon=True,
                         name=f"cancel-{job.request_id}").start()
        try:
            for text in stream:
                if timings.first_token_s is None:
                    timings.first_token_s = time.monotonic() - started
                pieces.append(text)
                job.put(Token(text, tuple(from_llama(stream.take_logprobs()))))
                if job.cancelled.is_set():
                    break
        finally:
            finished.set()
            stream.close()
        if left := from_llama(stream.take_logprobs()):  # tokens that made no text
            job.put(Token("", tuple(left)))
        timings.total_s = time.monotonic() - started
        self._account(timings, stream.answer, len(pieces))
        key = None if job.cancelled.is_set() else self._sessions.remember(conv, "".join(pieces))
        self._finish(job, pieces, timings, key)

    def _account(self, timings: Timings, answer: Answer, pieces: int) -> None:
        """llama-server's own counts onto the Timings the OpenVINO engines fill (a cancelled answer has none:
        then the pieces streamed so far). Image encoding is part of its prompt processing (prompt_ms), not apart."""
        t, usage = answer.timings, answer.usage
        timings.completion_tokens = int(t.get("predicted_n", usage.get("completion_tokens", pieces)))
        cached = int(t.get("cache_n", 0))
        timings.prompt_tokens = int(t.get("prompt_n", 0)) + cached or int(usage.get("prompt_tokens", 0))
        timings.extra = {key: t[key] for key in ("cache_n", "prompt_n", "prompt_ms", "predicted_n", "predicted_ms")
                         if key in t}
        if self.metrics is not None and cached:
            self.metrics.reused_prompt_tokens.inc(cached)


def unenforced_keyword(fmt) -> str | None:
    """A keyword of the format's schema that llama-server's JSON-schema-to-grammar converter would drop (measured:
    a number's minimum and maximum; answers of -668 and 5e+791 for minimum 12 and maximum 231), or None."""
    return number_bound(fmt)


def _cancel_on_hangup(job: Job, stream: ChatStream, finished: threading.Event) -> None:
    """Break the stream once the client has gone, also while llama-server is still prefilling (sending nothing)."""
    while not finished.wait(CANCEL_POLL_S):
        if job.cancelled.is_set():
            stream.cancel()
            return


def _client_error(e: LlamaServerError, sampling: Sampling | None = None) -> APIError:
    """llama-server's 400 (a prompt its context cannot hold, an image it cannot read, a schema it cannot convert to
    a grammar) is the client's to fix."""
    text = str(e)
    if sampling is not None and sampling.response_format is not None and re.search(r"schema|grammar", text, re.I):
        return APIError(text, 400, param="response_format.json_schema.schema", code="unsupported_schema")
    return APIError(text, 400, param="messages", code="invalid_request")
