"""The synthetic checkpoint looks like Qwen3-VL to the tools that read it."""

from __future__ import annotations

import json

from ops.model.synth import SHAPES, SPECIAL_TOKENS, special_token_ids


def test_config_token_ids_match_tokenizer(tiny_checkpoint):
    config = json.loads((tiny_checkpoint / "config.json").read_text())
    tokenizer = json.loads((tiny_checkpoint / "tokenizer.json").read_text())
    added = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    assert config["model_type"] == "qwen3_vl"
    assert config["image_token_id"] == added["<|image_pad|>"]
    assert config["vision_start_token_id"] == added["<|vision_start|>"]
    assert config["vision_end_token_id"] == added["<|vision_end|>"]
    assert set(SPECIAL_TOKENS) <= set(added)


def test_tokenizer_fills_regular_vocab_below_specials(tiny_checkpoint):
    tokenizer = json.loads((tiny_checkpoint / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    assert len(vocab) == SHAPES["tiny"].regular_vocab
    assert max(vocab.values()) < min(special_token_ids(SHAPES["tiny"]).values())


def test_chat_template_renders_image_tags(tiny_checkpoint):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is this?<|im_end|>\n"
                    "<|im_start|>assistant\n")


def test_2b_shape_has_real_parameter_count():
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    from ops.model.synth import build_config

    with torch.device("meta"):
        model = Qwen3VLForConditionalGeneration(build_config(SHAPES["2b"]))
    params = sum(p.numel() for p in model.parameters())
    assert 2.0e9 < params < 2.3e9, params
