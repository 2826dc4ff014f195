"""response_format (issue 29) on the real service and the tiny model: json_schema and json_object answers are
constrained while they are generated, on the serial and batching engines (genai's StructuredOutputConfig) and the
llamacpp engine (llama-server's grammar), streamed and not.

The tiny model's weights are random: without a real constrained decoder its answers are never JSON, so every answer
parsing and validating (the ``jsonschema`` library) against its schema is the test. The schemas are generated from a
seed (objects, arrays, enums, bounded numbers, nested objects, required keys), small, with bounded strings and
arrays so that a random model closes them within max_tokens.

The answers are sampled (temperature 1, a seed per request): genai's grammar engine (xgrammar, whose JSON grammar
genai builds with free whitespace and no bound on it) lets greedy decoding on random weights emit newlines forever
after '{'; a sampled answer leaves them. The answer cache is off, so every answer is generated.
"""

from __future__ import annotations

import json
import random
import uuid
from typing import Literal

import jsonschema
import pytest
from openai import BadRequestError, OpenAI
from pydantic import BaseModel, Field

from service.engine import ENGINES, constraining_engines
from service.engine.conversation import ResponseFormat
from service.engine.llamacpp import unenforced_keyword
from tests import servers
from tests.integration.conftest import chat_text, start_engine

MODEL = "qwen3-vl-2b-instruct"
SCHEMAS = 20
MAX_TOKENS = 600  # far more than any generated schema needs to close
QUESTION = {"role": "user", "content": "Extract every price in the image and say which product it belongs to."}
ENV = {"VLFLEET_ANSWER_CACHE_MB": "0", "VLFLEET_MAX_TOKENS": str(MAX_TOKENS)}


def generated_schema(rng: random.Random, depth: int = 0) -> dict:
    """One small object schema: 1-3 properties of the kinds below, some required, nothing else allowed."""
    names = rng.sample(["price", "product", "count", "tags", "ok", "size", "item", "unit"], rng.randint(1, 3))
    properties = {name: _value(rng, depth) for name in names}
    required = sorted(rng.sample(names, rng.randint(1, len(names))))
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def _value(rng: random.Random, depth: int) -> dict:
    kinds = ["integer", "number", "enum", "boolean", "string", "array"] + (["object"] if depth < 1 else [])
    kind = rng.choice(kinds)
    if kind == "integer":
        low = rng.randint(-50, 50)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 100)}
    if kind == "number":
        low = rng.randint(0, 20)
        return {"type": "number", "minimum": low, "maximum": low + rng.randint(1, 1000)}
    if kind == "enum":
        return {"enum": rng.sample(["EUR", "USD", "kg", "each", "box", "litre"], rng.randint(1, 4))}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "string":
        # ASCII, its length in the pattern: genai's xgrammar lets a string take byte tokens that detokenize to
        # U+FFFD (' bahi' + 4 x U+FFFD for maxLength 6, measured), and drops maxLength beside a pattern.
        low, high = rng.randint(0, 2), rng.randint(3, 8)
        return {"type": "string", "pattern": f"^[A-Za-z0-9 ]{{{low},{high}}}$", "minLength": low, "maxLength": high}
    if kind == "array":
        item = rng.choice([{"type": "integer", "minimum": 0, "maximum": 9}, {"enum": ["a", "b", "c"]},
                           {"type": "boolean"}])
        low = rng.randint(0, 2)
        return {"type": "array", "items": item, "minItems": low, "maxItems": low + rng.randint(0, 2)}
    return generated_schema(rng, depth + 1)


def schemas(seed: int = 29) -> list[dict]:
    rng = random.Random(seed)
    return [generated_schema(rng) for _ in range(SCHEMAS)]


def json_schema_format(schema: dict, name: str = "answer") -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def answer(client: OpenAI, response_format: dict, stream: bool, seed: int) -> tuple[str, str]:
    """The answer's text and finish reason, streamed or not."""
    kwargs = {"model": MODEL, "messages": [QUESTION], "response_format": response_format,
              "max_tokens": MAX_TOKENS, "temperature": 1.0, "seed": seed,
              "extra_headers": {"X-Request-Id": uuid.uuid4().hex[:16]}}
    return chat_text(client, stream, **kwargs)


def client_of(server: servers.Server) -> OpenAI:
    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module", params=["serial", "batching", "llamacpp"])
def engine(request, tmp_path_factory):
    """(name, service, client) of each engine that constrains output, the answer cache off."""
    name = request.param
    server = start_engine(name, request, tmp_path_factory, **ENV)
    yield name, server, client_of(server)
    server.stop()


FRACTIONAL = {"type": "object", "properties": {"share": {"type": "number", "minimum": 0.5, "maximum": 2}},
              "required": ["share"], "additionalProperties": False}


def test_fractional_number_bounds_are_refused(engine):
    """openvino-genai's grammar reads a fractional bound's decimal point as any character (answers like '0(5'), and
    llama-server's drops number bounds: these engines refuse the schema, naming the keyword, rather than answer
    outside it (the direct engine holds it: test_structured_direct)."""
    _, _, client = engine
    with pytest.raises(BadRequestError) as refused:
        answer(client, json_schema_format(FRACTIONAL, "tip"), False, seed=7)
    assert refused.value.body["param"] == "response_format.json_schema.schema"
    assert "minimum" in refused.value.body["message"], refused.value.body


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_every_answer_validates_against_its_generated_schema(engine, stream):
    name, _, client = engine
    failures = []
    for i, schema in enumerate(schemas()):
        if name == "llamacpp" and unenforced_keyword(ResponseFormat("json_schema", json.dumps(schema))):
            with pytest.raises(BadRequestError) as refused:  # llama-server would drop a number's bounds
                answer(client, json_schema_format(schema, f"schema_{i}"), stream, seed=1000 + i)
            assert refused.value.body["param"] == "response_format.json_schema.schema"
            continue
        text, finish = answer(client, json_schema_format(schema, f"schema_{i}"), stream, seed=1000 + i)
        try:
            jsonschema.validate(json.loads(text), schema)
        except (ValueError, jsonschema.ValidationError) as e:
            failures.append(f"schema {i} {json.dumps(schema)}: {finish}: {text[:200]!r}: {str(e)[:200]}")
        assert finish == "stop", f"{name}: schema {i} did not close within {MAX_TOKENS} tokens: {text[:200]!r}"
    assert not failures, f"{name}: {len(failures)}/{SCHEMAS} answers do not validate:\n" + "\n".join(failures)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_json_object_answers_are_json_objects(engine, stream):
    """Any JSON object: its keys and strings are unbounded, which random weights rarely close within max_tokens, so
    an answer that closed must parse as an object and one cut by the limit must still be an object's start."""
    name, _, client = engine
    for seed in range(3):
        text, finish = answer(client, {"type": "json_object"}, stream, seed)
        assert text.lstrip().startswith("{"), f"{name}: {text[:200]!r}"
        if finish == "stop":
            assert isinstance(json.loads(text), dict), f"{name}: {text[:200]!r}"


def test_text_format_is_no_constraint(engine):
    _, _, client = engine
    out = client.chat.completions.create(model=MODEL, messages=[QUESTION], response_format={"type": "text"},
                                         max_tokens=8)
    assert out.choices[0].message.content


class Price(BaseModel):
    product: str = Field(pattern="^[a-z]{1,6}$")
    price: int = Field(ge=0, le=999)
    currency: Literal["EUR", "USD"]


class Receipt(BaseModel):
    prices: list[Price] = Field(max_length=2)
    paid: bool


@pytest.mark.parametrize("engine", ["serial"], indirect=True)
def test_the_sdk_parses_a_pydantic_model(engine):
    """The openai SDK's parse(): it sends the model's JSON Schema (strict, every key required) and parses the
    answer into the model."""
    _, _, client = engine
    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    for seed in range(3):
        out = parse(model=MODEL, messages=[QUESTION], response_format=Receipt, max_tokens=MAX_TOKENS,
                    temperature=1.0, seed=seed)
        parsed = out.choices[0].message.parsed
        assert isinstance(parsed, Receipt), out.choices[0].message.content
        assert len(parsed.prices) <= 2 and all(p.currency in ("EUR", "USD") for p in parsed.prices)


def test_a_schema_the_grammar_engine_cannot_compile_is_a_400_naming_it(engine):
    """Refused before the request is queued, naming the keyword; the engine keeps answering (a ContinuousBatching
    pipeline given such a schema would fail every later step)."""
    name, _, client = engine
    if name == "llamacpp":
        bad = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}, "required": ["a"]}
    else:
        bad = {"type": "object", "properties": {"a": {"not": {"type": "string"}}}, "required": ["a"]}
    with pytest.raises(BadRequestError) as refused:
        answer(client, json_schema_format(bad), stream=False, seed=0)
    error = refused.value.body
    assert error["param"] == "response_format.json_schema.schema", error
    if name != "llamacpp":
        assert "not" in error["message"], error
    text, _ = answer(client, json_schema_format({"enum": ["yes", "no"]}), stream=False, seed=1)
    assert json.loads(text) in ("yes", "no")


def test_malformed_response_formats_are_400s_naming_the_field(engine):
    _, server, _ = engine
    for fmt, param in [({"type": "xml"}, "response_format.type"),
                       ({"type": "json_schema"}, "response_format.json_schema"),
                       ({"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}},
                        "response_format.json_schema.name"),
                       ({"type": "json_schema", "json_schema": {"name": "a", "schema": [1]}},
                        "response_format.json_schema.schema"),
                       ("json", "response_format")]:
        status, body = post(server, {"messages": [QUESTION], "response_format": fmt})
        assert status == 400 and body["error"]["param"] == param, (fmt, body)


def post(server: servers.Server, body: dict) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(server.url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_engines_that_cannot_constrain_refuse_it_naming_those_that_can(tiny_model, tmp_path):
    """Every engine whose Engine.constrains_output is False refuses response_format with a 400 that names the
    engines that support it (never answers unconstrained). Engines gain the capability by setting the attribute;
    the test follows (with every engine constraining, there is nothing left to refuse)."""
    without = [name for name, cls in ENGINES.items() if not cls.constrains_output]
    assert set(constraining_engines()) >= {"serial", "batching", "llamacpp"}
    for name in without:
        server = servers.start(tiny_model, tmp_path, VLFLEET_ENGINE=name, **ENV)
        try:
            status, body = post(server, {"messages": [QUESTION], "response_format": {"type": "json_object"}})
        finally:
            server.stop()
        assert status == 400, body
        error = body["error"]
        assert error["param"] == "response_format" and error["code"] == "unsupported_parameter", error
        assert all(engine in error["message"] for engine in constraining_engines()), error
