"""model.fetch with every source kind that runs here: local directory, tarball over a loopback HTTP server
(with dropped connections and resume), file URL, and the hub path through HF_ENDPOINT against the loopback
server's hub protocol (the real huggingface_hub client code; only the server is ours)."""

from __future__ import annotations

import hashlib
import io
import json
import random
import shutil
import tarfile
from pathlib import Path

import pytest

from ops.model import fetch
from ops.model.convert import SOURCE_FILE
from tests.integration.loopback_server import HubRepo, LoopbackServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"
TOKEN = "hf_loopbackSECRETtoken42"


def tree_digest(directory: Path) -> dict[str, str]:
    return {p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file() and p.name != SOURCE_FILE}


@pytest.fixture(scope="session")
def checkpoint_tarball(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(tiny_checkpoint, arcname="tiny-ckpt")
    return buf.getvalue()


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # Downloads and extractions go to a fresh cache; the hub client must not see this machine's HF settings.
    monkeypatch.setenv("VLFLEET_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    for var in ("HF_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path / "cache"


@pytest.fixture
def server():
    with LoopbackServer() as srv:
        yield srv


def test_local_directory_is_used_in_place(tiny_checkpoint: Path) -> None:
    got = fetch.fetch(str(tiny_checkpoint))
    assert got.path == tiny_checkpoint
    assert got.origin["kind"] == "dir"
    assert got.origin["revision"].startswith("sha256:")


def test_tarball_over_http_resumes_after_a_dropped_connection(server: LoopbackServer, checkpoint_tarball: bytes,
                                                               tiny_checkpoint: Path) -> None:
    server.files["/models/tiny.tar.gz"] = checkpoint_tarball
    server.truncate_once.add("/models/tiny.tar.gz")
    got = fetch.fetch(f"{server.url}/models/tiny.tar.gz", progress=False)
    assert tree_digest(got.path) == tree_digest(tiny_checkpoint)
    gets = [r for r in server.requests if r.method == "GET"]
    assert len(gets) == 2
    assert "range" not in gets[0].headers
    assert gets[1].headers["range"] == f"bytes={len(checkpoint_tarball) // 2}-"
    assert server.bytes_sent == len(checkpoint_tarball)  # nothing downloaded twice
    assert got.origin == {"kind": "url", "uri": f"{server.url}/models/tiny.tar.gz",
                          "revision": "sha256:" + hashlib.sha256(checkpoint_tarball).hexdigest()}
    assert json.loads((got.path / SOURCE_FILE).read_text()) == got.origin


def test_download_resumes_a_partial_file_from_an_earlier_run(server: LoopbackServer, tmp_path: Path) -> None:
    data = bytes(range(256)) * 4096
    server.files["/blob.bin"] = data
    dest = tmp_path / "blob.bin"
    dest.with_name("blob.bin.partial").write_bytes(data[:300_000])
    fetch.download(f"{server.url}/blob.bin", dest, progress=False)
    assert dest.read_bytes() == data
    assert server.requests[-1].headers["range"] == "bytes=300000-"
    assert server.bytes_sent == len(data) - 300_000


def test_download_gives_up_after_bounded_tries_and_keeps_the_partial(server: LoopbackServer,
                                                                      tmp_path: Path) -> None:
    data = b"x" * 100_000
    server.files["/flaky.bin"] = data
    server.truncate_once.add("/flaky.bin")
    dest = tmp_path / "flaky.bin"
    with pytest.raises(fetch.FetchError, match="run the same command again to resume"):
        fetch.download(f"{server.url}/flaky.bin", dest, retries=1, progress=False, retry_delay=0)
    assert dest.with_name("flaky.bin.partial").stat().st_size == 50_000
    fetch.download(f"{server.url}/flaky.bin", dest, progress=False)  # the next run finishes it
    assert dest.read_bytes() == data


def test_missing_url_says_so(server: LoopbackServer) -> None:
    with pytest.raises(fetch.FetchError, match=r"does not exist \(HTTP 404\)"):
        fetch.fetch(f"{server.url}/nope.tar.gz", progress=False)


def test_file_url_with_sha256_pin(tmp_path: Path, checkpoint_tarball: bytes, tiny_checkpoint: Path) -> None:
    archive = tmp_path / "tiny.tar.gz"
    archive.write_bytes(checkpoint_tarball)
    digest = hashlib.sha256(checkpoint_tarball).hexdigest()
    got = fetch.fetch(archive.as_uri(), sha256=digest, progress=False)
    assert tree_digest(got.path) == tree_digest(tiny_checkpoint)
    assert got.origin["uri"] == archive.as_uri()
    with pytest.raises(fetch.FetchError, match=f"has sha256 {digest}, expected 00"):
        fetch.fetch(archive.as_uri(), sha256="00" * 32, progress=False)


def test_tarball_escaping_its_directory_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "evil.tar"
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo("../escaped.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    with pytest.raises(fetch.FetchError, match="not a readable tarball"):
        fetch.fetch(str(archive), progress=False)
    assert not list(tmp_path.rglob("escaped.txt"))


def hub(server: LoopbackServer, checkpoint: Path) -> str:
    server.repos["acme/tiny-vl"] = HubRepo(checkpoint, COMMIT, {"main": COMMIT, "v1": COMMIT})
    server.token = TOKEN
    return "acme/tiny-vl"


def test_hub_branch_resolves_to_commit_warns_and_keeps_the_token_secret(
        server: LoopbackServer, tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture) -> None:
    repo = hub(server, tiny_checkpoint)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    got = fetch.fetch(repo, "main", progress=False)
    assert got.origin == {"kind": "hf", "uri": repo, "revision": COMMIT}
    assert tree_digest(got.path) == tree_digest(tiny_checkpoint)
    out = capsys.readouterr()
    assert "WARNING: revision 'main'" in out.err and COMMIT in out.err
    assert TOKEN not in out.out + out.err + caplog.text
    downloads = [r for r in server.requests if "/resolve/" in r.path and r.method == "GET"]
    assert downloads and all(f"/resolve/{COMMIT}/" in r.path for r in downloads)  # pinned to the commit
    assert all(r.headers.get("authorization") == f"Bearer {TOKEN}" for r in server.requests)


def test_hub_commit_revision_does_not_warn_and_token_file_works(
        server: LoopbackServer, tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    repo = hub(server, tiny_checkpoint)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    got = fetch.fetch(repo, COMMIT, endpoint=server.url, token_file=token_file, progress=False)
    assert got.origin["revision"] == COMMIT
    assert "WARNING" not in capsys.readouterr().err


def test_hub_download_resumes_an_interrupted_file(server: LoopbackServer, tiny_checkpoint: Path,
                                                  tmp_path: Path) -> None:
    # huggingface_hub writes in 10 MB chunks: the cut must come after the first one for anything to be kept.
    repo_dir = tmp_path / "repo"
    shutil.copytree(tiny_checkpoint, repo_dir)
    (repo_dir / "model-00002.bin").write_bytes(random.Random(0).randbytes(24 << 20))
    repo = hub(server, repo_dir)
    path = f"/{repo}/resolve/{COMMIT}/model-00002.bin"
    server.truncate_once.add(path)
    got = fetch.fetch_hf(repo, COMMIT, endpoint=server.url, token=TOKEN, progress=False)
    assert tree_digest(got.path) == tree_digest(repo_dir)
    gets = [r for r in server.requests if r.path == path and r.method == "GET"]
    assert len(gets) == 2 and gets[1].headers.get("range", "").startswith("bytes=")
    assert gets[1].headers["range"] != "bytes=0-"


def test_hub_wrong_token_is_explained_without_echoing_it(server: LoopbackServer, tiny_checkpoint: Path) -> None:
    repo = hub(server, tiny_checkpoint)
    wrong = "hf_wrongTOKENvalue99"
    with pytest.raises(fetch.FetchError) as err:
        fetch.fetch_hf(repo, COMMIT, endpoint=server.url, token=wrong, progress=False)
    assert "HF_TOKEN" in str(err.value)
    assert wrong not in str(err.value) and TOKEN not in str(err.value)


def test_hub_unknown_revision(server: LoopbackServer, tiny_checkpoint: Path) -> None:
    repo = hub(server, tiny_checkpoint)
    with pytest.raises(fetch.FetchError, match="has no revision 'v9'"):
        fetch.fetch_hf(repo, "v9", endpoint=server.url, token=TOKEN, progress=False)
