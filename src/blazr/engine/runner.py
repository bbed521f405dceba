"""ModelRunner: owns the model and its cache tensors; turns a ScheduledBatch into tensors, runs one forward
and returns the logit rows to sample from. The bookkeeping of the cache (which blocks and state slots a
sequence holds, what is cached) belongs to the scheduler's CacheManager; a step brings its block tables,
state slots and the state copies it needs (`CacheOps`: snapshot restores before the forward, snapshot saves
inside it — mid-chunk, by the Mamba2 layers — or after it).

Layout per step: decodes first (one token each), then prefill chunks. For each sequence the new tokens are
positions [num_computed, num_computed + num_new); their cache slots come from the block table, and the
keys it may attend to are positions [0, num_computed + num_new).

KV groups (state/layout.py): each group's slots come from the sequence's block table of that group, and the
batch carries one slot_mapping and kv_indices per group (`ForwardBatch.groups`); a sliding group's table
lacks the blocks its window left (`DROPPED`), whose positions are pointed at the first slot of the first
block it holds (`group_kv_indices`).

The decodes of a step run as one recorded kernel plan when the model allows it (`DecodePlan`: the model's
own forward captured on CPU float32 — attention, Mamba2 and their hybrids), as a captured CUDA graph on
CUDA (`GraphDecoder`: pure-attention models), else —
with quantized layers — the eager model on the decodes alone, a decode-only batch (every layer, linears
included, takes its decode path from `batch.is_decode_only`); then the prefill chunks, if any, run the
eager model. A decode token therefore takes the same path whatever else shares its step (quantized layers
compute differently in the decode kernels than in the prefill GEMMs).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from blazr.config import EngineConfig
from blazr.engine.cuda_graphs import GraphDecoder, is_supported
from blazr.engine.decode_plan import DecodePlan
from blazr.engine.scheduler import ScheduledBatch
from blazr.engine.sequence import Sequence
from blazr.model.mixers import cache_layout, chains_rows
from blazr.model.model import CausalLM
from blazr.model.qlinear import QuantizedLinear
from blazr.state.allocator import DROPPED
from blazr.state.batch import ForwardBatch, pad_kv_indices
from blazr.state.budget import CachePlan, plan_cache
from blazr.state.kv_cache import ModelCache

if TYPE_CHECKING:
    from blazr.distributed.group import TPGroup

log = logging.getLogger("blazr.engine")


class TensorParallelStepError(RuntimeError):
    """A tensor-parallel step failed on rank 0: the other ranks may wait in a collective it never reached,
    so no later step can run (the engine treats it as fatal; the server exits for a supervisor to restart
    every rank)."""

    is_fatal = True


@dataclass
class StepLogits:
    """Logits of one step: `sample[i]` belongs to `sample_seqs[i]` (sequences whose next token is due; for
    one carrying drafts, the row of its last token); `drafts[seq]` the rows of a sequence's drafted
    positions ([d, V]: row i follows draft i); `prompt[seq]` the rows for prompt positions of sequences
    that asked for prompt logprobs."""

    sample_seqs: list[Sequence]
    sample: torch.Tensor  # [n, V] float32
    prompt: dict[int, tuple[int, torch.Tensor]]  # seq_id → (first position predicted, [m, V])
    pooled: dict[int, torch.Tensor | None] = field(default_factory=dict)  # seq_id → this chunk's part
    drafts: dict[int, torch.Tensor] = field(default_factory=dict)  # seq_id → [d, V]

    @staticmethod
    def split(
        logits: torch.Tensor,
        sample_seqs: list[Sequence],
        prompt_rows: dict[int, tuple[int, int, int]],
        draft_rows: dict[int, tuple[int, int]] | None = None,
    ) -> StepLogits:
        """The rows of `logits` ([prompt-logprob rows; sampled rows; drafted rows], as `build` orders
        logits_indices)."""
        prompt = {sid: (first, logits[r0 : r0 + cnt]) for sid, (first, r0, cnt) in prompt_rows.items()}
        num_prompt_rows = sum(cnt for _, _, cnt in prompt_rows.values())
        d0 = num_prompt_rows + len(sample_seqs)
        drafts = {sid: logits[d0 + r0 : d0 + r0 + d] for sid, (r0, d) in (draft_rows or {}).items()}
        return StepLogits(sample_seqs, logits[num_prompt_rows:d0], prompt, drafts=drafts)


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        engine_cfg: EngineConfig,
        device: torch.device,
        dtype: torch.dtype,
        kv_dtype: torch.dtype | None = None,
        tp: TPGroup | None = None,
        cache_plan: CachePlan | None = None,
    ) -> None:
        """`kv_dtype`: element type of the attention K/V pools (default: `dtype`). `tp`: the model is one
        tensor-parallel shard: every step is broadcast to the other ranks, whose runners mirror it
        (`mirror_step`; distributed/worker.py), and runs eagerly (the recorded decode plan and CUDA graphs
        hold no collectives). `cache_plan`: the pools' sizes (a rank > 0 takes rank 0's)."""
        self.model = model
        self.cfg = model.cfg
        self.engine_cfg = engine_cfg
        self.device = device
        self.dtype = dtype
        self.tp = tp if tp is not None and tp.world > 1 else None
        self.is_tp_in_step = True  # False once a step failed part-way: the ranks may wait in a collective
        layout = cache_layout(self.cfg)
        plan = self.cache_plan = cache_plan or plan_cache(layout, engine_cfg, dtype, kv_dtype, device)
        self.block_size = bs = engine_cfg.block_size
        # one block past the plan's is never handed out: the padding rows of graph-captured steps write there
        self.cache = ModelCache(
            layout, tuple((n + 1) * bs for n in plan.group_blocks), plan.num_state_rows, dtype, device,
            kv_dtype=kv_dtype,
        )  # fmt: skip
        self.num_groups = layout.num_groups
        self.is_paged = self.cache.has_paged
        self.has_state = self.cache.has_state
        self.has_quantized = any(isinstance(m, QuantizedLinear) for m in model.modules())
        self.chains_rows = chains_rows(self.cfg)  # a sequence's consecutive tokens may run as decode rows
        self.decode_plan = (
            None if self.tp else DecodePlan.create(model, self.cache, engine_cfg, device, dtype)
        )
        self.graphs: GraphDecoder | None = None
        self._pool_rows: dict[int, tuple[int, int, int, bool]] = {}  # the last `build`'s embedding rows
        if self.decode_plan is None and self.is_paged and is_supported(self.cfg) and not self.tp:
            self.graphs = GraphDecoder.create(model, self.cache, engine_cfg, self._pad_slot(), device)

    def _pad_slot(self) -> tuple[int, ...] | None:
        """Per KV group, the first slot of the block reserved for the padding rows of graph-captured decode
        steps (None when graphs cannot run here)."""
        if not self.engine_cfg.cuda_graphs or self.device.type != "cuda" or not self.is_paged:
            return None
        return self._pad_slots()

    def _pad_slots(self) -> tuple[int, ...]:
        return tuple(n * self.block_size for n in self.cache_plan.group_blocks)

    def enable_graphs(self, capture) -> GraphDecoder | None:
        """Use graph-captured decode steps with this capture mechanism (tests: an eager stand-in on the CPU),
        padding into the reserved block; returns the decoder (None for an unsupported model)."""
        assert self.is_paged
        self.graphs = GraphDecoder.create(
            self.model, self.cache, self.engine_cfg, self._pad_slots(), self.device, capture,
        )  # fmt: skip
        return self.graphs

    # ------------------------------------------------------------------------------------ batch build

    def build(
        self, sched: ScheduledBatch
    ) -> tuple[torch.Tensor, ForwardBatch, list[Sequence], dict, dict[int, tuple[int, int]]]:
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[list[int]] = [[] for _ in range(self.num_groups)]  # per KV group
        prompt_logit_rows: list[int] = []  # hidden rows whose logits score prompt tokens (prompt logprobs)
        sample_rows: list[int] = []  # hidden rows whose logits are sampled
        sample_seqs: list[Sequence] = []
        prompt_rows: dict[int, tuple[int, int, int]] = {}  # seq_id → (first predicted pos, offset, count)
        pool_rows: dict[int, tuple[int, int, int, bool]] = {}  # seq_id → (row, count, position, is last)
        draft_logit_rows: list[int] = []  # hidden rows after each drafted token (speculative decoding)
        draft_rows: dict[int, tuple[int, int]] = {}  # seq_id → (offset in draft_logit_rows, drafts)
        context_lens, query_lens = [], []
        state_saves = []  # (row, offset, snapshot slot): the state after `offset` of the row's tokens
        for b, (seq, n) in enumerate(zip(sched.seqs, sched.num_new_tokens, strict=True)):
            start = seq.num_computed_tokens
            row0 = len(input_ids)
            input_ids.extend(seq.step_tokens(start, n))
            positions.extend(range(start, start + n))
            state_saves += [(b, k, dst) for k, dst in sched.cache_ops.saves.get(seq.seq_id, ()) if k < n]
            if self.is_paged:
                for group_slots, table in zip(slots, seq.block_tables, strict=True):
                    group_slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
            context_lens.append(start)
            query_lens.append(n)
            if seq.params.prompt_logprobs is not None and start < seq.num_prompt_tokens - 1:
                # the row of position p predicts token p + 1; prompt tokens 1.. are predicted
                count = min(start + n, seq.num_prompt_tokens - 1) - start
                prompt_rows[seq.seq_id] = (start + 1, len(prompt_logit_rows), count)
                prompt_logit_rows.extend(range(row0, row0 + count))
            if seq.params.pooling is not None:  # an embedding: its hidden rows pooled, nothing sampled
                pool_rows[seq.seq_id] = (row0, n, start, start + n == seq.num_tokens)
            elif seq.draft_ids:  # its last token's row is sampled, then each draft's verified
                u = seq.num_tokens - start  # its own tokens, then the drafts
                sample_rows.append(row0 + u - 1)
                sample_seqs.append(seq)
                draft_rows[seq.seq_id] = (len(draft_logit_rows), n - u)
                draft_logit_rows.extend(range(row0 + u, row0 + n))
            elif start + n == seq.num_tokens:
                sample_rows.append(row0 + n - 1)
                sample_seqs.append(seq)
        dev = self.device
        batch = ForwardBatch(
            positions=torch.tensor(positions, dtype=torch.long, device=dev),
            query_lens=tuple(query_lens),
            context_lens=tuple(context_lens),
            num_decodes=sched.num_decodes,
            logits_indices=torch.tensor(
                prompt_logit_rows + sample_rows + draft_logit_rows, dtype=torch.long, device=dev
            ),
        )
        if self.is_paged:
            seq_lens = [c + q for c, q in zip(context_lens, query_lens, strict=True)]
            lens = torch.tensor(seq_lens)
            addressing = []  # per KV group: (slot_mapping, kv_indices)
            for g in range(self.num_groups):
                kv_indices = self._kv_indices([s.block_tables[g] for s in sched.seqs], max(seq_lens))
                slot_mapping = torch.tensor(slots[g], dtype=torch.long, device=dev)
                addressing.append((slot_mapping, pad_kv_indices(kv_indices, lens).to(dev)))
            batch.slot_mapping, batch.kv_indices = addressing[0]
            batch.groups = tuple(addressing[1:])
            batch.decode_lens = torch.tensor(seq_lens[: sched.num_decodes], dtype=torch.long, device=dev)
        if self.has_state:
            batch.state_slots = torch.tensor([s.state_slot for s in sched.seqs], dtype=torch.long, device=dev)
            batch.state_saves = tuple(state_saves)
        ids = torch.tensor(input_ids, dtype=torch.long, device=dev)
        self._pool_rows = pool_rows
        return ids, batch, sample_seqs, prompt_rows, draft_rows

    def _kv_indices(self, tables: list[list[int]], max_len: int) -> torch.Tensor:
        """[B, max_len] flat slot of every position of each block table (positions past a table's end, and
        those of its `DROPPED` blocks, at the first slot of its first held block: see the module docstring;
        callers pad past each length with `pad_kv_indices`)."""
        bs = self.block_size
        num_blocks = -(-max_len // bs)
        table = np.full((len(tables), num_blocks), DROPPED, dtype=np.int64)
        for b, t in enumerate(tables):
            row = t[:num_blocks]
            table[b, : len(row)] = row
        return group_kv_indices(table, bs, max_len)

    # -------------------------------------------------------------------------------------------- run

    @staticmethod
    def _are_plain_decodes(sched: ScheduledBatch, max_len: int) -> bool:
        """Each of the first num_decodes sequences adds its last token: one sampled row each and no
        prompt-logprob rows (those only score positions before the prompt's last). The scheduler's decodes
        always are; hand-driven batches (tests) may mark 1-token prompt chunks as decodes."""
        nd = sched.num_decodes
        return all(
            n == 1 and not seq.draft_ids and seq.num_computed_tokens + 1 == seq.num_tokens <= max_len
            for seq, n in zip(sched.seqs[:nd], sched.num_new_tokens[:nd], strict=True)
        )

    def _run_decode_plan(self, plan: DecodePlan | GraphDecoder, seqs: list[Sequence]) -> StepLogits:
        """The decode-only batch build (ids, positions, slots, block tables → kv_indices [B, L], state
        slots) and the plan's (or graphs') step. A row sequence (models whose every mixer `chains_rows`) runs
        its u tokens to compute and its d drafts as u + d rows, row i at its own position, attending to the
        positions up to it and continuing the recurrent state of the row before: attention writes every
        row's keys before any row attends and the recurrent kinds run a slot's rows in order, so this is the
        decode step's own arithmetic and a verified token is the token decoding alone would have produced."""
        bs = self.block_size
        rows: list[tuple[Sequence, int, int]] = []  # (sequence, position, token)
        own: list[int] = []  # per sequence, its tokens to compute (u)
        for seq in seqs:
            p = seq.num_computed_tokens
            own.append(seq.num_tokens - p)
            tokens = seq.step_tokens(p, own[-1] + len(seq.draft_ids))
            rows += [(seq, p + i, t) for i, t in enumerate(tokens)]
        positions = [p for _, p, _ in rows]
        ids = torch.tensor([t for _, _, t in rows])
        addressing = []  # per KV group: (slots [B], kv_indices [B, L])
        if self.is_paged:
            max_len = max(positions) + 1
            for g in range(self.num_groups):
                tables = [seq.block_tables[g] for seq, _, _ in rows]
                slots = [t[p // bs] * bs + p % bs for t, p in zip(tables, positions, strict=True)]
                addressing.append((torch.tensor(slots), self._kv_indices(tables, max_len)))
        else:
            addressing.append((torch.zeros(0, dtype=torch.long), torch.zeros(len(rows), 0, dtype=torch.long)))
        seq_lens = torch.tensor([p + 1 for p in positions])
        state = torch.tensor([s.state_slot for s, _, _ in rows]) if self.has_state else None
        (slots, kv_indices), groups = addressing[0], tuple(addressing[1:])
        logits = plan.run(ids, torch.tensor(positions), slots, kv_indices, seq_lens, state, groups)
        if len(rows) == len(seqs):
            return StepLogits(list(seqs), logits, {})
        last, drafts, r = [], {}, 0
        for seq, u in zip(seqs, own, strict=True):
            last.append(r + u - 1)  # its last own token's row is sampled; the drafts' rows follow
            if d := len(seq.draft_ids):
                drafts[seq.seq_id] = logits[r + u : r + u + d]
            r += u + d
        return StepLogits(list(seqs), logits[last], {}, drafts=drafts)

    @torch.inference_mode()
    def run(self, sched: ScheduledBatch) -> StepLogits:
        """One step: restore snapshots, the forward (decodes, then prefill chunks), save the snapshots that
        fall at the end of a sequence's new tokens."""
        ends = [
            (seq.state_slot, dst)
            for seq, n in zip(sched.seqs, sched.num_new_tokens, strict=True)
            for k, dst in sched.cache_ops.saves.get(seq.seq_id, ())
            if k == n
        ]
        if self.tp is not None:
            return self._run_parallel(sched, ends)
        self.cache.copy_state_slots(sched.cache_ops.restores)
        step = self._forward(sched)
        self.cache.copy_state_slots(ends)
        return step

    def _run_parallel(self, sched: ScheduledBatch, ends: list[tuple[int, int]]) -> StepLogits:
        """Rank 0's tensor-parallel step: the batch built once, sent to every rank, run on every shard."""
        assert self.tp is not None
        ids, batch, sample_seqs, prompt_rows, draft_rows = self.build(sched)
        restores = sched.cache_ops.restores
        try:
            self.tp.broadcast_object(("step", ids, batch, restores, ends))
            logits = self.mirror_step(ids, batch, restores, ends)
        except Exception as e:
            self.is_tp_in_step = False
            raise TensorParallelStepError(f"tensor-parallel step failed: {type(e).__name__}: {e}") from e
        return StepLogits.split(logits, sample_seqs, prompt_rows, draft_rows)

    @torch.inference_mode()
    def mirror_step(
        self,
        ids: torch.Tensor,
        batch: ForwardBatch,
        restores: list[tuple[int, int]],
        ends: list[tuple[int, int]],
    ) -> torch.Tensor:
        """One step's forward on this shard (every rank runs it; the collectives inside meet): snapshot
        restores, the forward, the logits of `batch.logits_indices` (all-gathered: the whole vocabulary on
        every rank), the end-of-chunk snapshot saves."""
        self.cache.copy_state_slots(restores)
        hidden = self.model(ids.to(self.device), batch, self.cache)
        rows = batch.logits_indices
        if rows is not None and rows.numel():
            logits = self.model.compute_logits(hidden[rows], decode=batch.is_decode_only)
        else:  # a prompt chunk with nothing to sample or score (the same on every rank: no gather)
            logits = hidden.new_empty(0, self.cfg.vocab_size, dtype=torch.float32)
        self.cache.copy_state_slots(ends)
        return logits

    def stop_workers(self) -> bool:
        """Rank 0: end the other ranks' step loops. True when they were told in step (they now wait for the
        next model: distributed/ranks.py keeps them); False when a step failed part-way or a rank is gone
        (they cannot be told anything: the caller ends them)."""
        if self.tp is None:
            return False
        tp, self.tp = self.tp, None
        if not self.is_tp_in_step:
            return False
        try:
            tp.broadcast_object(("stop",))
        except RuntimeError as e:  # gloo / NCCL: a peer closed its connection
            log.debug("tensor-parallel stop: a rank is already gone (%s)", e)
            return False
        return True

    def _num_plan_rows(self, sched: ScheduledBatch) -> int:
        """How many row sequences (they follow the decodes) the recorded plan runs with the decodes: all of
        them when every mixer chains rows and the plan holds their rows, else none (they run as chunks)."""
        plan, nd, nv = self.decode_plan, sched.num_decodes, sched.num_rows
        if plan is None or not self.chains_rows or not nv:
            return 0
        fits = sum(sched.num_new_tokens[: nd + nv]) <= plan.max_seqs and all(
            seq.num_computed_tokens + n <= plan.max_len
            for seq, n in zip(sched.seqs[nd : nd + nv], sched.num_new_tokens[nd : nd + nv], strict=True)
        )
        return nv if fits else 0

    def _forward(self, sched: ScheduledBatch) -> StepLogits:
        plan, seqs = self.decode_plan or self.graphs, sched.seqs
        nd = sched.num_decodes + self._num_plan_rows(sched)
        if nd == 0:
            return self._run_eager(sched)
        if plan is not None and self._are_plain_decodes(sched, plan.max_len):
            decoded = self._run_decode_plan(plan, seqs[:nd])
        elif self.has_quantized:  # decode tokens in a decode-only forward: the kernels, not dense copies
            nd = sched.num_decodes
            decoded = self._run_eager(sched.part(0, nd))
        else:
            return self._run_eager(sched)
        if nd == len(seqs):
            return decoded
        rest = self._run_eager(sched.part(nd, len(seqs)))
        sample = torch.cat([decoded.sample, rest.sample])
        seqs = decoded.sample_seqs + rest.sample_seqs
        prompt, drafts = {**decoded.prompt, **rest.prompt}, {**decoded.drafts, **rest.drafts}
        return StepLogits(seqs, sample, prompt, rest.pooled, drafts)

    def _run_eager(self, sched: ScheduledBatch) -> StepLogits:
        ids, batch, sample_seqs, prompt_rows, draft_rows = self.build(sched)
        hidden = self.model(ids, batch, self.cache)
        logits = self.model.compute_logits(hidden[batch.logits_indices], decode=batch.is_decode_only)
        step = StepLogits.split(logits, sample_seqs, prompt_rows, draft_rows)
        by_id = {seq.seq_id: seq for seq in sched.seqs}
        for seq_id, (row0, n, start, is_last) in self._pool_rows.items():  # embeddings: pooled, not sampled
            pooling = by_id[seq_id].params.pooling
            assert pooling is not None
            step.pooled[seq_id] = pooling.partial(hidden[row0 : row0 + n], start, is_last)
        return step

    # ---------------------------------------------------------------------------------------- forking

    def copy_blocks(self, copies: list[tuple[int, int, int]]) -> None:
        """Copy whole blocks: (KV group, src block, dst block) each."""
        bs = self.block_size
        if not copies:
            return
        if self.tp is not None and self.tp.is_driver:
            self.tp.broadcast_object(("copy_blocks", copies))
        for g in sorted({g for g, _, _ in copies}):
            pairs = [(s, d) for h, s, d in copies if h == g]
            src = torch.cat([torch.arange(s * bs, (s + 1) * bs) for s, _ in pairs]).to(self.device)
            dst = torch.cat([torch.arange(d * bs, (d + 1) * bs) for _, d in pairs]).to(self.device)
            self.cache.copy_slots(src, dst, g)

    def copy_states(self, pairs: list[tuple[int, int]]) -> None:
        if pairs and self.tp is not None and self.tp.is_driver:
            self.tp.broadcast_object(("copy_states", pairs))
        self.cache.copy_state_slots(pairs)


def group_kv_indices(table: np.ndarray, block_size: int, max_len: int) -> torch.Tensor:
    """Block tables [B, N] int64 (`DROPPED` where a sliding group let a block go, and past a table's end) →
    kv_indices [B, max_len]: each position's flat slot, a dropped position's the first slot of its row's
    first held block (written, and outside every window that reads this row: the window's mask skips it).
    In numpy: built every decode step, where torch's per-op cost was 3 % of a small model's step."""
    pos = np.arange(max_len)
    blocks = table[:, pos // block_size]  # [B, L]
    idx = blocks * block_size + pos % block_size
    is_dropped = blocks == DROPPED
    if is_dropped.any():
        first = np.take_along_axis(table, (table != DROPPED).argmax(1)[:, None], 1)  # [B, 1]
        idx = np.where(is_dropped, first * block_size, idx)
    return torch.from_numpy(idx)
