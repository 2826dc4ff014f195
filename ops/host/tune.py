"""`vlfleet tune`'s host steps (ops/fleet/tune.py): what the host has, the override env file the unit reads after
the release's, a restart on an engine, peak memory, the record of the choice."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .contract import DEFAULT_ENGINE, ENGINES
from .errors import HostError
from .gate import wait_ready
from .layout import link_target, read_env, service_address
from .system import cgroup_file, cgroup_rss, read_json, restart_unit, unit_state, write_atomic

# Where the release wheelhouse's vlfleet-llama-server wheel (ops/llamacpp/wheel.py) puts llama-server in the venv.
RUNTIME_GLOB = "lib/python3*/site-packages/vlfleet_llama_server/bin/llama-server"


def _memory_property(value: str | None) -> int | None:
    """A systemd MemoryHigh/MemoryMax value in bytes; None when unset ("infinity") or unknown."""
    return int(value) if value and value.isdigit() else None


def tune_info(args: dict) -> dict:
    """What tune needs before it changes anything: the release's env, the override and record as they are, the
    unit's memory limits, the host's memory, and whether the llama-server binary the env names exists."""
    root = Path(args["root"])
    env = read_env(root / "current" / "vlfleet.env")
    override = Path(args["override"])
    limits = unit_state(args.get("unit", "vlfleet"), "MemoryHigh,MemoryMax")
    mem_total = next((int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemTotal:")), None)
    return {"release": link_target(root / "current"), "env": env,
            "override": read_env(override) if override.is_file() else None, "record": read_json(Path(args["record"])),
            "memory_high": _memory_property(limits.get("MemoryHigh")),
            "memory_max": _memory_property(limits.get("MemoryMax")), "mem_total": mem_total,
            "llama_server": llama_server(root, env)}


def llama_server(root: Path, env: dict) -> dict:
    """The llama-server the llamacpp engine would run (the env's, else the one the release's wheelhouse put in its
    venv) and the GGUF artifact it would serve, each with whether it is there."""
    server = env.get("VLFLEET_LLAMACPP_SERVER", "") or next(
        (str(p) for p in sorted((root / "current" / "venv").glob(RUNTIME_GLOB))), "")
    model = env.get("VLFLEET_LLAMACPP_MODEL_DIR", "")
    return {"path": server, "exists": bool(server) and os.access(server, os.X_OK),
            "model_dir": model, "model_exists": bool(model) and (Path(model) / "manifest.json").is_file()}


def override_text(engine: str) -> str:
    if engine not in ENGINES:
        raise HostError(f"engine {engine!r}: use one of {', '.join(ENGINES)}")
    return ("# Managed by `vlfleet tune` (its record: tuned.json beside this file). Read by the unit after the\n"
            f"# release's vlfleet.env, so it wins over VLFLEET_ENGINE there.\nVLFLEET_ENGINE={engine}\n")


def set_engine(args: dict) -> dict:
    """Run the service on an engine: write the override env file (no engine: remove it, the release's env decides),
    restart, and wait (bounded) for /readyz 200 reporting that engine."""
    root = Path(args["root"])
    unit = args.get("unit", "vlfleet")
    engine = args.get("engine")
    _write_or_remove(Path(args["override"]), override_text(engine) if engine else None)
    env = read_env(root / "current" / "vlfleet.env")
    expected = engine or env.get("VLFLEET_ENGINE") or DEFAULT_ENGINE
    since, restarts = restart_unit(unit, float(args.get("stop_timeout", 120)))
    # A release from before /readyz named its engine says nothing: take its word that it runs what it was told.
    result = wait_ready(service_address(env), unit, lambda body: body.get("engine", expected) == expected,
                        float(args.get("timeout", 600)), since, restarts)
    return {**result, "engine": expected}


def peak(args: dict) -> dict:
    """Peak memory of the running service: the sum of its processes' VmHWM (the high-water RSS since each started),
    and the cgroup's memory.peak (page cache included) where the kernel has it."""
    cgroup = unit_state(args.get("unit", "vlfleet")).get("ControlGroup") or ""
    cg_peak = (cgroup_file(cgroup, "memory.peak") or "").strip()
    return {"peak_rss_bytes": cgroup_rss(cgroup, field="VmHWM:"), "rss_bytes": cgroup_rss(cgroup),
            "cgroup_peak_bytes": int(cg_peak) if cg_peak.isdigit() else None}


def write_record(args: dict) -> dict:
    """Write tune's record (JSON, world-readable: it holds no secret); ``record`` None removes it."""
    record = args.get("record")
    _write_or_remove(Path(args["path"]), None if record is None else json.dumps(record, indent=1) + "\n")
    return {"written": record is not None}


def _write_or_remove(path: Path, text: str | None) -> None:
    if text is None:
        path.unlink(missing_ok=True)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text.encode(), 0o644)
