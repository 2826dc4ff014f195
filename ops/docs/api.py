"""docs/api.md: the HTTP API, from service/http/openapi.py document() (generated from the pydantic models), and the
request limits from service/runtime/settings.py."""

from __future__ import annotations

import json

from ops.docs.markdown import HEADER, cell, default


def _name(ref: str) -> str:
    return ref.rsplit("/", 1)[1]


def _kind(prop: dict) -> str:
    """A JSON Schema type in a few words; references link to their schema below."""
    if "$ref" in prop:
        return f"[{_name(prop['$ref'])}](#{_name(prop['$ref']).lower()})"
    if "const" in prop:
        return "const " + json.dumps(prop["const"])
    if "enum" in prop:
        return prop.get("type", "enum")
    for key in ("anyOf", "oneOf"):
        if key in prop:
            return " or ".join(_kind(p) for p in prop[key])
    if prop.get("type") == "array":
        items = (prop.get("prefixItems") or [prop.get("items", {})])[0]
        return f"list of {_kind(items)}"
    kind = prop.get("type", "any")
    return " or ".join(kind) if isinstance(kind, list) else kind


def _notes(prop: dict) -> list[str]:
    notes = []
    for branch in [prop, *prop.get("anyOf", []), *prop.get("oneOf", [])]:
        for key in ("format", "minimum", "maximum", "exclusiveMinimum", "minItems", "maxItems", "minLength",
                    "pattern"):
            if key in branch:
                notes.append(f"{key} {branch[key]}")
        if "enum" in branch:
            notes.append("one of " + ", ".join(f"`{v}`" for v in branch["enum"]))
    if "description" in prop:
        notes.append(prop["description"])
    return notes


def _schema_fields(schema: dict) -> list[str]:
    rows = ["| Field | Type | Required | Notes |", "|---|---|---|---|"]
    required = set(schema.get("required", []))
    for name, prop in schema.get("properties", {}).items():
        rows.append(f"| `{name}` | {cell(_kind(prop))} | {'yes' if name in required else ''} | "
                    f"{cell('; '.join(_notes(prop)))} |")
    return rows


def _body(body: dict, schemas: dict) -> list[str]:
    lines = []
    for mime, media in body["content"].items():
        schema = media["schema"]
        named = f" [{_name(schema['$ref'])}](#{_name(schema['$ref']).lower()})" if "$ref" in schema else ""
        lines += [f"Request body (`{mime}`{', required' if body.get('required') else ''}):{named}", ""]
        lines += [*_schema_fields(schemas[_name(schema["$ref"])] if named else schema), ""]
    return lines


def _schema_section(name: str, schema: dict) -> list[str]:
    lines = [f"### {name}", ""]
    if "description" in schema:
        lines += [cell(schema["description"]), ""]
    if "properties" in schema:
        lines += [*_schema_fields(schema), ""]
    return [*lines, "<details><summary>JSON Schema</summary>", "", "```json", json.dumps(schema, indent=2), "```", "",
            "</details>", ""]


def render(version: str | None = None) -> str:
    from service import __version__
    from service.http.openapi import document

    doc = document(version or __version__)
    schemas = doc["components"]["schemas"]
    lines = [HEADER.format(source="service/http/openapi.py (document(); served live at GET /openapi.json) from the "
                                  "pydantic models in service/http/api_models.py and service/http/api_responses.py"),
             f"# HTTP API reference ({doc['info']['title']} {doc['info']['version']})", "",
             cell(doc["info"]["description"]), "",
             "The same document is served by every host at `GET /openapi.json` (OpenAPI "
             f"{doc['openapi']}); requests are validated by the models it is generated from. Errors share one JSON "
             "shape: `{\"error\": {\"message\", \"type\", \"param\", \"code\"}}` (schema `Error` below); `param` "
             "is the field at fault as a path such as `messages[0].content`. When `VLFLEET_API_KEYS_FILE` is set, "
             "every endpoint but `/healthz` and `/readyz` needs `Authorization: Bearer KEY` (401 when it is missing "
             "or wrong).", "",
             "| Method | Path | Summary |", "|---|---|---|"]
    ops = [(path, method, op) for path, item in doc["paths"].items() for method, op in item.items()]
    for path, method, op in ops:
        lines.append(f"| {method.upper()} | [`{path}`](#{op['operationId'].lower()}) | {cell(op['summary'])} |")
    lines.append("")
    lines += limits()
    lines += tool_calling()
    lines += engines()
    for path, method, op in ops:
        lines += [f"## {op['operationId']}", "", f"`{method.upper()} {path}`: {cell(op['summary'])}", ""]
        if op.get("requestBody"):
            lines += _body(op["requestBody"], schemas)
        lines += ["Responses:", ""]
        for code, resp in op["responses"].items():
            content = resp.get("content", {})
            mimes = ", ".join(f"`{m}`" + (f" {_kind(c['schema'])}" if "$ref" in c["schema"] else "")
                              for m, c in content.items())
            lines.append(f"- **{code}** {cell(resp['description'])}" + (f" ({mimes})" if mimes else ""))
        lines.append("")
    lines += ["## Schemas", ""]
    for name, schema in schemas.items():
        lines += _schema_section(name, schema)
    return "\n".join(lines).rstrip() + "\n"


def tool_calling() -> list[str]:
    """How tools and tool_choice work, and the OpenAI fields still refused by name (service/http/openai_request.py)."""
    from service.http.openai_request import UNSUPPORTED

    return ["## Tool calling", "",
            "`tools` (OpenAI function tools) are listed to the model by its own chat template (Qwen3-VL's `<tools>` "
            "system block); a call it writes (`<tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>`) comes "
            "back as `message.tool_calls` (streamed: `delta.tool_calls`, the name first, then the arguments) with "
            "`finish_reason` `tool_calls`, and `content` the text before it (or null). Earlier calls (an assistant "
            "message's `tool_calls`, its `content` null) and their results (`role: \"tool\"` with the "
            "`tool_call_id` of one of them) go back in `messages`. `tool_choice`: `auto` (the default with tools) "
            "lets the model choose; `none` never returns a call; `required` or `{\"type\": \"function\", "
            "\"function\": {\"name\": ...}}` makes the answer one call, constrained while it is generated to one of "
            "the chosen tools' names and its `parameters` schema, on every engine. A 400 names an unknown function, "
            "a `parameters` schema the grammar cannot enforce, `tool_choice` without `tools`, a tool result that "
            "answers no call, and `response_format` beside a forced call.", "",
            "Still refused by name (400 `unsupported_parameter`), since each would change the answer: "
            + ", ".join(f"`{name}`" for name in UNSUPPORTED) + ".", ""]


def engines() -> list[str]:
    """What each engine (VLFLEET_ENGINE) gives of the request fields that depend on it, from the engines' classes."""
    from service.engine import ENGINES

    def mark(yes: bool, note: str = "") -> str:
        return ("yes" if yes else "no (400)") + (f": {note}" if note else "")

    rows = {
        "`response_format` (`json_object`, `json_schema`), a forced tool call (`tool_choice` `required` or named)":
            lambda e: mark(e.constrains_output, e.format_limits and f"refuses {e.format_limits}"),
        "`tools`, `tool_choice` `auto` / `none`, `role: \"tool\"` messages": lambda e: "yes",
        "`logprobs`": lambda e: mark(e.top_logprobs is not None, "the chosen token's" if e.top_logprobs == 0 else ""),
        "`top_logprobs` (0-20)": lambda e: (f"up to {e.top_logprobs}" if e.top_logprobs else
                                            "0 only" if e.top_logprobs == 0 else "no (400)"),
        "`n` (1-8)": lambda e: "side by side" if not e.estimates_wait else "one after another",
        "`stream_options.include_usage`": lambda e: "yes",
    }
    lines = ["## Fields by engine", "",
             "Every field of a request is validated the same way on every host; these depend on the host's engine "
             "(`VLFLEET_ENGINE`, [engines.md](engines.md)). A field the engine cannot honour is a 400 "
             "(`unsupported_parameter`) that names the engines that can, never ignored.", "",
             "| field | " + " | ".join(ENGINES) + " |", "|---|" + "---|" * len(ENGINES)]
    lines += [f"| {name} | " + " | ".join(cell(give(engine)) for engine in ENGINES.values()) + " |"
              for name, give in rows.items()]
    return [*lines, ""]


LIMITS = ("max_input_tokens", "max_turns", "max_conversation_images", "max_images", "max_tokens", "image_max_side",
          "image_max_side_low", "image_max_side_high", "max_image_bytes", "max_image_pixels", "max_body_bytes",
          "queue_size", "queue_timeout")


def limits() -> list[str]:
    """What one request may ask, and why: the settings that bound it, with their defaults (from
    service/runtime/settings.py)."""
    from service.runtime.settings import FIELDS

    fields = {f.name: f for f in FIELDS}
    lines = ["## Limits", "",
             "One inference thread serves every client, so what a single request may ask is bounded: a prompt "
             "over a limit is refused at the door with a 400 (413 for bodies and images; 429 when the queue is full "
             "or its work would outlast the queue timeout, 503 when a wait outlasts it anyway) whose message names "
             "the limit, the setting and the count, before it takes a queue slot. Each is a `VLFLEET_*` setting "
             "([configuration.md](configuration.md)).", "",
             "| Setting | Default | Why |", "|---|---|---|"]
    lines += [f"| `{fields[n].env}` | {default(fields[n].default)} | {cell(fields[n].help)} |" for n in LIMITS]
    return [*lines, ""]
