"""The HTTP API's tool-calling shapes (OpenAI function tools): the request's ``tools`` and ``tool_choice``, an
assistant message's ``tool_calls`` and a ``role: "tool"`` message. service.http.api_models puts them in the request;
service.http.tools renders them into the prompt, constrains and parses the answer."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from service.http.api_types import Shape, Text, matching, str_or_list

FunctionName = matching(r"^[A-Za-z0-9_-]{1,64}$", "invalid_value", "must be 1 to 64 letters, digits, '_' or '-'",
                        description="the function's name")


class FunctionDef(Shape):
    name: FunctionName
    description: str | None = Field(None, description="shown to the model in the tools block of the prompt")
    parameters: dict[str, Any] | None = Field(None, description="the JSON Schema of the arguments (default: any "
                                                                "object); enforced under tool_choice required or "
                                                                "a named function")
    strict: bool | None = Field(None, description="accepted: constrained calls always follow parameters")


class Tool(Shape):
    type: Literal["function"]
    function: FunctionDef


class ChosenFunction(Shape):
    name: FunctionName


class NamedToolChoice(Shape):
    type: Literal["function"]
    function: ChosenFunction


ToolChoice = Literal["auto", "none", "required"] | NamedToolChoice


class CalledFunction(Shape):
    name: FunctionName
    arguments: str = Field(description="the arguments as a JSON text")


class ToolCall(Shape):
    id: Annotated[str, Field(min_length=1)]
    type: Literal["function"]
    function: CalledFunction


class ToolTextPart(Shape):
    type: Literal["text"]
    text: Text


class ToolMessage(Shape):
    role: Literal["tool"]
    content: str_or_list(Text, ToolTextPart, "must be a string or a non-empty list of text parts", min_length=1)
    tool_call_id: Annotated[str, Field(min_length=1, description="the id of the assistant's call this answers")]
