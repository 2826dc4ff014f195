"""How a llama.cpp decode step's time grows with the sequences in it: the hybrid engine's batched step, timed through
the engine's own interface (service.engine.llama_worker) on the peer's GGUF, in a child process of its own.

ggml's repacked matmuls take a batch's rows four at a time and each one left over alone, so a step of 4k+3
sequences can be given a fourth row (ops/llamacpp/vlfleet_llama.c): 3 sequences are timed with and without it. The
engine does not pad (service.engine.llama_lm.LlamaLM.step_many says why). Then one sequence's step alone in the
cache and beside three kept conversations, with flash attention on (the engine's setting) and off: the hybrid engine
keeps each conversation's KV, and a step that has to read the others' cells (attention without flash attention)
slows with every conversation kept.

    python -m ops.bench.llama_steps --lib LIB --gguf GGUF [--threads N]   # one JSON line
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

# (sequences, padded): every step size the engine takes, and 3 padded
CASES = ((1, False), (2, False), (3, False), (3, True), (4, False))
KEPT = 450  # tokens of each kept conversation: a question about an image and its answer


def measure(lib: Path, gguf: Path, threads: int, context: int = 150, steps: int = 12, warmup: int = 2) -> dict:
    """Fill each sequence with ``context`` tokens, then time ``steps`` decode steps (after ``warmup``) per case;
    then one sequence's step alone and beside kept conversations, with flash attention on (the engine's) and off."""
    seqs = Sequences(lib, gguf, threads, context)
    rows = [{"sequences": n, "padded": pad, "ms_per_step": timed(partial(seqs.step, n, pad), steps, warmup)}
            for n, pad in CASES]
    kept = {"others": len(seqs.at) - 1, "tokens": KEPT, **seqs.kept(steps, warmup)}
    seqs.model.close()
    kept["flash_attention_off"] = Sequences(lib, gguf, threads, context, flash_attn=False).kept(steps, warmup)
    return {"threads": threads, "context": context, "steps": steps, "rows": rows, "kept": kept}


class Sequences:
    """The hybrid engine's context (as it opens it) with every sequence filled with ``context`` random tokens."""

    def __init__(self, lib: Path, gguf: Path, threads: int, context: int, flash_attn: bool = True):
        import numpy as np

        from service.engine.llama_lm import N_BATCH, SEQUENCES
        from service.engine.llama_worker import Model

        self.model = Model(str(lib), str(gguf), 4096, SEQUENCES, threads, N_BATCH, flash_attn=flash_attn)
        self.rng = np.random.default_rng(0)
        self.vocab = min(20000, self.model.n_vocab)  # ordinary tokens (a tiny test model has a small vocabulary)
        for seq in range(SEQUENCES):
            self.model.tokens(seq, self.random(context), np.arange(context), False)
        self.at = [context] * SEQUENCES

    def random(self, n: int):
        return self.rng.integers(100, self.vocab, n)

    def step(self, n: int, pad: bool = False) -> None:
        self.model.step(list(range(n)), self.random(n), self.at[:n], pad)
        self.at[:n] = [p + 1 for p in self.at[:n]]

    def kept(self, steps: int, warmup: int) -> dict:
        """Sequence 0's step alone in the cache, then beside the others holding KEPT tokens each."""
        import numpy as np

        others = range(1, len(self.at))
        for seq in others:
            self.model.seq_rm(seq, 0)
        alone = timed(partial(self.step, 1), steps, warmup)
        for seq in others:
            self.model.tokens(seq, self.random(KEPT), np.arange(KEPT), False)
        return {"alone_ms": alone, "beside_ms": timed(partial(self.step, 1), steps, warmup)}


def timed(call: Callable[[], object], steps: int, warmup: int) -> float:
    """Median ms of ``steps`` calls after ``warmup``."""
    wall = []
    for _ in range(warmup + steps):
        begin = time.perf_counter()
        call()
        wall.append(time.perf_counter() - begin)
    return round(1000 * statistics.median(wall[warmup:]), 2)


def run_subprocess(lib: Path, gguf: Path, threads: int | None = None, timeout: float = 600) -> dict:
    """``measure`` in a fresh interpreter: libllama is loaded there, never in the bench, and a crash ends only it."""
    threads = threads or len(os.sched_getaffinity(0))
    cmd = [sys.executable, "-m", "ops.bench.llama_steps", "--lib", str(lib), "--gguf", str(gguf),
           "--threads", str(threads)]
    return child_json(cmd, "llama.cpp decode steps", timeout)


def child_json(cmd: list[str], what: str, timeout: float) -> dict:
    """The JSON line a measuring child prints last; RuntimeError naming ``what`` and its stderr's end if it fails."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {proc.returncode}): {proc.stderr[-500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", type=Path, required=True, help="libvlfleet_llama.so")
    parser.add_argument("--gguf", type=Path, required=True, help="the GGUF language model file")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.lib, args.gguf, args.threads)))


if __name__ == "__main__":
    main()
