"""The engine's requests before and beside the step: whether a request can run at all (`Admission.validate`:
prompt ids in the vocabulary, prompt plus max_tokens within the context, a structured-output spec that
compiles, an embedding request on one rank with n = 1), the sequences it runs as — its first, and the n − 1
samples forked from it once its prompt is prefilled — each with its own generator (seeded per sample),
grammar matcher, thinking counter and detokenizer (`Admission.new_sequence`), and what the engine holds per
request (`RequestState`: its sequences and their detokenizers; `output` makes a sequence's `SeqOutput`).

In: prompt ids and `SamplingParams`; the runner (vocabulary size, tensor parallelism), tokenizer and
`EngineConfig`. Out: `BlazrError` for a request that can never run, `Sequence`s for the scheduler, and
`SeqOutput`s. Used by engine/engine.py, which keeps the request table, the scheduler and the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from blazr.config import EngineConfig
from blazr.engine.detokenizer import Detokenizer
from blazr.engine.grammar import GrammarCompiler
from blazr.engine.outputs import SeqOutput
from blazr.engine.runner import ModelRunner
from blazr.engine.sampling import SamplingParams
from blazr.engine.sequence import Sequence, Status, TokenLogprob
from blazr.engine.thinking import ThinkingCounter
from blazr.errors import BlazrError
from blazr.tokenizer import Tokenizer


@dataclass
class RequestState:
    """A request as the engine holds it: its sequences (the first, then its forked samples) and their
    detokenizers."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence] = field(default_factory=list)
    detoks: dict[int, Detokenizer] = field(default_factory=dict)  # seq_id → detokenizer

    def pending_fork(self) -> bool:
        """Whether a sequence still has samples to fork (its prompt not yet prefilled)."""
        return any(s.fork_pending for s in self.seqs)

    def output(self, seq: Sequence, token_ids: list[int], text: str, lps: list[TokenLogprob]) -> SeqOutput:
        return SeqOutput(
            request_id=self.request_id,
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
            num_cached_tokens=seq.num_cached_tokens,
        )


class Admission:
    """Checks requests and makes their sequences (see the module docstring); owns the structured-output
    compiler, whose compiled specs `validate` caches for `new_sequence`'s matchers."""

    def __init__(self, runner: ModelRunner, tokenizer: Tokenizer, cfg: EngineConfig) -> None:
        self.runner = runner
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.vocab_size = runner.cfg.vocab_size
        self.eos_ids = frozenset(tokenizer.eos_token_ids)
        self.grammars = GrammarCompiler(tokenizer, self.vocab_size)  # structured output: specs → matchers

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
        if params.structured is not None:
            self.grammars.compile(params.structured)  # cached: add_request's matchers copy it
        if params.pooling is not None and (params.n != 1 or self.runner.tp is not None):
            raise BlazrError("an embedding request takes n = 1 and one rank (no tensor parallelism)")

    def new_sequence(self, req: RequestState, index: int, parent: Sequence | None = None) -> Sequence:
        """A sequence of `req` (sample `index`; `parent`: the prefilled sequence a sample of n > 1 forks
        from) with its generator, grammar matcher, thinking counter and detokenizer."""
        params = req.params
        seq = Sequence(req.request_id, index, req.prompt_ids, params, self.eos_ids)
        if params.seed is not None and not params.is_greedy:
            seq.generator = torch.Generator(device="cpu").manual_seed(params.seed + index)
        if parent is not None and parent.grammar is not None:  # a sample of n > 1: its own copy
            seq.grammar = parent.grammar.fork()
        elif params.structured is not None:
            seq.grammar = self.grammars.matcher(params.structured, seq.stop_ids)
        if params.thinking is not None:
            seq.thinking = ThinkingCounter.build(params.thinking, self.tokenizer)
        req.seqs.append(seq)
        req.detoks[seq.seq_id] = Detokenizer(
            self.tokenizer.stream(skip_special=params.skip_special_tokens),
            params.stop,
            params.include_stop_str_in_output,
        )
        return seq
