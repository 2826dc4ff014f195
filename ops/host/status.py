"""What `vlfleet status` shows of one host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import client
from .errors import HostError
from .gate import readyz
from .layout import link_target, read_env, service_address
from .system import cgroup_rss, read_json, unit_state

# What the fleet report's cache locality panel reads (ops/report/collect.py).
LOCALITY_METRICS = ("vlfleet_answer_cache_hits_total", "vlfleet_answer_cache_misses_total",
                    "vlfleet_vision_encoder_runs_total", "vlfleet_prompt_images_total",
                    "vlfleet_reused_prompt_tokens_total", "vlfleet_prompt_tokens_total", "vlfleet_session_reuse_total")


def status(args: dict) -> dict:
    root = Path(args["root"])
    out: dict[str, Any] = {"release": link_target(root / "current"), "previous": link_target(root / "previous")}
    try:
        state = unit_state(args.get("unit", "vlfleet"))
    except HostError as e:
        state = {"error": str(e)}
    out["unit"] = {k: state.get(k) for k in ("ActiveState", "SubState", "MainPID", "NRestarts")}
    out["rss_bytes"] = cgroup_rss(state.get("ControlGroup") or "")
    record = read_json(Path(args["record"])) if args.get("record") else None
    out["tuned_engine"] = record.get("engine") if isinstance(record, dict) else None
    env = read_env(root / "current" / "vlfleet.env")
    addr = service_address(env)
    out["readyz_status"], out["readyz"] = readyz(addr)
    code, raw = client.get(client.base_url(*addr) + "/metrics", timeout=5, key=client.api_key(env))
    keep = ("vlfleet_time_to_first_token_seconds", "vlfleet_model_info", *LOCALITY_METRICS)
    out["metrics"] = "\n".join(line for line in raw.decode(errors="replace").splitlines()
                               if line.startswith(keep)) if code == 200 else ""
    return out
