"""Issue 9's targets, evaluated on one run's results: measured value, threshold, met or not.

Ratios are taken between numbers of the same run. A target whose inputs were not measured in this run
(``--only`` subset, a failed section) is reported as not evaluated, never as met. The llama-server targets compare
with the ``peer`` section of the same run (llama-server measured on the same checkpoint, image, prompt, token count
and client); there are no peer numbers from elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ops.bench.stats import TOLERANCE, compare, ratio, within

PEER_MISSING = "peer not measured in this run"


@dataclass
class Target:
    id: str
    name: str
    measured: float | None
    threshold: float
    unit: str  # "x" for ratios, else the unit of the absolute value
    higher_is_better: bool = False
    detail: str = ""
    tolerance: float | None = None  # two-sided: met when |measured - threshold| <= tolerance

    @property
    def met(self) -> bool | None:
        if self.measured is None:
            return None
        if self.tolerance is not None:
            return within(self.measured, self.threshold, self.tolerance)
        return self.measured >= self.threshold if self.higher_is_better else self.measured <= self.threshold

    def as_dict(self) -> dict:
        return {**asdict(self), "met": self.met}


def dig(results: dict, *path: str | int) -> Any:
    """results[path[0]][path[1]]..., or None where any step is missing."""
    node: Any = results
    for key in path:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def _level(levels: list[dict] | None, clients: int) -> dict | None:
    return next((lv for lv in levels or [] if lv.get("clients") == clients), None)


def throughput_ceiling(one: dict, clients: int, step_ratio: float = 1.0) -> float | None:
    """The most ``clients`` answers at once can gain over one at a time on this machine, from the one-client level:
    each first token (image encoding and prefill) takes every core, so they run one after another, while the
    decode steps after them are shared, each costing ``step_ratio`` times one answer's step (1: the best case of
    batching). One answer takes A seconds, P of them to its first token: N answers take at least
    N*P + (A - P) * step_ratio."""
    if not one.get("requests") or not one.get("first_token_p50_s"):
        return None
    answer, first = one["wall_s"] / one["requests"], one["first_token_p50_s"]
    return clients * answer / (clients * first + max(answer - first, 0.0) * step_ratio)


STEP_TABLES = {"paged": "paged_steps", "hybrid": "llama_steps"}  # each batching engine's measured step sizes


def step_ratio(results: dict, engine: str, sequences: int) -> float | None:
    """The engine's decode step of ``sequences`` over its step of one, from this run's step table (unpadded)."""
    rows = dig(results, STEP_TABLES.get(engine, ""), "rows") or []
    ms = {r["sequences"]: r["ms_per_step"] for r in rows if not r.get("padded")}
    return ms[sequences] / ms[1] if sequences in ms and ms.get(1) else None


def _either_way(measured: float | None) -> str:
    """Which side of a two-sided HTTP+SSE / in-process ratio is slower, for the target's note."""
    return compare(measured, "HTTP+SSE", "in-process")["summary"] if measured is not None and measured > 0 else ""


def _p95_vs_one(engine: str, four: dict, one: dict) -> Target:
    """4 clients' p95 first token against one client's p95 (like with like); one client's p50 only when its p95
    was not recorded, and then the name says so."""
    base, label = one.get("first_token_p95_s"), "p95"
    if base is None and one.get("first_token_p50_s") is not None:
        base, label = one["first_token_p50_s"], "p50 (its p95 not recorded)"
    first = one.get("first_token_p50_s")
    # the last of 4 first questions asked together waits for the 3 first tokens before its own (each on every core)
    floor = f"floor on this machine {4 * first / base:.2f}x (4 first tokens one after another)" if first and base \
        else ""
    return Target(f"c4-p95-{engine}", f"4 clients ({engine} engine): p95 first token / one client's {label}",
                  ratio(four.get("first_token_p95_s"), base), 3.0, "x", detail=floor)


def _vs_peer(id_: str, name: str, service: float | None, peer: float | None, fmt: Callable[[float], str]) -> Target:
    """service / llama-server of the same run, met at <= 1 (the service at least as fast or as small)."""
    if peer is None:
        detail = PEER_MISSING
    elif service is None:
        detail = f"llama-server {fmt(peer)}; the service's value was not measured in this run"
    else:
        detail = f"service {fmt(service)}, llama-server {fmt(peer)}"
    return Target(id_, name, ratio(service, peer), 1.0, "x", detail=detail)


def peer_targets(results: dict) -> list[Target]:
    svc = dig(results, "service", "int4", "image_416") or {}
    peer = dig(results, "peer", "image_416") or {}
    return [
        _vs_peer("peer-first", "first token, int4 service / llama-server (same run)", svc.get("first_token_s"),
                 peer.get("first_token_s"), lambda v: f"{v:.2f} s"),
        _vs_peer("peer-tpot", "ms per token, int4 service / llama-server (same run)", svc.get("ms_per_token"),
                 peer.get("ms_per_token"), lambda v: f"{v:.1f} ms"),
        _vs_peer("peer-rss", "peak RSS, int4 service / llama-server (same run)",
                 dig(results, "service", "int4", "peak_rss_bytes"), dig(results, "peer", "peak_rss_bytes"),
                 lambda v: f"{v / 1e9:.2f} GB"),
    ]


def answer_rivals(results: dict) -> dict[str, float | None]:
    """Time to the complete answer of llama-server and of the bare OpenVINO pipeline (the overhead section's
    in-process side), where they were measured in this run with as many tokens as the tune section."""
    tokens = dig(results, "tune", "tokens")
    out = {}
    for name, summ in (("llama-server", dig(results, "peer", "image_416")),
                       ("bare OpenVINO pipeline", dig(results, "overhead", "in_process"))):
        out[name] = summ.get("total_s") if summ and summ.get("tokens") == tokens else None
    return out


def tune_targets(results: dict) -> list[Target]:
    """The service on the engine `vlfleet tune` picks on this machine, against the best alternative of the run."""
    tune = results.get("tune") or {}
    engine = tune.get("engine")
    chosen = (tune.get("candidates") or {}).get(engine or "") or {}
    rivals = answer_rivals(results)
    missing = [name for name, v in rivals.items() if v is None]
    best = None if missing else min(rivals.values())
    if not tune:
        detail = "tune not measured in this run"
    elif missing:
        detail = f"not measured in this run with {tune.get('tokens')} tokens: {', '.join(missing)}"
    else:
        detail = f"{engine} {chosen.get('score_s')} s; " + ", ".join(f"{k} {v:.2f} s" for k, v in rivals.items())
    peer_rss = dig(results, "peer", "peak_rss_bytes")
    return [
        Target("tune-answer", f"time to a complete {tune.get('tokens', '?')}-token answer, the service on tune's "
               "engine / the better of llama-server and the bare OpenVINO pipeline (same run)",
               ratio(chosen.get("score_s"), best), 0.9, "x", detail=detail),
        Target("tune-rss", "peak RSS, the service on tune's engine (all its processes) / llama-server (same run)",
               ratio(chosen.get("peak_rss_bytes"), peer_rss), 1.0, "x",
               detail=PEER_MISSING if peer_rss is None else f"engine {engine}"),
    ]


def first_token_floor_note(results: dict, baseline_s: float | None) -> str:
    """The first token's compute floor (ops.bench.compute), as a ratio to ``baseline_s`` when given: a target
    below it cannot be met on this CPU by any engine built on the same kernels."""
    floor = dig(results, "machine_limit", "compute", "first_token", "seconds")
    if not floor:
        return ""
    vs = ratio(floor, baseline_s)
    return f"compute floor on this machine {floor:.2f} s" + (f" = {vs:.2f}x" if vs is not None else "")


def decode_note(results: dict) -> str:
    """How fast the decoder layers' int4 weights stream in process (ops.bench.decode_profile), against the read
    bandwidth the floor assumes: the kernel's share of the gap."""
    rate = dig(results, "machine_limit", "decode", "stream_bytes_per_s", "matmuls")
    bus = dig(results, "machine_limit", "bandwidth", "all_threads")
    if not rate or not bus:
        return ""
    return f"in process the decoder's int4 matmuls stream their weights at {rate / 1e9:.1f} GB/s = {rate / bus:.2f}x " \
           "the read bandwidth"


def evaluate(results: dict) -> list[Target]:
    svc = dig(results, "service", "int4", "image_416") or {}
    first = svc.get("first_token_s")
    ms = svc.get("ms_per_token")
    rss = dig(results, "service", "int4", "peak_rss_bytes")
    fp32, bf16 = dig(results, "baselines", "fp32") or {}, dig(results, "baselines", "bf16") or {}
    floor = dig(results, "machine_limit", "floor_ms_per_token", "int4")
    followup = dig(results, "service", "int4", "followup") or {}
    overhead = dig(results, "overhead") or {}

    fp32_first, bf16_first = fp32.get("first_token_s"), bf16.get("first_token_s")
    targets = [
        Target("first-vs-fp32", "first token, int4 / transformers fp32", ratio(first, fp32_first), 0.20, "x",
               detail=first_token_floor_note(results, fp32_first)),
        Target("first-vs-bf16", "first token, int4 / transformers bf16", ratio(first, bf16_first), 0.45, "x",
               detail=first_token_floor_note(results, bf16_first)),
        Target("first-abs", "first token, int4 service (absolute, this machine)", first, 1.2, "s",
               detail=first_token_floor_note(results, None)),
        Target("tpot-vs-floor", "ms per token, int4 service / bandwidth floor", ratio(ms, floor), 1.15, "x",
               detail="; ".join(filter(None, [f"floor {floor:.1f} ms/token" if floor else "", decode_note(results)]))),
        Target("rss-vs-fp32", "server peak RSS, int4 / transformers fp32", ratio(rss, fp32.get("peak_rss_bytes")),
               0.30, "x"),
        Target("followup", "follow-up first token / first question's",
               ratio(followup.get("followup_first_token_s"), followup.get("first_first_token_s")), 0.35, "x"),
        # Issue 30: the default engine's own image path must not cost the first token over genai's pipeline.
        Target("first-vs-serial", "first token, the default engine / the serial engine (same run)",
               ratio(first, dig(results, "service", "int4_serial", "image_416", "first_token_s")), 1.05, "x"),
    ]
    for key, entry in (results.get("service") or {}).items():
        fu = entry.get("followup") if key.startswith("int4_") else None
        if fu:
            targets.append(Target(f"followup-{entry['engine']}",
                                  f"follow-up first token / first question's ({entry['engine']} engine)",
                                  ratio(fu.get("followup_first_token_s"), fu.get("first_first_token_s")), 0.35, "x"))
    for key, entry in (results.get("service") or {}).items():
        st, engine = entry.get("structured") if key.startswith("int4") else None, entry.get("engine") or "serial"
        if st:
            cost = ratio(dig(st, "constrained", "ms_per_token"), dig(st, "plain", "ms_per_token"))
            targets.append(Target(f"structured-{engine}", f"ms per token, json_schema / plain ({engine} engine)",
                                  cost, 1.10, "x"))
    conc = dig(results, "concurrency") or {}
    # The fastest single client of any engine: an engine slow alone must not look good by its own ratio only.
    best_one = max((lv["tokens_per_s"] for levels in conc.values() if (lv := _level(levels, 1))), default=None)
    for engine, levels in conc.items():
        one, four = _level(levels, 1), _level(levels, 4)
        if one is None or four is None:
            continue
        vs_best, ceiling = ratio(four["tokens_per_s"], best_one), throughput_ceiling(one, 4)
        notes = ([f"{vs_best:.2f}x the fastest engine's one client"] if vs_best is not None else []) + (
            [f"ceiling on this machine {ceiling:.2f}x (4 first tokens one after another, each on every core)"]
            if ceiling is not None else [])
        step = step_ratio(results, engine, 4)
        if ceiling is not None and step is not None:
            notes.append(f"{throughput_ceiling(one, 4, step):.2f}x with this engine's 4-sequence decode step "
                         f"({step:.2f}x one's, this run)")
        targets += [
            Target(f"c4-throughput-{engine}", f"4 clients ({engine} engine): aggregate tokens/s / one client's",
                   ratio(four["tokens_per_s"], one["tokens_per_s"]), 2.5, "x", higher_is_better=True,
                   detail="; ".join(notes)),
            Target(f"c4-errors-{engine}", f"4 clients ({engine} engine): errors", float(four["errors"]), 0, "requests"),
            _p95_vs_one(engine, four, one),
        ]
    first_ratio, tpot_ratio = overhead.get("first_token_s_ratio"), overhead.get("ms_per_token_ratio")
    targets += [
        # Two-sided: an in-process side slower than the service is a broken comparison, not a fast service.
        Target("http-first", "HTTP+SSE / in-process VLMPipeline, first token", first_ratio, 1.0, "x",
               tolerance=TOLERANCE, detail=_either_way(first_ratio)),
        Target("http-tpot", "HTTP+SSE / in-process VLMPipeline, ms per token", tpot_ratio, 1.0, "x",
               tolerance=TOLERANCE, detail=_either_way(tpot_ratio)),
    ]
    return targets + peer_targets(results) + tune_targets(results)


def summary(targets: list[Target]) -> dict[str, int]:
    states = [t.met for t in targets]
    return {"met": states.count(True), "not_met": states.count(False), "not_evaluated": states.count(None),
            "total": len(targets)}
