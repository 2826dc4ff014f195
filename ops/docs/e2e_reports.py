"""The reliability reports kept in the repository: results/e2e/<name>.json, copies of the JSON files the tests
write into `$VLFLEET_CACHE/reports/` (tests/reports.py). docs/reliability.md's figures are generated from them
(ops/docs/reliability.py), so a figure in the doc is always one a test measured, and which run measured it is
recorded: the cache is outside git and overwritten by every run, the copies are committed.

`python -m ops.docs --collect [REPORTS_DIR]` copies them (default: the cache's reports/) and regenerates the docs.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from ops.paths import repo_root

E2E = "tests/e2e/"
HOSTILE = "tests/integration/test_hostile_images_memory.py::"
SLOW = "tests/integration/test_slow_clients.py::"

# report name -> the test that writes it (a unit test checks that the named test does)
REPORTS: dict[str, str] = {
    "faults-kill9": E2E + "test_faults.py::test_kill_9_of_the_service_is_restarted_by_systemd",
    "faults-vm-reboot": E2E + "test_faults.py::test_vm_reboot_brings_swap_limits_and_service_back",
    "faults-host-down-mid-rollout": E2E + "test_faults.py::test_host_down_in_the_middle_of_its_rollout_batch",
    "faults-corrupt-artifact":
        E2E + "test_faults.py::test_truncated_model_file_service_refuses_checklist_names_it_lb_serves",
    "faults-disk-full-convert": E2E + "test_faults.py::test_disk_full_during_convert_leaves_no_partial_artifact",
    "affinity-drain-e2e": E2E + "test_affinity.py::test_a_drained_host_hands_its_conversations_on_and_gets_them_back",
    "affinity-kill-e2e": E2E + "test_affinity.py::test_a_killed_host_loses_no_request_and_its_conversations_return",
    "rollout-e2e": E2E + "test_rollout.py::test_rollout_under_load_reaches_every_host_with_no_failed_request",
    "rollout-bad-e2e": E2E + "test_rollout.py::test_release_that_cannot_start_is_rolled_back_on_the_canary_only",
    "rollback-e2e": E2E + "test_rollout.py::test_rollback_to_the_first_release_and_status_shows_the_fleet",
    "security-exposure": E2E + "test_security_fleet.py::test_unit_exposure_at_most_3",
    "slow-client-stalled": SLOW + "test_client_that_stops_reading_blocks_no_one",
    "slow-client-disconnects": SLOW + "test_burst_of_mid_stream_disconnects_drains_the_queue",
    "hostile-images-rss": HOSTILE + "test_hostile_corpus_rounds_keep_rss_flat",
    "queue-overflow-rss": HOSTILE + "test_twice_the_queue_capacity_gets_429_and_stays_under_the_memory_limit",
}
INDEX = "collected.json"  # report name -> when the test wrote it (the source file's mtime: git keeps no mtimes)


def results_dir(root: Path | None = None) -> Path:
    return (root or repo_root()) / "results" / "e2e"


@dataclass
class Collected:
    copied: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unreadable: dict[str, str] = field(default_factory=dict)  # name -> why


def _written(path: Path) -> str:
    return datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _readable(path: Path) -> str | None:
    """Why ``path`` is not a report (None when it is one): a truncated write must not replace a good copy."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return None if isinstance(data, dict) else "not a JSON object"


def collect(source: Path, root: Path | None = None) -> Collected:
    """Copy every expected report found in ``source`` into results/e2e/. A report not found keeps its older copy
    (if any) and its recorded time, so the doc still says which run measured it."""
    dest = results_dir(root)
    dest.mkdir(parents=True, exist_ok=True)
    index = written(root)
    out = Collected()
    for name in REPORTS:
        src = source / f"{name}.json"
        if not src.is_file():
            out.missing.append(name)
            continue
        why = _readable(src)
        if why:
            out.unreadable[name] = why
            continue
        shutil.copyfile(src, dest / f"{name}.json")
        index[name] = _written(src)
        out.copied.append(name)
    (dest / INDEX).write_text(json.dumps(dict(sorted(index.items())), indent=1) + "\n")
    return out


def written(root: Path | None = None) -> dict[str, str]:
    path = results_dir(root) / INDEX
    return json.loads(path.read_text()) if path.is_file() else {}


def load(root: Path | None = None) -> dict[str, dict]:
    """Every collected report, by name."""
    d = results_dir(root)
    return {name: json.loads((d / f"{name}.json").read_text()) for name in REPORTS if (d / f"{name}.json").is_file()}


def summary(result: Collected, source: Path, root: Path | None = None) -> list[str]:
    """What --collect prints: copied, then each report not copied with the test that writes it and what is kept."""
    lines = [f"copied {len(result.copied)} of {len(REPORTS)} reports from {source} into {results_dir(root)}"]
    kept = written(root)
    for name in [*result.missing, *result.unreadable]:
        why = "not found" if name in result.missing else f"unreadable ({result.unreadable[name]})"
        older = "results/e2e has none"
        if (results_dir(root) / f"{name}.json").is_file():
            older = f"the copy written {kept.get(name, 'at an unknown time')} is kept"
        lines.append(f"MISSING {name}.json: {why}; written by {REPORTS[name]}; {older}")
    return lines
