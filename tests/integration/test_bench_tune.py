"""The bench's tune section (`vlfleet tune`'s choice, made by its own code) on the tiny model, with a llama-server that
dies of SIGSEGV while loading, as the AMX build did on the 2b shape (issue 30): llamacpp is a failed candidate named
with how it died, found by the smoke at once (not after a ready timeout), and the other engines are still measured
and one of them is picked."""

from __future__ import annotations

import time

from ops.bench import suite


def test_a_llama_server_that_dies_while_loading_is_a_failed_candidate_and_tune_picks_another(tiny_model, tiny_gguf,
                                                                                             tmp_path):
    crashing = tmp_path / "llama-server"
    crashing.write_text(f"#!/bin/sh\necho x >> {tmp_path / 'starts'}\n"
                        "echo 'load_tensors: AMX model buffer size = 999.43 MiB'\nkill -SEGV $$\n")
    crashing.chmod(0o755)
    plan = suite.Plan(runs=1, tokens=4, log_dir=tmp_path / "logs")
    said: list[str] = []
    suite._SMOKES.clear()
    started = time.monotonic()
    out = suite.tune_engines(plan, lambda fmt: tiny_model, lambda: suite.PeerInputs(crashing, tiny_gguf, {}),
                             said.append)
    for engine in ("llamacpp", "hybrid"):  # hybrid runs the same libllama: failed with llamacpp's reason
        failed = out["candidates"][engine]
        assert failed["status"] == "failed" and failed["score_s"] is None and failed["ready_s"] is None
        assert failed["reason"].startswith("llama-server crashed while loading: llama-server died while loading "
                                           "(SIGSEGV")
        assert "load_tensors: AMX model buffer" in failed["reason"]
    assert (tmp_path / "starts").read_text().count("x") == 1  # the smoke's start only: no service on it
    measured = {e: c for e, c in out["candidates"].items() if e not in ("llamacpp", "hybrid")}
    assert measured and all(c["status"] == "ok" and c["score_s"] > 0 for c in measured.values()), measured
    assert out["engine"] in measured
    assert any(line.startswith("tune: llamacpp failed: llama-server crashed while loading") for line in said)
    assert time.monotonic() - started < 300
