"""Mamba1 mixer (selective scan; Mamba, Falcon-Mamba, Jamba): in_proj → [x | z]; causal depthwise conv + SiLU
over x; x_proj → [dt | B | C] (RMS-normed for Falcon-Mamba (weightless) and Jamba (weighted)); dt_proj;
the selective scan with a state [Di, N] per sequence (+ D skip), gated by silu(z); out_proj.

One step's flat layout (see `ForwardBatch`): the conv and the scan each run
- with no cache (reference forward): every sequence from zero states through the torch references
  (`causal_conv_prefill_reference`, `mamba1_scan_prefill_reference`: transformers' sequential scan);
- for decode rows (the first Bd sequences, one token each): the kernel ops `causal_conv_step` and
  `mamba1_scan_step`, states advanced in place at `state_slots` — with x_proj, `mamba1_dt_bc` and dt_proj
  between them, all kernel ops, so the recorded decode plan holds the layer;
- for prefill rows: `causal_conv_prefill` and `mamba1_scan_prefill`, each sequence from its slot's states
  when `context_len > 0` (a chunked prefill continues) or from zeros; cut at the prefix cache's mid-chunk
  save points when the batch asks for any (model/segments.py: the conv's rounds save the conv state, the
  scan's the SSM state).

Parameters (HF `MambaMixer` names, except A): in_proj [2·Di, D] (+ bias), conv1d.weight [Di, 1, K] (+ bias),
x_proj [R + 2N, Di], dt_proj [Di, R] + bias, A [Di, N] (= −exp(A_log), made at load; float32), D [Di],
out_proj [D, Di] (+ bias); Jamba's norm weights dt_norm [R], b_norm / c_norm [N].
Shapes: T tokens, D hidden, Di inner channels, N state size, R dt rank, K conv kernel, S state slots.
Numerics: the scan in float32 (as HF), conv and projections in the weights' dtype.

`SPEC` declares the kind (model/mixer_spec.py): per sequence, conv [K − 1, Di] in the model dtype and SSM
[Di, N] float32 state (a prefix is a snapshot: a copy of the state slot's rows); in_proj, x_proj, dt_proj and
out_proj quantizable; tensor parallel splits the channels (in_proj's x and z rows, the conv, dt_proj's rows,
A, D, x_proj's and out_proj's columns): x_proj then sees this rank's channels only, and its output is
all-reduced before the split; the decode plan may hold it, a CUDA graph not.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from torch import nn

from blazr.config import Mamba1Config
from blazr.distributed.split import check_divisible, rank0_only, split_block, split_segments
from blazr.kernels import ops
from blazr.model.mixer_spec import MixerSpec
from blazr.model.qlinear import Linear
from blazr.model.segments import Segment, run_in_segments
from blazr.state.batch import ForwardBatch
from blazr.state.kv_cache import LayerCache
from blazr.state.layout import CacheTensor, Snapshot

if TYPE_CHECKING:
    from blazr.distributed.group import TPGroup

SSM_STATE_DTYPE = torch.float32


class Mamba1(nn.Module):
    """The Mamba1 mixer of one layer. `forward(x [T, D], batch, cache) → [T, D]`."""

    def __init__(self, cfg: Mamba1Config, hidden_size: int, tp: TPGroup | None = None) -> None:
        """`tp`: this layer is one tensor-parallel shard (cfg holds its channels): x_proj's partial output
        is all-reduced."""
        super().__init__()
        self.cfg, self.tp = cfg, tp
        Di, N, R, K = cfg.d_inner, cfg.state_size, cfg.dt_rank, cfg.conv_kernel
        self.in_proj = Linear(hidden_size, 2 * Di, bias=cfg.has_proj_bias)
        self.conv1d = nn.Conv1d(Di, Di, K, groups=Di, bias=cfg.has_conv_bias)  # weight [Di, 1, K]
        self.x_proj = Linear(Di, R + 2 * N, bias=False)
        self.dt_proj = Linear(R, Di, bias=True)
        # HF's initialisation (A = −(1..N) per channel, D = 1); loading overwrites it
        self.A = nn.Parameter(-torch.arange(1, N + 1, dtype=torch.float32).repeat(Di, 1))
        self.A.keep_float32 = True  # the loader keeps it in float32 whatever the dtype (as HF's −exp(A_log))
        self.D = nn.Parameter(torch.ones(Di))
        self.out_proj = Linear(Di, hidden_size, bias=cfg.has_proj_bias)
        if cfg.has_dt_bc_norm and cfg.has_norm_weights:
            self.dt_norm = nn.Parameter(torch.ones(R))
            self.b_norm = nn.Parameter(torch.ones(N))
            self.c_norm = nn.Parameter(torch.ones(N))
        else:
            self.dt_norm = self.b_norm = self.c_norm = None

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: LayerCache | None) -> torch.Tensor:
        cfg, T, decode = self.cfg, x.shape[0], batch.is_decode_only
        Di = cfg.d_inner
        xz = self.in_proj(x, decode=decode)  # [T, 2·Di]
        xs, z = xz[:, :Di], xz[:, Di:]  # column views
        w, b = self.conv1d.weight[:, 0], self.conv1d.bias  # [Di, K]
        is_cached = cache is not None and batch.state_slots is not None
        nd = batch.num_decodes if is_cached else 0
        if nd and nd == T:  # decode only: kernel ops throughout
            xc = ops.causal_conv_step(xs, None, None, batch.state_slots, w, b, cache.conv, True)
            dt_raw, bc = self._dt_bc(xc, decode)
            y = ops.mamba1_scan_step(xc, dt_raw, bc, z, batch.state_slots, self.A, self.D, cache.ssm)
            return self.out_proj(y, decode=decode)
        if not is_cached:  # the reference forward: every sequence from zero states, in throw-away pools
            Bn, fresh, slots = (
                batch.num_seqs,
                [True] * batch.num_seqs,
                torch.arange(batch.num_seqs, device=x.device),
            )
            conv0 = xz.new_zeros(Bn, cfg.conv_kernel - 1, Di)
            xc = ops.causal_conv_prefill_reference(
                xs, None, None, batch.query_lens, slots, fresh, w, b, conv0, True
            )
            dt_raw, bc = self._dt_bc(xc, decode)
            ssm0 = x.new_zeros(Bn, Di, cfg.state_size, dtype=SSM_STATE_DTYPE)
            y = ops.mamba1_scan_prefill_reference(
                xc, dt_raw, bc, z, batch.query_lens, slots, fresh, self.A, self.D, ssm0
            )
            return self.out_proj(y, decode=decode)
        xc = xz.new_empty(T, Di)
        slots = batch.state_slots
        if nd:
            xc[:nd] = ops.causal_conv_step(xs[:nd], None, None, slots[:nd], w, b, cache.conv, True)
        fresh = [c == 0 for c in batch.context_lens[nd:]]
        if not batch.state_saves:
            qlens = batch.query_lens[nd:]
            xc[nd:] = ops.causal_conv_prefill(
                xs[nd:], None, None, qlens, slots[nd:], fresh, w, b, cache.conv, True
            )
        else:
            xsp = xs[nd:]

            def conv(seg: Segment) -> torch.Tensor:
                return ops.causal_conv_prefill(
                    seg.take(xsp), None, None, seg.lens, seg.slots, seg.fresh, w, b, cache.conv, True
                )

            run_in_segments(batch, conv, xc[nd:], (cache.conv,))
        dt_raw, bc = self._dt_bc(xc, decode)
        y = xc.new_empty(T, Di)
        if nd:
            y[:nd] = ops.mamba1_scan_step(
                xc[:nd], dt_raw[:nd], bc[:nd], z[:nd], slots[:nd], self.A, self.D, cache.ssm
            )
        if not batch.state_saves:
            y[nd:] = ops.mamba1_scan_prefill(
                xc[nd:], dt_raw[nd:], bc[nd:], z[nd:], batch.query_lens[nd:], slots[nd:], fresh, self.A,
                self.D, cache.ssm,
            )  # fmt: skip
        else:
            parts = xc[nd:], dt_raw[nd:], bc[nd:], z[nd:]

            def scan(seg: Segment) -> torch.Tensor:
                xcs, dts, bcs, zs = (seg.take(t) for t in parts)
                return ops.mamba1_scan_prefill(
                    xcs, dts, bcs, zs, seg.lens, seg.slots, seg.fresh, self.A, self.D, cache.ssm
                )

            run_in_segments(batch, scan, y[nd:], (cache.ssm,))
        return self.out_proj(y, decode=decode)

    def _dt_bc(self, xc: torch.Tensor, decode: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """xc [T, Di] → (dt_proj's output [T, Di], [B | C] [T, 2N]): x_proj (all-reduced across ranks), the
        split and its norms, dt_proj."""
        cfg = self.cfg
        dbc = self.x_proj(xc, decode=decode)  # [T, R + 2N]
        if self.tp is not None:
            dbc = self.tp.all_reduce(dbc)
        dt, bc = ops.mamba1_dt_bc(
            dbc, cfg.dt_rank, cfg.state_size, self.dt_norm, self.b_norm, self.c_norm, cfg.has_dt_bc_norm,
            cfg.norm_eps,
        )  # fmt: skip
        return self.dt_proj(dt, decode=decode), bc


# ------------------------------------------------------------------------------------------- the kind


def _cache(cfg: Mamba1Config) -> tuple[CacheTensor, ...]:
    conv = CacheTensor("conv", (cfg.conv_kernel - 1, cfg.d_inner), "model")
    return conv, CacheTensor("ssm", (cfg.d_inner, cfg.state_size), SSM_STATE_DTYPE)


def _shard(cfg: Mamba1Config, world: int, where: str) -> Mamba1Config:
    check_divisible(cfg.d_inner, world, f"{where} Mamba1 channels")
    return replace(cfg, d_inner=cfg.d_inner // world)


def _slice(cfg: Mamba1Config, leaf: str, t: torch.Tensor, rank: int, world: int) -> torch.Tensor | None:
    if leaf.startswith("in_proj."):
        return split_segments(t, [cfg.d_inner] * 2, [True, True], rank, world)
    if leaf.startswith(("conv1d.", "dt_proj.")) or leaf in ("A", "D"):
        return split_block(t, 0, rank, world)
    if leaf in ("x_proj.weight", "out_proj.weight"):
        return split_block(t, 1, rank, world)
    if leaf == "out_proj.bias":
        return rank0_only(t, rank)
    return None


SPEC = MixerSpec(
    config=Mamba1Config,
    prefix="mamba1",
    build=lambda cfg, hidden_size, rope_for, tp: Mamba1(cfg, hidden_size, tp),
    cache=_cache,
    snapshot=Snapshot.STATE_SLOT,
    linears=("in_proj", "x_proj", "dt_proj", "out_proj"),
    float_linears=(),
    fused=lambda cfg, leaf: None,
    shard=_shard,
    slice=_slice,
    is_plan_safe=True,
    chains_rows=True,  # its decode step runs rows that share a slot in row order
    graph_windows=None,
)
