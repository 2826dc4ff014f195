"""Tool calling in Qwen3-VL's own format, the same on every engine.

The model's chat template lists the request's tools in a ``<tools>`` system block and renders earlier calls and
``role: "tool"`` results (service.engine.genai.render_prompt passes it ``tools``); the model answers a call as
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``. The engines generate that as text; this module
turns it into OpenAI's ``message.tool_calls`` (or ``delta.tool_calls`` while streaming).

``tool_choice`` required or a named function is a ResponseFormat of kind ``tool_call`` whose schema is the call
object (the name one of the chosen tools', the arguments that tool's parameters): each engine's grammar forces
``<tool_call>\\n`` + that JSON + ``\\n</tool_call>`` (service.engine.structured, genai's structural tags,
llama-server's own tool grammar), so such an answer always parses. ``auto`` is not constrained; ``none`` is never
parsed as a call.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass

from service.engine.conversation import ResponseFormat
from service.engine.errors import APIError
from service.http.api_tools import NamedToolChoice

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
ANY_ARGUMENTS = {"type": "object"}  # a function without parameters takes any object


@dataclass(frozen=True)
class Tools:
    """What a request's tools mean for its prompt and answer."""

    listed: str | None = None  # the tools as compact JSON text (the template's ``tools``), None without tools
    forced: ResponseFormat | None = None  # required / named: the call the answer is constrained to
    parse: bool = False  # the answer's <tool_call> blocks become tool_calls (not with tool_choice none)


def of_request(request) -> Tools:
    """The request's ``tools`` and ``tool_choice``, checked: a choice needs tools, a named function must be one of
    them, names are unique, and every parameters schema can be enforced by the grammar engine."""
    tools, choice = request.tools or [], request.tool_choice
    if not tools:
        if choice is not None:
            raise APIError("'tool_choice' needs 'tools': list the functions it chooses from", param="tool_choice",
                           code="invalid_value")
        return Tools()
    names = [tool.function.name for tool in tools]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise APIError(f"tools[{i}]: function '{name}' is listed twice", param=f"tools[{i}].function.name",
                           code="invalid_value")
    for i, tool in enumerate(tools):
        check_parameters(tool.function.parameters, f"tools[{i}].function.parameters")
    chosen = names if choice == "required" else None
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in names:
            raise APIError(f"'tool_choice.function.name': '{choice.function.name}' is not one of the tools "
                           f"({', '.join(names)})", param="tool_choice.function.name", code="invalid_value")
        chosen = [choice.function.name]
    if chosen is not None and request.response_format is not None and request.response_format.type != "text":
        raise APIError("'response_format' and a forced tool call ('tool_choice' required or a named function) "
                       "cannot both constrain the answer; send one", param="response_format", code="invalid_value")
    listed = json.dumps([tool.model_dump(exclude_none=True) for tool in tools], separators=(",", ":"))
    forced = None
    if chosen is not None:
        params = {tool.function.name: tool.function.parameters or ANY_ARGUMENTS for tool in tools}
        forced = ResponseFormat("tool_call", json.dumps(call_schema({n: params[n] for n in chosen}),
                                                        separators=(",", ":")))
    return Tools(listed, forced, parse=choice != "none")


def call_schema(parameters: dict[str, dict]) -> dict:
    """The JSON Schema of one call object: ``name`` one of ``parameters``' keys, ``arguments`` its schema."""
    options = [{"type": "object", "properties": {"name": {"const": name}, "arguments": schema},
                "required": ["name", "arguments"], "additionalProperties": False}
               for name, schema in parameters.items()]
    return options[0] if len(options) == 1 else {"anyOf": options}


def chosen_names(fmt: ResponseFormat) -> list[str]:
    """The function names a ``tool_call`` format allows (what call_schema made)."""
    schema = json.loads(fmt.schema)
    return [option["properties"]["name"]["const"] for option in schema.get("anyOf", [schema])]


def check_parameters(schema: dict | None, param: str) -> None:
    """The client's 400 naming what the grammar engine (llguidance) cannot enforce in a parameters schema."""
    if schema is None:
        return
    if schema.get("type", "object") != "object":  # the template's call is {"name", "arguments": <an object>}
        raise APIError(f"'{param}' must be an object schema (type 'object'): a call's arguments are a JSON object",
                       param=param, code="unsupported_schema")
    from llguidance import LLMatcher

    try:
        error = LLMatcher.validate_grammar(LLMatcher.grammar_from_json_schema(json.dumps(schema)))
    except (ValueError, RuntimeError) as e:
        error = str(e)
    if error:
        raise APIError(f"'{param}' cannot be enforced: {error.strip()}", param=param, code="unsupported_schema")


def check_history(messages) -> None:
    """A tool's result answers a call an earlier assistant message made (OpenAI refuses one that does not)."""
    called: set[str] = set()
    for i, message in enumerate(messages):
        if message.role == "assistant" and message.tool_calls:
            called |= {call.id for call in message.tool_calls}
        elif message.role == "tool" and message.tool_call_id not in called:
            raise APIError(f"messages[{i}]: 'tool_call_id' '{message.tool_call_id}' answers no earlier assistant "
                           "tool call", param=f"messages[{i}].tool_call_id", code="invalid_value")


def history_calls(message) -> str | None:
    """An assistant message's tool_calls as the compact JSON the template renders (arguments as sent)."""
    if message.role != "assistant" or not message.tool_calls:
        return None
    return json.dumps([call.model_dump() for call in message.tool_calls], separators=(",", ":"))


def new_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def _call(block: str) -> dict | None:
    """The ``{"name", "arguments"}`` of a <tool_call> block's JSON as an OpenAI tool call, None if it is not one."""
    try:
        obj = json.loads(block)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not isinstance(obj.get("arguments"),
                                                                                            dict):
        return None
    return {"id": new_id(), "type": "function",
            "function": {"name": obj["name"], "arguments": json.dumps(obj["arguments"], ensure_ascii=False)}}


def parse(text: str) -> tuple[str | None, list[dict]]:
    """(content, tool_calls) of a whole answer: the text before the first call (None if blank) and every call; an
    answer whose <tool_call> blocks do not all parse is all content."""
    found = list(_CALL.finditer(text))
    calls = [_call(m.group(1)) for m in found]
    if not found or None in calls:
        return text, []
    return text[:found[0].start()].strip() or None, calls


class ToolStream:
    """Streamed text in, OpenAI deltas out: content as it comes, except what could be the start of a <tool_call>
    (held back), and each call once its </tool_call> has come (name chunk, then arguments)."""

    def __init__(self):
        self._buf = ""
        self._in_call = False
        self.calls = 0

    def push(self, piece: str) -> list[dict]:
        self._buf += piece
        out: list[dict] = []
        while True:
            if not self._in_call:
                at = self._buf.find(OPEN)
                if at < 0:
                    keep = _held(self._buf)
                    out += self._content(self._buf[:len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep:]
                    return out
                out += self._content(self._buf[:at])
                self._buf, self._in_call = self._buf[at:], True
            end = self._buf.find(CLOSE)
            if end < 0:
                return out
            block, self._buf, self._in_call = self._buf[:end + len(CLOSE)], self._buf[end + len(CLOSE):], False
            call = _call(block[len(OPEN):-len(CLOSE)].strip())
            out += self._content(block) if call is None else self._deltas(call)

    def finish(self) -> list[dict]:
        """What is left: held text, or an unfinished call, is content."""
        rest, self._buf = self._buf, ""
        return self._content(rest)

    def _content(self, text: str) -> list[dict]:
        if not text or (self.calls and not text.strip()):  # the newlines between calls are not content
            return []
        return [{"content": text}]

    def _deltas(self, call: dict) -> list[dict]:
        index, self.calls = self.calls, self.calls + 1
        fn = call["function"]
        return [{"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                 "function": {"name": fn["name"], "arguments": ""}}]},
                {"tool_calls": [{"index": index, "function": {"arguments": fn["arguments"]}}]}]


def _held(text: str) -> int:
    """How many trailing characters of ``text`` could begin a <tool_call> (with the blank before it)."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-n:]):
            return n + len(text[:-n]) - len(text[:-n].rstrip())
    return len(text) - len(text.rstrip())
