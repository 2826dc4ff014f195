"""`vlfleet bench`: every measurement of issue 9 in one run, written as results/bench.json, .md and PNGs.

Sections run in order and each failure is recorded, not fatal, so one broken part still leaves the
rest of the numbers. Every answer about a first question uses a fresh image (a different seed, same size
and statistics) so no run is a prefix-cache hit on an earlier one; repeats of the *same* request would
measure caches, not the model.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

from ops.bench import (
    bandwidth,
    baseline,
    compute,
    concurrency,
    decode_profile,
    llama_server,
    service_overhead,
    targets,
    workload,
)
from ops.bench.charts import suite_charts
from ops.bench.report import render
from ops.bench.server import Server, model_size
from service.prompt_limits import VisionGrid

SECTIONS = ("machine", "baselines", "int8", "int4", "images", "followup", "concurrency", "overhead", "peer", "tune",
            "tune_load")
EXTRA_SECTIONS = ("levers",)  # only when asked for: A/B of service settings
FOLLOWUP = "What are the main colors, and where are they?"
FULL_SIDE = (1200, 800)


@dataclass
class Plan:
    sections: tuple[str, ...] = SECTIONS
    runs: int = 5
    baseline_runs: int = 2
    tokens: int = 128  # a typical answer: what `vlfleet tune` scores by default
    clients: tuple[int, ...] = (1, 2, 4, 8)
    rounds: int = 2  # requests per client per concurrency level
    tune_clients: int = 4  # tune_load: `vlfleet tune --clients` as a host whose users come together
    out: Path = Path("results")
    engines: tuple[str, ...] = ()  # filled from the service's settings
    log_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="vlfleet-bench-")))

    @classmethod
    def quick(cls, **kw) -> Plan:
        return cls(runs=2, baseline_runs=1, clients=(1, 2, 4), rounds=1, **kw)


def parse_only(only: str | None) -> tuple[str, ...]:
    """``--only service,concurrency`` -> sections in run order; "service" means int4+images+followup."""
    if not only:
        return SECTIONS
    aliases = {"service": ("int4", "images", "followup"), "baseline": ("baselines",)}
    wanted: set[str] = set()
    for name in (part.strip() for part in only.split(",") if part.strip()):
        if name in aliases:
            wanted.update(aliases[name])
        elif name in SECTIONS + EXTRA_SECTIONS:
            wanted.add(name)
        else:
            raise ValueError(f"unknown section {name!r}; choose from: {', '.join(SECTIONS + EXTRA_SECTIONS)}, "
                             "service")
    return tuple(s for s in SECTIONS + EXTRA_SECTIONS if s in wanted)


def service_engines() -> tuple[tuple[str, ...], str | None]:
    """Engines the service offers (VLFLEET_ENGINE) and its default; ("serial",) before that setting exists."""
    from service.settings import FIELDS

    engine = next((f for f in FIELDS if f.name == "engine"), None)
    if engine is None:
        raise LookupError("service/settings.py has no engine field (VLFLEET_ENGINE): the bench reads its default there")
    names = []
    for candidate in ("serial", "direct", "batching"):
        try:
            engine.parse(candidate)
            names.append(candidate)
        except ValueError:
            pass
    return tuple(names) or (engine.default,), engine.default


class Progress:
    def __init__(self) -> None:
        self.started = time.monotonic()

    def __call__(self, message: str) -> None:
        print(f"[bench {time.monotonic() - self.started:6.0f}s] {message}", flush=True)


def _machine() -> dict:
    """CPU model, ISA flags and CPUs (ops.machine.describe), memory, load, Python and the runtimes' versions."""
    from ops.machine import describe

    versions = {}
    for pkg in ("openvino", "openvino-genai", "torch", "transformers", "numpy"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {**describe(), "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            "python": platform.python_version(), "versions": versions}


def _answers(url: str, plan: Plan, width: int, height: int, seed: int, say: Callable[[str], None],
             label: str, detail: str | None = None) -> dict:
    """``plan.runs`` answers, each about a fresh image of ``width`` x ``height`` (sent with image_url.detail
    ``detail``), after one discarded warm-up; with the prompt tokens the service reported (the image's included)."""
    workload.over_http(url, workload.test_image(width, height, seed=seed + 999), 8)
    samples, prompt = [], []
    for i in range(plan.runs):
        turn = workload.user_turn(workload.test_image(width, height, seed=seed + i), detail=detail)
        done = workload.chat_stream(url, [turn], plan.tokens)
        samples.append(done.sample)
        if done.prompt_tokens is not None:
            prompt.append(done.prompt_tokens)
        s = samples[-1]
        say(f"{label} run {i + 1}/{plan.runs}: first token {s.first_token_s:.2f}s, {s.ms_per_token:.1f} ms/token, "
            f"{s.tokens} tokens")
    return {**workload.summarize(samples), "prompt_tokens": statistics.median(prompt) if prompt else None}


def _followup(url: str, plan: Plan, say: Callable[[str], None]) -> dict:
    """First question and a follow-up about the same image; also how much of each first token was spent preparing
    embeddings (vision encoder + merger, server-side, from /metrics), which says where a follow-up's time goes."""
    firsts, seconds, reused = [], [], 0
    embeds: dict[str, list[float]] = {"first": [], "followup": []}
    encodes: dict[str, list[float]] = {"first": [], "followup": []}
    encode_sum, encoder_runs = "vlfleet_image_encode_seconds_sum", "vlfleet_vision_encoder_runs_total"

    def answer(messages: list[dict], kind: str) -> workload.Answer:
        before, runs_before = workload.metric(url, encode_sum), workload.metric(url, encoder_runs)
        done = workload.chat_stream(url, messages, plan.tokens)
        embeds[kind].append(workload.metric(url, encode_sum) - before)
        encodes[kind].append(workload.metric(url, encoder_runs) - runs_before)
        return done

    for i in range(plan.runs):
        png = workload.test_image(seed=300 + i)
        first = answer([workload.user_turn(png)], "first")
        messages = [workload.user_turn(png), {"role": "assistant", "content": first.text},
                    {"role": "user", "content": FOLLOWUP}]
        second = answer(messages, "followup")
        reused += second.headers.get("X-Session-Reused") == "1"
        firsts.append(first.sample)
        seconds.append(second.sample)
        say(f"follow-up pair {i + 1}/{plan.runs}: first question {first.sample.first_token_s:.2f}s "
            f"(embeddings {embeds['first'][-1]:.2f}s), follow-up {second.sample.first_token_s:.2f}s "
            f"(embeddings {embeds['followup'][-1]:.2f}s, continued: {second.headers.get('X-Session-Reused')})")
    a, b = workload.summarize(firsts), workload.summarize(seconds)
    return {"runs": plan.runs, "reused": reused, "first_first_token_s": a["first_token_s"],
            "followup_first_token_s": b["first_token_s"], "first": a, "followup": b,
            "embeddings_s": {k: statistics.median(v) for k, v in embeds.items()},
            "vision_encoder_runs": {k: sum(v) for k, v in encodes.items()}}


def seen_size(server: Server, width: int, height: int, detail: str | None = None) -> str:
    """The size the model sees of a ``width`` x ``height`` test image sent to ``server`` with ``detail``: computed by
    the service's own image preparation under that server's settings (VLFLEET_IMAGE_MAX_SIDE*), not assumed."""
    w, h = model_size(workload.test_image(width, height), server.model, server.env, detail)
    return f"{w}x{h}"


def _concurrency(url: str, plan: Plan, say: Callable[[str], None], engine: str) -> list[dict]:
    levels = []
    for n in plan.clients:
        lv = concurrency.level(url, n, plan.tokens, rounds=plan.rounds, seed_base=1000 + 100 * n)
        levels.append(lv)
        say(f"concurrency ({engine}) {n} clients: {lv['tokens_per_s']:.1f} tokens/s, p50/p95 first token "
            f"{lv['first_token_p50_s'] or 0:.2f}/{lv['first_token_p95_s'] or 0:.2f}s, errors {lv['errors']}")
    return levels


@dataclass(frozen=True)
class PeerInputs:
    """What the peer section runs: a built llama-server and the 2b-shape checkpoint as a GGUF artifact."""

    server: Path
    artifact: Path
    build: dict  # ops.llamacpp.build's build.json: version, flags, CPU it was tuned for, build time


def run(plan: Plan, artifact: Callable[[str], Path], checkpoint: Callable[[], Path],
        peer_inputs: Callable[[], PeerInputs] | None = None) -> dict:
    """Run ``plan``; ``artifact(fmt)`` / ``checkpoint()`` / ``peer_inputs()`` give (and build if needed) the
    2b-shape inputs."""
    say = Progress()
    engines, default_engine = service_engines()
    plan.engines = plan.engines or engines
    results: dict = {"meta": {"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": _machine(),
                              "tokens": plan.tokens, "runs": plan.runs, "baseline_runs": plan.baseline_runs,
                              "sections": list(plan.sections), "image": "416x277 PNG (a fresh seed per run)",
                              "engines": list(plan.engines), "default_engine": default_engine or "serial"},
                     "service": {}, "errors": {}}

    def section(name: str, fn: Callable[[], None], label: str | None = None) -> None:
        if name not in plan.sections:
            return
        label = label or name
        say(f"== {label}")
        try:
            fn()
        except Exception as e:  # recorded in the results; the other sections still run
            results["errors"][label] = f"{type(e).__name__}: {e}"[:500]
            say(f"{label} FAILED: {results['errors'][label]}")

    def machine() -> None:
        bw = bandwidth.measure_bandwidth()
        say(f"read bandwidth {bw.one_thread / 1e9:.1f} GB/s one thread, {bw.all_threads / 1e9:.1f} GB/s "
            f"{bw.threads} threads")
        limit: dict = {"bandwidth": bw.as_dict(), "weights": {}, "floor_ms_per_token": {}}
        for fmt in ("int4", "int8"):
            w = bandwidth.artifact_weight_bytes(artifact(fmt))
            limit["weights"][fmt] = w.as_dict()
            limit["floor_ms_per_token"][fmt] = bandwidth.floor_ms_per_token(w.total, bw.all_threads)
            say(f"{fmt}: {w.total / 1e9:.3f} GB of language-model weights per token -> floor "
                f"{limit['floor_ms_per_token'][fmt]:.1f} ms/token")
        int4 = artifact("int4")
        config = json.loads((int4 / "config.json").read_text())
        limit["kv_bytes_per_token"] = bandwidth.kv_bytes_per_token(config, 200 + plan.tokens)
        kernels = compute.measure_kernels(config, say)
        best = max(kernels, key=lambda k: k.flops_per_s)
        limit["compute"] = {"kernels": [k.as_dict() for k in kernels], "peak": best.as_dict(),
                            "repeats": compute.REPEATS, "flop_model": asdict(compute.FlopModel.of_config(config)),
                            "vision_grid": asdict(VisionGrid.of_model(int4))}
        decode = decode_profile.profile_decode(int4, decode_profile.service_lm_properties(int4))
        rates = decode.stream_rates(limit["weights"]["int4"])
        limit["decode"] = decode.as_dict() | {"stream_bytes_per_s": rates}
        say(f"int4 decode step in process: {decode.ms_per_token:.1f} ms; weights stream at "
            + ", ".join(f"{rate / 1e9:.1f} GB/s ({part})" for part, rate in rates.items()))
        results["machine_limit"] = limit

    def baselines() -> None:
        results["baselines"] = {}
        for dtype in ("fp32", "bf16"):
            say(f"transformers {dtype}: subprocess, {plan.baseline_runs} runs after a warm-up")
            r = baseline.run_subprocess(checkpoint(), dtype, plan.tokens, plan.baseline_runs)
            results["baselines"][dtype] = r
            say(f"transformers {dtype}: first token {r['first_token_s']:.2f}s, {r['ms_per_token']:.1f} ms/token, "
                f"peak RSS {r['peak_rss_bytes'] / 1e9:.2f} GB")

    def server(fmt: str, log: str, env: dict[str, str] | None = None) -> Server:
        say(f"starting the service on the {fmt} artifact {env or ''}")
        return Server(artifact(fmt), plan.log_dir / log, env)

    def int8() -> None:
        with server("int8", "int8.log") as s:
            say(f"int8 ready after {s.cold_start_s:.1f}s")
            entry = {"cold_start_s": s.cold_start_s, "image_416": _answers(s.url, plan, 416, 277, 0, say, "int8")}
            entry["peak_rss_bytes"] = s.peak_rss()["worker"]
            entry["memory"] = s.memory()
        results["service"]["int8"] = entry

    main_int4 = {"int4", "images", "followup", "concurrency"} & set(plan.sections)
    if main_int4 and "int4" not in plan.sections:
        plan.sections = (*plan.sections, "int4")  # the others need its server; it is cheap next to them

    def int4() -> None:
        entry: dict = {"engine": default_engine or "serial"}
        results["service"]["int4"] = entry
        with server("int4", "int4.log") as s:
            say(f"int4 ready after {s.cold_start_s:.1f}s")
            entry["cold_start_s"] = s.cold_start_s
            entry["image_416"] = _answers(s.url, plan, 416, 277, 0, say, "int4 416x277")
            entry["image_416"]["model_size"] = seen_size(s, 416, 277)
            section("images", lambda: images(s, entry))
            section("followup", lambda: entry.update(followup=_followup(s.url, plan, say)))
            entry["peak_rss_bytes"] = s.peak_rss()["worker"]
            entry["memory"] = s.memory()  # where the RSS is: anonymous (plugin buffers) vs file-backed (mmap)
            say(f"int4 peak RSS (worker VmHWM) {entry['peak_rss_bytes'] / 1e9:.2f} GB; now {entry['memory']}")
            if "concurrency" in plan.sections:
                section("concurrency", lambda: results.setdefault("concurrency", {}).update(
                    {entry["engine"]: _concurrency(s.url, plan, say, entry["engine"])}))
                entry["peak_rss_after_concurrency_bytes"] = s.peak_rss()["worker"]
        if "images" in plan.sections:
            section("images", lambda: full_size_images(entry))
        wanted = [name for name in ("followup", "concurrency") if name in plan.sections]
        for engine in plan.engines if wanted else ():
            if engine != entry["engine"]:
                section(wanted[0], lambda e=engine: other_engine(e), f"engine {engine}")

    def images(s: Server, entry: dict) -> None:
        entry["images"] = {"416x277": {**entry["image_416"], "downscale": "on", "sent_size": "416x277",
                                       "model_size": seen_size(s, 416, 277)}}
        w, h = FULL_SIDE
        r = _answers(s.url, plan, w, h, 500, say, f"int4 {w}x{h} downscaled")
        entry["images"][f"{w}x{h}"] = {**r, "downscale": "on", "sent_size": f"{w}x{h}",
                                       "model_size": seen_size(s, w, h)}
        for detail in ("low", "high"):  # the client's choice of budget (image_url.detail), same image size
            r = _answers(s.url, plan, w, h, 600, say, f"int4 {w}x{h} detail {detail}", detail)
            entry["images"][f"{w}x{h} detail {detail}"] = {**r, "downscale": "on", "sent_size": f"{w}x{h}",
                                                           "detail": detail, "model_size": seen_size(s, w, h, detail)}

    def full_size_images(entry: dict) -> None:
        w, h = FULL_SIDE
        with server("int4", "int4-full.log", {"VLFLEET_IMAGE_MAX_SIDE": "0"}) as s:
            r = _answers(s.url, plan, w, h, 500, say, f"int4 {w}x{h} full size")
            size = seen_size(s, w, h)
        entry["images"][f"{w}x{h} (no downscale)"] = {**r, "downscale": "off", "sent_size": f"{w}x{h}",
                                                      "model_size": size}

    def other_engine(engine: str) -> None:
        """The same int4 artifact on another engine: single answers, then the follow-up and concurrency sections
        that were asked for."""
        with server("int4", f"int4-{engine}.log", {"VLFLEET_ENGINE": engine}) as s:
            entry = results["service"][f"int4_{engine}"] = {
                "engine": engine, "cold_start_s": s.cold_start_s,
                "image_416": _answers(s.url, plan, 416, 277, 0, say, f"int4 {engine} 416x277")}
            if "followup" in plan.sections:
                entry["followup"] = _followup(s.url, plan, say)
            entry["peak_rss_bytes"] = s.peak_rss()["worker"]
            if "concurrency" in plan.sections:
                results.setdefault("concurrency", {})[engine] = _concurrency(s.url, plan, say, engine)

    def overhead() -> None:
        results["overhead"] = service_overhead.measure(artifact("int4"), plan.runs, plan.tokens)
        verdicts = results["overhead"]["comparison"]
        say(f"HTTP+SSE / in-process: first token x{results['overhead']['first_token_s_ratio']:.3f} "
            f"({verdicts['first_token_s']['summary']}), ms/token x{results['overhead']['ms_per_token_ratio']:.3f} "
            f"({verdicts['ms_per_token']['summary']})")

    def peer() -> None:
        if peer_inputs is None:
            raise RuntimeError("this run was given no llama-server to measure (peer_inputs)")
        say("llama-server: llama.cpp build and 2b GGUF artifact (cached; the first build takes 10-20 min)")
        inputs = peer_inputs()
        results["peer"] = measure_peer(inputs, plan, say)

    def levers() -> None:
        results["levers"] = lever_ab(plan, artifact, say)

    def tune() -> None:
        results["tune"] = tune_engines(plan, artifact, peer_inputs, say)

    def tune_load() -> None:
        results["tune_load"] = tune_engines(plan, artifact, peer_inputs, say, clients=plan.tune_clients)

    steps = (("machine", machine), ("baselines", baselines), ("int8", int8), ("int4", int4),
             ("overhead", overhead), ("peer", peer), ("tune", tune), ("tune_load", tune_load), ("levers", levers))
    try:
        for name, fn in steps:
            section(name, fn)
    except KeyboardInterrupt:
        # Ctrl-C or SIGTERM: the servers of the section have been stopped on the way out; keep what was measured.
        results["meta"]["interrupted_in"] = name
        say(f"interrupted in {name}: writing what was measured so far")
        _finish(results, plan, say)
        raise
    return _finish(results, plan, say)


def _first_token_floor(results: dict) -> None:
    """The compute floor of the int4 service's 416x277 first question, once both it and the machine ran."""
    c = targets.dig(results, "machine_limit", "compute")
    svc = targets.dig(results, "service", "int4", "image_416") or {}
    if not c or not svc.get("prompt_tokens") or not svc.get("model_size"):
        return
    width, height = (int(v) for v in svc["model_size"].split("x"))
    flops = compute.FlopModel(**c["flop_model"])
    patches = VisionGrid(**c["vision_grid"]).tokens(width, height) * flops.merge ** 2
    c["first_token"] = compute.first_token_floor(flops, c["peak"]["flops_per_s"], patches, int(svc["prompt_tokens"]))


def _finish(results: dict, plan: Plan, say: Progress) -> dict:
    _first_token_floor(results)
    results["targets"] = [t.as_dict() for t in targets.evaluate(results)]
    results["meta"]["elapsed_s"] = time.monotonic() - say.started
    write(results, plan.out)
    say(f"done in {results['meta']['elapsed_s'] / 60:.1f} min: {plan.out}/bench.json, bench.md and PNGs")
    return results


def measure_peer(inputs: PeerInputs, plan: Plan, say: Callable[[str], None]) -> dict:
    """llama-server on the GGUF artifact, measured like the service's int4 runs: the same 416x277 images (seeds),
    prompt, token count, runs and client; with its build, artifact and the machine it ran on."""
    from ops.machine import describe
    from service.manifest import read_manifest

    manifest = read_manifest(inputs.artifact)
    entry: dict = {"engine": "llama-server", "machine": describe(),
                   "build": {k: inputs.build.get(k) for k in ("version", "flags", "cpu", "build_s", "compiler")},
                   "artifact": {"path": str(inputs.artifact), "artifact_id": manifest["artifact_id"],
                                "weight_format": manifest["weight_format"],
                                "sizes": {name: e["size"] for name, e in manifest["files"].items()}}}
    with llama_server.LlamaServer(inputs.server, inputs.artifact, plan.log_dir / "llama-server.log") as s:
        say(f"llama-server ready after {s.cold_start_s:.1f}s ({s.n_threads} threads, artifact "
            f"{manifest['artifact_id']})")
        entry.update(cold_start_s=s.cold_start_s, threads=s.n_threads,
                     command=[Path(a).name if i == 0 else a for i, a in enumerate(s.command)])
        entry["image_416"] = llama_server.measure(s, plan.runs, plan.tokens, 416, 277, 0, say)
        entry["peak_rss_bytes"] = s.peak_rss()
        entry["memory"] = s.memory()
    say(f"llama-server: first token {entry['image_416']['first_token_s']:.2f}s, "
        f"{entry['image_416']['ms_per_token']:.1f} ms/token, peak RSS {(entry['peak_rss_bytes'] or 0) / 1e9:.2f} GB")
    return entry


def tune_engines(plan: Plan, artifact: Callable[[str], Path], peer_inputs: Callable[[], PeerInputs] | None,
                 say: Callable[[str], None], clients: int = 1) -> dict:
    """`vlfleet tune [--clients N]`'s choice on this machine, made by its own code: the engines it would measure
    (ops.fleet.tune plan), each started alone and timed by the probe a host runs (service.probe latency:
    ``plan.tokens`` tokens, a new image each answer, ``clients`` answers at once), then scored and picked by the same
    functions. The peak is the whole process tree's, as a host reads it over the unit's cgroup (a llama-server child
    included)."""
    from dataclasses import asdict

    from ops.fleet import tune
    from service import probe

    peer, peer_error = None, "the run was given no llama-server (peer_inputs)"
    if peer_inputs is not None:
        try:
            peer = peer_inputs()
        except Exception as e:  # the other engines are still measured; llamacpp is skipped with the reason
            peer_error = f"llama-server or the GGUF artifact could not be built: {type(e).__name__}: {e}"[:300]
    info = {"llama_server": {"path": str(peer.server), "exists": peer.server.is_file(), "model_dir": str(peer.artifact),
                             "model_exists": (peer.artifact / "manifest.json").is_file()} if peer else {}}
    limit, limit_source = tune.budget({})
    candidates, skipped = [], {}
    for engine, skip in tune.plan(None, None, info, clients):
        if engine == "llamacpp" and peer is None:
            skip = peer_error
        if skip:
            skipped[engine] = skip
            say(f"tune: {engine} skipped: {skip}")
            continue
        model, env = artifact("int4"), {"VLFLEET_ENGINE": engine}
        if engine == "llamacpp":
            model, env = peer.artifact, {**env, "VLFLEET_LLAMACPP_SERVER": str(peer.server)}
        with Server(model, plan.log_dir / f"tune-{engine}.log", env) as s:
            runs = probe.latency("127.0.0.1", s.port, plan.tokens, plan.runs, 300.0 * clients, clients=clients)
            c = tune.evaluate(engine, runs, plan.tokens, s.peak_rss()["all"], limit, s.cold_start_s)
        candidates.append(c)
        say(f"tune ({clients} at once): {engine}: {c.score_s} s to a {plan.tokens}-token answer (first token "
            f"{c.first_token_s} s, "
            f"{c.ms_per_token} ms/token), peak RSS {(c.peak_rss_bytes or 0) / 1e9:.2f} GB {c.reason}")
    engine, why = tune.pick(candidates)
    say(f"tune picks {engine}: {why}")
    return {"engine": engine, "why": why, "tokens": plan.tokens, "runs": plan.runs, "clients": clients,
            "budget": limit_source,
            "candidates": {c.engine: {k: v for k, v in asdict(c).items() if k != "engine"} for c in candidates},
            "skipped": skipped}


def _compile_cache() -> str:
    from ops.paths import cache_root

    path = cache_root() / "bench-compile-cache"
    shutil.rmtree(path, ignore_errors=True)  # the first start with it must be a real cold start
    return str(path)


LEVERS: tuple[tuple[str, str, dict[str, str], str], ...] = (
    # (lever, setting, service env, artifact): the artifact names one of the bench's conversions (ops/tasks/bench.py).
    ("baseline", "service defaults", {}, "int4"),
    ("compile cache", "VLFLEET_MODEL_CACHE_DIR, first start (fills it)", {"VLFLEET_MODEL_CACHE_DIR": "{cache}"},
     "int4"),
    ("compile cache", "VLFLEET_MODEL_CACHE_DIR, second start", {"VLFLEET_MODEL_CACHE_DIR": "{cache}"}, "int4"),
    ("threads", "VLFLEET_THREADS=1", {"VLFLEET_THREADS": "1"}, "int4"),
    ("precision", "VLFLEET_PRECISION=f32", {"VLFLEET_PRECISION": "f32"}, "int4"),
    # The language model's own precision: auto is f32 on bf16+VNNI CPUs, so bf16 here is the A/B against it.
    ("precision", "VLFLEET_LM_PRECISION=bf16 (vision encoder on auto)", {"VLFLEET_LM_PRECISION": "bf16"}, "int4"),
    # Dynamic quantisation: auto is groups of 128 on VNNI CPUs, so these are the A/B against it.
    ("dynamic quantisation", "VLFLEET_DQ_GROUP_SIZE=32 (the plugin's default)", {"VLFLEET_DQ_GROUP_SIZE": "32"},
     "int4"),
    ("dynamic quantisation", "VLFLEET_DQ_GROUP_SIZE=0 (off)", {"VLFLEET_DQ_GROUP_SIZE": "0"}, "int4"),
    # The plugin's default KV cache is u8; wider caches cost bandwidth per decoded token but skip its quantisation.
    ("KV cache", "VLFLEET_KV_PRECISION=f16", {"VLFLEET_KV_PRECISION": "f16"}, "int4"),
    ("KV cache", "VLFLEET_KV_PRECISION=f32", {"VLFLEET_KV_PRECISION": "f32"}, "int4"),
    # The int4 conversion's own knobs: one scale per output channel instead of per 128 weights (fewer scales to
    # apply per decoded token), and symmetric groups (no zero points).
    ("weight format", "int4 per channel (--group-size -1)", {}, "int4-channel"),
    ("weight format", "int4 symmetric (--sym, group size 128)", {}, "int4-sym"),
    ("image budget", "VLFLEET_IMAGE_MAX_SIDE=320 (1200x800 image)", {"VLFLEET_IMAGE_MAX_SIDE": "320"}, "int4"),
    ("image budget", "VLFLEET_IMAGE_MAX_SIDE=448 (1200x800 image)", {"VLFLEET_IMAGE_MAX_SIDE": "448"}, "int4"),
    # The defaults again: a machine that slowed down or sped up during the section shows here (stats.lever_defaults).
    ("baseline", "service defaults, again after the others", {}, "int4"),
)


def lever_ab(plan: Plan, artifact: Callable[[str], Path], say: Callable[[str], None]) -> list[dict]:
    """Quick A/B of service settings and int4 conversions: one server per setting, same workload."""
    rows = []
    cache = _compile_cache()
    for name, setting, template, kind in LEVERS:
        env = {k: v.format(cache=cache) for k, v in template.items()}
        size = FULL_SIDE if "1200x800" in setting else (416, 277)
        with Server(artifact(kind), plan.log_dir / f"lever-{len(rows)}.log", env) as s:
            r = _answers(s.url, plan, *size, 700, say, f"lever {setting}")
            rows.append({"name": name, "setting": setting, "artifact": kind, "cold_start_s": s.cold_start_s,
                         "model_size": seen_size(s, *size),
                         "first_token_s": r["first_token_s"], "ms_per_token": r["ms_per_token"],
                         "peak_rss_bytes": s.peak_rss()["worker"], "runs": r["runs"]})
    return rows


def write(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    charts = suite_charts(results, out)
    (out / "bench.md").write_text(render(results, charts))
