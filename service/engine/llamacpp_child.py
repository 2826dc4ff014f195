"""The llamacpp engine's private llama-server: one child process on a GGUF artifact, on loopback only.

The one llama-server launcher: the engine runs it, and so does the bench's peer (ops/bench/llama_server.py), with
the same command line (``llama_server_argv``), start, bounded /health wait and stop (``LlamaServerChild``).

The engine's child binds port 0 (the kernel picks a free port, no race with other processes) and we read the port
from its "listening on" line; a command with a fixed ``--port`` is known at once. Its output is read by one thread
into the service's JSON log (errors and warnings as such, the rest at debug), or into a file when given one, and a
short tail kept for the message when it dies. It is stopped by its PID: SIGTERM, a grace period, SIGKILL; and the
kernel kills it if the thread that started it (the inference thread) dies first (PR_SET_PDEATHSIG), so a killed
service leaves no llama-server behind holding gigabytes.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.engine.genai import cpu_flags
from service.engine.llamacpp_api import Endpoint
from service.runtime.manifest import gguf_parts
from service.runtime.processes import die_with_parent, terminate

log = logging.getLogger("vlfleet.llamacpp")

STOP_GRACE_S = 10.0
HEALTH_POLL_S = 0.25
_LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")
_LEVEL = re.compile(r"^\S+ ([EWIDT]) ")  # llama.cpp's log prefix: "0.01.188.669 I srv ..."


class ChildError(RuntimeError):
    """llama-server is missing, would not start, or is not running; the message says which and why.

    ``exit_code``: set when the child died while loading (Popen's returncode: negative for a signal); trying it
    again the same way will fail the same way, unlike a start that ran out of time."""

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        self.exit_code = exit_code

    @property
    def died(self) -> bool:
        return self.exit_code is not None


# What a signal that kills llama-server usually means, for the message that names it.
_SIGNAL_HINTS = {
    signal.SIGILL: "an instruction the CPU refused: a build for another CPU (`vlfleet llamacpp.build` on this "
                   "host's CPU, or the portable build), or ggml's AMX kernels, which builds from before issue 30 "
                   "have (build again)",
    signal.SIGKILL: "killed from outside: the kernel's OOM killer (dmesg), or an operator",
}


def describe_exit(code: int | None) -> str:
    """How a child ended, by its Popen returncode: "SIGSEGV" (killed by a signal), "exit code 3", "still running"."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def died_while_loading(code: int, last_lines: str) -> str:
    """The message for a llama-server that died before it was ready (ChildError), naming the signal or code."""
    hint = _SIGNAL_HINTS.get(-code) if code < 0 else None
    return f"llama-server died while loading ({describe_exit(code)}{f': {hint}' if hint else ''}): {last_lines}"


@dataclass(frozen=True)
class GgufFiles:
    language_model: Path
    mmproj: Path

    @classmethod
    def of(cls, directory: Path, manifest: Mapping[str, Any]) -> GgufFiles | None:
        """The files of the artifact in ``directory`` with ``manifest``; None when it is not a GGUF artifact
        (service.runtime.manifest.gguf_parts)."""
        names = gguf_parts(manifest)
        return None if names is None else cls(**{part: Path(directory) / name for part, name in names.items()})


def gguf_files(model_dir: Path) -> GgufFiles:
    """The language model and vision projector of a GGUF artifact, as its manifest names them."""
    try:
        manifest = json.loads((Path(model_dir) / "manifest.json").read_text())
    except (OSError, ValueError) as e:
        raise ChildError(f"cannot read {model_dir}/manifest.json: {e}") from None
    files = GgufFiles.of(model_dir, manifest)
    if files is None:
        raise ChildError(f"{model_dir} is not a GGUF artifact, which VLFLEET_ENGINE=llamacpp needs (make one with "
                         "`vlfleet model.gguf` and set VLFLEET_LLAMACPP_MODEL_DIR to it; OpenVINO artifacts are "
                         "served by the other engines)")
    return files


def installed_package():
    """The installed vlfleet_llama_server package (llama-server from the wheelhouse), or None."""
    try:
        import vlfleet_llama_server
    except ImportError:
        return None
    return vlfleet_llama_server


def server_binary(configured: Path | None) -> Path:
    """VLFLEET_LLAMACPP_SERVER, else the installed package's llama-server, else llama-server on PATH; checked to
    run on this CPU when it is the package's."""
    package = installed_package()
    found = configured or (package.server() if package else None) or shutil.which("llama-server")
    if found is None or not Path(found).is_file():
        where = configured or (package.server() if package else "not on PATH")
        raise ChildError(f"llama-server not found ({where}): set VLFLEET_LLAMACPP_SERVER to the binary "
                         "`vlfleet llamacpp.build` prints, or install the wheel `vlfleet llamacpp.wheel` makes")
    if package is not None:
        check_isa(Path(found), package.server(), package.BUILD.get("requires_isa", []))
    return Path(found)


def check_isa(binary: Path, packaged: Path, required: list[str], cpuinfo: Path = Path("/proc/cpuinfo")) -> None:
    """ChildError if ``binary`` is the package's and this CPU lacks flags the package was built for: a native
    build stops on an illegal instruction, maybe mid-answer, rather than at start."""
    if not required or Path(binary).resolve() != Path(packaged).resolve():
        return
    missing = [flag for flag in required if flag not in cpu_flags(cpuinfo)]
    if missing:
        raise ChildError(f"the installed llama-server ({packaged}) is a native build for a CPU with "
                         f"{', '.join(required)}; this CPU lacks {', '.join(missing)}. Ship a portable build: "
                         "`vlfleet llamacpp.wheel --portable` (or `vlfleet llamacpp.build --portable`)")


def child_env(binary: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default os.environ) with the binary's directory first on LD_LIBRARY_PATH: the binaries'
    RUNPATH names the controller's build dir, which does not exist on hosts; their libraries sit beside them."""
    env = dict(os.environ if environ is None else environ)
    libs = str(Path(binary).resolve().parent)
    env["LD_LIBRARY_PATH"] = f"{libs}{os.pathsep}{env['LD_LIBRARY_PATH']}" if env.get("LD_LIBRARY_PATH") else libs
    return env


def context_size(settings) -> int:
    """The KV cache in tokens: the longest prompt plus the longest answer the service accepts, unless set."""
    return settings.llamacpp_ctx or settings.max_input_tokens + settings.max_tokens


def threads(settings) -> int:
    return settings.threads or len(os.sched_getaffinity(0))


def llama_server_argv(binary: Path, files: GgufFiles, n_threads: int, ctx: int, port: int = 0,
                      cache_ram_mib: int | None = None) -> list[str]:
    """llama-server on loopback, one slot (requests one at a time), ``n_threads`` for prompt processing and for
    generation, a ``ctx``-token KV cache; ``port`` 0: the kernel picks one; ``cache_ram_mib``: the host-memory
    prompt cache's bound (unset: llama-server's own default, 8 GiB)."""
    n = str(n_threads)
    cache = ["--cache-ram", str(cache_ram_mib)] if cache_ram_mib is not None else []
    return [str(binary), "-m", str(files.language_model), "--mmproj", str(files.mmproj), "-t", n, "-tb", n,
            "-c", str(ctx), "-np", "1", *cache, "--host", "127.0.0.1", "--port", str(port), "--no-webui"]


def server_command(settings) -> list[str]:
    """The engine's llama-server: the GGUF artifact and binary of ``settings``, a prompt cache no larger than
    VLFLEET_KV_CACHE_GB."""
    files = gguf_files(settings.model_dir)
    return llama_server_argv(server_binary(settings.llamacpp_server), files, threads(settings), context_size(settings),
                             cache_ram_mib=settings.kv_cache_gb * 1024)


def _fixed_port(command: list[str]) -> int | None:
    """The port of ``--port N`` in ``command``; None for 0 or none (then read from the "listening on" line)."""
    if "--port" not in command:
        return None
    return int(command[command.index("--port") + 1]) or None


class LlamaServerChild:
    """One llama-server process at a time: ``start`` (bounded wait for /health), ``alive``, ``stop``.

    ``log_file``: its output goes there instead of the JSON log. ``key``: it wants a fresh random API key per start
    (``endpoint().headers()`` sends it); the bench's peer runs it without one, as its client sends none."""

    def __init__(self, command: list[str], log_file: Path | None = None, key: bool = True):
        self.command, self.log_file, self.use_key = command, log_file, key
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.key = ""
        self.tail: collections.deque[str] = collections.deque(maxlen=40)
        self._port_seen = threading.Event()
        self._reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def endpoint(self) -> Endpoint | None:
        """Where to send requests while the child runs and listens, else None."""
        return Endpoint(self.port, self.key) if self.port is not None and self.alive() else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def start(self, timeout: float, setting: str | None = "VLFLEET_LLAMACPP_START_TIMEOUT") -> None:
        """Start llama-server and wait until it answers /health 200 (model loaded); ChildError otherwise, naming
        ``setting`` (where ``timeout`` comes from) when it timed out."""
        self.stop()
        self.port, self._port_seen = _fixed_port(self.command), threading.Event()
        if self.port is not None:
            self._port_seen.set()
        self.key = secrets.token_urlsafe(24) if self.use_key else ""
        self.tail.clear()
        env = child_env(Path(self.command[0]))
        if self.key:
            env["LLAMA_API_KEY"] = self.key  # by environment, not argv, which every user of the host can read in ps
        self.proc = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, preexec_fn=die_with_parent())
        log.info("llama-server started", extra={"pid": self.proc.pid, "command": " ".join(self.command)})
        try:
            out = open(self.log_file, "w", buffering=1) if self.log_file else None  # noqa: SIM115 (the reader closes it)
            self._reader = threading.Thread(target=self._read_output, args=(self.proc, out), name="llama-server-log",
                                            daemon=True)
            self._reader.start()
            self._wait_healthy(time.monotonic() + timeout, timeout, setting)
        except BaseException:
            self.stop()
            raise

    def _wait_healthy(self, deadline: float, timeout: float, setting: str | None) -> None:
        while time.monotonic() < deadline:
            if not self.alive():
                self._reader.join(timeout=2)  # its last words are what it died of
                code = self.exit_code()
                raise ChildError(died_while_loading(code, self.last_lines()), exit_code=code)
            if self._port_seen.is_set() and self._healthy():
                return
            time.sleep(HEALTH_POLL_S)
        raise ChildError(f"llama-server did not load the model within {timeout:g} s"
                         f"{f' ({setting})' if setting else ''}: {self.last_lines()}")

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                return r.status == 200
        except (OSError, urllib.error.URLError):  # 503 while loading, or not listening yet
            return False

    def _read_output(self, proc: subprocess.Popen, out) -> None:
        """Log each line llama-server writes (to ``out`` when given) and find its port; ends when the child's output
        closes."""
        assert proc.stdout is not None
        with out or contextlib.nullcontext():
            for raw in proc.stdout:
                line = raw.decode(errors="replace").rstrip()
                self.tail.append(line)
                if self.port is None and (m := _LISTENING.search(line)):
                    self.port = int(m.group(1))
                    self._port_seen.set()
                if out is not None:
                    out.write(line + "\n")
                    continue
                level = (m.group(1) if (m := _LEVEL.match(line)) else "I")
                log.log(logging.ERROR if level == "E" else logging.WARNING if level == "W" else logging.DEBUG,
                        "llama-server", extra={"pid": proc.pid, "line": line[:2000]})

    def last_lines(self, n: int = 5) -> str:
        return " | ".join(list(self.tail)[-n:]) or "(no output)"

    def stop(self) -> None:
        """SIGTERM to the PID we started, SIGKILL after STOP_GRACE_S."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        terminate(proc, STOP_GRACE_S)
        log.info("llama-server stopped", extra={"pid": proc.pid, "exit_code": proc.returncode})
