"""`python -m ops.preflight`: the fleet run without Fabric (the preflight Ansible role calls this)."""

from __future__ import annotations

import argparse
import sys

from ops.preflight.runner import Options, PreflightError, run_and_report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.preflight", description="Run the vlfleet pre-launch checklist.")
    p.add_argument("--inventory", required=True, help="Ansible inventory")
    p.add_argument("--hosts", default="vlm", help="hosts or groups, comma-separated (default: vlm)")
    p.add_argument("--ignore", default="", help="check ids whose failures are waived for this run")
    p.add_argument("--waivers", help="waivers YAML (id, reason, expires, hosts)")
    p.add_argument("--junit", help="write JUnit XML here")
    p.add_argument("--json", help="write the JSON report here")
    p.add_argument("--jobs", type=int, default=0, help="hosts checked at once (default: all, up to 16)")
    p.add_argument("--stream-timeout", type=float, default=120.0, help="bound of the SVC-STREAM check (default: 120 s)")
    p.add_argument("--logs", help="directory for each host's pytest output (default: a temporary directory)")
    p.add_argument("--color", action="store_true", help="colour the table")
    a = p.parse_args(argv)
    try:
        report = run_and_report(a.inventory, a.hosts, Options(ignore=a.ignore, waivers=a.waivers,
                                                              stream_timeout=a.stream_timeout),
                                junit=a.junit, json_out=a.json, jobs=a.jobs, logs=a.logs, color=a.color)
    except PreflightError as e:
        print(f"preflight: {e}", file=sys.stderr)
        return 2
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
