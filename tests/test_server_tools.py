"""Tool calling and reasoning through `blazr serve`.

Two halves:
  - a scripted engine (the model's text given piece by piece, cut at awkward places) behind the real app:
    what the parsers make of known output — tool_calls, content, reasoning_content, finish_reason — in
    the non-streamed message and in the stream, whose deltas must reassemble to it (the openai client's own
    stream accumulator does the reassembling);
  - SmolLM2 behind a real server, driven by the official `openai` client and by `langchain-openai`:
    tool_choice "required" / a named function enforced by the grammar, `parallel_tool_calls`, a whole
    call → tool result → answer conversation streamed and not, the tools and the history in the prompt.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import jsonschema
import pytest
from fastapi.testclient import TestClient
from openai.lib.streaming.chat import ChatCompletionStreamState

from blazr.engine.grammar import ThinkFirst
from blazr.engine.outputs import SeqOutput
from blazr.engine.sampling import SamplingParams
from blazr.server.app import LoadedModel, build_app
from blazr.server.options import ServerConfig
from tests.server_util import ServerProcess
from tests.test_server_app import FakeEngine, FakeTokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a time zone.",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string", "maxLength": 40}},
            "required": ["timezone"],
        },
    },
}
TOOLS = [WEATHER, TIME]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


# ---------------------------------------------------------------------------------- scripted engine


class _AnyGrammar:
    """The scripted engine ignores grammars (its output is fixed): every spec 'compiles'."""

    def compile(self, spec: Any) -> None:
        assert spec.kind


class ScriptedEngine(FakeEngine):
    """Every request's output is `script`, one piece per step, finishing with "stop"; the structured output
    asked for is recorded in `params`, not applied."""

    def __init__(self) -> None:
        super().__init__()
        self.grammars = _AnyGrammar()
        self.cfg.max_model_len = 100_000
        self.script: list[str] = []
        self.params: list[SamplingParams] = []

    def add_request(self, rid: str, prompt_ids: list[int], params: SamplingParams) -> None:
        self.params.append(params)
        params.max_tokens = len(self.script)
        super().add_request(rid, prompt_ids, params)

    def _outputs(
        self, rid: str, ids: list[int], params: SamplingParams, done: int, finished: bool
    ) -> list[SeqOutput]:
        text = self.script[done - 1]
        return [SeqOutput(rid, 0, [120], text, [], finished, "stop" if finished else None, len(ids), done)]


class ControlMarkerTokenizer(FakeTokenizer):
    """A tokenizer whose `<tool_call>` is a control token (decode drops it), as in some Hermes checkpoints."""

    special_tokens = {"<tool_call>": 7}  # noqa: RUF012

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return "" if list(ids) == [7] else super().decode(ids, skip_special)


def _scripted(tokenizer: FakeTokenizer | None = None, **config: Any) -> tuple[TestClient, ScriptedEngine]:
    engine = ScriptedEngine()

    def loader(cfg: ServerConfig) -> LoadedModel:
        return LoadedModel(engine, tokenizer or FakeTokenizer(), ["fake"], "fake-model")  # type: ignore[arg-type]

    client = TestClient(build_app(ServerConfig(**config), loader))
    client.__enter__()
    for _ in range(500):
        if client.get("/health").status_code == 200:
            break
        threading.Event().wait(0.01)
    return client, engine


@pytest.fixture
def scripted():
    client, engine = _scripted()
    yield client, engine
    client.__exit__(None, None, None)


@pytest.fixture
def thinking():
    client, engine = _scripted(reasoning_parser="deepseek_r1")
    yield client, engine
    client.__exit__(None, None, None)


def _cuts(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _events(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


def _both(client: TestClient, body: dict[str, Any]) -> tuple[dict[str, Any], Any, list[dict[str, Any]]]:
    """The non-streamed choice, the openai client's reassembly of the stream, and the raw chunks."""
    whole = client.post("/v1/chat/completions", json=body)
    assert whole.status_code == 200, whole.text
    streamed = client.post("/v1/chat/completions", json={**body, "stream": True})
    chunks = _events(streamed.text)
    state = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(_chunk_object(chunk))
    return whole.json()["choices"][0], state.get_final_completion().choices[0], chunks


def _chunk_object(chunk: dict[str, Any]) -> Any:
    from openai.types.chat import ChatCompletionChunk

    return ChatCompletionChunk.model_validate(chunk)


CALL_TEXT = (
    'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
    '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}\n</tool_call>'
)


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_tool_calls_are_parsed_and_streamed_deltas_reassemble(scripted, size):
    client, engine = scripted
    engine.script = _cuts(CALL_TEXT, size)
    body = {"model": "fake", "messages": [{"role": "user", "content": "weather?"}], "tools": TOOLS}
    whole, final, chunks = _both(client, body)
    calls = whole["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris", "unit": "celsius"}
    assert json.loads(calls[1]["function"]["arguments"]) == {"timezone": "Europe/Paris"}
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)
    assert len({c["id"] for c in calls}) == 2
    assert whole["message"]["content"].strip() == "Let me check."
    assert whole["finish_reason"] == "tool_calls"
    # the stream, reassembled by the openai client, is the same message
    assert final.finish_reason == "tool_calls"
    assert (final.message.content or "").strip() == "Let me check."
    got = [(c.function.name, c.function.arguments) for c in final.message.tool_calls]
    assert got == [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
    # no marker text ever leaks into the content deltas
    streamed_content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert "<tool_call" not in streamed_content and "</tool" not in streamed_content


def test_parallel_tool_calls_false_keeps_the_first_call(scripted):
    client, engine = scripted
    engine.script = _cuts(CALL_TEXT, 5)
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
    whole, final, _ = _both(client, {**body, "parallel_tool_calls": False})
    assert [c["function"]["name"] for c in whole["message"]["tool_calls"]] == ["get_weather"]
    assert [c.function.name for c in final.message.tool_calls] == ["get_weather"]
    assert whole["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("parser", ["llama3_json", "mistral"])
def test_other_call_formats_through_the_server(parser):
    text = {
        "llama3_json": '<|python_tag|>{"name": "get_time", "parameters": {"timezone": "UTC"}}',
        "mistral": '[TOOL_CALLS][{"name": "get_time", "arguments": {"timezone": "UTC"}}]',
    }[parser]
    client, engine = _scripted(tool_call_parser=parser)
    try:
        engine.script = _cuts(text, 3)
        body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
        whole, final, _ = _both(client, body)
        (call,) = whole["message"]["tool_calls"]
        assert call["function"]["name"] == "get_time"
        assert json.loads(call["function"]["arguments"]) == {"timezone": "UTC"}
        assert final.message.tool_calls[0].function.arguments == call["function"]["arguments"]
        assert engine.params[-1].skip_special_tokens is (parser != "mistral")
    finally:
        client.__exit__(None, None, None)


def test_without_tools_or_with_tool_choice_none_the_text_is_content(scripted):
    client, engine = scripted
    engine.script = _cuts(CALL_TEXT, 5)
    for extra in ({}, {"tools": TOOLS, "tool_choice": "none"}):
        body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], **extra}
        r = client.post("/v1/chat/completions", json=body).json()["choices"][0]
        assert r["message"]["content"] == CALL_TEXT
        assert r["message"]["tool_calls"] is None
        assert r["finish_reason"] == "stop"


def test_malformed_calls_come_back_as_content(scripted):
    client, engine = scripted
    text = 'Sure <tool_call>\n{"name": "get_weather", "arguments": not json}\n</tool_call> done'
    engine.script = _cuts(text, 4)
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
    whole, final, _ = _both(client, body)
    assert whole["message"]["tool_calls"] is None
    assert whole["finish_reason"] == "stop"
    assert "not json" in whole["message"]["content"]
    assert final.message.content == whole["message"]["content"]


def test_reasoning_is_split_from_content(thinking):
    client, engine = thinking
    text = "<think>The user greets me.\nI greet back.</think>\n\nHello there!"
    for size in (1, 4, 100):
        engine.script = _cuts(text, size)
        body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
        whole, final, chunks = _both(client, body)
        assert whole["message"]["reasoning_content"] == "The user greets me.\nI greet back."
        assert whole["message"]["content"] == "Hello there!"
        reasoning = "".join(
            c["choices"][0]["delta"].get("reasoning_content") or "" for c in chunks if c["choices"]
        )
        content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert reasoning == whole["message"]["reasoning_content"]
        assert content == whole["message"]["content"]
        assert final.message.content == "Hello there!"


def test_reasoning_then_a_tool_call(thinking):
    client, engine = thinking
    text = "<think>I need the weather; <tool_call> is how I call.</think>" + CALL_TEXT
    engine.script = _cuts(text, 6)
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
    whole, final, _ = _both(client, body)
    assert whole["message"]["reasoning_content"] == "I need the weather; <tool_call> is how I call."
    assert [c["function"]["name"] for c in whole["message"]["tool_calls"]] == ["get_weather", "get_time"]
    assert whole["finish_reason"] == "tool_calls"
    assert [c.function.name for c in final.message.tool_calls] == ["get_weather", "get_time"]


def test_special_tokens_are_kept_when_a_marker_is_a_control_token(scripted):
    """Decoding must keep a control-token `<tool_call>` for the parser to see it — only for requests whose
    output is parsed for calls — and a forced call's grammar writes it as that token."""
    plain_client, plain = scripted
    client, engine = _scripted(ControlMarkerTokenizer())
    try:
        for c, e in ((plain_client, plain), (client, engine)):
            e.script = ["ok"]
            for extra in ({}, {"tools": TOOLS}, {"tools": TOOLS, "tool_choice": "none"}):
                body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], **extra}
                assert c.post("/v1/chat/completions", json=body).status_code == 200
        assert [p.skip_special_tokens for p in plain.params] == [True, True, True]
        assert [p.skip_special_tokens for p in engine.params] == [True, False, True]
        # a forced call writes the marker as the control token
        for c in (plain_client, client):
            body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
            assert c.post("/v1/chat/completions", json={**body, "tool_choice": "required"}).status_code == 200
        assert '"<tool_call>\\n"' in plain.params[-1].structured.grammar
        assert "<[7]>" in engine.params[-1].structured.grammar
        assert "<tool_call>\\n" not in engine.params[-1].structured.grammar
    finally:
        client.__exit__(None, None, None)


def test_with_a_reasoning_parser_formats_hold_after_the_reasoning_block(thinking):
    """The structured output (a response format, or the forced tool-call grammar) is put behind the
    reasoning block, opened by the prompt or not."""
    client, engine = thinking
    engine.script = ['{"a": 1}']
    fmt = {"type": "json_object"}
    bodies = [
        {"messages": [{"role": "user", "content": "hi"}], "response_format": fmt},
        {"messages": [{"role": "user", "content": "hi <think>"}], "response_format": fmt},
        {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "tool_choice": "required"},
        {"messages": [{"role": "user", "content": "hi"}]},
    ]
    for body in bodies:
        assert client.post("/v1/chat/completions", json={"model": "fake", **body}).status_code == 200
    specs = [p.structured for p in engine.params]
    assert specs[0].json_object and specs[0].think == ThinkFirst("<think>", "</think>", opened=False)
    assert specs[1].think == ThinkFirst("<think>", "</think>", opened=True)
    assert specs[2].grammar and specs[2].think == ThinkFirst("<think>", "</think>", opened=False)
    assert specs[3] is None


def test_tool_requests_are_checked(scripted):
    client, _ = scripted
    chat = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
    named = {"type": "function", "function": {"name": "nope"}}
    bad_history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                               "function": {"name": "f", "arguments": "[1]"}}]},
    ]  # fmt: skip
    cases = [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": named}, "tool_choice.function.name"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools.0.function.name"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
         "response_format"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.tool_call_id"),
        ({"messages": [{"role": "user", "content": "x", "tool_call_id": "c"}]}, "messages.0.tool_call_id"),
        ({"messages": [{"role": "assistant"}]}, "messages.0.content"),
        ({"messages": bad_history}, "messages.1.tool_calls.0.function.arguments"),
    ]  # fmt: skip
    for extra, param in cases:
        r = client.post("/v1/chat/completions", json={**chat, **extra})
        assert r.status_code == 400, (extra, r.text)
        assert r.json()["error"]["param"] == param, (extra, r.json())


# ---------------------------------------------------------------------------------------- SmolLM2


@pytest.fixture(scope="module")
def smol():
    with ServerProcess(["--max-model-len", "2048", "--served-model-name", "m"]) as server:
        yield server


def _ask(question: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": question}]


def _check_call(name: str, arguments: str) -> dict[str, Any]:
    args = json.loads(arguments)
    jsonschema.validate(args, PARAMS[name])
    return args


def test_tool_choice_required_and_named_are_enforced(smol):
    client = smol.client()
    r = client.chat.completions.create(
        model="m", messages=_ask("What is the weather in Paris?"), tools=TOOLS, tool_choice="required",
        temperature=0, max_tokens=200,
    )  # fmt: skip
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls and not (choice.message.content or "").strip()
    for call in choice.message.tool_calls:
        _check_call(call.function.name, call.function.arguments)

    for name in ("get_weather", "get_time"):
        r = client.chat.completions.create(
            model="m", messages=_ask("Help me plan my day in Tokyo."), tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": name}}, temperature=0.7, seed=5,
            max_tokens=200,
        )  # fmt: skip
        (call,) = r.choices[0].message.tool_calls
        assert call.function.name == name
        _check_call(name, call.function.arguments)
        assert r.choices[0].finish_reason == "stop"  # as OpenAI reports a named tool_choice


def test_parallel_tool_calls_false_allows_one_call(smol):
    client = smol.client()
    for seed in range(3):
        r = client.chat.completions.create(
            model="m", messages=_ask("Weather in Paris and in Rome, and the time in Tokyo?"), tools=TOOLS,
            tool_choice="required", parallel_tool_calls=False, temperature=1.0, seed=seed, max_tokens=200,
        )  # fmt: skip
        assert len(r.choices[0].message.tool_calls) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_conversation_call_result_answer(smol, stream):
    client = smol.client()
    messages: list[dict[str, Any]] = _ask("What is the weather in Paris right now?")
    first = dict(
        model="m", messages=messages, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=200
    )
    if stream:
        with client.chat.completions.stream(**first) as s:  # the client's own accumulator
            r = s.get_final_completion()
        whole = client.chat.completions.create(**first)
        assert [(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls] == [
            (c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls
        ]
    else:
        r = client.chat.completions.create(**first)
    assert r.choices[0].finish_reason == "tool_calls"
    calls = r.choices[0].message.tool_calls
    messages.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                }
                for c in calls
            ],
        }
    )
    for c in calls:
        result = (
            {"temperature": 18, "sky": "clear"} if c.function.name == "get_weather" else {"time": "14:05"}
        )
        messages.append({"role": "tool", "tool_call_id": c.id, "content": json.dumps(result)})
    second = dict(model="m", messages=messages, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=60)
    if stream:
        pieces = [
            ch.choices[0].delta.content or ""
            for ch in client.chat.completions.create(**second, stream=True)
            if ch.choices
        ]
        answer = "".join(pieces)
    else:
        answer = client.chat.completions.create(**second).choices[0].message.content
    assert answer and answer.strip()
    # the tool result reached the prompt: the rendered conversation holds it
    tokens = smol.post("/tokenize", json={"messages": messages, "tools": TOOLS}).json()["tokens"]
    text = smol.post("/detokenize", json={"tokens": tokens}).json()["prompt"]
    assert "<tool_response>" in text and '"temperature": 18' in text
    assert "get_weather" in text and "<tools>" in text


def test_langchain_openai_binds_tools_and_structured_output(smol):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    llm = ChatOpenAI(model="m", base_url=smol.base_url, api_key="unused", temperature=0, max_tokens=200)
    bound = llm.bind_tools([WEATHER], tool_choice="get_weather")
    question = HumanMessage("What is the weather in Oslo?")
    ai = bound.invoke([question])
    assert ai.tool_calls and ai.tool_calls[0]["name"] == "get_weather"
    jsonschema.validate(ai.tool_calls[0]["args"], PARAMS["get_weather"])
    follow = llm.invoke(
        [question, ai, ToolMessage('{"temperature": 3}', tool_call_id=ai.tool_calls[0]["id"])]
    )
    assert isinstance(follow.content, str) and follow.content.strip()

    class City(BaseModel):
        name: str = Field(max_length=30)
        country: str = Field(max_length=30)
        population: int = Field(ge=0)

    city = llm.with_structured_output(City, method="json_schema").invoke("Describe a big city.")
    assert isinstance(city, City)
