"""Rolling changes on a staging fleet (3 service hosts behind the lb's nginx) while clients keep chatting.

A bounded stream of chat requests (streaming and not) goes through nginx during each change; every one must
succeed. A good release reaches every host; a release whose service cannot start is rolled back on the canary and
goes no further; rollback --to brings the fleet back to where it started.

VLFLEET_ROLLOUT_INVENTORY=PATH runs these against an already converged fleet instead of the `staging_fleet` one.
Each test records its report (docs/reliability.md's figures) after its assertions; tests/reports.py writes it only
for a test that passed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from ops import fleet as ops_fleet
from ops.fleet import Fleet, Outcome, Release, Timeouts, load_inventory
from ops.fleet.load import Load
from tests.e2e.site_vars import converge
from tests.reports import record

pytestmark = [pytest.mark.fleet, pytest.mark.slow]

@pytest.fixture(scope="module")
def inventory(request, tiny_model: Path) -> Path:
    """A fleet whose vlm hosts all serve: the session's converged e2e fleet, or VLFLEET_ROLLOUT_INVENTORY's."""
    given = os.environ.get("VLFLEET_ROLLOUT_INVENTORY")
    if not given:
        return request.getfixturevalue("converged_inventory")
    converge(Path(given), tiny_model)
    return Path(given)


def _fleet(path: Path) -> Fleet:
    return Fleet(load_inventory(path), timeouts=Timeouts(drain=60, ready=600), echo=print)


def _lb_address(path: Path) -> str:
    return load_inventory(path).group("lb")[0].address


def _releases(path: Path) -> dict[str, tuple[str | None, bool]]:
    with _fleet(path) as f:
        return {r["host"]: (r.get("serving"), bool(r.get("ready"))) for r in ops_fleet.status(f)}


@pytest.fixture(scope="module")
def start(inventory) -> dict[str, tuple[str | None, bool]]:
    """What every host served before these tests."""
    return _releases(inventory)


def test_rollout_under_load_reaches_every_host_with_no_failed_request(inventory, start):
    new = f"e2e-{int(time.time())}"
    with _fleet(inventory) as f, Load(_lb_address(inventory)) as load:
        time.sleep(3)  # traffic flowing before the first drain
        report = f and ops_fleet.rollout(f, Release(new), batch="1,25%,50%")
        time.sleep(2)
    print("\n" + report.table())
    summary = load.summary()
    assert report.ok, report.summary()
    assert summary["failures"] == 0, summary["failed"]
    assert summary["requests"] >= 10 and summary["streamed"] >= 5
    after = _releases(inventory)
    assert after == {h: (new, True) for h in start}, after
    record("rollout-e2e", {"release": new, "hosts": len(report.results), "rollout_s": report.seconds, **summary})


def test_release_that_cannot_start_is_rolled_back_on_the_canary_only(inventory, start):
    before = _releases(inventory)
    bad = f"e2e-bad-{int(time.time())}"
    with _fleet(inventory) as f, Load(_lb_address(inventory)) as load:
        report = ops_fleet.rollout(f, Release(bad, env={"VLFLEET_QUEUE_SIZE": "0"}), batch="1,25%,50%")
        time.sleep(2)
    print("\n" + report.table())
    summary = load.summary()
    canary, *rest = report.results
    assert canary.outcome is Outcome.ROLLED_BACK, report.table()
    assert "VLFLEET_QUEUE_SIZE" in canary.message  # the reason reaches the operator
    assert [r.outcome for r in rest] == [Outcome.SKIPPED] * len(rest) and report.stopped
    assert _releases(inventory) == before  # canary back, the others never changed
    assert summary["failures"] == 0, summary["failed"]
    record("rollout-bad-e2e", {"release": bad, "rollout_s": report.seconds, **summary})


def test_rollback_to_the_first_release_and_status_shows_the_fleet(inventory, start):
    original = {release for release, _ready in start.values()}
    assert len(original) == 1, f"hosts started on different releases: {start}"
    target = original.pop()
    with _fleet(inventory) as f, Load(_lb_address(inventory)) as load:
        report = ops_fleet.rollback(f, to=target, batch="1,50%")
        rows = ops_fleet.status(f)
    summary = load.summary()
    print("\n" + report.table() + "\n" + ops_fleet.status_table(rows))
    assert report.ok, report.summary()
    assert summary["failures"] == 0, summary["failed"]
    assert {r["host"]: (r["serving"], r["ready"]) for r in rows} == start
    for r in rows:
        assert r["rss_bytes"] and r["rss_bytes"] > 50 * 2**20, r
        assert r["uptime_s"] is not None and r["queue_depth"] is not None, r
    # hosts that served traffic since their restart have a first-token p50 from the histogram
    assert any(r["ttft_p50_s"] for r in rows), rows
    record("rollback-e2e", {"release": target, "rollback_s": report.seconds, **summary})
