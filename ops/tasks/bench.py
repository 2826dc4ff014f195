"""`vlfleet bench` (all of issue 9's measurements) and `vlfleet bench.service`; JSON + PNG + markdown under results/."""

from __future__ import annotations

import json
from pathlib import Path

from invoke import Exit, task

# The bench's 2b-shape conversions by name: the service's two formats and the int4 variants its levers compare.
ARTIFACTS = {"int4": {}, "int8": {"weight_format": "int8"}, "int4-channel": {"group_size": -1},
             "int4-sym": {"sym": True}}


def _artifact(name: str) -> Path:
    from ops.model.cache import artifact
    from ops.model.convert import ConvertParams

    params = ConvertParams(**{"weight_format": "int4", **ARTIFACTS[name]})
    return artifact("2b", params, quiet=False)  # minutes on first use: show progress


def _checkpoint() -> Path:
    from ops.model.cache import checkpoint

    return checkpoint("2b", quiet=False)


def _peer(output_type: str | None = None):
    """llama-server built for this CPU and the 2b-shape checkpoint as GGUF (Q4_0 + mmproj q8_0, the vocabulary
    projection at ``output_type``, llama-quantize's choice if None), both cached."""
    from ops.bench.suite import PeerInputs
    from ops.llamacpp import build, gguf, shim

    built = build.build()
    params = gguf.GgufParams("Q4_0", "q8_0", output_type)
    return PeerInputs(built.binary("llama-server"), gguf.cached("2b", params, quiet=False), built.info,
                      shim.shim(built))


@task(default=True, help={
    "only": "comma-separated subset: machine, baselines, int8, int4, images, followup, structured (answers "
            "constrained to a JSON schema beside plain ones), concurrency, overhead, "
            "peer (llama-server on the same checkpoint as GGUF, built on first use), tune (the engine `vlfleet tune` "
            "picks on this machine, by its own code), tune_load (its pick with 4 clients asking at once), levers "
            "(A/B, off by default), "
            "or service (= int4,images,followup)",
    "quick": "fewer runs (2), one baseline run, clients 1/2/4 once each: a check of the harness, not a result",
    "runs": "measured answers per configuration (default 5; 2 with --quick)",
    "tokens": "new tokens per answer (default 128: a typical answer, as `vlfleet tune` scores)",
    "out": "results directory (default results/, or results/quick for --quick/--only runs)",
})
def run(c, only=None, quick=False, runs=None, tokens=128, out=None):
    """Run the benchmark suite on the 2b-shape model (~30-40 min in full; artifacts are built on first use)."""
    from ops.bench.suite import Plan, parse_only
    from ops.bench.suite import run as run_suite

    try:
        sections = parse_only(only)
    except ValueError as e:
        raise Exit(f"--only: {e}") from None
    target = Path(out) if out else Path("results/quick" if quick or only else "results")
    plan = Plan.quick(sections=sections, out=target, tokens=int(tokens)) if quick else \
        Plan(sections=sections, out=target, tokens=int(tokens))
    if runs is not None:
        plan.runs = int(runs)
    if plan.runs < 1 or plan.tokens < 2:
        raise Exit("--runs must be >= 1 and --tokens >= 2 (ms/token needs two tokens)")
    print(f"[bench] sections: {', '.join(plan.sections)}; {plan.runs} runs, {plan.tokens} tokens; "
          f"logs in {plan.log_dir}; preparing 2b-shape artifacts (cached after the first build)", flush=True)
    from service.runtime.processes import sigterm_as_interrupt

    try:
        with sigterm_as_interrupt():
            results = run_suite(plan, _artifact, _checkpoint, _peer)
    except KeyboardInterrupt:
        raise Exit(f"interrupted: what was measured so far is in {target}/bench.json and bench.md", code=130) from None
    failed = results.get("errors") or {}
    if failed:
        raise Exit(f"sections failed: {', '.join(failed)}; see {target}/bench.md and the logs in {plan.log_dir}")


@task(help={"runs": "measured runs per path (default 5)", "tokens": "new tokens per answer (default 64)",
            "out": "results directory (default results/)", "model": "artifact (default: 2b-shape int4, built)"})
def service(c, runs=5, tokens=64, out="results", model=None):
    """HTTP+SSE path vs in-process VLMPipeline (in a clean process): first token and ms/token, within 5 % either way."""
    from ops.bench.service_overhead import run

    print("[bench] preparing the 2b-shape int4 artifact (cached after the first build)", flush=True)
    result = run(Path(model) if model else _artifact("int4"), Path(out), int(runs), int(tokens))
    print(f"first token: in-process {result['in_process']['first_token_s']:.3f}s, "
          f"http {result['http_sse']['first_token_s']:.3f}s (x{result['first_token_s_ratio']:.3f})")
    print(f"ms/token:    in-process {result['in_process']['ms_per_token']:.1f}, "
          f"http {result['http_sse']['ms_per_token']:.1f} (x{result['ms_per_token_ratio']:.3f})")
    for key, verdict in result["comparison"].items():
        print(f"{key}: {verdict['summary']}")
    print(f"saved {out}/bench-service.json and .png")


@task(help={"inventory": "Ansible inventory of a serving fleet with groups vlm and lb (default: ./inventory.yml)",
            "label": "the run's name in the results table, e.g. affinity-off (default: affinity-on)",
            "conversations": "conversations (default 12)", "clients": "conversations in flight at once (default 4)",
            "followups": "follow-up questions per conversation (default 3)",
            "tokens": "new tokens per answer at most (default 8)",
            "out": "results directory (default results/fleet-locality)"})
def locality(c, inventory="inventory.yml", label="affinity-on", conversations=12, clients=4, followups=3, tokens=8,
             out="results/fleet-locality"):
    """Cache locality through the lb: which host answered each turn, follow-up first token, encoder runs, cache hits."""
    from ops.bench import fleet_locality
    from ops.fleet import FleetError, load_inventory
    from ops.host.probe import FOLLOWUP_QUESTIONS

    try:
        inv = load_inventory(Path(inventory))
    except FleetError as e:
        raise Exit(f"vlfleet bench.locality: {e}") from e
    plan = fleet_locality.Plan(conversations=int(conversations), clients=int(clients), followups=int(followups),
                               tokens=int(tokens))
    if plan.conversations < 1 or plan.clients < 1 or not 0 <= plan.followups <= len(FOLLOWUP_QUESTIONS):
        raise Exit(f"--conversations and --clients must be >= 1, --followups 0-{len(FOLLOWUP_QUESTIONS)}")
    try:
        result = fleet_locality.run(inv, plan, label)
    except (ValueError, OSError) as e:
        raise Exit(f"vlfleet bench.locality: {e}") from e
    path = fleet_locality.save(result, Path(out))
    print(json.dumps(result["summary"], indent=1))
    print(f"saved {path} and {Path(out) / 'README.md'}")
