"""`vlfleet preflight`: the pre-launch checklist over the inventory, hosts in parallel; exit 0 only when ready."""

from __future__ import annotations

import sys

from invoke import Exit, task


@task(help={
    "inventory": "Ansible inventory (see inventory.example); default: ./inventory.yml",
    "hosts": "inventory hosts or groups to check, comma-separated (an Ansible pattern); default: vlm",
    "ignore": "check ids whose failures are waived for this run, comma-separated (e.g. CPU-AVX512,CLOCK-SYNC)",
    "waivers": "waivers YAML: entries with id, reason, expires (YYYY-MM-DD) and optional hosts",
    "junit": "write JUnit XML here (one testcase per host x check)",
    "json": "write the JSON report here",
    "jobs": "hosts checked at once (default: all, up to 16)",
    "stream_timeout": "seconds the SVC-STREAM check's answer may take to [DONE] (default: 120)",
    "logs": "directory for each host's pytest output (default: a temporary directory, printed)",
})
def preflight(c, inventory="inventory.yml", hosts="vlm", ignore="", waivers=None, junit=None, json=None, jobs=0,
              stream_timeout=120, logs=None):
    """Run the pre-launch checklist (ops/preflight) on every host; print a host x check table."""
    from ops.preflight.runner import Options, PreflightError, run_and_report

    opts = Options(ignore=ignore or "", waivers=waivers, stream_timeout=float(stream_timeout))
    try:
        report = run_and_report(inventory, hosts, opts, junit=junit, json_out=json, jobs=int(jobs), logs=logs,
                                color=sys.stdout.isatty(), echo=lambda s: print(s, flush=True))
    except PreflightError as e:
        raise Exit(f"preflight: {e}") from e
    if report.exit_code:
        raise Exit("preflight: not ready: fix the error findings above (or waive them with --ignore / --waivers)",
                   code=report.exit_code)
