"""Every structured-output kind × reasoning parser on / off × streamed or not, through `blazr serve` on
SmolLM2 with the official `openai` client; and what today's clients send beside it.

The kinds: response_format json_schema and json_object, structured_outputs regex, choice, Lark and GBNF
grammars, tool_choice "required" and a named function. The modes:
  - `off`: the embedded chat template, no reasoning parser: the output is the constrained answer;
  - `opened`: `--reasoning-parser qwen3` with a Qwen3-like template that opens `<think>` in the prompt; the
    conversation's earlier turns (assistant messages with `reasoning`, rendered by the template) show
    SmolLM2 a short thought, which it copies: the reasoning comes back as `reasoning_content` and the
    answer after `</think>` holds to the format;
  - `optional`: the same server with the template's `enable_thinking` off (`chat_template_kwargs`: an
    empty block in the prompt): a block is optional, and the answer holds either way. (`reasoning_effort:
    "none"` turns the same switch off and also caps any block the model still opens at 0 tokens:
    test_server_clients.py.)
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from blazr.server.ray_router import routing_key
from tests.server_util import ServerProcess

THINK_TEMPLATE = """\
{%- for m in messages -%}
<|im_start|>{{ m.role }}
{% if m.role == 'assistant' and m.reasoning_content %}<think>
{{ m.reasoning_content }}
</think>

{% endif %}{{ m.content }}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% else %}<think>
{% endif %}{% endif %}"""

HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "You think briefly, then answer."},
    {"role": "user", "content": "What is 2+3?"},
    {"role": "assistant", "reasoning": "Two plus three is five.", "content": "5"},
    {"role": "user", "content": "What is 4+4?"},
    {"role": "assistant", "reasoning": "Four plus four is eight.", "content": "8"},
    {"role": "user", "content": "What is 3+4?"},
]
ADD_PARAMS = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}
ADD = {
    "type": "function",
    "function": {"name": "add", "description": "Add two numbers.", "parameters": ADD_PARAMS},
}
ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["answer"],
}
SENTENCE = re.compile(r"The answer is [0-9]{1,2}\.")


@dataclass
class Answer:
    """One choice, from a response or reassembled from a stream."""

    content: str | None
    reasoning: str | None
    finish_reason: str | None
    calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments)


def _json_schema(a: Answer) -> bool:
    jsonschema.validate(json.loads(a.content or ""), ANSWER)
    return True


def _json_object(a: Answer) -> bool:
    return isinstance(json.loads(a.content or ""), dict)


def _calls(a: Answer, *, single: bool) -> bool:
    assert a.calls and not (a.content or "").strip()
    assert len(a.calls) == 1 or not single
    for name, arguments in a.calls:
        assert name == "add"
        jsonschema.validate(json.loads(arguments), ADD_PARAMS)
    return True


KINDS: dict[str, tuple[dict[str, Any], Any, str]] = {  # request fields, check, finish_reason
    "json_schema": (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}}},
        _json_schema,
        "stop",
    ),
    "json_object": ({"response_format": {"type": "json_object"}}, _json_object, "stop"),
    "regex": (
        {"extra_body": {"structured_outputs": {"regex": "[0-9]{1,2}"}}},
        lambda a: re.fullmatch("[0-9]{1,2}", a.content or ""),
        "stop",
    ),
    "choice": (
        {"extra_body": {"structured_outputs": {"choice": ["7", "8"]}}},
        lambda a: a.content in ("7", "8"),
        "stop",
    ),
    "lark": (
        {"extra_body": {"structured_outputs": {"grammar": 'start: "The answer is " N "."\nN: /[0-9]{1,2}/'}}},
        lambda a: SENTENCE.fullmatch(a.content or ""),
        "stop",
    ),
    "gbnf": (
        {"extra_body": {"structured_outputs": {"grammar": 'root ::= "The answer is " [0-9] [0-9]? "."'}}},
        lambda a: SENTENCE.fullmatch(a.content or ""),
        "stop",
    ),
    "tool_choice_required": (
        {"tools": [ADD], "tool_choice": "required"},
        lambda a: _calls(a, single=False),
        "tool_calls",
    ),
    "tool_choice_named": (  # OpenAI reports a named tool_choice's call with "stop"
        {"tools": [ADD], "tool_choice": {"type": "function", "function": {"name": "add"}}},
        lambda a: _calls(a, single=True),
        "stop",
    ),
}


@pytest.fixture(scope="module")
def plain() -> Iterator[ServerProcess]:
    with ServerProcess(["--max-model-len", "2048", "--served-model-name", "m"]) as server:
        yield server


@pytest.fixture(scope="module")
def thinking(tmp_path_factory) -> Iterator[ServerProcess]:
    template = tmp_path_factory.mktemp("template") / "think.jinja"
    template.write_text(THINK_TEMPLATE)
    args = ["--max-model-len", "2048", "--served-model-name", "m", "--reasoning-parser", "qwen3"]
    with ServerProcess([*args, "--chat-template", str(template)]) as server:
        yield server


async def _ask(client: openai.AsyncOpenAI, body: dict[str, Any], stream: bool) -> Answer:
    if not stream:
        choice = (await client.chat.completions.create(**body)).choices[0]
        m = choice.message
        calls = [(c.function.name, c.function.arguments) for c in m.tool_calls or ()]
        return Answer(m.content, getattr(m, "reasoning_content", None), choice.finish_reason, calls)
    content, reasoning, finish = [], [], None
    calls: dict[int, list[str]] = {}
    async for chunk in await client.chat.completions.create(**body, stream=True):
        for c in chunk.choices:
            content.append(c.delta.content or "")
            reasoning.append(getattr(c.delta, "reasoning_content", None) or "")
            for t in c.delta.tool_calls or ():
                call = calls.setdefault(t.index, ["", ""])
                call[0] += (t.function and t.function.name) or ""
                call[1] += (t.function and t.function.arguments) or ""
            finish = c.finish_reason or finish
    return Answer(
        "".join(content) or None,
        "".join(reasoning) or None,
        finish,
        [(name, args) for name, args in calls.values()],
    )


async def _ask_all(server: ServerProcess, extra: dict[str, Any], stream: bool) -> list[Answer]:
    async with server.async_client() as client:
        bodies = [
            {"model": "m", "messages": HISTORY, "max_tokens": 60, "temperature": 0, **fields}
            for fields, _, _ in KINDS.values()
        ]
        for body in bodies:  # (extra_body merged, not replaced)
            for key, value in extra.items():
                body[key] = {**body.get(key, {}), **value} if key == "extra_body" else value
        return await asyncio.gather(*(_ask(client, b, stream) for b in bodies))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("mode", ["off", "opened", "optional"])
def test_every_format_holds_with_and_without_a_reasoning_block(plain, thinking, mode, stream):
    server = plain if mode == "off" else thinking
    extra = {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}} if mode == "optional" else {}
    answers = asyncio.run(_ask_all(server, extra, stream))
    for (kind, (_, check, finish)), a in zip(KINDS.items(), answers, strict=True):
        assert a.finish_reason == finish, (kind, a)
        assert check(a), (kind, a)
        for text in (a.content or "", *(args for _, args in a.calls)):
            assert "<think>" not in text and "</think>" not in text, (kind, a)
        if mode == "off":
            assert a.reasoning is None, (kind, a)
        if mode == "opened":
            assert a.reasoning and a.reasoning.strip(), (kind, a)  # SmolLM2 thought, then answered
        # optional: greedy SmolLM2 takes the block for some kinds (reasoning_content), not for others


# ------------------------------------------------------------------------------ what clients send


def test_the_openai_client_with_todays_advisory_fields(plain):
    """Fields today's OpenAI clients and agent frameworks send are accepted (advisory, schemas.py);
    what blazr cannot do is still a 400 naming the field."""
    client = plain.client()
    advisory: dict[str, Any] = dict(
        reasoning_effort="low", verbosity="low", prompt_cache_key="tenant-1", prompt_cache_retention="24h",
        safety_identifier="user-42", service_tier="auto", store=True, metadata={"run": "r1"},
        parallel_tool_calls=False, tools=[ADD], user="u1",
    )  # fmt: skip
    ask = dict(model="m", messages=HISTORY, max_tokens=8, temperature=0)
    r = client.chat.completions.create(**ask, **advisory)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    chunks = list(
        client.chat.completions.create(
            **ask,
            **advisory,
            stream=True,
            stream_options={"include_usage": True, "include_obfuscation": False},
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    for kwargs, param in (
        ({"service_tier": "flex", "verbosity": "high", "reasoning_effort": "xhigh"}, None),
        ({"extra_body": {"reasoning_effort": "extreme"}}, "reasoning_effort"),
        ({"extra_body": {"prediction": {"type": "content", "content": "x"}}}, "prediction"),
        ({"extra_body": {"web_search_options": {}}}, "web_search_options"),
    ):
        if param is None:
            assert client.chat.completions.create(**ask, **kwargs).choices
            continue
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(**ask, **kwargs)
        assert e.value.body["param"] == param  # type: ignore[index]


def _prompt(server: ServerProcess, body: dict[str, Any]) -> str:
    r = server.post("/tokenize", json={"model": "m", **body})
    assert r.status_code == 200, r.text
    return server.post("/detokenize", json={"tokens": r.json()["tokens"]}).json()["prompt"]


def test_an_assistant_reasoning_field_reaches_the_template_as_reasoning_content(thinking):
    renamed = [{k if k != "reasoning" else "reasoning_content": v for k, v in m.items()} for m in HISTORY]
    text = _prompt(thinking, {"messages": HISTORY})
    assert text == _prompt(thinking, {"messages": renamed})
    assert "<think>\nTwo plus three is five.\n</think>\n\n5" in text
    both = [*HISTORY[:2], {**HISTORY[2], "reasoning_content": HISTORY[2]["reasoning"]}, *HISTORY[3:]]
    assert _prompt(thinking, {"messages": both}) == text  # both names, agreeing
    raw = httpx.post(
        f"{thinking.base_url}/chat/completions",
        json={"model": "m", "messages": HISTORY, "max_tokens": 2, "temperature": 0},
        timeout=60,
    )
    assert raw.status_code == 200, raw.text
    differ = [*HISTORY[:2], {**HISTORY[2], "reasoning_content": "Other."}, *HISTORY[3:]]
    r = thinking.post("/v1/chat/completions", json={"model": "m", "messages": differ, "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.2.reasoning", r.text


def test_reasoning_effort_reaches_the_template(thinking):
    """`reasoning_effort` is a template variable; `"none"` also turns Qwen3's `enable_thinking` off, unless
    chat_template_kwargs say otherwise."""
    ask = {"messages": HISTORY[-1:]}
    thinks = _prompt(thinking, ask)
    assert thinks.endswith("<|im_start|>assistant\n<think>\n")
    assert _prompt(thinking, {**ask, "reasoning_effort": "high"}) == thinks
    assert _prompt(thinking, {**ask, "reasoning_effort": "none"}).endswith("<think>\n\n</think>\n\n")
    kwargs = {"chat_template_kwargs": {"enable_thinking": True}}
    assert _prompt(thinking, {**ask, "reasoning_effort": "none", **kwargs}) == thinks


def test_ray_routing_follows_prompt_cache_key():
    """`blazr serve --ray` keys a request by its prompt_cache_key, whatever its prompt (OpenAI's meaning:
    requests sharing a key share a cache)."""
    long = "x" * 300
    short = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "prompt_cache_key": "t1"}
    other = {**short, "messages": [{"role": "user", "content": long}]}
    path = "/v1/chat/completions"
    assert routing_key(path, json.dumps(short).encode()) == routing_key(path, json.dumps(other).encode())
    assert routing_key(path, json.dumps({**short, "prompt_cache_key": "t2"}).encode()) not in (
        None,
        routing_key(path, json.dumps(short).encode()),
    )
    assert routing_key(path, json.dumps({**short, "prompt_cache_key": None}).encode()) is None  # short


# ------------------------------------------------------------------------- the other front-ends


def _history(front: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """HISTORY in a front-end's own shapes: (top-level fields, its messages / items)."""
    system, turns = HISTORY[0]["content"], HISTORY[1:]
    if front == "responses":
        items: list[dict[str, Any]] = []
        for m in turns:
            if m["role"] == "assistant":
                items.append(
                    {
                        "type": "reasoning",
                        "summary": [],
                        "content": [{"type": "reasoning_text", "text": m["reasoning"]}],
                    }
                )
            items.append({"role": m["role"], "content": m["content"]})
        return {"instructions": system}, items
    if front == "anthropic":

        def blocks(m: dict[str, Any]) -> list[dict[str, Any]]:
            thought = {"type": "thinking", "thinking": m["reasoning"], "signature": ""}
            return [thought, {"type": "text", "text": m["content"]}]

        out = [{"role": "assistant", "content": blocks(m)} if m["role"] == "assistant" else m for m in turns]
        return {"system": system}, out
    out = [{"role": m["role"], "content": m["content"], "thinking": m.get("reasoning")} for m in HISTORY]
    return {}, [{k: v for k, v in m.items() if v is not None} for m in out]


RESPONSES_ADD = [{"type": "function", **ADD["function"]}]
ANTHROPIC_ADD = [{"name": "add", "input_schema": ADD_PARAMS}]


def _one_call(a: Answer) -> bool:
    return _calls(a, single=True)


SCHEMA_FORMATS = {
    "responses": {"text": {"format": {"type": "json_schema", "name": "a", "schema": ANSWER}}},
    "anthropic": {"output_config": {"format": {"type": "json_schema", "schema": ANSWER}}},
    "ollama": {"format": ANSWER},
}
FRONT_KINDS: dict[str, dict[str, tuple[dict[str, Any], Any]]] = {  # front → kind → (fields, check)
    "responses": {
        "json_schema": (SCHEMA_FORMATS["responses"], _json_schema),
        "json_object": ({"text": {"format": {"type": "json_object"}}}, _json_object),
        "tool_required": (
            {"tools": RESPONSES_ADD, "tool_choice": "required", "parallel_tool_calls": False},
            _one_call,
        ),
        "tool_named": (
            {"tools": RESPONSES_ADD, "tool_choice": {"type": "function", "name": "add"}},
            _one_call,
        ),
    },
    "anthropic": {
        "json_schema": (SCHEMA_FORMATS["anthropic"], _json_schema),
        "tool_any": (
            {"tools": ANTHROPIC_ADD, "tool_choice": {"type": "any", "disable_parallel_tool_use": True}},
            _one_call,
        ),
        "tool_named": ({"tools": ANTHROPIC_ADD, "tool_choice": {"type": "tool", "name": "add"}}, _one_call),
    },
    "ollama": {
        "json_schema": (SCHEMA_FORMATS["ollama"], _json_schema),
        "json": ({"format": "json"}, _json_object),
    },
}
FRONT_PATHS = {"responses": "/v1/responses", "anthropic": "/v1/messages", "ollama": "/api/chat"}


def _read(front: str, data: dict[str, Any], a: Answer) -> None:
    """Add one whole answer's (or one stream event's) reasoning, text and calls to `a`."""
    kind = data.get("type", "")
    if front == "ollama":
        message = data["message"]
        a.content = (a.content or "") + message.get("content", "")
        a.reasoning = (a.reasoning or "") + message.get("thinking", "")
        a.calls += [
            (c["function"]["name"], json.dumps(c["function"]["arguments"]))
            for c in message.get("tool_calls", ())
        ]
    elif front == "responses" and kind in ("", "response.completed", "response.incomplete"):
        response = data.get("response", data)
        for item in response["output"]:
            if item["type"] == "reasoning":
                a.reasoning = "".join(c["text"] for c in item["content"])
            elif item["type"] == "message":
                a.content = "".join(c["text"] for c in item["content"])
            else:
                a.calls.append((item["name"], item["arguments"]))
        a.finish_reason = response["status"]
    elif front == "anthropic" and kind in ("", "message"):
        for block in data["content"]:
            if block["type"] == "thinking":
                a.reasoning = block["thinking"]
            elif block["type"] == "text":
                a.content = block["text"]
            else:
                a.calls.append((block["name"], json.dumps(block["input"])))
        a.finish_reason = data["stop_reason"]
    elif front == "anthropic" and kind == "content_block_delta":
        d = data["delta"]
        if d["type"] == "thinking_delta":
            a.reasoning = (a.reasoning or "") + d["thinking"]
        elif d["type"] == "text_delta":
            a.content = (a.content or "") + d["text"]
        elif d["type"] == "input_json_delta":
            a.calls[-1] = (a.calls[-1][0], a.calls[-1][1] + d["partial_json"])
    elif (
        front == "anthropic" and kind == "content_block_start" and data["content_block"]["type"] == "tool_use"
    ):
        a.calls.append((data["content_block"]["name"], ""))
    elif front == "anthropic" and kind == "message_delta":
        a.finish_reason = data["delta"]["stop_reason"]


async def _front(
    http: httpx.AsyncClient, front: str, fields: dict[str, Any], stream: bool, extra: dict
) -> Answer:
    top, history = _history(front)
    body: dict[str, Any] = {"model": "m", **top, **fields, **extra, "stream": stream}
    if front == "responses":
        body.update(input=history, max_output_tokens=60, temperature=0)
    elif front == "anthropic":
        body.update(messages=history, max_tokens=60, temperature=0)
    else:
        body.update(messages=history, options={"num_predict": 60, "temperature": 0})
    a = Answer(None, None, None)
    if not stream:
        r = await http.post(FRONT_PATHS[front], json=body)
        assert r.status_code == 200, r.text
        _read(front, r.json(), a)
    else:
        async with http.stream("POST", FRONT_PATHS[front], json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if front == "ollama" and line:
                    _read(front, json.loads(line), a)
                elif line.startswith("data: "):
                    _read(front, json.loads(line[6:]), a)
    a.content, a.reasoning = a.content or None, a.reasoning or None
    return a


@pytest.mark.parametrize("mode", ["off", "opened"])
def test_every_front_end_holds_its_formats_with_and_without_a_reasoning_block(plain, thinking, mode):
    """The Responses API, Anthropic Messages and Ollama's chat hold each format they can ask for (a JSON
    schema or object, a forced call — any, or to a named function) the way chat completions does, after
    the reasoning block the history (in each API's own shape) taught the model to write; streamed or not
    (all at once, batched)."""
    server = plain if mode == "off" else thinking

    async def run() -> list[tuple[str, str, Answer]]:
        jobs = [
            (front, kind, fields, stream)
            for front, kinds in FRONT_KINDS.items()
            for kind, (fields, _) in kinds.items()
            for stream in (False, True)
        ]
        async with httpx.AsyncClient(base_url=server.url, timeout=300) as http:
            answers = await asyncio.gather(*(_front(http, f, fields, st, {}) for f, _, fields, st in jobs))
        return [(f, k, a) for (f, k, _, _), a in zip(jobs, answers, strict=True)]

    for front, kind, a in asyncio.run(run()):
        check = FRONT_KINDS[front][kind][1]
        assert check(a), (front, kind, a)
        assert a.finish_reason in ("completed", "end_turn", "tool_use", None), (front, kind, a)
        for text in (a.content or "", *(args for _, args in a.calls)):
            assert "<think>" not in text and "</think>" not in text, (front, kind, a)
        if mode == "off":
            assert a.reasoning is None, (front, kind, a)
        else:
            assert a.reasoning and a.reasoning.strip(), (front, kind, a)
