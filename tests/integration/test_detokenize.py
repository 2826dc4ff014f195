"""Streamed text comes out token by token with the model's real tokenizer, and adds up to the whole answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.engine.detokenize import INCOMPLETE, IncrementalDecoder

TEXTS = ["Plain ASCII, with punctuation: done.", "Grüße aus Köln — naïve café", "猫が二匹います。",
         "emoji 🐈‍⬛ and 👍🏽 end",
         "  leading spaces\nand lines\n\n"]


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path):
    import openvino_genai as ov_genai

    return ov_genai.Tokenizer(str(tiny_model))


@pytest.mark.parametrize("text", TEXTS)
def test_pieces_add_up_to_the_decoded_text_and_are_never_partial(tokenizer, text):
    ids = [int(i) for i in tokenizer.encode(text, add_special_tokens=False).input_ids.data[0]]
    decoder = IncrementalDecoder(tokenizer)
    pieces = [decoder.push([i]) for i in ids]
    pieces.append(decoder.flush())
    assert "".join(pieces) == tokenizer.decode(ids)
    assert not any(INCOMPLETE in p for p in pieces), pieces


def test_text_comes_out_on_the_token_that_completes_it(tokenizer):
    # The point of the module: no 3-token hold-back. An ASCII word is out on its own token.
    ids = [int(i) for i in tokenizer.encode(" hello world again", add_special_tokens=False).input_ids.data[0]]
    decoder = IncrementalDecoder(tokenizer)
    assert decoder.push(ids[:1]) == tokenizer.decode(ids[:1]) != ""
