"""LLMEngine: requests in, token/text deltas out; `step()` = schedule → run → sample → postprocess.

Synchronous and single-threaded: the offline API (`blazr.LLM`) drives it in a loop, and the server runs the
same loop on its own thread (engine/async_engine.py). A request with n > 1 is prefilled once and forked
into n sequences when its prompt is done.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from blazr.config import EngineConfig
from blazr.engine.detokenizer import Detokenizer
from blazr.engine.runner import ModelRunner, StepLogits
from blazr.engine.sampling import SampleRequest, SamplingParams, sample
from blazr.engine.scheduler import Scheduler
from blazr.engine.sequence import Sequence, Status, TokenLogprob
from blazr.errors import BlazrError
from blazr.tokenizer import Tokenizer


class QueueFullError(BlazrError):
    """The waiting queue is at its bound; the client should retry later (HTTP 503)."""


@dataclass
class SeqOutput:
    """What one sequence produced in one step (deltas), plus its final state when `finished`."""

    request_id: str
    index: int
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprob]
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    prompt_logprobs: list[TokenLogprob | None] | None = None
    first_token_time: float | None = None
    arrival_time: float = 0.0


@dataclass
class _Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence] = field(default_factory=list)
    detoks: dict[int, Detokenizer] = field(default_factory=dict)  # seq_id → detokenizer


class LLMEngine:
    def __init__(self, runner: ModelRunner, tokenizer: Tokenizer, cfg: EngineConfig) -> None:
        self.runner = runner
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.vocab_size = runner.cfg.vocab_size
        self.scheduler = Scheduler(cfg, runner.blocks, runner.slots)
        self.requests: dict[str, _Request] = {}
        self.eos_ids = frozenset(tokenizer.eos_token_ids)

    # --------------------------------------------------------------------------------------- requests

    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Raise BlazrError for a request that can never run (the server maps it to HTTP 400)."""
        if not prompt_ids:
            raise BlazrError("the prompt is empty: at least one token is required")
        bad = [t for t in prompt_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise BlazrError(f"prompt token id {bad[0]} is out of range [0, {self.vocab_size})")
        limit = self.cfg.max_model_len
        if len(prompt_ids) + params.max_tokens > limit:
            raise BlazrError(
                f"this model's maximum context length is {limit} tokens; the prompt has "
                f"{len(prompt_ids)} tokens and max_tokens is {params.max_tokens} "
                f"({len(prompt_ids) + params.max_tokens} in total)"
            )

    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        self.validate(prompt_ids, params)
        if request_id in self.requests:
            raise BlazrError(f"duplicate request id {request_id}")
        if self.scheduler.num_waiting >= self.cfg.max_waiting:
            raise QueueFullError(f"the waiting queue is full ({self.cfg.max_waiting} requests)")
        if params.n > self.cfg.max_num_seqs:
            raise BlazrError(f"n={params.n} exceeds max_num_seqs={self.cfg.max_num_seqs}")
        req = _Request(request_id, list(prompt_ids), params)
        seq = self._new_sequence(req, 0)
        seq.fork_pending = params.n - 1
        self.requests[request_id] = req
        self.scheduler.add(seq)

    def _new_sequence(self, req: _Request, index: int) -> Sequence:
        params = req.params
        seq = Sequence(req.request_id, index, req.prompt_ids, params, self.eos_ids)
        if params.seed is not None and not params.is_greedy:
            seq.generator = torch.Generator(device="cpu").manual_seed(params.seed + index)
        req.seqs.append(seq)
        req.detoks[seq.seq_id] = Detokenizer(
            self.tokenizer.stream(skip_special=params.skip_special_tokens),
            params.stop,
            params.include_stop_str_in_output,
        )
        return seq

    def abort_request(self, request_id: str) -> list[SeqOutput]:
        """Cancel a request: its sequences finish with reason "abort" and free their cache at once."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return []
        outs = []
        for seq in req.seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq, "abort")
                outs.append(self._output(req, seq, [], "", []))
        return outs

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    # ------------------------------------------------------------------------------------------- step

    def step(self) -> list[SeqOutput]:
        sched = self.scheduler.schedule()
        if sched.is_empty:
            return []
        step = self.runner.run(sched)
        for seq, n in zip(sched.seqs, sched.num_new_tokens, strict=True):
            seq.num_computed_tokens += n
        outputs: list[SeqOutput] = []
        prompt_lps = self._prompt_logprobs(step, sched.seqs)
        seqs, rows = self._expand_forks(step)
        if not seqs:
            return outputs
        logits = step.sample if len(seqs) == len(step.sample_seqs) else step.sample[rows]
        requests = [
            SampleRequest(s.params, s.prompt_ids, s.output_ids, s.generator, s.stop_ids) for s in seqs
        ]
        result = sample(logits, requests)
        now = time.monotonic()
        for b, (seq, token) in enumerate(zip(seqs, result.token_ids, strict=True)):
            req = self.requests.get(seq.request_id)
            if req is None or seq.is_finished:
                continue
            seq.output_ids.append(token)
            if seq.first_token_time is None:
                seq.first_token_time = now
            seq.last_token_time = now
            lp: list[TokenLogprob] = []
            if result.logprobs is not None and seq.params.logprobs is not None:
                k = seq.params.logprobs
                top = []
                if k:
                    ids, vals = result.top_ids[b, :k].tolist(), result.top_logprobs[b, :k].tolist()
                    top = list(zip(ids, vals, strict=True))
                lp = [TokenLogprob(token, float(result.logprobs[b]), top)]
                seq.logprobs.extend(lp)
            detok = req.detoks[seq.seq_id]
            text, finish = "", None
            if token in seq.stop_ids:
                finish = "stop"
            else:
                text, hit_stop = detok.add(token)
                if hit_stop:
                    finish = "stop"
                elif len(seq.output_ids) >= seq.params.max_tokens or seq.num_tokens >= self.cfg.max_model_len:
                    finish = "length"
            if finish is not None:
                if finish != "stop" or token in seq.stop_ids:
                    text += detok.finish()
                self.scheduler.finish(seq, finish)
            out = self._output(req, seq, [token], text, lp)
            if seq.seq_id in prompt_lps:
                out.prompt_logprobs = prompt_lps[seq.seq_id]
            outputs.append(out)
            if finish is not None and all(s.is_finished for s in req.seqs) and not self._pending_fork(req):
                self.requests.pop(req.request_id, None)
        return outputs

    def _pending_fork(self, req: _Request) -> bool:
        return any(s.fork_pending for s in req.seqs)

    def _expand_forks(self, step: StepLogits) -> tuple[list[Sequence], list[int]]:
        """Sequences to sample and the logits row of each; n > 1 parents whose prefill just completed are
        forked here so that every child samples its own first token from the shared prompt logits."""
        seqs: list[Sequence] = []
        rows: list[int] = []
        for row, seq in enumerate(step.sample_seqs):
            seqs.append(seq)
            rows.append(row)
            if seq.fork_pending and not seq.output_ids:
                req = self.requests[seq.request_id]
                children = [self._new_sequence(req, len(req.seqs)) for _ in range(seq.fork_pending)]
                fork = self.scheduler.fork(seq, children)
                self.runner.copy_blocks(fork.block_copies)
                self.runner.copy_states(fork.state_copies)
                for child in fork.children:
                    seqs.append(child)
                    rows.append(row)
        return seqs, rows

    def _prompt_logprobs(
        self, step: StepLogits, scheduled: list[Sequence]
    ) -> dict[int, list[TokenLogprob | None]]:
        """Accumulate prompt logprobs chunk by chunk; returned complete with the first sampled token."""
        done: dict[int, list[TokenLogprob | None]] = {}
        if not step.prompt:
            return done
        by_id = {s.seq_id: s for s in scheduled}
        for seq_id, (first, logits) in step.prompt.items():
            seq = by_id.get(seq_id)
            if seq is None:
                continue
            if not seq.prompt_logprobs:
                seq.prompt_logprobs = [None]  # the first prompt token has no prediction
            lps = torch.log_softmax(logits, dim=-1)
            targets = torch.tensor(seq.prompt_ids[first : first + logits.shape[0]], dtype=torch.long)
            chosen = lps.gather(1, targets[:, None].to(lps.device)).squeeze(1).tolist()
            k = seq.params.prompt_logprobs or 0
            tops = lps.topk(k, dim=-1) if k else None
            for i, (t, v) in enumerate(zip(targets.tolist(), chosen, strict=True)):
                top = (
                    list(zip(tops.indices[i].tolist(), tops.values[i].tolist(), strict=True)) if tops else []
                )
                seq.prompt_logprobs.append(TokenLogprob(t, v, top))
        for seq in step.sample_seqs:
            if seq.params.prompt_logprobs is not None and not seq.output_ids:
                done[seq.seq_id] = seq.prompt_logprobs or [None]
        return done

    def _output(
        self, req: _Request, seq: Sequence, token_ids: list[int], text: str, lps: list[TokenLogprob]
    ) -> SeqOutput:
        return SeqOutput(
            request_id=req.request_id,
            index=seq.index,
            token_ids=token_ids,
            text=text,
            logprobs=lps,
            finished=seq.status is Status.FINISHED,
            finish_reason=seq.finish_reason,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=len(seq.output_ids),
            first_token_time=seq.first_token_time,
            arrival_time=seq.arrival_time,
        )

    # ------------------------------------------------------------------------------------------ stats

    @property
    def num_running(self) -> int:
        return self.scheduler.num_running

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    @property
    def cache_usage(self) -> float:
        return self.runner.blocks.usage if self.runner.blocks is not None else 0.0
