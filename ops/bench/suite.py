"""`vlfleet bench`: every measurement of issue 9 in one run, written as results/bench.json, .md and PNGs.

The run is a table of sections (``table``) that ``run`` walks in order. Each section is a top-level function of the
run (``Bench``: the plan, the inputs, what was measured so far) that yields its parts of bench.json as it measures
them. A failure is recorded, not fatal, so one broken part still leaves the rest of the numbers (and what the section
yielded before it failed). What a section depends on is in its row: ``requires`` (sections it needs: added to the
run with it, and it is skipped when one of them failed) and ``server`` (it runs on the int4 service on the default
engine, which the rows with it share). Every answer about a first question uses a fresh image (a different seed,
same size and statistics) so no run is a prefix-cache hit on an earlier one; repeats of the *same* request would
measure caches, not the model.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Set
from dataclasses import asdict, dataclass, field, replace
from functools import partial
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
from ops.bench.bench_md import render
from ops.bench.charts import suite_charts
from ops.bench.server import Server, model_size
from service.engine.prompt_limits import VisionGrid

SECTIONS = ("machine", "baselines", "int8", "int4", "images", "followup", "structured", "concurrency", "overhead",
            "peer", "tune", "tune_load")
EXTRA_SECTIONS = ("levers",)  # only when asked for: A/B of service settings
FOLLOWUP = "What are the main colors, and where are they?"
FULL_SIDE = (1200, 800)
# The structured section's response_format: one string too long to close within max_tokens (random weights would
# close a plain one after a dozen tokens), so every step pays the grammar's mask and the answers are as long as the
# plain ones.
STRUCTURED = {"type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": {
    "type": "object", "properties": {"answer": {"type": "string", "minLength": 4000}}, "required": ["answer"],
    "additionalProperties": False}}}


@dataclass
class Plan:
    sections: tuple[str, ...] = SECTIONS
    runs: int = 5
    baseline_runs: int = 2
    tokens: int = 128  # a typical answer: what `vlfleet tune` scores by default
    clients: tuple[int, ...] = (1, 2, 4, 8)
    rounds: int = 2  # requests per client per concurrency level
    tune_clients: int = 4  # tune_load: `vlfleet tune --clients` as a host whose users come together
    tune_followups: int = 1  # ... each user asking a follow-up about its picture, as chat users do
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


def service_engines() -> tuple[tuple[str, ...], str]:
    """The engines the service runs the int4 (OpenVINO IR) artifact on, and the one it runs by default:
    VLFLEET_ENGINE's choices and default (service.runtime.contract). llamacpp serves GGUF artifacts: the peer and tune
    sections measure it; hybrid runs the IR's vision with the peer's GGUF (engine_env)."""
    from service.runtime.contract import DEFAULT_ENGINE, ENGINES

    return tuple(e for e in ENGINES if e != "llamacpp"), DEFAULT_ENGINE


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


def _structured(url: str, plan: Plan, say: Callable[[str], None]) -> dict:
    """Plain answers and answers constrained to a JSON schema (``STRUCTURED``), in turn about the same images, so
    the one difference between the two is the grammar's cost per step (ms/token)."""
    plain, constrained = [], []
    for i in range(plan.runs):
        turn = workload.user_turn(workload.test_image(seed=700 + i))
        plain.append(workload.chat_stream(url, [turn], plan.tokens).sample)
        constrained.append(workload.chat_stream(url, [turn], plan.tokens, extra={"response_format": STRUCTURED}).sample)
        say(f"structured run {i + 1}/{plan.runs}: plain {plain[-1].ms_per_token:.1f} ms/token, "
            f"json_schema {constrained[-1].ms_per_token:.1f} ms/token ({constrained[-1].tokens} tokens)")
    return {"runs": plan.runs, "plain": workload.summarize(plain), "constrained": workload.summarize(constrained)}


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
    lib: Path | None = None  # the hybrid engine's libvlfleet_llama.so of the same build


@dataclass(frozen=True)
class Bench:
    """What every section is given: the plan, the 2b-shape inputs (each a function that builds it on first use), the
    progress line, the engine the service runs by default, the sections that run (the plan's and what they require)
    and the results so far (sections read them; ``run`` adds what they yield)."""

    plan: Plan
    artifact: Callable[[str], Path]
    checkpoint: Callable[[], Path]
    peer_inputs: Callable[..., PeerInputs] | None  # (output_type=None): see ops/tasks/bench.py
    say: Progress
    default_engine: str
    wanted: frozenset[str]
    results: dict

    def server(self, fmt: str, log: str, env: dict[str, str] | None = None) -> Server:
        self.say(f"starting the service on the {fmt} artifact {env or ''}")
        return Server(self.artifact(fmt), self.plan.log_dir / log, env)


def _int4(part: dict) -> dict:
    """``part`` of the int4 service's entry in bench.json."""
    return {"service": {"int4": part}}


def machine(b: Bench) -> Iterator[dict]:
    """Read bandwidth and the decode floor it sets per weight format, matmul peak, the int4 decode step's parts."""
    bw = bandwidth.measure_bandwidth()
    b.say(f"read bandwidth {bw.one_thread / 1e9:.1f} GB/s one thread, {bw.all_threads / 1e9:.1f} GB/s "
          f"{bw.threads} threads")
    limit: dict = {"bandwidth": bw.as_dict(), "weights": {}, "floor_ms_per_token": {}}
    for fmt in ("int4", "int8"):
        w = bandwidth.artifact_weight_bytes(b.artifact(fmt))
        limit["weights"][fmt] = w.as_dict()
        limit["floor_ms_per_token"][fmt] = bandwidth.floor_ms_per_token(w.total, bw.all_threads)
        b.say(f"{fmt}: {w.total / 1e9:.3f} GB of language-model weights per token -> floor "
              f"{limit['floor_ms_per_token'][fmt]:.1f} ms/token")
    int4 = b.artifact("int4")
    config = json.loads((int4 / "config.json").read_text())
    limit["kv_bytes_per_token"] = bandwidth.kv_bytes_per_token(config, 200 + b.plan.tokens)
    kernels = compute.measure_kernels(config, b.say)
    best = max(kernels, key=lambda k: k.flops_per_s)
    limit["compute"] = {"kernels": [k.as_dict() for k in kernels], "peak": best.as_dict(),
                        "repeats": compute.REPEATS, "flop_model": asdict(compute.FlopModel.of_config(config)),
                        "vision_grid": asdict(VisionGrid.of_model(int4))}
    decode = decode_profile.profile_decode(int4, decode_profile.service_lm_properties(int4))
    rates = decode.stream_rates(limit["weights"]["int4"])
    limit["decode"] = decode.as_dict() | {"stream_bytes_per_s": rates}
    b.say(f"int4 decode step in process: {decode.ms_per_token:.1f} ms; weights stream at "
          + ", ".join(f"{rate / 1e9:.1f} GB/s ({part})" for part, rate in rates.items()))
    yield {"machine_limit": limit}


def baselines(b: Bench) -> Iterator[dict]:
    """transformers fp32 and bf16 on the checkpoint, each in a subprocess."""
    for dtype in ("fp32", "bf16"):
        b.say(f"transformers {dtype}: subprocess, {b.plan.baseline_runs} runs after a warm-up")
        r = baseline.run_subprocess(b.checkpoint(), dtype, b.plan.tokens, b.plan.baseline_runs)
        yield {"baselines": {dtype: r}}
        b.say(f"transformers {dtype}: first token {r['first_token_s']:.2f}s, {r['ms_per_token']:.1f} ms/token, "
              f"peak RSS {r['peak_rss_bytes'] / 1e9:.2f} GB")


def int8(b: Bench) -> Iterator[dict]:
    with b.server("int8", "int8.log") as s:
        b.say(f"int8 ready after {s.cold_start_s:.1f}s")
        entry = {"cold_start_s": s.cold_start_s, "image_416": _answers(s.url, b.plan, 416, 277, 0, b.say, "int8")}
        entry["peak_rss_bytes"] = s.peak_rss()["worker"]
        entry["memory"] = s.memory()
    yield {"service": {"int8": entry}}


def int4(b: Bench, s: Server) -> Iterator[dict]:
    """The int4 service on the default engine: its cold start and single answers (the rows after it reuse it)."""
    b.say(f"int4 ready after {s.cold_start_s:.1f}s")
    yield _int4({"engine": b.default_engine, "cold_start_s": s.cold_start_s})
    r = _answers(s.url, b.plan, 416, 277, 0, b.say, "int4 416x277")
    yield _int4({"image_416": {**r, "model_size": seen_size(s, 416, 277)}})


def images(b: Bench, s: Server) -> Iterator[dict]:
    """The 416x277 answers (the int4 section's), a 1200x800 image downscaled, and at each image_url.detail."""
    yield _int4({"images": {"416x277": {**b.results["service"]["int4"]["image_416"], "downscale": "on",
                                        "sent_size": "416x277", "model_size": seen_size(s, 416, 277)}}})
    w, h = FULL_SIDE
    r = _answers(s.url, b.plan, w, h, 500, b.say, f"int4 {w}x{h} downscaled")
    yield _int4({"images": {f"{w}x{h}": {**r, "downscale": "on", "sent_size": f"{w}x{h}",
                                         "model_size": seen_size(s, w, h)}}})
    for detail in ("low", "high"):  # the client's choice of budget (image_url.detail), same image size
        r = _answers(s.url, b.plan, w, h, 600, b.say, f"int4 {w}x{h} detail {detail}", detail)
        yield _int4({"images": {f"{w}x{h} detail {detail}": {**r, "downscale": "on", "sent_size": f"{w}x{h}",
                                                             "detail": detail,
                                                             "model_size": seen_size(s, w, h, detail)}}})


def followup(b: Bench, s: Server) -> Iterator[dict]:
    yield _int4({"followup": _followup(s.url, b.plan, b.say)})


def structured(b: Bench, s: Server) -> Iterator[dict]:
    yield _int4({"structured": _structured(s.url, b.plan, b.say)})


def int4_memory(b: Bench, s: Server) -> Iterator[dict]:
    """Where the int4 service's RSS is after the single answers: anonymous (plugin buffers) vs file-backed (mmap)."""
    peak, memory = s.peak_rss()["worker"], s.memory()
    yield _int4({"peak_rss_bytes": peak, "memory": memory})
    b.say(f"int4 peak RSS (worker VmHWM) {peak / 1e9:.2f} GB; now {memory}")


def concurrency_default(b: Bench, s: Server) -> Iterator[dict]:
    yield {"concurrency": {b.default_engine: _concurrency(s.url, b.plan, b.say, b.default_engine)}}


def int4_peak_after_concurrency(b: Bench, s: Server) -> Iterator[dict]:
    yield _int4({"peak_rss_after_concurrency_bytes": s.peak_rss()["worker"]})


def images_full_size(b: Bench) -> Iterator[dict]:
    """The 1200x800 image with the service's downscaling off (its own service: VLFLEET_IMAGE_MAX_SIDE=0)."""
    w, h = FULL_SIDE
    with b.server("int4", "int4-full.log", {"VLFLEET_IMAGE_MAX_SIDE": "0"}) as s:
        r = _answers(s.url, b.plan, w, h, 500, b.say, f"int4 {w}x{h} full size")
        size = seen_size(s, w, h)
    yield _int4({"images": {f"{w}x{h} (no downscale)": {**r, "downscale": "off", "sent_size": f"{w}x{h}",
                                                        "model_size": size}}})


def other_engine(b: Bench, engine: str) -> Iterator[dict]:
    """The same int4 artifact on another engine: single answers, then the follow-up, structured and concurrency
    sections that were asked for."""
    key = f"int4_{engine}"
    with b.server("int4", f"int4-{engine}.log", {"VLFLEET_ENGINE": engine, **engine_env(b, engine)}) as s:
        yield {"service": {key: {"engine": engine, "cold_start_s": s.cold_start_s,
                                 "image_416": _answers(s.url, b.plan, 416, 277, 0, b.say, f"int4 {engine} 416x277")}}}
        if "followup" in b.wanted:
            yield {"service": {key: {"followup": _followup(s.url, b.plan, b.say)}}}
        if "structured" in b.wanted:
            yield {"service": {key: {"structured": _structured(s.url, b.plan, b.say)}}}
        # hybrid's language model is a child process of the worker: its memory counts too
        peak = s.peak_rss()["all" if engine == "hybrid" else "worker"]
        yield {"service": {key: {"peak_rss_bytes": peak}}}
        if "concurrency" in b.wanted:
            yield {"concurrency": {engine: _concurrency(s.url, b.plan, b.say, engine)}}


def engine_env(b: Bench, engine: str) -> dict[str, str]:
    """What an engine needs beside the int4 IR: the hybrid engine, the peer's GGUF artifact and shim."""
    if engine != "hybrid":
        return {}
    if b.peer_inputs is None:
        raise RuntimeError("the hybrid engine needs the peer's GGUF artifact and llama.cpp build (peer_inputs)")
    return hybrid_env(b.peer_inputs())


def hybrid_env(inputs: PeerInputs) -> dict[str, str]:
    return {"VLFLEET_LLAMACPP_MODEL_DIR": str(inputs.artifact), "VLFLEET_LLAMACPP_LIB": str(inputs.lib)}


def overhead(b: Bench) -> Iterator[dict]:
    result = service_overhead.measure(b.artifact("int4"), b.plan.runs, b.plan.tokens)
    yield {"overhead": result}
    verdicts = result["comparison"]
    b.say(f"HTTP+SSE / in-process: first token x{result['first_token_s_ratio']:.3f} "
          f"({verdicts['first_token_s']['summary']}), ms/token x{result['ms_per_token_ratio']:.3f} "
          f"({verdicts['ms_per_token']['summary']})")


def peer(b: Bench) -> Iterator[dict]:
    """llama-server's smoke (load and one token), then its measurements: a build that crashes on the 2b shape is
    recorded with how it died (bench.json's peer.smoke, the report's peer section), not a traceback or a hang."""
    if b.peer_inputs is None:
        raise RuntimeError("this run was given no llama-server to measure (peer_inputs)")
    b.say("llama-server: llama.cpp build and 2b GGUF artifact (cached; the first build takes 10-20 min)")
    inputs = b.peer_inputs()
    smoke = peer_smoke(inputs, b.plan.log_dir, b.say)
    if not smoke["ok"]:
        yield {"peer": {**peer_entry(inputs), "smoke": smoke}}
        raise RuntimeError(llama_server.headline(smoke))
    yield {"peer": {**measure_peer(inputs, b.plan, b.say), "smoke": smoke}}


def llama_steps(b: Bench) -> Iterator[dict]:
    """The hybrid engine's decode step by the sequences in it, on the peer's build and GGUF (ops.bench.llama_steps)."""
    from ops.bench import llama_steps as steps
    from service.engine.llamacpp_child import gguf_files

    inputs = b.peer_inputs() if b.peer_inputs is not None and "hybrid" in b.plan.engines else None
    if inputs is None or inputs.lib is None:  # a peer given without the hybrid engine's library
        return
    result = steps.run_subprocess(inputs.lib, gguf_files(inputs.artifact).language_model)
    b.say("llama.cpp decode step by sequences: " + ", ".join(
        f"{r['sequences']}{' padded' if r['padded'] else ''} {r['ms_per_step']:.1f} ms" for r in result["rows"]))
    yield {"llama_steps": result}


def paged_steps(b: Bench) -> Iterator[dict]:
    """The paged engine's decode step by the sequences in it, on the int4 artifact (ops.bench.paged_steps)."""
    from ops.bench import paged_steps as steps

    if "paged" not in b.plan.engines:
        return
    result = steps.run_subprocess(b.artifact("int4"))
    b.say("paged decode step by sequences: " + ", ".join(
        f"{r['sequences']} {r['ms_per_step']:.1f} ms" for r in result["rows"]))
    yield {"paged_steps": result}


def tune(b: Bench) -> Iterator[dict]:
    yield {"tune": tune_engines(b.plan, b.artifact, b.peer_inputs, b.say)}


def tune_load(b: Bench) -> Iterator[dict]:
    yield {"tune_load": tune_engines(b.plan, b.artifact, b.peer_inputs, b.say, clients=b.plan.tune_clients,
                                     followups=b.plan.tune_followups)}


def levers(b: Bench) -> Iterator[dict]:
    # llama.cpp's rows need a build of it, which a run without the hybrid engine does not ask for
    peer = b.peer_inputs if "hybrid" in b.plan.engines else None
    rows, failed = lever_ab(b.plan, b.artifact, b.say, peer)
    yield {"levers": rows, **({"levers_failed": failed} if failed else {})}


@dataclass(frozen=True)
class Section:
    """One row of the run. ``measure`` runs when ``name`` (or one of ``when``, if given) is among the sections that
    run, unless a section of ``requires`` failed; its failure is recorded under ``name``. ``requires`` also adds
    those sections to the run. A ``server`` row is given the int4 service on the default engine: started for the
    first such row (as part of it), stopped before the next row without it."""

    name: str
    measure: Callable[..., Iterator[dict]]
    requires: tuple[str, ...] = ()
    when: tuple[str, ...] = ()
    server: bool = False

    def selected(self, wanted: Set[str]) -> bool:
        return not wanted.isdisjoint(self.when or (self.name,))


def table(engines: tuple[str, ...], default_engine: str) -> tuple[Section, ...]:
    """The run's rows in order: images, followup and concurrency on the int4 service the int4 section starts, then
    the images without downscaling on a service of their own, and one row per other engine for followup and
    concurrency."""
    on_int4 = {"requires": ("int4",), "server": True}
    return (
        Section("machine", machine),
        Section("baselines", baselines),
        Section("int8", int8),
        Section("int4", int4, server=True),
        Section("images", images, **on_int4),
        Section("followup", followup, **on_int4),
        Section("structured", structured, **on_int4),
        Section("int4", int4_memory, **on_int4),
        Section("concurrency", concurrency_default, **on_int4),
        Section("int4", int4_peak_after_concurrency, when=("concurrency",), **on_int4),
        Section("images", images_full_size, requires=("int4",)),
        *(Section(f"engine {engine}", partial(other_engine, engine=engine), requires=("int4",),
                  when=("followup", "structured", "concurrency")) for engine in engines if engine != default_engine),
        Section("concurrency", paged_steps),  # what the 4-client ceiling of the paged engine takes its step from
        Section("overhead", overhead),
        Section("peer", peer),
        Section("peer", llama_steps, requires=("peer",)),  # not after a peer that crashed
        Section("tune", tune),
        Section("tune_load", tune_load),
        Section("levers", levers),
    )


def expand(rows: tuple[Section, ...], asked: tuple[str, ...]) -> frozenset[str]:
    """The sections that run: those ``asked`` for and every section a row that runs requires."""
    wanted = set(asked)
    while more := {r for row in rows if row.selected(wanted) for r in row.requires} - wanted:
        wanted |= more
    return frozenset(wanted)


def _merge(into: dict, part: dict) -> None:
    """``part`` of bench.json into ``into``: dicts merged key by key, anything else replaced."""
    for key, value in part.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


@contextlib.contextmanager
def _recorded(name: str, b: Bench) -> Iterator[None]:
    """A failure inside is recorded under ``name`` in the results, and the run goes on; Ctrl-C goes up."""
    try:
        yield
    except Exception as e:
        b.results["errors"][name] = f"{type(e).__name__}: {e}"[:400] + raised_at(e)
        b.say(f"{name} FAILED: {b.results['errors'][name]}")


def raised_at(e: BaseException) -> str:
    """`` (at file:line in function)`` of the frame that raised ``e``: a bare "TimeoutError: timed out" names no
    culprit, and the run goes on past it."""
    frames = traceback.extract_tb(e.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" (at {Path(last.filename).name}:{last.lineno} in {last.name})"


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
                              "engines": list(plan.engines), "default_engine": default_engine},
                     "service": {}, "errors": {}}
    rows = table(plan.engines, default_engine)
    b = Bench(plan, artifact, checkpoint, peer_inputs, say, default_engine, expand(rows, plan.sections), results)
    current = None
    try:
        with contextlib.ExitStack() as int4_service:
            server = None
            for row in rows:
                if server is not None and not row.server:
                    with _recorded("int4", b):
                        int4_service.close()
                    server = None
                if not row.selected(b.wanted) or not results["errors"].keys().isdisjoint(row.requires):
                    continue
                if row.name != current:
                    say(f"== {row.name}")
                current = row.name
                with _recorded(row.name, b):
                    if row.server and server is None:
                        server = int4_service.enter_context(b.server("int4", "int4.log"))
                    with contextlib.closing(row.measure(b, server) if row.server else row.measure(b)) as parts:
                        for part in parts:
                            _merge(results, part)
    except KeyboardInterrupt:
        # Ctrl-C or SIGTERM: the servers of the section have been stopped on the way out; keep what was measured.
        results["meta"]["interrupted_in"] = current
        say(f"interrupted in {current}: writing what was measured so far")
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


def peer_entry(inputs: PeerInputs) -> dict:
    """What the peer is: its build, artifact and the machine it runs on."""
    from ops.llamacpp import source
    from ops.machine import describe
    from service.runtime.manifest import read_manifest

    manifest = read_manifest(inputs.artifact)
    build = {k: inputs.build.get(k) for k in ("version", "flags", "cpu", "build_s", "compiler")}
    if inputs.build.get("patches") == source.patches_key():  # the build's tree carries this tree's patches
        build["patch_names"] = [patch.name for patch in source.patches()]
    return {"engine": "llama-server", "machine": describe(), "build": build,
            "artifact": {"path": str(inputs.artifact), "artifact_id": manifest["artifact_id"],
                         "weight_format": manifest["weight_format"],
                         "sizes": {name: e["size"] for name, e in manifest["files"].items()}}}


_SMOKES: dict[tuple[str, str], dict] = {}  # one smoke per llama-server and artifact in a run (peer, tune, tune_load)


def peer_smoke(inputs: PeerInputs, log_dir: Path, say: Callable[[str], None]) -> dict:
    """``llama_server.smoke`` of the peer's build on its artifact, once per run: its result, or the failure's
    (SmokeError.as_dict: stage, how it died, the message)."""
    key = (str(inputs.server), str(inputs.artifact))
    if key not in _SMOKES:
        try:
            _SMOKES[key] = llama_server.smoke(inputs.server, inputs.artifact, log_dir / "llama-server-smoke.log")
            say(f"llama-server smoke: loaded in {_SMOKES[key]['load_s']:.1f}s, one token after "
                f"{_SMOKES[key]['first_token_s']:.2f}s (buffers {', '.join(_SMOKES[key].get('buffers') or ['?'])})")
        except llama_server.SmokeError as e:
            _SMOKES[key] = e.as_dict()
            say(f"llama-server smoke FAILED: {e.headline()}")
    return _SMOKES[key]


def measure_peer(inputs: PeerInputs, plan: Plan, say: Callable[[str], None]) -> dict:
    """llama-server on the GGUF artifact, measured like the service's int4 runs: the same 416x277 images (seeds),
    prompt, token count, runs and client; with its build, artifact and the machine it ran on."""
    entry = peer_entry(inputs)
    with llama_server.LlamaServer(inputs.server, inputs.artifact, plan.log_dir / "llama-server.log") as s:
        say(f"llama-server ready after {s.cold_start_s:.1f}s ({s.n_threads} threads, artifact "
            f"{entry['artifact']['artifact_id']})")
        entry.update(cold_start_s=s.cold_start_s, threads=s.n_threads,
                     command=[Path(a).name if i == 0 else a for i, a in enumerate(s.command)])
        entry["image_416"] = llama_server.measure(s, plan.runs, plan.tokens, 416, 277, 0, say)
        entry["peak_rss_bytes"] = s.peak_rss()
        entry["memory"] = s.memory()
    say(f"llama-server: first token {entry['image_416']['first_token_s']:.2f}s, "
        f"{entry['image_416']['ms_per_token']:.1f} ms/token, peak RSS {(entry['peak_rss_bytes'] or 0) / 1e9:.2f} GB")
    return entry


def tune_engines(plan: Plan, artifact: Callable[[str], Path], peer_inputs: Callable[[], PeerInputs] | None,
                 say: Callable[[str], None], clients: int = 1, followups: int = 0) -> dict:
    """`vlfleet tune [--clients N] [--followups K]`'s choice on this machine, made by its own code: the engines it
    would measure (ops.fleet.tune plan), each started alone and timed by the probe a host runs (the host program's
    latency probe: ``plan.tokens`` tokens, a new image each first question, ``clients`` conversations at once, each
    with ``followups`` follow-ups), then scored and picked by the same functions. The peak is the whole process
    tree's, as a host reads it over the unit's cgroup (a llama-server child included)."""
    from dataclasses import asdict

    from ops.fleet import tune
    from ops.host import probe
    from service.runtime.manifest import is_gguf_artifact

    peer, peer_error = None, "the run was given no llama-server (peer_inputs)"
    if peer_inputs is not None:
        try:
            peer = peer_inputs()
        except Exception as e:  # the other engines are still measured; llamacpp is skipped with the reason
            peer_error = f"llama-server or the GGUF artifact could not be built: {type(e).__name__}: {e}"[:300]
    crashed = None  # measured only when its runtime runs the 2b shape; else a failed candidate, with how it died
    if peer is not None and not (smoke := peer_smoke(peer, plan.log_dir, say))["ok"]:
        crashed = tune.Candidate("llamacpp", tune.FAILED, reason=llama_server.headline(smoke)[:500])
    info = {"llama_server": {"path": str(peer.server), "exists": peer.server.is_file(), "model_dir": str(peer.artifact),
                             "model_exists": is_gguf_artifact(peer.artifact)} if peer else {}}
    limit, limit_source = tune.budget({})
    candidates, skipped = [], {}
    for engine, skip in tune.plan(None, None, info, clients):
        if engine in tune.LLAMACPP_RUNTIME and peer is None:
            skip = peer_error
        if skip:
            skipped[engine] = skip
            say(f"tune: {engine} skipped: {skip}")
            continue
        if engine in tune.LLAMACPP_RUNTIME and crashed is not None:  # the same libllama, the same kernels
            candidates.append(replace(crashed, engine=engine))
            say(f"tune: {engine} failed: {crashed.reason}")
            continue
        model, env = artifact("int4"), {"VLFLEET_ENGINE": engine}
        if engine == "llamacpp":
            model, env = peer.artifact, {**env, "VLFLEET_LLAMACPP_SERVER": str(peer.server)}
        elif engine == "hybrid":
            env = {**env, **hybrid_env(peer)}
        with Server(model, plan.log_dir / f"tune-{engine}.log", env) as s:
            runs = probe.latency("127.0.0.1", s.port, plan.tokens, plan.runs, 300.0 * clients, clients=clients,
                                 followups=followups)
            c = tune.evaluate(engine, runs, plan.tokens, s.peak_rss()["all"], limit, s.cold_start_s)
        candidates.append(c)
        followup = f", follow-ups' {c.followup_first_token_s} s" if followups else ""
        say(f"tune ({clients} at once, {followups} follow-ups): {engine}: {c.score_s} s to a {plan.tokens}-token "
            f"answer (first token {c.first_token_s} s{followup}, {c.ms_per_token} ms/token), peak RSS "
            f"{(c.peak_rss_bytes or 0) / 1e9:.2f} GB {c.reason}")
    engine, why = tune.pick(candidates)
    say(f"tune picks {engine}: {why}")
    return {"engine": engine, "why": why, "tokens": plan.tokens, "runs": plan.runs, "clients": clients,
            "followups": followups, "budget": limit_source,
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
    # The vision encoder's int8 weights unpacked once at load: the image encode on plain matmul kernels.
    ("vision weights", "VLFLEET_VISION_WEIGHTS=decompressed", {"VLFLEET_VISION_WEIGHTS": "decompressed"}, "int4"),
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


# llama.cpp's vocabulary projection, read whole by every decoded token (the hybrid engine's decode): llama-quantize
# keeps it at Q6_K, which ggml's CPU backend does not repack on x86; Q4_K it repacks, at less precision
# (ops.llamacpp.gguf.OUTPUT_TYPES). (setting, output tensor type for peer_inputs)
GGUF_LEVERS: tuple[tuple[str, str | None], ...] = (
    ("hybrid engine, GGUF output tensor Q6_K (llama-quantize's default)", None),
    ("hybrid engine, GGUF output tensor Q4_K (repacked on x86)", "Q4_K"),
)


@dataclass(frozen=True)
class Lever:
    name: str
    setting: str
    kind: str  # what it runs on: one of the bench's conversions, or that and a GGUF artifact
    model: Callable[[], Path]
    env: Callable[[], dict[str, str]]
    rss: str = "worker"  # Server.peak_rss()'s key: "all" where the engine has a child process


def levers_to_run(artifact: Callable[[str], Path], peer_inputs: Callable[..., PeerInputs] | None,
                  cache: str) -> list[Lever]:
    """LEVERS, with GGUF_LEVERS before the defaults' second run when there is a llama.cpp build (peer_inputs)."""
    def ir(kind: str, template: dict[str, str]) -> tuple[Callable[[], Path], Callable[[], dict[str, str]]]:
        return (lambda: artifact(kind)), (lambda: {k: v.format(cache=cache) for k, v in template.items()})

    out = [Lever(name, setting, kind, *ir(kind, template)) for name, setting, template, kind in LEVERS]
    if peer_inputs is None:
        return out
    gguf = [Lever("GGUF output tensor", setting, f"int4 + GGUF {output or 'Q6_K'} output", lambda: artifact("int4"),
                  lambda output=output: {"VLFLEET_ENGINE": "hybrid", **hybrid_env(peer_inputs(output))}, "all")
            for setting, output in GGUF_LEVERS]
    return out[:-1] + gguf + out[-1:]


def lever_ab(plan: Plan, artifact: Callable[[str], Path], say: Callable[[str], None],
             peer_inputs: Callable[..., PeerInputs] | None = None) -> tuple[list[dict], list[dict]]:
    """Quick A/B of service settings, int4 conversions and (with peer_inputs) the hybrid engine's GGUF: one server
    per setting, same workload. (rows, failed): a setting that fails (an engine that does not start) costs its own
    row, not the ones measured around it."""
    rows, failed = [], []
    for i, lever in enumerate(levers_to_run(artifact, peer_inputs, _compile_cache())):
        size, log = FULL_SIDE if "1200x800" in lever.setting else (416, 277), plan.log_dir / f"lever-{i}.log"
        try:
            with Server(lever.model(), log, lever.env()) as s:
                r = _answers(s.url, plan, *size, 700, say, f"lever {lever.setting}")
                rows.append({"name": lever.name, "setting": lever.setting, "artifact": lever.kind,
                             "cold_start_s": s.cold_start_s, "model_size": seen_size(s, *size),
                             "first_token_s": r["first_token_s"], "ms_per_token": r["ms_per_token"],
                             "peak_rss_bytes": s.peak_rss()[lever.rss], "runs": r["runs"]})
        except Exception as e:
            failed.append({"setting": lever.setting, "error": f"{type(e).__name__}: {e}"[:300], "log": str(log)})
            say(f"lever {lever.setting} FAILED: {failed[-1]['error']}")
    return rows, failed


def write(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    charts = suite_charts(results, out)
    (out / "bench.md").write_text(render(results, charts))
