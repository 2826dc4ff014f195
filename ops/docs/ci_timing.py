"""results/ci-timing.md: the wall time of a CI-like run, from results/ci-timing.json (the suite's timing hooks in
tests/budget.py) and results/ci-run.json (written by .ci/run)."""

from __future__ import annotations

import json
from pathlib import Path

from ops.docs.markdown import HEADER


def render(root: Path) -> str:
    data = json.loads((root / "results" / "ci-timing.json").read_text())
    run_file = root / "results" / "ci-run.json"
    run = json.loads(run_file.read_text()) if run_file.is_file() else {}
    machine = data["machine"]
    suites: dict[str, float] = {}
    for module, seconds in data["modules"].items():
        suite = module.split("/")[1] if module.count("/") > 1 else module
        suites[suite] = suites.get(suite, 0.0) + seconds
    lines = [HEADER.format(source="results/ci-timing.json and results/ci-run.json"), "# CI timing", "",
             f"One run of `bash .ci/run` from a fresh clone, on {machine['cpu']} "
             f"({machine['cpus']} CPUs; ISA: {', '.join(machine['isa']) or 'none of note'}).", "",
             f"- cache: {cache_state(run)}",
             "- `.ci/run` in all (apt, venv, model, staging images, tests, demo): "
             + (f"**{run['wall_s'] / 60:.1f} min** (exit {run['exit']})" if run else "not recorded"),
             f"- `make test` session: {data['session_s'] / 60:.1f} min, {data['tests_run']} tests, "
             f"exit status {data['exit_status']}",
             f"- `make demo` after it: {demo(run)}", "",
             "| suite | minutes |", "|---|---|"]
    lines += [f"| {suite} | {seconds / 60:.1f} |" for suite, seconds in sorted(suites.items())]
    lines += ["", "Per module (setup, call and teardown of its tests, fixtures included):", "",
              "| module | seconds |", "|---|---|"]
    lines += [f"| `{module}` | {seconds:.0f} |" for module, seconds in
              sorted(data["modules"].items(), key=lambda kv: -kv[1])]
    return "\n".join(lines) + "\n"


def cache_state(run: dict) -> str:
    """Cold or warm, from the parts of $VLFLEET_CACHE that held something before and after the run (.ci/run)."""
    if "cache_before" not in run:
        return "not recorded"
    before, built = run["cache_before"], [p for p in run["cache_after"] if p not in run["cache_before"]]
    state = "**cold** (empty at the start)" if not before else f"**warm**: held {', '.join(before)} at the start"
    return state + (f"; built during the run: {', '.join(built)}" if built else "")


def demo(run: dict) -> str:
    if run.get("demo_s", -1) < 0:
        return "not run" if "demo_s" in run else "not recorded"
    return f"{run['demo_s'] / 60:.1f} min"
