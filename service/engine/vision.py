"""Qwen3-VL's vision encoder run directly on the artifact's three vision sub-models, with its results kept.

genai re-runs the vision transformer (the ``vision_embeddings_merger`` model: most of an image's cost) for every
image of the prompt on every request, so a follow-up about the same image pays for it again. Here an image's
embeddings are computed once and kept, keyed by the image's pixel digest, in a small LRU: a follow-up, a stateless
client resending the image and a second conversation about it all skip the encoder.

Per image (the Qwen2-VL image processor, then the vision tower around the exported models):

1. resize to multiples of patch x merge pixels (service.engine.prompt_limits.VisionGrid, the same rule the prompt limits
   count with), scale to [-1, 1] with the processor's mean and std, repeat the frame ``temporal_patch_size`` times
   and cut it into flattened patches in merge-block order;
2. ``vision_embeddings``: patch embedding; plus the learned position embedding bilinearly interpolated to the
   image's grid (``vision_embeddings_pos`` looks up the four corners);
3. ``vision_embeddings_merger``: the transformer with 2D rotary positions, then the merger: one embedding per
   merge x merge block, and the deepstack features the language model adds into its first layers.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from service.engine.prompt_limits import VisionGrid


@dataclass(frozen=True)
class VisionConfig:
    patch: int
    merge: int
    temporal_patch: int
    heads: int
    hidden: int
    grid_side: int  # the learned position embedding is grid_side x grid_side
    mean: tuple[float, ...]
    std: tuple[float, ...]
    grid: VisionGrid

    @classmethod
    def of_model(cls, model_dir: Path) -> VisionConfig:
        vision = json.loads((Path(model_dir) / "config.json").read_text())["vision_config"]
        pre = json.loads((Path(model_dir) / "preprocessor_config.json").read_text())
        return cls(patch=int(vision["patch_size"]), merge=int(vision["spatial_merge_size"]),
                   temporal_patch=int(vision["temporal_patch_size"]), heads=int(vision["num_heads"]),
                   hidden=int(vision["hidden_size"]), grid_side=int(vision["num_position_embeddings"] ** 0.5),
                   mean=tuple(pre.get("image_mean", (0.5,) * 3)), std=tuple(pre.get("image_std", (0.5,) * 3)),
                   grid=VisionGrid.of_model(model_dir))


@dataclass(frozen=True)
class EncodedImage:
    """What the language model takes for one image: one embedding per image token, and the deepstack features."""

    embeds: np.ndarray  # (tokens, hidden)
    deepstack: np.ndarray  # (deepstack layers, tokens, hidden)
    grid: tuple[int, int, int]  # (t, h, w) in image tokens: merge x merge patches each

    @property
    def tokens(self) -> int:
        return int(self.embeds.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.embeds.nbytes + self.deepstack.nbytes)


def patches(pixels: np.ndarray, cfg: VisionConfig) -> tuple[np.ndarray, tuple[int, int, int]]:
    """(1, H, W, 3) uint8 RGB -> flattened patches (t*h*w, 3*temporal*patch*patch) float32 and the grid (t, h, w)."""
    from PIL import Image

    height, width = int(pixels.shape[1]), int(pixels.shape[2])
    w, h = cfg.grid.resized(width, height)
    image = Image.fromarray(pixels[0])
    if (w, h) != (width, height):
        image = image.resize((w, h), Image.Resampling.BICUBIC)
    x = np.asarray(image, dtype=np.float32) / 255.0
    x = (x - np.asarray(cfg.mean, np.float32)) / np.asarray(cfg.std, np.float32)
    x = np.repeat(x.transpose(2, 0, 1)[None], cfg.temporal_patch, axis=0)  # (temporal, C, H, W): one still frame
    p, m, gh, gw = cfg.patch, cfg.merge, h // cfg.patch, w // cfg.patch
    x = x.reshape(1, cfg.temporal_patch, 3, gh // m, m, p, gw // m, m, p)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)  # merge blocks first, then the patches inside each block
    return np.ascontiguousarray(x.reshape(gh * gw, -1)), (1, gh, gw)


def position_lookup(grid: tuple[int, int, int], cfg: VisionConfig) -> tuple[np.ndarray, np.ndarray]:
    """The four corner indices into the learned position table, and their bilinear weights, per patch."""
    _, h, w = grid
    side = cfg.grid_side
    hi, wi = np.linspace(0, side - 1, h, dtype=np.float32), np.linspace(0, side - 1, w, dtype=np.float32)
    h0, w0 = hi.astype(np.int64), wi.astype(np.int64)
    h1, w1 = np.minimum(h0 + 1, side - 1), np.minimum(w0 + 1, side - 1)
    dh, dw = (hi - h0)[:, None], (wi - w0)[None, :]
    idx = [(a[:, None] * side + b[None, :]).ravel() for a, b in ((h0, w0), (h0, w1), (h1, w0), (h1, w1))]
    wts = [((1 - dh) * (1 - dw)).ravel(), ((1 - dh) * dw).ravel(), (dh * (1 - dw)).ravel(), (dh * dw).ravel()]
    return np.stack(idx), np.stack(wts).astype(np.float32)


def merge_order(values: np.ndarray, grid: tuple[int, int, int], merge: int) -> np.ndarray:
    """Rows in raster order (h, w) -> the merge-block order the patches are in."""
    t, h, w = grid
    v = np.tile(values, (t, 1)).reshape(t, h // merge, merge, w // merge, merge, -1)
    return v.transpose(0, 1, 3, 2, 4, 5).reshape(t * h * w, -1)


def rotary(grid: tuple[int, int, int], cfg: VisionConfig) -> np.ndarray:
    """The vision transformer's 2D rotary angles: (row, column) of each patch, in merge-block order."""
    _, h, w = grid
    dim = cfg.hidden // cfg.heads // 2
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    rows = np.repeat(np.arange(h)[:, None], w, axis=1)
    cols = np.repeat(np.arange(w)[None, :], h, axis=0)
    coords = merge_order(np.stack([rows.ravel(), cols.ravel()], axis=1), grid, cfg.merge)
    return (coords[:, :, None] * inv_freq[None, None, :]).reshape(len(coords), -1).astype(np.float32)


class VisionEncoder:
    """The three compiled vision models; ``encode`` returns a kept result when it has seen the image before.

    Only the inference thread calls it. ``runs`` counts the encoder's real runs (the service exports it).
    """

    def __init__(self, core, model_dir: Path, device: str, properties: dict, cache_bytes: int,
                 decompress: bool = False):
        """``decompress``: unpack the artifact's int8 weights at load (decompress_weights), VLFLEET_VISION_WEIGHTS."""
        self.cfg = VisionConfig.of_model(model_dir)

        def load(name: str, *rewrites):
            model = core.read_model(str(Path(model_dir) / f"openvino_{name}_model.xml"))
            for rewrite in rewrites + ((decompress_weights,) if decompress else ()):
                rewrite(model)
            return core.compile_model(model, device, properties).create_infer_request()

        self._patch_embed = load("vision_embeddings", _patch_embedding_as_matmul)
        self._position = load("vision_embeddings_pos")
        self._merger = load("vision_embeddings_merger")
        self._cache: OrderedDict[str, EncodedImage] = OrderedDict()
        self._cache_bytes = cache_bytes
        self._lock = threading.Lock()  # trim() may come from another thread
        self.runs = 0
        self.seconds = 0.0

    def encode(self, pixels: np.ndarray, digest: str) -> EncodedImage:
        with self._lock:
            hit = self._cache.get(digest)
            if hit is not None:
                self._cache.move_to_end(digest)
                return hit
        started = time.monotonic()
        encoded = self._run(pixels)
        self.runs += 1
        self.seconds += time.monotonic() - started
        self._keep(digest, encoded)
        return encoded

    def holds(self, digest: str) -> bool:
        with self._lock:
            return digest in self._cache

    def trim(self) -> None:
        with self._lock:
            self._cache.clear()

    def _run(self, pixels: np.ndarray) -> EncodedImage:
        flat, grid = patches(pixels, self.cfg)
        hidden = self._patch_embed.infer({"hidden_states": flat})[0]
        idx, wts = position_lookup(grid, self.cfg)
        corners = self._position.infer({"input": idx})[0]  # (4, h*w, hidden)
        hidden = hidden + merge_order((corners * wts[:, :, None]).sum(axis=0), grid, self.cfg.merge)
        n = hidden.shape[0]
        out = self._merger.infer({"hidden_states": hidden.astype(np.float32),
                                  "attention_mask": np.zeros((1, n, n), np.float32),  # one image: all attend
                                  "rotary_pos_emb": rotary(grid, self.cfg)})
        t, h, w = grid
        return EncodedImage(np.array(out[0]), np.array(out[1]), (t, h // self.cfg.merge, w // self.cfg.merge))

    def _keep(self, digest: str, encoded: EncodedImage) -> None:
        with self._lock:
            self._cache[digest] = encoded
            while sum(e.nbytes for e in self._cache.values()) > self._cache_bytes and len(self._cache) > 1:
                self._cache.popitem(last=False)


def _patch_embedding_as_matmul(model) -> None:
    """The patch embedding's Conv3d, whose kernel covers its whole input (one output position per patch), as the
    matmul it is: (patches, C*T*P*P) @ (hidden, C*T*P*P)^T, reshaped back to the convolution's output.

    The CPU plugin runs the convolution as a direct convolution (brgconv, AMX bf16): ~117 ms for the 2b shape's 468
    patches (1536 -> 1024) on a 2-core AMX Xeon, where the same product as a FullyConnected (brgemm) takes ~4 ms.
    Only a convolution whose window is its whole input is rewritten (no padding, no dilation): the sum is then over
    (C, T, P, P) of input and kernel in the same order, which is what the two reshapes line up."""
    import openvino.opset13 as ops

    for conv in model.get_ordered_ops():
        if conv.get_type_name() != "Convolution":
            continue
        x, w, attrs = conv.input_value(0), conv.input_value(1), conv.get_attributes()
        window, kernel = x.get_partial_shape()[2:], w.get_partial_shape()
        if (window.is_dynamic or kernel.is_dynamic or list(window.to_shape()) != list(kernel.to_shape())[2:]
                or any(attrs["pads_begin"]) or any(attrs["pads_end"]) or attrs["auto_pad"] not in ("explicit", "valid")
                or any(d != 1 for d in attrs["dilations"])):
            continue
        out, k = kernel[0].get_length(), int(np.prod(kernel.to_shape()[1:]))
        shape = lambda *dims: ops.constant(np.array(dims, dtype=np.int64))  # noqa: E731
        y = ops.matmul(ops.reshape(x, shape(-1, k), False), ops.reshape(w, shape(out, k), False), False, True)
        y.set_friendly_name(conv.get_friendly_name())
        y = ops.reshape(y, shape(-1, out, *[1] * len(window)), False)  # the convolution's (N, hidden, 1, 1, 1)
        for target in conv.output(0).get_target_inputs():
            target.replace_source_output(y.output(0))
    model.validate_nodes_and_infer_types()


def decompress_weights(model) -> int:
    """Replace each int8/uint8 weight's decompression (Convert, minus the zero point, times the scale) with its
    result, a constant in the decompression's own type (f16 in the exported IR); returns how many were replaced.

    The CPU plugin runs a matmul whose weights arrive through that chain on its compressed kernel, which unpacks and
    scales the weights inside every product: the image encode's matmuls (468 patches at 2b) then run below the plain
    kernel's rate. Unpacked once here, they take the plain kernel, for more memory: the f16 constants are twice the int8
    weights' size, and the plugin packs its own copy for the kernel beside them."""
    import openvino.opset13 as ops

    folded = 0
    for node in model.get_ordered_ops():
        if node.get_type_name() != "Multiply" or not _has_int8_source(node):
            continue
        value = _constant_value(node)
        if value is None:
            continue
        node.output(0).replace(ops.constant(value).output(0))
        folded += 1
    model.validate_nodes_and_infer_types()
    return folded


_FOLDABLE = {"Convert", "Subtract", "Multiply"}


def _has_int8_source(node) -> bool:
    if node.get_type_name() == "Constant":
        return node.get_element_type().get_type_name() in ("i8", "u8")
    return node.get_type_name() in _FOLDABLE and any(
        _has_int8_source(node.input_value(i).get_node()) for i in range(node.get_input_size()))


def _constant_value(node) -> np.ndarray | None:
    """The value of a subgraph of constants and _FOLDABLE ops, or None where it reads anything else (or a type numpy
    has no dtype for: bf16, int4)."""
    kind = node.get_type_name()
    try:
        dtype = node.get_output_element_type(0).to_dtype()
    except (RuntimeError, TypeError):
        return None
    if kind == "Constant":
        return node.get_data()
    if kind not in _FOLDABLE:
        return None
    args = [_constant_value(node.input_value(i).get_node()) for i in range(node.get_input_size())]
    if any(a is None for a in args):
        return None
    if kind == "Convert":
        return args[0].astype(dtype)
    # in f32: numpy's f16 arithmetic is several times slower, and one rounding at the end is the closer result
    return (np.subtract if kind == "Subtract" else np.multiply)(*args, dtype=np.float32).astype(dtype)
