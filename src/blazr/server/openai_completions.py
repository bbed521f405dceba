"""POST /v1/completions: prompts (a string, strings, token ids, lists of them) → engine requests, answered as
one JSON body or Server-Sent Events (`data: {chunk}\\n\\n` … `data: [DONE]\\n\\n`).

Choice indices: prompt i of a call with n samples owns choices i*n … i*n+n-1 (as OpenAI and vLLM number
them); streamed chunks of different choices are interleaved as the engine produces them, one write per
engine step's worth of outputs. `echo` prepends the prompt (with its logprobs when `logprobs` is set);
max_tokens 0 with echo scores the prompt only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import Request
from fastapi.responses import Response

from blazr.engine.async_engine import EngineRequest, RequestStream
from blazr.engine.outputs import SeqOutput
from blazr.engine.sampling import SamplingParams
from blazr.engine.sequence import TokenLogprob
from blazr.server import chunks, constraints, request_in, response_out
from blazr.server.chunks import ChunkEncoder, usage_mode
from blazr.server.errors import bad_request
from blazr.server.middleware import request_id
from blazr.server.request_in import PromptInput
from blazr.server.response_out import CompletionLogprobsWriter
from blazr.server.schemas import (
    CompletionBodyChoice,
    CompletionChoice,
    CompletionChunk,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    Usage,
)
from blazr.server.serving import Serving
from blazr.server.transport import run_until_disconnect, sse_response

log = logging.getLogger("blazr.server")


async def completions(s: Serving, req: CompletionRequest, raw: Request) -> Response:
    model = s.check_model(req.model)
    rid = request_id(raw.scope)
    request_in.check_unsupported(req)
    if req.suffix:
        raise bad_request("suffix is not supported", "suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise bad_request("best_of is not supported (only best_of == n)", "best_of")
    if req.prompt_logprobs is not None and req.stream:
        raise bad_request("prompt_logprobs is not streamed here; use echo with logprobs", "prompt_logprobs")
    max_tokens = request_in.COMPLETIONS_DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
    echo_only = max_tokens == 0  # score the prompt: echo + logprobs, nothing generated
    if echo_only and not req.echo:
        raise bad_request("max_tokens must be at least 1 (0 is allowed only with echo)", "max_tokens")
    texts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
    for text in texts:
        if isinstance(text, str):
            s.check_prompt_chars(len(text), "prompt")
    echoed = req.logprobs if req.echo and req.logprobs is not None else None
    prompt_lps = (
        max(x for x in (echoed, req.prompt_logprobs) if x is not None)
        if (echoed is not None or req.prompt_logprobs is not None)
        else None
    )
    params = request_in.sampling_params(
        req,
        max_tokens=max(1, max_tokens),
        vocab_size=s.engine.vocab_size,
        logprobs=req.logprobs,
        prompt_logprobs=prompt_lps,
    )
    structured = constraints.structured_output(req)
    if structured is not None:
        params.structured = structured[0]
        await s.compile_structured(*structured)
    prompts = await s.off_loop(request_in.completion_prompts, req.prompt, s.tokenizer)
    job = CompletionJob(s, req, model, prompts, params, echo_only, rid)
    if log.isEnabledFor(logging.INFO):
        log.info("%s: %d prompt(s)%s", job.id, len(prompts), f" user={req.user!r}" if req.user else "")
    stream = await s.submit(job.engine_requests(), "prompt")
    if req.stream:
        return sse_response(job.events(stream), stream, rid)
    return await run_until_disconnect(raw, job.collect(stream), rid)


@dataclass
class _Choice:
    """What one choice accumulated (non-streaming) or still needs (streaming)."""

    texts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    num_tokens: int = 0
    finish_reason: str | None = None
    started: bool = False


class CompletionJob:
    """One /v1/completions call: its prompts' engine requests, and their outputs as a body or SSE events."""

    def __init__(
        self,
        serving: Serving,
        req: CompletionRequest,
        model: str,
        prompts: list[PromptInput],
        params: SamplingParams,
        echo_only: bool,
        rid: str,
    ) -> None:
        self.tok = serving.tokenizer
        self.req = req
        self.model = model
        self.prompts = prompts
        self.params = params
        self.echo_only = echo_only
        self.id = f"cmpl-{rid}"
        self.created = int(time.time())
        self.n = req.n
        self.prompt_of = {f"{self.id}-{i}": i for i in range(len(prompts))}
        self.prompt_lps: dict[int, list[TokenLogprob | None]] = {}
        self.num_cached = [0] * len(prompts)  # prompt index → its tokens found in the prefix cache
        self.writers = [
            CompletionLogprobsWriter(self.tok, req.return_tokens_as_token_ids) for _ in self.choices()
        ]

    def choices(self) -> range:
        return range(len(self.prompts) * self.n)

    def engine_requests(self) -> list[EngineRequest]:
        return [EngineRequest(f"{self.id}-{i}", p.ids, self.params) for i, p in enumerate(self.prompts)]

    def usage(self, num_generated: int) -> Usage:
        """The whole call's: every prompt once (its cached tokens too), every choice's tokens."""
        return chunks.usage(sum(len(p.ids) for p in self.prompts), num_generated, sum(self.num_cached))

    def _echo_text(self, prompt: PromptInput) -> str:
        return prompt.text if prompt.text is not None else self.tok.decode(prompt.ids, skip_special=False)

    def _piece(self, out: SeqOutput, state: _Choice) -> tuple[int, str, CompletionLogprobs | None]:
        """The choice index, the text and logprobs one output adds to it (the echo comes first)."""
        p = self.prompt_of[out.request_id]
        index = p * self.n + out.index
        self.num_cached[p] = out.num_cached_tokens  # the prompt's: the same on each of its outputs
        if out.prompt_logprobs is not None:
            self.prompt_lps[p] = out.prompt_logprobs
        text = "" if self.echo_only else out.text
        lps = [] if self.echo_only else out.logprobs
        parts: list[CompletionLogprobs] = []
        writer = self.writers[index]
        if not state.started:
            state.started = True
            if self.req.echo:
                text = self._echo_text(self.prompts[p]) + text
                if self.req.logprobs is not None:
                    parts.append(writer.prompt(self.prompts[p].ids, self.prompt_lps.get(p, [])))
        if self.req.logprobs is not None:
            parts.append(writer.generated(lps))
        logprobs = response_out.merge_completion_logprobs(parts) if self.req.logprobs is not None else None
        return index, text, logprobs

    def _prompt_logprobs(self, p: int) -> list | None:
        if self.req.prompt_logprobs is None:
            return None
        return response_out.prompt_logprobs(self.prompt_lps.get(p), self.tok)

    def _num_new(self, out: SeqOutput) -> int:
        return 0 if self.echo_only else len(out.token_ids)

    async def collect(self, stream: RequestStream) -> CompletionResponse:
        states = [_Choice() for _ in self.choices()]
        pieces: list[list[CompletionLogprobs]] = [[] for _ in self.choices()]
        try:
            async for out in stream:
                index = self.prompt_of[out.request_id] * self.n + out.index
                state = states[index]
                _, text, lps = self._piece(out, state)
                state.texts.append(text)
                state.num_tokens += self._num_new(out)
                if lps is not None:
                    pieces[index].append(lps)
                if out.finished:
                    state.finish_reason = "length" if self.echo_only else out.finish_reason
        finally:
            stream.abort()
        choices = [
            CompletionBodyChoice(
                index=i,
                text="".join(s.texts),
                logprobs=response_out.merge_completion_logprobs(pieces[i])
                if self.req.logprobs is not None
                else None,
                finish_reason=s.finish_reason,  # type: ignore[arg-type]
                prompt_logprobs=self._prompt_logprobs(i // self.n),
            )
            for i, s in enumerate(states)
        ]
        return CompletionResponse(
            id=self.id,
            created=self.created,
            model=self.model,
            choices=choices,
            usage=self.usage(sum(s.num_tokens for s in states)),
        )

    async def events(self, stream: RequestStream) -> AsyncIterator[bytes]:
        """The SSE events: one write per engine step's worth of outputs."""
        mode = usage_mode(self.req.stream_options)
        enc = ChunkEncoder(CompletionChunk, self.id, self.created, self.model, mode)
        states = [_Choice() for _ in self.choices()]
        try:
            async for batch in stream.batches():
                parts: list[bytes] = []
                for out in batch:
                    p = self.prompt_of[out.request_id]
                    state = states[p * self.n + out.index]
                    index, text, lps = self._piece(out, state)
                    state.num_tokens += self._num_new(out)
                    has_lps = lps is not None and bool(lps.tokens)
                    if not (text or has_lps or out.finished):
                        continue
                    so_far = None
                    if mode == "continuous":
                        so_far = chunks.usage(len(self.prompts[p].ids), state.num_tokens, self.num_cached[p])
                    if lps is None and not out.finished:
                        parts.append(enc.text(index, text, so_far))
                        continue
                    reason = ("length" if self.echo_only else out.finish_reason) if out.finished else None
                    choice = CompletionChoice(index=index, text=text, logprobs=lps, finish_reason=reason)  # type: ignore[arg-type]
                    parts.append(enc.event(self._chunk([choice], so_far)))
                if parts:
                    yield b"".join(parts)
        finally:
            stream.abort()
        if mode != "off":
            yield enc.event(self._chunk([], self.usage(sum(s.num_tokens for s in states))))

    def _chunk(self, choices: list[CompletionChoice], usage: Usage | None) -> CompletionChunk:
        return CompletionChunk(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )
