"""`vlfleet report`: one HTML page (plus PNG charts and a JSON twin) showing the whole fleet at a glance."""

from __future__ import annotations

from invoke import Exit, task

from ops.host.probe import LATENCY_IMAGE, image_size


@task(help={
    "inventory": "Ansible inventory (see inventory.example); default: ./inventory.yml",
    "out": "directory for report.html, report.json and the PNG charts (default: ./fleet-report)",
    "hosts": "service hosts to include, comma-separated inventory names (default: every host of group vlm)",
    "probe_tokens": "tokens per probe request (default 32; the probe asks for exactly this many)",
    "probe_runs": "probe requests per host; the report shows the median (default 3)",
    "probe_image": "WIDTHxHEIGHT of the probe's pictures (default {}x{}, a typical photo after downscaling)".format(
        *LATENCY_IMAGE),
    "checklist_json": "use this `vlfleet preflight --json` report for the matrix instead of running the checklist",
    "no_checklist": "leave the checklist matrix out (faster)",
    "waivers": "waivers YAML for the checklist run (see docs/checklist.md)",
    "ignore": "check ids waived for the checklist run, comma-separated",
    "jobs": "hosts gathered at once (default 8)",
})
def report(c, inventory="inventory.yml", out="fleet-report", hosts="", probe_tokens=32, probe_runs=3,
           probe_image="", checklist_json=None, no_checklist=False, waivers=None, ignore="", jobs=8):
    """Fleet report: checklist matrix, release/artifact, CPU and ISA, pinning, memory, probe latency charts."""
    from pathlib import Path

    from ops.report import Options, ReportError, build

    if int(probe_tokens) < 2 or int(probe_runs) < 1:
        raise Exit("report: --probe-tokens must be >= 2 (ms/token needs two tokens) and --probe-runs >= 1")
    try:
        image = "x".join(map(str, image_size(probe_image)))  # "" is the default size; "64X64" is sent as 64x64
    except ValueError as e:
        raise Exit(f"report: --probe-image: {e}") from None
    opts = Options(hosts=hosts, probe_tokens=int(probe_tokens), probe_runs=int(probe_runs), probe_image=image,
                   checklist=not no_checklist, checklist_json=checklist_json, waivers=waivers, ignore=ignore or "",
                   jobs=int(jobs))
    try:
        data = build(inventory, out, opts, echo=lambda s: print(s, flush=True))
    except ReportError as e:
        raise Exit(f"report: {e}") from e
    for s in data["slowest"]:
        print(f"[report] slowest by {s['label']}: {s['host']} ({s['value']}, {s['ratio']}x median)"
              + (" OUTLIER" if s["outlier"] else ""))
    print(f"[report] wrote {Path(out).expanduser() / 'report.html'} (+ report.json, "
          + ", ".join(data["charts"].values()) + ")")
