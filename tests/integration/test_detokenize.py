"""Streamed text comes out token by token with the model's real tokenizer, and adds up to the whole answer; the
byte table's fast path (service.engine.detokenize) gives what genai's decode gives."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from service.engine.detokenize import INCOMPLETE, IncrementalDecoder, joined
from service.engine.logprobs import TokenBytes

TEXTS = ["Plain ASCII, with punctuation: done.", "Grüße aus Köln — naïve café", "猫が二匹います。",
         "emoji 🐈‍⬛ and 👍🏽 end",
         "  leading spaces\nand lines\n\n"]


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path):
    import openvino_genai as ov_genai

    return ov_genai.Tokenizer(str(tiny_model))


@pytest.fixture(scope="module")
def token_bytes(tiny_model: Path) -> TokenBytes:
    return TokenBytes(tiny_model / "tokenizer.json")


@pytest.fixture(params=["genai", "byte table"])
def decoder(request, tokenizer, token_bytes) -> IncrementalDecoder:
    return IncrementalDecoder(tokenizer, token_bytes if request.param == "byte table" else None)


def _ids(tokenizer, text: str) -> list[int]:
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=False).input_ids.data[0]]


@pytest.mark.parametrize("text", TEXTS)
def test_pieces_add_up_to_the_decoded_text_and_are_never_partial(tokenizer, decoder, text):
    ids = _ids(tokenizer, text)
    pieces = [decoder.push([i]) for i in ids]
    pieces.append(decoder.flush())
    assert "".join(pieces) == tokenizer.decode(ids)
    assert not any(INCOMPLETE in p for p in pieces), pieces


def test_text_comes_out_on_the_token_that_completes_it(tokenizer, decoder):
    # The point of the module: no 3-token hold-back. An ASCII word is out on its own token.
    ids = _ids(tokenizer, " hello world again")
    assert decoder.push(ids[:1]) == tokenizer.decode(ids[:1]) != ""


def test_the_byte_table_decodes_every_token_as_genai_does(tokenizer, token_bytes):
    # Every id of the tokenizer alone (special tokens left out, added ones kept), where the table takes the fast path.
    ids = sorted(token_bytes)
    fast = 0
    for i in ids:
        text = joined(token_bytes, [i])
        if text is not None:
            assert text == tokenizer.decode([i]), i
            fast += 1
    assert fast > 0.9 * len(ids)  # most tokens are whole characters: the fast path is the common one


def test_the_byte_table_decodes_random_sequences_as_genai_does(tokenizer, token_bytes):
    # Tokens side by side, as an answer strings them (a random model's answer included): same text either way.
    rng = np.random.default_rng(7)
    known = sorted(token_bytes)
    for _ in range(200):
        ids = [int(i) for i in rng.choice(known, size=int(rng.integers(2, 12)))]
        ours = IncrementalDecoder(tokenizer, token_bytes)
        theirs = IncrementalDecoder(tokenizer)
        assert ([ours.push([i]) for i in ids], ours.flush()) == ([theirs.push([i]) for i in ids], theirs.flush()), ids
