"""Mamba2 mixer: in_proj → causal depthwise conv + SiLU over [x | B | C] → SSD scan (+ D skip) → gated RMSNorm
→ out_proj. Standard causal SSD (HF `Mamba2Mixer` / state-spaces `Mamba2`), with oxidizr's options (biases,
dt clamp, full-width or grouped gated norm) selected by `Mamba2Config`.

One step's flat layout (see `ForwardBatch`):
- no cache (reference forward): every sequence runs from zero state and nothing is stored;
- decode rows (the first Bd sequences, one token each): one batched recurrent step, the kernel op
  `mamba2_step` (conv step, dt, state update and D skip; `cache.conv` / `cache.ssm` advanced in place at
  `state_slots`; its torch reference `mamba2_step_reference` where the C kernels do not apply);
- prefill rows: all sequences in one kernel op `mamba2_prefill` (a sequential scan in C; its torch
  reference `mamba2_prefill_reference` runs the chunked SSD of `ssd.py`), each starting from its slot's
  states when `context_len > 0` (a chunked prefill continues) or from zeros when it is 0 (the slot may hold
  a previous owner's state), its final conv and SSM states written back to the slot. A prefix-cache
  snapshot inside a chunk (`batch.state_saves`) splits the scan there (model/segments.py): the sequences
  run segment by segment, and after each the slot's states are copied to the snapshot slot.

Parameters (HF names): in_proj [2·Di + 2·G·N + H, D] split as [z | xBC | dt]; conv1d.weight [Cd, 1, K]
(+ bias); dt_bias, A_log, D [H]; norm.weight [Di]; out_proj [D, Di].
Shapes: T tokens, D hidden, H heads, P head dim, Di = H·P, G groups, N state, K conv kernel,
Cd = Di + 2·G·N conv channels, S state slots, Bd decode rows, n tokens of one prefill sequence.
Numerics: conv + SiLU in the weights' dtype, as HF (decode accumulates its K taps in float32, then rounds);
dt = clamp(softplus(dt_raw + dt_bias), dt_min, dt_max), the scan, D skip and gated norm in float32, cast back
to the input dtype before out_proj. Two deliberate differences from HF's torch path: softplus(dt) is float32
(HF: model dtype; identical for float32 models), and the decode step clamps dt too (HF's recurrent step
ignores `time_step_limit`, so its cached decode disagrees with its own full forward when a limit is set).

`SPEC` declares the kind (model/mixer_spec.py): per sequence, conv [Cd, K-1] in the model dtype and SSM
[H, P, N] float32 state (a prefix is a snapshot: a copy of the state slot's rows); `in_proj` and `out_proj`
quantizable; tensor parallel splits the heads (in_proj's z | x | dt rows, conv's x channels, dt_bias, A_log,
D, the norm, out_proj's columns) and B and C when the groups divide (else one group, replicated); conv and
SSM state per rank follow from the sizes, and a gated norm spanning the whole width reduces its sum of
squares across ranks (model/norm.py); the decode plan may hold it, a CUDA graph not.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from torch import nn

from blazr.config import Mamba2Config
from blazr.distributed.split import check_divisible, groups_split, rank0_only, split_block, split_segments
from blazr.kernels import ops
from blazr.model.mixer_spec import MixerSpec
from blazr.model.norm import GatedRMSNorm
from blazr.model.qlinear import Linear
from blazr.model.segments import Segment, run_in_segments
from blazr.state.batch import ForwardBatch
from blazr.state.kv_cache import LayerCache
from blazr.state.layout import CacheTensor, Snapshot

if TYPE_CHECKING:
    from blazr.distributed.group import TPGroup

SSM_STATE_DTYPE = torch.float32


class Mamba2(nn.Module):
    """The Mamba2 (SSD) mixer of one layer. `forward(x [T, D], batch, cache) → [T, D]`."""

    def __init__(self, cfg: Mamba2Config, hidden_size: int, tp: TPGroup | None = None) -> None:
        """`tp`: this layer is one tensor-parallel shard (cfg holds the shard's heads); only a gated norm
        spanning the whole width needs it (its statistics are reduced across ranks)."""
        super().__init__()
        self.cfg = cfg
        H, Di, Cd, K = cfg.num_heads, cfg.d_inner, cfg.conv_dim, cfg.conv_kernel
        self.in_proj = Linear(hidden_size, Di + Cd + H, bias=cfg.has_in_proj_bias)
        self.conv1d = nn.Conv1d(Cd, Cd, K, groups=Cd, bias=cfg.has_conv_bias)  # weight [Cd, 1, K]
        # HF's initialisation (A = -(1..H), D = 1, dt log-spread over [1e-3, 1e-1]); loading overwrites it.
        dt_init = torch.exp(torch.linspace(math.log(1e-3), math.log(1e-1), H))
        self.dt_bias = nn.Parameter(dt_init + torch.log(-torch.expm1(-dt_init)))  # softplus⁻¹
        self.A_log = nn.Parameter(torch.log(torch.arange(1, H + 1, dtype=torch.float32)))
        self.D = nn.Parameter(torch.ones(H))
        norm_tp = tp if cfg.norm_spans_ranks else None
        group = cfg.norm_group_size or Di
        self.norm = (
            GatedRMSNorm(Di, group, cfg.norm_eps, cfg.is_norm_before_gate, norm_tp)
            if cfg.has_gated_norm
            else None
        )
        self.out_proj = Linear(Di, hidden_size, bias=cfg.has_out_proj_bias)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: LayerCache | None) -> torch.Tensor:
        cfg = self.cfg
        H, P, Di = cfg.num_heads, cfg.head_dim, cfg.d_inner
        T = x.shape[0]
        zxd = self.in_proj(x, decode=batch.is_decode_only)  # [T, Di + Cd + H]
        z, xBC, dt_raw = zxd.split([Di, cfg.conv_dim, H], dim=-1)

        is_cached = cache is not None and batch.state_slots is not None
        nd = batch.num_decodes if is_cached else 0
        conv_w, conv_b = self.conv1d.weight[:, 0], self.conv1d.bias
        if nd:  # one token per sequence: the fused step (kernel op), D skip included
            yd = ops.mamba2_step(
                xBC[:nd], dt_raw[:nd], batch.state_slots[:nd], conv_w, conv_b,
                cache.conv, self.dt_bias, self.A_log, self.D, cache.ssm, cfg.n_groups, cfg.dt_min, cfg.dt_max,
            )  # fmt: skip
        if nd and nd == T:  # decode only
            return self._output(yd.view(T, Di), z, x.dtype, batch.is_decode_only)
        y = x.new_empty(T, H, P, dtype=torch.float32)
        if nd:
            y[:nd] = yd
        if is_cached and not batch.state_saves:  # prefill rows: the kernel op, final states left in the slots
            fresh = [c == 0 for c in batch.context_lens[nd:]]  # context 0: the slot may hold an old owner's
            y[nd:] = ops.mamba2_prefill(
                xBC[nd:], dt_raw[nd:], batch.query_lens[nd:], batch.state_slots[nd:], fresh, conv_w, conv_b,
                cache.conv, self.dt_bias, self.A_log, self.D, cache.ssm, cfg.n_groups, cfg.dt_min, cfg.dt_max,
            )  # fmt: skip
        elif is_cached:
            self._prefill_in_segments(zxd[nd:, Di:], batch, cache, y[nd:])
        else:  # the reference forward: every sequence from zero states, through throw-away state pools
            B = batch.num_seqs
            conv0 = x.new_zeros(B, cfg.conv_dim, cfg.conv_kernel - 1)
            ssm0 = x.new_zeros(B, H, P, cfg.state_size, dtype=torch.float32)
            y = ops.mamba2_prefill_reference(
                xBC, dt_raw, batch.query_lens, torch.arange(B, device=x.device), [True] * B, conv_w, conv_b,
                conv0, self.dt_bias, self.A_log, self.D, ssm0, cfg.n_groups, cfg.dt_min, cfg.dt_max,
            )  # fmt: skip
        return self._output(y.view(T, Di), z, x.dtype, batch.is_decode_only)

    def _prefill_in_segments(
        self, xbc_dt: torch.Tensor, batch: ForwardBatch, cache: LayerCache, y: torch.Tensor
    ) -> None:
        """The prefill rows' scan (xbc_dt [Tp, Cd + H]: xBC and dt_raw side by side, in_proj's columns →
        y [Tp, H, P], written in place), cut at the offsets of `batch.state_saves` (model/segments.py)."""
        cfg, Cd = self.cfg, self.cfg.conv_dim
        conv_w, conv_b = self.conv1d.weight[:, 0], self.conv1d.bias

        def run(seg: Segment) -> torch.Tensor:
            rows = seg.take(xbc_dt)  # the kernel takes xBC and dt as column views of one row-major buffer
            return ops.mamba2_prefill(
                rows[:, :Cd], rows[:, Cd:], seg.lens, seg.slots, seg.fresh, conv_w, conv_b, cache.conv,
                self.dt_bias, self.A_log, self.D, cache.ssm, cfg.n_groups, cfg.dt_min, cfg.dt_max,
            )  # fmt: skip

        run_in_segments(batch, run, y, (cache.conv, cache.ssm))

    def _output(self, y: torch.Tensor, z: torch.Tensor, dtype: torch.dtype, decode: bool) -> torch.Tensor:
        """Gate (gated RMSNorm, or plain SiLU gating) and out_proj: y, z [T, Di] → [T, D] in `dtype`."""
        if self.norm is not None:
            y = self.norm(y, z)  # float32 [T, Di]
        else:  # the gate alone
            y = ops.gated_rms_norm(y, z, None, y.shape[-1], 0.0, False)
        return self.out_proj(y.to(dtype), decode=decode)


# ------------------------------------------------------------------------------------------- the kind


def _cache(cfg: Mamba2Config) -> tuple[CacheTensor, ...]:
    conv = CacheTensor("conv", (cfg.conv_dim, cfg.conv_kernel - 1), "model")
    return conv, CacheTensor("ssm", (cfg.num_heads, cfg.head_dim, cfg.state_size), SSM_STATE_DTYPE)


def _shard(cfg: Mamba2Config, world: int, where: str) -> Mamba2Config:
    check_divisible(cfg.num_heads, world, f"{where} Mamba2 heads")
    split = groups_split(cfg.n_groups, world)
    full_norm = cfg.norm_group_size in (0, cfg.d_inner)
    return replace(
        cfg,
        num_heads=cfg.num_heads // world,
        n_groups=cfg.n_groups // world if split else cfg.n_groups,
        norm_group_size=cfg.d_inner // world if full_norm else cfg.norm_group_size,
        norm_spans_ranks=full_norm,
    )


def _slice(cfg: Mamba2Config, leaf: str, t: torch.Tensor, rank: int, world: int) -> torch.Tensor | None:
    split = groups_split(cfg.n_groups, world)
    gn = cfg.n_groups * cfg.state_size
    if leaf.startswith("in_proj."):
        sizes = [cfg.d_inner, cfg.d_inner, gn, gn, cfg.num_heads]
        return split_segments(t, sizes, [True, True, split, split, True], rank, world)
    if leaf.startswith("conv1d."):
        return split_segments(t, [cfg.d_inner, gn, gn], [True, split, split], rank, world)
    if leaf in ("dt_bias", "A_log", "D", "norm.weight"):
        return split_block(t, 0, rank, world)
    if leaf == "out_proj.weight":
        return split_block(t, 1, rank, world)
    if leaf == "out_proj.bias":
        return rank0_only(t, rank)
    return None


SPEC = MixerSpec(
    config=Mamba2Config,
    prefix="mamba",
    build=lambda cfg, hidden_size, rope_for, tp: Mamba2(cfg, hidden_size, tp),
    cache=_cache,
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
