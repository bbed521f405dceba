"""The one chat request every front-end translates into, whatever API it came in through.

OpenAI chat completions (request_in.py), the Responses API (openai_responses.py), Anthropic Messages
(anthropic_messages.py) and Ollama's /api/chat and /api/generate (ollama_api.py) each turn their request into
a `Conversation`; chat_format.py turns that into the prompt, the grammar and the parsers of the served model
(llama.cpp's `common_chat_templates_inputs`: messages, tools, tool choice, format, thinking). Nothing here
knows an API's field names except for naming them in errors (`params`).

Messages follow the chat templates' (HF's) conventions: `{"role": "system" | "user" | "assistant" | "tool",
"content": str | [{"type": "text", "text"}]}`, an assistant's `tool_calls` as `[{"id", "type": "function",
"function": {"name", "arguments": <object>}}]` and its `reasoning_content`, a tool message's
`tool_call_id` (and `name`). Tools are OpenAI function tools, `{"type": "function", "function": {"name",
"description", "parameters"}}`.

Thinking: `thinking` False turns the template's switch off (`enable_thinking`, Qwen3's and its kin's);
`thinking_budget` caps the reasoning block at that many tokens (the engine then writes the end marker
itself, engine/thinking.py); `reasoning_effort` is passed to the template as the variable of that name
(gpt-oss reads it) and maps to both (`EFFORT_BUDGETS`) unless they are given.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from blazr.engine.grammar import StructuredOutput

ToolMode = Literal["none", "auto", "required"]

# reasoning effort → thinking budget in tokens (None: no cap); "none" also turns the template's switch off
EFFORT_BUDGETS: dict[str, int | None] = {
    "none": 0,
    "minimal": 256,
    "low": 1024,
    "medium": 4096,
    "high": 16384,
    "xhigh": None,
    "max": None,
}


@dataclass(frozen=True)
class ToolChoice:
    """`none` (tools not shown, output not parsed for calls), `auto`, or `required` — with `name`, that
    function only. `required` and a name are held by a grammar in the model's own call format."""

    mode: ToolMode = "auto"
    name: str | None = None

    @property
    def is_forced(self) -> bool:
        return self.mode == "required"


@dataclass
class Conversation:
    """A chat request, API-neutral (see the module docstring). `params`: the request's field names for
    errors, by concept: messages, tools, tool_choice, tool_name (the function a choice names), format."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: ToolChoice = ToolChoice()
    parallel_tool_calls: bool = True
    response_format: StructuredOutput | None = None  # what the answer must match (after any reasoning)
    thinking: bool | None = None  # None: the template's default
    thinking_budget: int | None = None  # tokens of reasoning at most (None: no cap)
    reasoning_effort: str | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    add_generation_prompt: bool = True
    prefill: str = ""  # the start of the answer, written by the client (Anthropic's last assistant turn)
    params: dict[str, str] = field(default_factory=dict)

    def param(self, concept: str) -> str:
        """The request field that holds `concept` (for a 400 naming it)."""
        return self.params.get(concept, concept)

    def template_variables(self) -> dict[str, Any]:
        """What the chat template sees besides messages and tools: the client's kwargs, then the thinking
        switch and `reasoning_effort` where the kwargs leave them unset."""
        out = {
            k: v
            for k, v in self.template_kwargs.items()
            if k not in ("messages", "add_generation_prompt", "self", "tools")
        }
        if self.reasoning_effort is not None:
            out.setdefault("reasoning_effort", self.reasoning_effort)
        thinking = self.thinking
        if thinking is None and self.reasoning_effort == "none":
            thinking = False
        if thinking is not None:
            out.setdefault("enable_thinking", thinking)
        return out

    def num_chars(self) -> int:
        """The characters of the conversation's text (an upper bound of its tokens' before tokenizing)."""
        total = 0
        for m in self.messages:
            content = m.get("content")
            if isinstance(content, str):
                total += len(content)
            elif isinstance(content, list):
                total += sum(len(str(p.get("text", ""))) for p in content if isinstance(p, dict))
            total += len(str(m.get("reasoning_content") or ""))
            total += sum(
                len(json.dumps(c.get("function", {}).get("arguments"))) for c in m.get("tool_calls") or ()
            )
        return total

    @property
    def budget(self) -> int | None:
        """The thinking budget in force: given, else from the effort, else none; 0 when thinking is off."""
        if self.thinking_budget is not None:
            return self.thinking_budget
        if self.thinking is False:
            return 0
        if self.reasoning_effort is not None:
            return EFFORT_BUDGETS.get(self.reasoning_effort)
        return None
