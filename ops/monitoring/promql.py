"""Which metric names the kit's queries use, and which a /metrics exposition offers: what the tests compare."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from ops.monitoring import ALERTS, DASHBOARD

_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_NAME = re.compile(r"(?<![A-Za-z0-9_:$])(vlfleet_[a-z0-9_]+)")
_TYPE = re.compile(r"^# TYPE (\S+) (\w+)", re.MULTILINE)
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", re.MULTILINE)
# Series a metric family of each type exposes (prometheus_client's text format).
_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
             "summary": ("_sum", "_count", "_created", ""), "gauge": ("",), "info": ("_info",),
             "untyped": ("",), "stateset": ("",), "gaugehistogram": ("_bucket", "_gsum", "_gcount")}


def metric_names(expr: str) -> set[str]:
    """The service's metric names (vlfleet_*) a PromQL expression reads; label values and strings are ignored."""
    return set(_NAME.findall(_QUOTED.sub('""', expr)))


def rule_exprs(path: Path = ALERTS) -> dict[str, str]:
    """alert name -> expression."""
    data = yaml.safe_load(path.read_text())
    return {r["alert"]: r["expr"] for g in data["groups"] for r in g["rules"] if "alert" in r}


def dashboard_exprs(path: Path = DASHBOARD) -> dict[str, str]:
    """'panel title / refId' (and templating, annotations) -> expression."""
    data = json.loads(path.read_text())
    out = {f"{p['title']} / {t['refId']}": t["expr"] for p in data["panels"] for t in p.get("targets", [])}
    for var in data.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            out[f"variable {var['name']}"] = var.get("definition") or var["query"]["query"]
    for ann in data.get("annotations", {}).get("list", []):
        if ann.get("expr"):
            out[f"annotation {ann['name']}"] = ann["expr"]
    return out


def exposed_names(text: str) -> set[str]:
    """Every series name a text exposition offers: samples present, plus what each declared family would expose
    (a labelled counter that has not counted yet has a # TYPE line but no sample)."""
    names = set(_SAMPLE.findall(text))
    for family, kind in _TYPE.findall(text):
        base = family.removesuffix("_total") if kind == "counter" else family
        names.update(base + s for s in _SUFFIXES.get(kind, ("",)))
    return names
