"""A fuzzer for every generation API — OpenAI's completions, chat, Responses and embeddings, Anthropic's
Messages, Ollama's chat / generate / embed: malformed and adversarial requests, and the verdict on the
answers.

`generate(rng, model)` yields requests built from valid bodies of each API with random mutations —
fields dropped, retyped, pushed to extremes (huge, negative, NaN/Infinity literals, 2**64), unknown fields,
odd unicode and lone surrogates, deep nesting, truncated or non-JSON bodies, invalid UTF-8, wrong content
types and methods, random logit_bias keys, stop lists, message roles and parts, chat_template_kwargs —
and, as often, valid requests with random sampling parameters (streamed or not) so that the bad ones share
batches with good ones.

`run(url, requests, concurrency)` sends them and judges every answer: a 5xx is a failure (but a 503
queue-full with Retry-After, the right answer to overload); any other non-200 must be error JSON in its
API's shape (OpenAI's, Anthropic's, Ollama's); a stream must end as its API ends one (`data: [DONE]`,
`response.completed` / `incomplete`, `message_stop`, a `done` NDJSON line, or that API's error event);
/health must stay 200 throughout (an engine death is a failure).
Used by tests/test_server_fuzz.py (bounded) and benchmarks/fuzz.py.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class FuzzRequest:
    method: str
    path: str
    body: bytes
    content_type: str = "application/json"
    is_stream: bool = False


@dataclass
class FuzzReport:
    statuses: Counter[int] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    health_failures: int = 0
    num_requests: int = 0

    @property
    def num_5xx(self) -> int:
        """Server errors (a 503 queue-full answer to overload is counted apart, in `statuses`; 599 marks a
        transport error on the client's side — a dropped connection or a timeout — and counts as one)."""
        return sum(n for status, n in self.statuses.items() if status >= 500 and status != 503)

    def summary(self) -> str:
        codes = ", ".join(f"{s}: {n}" for s, n in sorted(self.statuses.items()))
        return (
            f"{self.num_requests} requests — {codes}; 5xx: {self.num_5xx}; failures: {len(self.failures)}; "
            f"health checks failed: {self.health_failures}"
        )


WEIRD_STRINGS = [
    "",
    " ",
    "\x00",
    "\\u0000",
    "\u202e\u200b\ufeff",
    "🦊" * 50,
    "<|im_start|>system\n<|im_end|>",
    "<|endoftext|>",
    "{{ 7 * 7 }}{% for x in range(10) %}{% endfor %}",
    "\n" * 200,
    "a" * 5000,
    "Ω≈ç√∫˜µ≤≥÷",
    "null",
    "\t\r\n",
]
WEIRD_NUMBERS: list[Any] = [
    0,
    -1,
    1,
    2,
    3.5,
    -0.0,
    1e-320,
    1e308,
    -1e308,
    2**31,
    2**63,
    2**64,
    -(2**63) - 1,
    0.999999,
]
RAW_LITERALS = [
    "NaN",
    "Infinity",
    "-Infinity",
    "1e400",
    "-1e400",
    "00",
    "1.",
    ".5",
    "0x10",
    "true",
    "[]",
    "{}",
]
FIELDS = [
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "n",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "min_tokens",
    "stop_token_ids",
    "logprobs",
    "echo",
    "stream",
    "stream_options",
    "ignore_eos",
    "skip_special_tokens",
    "user",
    "model",
]
UNKNOWN = ["functions", "function_call", "best_of", "suffix", "guided_decoding_backend",
           "frobnicate", "__proto__", "prompt_logprobs", "use_beam_search", "extra_body"]  # fmt: skip


TOOL_SCHEMA = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"]}
TEXTS = ["Hi!", "Tell me a joke.", "¿Qué tal?", "<|im_end|>{{x}}", "🦊 " * 20]


def _other_api(rng: random.Random, model: str) -> tuple[str, dict[str, Any]]:
    """A valid request to one of the other APIs (Responses, Anthropic, Ollama, embeddings)."""
    stream = rng.random() < 0.4
    text = rng.choice(TEXTS)
    n = rng.randint(1, 6)
    kind = rng.randrange(8)
    if kind == 0:
        body: dict[str, Any] = {"model": model, "input": text, "max_output_tokens": n, "stream": stream}
        if rng.random() < 0.3:
            body["input"] = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": text}]
        if rng.random() < 0.2:
            body["tools"] = [{"type": "function", "name": "w", "parameters": TOOL_SCHEMA, "strict": True}]
            body["tool_choice"] = rng.choice(["auto", "required", {"type": "function", "name": "w"}])
        if rng.random() < 0.2:
            body["text"] = {"format": {"type": "json_object"}}
        if rng.random() < 0.2:
            body["reasoning"] = {"effort": rng.choice(["none", "low", "high"])}
        return "/v1/responses", body
    if kind == 1:
        body = {
            "model": model,
            "max_tokens": n,
            "messages": [{"role": "user", "content": text}],
            "stream": stream,
        }
        if rng.random() < 0.3:
            body["system"] = "Be brief."
        if rng.random() < 0.2:
            body["tools"] = [{"name": "w", "input_schema": TOOL_SCHEMA}]
            body["tool_choice"] = rng.choice(
                [{"type": "auto"}, {"type": "any"}, {"type": "tool", "name": "w"}]
            )
        if rng.random() < 0.2:
            body["thinking"] = rng.choice([{"type": "enabled", "budget_tokens": 2}, {"type": "disabled"}])
        if rng.random() < 0.2:
            body["temperature"] = rng.choice([0, 0.5, 1])
            body["stop_sequences"] = ["."]
        return "/v1/messages", body
    if kind == 2:
        options = {"num_predict": n, "temperature": rng.choice([0, 0.7]), "seed": rng.randrange(10)}
        body = {"model": model, "messages": [{"role": "user", "content": text}], "options": options}
        if rng.random() < 0.5:
            body["stream"] = stream
        if rng.random() < 0.2:
            body["format"] = rng.choice(["json", {"type": "object"}])
        return "/api/chat", body
    if kind == 3:
        body = {"model": model + rng.choice(["", ":latest"]), "prompt": text, "options": {"num_predict": n}}
        if rng.random() < 0.5:
            body["stream"] = stream
        if rng.random() < 0.2:
            body["raw"] = True
        return "/api/generate", body
    if kind == 4:
        return "/v1/embeddings", {"model": model, "input": rng.choice([text, [text, "x"], [1, 2, 3]])}
    if kind == 5:
        return "/api/embed", {"model": model, "input": rng.choice([text, [text, "y"]])}
    if kind == 6:
        return "/v1/messages/count_tokens", {"model": model, "messages": [{"role": "user", "content": text}]}
    return "/v1/responses/input_tokens", {"model": model, "input": text}


def is_stream(path: str, body: Any) -> bool:
    """Whether a well-formed answer to this body is a stream (Ollama streams unless told not to)."""
    if not isinstance(body, dict):
        return False
    if path.startswith("/api/"):
        return path in ("/api/chat", "/api/generate") and body.get("stream", True) is True
    return body.get("stream") is True


def _valid(rng: random.Random, model: str, vocab: int) -> tuple[str, dict[str, Any]]:
    if rng.random() < 0.4:
        return _other_api(rng, model)
    stream = rng.random() < 0.4
    params: dict[str, Any] = {"model": model, "max_tokens": rng.randint(1, 8), "stream": stream}
    if rng.random() < 0.5:
        params["temperature"] = rng.choice([0, 0.5, 1.0, 1.5])
    for name, values in [
        ("top_p", [0.1, 0.9, 1.0]),
        ("top_k", [-1, 0, 1, 20]),
        ("min_p", [0.0, 0.1]),
        ("seed", [0, 7, 2**40]),
        ("presence_penalty", [-2, 0.5, 2]),
        ("frequency_penalty", [-1, 1.5]),
        ("repetition_penalty", [0.5, 1.2, 3.0]),
        ("logit_bias", [{"5": 10}, {str(rng.randrange(vocab)): -100}]),
        ("min_tokens", [0, 2]),
        ("stop", ["\n", [".", "the"]]),
        ("stop_token_ids", [[1], [rng.randrange(vocab)]]),
        ("n", [1, 2]),
        ("ignore_eos", [True]),
    ]:
        if rng.random() < 0.2:
            params[name] = rng.choice(values)
    if params.get("min_tokens", 0) > params["max_tokens"]:
        params["min_tokens"] = params["max_tokens"]
    if stream and rng.random() < 0.5:
        params["stream_options"] = {"include_usage": True}
    if rng.random() < 0.5:
        prompt: Any = rng.choice(
            ["Hello there", "The capital of France is", [1, 2, 3], ["a", "b"], [[4, 5], [6]]]
        )
        if rng.random() < 0.3:
            params["logprobs"] = rng.randint(0, 5)
        if rng.random() < 0.2:
            params["echo"] = True
        return "/v1/completions", {**params, "prompt": prompt}
    messages = [{"role": "user", "content": rng.choice(["Hi!", "Tell me a joke.", "¿Qué tal?"])}]
    if rng.random() < 0.3:
        messages.insert(0, {"role": rng.choice(["system", "developer"]), "content": "Be brief."})
    if rng.random() < 0.2:
        params.update(logprobs=True, top_logprobs=rng.randint(0, 5))
    return "/v1/chat/completions", {**params, "messages": messages}


def _mutate(rng: random.Random, body: dict[str, Any]) -> dict[str, Any] | bytes:
    kind = rng.randrange(12)
    body = dict(body)
    if kind == 0:  # drop a field, maybe a required one
        if body:
            body.pop(rng.choice(list(body)))
    elif kind == 1:  # retype a field
        body[rng.choice(FIELDS)] = rng.choice([None, "x", 3, -7.5, [], {}, [1, "a"], True, {"a": [1]}])
    elif kind == 2:  # an extreme number
        body[rng.choice(FIELDS)] = rng.choice(WEIRD_NUMBERS)
    elif kind == 3:  # an unknown or unsupported field
        body[rng.choice(UNKNOWN)] = rng.choice([True, {"type": "object"}, [], "x", 1])
    elif kind == 4:  # weird strings where strings go
        target = next((k for k in ("prompt", "input", "messages") if k in body), "messages")
        text = rng.choice(WEIRD_STRINGS)
        body[target] = text if target != "messages" else [{"role": "user", "content": text}]
        if rng.random() < 0.5:
            body["stop"] = [rng.choice(WEIRD_STRINGS)[:50] or "x"]
    elif kind == 5:  # token ids out of range, negative, huge lists
        body.pop("messages", None)
        body["prompt"] = rng.choice([[-1], [10**9], [0] * 5000, [[]], [[1], []], list(range(3000)), [1.5]])
    elif kind == 6:  # messages of odd shapes
        body.pop("prompt", None)
        body["messages"] = rng.choice([
            [],
            [{"role": "tool", "content": "x"}],
            [{"role": "user"}],
            [{"role": "user", "content": None}],
            [{"role": "assistant", "content": None}],
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}],
            [{"role": "user", "content": [{"type": "text"}]}],
            [{"role": "user", "content": [{"type": "text", "text": "hi", "extra": 1}]}],
            [{"role": "user", "content": "hi", "tool_calls": []}],
            [{"role": "user", "content": "hi", "name": "x" * 600}],
            [{"content": "hi"}],
            "hi",
        ])  # fmt: skip
    elif kind == 7:  # logit_bias keys and values
        body["logit_bias"] = rng.choice([
            {"-1": 1}, {"abc": 1}, {"1_0": 1}, {" 5": 1}, {"5": 101}, {"5": "x"}, {"99999999999": 1},
            {str(i): 1 for i in range(1100)},
        ])  # fmt: skip
    elif kind == 8:  # stop lists
        body["stop"] = rng.choice([[""], ["a"] * 40, "x" * 1000, [None], [1], []])
    elif kind == 9:  # chat_template_kwargs
        body["chat_template_kwargs"] = rng.choice([
            {"x": 1}, {"messages": "evil"}, {"add_generation_prompt": "yes"}, {"bos_token": "<|x|>"},
            {"a": {"b": [1, {"c": None}]}}, {"__class__": "x"}, "notadict",
        ])  # fmt: skip
    elif kind == 10:  # raw JSON literals JSON does not allow
        text = json.dumps(body)
        field = rng.choice(["max_tokens", "temperature", "top_p", "seed"])
        literal = rng.choice(RAW_LITERALS)
        return (text[:-1] + f', "{field}": {literal}}}').encode()
    else:  # n, max_tokens and context at their limits
        body.update(n=rng.choice([1, 16, 17, 128, 129]), max_tokens=rng.choice([1, 4, 10_000]))
    return body


def generate(rng: random.Random, model: str, vocab: int = 1000) -> Iterator[FuzzRequest]:
    """An endless stream of requests: ~45% valid, the rest malformed or adversarial."""
    while True:
        path, body = _valid(rng, model, vocab)
        roll = rng.random()
        if roll < 0.45:
            yield FuzzRequest("POST", path, json.dumps(body).encode(), is_stream=is_stream(path, body))
            continue
        if roll < 0.90:
            mutated = _mutate(rng, body)
            if isinstance(mutated, bytes):
                yield FuzzRequest("POST", path, mutated)
            else:
                raw = json.dumps(mutated).encode()
                yield FuzzRequest("POST", path, raw, is_stream=is_stream(path, mutated))
            continue
        raw = json.dumps(body).encode()
        yield rng.choice([
            FuzzRequest("POST", path, raw[: rng.randrange(1, len(raw))]),  # truncated JSON
            FuzzRequest("POST", path, b"\xff\xfe\x00garbage"),  # invalid UTF-8
            FuzzRequest("POST", path, b""),
            FuzzRequest("POST", path, b"prompt=hi&max_tokens=2", "application/x-www-form-urlencoded"),
            FuzzRequest("POST", path, raw, "text/plain"),
            FuzzRequest("POST", path, b"[" * 10_000 + b"]" * 10_000),
            FuzzRequest("POST", path, json.dumps([body]).encode()),
            FuzzRequest("GET", path, b""),
            FuzzRequest("DELETE", "/v1/models/" + model, b""),
            FuzzRequest("GET", "/v1/models/" + "%2e%2e/" * 20, b""),
            FuzzRequest("POST", "/v1/embeddings", raw),
            FuzzRequest("GET", "/v1/models/x" * 500, b""),
            FuzzRequest("GET", rng.choice(["/api/tags", "/api/ps", "/api/version", "/v1/responses/x"]), b""),
            FuzzRequest("DELETE", "/v1/responses/" + "%2e%2e/" * 5, b""),
            FuzzRequest("POST", "/api/show", json.dumps({"model": rng.choice([model, "nope"])}).encode()),
            FuzzRequest("POST", rng.choice(["/v1/messages", "/api/chat", "/v1/responses"]), raw[:-1]),
        ])  # fmt: skip


def _stream_ended(path: str, text: str) -> bool:
    """Whether a stream ends as its API ends one (a last event, or that API's error event)."""
    text = text.rstrip()
    if path.startswith("/api/"):
        last = json.loads(text.splitlines()[-1]) if text else {}
        return last.get("done") is True or bool(last.get("error"))
    if path.startswith("/v1/messages"):
        return text.endswith('{"type": "message_stop"}') or "event: error\ndata:" in text[-2000:]
    if path.startswith("/v1/responses"):
        last = text.rsplit("event: ", 1)[-1]
        return last.startswith(("response.completed", "response.incomplete", "error\n"))
    return text.endswith("data: [DONE]")


def _error_json(path: str, text: str) -> bool:
    """Whether `text` is an error in the API's own shape."""
    try:
        body = json.loads(text)
        if path.startswith("/api/"):
            return set(body) == {"error"} and isinstance(body["error"], str) and bool(body["error"])
        if path.startswith("/v1/messages"):
            return body["type"] == "error" and bool(body["error"]["type"]) and bool(body["error"]["message"])
        return isinstance(body["error"]["message"], str) and bool(body["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return False


def _judge(req: FuzzRequest, status: int, text: str, headers: httpx.Headers) -> str | None:
    """What is wrong with this answer (None: nothing). A 503 with Retry-After is the right answer when the
    requests in flight hold more sequences than the server admits (n up to 128)."""
    if status == 503 and "retry-after" in headers and _error_json(req.path, text):
        return None
    if status >= 500:
        return f"{status} for {req.method} {req.path} {req.body[:300]!r}: {text[:300]}"
    if status == 200 and req.is_stream:
        try:
            ended = _stream_ended(req.path, text)
        except ValueError:
            ended = False
        return None if ended else f"stream of {req.path} not ended: {req.body[:200]!r}: {text[-300:]}"
    if status != 200 and not _error_json(req.path, text):
        return f"{status} without {req.path}'s error JSON for {req.body[:200]!r}: {text[:300]}"
    return None


async def _health(http: httpx.AsyncClient, report: FuzzReport, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            r = await http.get("/health")
            if r.status_code != 200:
                report.health_failures += 1
        except httpx.HTTPError:
            report.health_failures += 1
        await asyncio.sleep(0.25)


async def run(
    url: str,
    requests: list[FuzzRequest],
    concurrency: int = 8,
    headers: dict[str, str] | None = None,
    timeout: float = 1800.0,
) -> FuzzReport:
    """Send `requests` with `concurrency` in flight, /health polled meanwhile; the verdict. `timeout`
    per request: a chat request without max_tokens generates to the end of the context (as vLLM)."""
    report = FuzzReport()
    queue: asyncio.Queue[FuzzRequest] = asyncio.Queue()
    for r in requests:
        queue.put_nowait(r)
    stop = asyncio.Event()
    async with httpx.AsyncClient(base_url=url, timeout=timeout, headers=headers or {}) as http:

        async def worker() -> None:
            while not queue.empty():
                req = queue.get_nowait()
                try:
                    r = await http.request(
                        req.method, req.path, content=req.body, headers={"content-type": req.content_type}
                    )
                    status, text, headers = r.status_code, r.text, r.headers
                except httpx.HTTPError as e:
                    status, text, headers = 599, f"transport error: {type(e).__name__}: {e}", httpx.Headers()
                report.num_requests += 1
                report.statuses[status] += 1
                problem = _judge(req, status, text, headers)
                if problem is not None:
                    report.failures.append(problem)

        poller = asyncio.create_task(_health(http, report, stop))
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        stop.set()
        await poller
    return report
