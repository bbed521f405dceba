"""Gated DeltaNet mixer (Qwen3-Next, Qwen3.5 / 3.6, OLMo-Hybrid): in_proj_qkvz → causal depthwise conv + SiLU
over [q | k | v] → L2-normed q, k → gated delta rule (decay g from A_log / dt_bias, write strength β from b)
→ gated RMSNorm with z → out_proj. HF `Qwen3NextGatedDeltaNet` / `Qwen3_5GatedDeltaNet` /
`OlmoHybridGatedDeltaNet`; the math of one token is in blazr/kernels/reference_deltanet.py, the delta rule's
two forms in blazr/model/delta_rule.py.

One step's flat layout (see `ForwardBatch`), as Mamba2's:
- no cache (reference forward): every sequence runs from zero states through throw-away pools, on the torch
  reference (`deltanet_prefill_reference`, the chunked delta rule);
- decode rows (the first Bd sequences, one token each): one batched recurrent step, the kernel op
  `deltanet_step` (conv step, norms, gates, state update and gated norm; `cache.dn_conv` / `cache.dn_state`
  advanced in place at `state_slots`);
- prefill rows: all sequences in one kernel op `deltanet_prefill` (the chunked WY form in C), each from its
  slot's states when `context_len > 0` (a chunked prefill continues) or from zeros when it is 0 (the slot may
  hold a previous owner's state), its final states written back to the slot; a prefix-cache snapshot inside
  the step (`batch.state_saves`) cuts the chunks there and copies the states at that point into its snapshot
  slot, in the same call.

Parameters (internal names; loading/names maps each family's): in_proj_qkvz [2·Kd + 2·Vd, D] rows [q | k | v |
z] (parts q_proj, k_proj, v_proj, z_proj), in_proj_ba [2·Hv, D] rows [b | a] (parts b_proj, a_proj),
conv1d.weight [C, 1, K] (no bias; parts q_conv1d, k_conv1d, v_conv1d), dt_bias, A_log [Hv], norm.weight
[Dv] (shared by the value heads), out_proj [D, Vd].
Shapes: T tokens, D hidden, Hk / Hv key / value heads, Dk / Dv their dims, Kd = Hk·Dk, Vd = Hv·Dv,
C = 2·Kd + Vd conv channels, K conv taps, S state slots, Bd decode rows.
Numerics: conv + SiLU in the weights' dtype (as HF), all after it float32, y cast back before out_proj.

`SPEC` declares the kind (model/mixer_spec.py): per sequence, conv [C, K-1] in the model dtype and the
delta-rule state [Hv, Dk, Dv] float32 (a prefix is a snapshot: a copy of the state slot's rows); in_proj_qkvz,
in_proj_ba and out_proj quantizable; tensor parallel splits the key heads and their value heads (each rank
its own heads' rows of in_proj_qkvz / in_proj_ba / conv, their dt_bias / A_log, out_proj's columns; the
norm, per value head, is replicated); the decode plan may hold it, a CUDA graph not.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from blazr.config import GatedDeltaNetConfig
from blazr.distributed.split import check_divisible
from blazr.kernels import ops
from blazr.model.mixer_spec import FusedParts, MixerSpec
from blazr.model.norm import GatedRMSNorm
from blazr.model.qlinear import Linear
from blazr.state.batch import ForwardBatch
from blazr.state.kv_cache import LayerCache
from blazr.state.layout import CacheTensor, Snapshot

STATE_DTYPE = torch.float32


class GatedDeltaNet(nn.Module):
    """The gated DeltaNet mixer of one layer. `forward(x [T, D], batch, cache) → [T, D]`."""

    def __init__(self, cfg: GatedDeltaNetConfig, hidden_size: int) -> None:
        super().__init__()
        if cfg.num_v_heads % cfg.num_k_heads:
            raise ValueError(f"{cfg.num_v_heads} value heads do not split over {cfg.num_k_heads} key heads")
        self.cfg = cfg
        C, Vd, Hv = cfg.conv_dim, cfg.value_dim, cfg.num_v_heads
        self.in_proj_qkvz = Linear(hidden_size, C + Vd, bias=False)
        self.in_proj_ba = Linear(hidden_size, 2 * Hv, bias=False)
        self.conv1d = nn.Conv1d(C, C, cfg.conv_kernel, groups=C, bias=False)  # weight [C, 1, K]
        self.dt_bias = nn.Parameter(torch.ones(Hv))  # HF's initialisation; loading overwrites both
        self.A_log = nn.Parameter(torch.zeros(Hv))
        self.norm = GatedRMSNorm(cfg.head_v_dim, cfg.head_v_dim, cfg.norm_eps, is_norm_before_gate=True)
        self.out_proj = Linear(Vd, hidden_size, bias=False)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: LayerCache | None) -> torch.Tensor:
        cfg, T, decode = self.cfg, x.shape[0], batch.is_decode_only
        qkvz, ba = self.in_proj_qkvz(x, decode=decode), self.in_proj_ba(x, decode=decode)
        conv_w = self.conv1d.weight[:, 0]
        args = (self.dt_bias, self.A_log, self.norm.weight)
        head = (cfg.num_k_heads, cfg.is_v_tiled, cfg.beta_scale, cfg.norm_eps)
        if cache is None or batch.state_slots is None:  # the reference forward, from zero states
            B = batch.num_seqs
            conv0 = x.new_zeros(B, cfg.conv_dim, cfg.conv_kernel - 1)
            state0 = x.new_zeros(B, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim, dtype=STATE_DTYPE)
            y = ops.deltanet_prefill_reference(
                qkvz, ba, batch.query_lens, torch.arange(B, device=x.device), [True] * B, (), conv_w, conv0,
                *args, state0, *head, cfg.chunk_size,
            )  # fmt: skip
            return self.out_proj(y.to(x.dtype), decode=decode)
        nd = batch.num_decodes
        if nd:  # one token per sequence: the fused step (kernel op)
            slots = batch.state_slots[:nd]
            yd = ops.deltanet_step(
                qkvz[:nd], ba[:nd], slots, conv_w, cache.dn_conv, *args, cache.dn_state, *head
            )
            if nd == T:  # decode only
                return self.out_proj(yd.to(x.dtype), decode=decode)
        fresh = [c == 0 for c in batch.context_lens[nd:]]  # context 0: the slot may hold an old owner's
        saves = tuple((b - nd, k, dst) for b, k, dst in batch.state_saves)  # prefill rows only have saves
        yp = ops.deltanet_prefill(
            qkvz[nd:], ba[nd:], batch.query_lens[nd:], batch.state_slots[nd:], fresh, saves, conv_w,
            cache.dn_conv, *args, cache.dn_state, *head, cfg.chunk_size,
        )  # fmt: skip
        y = torch.cat([yd, yp]) if nd else yp
        return self.out_proj(y.to(x.dtype), decode=decode)


# ------------------------------------------------------------------------------------------- the kind


def _cache(cfg: GatedDeltaNetConfig) -> tuple[CacheTensor, ...]:
    conv = CacheTensor("dn_conv", (cfg.conv_dim, cfg.conv_kernel - 1), "model")
    return conv, CacheTensor("dn_state", (cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim), STATE_DTYPE)


def _fused(cfg: GatedDeltaNetConfig, leaf: str) -> FusedParts | None:
    Kd, Vd, Hv = cfg.key_dim, cfg.value_dim, cfg.num_v_heads
    if leaf == "in_proj_qkvz.weight":
        return FusedParts(
            (("q_proj.weight", Kd), ("k_proj.weight", Kd), ("v_proj.weight", Vd), ("z_proj.weight", Vd))
        )
    if leaf == "in_proj_ba.weight":
        return FusedParts((("b_proj.weight", Hv), ("a_proj.weight", Hv)))
    if leaf == "conv1d.weight":  # OLMo-Hybrid's checkpoints hold one conv per q, k, v
        return FusedParts((("q_conv1d.weight", Kd), ("k_conv1d.weight", Kd), ("v_conv1d.weight", Vd)))
    return None


def v_head_order(cfg: GatedDeltaNetConfig, rank: int, world: int) -> torch.Tensor:
    """The value heads rank `rank` of `world` holds, in the order its shard lays them out: those of its key
    heads [rank·Hk/w, (rank+1)·Hk/w) — contiguous in HF's grouped order, interleaved in the tiled one."""
    Hk, Hv = cfg.num_k_heads, cfg.num_v_heads
    r, hk = Hv // Hk, Hk // world
    if not cfg.is_v_tiled:  # value head h of key head h // r
        return torch.arange(rank * hk * r, (rank + 1) * hk * r)
    # tiled: value head h of key head h % Hk; the shard's local order is tiled over its own hk key heads
    return torch.tensor([m * Hk + rank * hk + j for m in range(r) for j in range(hk)])


def _rows(heads: torch.Tensor, width: int) -> torch.Tensor:
    """The rows (or columns) of `heads`, `width` each."""
    return (heads[:, None] * width + torch.arange(width)[None, :]).flatten()


def _shard(cfg: GatedDeltaNetConfig, world: int, where: str) -> GatedDeltaNetConfig:
    check_divisible(cfg.num_k_heads, world, f"{where} DeltaNet key heads")
    return replace(cfg, num_k_heads=cfg.num_k_heads // world, num_v_heads=cfg.num_v_heads // world)


def _slice(
    cfg: GatedDeltaNetConfig, leaf: str, t: torch.Tensor, rank: int, world: int
) -> torch.Tensor | None:
    Kd, Dk, Dv, Hv = cfg.key_dim, cfg.head_k_dim, cfg.head_v_dim, cfg.num_v_heads
    k_heads = torch.arange(rank * cfg.num_k_heads // world, (rank + 1) * cfg.num_k_heads // world)
    v_heads = v_head_order(cfg, rank, world)
    qk, v = _rows(k_heads, Dk), _rows(v_heads, Dv)
    if leaf == "in_proj_qkvz.weight":  # [q | k | v | z] rows
        return t[torch.cat([qk, Kd + qk, 2 * Kd + v, 2 * Kd + cfg.value_dim + v])]
    if leaf == "conv1d.weight":  # [q | k | v] channels
        return t[torch.cat([qk, Kd + qk, 2 * Kd + v])]
    if leaf == "in_proj_ba.weight":
        return t[torch.cat([v_heads, Hv + v_heads])]
    if leaf in ("dt_bias", "A_log"):
        return t[v_heads]
    if leaf == "out_proj.weight":
        return t[:, v]
    return None


SPEC = MixerSpec(
    config=GatedDeltaNetConfig,
    prefix="deltanet",
    build=lambda cfg, hidden_size, rope_for, tp: GatedDeltaNet(cfg, hidden_size),
    cache=_cache,
    snapshot=Snapshot.STATE_SLOT,
    linears=("in_proj_qkvz", "in_proj_ba", "out_proj"),
    float_linears=(),
    fused=_fused,
    shard=_shard,
    slice=_slice,
    is_plan_safe=True,
    chains_rows=True,  # its decode step runs rows that share a slot in row order
    graph_windows=None,
)
