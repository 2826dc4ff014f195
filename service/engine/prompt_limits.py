"""Limits on what one prompt may ask of the inference thread: input tokens (text + image), turns and images.

Prefill costs roughly linear-to-quadratic time in the prompt's length, and there is one inference thread: a single
huge prompt would hold every other client for minutes. So the prompt is counted before it is queued, and one over
the limit is a 400 that names the limit and the count. Conversations continued by session id are counted again on
the inference thread, where their earlier turns are known.

Image tokens follow Qwen-VL's image processor (preprocessor_config.json of the artifact): the image is resized to
multiples of patch x merge pixels within [min_pixels, max_pixels], and each merge x merge block of patches is one
token, plus the vision start/end tokens.
"""

from __future__ import annotations

import json
import math
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from service.engine.conversation import RESERVED_TAG_PATTERN, Conversation
from service.engine.errors import APIError

IMAGE_TAG = re.compile(RESERVED_TAG_PATTERN)  # the tags render_prompt puts in; client text may hold none
VISION_WRAP = 2  # <|vision_start|> ... <|vision_end|> around each image's tokens


@dataclass(frozen=True)
class VisionGrid:
    patch: int = 16
    merge: int = 2
    min_pixels: int = 3136
    max_pixels: int = 1003520

    @classmethod
    def of_model(cls, model_dir: Path) -> VisionGrid:
        try:
            cfg = json.loads((Path(model_dir) / "preprocessor_config.json").read_text())
        except (OSError, ValueError):
            return cls()
        size = cfg.get("size") or {}
        return cls(int(cfg.get("patch_size", cls.patch)), int(cfg.get("merge_size", cls.merge)),
                   int(size.get("shortest_edge", cfg.get("min_pixels", cls.min_pixels))),
                   int(size.get("longest_edge", cfg.get("max_pixels", cls.max_pixels))))

    @staticmethod
    def _round(x: float) -> int:
        return round(x)  # Python's: half to even, as the Hugging Face image processor

    def resized(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) the image processor resizes an image to (Qwen's smart resize)."""
        f = self.patch * self.merge
        h, w = max(f, self._round(height / f) * f), max(f, self._round(width / f) * f)
        if h * w > self.max_pixels:
            beta = math.sqrt(height * width / self.max_pixels)
            h, w = max(f, math.floor(height / beta / f) * f), max(f, math.floor(width / beta / f) * f)
        elif h * w < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h, w = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
        return w, h

    def tokens(self, width: int, height: int) -> int:
        """Image tokens the language model sees for an image of ``width`` x ``height``."""
        w, h = self.resized(width, height)
        f = self.patch * self.merge
        return (h // f) * (w // f)


class PromptLimits:
    """Counts a conversation's input tokens and refuses one over VLFLEET_MAX_INPUT_TOKENS, _MAX_TURNS or
    _MAX_CONVERSATION_IMAGES. Its own tokenizer (the pipeline's belongs to the inference thread), under a lock."""

    def __init__(self, settings, render):
        self.max_tokens = settings.max_input_tokens
        self.max_turns = settings.max_turns
        self.max_images = settings.max_conversation_images
        self.grid = VisionGrid.of_model(settings.model_dir)
        self._model_dir = settings.model_dir
        self._render = render  # (tokenizer, conversation) -> prompt text, as the engine renders it
        self._tokenizer = None
        self._lock = threading.Lock()

    def count(self, conv: Conversation) -> int:
        with self._lock:
            if self._tokenizer is None:
                import openvino_genai as ov_genai

                self._tokenizer = ov_genai.Tokenizer(str(self._model_dir))
            text = IMAGE_TAG.sub("", self._render(self._tokenizer, conv))
            ids = self._tokenizer.encode(text, add_special_tokens=False).input_ids
        return int(ids.shape[-1]) + sum(self.grid.tokens(*img.size) + VISION_WRAP for img in conv.images)

    def check(self, conv: Conversation) -> int:
        """The conversation's input tokens; raises a 400 naming the limit when it is over one."""
        turns, images = sum(t.role == "user" for t in conv.turns), len(conv.images)
        if turns > self.max_turns:
            raise APIError(f"the conversation has {turns} user turns; the limit is {self.max_turns} "
                           "(VLFLEET_MAX_TURNS): start a new conversation or drop early turns",
                           param="messages", code="too_many_turns")
        if images > self.max_images:
            raise APIError(f"the conversation has {images} images; the limit is {self.max_images} "
                           "(VLFLEET_MAX_CONVERSATION_IMAGES): start a new conversation or drop earlier images",
                           param="messages", code="too_many_images")
        tokens = self.count(conv)
        if tokens > self.max_tokens:
            raise APIError(f"the prompt is {tokens} tokens (text and images); the limit is {self.max_tokens} "
                           "(VLFLEET_MAX_INPUT_TOKENS): shorten the text, send fewer or smaller images, or start a "
                           "new conversation", param="messages", code="context_length_exceeded")
        return tokens
