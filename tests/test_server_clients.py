"""Every API through the real server with its official SDK — `openai` (chat; the Responses API streamed,
with a function tool round trip, stored, retrieved, deleted, input tokens), `anthropic` (messages,
streaming, a tool_use → tool_result round trip, count_tokens), `ollama` (chat and generate streamed,
embed) — on SmolLM2 (the embedded default) and on a tiny random hybrid (Mamba2 + attention + MoE, as
test_server_sampling builds it), behind an API key. Then on SmolLM2: vectors of /v1/embeddings and
/api/embed agree, a thinking budget holds through Anthropic's `budget_tokens` and OpenAI's
`reasoning_effort`, `cache_salt` isolates prefix-cache tenants, vLLM's `prompt_logprobs`."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import ollama
import openai
import pytest

from tests.server_util import ServerProcess
from tests.ssm_fixtures import randomise
from tests.test_server_sampling import GRANITE, VOCAB
from tests.tiny import build

KEY = "sk-clients"
CITY = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"]}
THINK_TEMPLATE = """{%- for m in messages -%}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor -%}{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% else %}<think>
{% endif %}{% endif %}"""


@pytest.fixture(scope="module", params=["smollm2", "hybrid"])
def server(request, tmp_path_factory):
    args = ["--served-model-name", "m", "--max-model-len", "1024", "--max-num-seqs", "8"]
    if request.param == "hybrid":
        path = tmp_path_factory.mktemp("hybrid")
        hf = build("GraniteMoeHybridForCausalLM", path, vocab_size=VOCAB, **GRANITE)
        randomise(hf, 1)
        hf.save_pretrained(path)
        args += ["--model", str(path), "--num-threads", "1"]
    with ServerProcess(args, api_key=KEY) as s:
        s.is_hybrid = request.param == "hybrid"  # type: ignore[attr-defined]
        yield s


def _anthropic(s: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=s.url, api_key=KEY, max_retries=0, timeout=300)


def _ollama(s: ServerProcess) -> ollama.Client:
    return ollama.Client(host=s.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=300)


def test_openai_chat_and_responses_with_a_tool_round_trip(server):
    client = server.client()
    chat = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
    )
    assert chat.choices[0].finish_reason in ("stop", "length") and chat.usage.completion_tokens > 0
    tools: Any = [{"type": "function", "name": "weather", "parameters": CITY, "strict": True}]
    ask = dict(
        model="m", input="Weather in Oslo?", tools=tools, tool_choice="required", parallel_tool_calls=False
    )
    events = list(client.responses.create(**ask, max_output_tokens=40, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"], kinds
    assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed", kinds
    first = events[-1].response  # type: ignore[union-attr]
    call = next(o for o in first.output if o.type == "function_call")
    assert call.name == "weather" and json.loads(call.arguments)["city"] in ("Paris", "Oslo")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    # the tool's result continues the stored conversation (its prompt starts with the one before: cached)
    result: Any = [{"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature": -3}'}]
    events = list(
        client.responses.create(
            model="m", previous_response_id=first.id, input=result, max_output_tokens=6, stream=True
        )
    )
    second = events[-1].response  # type: ignore[union-attr]
    assert events[-1].type in ("response.completed", "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == second.output_text
    # (a hybrid resumes only from a recurrent-state snapshot, none of which this short prefix reaches)
    assert second.usage.input_tokens_details.cached_tokens > 0 or server.is_hybrid
    got = client.responses.retrieve(first.id)
    assert got.id == first.id and got.output[0].type == "function_call"
    count = client.responses.input_tokens.count(model="m", input="Weather in Oslo?", tools=tools).input_tokens
    assert count == first.usage.input_tokens  # type: ignore[union-attr]
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)


def test_anthropic_messages_streaming_and_a_tool_round_trip(server):
    client = _anthropic(server)
    msg = client.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    assert msg.stop_reason in ("end_turn", "max_tokens") and msg.usage.output_tokens > 0
    with client.messages.stream(model="m", max_tokens=4, messages=[{"role": "user", "content": "Hi"}]) as st:
        kinds = [e.type for e in st]
        streamed = st.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
    assert streamed.usage.output_tokens > 0
    tools: Any = [{"name": "weather", "description": "Weather in a city", "input_schema": CITY}]
    question: Any = [{"role": "user", "content": "Weather in Oslo?"}]
    forced: Any = {"type": "any", "disable_parallel_tool_use": True}
    used = client.messages.create(
        model="m", max_tokens=40, tools=tools, tool_choice=forced, messages=question
    )
    assert used.stop_reason == "tool_use"
    tool_use = next(b for b in used.content if b.type == "tool_use")
    assert tool_use.name == "weather" and tool_use.input["city"] in ("Paris", "Oslo")  # type: ignore[index]
    history: Any = [
        *question,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in used.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "-3 C"}]},
    ]
    with client.messages.stream(model="m", max_tokens=6, tools=tools, messages=history) as st:
        answer = st.get_final_message()
    total = answer.usage.input_tokens + (answer.usage.cache_read_input_tokens or 0)
    assert client.messages.count_tokens(model="m", tools=tools, messages=history).input_tokens == total
    assert (answer.usage.cache_read_input_tokens or 0) > 0 or server.is_hybrid  # the turn before: cached


def test_ollama_chat_generate_and_embed(server):
    client = _ollama(server)
    parts = list(
        client.chat(
            model="m", messages=[{"role": "user", "content": "Hi"}], stream=True, options={"num_predict": 4}
        )
    )
    assert len(parts) >= 2 and parts[-1].done and parts[-1].eval_count == 4
    assert not any(p.done for p in parts[:-1])
    parts = list(
        client.generate(model="m:latest", prompt="Once upon a time", stream=True, options={"num_predict": 4})
    )
    assert parts[-1].done and parts[-1].done_reason == "length" and parts[-1].context
    embedded = client.embed(model="m", input=["hello world", "goodbye", "hello world"])
    a, b, c = embedded.embeddings
    assert abs(sum(x * x for x in a) - 1) < 1e-4 and a == c and a != b
    assert [m.model for m in client.list().models] == ["m"]


def test_embeddings_agree_across_apis(server):
    texts = ["The fox jumps.", "A quiet river"]
    openai_vectors = [d.embedding for d in server.client().embeddings.create(model="m", input=texts).data]
    ollama_vectors = _ollama(server).embed(model="m", input=texts).embeddings
    for u, v in zip(openai_vectors, ollama_vectors, strict=True):
        assert max(abs(x - y) for x, y in zip(u, v, strict=True)) < 1e-5


@pytest.fixture(scope="module")
def thinking(tmp_path_factory):
    template = tmp_path_factory.mktemp("think") / "think.jinja"
    template.write_text(THINK_TEMPLATE)
    args = ["--served-model-name", "m", "--max-model-len", "1024", "--reasoning-parser", "qwen3"]
    with ServerProcess([*args, "--chat-template", str(template)]) as s:
        yield s


def test_thinking_budgets_end_the_block_then_the_format_holds(thinking):
    question: Any = [{"role": "user", "content": "What is 3+4? Think it through."}]
    client = anthropic.Anthropic(base_url=thinking.url, api_key="x", max_retries=0, timeout=300)
    answer = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 99}}}
    fmt: Any = {"format": {"type": "json_schema", "schema": {**answer, "required": ["answer"]}}}
    for budget in (2, 5):
        thought_cap: Any = {"type": "enabled", "budget_tokens": budget}
        msg = client.messages.create(  # greedy (an older client's field): sampled, the answer may not fit
            model="m",
            max_tokens=40,
            messages=question,
            thinking=thought_cap,
            output_config=fmt,
            extra_body={"temperature": 0},
        )
        kinds = [b.type for b in msg.content]
        assert kinds == ["thinking", "text"], msg.content
        thought = msg.content[0].thinking  # type: ignore[union-attr]
        assert (
            0
            < len(
                thinking.post("/tokenize", json={"prompt": thought, "add_special_tokens": False}).json()[
                    "tokens"
                ]
            )
            <= budget + 1
        )
        assert isinstance(json.loads(msg.content[1].text)["answer"], int)  # type: ignore[union-attr]
    oa = thinking.client()
    none = oa.chat.completions.create(model="m", messages=question, max_tokens=12, reasoning_effort="none")
    assert not getattr(none.choices[0].message, "reasoning_content", None)  # switch off, budget 0


def test_cache_salt_isolates_tenants_and_prompt_logprobs(thinking):
    client = thinking.client()
    prompt = "The history of the river valley, told in many parts. " * 12
    ask = dict(model="m", prompt=prompt, max_tokens=1)

    def cached(salt: str | None) -> int:
        extra = {"cache_salt": salt} if salt else {}
        r = client.completions.create(**ask, extra_body=extra)
        return r.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]

    cached("tenant-a")
    assert cached("tenant-b") == 0 and cached(None) == 0  # another tenant, and no salt: nothing shared
    assert cached("tenant-a") > 0
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=2,
        extra_body={"prompt_logprobs": 1},
    )
    lps = r.model_extra["prompt_logprobs"]  # type: ignore[index]
    assert lps[0] is None and len(lps) == r.usage.prompt_tokens and all(len(x) >= 1 for x in lps[1:])
