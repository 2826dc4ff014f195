"""Qwen3-VL's language model in llama.cpp, a service.engine.kept_sequences.KeptSequences, for the hybrid engine:
the images go through OpenVINO's vision tower (service.engine.vision) and their embeddings into llama.cpp.

The model runs in a child process (service.engine.llama_worker) that owns libllama: a native crash there ends the
request it was serving with an error, and the next request starts a new child, instead of taking the service down.

llama.cpp keeps several sequences in one KV cache (SEQUENCES conversations, chosen and cut as
service.engine.kept_sequences says). An image token's row is its embedding followed by its deepstack features
(``[main | deepstack_1 | ... | deepstack_n]``, what llama.cpp's Qwen3-VL graph reads), at its M-RoPE position
(t, y, x, 0); a text token is its id at one position. A cut is made by position, so it never falls inside an image
(all of an image's tokens share their first position).

With VLFLEET_HYBRID_PREFILL=openvino (the default) a new conversation's prompt is computed by the artifact's
OpenVINO language model and its KV handed to llama.cpp (service.engine.kv_handoff); the answer's tokens and a
follow-up's new turn are llama.cpp's, after the KV its sequence keeps.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from service.engine.kept_sequences import SEQUENCES, KeptSequences, Sequence, segments
from service.engine.kv_handoff import Layout, LayoutError, OpenVINOPrefill
from service.engine.llamacpp_child import (
    child_env,
    context_size,
    describe_exit,
    gguf_files,
    installed_package,
    threads,
)
from service.engine.prompt import Prompt
from service.runtime.processes import die_with_parent

log = logging.getLogger("vlfleet.engine")

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


def image_rows(image, lo: int) -> np.ndarray:
    """The rows llama.cpp takes for image tokens lo.. of ``image``: embedding, then each deepstack layer's feature."""
    parts = [image.embeds[lo:], *(layer[lo:] for layer in image.deepstack)]
    return np.concatenate(parts, axis=1).astype(np.float32)


class LlamaLM(KeptSequences):
    """service.engine.kept_sequences.KeptSequences over a llama.cpp child process: each sequence is a llama.cpp
    sequence of one KV cache, cut by position."""

    context_setting = "VLFLEET_LLAMACPP_CTX"
    runtime = "llamacpp"

    def __init__(self, settings, model_dir: Path):
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
        text, vision = cfg.get("text_config", cfg), cfg.get("vision_config", {})
        self._row = int(text["hidden_size"]) * (1 + len(vision.get("deepstack_visual_indexes", ())))
        gguf = gguf_files(settings.llamacpp_model_dir or settings.model_dir).language_model
        self._open_args = (str(shim_path(settings)), str(gguf), context_size(settings), SEQUENCES,
                           threads(settings), N_BATCH, settings.log_level == "debug")
        self._worker = self._start()
        self._init_sequences()
        self._prefill = self._openvino_prefill(settings, model_dir) if settings.hybrid_prefill == "openvino" else None

    def _start(self) -> Worker:
        worker = Worker(self._open_args)
        info = worker.info
        if info["n_embd_inp"] != self._row:
            worker.stop()
            raise RuntimeError(f"the GGUF language model takes rows of {info['n_embd_inp']} values, the vision "
                               f"tower gives {self._row}: the two artifacts are not of the same checkpoint")
        self.vocab_size, self.n_ctx = int(info["n_vocab"]), int(info["n_ctx"])
        return worker

    def _openvino_prefill(self, settings, model_dir: Path) -> OpenVINOPrefill | None:
        """OpenVINO's prefill, with the layout of what llama.cpp writes for a one-token sequence; None (prompts on
        llama.cpp) if that layout is one kv_handoff cannot write."""
        seq = self._sequences[0].seq  # empty until the first request
        self._worker.call("tokens", seq, [0], [0], False)
        try:
            layout = Layout.probe(self._worker.call("get_state", seq))
        except LayoutError as e:
            log.warning("prompts are computed on llama.cpp: %s", e)
            return None
        finally:
            self._worker.call("seq_rm", seq, 0)
        return OpenVINOPrefill(settings, model_dir, layout)

    def close(self) -> None:
        self._worker.stop()

    def reset(self) -> None:
        """Forget every sequence; a child that died is replaced (its KV died with it)."""
        if not self._worker.alive():
            self._worker = self._start()
        else:
            for s in self._sequences:
                if s.keys:
                    self._worker.call("seq_rm", s.seq, 0)
        self._forget_all()

    def prefill_on(self, tokens: int, keep: int) -> str:
        return "openvino" if self._prefill is not None and self._prefill.worth(tokens, keep) else self.runtime

    def _keep(self, s: Sequence, prompt: Prompt) -> int:
        keep = super()._keep(s, prompt)
        if self.prefill_on(len(prompt.ids), keep) == "openvino":
            self._cut(s, 0)  # the whole prompt is OpenVINO's
            return 0
        return keep

    def feed(self, s: Sequence, prompt: Prompt, keep: int, chunk: int) -> Iterator[np.ndarray | None]:
        if keep == 0 and self.prefill_on(len(prompt.ids), 0) == "openvino":
            yield from self._handed_over(s, prompt, chunk)
            return
        yield from self._computed(s, prompt, keep, chunk)

    def _computed(self, s: Sequence, prompt: Prompt, keep: int, chunk: int) -> Iterator[np.ndarray | None]:
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
                self._kept(s, prompt, a, b)
                yield out

    def _handed_over(self, s: Sequence, prompt: Prompt, chunk: int) -> Iterator[np.ndarray | None]:
        """``prompt`` computed by OpenVINO, its KV written into ``s``. Chunks twice as long as llama.cpp's: OpenVINO
        computes a prompt about twice as fast, so the others' decode waits as long between two."""
        for state in self._prefill.feed(prompt, 2 * chunk):
            if state is None:
                yield None
                continue
            self._worker.call("set_state", s.seq, state)
            self._kept(s, prompt, 0, len(prompt.ids) - 1)
        yield from self._computed(s, prompt, len(prompt.ids) - 1, chunk)  # the last token: its logits llama.cpp's

    def step_many(self, steps: list[tuple[Sequence, int, int]], pad: bool = False) -> np.ndarray:
        """``pad``: a step of 3 gets a fourth row (vlfleet_llama.c). Off in the engine: the rows then take another
        matmul kernel than one sequence alone, so a seeded answer would change with what it is batched with."""
        out = self._worker.call("step", [s.seq for s, _, _ in steps], [t for _, t, _ in steps],
                                [p for _, _, p in steps], pad)
        self._stepped(steps)
        return out

    def _cut_kv(self, s: Sequence, length: int) -> None:
        self._worker.call("seq_rm", s.seq, s.starts[length] if length else 0)
