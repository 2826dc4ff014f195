"""What `vlfleet report` gathers from the hosts themselves, and the files it writes.

Per service host (group `vlm`), over SSH with the host program (ops/host/): release, artifact and engine (its
`status` step: `/readyz`, and the engine `vlfleet tune` chose, from its record), CPU model and ISA flags, the
launcher's core pinning (/run/vlfleet/cpu-plan.json), memory and swap (its `facts` probe), and a short probe: real
streamed requests to the host's service, timed on the host (its `latency` probe: first token, ms per token). Then
the pre-launch checklist (ops.preflight) for the host x check matrix, or a `vlfleet preflight --json` report given
instead.

Written to one directory: report.json (everything), first_token.png and ms_per_token.png, and report.html (one
self-contained page: inline CSS, the charts embedded; ops/report/page.py renders it).
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ops.host.layout import parse_env, service_address
from ops.host.probe import LATENCY_IMAGE
from ops.machine import isa

REPORT_VERSION = 1
OUTLIER_RATIO = 1.25  # a host this much slower than the fleet median is called out as an outlier

class ReportError(RuntimeError):
    """The report cannot be made (bad inventory, pattern, checklist file); the message says what to fix."""


@dataclass
class Options:
    hosts: str = ""  # comma-separated inventory names; default: every host of group vlm
    probe_tokens: int = 32
    probe_runs: int = 3
    probe_image: str = "x".join(map(str, LATENCY_IMAGE))  # WIDTHxHEIGHT of the probe's pictures
    probe_timeout: float = 300.0
    checklist: bool = True
    checklist_json: str | None = None  # a `vlfleet preflight --json` report to use instead of running it
    waivers: str | None = None
    ignore: str = ""
    jobs: int = 8


def parse_facts(sections: dict[str, Any]) -> dict[str, Any]:
    """the host program's `facts` probe -> CPU, memory, swap, pinning and service address."""
    mem = {k: int(v.split()[0]) * 1024 for k, v in
           (ln.split(":", 1) for ln in sections.get("meminfo", "").splitlines() if ":" in ln)}
    host, port = service_address(parse_env(sections.get("env", "")))
    try:
        plan = json.loads(sections.get("plan") or "null")
    except ValueError:
        plan = None
    cpus = sections.get("cpus")
    return {
        "cpu_model": sections.get("model") or None,
        "isa": isa(sections.get("flags", "")),
        "cpus": cpus if isinstance(cpus, int) else None,
        "pinned_cpus": list(plan["cpus"]) if plan and "cpus" in plan else None,
        "threads": plan.get("threads") if plan else None,
        "mem_total_bytes": mem.get("MemTotal"),
        "mem_available_bytes": mem.get("MemAvailable"),
        "swap_total_bytes": mem.get("SwapTotal"),
        "swap_used_bytes": (mem["SwapTotal"] - mem["SwapFree"]) if "SwapTotal" in mem and "SwapFree" in mem else None,
        "os": sections.get("os") or None,
        "kernel": sections.get("kernel") or None,
        "service_host": host,  # asked from the host itself: a wildcard bind is reached on loopback
        "service_port": port,
    }


def summarize_probe(runs: Sequence[dict]) -> dict[str, Any]:
    """Median first token and ms/token over the runs that streamed, plus the first error."""
    good = [r for r in runs if not r.get("error") and r.get("first_token_s") is not None]
    out: dict[str, Any] = {"runs": list(runs), "ok_runs": len(good), "first_token_s": None, "ms_per_token": None,
                           "tokens": None, "error": next((r["error"] for r in runs if r.get("error")), None)}
    if good:
        out["first_token_s"] = round(statistics.median(r["first_token_s"] for r in good), 4)
        per_token = [r["ms_per_token"] for r in good if r.get("ms_per_token") is not None]
        out["ms_per_token"] = round(statistics.median(per_token), 2) if per_token else None
        out["tokens"] = max(r.get("tokens") or 0 for r in good)
    return out


def slowest(hosts: Sequence[dict]) -> list[dict]:
    """Per metric: the slowest host, and every host at least OUTLIER_RATIO x the fleet median (called outliers)."""
    found = []
    for metric, label in (("first_token_s", "first token"), ("ms_per_token", "ms per token")):
        values = {h["name"]: h["probe"][metric] for h in hosts if (h.get("probe") or {}).get(metric) is not None}
        if not values:
            continue
        median = statistics.median(values.values())
        worst = max(values, key=values.__getitem__)
        for name, value in sorted(values.items(), key=lambda kv: -kv[1]):
            ratio = value / median if median else 1.0
            if name == worst or ratio >= OUTLIER_RATIO:
                found.append({"host": name, "metric": metric, "label": label, "value": value,
                              "median": round(median, 4), "ratio": round(ratio, 2),
                              "outlier": len(values) > 1 and ratio >= OUTLIER_RATIO})
    return found


def locality(metrics_text: str) -> dict[str, Any]:
    """How much of a host's work its caches saved, from its /metrics (since the service started): the answer
    cache's hit ratio, the share of prompt images it did not encode again, the share of prompt tokens whose KV it
    kept. None where it saw nothing to count (an engine without the cache, or no traffic)."""
    from ops.fleet.prometheus_text import samples

    def total(name: str) -> float:
        return sum(v for _labels, v in samples(metrics_text, f"vlfleet_{name}_total"))

    def ratio(part: float, whole: float) -> float | None:
        return round(part / whole, 3) if whole > 0 else None

    hits, misses = total("answer_cache_hits"), total("answer_cache_misses")
    images, runs = total("prompt_images"), total("vision_encoder_runs")
    return {"answer_cache_hits": int(hits), "answer_cache_hit_ratio": ratio(hits, hits + misses),
            "prompt_images": int(images), "vision_encoder_runs": int(runs),
            "image_kept_ratio": ratio(max(0.0, images - runs), images),
            "prompt_tokens_reused_ratio": ratio(total("reused_prompt_tokens"), total("prompt_tokens")),
            "conversations_continued": int(total("session_reuse"))}


def gather_host(fleet, name: str, opts: Options) -> dict[str, Any]:
    """Everything about one host; an unreachable host gets ``error`` instead of facts (the report still renders)."""
    from ops.fleet.batches import describe_error

    host = fleet.host(name)
    groups = [g for g in host.groups if g not in ("all", "ungrouped")]
    row: dict[str, Any] = {"name": name, "groups": groups, "address": host.address, "error": None}
    try:
        p = fleet.status(name)
        ready = p.get("readyz") or {}
        row.update({"release": p.get("release"), "previous": p.get("previous"),
                    "unit": "/".join(str((p.get("unit") or {}).get(k)) for k in ("ActiveState", "SubState")),
                    "restarts": (p.get("unit") or {}).get("NRestarts"), "rss_bytes": p.get("rss_bytes"),
                    "ready": p.get("readyz_status") == 200, "ready_reason": ready.get("reason", ""),
                    "release_id": ready.get("release_id"), "artifact_id": ready.get("artifact_id"),
                    "model": ready.get("model"), "engine": ready.get("engine"),
                    "tuned_engine": p.get("tuned_engine"), "locality": locality(p.get("metrics") or "")})
        row.update(parse_facts(fleet.probe(name, "facts", host.root)))
        row["probe"] = summarize_probe(fleet.latency(name, row["service_host"], row["service_port"], opts.probe_tokens,
                                                     opts.probe_runs, opts.probe_timeout, "", 1, opts.probe_image,
                                                     timeout=opts.probe_timeout * opts.probe_runs + 60))
    except Exception as e:  # one host's failure is a row in the report, not the end of it
        row["error"] = describe_error(e)[1]
        row.setdefault("probe", None)
    return row


def _checklist(inventory: Path, names: list[str], opts: Options, out_dir: Path, echo) -> dict | None:
    from ops.preflight import runner

    if not opts.checklist:
        return None
    if opts.checklist_json:
        path = Path(opts.checklist_json).expanduser()
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ReportError(f"--checklist-json {path}: {e}; pass the file `vlfleet preflight --json FILE` "
                              "wrote") from e
    echo(f"[report] running the pre-launch checklist on {len(names)} host(s) ...")
    popts = runner.Options(ignore=opts.ignore, waivers=opts.waivers)
    if popts.waivers:
        popts.waivers = str(Path(popts.waivers).expanduser().resolve())
    try:
        report = runner.run_fleet(inventory, names, popts, out_dir=out_dir / "checklist-logs")
    except runner.PreflightError as e:
        raise ReportError(str(e)) from e
    return report.to_json()


def build(inventory: Path | str, out_dir: Path | str, opts: Options | None = None,
          echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Gather, write report.json, the charts and report.html into ``out_dir``; return the report data."""
    from ops.fleet.inventory import FleetError, Inventory
    from ops.fleet.transport import Fleet
    from ops.monitoring.inventory import InventoryError, load
    from ops.report.page import render, write_charts

    opts = opts or Options()
    inventory = Path(inventory).expanduser().resolve()
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    try:
        hosts = load(inventory)
    except InventoryError as e:
        raise ReportError(str(e)) from e
    limit = [h.strip() for h in opts.hosts.split(",") if h.strip()] or None
    try:
        fleet = Fleet(Inventory(hosts), limit=limit, echo=None)
    except FleetError as e:
        raise ReportError(str(e)) from e
    names = [h.name for h in fleet.hosts]
    echo(f"[report] {len(names)} host(s): {', '.join(names)}; probing ({opts.probe_runs} x {opts.probe_tokens} "
         "tokens each) ...")
    with fleet, ThreadPoolExecutor(max_workers=max(1, min(opts.jobs, len(names)))) as pool:
        rows = list(pool.map(lambda n: gather_host(fleet, n, opts), names))
    for r in rows:
        p = r.get("probe") or {}
        echo(f"[report] {r['name']}: " + (f"error: {r['error']}" if r["error"] else
                                           f"first token {p.get('first_token_s')} s, {p.get('ms_per_token')} ms/token"))
    data: dict[str, Any] = {
        "version": REPORT_VERSION,
        "generated_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "inventory": str(inventory),
        "probe": {"tokens": opts.probe_tokens, "runs": opts.probe_runs, "image": opts.probe_image},
        "hosts": rows,
        "slowest": slowest(rows),
        "checklist": _checklist(inventory, names, opts, out, echo),
    }
    data["charts"] = {k: p.name for k, p in write_charts(data, out).items()}
    (out / "report.json").write_text(json.dumps(data, indent=2) + "\n")
    (out / "report.html").write_text(render(data, out))
    return data
