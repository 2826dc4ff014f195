"""`vlfleet llamacpp.*`: llama.cpp's source (from the llama-cpp-python sdist) and a cached build of llama-server."""

from __future__ import annotations

from invoke import Exit, task


@task(help={"version": "llama-cpp-python sdist version whose vendored llama.cpp is used (default: the pinned one)"})
def source(c, version=None):
    """Download (pip), verify (pinned sha256) and unpack llama.cpp's source into the vlfleet cache; print its path."""
    from ops.llamacpp.source import VERSION, SourceError, fetch

    try:
        src = fetch(version or VERSION)
    except SourceError as e:
        raise Exit(f"llamacpp.source: {e}") from None
    print(f"llama.cpp source (llama-cpp-python {src.version}, sha256 {src.sha256[:12]}...): {src.llama_cpp}")


@task(help={
    "portable": "build for hosts of several CPU generations (every CPU variant as a backend library) instead of "
                "tuning for this CPU (the default, right for the bench's llama-server on this controller)",
    "jobs": "parallel compile jobs (default 2)",
    "timeout": "minutes before the build is stopped (default 60)",
    "version": "llama-cpp-python sdist version (default: the pinned one)",
})
def build(c, portable=False, jobs=2, timeout=60, version=None):
    """Build llama-server, llama-quantize and llama-mtmd-cli (cached; 6-15 min on 2 cores the first time)."""
    from ops.llamacpp import build as build_mod
    from ops.llamacpp.source import VERSION, SourceError

    if int(jobs) < 1 or float(timeout) <= 0:
        raise Exit("llamacpp.build: --jobs must be >= 1 and --timeout (minutes) > 0")
    config = build_mod.default_config(native=not portable, version=version or VERSION)
    try:
        done = build_mod.build(config, jobs=int(jobs), timeout=float(timeout) * 60)
    except (build_mod.BuildError, SourceError) as e:
        raise Exit(f"llamacpp.build: {e}") from None
    print(f"llama-server: {done.binary('llama-server')}")
