"""`vlfleet bench.*`: benchmarks on the 2b-shape synthetic model; JSON + PNG under results/."""

from __future__ import annotations

from pathlib import Path

from invoke import task


def _artifact(weight_format: str) -> Path:
    from ops.model.cache import artifact
    from ops.model.convert import ConvertParams

    print(f"[bench] preparing the 2b-shape {weight_format} artifact (cached after the first build)", flush=True)
    return artifact("2b", ConvertParams(weight_format))


@task(help={"runs": "measured runs per path (default 5)", "tokens": "new tokens per answer (default 64)",
            "out": "results directory (default results/)", "model": "artifact (default: 2b-shape int4, built)"})
def service(c, runs=5, tokens=64, out="results", model=None):
    """HTTP+SSE path vs in-process VLMPipeline: first token and ms/token, same run."""
    from ops.bench.service_overhead import run

    result = run(Path(model) if model else _artifact("int4"), Path(out), int(runs), int(tokens))
    print(f"first token: in-process {result['in_process']['first_token_s']:.3f}s, "
          f"http {result['http_sse']['first_token_s']:.3f}s (x{result['first_token_s_ratio']:.3f})")
    print(f"ms/token:    in-process {result['in_process']['ms_per_token']:.1f}, "
          f"http {result['http_sse']['ms_per_token']:.1f} (x{result['ms_per_token_ratio']:.3f})")
    print(f"saved {out}/bench-service.json and .png")
