"""Tools in the prompt of a model whose chat template does not render them.

A template that reads `tools` (Qwen2.5, Llama 3.1, Mistral, Hermes, …) gets them as the `tools` variable and
renders the definitions, the assistant's `tool_calls` and `tool` messages its own way. A template that does
not (SmolLM2's ChatML, most base chat templates) would drop all three silently, so the model would never
know it has tools nor see their results. For those, blazr writes the conversation in the Hermes format
itself, as plain messages every template renders:

  - the tool definitions go at the end of the system message (one is added first when there is none),
    with how to call them: one `<tool_call>{"name": …, "arguments": {…}}</tool_call>` block per call;
  - an assistant message's `tool_calls` become those blocks in its content;
  - `tool` messages become a user message of `<tool_response>…</tool_response>` blocks (consecutive ones
    merged into one, in order), as Qwen2.5's template renders them.

The server then reads calls back with the `hermes` parser (server/tool_parsers.py), and a grammar in that
same format enforces `tool_choice: required` or a named function.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from blazr.chat_template import message_text

TOOL_PARSER = "hermes"  # the format written here

_INSTRUCTIONS = """# Tools

You can call functions to help with the request. They are described in JSON Schema inside <tools></tools>:
<tools>
{definitions}
</tools>

To call functions, answer with one JSON object per call, each inside <tool_call></tool_call> tags:
<tool_call>
{{"name": <function name>, "arguments": <JSON object of arguments>}}
</tool_call>"""


def describe_tools(messages: list[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` (as a `Conversation` holds them, conversation.py) rewritten so that a template without tool
    support shows the model its tools, its earlier calls and their results. Unchanged when none occur."""
    has_calls = any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
    if not tools and not has_calls:
        return messages
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "tool":
            block = f"<tool_response>\n{message_text(m['content'])}\n</tool_response>"
            if out and out[-1].get("_tool_responses"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_responses": True})
            continue
        calls = [
            call_block(c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls", ())
        ]
        m = {k: v for k, v in m.items() if k != "tool_calls"}
        if calls:
            text = message_text(m.get("content")) or ""
            m["content"] = "\n".join(([text] if text else []) + calls)
        out.append(m)
    for m in out:
        m.pop("_tool_responses", None)
    if tools:
        definitions = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        instructions = _INSTRUCTIONS.format(definitions=definitions)
        if out and out[0]["role"] == "system":
            system = message_text(out[0]["content"]) or ""
            out[0] = {**out[0], "content": f"{system}\n\n{instructions}" if system else instructions}
        else:
            out.insert(0, {"role": "system", "content": instructions})
    return out


def call_block(name: str, arguments: dict[str, Any]) -> str:
    """One call as the model is asked to write it."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"
