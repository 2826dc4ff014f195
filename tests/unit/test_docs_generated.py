"""docs/configuration.md, docs/api.md, results/ci-timing.md, docs/reliability.md's figures and docs/tuning.md are
generated: they must equal what their sources render now."""

from __future__ import annotations

import re

import pytest

from ops.docs import generate
from ops.paths import repo_root


@pytest.mark.parametrize("name", ["docs/configuration.md", "docs/api.md", "results/ci-timing.md",
                                  "docs/reliability.md", "docs/tuning.md", "results/README.md"])
def test_generated_reference_matches_its_source(name):
    path = repo_root() / name
    render = generate.targets()[path]
    assert path.is_file(), f"{path} missing: run `python -m ops.docs`"
    assert path.read_text() == render(), f"{path} drifted from its source: run `python -m ops.docs` and commit"


def test_check_mode_reports_drift(tmp_path):
    # A copy of the repository's sources with one stale doc: --check logic must name it.
    root = repo_root()
    (tmp_path / "docs").mkdir()
    (tmp_path / "roles").symlink_to(root / "roles")
    targets = generate.targets(tmp_path)
    for path, render in targets.items():
        path.write_text(render())
    assert generate.stale(tmp_path) == []
    api = tmp_path / "docs" / "api.md"
    api.write_text(api.read_text().replace("Liveness", "Liveliness"))
    assert generate.stale(tmp_path) == [api]


def test_every_setting_and_role_option_is_documented():
    import yaml

    from service.runtime.settings import FIELDS

    text = (repo_root() / "docs" / "configuration.md").read_text()
    for f in FIELDS:
        assert f"| `{f.env}` |" in text
    for spec in sorted((repo_root() / "roles").glob("*/meta/argument_specs.yml")):
        for entry in yaml.safe_load(spec.read_text())["argument_specs"].values():
            for option in entry.get("options") or {}:
                assert f"| `{option}` |" in text, f"{spec}: {option}"


def test_every_endpoint_is_documented():
    from service.http.openapi import document

    text = (repo_root() / "docs" / "api.md").read_text()
    for path, item in document("0").get("paths").items():
        for op in item.values():
            assert re.search(rf"^## {op['operationId']}$", text, re.M), path


def test_ci_timing_says_whether_the_cache_was_cold_and_what_the_run_built():
    from ops.docs.ci_timing import cache_state, demo
    cold = {"cache_before": [], "cache_after": ["artifacts", "staging"], "demo_s": 150}
    assert cache_state(cold) == "**cold** (empty at the start); built during the run: artifacts, staging"
    warm = {"cache_before": ["staging"], "cache_after": ["staging"], "demo_s": -1}
    assert cache_state(warm) == "**warm**: held staging at the start"
    assert (demo(cold), demo(warm), demo({})) == ("2.5 min", "not run", "not recorded")
