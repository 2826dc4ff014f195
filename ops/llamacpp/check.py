"""`vlfleet llamacpp.check`: does a llama-server build run the model shape the fleet serves, and how fast.

Which of llama.cpp's CPU kernels a matrix takes depends on its type and sizes (ggml's AMX matmul, which killed the
native build with SIGSEGV or SIGILL on a Xeon with AMX, issue 30; the repacked Q4_0 ones). This check runs the
shape the fleet serves (2b, the synthetic checkpoint of the real model's size) as GGUF (Q4_0 + mmproj q8_0,
``ops.llamacpp.gguf.cached``):

1. **smoke**: llama-server loads it and answers one token about the bench's image (``ops.bench.llama_server.smoke``);
   a crash is reported with the signal it died of;
2. with ``runs`` > 0, **speed**: ``runs`` answers of ``tokens`` tokens, each about a fresh 416x277 image, with the
   bench's client (``ops.bench.llama_server.timed``), once as built (the repacked Q4_0 kernels, CPU_REPACK) and
   once with ``--no-repack`` (the plain kernels: what a crash in the repacked or AMX buffers leaves); both servers
   run at once and are asked in turn, so that drifting load on a shared machine weighs on both alike.

``check.json`` holds it all with the machine (CPU model, ISA flags) and the build (flags, key); ``check.md`` beside it
is rendered from that JSON alone (``render``), so the numbers are never typed.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from ops.bench import llama_server

COMPARED = (("repack", ()), ("no-repack", ("--no-repack",)))  # (name, llama-server arguments)
JSON_NAME, MD_NAME = "check.json", "check.md"


def short(path: Path | str) -> str:
    """``path`` with the home directory as ``~`` (result files do not carry the user's home)."""
    text, home = str(path), str(Path.home())
    return "~" + text[len(home):] if text == home or text.startswith(home + "/") else text


def build_info(binary: Path) -> dict:
    """The build.json of the cached build ``binary`` belongs to (ops.llamacpp.build), or {} for another binary."""
    info = Path(binary).resolve().parent.parent.parent / "build.json"  # <build>/build/bin/llama-server
    try:
        data = json.loads(info.read_text())
    except (OSError, ValueError):
        return {}
    keep = ("version", "flags", "cpu", "removed_cpu_variants", "compiler", "build_s", "built_at")
    return {"key": info.parent.name, **{k: data[k] for k in keep if k in data}}


def run(binary: Path, artifact: Path, log_dir: Path, runs: int = 3, tokens: int = 128, shape: str = "2b",
        say: Callable[[str], None] = print) -> dict:
    """The smoke and (``runs`` > 0) the speed comparison of ``binary`` on GGUF ``artifact``; the JSON document."""
    from ops.machine import describe
    from service.runtime.manifest import read_manifest

    manifest = read_manifest(artifact)
    data: dict = {
        "what": "llama-server on the fleet's model shape: load and one token, then first token and ms/token with "
                "its repacked kernels and with --no-repack",
        "machine": describe(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "binary": short(binary), "build": build_info(binary),
        "artifact": {"shape": shape, "path": short(artifact), "artifact_id": manifest["artifact_id"],
                     "weight_format": manifest["weight_format"],
                     "sizes": {name: e["size"] for name, e in manifest["files"].items()}},
        "runs": runs, "tokens": tokens, "logs": short(log_dir), "configs": {},
    }
    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        data["smoke"] = llama_server.smoke(binary, artifact, log_dir / "smoke.log")
        say(f"smoke: loaded in {data['smoke']['load_s']:.1f} s, one token after "
            f"{data['smoke']['first_token_s']:.2f} s")
    except llama_server.SmokeError as e:
        data["smoke"] = {"ok": False, "error": str(e)[:2000]}
        say(f"smoke FAILED: {e}")
        data["loadavg_end"] = describe()["loadavg"]
        return data
    if runs > 0:
        data["configs"] = compare(binary, artifact, log_dir, runs, tokens, say)
    data["loadavg_end"] = describe()["loadavg"]  # with the machine's at the start: how quiet the run was
    if {"repack", "no-repack"} <= set(data["configs"]):
        fast, slow = data["configs"]["repack"], data["configs"]["no-repack"]
        data["no_repack_over_repack"] = {k: round(slow[k] / fast[k], 3) for k in ("first_token_s", "ms_per_token",
                                                                                   "total_s")}
    return data


def cpu_seconds(pids: list[int], stat: Path = Path("/proc/stat")) -> tuple[float, float]:
    """(CPU seconds every process of the machine has used, those of ``pids``) since boot, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    fields = stat.read_text().splitlines()[0].split()[1:]
    busy = sum(int(v) for i, v in enumerate(fields[:8]) if i not in (3, 4))  # all but idle and iowait
    own = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            parts = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            own += int(parts[11]) + int(parts[12])  # utime, stime
    return busy / tick, own / tick


def others_share(before: tuple[float, float], after: tuple[float, float], wall_s: float, cpus: int) -> float:
    """The share of the machine's ``cpus`` that other processes than ours used over ``wall_s``."""
    return round(max(0.0, (after[0] - before[0]) - (after[1] - before[1])) / (wall_s * cpus), 3)


def compare(binary: Path, artifact: Path, log_dir: Path, runs: int, tokens: int,
            say: Callable[[str], None] = print) -> dict:
    """Each of COMPARED's llama-servers, all running at once (one answers while the others idle), warmed up, then
    asked in turn: run i of each is about the same image, one after the other, so that a machine whose load drifts
    (others' work on a shared host) weighs on every configuration alike."""
    servers: dict[str, llama_server.LlamaServer] = {}
    answers: dict[str, list] = {name: [] for name, _ in COMPARED}
    with contextlib.ExitStack() as stack:
        for name, extra in COMPARED:
            s = stack.enter_context(llama_server.LlamaServer(binary, artifact, log_dir / f"{name}.log",
                                                             extra_args=extra))
            servers[name] = s
            say(f"{name}: ready after {s.cold_start_s:.1f} s")
        for s in servers.values():
            llama_server.warm_up(s)
        pids = [os.getpid(), *(s.proc.pid for s in servers.values())]  # the servers and their client
        before, started = cpu_seconds(pids), time.monotonic()
        for i in range(runs):
            for name, s in servers.items():
                a = llama_server.timed(s, tokens, seed=i)
                answers[name].append(a)
                say(f"{name}: run {i + 1}/{runs}: first token {a.sample.first_token_s:.2f} s, "
                    f"{a.sample.ms_per_token:.1f} ms/token")
        wall = time.monotonic() - started
        share = others_share(before, cpu_seconds(pids), wall, len(os.sched_getaffinity(0)))
        say(f"other processes used {share:.0%} of the CPUs during the timed runs")
        return {name: {"args": list(extra), "cold_start_s": round(servers[name].cold_start_s, 3),
                       "others_cpu_share": share,
                       "threads": servers[name].n_threads, **llama_server.summary(answers[name]),
                       "peak_rss_bytes": servers[name].peak_rss()} for name, extra in COMPARED}


def render(data: dict) -> str:
    """check.md from check.json's document."""
    m, b, a = data["machine"], data.get("build") or {}, data["artifact"]
    ggml = [f for f in b.get("flags", []) if f.startswith("-DGGML_")]
    end = f", {data['loadavg_end']} at the end" if data.get("loadavg_end") else ""
    lines = [f"# llama-server on the {a['shape']}-shape GGUF: smoke and speed", "",
             f"- CPU: {m['cpu']} ({m['cpus']} CPUs; load average {m['loadavg']} at the start{end})",
             f"- ISA: {' '.join(m['isa'])}",
             f"- binary: `{data['binary']}`" + (f" (build `{b['key']}`, {b.get('compiler', '')})" if b else ""),
             f"- ggml flags: {' '.join(f'`{f}`' for f in ggml) or 'unknown'}"]
    if b.get("removed_cpu_variants"):
        lines.append(f"- CPU variants removed after the build: {', '.join(b['removed_cpu_variants'])}")
    sizes = ", ".join(f"{n} {v / 1e9:.2f} GB" for n, v in a["sizes"].items())
    lines += [f"- artifact: {a['artifact_id']} ({a['weight_format'].get('language_model')} + mmproj "
              f"{a['weight_format'].get('mmproj')}; {sizes})", f"- measured {data['time']}; written by "
              "`vlfleet llamacpp.check`, this page rendered from check.json", ""]
    smoke = data["smoke"]
    if smoke.get("ok"):
        lines.append(f"**Smoke: passed.** Loaded in {smoke['load_s']:.2f} s; one token about the 416x277 image "
                     f"({smoke['prompt_tokens']} prompt tokens) after {smoke['first_token_s']:.2f} s.")
        if smoke.get("buffers") or smoke.get("cpu_backend"):
            types = ", ".join(f"{n} {t}" for t, n in (smoke.get("types") or {}).items())
            lines.append(f"Kernels (its log): model buffers {', '.join(smoke.get('buffers') or ['?'])}"
                         + (f"; CPU backend {smoke['cpu_backend']}" if smoke.get("cpu_backend") else "")
                         + (f"; tensors {types}" if types else "") + ".")
    else:
        lines.append(f"**Smoke: FAILED.** {smoke['error'][:600]}")
    if data["configs"]:
        lines += ["", f"Medians of {data['runs']} answers of {data['tokens']} tokens, each about a fresh 416x277 image "
                  "(bench client, `cache_prompt: false`, greedy, ignore_eos; both servers up at once, asked in turn "
                  "about the same images):", "",
                  "| llama-server | first token | ms/token | whole answer | prompt eval (server) | ready after | "
                  "peak RSS |", "|---|---|---|---|---|---|---|"]
        for name, c in data["configs"].items():
            prompt = c.get("server_timings", {}).get("prompt_ms")
            rss = c.get("peak_rss_bytes")
            lines.append(f"| {name} (`{' '.join(c['args']) or 'as built'}`) | {c['first_token_s']:.2f} s | "
                         f"{c['ms_per_token']:.1f} | {c['total_s']:.2f} s | "
                         f"{f'{prompt / 1000:.2f} s' if prompt is not None else '-'} | {c['cold_start_s']:.1f} s | "
                         f"{f'{rss / 1e9:.2f} GB' if rss else '-'} |")
        share = next(iter(data["configs"].values())).get("others_cpu_share")
        if share is not None:
            lines += ["", f"Other processes used {share:.0%} of the machine's CPUs during the timed runs"
                      + (": a shared machine, so the times above are inflated (llama.cpp's threads wait for each "
                         "other at every step, and any one preempted stalls the rest); compare the rows of this page "
                         "with each other, not with a quiet machine's." if share > 0.1 else " (a quiet machine).")]
        ratio = data.get("no_repack_over_repack")
        if ratio:
            lines += ["", f"`--no-repack` / as built: first token {ratio['first_token_s']:.2f}x, ms/token "
                      f"{ratio['ms_per_token']:.2f}x, whole answer {ratio['total_s']:.2f}x."]
    return "\n".join(lines) + "\n"


def write(data: dict, out: Path) -> tuple[Path, Path]:
    """check.json, then check.md rendered from the file just written."""
    out.mkdir(parents=True, exist_ok=True)
    js, md = out / JSON_NAME, out / MD_NAME
    js.write_text(json.dumps(data, indent=1) + "\n")
    md.write_text(render(json.loads(js.read_text())))
    return js, md
