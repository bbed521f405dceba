"""LLMEngine: requests in, token/text deltas out; `step()` = schedule → run → sample → postprocess.

Speculative decoding (`EngineConfig.speculative`): a sequence that carried drafts into the step is sampled
position after position (`_verify`: its last token's row, then each draft's while the sampled token equals
the draft) — the same sampler, grammar, penalties and generator as without drafts, so the output is the
same (engine/speculative.py says why); the state of its recurrent layers is then put back to the kept
position (the cache manager's `settle_drafts`).

A request's admission — its checks, its sequences (each with its generator, grammar matcher, thinking
counter and detokenizer) and its `SeqOutput`s — is engine/admission.py's; here: the request table, the
scheduler, the step, speculative verification and failure containment.

Synchronous and single-threaded: the offline API (`blazr.LLM`) drives it in a loop, and the server runs the
same loop on its own thread (engine/async_engine.py). A request with n > 1 is prefilled once and forked
into n sequences when its prompt is done.

Failures are contained to the request that caused them. An exception while sampling, detokenizing, scoring
prompt logprobs or forking one request finishes that request with `finish_reason="error"` (its `SeqOutput`
carries the exception for the log; clients only ever see a request id). An exception in the forward of a
step that held one request fails that request; one that held several cannot be attributed, so the
scheduler quarantines them (each re-run alone from a fresh cache) and the one that fails again alone is
failed. What cannot be contained is raised from `step()`: an error outside these regions (a bug in the
bookkeeping), an error that leaves the device unusable, or `MAX_CONSECUTIVE_FAILURES` failed forwards in a
row (the engine is broken, not a request) — the server then exits so that a supervisor restarts it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import torch

from blazr.config import EngineConfig
from blazr.engine.admission import Admission, RequestState
from blazr.engine.cache_manager import CacheManager
from blazr.engine.failures import MAX_CONSECUTIVE_FAILURES, EngineBrokenError, is_fatal
from blazr.engine.outputs import SeqOutput, merge_outputs, score_prompt
from blazr.engine.runner import ModelRunner, StepLogits
from blazr.engine.sampling import SampleRequest, SampleResult, SamplingParams, sample
from blazr.engine.scheduler import ScheduledBatch, Scheduler
from blazr.engine.sequence import Sequence, TokenLogprob
from blazr.engine.speculative import ROW_COST_CHUNK, ROW_COST_PLAN, DraftSource, Speculator
from blazr.errors import BlazrError
from blazr.tokenizer import Tokenizer

log = logging.getLogger("blazr.engine")
T = TypeVar("T")


class LLMEngine:
    def __init__(
        self,
        runner: ModelRunner,
        tokenizer: Tokenizer,
        cfg: EngineConfig,
        draft_source: DraftSource | None = None,
    ) -> None:
        """`draft_source`: where speculative decoding's drafts come from (None: the method's own, n-gram)."""
        self.runner = runner
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.vocab_size = runner.cfg.vocab_size
        self.cache = CacheManager(
            runner.cache_plan,
            has_paged=runner.cache.has_paged,
            has_state=runner.cache.has_state,
            enable_prefix_caching=cfg.enable_prefix_caching,
            snapshot_interval=cfg.state_snapshot_interval,
        )
        spec = cfg.speculative
        # drafts run as rows of the recorded decode plan (stateless models), else as a chunk
        on_plan = runner.decode_plan is not None and runner.chains_rows
        row_cost = ROW_COST_PLAN if on_plan else ROW_COST_CHUNK
        self.speculator = Speculator(spec, draft_source, row_cost) if spec is not None else None
        self.scheduler = Scheduler(cfg, self.cache, self.speculator)
        self.requests: dict[str, RequestState] = {}
        self.admission = Admission(runner, tokenizer, cfg)
        self.grammars = self.admission.grammars  # structured output: specs → matchers
        self.num_consecutive_failures = 0  # failed forwards since the last successful one

    # --------------------------------------------------------------------------------------- requests

    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Raise BlazrError for a request that can never run (the server maps it to HTTP 400; the checks:
        engine/admission.py)."""
        self.admission.validate(prompt_ids, params)

    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        self.validate(prompt_ids, params)
        if request_id in self.requests:
            raise BlazrError(f"duplicate request id {request_id}")
        if params.n > self.cfg.max_num_seqs:
            raise BlazrError(f"n={params.n} exceeds max_num_seqs={self.cfg.max_num_seqs}")
        req = RequestState(request_id, list(prompt_ids), params)
        seq = self.admission.new_sequence(req, 0)
        seq.fork_pending = params.n - 1
        self.requests[request_id] = req
        self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> list[SeqOutput]:
        """Cancel a request: its sequences finish with reason "abort" and free their cache at once."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return []
        outs = []
        for seq in req.seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq, "abort")
                seq.grammar = None
                outs.append(req.output(seq, [], "", []))
        return outs

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    # ------------------------------------------------------------------------------------------- step

    def step(self) -> list[SeqOutput]:
        """One engine step: the outputs (token deltas, finished and failed sequences) it produced. Raises
        only what cannot be contained (see the module docstring)."""
        with torch.inference_mode():  # the runner's logits are inference tensors; sampling edits copies
            return self._step()

    def _step(self) -> list[SeqOutput]:
        t0 = time.perf_counter()
        sched = self.scheduler.schedule()
        if sched.is_empty:
            return []
        outputs = self._run(sched)
        if self.speculator is not None and len(sched.seqs) == sched.num_decodes + sched.num_rows:
            self.speculator.observe_step(sum(sched.num_new_tokens), time.perf_counter() - t0)
        return outputs

    def _run(self, sched: ScheduledBatch) -> list[SeqOutput]:
        """The scheduled step's forward, then its sampling and verification."""
        try:
            step = self.runner.run(sched)
        except Exception as e:
            self.scheduler.rollback(sched)
            return self._forward_failed(sched, e)
        self.num_consecutive_failures = 0
        starts = {seq.seq_id: seq.num_computed_tokens for seq in sched.seqs if seq.draft_ids}
        for seq, n in zip(sched.seqs, sched.num_new_tokens, strict=True):
            seq.num_computed_tokens += n - len(seq.draft_ids)  # drafts count once verified
        self.scheduler.commit(sched)
        drafted = [seq for seq in sched.seqs if seq.draft_ids]
        try:
            return self._sample_step(step, sched, drafted, starts)
        finally:
            for seq in drafted:  # what a verification did not settle (a failed request): dropped
                if seq.draft_ids:
                    self._settle(seq, 0, starts[seq.seq_id])

    def _sample_step(
        self, step: StepLogits, sched: ScheduledBatch, drafted: list[Sequence], starts: dict[int, int]
    ) -> list[SeqOutput]:
        outputs: list[SeqOutput] = []
        prompt_lps = self._prompt_logprobs(step, sched.seqs, outputs)
        if step.pooled:
            self._pool(step, sched, outputs)
        seqs, rows = self._expand_forks(step, outputs)
        if not seqs:
            return outputs
        logits = step.sample if len(seqs) == len(step.sample_seqs) else step.sample[rows]
        results = self._sample(logits, seqs, outputs)
        now = time.monotonic()
        for seq, (result, b) in zip(seqs, results, strict=True):
            req = self.requests.get(seq.request_id)
            if req is None or seq.is_finished or result is None:
                continue
            try:
                out = self._append(req, seq, result, b, now)
            except Exception as e:
                outputs += self._fail(req, e, "processing its output")
                continue
            if seq.seq_id in prompt_lps:
                out.prompt_logprobs = prompt_lps[seq.seq_id]
            outputs.append(out)
            if out.finished and all(s.is_finished for s in req.seqs) and not req.pending_fork():
                self.requests.pop(req.request_id, None)
        if drafted:
            self._verify(step, drafted, outputs, now, starts)
        return outputs

    def _verify(
        self,
        step: StepLogits,
        drafted: list[Sequence],
        outputs: list[SeqOutput],
        now: float,
        starts: dict[int, int],
    ) -> None:
        """Sequences that carried drafts have sampled their last token's row; while a sequence's sampled
        token equals its next draft, the row after that draft is sampled too (batched across sequences,
        one round per draft position). Each sequence's tokens of the step are merged into one output;
        then its computed count, blocks and recurrent state move to the kept position."""
        index = {(o.request_id, o.index): i for i, o in enumerate(outputs)}  # each sequence's output
        accepted = {seq.seq_id: 0 for seq in drafted}
        for r in range(max(len(s.draft_ids) for s in drafted)):
            going = [
                s for s in drafted
                if not s.is_finished and accepted[s.seq_id] == r and r < len(s.draft_ids)
                and s.seq_id in step.drafts and s.output_ids and s.output_ids[-1] == s.draft_ids[r]
                and s.request_id in self.requests
            ]  # fmt: skip
            if not going:
                break
            for s in going:
                accepted[s.seq_id] += 1
            logits = torch.stack([step.drafts[s.seq_id][r] for s in going])
            results = self._sample(logits, going, outputs)
            for seq, (result, b) in zip(going, results, strict=True):
                req = self.requests.get(seq.request_id)
                if req is None or seq.is_finished or result is None:
                    continue
                try:
                    out = self._append(req, seq, result, b, now)
                except Exception as e:
                    outputs += self._fail(req, e, "processing its output")
                    continue
                at = index.get((out.request_id, out.index))
                if at is None:
                    index[(out.request_id, out.index)] = len(outputs)
                    outputs.append(out)
                else:
                    outputs[at] = merge_outputs(outputs[at], out)
                if out.finished and all(s.is_finished for s in req.seqs) and not req.pending_fork():
                    self.requests.pop(req.request_id, None)
        for seq in drafted:
            d, m = len(seq.draft_ids), accepted[seq.seq_id]
            if self.speculator is not None:
                self.speculator.record(seq, d, m)
            self._settle(seq, m, starts[seq.seq_id])

    def _settle(self, seq: Sequence, num_accepted: int, start: int) -> None:
        """`seq`'s verification kept `num_accepted` drafts: they count as computed and the blocks they filled
        are named — or, with recurrent state and a draft rejected, the state goes back to where the step
        began (`start`) and the step's kept tokens are computed again with the next ones. Its drafts are
        gone."""
        is_whole = num_accepted == len(seq.draft_ids)
        if not seq.is_finished:
            if is_whole or not self.cache.replays_rejected:
                seq.num_computed_tokens += num_accepted
                self.cache.commit([seq])
            else:
                seq.num_computed_tokens = start
        self.runner.copy_states(self.cache.settle_drafts(seq, is_whole))
        seq.draft_ids = []

    def _append(
        self, req: RequestState, seq: Sequence, result: SampleResult, b: int, now: float
    ) -> SeqOutput:
        """Add row `b` of `result` to `seq`: its token, logprobs, text, and whether it finished."""
        token = result.token_ids[b]
        seq.output_ids.append(token)
        if seq.grammar is not None:  # output tokens are appended once (a recompute samples only the next)
            seq.grammar.advance(token)
        if seq.thinking is not None:
            seq.thinking.advance(token)
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
        is_end = token in seq.stop_ids or (seq.grammar is not None and seq.grammar.is_done)
        if is_end:  # never sampled before min_tokens: the sampler masks them
            finish = "stop"
        else:
            # stop strings count from min_tokens on too (as vLLM's detokenizer)
            text, hit_stop = detok.add(token, check_stop=len(seq.output_ids) > seq.params.min_tokens)
            if hit_stop:
                finish = "stop"
            elif len(seq.output_ids) >= seq.params.max_tokens or seq.num_tokens >= self.cfg.max_model_len:
                finish = "length"
        if finish is not None:
            if finish != "stop" or is_end:
                text += detok.finish()
            self.scheduler.finish(seq, finish)
            seq.grammar = None
        return req.output(seq, [token], text, lp)

    def _pool(self, step: StepLogits, sched: ScheduledBatch, outputs: list[SeqOutput]) -> None:
        """Embedding requests: each chunk's pooled part added up; one whose prompt is done finishes with
        its vector (engine/pooling.py)."""
        for seq, n in zip(sched.seqs, sched.num_new_tokens, strict=True):
            pooling = seq.params.pooling
            if pooling is None or seq.seq_id not in step.pooled:
                continue
            if seq.num_computed_tokens == n:  # the first chunk (again, after a preemption): start over
                seq.pooled = None
            seq.pooled = pooling.combine(seq.pooled, step.pooled[seq.seq_id])
            req = self.requests.get(seq.request_id)
            if seq.num_computed_tokens < seq.num_tokens or req is None:
                continue
            try:
                assert seq.pooled is not None, "a finished prompt pooled nothing"
                vector = pooling.finish(seq.pooled, seq.num_tokens)
            except Exception as e:
                outputs += self._fail(req, e, "pooling its prompt")
                continue
            self.scheduler.finish(seq, "stop")
            seq.pooled = None
            out = req.output(seq, [], "", [])
            out.embedding = vector
            outputs.append(out)
            self.requests.pop(req.request_id, None)

    # ------------------------------------------------------------------------------------- failures

    def _forward_failed(self, sched: ScheduledBatch, error: Exception) -> list[SeqOutput]:
        """The forward of `sched` raised: fail its request if it held one, else quarantine them all."""
        self.num_consecutive_failures += 1
        if is_fatal(error) or self.num_consecutive_failures >= MAX_CONSECUTIVE_FAILURES:
            raise EngineBrokenError(
                f"the forward failed {self.num_consecutive_failures} time(s) in a row: {type(error).__name__}"
            ) from error
        request_ids = list(dict.fromkeys(seq.request_id for seq in sched.seqs))
        if len(request_ids) == 1:
            req = self.requests.get(request_ids[0])
            return self._fail(req, error, "the forward") if req is not None else []
        log.warning(
            "a step of %d requests failed (%s); re-running each alone to find the cause",
            len(request_ids),
            type(error).__name__,
        )
        self.scheduler.quarantine(sched)
        return []

    def _fail(self, req: RequestState, error: BaseException, stage: str) -> list[SeqOutput]:
        """Finish every sequence of `req` with reason "error"; log the traceback under its request id."""
        log.error("request %s failed in %s", req.request_id, stage, exc_info=error)
        self.requests.pop(req.request_id, None)
        outs = []
        for seq in req.seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq, "error")
                seq.grammar = None
                out = req.output(seq, [], "", [])
                out.error = error
                outs.append(out)
        for index in range(len(req.seqs), req.params.n):  # samples never forked from the parent
            n_prompt = len(req.prompt_ids)
            outs.append(SeqOutput(req.request_id, index, [], "", [], True, "error", n_prompt, 0, error=error))
        return outs

    def _contain(
        self, seq: Sequence, outputs: list[SeqOutput], stage: str, fn: Callable[..., T], *args: object
    ) -> tuple[bool, T | None]:
        """`fn(*args)` for one sequence's request: (True, its result), or (False, None) when it raised —
        then that request is failed (its outputs go to `outputs`) and the others go on."""
        try:
            return True, fn(*args)
        except Exception as e:
            req = self.requests.get(seq.request_id)
            if req is not None:
                outputs += self._fail(req, e, stage)
            return False, None

    def _sample(
        self, logits: torch.Tensor, seqs: list[Sequence], outputs: list[SeqOutput]
    ) -> list[tuple[SampleResult, int] | tuple[None, int]]:
        """Sample one token per row: (result, row in it) per sequence. If the batch fails, each row is
        sampled alone, and a row that fails alone fails its request (result None)."""
        requests = [
            SampleRequest(
                s.params,
                s.prompt_ids,
                s.output_ids,
                s.generator,
                s.stop_ids,
                s.grammar,
                s.thinking.forced() if s.thinking is not None else None,
            )
            for s in seqs
        ]
        try:
            result = sample(logits, requests)
            return [(result, b) for b in range(len(seqs))]
        except Exception:
            log.warning("sampling a batch of %d failed; sampling each row alone", len(seqs))
        out: list[tuple[SampleResult, int] | tuple[None, int]] = []
        for b, (seq, request) in enumerate(zip(seqs, requests, strict=True)):
            _, alone = self._contain(seq, outputs, "sampling", sample, logits[b : b + 1], [request])
            out.append((alone, 0))
        return out

    def _expand_forks(self, step: StepLogits, outputs: list[SeqOutput]) -> tuple[list[Sequence], list[int]]:
        """Sequences to sample and the logits row of each; n > 1 parents whose prefill just completed are
        forked here so that every child samples its own first token from the shared prompt logits."""
        seqs: list[Sequence] = []
        rows: list[int] = []
        for row, seq in enumerate(step.sample_seqs):
            if seq.request_id not in self.requests or seq.is_finished:
                continue
            forked: list[Sequence] | None = []
            if seq.fork_pending and not seq.output_ids:
                ok, forked = self._contain(seq, outputs, "forking its n samples", self._fork, seq)
                if not ok:
                    continue
            for s in (seq, *(forked or ())):
                seqs.append(s)
                rows.append(row)
        return seqs, rows

    def _fork(self, parent: Sequence) -> list[Sequence]:
        req = self.requests[parent.request_id]
        children = [
            self.admission.new_sequence(req, len(req.seqs), parent) for _ in range(parent.fork_pending)
        ]
        fork = self.scheduler.fork(parent, children)
        self.runner.copy_blocks(fork.block_copies)
        self.runner.copy_states(fork.state_copies)
        return fork.children

    def _prompt_logprobs(
        self, step: StepLogits, scheduled: list[Sequence], outputs: list[SeqOutput]
    ) -> dict[int, list[TokenLogprob | None]]:
        """Accumulate prompt logprobs chunk by chunk; returned complete with the first sampled token."""
        done: dict[int, list[TokenLogprob | None]] = {}
        if not step.prompt:
            return done
        by_id = {s.seq_id: s for s in scheduled}
        for seq_id, (first, logits) in step.prompt.items():
            seq = by_id.get(seq_id)
            if seq is not None:
                self._contain(seq, outputs, "scoring its prompt", score_prompt, seq, first, logits)
        for seq in step.sample_seqs:
            if seq.is_finished:
                continue
            if seq.params.prompt_logprobs is not None and not seq.output_ids:
                done[seq.seq_id] = seq.prompt_logprobs or [None]
        return done

    # ------------------------------------------------------------------------------------------ stats

    @property
    def num_running(self) -> int:
        return self.scheduler.num_running

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    @property
    def cache_usage(self) -> float:
        return self.cache.usage

    @property
    def prefix_cache_queries(self) -> int:
        """Prompt tokens looked up in the prefix cache (first admissions; cumulative)."""
        return self.cache.queries

    @property
    def prefix_cache_hits(self) -> int:
        """Of those, tokens found cached (cumulative)."""
        return self.cache.hits
