"""Qwen3-VL generation over the artifact's sub-models, without genai's pipeline: kept image embeddings and the KV of
the last few conversations (service.engine.vision, service.engine.paged_lm).

The tokenizer, chat template and detokenizer are the artifact's own (openvino-genai's Tokenizer), so the prompt is
the one genai would build. Sampling is greedy unless a temperature is given (then top-p with the request's seed);
stop strings are matched on the text, which is held back only as long as a stop string could still be completing.
A response format (JSON) masks the logits at every step with its grammar's allowed tokens (service.engine.structured)
before the same sampling; the end of the answer is then allowed only where the grammar accepts. Token logprobs (when
asked for) are a log-softmax over the same logits the token was drawn from (service.engine.logprobs.from_logits).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from service.engine.answer_ids import AnswerIds
from service.engine.conversation import Conversation, Sampling
from service.engine.detokenize import IncrementalDecoder
from service.engine.genai import render_prompt, split_properties
from service.engine.logprobs import TokenBytes, from_logits
from service.engine.paged_lm import PagedLM
from service.engine.prompt import Prompt, TokenIds, expand_images
from service.engine.structured import Grammars
from service.engine.vision import VisionEncoder

VISION_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"  # what the chat template writes for an image


@dataclass
class Generation:
    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens whose KV was already in the state
    completion_tokens: int = 0
    image_encode_s: float = 0.0
    images_encoded: int = 0  # images that went through the vision encoder (the others were kept)


class DirectPipeline:
    """Loaded once on the inference thread; ``generate`` answers one conversation at a time."""

    def __init__(self, settings, language_model: Callable | None = None):
        """``language_model(settings, model_dir)``: the language model, kept_sequences.KeptSequences' interface
        (the hybrid engine's llama.cpp one); unset, the artifact's own over a paged KV cache (service.engine.paged_lm:
        its attention computes a prompt several times faster than the stateful model's, docs/engines.md)."""
        import openvino as ov
        import openvino_genai as ov_genai

        model_dir = Path(settings.model_dir)
        core = ov.Core()
        vision_props, _ = split_properties(settings)
        self.tokenizer = ov_genai.Tokenizer(str(model_dir))
        self.ids = TokenIds.of_model(model_dir)
        self.vision = VisionEncoder(core, model_dir, settings.device, vision_props,
                                    int(settings.image_cache_mb * 2**20), settings.vision_weights == "decompressed")
        self.lm = (language_model or PagedLM)(settings, model_dir)
        self.grammars = Grammars(model_dir, self.lm.vocab_size, self.ids.eos)
        self.answer_ids = AnswerIds()
        self._model_dir = model_dir

    @functools.cached_property
    def token_bytes(self) -> TokenBytes:
        return TokenBytes(self._model_dir / "tokenizer.json")

    def get_tokenizer(self):
        return self.tokenizer

    def trim(self) -> None:
        """Forget kept images and the conversations' KV (memory pressure)."""
        self.vision.trim()
        self.lm.reset()

    def prompt(self, conv: Conversation, stats: Generation) -> Prompt:
        text = render_prompt(self.tokenizer, conv, lambda _i: VISION_PLACEHOLDER)
        ids = self.answer_ids.encode(text, self._encode)  # earlier answers as they were generated
        runs, started = self.vision.runs, time.monotonic()
        images = [(self.vision.encode(img.pixels, img.digest), img.digest) for img in conv.images]
        stats.image_encode_s = time.monotonic() - started
        stats.images_encoded = self.vision.runs - runs
        prompt = expand_images(ids, self.ids.image, images)
        prompt.text, prompt.text_ids = text, ids
        return prompt

    def _encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False).input_ids.data[0], dtype=np.int64)

    def generate(self, conv: Conversation, sampling: Sampling, on_text: Callable[[str], None],
                 cancelled: Callable[[], bool], on_logprob: Callable[[dict], None] | None = None) -> Generation:
        """``on_logprob(entry)`` (with sampling.logprobs) gets each token's logprob entry before its text."""
        answer = Answer(self, conv, sampling, on_text, cancelled, on_logprob)
        logits, answer.stats.reused_tokens = self.lm.prefill(answer.prompt)
        while (token := answer.next_token(logits)) is not None:
            logits = self.lm.step(token, answer.position)
        return answer.finish()


class Answer:
    """One answer being generated: its prompt (images encoded on creation), then one token per ``next_token`` from
    the language model's logits, until it ends. The language model is driven by the caller: one conversation at a
    time (DirectPipeline.generate), or several whose steps are batched (the hybrid engine)."""

    def __init__(self, pipe: DirectPipeline, conv: Conversation, sampling: Sampling,
                 on_text: Callable[[str], None], cancelled: Callable[[], bool],
                 on_logprob: Callable[[dict], None] | None = None):
        self.stats, self.sampling, self._pipe = Generation(), sampling, pipe
        self._cancelled, self._on_logprob = cancelled, on_logprob
        # Compiled (or taken from the cache) before anything else: a schema it cannot enforce fails the request
        # before a token is generated.
        fmt = sampling.response_format
        self._constraint = pipe.grammars.constraint(fmt) if fmt is not None else None
        # ignore_eos (benchmarks) holds back the end while the grammar could go on; a complete answer still ends.
        self._forbid = pipe.ids.eos if sampling.ignore_eos else ()
        self.prompt = pipe.prompt(conv, self.stats)
        self.stats.prompt_tokens = len(self.prompt.ids)
        self._rng = np.random.default_rng(sampling.seed)
        self._generated: list[int] = []
        self._text = TextOut(IncrementalDecoder(pipe.tokenizer, pipe.token_bytes), sampling.stop, on_text)

    @property
    def position(self) -> int:
        """The position of the token ``next_token`` last returned."""
        return self.prompt.next_position + self.stats.completion_tokens - 1

    def next_token(self, logits: np.ndarray) -> int | None:
        """The next token drawn from ``logits`` (its text sent), or None when the answer has ended."""
        sampling, constraint = self.sampling, self._constraint
        if constraint is not None:
            if constraint.stopped:
                return None
            constraint.mask(logits, self._forbid)
        token = pick(logits, sampling, self._rng)
        if token in self._pipe.ids.eos and (constraint is not None or not sampling.ignore_eos):
            return None
        if constraint is not None:
            constraint.consume(token)
        if sampling.logprobs and self._on_logprob is not None:
            self._on_logprob(from_logits(logits, token, sampling.top_logprobs, self._pipe.token_bytes))
        self.stats.completion_tokens += 1
        self._generated.append(token)
        if self._text.push(token) or self.stats.completion_tokens >= sampling.max_tokens or self._cancelled():
            return None
        return token

    def finish(self) -> Generation:
        self._text.flush()
        if not self._text.stopped:  # past a stop string the text sent is not what the tokens say
            self._pipe.answer_ids.remember(self.prompt.text + self._text.sent,
                                           np.concatenate([self.prompt.text_ids, self._generated]).astype(np.int64))
        return self.stats


class TextOut:
    """Token ids in, text pieces out; the text of a stop string and all after it never goes out."""

    def __init__(self, decoder: IncrementalDecoder, stop: tuple[str, ...] | list[str], on_text):
        self._decoder, self._stop, self._on_text = decoder, tuple(s for s in stop or () if s), on_text
        self._held = ""  # text that could be the start of a stop string
        self._sent: list[str] = []  # what went out, joined once at the end (not copied per token)
        self.stopped = False
        self._hold = max((len(s) for s in self._stop), default=1) - 1

    def push(self, token: int) -> bool:
        """Send what is safe to send; True once a stop string has been reached."""
        self._held += self._decoder.push([token])
        for s in self._stop:
            at = self._held.find(s)
            if at >= 0:
                self._send(self._held[:at])
                self._held, self.stopped = "", True
                return True
        cut = len(self._held) - self._hold
        if cut > 0:
            self._send(self._held[:cut])
            self._held = self._held[cut:]
        return False

    def flush(self) -> None:
        self._held += self._decoder.flush()
        self._send(self._held)
        self._held = ""

    @property
    def sent(self) -> str:
        return "".join(self._sent)

    def _send(self, piece: str) -> None:
        if piece:
            self._sent.append(piece)
            self._on_text(piece)


def pick(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> int:
    """Greedy at temperature 0; otherwise a draw from the top-p nucleus of the tempered distribution."""
    if sampling.temperature <= 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / sampling.temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p)
    keep = order[: int(np.searchsorted(np.cumsum(p[order]), sampling.top_p)) + 1]
    q = p[keep] / p[keep].sum()
    return int(keep[rng.choice(len(keep), p=q)])
