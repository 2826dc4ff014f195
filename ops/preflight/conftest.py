"""Wires the checklist plugin into a plain `pytest ops/preflight/test_checklist.py --hosts=...` run."""

from __future__ import annotations

import pytest

from ops.preflight import plugin


def pytest_addoption(parser: pytest.Parser) -> None:
    plugin.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    plugin.configure(config)
