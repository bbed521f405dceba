"""The served model's chat format: one object that renders a `Conversation` (conversation.py) into its
prompt, makes the grammar that holds its output (a forced tool call, a response format — behind a reasoning
block when the model reasons), knows its control tokens, and parses its output stream back into reasoning,
content and tool calls. llama.cpp's `common_chat_templates_apply` → `common_chat_params` and
`common_chat_parse` are the model: every front-end (OpenAI chat completions, Responses, Anthropic Messages,
Ollama) goes through `ChatFormat.plan` and `ChatPlan.output`, none of them touches a format's pieces.

A format is a tool-call style and a reasoning style:
  - the tool-call style (`--tool-call-parser`, else read from the template's markers, `choose_tool_parser`)
    is a `ToolParser` class (tool_parsers.py): its markers, the framing its grammar writes (tool_grammar.py)
    and its incremental parser; a template that renders no tools gets them described in the Hermes style
    by blazr (tool_prompt.py);
  - the reasoning style (`--reasoning-parser`) is a `ReasoningParser` class (reasoning.py): its
    `<think>` / `</think>` markers, and its incremental splitter.
A format whose output is channels (GPT-OSS's harmony, harmony.py: chosen from a template that writes
`<|channel|>`, or by `--tool-call-parser harmony` / `--reasoning-parser harmony`) has one parser for both
(`ToolParser.splits_channels`): it splits reasoning and content with tools or without, its forced call
carries its own optional reasoning block, a response format holds in its final channel, and the
conversation is adapted to its template (reasoning as `thinking`, one call per message, the effort's name).
The tokenizer says which markers are control tokens (decode must keep them for the parser; a forced-call
grammar writes them as those tokens).

`plan(conversation)` (off the event loop: it renders the template) checks tools against tool_choice and the
format, renders the prompt, and returns a `ChatPlan`: the prompt ids, the structured-output spec (behind
`ThinkFirst` with a reasoning parser), the thinking budget, and what the output's parsers need (did the
prompt open a reasoning block, which call is forced, how many calls at most). `ChatPlan.apply(params)` puts
its part into the request's `SamplingParams`; `ChatPlan.output()` is a fresh parser for one choice.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from blazr.chat_template import ChatTemplate
from blazr.engine.grammar import StructuredOutput, ThinkFirst
from blazr.engine.sampling import SamplingParams
from blazr.engine.thinking import ThinkingBudget
from blazr.errors import BlazrError
from blazr.server import harmony, tool_prompt
from blazr.server.assistant import AssistantOutput
from blazr.server.conversation import Conversation
from blazr.server.errors import bad_request
from blazr.server.reasoning import CHANNEL_FORMATS, REASONING_PARSERS, ReasoningParser
from blazr.server.tool_parsers import TOOL_PARSERS, ToolParser, detect_tool_parser
from blazr.tokenizer import Tokenizer

PROMPT_TAIL_TOKENS = 16  # the prompt's end, decoded for the reasoning parser (did the template open <think>?)


def choose_tool_parser(template: ChatTemplate) -> str:
    """The tool-call style of a chat template: named by its markers; a template that renders no tools gets
    them described by blazr in the Hermes style (tool_prompt.py); else Hermes, the most common."""
    if not template.uses_tools:
        return tool_prompt.TOOL_PARSER
    return detect_tool_parser(template.source) or "hermes"


@dataclass
class ChatPlan:
    """What a conversation becomes for this model (llama.cpp's `common_chat_params`)."""

    prompt_ids: list[int]
    prompt_tail: str  # the prompt's end as text, control tokens kept
    tool_parser: type[ToolParser] | None  # None: no tools, or tool_choice none (output not parsed for calls)
    reasoning_parser: type[ReasoningParser] | None
    calls_on: bool = True  # a `splits_channels` tool parser is there with calls off too
    structured: StructuredOutput | None = None  # a forced call or a response format (after any reasoning)
    structured_param: str | None = None  # the field that asked for it (a bad schema names it)
    forced_name: str | None = None  # tool_choice named this function
    max_calls: int | None = None  # 1 with parallel tool calls off or a named function
    keep_special: bool = False  # decode keeping control tokens (the tool parser reads its markers)
    thinking: ThinkingBudget | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def apply(self, params: SamplingParams) -> None:
        """Put the plan's part into a request's sampling parameters."""
        params.structured = self.structured
        params.thinking = self.thinking
        if self.keep_special:
            params.skip_special_tokens = False

    def output(self) -> AssistantOutput:
        """A fresh parser for one choice's output."""
        r, tools = self.reasoning_parser, self.tool_parser
        return AssistantOutput(
            r(self.prompt_tail) if r is not None else None,
            tools.for_output(self.prompt_tail, self.calls_on) if tools is not None else None,
            self.forced_name,
            self.max_calls,
        )

    @property
    def opened_thinking(self) -> bool:
        """The prompt opened a reasoning block (the output starts inside it)."""
        r = self.reasoning_parser
        return r is not None and r(self.prompt_tail).opened_by_prompt


class ChatFormat:
    """The served model's chat format (see the module docstring)."""

    def __init__(
        self, tokenizer: Tokenizer, tool_call_parser: str | None = None, reasoning_parser: str | None = None
    ) -> None:
        """`tool_call_parser`: a name in TOOL_PARSERS, or None to pick one from the chat template;
        `reasoning_parser`: a name in REASONING_PARSERS (or CHANNEL_FORMATS: that format whole), or None for
        no reasoning split."""
        self.tokenizer = tokenizer
        if reasoning_parser in CHANNEL_FORMATS:
            tool_call_parser, reasoning_parser = tool_call_parser or reasoning_parser, None
        self.tool_parser = TOOL_PARSERS[tool_call_parser or choose_tool_parser(tokenizer.chat_template)]
        self.reasoning_parser = REASONING_PARSERS[reasoning_parser] if reasoning_parser else None
        self.channels = self.tool_parser.splits_channels
        # the tool parser's markers that are control tokens here: decode must keep them for the parser, and a
        # forced-call grammar writes them as those tokens
        added = tokenizer.special_tokens
        self.control_ids = {
            m: added[m] for m in self.tool_parser.markers if m in added and tokenizer.decode([added[m]]) == ""
        }
        self.keep_special = self.tool_parser.needs_special_tokens or bool(self.control_ids)

    def describe(self) -> str:
        if self.channels:
            return f"{self.tool_parser.name} (reasoning and tool calls)"
        reasoning = f", reasoning {self.reasoning_parser.name}" if self.reasoning_parser else ""
        return f"tool calls {self.tool_parser.name}{reasoning}"

    @property
    def reasons(self) -> bool:
        """Reasoning is split from content (a reasoning parser, or a format of channels)."""
        return self.reasoning_parser is not None or self.channels

    # ---------------------------------------------------------------------------------------- render

    def render(self, conv: Conversation, tools_shown: bool = True) -> list[int]:
        """The prompt ids of a conversation: tools rendered by the template when it renders tools, else
        described in the system message (tool_prompt.py), then the answer's prefill as plain text; a
        template that rejects the conversation is a 400 naming the messages."""
        tools = conv.tools if tools_shown and conv.tool_choice.mode != "none" else []
        kwargs = conv.template_variables()
        messages = conv.messages
        prefill = self.tokenizer.encode_ordinary(conv.prefill) if conv.prefill else []
        if self.channels:  # harmony: its template's conventions, the prefill in the final channel
            messages, tools = harmony.template_messages(messages), harmony.template_tools(tools)
            effort = harmony.template_effort(kwargs.get("reasoning_effort"))
            if effort is not None:
                kwargs["reasoning_effort"] = effort
            prefill = self.encode_framing(harmony.FINAL) + prefill if prefill else []
        if self.tokenizer.chat_template.uses_tools:
            if tools:
                kwargs["tools"] = tools
        else:
            messages = tool_prompt.describe_tools(messages, tools)
        try:
            ids = self.tokenizer.encode_chat(
                messages, add_generation_prompt=conv.add_generation_prompt, **kwargs
            )
        except (BlazrError, TypeError, ValueError) as e:
            raise bad_request(str(e), conv.param("messages")) from None
        return ids + prefill

    def encode_framing(self, text: str) -> list[int]:
        """Format text (no client's): the control markers in it as their tokens, the rest as plain text."""
        if not self.control_ids:
            return self.tokenizer.encode_ordinary(text)
        ids: list[int] = []
        for piece in re.split("(" + "|".join(map(re.escape, self.control_ids)) + ")", text):
            if piece in self.control_ids:
                ids.append(self.control_ids[piece])
            elif piece:
                ids.extend(self.tokenizer.encode_ordinary(piece))
        return ids

    def prompt_tail(self, prompt_ids: list[int]) -> str:
        """The end of a prompt as text, control tokens kept (did the template open a reasoning block?)."""
        return self.tokenizer.decode(prompt_ids[-PROMPT_TAIL_TOKENS:], skip_special=False)

    # ------------------------------------------------------------------------------------------ plan

    def plan(self, conv: Conversation) -> ChatPlan:
        """Check, render and plan a conversation (see the module docstring); 400s name the field."""
        _check_tools(conv)
        tools_on = bool(conv.tools) and conv.tool_choice.mode != "none"
        structured, param = conv.response_format, conv.param("format")
        if tools_on and conv.tool_choice.is_forced:
            if structured is not None:
                raise bad_request(f"{param} cannot be combined with tool_choice {_choice_name(conv)}", param)
            structured, param = self.call_grammar(conv), conv.param("tool_choice")
        return self.plan_prompt(self.render(conv), conv, structured, param, tools_on)

    def plan_prompt(
        self,
        prompt_ids: list[int],
        conv: Conversation | None = None,
        structured: StructuredOutput | None = None,
        param: str | None = None,
        tools_on: bool = False,
    ) -> ChatPlan:
        """The plan of an already rendered prompt (a raw prompt: Ollama's `raw`; no tools unless `conv`
        has them on)."""
        r = self.reasoning_parser
        tail = self.prompt_tail(prompt_ids)
        parser = self.tool_parser if tools_on or self.channels else None
        plan = ChatPlan(prompt_ids, tail, parser, r, tools_on)
        if conv is not None and tools_on:
            plan.forced_name = conv.tool_choice.name
            plan.max_calls = 1 if not conv.parallel_tool_calls or conv.tool_choice.name else None
        plan.keep_special = self.keep_special and (tools_on or self.channels)
        opened = plan.opened_thinking
        forced_call = tools_on and conv is not None and conv.tool_choice.is_forced  # (it frames reasoning)
        if structured is not None and self.channels and not forced_call:  # in the final channel
            lark = harmony.answer_block(self.control_ids)
            think = ThinkFirst(harmony.THINK_START, harmony.THINK_END, lark=lark)
            structured = dataclasses.replace(structured, think=think)
        elif structured is not None and r is not None:  # the format holds after the reasoning block
            structured = dataclasses.replace(structured, think=ThinkFirst(r.start, r.end, opened))
        plan.structured, plan.structured_param = structured, param
        budget = conv.budget if conv is not None else None
        if budget is not None and self.channels:
            plan.thinking = ThinkingBudget(budget, harmony.THINK_START, harmony.THINK_END)
        elif budget is not None and r is not None:  # (no reasoning parser: no block to cap)
            plan.thinking = ThinkingBudget(budget, r.start, r.end, opened)
        return plan

    def call_grammar(self, conv: Conversation) -> StructuredOutput:
        """The grammar that holds the output to calls in this format's style (tool_choice required /
        named), its control-token markers written as those tokens."""
        named = conv.tool_choice.name
        parallel = conv.parallel_tool_calls and named is None
        try:
            grammar = self.tool_parser.grammar(conv.tools, named, parallel, self.control_ids)
        except BlazrError as e:
            raise bad_request(str(e), conv.param("tool_choice")) from None
        return StructuredOutput(grammar=grammar)


def _check_tools(conv: Conversation) -> None:
    """tools and tool_choice together: names unique, a named function among them, a choice needs tools."""
    choice = conv.tool_choice
    if not conv.tools:
        if choice.mode not in ("none", "auto") or choice.name is not None:
            raise bad_request(f"{conv.param('tool_choice')} needs tools", conv.param("tool_choice"))
        return
    names = [_name(t) for t in conv.tools]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise bad_request(f"tools: function {dupes[0]!r} is defined twice", conv.param("tools"))
    if choice.name is not None and choice.name not in names:
        raise bad_request(
            f"{conv.param('tool_choice')} names function {choice.name!r}, which is not in tools",
            conv.params.get("tool_name", "tool_choice.name"),
        )


def _name(tool: Mapping[str, Any]) -> str:
    fn = tool.get("function")
    return str(fn.get("name")) if isinstance(fn, Mapping) else ""


def _choice_name(conv: Conversation) -> str:
    name = conv.tool_choice.name
    return f"naming {name!r}" if name else "'required'"
