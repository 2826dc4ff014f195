"""What the checklist (ops/preflight/test_checklist.py), the fleet report (ops/report/collect.py) and tune read on a
service host: one command each, one JSON document printed, arguments by position.

    python3 vlfleet-host.pyz snapshot ROOT SERVICE
    python3 vlfleet-host.pyz facts ROOT
    <root>/current/venv/bin/python vlfleet-host.pyz runtime-versions
    <root>/current/venv/bin/python vlfleet-host.pyz readyz URL
    <root>/current/venv/bin/python vlfleet-host.pyz stream HOST PORT MODEL FIRST_TOKEN_S TOTAL_S [API_KEYS_FILE]
    <root>/current/venv/bin/python vlfleet-host.pyz latency HOST PORT TOKENS RUNS TIMEOUT_S [API_KEYS_FILE] [CLIENTS]
        [WIDTHxHEIGHT] [FOLLOWUPS]

`snapshot` and `facts` work where no release exists yet (they are how the checklist finds the venv), so they run on
the distribution's python3; runtime-versions runs on the release venv's, whose packages it imports. Requests go to
the service from the host itself: the service may bind loopback only.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from . import client, png
from .contract import CPU_PLAN_FILE, MODEL_CACHE_DIR, TUNED_FILE
from .layout import parse_env

RUNTIME_DISTS = (("openvino", "openvino"), ("openvino-genai", "openvino_genai"),
                 ("openvino-tokenizers", "openvino_tokenizers"))
LATENCY_IMAGE = (416, 277)  # a typical photo's budget after downscaling: image tokens dominate the first token
LATENCY_QUESTION = "Describe this picture."
# a chat user's next questions about the same picture (the latency probe's and the fleet locality bench's)
FOLLOWUP_QUESTIONS = ("What colours stand out?", "Is there any text in it?", "Summarise it in one sentence.")
UNIT_PROPERTIES = "ActiveState,SubState,Result,UnitFileState,MainPID,Restart,RestartUSec,LimitNOFILE,DropInPaths," \
                  "NRestarts"


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _lines(path: str, *prefixes: str) -> str:
    """The lines of ``path`` that start with one of ``prefixes`` (grep '^prefix'), newline-terminated."""
    return "".join(line for line in _read(path).splitlines(keepends=True) if line.startswith(prefixes))


def _first(path: str, prefix: str) -> str:
    return next(iter(_lines(path, prefix).splitlines()), "")


def _out(*command: str, stderr: bool = False) -> str:
    """A command's output; a missing command reads as no output, as in a shell."""
    try:
        return subprocess.run(command, stdout=subprocess.PIPE, text=True, errors="replace", timeout=60, check=False,
                              stderr=subprocess.STDOUT if stderr else subprocess.DEVNULL).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _after_header(text: str) -> str:
    return "".join(text.splitlines(keepends=True)[1:])


def _df(*paths: str) -> str:
    # stderr too: the first line (header or the error) is dropped, so a missing path leaves no row to misread
    return _after_header(_out("df", "-B1", "--output=target,fstype,avail", *paths, stderr=True))


def _release(root: str) -> tuple[str, str, str]:
    """``root``/current resolved (or ""), its venv python when executable (or ""), its env file's text."""
    target = os.path.realpath(os.path.join(root, "current"))
    if not os.path.exists(target):
        return "", "", ""
    python = os.path.join(target, "venv", "bin", "python")
    return target, python if os.access(python, os.X_OK) else "", _read(os.path.join(target, "vlfleet.env"))


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (children of any of its threads: gunicorn forks from its main thread, but
    the model's helpers may not)."""
    out, todo = [], [pid]
    while todo and len(out) < 256:  # bounded: a unit with a fork bomb still gets a snapshot
        p = todo.pop()
        out.append(p)
        for task in glob.glob(f"/proc/{p}/task/*/children"):
            todo += [int(c) for c in _read(task).split()]
    return out


def _numa(pid: int) -> str:
    """JSON: the host's NUMA nodes (id -> CPU list) and, per process of the service, the CPU lists its threads may
    run on and how many of its mappings have each memory policy (/proc/PID/numa_maps: "bind:0", "default", ...)."""
    nodes = {d.name[4:]: _read(f"{d}/cpulist").strip()
             for d in sorted(Path("/sys/devices/system/node").glob("node[0-9]*"))}
    procs: dict[str, Any] = {}
    for p in _descendants(pid) if pid > 0 else []:
        cpus = {_first(f, "Cpus_allowed_list:").partition(":")[2].strip()
                for f in glob.glob(f"/proc/{p}/task/*/status")}
        maps = (line.split() for line in _read(f"/proc/{p}/numa_maps").splitlines())
        policies = Counter(fields[1] for fields in maps if len(fields) > 1)
        procs[str(p)] = {"cpus": sorted(cpus - {""}), "policies": policies}
    return json.dumps({"nodes": nodes, "processes": procs})


def _service(service: str, port: str) -> dict[str, str]:
    active = _out("systemctl", "is-active", f"{service}.service").strip() == "active"
    journal = "" if active else _out("journalctl", "-u", f"{service}.service", "-n", "5", "--no-pager", "-o", "cat")
    return {"unit": _out("systemctl", "show", f"{service}.service", "-p", UNIT_PROPERTIES),
            "listen": _out("ss", "-Hltnp", f"sport = :{port}") if port else "", "journal": journal}


def snapshot(root: str, service: str) -> dict[str, str]:
    """Every fact the checklist's shell-level checks read, in one process (a TCG VM pays seconds per process spawned
    over SSH): section name -> text, as the commands named in each reader print it."""
    target, python, env = _release(root)
    values = parse_env(env)
    model, gguf = values.get("VLFLEET_MODEL_DIR"), values.get("VLFLEET_LLAMACPP_MODEL_DIR")
    unit = _service(service, values.get("VLFLEET_PORT", ""))  # one systemctl show: a process costs seconds on TCG
    main_pid = parse_env(unit["unit"]).get("MainPID", "")
    pid = int(main_pid) if main_pid.isdigit() else 0  # 0 when it does not run: there is no /proc/0
    plan = values.get("VLFLEET_CPU_PLAN_FILE") or CPU_PLAN_FILE
    cache = values.get("VLFLEET_MODEL_CACHE_DIR") or MODEL_CACHE_DIR
    # --container prints the container's kind, or "none" (and fails) outside one
    container = _out("systemd-detect-virt", "--container").strip() not in ("", "none")
    governors = sorted(glob.glob("/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor"))
    return {"virt": _out("systemd-detect-virt"), "container": "yes" if container else "no",
            "flags": _first("/proc/cpuinfo", "flags"), "target": target, "python": python, "env": env,
            "governors": "".join(f"{p}:{line}\n" for p in governors for line in _read(p).splitlines() if line),
            "manifest": _read(os.path.join(model, "manifest.json")) if model else "",
            "gguf_manifest": _read(os.path.join(gguf, "manifest.json")) if gguf else "",
            "meminfo": _read("/proc/meminfo"), "swaps": _after_header(_read("/proc/swaps")),
            "df_tmp": _df("/tmp", "/var/tmp"), "cache": cache + "\n", "df_models": _df(f"{root}/models"),
            "df_cache": _df(cache if os.path.isdir(cache) else os.path.dirname(cache)),
            "pid_limits": _lines(f"/proc/{pid}/limits", "Max open files"),
            "pid_status": _lines(f"/proc/{pid}/status", "VmRSS:", "Cpus_allowed_list:"), "numa": _numa(pid),
            "init_limits": _lines("/proc/1/limits", "Max open files"), "plan": _read(plan),
            "time": _out("timedatectl", "show", "-p", "NTP", "-p", "NTPSynchronized", stderr=True),
            "tuned": _read(TUNED_FILE), **unit}


def facts(root: str) -> dict[str, Any]:
    """What the fleet report shows of a host: CPU model and flags, CPUs, memory, OS, the current env and the
    launcher's core plan (texts; the report parses them)."""
    env = _read(os.path.join(root, "current", "vlfleet.env"))
    plan = parse_env(env).get("VLFLEET_CPU_PLAN_FILE") or CPU_PLAN_FILE
    return {"model": _first("/proc/cpuinfo", "model name").partition(":")[2].strip(),
            "flags": _first("/proc/cpuinfo", "flags").partition(":")[2].strip(),
            "cpus": os.sysconf("SC_NPROCESSORS_CONF"),
            "meminfo": _lines("/proc/meminfo", "MemTotal:", "MemAvailable:", "SwapTotal:", "SwapFree:"),
            "os": _first("/etc/os-release", "PRETTY_NAME=").partition("=")[2].strip().strip("\"'"),
            "kernel": os.uname().release, "env": env, "plan": _read(plan)}


def runtime_versions() -> dict[str, Any]:
    """The interpreter's version, and each OpenVINO distribution's version and whether it imports."""
    import importlib
    import importlib.metadata as md
    import platform

    out: dict[str, Any] = {"python": platform.python_version(), "dists": {}}
    for dist, module in RUNTIME_DISTS:
        try:
            version = md.version(dist)
        except md.PackageNotFoundError:
            version = None
        try:
            importlib.import_module(module)
            imported = "ok"
        except Exception as e:  # whatever the import raises is the finding
            imported = client.describe(e)
        out["dists"][dist] = {"version": version, "import": imported}
    return out


def _rounded(seconds: float | None, digits: int) -> float | None:
    return None if seconds is None else round(seconds, digits)


def _ask(host: str, port: int, key: str | None, image: bytes, question: str, timeout: float, bound: float,
         earlier: tuple[tuple[str, str], ...] = (), **body: Any) -> client.Answer:
    """Ask ``question`` about ``image``; with ``earlier`` (question, answer) turns, ``question`` follows them in the
    same conversation, the image in its first turn, as a chat client re-sends its history."""
    turns = [*earlier, (question, None)]
    messages: list[dict] = []
    for n, (asked, answered) in enumerate(turns):
        messages.append(client.user_turn(client.data_url(image), asked) if n == 0 else
                        {"role": "user", "content": asked})
        if answered is not None:
            messages.append({"role": "assistant", "content": answered})
    return client.chat(client.base_url(host, port), {"stream": True, "temperature": 0, **body, "messages": messages},
                       timeout, bound, key)


def _row(a: client.Answer, digits: int) -> dict[str, Any]:
    return {"status": a.status, "first_token_s": _rounded(a.first_token_s, digits),
            "total_s": _rounded(a.total_s, digits), "error": a.error}


def stream(host: str, port: int, model: str, first_token_s: float, total_s: float,
           keys_file: str = "") -> dict[str, Any]:
    """One small image and a short question, streamed: status, content chunks, first token and [DONE] times."""
    try:
        a = _ask(host, port, client.first_key(keys_file), png.solid(64, 48, (200, 40, 40)),
                 "What colour is this image?", first_token_s, total_s, model=model, max_tokens=8)
    except Exception as e:  # the error is the answer
        a = client.Answer(error=client.describe(e))
    return {**_row(a, 3), "chunks": a.chunks, "chars": len(a.text), "text": a.text[:200], "done": a.done}


def latency(host: str, port: int, tokens: int, runs: int, bound: float, keys_file: str = "",
            clients: int = 1, image: tuple[int, int] = LATENCY_IMAGE, followups: int = 0) -> list[dict[str, Any]]:
    """``runs`` streamed answers of exactly ``tokens`` tokens, one after another, each about a new image of a
    typical size: first token, ms per token and the time to the whole answer. A new image each time, because an
    engine that keeps encoded images (or their KV) would otherwise time its cache, not a typical first question.
    With ``clients`` > 1 each run is that many answers asked at once, as that many users would; every answer is a
    row. With ``followups`` each first question is a conversation's start: that many follow-up questions about the
    same image come after it, each re-sending the turns before it (answers included) as a chat client does, each a
    row of its own (``turn`` 1, 2, ...), so an engine that keeps a conversation's image and KV is timed doing so.
    With ``keys_file`` (read as root on the host), the first key goes with each request. ``image`` is the pictures'
    width and height."""
    key = client.first_key(keys_file)

    def answer(i: int, question: str, earlier: tuple[tuple[str, str], ...]) -> tuple[dict[str, Any], str]:
        picture = png.solid(*image, (40 + (7 * i) % 200, 120, 200))
        try:
            a = _ask(host, port, key, picture, question, bound, bound, earlier, max_tokens=tokens, ignore_eos=True,
                     stream_options={"include_usage": True})
        except Exception as e:  # one run's error is its row
            a = client.Answer(error=client.describe(e))
        # X-Cache: an answer replayed from the service's cache timed the cache, not the engine
        row = {**_row(a, 4), "tokens": a.tokens or 0, "ms_per_token": None, "turn": len(earlier),
               "prompt_tokens": a.usage.get("prompt_tokens"), "cache": a.headers.get("X-Cache")}
        if a.first_token_s is not None and row["tokens"] > 1:
            row["ms_per_token"] = round(1000 * (a.last_token_s - a.first_token_s) / (row["tokens"] - 1), 2)
        return row, a.text

    def conversation(i: int) -> list[dict[str, Any]]:
        # a nonce in the first prompt: the service replays identical deterministic requests from its answer cache
        # (a follow-up's history holds it, so follow-ups need none)
        questions = (f"{LATENCY_QUESTION} (probe {i} {time.time():.6f})", *FOLLOWUP_QUESTIONS[:followups])
        rows: list[dict[str, Any]] = []
        earlier: tuple[tuple[str, str], ...] = ()
        for question in questions:
            row, text = answer(i, question, earlier)
            rows.append(row)
            if row["error"]:  # a conversation whose answer failed has nothing to follow up on
                break
            earlier += ((question, text),)
        return rows

    if clients <= 1:
        return [row for i in range(runs) for row in conversation(i)]
    with ThreadPoolExecutor(clients) as pool:
        return [row for r in range(runs) for rows in pool.map(conversation, range(r * clients, (r + 1) * clients))
                for row in rows]


def image_size(text: str) -> tuple[int, int]:
    """``WIDTHxHEIGHT`` (e.g. 416x277) as integers, each 1..4096; empty: LATENCY_IMAGE."""
    if not text:
        return LATENCY_IMAGE
    width, sep, height = text.lower().partition("x")
    if not (sep and width.isdigit() and height.isdigit() and 0 < int(width) <= 4096 and 0 < int(height) <= 4096):
        raise ValueError(f"an image size is WIDTHxHEIGHT, each 1..4096 (e.g. 416x277), not {text!r}")
    return int(width), int(height)


def _optional(args: list[str], i: int) -> str:
    return args[i] if len(args) > i else ""


COMMANDS = {
    "runtime-versions": lambda a: runtime_versions(),
    "readyz": lambda a: client.readyz(a[0]),
    "stream": lambda a: stream(a[0], int(a[1]), a[2], float(a[3]), float(a[4]), _optional(a, 5)),
    "latency": lambda a: latency(a[0], int(a[1]), int(a[2]), int(a[3]), float(a[4]), _optional(a, 5),
                                 int(_optional(a, 6) or 1), image_size(_optional(a, 7)), int(_optional(a, 8) or 0)),
    "snapshot": lambda a: snapshot(a[0], a[1]),
    "facts": lambda a: facts(a[0]),
}
