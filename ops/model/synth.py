"""Synthetic Qwen3-VL checkpoints in Hugging Face format, made locally (no hub).

``tiny`` converts and runs in seconds and is what the tests use. ``2b`` has the real
Qwen3-VL-2B-Instruct shape (2.13 B parameters): its compute and memory are the real model's,
so it is the benchmark model, but its weights are random and its answers are noise.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass
from pathlib import Path

# Qwen's special tokens, in Qwen's order; they follow the regular vocabulary as in the real model.
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
]
# Added tokens the real tokenizer does not mark special ("special": false in its tokenizer_config.json): they decode
# as text, so a tool call's <tool_call> tags survive detokenization that skips special tokens.
TEXT_TOKENS = {"<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
               "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>"}

# The chat format of Qwen3-VL-Instruct's template, written for the synthetic checkpoint (the real checkpoint brings
# its own): images as vision tags in their turns; with tools, a system turn listing them as JSON lines in <tools>;
# an assistant's calls as <tool_call>{"name", "arguments"}</tool_call> blocks; tool results as <tool_response>
# blocks in one user turn. Those are what the service's tool calling renders, constrains and parses
# (service.http.tools), and what llama-server recognises in a template (Hermes-style calls).
CHAT_TEMPLATE = r"""
{%- macro text(content) -%}
{%- if content is string -%}{{- content -}}
{%- else -%}{%- for part in content -%}
{%- if part.type == 'image' or 'image' in part or 'image_url' in part -%}<|vision_start|><|image_pad|><|vision_end|>
{%- elif part.type == 'video' or 'video' in part -%}<|vision_start|><|video_pad|><|vision_end|>
{%- elif 'text' in part -%}{{- part.text -}}{%- endif -%}
{%- endfor -%}{%- endif -%}
{%- endmacro -%}
{%- set system = messages[0].role == 'system' -%}
{%- if tools -%}
{{- '<|im_start|>system\n' -}}{%- if system -%}{{- text(messages[0].content) + '\n\n' -}}{%- endif -%}
{{- '# Tools\n\nFunctions you may call, one JSON signature per line:\n<tools>' -}}
{%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
{{- '\n</tools>\n\nTo call one, answer with its name and arguments as a JSON object in tags:\n<tool_call>\n' -}}
{{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif system -%}
{{- '<|im_start|>system\n' + text(messages[0].content) + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) -%}
{{- '<|im_start|>' + message.role + '\n' + text(message.content) + '<|im_end|>\n' -}}
{%- elif message.role == 'assistant' -%}
{{- '<|im_start|>assistant\n' -}}{%- if message.content -%}{{- text(message.content) -}}{%- endif -%}
{%- for call in message.tool_calls or [] -%}
{%- set call = call.function or call -%}
{%- if message.content or not loop.first -%}{{- '\n' -}}{%- endif -%}
{{- '<tool_call>\n{"name": "' + call.name + '", "arguments": ' -}}
{{- call.arguments if call.arguments is string else (call.arguments | tojson) -}}
{{- '}\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- elif message.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\n<tool_response>\n' + text(message.content) + '\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""

CORPUS = """
A photo of a red bicycle leaning against a brick wall in the afternoon sun. Two cats sleep on a
blue sofa next to a window. The chart shows revenue growing each quarter, with a dip in the third.
A street market sells oranges, lemons, apples and fresh bread. The invoice lists three items and a
total of forty two dollars. What is in this image? Describe the picture in one sentence. How many
people are standing near the bus? The dog is brown and white, and it is running on green grass.
Servers in the rack have blinking lights; one cable is unplugged. The screenshot shows an error
dialog that says the disk is full. A mountain lake reflects snowy peaks under a clear sky.
"""


@dataclass(frozen=True)
class Shape:
    """Sizes of one synthetic checkpoint."""

    name: str
    regular_vocab: int  # ids below this are BPE tokens; Qwen's specials follow
    vocab_size: int  # embedding rows (the real model pads past the specials)
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    mrope_section: tuple[int, int, int]
    vision_depth: int
    vision_hidden: int
    vision_intermediate: int
    vision_heads: int
    deepstack: tuple[int, ...]
    dtype: str


SHAPES = {
    # 4 text layers for 3 deepstack layers: llama.cpp adds the deepstack features to the first n_deepstack layers'
    # outputs, and on the last layer those rows are already cut to the outputs (GGML_ASSERT(ggml_can_repeat) at
    # load when every text layer is a deepstack layer), so it needs at least one plain layer after them.
    "tiny": Shape("tiny", 3000, 3072, 64, 4, 4, 2, 32, 128, (6, 5, 5), 4, 64, 128, 4, (1, 2, 3), "float32"),
    # Qwen3-VL-2B-Instruct's published config.json.
    "2b": Shape(
        "2b", 151643, 151936, 2048, 28, 16, 8, 128, 6144, (24, 20, 20), 24, 1024, 4096, 16, (5, 11, 17),
        "bfloat16",
    ),
    # The smallest shape whose llama.cpp load takes the 2b shape's CPU kernel paths (tests/integration/
    # test_llamacpp_kernels.py): every Q4_0 matrix repacked (rows in multiples of 8, ggml-cpu/repack.cpp), and a
    # hidden size that is a multiple of 256 so the tied embedding/output matrix is Q6_K as in 2b (llama-quantize falls
    # back to Q8_0 for tiny's 64); 2b's head sizes (text 128, vision 64) and bf16, so conversion and attention match.
    "kernels": Shape("kernels", 3000, 3072, 256, 4, 2, 1, 128, 768, (24, 20, 20), 4, 128, 256, 2, (1, 2, 3),
                     "bfloat16"),
}


def special_token_ids(shape: Shape) -> dict[str, int]:
    return {tok: shape.regular_vocab + i for i, tok in enumerate(SPECIAL_TOKENS)}


def _filler_words(seed: int):
    """Endless, deterministic, pronounceable word pieces to fill the vocabulary up to its size."""
    rng = random.Random(seed)
    syllables = ["".join(p) for p in itertools.product("bcdfghklmnprstvz", "aeiou")]
    for n in itertools.count(1):
        for _ in range(len(syllables) ** 2):
            word = "".join(rng.choice(syllables) for _ in range(1 + n % 3))
            yield ("Ġ" if rng.random() < 0.7 else "") + word


def build_tokenizer(shape: Shape, seed: int = 0):
    """A byte-level BPE trained on a small corpus, padded to the shape's regular vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from tokenizers.processors import ByteLevel as ByteLevelProcessor

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = ByteLevelProcessor(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=min(shape.regular_vocab, 1000),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS] * 4, trainer=trainer)

    spec = json.loads(tok.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    fill = _filler_words(seed)
    while len(vocab) < shape.regular_vocab:
        word = next(fill)
        if word not in vocab:
            vocab[word] = len(vocab)
    spec["added_tokens"] = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": t not in TEXT_TOKENS}
        for t, i in special_token_ids(shape).items()
    ]
    return Tokenizer.from_str(json.dumps(spec))


def build_config(shape: Shape):
    from transformers import Qwen3VLConfig

    ids = special_token_ids(shape)
    text = {
        "vocab_size": shape.vocab_size,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "max_position_embeddings": 262144,
        "rope_theta": 5000000,
        "rope_scaling": {"rope_type": "default", "mrope_section": list(shape.mrope_section),
                         "mrope_interleaved": True},
        "tie_word_embeddings": True,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "dtype": shape.dtype,
    }
    vision = {
        "depth": shape.vision_depth,
        "hidden_size": shape.vision_hidden,
        "intermediate_size": shape.vision_intermediate,
        "num_heads": shape.vision_heads,
        "out_hidden_size": shape.hidden,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "num_position_embeddings": 2304,
        "deepstack_visual_indexes": list(shape.deepstack),
    }
    return Qwen3VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
        architectures=["Qwen3VLForConditionalGeneration"],
    )


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def write_processor_files(shape: Shape, out: Path) -> None:
    """Processor configs as JSON: the Qwen3-VL processor class itself wants torchvision (DESIGN §4)."""
    ids = special_token_ids(shape)
    image = {
        "size": {"longest_edge": 16777216, "shortest_edge": 65536},
        "patch_size": 16,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_resize": True,
        "do_convert_rgb": True,
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen3VLProcessor",
    }
    _write_json(out / "preprocessor_config.json", image)
    _write_json(out / "video_preprocessor_config.json",
                {**image, "fps": 2, "video_processor_type": "Qwen3VLVideoProcessor"})
    _write_json(out / "chat_template.json", {"chat_template": CHAT_TEMPLATE})
    _write_json(out / "generation_config.json", {
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "pad_token_id": ids["<|endoftext|>"],
        "do_sample": False,
    })


def write_tokenizer_files(shape: Shape, out: Path, seed: int) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(shape, seed),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=[t for t in SPECIAL_TOKENS
                                   if t not in ("<|im_end|>", "<|endoftext|>") and t not in TEXT_TOKENS],
        model_max_length=262144,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    # Qwen's tokenizer class name, so tools that dispatch on it behave as with the real checkpoint.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "Qwen2TokenizerFast"
    _write_json(cfg_path, cfg)


def synthesize(shape_name: str, out: Path, seed: int = 0) -> Path:
    """Write a complete checkpoint for ``shape_name`` into ``out`` (created; must be empty or absent)."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    if shape_name not in SHAPES:
        raise ValueError(f"unknown shape {shape_name!r}; choose one of: {', '.join(SHAPES)}")
    shape = SHAPES[shape_name]
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty; pick a new --out or remove it")
    out.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(seed)
    dtype = getattr(torch, shape.dtype)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # build in the target dtype: the 2b shape in fp32 would need 8.5 GB
    try:
        model = Qwen3VLForConditionalGeneration(build_config(shape)).eval()
    finally:
        torch.set_default_dtype(previous)
    model.save_pretrained(out, safe_serialization=True)
    write_tokenizer_files(shape, out, seed)
    write_processor_files(shape, out)
    return out
