"""Kimi Delta Attention mixer (Kimi-Linear's linear-attention layers, HF `KimiLinearDeltaAttention`): q / k /
v projections → causal depthwise conv + SiLU over [q | k | v] → L2-normed q, k → the delta rule with a
channel-wise decay (g = −exp(A_log) · softplus(f_b(f_a(x)) + dt_bias), one per head and key channel; write
strength β = sigmoid(b_proj(x))) → per-head RMSNorm · sigmoid(g_b(g_a(x))) → o_proj. The math of one token is
in blazr/kernels/reference_kda.py, the delta rule's two forms in blazr/model/delta_rule.py.

One step's flat layout (see `ForwardBatch`), as gated DeltaNet's (model/deltanet.py):
- no cache (reference forward): every sequence from zero states through throw-away pools
  (`kda_prefill_reference`, the chunked delta rule);
- decode rows (the first Bd sequences, one token each): one batched recurrent step, the kernel op `kda_step`
  (csrc/kda.c; `cache.kda_conv` / `cache.kda_state` advanced in place at `state_slots`);
- prefill rows: all sequences in one kernel op `kda_prefill` (the chunked WY form in C), each from its
  slot's states when `context_len > 0` or from zeros, its final states written back; prefix-cache snapshots
  (`batch.state_saves`) cut the chunks there and copy the states at that point into their snapshot slots.

Parameters (internal names; loading/names/kimi_linear.py maps HF's): qkv_proj [3·W, D] rows [q | k | v]
(parts q_proj, k_proj, v_proj), f_a_proj [Dh, D], f_b_proj [W, Dh], g_a_proj [Dh, D], g_b_proj [W, Dh],
b_proj [H, D], conv1d.weight [3·W, 1, K] (no bias; parts q_conv1d, k_conv1d, v_conv1d), dt_bias [W], A_log
[H], o_norm.weight [Dh] (shared by the heads), o_proj [D, W].
Shapes: T tokens, D hidden, H heads of Dh, W = H·Dh, K conv taps, S state slots, Bd decode rows.
Numerics: conv + SiLU in the weights' dtype (as HF), all after it float32, y cast back before o_proj.

`SPEC` declares the kind (model/mixer_spec.py): per sequence, conv [3·W, K-1] in the model dtype and the
state [H, Dh, Dh] float32 (a prefix is a snapshot: a copy of the state slot's rows); every linear
quantizable; tensor parallel splits the heads (each rank its heads' rows of qkv_proj / f_b_proj / g_b_proj /
b_proj / conv, their dt_bias / A_log, o_proj's columns; f_a_proj / g_a_proj and the norm are replicated);
the decode plan may hold it (its step is kernel ops: the linears and `kda_step`), a CUDA graph not.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from blazr.config import KimiDeltaConfig
from blazr.distributed.split import check_divisible
from blazr.kernels import ops
from blazr.model.mixer_spec import FusedParts, MixerSpec
from blazr.model.norm import RMSNorm
from blazr.model.qlinear import Linear
from blazr.state.batch import ForwardBatch
from blazr.state.kv_cache import LayerCache
from blazr.state.layout import CacheTensor, Snapshot

STATE_DTYPE = torch.float32


class KimiDeltaAttention(nn.Module):
    """The KDA mixer of one layer. `forward(x [T, D], batch, cache) → [T, D]`."""

    def __init__(self, cfg: KimiDeltaConfig, hidden_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        H, Dh, W = cfg.num_heads, cfg.head_dim, cfg.width
        self.qkv_proj = Linear(hidden_size, 3 * W, bias=False)
        self.f_a_proj = Linear(hidden_size, Dh, bias=False)
        self.f_b_proj = Linear(Dh, W, bias=False)
        self.g_a_proj = Linear(hidden_size, Dh, bias=False)
        self.g_b_proj = Linear(Dh, W, bias=False)
        self.b_proj = Linear(hidden_size, H, bias=False)
        self.conv1d = nn.Conv1d(3 * W, 3 * W, cfg.conv_kernel, groups=3 * W, bias=False)  # weight [C, 1, K]
        self.dt_bias = nn.Parameter(torch.zeros(W))  # loading overwrites these
        self.A_log = nn.Parameter(torch.zeros(H))
        self.o_norm = RMSNorm(Dh, cfg.norm_eps)  # its weight, read by the ops (norm then · sigmoid(gate))
        self.o_proj = Linear(W, hidden_size, bias=False)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: LayerCache | None) -> torch.Tensor:
        cfg, T, decode = self.cfg, x.shape[0], batch.is_decode_only
        qkv, b = self.qkv_proj(x, decode=decode), self.b_proj(x, decode=decode)
        f = self.f_b_proj(self.f_a_proj(x, decode=decode), decode=decode)
        gate = self.g_b_proj(self.g_a_proj(x, decode=decode), decode=decode)
        conv_w = self.conv1d.weight[:, 0]
        args = (self.dt_bias, self.A_log, self.o_norm.weight)
        if cache is None or batch.state_slots is None:  # the reference forward, from zero states
            B = batch.num_seqs
            conv0 = x.new_zeros(B, cfg.conv_dim, cfg.conv_kernel - 1)
            state0 = x.new_zeros(B, cfg.num_heads, cfg.head_dim, cfg.head_dim, dtype=STATE_DTYPE)
            y = ops.kda_prefill_reference(
                qkv, f, b, gate, batch.query_lens, torch.arange(B, device=x.device), [True] * B, (), conv_w,
                conv0, *args, state0, cfg.norm_eps, cfg.chunk_size,
            )  # fmt: skip
            return self.o_proj(y.to(x.dtype), decode=decode)
        nd = batch.num_decodes
        if nd:  # one token per sequence: the fused step
            slots = batch.state_slots[:nd]
            yd = ops.kda_step(
                qkv[:nd], f[:nd], b[:nd], gate[:nd], slots, conv_w, cache.kda_conv, *args, cache.kda_state,
                cfg.norm_eps,
            )  # fmt: skip
            if nd == T:  # decode only
                return self.o_proj(yd.to(x.dtype), decode=decode)
        fresh = [c == 0 for c in batch.context_lens[nd:]]  # context 0: the slot may hold an old owner's
        saves = tuple((i - nd, k, dst) for i, k, dst in batch.state_saves)  # prefill rows only have saves
        yp = ops.kda_prefill(
            qkv[nd:], f[nd:], b[nd:], gate[nd:], batch.query_lens[nd:], batch.state_slots[nd:], fresh, saves,
            conv_w, cache.kda_conv, *args, cache.kda_state, cfg.norm_eps, cfg.chunk_size,
        )  # fmt: skip
        y = torch.cat([yd, yp]) if nd else yp
        return self.o_proj(y.to(x.dtype), decode=decode)


# ------------------------------------------------------------------------------------------- the kind


def _cache(cfg: KimiDeltaConfig) -> tuple[CacheTensor, ...]:
    conv = CacheTensor("kda_conv", (cfg.conv_dim, cfg.conv_kernel - 1), "model")
    return conv, CacheTensor("kda_state", (cfg.num_heads, cfg.head_dim, cfg.head_dim), STATE_DTYPE)


def _fused(cfg: KimiDeltaConfig, leaf: str) -> FusedParts | None:
    W = cfg.width
    if leaf == "qkv_proj.weight":
        return FusedParts((("q_proj.weight", W), ("k_proj.weight", W), ("v_proj.weight", W)))
    if leaf == "conv1d.weight":  # the checkpoints hold one conv per q, k, v
        return FusedParts((("q_conv1d.weight", W), ("k_conv1d.weight", W), ("v_conv1d.weight", W)))
    return None


def _shard(cfg: KimiDeltaConfig, world: int, where: str) -> KimiDeltaConfig:
    check_divisible(cfg.num_heads, world, f"{where} KDA heads")
    return replace(cfg, num_heads=cfg.num_heads // world)


def _slice(cfg: KimiDeltaConfig, leaf: str, t: torch.Tensor, rank: int, world: int) -> torch.Tensor | None:
    H, Dh, W = cfg.num_heads, cfg.head_dim, cfg.width
    heads = torch.arange(rank * H // world, (rank + 1) * H // world)
    cols = (heads[:, None] * Dh + torch.arange(Dh)[None, :]).flatten()  # the rank's W-wide features
    if leaf in ("qkv_proj.weight", "conv1d.weight"):  # [q | k | v] rows
        return t[torch.cat([cols, W + cols, 2 * W + cols])]
    if leaf in ("f_b_proj.weight", "g_b_proj.weight", "dt_bias"):
        return t[cols]
    if leaf in ("b_proj.weight", "A_log"):
        return t[heads]
    if leaf == "o_proj.weight":
        return t[:, cols]
    return None


SPEC = MixerSpec(
    config=KimiDeltaConfig,
    prefix="kda",
    build=lambda cfg, hidden_size, rope_for, tp: KimiDeltaAttention(cfg, hidden_size),
    cache=_cache,
    snapshot=Snapshot.STATE_SLOT,
    linears=("qkv_proj", "f_a_proj", "f_b_proj", "g_a_proj", "g_b_proj", "b_proj", "o_proj"),
    float_linears=(),
    fused=_fused,
    shard=_shard,
    slice=_slice,
    is_plan_safe=True,
    chains_rows=True,  # its decode step runs rows that share a slot in row order
    graph_windows=None,
)
