"""The API's request models: a bad request gets one error in OpenAI's shape naming the field and the fix, and the
OpenAPI schema generated from the models accepts exactly what they accept."""

from __future__ import annotations

import copy
import json
import re

import jsonschema_rs
import pytest
from flask import Flask

from service.engine import errors
from service.engine.conversation import Sampling
from service.engine.errors import APIError
from service.http import openai_request
from service.http.api_models import ChatCompletionRequest, ChatForm
from service.http.openapi import document
from service.http.request_errors import api_error

ASK = {"role": "user", "content": "What is it?"}
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


def parse(body):
    return openai_request.parse(body, "m", 128, 4, lambda url, param, detail: (url, param))


def refusal(body) -> tuple[int, str | None, str | None, str]:
    with pytest.raises(APIError) as caught:
        parse(body)
    e = caught.value
    return e.status, e.code, e.param, e.message


def body(**fields) -> dict:
    return {"messages": [ASK], **fields}


REFUSALS = [
    ([1, 2], 400, "invalid_json", "body", "request body must be a JSON object"),
    ({"max_tokens": 3}, 400, "invalid_type", "messages",
     "'messages' must be a non-empty list of {role, content} objects"),
    ({"messages": []}, 400, "invalid_type", "messages",
     "'messages' must be a non-empty list of {role, content} objects"),
    (body(frobnicate=1, zz=2), 400, "unknown_parameter", "frobnicate",
     "unknown field(s): frobnicate, zz; see /openapi.json for the fields accepted"),
    ({"messages": [{**ASK, "foo": 1}]}, 400, "unknown_parameter", "messages[0].foo",
     "unknown field(s) in 'messages[0]': foo; see /openapi.json for the fields accepted"),
    (body(n=0), 400, "invalid_value", "n", "'n' must be at least 1, got 0"),
    (body(n=9), 400, "invalid_value", "n", "'n' must be at most 8, got 9"),
    (body(logprobs=True, top_logprobs=21), 400, "invalid_value", "top_logprobs",
     "'top_logprobs' must be at most 20, got 21"),
    (body(logprobs=True, top_logprobs=-1), 400, "invalid_value", "top_logprobs",
     "'top_logprobs' must be at least 0, got -1"),
    (body(top_logprobs=2), 400, "invalid_value", "top_logprobs", "'top_logprobs' is only allowed with logprobs: true"),
    (body(logprobs=False, top_logprobs=0), 400, "invalid_value", "top_logprobs",
     "'top_logprobs' is only allowed with logprobs: true"),
    (body(logprobs="yes"), 400, "invalid_type", "logprobs", "'logprobs' must be true or false"),
    (body(tools=[{"type": "function"}]), 400, "invalid_type", "tools[0].function", "'tools[0].function' is required"),
    (body(tool_choice="auto"), 400, "invalid_value", "tool_choice",
     "'tool_choice' needs 'tools': list the functions it chooses from"),
    (body(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice={"type": "function", "function": {
        "name": "g"}}), 400, "invalid_value", "tool_choice.function.name",
     "'tool_choice.function.name': 'g' is not one of the tools (f)"),
    ({"messages": [{"role": "tool", "content": "x", "tool_call_id": "a"}]}, 400, "invalid_value",
     "messages[0].tool_call_id", "messages[0]: 'tool_call_id' 'a' answers no earlier assistant tool call"),
    (body(functions=[{"name": "f"}]), 400, "unsupported_parameter", "functions",
     "'functions': function calling is not supported by this server"),
    (body(n=True), 400, "invalid_type", "n", "'n' must be an integer"),
    (body(presence_penalty=0.5), 400, "unsupported_parameter", "presence_penalty",
     "'presence_penalty' is not supported; leave it out or set 0"),
    ({"messages": [{"role": "robot", "content": "x"}]}, 400, "invalid_value", "messages[0].role",
     "'messages[0].role' must be one of 'user', 'system', 'assistant', 'tool', got 'robot'"),
    ({"messages": [{"content": "x"}]}, 400, "invalid_value", "messages[0].role", "'messages[0].role' is required"),
    ({"messages": ["x"]}, 400, "invalid_type", "messages[0]", "'messages[0]' must be an object"),
    ({"messages": [ASK, {"role": "assistant", "content": "y"}]}, 400, "invalid_value", "messages[1].role",
     "the last message (messages[1]) must have role 'user' (or 'tool')"),
    ({"messages": [ASK, {"role": "system", "content": "y"}, ASK]}, 400, "invalid_value", "messages[1].role",
     "messages[1] has role 'system': a system message may only come first"),
    ({"messages": [{"role": "user", "content": "   "}]}, 400, "empty_prompt", "messages[0].content",
     "'messages[0].content' is blank; ask a question (or send the image part alone)"),
    ({"messages": [{"role": "user", "content": [IMAGE, {"type": "text", "text": ""}]}]}, 400, "empty_prompt",
     "messages[0].content[1].text", "'messages[0].content[1].text' is blank; ask a question (or send the image "
                                    "part alone)"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "what is <ov_genai_image_3>?"}]}]}, 400,
     "reserved_tag", "messages[0].content[0].text", "'messages[0].content[0].text' contains <ov_genai_image_3>, a "
     "placeholder reserved for the runtime; send images as image_url parts (on /chat as the 'image' file)"),
    ({"messages": [{"role": "user", "content": 5}]}, 400, "invalid_type", "messages[0].content",
     "'messages[0].content' must be a string or a non-empty list of content parts"),
    ({"messages": [{"role": "user", "content": [{"type": "video"}]}]}, 400, "invalid_value",
     "messages[0].content[0].type", "'messages[0].content[0].type' must be one of 'text', 'image_url', got 'video'"),
    ({"messages": [{"role": "assistant", "content": [IMAGE]}, ASK]}, 400, "invalid_value", "messages[0].content[0]",
     "'messages[0].content[0]' is an image: images are only allowed in user messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "ftp://x"}}]}]}, 400,
     "invalid_image_url", "messages[0].content[0].image_url.url", "'messages[0].content[0].image_url.url' must be a "
     "data: URL like 'data:image/png;base64,...' (or an http(s) URL from an allowed domain)"),
    (body(temperature=9), 400, "invalid_value", "temperature", "'temperature' must be at most 2.0, got 9"),
    (body(temperature="1"), 400, "invalid_type", "temperature", "'temperature' must be a number"),
    (body(max_tokens=0), 400, "invalid_value", "max_tokens", "'max_tokens' must be at least 1, got 0"),
    (body(max_tokens=5.5), 400, "invalid_type", "max_tokens", "'max_tokens' must be an integer"),
    (body(stream=None), 400, "invalid_type", "stream", "'stream' must be true or false"),
    (body(stream_options={"include_usage": True}), 400, "invalid_value", "stream_options",
     "'stream_options' is only allowed with stream: true"),
    (body(stream=True, stream_options={"x": True}), 400, "unknown_parameter", "stream_options.x",
     "unknown field(s) in 'stream_options': x; see /openapi.json for the fields accepted"),
    (body(stop=3), 400, "invalid_type", "stop", "'stop' must be a non-empty string or a list of up to 4 non-empty "
                                                 "strings"),
    (body(stop=["a"] * 5), 400, "invalid_value", "stop", "'stop' may have at most 4 items"),
    (body(model="gpt-9"), 404, "model_not_found", "model",
     "model 'gpt-9' is not served here; use 'm' (see /v1/models)"),
    ({"messages": [{"role": "user", "content": [IMAGE] * 5}]}, 400, "too_many_images", "messages",
     "5 images in this request; the limit is 4 (VLFLEET_MAX_IMAGES)"),
]


@pytest.mark.parametrize(("request_body", "status", "code", "param", "message"), REFUSALS)
def test_a_bad_request_gets_one_error_naming_the_field_and_the_fix(request_body, status, code, param, message):
    assert refusal(request_body) == (status, code, param, message)


def test_a_good_request_becomes_sampling_and_turns():
    parsed = parse({"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                               {"role": "user", "content": [IMAGE, {"type": "text", "text": "Q"}]}],
                    "max_tokens": 9, "max_completion_tokens": 5.0, "stop": "x", "seed": 3, "temperature": 1,
                    "top_p": 0.5, "stream": True, "stream_options": {"include_usage": True}, "n": 1,
                    "frequency_penalty": 0.0, "tools": [], "logprobs": False})
    assert parsed.sampling == Sampling(max_tokens=5, temperature=1.0, top_p=0.5, seed=3, stop=("x",))
    assert (parsed.stream, parsed.include_usage, parsed.model) == (True, True, "m")
    system, user = parsed.conversation.turns
    assert (system.role, system.text, system.images) == ("system", "Be brief.", ())
    assert (user.role, user.text) == ("user", "Q")
    assert user.images == ((IMAGE["image_url"]["url"], "messages[1].content[0].image_url"),)


def test_defaults_come_from_the_server():
    parsed = parse(body(stop=None, temperature=None))
    assert parsed.sampling == Sampling(max_tokens=128)
    assert (parsed.stream, parsed.include_usage) == (False, False)


def request_schema() -> jsonschema_rs.Validator:
    doc = document("0", "m")
    return jsonschema_rs.Draft202012Validator({"$ref": "#/components/schemas/ChatCompletionRequest",
                                               "components": doc["components"]})


def accepted(request_body) -> bool:
    try:
        parse(copy.deepcopy(request_body))
    except APIError:
        return False
    return True


# Each rule the schema states, kept and broken (the last message being the user's is the one it cannot state).
AGREEMENT = [
    body(), body(model="m"), body(model="gpt-9"), {"messages": []}, body(extra=1),
    {"messages": [{"role": "user", "content": " "}]}, {"messages": [{"role": "user", "content": [IMAGE]}]},
    {"messages": [{"role": "user", "content": [IMAGE, {"type": "text", "text": " "}]}]},
    {"messages": [{"role": "system", "content": ""}, ASK]},
    {"messages": [ASK, {"role": "system", "content": "x"}, ASK]},
    {"messages": [{"role": "assistant", "content": [IMAGE]}, ASK]}, {"messages": [{"role": "user", "content": []}]},
    {"messages": [{"role": "user", "content": "<ov_genai_video_12>"}]},
    {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "HTTPS://x"}}]}]},
    {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///x"}}]}]},
    body(stream_options={"include_usage": True}), body(stream=True, stream_options={"include_usage": True}),
    body(stream_options=None), body(n=1), body(n=1.0), body(n=2), body(n=True), body(frequency_penalty=0.0),
    body(frequency_penalty=1), body(max_tokens=5.0), body(max_tokens=5.5), body(max_tokens=2**31),
    body(max_tokens=2**31 + 1), body(top_p=0), body(top_p=0.0001), body(seed=2**63 - 1), body(seed=2**63),
    body(stop=""), body(stop=[]), body(stop=["a"] * 4), body(stop=["a"] * 5), body(stop=[""]), body(user=None),
    body(user=3), body(ignore_eos=1), body(temperature=2), body(temperature=2.5),
]


@pytest.mark.parametrize("request_body", AGREEMENT, ids=range(len(AGREEMENT)))
def test_the_schema_accepts_what_the_models_accept(request_body):
    assert request_schema().is_valid(request_body) == accepted(request_body)


def form_error(fields: dict) -> tuple[str | None, str | None, str]:
    try:
        ChatForm.model_validate(fields)
    except Exception as e:  # a pydantic ValidationError
        error = api_error(e, fields)
        return error.code, error.param, error.message
    return None, None, "accepted"


@pytest.mark.parametrize(("fields", "expected"), [
    ({"question": "Hi", "image": b"png"}, (None, None, "accepted")),
    ({"question": "Hi", "session": "abc", "max_tokens": "7"}, (None, None, "accepted")),
    ({"question": " ", "image": b"png"}, ("empty_prompt", "question",
                                          "'question' is empty; type a question about the image")),
    ({"question": "Hi"}, ("missing_image", "image",
                          "attach an image (field 'image') or continue a conversation (field 'session')")),
    ({"question": "Hi", "session": ""}, ("invalid_value", "session", "'session' must not be empty")),
    ({"question": "Hi", "image": b"png", "max_tokens": "x"}, ("invalid_type", "max_tokens",
                                                              "'max_tokens' must be an integer")),
    ({"question": "Hi", "image": b"png", "model": "x"}, ("unknown_parameter", "model", "unknown field(s): model; "
                                                         "see /openapi.json for the fields accepted")),
    ({"question": "Hi", "image": b"png", "response_format": '{"type": "json_object"}'}, (None, None, "accepted")),
    ({"question": "Hi", "image": b"png", "response_format": "{type"},
     ("invalid_json", "response_format", "'response_format' is not valid JSON: key must be a string at line 1 "
                                         "column 2")),
])
def test_chat_form(fields, expected):
    assert form_error(fields) == expected


def test_the_document_is_generated_from_the_models():
    schemas = document("0", "served-name")["components"]["schemas"]
    request = schemas["ChatCompletionRequest"]
    assert set(request["properties"]) == set(ChatCompletionRequest.model_fields)
    assert request["properties"]["model"]["anyOf"][0] == {"type": "string", "enum": ["served-name"]}
    assert set(schemas["ChatForm"]["properties"]) == set(ChatForm.model_fields)
    refs = re.findall(r'"\$ref": "#/components/schemas/([^"]+)"', json.dumps(schemas))
    assert refs and set(refs) <= set(schemas)  # every reference resolves within the document


def test_a_405_names_the_methods_allowed():
    app = Flask(__name__)
    errors.register(app)
    app.add_url_rule("/x", "x", lambda: "ok", methods=["POST"])
    answer = app.test_client().get("/x")
    assert (answer.status_code, answer.json["error"]["code"]) == (405, "method_not_allowed")
    assert set(answer.headers["Allow"].split(", ")) == {"POST", "OPTIONS"}
