"""DecodePlan: one CPU decode step of a pure-attention model (every layer GQA attention + gated SiLU MLP,
RMSNorm) as a recorded KernelPlan — one C call over static buffers instead of ~10 torch ops per layer.

Per layer, on the rows of B sequences (one new token each):

    x = rms_norm(h);  qkv = x · Wqkvᵀ (+ b);  rope(q, k) in place;  kv_write(k, v → pools)
    a = paged_attention_decode(q, pools, kv_indices, seq_lens, window);  h += a · Woᵀ (+ b)
    x = rms_norm(h);  act = silu(gate) · up of x · Wgate_upᵀ (+ b);  h += act · Wdownᵀ (+ b)

then logits = rms_norm(h) · Wheadᵀ. The embedding lookup (`torch.index_select` into h) runs before the plan.
Weights are read in place: an fp32 `nn.Linear` weight is wrapped as an "f32" QuantizedWeight without a
copy, a `QuantizedLinear` gives its own. One plan is recorded per batch size B ≤ Bmax, lazily, over the
[:B] views of the buffers (the kernels capture pointers, not values), and replayed every step with new
ids, positions, slots, block tables and lengths. `create` returns None for what the kernels do not cover.

A row's result does not depend on B, bit for bit, so a decode token is the same batched or alone: every
kernel computes a row by the same operations whatever else is in the call (attention splits a sequence's
keys by its own length only). That matters: block-quantized linears quantize their input to 8 bits, which
would turn a last-bit difference into a visible one.

Shapes: B sequences (≤ Bmax = max_num_seqs), D hidden, H / Hkv heads, Dh head dim, W = (H + 2·Hkv)·Dh,
I intermediate, V vocabulary, Lmax kv_indices width (max_model_len rounded up to blocks), S cache slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from blazr import kernels
from blazr.config import EngineConfig, LayerConfig, ModelConfig
from blazr.kernels import ops
from blazr.kernels.bindings import KernelPlan, UnsupportedInput
from blazr.kernels.quant import QuantizedWeight
from blazr.model.model import CausalLM
from blazr.model.norm import RMSNorm
from blazr.model.qlinear import QuantizedLinear
from blazr.model.rope import RotaryEmbedding
from blazr.state.kv_cache import ModelCache

_F32 = torch.float32


@dataclass(frozen=True)
class _Linear:
    weight: QuantizedWeight
    bias: torch.Tensor | None  # [N] fp32


@dataclass(frozen=True)
class _Layer:
    """Everything one layer's kernel calls read (tensors shared with the model and the cache)."""

    norm: RMSNorm  # weight [D]
    qkv: _Linear  # [W, D]
    o: _Linear  # [D, H·Dh]
    ffn_norm: RMSNorm
    gate_up: _Linear  # [2I, D]
    down: _Linear  # [D, I]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    window: int | None
    cos: torch.Tensor  # [P, R/2]
    sin: torch.Tensor
    rot_dim: int
    k_pool: torch.Tensor  # [S, Hkv, Dh]
    v_pool: torch.Tensor

    @property
    def qkv_width(self) -> int:
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim


def _is_f32_cpu(t: torch.Tensor | None) -> bool:
    return t is None or (t.dtype is _F32 and t.is_cpu and t.is_contiguous())


def _linear_of(m: nn.Module | None) -> _Linear | None:
    """The kernel weight of an fp32 nn.Linear (zero-copy) or a QuantizedLinear; None for anything else."""
    if isinstance(m, QuantizedLinear):
        bias = None if m.bias is None else m.bias.data
        ok = m.qweight.data.is_cpu and _is_f32_cpu(bias)
        return _Linear(m.qweight, bias) if ok else None
    if type(m) is nn.Linear:
        w, bias = m.weight.data, None if m.bias is None else m.bias.data
        if not (_is_f32_cpu(w) and _is_f32_cpu(bias)):
            return None
        return _Linear(QuantizedWeight("f32", w, m.out_features, m.in_features), bias)
    return None


def _tied_head(embed: torch.Tensor) -> _Linear | None:
    """A tied lm head: the embedding table [V, D] read in place."""
    ok = _is_f32_cpu(embed)
    return _Linear(QuantizedWeight("f32", embed, *embed.shape), None) if ok else None


def _is_supported_layer(cfg: LayerConfig) -> bool:
    a, mlp = cfg.attention, cfg.mlp
    return (
        a is not None
        and cfg.mla is None
        and cfg.mamba is None
        and cfg.moe is None
        and mlp is not None
        and mlp.is_gated
        and mlp.activation == "silu"
        and cfg.norm.kind == "rms"
        and cfg.ffn_norm.kind == "rms"
        and a.rope is not None
        and a.num_heads % a.num_kv_heads == 0
        and (a.sliding_window is None or a.sliding_window > 0)
    )


def _is_supported_model(cfg: ModelConfig) -> bool:
    return (
        cfg.residual_multiplier == 1.0
        and cfg.embedding_multiplier == 1.0
        and cfg.logits_scale == 1.0
        and cfg.final_norm.kind == "rms"
        and all(_is_supported_layer(layer) for layer in cfg.layers)
    )


def _layer_of(model: CausalLM, cache: ModelCache, i: int) -> _Layer | None:
    block, lc = model.layers[i], cache.layer(i)
    attn, mlp, cfg = block.attn, block.mlp, model.cfg.layers[i].attention
    assert attn is not None and mlp is not None and cfg is not None  # _is_supported_layer
    rope = attn.rope
    if not isinstance(block.mixer_norm, RMSNorm) or not isinstance(block.ffn_norm, RMSNorm):
        return None
    if not isinstance(rope, RotaryEmbedding) or rope.dim % 2 or rope.dim > cfg.head_dim:
        return None
    if lc.k is None or lc.v is None or not (_is_f32_cpu(rope.cos) and _is_f32_cpu(rope.sin)):
        return None
    linears = [_linear_of(m) for m in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)]
    norms = [block.mixer_norm.weight.data, block.ffn_norm.weight.data]
    if any(lin is None for lin in linears) or not all(_is_f32_cpu(w) for w in norms):
        return None
    qkv, o, gate_up, down = linears
    assert qkv is not None and o is not None and gate_up is not None and down is not None
    return _Layer(
        norm=block.mixer_norm,
        qkv=qkv,
        o=o,
        ffn_norm=block.ffn_norm,
        gate_up=gate_up,
        down=down,
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        scale=cfg.softmax_scale,
        window=cfg.sliding_window,
        cos=rope.cos,
        sin=rope.sin,
        rot_dim=rope.dim,
        k_pool=lc.k,
        v_pool=lc.v,
    )


class DecodePlan:
    """Static buffers for up to `max_seqs` decode rows and one recorded KernelPlan per batch size."""

    def __init__(
        self,
        layers: list[_Layer],
        final_norm: RMSNorm,
        embed: torch.Tensor,
        lm_head: _Linear,
        max_seqs: int,
        max_len: int,
    ) -> None:
        self.layers, self.final_norm = layers, final_norm
        self.embed, self.lm_head = embed, lm_head  # embed [V, D]
        self.max_seqs, self.max_len = max_seqs, max_len
        Bm, D = max_seqs, embed.shape[1]
        self.h = torch.zeros(Bm, D)  # residual stream
        self.x = torch.zeros(Bm, D)  # normed input of each projection
        # Flat scratch so that layers of different widths get contiguous [B, width] views.
        self.qkv = torch.zeros(Bm * max(layer.qkv_width for layer in layers))
        self.attn = torch.zeros(Bm * max(layer.num_heads * layer.head_dim for layer in layers))
        self.act = torch.zeros(Bm * max(layer.down.weight.in_features for layer in layers))
        self.logits = torch.zeros(Bm, lm_head.weight.out_features)
        self.ids = torch.zeros(Bm, dtype=torch.int64)
        self.positions = torch.zeros(Bm, dtype=torch.int64)
        self.slot_mapping = torch.zeros(Bm, dtype=torch.int64)
        self.seq_lens = torch.ones(Bm, dtype=torch.int64)
        self.kv_indices = torch.zeros(Bm, max_len, dtype=torch.int64)
        self._plans: dict[int, KernelPlan] = {}
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
        """The plan for `model` on `cache`, or None when fused decode is off or anything is unsupported
        (not CPU fp32, no kernel library, a layer that is not attention + SiLU MLP with RMSNorm, …)."""
        if not engine_cfg.fused_decode or torch.device(device).type != "cpu" or dtype != _F32:
            return None
        if not kernels.available() or not _is_supported_model(model.cfg):
            return None
        found = [_layer_of(model, cache, i) for i in range(len(model.layers))]
        layers = [layer for layer in found if layer is not None]
        embed, norm, bs = model.embed_tokens.weight.data, model.norm, engine_cfg.block_size
        head = _linear_of(model.lm_head) if model.lm_head is not None else _tied_head(embed)
        if not layers or len(layers) != len(found) or head is None or not isinstance(norm, RMSNorm):
            return None
        if not (_is_f32_cpu(norm.weight.data) and _is_f32_cpu(embed)):
            return None
        if any(layer.cos.shape[0] < engine_cfg.max_model_len for layer in layers):
            return None  # positions past the rope table
        max_len = -(-engine_cfg.max_model_len // bs) * bs
        plan = cls(layers, norm, embed, head, engine_cfg.max_num_seqs, max_len)
        try:
            plan._plan(1)  # records every call once: shapes, dtypes and layouts the kernels reject fail here
        except (UnsupportedInput, ValueError):
            return None
        return plan

    # ----------------------------------------------------------------------------------------- record

    def _record(self, B: int) -> KernelPlan:
        h, x, pos = self.h[:B], self.x[:B], self.positions[:B]
        slots, lens, idx = self.slot_mapping[:B], self.seq_lens[:B], self.kv_indices[:B]
        with ops.record() as plan:
            for layer in self.layers:
                H, Hkv, Dh = layer.num_heads, layer.num_kv_heads, layer.head_dim
                qkv = self.qkv[: B * layer.qkv_width].view(B, layer.qkv_width)
                q = qkv[:, : H * Dh].view(B, H, Dh)  # row-strided views into the fused output
                qk = qkv[:, : (H + Hkv) * Dh].view(B, H + Hkv, Dh)
                k = qkv[:, H * Dh : (H + Hkv) * Dh].view(B, Hkv, Dh)
                v = qkv[:, (H + Hkv) * Dh :].view(B, Hkv, Dh)
                attn = self.attn[: B * H * Dh].view(B, H, Dh)
                act = self.act[: B * layer.down.weight.in_features].view(B, -1)
                ops.rms_norm(h, layer.norm.weight.data, layer.norm.eps, out=x)
                ops.linear(x, layer.qkv.weight, layer.qkv.bias, out=qkv)
                ops.rope_neox(qk, pos, layer.cos, layer.sin, layer.rot_dim)  # q and k heads in one call
                ops.kv_write(k, v, slots, layer.k_pool, layer.v_pool)
                ops.paged_attention_decode(
                    q, layer.k_pool, layer.v_pool, idx, lens, layer.scale, window=layer.window, out=attn
                )
                ops.linear(attn.view(B, H * Dh), layer.o.weight, layer.o.bias, residual=h, out=h)
                ops.rms_norm(h, layer.ffn_norm.weight.data, layer.ffn_norm.eps, out=x)
                ops.linear(x, layer.gate_up.weight, layer.gate_up.bias, swiglu=True, out=act)
                ops.linear(act, layer.down.weight, layer.down.bias, residual=h, out=h)
            ops.rms_norm(h, self.final_norm.weight.data, self.final_norm.eps, out=x)
            ops.linear(x, self.lm_head.weight, self.lm_head.bias, out=self.logits[:B])
        return plan

    @property
    def batch_sizes(self) -> list[int]:
        """The batch sizes recorded so far."""
        return sorted(self._plans)

    def _plan(self, B: int) -> KernelPlan:
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
    ) -> torch.Tensor:
        """One decode step of B sequences: ids, positions, slot_mapping, seq_lens [B] int64 and
        kv_indices [B, L ≤ Lmax] (only the first seq_lens[b] entries of row b are read). Returns the
        logits [B, V] float32 — a view of the plan's buffer, valid until the next run."""
        B, width = kv_indices.shape
        if not (0 < B <= self.max_seqs and width <= self.max_len):
            raise ValueError(
                f"decode plan: {B} sequences × {width} slots, at most {self.max_seqs} × {self.max_len}"
            )
        self.ids[:B].copy_(ids)
        self.positions[:B].copy_(positions)
        self.slot_mapping[:B].copy_(slot_mapping)
        self.seq_lens[:B].copy_(seq_lens)
        self.kv_indices[:B, :width].copy_(kv_indices)
        torch.index_select(self.embed, 0, self.ids[:B], out=self.h[:B])
        self._plan(B).run()
        self.num_runs += 1
        return self.logits[:B]
