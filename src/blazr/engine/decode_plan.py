"""DecodePlan: one CPU decode step of the model — its own `forward` and `compute_logits`, recorded as a
KernelPlan (`kernels/capture.py`) and replayed by one C call per step, for every architecture whose decode
step the layers run as kernel ops (attention, MLA, Mamba2 and their hybrids; MLPs and MoE, routed experts
and shared; Granite's multipliers). There is no second copy of the forward: what the plan replays is what
the eager model does with float32 CPU activations on a decode-only batch.

The step reads static buffers: token ids, positions, cache slots, block tables (`kv_indices`, sized for
`max_model_len`), decode lengths and recurrent-state slots, [Bmax] each — cache slots and kv_indices once per
KV group (state/layout.py: a sliding window's layers address their own pool). One plan is captured per batch
size B ≤ Bmax, lazily, over the [:B] views of these buffers (the kernels capture pointers, not values); all
plans share one arena for their activations. Host-side lengths are unknown while recording: the batch's
`context_lens` is empty, so code that would read one fails the capture instead of baking in a value.

`create` returns None — and logs why — when the model's step is not kernel ops only (a layer without a
decode kernel yet, e.g. LayerNorm, or float nn.Linear weights): capture names the torch op and the line
that ran it. The runner then runs the eager model.

A row's result does not depend on B, bit for bit: every kernel computes a row by the same operations
whatever else is in the call, so a decode token is the same batched or alone.

Shapes: B rows (≤ Bmax = max_num_seqs; × (1 + 2k) with k drafted tokens per sequence on a model whose mixers
chain rows: a sequence's tokens to compute and its drafts are rows too), V vocabulary, Lmax kv_indices width
(max_model_len rounded up to blocks).
"""

from __future__ import annotations

import logging

import torch

from blazr import kernels
from blazr.config import EngineConfig
from blazr.kernels.calls import UnsupportedInput
from blazr.kernels.capture import Arena, CapturedPlan, capture
from blazr.model.mixers import chains_rows, spec_of
from blazr.model.model import CausalLM
from blazr.model.rope import RotaryEmbedding
from blazr.state.batch import ForwardBatch
from blazr.state.kv_cache import ModelCache

log = logging.getLogger("blazr")
_I64 = torch.int64


class DecodePlan:
    """Static input buffers for up to `max_seqs` decode rows and one captured plan per batch size."""

    def __init__(self, model: CausalLM, cache: ModelCache, max_seqs: int, max_len: int) -> None:
        self.model, self.cache = model, cache
        self.max_seqs, self.max_len = max_seqs, max_len
        Bm = max_seqs
        self.ids = torch.zeros(Bm, dtype=_I64)
        self.positions = torch.zeros(Bm, dtype=_I64)
        self.seq_lens = torch.ones(Bm, dtype=_I64)
        num_groups = cache.layout.num_groups
        self.group_slots = [torch.zeros(Bm, dtype=_I64) for _ in range(num_groups)]  # per KV group
        self.group_kv_indices = [torch.zeros(Bm, max_len, dtype=_I64) for _ in range(num_groups)]
        self.slot_mapping, self.kv_indices = self.group_slots[0], self.group_kv_indices[0]
        self.state_slots = torch.arange(Bm, dtype=_I64)
        self.arena = Arena()
        self._plans: dict[int, CapturedPlan] = {}
        self.num_runs = 0

    @classmethod
    def create(
        cls,
        model: CausalLM,
        cache: ModelCache,
        engine_cfg: EngineConfig,
        device: torch.device,
        dtype: torch.dtype,
    ) -> DecodePlan | None:
        """The plan for `model` on `cache`, or None when fused decode is off, not a float32 CPU model, a
        mixer's kind is not plan-safe (`MixerSpec.is_plan_safe`), the kernel library is unavailable, or the
        model's decode step is not kernel ops only (logged)."""
        if not engine_cfg.fused_decode or torch.device(device).type != "cpu" or dtype != torch.float32:
            return None
        refused = {
            s.kind for layer in model.cfg.layers for m in layer.mixers if not (s := spec_of(m)).is_plan_safe
        }
        if refused:  # an allow-list: a kind joins when its decode step is kernel ops
            log.info("fused decode off: no kernel decode step for %s", ", ".join(sorted(refused)))
            return None
        if not kernels.available():
            log.info("fused decode off: the C kernel library is unavailable")
            return None
        ropes = [m for m in model.modules() if isinstance(m, RotaryEmbedding)]
        if any(r.cos.shape[0] < engine_cfg.max_model_len for r in ropes):
            log.info("fused decode off: positions up to max_model_len run past the rope table")
            return None
        bs = engine_cfg.block_size
        # speculative decoding: a row sequence's tokens (up to 1 + k again) and drafts (k) run as rows
        k = engine_cfg.num_speculative_tokens if chains_rows(model.cfg) else 0
        rows = engine_cfg.max_num_seqs * (1 + 2 * k)
        plan = cls(model, cache, rows, -(-engine_cfg.max_model_len // bs) * bs)
        try:
            plan._plan(1)  # records the step once: whatever the kernels do not cover fails here
        except UnsupportedInput as e:
            log.info("fused decode off for %s: %s", model.cfg.architecture, e)
            return None
        return plan

    # ----------------------------------------------------------------------------------------- record

    def _batch(self, B: int) -> ForwardBatch:
        """A decode-only batch of B sequences over the static buffers."""
        paged = self.cache.has_paged
        return ForwardBatch(
            positions=self.positions[:B],
            query_lens=(1,) * B,
            context_lens=(),  # unknown while recording (see the module docstring)
            num_decodes=B,
            logits_indices=self.positions[:0],
            slot_mapping=self.slot_mapping[:B] if paged else None,
            kv_indices=self.kv_indices[:B] if paged else None,
            state_slots=self.state_slots[:B] if self.cache.has_state else None,
            decode_lens=self.seq_lens[:B] if paged else None,
            groups=tuple(
                (sm[:B], kv[:B])
                for sm, kv in zip(self.group_slots[1:], self.group_kv_indices[1:], strict=True)
            )
            if paged
            else (),
        )

    def _record(self, B: int) -> CapturedPlan:
        batch, ids = self._batch(B), self.ids[:B]

        def step() -> list[torch.Tensor]:
            return [self.model.compute_logits(self.model(ids, batch, self.cache), decode=True)]

        try:
            return capture(step, self.arena)
        except UnsupportedInput:
            raise
        except (IndexError, ValueError) as e:  # a host-side length read (see _batch)
            raise UnsupportedInput(f"the decode step reads host-side batch lengths ({e})") from e

    @property
    def batch_sizes(self) -> list[int]:
        """The batch sizes recorded so far."""
        return sorted(self._plans)

    def _plan(self, B: int) -> CapturedPlan:
        plan = self._plans.get(B)
        if plan is None:
            plan = self._plans[B] = self._record(B)
        return plan

    # -------------------------------------------------------------------------------------------- run

    def run(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        kv_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        state_slots: torch.Tensor | None = None,
        groups: tuple[tuple[torch.Tensor, torch.Tensor], ...] = (),
    ) -> torch.Tensor:
        """One decode step of B sequences: ids, positions, slot_mapping, seq_lens, state_slots [B] int64 and
        kv_indices [B, L ≤ Lmax] (only the first seq_lens[b] entries of row b are read; the cache-less
        arguments of a model without attention may be empty); `groups`: (slot_mapping, kv_indices) of KV
        groups 1.. (sliding windows). Returns the logits [B, V] float32 — a view of the arena, valid until
        the next run."""
        B = ids.shape[0]
        width = kv_indices.shape[1] if kv_indices.dim() == 2 else 0
        if not (0 < B <= self.max_seqs and width <= self.max_len):
            raise ValueError(
                f"decode plan: {B} sequences × {width} slots, at most {self.max_seqs} × {self.max_len}"
            )
        self.ids[:B].copy_(ids)
        self.positions[:B].copy_(positions)
        if self.cache.has_paged:
            self.seq_lens[:B].copy_(seq_lens)
            for (sm, kv), dst_sm, dst_kv in zip(
                ((slot_mapping, kv_indices), *groups), self.group_slots, self.group_kv_indices, strict=True
            ):
                dst_sm[:B].copy_(sm)
                dst_kv[:B, :width].copy_(kv)
        if state_slots is not None:
            self.state_slots[:B].copy_(state_slots)
        (logits,) = self._plan(B).run()
        self.num_runs += 1
        return logits
