"""What an OpenAI request's output must match, from the fields clients send for it.

In:  a validated request — OpenAI's `response_format` (`json_object`, `json_schema` + `strict`), vLLM's
     `structured_outputs` (`json`, `json_object`, `regex`, `choice`, `grammar`) and its older top-level
     names (`guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`).
Out: one `StructuredOutput` (engine/grammar.py) and the field that asked for it, or None.

At most one source may ask for a format: two (say `response_format` and `structured_outputs`) is a 400
naming both, never a silent pick. A forced tool call (chat's `tool_choice: "required"` or a named function)
is the chat format's own grammar (chat_format.py) and cannot be combined with a response format (400).
With `tool_choice: "auto"` and a response format, the format wins: the output is held to it, so no tool
call can occur (tools are still rendered into the prompt).

With --reasoning-parser, chat_format.py puts any of these behind the reasoning block (engine/grammar.py's
`ThinkFirst`): the model thinks freely up to `</think>`, then the format holds — as vLLM does.

Specs are only built here; compiling them (which checks them against the grammar library) happens on the
preprocessing pool (serving.py) and turns a bad schema or regex into a 400 naming the field.
"""

from __future__ import annotations

from typing import Any

from blazr.engine.grammar import StructuredOutput
from blazr.errors import BlazrError
from blazr.server.errors import bad_request
from blazr.server.schemas import SamplingFields


def structured_output(req: SamplingFields) -> tuple[StructuredOutput, str] | None:
    """The one format asked for and the field that asked (for errors), or None."""
    found: list[tuple[str, dict[str, Any]]] = []
    fmt = req.response_format
    if fmt is not None and fmt.type != "json_schema" and fmt.json_schema is not None:
        raise bad_request(
            "response_format: json_schema is only allowed with type json_schema",
            "response_format.json_schema",
        )
    if fmt is not None and fmt.type == "json_object":
        found.append(("response_format", {"json_object": True}))
    elif fmt is not None and fmt.type == "json_schema":
        js = fmt.json_schema
        if js is None:
            raise bad_request(
                "response_format of type json_schema needs a json_schema object",
                "response_format.json_schema",
            )
        spec = (
            {"json_schema": js.schema_, "strict": bool(js.strict)}
            if js.schema_ is not None
            else {"json_object": True}
        )
        found.append(("response_format", spec))
    so = req.structured_outputs
    if so is not None:
        given = {
            "json_schema": so.json_,
            "json_object": so.json_object or None,
            "regex": so.regex,
            "choice": so.choice,
            "grammar": so.grammar,
        }
        given = {k: v for k, v in given.items() if v is not None}
        if len(given) != 1:
            names = ", ".join("json" if k == "json_schema" else k for k in given) or "none"
            raise bad_request(
                "structured_outputs: give exactly one of json, json_object, regex, choice, grammar; "
                f"got {names}",
                "structured_outputs",
            )
        found.append(("structured_outputs", given))
    for name, key in (
        ("guided_json", "json_schema"),
        ("guided_regex", "regex"),
        ("guided_choice", "choice"),
        ("guided_grammar", "grammar"),
    ):
        value = getattr(req, name)
        if value is not None:
            found.append((name, {key: value}))
    if not found:
        return None
    if len(found) > 1:
        raise bad_request(
            f"{found[0][0]} and {found[1][0]} both ask for an output format; give one", found[1][0]
        )
    param, kwargs = found[0]
    try:
        return StructuredOutput(**kwargs), param
    except BlazrError as e:
        raise bad_request(str(e), param) from None
