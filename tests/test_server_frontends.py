"""The front-ends over the chat core, in-process with the scripted engine of test_server_tools (the model's
text given piece by piece, cut at awkward places, reasoning and a tool call in it): OpenAI's Responses API,
Anthropic's Messages and Ollama's /api/chat turn the same output into their own shapes, a stream of each
reassembles (with the official clients' own accumulators) to exactly its non-streamed answer, the request
side reaches the engine as the core's plan (forced calls, formats, thinking budgets, stop strings), and
errors come in each API's error shape. (The official SDKs against real models: test_server_clients.py.)"""

from __future__ import annotations

import json
from typing import Any

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import RawMessageStreamEvent
from openai._models import construct_type_unchecked
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent

from tests.test_server_tools import _scripted

REASONED_CALL = [
    "<th",
    "ink>Let me ",
    "check.</think>",
    "\n\n",
    '<tool_call>\n{"na',
    'me": "get_weather", "argu',
    'ments": {"city": "Os',
    'lo"}}\n</tool',
    "_call>",
]
ANTHROPIC_TOOL = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
RESPONSES_TOOL = {
    "type": "function",
    "name": "get_weather",
    "parameters": ANTHROPIC_TOOL["input_schema"],
    "strict": True,
}


@pytest.fixture(scope="module")
def thinking():
    client, engine = _scripted(reasoning_parser="qwen3")
    yield client, engine
    client.__exit__(None, None, None)


def _sse(text: str) -> list[tuple[str, dict[str, Any]]]:
    events, kind = [], None
    for line in text.splitlines():
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            data = json.loads(line[6:])
            assert data["type"] == kind, (kind, data)
            events.append((kind, data))
    return events


def test_responses_stream_reassembles_to_the_whole_response(thinking):
    client, engine = thinking
    engine.script = REASONED_CALL
    body = {
        "model": "fake",
        "input": "Weather in Oslo?",
        "tools": [RESPONSES_TOOL],
        "reasoning": {"effort": "low"},
    }
    whole = client.post("/v1/responses", json=body).json()
    kinds = [o["type"] for o in whole["output"]]
    assert kinds == ["reasoning", "function_call"], whole["output"]
    assert whole["output"][0]["content"] == [{"type": "reasoning_text", "text": "Let me check."}]
    call = whole["output"][1]
    assert (call["name"], json.loads(call["arguments"])) == ("get_weather", {"city": "Oslo"})
    assert whole["status"] == "completed" and whole["usage"]["output_tokens"] == len(REASONED_CALL)
    budget = engine.params[-1].thinking
    assert budget is not None and budget.max_tokens == 1024  # reasoning.effort low (conversation.py)

    events = _sse(client.post("/v1/responses", json={**body, "stream": True}).text)
    kinds = [k for k, _ in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.reasoning_text.delta"] * kinds.count("response.reasoning_text.delta"),
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * kinds.count("response.function_call_arguments.delta"),
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for _, e in events] == list(range(len(events)))
    state: ResponseStreamState = ResponseStreamState(input_tools=[RESPONSES_TOOL], text_format=None)  # type: ignore[arg-type]
    for _, data in events:
        state.handle_event(construct_type_unchecked(type_=ResponseStreamEvent, value=data))  # type: ignore[arg-type]
    final = events[-1][1]["response"]
    strip = [{k: v for k, v in o.items() if k not in ("id", "call_id")} for o in final["output"]]
    assert strip == [{k: v for k, v in o.items() if k not in ("id", "call_id")} for o in whole["output"]]


def test_responses_request_side(thinking):
    client, engine = thinking
    engine.script = ['{"a": 1}']
    fmt = {"type": "json_schema", "name": "a", "schema": {"type": "object"}, "strict": True}
    body = {
        "model": "fake",
        "input": [
            {"role": "developer", "content": "Be brief."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        ],
        "text": {"format": fmt, "verbosity": "low"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "max_output_tokens": 9,
        "thinking_token_budget": 3,
        "stop": ["STOP"],
    }
    r = client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    params = engine.params[-1]
    assert params.structured is not None and params.structured.kind == "json_schema"
    assert params.structured.think is not None  # behind the reasoning block
    assert params.thinking is not None and params.thinking.max_tokens == 3
    assert params.stop == ["STOP"] and params.include_stop_str_in_output  # cut by the core, not the engine
    rid = r.json()["id"]
    assert client.get(f"/v1/responses/{rid}").status_code == 404  # store false: not kept
    for extra, param in [
        ({"background": True}, "background"),
        ({"input": [{"type": "web_search_call", "id": "x"}]}, "input"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"previous_response_id": "resp_nope"}, "previous_response_id"),
        (
            {"tool_choice": {"type": "function", "name": "nope"}, "tools": [RESPONSES_TOOL]},
            "tool_choice.name",
        ),
        (
            {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]},
            "input.0.arguments",
        ),
        ({"frobnicate": 1}, "frobnicate"),
    ]:
        r = client.post("/v1/responses", json={"model": "fake", "input": "x", **extra})
        assert r.status_code == 400, (extra, r.text)
        assert r.json()["error"]["param"] == param, (extra, r.json())
        assert "web_search_call" in r.json()["error"]["message"] or "web_search_call" not in str(extra)


def test_anthropic_stream_reassembles_to_the_whole_message(thinking):
    client, engine = thinking
    engine.script = REASONED_CALL
    body = {
        "model": "fake",
        "max_tokens": 50,
        "tools": [ANTHROPIC_TOOL],
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
    }
    whole = client.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"}).json()
    assert whole["content"] == [
        {"type": "thinking", "thinking": "Let me check.", "signature": ""},
        {
            "type": "tool_use",
            "id": whole["content"][1]["id"],
            "name": "get_weather",
            "input": {"city": "Oslo"},
        },
    ]
    assert whole["stop_reason"] == "tool_use"
    events = _sse(client.post("/v1/messages", json={**body, "stream": True}).text)
    kinds = [k for k, _ in events]
    assert kinds[:2] == ["message_start", "ping"] and kinds[-2:] == ["message_delta", "message_stop"]
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    deltas = {e["delta"]["type"] for k, e in events if k == "content_block_delta"}
    assert deltas == {"thinking_delta", "signature_delta", "input_json_delta"}
    snapshot = None
    bufs: dict[int, bytes] = {}
    for _, data in events:
        if data["type"] != "ping":
            raw = construct_type_unchecked(type_=RawMessageStreamEvent, value=data)  # type: ignore[arg-type]
            snapshot = accumulate_event(event=raw, current_snapshot=snapshot, json_bufs=bufs)  # type: ignore[arg-type]
    assert snapshot is not None
    got = [b.model_dump(exclude_none=True, exclude={"id"}) for b in snapshot.content]
    assert got == [{k: v for k, v in b.items() if k != "id"} for b in whole["content"]]


def test_anthropic_request_side_and_errors(thinking):
    client, engine = thinking
    engine.script = ["Hello", " there"]
    body = {
        "model": "fake",
        "max_tokens": 20,
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Call it.", "signature": "sig"},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "-3 C"}],
            },
            {"role": "assistant", "content": "It is"},
        ],
        "tools": [ANTHROPIC_TOOL],
        "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        "thinking": {"type": "enabled", "budget_tokens": 64},
        "stop_sequences": ["there"],
        "temperature": 0.5,
        "top_k": 5,
        "metadata": {"user_id": "u1"},
    }
    r = client.post("/v1/messages", json=body)
    assert r.status_code == 200, r.text
    params = engine.params[-1]
    assert params.structured is not None and params.structured.kind == "grammar"  # the forced call
    assert params.thinking is not None and params.thinking.max_tokens == 64
    assert (params.temperature, params.top_k, params.stop) == (0.5, 5, ["there"])
    # anthropic 2.x: output_config, a system message in messages
    body2 = {
        "model": "fake",
        "max_tokens": 5,
        "messages": [{"role": "system", "content": "Terse."}, {"role": "user", "content": "Hi"}],
        "output_config": {"effort": "high", "format": {"type": "json_schema", "schema": {"type": "object"}}},
    }
    assert client.post("/v1/messages", json=body2).status_code == 200
    params = engine.params[-1]
    assert params.structured is not None and params.structured.kind == "json_schema"
    assert params.thinking is not None and params.thinking.max_tokens == 16384
    engine.script = ["Hi", " there"]
    r = client.post(
        "/v1/messages",
        json={
            "model": "fake",
            "max_tokens": 9,
            "stop_sequences": ["there"],
            "messages": [{"role": "user", "content": "x"}],
        },
    )
    assert r.json()["stop_reason"] == "stop_sequence" and r.json()["stop_sequence"] == "there"
    assert r.json()["content"] == [{"type": "text", "text": "Hi "}]
    for extra, status, kind in [
        ({"max_tokens": 0}, 400, "invalid_request_error"),
        ({"model": "claude-nope"}, 404, "not_found_error"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            400,
            "invalid_request_error",
        ),
        ({"tool_choice": {"type": "any"}}, 400, "invalid_request_error"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400, "invalid_request_error"),
    ]:
        r = client.post(
            "/v1/messages",
            json={"model": "fake", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], **extra},
        )
        assert r.status_code == status, (extra, r.text)
        error = r.json()
        assert error["type"] == "error" and error["error"]["type"] == kind and error["error"]["message"], (
            error
        )
    r = client.post(
        "/v1/messages/count_tokens", json={"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert r.status_code == 200 and r.json()["input_tokens"] > 0


def test_ollama_chat_and_generate(thinking):
    client, engine = thinking
    engine.script = REASONED_CALL
    tools = [
        {
            "type": "function",
            "function": {"name": "get_weather", "parameters": ANTHROPIC_TOOL["input_schema"]},
        }
    ]
    body = {
        "model": "fake:latest",
        "messages": [{"role": "user", "content": "Weather?"}],
        "tools": tools,
        "think": "low",
        "options": {"num_predict": 40, "temperature": 0, "num_ctx": 8192},
    }
    whole = client.post("/api/chat", json={**body, "stream": False}).json()
    assert whole["message"]["thinking"] == "Let me check."
    assert whole["message"]["tool_calls"] == [
        {"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    ]
    assert whole["done"] and whole["done_reason"] == "stop" and whole["eval_count"] == len(REASONED_CALL)
    r = client.post("/api/chat", json=body)  # streamed by default
    assert r.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert "".join(x["message"].get("thinking", "") for x in lines) == "Let me check."
    assert [x["message"]["tool_calls"] for x in lines if "tool_calls" in x["message"]] == [
        whole["message"]["tool_calls"]
    ]
    assert lines[-1]["done"] and not any(x["done"] for x in lines[:-1])
    engine.script = ["Par", "is."]
    r = client.post(
        "/api/generate", json={"model": "fake", "prompt": "Capital?", "format": "json", "stream": False}
    )
    assert r.json()["response"] == "Paris." and r.json()["context"]
    assert engine.params[-1].structured is not None and engine.params[-1].structured.kind == "json_object"
    lines = [
        json.loads(x)
        for x in client.post("/api/generate", json={"model": "fake", "prompt": "x"}).text.splitlines()
    ]
    assert "".join(x["response"] for x in lines) == "Paris." and lines[-1]["done_reason"] == "stop"
    assert client.post("/api/generate", json={"model": "fake", "prompt": ""}).json()["done_reason"] == "load"
    assert client.get("/api/tags").json()["models"][0]["name"] == "fake"
    assert client.get("/api/version").json()["version"]
    assert "thinking" in client.post("/api/show", json={"model": "fake"}).json()["capabilities"]
    for path, body, status in [
        ("/api/chat", {"model": "nope", "messages": []}, 404),
        (
            "/api/chat",
            {"model": "fake", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]},
            400,
        ),
        ("/api/generate", {"model": "fake", "prompt": "x", "suffix": "y"}, 400),
        ("/api/generate", {"model": "fake", "prompt": "x", "options": {"nonsense": 1}}, 400),
        ("/api/chat", {"model": "fake", "messages": "x"}, 400),
        ("/api/nothing", {}, 404),
    ]:
        r = client.post(path, json=body)
        assert r.status_code == status, (path, body, r.text)
        assert set(r.json()) == {"error"} and r.json()["error"], r.json()


def test_openai_chat_carries_reasoning_under_both_names(thinking):
    client, engine = thinking
    engine.script = [*REASONED_CALL[:4], "Sunny."]
    r = client.post(
        "/v1/chat/completions",
        json={
            "model": "fake",
            "messages": [{"role": "user", "content": "x"}],
            "thinking_token_budget": 7,
            "priority": -1,
            "cache_salt": "t1",
        },
    )
    message = r.json()["choices"][0]["message"]
    assert (
        message["reasoning_content"] == message["reasoning"] == "Let me check."
        and message["content"] == "Sunny."
    )
    params = engine.params[-1]
    assert params.thinking.max_tokens == 7 and params.priority == -1 and params.cache_salt == "t1"  # type: ignore[union-attr]


def test_every_new_route_is_behind_the_key_in_its_own_error_shape():
    client, engine = _scripted(api_key="sk-k")
    engine.script = ["ok"]
    try:
        cases = [
            ("POST", "/v1/responses", "openai"),
            ("GET", "/v1/responses/x", "openai"),
            ("DELETE", "/v1/responses/x", "openai"),
            ("POST", "/v1/responses/input_tokens", "openai"),
            ("POST", "/v1/embeddings", "openai"),
            ("POST", "/v1/messages", "anthropic"),
            ("POST", "/v1/messages/count_tokens", "anthropic"),
            ("GET", "/api/version", "ollama"),
            ("GET", "/api/tags", "ollama"),
            ("GET", "/api/ps", "ollama"),
            ("POST", "/api/show", "ollama"),
            ("POST", "/api/chat", "ollama"),
            ("POST", "/api/generate", "ollama"),
            ("POST", "/api/embed", "ollama"),
            ("POST", "/api/embeddings", "ollama"),
        ]
        for method, path, dialect in cases:
            r = client.request(method, path, json={})
            assert r.status_code == 401, (path, r.text)
            error = r.json()
            if dialect == "openai":
                assert error["error"]["code"] == "invalid_api_key", error
            elif dialect == "anthropic":
                assert error["type"] == "error" and error["error"]["type"] == "authentication_error", error
            else:
                assert set(error) == {"error"}, error
        messages = {"model": "fake", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}
        assert client.post("/v1/messages", json=messages, headers={"x-api-key": "sk-k"}).status_code == 200
        assert client.post("/v1/messages", json=messages, headers={"x-api-key": "sk-no"}).status_code == 401
        assert client.get("/api/tags", headers={"Authorization": "Bearer sk-k"}).status_code == 200
        assert client.get("/health").status_code == 200
    finally:
        client.__exit__(None, None, None)


def test_the_response_store_is_bounded_least_recently_used_first():
    from blazr.server.response_store import ResponseStore

    store = ResponseStore(max_responses=3, max_chars=1000)
    message = [{"role": "user", "content": "x" * 100}]
    for i in range(4):
        store.put({"id": f"r{i}", "output": []}, message)
    assert store.get("r0") is None and len(store) == 3  # the oldest went past 3
    store.get("r1")  # used: now the most recent
    store.put({"id": "big", "output": []}, [{"role": "user", "content": "y" * 800}])  # past 1000 characters
    assert store.get("r1") is not None and store.get("r2") is None and store.get("big") is not None
    assert store.delete("big") and not store.delete("big")
