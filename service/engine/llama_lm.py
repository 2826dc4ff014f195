"""Qwen3-VL's language model in llama.cpp, with the interface of service.engine.stateful_lm.StatefulLM, for the hybrid
engine: the images go through OpenVINO's vision tower (service.engine.vision) and their embeddings into llama.cpp.

The model runs in a child process (service.engine.llama_worker) that owns libllama: a native crash there ends the
request it was serving with an error, and the next request starts a new child, instead of taking the service down.

llama.cpp keeps several sequences in one KV cache (SEQUENCES conversations). A prompt goes to the sequence whose
kept tokens share the longest prefix with it (image tokens compared by the image's digest, as in StatefulLM), is
cut back to that prefix, and only the rest is computed. When the cache has no room for a prompt, the sequences
used longest ago are forgotten first. An image token's row is its embedding followed by its deepstack features
(``[main | deepstack_1 | ... | deepstack_n]``, what llama.cpp's Qwen3-VL graph reads), at its M-RoPE position
(t, y, x, 0); a text token is its id at one position. A cut is made by position, so it never falls inside an image
(all of an image's tokens share their first position): a prefix that ends inside one keeps none of it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from service.engine.llamacpp_child import (
    child_env,
    context_size,
    describe_exit,
    gguf_files,
    installed_package,
    threads,
)
from service.engine.stateful_lm import Prompt, common_prefix
from service.runtime.processes import die_with_parent

SEQUENCES = 4  # conversations whose KV is kept at once, in one shared cache of context_size() tokens
SAME_CONVERSATION = 0.5  # the share of a sequence's tokens a prompt must start with to continue it
N_BATCH = 512  # tokens per llama_decode call in a prefill
STOP_GRACE_S = 10.0
SHIM = "libvlfleet_llama.so"


class WorkerDied(RuntimeError):
    """The child process ended: crashed (a signal) or exited; the message says how."""


def shim_path(settings) -> Path:
    """VLFLEET_LLAMACPP_LIB, else the shim in the installed vlfleet-llama-server wheel."""
    package = installed_package()
    found = Path(settings.llamacpp_lib or (package.BIN / SHIM if package else SHIM))
    if not found.is_file():
        raise RuntimeError(f"{SHIM} not found ({found}): install the vlfleet-llama-server wheel (`vlfleet "
                           "llamacpp.wheel`) or set VLFLEET_LLAMACPP_LIB to the one `vlfleet llamacpp.build` prints")
    return found


class Worker:
    """The child process and its connection; ``call`` is one request and its answer."""

    def __init__(self, open_args: tuple):
        self._open_args = open_args
        parent, child = socket.socketpair()
        root = str(Path(__file__).resolve().parents[2])  # the directory that holds the service package
        env = child_env(Path(open_args[0]))  # the wheel's libraries beside the shim, not the build's it was linked to
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen([sys.executable, "-m", "service.engine.llama_worker", str(child.fileno())],
                                     pass_fds=(child.fileno(),), env=env, preexec_fn=die_with_parent())
        child.close()
        self._conn = Connection(parent.detach())
        self.info = self.call("open", *open_args)

    def call(self, name: str, *args):
        try:
            self._conn.send((name, args))
            kind, value = self._conn.recv()
        except (EOFError, OSError):
            raise WorkerDied(f"llama.cpp's process ended while {name}: {describe_exit(self._wait())}") from None
        if kind == "full":
            raise MemoryError(value)
        if kind == "error":
            raise RuntimeError(value)
        return value

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        self._conn.close()  # the child's loop ends on EOF
        self._wait()

    def _wait(self) -> int | None:
        try:
            return self.proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


@dataclass
class Sequence:
    seq: int
    keys: list = field(default_factory=list)  # one per kept token (StatefulLM's keys)
    starts: list[int] = field(default_factory=list)  # each kept token's first M-RoPE position: what a cut is by
    used: float = 0.0
    busy: bool = False  # claimed by an answer being generated
    reserve: int = 0  # tokens kept free for it while busy: its prompt and longest answer


def image_rows(image, lo: int) -> np.ndarray:
    """The rows llama.cpp takes for image tokens lo.. of ``image``: embedding, then each deepstack layer's feature."""
    parts = [image.embeds[lo:], *(layer[lo:] for layer in image.deepstack)]
    return np.concatenate(parts, axis=1).astype(np.float32)


def segments(prompt: Prompt, keep: int):
    """(kind, start, end) runs of prompt tokens from ``keep`` on: "text" runs and "image" runs, in order."""
    cursor = keep
    for start, image, _ in prompt.images:
        end = start + image.tokens
        if end <= cursor:
            continue
        if start > cursor:
            yield "text", cursor, start
        yield "image", max(start, cursor), end
        cursor = end
    if cursor < len(prompt.ids):
        yield "text", cursor, len(prompt.ids)


class LlamaLM:
    """StatefulLM's interface (prefill, step, reset, keys, vocab_size) over a llama.cpp child process, for one
    conversation at a time; and, for several at once (the hybrid engine's batches), ``claim`` a sequence,
    ``feed`` its prompt in chunks, ``step_many`` one decode step for all, ``release`` it."""

    def __init__(self, settings, model_dir: Path):
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
        text, vision = cfg.get("text_config", cfg), cfg.get("vision_config", {})
        self._row = int(text["hidden_size"]) * (1 + len(vision.get("deepstack_visual_indexes", ())))
        gguf = gguf_files(settings.llamacpp_model_dir or settings.model_dir).language_model
        self._open_args = (str(shim_path(settings)), str(gguf), context_size(settings), SEQUENCES,
                           threads(settings), N_BATCH, settings.log_level == "debug")
        self._worker = self._start()
        self._sequences = [Sequence(i) for i in range(SEQUENCES)]
        self._active = self._sequences[0]

    def _start(self) -> Worker:
        worker = Worker(self._open_args)
        info = worker.info
        if info["n_embd_inp"] != self._row:
            worker.stop()
            raise RuntimeError(f"the GGUF language model takes rows of {info['n_embd_inp']} values, the vision "
                               f"tower gives {self._row}: the two artifacts are not of the same checkpoint")
        self.vocab_size, self.n_ctx = int(info["n_vocab"]), int(info["n_ctx"])
        return worker

    def close(self) -> None:
        self._worker.stop()

    @property
    def keys(self) -> list:
        return self._active.keys

    def reset(self) -> None:
        """Forget every sequence; a child that died is replaced (its KV died with it)."""
        if not self._worker.alive():
            self._worker = self._start()
        else:
            for s in self._sequences:
                if s.keys:
                    self._worker.call("seq_rm", s.seq, 0)
        for s in self._sequences:
            s.keys, s.starts, s.busy, s.reserve = [], [], False, 0

    # --- one conversation at a time (DirectPipeline.generate) ------------------------------------------------

    def prefill(self, prompt: Prompt) -> tuple[np.ndarray, int]:
        s = self._choose(prompt.keys, self._sequences)
        self._active = s
        keep = self._keep(s, prompt)
        self._make_room(len(prompt.keys) - keep, s)
        *_, logits = self.feed(s, prompt, keep, len(prompt.ids))
        return logits, keep

    def step(self, token: int, position: int) -> np.ndarray:
        self._make_room(1, self._active)
        return self.step_many([(self._active, token, position)])[0]

    # --- several at once (the hybrid engine) --------------------------------------------------------------

    def claim(self, prompt: Prompt, answer_tokens: int) -> tuple[Sequence, int] | None:
        """A sequence for ``prompt`` and how many of its tokens it already holds, with room kept for the prompt and
        ``answer_tokens`` more; None while the busy sequences leave no such room (try again when one is released)."""
        idle = [s for s in self._sequences if not s.busy]
        if not idle:
            return None
        s = self._choose(prompt.keys, idle)
        keep = self._keep(s, prompt)
        s.busy, s.reserve = True, len(prompt.keys) + answer_tokens
        if self._make_room(0, s):
            return s, keep
        s.busy, s.reserve = False, 0
        return None

    def release(self, s: Sequence) -> None:
        s.busy, s.reserve = False, 0

    def forget(self, s: Sequence) -> None:
        """Release ``s`` with nothing kept."""
        self._cut(s, 0)
        self.release(s)

    def feed(self, s: Sequence, prompt: Prompt, keep: int, chunk: int) -> Iterator[np.ndarray | None]:
        """Compute ``prompt`` after its first ``keep`` tokens into ``s``, at most ``chunk`` tokens per call to
        llama.cpp; yields None after each call but the last, and the logits after the last."""
        for kind, lo, hi in segments(prompt, keep):
            for a in range(lo, hi, chunk):
                b = min(a + chunk, hi)
                last = b == len(prompt.ids)
                if kind == "text":
                    out = self._worker.call("tokens", s.seq, prompt.ids[a:b], prompt.positions[0, a:b], last)
                else:
                    start, image = next((st, im) for st, im, _ in prompt.images if st <= a < st + im.tokens)
                    pos4 = np.vstack([prompt.positions[:, a:b], np.zeros((1, b - a), np.int64)]).T
                    out = self._worker.call("embeddings", s.seq, image_rows(image, a - start)[:b - a], pos4, last)
                s.keys.extend(prompt.keys[a:b])
                s.starts.extend(prompt.positions[0, a:b].tolist())
                yield out

    def step_many(self, steps: list[tuple[Sequence, int, int]], pad: bool = False) -> np.ndarray:
        """One decode step: token of each (sequence, token, position) at its position; (len(steps), vocab) logits.
        ``pad``: a step of 3 gets a fourth row (vlfleet_llama.c). Off in the engine: the rows then take another
        matmul kernel than one sequence alone, so a seeded answer would change with what it is batched with."""
        out = self._worker.call("step", [s.seq for s, _, _ in steps], [t for _, t, _ in steps],
                                [p for _, _, p in steps], pad)
        for s, token, position in steps:
            s.keys.append(token)
            s.starts.append(position)
        return out

    # --- which sequence, what it keeps ------------------------------------------------------------------------

    @staticmethod
    def _choose(keys: tuple, among: list[Sequence]) -> Sequence:
        """The sequence this prompt continues: the one sharing the longest prefix with it, if that is at least
        SAME_CONVERSATION of what the sequence holds (a follow-up, a regenerated or edited last turn); otherwise an
        empty one, or the one used longest ago. Every conversation shares the chat template's first tokens, so a
        longest prefix alone would make each new conversation take over the last one's sequence."""
        shared = {s.seq: common_prefix(tuple(s.keys), keys) for s in among}
        best = max(among, key=lambda s: (shared[s.seq], s.used))
        if not best.keys or shared[best.seq] < SAME_CONVERSATION * len(best.keys):
            best = min(among, key=lambda s: (bool(s.keys), s.used))
        best.used = time.monotonic()
        return best

    def _keep(self, s: Sequence, prompt: Prompt) -> int:
        """Cut ``s`` back to what ``prompt`` shares with it (at least one token left to compute, never inside an
        image); how many tokens it keeps."""
        keep = min(common_prefix(tuple(s.keys), prompt.keys), len(prompt.keys) - 1)
        for start, image, _ in prompt.images:
            if start < keep < start + image.tokens:
                keep = start
        self._cut(s, keep)
        return keep

    def _cut(self, s: Sequence, length: int) -> None:
        if length < len(s.keys):
            self._worker.call("seq_rm", s.seq, s.starts[length] if length else 0)
            del s.keys[length:], s.starts[length:]

    def _make_room(self, tokens: int, s: Sequence) -> bool:
        """Forget idle sequences, used longest ago first (never ``s``), until ``tokens`` more fit in the cache
        beside what the busy ones hold and have reserved; False if they cannot."""
        def used() -> int:
            return sum(max(len(o.keys), o.reserve) if o.busy else len(o.keys) for o in self._sequences)

        idle = sorted((o for o in self._sequences if o is not s and not o.busy and o.keys), key=lambda o: o.used)
        if used() - sum(len(o.keys) for o in idle) + tokens > self.n_ctx:
            return False  # not even with every idle one forgotten: forget none
        while idle and used() + tokens > self.n_ctx:
            self._cut(idle.pop(0), 0)
        return True
