"""Multi-head Latent Attention (DeepSeek-V2/V3 and the oxidizr variant), with the naive and absorbed forms.

Per token the layer caches only the latent row [c_kv | k_rope] (Lkv + R values): the normed kv latent and the
rotated rope key shared by all heads. Two ways to attend over it, both kept (the naive one is the reference):
- naive: expand every key position with `kv_b_proj` into per-head [k_nope | v], then standard MHA over
  q = [q_nope | q_rope], k = [k_nope | k_rope]. Cheap per query-key pair, costly per key (an expansion).
- absorbed: fold W_UK into the query (q_lat = q_nope · W_UK, per head [Lkv]), attend with MQA straight over
  the cached latent rows (key = [c_kv | k_rope], value = c_kv), then apply W_UV to the latent-space output.
  No expansion, but every query-key pair costs Lkv + R (+ Lkv for the value) instead of Dn + R (+ Dv).
`impl="auto"` picks per sequence: decode rows are absorbed (one query per sequence: expansion would dominate);
a prefill chunk of n queries over ctx cached keys is absorbed when n·(ctx + n)·(2·Lkv − Dn − Dv) <
ctx·Lkv·(Dn + Dv) — the extra FLOPs of each form (per query-key pair vs per expanded cached key) — and naive
otherwise; a fresh prompt is always naive. At DeepSeek sizes a chunk of 16 or 64 over 4k cached tokens is
absorbed, 512 is naive (measured on CPU: 48 vs 208 ms and 136 vs 263 ms for the 16 and 64 chunks).
The naive form reads the cached positions [0, ctx) back from the pool and expands them once.
Decode rows run `_latent_decode` (heads as the rows of one score matrix per sequence); absorbed prefill rows
reuse `causal_attention` as MQA over the latent pool. A decode-only batch with float32 CPU activations runs
`_decode` instead: the same absorbed form as kernel ops (`ops.mla_cache_write`, `ops.linear_heads` with
W_UKᵀ, `ops.mla_decode`, `ops.linear_heads` with W_UV, whose torch references are this math), so a decode
step can be recorded (kernels/capture.py). Its per-head weights (`absorbed`: W_UKᵀ [H·Lkv, Dn] and W_UV
[H·Dv, Lkv], in a kernel weight format, e.g. Q8_0) are made by the loader from `kv_b_proj`
(loading/absorb.py); a rounded pair's values are written back into `kv_b_proj`, so the
prefill forms compute with the same weights.

Weights (all [out, in], no bias; H heads, Dn = qk_nope_head_dim, R = qk_rope_head_dim, Dv = v_head_dim):
- q path: `q_proj` [H·Dq, D] when q_lora_rank is None, else `q_a_proj` [Lq, D] → `q_a_norm` (if
  has_latent_norms) → `q_b_proj` [H·Dq, Lq]. DeepSeek: Dq = Dn + R, per head [q_nope | q_rope]. oxidizr
  (`is_q_rope_from_hidden`): Dq = Dn and the rope query comes from `q_rope_proj` [H·R, D] on the hidden state.
- kv path: `kv_a_proj` [Lkv + R, D] → [c_kv | k_rope] (HF `kv_a_proj_with_mqa`; oxidizr cat(w_dkv, w_kr));
  `kv_a_norm` on c_kv (if has_latent_norms); `kv_b_proj` [H·(Dn + Dv), Lkv], per head [k_nope | v] (HF
  layout; oxidizr: per head h, rows [w_uk[h·Dn:(h+1)·Dn]; w_uv[h·Dv:(h+1)·Dv]]).
- `o_proj` [D, H·Dv].
RoPE is the half-split (NeoX) layout on the last R features of q and the k_rope rows. DeepSeek checkpoints
rotate interleaved pairs; `interleaved_to_half_rows` permutes their rope rows at load so the math is equal.

`SPEC` declares the kind (model/mixer_spec.py): a paged latent row [Lkv + R] per token in the model dtype (a
prefix is its blocks); every projection quantizable but `kv_b_proj` (read whole by the absorbed forms and
made into the decode's per-head weights, loading/absorb.py); `kv_a_proj` fused from [c_kv | k_rope] and
`kv_b_proj` per head from [k_nope; v] (oxidizr stores them apart); tensor parallel splits the heads (the q
projections, `kv_b_proj` and `o_proj`'s columns) and replicates the latent (`q_a_proj`, `kv_a_proj`, their
norms, the latent cache); the decode plan may hold it, a CUDA graph not.

Shapes: T tokens, D hidden, H heads, Lq / Lkv latent ranks, Dn / R / Dv head dims, S cache slots, N key rows.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from blazr.config import MLAConfig
from blazr.distributed.split import check_divisible, split_block
from blazr.kernels import ops
from blazr.kernels.quant import QuantizedWeight
from blazr.model.attention import causal_attention
from blazr.model.mixer_spec import FusedParts, MixerSpec
from blazr.model.norm import RMSNorm
from blazr.model.qlinear import Linear
from blazr.model.rope import RotaryEmbedding
from blazr.state.batch import ForwardBatch
from blazr.state.kv_cache import LayerCache
from blazr.state.layout import CacheTensor, Snapshot

MLAImpl = Literal["auto", "naive", "absorb"]


def interleaved_to_half_rows(
    w: torch.Tensor, rope_dim: int, rows_per_head: int, rope_offset: int
) -> torch.Tensor:
    """Permute the rope rows of a DeepSeek projection from interleaved pairs to the half-split layout.

    `w` is a weight [rows, in] (or a bias [rows]) made of `rows / rows_per_head` blocks; in each block the
    `rope_dim` rows starting at `rope_offset` hold rope features as pairs (x0, x1), (x2, x3), …; they are
    reordered to (x0, x2, …, x1, x3, …), so a half-split rotation of the new rows equals HF's interleaved
    rotation of the old ones (HF V3 even outputs this half-split order). Other rows are untouched.

    DeepSeek uses: `q_b_proj` / `q_proj` → rows_per_head = Dn + R, rope_offset = Dn (one block per head);
    `kv_a_proj_with_mqa` → rows_per_head = Lkv + R, rope_offset = Lkv (one block).
    """
    rows = w.shape[0]
    if rope_dim % 2 or rope_offset + rope_dim > rows_per_head or rows % rows_per_head:
        raise ValueError(
            f"cannot permute rope rows: {rows} rows, {rows_per_head} rows per head, rope rows "
            f"[{rope_offset}, {rope_offset + rope_dim}) (rope_dim must be even and fit in a head)"
        )
    block = torch.arange(rows_per_head)
    block[rope_offset : rope_offset + rope_dim] = rope_offset + torch.cat(
        (torch.arange(0, rope_dim, 2), torch.arange(1, rope_dim, 2))
    )
    heads = torch.arange(rows // rows_per_head)[:, None] * rows_per_head
    return w[(heads + block[None, :]).flatten().to(w.device)]


def _pad_to(v: torch.Tensor, dim: int) -> torch.Tensor:
    """Zero-pad the value head dim up to the query/key head dim: SDPA's fused CPU kernel needs them equal
    (otherwise it falls back to the math path, 3× slower and with O(n²) score memory); the zero columns of
    the output are sliced off by the caller."""
    return v if v.shape[-1] >= dim else F.pad(v, (0, dim - v.shape[-1]))


class MLA(nn.Module):
    """MLA over a flat batch; `impl` picks the attention form ("auto": absorbed decode, naive prefill)."""

    def __init__(
        self, cfg: MLAConfig, hidden_size: int, rope: RotaryEmbedding, impl: MLAImpl = "auto"
    ) -> None:
        super().__init__()
        assert rope.dim == cfg.qk_rope_head_dim, "the MLA rotary embedding spans the rope head dim"
        self.cfg = cfg
        self.impl = impl
        self.rope = rope
        H, Dn, R, Dv, Lkv = (
            cfg.num_heads,
            cfg.qk_nope_head_dim,
            cfg.qk_rope_head_dim,
            cfg.v_head_dim,
            cfg.kv_lora_rank,
        )
        q_head_dim = Dn if cfg.is_q_rope_from_hidden else Dn + R
        if cfg.q_lora_rank is None:
            self.q_proj = Linear(hidden_size, H * q_head_dim, bias=False)
        else:
            self.q_a_proj = Linear(hidden_size, cfg.q_lora_rank, bias=False)
            if cfg.has_latent_norms:
                self.q_a_norm = RMSNorm(cfg.q_lora_rank, cfg.norm_eps)
            self.q_b_proj = Linear(cfg.q_lora_rank, H * q_head_dim, bias=False)
        if cfg.is_q_rope_from_hidden:
            self.q_rope_proj = Linear(hidden_size, H * R, bias=False)
        self.kv_a_proj = Linear(hidden_size, Lkv + R, bias=False)
        if cfg.has_latent_norms:
            self.kv_a_norm = RMSNorm(Lkv, cfg.norm_eps)
        self.kv_b_proj = Linear(Lkv, H * (Dn + Dv), bias=False)
        self.o_proj = Linear(H * Dv, hidden_size, bias=False)
        # kv_b_proj's per-head halves for the decode kernels: (W_UKᵀ [H·Lkv, Dn], W_UV [H·Dv, Lkv]), set by
        # the loader (`absorb_mla`); None: decode steps take the torch forms
        self.absorbed: tuple[QuantizedWeight, QuantizedWeight] | None = None

    # ---------------------------------------------------------------------------------------------------
    # Projections.
    # ---------------------------------------------------------------------------------------------------

    def _query_parts(self, x: torch.Tensor, decode: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, D] → q_nope [T, H, Dn], q_rope [T, H, R] before rotation (views of the projections)."""
        cfg, T = self.cfg, x.shape[0]
        if cfg.q_lora_rank is None:
            q = self.q_proj(x, decode=decode)
        else:
            c_q = self.q_a_proj(x, decode=decode)  # [T, Lq]
            if cfg.has_latent_norms:
                c_q = self.q_a_norm(c_q)
            q = self.q_b_proj(c_q, decode=decode)
        if cfg.is_q_rope_from_hidden:
            q_nope = q.view(T, cfg.num_heads, cfg.qk_nope_head_dim)
            q_rope = self.q_rope_proj(x, decode=decode).view(T, cfg.num_heads, cfg.qk_rope_head_dim)
        else:
            q = q.view(T, cfg.num_heads, cfg.qk_nope_head_dim + cfg.qk_rope_head_dim)
            q_nope, q_rope = q.split([cfg.qk_nope_head_dim, cfg.qk_rope_head_dim], dim=-1)
        return q_nope, q_rope

    def _queries(
        self, x: torch.Tensor, positions: torch.Tensor, decode: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, D] → q_nope [T, H, Dn], rotated q_rope [T, H, R]."""
        q_nope, q_rope = self._query_parts(x, decode)
        return q_nope, self.rope(q_rope, positions)

    def _latents(self, x: torch.Tensor, positions: torch.Tensor, decode: bool) -> torch.Tensor:
        """x [T, D] → the cache rows [T, Lkv + R]: normed c_kv, then the rotated k_rope."""
        c_kv, k_rope = self.kv_a_proj(x, decode=decode).split(
            [self.cfg.kv_lora_rank, self.cfg.qk_rope_head_dim], dim=-1
        )
        if self.cfg.has_latent_norms:
            c_kv = self.kv_a_norm(c_kv)
        k_rope = self.rope(k_rope.unsqueeze(1), positions).squeeze(1)  # one shared rope head
        return torch.cat((c_kv, k_rope), dim=-1)

    def _kv_b_heads(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W_UK [H, Dn, Lkv] and W_UV [H, Dv, Lkv], views of kv_b_proj.weight."""
        cfg = self.cfg
        w = self.kv_b_proj.weight.view(cfg.num_heads, cfg.qk_nope_head_dim + cfg.v_head_dim, cfg.kv_lora_rank)
        return w[:, : cfg.qk_nope_head_dim], w[:, cfg.qk_nope_head_dim :]

    # ---------------------------------------------------------------------------------------------------
    # The two attention forms. Both take q parts of the batch's T tokens and return [T, H, Dv].
    # ---------------------------------------------------------------------------------------------------

    def _expand(self, latent: torch.Tensor, decode: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """latent rows [N, Lkv + R] → k [N, H, Dn + R], v [N, H, Dv]."""
        cfg, N = self.cfg, latent.shape[0]
        Lkv, Dn = cfg.kv_lora_rank, cfg.qk_nope_head_dim
        kv = self.kv_b_proj(latent[:, :Lkv], decode=decode).view(N, cfg.num_heads, Dn + cfg.v_head_dim)
        k_nope, v = kv.split([Dn, cfg.v_head_dim], dim=-1)
        k_rope = latent[:, None, Lkv:].expand(N, cfg.num_heads, cfg.qk_rope_head_dim)
        return torch.cat((k_nope, k_rope), dim=-1), v

    def _naive(
        self,
        q_nope: torch.Tensor,
        q_rope: torch.Tensor,
        latent_new: torch.Tensor,
        batch: ForwardBatch,
        pool: torch.Tensor | None,
        decode: bool,
    ) -> torch.Tensor:
        """Standard MHA on expanded keys (`kv_b_proj` runs as the forward's batch asks: `decode`). With a
        pool, the rows to expand are the new tokens' latents followed by each sequence's cached positions
        [0, ctx); `kv_indices` is rewritten to point into that compact set, so every key row is expanded once
        and `causal_attention` runs unchanged."""
        q = torch.cat((q_nope, q_rope), dim=-1)  # [T, H, Dn + R]
        T = q.shape[0]
        if pool is None:
            k, v = self._expand(latent_new, decode)
            v = _pad_to(v, q.shape[-1])
            return causal_attention(q, k, v, batch, self.cfg.softmax_scale)[..., : self.cfg.v_head_dim]
        assert batch.kv_indices is not None
        device = batch.kv_indices.device
        table = torch.zeros_like(batch.kv_indices)  # [B, Lmax] rows of the compact key set
        cached, num_cached = [], 0
        lens = zip(batch.query_starts, batch.query_lens, batch.context_lens, strict=True)
        for b, (s, n, ctx) in enumerate(lens):
            cached.append(batch.kv_indices[b, :ctx])
            table[b, :ctx] = torch.arange(T + num_cached, T + num_cached + ctx, device=device)
            table[b, ctx : ctx + n] = torch.arange(s, s + n, device=device)
            num_cached += ctx
        rows = latent_new
        if num_cached:
            rows = torch.cat((latent_new, pool[torch.cat(cached)].to(latent_new.dtype)))
        k_all, v_all = self._expand(rows, decode)  # [T + Σctx, H, *]
        v_all = _pad_to(v_all, q.shape[-1])
        compact = ForwardBatch(
            positions=batch.positions,
            query_lens=batch.query_lens,
            context_lens=batch.context_lens,
            num_decodes=batch.num_decodes,
            logits_indices=batch.logits_indices,
            slot_mapping=batch.slot_mapping,
            kv_indices=table,
        )
        o = causal_attention(q, k_all[:T], v_all[:T], compact, self.cfg.softmax_scale, k_all, v_all)
        return o[..., : self.cfg.v_head_dim]

    def _absorbed(
        self,
        q_nope: torch.Tensor,
        q_rope: torch.Tensor,
        latent_new: torch.Tensor,
        batch: ForwardBatch,
        pool: torch.Tensor | None,
        decode: bool,
    ) -> torch.Tensor:
        """MQA over the latent rows: q_abs = [q_nope · W_UK | q_rope] [T, H, Lkv + R], one shared key head
        [c_kv | k_rope], value head c_kv; the latent-space output [T, H, Lkv] is mapped by W_UV. Decode rows
        use `_latent_decode`; prefill rows use `causal_attention` with k_pool / v_pool = latent views.
        (`decode` is unused: this form runs no linear layer.)"""
        Lkv, nd, T = self.cfg.kv_lora_rank, batch.num_decodes, q_nope.shape[0]
        w_uk, w_uv = self._kv_b_heads()
        q_lat = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # [T, H, Lkv]
        q_abs = torch.cat((q_lat, q_rope), dim=-1)
        o_lat = q_abs.new_empty(T, self.cfg.num_heads, Lkv)
        if nd:
            assert pool is not None
            o_lat[:nd] = self._latent_decode(q_abs[:nd], pool, batch)
        if nd < batch.num_seqs:
            sub = batch.prefill_part() if nd else batch
            # value = the whole latent row (its rope tail is dropped after): equal head dims keep SDPA on its
            # fused CPU kernel, which unequal ones (v = c_kv alone) lose
            kv = latent_new[nd:, None, :]  # [n, 1, Lkv + R]
            kv_pool = None if pool is None else pool[:, None, :]
            o = causal_attention(q_abs[nd:], kv, kv, sub, self.cfg.softmax_scale, kv_pool, kv_pool)
            o_lat[nd:] = o[..., :Lkv]
        return torch.bmm(o_lat.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)  # [T, H, Dv]

    def _latent_decode(self, q_abs: torch.Tensor, pool: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """Decode rows q_abs [Bd, H, Lkv + R] → latent-space outputs [Bd, H, Lkv].

        All heads share one key row per position, so the heads are the rows of one [H, L] score matrix per
        sequence: one gather of the latent rows and two bmm, scores and softmax in float32. Measured on CPU
        (16 heads, Lkv 512, R 64, 1 thread): 1.2-4× faster than `causal_attention` with value = the whole
        latent row (two gathers, SDPA's GQA kernel), ~100× faster than with value = c_kv (Dk ≠ Dv sends SDPA
        to its math path, which also materialises the GQA-expanded keys)."""
        nd = q_abs.shape[0]
        mask = batch.decode_mask()  # [Bd, 1, 1, L]
        lat = pool[batch.kv_indices[:nd, : mask.shape[-1]]].float()  # [Bd, L, Lkv + R]
        scores = torch.bmm(q_abs.float(), lat.transpose(1, 2)) * self.cfg.softmax_scale  # [Bd, H, L]
        probs = scores.masked_fill_(~mask[:, 0], float("-inf")).softmax(dim=-1)
        return torch.bmm(probs, lat[..., : self.cfg.kv_lora_rank]).to(q_abs.dtype)

    # ---------------------------------------------------------------------------------------------------

    def _decode(self, x: torch.Tensor, batch: ForwardBatch, cache: LayerCache) -> torch.Tensor:
        """One token per sequence, float32 on the CPU, as kernel ops (a recordable step): the q projections,
        q_rope rotated in place, the latent row normed, rotated and written by `mla_cache_write`, then q_lat =
        q_nope · W_UK per head, the absorbed attention over the latent pool, and W_UV per head. x [B, D]."""
        cfg, B = self.cfg, x.shape[0]
        assert cache.latent is not None and batch.slot_mapping is not None and batch.kv_indices is not None
        assert self.absorbed is not None
        w_uk_t, w_uv = self.absorbed
        q_nope, q_rope = self._query_parts(x, True)
        cos, sin = self.rope.cos, self.rope.sin
        ops.rope_neox(q_rope, batch.positions, cos, sin, cfg.qk_rope_head_dim)
        norm = self.kv_a_norm.weight if cfg.has_latent_norms else None
        ops.mla_cache_write(
            self.kv_a_proj(x, decode=True), norm, cfg.norm_eps, batch.positions, cos, sin, batch.slot_mapping,
            cache.latent,
        )  # fmt: skip
        q_lat = ops.linear_heads(q_nope, w_uk_t)  # [B, H, Lkv]
        o_lat = ops.mla_decode(
            q_lat, q_rope, cache.latent, batch.kv_indices, batch.decode_lens, cfg.softmax_scale
        )  # [B, H, Lkv]
        o = ops.linear_heads(o_lat, w_uv)  # [B, H, Dv]
        return self.o_proj(o.view(B, cfg.num_heads * cfg.v_head_dim), decode=True)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: LayerCache | None) -> torch.Tensor:
        """x [T, D] → [T, D]. Writes the new tokens' latent rows to `cache.latent` at `batch.slot_mapping`."""
        if (
            cache is not None
            and batch.is_decode_only
            and batch.decode_lens is not None
            and self.absorbed is not None
            and ops.cpu_f32(x)
        ):
            return self._decode(x, batch, cache)
        cfg, T, decode = self.cfg, x.shape[0], batch.is_decode_only
        q_nope, q_rope = self._queries(x, batch.positions, decode)
        latent_new = self._latents(x, batch.positions, decode)  # [T, Lkv + R]
        pool = None
        if cache is not None and batch.has_cache:
            assert cache.latent is not None and cache.latent.shape[1] == latent_new.shape[1]
            pool = cache.latent
            pool.index_copy_(0, batch.slot_mapping, latent_new.to(pool.dtype))
        if self.impl != "auto":
            form = self._absorbed if self.impl == "absorb" else self._naive
            o = form(q_nope, q_rope, latent_new, batch, pool, decode)
        else:  # runs of consecutive sequences that take the same form (decodes first, so at most a few)
            o = q_nope.new_empty(T, cfg.num_heads, cfg.v_head_dim)
            for b0, b1, is_absorbed in self._runs(batch):
                sub = batch.select(b0, b1)
                rows = slice(batch.query_starts[b0], batch.query_starts[b0] + sub.num_tokens)
                form = self._absorbed if is_absorbed else self._naive
                o[rows] = form(q_nope[rows], q_rope[rows], latent_new[rows], sub, pool, decode)
        return self.o_proj(o.reshape(T, cfg.num_heads * cfg.v_head_dim), decode=decode)

    def _runs(self, batch: ForwardBatch) -> list[tuple[int, int, bool]]:
        """Split the batch's sequences into runs [b0, b1) by form: decode rows are absorbed; a prefill chunk
        of n queries over ctx cached keys is absorbed when that is cheaper by the FLOP model in the module
        docstring (short chunks over long contexts), else naive."""
        cfg = self.cfg
        per_pair = 2 * cfg.kv_lora_rank - cfg.qk_nope_head_dim - cfg.v_head_dim
        per_key = cfg.kv_lora_rank * (cfg.qk_nope_head_dim + cfg.v_head_dim)
        runs: list[tuple[int, int, bool]] = []
        for b, (n, ctx) in enumerate(zip(batch.query_lens, batch.context_lens, strict=True)):
            is_absorbed = b < batch.num_decodes or n * (ctx + n) * per_pair < ctx * per_key
            if runs and runs[-1][2] == is_absorbed:
                runs[-1] = (runs[-1][0], b + 1, is_absorbed)
            else:
                runs.append((b, b + 1, is_absorbed))
        return runs


# ------------------------------------------------------------------------------------------- the kind


def _fused(cfg: MLAConfig, leaf: str) -> FusedParts | None:
    if leaf == "kv_a_proj.weight":
        return FusedParts((("kv_a_proj.latent", cfg.kv_lora_rank), ("kv_a_proj.rope", cfg.qk_rope_head_dim)))
    if leaf == "kv_b_proj.weight":
        H = cfg.num_heads
        parts = (("kv_b_proj.k", H * cfg.qk_nope_head_dim), ("kv_b_proj.v", H * cfg.v_head_dim))
        return FusedParts(parts, num_heads=H)
    return None


def _shard(cfg: MLAConfig, world: int, where: str) -> MLAConfig:
    check_divisible(cfg.num_heads, world, f"{where} MLA heads")
    return replace(cfg, num_heads=cfg.num_heads // world)


def _slice(cfg: MLAConfig, leaf: str, t: torch.Tensor, rank: int, world: int) -> torch.Tensor | None:
    if leaf.split(".")[0] in ("q_proj", "q_b_proj", "q_rope_proj", "kv_b_proj"):
        return split_block(t, 0, rank, world)
    if leaf == "o_proj.weight":
        return split_block(t, 1, rank, world)
    return None  # q_a_proj, kv_a_proj and their norms: the latent is replicated


SPEC = MixerSpec(
    config=MLAConfig,
    prefix="mla",
    build=lambda cfg, hidden_size, rope_for, tp: MLA(cfg, hidden_size, rope_for(cfg.rope)),
    cache=lambda cfg: (CacheTensor("latent", (cfg.kv_lora_rank + cfg.qk_rope_head_dim,), "model"),),
    snapshot=Snapshot.BLOCKS,
    linears=("q_proj", "q_a_proj", "q_b_proj", "q_rope_proj", "kv_a_proj", "o_proj"),
    float_linears=("kv_b_proj",),
    fused=_fused,
    shard=_shard,
    slice=_slice,
    is_plan_safe=True,
    chains_rows=True,  # the latent cache is written before any row attends
    graph_windows=None,
)
