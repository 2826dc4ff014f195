"""response_format on the direct engine (issue 29, item 1), on the tiny model: with its random weights only a decoder
constrained while it generates gives valid JSON, so every answer to 20 generated schemas must parse and validate
(jsonschema), greedy and sampled, from the pipeline and through the service (streamed and not, the answer cache
off); the end of an answer only where the grammar accepts; a schema the grammar engine cannot compile is a 400
naming the keyword, before any token; a repeated schema is compiled once."""

from __future__ import annotations

import json
import random
from decimal import Decimal

import jsonschema
import pytest
from openai import BadRequestError, OpenAI
from pydantic import BaseModel, Field

from service.engine.conversation import Conversation, ResponseFormat, Sampling, Turn
from service.engine.errors import APIError
from service.engine.events import Done, Keepalive, Started, Token
from service.engine.genai import SCHEMA_PARAM
from service.runtime import settings as service_settings
from tests import servers
from tests.integration.conftest import chat_text
from tests.integration.test_direct_engine import MODEL, _conversation, _settings

WORDS = ("price", "product", "name", "count", "unit", "total", "items", "colour", "label", "shop", "tags", "size")
SEED, SCHEMAS = 29, 20
MAX_TOKENS = 512


def _leaf(rng: random.Random, depth: int) -> dict:
    kind = rng.choice(["integer", "number", "enum", "string", "boolean", "array"] + (["object"] if depth < 2 else []))
    if kind == "integer":
        lo = rng.randint(-1000, 1000)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 5000)}
    if kind == "number":
        # multipleOf bounds the digits: a free-precision number lets greedy decoding of random weights write
        # 66.2222... until max_tokens (which the grammar allows; a real model stops).
        lo = round(rng.uniform(-100, 100), 2)
        return {"type": "number", "minimum": lo, "maximum": round(lo + rng.uniform(0.5, 1000), 2),
                "multipleOf": rng.choice([0.5, 0.25, 0.1, 0.01])}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", "EUR", "USD", 1, 2, 3, True, None], rng.randint(1, 5))}
    if kind == "string":
        lo = rng.randint(0, 3)
        return {"type": "string", "minLength": lo, "maxLength": lo + rng.randint(1, 12)}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "array":
        lo = rng.randint(0, 2)
        return {"type": "array", "items": _leaf(rng, depth + 1), "minItems": lo, "maxItems": lo + rng.randint(1, 3)}
    return _object(rng, depth + 1)


def _object(rng: random.Random, depth: int = 0) -> dict:
    keys = rng.sample(WORDS, rng.randint(1, 4))
    return {"type": "object", "properties": {k: _leaf(rng, depth) for k in keys},
            "required": sorted(rng.sample(keys, rng.randint(1, len(keys)))), "additionalProperties": False}


def generated_schemas(seed: int = SEED, n: int = SCHEMAS) -> list[dict]:
    """Objects with required keys, nested objects, arrays, enums, bounded integers and numbers; every 7th a
    top-level array of objects."""
    rng = random.Random(seed)
    return [{"type": "array", "items": _object(rng, 1), "minItems": 1, "maxItems": 3} if i % 7 == 6 else _object(rng)
            for i in range(n)]


def validate(text: str, schema: dict) -> None:
    """``text`` parses as JSON valid against ``schema``; numbers as decimals on both sides, as JSON writes them
    (in floats -38.8 is not a multiple of 0.1, for jsonschema's multipleOf)."""
    decimal = json.loads(json.dumps(schema), parse_float=Decimal)
    jsonschema.validate(json.loads(text, parse_float=Decimal), decimal)


def json_schema(schema: dict) -> ResponseFormat:
    return ResponseFormat("json_schema", json.dumps(schema, sort_keys=True, separators=(",", ":")))


@pytest.fixture(scope="module")
def pipe(tiny_model):
    from service.engine.direct_pipeline import DirectPipeline

    return DirectPipeline(_settings(tiny_model))


QUESTION = Conversation((Turn("user", "Extract every price in the image and say which product it belongs to."),))


def _answer(pipe, fmt: ResponseFormat, conv: Conversation = QUESTION, **sampling) -> tuple[str, int]:
    pieces: list[str] = []
    stats = pipe.generate(conv, Sampling(max_tokens=MAX_TOKENS, response_format=fmt, **sampling), pieces.append,
                          lambda: False)
    return "".join(pieces), stats.completion_tokens


def test_the_schemas_cover_what_the_issue_asks():
    text = json.dumps(generated_schemas())
    for word in ('"enum"', '"minimum"', '"maximum"', '"required"', '"minItems"', '"type": "array"',
                 '"type": "number"', '"type": "integer"', '"type": "string"', '"type": "boolean"'):
        assert word in text, word
    assert any('"properties"' in json.dumps(p) for s in generated_schemas() if "properties" in s
               for p in s["properties"].values())  # nested objects


@pytest.mark.parametrize("index", range(SCHEMAS))
def test_every_answer_validates_against_its_schema(pipe, index):
    schema = generated_schemas()[index]
    jsonschema.Draft202012Validator.check_schema(schema)
    for sampling in ({"temperature": 0.0}, {"temperature": 1.0, "seed": index}):
        text, tokens = _answer(pipe, json_schema(schema), **sampling)
        assert tokens < MAX_TOKENS, f"cut at max_tokens: {text[:200]!r}"
        validate(text, schema)


def test_fractional_number_bounds_hold(pipe):
    """minimum 0.5: the bound the genai engines refuse (their grammar mis-reads it) holds here."""
    from tests.integration.test_response_format import FRACTIONAL

    for seed in range(12):
        text, tokens = _answer(pipe, json_schema(FRACTIONAL), temperature=1.0, seed=seed)
        assert tokens < MAX_TOKENS, f"cut at max_tokens: {text[:200]!r}"
        validate(text, FRACTIONAL)


def test_json_object_is_any_object(pipe):
    for conv in (QUESTION, _conversation("Describe this image as JSON.")):
        text, tokens = _answer(pipe, ResponseFormat("json_object"), conv)
        assert tokens < MAX_TOKENS
        assert isinstance(json.loads(text), dict)


def test_the_end_is_allowed_only_where_the_grammar_accepts(pipe):
    schema = {"type": "object", "properties": {"price": {"type": "integer"}}, "required": ["price"],
              "additionalProperties": False}
    constraint = pipe.grammars.constraint(json_schema(schema))
    eos = list(pipe.ids.eos)
    assert not constraint.allowed()[eos].any()
    tokens = list(pipe.tokenizer.encode('{"price": 12', add_special_tokens=False).input_ids.data[0])
    for token in tokens:
        assert constraint.allowed()[token]
        constraint.consume(token)
    assert not constraint.allowed()[eos].any() and not constraint.stopped  # "12" could go on, "}" is missing
    (close,) = pipe.tokenizer.encode("}", add_special_tokens=False).input_ids.data[0]
    constraint.consume(int(close))
    assert constraint.stopped and constraint.allowed()[eos].all() and constraint.allowed().sum() == len(eos)


def test_ignore_eos_still_ends_a_complete_answer(pipe):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    text, tokens = _answer(pipe, json_schema(schema), ignore_eos=True)
    assert json.loads(text) in ({"ok": True}, {"ok": False}) and tokens < MAX_TOKENS


@pytest.mark.parametrize(("schema", "named"), [
    ({"type": "array", "uniqueItems": True}, "uniqueItems"),
    ({"type": "string", "format": "uri-reference"}, "uri-reference"),
    ({"if": {"type": "string"}, "then": {"minLength": 3}}, '"if"'),
    ({"type": "objekt"}, "objekt"),
])
def test_an_unsupported_schema_is_a_400_naming_it_before_any_token(pipe, schema, named):
    pieces: list[str] = []
    keys = list(pipe.lm.keys)
    with pytest.raises(APIError) as raised:
        pipe.generate(QUESTION, Sampling(max_tokens=8, response_format=json_schema(schema)), pieces.append,
                      lambda: False)
    error = raised.value
    assert (error.status, error.param, error.code) == (400, SCHEMA_PARAM, "unsupported_schema")
    assert named in error.message
    assert pieces == [] and pipe.lm.keys == keys  # nothing generated, not even a prefill


def test_a_repeated_schema_is_compiled_once(pipe):
    fmt = json_schema({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    before = pipe.grammars.compiles
    first = _answer(pipe, fmt)
    assert pipe.grammars.compiles == before + 1
    assert _answer(pipe, fmt) == first  # greedy: the same answer, from a fresh copy of the kept matcher
    assert pipe.grammars.compiles == before + 1


@pytest.fixture(scope="module")
def engine(tiny_model):
    from service.engine.direct import DirectEngine

    engine = DirectEngine(service_settings.load({"VLFLEET_MODEL_DIR": str(tiny_model), "VLFLEET_ENGINE": "direct",
                                                 "VLFLEET_ANSWER_CACHE_MB": "0"}))
    engine.start()
    assert engine.ready.wait(300), engine.failed
    return engine


def _events(job) -> list:
    return [e for e in job.events(queue_timeout=120) if not isinstance(e, Keepalive)]


def test_the_engine_streams_a_valid_answer(engine):
    assert engine.constrains_output
    schema = generated_schemas()[1]
    events = _events(engine.submit(QUESTION, Sampling(max_tokens=MAX_TOKENS, response_format=json_schema(schema)),
                                   "structured-1"))
    assert isinstance(events[0], Started) and isinstance(events[-1], Done), events[-1]
    text = "".join(e.text for e in events if isinstance(e, Token))
    assert events[-1].text == text and events[-1].finish_reason == "stop"
    validate(text, schema)


def test_the_engine_refuses_an_unsupported_schema_at_submit(engine):
    with pytest.raises(APIError, match="uniqueItems") as raised:
        engine.submit(QUESTION, Sampling(max_tokens=8, response_format=json_schema({"type": "array",
                                                                                    "uniqueItems": True})), "bad-1")
    assert raised.value.status == 400 and raised.value.code == "unsupported_schema"
    assert engine.queue_depth == 0


def test_an_answer_without_a_format_is_free_text(engine):
    """No format, no mask: the random model's greedy answer is the noise it always was, not JSON."""
    events = _events(engine.submit(QUESTION, Sampling(max_tokens=12), "plain-1"))
    assert isinstance(events[-1], Done), events[-1]
    with pytest.raises(ValueError):
        json.loads(events[-1].text)


@pytest.fixture(scope="module")
def client(tiny_model, tmp_path_factory):
    server = servers.start(tiny_model, tmp_path_factory.mktemp("structured-direct"), VLFLEET_ENGINE="direct",
                           VLFLEET_ANSWER_CACHE_MB="0", VLFLEET_MAX_TOKENS=str(MAX_TOKENS))
    yield OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    server.stop()


def _chat(client, response_format: dict, stream: bool, **sampling) -> tuple[str, str]:
    kwargs = {"model": MODEL, "messages": [{"role": "user", "content": QUESTION.turns[-1].text}],
              "response_format": response_format, "max_tokens": MAX_TOKENS, **sampling}
    return chat_text(client, stream, **kwargs)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_service_answers_every_schema_with_valid_json(client, stream):
    for i, schema in enumerate(generated_schemas()):
        fmt = {"type": "json_schema", "json_schema": {"name": f"schema_{i}", "schema": schema, "strict": True}}
        for sampling in ({"temperature": 0}, {"temperature": 1.0, "seed": 100 + i}):
            text, finish = _chat(client, fmt, stream, **sampling)
            assert finish == "stop", (i, sampling, text[:200])
            validate(text, schema)


def test_properties_come_out_in_the_schemas_order_not_sorted(client):
    """Clients order fields on purpose (a reasoning field before the answer): the schema's order is the answer's."""
    order = ["zeta", "alpha", "mid"]
    schema = {"type": "object", "properties": {k: {"type": "integer", "minimum": 0, "maximum": 9} for k in order},
              "required": order, "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "ordered", "schema": schema, "strict": True}}
    text, finish = _chat(client, fmt, False, temperature=0)
    assert finish == "stop" and list(json.loads(text)) == order, text


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_service_refuses_an_unsupported_keyword_by_name(client, stream):
    fmt = {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "array", "uniqueItems": True}}}
    with pytest.raises(BadRequestError) as refused:
        _chat(client, fmt, stream)
    error = refused.value.body
    assert error["param"] == SCHEMA_PARAM and error["code"] == "unsupported_schema", error
    assert "uniqueItems" in error["message"], error
    text, _ = _chat(client, {"type": "json_object"}, stream, temperature=0)
    assert isinstance(json.loads(text), dict)  # and it goes on answering


class Price(BaseModel):
    product: str = Field(max_length=8)
    price: int = Field(ge=0, le=999)
    currency: str = Field(pattern="^(EUR|USD)$")


class Receipt(BaseModel):
    prices: list[Price] = Field(max_length=3)
    paid: bool


def test_the_sdk_parses_a_pydantic_model(client):
    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    for sampling in ({"temperature": 0}, {"temperature": 1.0, "seed": 7}):
        out = parse(model=MODEL, messages=[{"role": "user", "content": QUESTION.turns[-1].text}],
                    response_format=Receipt, max_tokens=MAX_TOKENS, **sampling)
        assert isinstance(out.choices[0].message.parsed, Receipt), out.choices[0].message.content
