"""Ollama's API as a thin translation onto blazr: /api/version, /api/tags, /api/show, /api/ps (the one
served model), /api/chat and /api/generate (through the chat core: `Conversation` → `ChatRun`), /api/embed
and /api/embeddings (embeddings.py). Errors are Ollama's `{"error": "…"}` (errors.py).

Model names: a served name, with or without Ollama's `:latest` tag; another name is a 404.

/api/chat: messages (an assistant's `thinking` is its reasoning, its `tool_calls` carry arguments as
objects; a `tool` message's `tool_name` names the function it answers), `tools`, `format` (`"json"` or a
JSON schema: the answer is held to it), `think` (true / false, or `low` / `medium` / `high`: the template's
switch and a thinking budget, conversation.py; `true` on a server without --reasoning-parser is a 400),
`options`, `logprobs` / `top_logprobs`. /api/generate: `prompt` with `system` through the chat template, or
`raw` (the prompt as is); `context` (earlier ids) goes before the prompt, and the final chunk carries the
new context; an empty prompt answers at once (`done_reason` "load", as Ollama's model-load request).
`num_predict` -1 or -2 (or none) generate to the end of the context.

Streams (the default; `"stream": false` for one object) are NDJSON: a line per engine step with the text
(`message.content` / `response`) and `thinking`, tool calls whole once the output ends, then a last line
with `done: true`, `done_reason` (`stop`, `length`), the token counts (`prompt_eval_count`, `eval_count`)
and durations in nanoseconds.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from blazr import __version__
from blazr.engine.grammar import StructuredOutput
from blazr.errors import BlazrError
from blazr.server import embeddings, request_in, response_out
from blazr.server.chat_run import ChatRun
from blazr.server.conversation import Conversation
from blazr.server.errors import APIError, bad_request
from blazr.server.middleware import request_id
from blazr.server.schemas_ollama import (
    ChatRequest,
    EmbeddingsRequest,
    EmbedRequest,
    GenerateRequest,
    GenerationFields,
    Options,
)
from blazr.server.serving import Serving
from blazr.server.transport import run_until_disconnect, sse_response

OLLAMA_VERSION = "0.13.0"  # the Ollama API version whose shapes blazr answers in
DIGEST = "sha256:" + "0" * 64  # blazr has no registry digests
THINK_EFFORT = {"low": "low", "medium": "medium", "high": "high"}


def model_name(s: Serving, name: str) -> str:
    """The name as the client gave it, if it names the served model (`:latest` optional); else a 404."""
    base = name[: -len(":latest")] if name.endswith(":latest") else name
    if base not in s.model_names and name not in s.model_names:
        raise APIError(404, f"model '{request_in.shorten(name)}' not found", code="model_not_found")
    return name


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


# ------------------------------------------------------------------------------------------ model info


def version() -> dict[str, Any]:
    return {"version": OLLAMA_VERSION, "blazr_version": __version__}


def _details(s: Serving) -> dict[str, Any]:
    return details_of(s.details)


def details_of(d: dict[str, Any]) -> dict[str, Any]:
    """Ollama's `details` of a model from `LLM.details()`."""
    return {
        "parent_model": "",
        "format": d.get("format", "safetensors"),
        "family": d.get("family", ""),
        "families": [d["family"]] if d.get("family") else None,
        "parameter_size": _short(d.get("parameter_count", 0)),
        "quantization_level": d.get("quantization_level", ""),
    }


_DURATION = re.compile(r"^(-?\d+(?:\.\d+)?)(ms|s|m|h)?$")
_UNIT_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def keep_alive_seconds(value: float | str | None) -> float | None:
    """Ollama's `keep_alive` → seconds to stay loaded once idle: a number of seconds or a duration
    ("5m", "30s", "1h"); negative: for ever (inf); 0: unload once the request is done; None: the server's
    --sleep-idle-seconds. Another value is a 400."""
    if value is None:
        return None
    if isinstance(value, str):
        m = _DURATION.match(value.strip())
        if m is None:
            message = f"keep_alive {request_in.shorten(value)!r}: expected seconds or a duration (5m)"
            raise bad_request(message, "keep_alive")
        seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    else:
        seconds = float(value)
    return float("inf") if seconds < 0 else seconds


def _short(n: int) -> str:
    """135000000 → '135M' (Ollama's parameter_size)."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def tags(s: Serving) -> dict[str, Any]:
    modified = datetime.fromtimestamp(s.created, UTC).isoformat().replace("+00:00", "Z")
    models = [
        {
            "name": name,
            "model": name,
            "modified_at": modified,
            "size": s.details.get("size", 0),
            "digest": DIGEST,
            "details": _details(s),
        }
        for name in s.model_names
    ]
    return {"models": models}


def ps(s: Serving) -> dict[str, Any]:
    models = [
        {**m, "expires_at": "0001-01-01T00:00:00Z", "size_vram": 0, "context_length": s.engine.max_model_len}
        for m in tags(s)["models"]
    ]
    return {"models": models}


def capabilities(s: Serving) -> list[str]:
    caps = ["completion", "tools", "embedding"]
    if s.format.reasons:
        caps.append("thinking")
    return caps


def show(s: Serving, name: str) -> dict[str, Any]:
    model_name(s, name)
    d = s.details
    family = d.get("family", "")
    info = {
        "general.architecture": family,
        "general.parameter_count": d.get("parameter_count", 0),
        f"{family}.context_length": s.engine.max_model_len,
        f"{family}.embedding_length": d.get("embedding_length", 0),
        f"{family}.block_count": d.get("num_layers", 0),
    }
    return {
        "modelfile": f"# served by blazr {__version__}\nFROM {s.root}\n",
        "parameters": "",
        "template": s.tokenizer.chat_template.source,
        "details": _details(s),
        "model_info": info,
        "capabilities": capabilities(s),
        "modified_at": datetime.fromtimestamp(s.created, UTC).isoformat().replace("+00:00", "Z"),
    }


# ---------------------------------------------------------------------------------------------- input


def _format(fmt: str | dict[str, Any] | None) -> StructuredOutput | None:
    if not fmt:
        return None
    try:
        if fmt == "json":
            return StructuredOutput(json_object=True)
        return StructuredOutput(json_schema=fmt)  # type: ignore[arg-type]
    except BlazrError as e:
        raise bad_request(str(e), "format") from None


def _thinking(s: Serving, req: GenerationFields) -> tuple[bool | None, str | None]:
    """(the template's thinking switch, the reasoning effort) of `think`."""
    think = req.think
    if think is None:
        return None, None
    if think is not False and not s.format.reasons:
        raise bad_request(
            f"'{req.model}' does not support thinking (start blazr serve with --reasoning-parser)", "think"
        )
    if isinstance(think, bool):
        return think, None
    return True, THINK_EFFORT[think]


def chat_conversation(s: Serving, req: ChatRequest) -> Conversation:
    messages: list[dict[str, Any]] = []
    for i, m in enumerate(req.messages or ()):
        if m.images:
            raise bad_request(f"messages[{i}]: images are not supported (blazr takes text)", f"messages.{i}")
        message: dict[str, Any] = {"role": m.role, "content": m.content or ""}
        if m.thinking and m.role == "assistant":
            message["reasoning_content"] = m.thinking
        if m.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.id or f"call_{i}_{j}",
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                }
                for j, c in enumerate(m.tool_calls)
            ]
        if m.role == "tool":
            if m.tool_name:
                message["name"] = m.tool_name
            if m.tool_call_id:
                message["tool_call_id"] = m.tool_call_id
        messages.append(message)
    thinking, effort = _thinking(s, req)
    return Conversation(
        messages=messages,
        tools=[t.model_dump(exclude_none=True) for t in req.tools or ()],
        response_format=_format(req.format),
        thinking=thinking,
        reasoning_effort=effort,
        params={"format": "format"},
    )


def _params(s: Serving, options: Options | None, logprobs: int | None) -> tuple[Any, int | None]:
    """Sampling parameters from `options`, and max_tokens (None: to the end of the context)."""
    o = options or Options()
    max_tokens = o.num_predict if o.num_predict is not None and o.num_predict > 0 else None
    params = request_in.basic_params(
        max_tokens=max_tokens or s.engine.max_model_len,
        temperature=o.temperature,
        top_p=o.top_p,
        top_k=o.top_k,
        min_p=o.min_p,
        seed=o.seed,
        repetition_penalty=o.repeat_penalty if o.repeat_penalty else None,
        presence_penalty=o.presence_penalty,
        frequency_penalty=o.frequency_penalty,
        stop=o.stop,
        logprobs=logprobs,
    )
    return params, max_tokens


def load_seconds(raw: Request) -> float:
    """How long this request waited for its model to load (a multi-model server; else 0)."""
    return getattr(raw.state, "load_seconds", 0.0)


def _logprobs(req: GenerationFields) -> int | None:
    return (req.top_logprobs or 0) if req.logprobs else None


# -------------------------------------------------------------------------------------------- endpoints


async def chat(s: Serving, req: ChatRequest, raw: Request) -> Response:
    name = model_name(s, req.model)
    rid = request_id(raw.scope)
    if not req.messages:  # Ollama's "load the model" request
        done = {"model": name, "created_at": _now(), "message": {"role": "assistant", "content": ""}}
        done |= {"done": True, "done_reason": "load", "load_duration": int(load_seconds(raw) * 1e9)}
        return Response(json.dumps(done), media_type="application/json")
    params, max_tokens = _params(s, req.options, _logprobs(req))
    conv = await s.off_loop(chat_conversation, s, req)
    run = await s.start_chat(conv, params, f"ollama-chat-{rid}", max_tokens)
    job = OllamaJob(s, run, name, "chat", load_seconds(raw))
    if req.stream:
        return sse_response(job.events(), run.stream, rid, "ollama")
    return await run_until_disconnect(raw, job.collect(), rid)


async def generate(s: Serving, req: GenerateRequest, raw: Request) -> Response:
    name = model_name(s, req.model)
    rid = request_id(raw.scope)
    for field, value in (("suffix", req.suffix), ("template", req.template), ("images", req.images)):
        if value:
            raise bad_request(f"{field} is not supported", field)
    if not req.prompt and not req.context:  # Ollama's "load the model" request
        done = {"model": name, "created_at": _now(), "response": "", "done": True, "done_reason": "load"}
        done["load_duration"] = int(load_seconds(raw) * 1e9)
        return Response(json.dumps(done), media_type="application/json")
    params, max_tokens = _params(s, req.options, _logprobs(req))
    s.check_prompt_chars(len(req.prompt or "") + len(req.system or ""), "prompt")
    plan = await s.off_loop(_generate_plan, s, req)
    run = await s.start_plan(plan, params, f"ollama-generate-{rid}", max_tokens, "prompt")
    job = OllamaJob(s, run, name, "generate", load_seconds(raw))
    if req.stream:
        return sse_response(job.events(), run.stream, rid, "ollama")
    return await run_until_disconnect(raw, job.collect(), rid)


def _generate_plan(s: Serving, req: GenerateRequest) -> Any:
    """The plan of a generate request: the raw prompt, or system + prompt through the chat template; the
    earlier `context` ids before it."""
    thinking, effort = _thinking(s, req)
    conv = Conversation(
        messages=[
            *([{"role": "system", "content": req.system}] if req.system else []),
            {"role": "user", "content": req.prompt or ""},
        ],
        response_format=_format(req.format),
        thinking=thinking,
        reasoning_effort=effort,
        params={"messages": "prompt", "format": "format"},
    )
    fmt = conv.response_format
    if req.raw:
        ids = s.tokenizer.encode(req.prompt or "") if req.prompt else []
        if req.context and ids[:1] == [s.tokenizer.bos_token_id] and s.tokenizer.add_bos:
            ids = ids[1:]
    else:
        ids = s.format.render(conv)
    return s.format.plan_prompt(list(req.context or ()) + ids, conv, fmt, "format")


class OllamaJob:
    """One /api/chat or /api/generate answer, from its `ChatRun`: one object or NDJSON lines."""

    def __init__(self, s: Serving, run: ChatRun, model: str, kind: str, load_s: float = 0.0) -> None:
        self.s = s
        self.run = run
        self.model = model
        self.kind = kind  # chat | generate
        self.load_s = load_s  # the model's load, when this request waited for it (a multi-model server)
        self.started = time.monotonic() - load_s

    def _line(self, content: str, thinking: str, calls: list[dict[str, Any]], lps: list) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "created_at": _now()}
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            out["message"] = message
        else:
            out["response"] = content
            if thinking:
                out["thinking"] = thinking
        if self.run.params.logprobs is not None:
            out["logprobs"] = [
                {
                    "token": e.token,
                    "logprob": e.logprob,
                    "top_logprobs": [t.model_dump() for t in e.top_logprobs],
                }
                for e in response_out.chat_logprobs(lps, self.s.tokenizer).content or []
            ]
        out["done"] = False
        return out

    def _done(self, line: dict[str, Any], finish: str | None) -> dict[str, Any]:
        run, now = self.run, time.monotonic()
        first = run.first_token_at or now
        line.update(
            done=True,
            done_reason="length" if finish == "length" else "stop",
            total_duration=int((now - self.started) * 1e9),
            load_duration=int(self.load_s * 1e9),
            prompt_eval_count=run.num_prompt_tokens,
            prompt_eval_duration=int((first - run.submitted) * 1e9),
            eval_count=run.num_generated,
            eval_duration=int((now - first) * 1e9),
        )
        if self.kind == "generate":
            line["context"] = run.plan.prompt_ids + run.token_ids[0]
        return line

    async def collect(self) -> dict[str, Any]:
        r = (await self.run.results())[0]
        calls = [_call(c.name, c.arguments) for c in r.tool_calls]
        content = "" if calls and not r.content.strip() else r.content
        return self._done(self._line(content, r.reasoning, calls, r.logprobs), r.finish_reason)

    async def events(self) -> AsyncIterator[bytes]:
        finish = None
        calls: dict[int, list[str]] = {}  # index → [name, arguments text]
        async for steps in self.run.steps():
            lines = []
            for step in steps:
                d = step.delta
                for c in d.tool_calls:
                    entry = calls.setdefault(c.index, ["", ""])
                    entry[0] = entry[0] or (c.name or "")
                    entry[1] += c.arguments
                if step.finished:
                    finish = step.finish_reason
                if d.content or d.reasoning or step.logprobs:
                    lines.append(self._line(d.content, d.reasoning, [], step.logprobs))
            if lines:
                yield b"".join(json.dumps(line, ensure_ascii=False).encode() + b"\n" for line in lines)
        lines = []
        tool_calls = [_call(name, args) for _, (name, args) in sorted(calls.items())]
        if tool_calls:  # the calls whole, on a line of their own before the last (as Ollama sends them)
            lines.append(self._line("", "", tool_calls, []))
        lines.append(self._done(self._line("", "", [], []), finish))
        yield b"".join(json.dumps(line, ensure_ascii=False).encode() + b"\n" for line in lines)


def _call(name: str, arguments: str) -> dict[str, Any]:
    try:
        args = json.loads(arguments)
    except ValueError:
        args = {}
    return {"function": {"name": name, "arguments": args if isinstance(args, dict) else {}}}


# ---------------------------------------------------------------------------------------------- embed


async def embed(s: Serving, req: EmbedRequest, rid: str) -> dict[str, Any]:
    """/api/embed: one vector per input; `truncate` (default true) keeps an input's first tokens that fit
    the context, false makes a longer one a 400."""
    name = model_name(s, req.model)
    embeddings.check_dimensions(s, req.dimensions)
    t0 = time.monotonic()
    texts = [req.input] if isinstance(req.input, str) else req.input
    for text in texts:
        s.check_prompt_chars(len(text), "input")
    id_lists = await s.off_loop(lambda: [s.tokenizer.encode(t) for t in texts])
    if req.truncate is not False:
        id_lists = [ids[: s.engine.max_model_len - 1] for ids in id_lists]
    id_lists = [embeddings.fit(s, ids, None, "input") for ids in id_lists]
    found = await embeddings.vectors(s, id_lists, f"ollama-embed-{rid}", "input")
    return {
        "model": name,
        "embeddings": found,
        "total_duration": int((time.monotonic() - t0) * 1e9),
        "load_duration": 0,
        "prompt_eval_count": sum(len(ids) for ids in id_lists),
    }


async def embeddings_legacy(s: Serving, req: EmbeddingsRequest, rid: str) -> dict[str, Any]:
    """/api/embeddings: one prompt's vector (Ollama's older form)."""
    model_name(s, req.model)
    s.check_prompt_chars(len(req.prompt), "prompt")
    ids = await s.off_loop(s.tokenizer.encode, req.prompt)
    found = await embeddings.vectors(
        s, [embeddings.fit(s, ids, None, "prompt")], f"ollama-embd-{rid}", "prompt"
    )
    return {"embedding": found[0]}
