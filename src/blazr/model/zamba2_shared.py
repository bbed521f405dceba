"""Zamba2's shared transformer block and its calls: the mixer kind `zamba2_shared`.

A Zamba2 model holds `num_mem_blocks` transformer blocks (`SharedBlock`, the model's `shared_blocks.{b}`)
and calls them, in turn, from its hybrid layers. Each call (`SharedCall`, the layer's `shared` mixer) runs
the block on the un-normed residual x and the token embeddings e, with its own adapters, its own KV cache
and its own output projection:

    h = input_norm(concat(x, e))                                        [T, 2D]
    q, k, v = q_proj(h) + q_adapter(h), …  (adapters: per call, when the model has them)
    a = o_proj(attention(q, k, v))         (head_dim 2D / H, rope when the model has it)   [T, D]
    a = ffn_norm(a)
    g, u = gate_up_proj(a) + gate_up_adapter(a)
    out = linear(down_proj(act(g) · u))                                 [T, D]

and the layer adds `out` to the input of its Mamba2 mixer (`MixerConfig.is_input_addend`, model/block.py):
x ← x + mamba(norm(x + out)). An adapter is two linears (`.0`: down to the rank, `.1`: back up), as the
checkpoint stores them.

The block's weights exist once (the model's `shared_blocks`); a call holds only its adapters and `linear`,
and reaches its block through `bind` (not a submodule: its parameters keep one name, and a linear swapped
for a quantized one by the loader is seen by every call). Every linear of a shared block is quantizable
(loading/quantize.py), as are each call's.

`SPEC`: the paged K and V of the call's attention (a prefix is its blocks); on the CPU a decode step is
kernel ops only (`_decode`: the concat a row copy into each half, the adapters' sums kernel adds), so the
recorded decode plan holds it; CUDA graphs do not (not measured there). Tensor parallel: a block splits as a
transformer block does — q / k / v rows and o_proj's columns by heads, gate_up rows and down_proj's columns by
the MLP width (`slice_block`, for the model's `shared_blocks.{b}.…`); a call's adapters split their up
projection (`.1`) the same way and keep the down one (`.0`, to the rank) whole on every rank. o_proj's partial
sums are all-reduced inside the call (ffn_norm needs the whole row); the call's output, `linear` (replicated)
of down_proj's partial sum, is a partial sum the block all-reduces before adding it.

Shapes: T tokens, D hidden, H heads, Hkv KV heads, Dh = 2D / H head size, I MLP width, R adapter rank.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from torch import nn

from blazr.config import ModelConfig, Zamba2SharedConfig
from blazr.distributed.split import check_divisible, slice_mlp, split_block, split_segments
from blazr.kernels import ops
from blazr.model.attention import _cache as attention_cache
from blazr.model.attention import causal_attention
from blazr.model.mixer_spec import MixerSpec, RopeFor
from blazr.model.mlp import activate
from blazr.model.norm import RMSNorm
from blazr.model.qlinear import Linear
from blazr.model.rope import RotaryEmbedding
from blazr.state.batch import ForwardBatch
from blazr.state.kv_cache import LayerCache
from blazr.state.layout import Snapshot

if TYPE_CHECKING:
    from blazr.distributed.group import TPGroup


class _Attention(nn.Module):
    """The shared attention's projections: q/k/v [H·Dh or Hkv·Dh, 2D], o_proj [D, H·Dh]."""

    def __init__(self, cfg: Zamba2SharedConfig, hidden_size: int) -> None:
        super().__init__()
        a = cfg.attention
        self.q_proj = Linear(2 * hidden_size, a.num_heads * a.head_dim, bias=False)
        self.k_proj = Linear(2 * hidden_size, a.num_kv_heads * a.head_dim, bias=False)
        self.v_proj = Linear(2 * hidden_size, a.num_kv_heads * a.head_dim, bias=False)
        self.o_proj = Linear(a.num_heads * a.head_dim, hidden_size, bias=False)


class _MLP(nn.Module):
    """The shared MLP's projections: gate_up_proj [2I, D] (gate rows first), down_proj [D, I]."""

    def __init__(self, cfg: Zamba2SharedConfig, hidden_size: int) -> None:
        super().__init__()
        width = cfg.mlp.intermediate_size
        self.gate_up_proj = Linear(hidden_size, 2 * width, bias=cfg.mlp.has_bias)
        self.down_proj = Linear(width, hidden_size, bias=cfg.mlp.has_bias)


class SharedBlock(nn.Module):
    """One shared transformer block's weights (its calls run it: `SharedCall.forward`)."""

    def __init__(self, cfg: Zamba2SharedConfig, hidden_size: int, rope: RotaryEmbedding | None) -> None:
        super().__init__()
        self.input_norm = RMSNorm(2 * hidden_size, cfg.norm.eps)
        self.attn = _Attention(cfg, hidden_size)
        self.ffn_norm = RMSNorm(hidden_size, cfg.norm.eps)
        self.mlp = _MLP(cfg, hidden_size)
        self.rope = rope


class _Adapter(nn.Sequential):
    """A low-rank adapter: `.0` [R, n_in] down to the rank, `.1` [n_out, R] back up.
    x [T, n_in] → [T, n_out]."""

    def __init__(self, n_in: int, rank: int, n_out: int) -> None:
        super().__init__(Linear(n_in, rank, bias=False), Linear(rank, n_out, bias=False))

    def forward(self, x: torch.Tensor, *, decode: bool) -> torch.Tensor:
        down, up = self
        return up(down(x, decode=decode), decode=decode)


class SharedCall(nn.Module):
    """One layer's call of a shared block: its adapters, its output `linear` [D, D] and (through the layer's
    cache) its own keys and values. (x [T, D], embeddings [T, D]) → [T, D]."""

    def __init__(self, cfg: Zamba2SharedConfig, hidden_size: int, tp: TPGroup | None = None) -> None:
        """`tp`: this call is one tensor-parallel shard (cfg holds its heads and MLP width)."""
        super().__init__()
        self.cfg, self.tp = cfg, tp
        a, wide = cfg.attention, 2 * hidden_size
        if cfg.attention_adapter_rank is not None:
            r = cfg.attention_adapter_rank
            self.q_adapter = _Adapter(wide, r, a.num_heads * a.head_dim)
            self.k_adapter = _Adapter(wide, r, a.num_kv_heads * a.head_dim)
            self.v_adapter = _Adapter(wide, r, a.num_kv_heads * a.head_dim)
        self.gate_up_adapter = _Adapter(hidden_size, cfg.mlp_adapter_rank, 2 * cfg.mlp.intermediate_size)
        self.linear = Linear(hidden_size, hidden_size, bias=False)
        self._block: tuple[SharedBlock, ...] = ()  # a tuple: not a submodule (see the module docstring)

    def bind(self, block: SharedBlock) -> None:
        self._block = (block,)

    def forward(
        self, x: torch.Tensor, batch: ForwardBatch, cache: LayerCache | None, embeddings: torch.Tensor
    ) -> torch.Tensor:
        assert self._block, "a SharedCall runs only bound to its model's shared block"
        if cache is not None and batch.is_decode_only and batch.decode_lens is not None and ops.cpu_f32(x):
            return self._decode(x, batch, cache, embeddings)
        block, cfg, T, decode = self._block[0], self.cfg.attention, x.shape[0], batch.is_decode_only
        h = block.input_norm(torch.cat([x, embeddings], dim=-1))  # [T, 2D]
        q, k, v = (getattr(block.attn, n)(h, decode=decode) for n in ("q_proj", "k_proj", "v_proj"))
        if self.cfg.attention_adapter_rank is not None:
            q, k, v = (
                t + a(h, decode=decode)
                for t, a in zip((q, k, v), (self.q_adapter, self.k_adapter, self.v_adapter), strict=True)
            )
        q = q.view(T, cfg.num_heads, cfg.head_dim)
        k = k.view(T, cfg.num_kv_heads, cfg.head_dim)
        v = v.view(T, cfg.num_kv_heads, cfg.head_dim)
        if block.rope is not None:
            q, k = block.rope(q, batch.positions), block.rope(k, batch.positions)
        k_pool = v_pool = None
        if cache is not None and batch.has_cache:
            k_pool, v_pool = cache.k, cache.v
            k_pool.index_copy_(0, batch.slot_mapping, k.to(k_pool.dtype))
            v_pool.index_copy_(0, batch.slot_mapping, v.to(v_pool.dtype))
        o = causal_attention(q, k, v, batch, cfg.softmax_scale, k_pool, v_pool, cfg.sliding_window)
        a = block.ffn_norm(self._whole(block.attn.o_proj(o.reshape(T, -1), decode=decode)))  # [T, D]
        gate_up = block.mlp.gate_up_proj(a, decode=decode) + self.gate_up_adapter(a, decode=decode)
        gate, up = gate_up.chunk(2, dim=-1)
        y = block.mlp.down_proj(activate(gate, self.cfg.mlp.activation) * up, decode=decode)
        return self.linear(y, decode=decode)

    def _whole(self, a: torch.Tensor) -> torch.Tensor:
        """o_proj's output: on a shard, the ranks' partial sums added (in place)."""
        return a if self.tp is None else self.tp.all_reduce(a)

    def _decode(
        self, x: torch.Tensor, batch: ForwardBatch, cache: LayerCache, embeddings: torch.Tensor
    ) -> torch.Tensor:
        """One token per sequence, float32 on the CPU, as kernel ops (a recordable step): x and e copied into
        the halves of one row, the projections with their adapters added, RoPE in place, keys and values into
        the pools, paged decode attention, the gated MLP. x, embeddings [B, D] → [B, D]."""
        block, cfg, (B, D) = self._block[0], self.cfg.attention, x.shape
        H, Hkv, Dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        assert cache.k is not None and cache.v is not None and batch.slot_mapping is not None
        h = torch.empty(B, 2 * D, dtype=x.dtype, device=x.device)
        ops.copy_rows(x, h[:, :D])
        ops.copy_rows(embeddings, h[:, D:])
        h = block.input_norm(h)  # [B, 2D]
        q, k, v = (getattr(block.attn, n)(h, decode=True) for n in ("q_proj", "k_proj", "v_proj"))
        if self.cfg.attention_adapter_rank is not None:
            for t, adapter in zip((q, k, v), (self.q_adapter, self.k_adapter, self.v_adapter), strict=True):
                ops.add(t, adapter(h, decode=True), out=t)
        q, k, v = q.view(B, H, Dh), k.view(B, Hkv, Dh), v.view(B, Hkv, Dh)
        if block.rope is not None:
            for t in (q, k):
                ops.rope_neox(t, batch.positions, block.rope.cos, block.rope.sin, block.rope.dim)
        ops.kv_write(k, v, batch.slot_mapping, cache.k, cache.v)
        o = ops.paged_attention_decode(
            q, cache.k, cache.v, batch.kv_indices, batch.decode_lens, cfg.softmax_scale,
            window=cfg.sliding_window,
        )  # fmt: skip
        a = block.ffn_norm(self._whole(block.attn.o_proj(o.view(B, H * Dh), decode=True)))  # [B, D]
        gate_up = block.mlp.gate_up_proj(a, decode=True)
        ops.add(gate_up, self.gate_up_adapter(a, decode=True), out=gate_up)
        y = ops.activation(gate_up, self.cfg.mlp.activation, gated=True)
        return self.linear(block.mlp.down_proj(y, decode=True), decode=True)


def shared_blocks(cfg: ModelConfig, rope_for: RopeFor) -> nn.ModuleList:
    """The model's shared blocks, `max(block) + 1` of them, each built from the first call that names it
    (ValueError when two calls of one block disagree on its sizes, or a block is never called)."""
    first: dict[int, Zamba2SharedConfig] = {}
    for i, layer in enumerate(cfg.layers):
        for m in layer.mixers:
            if not isinstance(m, Zamba2SharedConfig):
                continue
            seen = first.setdefault(m.block, m)
            if (seen.attention, seen.mlp, seen.norm) != (m.attention, m.mlp, m.norm):
                raise ValueError(f"layer {i}: its call of shared block {m.block} disagrees on its sizes")
    if sorted(first) != list(range(len(first))):
        raise ValueError(f"shared blocks {sorted(first)}: every block from 0 up must be called")
    return nn.ModuleList(
        SharedBlock(first[b], cfg.hidden_size, rope_for(first[b].attention.rope)) for b in range(len(first))
    )


def bind_calls(layers: nn.ModuleList, blocks: nn.ModuleList) -> None:
    """Point every layer's SharedCall at its block."""
    for layer in layers:
        for module in layer.children():
            if isinstance(module, SharedCall):
                module.bind(blocks[module.cfg.block])


def _shard(cfg: Zamba2SharedConfig, world: int, where: str) -> Zamba2SharedConfig:
    a, width = cfg.attention, cfg.mlp.intermediate_size
    check_divisible(a.num_heads, world, f"{where} Zamba2 shared attention heads")
    check_divisible(a.num_kv_heads, world, f"{where} Zamba2 shared KV heads")
    check_divisible(width, world, f"{where} Zamba2 shared MLP width")
    return replace(
        cfg,
        attention=replace(a, num_heads=a.num_heads // world, num_kv_heads=a.num_kv_heads // world),
        mlp=replace(cfg.mlp, intermediate_size=width // world),
    )


def _slice(cfg: Zamba2SharedConfig, leaf: str, t: torch.Tensor, rank: int, world: int) -> torch.Tensor | None:
    """A call's tensors: each adapter's up projection (`.1`) split as the projection it adds to."""
    if leaf in ("q_adapter.1.weight", "k_adapter.1.weight", "v_adapter.1.weight"):
        return split_block(t, 0, rank, world)  # [heads · Dh, R]: the rank's heads
    if leaf == "gate_up_adapter.1.weight":  # [2I, R]: the rank's gate rows and up rows
        return split_segments(t, [cfg.mlp.intermediate_size] * 2, [True, True], rank, world)
    return None


def slice_block(
    cfg: Zamba2SharedConfig, leaf: str, t: torch.Tensor, rank: int, world: int
) -> torch.Tensor | None:
    """Rank `rank`'s piece of a shared block's tensor `leaf` (`shared_blocks.{b}.{leaf}`; cfg: a full call of
    block b); None: replicated (the norms)."""
    if leaf in ("attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight"):
        return split_block(t, 0, rank, world)
    if leaf == "attn.o_proj.weight":
        return split_block(t, 1, rank, world)
    if leaf.startswith("mlp."):
        return slice_mlp(leaf.removeprefix("mlp."), t, cfg.mlp.intermediate_size, rank, world)
    return None


SPEC = MixerSpec(
    config=Zamba2SharedConfig,
    prefix="shared",
    build=lambda cfg, hidden_size, rope_for, tp: SharedCall(cfg, hidden_size, tp),
    cache=lambda cfg: attention_cache(cfg.attention),
    snapshot=Snapshot.BLOCKS,
    linears=(
        *(f"{x}_adapter.{j}" for x in ("q", "k", "v", "gate_up") for j in (0, 1)),
        "linear",
    ),
    float_linears=(),
    fused=lambda cfg, leaf: None,
    shard=_shard,
    slice=_slice,
    is_plan_safe=True,
    chains_rows=True,  # its keys and values are written before any row attends, as attention's
    graph_windows=None,
)
