"""The answer cache: keys that change with every input that changes the answer, and a byte bound."""

from __future__ import annotations

import numpy as np

from service.engine.answer_cache import ENTRY_OVERHEAD, AnswerCache, CachedAnswer, cache_key
from service.engine.conversation import Conversation, Sampling, Turn
from service.engine.images import PreparedImage


def image(value: int) -> PreparedImage:
    pixels = np.full((1, 4, 4, 3), value, dtype=np.uint8)
    return PreparedImage(pixels, f"digest-{value}", (4, 4))


def conv(text="What is it?", value=1) -> Conversation:
    return Conversation((Turn("user", text, (image(value),)),))


def test_key_changes_with_image_text_and_parameters():
    base = cache_key(conv(), Sampling(16), "m")
    assert base == cache_key(conv(), Sampling(16), "m")
    assert base != cache_key(conv(value=2), Sampling(16), "m")
    assert base != cache_key(conv("What is this?"), Sampling(16), "m")
    assert base != cache_key(conv(), Sampling(17), "m")
    assert base != cache_key(conv(), Sampling(16), "other-artifact")


def test_a_session_follow_up_is_keyed_by_the_session_it_continues():
    follow_up = (Turn("user", "And the colour?"),)
    a = cache_key(Conversation(follow_up, session="session-a", by_session=True), Sampling(16), "m")
    b = cache_key(Conversation(follow_up, session="session-b", by_session=True), Sampling(16), "m")
    assert a != b  # the same words after different conversations
    assert a == cache_key(Conversation(follow_up, session="session-a", by_session=True), Sampling(16), "m")
    # a first question has no session, so the web UI's and an API client's same first question share a key
    assert cache_key(Conversation(follow_up, by_session=True), Sampling(16), "m") == cache_key(
        Conversation(follow_up), Sampling(16), "m")


def test_another_response_format_is_another_answer():
    from service.engine.conversation import ResponseFormat

    free = cache_key(conv(), Sampling(16), "m")
    obj = cache_key(conv(), Sampling(16, response_format=ResponseFormat("json_object")), "m")
    one = cache_key(conv(), Sampling(16, response_format=ResponseFormat("json_schema", '{"type": "object"}')), "m")
    other = cache_key(conv(), Sampling(16, response_format=ResponseFormat("json_schema", '{"type": "array"}')), "m")
    assert len({free, obj, one, other}) == 4


def test_tools_their_history_and_a_forced_call_are_other_answers():
    """The tools are in the prompt, a call in the history too, and a forced call constrains the answer."""
    from service.engine.conversation import ResponseFormat

    ask = Turn("user", "Weather?")
    tools_a = '[{"type":"function","function":{"name":"a"}}]'
    plain = cache_key(Conversation((ask,)), Sampling(16), "m")
    listed = cache_key(Conversation((ask,), tools=tools_a), Sampling(16), "m")
    assert len({plain, listed, cache_key(Conversation((ask,), tools=tools_a.replace('"a"', '"b"')), Sampling(16),
                                         "m")}) == 3
    forced = ResponseFormat("tool_call", '{"properties":{"name":{"const":"a"}}}')
    assert listed != cache_key(Conversation((ask,), tools=tools_a), Sampling(16, response_format=forced), "m")
    called = [Turn("assistant", "", tool_calls=f'[{{"id":"c","function":{{"name":"a","arguments":"{args}"}}}}]')
              for args in ("{}", "{\\\"x\\\": 1}")]
    keys = {cache_key(Conversation((ask, turn, Turn("tool", "42"))), Sampling(16), "m") for turn in called}
    assert len(keys) == 2


def test_key_never_contains_the_image():
    key = cache_key(conv(), Sampling(16), "m")
    assert len(key) == 64 and "digest" not in key


def test_sampling_without_seed_is_not_cacheable():
    assert cache_key(conv(), Sampling(16, temperature=0.7), "m") is None
    assert cache_key(conv(), Sampling(16, temperature=0.7, seed=3), "m") is not None


def test_bytes_and_entries_stay_bounded():
    cache = AnswerCache(max_bytes=10 * (ENTRY_OVERHEAD + 100), max_entries=1000)
    for i in range(100):
        cache.put(f"k{i}", CachedAnswer(("x" * 100,), "length", 5, 100))
        assert cache.bytes <= cache.max_bytes
    assert len(cache) == 10
    assert cache.get("k99") is not None and cache.get("k0") is None
    small = AnswerCache(max_bytes=1 << 20, max_entries=3)
    for i in range(5):
        small.put(f"k{i}", CachedAnswer(("y",), "stop", 1, 1))
    assert len(small) == 3


def test_disabled_cache_stores_nothing():
    cache = AnswerCache(0, 10)
    cache.put("k", CachedAnswer(("x",), "stop", 1, 1))
    assert cache.get("k") is None
