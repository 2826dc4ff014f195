"""Service configuration from VLFLEET_* environment variables, validated once at start.

Each setting is declared once in ``FIELDS`` (name, type, default, help); the docs' configuration
reference is generated from that table. A bad value stops the process with a message that names
the variable and what it accepts; so does a VLFLEET_* name nothing reads (a misspelt setting would
otherwise be ignored), with the nearest valid name. What the fleet side needs from here (the engine
names, the default engine, the names a host reads) it reads through ``service.runtime.contract``.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PREFIX = "VLFLEET_"


class SettingsError(ValueError):
    """A VLFLEET_* variable has a value the service cannot use."""


@dataclass(frozen=True)
class Field:
    name: str  # attribute name; the variable is PREFIX + name.upper()
    parse: Callable[[str], Any]
    default: Any
    help: str
    accepts: str = ""  # what a valid value looks like, for the error message and the docs; "" = the parser's own

    def __post_init__(self) -> None:
        if not self.accepts:
            object.__setattr__(self, "accepts", self.parse.accepts)

    @property
    def env(self) -> str:
        return PREFIX + self.name.upper()

    @property
    def choices(self) -> tuple[str, ...] | None:
        """The values a choice field accepts, in their declared order; None for other fields."""
        return self.parse.choices if isinstance(self.parse, _Choice) else None


@dataclass(frozen=True)
class _Range:
    """A parser for a ``kind`` number within [lo, hi]; ``what`` names the kind in messages and the docs."""

    kind: type
    lo: float
    hi: float
    what: str

    def __call__(self, raw: str) -> Any:
        value = self.kind(raw)
        if not self.lo <= value <= self.hi:
            raise ValueError
        return value

    @property
    def accepts(self) -> str:
        return f"{self.what} {self.lo}-{self.hi}"


def _int_range(lo: int, hi: int) -> _Range:
    return _Range(int, lo, hi, "an integer")


def _float_range(lo: float, hi: float, what: str = "a number") -> _Range:
    return _Range(float, lo, hi, what)


def _bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError


_bool.accepts = "true or false"  # type: ignore[attr-defined]


@dataclass(frozen=True)
class _Choice:
    """A parser that accepts one of ``choices`` (kept, so others can read them: ``Field.choices``)."""

    choices: tuple[str, ...]

    def __call__(self, raw: str) -> str:
        if raw not in self.choices:
            raise ValueError
        return raw

    @property
    def accepts(self) -> str:
        return " or ".join(filter(None, (", ".join(self.choices[:-1]), self.choices[-1])))


def _choice(*choices: str) -> _Choice:
    return _Choice(choices)


def _csv(raw: str) -> tuple[str, ...]:
    return tuple(part.strip().lower() for part in raw.split(",") if part.strip())


def _path(raw: str) -> Path | None:
    return Path(raw) if raw else None


MiB = 1024 * 1024

# One row per setting: rows alike in shape by design (a declaration table, no logic repeated).
FIELDS: tuple[Field, ...] = (
    Field("model_dir", _path, None, "OpenVINO model artifact directory (with manifest.json).", "a directory path"),
    Field("model_name", str, "qwen3-vl-2b-instruct", "Model id reported by /v1/models and accepted in requests.",
          "a string"),
    Field("host", str, "127.0.0.1", "Address to bind. Loopback by default: nginx is the public entry.",
          "an IP address or host name"),
    Field("port", _int_range(1, 65535), 8000, "TCP port to listen on."),
    Field("device", _choice("CPU"), "CPU", "OpenVINO device."),
    Field("engine", _choice("direct", "serial", "batching", "llamacpp", "hybrid", "paged"), "direct",
          "direct: one request at a time over the artifact's sub-models, keeping encoded images and the last few "
          "conversations' KV, so a follow-up re-runs neither the vision encoder nor the earlier turns. serial: one "
          "genai VLMPipeline, one request at a time. batching: a "
          "ContinuousBatchingPipeline whose decode steps serve several requests at once. llamacpp: a private "
          "llama-server child on a GGUF artifact (made by `vlfleet model.gguf`: VLFLEET_LLAMACPP_MODEL_DIR, else "
          "VLFLEET_MODEL_DIR), one request at a time; decodes faster, first token slower (docs/engines.md). "
          "hybrid: the direct engine's OpenVINO vision tower in front of llama.cpp's language model (the GGUF "
          "artifact of VLFLEET_LLAMACPP_MODEL_DIR, in a child process): up to VLFLEET_MAX_BATCH requests at once "
          "sharing decode steps, each conversation's KV kept. paged: the direct engine serving up to "
          "VLFLEET_MAX_BATCH requests at once, sharing decode steps, each conversation's KV and images kept. "
          "`vlfleet tune` picks per host."),
    Field("llamacpp_server", _path, None,
          "The llama-server binary the llamacpp engine runs (`vlfleet llamacpp.build` builds one); unset = the "
          "one in the installed vlfleet-llama-server wheel (`vlfleet llamacpp.wheel`, shipped in the wheelhouse), "
          "else llama-server on PATH.", "a file path"),
    Field("llamacpp_lib", _path, None,
          "libvlfleet_llama.so, the hybrid engine's interface to libllama (`vlfleet llamacpp.build` builds one); "
          "unset = the one in the installed vlfleet-llama-server wheel.", "a file path"),
    Field("llamacpp_model_dir", _path, None,
          "The GGUF artifact the llamacpp engine serves (`vlfleet model.gguf` makes one); when set and "
          "VLFLEET_ENGINE=llamacpp it replaces VLFLEET_MODEL_DIR, so one environment serves every engine; unset = "
          "VLFLEET_MODEL_DIR.", "a directory path"),
    Field("llamacpp_ctx", _int_range(0, 1 << 20), 0,
          "Context size of the llamacpp engine's llama-server, in tokens (its KV cache); 0 = "
          "VLFLEET_MAX_INPUT_TOKENS + VLFLEET_MAX_TOKENS, the longest prompt and answer accepted."),
    Field("hybrid_prefill", _choice("openvino", "llamacpp"), "openvino",
          "Where the hybrid engine computes a new conversation's prompt. openvino: the artifact's own language "
          "model (loaded beside llama.cpp's: about its size again in memory), its KV then handed to llama.cpp, "
          "which decodes; faster to the first token where OpenVINO's prefill is (docs/engines.md). llamacpp: all "
          "of it on llama.cpp. A follow-up's new turn is llama.cpp's either way."),
    Field("llamacpp_start_timeout", _float_range(1, 3600, "a number of seconds"), 300.0,
          "Seconds the llamacpp engine waits for its llama-server to load the model (/health 200) at start and "
          "after a restart."),
    Field("llamacpp_restarts", _int_range(0, 100), 5,
          "Times in a row the llamacpp engine restarts a llama-server that died or would not start before it "
          "gives up (the service then stays unready); a restart that serves resets the count."),
    Field("max_batch", _int_range(1, 256), 4,
          "Requests generating at once (batching engine; hybrid: at most 4, paged: at most 8)."),
    Field("kv_cache_gb", _int_range(1, 1024), 2,
          "KV-cache size in GiB (direct, batching and paged engines); it also holds the prefix cache that makes "
          "follow-ups cheaper."),
    Field("threads", _int_range(0, 1024), 0,
          "OpenVINO inference threads; 0 = one per CPU in the process's affinity mask (the launcher sets it)."),
    Field("precision", _choice("auto", "bf16", "f32"), "auto",
          "Compute precision (INFERENCE_PRECISION_HINT). auto = the plugin's choice: bf16 where the CPU has it (AMX, "
          "AVX512-BF16). f32 trades the first token (image encode, prompt prefill) against decode, by how much "
          "depends on the CPU and the other settings: docs/tuning.md's \"Precision, threads, compile cache\" table "
          "gives both against the defaults, per CPU, from the newest bench run that measured it."),
    Field("lm_precision", _choice("auto", "bf16", "f32"), "auto",
          "Compute precision of the language model alone (genai's MODEL_PROPERTIES), over VLFLEET_PRECISION: f32 "
          "here with bf16 for the vision encoder keeps the fast image encode of bf16 and gives decode the int8 "
          "dynamic-quantisation kernels, which need f32 activations (CPUs with VNNI). auto = f32 on CPUs with bf16 and "
          "VNNI when VLFLEET_PRECISION is auto (measured: results/run5-avx512-levers/bench.md), else as "
          "VLFLEET_PRECISION."),
    Field("kv_precision", _choice("auto", "u8", "f16", "bf16", "f32"), "auto",
          "Precision of the language model's KV cache (KV_CACHE_PRECISION). auto = the CPU plugin's default (u8 on "
          "x86: a quarter of f32's memory and bandwidth per cached token); the bench's levers table measures the "
          "others on its CPU."),
    Field("dq_group_size", _choice("auto", "0", "32", "64", "128"), "auto",
          "Group size of the CPU plugin's dynamic quantisation (DYNAMIC_QUANTIZATION_GROUP_SIZE): activations "
          "of int4/int8 matmuls go to int8 in groups of this many values, so they run on the int8 kernels (VNNI, AMX). "
          "auto = 128 on CPUs with VNNI, the int4 conversion's own group size (the image encode and prompt prefill "
          "faster than the plugin's default 32, measured in the bench's levers table), else the plugin's default; "
          "0 = off."),
    Field("vision_weights", _choice("compressed", "decompressed"), "compressed",
          "How the direct, paged and hybrid engines hold the vision encoder's int8 weights. compressed = as the "
          "artifact stores them, unpacked inside every matmul of every image encode; decompressed = unpacked once at "
          "load into f16 constants, so the image encode runs the plugin's plain matmul kernels instead of its "
          "compressed ones, for more memory. The bench's levers table gives both on its CPU (first token, peak RSS)."),
    Field("http_threads", _int_range(2, 256), 16,
          "gunicorn threads in the one worker process (each open SSE stream holds one)."),
    Field("queue_size", _int_range(1, 1024), 8,
          "Requests that may wait for the inference thread; beyond it: 429 with Retry-After."),
    Field("queue_timeout", _float_range(0.1, 3600, "a number of seconds"), 120.0,
          "Seconds a request may wait for the inference thread: past that, a client is better off retrying later or "
          "on another host. A request whose estimated wait is longer gets 429 with Retry-After at once, not a 503 "
          "after the wait (the estimate: the running job's rest plus each queued job's prefill and max_tokens at the "
          "measured seconds per token; one-at-a-time engines, once an answer was timed). One that waits longer "
          "anyway gets 503."),
    Field("max_tokens", _int_range(1, 32768), 128,
          "Server maximum for max_tokens/max_completion_tokens (and the default)."),
    Field("image_max_side", _int_range(0, 8192), 448,
          "Images are downscaled so the long side is at most this many pixels (aspect kept); 0 = off. The budget "
          "of an image sent with detail \"auto\" (or none): image tokens dominate the time to first token."),
    Field("image_max_side_low", _int_range(0, 8192), 224,
          "The long side of an image sent with detail \"low\": a quarter of the default's tokens, for questions "
          "about the whole scene."),
    Field("image_max_side_high", _int_range(0, 8192), 896,
          "The long side of an image sent with detail \"high\": four times the default's tokens, for reading "
          "small text; 0 = the image as sent."),
    Field("max_images", _int_range(1, 16), 4, "Images allowed in one request."),
    Field("max_input_tokens", _int_range(16, 262144), 4096,
          "Largest prompt accepted, in tokens (text and images, the whole conversation): one prompt must not hold "
          "the single inference thread for minutes (prefill time grows with every token). The default holds a "
          "long conversation with its images; the KV cache (VLFLEET_KV_CACHE_GB) holds many times that."),
    Field("max_turns", _int_range(1, 1024), 32, "Most user turns in one conversation."),
    Field("max_conversation_images", _int_range(1, 256), 8,
          "Most images in one conversation, its earlier turns included."),
    Field("max_image_bytes", _int_range(1024, 512 * MiB), 10 * MiB, "Largest encoded image accepted, in bytes."),
    Field("max_image_pixels", _int_range(1, 1 << 30), 40_000_000,
          "Largest decoded image accepted (width x height); guards against decompression bombs."),
    Field("max_body_bytes", _int_range(1024, 1 << 30), 24 * MiB, "Largest request body accepted, in bytes."),
    Field("image_url_domains", _csv, (),
          "Comma-separated domains whose http(s) image URLs may be fetched; empty = URLs refused.",
          "comma-separated domain names"),
    Field("api_keys_file", _path, None,
          "File with one API key per line; when set, every endpoint but /healthz and /readyz needs one.",
          "a file path"),
    Field("model_cache_dir", _path, None, "OpenVINO compiled-model cache directory (faster restarts).",
          "a directory path"),
    Field("answer_cache_mb", _float_range(0, 65536), 64.0,
          "Memory for cached answers to identical deterministic requests, in MiB; 0 = cache off."),
    Field("image_cache_mb", _float_range(0, 65536), 256.0,
          "Memory for encoded images kept by the direct engine, in MiB (about 6 MiB per 448x448 image at 2b)."),
    Field("answer_cache_entries", _int_range(0, 10_000_000), 1024, "Most answers kept in the answer cache."),
    Field("memory_limit_mb", _int_range(0, 1 << 24), 0,
          "Memory the process may use, in MiB, for load shedding; 0 = the unit's MemoryHigh (cgroup) if set."),
    Field("memory_high_water", _float_range(0.05, 1.0, "a fraction"), 0.80,
          "Above this share of the memory limit new requests get 503 (load shedding)."),
    Field("system_memory_high_water", _float_range(0.05, 1.0, "a fraction"), 0.95,
          "Above this share of the host's memory in use new requests get 503 too."),
    Field("memory_low_water", _float_range(0.05, 1.0, "a fraction"), 0.70,
          "Below this share, requests are admitted again after shedding."),
    Field("warmup", _bool, True, "Run one generation at start before /readyz turns 200."),
    Field("release_id", str, "", "Release this process belongs to (shown in /readyz and /metrics).", "a string"),
    Field("log_level", _choice("debug", "info", "warning", "error"), "info", "Log level of the JSON logs."),
    Field("verify_hashes", _bool, True,
          "At start, check every model file's sha256 against the manifest (about 1 s per GB), not only sizes."),
    Field("skip_artifact_check", _bool, False,
          "Start even when the artifact's manifest checks fail (for development only)."),
)


# VLFLEET_* variables the host side reads besides FIELDS: the launcher's inputs (service/launcher.py), read before
# the settings are (it sets VLFLEET_THREADS, a field, for the service it starts).
LAUNCHER_ENV: tuple[str, ...] = ("VLFLEET_CPUS", "VLFLEET_CPU_PLAN_FILE")
# Read by the controller's tools and the tests, never by the service. A service started from their environment
# (`vlfleet serve`, the bench, the tests' servers) inherits them, so there they are no mistake; on a host they mean
# nothing, and the host program refuses them in an env file. A new one goes here (tests/unit/test_contract.py finds
# every VLFLEET_* name in the tree).
TOOLING_ENV: tuple[str, ...] = (
    "VLFLEET_CACHE",  # ops/paths.py: the controller's cache
    "VLFLEET_TORCH_INDEX",  # ops/bootstrap_venv.sh: where torch's CPU build comes from
    "VLFLEET_PROFILE_JSON",  # ops/playbook.py -> the Ansible profile callback
    "VLFLEET_REQUIRE_ALL",  # tests: a skip or xfail fails the run (CI)
    "VLFLEET_E2E_BUDGET_S", "VLFLEET_E2E_CONVERGED", "VLFLEET_E2E_FLEET",  # tests/e2e
    "VLFLEET_FAULTS_INVENTORY", "VLFLEET_ROLLOUT_INVENTORY", "VLFLEET_KEEP_FLEET", "VLFLEET_REPORT_SCREENSHOT",
)


def host_names() -> tuple[str, ...]:
    """Every VLFLEET_* name the host side reads: the settings (in FIELDS order), then the launcher's inputs."""
    return tuple(f.env for f in FIELDS) + LAUNCHER_ENV


def unknown_names(names: Iterable[str], known: Collection[str] | None = None) -> list[str]:
    """What is wrong with each VLFLEET_* name of ``names`` that is not in ``known`` (default: the host side's and
    the tooling's names): the name, and the nearest known one."""
    known = (*host_names(), *TOOLING_ENV) if known is None else tuple(known)
    problems = []
    for name in sorted(n for n in names if n.startswith(PREFIX) and n not in known):
        near = difflib.get_close_matches(name, known, n=1)
        problems.append(f"{name} is not a setting" + (f" (did you mean {near[0]}?)" if near else ""))
    return problems


@dataclass(frozen=True)
class Settings:
    values: Mapping[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None

    def replace(self, **changes: Any) -> Settings:
        unknown = set(changes) - {f.name for f in FIELDS}
        if unknown:
            raise SettingsError(f"unknown settings: {', '.join(sorted(unknown))}")
        return Settings({**self.values, **changes})


def load(environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Read every field from ``environ`` (default os.environ); ``overrides`` win and are not parsed."""
    environ = os.environ if environ is None else environ
    unknown = unknown_names(environ)
    if unknown:
        raise SettingsError(f"unknown VLFLEET_* variable: {'; '.join(unknown)}. Nothing reads it, so its value would "
                            "be ignored: fix the name or remove it (docs/configuration.md lists every setting)")
    values: dict[str, Any] = {}
    for f in FIELDS:
        raw = environ.get(f.env)
        if raw is None or raw == "":
            values[f.name] = f.default
            continue
        try:
            values[f.name] = f.parse(raw)
        except ValueError:
            raise SettingsError(f"{f.env}={raw!r} is not valid: expected {f.accepts}") from None
    settings = Settings(values).replace(**overrides)
    if settings.memory_low_water >= settings.memory_high_water:
        raise SettingsError(f"{PREFIX}MEMORY_LOW_WATER ({settings.memory_low_water}) must be below "
                            f"{PREFIX}MEMORY_HIGH_WATER ({settings.memory_high_water})")
    if settings.engine == "llamacpp" and settings.llamacpp_model_dir is not None:
        # One env file per release serves every engine and `vlfleet tune` switches only VLFLEET_ENGINE, so the GGUF
        # artifact has its own variable; it becomes model_dir, which the startup checks, /readyz's artifact id and
        # the prompt limits read.
        settings = settings.replace(model_dir=settings.llamacpp_model_dir)
    if settings.model_dir is None:
        raise SettingsError(f"{PREFIX}MODEL_DIR is not set: point it at a converted model artifact directory")
    return settings
