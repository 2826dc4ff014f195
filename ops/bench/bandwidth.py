"""The machine's limit for decoding: memory read bandwidth, and the bytes of weights each new token reads.

Decoding one token multiplies one activation vector by every language-model weight once, so it reads all
of them from memory; with weights far larger than the caches, ms/token cannot go below
bytes-read-per-token / read-bandwidth. The bytes come from the IR itself (every constant's size as
stored, int4/int8 packing, scales and zero points included), not from a parameter count.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from ops.bench.stats import best_rate

LANGUAGE_MODEL_XML = "openvino_language_model.xml"


@dataclass
class WeightBytes:
    total: int  # every distinct constant of the language model, as stored
    by_type: dict[str, int]  # element type -> bytes (u4, u8, f16, f32, ...)
    lm_head: int  # the output projection (vocab x hidden, with its scales); read once per token
    constants: int

    def as_dict(self) -> dict:
        return asdict(self)


def ir_weight_bytes(xml_text: str, vocab_size: int | None = None) -> WeightBytes:
    """Bytes of the constants an OpenVINO IR reads (each stored blob counted once, shared ones too).

    With ``vocab_size``, constants whose first dimension is the vocabulary (the lm_head weight and its
    per-row scales / zero points) are summed as ``lm_head``: with tied embeddings the token embedding table
    is a separate model, so this is the one vocab-sized read per decode step.
    """
    seen: set[tuple[int, int]] = set()
    by_type: dict[str, int] = {}
    lm_head = 0
    for layer in ET.fromstring(xml_text).iter("layer"):
        if layer.get("type") != "Const":
            continue
        data = layer.find("data")
        if data is None or data.get("size") is None:
            continue
        offset, size = int(data.get("offset", "0")), int(data.get("size", "0"))
        if (offset, size) in seen:
            continue
        seen.add((offset, size))
        kind = data.get("element_type", "?")
        by_type[kind] = by_type.get(kind, 0) + size
        shape = [int(d) for d in data.get("shape", "").split(",") if d.strip()]
        if vocab_size and shape and shape[0] == vocab_size:
            lm_head += size
    return WeightBytes(sum(by_type.values()), dict(sorted(by_type.items())), lm_head, len(seen))


def artifact_weight_bytes(artifact: Path) -> WeightBytes:
    import json

    config = json.loads((artifact / "config.json").read_text())
    vocab = config.get("text_config", config).get("vocab_size")
    return ir_weight_bytes((artifact / LANGUAGE_MODEL_XML).read_text(), vocab)


def kv_bytes_per_token(config: dict, context_tokens: int, bytes_per_value: float = 1.0) -> float:
    """KV cache read per decode step at ``context_tokens`` (u8 KV cache: 1 byte/value, scales ignored)."""
    text = config.get("text_config", config)
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    return 2 * text["num_hidden_layers"] * text["num_key_value_heads"] * head_dim * context_tokens * bytes_per_value


def floor_ms_per_token(bytes_per_token: float, bandwidth_bytes_per_s: float) -> float:
    if bandwidth_bytes_per_s <= 0:
        raise ValueError("bandwidth must be positive")
    return 1000.0 * bytes_per_token / bandwidth_bytes_per_s


@dataclass
class Bandwidth:
    one_thread: float  # bytes/s, best pass
    all_threads: float
    threads: int
    array_bytes: int
    passes: int

    def as_dict(self) -> dict:
        return asdict(self)


def measure_bandwidth(gib: float = 1.0, passes: int = 5, threads: int | None = None) -> Bandwidth:
    """Read bandwidth: best of ``passes`` reads of a ``gib`` GiB array, on one thread and on ``threads``.

    numpy reductions and dot release the GIL, so Python threads each reading a slice read memory in parallel.
    """
    import numpy as np

    threads = threads or len(os.sched_getaffinity(0))
    data = np.ones(int(gib * 2**30) // 4, dtype=np.float32)  # written once, so every page is resident
    chunks = np.array_split(data, threads)
    # Two kernels, the faster counts: a reduction that is compute-bound on some CPUs would understate the
    # bandwidth and so make the floor too easy to reach. dot(x, x) streams x once.
    kernels = (np.add.reduce, lambda x: np.dot(x, x))
    one = parallel = 0.0
    with ThreadPoolExecutor(threads) as pool:
        for kernel in kernels:
            one = max(one, best_rate(lambda k=kernel: k(data), passes, data.nbytes))
            parallel = max(parallel, best_rate(lambda k=kernel: list(pool.map(k, chunks)), passes, data.nbytes))
    return Bandwidth(one, parallel, threads, data.nbytes, passes)
