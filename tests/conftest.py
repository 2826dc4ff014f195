"""Shared fixtures: the tiny synthetic model artifact, and the skip-means-fail switch for CI."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

# CI sets VLFLEET_REQUIRE_ALL=1: a test that would skip for lack of root, nspawn, qemu or chromium fails instead.
REQUIRE_ALL = os.environ.get("VLFLEET_REQUIRE_ALL") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_ALL and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under VLFLEET_REQUIRE_ALL=1 (CI must run everything): {reason}"


def require(condition: bool, reason: str) -> None:
    """Skip (or, under VLFLEET_REQUIRE_ALL=1, fail) when a prerequisite of the machine is missing."""
    if not condition:
        pytest.skip(reason)


def require_root_tools(*tools: str) -> None:
    require(os.geteuid() == 0, "needs root")
    for tool in tools:
        require(shutil.which(tool) is not None, f"needs {tool} on PATH")


@pytest.fixture(scope="session")
def tiny_checkpoint() -> Path:
    """The tiny synthetic Hugging Face checkpoint, built once per cache."""
    from ops.model.cache import tiny_checkpoint as build

    return build()


@pytest.fixture(scope="session")
def tiny_model(tiny_checkpoint: Path) -> Path:
    """The tiny checkpoint converted to an int4 OpenVINO artifact with the real optimum-cli export."""
    from ops.model.cache import tiny_artifact

    return tiny_artifact()
