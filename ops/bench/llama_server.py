"""llama.cpp's llama-server as the bench's peer: started on a free loopback port on a GGUF artifact
(ops.llamacpp.gguf) by the llamacpp engine's launcher (service/engine/llamacpp_child.py: the same command line, a
bounded /health wait, stopped by its PID on exit, also on an exception or Ctrl-C), and measured with the bench's own
client (workload.chat_stream).

The requests are the service's (same image, prompt, token count, streamed, timed at the client); the only extra
body fields make llama-server do the same work as the service: ``cache_prompt: false`` (no reuse of an earlier
request's KV cache) and ``temperature: 0`` (greedy, the service's default; llama-server's own default samples).

``smoke`` is the check that a llama-server build runs a model shape at all: load it and answer one token about the
bench's image. Which CPU kernel a matrix takes depends on its type and sizes (ggml-cpu/repack.cpp, amx/), so the
bench and ``vlfleet llamacpp.check`` run it on the shape the fleet serves (2b), and the suite on the "kernels" shape
that meets the same conditions (tests/integration/test_llamacpp_kernels.py); the AMX kernels crashed on a Xeon with
AMX (issue 30).
"""

from __future__ import annotations

import contextlib
import os
import re
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from ops.bench import workload
from ops.bench.memory import memory_status, peak_rss_bytes
from ops.bench.server import free_port
from service.engine.llamacpp_child import GgufFiles, LlamaServerChild, describe_exit, llama_server_argv

# Body fields for llama-server beside the service's request (see the module doc).
PEER_BODY = {"cache_prompt": False, "temperature": 0}
CONTEXT = 4096  # enough for the 416-px image, the prompt and 64-512 new tokens
TIMING_KEYS = ("prompt_n", "prompt_ms", "prompt_per_token_ms", "predicted_n", "predicted_ms",
               "predicted_per_token_ms")


def artifact_files(artifact: Path) -> GgufFiles:
    """The language model and vision projector of a GGUF artifact, as its manifest names them."""
    from service.runtime.manifest import read_manifest

    files = GgufFiles.of(artifact, read_manifest(artifact))
    if files is None:
        raise ValueError(f"{artifact} is not a GGUF artifact (make one with `vlfleet model.gguf`)")
    return files


def threads() -> int:
    """One per CPU in our affinity mask: what the service uses by default (VLFLEET_THREADS=0)."""
    return len(os.sched_getaffinity(0))


def server_command(binary: Path, files: GgufFiles, port: int, n_threads: int, ctx: int = CONTEXT) -> list[str]:
    """The engine's llama-server command line (llama_server_argv) on ``port``, without its host-memory prompt cache
    (the bench's requests say ``cache_prompt: false``)."""
    return llama_server_argv(binary, files, n_threads, ctx, port=port)


class LlamaServer:
    """``with LlamaServer(binary, artifact, log) as s:`` starts llama-server (its output in ``log``), waits for
    /health, stops it on exit: the engine's launcher (LlamaServerChild) on a port of ours, with no API key.
    ``extra_args`` go at the end of its command line (``--no-repack`` for a comparison)."""

    def __init__(self, binary: Path, artifact: Path, log: Path, n_threads: int | None = None, ctx: int = CONTEXT,
                 ready_timeout: float = 600, extra_args: tuple[str, ...] = ()):
        self.binary, self.log, self.ready_timeout = Path(binary), Path(log), ready_timeout
        self.files = artifact_files(Path(artifact))
        self.n_threads = n_threads or threads()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [*server_command(self.binary, self.files, self.port, self.n_threads, ctx), *extra_args]
        self.child = LlamaServerChild(self.command, log_file=self.log, key=False)
        self.proc = None  # the process started, kept after it is stopped (its exit code)
        self.cold_start_s: float | None = None

    def __enter__(self) -> LlamaServer:
        started = time.perf_counter()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.child.start(self.ready_timeout, setting=None)
        self.proc = self.child.proc
        self.cold_start_s = time.perf_counter() - started  # process start to /health 200: load weights, mmproj
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def peak_rss(self) -> int | None:
        return peak_rss_bytes(self.proc.pid) if self.proc else None

    def memory(self) -> dict[str, int | None]:
        return memory_status(self.proc.pid) if self.proc else {}

    def stop(self) -> None:
        """SIGTERM to the PID we started, then SIGKILL after a grace period (LlamaServerChild.stop)."""
        self.child.stop()


class SmokeError(RuntimeError):
    """llama-server did not load the model or answer one token; the message says how (the signal it died of).
    ``stage``: "start" (not an executable), "loading" or "answering"; ``exit``: how it ended ("SIGSEGV", "exit code
    1"), None while it still runs (a load that ran out of time, a failed answer from a live server)."""

    def __init__(self, message: str, stage: str, exit: str | None = None):
        super().__init__(message)
        self.stage, self.exit = stage, exit

    def as_dict(self) -> dict:
        """The failed smoke as bench.json and tune record it."""
        return {"ok": False, "stage": self.stage, "exit": self.exit, "error": str(self)[:2000]}

    def headline(self) -> str:
        """One line for a report: "llama-server crashed while loading: <the message>" when it died of a signal."""
        return headline(self.as_dict())


def headline(smoke: dict) -> str:
    """How a smoke's result (``smoke()``'s, or ``SmokeError.as_dict``'s) reads in a report."""
    if smoke.get("ok"):
        return "llama-server passed its smoke (load and one token)"
    died = (smoke.get("exit") or "").startswith("SIG")
    what = {"loading": "crashed while loading" if died else "did not load",
            "answering": "crashed answering one token" if died else "failed to answer one token",
            }.get(smoke.get("stage"), "did not start")
    return f"llama-server {what}: {smoke.get('error', '?')}"


def smoke(binary: Path, artifact: Path, log: Path, ready_timeout: float = 600, timeout: float = 300,
          width: int = 416, height: int = 277) -> dict:
    """Load-and-one-token: llama-server ``binary`` loads GGUF ``artifact`` (its own warm-up decode runs the language
    model's matmuls at load) and answers one token about the bench's ``width`` x ``height`` image (the vision
    encoder and a real prefill); SmokeError naming how it died otherwise (e.g. "llama-server died while loading
    (SIGSEGV): ..."). Returns what it took: {"ok", "load_s", "first_token_s", "prompt_tokens", "threads"}.

    The bench's peer section and tune call it before measuring llama-server, so a build that crashes on the
    served shape is named at once (call: ``llama_server.smoke(inputs.server, inputs.artifact, log)``)."""
    server = LlamaServer(binary, artifact, log, ready_timeout=ready_timeout, extra_args=("-lv", "4"))
    try:
        server.__enter__()
    except RuntimeError as e:  # ChildError: died while loading (named), or did not load in time
        code = getattr(e, "exit_code", None)
        raise SmokeError(str(e), "loading", None if code is None else describe_exit(code)) from None
    except OSError as e:  # not an executable
        raise SmokeError(f"cannot start {binary}: {e}", "start") from None
    try:
        try:
            a = answer(server.url, workload.test_image(width, height, seed=999), 1, timeout)
            failure = None if a.sample.tokens == 1 else f"answered {a.sample.tokens} tokens, asked for 1 (ignore_eos)"
        except Exception as e:
            failure = f"loaded but its one-token answer failed: {type(e).__name__}: {e}"
        if failure is not None:
            # A server dying mid-answer breaks the connection, or ends the stream early: which, is a race.
            child = server.child
            if child.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.proc.wait(timeout=2)  # let it finish dying
            if not child.alive():
                code = describe_exit(child.exit_code())
                raise SmokeError(f"llama-server died answering one token ({code}): {child.last_lines()}",
                                 "answering", code)
            raise SmokeError(f"llama-server {failure}", "answering")
        return {"ok": True, "load_s": round(server.cold_start_s, 3), "first_token_s": round(a.sample.first_token_s, 3),
                "prompt_tokens": a.prompt_tokens, "threads": server.n_threads, **kernels(log)}
    finally:
        server.stop()


_BACKEND = re.compile(r"loaded CPU backend from (\S+)")
_BUFFER = re.compile(r"load_tensors:\s+(\S+) model buffer size =\s+([0-9.]+) MiB")
_TYPE = re.compile(r"llama_model_loader: - type\s+(\S+):\s+(\d+) tensors")


def kernels(log: Path) -> dict:
    """What llama-server's verbose log (``-lv 4``) says about its CPU kernels: the backend library a portable build
    loaded (``cpu_backend``, e.g. libggml-cpu-zen4.so; absent for a native build), the model's buffer types
    (``buffers``: CPU_REPACK for the repacked Q4_0 kernels, AMX for ggml's AMX ones) with their sizes
    (``buffer_mib``), and the language model's tensor types with their counts (``types``: what llama-quantize made,
    which picks the kernels as much as the buffers do)."""
    try:
        text = Path(log).read_text(errors="replace")
    except OSError:
        return {}
    sizes = {name: float(mib) for name, mib in _BUFFER.findall(text)}
    found: dict = {"buffers": list(sizes), "buffer_mib": sizes,
                   "types": {name: int(n) for name, n in _TYPE.findall(text)}}
    if m := _BACKEND.search(text):
        found["cpu_backend"] = Path(m.group(1)).name
    return found


def checked(inputs, log: Path, **kwargs):
    """``inputs`` (the bench's PeerInputs: ``.server``, ``.artifact``) once ``smoke`` passed on them; SmokeError
    otherwise. For a caller that skips llama-server when it does not run: ``peer = checked(peer_inputs(), log)``."""
    smoke(inputs.server, inputs.artifact, log, **kwargs)
    return inputs


def answer(url: str, png: bytes, tokens: int, timeout: float = 600) -> workload.Answer:
    """One answer from llama-server about ``png``: the bench's request and client, plus PEER_BODY."""
    return workload.chat_stream(url, [workload.user_turn(png)], tokens, timeout, extra=PEER_BODY)


def timing_medians(answers: list[workload.Answer]) -> dict[str, float]:
    """Medians of llama-server's own timings over ``answers`` (the keys every answer reported)."""
    out = {}
    for key in TIMING_KEYS:
        values = [a.server_timings[key] for a in answers if key in a.server_timings]
        if values and len(values) == len(answers):
            out[key] = statistics.median(values)
    return out


def timed(server: LlamaServer, tokens: int, width: int = 416, height: int = 277, seed: int = 0) -> workload.Answer:
    """One measured answer of ``tokens`` tokens about the bench's image of ``seed``; RuntimeError on a short one."""
    a = answer(server.url, workload.test_image(width, height, seed=seed), tokens)
    if a.sample.tokens != tokens:
        raise RuntimeError(f"llama-server answered {a.sample.tokens} tokens, asked for {tokens} (ignore_eos)")
    return a


def warm_up(server: LlamaServer, width: int = 416, height: int = 277, seed: int = 0) -> None:
    """The discarded first answer (8 tokens, an image no measured run uses)."""
    answer(server.url, workload.test_image(width, height, seed=seed + 999), 8)


def summary(answers: list[workload.Answer]) -> dict:
    """The service's summary of ``answers`` (client-timed), llama-server's own timings, prompt tokens."""
    prompt = [a.prompt_tokens for a in answers if a.prompt_tokens is not None]
    return {**workload.summarize([a.sample for a in answers]), "server_timings": timing_medians(answers),
            "prompt_tokens": statistics.median(prompt) if prompt else None}


def measure(server: LlamaServer, runs: int, tokens: int, width: int = 416, height: int = 277, seed: int = 0,
            say: Callable[[str], None] = print) -> dict:
    """``runs`` answers, each about a fresh image (the seeds the service's int4 runs use), after one discarded
    warm-up: the service's summary (client-timed), llama-server's own timings, prompt tokens, memory."""
    warm_up(server, width, height, seed)
    answers = []
    for i in range(runs):
        a = timed(server, tokens, width, height, seed + i)
        answers.append(a)
        s = a.sample
        say(f"llama-server run {i + 1}/{runs}: first token {s.first_token_s:.2f}s, {s.ms_per_token:.1f} ms/token, "
            f"{s.tokens} tokens, {a.prompt_tokens} prompt tokens")
    return summary(answers)
