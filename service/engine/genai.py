"""OpenVINO GenAI specifics shared by the genai engines, serial and batching, and by the benchmarks (which prompt
as the service does).

OpenVINO is imported inside each function, so importing this module stays cheap and does not need OpenVINO.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from service.engine.conversation import Conversation, ResponseFormat, Sampling
from service.engine.errors import APIError

ANY_OBJECT = '{"type": "object"}'  # json_object: a schema any JSON object follows
SCHEMA_PARAM = "response_format.json_schema.schema"
TOOLS_PARAM = "tools"
# A forced tool call (service.http.tools) in Qwen3-VL's format: the call object between these, one newline each side.
CALL_OPEN, CALL_CLOSE = "<tool_call>\n", "\n</tool_call>"


def genai_image_tag(index: int) -> str:
    return f"<ov_genai_image_{index}>"


def render_prompt(tokenizer, conv: Conversation, image_tag: Callable[[int], str] = genai_image_tag) -> str:
    """The whole conversation through the model's chat template, each image tagged in the turn it came with.

    The same conversation always renders the same prompt, and a follow-up's prompt starts with its earlier
    turns' prompt, which is what lets the prefix cache find them. genai replaces its tags with the image's
    tokens; the direct engine passes the model's own vision placeholder instead.
    """
    messages, index = [], 0
    for turn in conv.turns:
        tags = "".join(image_tag(index + i) for i in range(len(turn.images)))
        index += len(turn.images)
        message = {"role": turn.role, "content": tags + turn.text}
        if turn.tool_calls:  # the template writes each as <tool_call>{"name", "arguments"}</tool_call>
            message["tool_calls"] = json.loads(turn.tool_calls)
        messages.append(message)
    if conv.tools:  # the template's own <tools> system block
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=json.loads(conv.tools))
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True)


def generation_config(sampling: Sampling):
    import openvino_genai as ov_genai

    cfg = ov_genai.GenerationConfig()
    cfg.max_new_tokens = sampling.max_tokens
    if sampling.temperature > 0:
        cfg.do_sample = True
        cfg.temperature = sampling.temperature
        cfg.top_p = sampling.top_p
    if sampling.seed is not None:
        cfg.rng_seed = sampling.seed
    if sampling.stop:
        cfg.stop_strings = set(sampling.stop)
        cfg.include_stop_str_in_output = False
    if sampling.ignore_eos:
        cfg.ignore_eos = True
        cfg.min_new_tokens = sampling.max_tokens
    if sampling.logprobs:
        cfg.logprobs = 1  # the chosen token's: genai computes no top-k (service.engine.logprobs)
    if sampling.response_format is not None:
        cfg.structured_output_config = structured_output(sampling.response_format)
    return cfg


def structured_output(fmt: ResponseFormat):
    """genai's StructuredOutputConfig for a format: a JSON schema, or for a forced tool call the call object between
    its tags as one structural tag (a Concat of the fixed text and the JSON schema)."""
    import openvino_genai as ov_genai

    config = ov_genai.StructuredOutputConfig
    if fmt.kind != "tool_call":
        return config(json_schema=schema_text(fmt))
    tag = config.Concat(config.ConstString(CALL_OPEN), config.JSONSchema(fmt.schema), config.ConstString(CALL_CLOSE))
    return config(structural_tags_config=tag)


def schema_text(fmt: ResponseFormat) -> str:
    return ANY_OBJECT if fmt.kind == "json_object" else fmt.schema


def check_schema(fmt: ResponseFormat) -> None:
    """The client's 400, naming what is wrong, for a schema the grammar engines cannot compile; before the request
    is queued. genai's own grammar engine (xgrammar) compiles a schema only once its request is scheduled, and a
    schema it cannot compile then breaks a ContinuousBatchingPipeline for every request after it (measured:
    each later step raises "cannot be called when we are already in scheduling phase"), so the schema is compiled
    here first by llguidance, which refuses what it does not implement by name (``not``, ``if``, look-around in a
    pattern, a dangling ``$ref``, an unknown ``type``) where xgrammar ignores some of those keywords."""
    if fmt.kind != "json_schema":  # a forced tool call's parameters were checked tool by tool (service.http.tools)
        return
    from llguidance import LLMatcher

    try:
        grammar = LLMatcher.grammar_from_json_schema(fmt.schema)
        error = LLMatcher.validate_grammar(grammar)
    except (ValueError, RuntimeError) as e:
        error = str(e)
    if error:
        raise APIError(f"'{SCHEMA_PARAM}' cannot be enforced: {error.strip()}", param=SCHEMA_PARAM,
                       code="unsupported_schema")


NUMBER_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def number_bound(fmt: ResponseFormat, fractional: bool = False) -> str | None:
    """The first bound keyword on a number of the format's schema (a forced tool call's too), or None; with
    ``fractional``, only a bound that is not a whole number (minimum 0.5)."""
    if fmt.kind not in ("json_schema", "tool_call"):
        return None

    def walk(node) -> str | None:
        if isinstance(node, list):
            return next((k for k in map(walk, node) if k), None)
        if not isinstance(node, dict):
            return None
        kinds = node.get("type")
        if "number" in (kinds if isinstance(kinds, list) else [kinds]):
            for key in NUMBER_BOUNDS:
                if key in node and not (fractional and float(node[key]).is_integer()):
                    return key
        return next((k for k in map(walk, node.values()) if k), None)

    return walk(json.loads(fmt.schema))


# The genai engines' Engine.format_limits: what check_bounds refuses.
BOUNDS_LIMIT = "bounds on a number that are not whole numbers (its grammar mis-reads them)"


def check_bounds(fmt: ResponseFormat) -> None:
    """The 400 for a fractional bound on a number, which genai 2026.4.1's grammar compiles wrong: the bound's
    decimal point matches any character (measured on the serial engine, minimum 0.5 and maximum 2: 8 answers of 20
    like '0(5' or '0\\x1d5', one of 2.604); whole-number bounds held in all of 20."""
    if key := number_bound(fmt, fractional=True):
        param = TOOLS_PARAM if fmt.kind == "tool_call" else SCHEMA_PARAM
        raise APIError(f"'{param}' cannot be enforced here: openvino-genai's grammar mis-reads a {key} that is not a "
                       f"whole number (its decimal point matches any character); whole-number bounds hold, and the "
                       f"direct engine enforces fractional ones", param=param, code="unsupported_schema")


def grammar_error(error: Exception) -> APIError | None:
    """genai's grammar engine refusing a job's schema (raised when the job starts), as the client's 400; None for
    another error."""
    text = str(error)
    if "xgrammar" not in text and "structured output" not in text.lower():
        return None
    reason = re.split(r"\.(?:cc|cpp|h|hpp):\d+:\s*", text.strip())[-1].strip()
    return APIError(f"'{SCHEMA_PARAM}' cannot be enforced: {reason}", param=SCHEMA_PARAM, code="unsupported_schema")


def pipeline_properties(settings) -> dict[str, Any]:
    """OpenVINO properties from the settings: threads, precision (global, and the language model's own), the
    language model's KV-cache precision and the compiled-model cache."""
    properties: dict[str, Any] = {}
    if settings.threads:
        properties["INFERENCE_NUM_THREADS"] = settings.threads
    if settings.precision != "auto":
        properties["INFERENCE_PRECISION_HINT"] = settings.precision
    flags = cpu_flags()
    if (group := dq_group_size(settings.dq_group_size, flags)) is not None:
        properties["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = group
    lm: dict[str, Any] = {}
    if precision := lm_precision(settings.lm_precision, settings.precision, flags):
        lm["INFERENCE_PRECISION_HINT"] = precision
    if settings.kv_precision != "auto":
        lm["KV_CACHE_PRECISION"] = settings.kv_precision
    if lm:
        properties["MODEL_PROPERTIES"] = {"language_model": lm}
    if settings.model_cache_dir:
        Path(settings.model_cache_dir).mkdir(parents=True, exist_ok=True)
        properties["CACHE_DIR"] = str(settings.model_cache_dir)
    return properties


def split_properties(settings) -> tuple[dict, dict]:
    """(vision, language model) compile properties from the same settings genai gets (its MODEL_PROPERTIES is
    genai's per-sub-model form)."""
    base = pipeline_properties(settings)
    per_model = base.pop("MODEL_PROPERTIES", {})
    return base, {**base, **per_model.get("language_model", {})}


BF16 = ("avx512_bf16", "amx_bf16")  # where the CPU plugin computes in bf16 unless told otherwise
VNNI = ("avx512_vnni", "avx_vnni", "amx_int8")  # what its int8 dynamic-quantisation kernels need


def lm_precision(setting: str, precision: str, flags: set[str]) -> str | None:
    """The language model's own precision hint, or None to leave it to VLFLEET_PRECISION.

    auto: f32 on CPUs where the plugin would pick bf16 and VNNI is there. Decode then takes the int8
    dynamic-quantisation kernels, which need f32 activations, while the vision encoder stays on bf16 (measured on an
    AVX-512 BF16/VNNI EPYC: results/run5-avx512-levers/bench.md, levers). An explicit VLFLEET_PRECISION wins.
    """
    if setting != "auto":
        return setting
    if precision == "auto" and flags & set(BF16) and flags & set(VNNI):
        return "f32"
    return None


def dq_group_size(setting: str, flags: set[str]) -> int | None:
    """The dynamic-quantisation group size to set, or None for the plugin's default.

    auto: 128 where the int8 kernels have VNNI. Groups as wide as the int4 conversion's (128) give the matmuls of
    the image encode and the prompt fewer scales to compute than the plugin's 32; decode is unchanged (measured in
    the bench's levers table). Without VNNI the plugin's choice stands: untested there.
    """
    if setting != "auto":
        return int(setting)
    return 128 if flags & set(VNNI) else None


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def scheduler_config(settings):
    """Paged KV cache with prefix caching: a follow-up re-uses the KV blocks of the turns it repeats.

    VLMPipeline only caches prefixes when given a SchedulerConfig explicitly (measured: a repeated 6.6k-token
    prompt with an image went from 5.3 s to 0.9 s to first token on the tiny model; without it, no change).
    """
    import openvino_genai as ov_genai

    scheduler = ov_genai.SchedulerConfig()
    scheduler.enable_prefix_caching = True
    scheduler.cache_size = settings.kv_cache_gb
    scheduler.max_num_seqs = settings.max_batch
    scheduler.dynamic_split_fuse = True
    return scheduler


def load_pipeline(settings):
    """The serial engine's VLMPipeline (also what the benchmarks load in-process)."""
    import openvino_genai as ov_genai

    return ov_genai.VLMPipeline(str(settings.model_dir), settings.device, scheduler_config=scheduler_config(settings),
                                **pipeline_properties(settings))


def load_batching_pipeline(settings):
    """The batching engine's ContinuousBatchingPipeline, with the same scheduler and properties."""
    import openvino_genai as ov_genai

    return ov_genai.ContinuousBatchingPipeline(str(settings.model_dir), scheduler_config(settings), settings.device,
                                               pipeline_properties(settings))


def image_tensors(conv: Conversation) -> list:
    """The conversation's images as OpenVINO tensors, in the order render_prompt tags them."""
    import openvino as ov

    return [ov.Tensor(img.pixels) for img in conv.images]
