"""The grammar that forces a model to write tool calls in its parser's format (tool_choice "required" or
a named function), in llguidance's Lark dialect.

`call_grammar` (`ToolParser.grammar`): a Lark grammar forcing >= 1 call (exactly 1 unless
`parallel`) in this parser's format, one `%json` alternative per allowed tool (`lark_json`: compact JSON, keys
in schema order — the fast path's order, objects closed). A tool's `$defs` move to its call schema's root
and its `#/...` refs are rebased, since the parameters are nested under the call's "arguments" key.
Markers that are control tokens in the model's tokenizer (Mistral's `[TOOL_CALLS]`) are written as that
token, `<[id]>` (llguidance's Lark names a special token only as `<name>` or `<[id]>`, and `[TOOL_CALLS]`
has no `<name>` form), when the caller gives their ids (`control_ids`; the server does); without them the
marker is text, which detokenizes the same (the server keeps special tokens for this parser) but is a
spelling the model never learned. The mistral grammar uses the v3 array form.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from blazr.engine.json_schema import lark_json
from blazr.errors import BlazrError

if TYPE_CHECKING:
    from blazr.server.tool_parsers import ToolParser


def call_grammar(
    parser: type[ToolParser],
    tools: Sequence[Mapping[str, Any]],
    name: str | None,
    parallel: bool,
    control_ids: Mapping[str, int] | None = None,
) -> str:
    """`parser.grammar`'s work (see there): >= 1 call (1 unless `parallel`) to `tools`, or to `name` only."""
    schemas = chosen([_call_schema(t, parser.grammar_key) for t in tools], name)
    ids = dict(control_ids or {})

    def lit(text: str) -> str:
        return lark_frame(text, ids)

    before, between, after = parser.frame
    calls = f"call ({lit(between)} call)*" if parallel else "call"
    lines = [
        "start: " + " ".join(p for p in (lit(before), calls, lit(after)) if p),
        "call: " + " ".join(p for p in (lit(parser.call_frame[0]), "fn", lit(parser.call_frame[1])) if p),
        "fn: " + " | ".join(f"fn_{i}" for i in range(len(schemas))),
    ]
    lines += [f"fn_{i}: {lark_json(s)}" for i, (_, s) in enumerate(schemas)]
    return "\n".join(lines) + "\n"


def chosen(schemas: list[tuple[str, dict[str, Any]]], name: str | None) -> list[tuple[str, dict[str, Any]]]:
    """The (function name, schema) pairs a forced call may take: all of them, or `name`'s only; BlazrError
    when there are none or `name` is not among them."""
    if not schemas:
        raise BlazrError("tool_choice: tools is empty")
    if name is None:
        return schemas
    picked = [(f, s) for f, s in schemas if f == name]
    if not picked:
        raise BlazrError(f"tool_choice: function {name!r} is not in tools")
    return picked


def _lit(text: str) -> str:
    """A Lark string literal ("" for none)."""
    return json.dumps(text) if text else ""


def lark_frame(text: str, control_ids: Mapping[str, int]) -> str:
    """Framing text as Lark: string literals, and `<[id]>` for each control-token marker inside it."""
    if not control_ids:
        return _lit(text)
    pattern = "|".join(re.escape(m) for m in sorted(control_ids, key=len, reverse=True))
    parts = []
    for piece in re.split(f"({pattern})", text):
        if piece in control_ids:
            parts.append(f"<[{control_ids[piece]}]>")
        elif piece:
            parts.append(_lit(piece))
    return " ".join(parts)


def tool_parameters(tool: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(function name, its parameters' JSON schema: `{"type": "object", "properties": {}}` when absent);
    BlazrError on a tool without a name or with parameters that are not an object."""
    fn = tool.get("function") if isinstance(tool, Mapping) else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(name, str) or not name:
        raise BlazrError("tools: each tool needs a function with a name")
    params = fn.get("parameters")  # type: ignore[union-attr]
    if params is None:
        params = {"type": "object", "properties": {}}
    if not isinstance(params, Mapping):
        raise BlazrError(f"tools: function {name!r} parameters must be a JSON schema object")
    return name, dict(params)


def _call_schema(tool: Mapping[str, Any], key: str) -> tuple[str, dict[str, Any]]:
    """(function name, JSON schema of one call to it: `{"name": f, key: <parameters>}`)."""
    name, params = tool_parameters(tool)
    defs = {k: params.pop(k) for k in ("$defs", "definitions") if k in params}
    for k in ("$schema", "$id"):
        params.pop(k, None)
    schema = {
        **defs,
        "type": "object",
        "properties": {"name": {"const": name}, key: _rebase_refs(params, f"#/properties/{key}")},
        "required": ["name", key],
    }
    return name, schema


_DATA_KEYWORDS = ("const", "enum", "default", "examples")


def _rebase_refs(schema: Any, base: str) -> Any:
    """`schema` with its local `$ref`s pointing where it now sits (`base`); `$defs` refs stay (moved up)."""
    if isinstance(schema, list):
        return [_rebase_refs(s, base) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for k, v in schema.items():
        if k == "$ref" and isinstance(v, str) and (v == "#" or v.startswith("#/")):
            kept = v.startswith(("#/$defs/", "#/definitions/"))
            out[k] = v if kept else base + v[1:]
        elif k in _DATA_KEYWORDS:
            out[k] = v
        else:
            out[k] = _rebase_refs(v, base)
    return out
