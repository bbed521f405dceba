"""LFM2's gated short convolution: in_proj → [B | C | x]; y = C · conv(B · x), a causal depthwise conv of
kernel L over the time axis; out_proj. Its state per sequence is the last L − 1 inputs B · x.

One step's flat layout (see `ForwardBatch`):
- no cache (reference forward): every sequence from a zero state, through the torch reference
  `causal_conv_prefill_reference`, nothing stored;
- decode rows (the first Bd sequences, one token each): one kernel op `causal_conv_step` (gates, the conv's
  taps, the state shifted in place at `state_slots`) — the recorded decode plan holds it;
- prefill rows: the kernel op `causal_conv_prefill` for all sequences, each from its slot's state when
  `context_len > 0` (a chunked prefill continues) or from zeros; cut at the prefix cache's mid-chunk save
  points when the batch asks for any (model/segments.py), the state copied to each snapshot slot.

Parameters (HF `Lfm2ShortConv` names): in_proj [3·W, D] (+ bias), conv.weight [W, 1, L] (+ bias), out_proj
[D, W] (+ bias). Shapes: T tokens, D hidden, W channels (= D; a tensor-parallel shard's part of it), L conv
kernel, S state slots. Numerics: as HF in the weights' dtype; on float32 CPU rows the kernels (taps summed
in float32 by fma, in order).

`SPEC` declares the kind (model/mixer_spec.py): conv state [L − 1, W] per sequence in the model dtype (a
prefix is a snapshot: a copy of the state slot's row); `in_proj` and `out_proj` quantizable; tensor parallel
splits the channels (in_proj's B, C and x rows, the conv's channels, out_proj's columns); the decode plan may
hold it, a CUDA graph not.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from blazr.config import ShortConvConfig
from blazr.distributed.split import check_divisible, rank0_only, split_block, split_segments
from blazr.kernels import ops
from blazr.model.mixer_spec import MixerSpec
from blazr.model.qlinear import Linear
from blazr.model.segments import Segment, run_in_segments
from blazr.state.batch import ForwardBatch
from blazr.state.kv_cache import LayerCache
from blazr.state.layout import CacheTensor, Snapshot


class ShortConv(nn.Module):
    """The gated short-conv mixer of one layer. `forward(x [T, D], batch, cache) → [T, D]`."""

    def __init__(self, cfg: ShortConvConfig, hidden_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        W, L = cfg.width, cfg.conv_kernel
        self.in_proj = Linear(hidden_size, 3 * W, bias=cfg.has_bias)
        self.conv = nn.Conv1d(W, W, L, groups=W, bias=cfg.has_bias)  # weight [W, 1, L]
        self.out_proj = Linear(W, hidden_size, bias=cfg.has_bias)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: LayerCache | None) -> torch.Tensor:
        W, T, decode = self.cfg.width, x.shape[0], batch.is_decode_only
        bcx = self.in_proj(x, decode=decode)  # [T, 3W]
        gin, gout, u = bcx[:, :W], bcx[:, W : 2 * W], bcx[:, 2 * W :]  # B, C, x: column views
        w, b = self.conv.weight[:, 0], self.conv.bias  # [W, L]
        is_cached = cache is not None and batch.state_slots is not None
        nd = batch.num_decodes if is_cached else 0
        if nd and nd == T:  # decode only: one kernel op
            y = ops.causal_conv_step(u, gin, gout, batch.state_slots, w, b, cache.conv, False)
            return self.out_proj(y, decode=decode)
        y = bcx.new_empty(T, W)
        if nd:
            y[:nd] = ops.causal_conv_step(
                u[:nd], gin[:nd], gout[:nd], batch.state_slots[:nd], w, b, cache.conv, False
            )
        if not is_cached:  # the reference forward: every sequence from a zero state, in throw-away pools
            B = batch.num_seqs
            state = bcx.new_zeros(B, self.cfg.conv_kernel - 1, W)
            y = ops.causal_conv_prefill_reference(
                u,
                gin,
                gout,
                batch.query_lens,
                torch.arange(B, device=x.device),
                [True] * B,
                w,
                b,
                state,
                False,
            )
        elif not batch.state_saves:  # prefill rows: the kernel op, final states left in the slots
            fresh = [c == 0 for c in batch.context_lens[nd:]]
            y[nd:] = ops.causal_conv_prefill(
                u[nd:], gin[nd:], gout[nd:], batch.query_lens[nd:], batch.state_slots[nd:], fresh, w, b,
                cache.conv, False,
            )  # fmt: skip
        else:  # cut at the prefix cache's save points

            def run(seg: Segment) -> torch.Tensor:
                rows = seg.take(bcx[nd:])  # [n, 3W]: its column views share one stride
                return ops.causal_conv_prefill(
                    rows[:, 2 * W :], rows[:, :W], rows[:, W : 2 * W], seg.lens, seg.slots, seg.fresh, w, b,
                    cache.conv, False,
                )  # fmt: skip

            run_in_segments(batch, run, y[nd:], (cache.conv,))
        return self.out_proj(y, decode=decode)


# ------------------------------------------------------------------------------------------- the kind


def _shard(cfg: ShortConvConfig, world: int, where: str) -> ShortConvConfig:
    check_divisible(cfg.width, world, f"{where} short-conv channels")
    return replace(cfg, width=cfg.width // world)


def _slice(cfg: ShortConvConfig, leaf: str, t: torch.Tensor, rank: int, world: int) -> torch.Tensor | None:
    if leaf.startswith("in_proj."):
        return split_segments(t, [cfg.width] * 3, [True] * 3, rank, world)
    if leaf.startswith("conv."):
        return split_block(t, 0, rank, world)
    if leaf == "out_proj.weight":
        return split_block(t, 1, rank, world)
    if leaf == "out_proj.bias":
        return rank0_only(t, rank)
    return None


SPEC = MixerSpec(
    config=ShortConvConfig,
    prefix="conv",
    build=lambda cfg, hidden_size, rope_for, tp: ShortConv(cfg, hidden_size),
    cache=lambda cfg: (CacheTensor("conv", (cfg.conv_kernel - 1, cfg.width), "model"),),
    snapshot=Snapshot.STATE_SLOT,
    linears=("in_proj", "out_proj"),
    float_linears=(),
    fused=lambda cfg, leaf: None,
    shard=_shard,
    slice=_slice,
    is_plan_safe=True,
    chains_rows=True,  # its decode step runs rows that share a slot in row order
    graph_windows=None,
)
