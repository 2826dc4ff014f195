"""Tool calling (OpenAI ``tools`` / ``tool_choice``) in Qwen3-VL's own format on every engine, on the real service
and the tiny model: serial and batching (genai's structural tags), direct (llguidance), llamacpp (llama-server's
tool grammar), streamed and not.

The tiny model's weights are random, so it never writes a call by itself: under ``tool_choice`` required or a named
function every answer being a ``tool_calls`` list whose arguments validate (the ``jsonschema`` library) against the
chosen tool's parameters is the constrained decoder's doing. Answers are sampled (temperature 1, a seed per request)
for the reason test_response_format gives (greedy decoding on random weights under genai's free JSON whitespace
emits newlines forever). The answer cache is off, so every answer is generated.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
from openai import BadRequestError, OpenAI

from tests.integration.conftest import start_engine
from tests.integration.test_response_format import post

MODEL = "qwen3-vl-2b-instruct"
MAX_TOKENS = 600
REQUESTS = 6  # per engine, mode and choice
ENV = {"VLFLEET_ANSWER_CACHE_MB": "0", "VLFLEET_MAX_TOKENS": str(MAX_TOKENS)}
QUESTION = {"role": "user", "content": "Book the trip and tell me the weather there."}

# Three parameter schemas of different kinds: an enum, integer bounds (llama-server's grammar drops a *number's*
# bounds, so its engine refuses those: test_llamacpp_refuses_number_bounds), a nested object and required keys.
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
            "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "set_alarm", "description": "An alarm in so many minutes.",
        "parameters": {"type": "object", "properties": {
            "minutes": {"type": "integer", "minimum": 1, "maximum": 90},
            "repeat": {"type": "boolean"}},
            "required": ["minutes"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "book_trip", "description": "Book a trip.",
        "parameters": {"type": "object", "properties": {
            "traveller": {"type": "object", "properties": {
                "name": {"type": "string", "pattern": "^[A-Za-z ]{1,8}$"},
                "seats": {"type": "integer", "minimum": 1, "maximum": 4}},
                "required": ["name", "seats"], "additionalProperties": False},
            "class": {"enum": ["economy", "business"]}},
            "required": ["traveller", "class"], "additionalProperties": False}}},
]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module", params=["serial", "batching", "direct", "llamacpp", "hybrid"])
def engine(request, tmp_path_factory):
    """(name, service, client) of each engine, the answer cache off."""
    name = request.param
    server = start_engine(name, request, tmp_path_factory, **ENV)
    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=180)
    yield name, server, client
    server.stop()


def calls_of(client: OpenAI, stream: bool, **kwargs) -> tuple[list[dict], str | None, str | None]:
    """(tool calls as {id, name, arguments}, content, finish reason) of one answer, streamed deltas reassembled."""
    kwargs = {"model": MODEL, "max_tokens": MAX_TOKENS, "temperature": 1.0, **kwargs}
    if not stream:
        choice = client.chat.completions.create(**kwargs).choices[0]
        calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                 for c in choice.message.tool_calls or ()]
        return calls, choice.message.content, choice.finish_reason
    calls: dict[int, dict] = {}
    content, finish = [], None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            content.append(choice.delta.content or "")
            for c in choice.delta.tool_calls or ():
                entry = calls.setdefault(c.index, {"id": None, "name": "", "arguments": ""})
                entry["id"] = c.id or entry["id"]
                entry["name"] += (c.function and c.function.name) or ""
                entry["arguments"] += (c.function and c.function.arguments) or ""
            finish = choice.finish_reason or finish
    return [calls[i] for i in sorted(calls)], "".join(content) or None, finish


def validate_calls(calls: list[dict], names: set[str]) -> None:
    assert calls, "no tool call"
    for call in calls:
        assert call["id"] and call["name"] in names, call
        jsonschema.validate(json.loads(call["arguments"]), PARAMETERS[call["name"]])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_required_always_calls_a_tool_with_valid_arguments(engine, stream):
    name, _, client = engine
    failures = []
    for seed in range(REQUESTS):
        calls, content, finish = calls_of(client, stream, messages=[QUESTION], tools=TOOLS, tool_choice="required",
                                          seed=100 + seed)
        try:
            validate_calls(calls, set(PARAMETERS))
            assert finish == "tool_calls", finish
        except (AssertionError, ValueError, jsonschema.ValidationError) as e:
            failures.append(f"seed {seed}: {finish}: {calls} {content!r}: {str(e)[:200]}")
    assert not failures, f"{name}: {len(failures)}/{REQUESTS} answers are not a valid call:\n" + "\n".join(failures)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_named_function_is_always_the_call(engine, stream):
    name, _, client = engine
    for seed, chosen in enumerate(["set_alarm", "book_trip", "get_weather"] * 2):
        calls, _, finish = calls_of(client, stream, messages=[QUESTION], tools=TOOLS, seed=200 + seed,
                                    tool_choice={"type": "function", "function": {"name": chosen}})
        validate_calls(calls, {chosen})
        assert finish == "tool_calls", (name, chosen, finish)


def test_streamed_deltas_reassemble_to_the_whole_answer(engine):
    """The same seeded request, streamed and not: the same call (ids aside), both generated (cache off)."""
    _, _, client = engine
    for seed in range(3):
        args = {"messages": [QUESTION], "tools": TOOLS, "tool_choice": "required", "seed": 300 + seed}
        whole, _, whole_finish = calls_of(client, False, **args)
        streamed, _, streamed_finish = calls_of(client, True, **args)
        strip = [[(c["name"], json.loads(c["arguments"])) for c in calls] for calls in (whole, streamed)]
        assert strip[0] == strip[1] and whole_finish == streamed_finish == "tool_calls", (whole, streamed)


def test_round_trip_with_the_openai_sdk(engine):
    """Request with tools -> tool_calls -> the assistant message and a role 'tool' result go back -> an answer."""
    _, _, client = engine
    first = client.chat.completions.create(model=MODEL, messages=[QUESTION], tools=TOOLS, tool_choice="required",
                                           max_tokens=MAX_TOKENS, temperature=1.0, seed=7)
    message = first.choices[0].message
    assert message.tool_calls and first.choices[0].finish_reason == "tool_calls"
    call = message.tool_calls[0]
    history = [QUESTION, message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"ok": True, "temperature": 21})}]
    second = client.chat.completions.with_raw_response.create(model=MODEL, messages=history, tools=TOOLS,
                                                              max_tokens=16, temperature=1.0, seed=8)
    assert second.status_code == 200 and second.headers["X-Cache"] == "miss"
    answer = second.parse().choices[0]
    assert answer.finish_reason in ("stop", "length", "tool_calls")
    assert second.parse().usage.prompt_tokens > first.usage.prompt_tokens  # the call and its result were rendered


def test_tools_are_in_the_prompt_and_none_is_never_a_call(engine):
    """The template lists the tools (the prompt grows by them); tool_choice none answers with content only."""
    _, _, client = engine
    base = {"model": MODEL, "messages": [QUESTION], "max_tokens": 8, "temperature": 1.0, "seed": 9}
    plain = client.chat.completions.create(**base)
    none = client.chat.completions.create(tools=TOOLS, tool_choice="none", **base)
    assert none.usage.prompt_tokens > plain.usage.prompt_tokens + 100
    assert not none.choices[0].message.tool_calls and none.choices[0].finish_reason in ("stop", "length")


def _refused(server, body: dict) -> dict:
    status, answer = post(server, {"model": MODEL, "messages": [QUESTION], **body})
    assert status == 400, answer
    return answer["error"]


def test_bad_tool_requests_are_400s_naming_the_field(engine):
    _, server, _ = engine
    unknown = _refused(server, {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "fly"}}})
    assert unknown["param"] == "tool_choice.function.name" and "'fly'" in unknown["message"]
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "string", "pattern": "(?=a)b"}}}}}]
    schema = _refused(server, {"tools": bad, "tool_choice": "required"})
    assert schema["param"] == "tools[0].function.parameters" and schema["code"] == "unsupported_schema"
    assert "lookaround" in schema["message"].lower() or "look" in schema["message"].lower(), schema
    assert _refused(server, {"tool_choice": "auto"})["param"] == "tool_choice"
    orphan = {"messages": [QUESTION, {"role": "tool", "tool_call_id": "call_nobody", "content": "42"}]}
    assert _refused(server, orphan)["param"] == "messages[1].tool_call_id"
    not_a_tool = _refused(server, {"tools": [{"type": "function", "function": {"name": "a b"}}]})
    assert not_a_tool["param"].startswith("tools[0].function.name")
    both = {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}
    assert _refused(server, both)["param"] == "response_format"


def test_number_bounds_hold_or_are_refused(engine):
    """A number's bounds hold in the call: fractional ones on direct, whole-number ones on serial and batching.
    llama-server's grammar drops number bounds and openvino-genai's mis-reads fractional ones (its decimal point
    matches any character: answers like '0(5'), so those engines say so (400) rather than answer outside them."""
    name, _, client = engine

    def bounded(low, high) -> dict:
        parameters = {"type": "object", "properties": {"share": {"type": "number", "minimum": low, "maximum": high}},
                      "required": ["share"], "additionalProperties": False}
        return {"messages": [QUESTION], "tool_choice": "required",
                "tools": [{"type": "function", "function": {"name": "tip", "parameters": parameters}}]}

    holds_fractions = name in ("direct", "hybrid")  # their own grammar; genai's and llama-server's mis-read them
    if not holds_fractions:
        with pytest.raises(BadRequestError) as refused:
            calls_of(client, False, **bounded(0.5, 2))
        assert refused.value.body["param"] == "tools" and "minimum" in refused.value.body["message"]
    if name == "llamacpp":
        return
    request = bounded(0.5, 2) if holds_fractions else bounded(1, 20)
    parameters = request["tools"][0]["function"]["parameters"]
    for seed in range(3):
        calls, _, finish = calls_of(client, seed % 2 == 1, seed=400 + seed, **request)
        assert [c["name"] for c in calls] == ["tip"] and finish == "tool_calls"
        jsonschema.validate(json.loads(calls[0]["arguments"]), parameters)
