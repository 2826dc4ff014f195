"""The fleet report's parsing, slowest-host call-out and rendering, from recorded host output (no hosts needed).
tests/e2e/test_report.py runs the whole report against the staging fleet and opens it in Chromium."""

from __future__ import annotations

import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from ops.preflight import registry
from ops.report import Options, build, parse_facts, slowest, summarize_probe
from ops.report.page import render, write_charts

FACTS_OUTPUT = {  # what the host program's `facts` probe prints (JSON)
    "model": "Intel(R) Xeon(R) Platinum 8480+",
    "flags": "fpu sse sse2 avx avx2 fma f16c avx512f avx512bw avx512_vnni amx_tile amx_int8 hypervisor",
    "cpus": 8,
    "meminfo": "MemTotal:       16384000 kB\nMemAvailable:   12000000 kB\nSwapTotal:       2097148 kB\n"
               "SwapFree:        2097148 kB\n",
    "os": "Ubuntu 22.04.4 LTS", "kernel": "5.15.0-105-generic",
    "env": "# vlfleet env\nVLFLEET_HOST=10.0.0.11\nVLFLEET_PORT=8100\n",
    "plan": '{"allowed": [0, 1, 2, 3, 4, 5, 6, 7], "cpus": [0, 1, 2, 3], "threads": 4, "node": 0}\n',
}


def _host(name: str, ttft: float | None, mspt: float | None, **extra) -> dict:
    probe = None if ttft is None else summarize_probe([{"first_token_s": ttft, "ms_per_token": mspt, "tokens": 32,
                                                        "total_s": ttft + 1, "error": None}])
    return {"name": name, "groups": ["vlm"], "error": None, "ready": True, "release_id": "r1",
            "artifact_id": "synth-tiny", "probe": probe, **parse_facts(FACTS_OUTPUT), **extra}


def _data(hosts: list[dict], checklist: dict | None = None) -> dict:
    return {"version": 1, "generated_at": "2026-01-01T00:00:00+00:00", "inventory": "/x/inventory.yml",
            "probe": {"tokens": 32, "runs": 3}, "hosts": hosts, "slowest": slowest(hosts), "checklist": checklist}


def test_facts_are_parsed():
    f = parse_facts(FACTS_OUTPUT)
    assert f["cpu_model"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert f["isa"] == ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "amx_tile", "amx_int8"]
    assert (f["cpus"], f["pinned_cpus"], f["threads"]) == (8, [0, 1, 2, 3], 4)
    assert f["mem_total_bytes"] == 16384000 * 1024 and f["swap_used_bytes"] == 0
    assert (f["os"], f["kernel"]) == ("Ubuntu 22.04.4 LTS", "5.15.0-105-generic")
    assert (f["service_host"], f["service_port"]) == ("10.0.0.11", 8100)


def test_facts_without_a_release_or_plan():
    f = parse_facts({"model": "x", "flags": "sse2", "cpus": 2, "meminfo": "", "os": "", "kernel": "", "env": "",
                     "plan": ""})
    assert f["pinned_cpus"] is None and f["isa"] == [] and f["service_port"] == 8000


def test_slowest_host_per_metric_and_outliers():
    hosts = [_host("a", 1.0, 50), _host("b", 1.1, 52), _host("c", 2.5, 51), _host("d", None, None)]
    found = {(s["host"], s["metric"]): s for s in slowest(hosts)}
    assert set(found) == {("c", "first_token_s"), ("b", "ms_per_token")}
    assert found[("c", "first_token_s")]["outlier"] is True
    assert found[("c", "first_token_s")]["ratio"] == pytest.approx(2.27, abs=0.01)
    assert found[("b", "ms_per_token")]["outlier"] is False  # slowest, but within 25% of the median
    assert slowest([_host("solo", 1.0, 50)])[0]["outlier"] is False


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.rows, self.cells, self.imgs, self.external = [], [], [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr" and "host-row" in (a.get("class") or ""):
            self.rows.append(a["data-host"])
        if tag == "td" and "cell" in (a.get("class") or "").split():
            self.cells.append((a.get("data-status"), a.get("title", "")))
        if tag == "img":
            self.imgs.append(a["src"])
        for key in ("src", "href"):
            if (a.get(key) or "").startswith(("http:", "https:", "//")):
                self.external.append(a[key])


def test_page_is_self_contained_with_matrix_charts_and_fixes(tmp_path):
    hosts = [_host("c1", 1.2, 40), _host("c2", 3.0, 45), _host("vm1", None, None, error="ssh: connection refused")]
    check_ids = registry.ids()
    results = [{"host": h, "id": cid, "status": "pass", "message": "", "severity": registry.get(cid).severity}
               for h in ("c1", "c2") for cid in check_ids]
    results[0] = {**results[0], "status": "fail", "message": "swap off"}
    checklist = {"checks": [{"id": c.id, "severity": c.severity, "description": c.description}
                            for c in registry.CHECKS], "results": results, "run_errors": ["vm1: unreachable"]}
    data = _data(hosts, checklist)
    data["charts"] = {k: p.name for k, p in write_charts(data, tmp_path).items()}
    page = _Page()
    html = render(data, tmp_path)
    page.feed(html)
    assert page.rows == ["c1", "c2", "vm1"]
    assert len(page.cells) == 3 * len(check_ids)
    failed = [title for status, title in page.cells if status == "fail"]
    assert len(failed) == 1 and registry.get(check_ids[0]).remediation[:40] in failed[0]
    assert len(page.imgs) == 2 and all(src.startswith("data:image/png;base64,") for src in page.imgs)
    assert page.external == []
    assert "ssh: connection refused" in html and "vm1: unreachable" in html
    assert "<b>c2</b>: first token 3 s" in html  # the slowest host is called out
    for name in data["charts"].values():
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


def test_unusable_inventory_is_a_clear_error(tmp_path):
    from ops.report import ReportError

    with pytest.raises(ReportError, match="not found: pass --inventory"):
        build(tmp_path / "nope.yml", tmp_path / "out", Options())
    done = subprocess.run([str(Path(sys.executable).with_name("vlfleet")), "report", "--inventory",
                           str(tmp_path / "nope.yml"), "--out", str(tmp_path / "out")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr and "report: inventory" in done.stderr
    bad = subprocess.run([str(Path(sys.executable).with_name("vlfleet")), "report", "--probe-tokens", "1"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert bad.returncode == 1 and "--probe-tokens must be >= 2" in bad.stderr


def test_cache_locality_is_read_from_the_hosts_metrics_and_shown_per_host(tmp_path):
    from ops.report.collect import locality

    metrics = "\n".join([  # what a direct-engine host's /metrics says after 10 cacheable answers, 2 replayed
        "vlfleet_answer_cache_hits_total 2.0", "vlfleet_answer_cache_misses_total 8.0",
        "vlfleet_prompt_images_total 8.0", "vlfleet_vision_encoder_runs_total 2.0",
        "vlfleet_reused_prompt_tokens_total 300.0", "vlfleet_prompt_tokens_total 1200.0",
        "vlfleet_session_reuse_total 6.0"])
    loc = locality(metrics)
    assert loc == {"answer_cache_hits": 2, "answer_cache_hit_ratio": 0.2, "prompt_images": 8,
                   "vision_encoder_runs": 2, "image_kept_ratio": 0.75, "prompt_tokens_reused_ratio": 0.25,
                   "conversations_continued": 6}
    idle = locality("")  # a host that answered nothing yet: nothing to divide, no made-up 0 %
    assert idle["answer_cache_hit_ratio"] is None and idle["image_kept_ratio"] is None
    html = render(_data([_host("c1", 1.0, 40, locality=loc), _host("c2", 1.0, 40, locality=idle)]), tmp_path)
    panel = html[html.index("<h2>Cache locality</h2>"):]
    assert "<th>c1</th><td class='num'>20% (2)</td><td class='num'>75% (2 runs for 8 images)</td>" in panel
    assert "<th>c2</th><td class='num'>n/a (0)</td>" in panel
