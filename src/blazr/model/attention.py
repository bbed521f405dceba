"""Grouped-query attention (Llama, Qwen2, Mistral, Granite, Bamba, Qwen3-Next / Qwen3.5, LFM2, Jamba …) and
the causal attention kernel shared with MLA.

`causal_attention` covers three cases in one step's flat layout:
- no cache: each sequence attends to its own new tokens (reference / test forwards; on the CPU the prefill
  kernel below with those keys as its pools, so a cacheless forward gives a cached prefill's bits);
- decode rows (the first Bd sequences, one query each): batched over sequences, keys gathered from the
  paged pool by `kv_indices`, padded to the longest and masked;
- prefill rows: per sequence, causal with an offset of `context_len` cached tokens (chunked prefill): with
  pools on the CPU the C kernel (`ops.attention_prefill`, keys and values read from the pools, a row's result
  independent of its chunk), else torch's SDPA on the gathered keys.

Options (AttentionConfig): q/k RMSNorm per head or over all heads before rope (`ops.head_rms_norm` on views
of the qkv output, in place), partial rope, score soft-capping (Gemma 2: the torch path as plain matmul /
tanh / softmax, the C decode attention on each score before its softmax, so such a layer stays in the decode
plan), attention sinks (GPT-OSS: a learned logit per head,
`sinks` [H] float32, in the softmax's denominator — the torch path as one more score column, the C decode
attention in its merge, so such a layer stays in the decode plan), Gemma 4's KV sharing (`kv_source`:
qkv_proj holds q only; keys and values are read from the source layer's pools, this layer's cache), K = V
(`is_v_from_k`: qkv_proj's rows [q | k], values a copy of k before its norm) and weightless value norms, and
an output gate — qkv_proj's rows [q | k | v | gate], the attention output multiplied by sigmoid(gate) before
o_proj (`ops.sigmoid_mul`).

`SPEC` declares the kind (model/mixer_spec.py): paged K and V, [Hkv, D] per token each, in the KV pools' dtype
(a prefix is its blocks), read through the layer's sliding window if it has one (its KV group then holds only
the window's blocks: the batch's `kv_indices` of this layer's group point the positions before the window at a
held slot, which the window's mask leaves unread); `qkv_proj` and `o_proj` quantizable, `qkv_proj` fused from
q, k and v (and the gate, `q_gate`: a checkpoint's q_proj holds it beside q, each head's [q_h; gate_h]);
tensor parallel splits the heads and KV heads (each rank its own contiguous heads, q / k / v / gate rows
column-parallel, `o_proj` row-parallel, per-head q/k norms replicated; a q/k norm over all heads split with
the heads, its mean of squares all-reduced, `is_qk_norm_across_ranks`; a KV-sharing layer's heads read its
source layer's KV heads of the same rank, which the same split keeps);
the decode plan and CUDA graphs may hold it.

Shapes: T tokens, H query heads, Hkv kv heads, Dk / Dv head dims, S cache slots.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from blazr.config import AttentionConfig
from blazr.distributed.split import check_divisible, rank0_only, split_block, split_segments
from blazr.kernels import ops
from blazr.kernels.bindings_attention import MAX_HEAD_DIM
from blazr.model.mixer_spec import FusedParts, MixerSpec
from blazr.model.norm import RMSNorm, normed_across_ranks
from blazr.model.qlinear import Linear
from blazr.model.rope import RotaryEmbedding
from blazr.state.batch import ForwardBatch
from blazr.state.kv_cache import LayerCache
from blazr.state.layout import CacheTensor, Snapshot

if TYPE_CHECKING:
    from blazr.distributed.group import TPGroup


def _sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [B, H, Lq, Dk], k [B, Hkv, Lk, Dk], v [B, Hkv, Lk, Dv] → [B, H, Lq, Dv]; `mask` boolean (True:
    attend). With `softcap` c the scores s = scale · q·kᵀ become c · tanh(s / c) before the mask (Gemma 2);
    with `sinks` [H] each head's logit joins the softmax's denominator as one more column without a value
    (GPT-OSS): plain torch, as SDPA has neither step."""
    if softcap is not None or sinks is not None:
        G = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
        s = torch.matmul(q, k.transpose(-1, -2)) * scale  # [B, H, Lq, Lk]
        if softcap is not None:
            s = torch.tanh(s / softcap) * softcap
        if is_causal:
            Lq, Lk = s.shape[-2:]
            mask = torch.ones(Lq, Lk, dtype=torch.bool, device=q.device).tril(Lk - Lq)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        if sinks is None:
            return torch.matmul(s.softmax(-1), v)
        B, H, Lq, _ = s.shape
        sink = sinks.to(s.dtype).view(1, H, 1, 1).expand(B, H, Lq, 1)
        p = torch.cat([s, sink], dim=-1).softmax(-1)[..., :-1]  # the sink's share is dropped
        return torch.matmul(p, v)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
    )


def _prefill_mask(q_len: int, ctx: int, window: int | None, device: torch.device) -> torch.Tensor:
    """Boolean [Lq, ctx + Lq]: query i (absolute ctx + i) sees key j ≤ ctx + i, within the window."""
    rows = torch.arange(q_len, device=device)[:, None] + ctx
    cols = torch.arange(ctx + q_len, device=device)[None, :]
    mask = cols <= rows
    if window is not None:
        mask &= cols > rows - window
    return mask


def _prefill_kernel(q: torch.Tensor, v: torch.Tensor) -> bool:
    """Prefill rows take the C kernel (ops.attention_prefill: lanes of query rows, KV read from the pools as
    stored; 3.6x torch's CPU flash SDPA at 512 tokens, 2.3x at 2048) where the library runs and takes the head
    dims; else torch's SDPA below."""
    return ops.cpu_f32(q) and ops.kernels() is not None and max(q.shape[-1], v.shape[-1]) <= MAX_HEAD_DIM


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    batch: ForwardBatch,
    scale: float,
    k_pool: torch.Tensor | None = None,
    v_pool: torch.Tensor | None = None,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T, H, Dk]; k, v [T, Hkv, D*] for the new tokens (already written to the pools, if any);
    k_pool / v_pool [S, Hkv, D*], possibly of a narrower dtype than q: keys and values are then read back
    as stored (also a chunk's own new ones), so a prompt attends to the same values chunked or whole and
    as its later decode steps do. `softcap`: scores soft-capped, `sinks` [H]: per-head sink logits (see
    `_sdpa`). Returns [T, H, Dv]."""
    T, H, _ = q.shape
    nd = batch.num_decodes
    kernel = nd < batch.num_seqs and _prefill_kernel(q, v)
    on_kernel = kernel and k_pool is not None and v_pool is not None and batch.kv_indices is not None
    alone = kernel and k_pool is None  # no cache: the chunk's own keys as the kernel's pools (ctx is 0)
    if k_pool is not None and k_pool.dtype != q.dtype and not on_kernel:
        k, v = k.to(k_pool.dtype).to(q.dtype), v.to(k_pool.dtype).to(q.dtype)
    out = q.new_empty(T, H, v.shape[-1])
    if nd:
        assert k_pool is not None and v_pool is not None and batch.kv_indices is not None
        mask = batch.decode_mask(window)  # [Bd, 1, 1, L]
        idx = batch.kv_indices[:nd, : mask.shape[-1]]  # [Bd, L]
        kd = k_pool[idx].to(q.dtype).transpose(1, 2)  # [Bd, Hkv, L, Dk]
        vd = v_pool[idx].to(q.dtype).transpose(1, 2)
        od = _sdpa(q[:nd].unsqueeze(2), kd, vd, scale, mask, softcap=softcap, sinks=sinks)  # [Bd, H, 1, Dv]
        out[:nd] = od.squeeze(2)
    starts = batch.query_starts
    for b in range(nd, batch.num_seqs):
        s, n, ctx = starts[b], batch.query_lens[b], batch.context_lens[b]
        if on_kernel or (alone and ctx == 0):  # cacheless: a cached prefill's bits
            kb, vb, slots = (
                (k_pool, v_pool, batch.kv_indices[b])
                if on_kernel
                else (k[s : s + n].contiguous(), v[s : s + n].contiguous(), torch.arange(n))
            )
            kw = {"window": window, "sinks": sinks, "softcap": softcap, "out": out[s : s + n]}
            ops.attention_prefill(q[s : s + n], kb, vb, slots, ctx, scale, **kw)
            continue
        qb = q[s : s + n].transpose(0, 1).unsqueeze(0)  # [1, H, n, Dk]
        if ctx == 0:
            kb, vb = k[s : s + n], v[s : s + n]
        else:
            assert k_pool is not None and v_pool is not None and batch.kv_indices is not None
            idx = batch.kv_indices[b, : ctx + n]
            kb, vb = k_pool[idx].to(q.dtype), v_pool[idx].to(q.dtype)
        kb = kb.transpose(0, 1).unsqueeze(0)  # [1, Hkv, ctx + n, Dk]
        vb = vb.transpose(0, 1).unsqueeze(0)
        if ctx == 0 and window is None:
            ob = _sdpa(qb, kb, vb, scale, is_causal=True, softcap=softcap, sinks=sinks)
        else:
            ob = _sdpa(
                qb, kb, vb, scale, _prefill_mask(n, ctx, window, q.device), softcap=softcap, sinks=sinks
            )
        out[s : s + n] = ob.squeeze(0).transpose(0, 1)
    return out


class Attention(nn.Module):
    """GQA with fused qkv projection, optional RoPE (None = NoPE), optional biases and sliding window, q/k
    RMSNorm (`q_norm`, `k_norm`) and a sigmoid output gate (qkv_proj's rows [q | k | v | gate])."""

    def __init__(
        self, cfg: AttentionConfig, hidden_size: int, rope: RotaryEmbedding | None, tp: TPGroup | None = None
    ) -> None:
        """`tp`: this layer is one tensor-parallel shard (cfg holds its heads); only a q/k norm over all
        heads talks to the other ranks."""
        super().__init__()
        self.cfg = cfg
        self.norm_tp = tp if cfg.is_qk_norm_across_ranks else None
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.gate_size = self.q_size if cfg.has_output_gate else 0
        # the k and v rows qkv_proj holds: none (KV read from another layer), k only (v = k), or both
        self.num_kv_rows = 0 if cfg.kv_source is not None else (1 if cfg.is_v_from_k else 2) * self.kv_size
        out = self.q_size + self.num_kv_rows + self.gate_size
        self.qkv_proj = Linear(hidden_size, out, bias=cfg.has_qkv_bias)
        self.o_proj = Linear(self.q_size, hidden_size, bias=cfg.has_o_bias)
        if cfg.qk_norm is not None:  # per head: [Dh] weights; over all heads: [H·Dh], [Hkv·Dh]
            n = cfg.qk_norm
            self.q_norm = RMSNorm(
                cfg.head_dim if cfg.is_qk_norm_per_head else self.q_size, n.eps, n.weight_offset
            )
            if cfg.kv_source is None:
                self.k_norm = RMSNorm(
                    cfg.head_dim if cfg.is_qk_norm_per_head else self.kv_size, n.eps, n.weight_offset
                )
        if cfg.has_sinks:  # one logit per query head, kept float32 (the C decode attention reads it so)
            self.sinks = nn.Parameter(torch.empty(cfg.num_heads, dtype=torch.float32), requires_grad=False)
            self.sinks.keep_float32 = True
        if cfg.has_v_norm:  # weightless: a constant scale of ones for the kernel op
            self.register_buffer("v_norm_scale", torch.ones(cfg.head_dim, device="cpu"), persistent=False)
        self.rope = rope

    def _sinks(self) -> torch.Tensor | None:
        return self.sinks if self.cfg.has_sinks else None

    def _qk_norm(self, q: torch.Tensor, k: torch.Tensor | None) -> None:
        """q [T, H, Dh], k [T, Hkv, Dh] (views into the qkv output; None: KV read from another layer) normed
        in place, per head or per row."""
        if self.cfg.qk_norm is None:
            return
        if self.norm_tp is not None:
            self._qk_norm_across_ranks(q, k, self.norm_tp)
            return
        if not self.cfg.is_qk_norm_per_head:  # one group of all heads' features: [T, 1, H·Dh]
            q = q.flatten(1).unsqueeze(1)
            k = None if k is None else k.flatten(1).unsqueeze(1)
        ops.head_rms_norm(q, self.q_norm.weight, self.q_norm.eps)
        if k is not None:
            ops.head_rms_norm(k, self.k_norm.weight, self.k_norm.eps)

    def _qk_norm_across_ranks(self, q: torch.Tensor, k: torch.Tensor | None, tp: TPGroup) -> None:
        """The all-heads q/k norm of a shard (`_qk_norm`'s math, in place): each rank sums the squares of its
        heads' features, one all-reduce adds the ranks' sums (q's and k's side by side), and each rank scales
        its own features by the whole row's root mean square and its slice of the weights."""
        pairs = [(q.flatten(1), self.q_norm)] + ([] if k is None else [(k.flatten(1), self.k_norm)])
        normed = normed_across_ranks([v.float() for v, _ in pairs], [n.eps for _, n in pairs], tp)
        for (v, norm), y in zip(pairs, normed, strict=True):  # v: [T, H·Dh] / [T, Hkv·Dh], a view into qkv
            v.copy_((y * norm.weight).to(v.dtype))

    def _values(self, qkv: torch.Tensor, T: int) -> torch.Tensor:
        """v [T, Hkv, Dh]: qkv's v rows, or (`is_v_from_k`) its k rows taken before the k norm; RMS-normed
        without weights (`has_v_norm`: in place, or from k's rows into a buffer of its own). Call before the
        k norm."""
        cfg, q, kv = self.cfg, self.q_size, self.kv_size
        if cfg.is_v_from_k:
            k = qkv[:, q : q + kv].view(T, cfg.num_kv_heads, cfg.head_dim)
            if cfg.has_v_norm:  # normed into a buffer of its own, k as it is: a kernel op a plan holds
                assert cfg.qk_norm is not None
                out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
                return ops.head_rms_norm(k, self.v_norm_scale, cfg.qk_norm.eps, out=out)
            v = k.clone()
        else:
            v = qkv[:, q + kv : q + 2 * kv].view(T, cfg.num_kv_heads, cfg.head_dim)
        if cfg.has_v_norm:
            assert cfg.qk_norm is not None
            ops.head_rms_norm(v, self.v_norm_scale, cfg.qk_norm.eps)
        return v

    def _gate(self, o: torch.Tensor, qkv: torch.Tensor) -> torch.Tensor:
        """The output gate: o [T, H·Dh] · sigmoid(gate rows of qkv), in place (no gate: o as it is)."""
        if self.gate_size:
            ops.sigmoid_mul(o, qkv[:, self.q_size + self.num_kv_rows :])
        return o

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: LayerCache | None) -> torch.Tensor:
        if cache is not None and batch.is_decode_only and batch.decode_lens is not None and ops.cpu_f32(x):
            return self._decode(x, batch, cache)
        cfg, T, decode = self.cfg, x.shape[0], batch.is_decode_only
        qkv = self.qkv_proj(x, decode=decode)
        q = qkv[:, : self.q_size].view(T, cfg.num_heads, cfg.head_dim)
        if cfg.kv_source is not None:
            return self._shared_kv(q, qkv, batch, cache)
        v = self._values(qkv, T)
        k = qkv[:, self.q_size : self.q_size + self.kv_size].view(T, cfg.num_kv_heads, cfg.head_dim)
        self._qk_norm(q, k)
        on_cpu = ops.cpu_f32(qkv)
        if self.rope is not None and on_cpu:  # as the decode step: q and k heads back to back, in place
            qk = qkv[:, : self.q_size + self.kv_size].view(T, cfg.num_heads + cfg.num_kv_heads, cfg.head_dim)
            ops.rope_neox(qk, batch.positions, self.rope.cos, self.rope.sin, self.rope.dim)
        elif self.rope is not None:
            q = self.rope(q, batch.positions)
            k = self.rope(k, batch.positions)
        k_pool = v_pool = None
        if cache is not None and batch.has_cache:
            k_pool, v_pool = cache.k, cache.v
            if on_cpu:
                ops.kv_write(k, v, batch.slot_mapping, k_pool, v_pool)
            else:
                k_pool.index_copy_(0, batch.slot_mapping, k.to(k_pool.dtype))
                v_pool.index_copy_(0, batch.slot_mapping, v.to(v_pool.dtype))
        o = causal_attention(
            q, k, v, batch, cfg.softmax_scale, k_pool, v_pool, cfg.sliding_window, cfg.logit_softcap,
            self._sinks(),
        )  # fmt: skip
        return self.o_proj(self._gate(o.reshape(T, self.q_size), qkv), decode=batch.is_decode_only)

    def _shared_kv(
        self, q: torch.Tensor, qkv: torch.Tensor, batch: ForwardBatch, cache: LayerCache | None
    ) -> torch.Tensor:
        """Attention over the keys and values layer `kv_source` wrote (this layer's cache is that layer's):
        the new tokens' own rows read back from the pools, as stored. q [T, H, Dh] → [T, D]."""
        cfg, T = self.cfg, q.shape[0]
        assert cache is not None and batch.slot_mapping is not None, "a KV-sharing layer reads a cache"
        self._qk_norm(q, None)
        if self.rope is not None:
            q = self.rope(q, batch.positions)
        k_pool, v_pool = cache.k, cache.v
        k, v = k_pool[batch.slot_mapping].to(q.dtype), v_pool[batch.slot_mapping].to(q.dtype)
        o = causal_attention(
            q, k, v, batch, cfg.softmax_scale, k_pool, v_pool, cfg.sliding_window, cfg.logit_softcap
        )
        return self.o_proj(self._gate(o.reshape(T, self.q_size), qkv), decode=batch.is_decode_only)

    def _decode(self, x: torch.Tensor, batch: ForwardBatch, cache: LayerCache) -> torch.Tensor:
        """One token per sequence, float32 on the CPU, as kernel ops: RoPE on the q and k heads of the fused
        qkv output in place, keys / values into the pools, paged decode attention. x [B, D] → [B, D]."""
        cfg, B = self.cfg, x.shape[0]
        H, Hkv, Dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        assert cache.k is not None and cache.v is not None and batch.slot_mapping is not None
        qkv = self.qkv_proj(x, decode=True)  # [B, H·Dh + k / v rows (+ H·Dh gate)]
        q = qkv[:, : H * Dh].view(B, H, Dh)
        if cfg.kv_source is None:  # this layer's own keys and values into the pools
            v = self._values(qkv, B)
            k = qkv[:, H * Dh : (H + Hkv) * Dh].view(B, Hkv, Dh)
            self._qk_norm(q, k)
            if self.rope is not None:  # q and k heads back to back: one call
                qk = qkv[:, : (H + Hkv) * Dh].view(B, H + Hkv, Dh)
                ops.rope_neox(qk, batch.positions, self.rope.cos, self.rope.sin, self.rope.dim)
            ops.kv_write(k, v, batch.slot_mapping, cache.k, cache.v)
        else:  # KV shared: layer kv_source wrote this step's keys and values already
            self._qk_norm(q, None)
            if self.rope is not None:
                ops.rope_neox(q, batch.positions, self.rope.cos, self.rope.sin, self.rope.dim)
        o = ops.paged_attention_decode(
            q,
            cache.k,
            cache.v,
            batch.kv_indices,
            batch.decode_lens,
            cfg.softmax_scale,
            window=cfg.sliding_window,
            sinks=self._sinks(),
            softcap=cfg.logit_softcap,
        )
        return self.o_proj(self._gate(o.view(B, H * Dh), qkv), decode=True)


# ------------------------------------------------------------------------------------------- the kind


def _cache(cfg: AttentionConfig) -> tuple[CacheTensor, ...]:
    if cfg.kv_source is not None:  # reads layer kv_source's cache (mixers.cache_layout)
        return ()
    row, window = (cfg.num_kv_heads, cfg.head_dim), cfg.sliding_window
    return CacheTensor("k", row, "kv", window), CacheTensor("v", row, "kv", window)


def _fused(cfg: AttentionConfig, leaf: str) -> FusedParts | None:
    if not leaf.startswith("qkv_proj."):
        return None
    end = leaf.removeprefix("qkv_proj.")  # weight | bias
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    gate = ((f"q_gate.{end}", q),) if cfg.has_output_gate else ()
    k_v = ((f"k_proj.{end}", kv),) if cfg.is_v_from_k else ((f"k_proj.{end}", kv), (f"v_proj.{end}", kv))
    return FusedParts(((f"q_proj.{end}", q), *(k_v if cfg.kv_source is None else ()), *gate))


def _shard(cfg: AttentionConfig, world: int, where: str) -> AttentionConfig:
    check_divisible(cfg.num_heads, world, f"{where} attention heads")
    check_divisible(cfg.num_kv_heads, world, f"{where} KV heads")
    across = cfg.qk_norm is not None and not cfg.is_qk_norm_per_head and world > 1  # OLMo's all-heads norm
    return replace(
        cfg,
        num_heads=cfg.num_heads // world,
        num_kv_heads=cfg.num_kv_heads // world,
        is_qk_norm_across_ranks=across,
    )


def _slice(cfg: AttentionConfig, leaf: str, t: torch.Tensor, rank: int, world: int) -> torch.Tensor | None:
    if leaf.startswith("qkv_proj."):  # the rows `_fused` lays out: q, then k and v as the layer holds them
        q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        kv_rows = [] if cfg.kv_source is not None else [kv] if cfg.is_v_from_k else [kv, kv]
        sizes = [q, *kv_rows, *([q] if cfg.has_output_gate else [])]
        return split_segments(t, sizes, [True] * len(sizes), rank, world)
    if leaf == "o_proj.weight":
        return split_block(t, 1, rank, world)
    if leaf == "o_proj.bias":
        return rank0_only(t, rank)
    if leaf == "sinks":  # per query head: each rank its heads'
        return split_block(t, 0, rank, world)
    if leaf in ("q_norm.weight", "k_norm.weight") and not cfg.is_qk_norm_per_head:  # [H·Dh] / [Hkv·Dh]
        return split_block(t, 0, rank, world)
    return None


SPEC = MixerSpec(
    config=AttentionConfig,
    prefix="attn",
    build=lambda cfg, hidden_size, rope_for, tp: Attention(cfg, hidden_size, rope_for(cfg.rope), tp),
    cache=_cache,
    snapshot=Snapshot.BLOCKS,
    linears=("qkv_proj", "o_proj"),
    float_linears=(),
    fused=_fused,
    shard=_shard,
    slice=_slice,
    is_plan_safe=True,
    chains_rows=True,  # keys and values are written before any row attends
    graph_windows=lambda cfg: (cfg.sliding_window,),
)
