"""Building blocks of the API's pydantic models: each states a rule once, to JSON Schema and to validation alike.

Refusals raise ``PydanticCustomError(code, fix)``; service.http.request_errors turns them into OpenAI's error shape with
the field's path in front of ``fix``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, WithJsonSchema
from pydantic_core import PydanticCustomError

from service.engine.conversation import RESERVED_TAG_PATTERN, reserved_tag

# The codes refusals below use; any other error type is pydantic's own (request_errors phrases those).
CODES = frozenset({"invalid_type", "invalid_value", "unsupported_parameter", "empty_prompt", "reserved_tag",
                   "invalid_image_url", "missing_image"})
# Not blank: ASCII whitespace spelled out, so JSON Schema's (ECMA-262) and Python's regex agree on every string.
NOT_BLANK = r"[^ \t\n\r\f\v]"


def refuse(code: str, fix: str, param: str | None = None) -> PydanticCustomError:
    """A refusal. ``fix`` follows the field's path in the message; a rule across fields gives ``param`` (the field
    to change) and a whole sentence that names it."""
    return PydanticCustomError(code, fix, {"param": param} if param else None)


class Shape(BaseModel):
    """JSON as it is: no coercion (1.0 is not an int, "1" not a number, 1 not true) and no unknown fields."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _integral(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def integer(**limits: int) -> Any:
    """JSON Schema's integer: a number without a fractional part, 5.0 included (a JSON parser makes that a float).
    ``limits`` (ge, le) come first so pydantic declares them as minimum and maximum."""
    return Annotated[int, Field(**limits), BeforeValidator(_integral)]


def _matches(pattern: str, code: str, fix: str):
    regex = re.compile(pattern)

    def check(text: str) -> str:
        if not regex.search(text):
            raise refuse(code, fix)
        return text

    return check


def matching(pattern: str, code: str, fix: str, **schema: Any) -> Any:
    """A string that must match ``pattern``: one regex, declared to JSON Schema and checked here."""
    return Annotated[str, AfterValidator(_matches(pattern, code, fix)),
                     WithJsonSchema({"type": "string", "pattern": pattern, **schema})]


def _no_reserved_tag(text: str) -> str:
    if tag := reserved_tag(text):
        raise refuse("reserved_tag", f"contains {tag}, a placeholder reserved for the runtime; send images as "
                                     "image_url parts (on /chat as the 'image' file)")
    return text


NOT_RESERVED = {"not": {"pattern": RESERVED_TAG_PATTERN}}
Text = Annotated[str, AfterValidator(_no_reserved_tag), WithJsonSchema({"type": "string", **NOT_RESERVED})]


def prompt(fix: str, form: bool = False) -> Any:
    """Text a user asks with: not blank (code empty_prompt, ``fix``) and free of runtime placeholders. A ``form``
    field's schema leaves the placeholder rule ("not") out: schemathesis 4.32.5 fails on "not" beside a file."""
    schema = {"type": "string", "pattern": NOT_BLANK, **({} if form else NOT_RESERVED)}
    return Annotated[str, AfterValidator(_matches(NOT_BLANK, "empty_prompt", fix)), AfterValidator(_no_reserved_tag),
                     WithJsonSchema(schema)]


def _no_default(schema: dict) -> None:
    schema.pop("default", None)


def leave_out(description: str) -> Any:
    """A form field that may be left out: forms have no null, so None is the default and not a documented value
    (the type says ``X | SkipJsonSchema[None]``)."""
    return Field(None, description=description, json_schema_extra=_no_default)


def str_or_list(text: Any, item: Any, fix: str, **limits: int) -> Any:
    """``text`` or a list of ``item``, told apart by JSON type: a mistake gets one error (``fix``), not one per kind."""

    def kind(value: Any) -> str | None:
        return "text" if isinstance(value, str) else "list" if isinstance(value, list) else None

    return Annotated[Annotated[text, Tag("text")] | Annotated[list[item], Tag("list"), Field(**limits)],
                     Discriminator(kind, custom_error_type="invalid_type", custom_error_message=fix)]


def only(kind: type, value: int, fix: str) -> Any:
    """A field accepted at OpenAI's default only: another value would change the answer, so it is refused."""

    def check(given: float) -> float:
        if given != value:
            raise refuse("unsupported_parameter", fix)
        return given

    return Annotated[integer() if kind is int else kind, AfterValidator(check),
                     WithJsonSchema({"type": "integer" if kind is int else "number", "const": value})]
