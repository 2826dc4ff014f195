"""`vlfleet bench.service`: what the HTTP+SSE path adds over calling VLMPipeline in-process.

Two processes answer the same requests on the same artifact, image, prompt and token count, alternating run by
run (and which of them goes first) so drift on a noisy machine hits both alike:

- the service, started as users start it (`vlfleet serve`), timed at its HTTP client;
- a clean process started for this benchmark alone (``python -m ops.bench.service_overhead --worker``, never the
  bench's own long-lived process), which loads VLMPipeline with the service's settings (the environment the service
  gets) and answers each request as the service's serial engine does: the image prepared by
  ``service.engine.images.prepare`` under the service's limits, the prompt rendered by ``render_prompt``, the generation
  config made by ``generation_config`` from the Sampling the service's request parser makes of the same body, and
  the service's per-token streamer. It is timed from the PNG bytes to the first piece of text, as a client times
  the service from its request.

So the ratio (HTTP+SSE / in-process) is the cost of HTTP, SSE and the service around the pipeline, nothing else.
It is within 5 % when |ratio - 1| <= 0.05 for both first token and ms/token; outside that, the result says which
side is slower and by how much. An in-process side slower than the service is not a good result for the service:
it says the two sides did not do the same work (or the machine drifted), and it fails the check all the same.
Each run uses a new image (the same one on both paths), so neither path answers from a warm prefix cache.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

from ops.bench import workload
from ops.bench.server import free_port, service_env, start_service, wait_ready
from ops.bench.stats import TOLERANCE, compare
from service.runtime.processes import kill_session, terminate

METRICS = ("first_token_s", "ms_per_token")


def request_body(png: bytes, tokens: int, prompt: str = workload.PROMPT) -> dict:
    """The body ``workload.over_http`` posts for one answer about ``png`` (fixed length, streamed)."""
    return {"messages": [workload.user_turn(png, prompt)], "max_tokens": tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}


class InProcess:
    """VLMPipeline set up and driven as the service's serial engine drives it; lives in the worker process."""

    def __init__(self, model: Path, environ: dict[str, str] | None = None):
        from service.engine import load_pipeline
        from service.http import image_source
        from service.runtime.settings import load

        self.settings = load(os.environ if environ is None else environ, model_dir=model)
        s = self.settings
        self.limits = image_source.limits_by_detail(s)["auto"]
        self._load_image = image_source.loader(s)  # as the service loads a request's images
        self.pipe = load_pipeline(s)
        self.tokenizer = self.pipe.get_tokenizer()

    def release_mapped_weights(self) -> None:
        """What the service does after its warm-up (service.runtime.mapped_weights): the same memory state on both
        sides."""
        from service.runtime.mapped_weights import release

        try:
            release(self.settings.model_dir)
        except OSError as e:  # as in the service: an optimisation, never a reason to stop
            print(f"[bench.service worker] could not release mapped weights: {e}", file=sys.stderr, flush=True)

    def answer(self, png: bytes, tokens: int, prompt: str = workload.PROMPT) -> workload.Sample:
        import openvino as ov
        import openvino_genai as ov_genai

        from service.engine import generation_config, render_prompt
        from service.engine.conversation import Conversation, Turn
        from service.engine.detokenize import token_streamer
        from service.engine.images import prepare
        from service.http import openai_request

        s = self.settings
        # What the service makes of the same request: its Sampling, and the conversation to check ours against.
        parsed = openai_request.parse(request_body(png, tokens, prompt), s.model_name, s.max_tokens, s.max_images,
                                      self._load_image)
        (turn,) = parsed.conversation.turns
        first: list[float] = []
        pieces: list[str] = []

        def on_text(text: str):
            if not first:
                first.append(time.perf_counter())
            pieces.append(text)
            return ov_genai.StreamingStatus.RUNNING

        started = time.perf_counter()
        image = prepare(png, self.limits, "image")
        conv = Conversation((Turn(turn.role, turn.text, (image,)),))
        cfg = generation_config(parsed.sampling)
        cfg.apply_chat_template = False  # as the service: rendered here, images tagged in their turns
        result = self.pipe.generate(render_prompt(self.tokenizer, conv),
                                    images=[ov.Tensor(img.pixels) for img in conv.images], generation_config=cfg,
                                    streamer=token_streamer(self.tokenizer, on_text))
        ended = time.perf_counter()
        if [img.digest for img in turn.images] != [image.digest]:
            raise RuntimeError("the in-process side prepared other pixels than the service's parser would")
        if not first:
            raise RuntimeError("in-process generation produced no text")
        return workload.Sample(first[0] - started, ended - started, int(result.perf_metrics.get_num_generated_tokens()))


def worker(model: Path, out: IO[str]) -> int:
    """The clean process's loop: load, warm up as the service does, then answer one JSON line per request line."""

    def send(message: dict) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    try:
        side = InProcess(model)
        side.answer(workload.test_image(64, 64, seed=0), 2)  # the service warms up with a 2-token answer
        side.release_mapped_weights()
    except Exception as e:
        send({"error": f"{type(e).__name__}: {e}"[:2000]})
        return 1
    send({"ready": True, "pid": os.getpid(), "threads": side.settings.threads})
    for line in sys.stdin:
        request = json.loads(line)
        try:
            sample = side.answer(base64.b64decode(request["png"]), int(request["tokens"]))
        except Exception as e:
            send({"error": f"{type(e).__name__}: {e}"[:2000]})
            continue
        send({"first_token_s": sample.first_token_s, "total_s": sample.total_s, "tokens": sample.tokens})
    return 0


class Worker:
    """The in-process side, in a subprocess started for it: ``answer(png, tokens)`` -> Sample."""

    def __init__(self, model: Path, log: Path, env: dict[str, str] | None = None, ready_timeout: float = 900):
        self.log_path = log
        with open(log, "wb") as err:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen([sys.executable, "-m", "ops.bench.service_overhead", "--worker", str(model)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                                         env=service_env(env))
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, name="bench-worker-stdout", daemon=True).start()
        try:
            self.ready = self._receive(ready_timeout, "loading the pipeline")
        except BaseException:
            self.stop()
            raise

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)  # end of output: the worker exited

    def _receive(self, timeout: float, doing: str) -> dict:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"in-process worker: no answer after {timeout:.0f}s {doing}; log {self.log_path}") \
                from None
        if line is None:
            code = self.proc.wait(timeout=30)
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"in-process worker exited (code {code}) while {doing}\n{tail}")
        message = json.loads(line)
        if "error" in message:
            raise RuntimeError(f"in-process worker failed while {doing}: {message['error']}")
        return message

    def answer(self, png: bytes, tokens: int, timeout: float = 600) -> workload.Sample:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"png": base64.b64encode(png).decode(), "tokens": tokens}) + "\n")
        self.proc.stdin.flush()
        m = self._receive(timeout, f"answering with {tokens} tokens")
        return workload.Sample(m["first_token_s"], m["total_s"], m["tokens"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            if self.proc.stdin is not None:
                self.proc.stdin.close()  # end of requests: the worker's loop ends
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)


def comparison(in_process: dict, http_sse: dict, tolerance: float = TOLERANCE) -> dict[str, Any]:
    """Ratios HTTP+SSE / in-process of the medians, each judged two-sided, and the overall verdict."""
    result: dict[str, Any] = {"comparison": {}}
    for key in METRICS:
        verdict = compare(http_sse[key] / in_process[key], "HTTP+SSE", "in-process", tolerance)
        result[f"{key}_ratio"] = verdict["ratio"]
        result["comparison"][key] = verdict
    result["within_5_percent"] = all(v["within"] for v in result["comparison"].values())
    return result


def measure(model: Path, runs: int = 5, tokens: int = 64, port: int | None = None) -> dict:
    """Alternate in-process and HTTP+SSE answers on one artifact; medians and their two-sided ratios."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    logs = Path(tempfile.mkdtemp(prefix="vlfleet-bench-service-"))
    print(f"[bench.service] in-process side: a clean worker process loading VLMPipeline from {model} with the "
          f"service's settings (log {logs / 'in-process.log'})", flush=True)
    side = Worker(model, logs / "in-process.log")
    proc = None
    try:
        print("[bench.service] starting the service", flush=True)
        # The in-process side is genai's VLMPipeline: the service runs the engine built on it, so the ratio is the
        # cost of HTTP, SSE and the service process around the same pipeline.
        proc = start_service(model, port, logs / "service.log", {"VLFLEET_ENGINE": "serial"})
        wait_ready(url, proc, log=logs / "service.log")
        warm = workload.test_image(seed=runs + 1)
        side.answer(warm, 8)  # warm both paths
        workload.over_http(url, warm, 8)
        local, http = [], []
        for i in range(runs):
            png = workload.test_image(seed=i + 1)
            # Which side goes first alternates too: neither always runs right after the other's answer.
            for name in (("in-process", "http") if i % 2 == 0 else ("http", "in-process")):
                if name == "http":
                    http.append(workload.over_http(url, png, tokens))
                else:
                    local.append(side.answer(png, tokens))
            print(f"[bench.service] run {i + 1}/{runs}: in-process first token {local[-1].first_token_s:.2f}s "
                  f"{local[-1].ms_per_token:.1f} ms/token | http {http[-1].first_token_s:.2f}s "
                  f"{http[-1].ms_per_token:.1f} ms/token", flush=True)
    finally:
        side.stop()
        terminate(proc, 60)
        kill_session(proc)
    from ops.machine import describe

    result = {
        "benchmark": "service_overhead",
        "machine": describe(),  # a ratio means little without the CPU it was measured on
        "model": str(model),
        "image": "416x277 PNG",
        "new_tokens": tokens,
        "in_process_side": "clean worker process (ops.bench.service_overhead --worker), the service's settings, "
                           "image preparation, prompt rendering, generation config and streamer",
        "in_process": workload.summarize(local),
        "http_sse": workload.summarize(http),
    }
    result.update(comparison(result["in_process"], result["http_sse"]))
    return result


def run(model: Path, out_dir: Path, runs: int = 5, tokens: int = 64, port: int | None = None) -> dict:
    from ops.bench.charts import bar_chart

    result = measure(model, runs, tokens, port)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench-service.json").write_text(json.dumps(result, indent=2) + "\n")
    bar_chart(out_dir / "bench-service.png", "HTTP+SSE vs in-process VLMPipeline (2b-shape int4)",
              {"first token (s)": [result["in_process"]["first_token_s"], result["http_sse"]["first_token_s"]],
               "ms per token / 100": [result["in_process"]["ms_per_token"] / 100,
                                      result["http_sse"]["ms_per_token"] / 100]},
              series=["in-process", "HTTP+SSE"])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="bench.service's in-process side (started by the bench)")
    parser.add_argument("--worker", type=Path, required=True, metavar="MODEL", help="artifact directory")
    args = parser.parse_args(argv)
    # The protocol owns stdout; whatever the runtime prints goes to stderr (the worker's log).
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    return worker(args.worker, protocol)


if __name__ == "__main__":
    sys.exit(main())
