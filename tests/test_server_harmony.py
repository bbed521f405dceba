"""GPT-OSS's harmony format through the real app: a tiny random GptOssForCausalLM with SmolLM2's tokenizer
plus the harmony markers as control tokens and GPT-OSS's own chat template (gpt_oss_chat_template.jinja
here), so the format is chosen from the template (`harmony`: no flag). The model is random: what it writes
is held by grammars — a forced call (tool_choice required / named) in harmony framing, an answer in the
final channel (a response format) — steered by `logit_bias` (towards "commentary": a call without
reasoning; towards "analysis" with a thinking budget, `thinking_token_budget`, after which the engine
writes `<|end|>`: reasoning, then the answer). Checked: calls parsed into `tool_calls` (valid against the
schema), the analysis into `reasoning_content`, the JSON answer into `content`, no harmony marker
anywhere, streamed == whole (greedy); the analysis as Anthropic's, the Responses API's and Ollama's
reasoning; a tool conversation rendered back through the template."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from fastapi.testclient import TestClient

from blazr.server.app import build_app
from blazr.server.harmony import MARKERS
from blazr.server.options import ServerConfig
from tests.llama_cpp_convert import export_tokenizer
from tests.tiny import build

TEMPLATE = Path(__file__).with_name("gpt_oss_chat_template.jinja")
SIZES = dict(
    hidden_size=64, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    num_local_experts=4, num_experts_per_tok=2, num_hidden_layers=2,
)  # fmt: skip
PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather.", "parameters": PARAMS},
}
NOW = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}
ANSWER = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["n"],
}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    import transformers

    root = tmp_path_factory.mktemp("gpt_oss_harmony")
    tok = transformers.AutoTokenizer.from_pretrained(export_tokenizer(tmp_path_factory.mktemp("smollm2")))
    tok.add_special_tokens({"additional_special_tokens": list(MARKERS)})
    tok.chat_template = TEMPLATE.read_text()
    tok.save_pretrained(root)
    build("GptOssForCausalLM", root, vocab_size=len(tok), **SIZES)
    analysis = tok.encode("analysis", add_special_tokens=False)
    commentary = tok.encode("commentary", add_special_tokens=False)
    config = ServerConfig.of(
        model=str(root), cpu=True, dtype="float32", max_num_seqs=4, num_threads=1, served_model_names=("m",)
    )
    with TestClient(build_app(config)) as client:
        for _ in range(3000):
            if client.get("/health").status_code == 200:
                break
            threading.Event().wait(0.01)
        client.app.state.harmony_root = root
        yield client, {str(i): 30 for i in analysis}, {str(i): 30 for i in commentary}


def _chat(client: TestClient, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The whole message and the stream's deltas reassembled (content, reasoning, calls)."""
    body = {"model": "m", "messages": ASK, "max_tokens": 48, "temperature": 0, **body}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    whole = r.json()["choices"][0]
    s = client.post("/v1/chat/completions", json={**body, "stream": True})
    assert s.status_code == 200, s.text
    chunks = [json.loads(x[6:]) for x in s.text.split("\n\n") if x.startswith("data: {")]
    content, reasoning, calls, finish = "", "", {}, None
    for c in chunks:
        for ch in c["choices"]:
            d = ch["delta"]
            content += d.get("content") or ""
            reasoning += d.get("reasoning_content") or ""
            for t in d.get("tool_calls") or ():
                call = calls.setdefault(t["index"], {"id": t.get("id"), "name": "", "arguments": ""})
                call["name"] += (t.get("function") or {}).get("name") or ""
                call["arguments"] += (t.get("function") or {}).get("arguments") or ""
            finish = ch.get("finish_reason") or finish
    streamed = {
        "content": content or None,
        "reasoning_content": reasoning or None,
        "tool_calls": [(c["name"], c["arguments"]) for _, c in sorted(calls.items())],
        "finish_reason": finish,
    }
    return whole, streamed


def _summary(choice: dict[str, Any]) -> dict[str, Any]:
    m = choice["message"]
    calls = [(t["function"]["name"], t["function"]["arguments"]) for t in m.get("tool_calls") or ()]
    return {
        "content": m.get("content"),
        "reasoning_content": m.get("reasoning_content"),
        "tool_calls": calls,
        "finish_reason": choice["finish_reason"],
    }


def _no_markers(*texts: str | None) -> None:
    for text in texts:
        assert not any(m in (text or "") for m in MARKERS), text


def test_the_format_is_chosen_from_the_template(app):
    client, _, _ = app
    r = client.post("/api/show", json={"model": "m"})
    assert r.status_code == 200 and "thinking" in r.json()["capabilities"]


def test_a_forced_call_streamed_equals_whole(app):
    """(`logit_bias` towards "commentary": the random model would otherwise reason until max_tokens.)"""
    client, _, to_call = app
    body = {"tools": [WEATHER, NOW], "tool_choice": "required", "logit_bias": to_call}
    whole, streamed = _chat(client, body)
    got = _summary(whole)
    assert got == streamed
    [(name, arguments)] = got["tool_calls"]
    assert got["content"] is None and got["finish_reason"] == "tool_calls"
    if name == "get_weather":
        jsonschema.validate(json.loads(arguments), PARAMS)
    else:
        assert json.loads(arguments) == {}
    _no_markers(got["reasoning_content"], arguments)
    assert whole["message"]["tool_calls"][0]["id"].startswith("call_")


def test_a_named_call(app):
    client, _, to_call = app
    body = {"tools": [WEATHER, NOW], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    whole, streamed = _chat(client, {**body, "logit_bias": to_call})
    got = _summary(whole)
    assert got == streamed and got["finish_reason"] == "stop"  # (OpenAI's for a named choice)
    [(name, arguments)] = got["tool_calls"]
    assert name == "get_weather"
    jsonschema.validate(json.loads(arguments), PARAMS)
    _no_markers(got["reasoning_content"], got["content"])


def test_a_response_format_is_answered_in_the_final_channel(app):
    client, bias, _ = app
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}}
    whole, streamed = _chat(client, {"response_format": fmt, "thinking_token_budget": 3, "logit_bias": bias})
    got = _summary(whole)
    assert got == streamed and got["tool_calls"] == []
    jsonschema.validate(json.loads(got["content"]), ANSWER)
    assert got["reasoning_content"]
    _no_markers(got["reasoning_content"])


def test_other_front_ends_split_the_analysis(app):
    """Anthropic Messages, Responses and Ollama, each held to harmony by a grammar (a forced call, a format;
    none takes a logit_bias, so the random model takes the analysis and reasons until the token limit): the
    analysis channel comes back as each API's reasoning, with no harmony marker anywhere."""
    client, _, _ = app
    r = client.post(
        "/v1/messages",
        json={
            "model": "m", "max_tokens": 24, "messages": ASK, "temperature": 0, "tool_choice": {"type": "any"},
            "tools": [{"name": "get_weather", "description": "Weather.", "input_schema": PARAMS}],
            "thinking": {"type": "enabled", "budget_tokens": 1024},
        },
    )  # fmt: skip
    assert r.status_code == 200, r.text
    blocks = r.json()["content"]
    assert [b["type"] for b in blocks] == ["thinking"] and r.json()["stop_reason"] == "max_tokens"
    _no_markers(blocks[0]["thinking"])
    assert len(blocks[0]["thinking"]) > 20
    r = client.post(
        "/v1/responses",
        json={
            "model": "m", "input": "Weather in Paris?", "max_output_tokens": 24, "temperature": 0,
            "reasoning": {"effort": "high"}, "tool_choice": "required",
            "tools": [{"type": "function", "name": "get_weather", "parameters": PARAMS}],
        },
    )  # fmt: skip
    assert r.status_code == 200, r.text
    [item] = r.json()["output"]
    assert item["type"] == "reasoning"
    _no_markers(json.dumps(item))
    r = client.post(
        "/api/chat",
        json={"model": "m", "messages": ASK, "stream": False, "think": "low", "format": ANSWER,
              "options": {"temperature": 0, "num_predict": 24}},
    )  # fmt: skip
    assert r.status_code == 200, r.text
    message = r.json()["message"]
    assert message["thinking"] and not message["content"]
    _no_markers(message["thinking"])


def test_a_tool_conversation_renders_back(app):
    """call → result → answer: the history (parallel calls, reasoning, results out of order) is accepted, and
    the prompt is GPT-OSS's: each call followed by its own result, the calls' reasoning kept while no final
    answer followed, the effort's harmony name; a prefill starts the final channel."""
    from blazr.server.chat_format import ChatFormat
    from blazr.server.conversation import Conversation
    from blazr.tokenizer import TokenizerSource, load_tokenizer

    client, _, _ = app
    paris = '{"city": "Paris", "unit": "c"}'
    calls = [
        {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": paris}},
        {"id": "b", "type": "function", "function": {"name": "now", "arguments": "{}"}},
    ]
    history = [
        *ASK,
        {"role": "assistant", "content": None, "reasoning_content": "Need tools.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "b", "content": "noon"},
        {"role": "tool", "tool_call_id": "a", "content": "sunny"},
    ]
    body = {"model": "m", "messages": history, "tools": [WEATHER, NOW], "max_tokens": 8, "temperature": 0}
    r = client.post("/v1/chat/completions", json={**body, "reasoning_effort": "minimal"})
    assert r.status_code == 200, r.text
    _no_markers(
        r.json()["choices"][0]["message"]["content"],
        r.json()["choices"][0]["message"].get("reasoning_content"),
    )

    fmt = ChatFormat(load_tokenizer(TokenizerSource(tokenizer_dir=client.app.state.harmony_root)))
    assert fmt.describe() == "harmony (reasoning and tool calls)"
    parsed = [
        {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
        for c in calls
    ]
    as_objects = [{**m, "tool_calls": parsed} if m.get("tool_calls") else m for m in history]
    conv = Conversation(as_objects, tools=[WEATHER, NOW], reasoning_effort="minimal", prefill="It is")
    text = fmt.tokenizer.decode(fmt.render(conv), skip_special=False)
    assert "Reasoning: low" in text
    assert (
        "<|start|>assistant<|channel|>analysis<|message|>Need tools.<|end|>"
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
        '{"city": "Paris", "unit": "c"}<|call|>'
        '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"sunny"<|end|>'
        "<|start|>assistant to=functions.now<|channel|>commentary json<|message|>{}<|call|>"
        '<|start|>functions.now to=assistant<|channel|>commentary<|message|>"noon"<|end|>'
        "<|start|>assistant<|channel|>final<|message|>It is"
    ) in text
    assert text.endswith("<|channel|>final<|message|>It is")
