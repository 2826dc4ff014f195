"""`vlfleet site`: make sure the wheelhouse and the model artifact exist, then converge the fleet with site.yml."""

from __future__ import annotations

import json
from pathlib import Path

from invoke import Exit, task


def _artifact_dir(artifact: str) -> Path:
    if artifact == "tiny":
        from ops.model.cache import tiny_artifact

        return tiny_artifact()
    path = Path(artifact).expanduser()
    if not (path / "manifest.json").is_file():
        raise Exit(f"--artifact {path}: no manifest.json there. Build an artifact with `vlfleet model.build`, "
                   f"or pass --artifact tiny for the synthetic staging model")
    return path


def _llamacpp(gguf: str, build_kind: str) -> tuple[Path, Path]:
    """The GGUF artifact to ship and the llama.cpp runtime wheel for the hosts' wheelhouse (built or reused)."""
    from ops.llamacpp import build, wheel
    from ops.llamacpp import gguf as gguf_mod
    from ops.llamacpp.source import SourceError
    from service.runtime.manifest import is_gguf_artifact

    path = Path(gguf).expanduser()
    if gguf != "tiny" and not is_gguf_artifact(path):  # checked first: the build may take many minutes
        raise Exit(f"--gguf {path}: not a GGUF artifact (manifest.json with weight format gguf). Make one with "
                   "`vlfleet model.gguf`, or pass --gguf tiny with --artifact tiny")
    try:
        runtime = wheel.hosts_wheel(build_kind)
        if gguf == "tiny":
            config = build.default_config(native=build_kind == "native")  # its llama-quantize, already built
            path = gguf_mod.cached("tiny", build_config=config)
    except (build.BuildError, wheel.WheelError, gguf_mod.GgufError, SourceError) as e:
        raise Exit(f"site: {e}") from e
    return path, runtime


def _wheelhouse_dir(wheelhouse: str | None, python: str, inventory: Path, extra_wheels: list[Path]) -> Path:
    if wheelhouse:
        path = Path(wheelhouse).expanduser()
        if not (path / "requirements.txt").is_file():
            raise Exit(f"--wheelhouse {path}: no requirements.txt there. Build one with "
                       f"`vlfleet wheelhouse.build --python X.Y --out DIR`")
        return path
    if python == "auto":
        from ops.playbook import PlaybookError, host_python_versions

        try:
            versions = host_python_versions(inventory)
        except PlaybookError as e:
            raise Exit(f"site: {e}") from e
        if len(set(versions.values())) != 1:
            raise Exit("site: the vlm hosts run different Python versions "
                       f"({json.dumps(versions)}); run `vlfleet site` per group with --limit and --python")
        python = next(iter(versions.values()))
        print(f"[site] hosts run Python {python}")
    from ops.wheelhouse import DEFAULT_PLATFORM, Target, WheelhouseError, assemble

    print(f"[site] building (or reusing) the wheelhouse for Python {python} ...")
    try:
        return assemble(Target(python, DEFAULT_PLATFORM), extra_wheels=extra_wheels)
    except WheelhouseError as e:
        raise Exit(f"site: {e}") from e


@task(help={
    "inventory": "Ansible inventory (see inventory.example); default: ./inventory.yml",
    "artifact": "model artifact directory (from `vlfleet model.build`), or 'tiny' for the synthetic staging model",
    "wheelhouse": "host wheelhouse directory; default: built for the hosts' Python (see --python)",
    "python": "hosts' Python version for the wheelhouse (3.10, 3.11) or 'auto' to ask the hosts (default)",
    "check": "dry run: report what would change, change nothing (ansible --check --diff)",
    "limit": "only these hosts or groups (ansible --limit)",
    "tags": "only these role tags, comma-separated (e.g. vlm_service,lb)",
    "extra": "more variables as JSON, e.g. '{\"lb_drained_hosts\": [\"vlm2\"]}'",
    "gguf": "also ship this GGUF artifact of the same checkpoint (from `vlfleet model.gguf`; 'tiny' with --artifact "
            "tiny) and put llama.cpp's llama-server into the hosts' wheelhouse, so the llamacpp engine can run and "
            "`vlfleet tune` measures it",
    "llamacpp_build": "with --gguf: portable (the default: every CPU variant, chosen at run time, for hosts of any "
                      "x86-64 generation) or native (tuned for this controller's CPU; hosts must have its ISA)",
})
def site(c, inventory="inventory.yml", artifact=None, wheelhouse=None, python="auto", check=False, limit=None,
         tags=None, extra=None, gguf=None, llamacpp_build="portable"):
    """Converge the fleet: CPU check, swap, limits, tuning, release venv, model, service, nginx (site.yml)."""
    from ops.playbook import PlaybookError, run_playbook

    inv = Path(inventory).expanduser()
    if not inv.is_file():
        raise Exit(f"site: inventory {inv} not found; copy inventory.example, or use the one `vlfleet staging.up` "
                   f"prints")
    if not artifact:
        raise Exit("site: --artifact is required: a directory from `vlfleet model.build`, or 'tiny' for the "
                   "synthetic staging model")
    extra_vars: dict = {}
    if extra:
        try:
            extra_vars = dict(json.loads(extra))
        except (ValueError, TypeError) as e:
            raise Exit(f"site: --extra must be a JSON object: {e}") from e
    extra_vars["vlfleet_artifact_dir"] = str(_artifact_dir(artifact))
    runtime: list[Path] = []
    if gguf:
        if wheelhouse:
            raise Exit("site: --gguf puts llama-server into the wheelhouse it builds; leave out --wheelhouse (or "
                       "build yours with the runtime wheel from `vlfleet llamacpp.wheel` and pass vlfleet_gguf_dir "
                       "in --extra)")
        gguf_dir, wheel = _llamacpp(gguf, llamacpp_build)
        extra_vars["vlfleet_gguf_dir"], runtime = str(gguf_dir), [wheel]
    extra_vars["vlfleet_wheelhouse_dir"] = str(_wheelhouse_dir(wheelhouse, python, inv, runtime))
    try:
        run = run_playbook(inv, "site.yml", extra_vars, check=bool(check), diff=bool(check), limit=limit,
                           tags=[t for t in (tags or "").split(",") if t])
    except PlaybookError as e:
        raise Exit(f"site: {e}") from e
    print("\n[site] per host:\n" + run.summary())
    if not run.ok:
        raise Exit(f"site: ansible-playbook failed (exit {run.returncode}); see the failures above", code=1)
