"""`vlfleet report`: the fleet at a glance, gathered from the hosts themselves (`collect`), written as one
self-contained HTML page with PNG charts and a JSON twin (`page`)."""

from ops.report.collect import Options, ReportError, build, parse_facts, slowest, summarize_probe
from ops.report.page import render, write_charts

__all__ = ["Options", "ReportError", "build", "parse_facts", "render", "slowest", "summarize_probe", "write_charts"]
