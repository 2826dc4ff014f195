"""`vlfleet preflight`: the pre-launch checklist over the inventory, hosts in parallel; exit 0 only when ready."""

from __future__ import annotations

import sys
from pathlib import Path

from invoke import Exit, task


@task(help={
    "inventory": "Ansible inventory (see inventory.example); default: ./inventory.yml",
    "hosts": "inventory hosts or groups to check, comma-separated (an Ansible pattern); default: vlm",
    "ignore": "check ids whose failures are waived for this run, comma-separated (e.g. CPU-AVX512,CLOCK-SYNC)",
    "waivers": "waivers YAML: entries with id, reason, expires (YYYY-MM-DD) and optional hosts",
    "junit": "write JUnit XML here (one testcase per host x check)",
    "json": "write the JSON report here",
    "jobs": "hosts checked at once (default: all, up to 16)",
    "stream_timeout": "seconds the STREAM check's answer may take to [DONE] (default: 120)",
    "keep_logs": "directory for each host's pytest output (default: a temporary directory, printed)",
})
def preflight(c, inventory="inventory.yml", hosts="vlm", ignore="", waivers=None, junit=None, json=None, jobs=0,
              stream_timeout=120, keep_logs=None):
    """Run the pre-launch checklist (ops/preflight) on every host; print a host x check table."""
    import tempfile

    from ops.preflight.results import render_table
    from ops.preflight.runner import Options, PreflightError, resolve_hosts, run_fleet

    if waivers and not Path(waivers).expanduser().is_file():
        raise Exit(f"preflight: waivers file {waivers} not found; see docs/checklist.md#waivers for the format")
    try:
        inv = Path(inventory).expanduser().resolve()
        names = resolve_hosts(inv, ",".join(h.strip() for h in hosts.split(",") if h.strip()) or "vlm")
        opts = Options(ignore=ignore or "", waivers=str(Path(waivers).expanduser()) if waivers else None,
                       stream_timeout=float(stream_timeout))
        print(f"[preflight] checking {len(names)} host(s): {', '.join(names)}", flush=True)
        logs = Path(keep_logs).expanduser() if keep_logs else Path(tempfile.mkdtemp(prefix="vlfleet-preflight-"))
        print(f"[preflight] per-host pytest output in {logs}", flush=True)
        report = run_fleet(inv, names, opts, out_dir=logs,
                           jobs=int(jobs), on_host=lambda h, r: print(
                               f"[preflight] {h}: done ({len(r.failed_ids(h))} failed)", flush=True))
    except PreflightError as e:
        raise Exit(f"preflight: {e}") from e
    print(render_table(report, color=sys.stdout.isatty()))
    if json:
        print(f"[preflight] JSON report: {report.write_json(Path(json).expanduser())}")
    if junit:
        print(f"[preflight] JUnit XML: {report.write_junit(Path(junit).expanduser())}")
    if report.exit_code:
        raise Exit("preflight: not ready: fix the error findings above (or waive them with --ignore/--waivers)",
                   code=report.exit_code)
