"""A pydantic ValidationError as OpenAI's error body: the field's path in the client's JSON and what to send instead.

One error is reported, the first a client would fix: an unknown field (often a typo of a known one), else the first
in field order. Refusals of service.http.api_types carry their own code and fix; pydantic's own error types are phrased
here.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from service.engine.errors import APIError
from service.http.api_types import CODES

# pydantic's error type -> (code, fix); {names} come from the error's context.
PHRASES = {
    "missing": ("invalid_type", "is required"),
    "string_type": ("invalid_type", "must be a string"),
    "int_type": ("invalid_type", "must be an integer"),
    "int_parsing": ("invalid_type", "must be an integer"),
    "float_type": ("invalid_type", "must be a number"),
    "bool_type": ("invalid_type", "must be true or false"),
    "bytes_type": ("invalid_type", "must be a file"),
    "list_type": ("invalid_type", "must be a list"),
    "model_type": ("invalid_type", "must be an object"),
    "model_attributes_type": ("invalid_type", "must be an object"),
    "dict_type": ("invalid_type", "must be an object"),
    "too_short": ("invalid_value", "must have at least {min_length} item(s)"),
    "too_long": ("invalid_value", "may have at most {max_length} items"),
    "string_too_short": ("invalid_value", "must not be empty"),
    "greater_than_equal": ("invalid_value", "must be at least {ge}, got {input}"),
    "less_than_equal": ("invalid_value", "must be at most {le}, got {input}"),
    "literal_error": ("invalid_value", "must be {expected}, got {input!r}"),
    "union_tag_invalid": ("invalid_value", "must be one of {expected_tags}, got {tag!r}"),
    "union_tag_not_found": ("invalid_value", "is required"),
    "json_invalid": ("invalid_json", "is not valid JSON: {error}"),  # a form field holding JSON (Json[...])
}
# Fields whose shape errors (missing, not a list, empty) read better as one sentence.
SHAPES = {"messages": ("invalid_type", "must be a non-empty list of {role, content} objects")}


def api_error(error: ValidationError, body: Any) -> APIError:
    """The APIError (400) for ``error``, raised by validating ``body``."""
    errors = error.errors(include_url=False)
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    if unknown:
        return _unknown(unknown, body)
    first = errors[0]
    if param := (first.get("ctx") or {}).get("param"):  # a rule across fields: its message is a sentence
        return APIError(first["msg"], param=param, code=first["type"])
    param = path(first, body)
    code, fix = phrase(first, param)
    return APIError(f"'{param}' {fix}", param=param, code=code)


def phrase(error: dict, param: str) -> tuple[str, str]:
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind in CODES:
        return kind, error["msg"]
    if param in SHAPES and kind in ("missing", "list_type", "too_short"):
        return SHAPES[param]
    if kind in PHRASES:
        code, fix = PHRASES[kind]
        return code, fix.format(**ctx, input=error.get("input"))
    return "invalid_value", error["msg"][:1].lower() + error["msg"][1:]


def _unknown(errors: list[dict], body: Any) -> APIError:
    params = [path(e, body) for e in errors]
    parent = params[0].rpartition(".")[0]
    names = [p.rpartition(".")[2] for p in params if p.rpartition(".")[0] == parent]
    where = f" in '{parent}'" if parent else ""
    return APIError(f"unknown field(s){where}: {', '.join(names)}; see /openapi.json for the fields accepted",
                    param=params[0], code="unknown_parameter")


def path(error: dict, body: Any) -> str:
    """``error``'s location as the client wrote it (messages[0].content): pydantic's also names union branches
    (the tag 'user', 'list'), which are not in the client's JSON, so the location is walked through ``body``."""
    loc, node, out = error["loc"], body, ""
    for i, key in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(key, int) and isinstance(node, list) and key < len(node):
            out, node = f"{out}[{key}]", node[key]
        elif isinstance(key, str) and isinstance(node, dict) and (key in node or (last and "[" not in key)):
            # (a key with '[' is pydantic's name of a wrapper, json[...] for a form field holding JSON, no field)
            out, node = f"{out}.{key}" if out else key, node.get(key)
    if error["type"] in ("union_tag_invalid", "union_tag_not_found"):
        out += "." + error["ctx"]["discriminator"].strip("'")
    return out or "body"
