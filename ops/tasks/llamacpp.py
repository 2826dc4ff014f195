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
    """Build llama-server, llama-quantize and llama-mtmd-cli (cached; 6-15 min on 2 cores the first time), and the
    hybrid engine's libvlfleet_llama.so against them."""
    from ops.llamacpp import build as build_mod
    from ops.llamacpp import shim
    from ops.llamacpp.source import VERSION, SourceError

    if int(jobs) < 1 or float(timeout) <= 0:
        raise Exit("llamacpp.build: --jobs must be >= 1 and --timeout (minutes) > 0")
    config = build_mod.default_config(native=not portable, version=version or VERSION)
    try:
        done = build_mod.build(config, jobs=int(jobs), timeout=float(timeout) * 60)
        lib = shim.shim(done)
    except (build_mod.BuildError, SourceError) as e:
        raise Exit(f"llamacpp.build: {e}") from None
    print(f"llama-server: {done.binary('llama-server')}")
    print(f"{shim.NAME} (VLFLEET_LLAMACPP_LIB): {lib}")


@task(help={
    "portable": "package a portable build (every CPU variant, for hosts of several CPU generations) instead of the "
                "native one tuned for this CPU, which hosts without its ISA flags refuse to run",
    "out": "also copy the wheel into this directory (default: only the vlfleet cache)",
})
def wheel(c, portable=False, out=None):
    """Package llama-server and the shared libraries it needs as a wheel for the hosts' wheelhouse (builds first if
    absent); print the wheel's path."""
    from pathlib import Path

    from ops.llamacpp.build import BuildError
    from ops.llamacpp.source import SourceError
    from ops.llamacpp.wheel import WheelError, hosts_wheel

    try:
        path = hosts_wheel("portable" if portable else "native", Path(out) if out else None)
    except (BuildError, SourceError, WheelError) as e:
        raise Exit(f"llamacpp.wheel: {e}") from None
    except OSError as e:
        raise Exit(f"llamacpp.wheel: cannot write the wheel: {e}") from None
    print(path)


@task(help={
    "portable": "check the portable build (every CPU variant, picked at run time) instead of the native one",
    "binary": "check this llama-server instead of a cached build (e.g. an older build, or a wheel's)",
    "shape": "the synthetic checkpoint's shape, converted to GGUF Q4_0 + mmproj q8_0 (default 2b: what the fleet "
             "serves; kernels: 4 MB with 2b's kernel conditions, for a quick check)",
    "runs": "answers timed per configuration, as built and with --no-repack (default 3; 0: the smoke alone)",
    "tokens": "new tokens per timed answer (default 128)",
    "out": "directory for check.json and check.md (default $VLFLEET_CACHE/reports/llamacpp-check); llama-server's "
           "logs go to $VLFLEET_CACHE/reports/llamacpp-check-logs/",
})
def check(c, portable=False, binary=None, shape="2b", runs=3, tokens=128, out=None):
    """Check that llama-server runs the model shape the fleet serves: load its GGUF and answer one token (a crash is
    named with its signal), then time it as built and with --no-repack; check.json and check.md in --out. Exits 1
    when the smoke fails."""
    from pathlib import Path

    from ops.llamacpp import build as build_mod
    from ops.llamacpp import check as check_mod
    from ops.llamacpp import gguf
    from ops.llamacpp.source import SourceError
    from ops.paths import cache_root

    if int(runs) < 0 or int(tokens) < 2:
        raise Exit("llamacpp.check: --runs must be >= 0 and --tokens >= 2")
    config = build_mod.default_config(native=not portable)
    try:
        server = Path(binary) if binary else build_mod.build(config).binary("llama-server")
        artifact = gguf.cached(shape, gguf.GgufParams("Q4_0", "q8_0"), quiet=False, build_config=config)
    except (build_mod.BuildError, SourceError, gguf.GgufError, ValueError) as e:
        raise Exit(f"llamacpp.check: {e}") from None
    if not server.is_file():
        raise Exit(f"llamacpp.check: {server} is not a file")
    folder = Path(out) if out else cache_root() / "reports" / "llamacpp-check"
    logs = cache_root() / "reports" / "llamacpp-check-logs" / folder.resolve().name
    data = check_mod.run(server, artifact, logs, int(runs), int(tokens), shape,
                         say=lambda m: print(f"[llamacpp.check] {m}", flush=True))
    js, md = check_mod.write(data, folder)
    print(f"{js}\n{md}")
    if not data["smoke"]["ok"]:
        raise Exit(f"llamacpp.check: llama-server does not run the {shape} shape: {data['smoke']['error'][:500]}")
