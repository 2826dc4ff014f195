"""Building a synthetic checkpoint says what it is doing (the 2b shape takes minutes) and is silent when cached."""

from __future__ import annotations

from ops.model import cache


def test_checkpoint_build_shows_progress_then_is_cached_silently(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VLFLEET_CACHE", str(tmp_path))
    path = cache.checkpoint("tiny", quiet=False)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"[model] synthesizing the tiny-shape checkpoint into {path} (the 2b shape: about a minute, 4 GB)"
    assert err[-1].startswith("[model] checkpoint written in ") and (path / "config.json").is_file()
    assert cache.checkpoint("tiny", quiet=False) == path
    assert capsys.readouterr().err == ""
