"""`vlfleet os-mirror.*`: a flat apt repository of the distribution packages the roles install, for hosts that
reach no package registry (role os_packages with vlfleet_os_packages_mirror)."""

from __future__ import annotations

from pathlib import Path

from invoke import Exit, task


@task(help={
    "suite": "the hosts' suite: bookworm (default; the staging hosts), jammy (Ubuntu 22.04) or noble",
    "mirror": "upstream apt mirror (default: this machine's apt source for the suite; Ubuntu needs one given, "
              "e.g. http://archive.ubuntu.com/ubuntu)",
    "status": "a host's /var/lib/dpkg/status (copied here): fetch only what that host lacks (default: everything "
              "the roles install, with the dependencies an empty system would need)",
    "needs": "comma-separated os_packages needs (python_venv,numactl,nginx; default all)",
    "suites": "comma-separated suites to resolve from (default: the suite; Ubuntu adds -updates and -security)",
    "keyring": "keyring the suite's Release signatures are verified with (default: the distribution's archive "
               "keyring: debian-archive-keyring or ubuntu-keyring)",
    "refresh": "build again even when the cache holds this mirror (upstream moved on)",
})
def build(c, suite="bookworm", mirror="", status="", needs="", suites="", keyring="", refresh=False):
    """Download the .debs os_packages installs, with their dependencies, into a flat apt repository (cached)."""
    from ops.os_mirror import MirrorError
    from ops.os_mirror.build import MirrorSpec
    from ops.os_mirror.build import build as build_mirror

    spec = MirrorSpec(suite, mirror, _split(needs), Path(status) if status else None, keyring, _split(suites))
    try:
        built = build_mirror(spec, refresh=bool(refresh))
    except MirrorError as e:
        raise Exit(f"os-mirror.build: {e}") from None
    print(f"mirror: {built.path} ({len(built.debs)} .debs for {', '.join(built.packages) or 'nothing missing'})")
    print(f"serve it: vlfleet os-mirror.serve --dir {built.path} --bind ADDR --port 8080")
    print("then: vlfleet site ... -e vlfleet_os_packages_mirror=http://ADDR:8080/  (hosts get: "
          f"{built.apt_line('http://ADDR:8080')})")


@task(help={
    "dir": "mirror directory (default: the one os-mirror.build made last)",
    "bind": "address to listen on, one the hosts reach (e.g. the staging bridge's .1); default 127.0.0.1",
    "port": "TCP port (default 8080)",
    "seconds": "stop after this many seconds (default 0: until Ctrl-C)",
})
def serve(c, dir="", bind="127.0.0.1", port=8080, seconds=0):
    """Serve a built mirror read-only over HTTP (stdlib server; GET/HEAD of its files only)."""
    from ops.os_mirror import MirrorError
    from ops.os_mirror.build import last_built
    from ops.os_mirror.serve import serve as serve_mirror

    root = Path(dir) if dir else last_built()
    if root is None:
        raise Exit("os-mirror.serve: no mirror built yet: run `vlfleet os-mirror.build` first, or pass --dir")
    try:
        serve_mirror(root, bind, int(port), float(seconds))
    except MirrorError as e:
        raise Exit(f"os-mirror.serve: {e}") from None


def _split(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())
