"""`vlfleet report` against the staging fleet (c1, c2 containers + vm1 VM, converged with site.yml): the JSON twin
holds real facts and real probe timings for each host, and the HTML page renders in headless Chromium (matrix rows =
hosts, charts decoded). Set VLFLEET_REPORT_SCREENSHOT=PATH to keep the screenshot (docs/images/report.png is one).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.waivers import staging_waivers
from tests.prereq import require

pytestmark = [pytest.mark.fleet, pytest.mark.slow, pytest.mark.browser]

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
PROBE_IMAGE = "64x64"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def inventory(converged_inventory) -> Path:
    """The e2e fleet, converged by the session's shared site.yml run."""
    return converged_inventory


@pytest.fixture(scope="module")
def service_hosts(inventory) -> list[str]:
    """The inventory's vlm hosts, in inventory order (c1, c2, vm1 for the standard e2e fleet)."""
    from ops.staging.inventory import hosts_of

    names = [n for n, h in hosts_of(inventory).items() if "vlm" in h["groups"]]
    assert {"c1", "c2", "vm1"} <= set(names)
    return names


@pytest.fixture(scope="module")
def report_dir(inventory, tmp_path_factory) -> Path:
    from ops.staging.inventory import hosts_of

    out = tmp_path_factory.mktemp("report")
    staging_waivers(hosts_of(inventory), out / "waivers.yml")
    done = subprocess.run([str(BIN / "vlfleet"), "report", "--inventory", str(inventory), "--out", str(out / "r"),
                           "--waivers", str(out / "waivers.yml"), "--probe-tokens", "16", "--probe-runs", "2",
                           # small pictures: under TCG the VM takes about 75 s per 416x277 image, 4 s per 64x64
                           "--probe-image", PROBE_IMAGE],
                          cwd=REPO, capture_output=True, text=True, timeout=2400, stdin=subprocess.DEVNULL)
    print(done.stdout + done.stderr)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[report] wrote" in done.stdout
    return out / "r"


def test_json_twin_has_facts_and_probe_for_every_host(report_dir, service_hosts):
    data = json.loads((report_dir / "report.json").read_text())
    assert [h["name"] for h in data["hosts"]] == service_hosts
    assert data["probe"] == {"tokens": 16, "runs": 2, "image": PROBE_IMAGE}
    for h in data["hosts"]:
        assert h["error"] is None, h
        assert h["ready"] and h["artifact_id"], h
        assert "avx2" in h["isa"] and h["cpu_model"], h
        assert h["cpus"] >= 1 and h["pinned_cpus"], h  # the launcher's plan is on every host
        assert h["mem_total_bytes"] > 0
        probe = h["probe"]
        assert probe["ok_runs"] == 2 and probe["error"] is None, probe
        assert probe["tokens"] == 16 and 0 < probe["first_token_s"] < probe["runs"][0]["total_s"] + 1
        assert probe["ms_per_token"] > 0
    # vm1 is the only host with swap (containers cannot swapon)
    swap = {h["name"]: h["swap_total_bytes"] for h in data["hosts"]}
    assert swap["vm1"] > 0
    assert {s["metric"] for s in data["slowest"]} == {"first_token_s", "ms_per_token"}  # the slowest host per metric
    results = data["checklist"]["results"]
    assert {r["host"] for r in results} == set(service_hosts)
    assert data["checklist"]["exit_code"] == 0, [r for r in results if r["status"] == "fail"]
    for name in data["charts"].values():
        assert (report_dir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_html_renders_in_chromium(report_dir, service_hosts):
    require(shutil.which("chromium") is not None, "needs Debian's chromium (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    html = (report_dir / "report.html").read_text()
    assert "http://" not in html and "https://" not in html, "the page must not load anything from the network"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1360, "height": 900})
            page.goto((report_dir / "report.html").as_uri())
            rows = page.eval_on_selector_all("#checklist-matrix tr.host-row", "rs => rs.map(r => r.dataset.host)")
            assert rows == service_hosts
            cells = page.eval_on_selector_all("#checklist-matrix td.cell", "cs => cs.map(c => c.dataset.status)")
            assert cells and all(c in ("pass", "n/a", "waived", "fail", "blocked") for c in cells)
            assert page.locator("#hosts tbody tr").count() == len(service_hosts)
            charts = page.eval_on_selector_all("img.chart", "is => is.map(i => [i.id, i.complete, i.naturalWidth])")
            assert sorted(c[0] for c in charts) == ["chart-first_token", "chart-ms_per_token"]
            assert all(complete and width > 100 for _id, complete, width in charts), charts
            assert page.locator(".callout li").count() >= 2  # slowest host per metric
            shot = report_dir / "report.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000
    keep = os.environ.get("VLFLEET_REPORT_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep)
