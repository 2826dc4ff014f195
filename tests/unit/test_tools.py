"""service.http.tools without a model: a forced call's schema and grammar, and the answer's text as tool_calls, whole
and streamed in any chunking."""

from __future__ import annotations

import json
import random

import pytest

from service.engine.conversation import ResponseFormat
from service.engine.errors import APIError
from service.http import tools

WEATHER = {"type": "object", "properties": {"city": {"enum": ["Oslo", "Lima"]}}, "required": ["city"]}
ANSWER = ('Let me look.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
          '<tool_call>\n{"name": "alarm", "arguments": {"minutes": 5}}\n</tool_call>')


def reassembled(text: str, rng: random.Random) -> tuple[str, list[tuple[str, dict]]]:
    """The content and calls a client rebuilds from ToolStream's deltas for ``text`` cut at random places."""
    stream, deltas, at = tools.ToolStream(), [], 0
    while at < len(text):
        step = rng.randint(1, 7)
        deltas += stream.push(text[at:at + step])
        at += step
    deltas += stream.finish()
    content = "".join(d.get("content", "") for d in deltas)
    calls: dict[int, dict] = {}
    for d in deltas:
        for c in d.get("tool_calls", ()):
            entry = calls.setdefault(c["index"], {"name": "", "arguments": ""})
            entry["name"] += c.get("function", {}).get("name", "")
            entry["arguments"] += c.get("function", {}).get("arguments", "")
    return content, [(calls[i]["name"], json.loads(calls[i]["arguments"])) for i in sorted(calls)]


def test_whole_answer_is_content_then_calls():
    content, calls = tools.parse(ANSWER)
    assert content == "Let me look."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("weather", {"city": "Oslo"}), ("alarm", {"minutes": 5})]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)
    assert len({c["id"] for c in calls}) == 2


@pytest.mark.parametrize("seed", range(20))
def test_streamed_deltas_rebuild_the_whole_answer(seed):
    content, calls = reassembled(ANSWER, random.Random(seed))
    assert content.strip() == "Let me look."
    assert calls == [("weather", {"city": "Oslo"}), ("alarm", {"minutes": 5})]


@pytest.mark.parametrize("text", ["<tool_call>\n{not json}\n</tool_call>", "a <tool_call> never closed",
                                  '<tool_call>{"name": "f", "arguments": 3}</tool_call>', "x < y and <tool"])
def test_what_is_not_a_call_stays_content(text):
    assert tools.parse(text) == (text, [])
    content, calls = reassembled(text, random.Random(0))
    assert (content, calls) == (text, [])


def test_call_schema_and_its_names():
    fmt = ResponseFormat("tool_call", json.dumps(tools.call_schema({"weather": WEATHER, "alarm": {"type": "object"}})))
    assert tools.chosen_names(fmt) == ["weather", "alarm"]
    one = tools.call_schema({"weather": WEATHER})
    assert one["properties"] == {"name": {"const": "weather"}, "arguments": WEATHER}


def test_forced_call_grammar_uses_the_tag_tokens():
    """The direct engine's grammar: the tokenizer's own <tool_call> tokens around the call object."""
    import llguidance

    from service.engine.structured import _grammar

    fmt = ResponseFormat("tool_call", json.dumps(tools.call_schema({"weather": WEATHER})))
    text = _grammar(fmt, {"<tool_call>": 3014, "</tool_call>": 3015})
    assert "<[3014]>" in text and "<[3015]>" in text
    assert not llguidance.LLMatcher.validate_grammar(_grammar(fmt, {}))


@pytest.mark.parametrize(("schema", "word"), [({"type": "string"}, "object"),
                                              ({"type": "object", "properties": {"x": {"type": "nope"}}}, "nope")])
def test_parameters_the_grammar_cannot_enforce_are_refused_naming_them(schema, word):
    with pytest.raises(APIError) as refused:
        tools.check_parameters(schema, "tools[0].function.parameters")
    assert refused.value.param == "tools[0].function.parameters" and word in str(refused.value)
