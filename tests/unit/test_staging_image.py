"""Base image: the mirror is read from apt sources, and the cache key follows content."""

from __future__ import annotations

from pathlib import Path

import pytest

from ops.staging import image
from ops.staging.system import StagingError


@pytest.fixture()
def apt_dir(tmp_path) -> Path:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text(
        "# comment\ndeb [arch=amd64] https://packages.example.com/apt cloud-sdk-bookworm main\n"
    )
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example.org/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\n\nTypes: deb\nURIs: http://security.example.org/debian-security\n"
        "Suites: bookworm-security\nComponents: main\n"
    )
    (tmp_path / "sources.list.d" / "ubuntu.list").write_text(
        "deb http://archive.example.net/ubuntu jammy main universe\n"
    )
    return tmp_path


def test_mirror_for_suite_from_both_formats(apt_dir):
    assert image.default_mirror("bookworm", apt_dir) == "http://mirror.example.org/debian"
    assert image.default_mirror("jammy", apt_dir) == "http://archive.example.net/ubuntu"
    # Another Debian suite falls back to the Debian mirror; Ubuntu suites never do.
    assert image.default_mirror("trixie", apt_dir) == "http://mirror.example.org/debian"
    with pytest.raises(StagingError, match="--mirror"):
        image.default_mirror("noble", apt_dir)


def test_cache_key_follows_content():
    base = image.ImageSpec("bookworm", "http://m/debian")
    assert base.key() == image.ImageSpec("bookworm", "http://m/debian").key()
    assert base.key() != image.ImageSpec("bookworm", "http://other/debian").key()
    assert base.key() != image.ImageSpec("jammy", "http://m/debian").key()
    assert base.key() != image.ImageSpec("bookworm", "http://m/debian", extra_packages=("htop",)).key()
    reordered = image.ImageSpec("bookworm", "http://m/debian", tuple(reversed(image.PACKAGES)))
    assert base.key() == reordered.key()


def test_image_has_what_roles_assert():
    for pkg in ("systemd", "openssh-server", "python3-venv", "sudo", "nginx-light", "numactl", "udev"):
        assert pkg in image.PACKAGES


def test_jammy_uses_universe_and_ubuntu_keyring(tmp_path):
    spec = image.ImageSpec("jammy", "http://archive.ubuntu.com/ubuntu")
    keyring = Path("/usr/share/keyrings/ubuntu-archive-keyring.gpg")
    if not keyring.is_file():
        with pytest.raises(StagingError, match="ubuntu-keyring"):
            image.debootstrap_args(spec, tmp_path)
        return
    args = image.debootstrap_args(spec, tmp_path)
    assert "--components=main,universe" in args and args[-3:] == ["jammy", str(tmp_path), spec.mirror]
