"""results/bench.md: one run's numbers as markdown tables, targets first. Pure: results dict in, text out."""

from __future__ import annotations

import statistics

from ops.bench.decode_profile import weights_by_part
from ops.bench.llama_server import headline
from ops.bench.stats import TOLERANCE, ratio
from ops.bench.targets import Target, answer_rivals, dig, summary

GB = 1e9


def num(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{suffix}"


def gb(value: float | None) -> str:
    return num(None if value is None else value / GB, 2)


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def sig(value: float) -> str:
    """Three significant digits without exponents (1007 ms, 0.167x, 24.2 s)."""
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _measured(t: Target) -> str:
    if t.measured is None:
        return "not measured"
    if t.unit == "bytes":
        return f"{t.measured / GB:.2f} GB"
    return f"{sig(t.measured)}{' ' + t.unit if t.unit != 'x' else 'x'}"


def _threshold(t: Target) -> str:
    if t.tolerance is not None:
        return f"{t.threshold:g} ± {t.tolerance:g}{' ' + t.unit if t.unit != 'x' else 'x'}"
    op = ">=" if t.higher_is_better else "<="
    if t.unit == "bytes":
        return f"{op} {t.threshold / GB:.2f} GB"
    return f"{op} {t.threshold:g}{' ' + t.unit if t.unit != 'x' else 'x'}"


def targets_table(targets: list[Target]) -> str:
    mark = {True: "met", False: "**not met**", None: "not evaluated"}
    rows = [[t.name, _measured(t), _threshold(t), mark[t.met], t.detail] for t in targets]
    return table(["target", "measured", "threshold", "result", "note"], rows)


def _engine(results: dict, key: str) -> str:
    """" direct engine, the default" where the run recorded which engine the default-settings server ran."""
    engine = dig(results, "service", key, "engine")
    return f" {engine} engine, the default" if engine else ""


def runtime_rows(results: dict) -> list[list[str]]:
    fp32 = dig(results, "baselines", "fp32") or {}
    rows = []
    entries = [(f"transformers {k}", dig(results, "baselines", k), None) for k in ("fp32", "bf16")]
    entries += [(f"service {k}{_engine(results, k)} (HTTP+SSE)", dig(results, "service", k, "image_416"),
                 dig(results, "service", k)) for k in ("int8", "int4")]
    entries += [(f"service int4 {v['engine']} engine (HTTP+SSE)", v.get("image_416"), v)
                for k, v in (results.get("service") or {}).items() if k.startswith("int4_")]
    if dig(results, "peer", "image_416"):
        entries.append((peer_label(results), dig(results, "peer", "image_416"), results["peer"]))
    for name, summ, server in entries:
        if not summ:
            continue
        rss = summ.get("peak_rss_bytes") if server is None else server.get("peak_rss_bytes")
        cold = summ.get("load_s") if server is None else server.get("cold_start_s")
        rows.append([name, num(summ["first_token_s"]), num(summ["ms_per_token"], 1), num(summ["total_s"]), gb(rss),
                     num(cold, 1), num(ratio(summ["first_token_s"], fp32.get("first_token_s")), 3, "x"),
                     num(ratio(summ["ms_per_token"], fp32.get("ms_per_token")), 3, "x"),
                     num(ratio(rss, fp32.get("peak_rss_bytes")), 3, "x")])
    return rows


def per_engine(results: dict, part: str) -> list[tuple[str, dict]]:
    """(engine, its ``part`` record: followup, structured) for the default engine's server and every other engine
    measured."""
    service = results.get("service") or {}
    found = [(dig(service, "int4", "engine") or "serial", dig(service, "int4", part))]
    found += [(v["engine"], v.get(part)) for k, v in service.items() if k.startswith("int4_")]
    return [(engine, record) for engine, record in found if record]


def followups(results: dict) -> list[tuple[str, dict]]:
    return per_engine(results, "followup")


def structured_section(results: dict) -> list[str]:
    rows = [[engine, num(r["plain"]["ms_per_token"], 1), num(r["constrained"]["ms_per_token"], 1),
             num(ratio(r["constrained"]["ms_per_token"], r["plain"]["ms_per_token"]), 3, "x"),
             num(r["plain"]["first_token_s"]), num(r["constrained"]["first_token_s"]),
             num(statistics.median(x["tokens"] for x in r["constrained"]["samples"]), 0)]
            for engine, r in per_engine(results, "structured")]
    if not rows:
        return []
    return ["## Structured output (int4)", "", table(
        ["engine", "plain: ms/token", "json_schema: ms/token", "json_schema / plain", "plain: first token (s)",
         "json_schema: first token (s)", "json_schema: tokens (median)"], rows),
        "", "Each run asks about one image twice, plain and with `response_format` `json_schema` (one string "
        "property): the answer is constrained while it is generated, so the ratio is the grammar's cost per step.", ""]


def followup_section(results: dict) -> list[str]:
    rows = []
    for engine, fu in followups(results):
        emb, runs = fu.get("embeddings_s", {}), fu.get("vision_encoder_runs", {})
        rows.append([engine, num(fu["first_first_token_s"]), num(fu["followup_first_token_s"]),
                     num(ratio(fu["followup_first_token_s"], fu["first_first_token_s"]), 3, "x"),
                     num(emb.get("first")), num(emb.get("followup")),
                     f"{num(runs.get('first'), 0)} / {num(runs.get('followup'), 0)}" if runs else "",
                     f"{fu['reused']}/{fu['runs']}"])
    if not rows:
        return []
    return ["## Follow-up on the same image (int4)", "", table(
        ["engine", "first question: first token (s)", "follow-up: first token (s)", "follow-up / first",
         "preparing embeddings, first (s)", "... follow-up (s)", "vision encoder runs, first / follow-ups",
         "conversation continued"], rows),
        "", "Preparing embeddings is server-side `vlfleet_image_encode_seconds`; the encoder runs are "
        "`vlfleet_vision_encoder_runs_total` over all runs. The genai engines run the vision transformer over the "
        "history's image again for a follow-up; the direct engine keeps the encoded image and the conversation's KV.",
        ""]


def peer_label(results: dict) -> str:
    """"llama-server Q4_0 + mmproj q8_0 (HTTP+SSE)": the peer row's name, with its GGUF types."""
    wf = dig(results, "peer", "artifact", "weight_format") or {}
    types = f" {wf['language_model']} + mmproj {wf['mmproj']}" if wf.get("language_model") else ""
    return f"llama-server{types} (HTTP+SSE)"


def _patched(build: dict) -> str:
    """What ops/llamacpp/patches changed in the build's tree; nothing where the run did not record it."""
    names = build.get("patch_names")
    if names is None:
        return ""
    return f" with {', '.join(names)} (ops/llamacpp/patches)" if names else " with no patches"


def peer_section(results: dict) -> list[str]:
    """What the peer was: build, artifact, threads, its own timings and the prompt each side processed."""
    peer = results.get("peer")
    if not peer:
        return []
    smoke = peer.get("smoke") or {}
    if smoke and not smoke.get("ok"):
        return ["## Peer: llama.cpp llama-server (this run)", "",
                f"**{headline(smoke)}**", "",
                "Not measured: its smoke (load the 2b-shape GGUF, answer one token) failed. `vlfleet llamacpp.check` "
                "runs it alone; docs/engines.md says what to build instead.", ""]
    summ = peer.get("image_416", {})
    build = peer.get("build") or {}
    art = peer.get("artifact") or {}
    machine = peer.get("machine") or {}
    sizes = ", ".join(f"{name} {gb(size)} GB" for name, size in (art.get("sizes") or {}).items())
    timings = summ.get("server_timings") or {}
    svc = dig(results, "service", "int4") or {}
    svc_416 = svc.get("image_416") or {}
    rows = [["first token (s), client", num(summ.get("first_token_s")), num(svc_416.get("first_token_s"))],
            ["ms/token, client", num(summ.get("ms_per_token"), 1), num(svc_416.get("ms_per_token"), 1)],
            ["prompt tokens (image included)", num(summ.get("prompt_tokens"), 0), num(svc_416.get("prompt_tokens"), 0)],
            ["prompt processing (ms), server-side", num(timings.get("prompt_ms"), 0), ""],
            ["ms/token, server-side", num(timings.get("predicted_per_token_ms"), 1), ""],
            ["peak RSS (GB)", gb(peer.get("peak_rss_bytes")), gb(svc.get("peak_rss_bytes"))],
            ["cold start (s)", num(peer.get("cold_start_s"), 1), num(svc.get("cold_start_s"), 1)]]
    out = ["## Peer: llama.cpp llama-server (this run)", "",
           f"llama-server from llama.cpp as vendored by the llama-cpp-python {build.get('version', '?')} sdist"
           f"{_patched(build)}, built here ({' '.join(build.get('flags') or [])}; "
           f"{build.get('compiler') or 'compiler ?'}), on "
           f"{machine.get('cpu', '?')} (ISA: {', '.join(machine.get('isa') or []) or '?'}), "
           f"{peer.get('threads', '?')} threads, one slot. Model: the same 2b-shape checkpoint converted to GGUF "
           f"(artifact {art.get('artifact_id', '?')}: {sizes or '?'}). Same images, prompt, token count, runs and "
           "client as the service's int4 runs; the request adds `cache_prompt: false` and `temperature: 0` (greedy, "
           "as the service).", "",
           table(["", "llama-server", "service int4"], rows), ""]
    mem = peer.get("memory") or {}
    if mem.get("RssAnon") is not None:
        out += [f"llama-server after its runs: RSS {gb(mem.get('VmRSS'))} GB = {gb(mem.get('RssAnon'))} GB "
                f"anonymous + {gb(mem.get('RssFile'))} GB file-backed (memory-mapped GGUF).", ""]
    return out


def _step_rows(steps: dict, padded: bool = False) -> list[list[str]]:
    """Each step size's row: ms, against one sequence's, and tokens per step-time against one sequence's."""
    one = next(r["ms_per_step"] for r in steps["rows"] if r["sequences"] == 1)
    return [[str(r["sequences"])] + (["yes (a 4th row)" if r["padded"] else "no"] if padded else [])
            + [num(r["ms_per_step"], 1), num(r["ms_per_step"] / one, 2, "x"),
               num(r["sequences"] * one / r["ms_per_step"], 2, "x")] for r in steps["rows"]]


STEP_HEADER = ["ms per step", "vs 1 sequence", "tokens per step-time vs 1 sequence"]


def llama_steps_section(results: dict) -> list[str]:
    """The hybrid engine's batched decode step, by the sequences in it (ops.bench.llama_steps)."""
    steps = results.get("llama_steps")
    if not steps:
        return []
    return ["## llama.cpp decode step by sequences (the hybrid engine's batch)", "",
            f"One decode step for several sequences at once through the hybrid engine's interface to libllama, on the "
            f"peer's build and GGUF language model: {steps['threads']} threads, {steps['context']} tokens of context "
            f"per sequence, median of {steps['steps']} steps (ops/bench/llama_steps.py). ggml's repacked matmuls take "
            "a batch's rows four at a time and each one left over alone; a step of 3 is timed as the engine runs "
            "it and with a fourth row (ops/llamacpp/vlfleet_llama.c), which the engine leaves off: it would change a "
            "seeded answer with what it is batched with.", "",
            table(["sequences", "padded", *STEP_HEADER], _step_rows(steps, padded=True)), "", *_kept_line(steps)]


def _kept_line(steps: dict) -> list[str]:
    kept = steps.get("kept")
    if not kept:
        return []
    off = kept.get("flash_attention_off")
    line = (f"One sequence's step beside {kept['others']} kept conversations of {kept['tokens']} tokens each: "
            f"{_beside(kept)} with flash attention (the engine's setting)")
    if off:
        line += f", {_beside(off)} without it"
    return [line + ". Each conversation's KV is kept for its follow-up; attention that reads only the stepping "
            "sequence's cells does not slow with them.", ""]


def _beside(kept: dict) -> str:
    return (f"{num(kept['beside_ms'], 1)} ms, {num(kept['beside_ms'] / kept['alone_ms'], 2, 'x')} its step alone in "
            f"the cache ({num(kept['alone_ms'], 1)} ms)")


def paged_steps_section(results: dict) -> list[str]:
    """The paged engine's batched decode step, by the sequences in it (ops.bench.paged_steps)."""
    steps = results.get("paged_steps")
    if not steps:
        return []
    return ["## OpenVINO paged decode step by sequences (the paged engine's batch)", "",
            f"One decode step for several sequences at once through the paged engine's language model "
            f"(service/engine/paged_lm.py) on the int4 artifact, {steps['context']} tokens of context per sequence, "
            f"median of {steps['steps']} steps (ops/bench/paged_steps.py). The 4-client targets' ceiling with this "
            "engine's step takes its 4-sequence row.", "",
            table(["sequences", *STEP_HEADER], _step_rows(steps)), "", *_fused_line(steps)]


def _fused_line(steps: dict) -> list[str]:
    """A prompt chunk with the others' decode step in its call (service/engine/paged.py) against the two apart."""
    f = steps.get("fused")
    if not f:
        return []
    apart, prompt = f["chunk_ms"] + f["step_ms"], f["chunk"] - f["others"]
    return [f"A prompt chunk of {f['chunk']} tokens: {num(f['chunk_ms'], 1)} ms; {f['others']} sequences' decode "
            f"step: {num(f['step_ms'], 1)} ms; the two in one call as the paged engine makes it ({prompt} "
            f"prompt tokens and the step's {f['others']} rows): {num(f['together_ms'], 1)} ms, "
            f"{num(f['together_ms'] / apart, 2, 'x')} the two calls apart ({num(apart, 1)} ms).", ""]


def tune_section(results: dict, key: str = "tune") -> list[str]:
    """Each engine `vlfleet tune` measured here, the one it picks and why; for one client at a time, beside the
    answer times it must beat."""
    tune = results.get(key)
    if not tune:
        return []
    clients, followups = tune.get("clients") or 1, tune.get("followups") or 0
    header = (["engine", "status", f"time to {tune.get('tokens')} tokens (s)", "first token (s)"]
              + (["follow-ups' first token (s)"] if followups else [])
              + ["ms/token", "peak RSS (GB)", "ready after (s)", "note"])
    rows = [[engine + (" (picked)" if engine == tune.get("engine") else ""), c.get("status", ""),
             num(c.get("score_s")), num(c.get("first_token_s"))]
            + ([num(c.get("followup_first_token_s"))] if followups else [])
            + [num(c.get("ms_per_token"), 1), gb(c.get("peak_rss_bytes")), num(c.get("ready_s"), 1),
               c.get("reason") or ""]
            for engine, c in (tune.get("candidates") or {}).items()]
    blank = [""] * (len(header) - 3)  # every measured column: a row that was not measured leaves them empty
    rows += [[engine, "skipped", *blank, why] for engine, why in (tune.get("skipped") or {}).items()]
    if clients == 1:
        rows += [[name, "same run", num(total), *blank[1:], "for comparison"]
                 for name, total in answer_rivals(results).items() if total is not None]
    command, asked = ("vlfleet tune", f"{tune.get('runs')} answers") if clients == 1 else (
        f"vlfleet tune --clients {clients}", f"{tune.get('runs')} runs of {clients} answers asked at once")
    if followups:
        command += f" --followups {followups}"
        asked += f", each followed by {followups} follow-up question(s) in its conversation"
    return [f"## The engine `{command}` picks on this machine ({tune.get('tokens')}-token answers)", "",
            "Each engine started alone and timed by the probe hosts run (the host program's `latency` probe: "
            f"{asked}, a new 416x277 image each), scored and picked by `ops.fleet.tune` (median time to the whole "
            f"answer, within the memory budget: {tune.get('budget')}). Peak RSS: all of the service's processes. "
            f"Picked: **{tune.get('engine')}** ({tune.get('why')}).", "", table(header, rows), ""]


def compute_section(results: dict) -> list[str]:
    c = dig(results, "machine_limit", "compute")
    if not c:
        return []
    rows = [[k["name"], "x".join(map(str, k["shape"])), num(k["flops_per_s"] / 1e9, 0)] for k in c["kernels"]]
    repeats = c.get("repeats", 6)  # run 11 measured with 6 before the count was recorded
    out = ["Matrix multiplication throughput (OpenVINO CPU kernels, the model's MLP shapes: rows x input x output, "
           f"best of {repeats} runs each):", "", table(["weights, compute precision", "shape", "GFLOP/s"], rows), ""]
    floor = c.get("first_token")
    if floor:
        first = dig(results, "service", "int4", "image_416", "first_token_s")
        peak = c["peak"]
        out += [table(["first token (416x277)", "vision GFLOP", "language model GFLOP", "at (GFLOP/s)", "floor (s)",
                       "measured (s)", "measured / floor"],
                      [["int4 service", num(floor["vision_flops"] / 1e9, 0), num(floor["language_flops"] / 1e9, 0),
                        f"{num(peak['flops_per_s'] / 1e9, 0)} ({peak['name']})", num(floor["seconds"]),
                        num(first), num(ratio(first, floor["seconds"]), 2, "x")]]), "",
                f"The floor is the prompt's multiply-accumulates ({floor['patches']} image patches through the vision "
                f"tower, {floor['prompt_tokens']} prompt tokens through the language model) at the fastest rate "
                "above; normalisation, activations and image preparation are left out, so no engine on these "
                "kernels gets below it (ops/bench/compute.py).", ""]
    return out


DECODE_PARTS = {"lm_head": "lm_head matmul", "matmuls": "decoder layers' matmuls",
                "attention": "attention over the KV cache", "other": "everything else"}


def decode_section(results: dict) -> list[str]:
    d = dig(results, "machine_limit", "decode")
    if not d:
        return []
    bus = dig(results, "machine_limit", "bandwidth", "all_threads")
    read = weights_by_part(dig(results, "machine_limit", "weights", "int4"))
    rows = []
    for part, label in DECODE_PARTS.items():
        share, rate = d["shares"].get(part, 0.0), d["stream_bytes_per_s"].get(part)
        rows.append([label, num(100 * share, 0, " %"), num(share * d["ms_per_token"], 1),
                     gb(read[part]) if part in read else "", num(rate / GB, 1) if rate else "",
                     num(ratio(rate, bus), 2, "x") if rate else ""])
    return [f"int4 decode step in process (the language model's IR with the service's properties, {d['prompt_tokens']} "
            f"tokens of context, median of {d['steps']} steps): {d['ms_per_token']:.1f} ms. Shares from the CPU "
            f"plugin's per-node counters; matmul kernels: {', '.join(d['kernels'])}.", "",
            table(["part", "share", "ms/token", "weights read (GB)", "streamed at (GB/s)", "vs read bandwidth"], rows),
            "", "A part whose weights stream well below the read bandwidth is held back by its kernel (unpacking and "
            "scaling the weights as they arrive), not by the memory bus (ops/bench/decode_profile.py).", ""]


def render(results: dict, charts: list[str] | None = None) -> str:
    meta = results.get("meta", {})
    out = [f"# vlfleet bench: {meta.get('started', '')}", ""]
    machine = meta.get("machine", {})
    parts = [machine.get("generation"), f"ISA: {', '.join(machine['isa'])}" if machine.get("isa") else ""]
    about = f" ({'; '.join(part for part in parts if part)})" if any(parts) else ""
    out.append(f"Machine: {machine.get('cpu', '?')}{about}, {machine.get('cpus', '?')} CPUs, "
               f"{gb(machine.get('memory_bytes'))} GB RAM, load average at start {machine.get('loadavg', '?')}. "
               f"Model: 2b-shape synthetic Qwen3-VL (real compute and memory, random weights: ops/model/synth.py). "
               f"{meta.get('tokens', '?')} new tokens (fixed, greedy), image {meta.get('image', '416x277')}, "
               f"medians of {meta.get('runs', '?')} runs. Ratios are within this run; absolute times are context.")
    out.append("")
    if meta.get("interrupted_in"):
        out += [f"**Interrupted** in section `{meta['interrupted_in']}`: it and the sections after it are missing or "
                "incomplete; what is below was measured before the interrupt.", ""]
    targets = [Target(**{k: v for k, v in t.items() if k != "met"}) for t in results.get("targets", [])]
    if targets:
        s = summary(targets)
        out += ["## Targets (issue 9)", "",
                f"{s['met']} met, {s['not_met']} not met, {s['not_evaluated']} not evaluated of {s['total']}.", "",
                targets_table(targets), ""]
    rows = runtime_rows(results)
    if rows:
        out += ["## Runtimes (416x277 image)", "", table(
            ["runtime", "first token (s)", "ms/token", "total (s)", "peak RSS (GB)", "load / cold start (s)",
             "first token vs fp32", "ms/token vs fp32", "RSS vs fp32"], rows), "",
            "Baselines: load_s is loading the checkpoint in-process; the service's column is process start to "
            "/readyz 200 (imports, compile, warm-up). Service peak RSS is the gunicorn worker's VmHWM.", ""]
        for fmt in ("int8", "int4"):
            mem = dig(results, "service", fmt, "memory") or {}
            if mem.get("RssAnon") is not None:
                out += [f"- {fmt} worker after the single-client runs: RSS {gb(mem.get('VmRSS'))} GB = "
                        f"{gb(mem.get('RssAnon'))} GB anonymous (plugin's repacked weights, buffers, KV cache) + "
                        f"{gb(mem.get('RssFile'))} GB file-backed (memory-mapped IR weights)."]
        out.append("")
    limit = results.get("machine_limit")
    if limit:
        bw = limit["bandwidth"]
        out += ["## Machine limit", "",
                f"Memory read bandwidth (numpy, best of {bw['passes']} passes over {bw['array_bytes'] / 2**30:.1f} "
                f"GiB): {bw['one_thread'] / GB:.1f} GB/s on one thread, {bw['all_threads'] / GB:.1f} GB/s on "
                f"{bw['threads']} threads. The floor uses the {bw['threads']}-thread figure (the service decodes on "
                "all cores).", ""]
        rows = []
        for fmt, w in limit.get("weights", {}).items():
            measured = dig(results, "service", fmt, "image_416", "ms_per_token")
            floor = limit["floor_ms_per_token"].get(fmt)
            rows.append([fmt, gb(w["total"]), gb(w["lm_head"]), num(floor, 1), num(measured, 1),
                         num(ratio(measured, floor), 2, "x")])
        out += [table(["weights", "LM bytes read per token (GB)", "of which lm_head (GB)", "floor ms/token",
                       "measured ms/token", "measured / floor"], rows), ""]
        if limit.get("kv_bytes_per_token"):
            out += [f"KV cache read per token at the end of the answer: "
                    f"{limit['kv_bytes_per_token'] / 1e6:.1f} MB (u8), not in the floor.", ""]
        out += compute_section(results) + decode_section(results)
    images = dig(results, "service", "int4", "images")
    if images:
        # model_size: computed from the service's image preparation; older runs wrote the size the model saw as
        # sent_size.
        rows = [[name, v["downscale"], v.get("model_size", v.get("sent_size", "")), num(v.get("prompt_tokens"), 0),
                 num(v["first_token_s"]), num(v["ms_per_token"], 1), num(v["total_s"])] for name, v in images.items()]
        out += ["## Image sizes (int4)", "", table(
            ["image", "service downscaling", "size the model saw", "prompt tokens (image + text)", "first token (s)",
             "ms/token", "total (s)"], rows),
            "", "`detail low/high`: the same image sent with image_url.detail (VLFLEET_IMAGE_MAX_SIDE_LOW / _HIGH).",
            ""]
    out += followup_section(results)
    out += structured_section(results)
    conc = results.get("concurrency")
    if conc:
        rows = []
        for engine, levels in conc.items():
            one = next((lv for lv in levels if lv["clients"] == 1), None)
            for lv in levels:
                rows.append([engine, str(lv["clients"]), num(lv["tokens_per_s"], 1),
                             num(ratio(lv["tokens_per_s"], one and one["tokens_per_s"]), 2, "x"),
                             num(lv["first_token_p50_s"]), num(lv["first_token_p95_s"]), str(lv["errors"])])
        out += ["## Concurrency (int4, each client its own 416-px image)", "", table(
            ["engine", "clients", "output tokens/s", "vs one client", "p50 first token (s)", "p95 first token (s)",
             "errors"], rows), ""]
    out += paged_steps_section(results)
    ov = results.get("overhead")
    if ov:
        out += ["## HTTP+SSE vs in-process VLMPipeline (int4)", "", table(
            ["path", "first token (s)", "ms/token"],
            [["in-process", num(ov["in_process"]["first_token_s"], 3), num(ov["in_process"]["ms_per_token"], 1)],
             ["HTTP+SSE", num(ov["http_sse"]["first_token_s"], 3), num(ov["http_sse"]["ms_per_token"], 1)],
             ["ratio", num(ov["first_token_s_ratio"], 3, "x"), num(ov["ms_per_token_ratio"], 3, "x")]]), ""]
        verdicts = ov.get("comparison")
        if verdicts:
            out += [f"First token: {verdicts['first_token_s']['summary']}. ms/token: "
                    f"{verdicts['ms_per_token']['summary']}. Within means |ratio - 1| <= {TOLERANCE:g}, either way: "
                    "an in-process side slower than the service means the two sides did not do the same work.", ""]
    out += peer_section(results) + llama_steps_section(results)
    out += tune_section(results) + tune_section(results, "tune_load")
    levers = results.get("levers")
    if levers:
        rows = [[lv["name"], lv["setting"], num(lv.get("cold_start_s"), 1), num(lv["first_token_s"]),
                 num(lv["ms_per_token"], 1), gb(lv.get("peak_rss_bytes"))] for lv in levers]
        out += ["## Levers (A/B, int4)", "", table(["lever", "setting", "cold start (s)", "first token (s)",
                                                    "ms/token", "peak RSS (GB)"], rows), ""]
    failed = results.get("levers_failed") or []
    if failed:
        out += [f"- lever {f['setting']} failed: {f['error']} (log: {f['log']})" for f in failed] + [""]
    errors = results.get("errors")
    if errors:
        out += ["## Sections that failed", ""] + [f"- {name}: {msg}" for name, msg in errors.items()] + [""]
    if charts:
        out += ["## Charts", ""] + [f"![{c}]({c})" for c in charts] + [""]
    return "\n".join(out)
