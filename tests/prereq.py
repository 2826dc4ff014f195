"""Prerequisite checks for tests: skip on a machine that lacks something, fail instead under CI's switch."""

from __future__ import annotations

import os
import shutil

import pytest

# CI sets VLFLEET_REQUIRE_ALL=1: tests/conftest.py turns every skip into a failure then.
REQUIRE_ALL = os.environ.get("VLFLEET_REQUIRE_ALL") == "1"


def require(condition: bool, reason: str) -> None:
    """Skip (or, under VLFLEET_REQUIRE_ALL=1, fail) when a prerequisite of the machine is missing."""
    if not condition:
        pytest.skip(reason)


def require_tools(*tools: str, root: bool = False) -> None:
    if root:
        require(os.geteuid() == 0, "needs root")
    for tool in tools:
        require(shutil.which(tool) is not None, f"needs {tool} on PATH (see .ci/apt-packages/)")
