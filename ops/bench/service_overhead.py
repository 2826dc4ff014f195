"""`vlfleet bench.service`: what the HTTP+SSE path adds over calling VLMPipeline in-process.

Both run in the same process tree on the same artifact, image, prompt and token count, alternating
run by run so drift on a noisy machine hits both alike. The service is started as users start it. The
in-process pipeline is built and streamed exactly as the service builds and streams its own (same settings,
scheduler and streamer), so the ratio is the cost of HTTP, SSE and the service around the pipeline, nothing
else. Each run uses a new image (the same one on both paths), so neither path answers from a warm prefix cache.
"""

from __future__ import annotations

import json
import signal
import tempfile
from pathlib import Path

from ops.bench import workload
from ops.bench.charts import bar_chart
from ops.bench.server import free_port, start_service, wait_ready


def measure(model: Path, runs: int = 5, tokens: int = 64, port: int | None = None) -> dict:
    """Alternate in-process and HTTP+SSE answers on one artifact; medians and their ratios."""
    from service.engine import load_pipeline
    from service.settings import load

    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    log = Path(tempfile.mkdtemp()) / "service.log"
    print(f"[bench.service] loading VLMPipeline in-process from {model} with the service's settings", flush=True)
    pipe = load_pipeline(load({}, model_dir=model))
    print("[bench.service] starting the service", flush=True)
    proc = start_service(model, port, log)
    try:
        wait_ready(url, proc, log=log)
        warm = workload.test_image(seed=runs + 1)
        workload.in_process(pipe, warm, 8)  # warm both paths
        workload.over_http(url, warm, 8)
        local, http = [], []
        for i in range(runs):
            png = workload.test_image(seed=i + 1)
            local.append(workload.in_process(pipe, png, tokens))
            http.append(workload.over_http(url, png, tokens))
            print(f"[bench.service] run {i + 1}/{runs}: in-process first token {local[-1].first_token_s:.2f}s "
                  f"{local[-1].ms_per_token:.1f} ms/token | http {http[-1].first_token_s:.2f}s "
                  f"{http[-1].ms_per_token:.1f} ms/token", flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    result = {
        "benchmark": "service_overhead",
        "model": str(model),
        "image": "416x277 PNG",
        "new_tokens": tokens,
        "in_process": workload.summarize(local),
        "http_sse": workload.summarize(http),
    }
    for key in ("first_token_s", "ms_per_token"):
        result[f"{key}_ratio"] = result["http_sse"][key] / result["in_process"][key]
    result["within_5_percent"] = all(result[f"{k}_ratio"] <= 1.05 for k in ("first_token_s", "ms_per_token"))
    return result


def run(model: Path, out_dir: Path, runs: int = 5, tokens: int = 64, port: int | None = None) -> dict:
    result = measure(model, runs, tokens, port)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench-service.json").write_text(json.dumps(result, indent=2) + "\n")
    bar_chart(out_dir / "bench-service.png", "HTTP+SSE vs in-process VLMPipeline (2b-shape int4)",
              {"first token (s)": [result["in_process"]["first_token_s"], result["http_sse"]["first_token_s"]],
               "ms per token / 100": [result["in_process"]["ms_per_token"] / 100,
                                      result["http_sse"]["ms_per_token"] / 100]},
              series=["in-process", "HTTP+SSE"])
    return result
