"""The fixed inputs every benchmark shares, and the two ways of timing one answer."""

from __future__ import annotations

import io
import statistics
import time
from dataclasses import asdict, dataclass, field

import numpy as np
from PIL import Image

from ops.host import client

PROMPT = "Describe this image in detail."


def test_image(width: int = 416, height: int = 277, seed: int = 0) -> bytes:
    """A deterministic photo-like PNG (smooth gradients plus noise), the same bytes in every run."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (width + height)], axis=-1)
    pixels = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, "PNG")
    return buf.getvalue()


@dataclass
class Sample:
    first_token_s: float
    total_s: float
    tokens: int

    @property
    def ms_per_token(self) -> float:
        return 1000.0 * (self.total_s - self.first_token_s) / max(1, self.tokens - 1)


def summarize(samples: list[Sample]) -> dict:
    return {
        "runs": len(samples),
        "first_token_s": statistics.median(s.first_token_s for s in samples),
        "ms_per_token": statistics.median(s.ms_per_token for s in samples),
        "total_s": statistics.median(s.total_s for s in samples),
        "tokens": samples[0].tokens if samples else 0,
        "samples": [asdict(s) | {"ms_per_token": s.ms_per_token} for s in samples],
    }


def in_process(pipe, png: bytes, tokens: int, prompt: str = PROMPT) -> Sample:
    """One answer from a VLMPipeline in this process, prompted (service.engine.render_prompt) and streamed
    (service.engine.detokenize) as the service does, and timed at the first piece of text, as a client of the service
    times it."""
    import openvino as ov
    import openvino_genai as ov_genai

    from service.engine import render_prompt
    from service.engine.conversation import Conversation, Turn
    from service.engine.detokenize import token_streamer
    from service.engine.images import PreparedImage

    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.uint8)[None]
    image = PreparedImage(pixels, "bench", (pixels.shape[2], pixels.shape[1]))
    cfg = ov_genai.GenerationConfig()
    cfg.max_new_tokens = cfg.min_new_tokens = tokens
    cfg.ignore_eos = True
    cfg.apply_chat_template = False
    text = render_prompt(pipe.get_tokenizer(), Conversation((Turn("user", prompt, (image,)),)))
    first: list[float] = []

    def on_text(_text: str):
        if not first:
            first.append(time.perf_counter())
        return ov_genai.StreamingStatus.RUNNING

    started = time.perf_counter()
    result = pipe.generate(text, images=[ov.Tensor(pixels)], generation_config=cfg,
                           streamer=token_streamer(pipe.get_tokenizer(), on_text))
    ended = time.perf_counter()
    return Sample(first[0] - started, ended - started, int(result.perf_metrics.get_num_generated_tokens()))


def user_turn(png: bytes, prompt: str = PROMPT, detail: str | None = None) -> dict:
    return client.user_turn(client.data_url(png), prompt, detail)


@dataclass
class Answer:
    """One streamed answer as the client saw it: timings, the text, and the response headers."""

    sample: Sample
    text: str
    headers: dict[str, str]
    prompt_tokens: int | None = None  # the usage chunk's, when the server sent one
    server_timings: dict = field(default_factory=dict)  # llama-server's own ``timings`` (its last chunk's)


def chat_stream(url: str, messages: list[dict], tokens: int, timeout: float = 600,
                extra: dict | None = None) -> Answer:
    """POST /v1/chat/completions with stream: true and a fixed output length, timed at the client (ops/host/client.py:
    first token = first content delta, end = the finish_reason); RuntimeError when it gave no whole answer.

    ``extra`` adds body fields a particular server needs to do the same work (llama-server: ``cache_prompt``,
    ``temperature``; see ops/bench/llama_server.py); the timing and parsing are the same for every server."""
    body = {"messages": messages, "max_tokens": tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, **(extra or {})}
    a = client.chat(url, body, timeout).check()
    if a.finish_s is None:
        raise client.ChatError("stream ended without a finish_reason")
    sample = Sample(a.first_token_s, a.finish_s, a.tokens or 0)
    return Answer(sample, a.text, a.headers, a.usage.get("prompt_tokens"), a.timings)


def over_http(url: str, png: bytes, tokens: int, prompt: str = PROMPT, timeout: float = 600,
              extra: dict | None = None) -> Sample:
    """One answer about one image through the OpenAI-compatible streaming endpoint."""
    return chat_stream(url, [user_turn(png, prompt)], tokens, timeout, extra).sample


def metric(url: str, name: str) -> float:
    """One unlabelled sample of the service's /metrics (0 when absent)."""
    import requests

    for line in requests.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0
