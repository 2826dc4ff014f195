"""Get a Hugging Face checkpoint onto the controller: hub repo (or mirror), local directory, or tarball URL.

Source kinds, told apart by their spelling:

- ``owner/name`` (default ``Qwen/Qwen3-VL-2B-Instruct``): the Hugging Face hub through ``huggingface_hub``, or a
  mirror when ``HF_ENDPOINT`` (or ``endpoint=``) is set. The revision is resolved to its commit first and the
  download pinned to that commit, so a branch moving mid-download cannot mix two revisions. A branch or tag as
  revision is allowed but warned about loudly: the build is then not reproducible.
- an existing directory: used in place (a checkpoint already on disk).
- ``http(s)://`` URL of a tarball (an internal artifact server), ``file://`` URL or path of a tarball: downloaded
  with HTTP Range resume (an interrupted download continues where it stopped, within a call and across calls),
  optionally checked against ``sha256``, then extracted safely.

The hub token comes from ``HF_TOKEN`` or a token file and goes only to the hub; it is never printed or logged,
and error messages are scrubbed of it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tarfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ops.model.convert import SOURCE_FILE, describe_source
from ops.paths import cache_root
from service.runtime.manifest import sha256_file

DEFAULT_REPO = "Qwen/Qwen3-VL-2B-Instruct"
DEFAULT_REVISION = "main"
COMMIT = re.compile(r"^[0-9a-f]{40}$")
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_CHUNK = 1 << 20


class FetchError(RuntimeError):
    """A fetch failed for a reason the operator can fix; the message says what and how."""


@dataclass(frozen=True)
class Fetched:
    path: Path  # checkpoint directory (holds config.json)
    origin: dict[str, Any] = field(default_factory=dict)  # kind, uri, resolved revision: for the manifest


def source_kind(spec: str) -> str:
    """'hf', 'dir', 'url' (http/https/file URL or a tarball path)."""
    if re.match(r"^(https?|file)://", spec):
        return "url"
    path = Path(spec).expanduser()
    if path.is_dir():
        return "dir"
    if path.is_file():
        return "url"
    if REPO_ID.match(spec):
        return "hf"
    raise FetchError(f"source {spec!r} is not an existing directory, a tarball path, an http(s)/file URL or a "
                     "Hugging Face repo id (owner/name)")


def read_token(token_file: str | Path | None = None) -> str | None:
    """Hub token from ``HF_TOKEN``, else from ``token_file``, else None (anonymous)."""
    token = os.environ.get("HF_TOKEN", "").strip()
    if token:
        return token
    if token_file:
        path = Path(token_file).expanduser()
        try:
            token = path.read_text().strip()
        except OSError as e:
            raise FetchError(f"cannot read the token file {path}: {e.strerror}; fix the path or set HF_TOKEN") from e
        if not token:
            raise FetchError(f"the token file {path} is empty; put the hub token in it or set HF_TOKEN")
        return token
    return None


def redact_url(url: str) -> str:
    """URL without credentials or query string (signed URLs carry secrets there): safe to print and record."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "…" if parts.query else "", ""))


def _scrub(text: str, secret: str | None) -> str:
    return text.replace(secret, "***") if secret else text


def _log(msg: str) -> None:
    print(f"[fetch] {msg}", file=sys.stderr, flush=True)


def warn_branch(repo: str, revision: str, sha: str | None) -> None:
    bar = "!" * 78
    resolved = f"It resolves to commit {sha} right now; " if sha else ""
    print(f"{bar}\nWARNING: revision {revision!r} of {repo} is a branch or tag, not a commit: what it names can "
          f"change,\nso this build is not reproducible. {resolved}the manifest records that commit.\n"
          f"Pin it: --revision {sha or '<40-hex commit>'}\n{bar}", file=sys.stderr, flush=True)


class _Progress:
    """One line every few seconds (and at the end): works in logs and terminals alike."""

    def __init__(self, label: str, total: int | None, done: int = 0, enabled: bool = True) -> None:
        self.label, self.total, self.done, self.enabled = label, total, done, enabled
        self.started = self.last = time.monotonic()
        self.start_done = done

    def update(self, n: int) -> None:
        self.done += n
        if self.enabled and time.monotonic() - self.last >= 2.0:
            self.show()

    def show(self) -> None:
        self.last = time.monotonic()
        rate = (self.done - self.start_done) / max(self.last - self.started, 1e-6) / 1e6
        pct = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        total = f"/{self.total / 1e6:.1f}" if self.total else ""
        if self.enabled:
            _log(f"{self.label}: {self.done / 1e6:.1f}{total} MB{pct}, {rate:.1f} MB/s")


def download(url: str, dest: Path, *, retries: int = 3, progress: bool = True, timeout: float = 60.0,
             retry_delay: float = 1.0) -> Path:
    """Download ``url`` to ``dest``, resuming from ``dest.partial`` with HTTP Range; at most ``retries`` tries."""
    partial = dest.with_name(dest.name + ".partial")
    dest.parent.mkdir(parents=True, exist_ok=True)
    shown = redact_url(url)
    for attempt in range(1, retries + 1):
        have = partial.stat().st_size if partial.exists() else 0
        request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as resp:
                if have and resp.status == 206 and _range_start(resp.headers.get("Content-Range")) == have:
                    mode = "ab"
                    _log(f"resuming {shown} at {have / 1e6:.1f} MB")
                else:
                    mode, have = "wb", 0  # the server ignored the Range: start over
                length = resp.headers.get("Content-Length")
                total = have + int(length) if length else None
                bar = _Progress(f"downloading {shown}", total, have, progress)
                with open(partial, mode) as f:
                    while chunk := resp.read(_CHUNK):
                        f.write(chunk)
                        bar.update(len(chunk))
                    got = f.tell()
                bar.show()
                if total is not None and got != total:
                    raise ConnectionError(f"connection closed at {got} of {total} bytes")
            partial.rename(dest)
            return dest
        except urllib.error.HTTPError as e:
            if e.code == 416 and have and _range_total(e.headers.get("Content-Range")) == have:
                partial.rename(dest)  # the partial file was already complete
                return dest
            if e.code in (401, 403):
                raise FetchError(f"{shown} refused access (HTTP {e.code}); check the URL and the server's "
                                 "access rules") from e
            if e.code == 404:
                raise FetchError(f"{shown} does not exist (HTTP 404); check the URL") from e
            if attempt == retries:
                raise FetchError(f"{shown} failed with HTTP {e.code} after {retries} tries; run again to resume "
                                 f"from byte {have}") from e
            error: Exception = e
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as e:
            if isinstance(e, urllib.error.URLError) and isinstance(e.reason, FileNotFoundError):
                raise FetchError(f"{shown} does not exist; check the path") from e
            if attempt == retries:
                done = partial.stat().st_size if partial.exists() else 0
                raise FetchError(f"downloading {shown} failed after {retries} tries ({e}); {done} bytes are kept "
                                 f"in {partial}: run the same command again to resume") from e
            error = e
        _log(f"download interrupted ({error}); retrying ({attempt}/{retries})")
        time.sleep(retry_delay * attempt)
    raise AssertionError("unreachable")


def _range_start(content_range: str | None) -> int | None:
    m = re.match(r"bytes (\d+)-", content_range or "")
    return int(m.group(1)) if m else None


def _range_total(content_range: str | None) -> int | None:
    m = re.match(r"bytes [*\d-]+/(\d+)", content_range or "")
    return int(m.group(1)) if m else None


def _safe_extract(archive: Path, dest: Path) -> None:
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")  # refuses absolute paths, '..', links out of dest, devices
            return
        for member in tar.getmembers():  # Python < 3.10.12 / 3.11.4: the same rules by hand
            target = (dest / member.name).resolve()
            if not (member.isfile() or member.isdir()) or not target.is_relative_to(dest.resolve()):
                raise FetchError(f"{archive} holds an unsafe member {member.name!r}; refusing to extract it")
        tar.extractall(dest)


def _checkpoint_root(tree: Path) -> Path:
    """The directory holding config.json: the tree itself or its single top-level directory."""
    if (tree / "config.json").is_file():
        return tree
    subdirs = [p for p in tree.iterdir() if p.is_dir()]
    if len(subdirs) == 1 and (subdirs[0] / "config.json").is_file():
        return subdirs[0]
    raise FetchError("the tarball holds no Hugging Face checkpoint (no config.json at its top or in its single "
                     "top-level directory)")


def fetch_url(url: str, *, out: Path | None = None, sha256: str | None = None, progress: bool = True,
              retries: int = 3, refresh: bool = False) -> Fetched:
    """A checkpoint tarball from an http(s)/file URL or a path; extracted under the cache (or ``out``)."""
    if not re.match(r"^(https?|file)://", url):
        url = Path(url).expanduser().absolute().as_uri()
    if url.startswith("file://"):
        archive = Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path))
        if not archive.is_file():
            raise FetchError(f"{archive} does not exist; check the file URL or path")
    else:
        archive = cache_root() / "downloads" / (hashlib.sha256(url.encode()).hexdigest()[:16] + ".tar")
        if refresh and archive.exists():
            archive.unlink()
        if not archive.exists():
            download(url, archive, retries=retries, progress=progress)
        elif progress:
            _log(f"{redact_url(url)} already downloaded ({archive}); --refresh downloads it again")
    digest = sha256_file(archive)
    if sha256 and digest != sha256.lower():
        if not url.startswith("file://"):
            archive.unlink()
        raise FetchError(f"{redact_url(url)} has sha256 {digest}, expected {sha256}; the server holds another "
                         "file than the one you pinned (fix the URL or --sha256)")
    origin = {"kind": "url", "uri": redact_url(url), "revision": f"sha256:{digest}"}
    dest = Path(out) if out else cache_root() / "checkpoints" / f"url-{digest[:16]}"
    if (dest / SOURCE_FILE).is_file():
        recorded = json.loads((dest / SOURCE_FILE).read_text())
        if recorded.get("revision") != origin["revision"]:
            raise FetchError(f"{dest} holds another checkpoint ({recorded.get('uri')} @ {recorded.get('revision')}); "
                             "remove it or choose another --out")
        return Fetched(_checkpoint_root(dest), origin)
    if dest.exists() and any(dest.iterdir()):
        raise FetchError(f"{dest} is not empty; remove it or choose another --out")
    tmp = dest.with_name(f".{dest.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if progress:
            _log(f"extracting {archive.name} into {dest}")
        try:
            _safe_extract(archive, tmp)
        except (tarfile.TarError, OSError) as e:
            raise FetchError(f"{redact_url(url)} is not a readable tarball ({e})") from e
        root = _checkpoint_root(tmp)
        (tmp / SOURCE_FILE).write_text(json.dumps(origin, indent=2) + "\n")
        if root != tmp:  # keep the record beside config.json
            (root / SOURCE_FILE).write_text(json.dumps(origin, indent=2) + "\n")
        if dest.exists():
            dest.rmdir()
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Fetched(_checkpoint_root(dest), origin)


def fetch_dir(path: Path, *, out: Path | None = None) -> Fetched:
    path = Path(path).expanduser().absolute()
    if not (path / "config.json").is_file():
        raise FetchError(f"{path} has no config.json: not a Hugging Face checkpoint directory")
    if out is None:
        return Fetched(path, describe_source(path))
    origin = describe_source(path)
    if Path(out).exists():
        raise FetchError(f"{out} already exists; remove it or choose another --out")
    shutil.copytree(path, out)
    (Path(out) / SOURCE_FILE).write_text(json.dumps(origin, indent=2) + "\n")
    return Fetched(Path(out), origin)


def fetch_hf(repo: str, revision: str | None = None, *, out: Path | None = None, endpoint: str | None = None,
             token: str | None = None, progress: bool = True, retries: int = 3) -> Fetched:
    """Download ``repo`` at ``revision`` (resolved to a commit first) from the hub or the ``HF_ENDPOINT`` mirror."""
    import requests
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub import errors as hf_errors
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

    revision = revision or DEFAULT_REVISION
    endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or "").rstrip("/") or None
    where = f"{repo} at {endpoint or 'the Hugging Face hub'}"
    try:
        sha = HfApi(endpoint=endpoint, token=token).model_info(repo, revision=revision).sha
    except hf_errors.RevisionNotFoundError as e:
        raise FetchError(f"{where} has no revision {revision!r}; check --revision") from e
    except (hf_errors.RepositoryNotFoundError, hf_errors.GatedRepoError) as e:
        raise FetchError(f"{where}: repository not found or not accessible with the given token; check the repo "
                         "id, and set HF_TOKEN (or --token-file) for private or gated repos") from e
    except hf_errors.HfHubHTTPError as e:
        status = getattr(e.response, "status_code", None)
        if status in (401, 403):
            raise FetchError(f"{where} refused the token (HTTP {status}); set HF_TOKEN or --token-file to a token "
                             "that can read this repo (for gated repos, accept the licence on the hub first)") from e
        raise FetchError(f"{where} answered {_scrub(str(e).splitlines()[0], token)}; check the endpoint "
                         "(HF_ENDPOINT) and the token") from e
    except requests.RequestException as e:
        raise FetchError(f"cannot reach {where} ({_scrub(type(e).__name__, token)}); check the network or set "
                         "HF_ENDPOINT to a reachable mirror") from e
    if not sha:
        raise FetchError(f"{where} did not say which commit {revision!r} is; use a commit id as --revision")
    if not COMMIT.match(revision):
        warn_branch(repo, revision, sha)
    origin = {"kind": "hf", "uri": repo, "revision": sha}
    kwargs: dict[str, Any] = {"revision": sha, "endpoint": endpoint, "token": token}
    if out is not None:
        kwargs["local_dir"] = str(out)
    else:
        kwargs["cache_dir"] = str(cache_root() / "hub")
    if not progress:
        disable_progress_bars()
    try:
        for attempt in range(1, retries + 1):
            try:
                # Resumes from the .incomplete files a previous, interrupted try left in the cache.
                path = Path(snapshot_download(repo, **kwargs))
                break
            except (requests.RequestException, OSError, hf_errors.HfHubHTTPError) as e:
                if attempt == retries:
                    raise FetchError(f"downloading {where} failed after {retries} tries "
                                     f"({_scrub(str(e).splitlines()[0], token)}); run again to resume") from e
                _log(f"download interrupted ({_scrub(type(e).__name__, token)}); retrying ({attempt}/{retries})")
                time.sleep(attempt)
    finally:
        if not progress:
            enable_progress_bars()
    if out is not None:
        (path / SOURCE_FILE).write_text(json.dumps(origin, indent=2) + "\n")
    if not (path / "config.json").is_file():
        raise FetchError(f"{where} at {sha} has no config.json: not a Hugging Face checkpoint")
    return Fetched(path, origin)


def fetch(spec: str = DEFAULT_REPO, revision: str | None = None, *, out: Path | None = None,
          endpoint: str | None = None, token_file: str | Path | None = None, sha256: str | None = None,
          progress: bool = True, retries: int = 3, refresh: bool = False) -> Fetched:
    """Any source kind -> a checkpoint directory plus where it came from (see the module docstring)."""
    kind = source_kind(spec)
    if kind != "hf" and revision:
        raise FetchError("--revision applies to Hugging Face repos only; a directory or tarball is what it is "
                         "(pin a tarball with --sha256)")
    if kind == "hf":
        return fetch_hf(spec, revision, out=out, endpoint=endpoint, token=read_token(token_file),
                        progress=progress, retries=retries)
    if kind == "dir":
        return fetch_dir(Path(spec), out=out)
    return fetch_url(spec, out=out, sha256=sha256, progress=progress, retries=retries, refresh=refresh)
