"""`vlfleet report`: the fleet at a glance, gathered from the hosts themselves.

Per service host (group `vlm`), over SSH: release and artifact (`/readyz`, via ops.fleet's host agent), CPU model and
ISA flags, the launcher's core pinning (/run/vlfleet/cpu-plan.json), memory and swap, and a short probe: real streamed
requests to the host's service, timed on the host (first token, ms per token). Then the pre-launch checklist
(ops.preflight) for the host x check matrix, or a `vlfleet preflight --json` report given instead.

Written to one directory: report.json (everything), first_token.png and ms_per_token.png, and report.html (one
self-contained page: inline CSS, the charts embedded; ops/report_html.py renders it).
"""

from __future__ import annotations

import datetime as dt
import json
import shlex
import statistics
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ops.machine import isa

REPORT_VERSION = 1
OUTLIER_RATIO = 1.25  # a host this much slower than the fleet median is called out as an outlier

# One root shell run per host (one SSH round trip: a TCG VM pays seconds per process). argv: root.
FACTS = r"""
root=$1
sec() { echo "@@$1@@"; }
sec model; grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2-
sec flags; grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2-
sec nproc; nproc --all
sec meminfo; grep -E '^(MemTotal|MemAvailable|SwapTotal|SwapFree):' /proc/meminfo
sec os; (. /etc/os-release && echo "$PRETTY_NAME"); uname -r
sec env; cat "$root/current/vlfleet.env" 2>/dev/null
plan=$(sed -n 's/^VLFLEET_CPU_PLAN_FILE=//p' "$root/current/vlfleet.env" 2>/dev/null | tail -n1)
sec plan; cat "${plan:-/run/vlfleet/cpu-plan.json}" 2>/dev/null
sec end
"""

# Runs on the host with the service venv's Python. argv: host port tokens runs timeout. Prints one JSON object.
# A nonce in each prompt: the service replays identical deterministic requests from its answer cache.
PROBE = r"""
import base64, http.client, io, json, sys, time
host, port, tokens, runs, bound = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
from PIL import Image
buf = io.BytesIO()
Image.new("RGB", (96, 64), (40, 120, 200)).save(buf, format="PNG")
url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
out = []
for i in range(runs):
    row = {"status": None, "first_token_s": None, "total_s": None, "tokens": 0, "ms_per_token": None, "error": None}
    body = {"stream": True, "max_tokens": tokens, "ignore_eos": True, "temperature": 0,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                         {"type": "text", "text": "Describe this picture. (probe %d %.6f)" % (i, time.time())}]}]}
    try:
        t0 = time.monotonic()
        conn = http.client.HTTPConnection(host, port, timeout=bound)
        conn.request("POST", "/v1/chat/completions", json.dumps(body),
                     {"Content-Type": "application/json", "Accept": "text/event-stream"})
        resp = conn.getresponse()
        row["status"] = resp.status
        if resp.status != 200:
            row["error"] = "HTTP %d: %s" % (resp.status, resp.read(300).decode(errors="replace"))
        else:
            first = last = None
            for n, raw in enumerate(resp):
                if n > 100000 or time.monotonic() - t0 > bound:
                    row["error"] = "no [DONE] within %.0f s" % bound
                    break
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    row["error"] = json.dumps(event["error"])[:300]
                    break
                if event.get("usage"):
                    row["tokens"] = event["usage"].get("completion_tokens") or row["tokens"]
                delta = (event.get("choices") or [{}])[0].get("delta") or {}
                if delta.get("content"):
                    last = time.monotonic()
                    first = first or last
            row["total_s"] = round(time.monotonic() - t0, 4)
            if first is not None:
                row["first_token_s"] = round(first - t0, 4)
                if row["tokens"] > 1:
                    row["ms_per_token"] = round(1000 * (last - first) / (row["tokens"] - 1), 2)
        conn.close()
    except Exception as e:
        row["error"] = "%s: %s" % (type(e).__name__, e)
    out.append(row)
print(json.dumps(out))
"""


class ReportError(RuntimeError):
    """The report cannot be made (bad inventory, pattern, checklist file); the message says what to fix."""


@dataclass
class Options:
    hosts: str = ""  # comma-separated inventory names; default: every host of group vlm
    probe_tokens: int = 32
    probe_runs: int = 3
    probe_timeout: float = 300.0
    checklist: bool = True
    checklist_json: str | None = None  # a `vlfleet preflight --json` report to use instead of running it
    waivers: str | None = None
    ignore: str = ""
    jobs: int = 8


def _sections(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        if line.startswith("@@") and line.endswith("@@"):
            name = line.strip("@")
            out[name] = ""
        elif name:
            out[name] += line + "\n"
    return out


def parse_facts(text: str) -> dict[str, Any]:
    """The FACTS script's output -> CPU, memory, swap, pinning and service address."""
    s = _sections(text)
    mem = {k: int(v.split()[0]) * 1024 for k, v in
           (ln.split(":", 1) for ln in s.get("meminfo", "").splitlines() if ":" in ln)}
    env = dict(ln.split("=", 1) for ln in s.get("env", "").splitlines() if "=" in ln and not ln.startswith("#"))
    try:
        plan = json.loads(s.get("plan") or "null")
    except ValueError:
        plan = None
    os_lines = s.get("os", "").strip().splitlines()
    nproc = s.get("nproc", "").strip()
    return {
        "cpu_model": s.get("model", "").strip() or None,
        "isa": isa(s.get("flags", "")),
        "cpus": int(nproc) if nproc.isdigit() else None,
        "pinned_cpus": list(plan["cpus"]) if plan and "cpus" in plan else None,
        "threads": plan.get("threads") if plan else None,
        "mem_total_bytes": mem.get("MemTotal"),
        "mem_available_bytes": mem.get("MemAvailable"),
        "swap_total_bytes": mem.get("SwapTotal"),
        "swap_used_bytes": (mem["SwapTotal"] - mem["SwapFree"]) if "SwapTotal" in mem and "SwapFree" in mem else None,
        "os": os_lines[0] if os_lines else None,
        "kernel": os_lines[1] if len(os_lines) > 1 else None,
        "service_host": env.get("VLFLEET_HOST", "127.0.0.1"),
        "service_port": int(env.get("VLFLEET_PORT", "8000")),
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


def gather_host(fleet, name: str, opts: Options) -> dict[str, Any]:
    """Everything about one host; an unreachable host gets ``error`` instead of facts (the report still renders)."""
    from ops.fleet import StepError, describe_error

    host = fleet.host(name)
    groups = [g for g in host.groups if g not in ("all", "ungrouped")]
    row: dict[str, Any] = {"name": name, "groups": groups, "address": host.address, "error": None}
    try:
        p = fleet.probe(name)
        ready = p.get("readyz") or {}
        row.update({"release": p.get("release"), "previous": p.get("previous"),
                    "unit": "/".join(str((p.get("unit") or {}).get(k)) for k in ("ActiveState", "SubState")),
                    "restarts": (p.get("unit") or {}).get("NRestarts"), "rss_bytes": p.get("rss_bytes"),
                    "ready": p.get("readyz_status") == 200, "ready_reason": ready.get("reason", ""),
                    "release_id": ready.get("release_id"), "artifact_id": ready.get("artifact_id"),
                    "model": ready.get("model")})
        conn = fleet.conns[name]
        facts = conn.run(f"sudo -n sh -c {shlex.quote(FACTS)} facts {shlex.quote(host.root)}", hide=True,
                         warn=True, in_stream=False, timeout=120)
        if facts.exited != 0:
            raise StepError(f"reading host facts failed (exit {facts.exited}): {facts.stderr.strip()[-300:]}")
        row.update(parse_facts(facts.stdout))
        python = f"{host.root}/current/venv/bin/python"
        cmd = " ".join(shlex.quote(a) for a in (python, "-c", PROBE, row["service_host"], str(row["service_port"]),
                                                str(opts.probe_tokens), str(opts.probe_runs),
                                                str(opts.probe_timeout)))
        done = conn.run(cmd, hide=True, warn=True, in_stream=False,
                        timeout=opts.probe_timeout * opts.probe_runs + 60)
        try:
            runs = json.loads(done.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            runs = [{"error": f"probe exited {done.exited}: {(done.stderr or done.stdout).strip()[-300:]}"}]
        row["probe"] = summarize_probe(runs)
    except Exception as e:  # one host's failure is a row in the report, not the end of it
        row["error"] = str(e) if isinstance(e, StepError) else describe_error(e)[1]
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
    from ops.fleet import Fleet, FleetError, Inventory
    from ops.monitoring.inventory import InventoryError, load
    from ops.report_html import render, write_charts

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
        "probe": {"tokens": opts.probe_tokens, "runs": opts.probe_runs},
        "hosts": rows,
        "slowest": slowest(rows),
        "checklist": _checklist(inventory, names, opts, out, echo),
    }
    data["charts"] = {k: p.name for k, p in write_charts(data, out).items()}
    (out / "report.json").write_text(json.dumps(data, indent=2) + "\n")
    (out / "report.html").write_text(render(data, out))
    return data
