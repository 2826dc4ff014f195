"""`vlfleet demo` (and `make demo`): the quick start on the embedded defaults.

Synthetic model artifact, a local staging fleet, the site playbook, the pre-launch checklist, then one answer
streamed through the fleet's load balancer to this terminal. Every step says what it is doing.
"""

from __future__ import annotations

import time

from invoke import Exit, task

from ops.bench.workload import test_image
from ops.host import client

STEPS = 6


def _step(n: int, text: str) -> float:
    print(f"\n[demo {n}/{STEPS}] {text}", flush=True)
    return time.monotonic()


def _stream_answer(url: str, question: str, timeout: float = 300) -> tuple[str, float]:
    """POST one streamed chat through ``url``; print tokens as they arrive; return the text and first-token time."""
    body = {"messages": [client.user_turn(client.data_url(test_image()), question)],
            # Sampled with a seed: greedy decoding of random weights tends to repeat one token (often a newline).
            "max_tokens": 48, "stream": True, "temperature": 0.8, "seed": 7}
    answer = client.chat(url, body, timeout, on_text=lambda piece: print(piece, end="", flush=True))
    print()
    try:
        answer.check()
    except client.ChatError as e:  # "HTTP 502: ...", the stream's error, or the connection's
        raise Exit(f"demo: no answer through the load balancer: {e}") from None
    return answer.text, answer.first_token_s


def _staging_waivers() -> list[str]:
    """Checks a staging container cannot pass for reasons of this machine, not of the deployment."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 65535:
        print(f"  waiving SVC-NOFILE: this machine caps open files at {hard}, and container hosts inherit the cap")
        return ["SVC-NOFILE"]
    return []


@task(help={
    "containers": "container hosts running the service (default 2)",
    "vms": "VM hosts running the service (default 0; each boots in ~2 min under software emulation)",
    "name": "staging fleet name (default demo)",
})
def demo(c, containers=2, vms=0, name="demo"):
    """Quick start: synthetic model + local staging fleet + site playbook + checklist + one streamed answer."""
    from ops.model.cache import tiny_artifact
    from ops.staging import fleet as staging
    from ops.tasks.preflight import preflight
    from ops.tasks.site import site

    began = _step(1, "building the synthetic Qwen3-VL model and converting it to OpenVINO int4 (cached) ...")
    artifact = tiny_artifact()
    print(f"  artifact: {artifact}")

    _step(2, f"bringing up staging fleet '{name}': {containers} container(s), {vms} VM(s), 1 load balancer ...")
    try:
        fleet = staging.up(name, containers=int(containers), vms=int(vms), lb=True)
    except Exception as e:  # staging errors name the missing tool or permission; show them, not a traceback
        raise Exit(f"demo: staging fleet could not start: {e}") from e
    print(f"  inventory: {fleet.inventory_path}")

    _step(3, "converging the fleet with site.yml (CPU check, swap, limits, runtime, model, service, nginx) ...")
    site(c, inventory=str(fleet.inventory_path), artifact=str(artifact))

    _step(4, "running the pre-launch checklist on every service host ...")
    preflight(c, inventory=str(fleet.inventory_path), ignore=",".join(_staging_waivers()))

    lb = fleet.group("lb")[0]
    url = f"http://{lb.ip}"
    _step(5, f"asking the fleet about an image through the load balancer at {url} ...")
    _, first = _stream_answer(url, "What is in this image?")
    print(f"  first token after {first:.2f}s (the synthetic model's words are noise: its weights are random)")

    _step(6, f"done in {time.monotonic() - began:.0f}s")
    print(f"  web UI:       open {url}/ in a browser on this machine (or: ssh -L 8080:{lb.ip}:80 THIS_HOST)")
    print(f"  status:       vlfleet status --inventory {fleet.inventory_path}")
    print(f"  a shell:      vlfleet staging.ssh --name {name} {fleet.group('vlm')[0].name}")
    print(f"  tear it down: vlfleet staging.down --name {name}")
