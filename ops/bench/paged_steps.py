"""How an OpenVINO paged decode step's time grows with the sequences in it: the paged engine's batched step, timed
through its own language model (service.engine.paged_lm) on the int4 artifact, in a child process of its own.

With one client a decode step is one row; with N clients it is up to N. The bench's 4-client ceiling
(ops.bench.targets.throughput_ceiling) takes the ratio of the two from here: what a shared step costs over one row
bounds what batching can gain.

    python -m ops.bench.paged_steps --model-dir IR   # one JSON line
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ops.bench.llama_steps import child_json, timed

FUSED_OTHERS = 3  # the decode step beside a prompt chunk when a fourth client's prompt comes in


def measure(model_dir: Path, context: int = 150, steps: int = 12, warmup: int = 2) -> dict:
    """Fill each sequence with ``context`` text tokens, then time ``steps`` decode steps (after ``warmup``) per
    number of sequences in the step; then a prompt chunk alone and with the others' decode step in it (``fused``).
    Settings are the service's defaults for this artifact."""
    import numpy as np

    from service.engine.paged_lm import PagedLM
    from service.engine.prompt import Prompt
    from service.runtime.settings import load

    lm = PagedLM(load({}, model_dir=model_dir), model_dir)
    rng = np.random.default_rng(0)
    sequences = []
    sizes = range(1, lm.sequences + 1)
    for _ in sizes:
        prompt = Prompt(rng.integers(100, 20000, context).astype(np.int64), [])
        seq, keep = lm.claim(prompt, (warmup + steps) * (len(sizes) + 2))
        list(lm.feed(seq, prompt, keep, context))
        sequences.append(seq)

    def decode(seqs: list) -> list:  # a text token's position is its index
        return [(s, int(rng.integers(100, 20000)), len(s.keys)) for s in seqs]

    rows = [{"sequences": n, "ms_per_step": timed(lambda n=n: lm.step_many(decode(sequences[:n])), steps, warmup)}
            for n in sizes]
    return {"context": context, "steps": steps, "rows": rows,
            "fused": _fused(lm, sequences[-1], sequences[:FUSED_OTHERS], decode, rng, steps, warmup)}


def _fused(lm, filling, others: list, decode, rng, steps: int, warmup: int) -> dict:
    """A PREFILL_CHUNK-token prompt chunk into ``filling`` alone, the decode step of ``others`` alone, and the two in
    one call as the paged engine makes it (service.engine.paged: the chunk less the step's rows)."""
    import numpy as np

    from service.engine.hybrid import PREFILL_CHUNK
    from service.engine.prompt import Prompt

    chunk = Prompt(rng.integers(100, 20000, PREFILL_CHUNK).astype(np.int64), [])

    def fill(rows: int, beside: list) -> None:
        lm._cut(filling, 0)  # the chunk starts a new prompt each time
        lm.feed_beside(filling, chunk, 0, rows, beside)

    return {"chunk": PREFILL_CHUNK, "others": len(others),
            "chunk_ms": timed(lambda: fill(PREFILL_CHUNK, []), steps, warmup),
            "step_ms": timed(lambda: lm.step_many(decode(others)), steps, warmup),
            "together_ms": timed(lambda: fill(PREFILL_CHUNK - len(others), decode(others)), steps, warmup)}


def run_subprocess(model_dir: Path, timeout: float = 600) -> dict:
    """``measure`` in a fresh interpreter: the bench's own process never holds a model."""
    cmd = [sys.executable, "-m", "ops.bench.paged_steps", "--model-dir", str(model_dir)]
    return child_json(cmd, "paged decode steps", timeout)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True, help="the OpenVINO IR artifact")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.model_dir)))


if __name__ == "__main__":
    main()
