"""service.engine.answer_ids: a prompt that starts with a remembered prompt and answer takes their ids."""

from __future__ import annotations

import numpy as np

from service.engine.answer_ids import END_OF_TURN, AnswerIds


def _chars(text: str) -> np.ndarray:
    """A stand-in tokenizer: one id per character (special tokens included, as characters)."""
    return np.array([ord(c) for c in text], np.int64)


def test_the_longest_remembered_prefix_is_taken_as_computed_and_the_rest_tokenized():
    ids = AnswerIds()
    turn1 = "<user>hi" + END_OF_TURN + "<assistant>hello"
    ids.remember(turn1, np.array([1, 2, 3]))
    turn2 = turn1 + END_OF_TURN + "<user>why" + END_OF_TURN + "<assistant>because"
    ids.remember(turn2, np.array([4, 5]))
    tail = END_OF_TURN + "<user>and?" + END_OF_TURN + "<assistant>"
    assert ids.encode(turn2 + tail, _chars).tolist() == [4, 5, *_chars(tail).tolist()]
    assert ids.encode(turn1 + tail, _chars).tolist() == [1, 2, 3, *_chars(tail).tolist()]


def test_a_prompt_that_starts_with_no_remembered_answer_is_tokenized_whole():
    ids = AnswerIds()
    ids.remember("<user>hi" + END_OF_TURN + "<assistant>hello", np.array([1, 2, 3]))
    edited = "<user>hi" + END_OF_TURN + "<assistant>hellO" + END_OF_TURN
    assert ids.encode(edited, _chars).tolist() == _chars(edited).tolist()
    assert ids.encode("", _chars).tolist() == []


def test_answers_used_longest_ago_are_forgotten_first():
    ids = AnswerIds(capacity=2)
    for n, text in enumerate(("a", "b", "c")):
        ids.remember(text, np.array([n]))
    assert ids.encode("a" + END_OF_TURN, _chars).tolist() == _chars("a" + END_OF_TURN).tolist()
    assert ids.encode("c" + END_OF_TURN, _chars).tolist() == [2, *_chars(END_OF_TURN).tolist()]
