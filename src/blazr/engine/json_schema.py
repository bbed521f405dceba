"""JSON Schemas as blazr's constrained decoding writes them: `narrow_schema` (objects closed, numbers of
bounded digits — engine/grammar.py's docstring says why), the formatting options every JSON grammar
shares (`JSON_OPTIONS`: compact, as `json.dumps` writes), and `lark_json`, a schema as a `%json` item of a
Lark grammar (the tool-call grammars). Plain Python: what the command line's parser reaches (the tool
parsers' names) does not import the matcher's llguidance and torch.
"""

from __future__ import annotations

import json
from typing import Any

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
NUMBER_DECIMALS = 10  # at most this many digits after the point in a `number` (llguidance's multipleOf limit)
MAX_SAFE_INTEGER = 2**53 - 1
MAX_NUMBER = 10**15


def narrow_schema(schema: Any, in_all_of: bool = False) -> Any:
    """A copy of `schema` that admits less, never more (see blazr.engine.grammar's docstring):
    - every object schema listing `properties` and saying nothing of other keys admits no other keys
      (`additionalProperties: false`); members of an `allOf` are left open (closing each would reject the
      keys of the others);
    - numbers have bounded digits: an `integer` stays within ±(2^53 - 1) (what a float64 holds exactly), a
      `number` within ±10^15 and, without `multipleOf`, at most `NUMBER_DECIMALS` decimals — a side the
      schema bounds itself keeps its bound, and a one-sided bound (pydantic's `ge=0`) gets the default on
      the other side — so a small model can never write digits until max_tokens cuts its JSON (SmolLM2
      wrote a population of 8111222222333… under `minimum: 0`)."""
    if isinstance(schema, list):
        return [narrow_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas"):
            out[key] = {k: narrow_schema(v) for k, v in value.items()} if isinstance(value, dict) else value
        elif key == "allOf" and isinstance(value, list):
            out[key] = [narrow_schema(s, in_all_of=True) for s in value]
        elif key in ("items", "prefixItems", "additionalProperties", "anyOf", "oneOf", "not", "contains"):
            out[key] = narrow_schema(value)
        else:
            out[key] = value
    open_keys = ("additionalProperties", "patternProperties", "unevaluatedProperties")
    if "properties" in out and not in_all_of and not any(k in out for k in open_keys):
        out["additionalProperties"] = False
    types = out.get("type")
    types = [types] if isinstance(types, str) else types if isinstance(types, list) else []
    if "integer" in types or "number" in types:
        limit = MAX_SAFE_INTEGER if "number" not in types else MAX_NUMBER
        low, high = ("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")
        if not any(k in out for k in low) and _within(out, high, limit):
            out["minimum"] = -limit
        if not any(k in out for k in high) and _within(out, low, limit):
            out["maximum"] = limit
        if "number" in types and "integer" not in types and "multipleOf" not in out:
            out["multipleOf"] = 10.0**-NUMBER_DECIMALS
    return out


def _within(schema: dict[str, Any], keys: tuple[str, ...], limit: float) -> bool:
    """Whether the bounds `keys` that `schema` gives (none: true) are numbers within ±limit, so that the other
    side's default bound leaves the range non-empty."""
    given = [schema[k] for k in keys if k in schema]
    return all(isinstance(v, int | float) and not isinstance(v, bool) and -limit <= v <= limit for v in given)


def lark_json(schema: dict[str, Any]) -> str:
    """A Lark item matching `schema` written as `json_schema` outputs are (compact, objects closed), for
    grammars that embed JSON: `start: "<tool_call>\\n" call "\\n</tool_call>"` with `call: ` + this."""
    return "%json " + json.dumps({**narrow_schema(schema), "x-guidance": JSON_OPTIONS})
