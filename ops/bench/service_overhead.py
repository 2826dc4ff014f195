"""`vlfleet bench.service`: what the HTTP+SSE path adds over calling VLMPipeline in-process.

Both run in the same process tree on the same artifact, image, prompt and token count, alternating
run by run so drift on a noisy machine hits both alike. The service is started as users start it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ops.bench import workload
from ops.bench.charts import bar_chart


def start_service(model: Path, port: int, log: Path) -> subprocess.Popen:
    vlfleet = Path(sys.executable).with_name("vlfleet")
    env = {**os.environ, "VLFLEET_MAX_TOKENS": "4096"}
    with open(log, "wb") as out:
        return subprocess.Popen([str(vlfleet), "serve", "--model", str(model), "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, env=env)


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 900) -> None:
    import requests

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("service exited before becoming ready")
        try:
            if requests.get(url + "/readyz", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(1)
    raise TimeoutError(f"service not ready after {timeout}s")


def run(model: Path, out_dir: Path, runs: int = 5, tokens: int = 64, port: int = 8765) -> dict:
    import openvino_genai as ov_genai

    png = workload.test_image()
    url = f"http://127.0.0.1:{port}"
    log = Path(tempfile.mkdtemp()) / "service.log"
    print(f"[bench.service] loading VLMPipeline in-process from {model}", flush=True)
    pipe = ov_genai.VLMPipeline(str(model), "CPU")
    print("[bench.service] starting the service", flush=True)
    proc = start_service(model, port, log)
    try:
        wait_ready(url, proc)
        workload.in_process(pipe, png, 8)  # warm both paths
        workload.over_http(url, png, 8)
        local, http = [], []
        for i in range(runs):
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
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench-service.json").write_text(json.dumps(result, indent=2) + "\n")
    bar_chart(out_dir / "bench-service.png", "HTTP+SSE vs in-process VLMPipeline (2b-shape int4)",
              {"first token (s)": [result["in_process"]["first_token_s"], result["http_sse"]["first_token_s"]],
               "ms per token / 100": [result["in_process"]["ms_per_token"] / 100,
                                      result["http_sse"]["ms_per_token"] / 100]},
              series=["in-process", "HTTP+SSE"])
    return result
