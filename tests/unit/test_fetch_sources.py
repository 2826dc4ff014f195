"""ops.model.fetch at its seams: source kinds, token handling, URL redaction, the branch warning."""

from __future__ import annotations

from pathlib import Path

import pytest

from ops.model import fetch


def test_source_kinds(tmp_path: Path) -> None:
    tarball = tmp_path / "ckpt.tar.gz"
    tarball.write_bytes(b"")
    assert fetch.source_kind("Qwen/Qwen3-VL-2B-Instruct") == "hf"
    assert fetch.source_kind(str(tmp_path)) == "dir"
    assert fetch.source_kind(str(tarball)) == "url"
    assert fetch.source_kind("https://artifacts.example/ckpt.tar") == "url"
    assert fetch.source_kind("file:///srv/ckpt.tar") == "url"
    with pytest.raises(fetch.FetchError, match="not an existing directory"):
        fetch.source_kind("./no/such/thing/here")


def test_revision_is_refused_for_non_hub_sources(tmp_path: Path) -> None:
    with pytest.raises(fetch.FetchError, match="--revision applies to Hugging Face repos only"):
        fetch.fetch(str(tmp_path), revision="main")


def test_token_from_env_wins_then_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("hf_from_file\n")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert fetch.read_token(None) is None
    assert fetch.read_token(token_file) == "hf_from_file"
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    assert fetch.read_token(token_file) == "hf_from_env"


def test_bad_token_file_messages_do_not_leak_the_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(fetch.FetchError, match=r"cannot read the token file .* set HF_TOKEN"):
        fetch.read_token(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(fetch.FetchError, match="is empty"):
        fetch.read_token(empty)


def test_redact_url_drops_credentials_and_query() -> None:
    assert fetch.redact_url("https://user:s3cret@host:8443/a/b.tar?sig=abc") == "https://host:8443/a/b.tar?…"
    assert fetch.redact_url("http://host/x.tar") == "http://host/x.tar"


def test_branch_warning_is_loud_and_names_the_commit(capsys: pytest.CaptureFixture) -> None:
    fetch.warn_branch("Qwen/Qwen3-VL-2B-Instruct", "main", "a" * 40)
    err = capsys.readouterr().err
    assert "WARNING: revision 'main'" in err
    assert "not reproducible" in err
    assert f"--revision {'a' * 40}" in err
