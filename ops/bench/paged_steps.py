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

SIZES = (1, 2, 3, 4)


def measure(model_dir: Path, context: int = 150, steps: int = 12, warmup: int = 2) -> dict:
    """Fill each sequence with ``context`` text tokens, then time ``steps`` decode steps (after ``warmup``) per
    number of sequences in the step. Settings are the service's defaults for this artifact."""
    import numpy as np

    from service.engine.kept_sequences import SEQUENCES
    from service.engine.paged_lm import PagedLM
    from service.engine.prompt import Prompt
    from service.runtime.settings import load

    lm = PagedLM(load({}, model_dir=model_dir), model_dir)
    rng = np.random.default_rng(0)
    sequences = []
    for _ in range(SEQUENCES):
        prompt = Prompt(rng.integers(100, 20000, context).astype(np.int64), [])
        seq, keep = lm.claim(prompt, (warmup + steps) * len(SIZES))
        list(lm.feed(seq, prompt, keep, context))
        sequences.append(seq)

    def step(n: int) -> None:  # a text token's position is its index
        lm.step_many([(s, int(rng.integers(100, 20000)), len(s.keys)) for s in sequences[:n]])

    rows = [{"sequences": n, "ms_per_step": timed(lambda n=n: step(n), steps, warmup)} for n in SIZES]
    return {"context": context, "steps": steps, "rows": rows}


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
