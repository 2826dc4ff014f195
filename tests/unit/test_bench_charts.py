"""The bench's PNGs: which charts a run's results make (real matplotlib files, read back as PNG)."""

from __future__ import annotations

from ops.bench.charts import suite_charts

PNG = b"\x89PNG\r\n\x1a\n"


def _lever(name: str, setting: str, first: float, ms: float) -> dict:
    return {"name": name, "setting": setting, "first_token_s": first, "ms_per_token": ms}


def test_levers_chart_only_with_a_baseline(tmp_path):
    levers = [_lever("baseline", "service defaults", 2.0, 50.0), _lever("weight format", "per channel", 2.0, 41.0)]
    assert suite_charts({"levers": levers}, tmp_path) == ["bench-levers.png"]
    assert (tmp_path / "bench-levers.png").read_bytes().startswith(PNG)
    assert suite_charts({"levers": levers[1:]}, tmp_path / "none") == []


def test_nothing_measured_makes_no_chart(tmp_path):
    assert suite_charts({}, tmp_path) == []
    assert list(tmp_path.iterdir()) == []


def test_tune_chart_groups_each_load_with_every_engine_measured(tmp_path):
    one = {"tokens": 128, "candidates": {"serial": {"score_s": 9.0}, "llamacpp": {"score_s": 9.3}}}
    four = {"tokens": 128, "clients": 4, "candidates": {"serial": {"score_s": 20.5}, "batching": {"score_s": 16.8}}}
    assert suite_charts({"tune": one, "tune_load": four}, tmp_path) == ["bench-tune.png"]
    assert (tmp_path / "bench-tune.png").read_bytes().startswith(PNG)
    assert suite_charts({"tune": {"tokens": 128, "candidates": {}}}, tmp_path / "none") == []
