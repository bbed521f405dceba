"""The kernel operations: dispatch between the C kernels (`bindings.py`) and their plain-torch references
(`reference.py`, `reference_attention.py`, `reference_conv.py`, `reference_deltanet.py`, `reference_kda.py`,
`reference_mamba1.py`, `reference_mamba2.py`, `reference_moe_mla.py`, `reference_sample.py`); both are
re-exported here, so every `op` has its `op_reference` beside it.

Each public op (`embedding`, `embedding_rows`, `add`, `activation`, `softcap`, `linear`, `rms_norm`,
`gated_rms_norm`, `rope_neox`, `kv_write`, `paged_attention_decode`, `attention_prefill`, `mamba2_step`,
`mamba2_prefill`, `deltanet_step`, `deltanet_prefill`, `kda_step`, `kda_prefill`, `head_rms_norm`,
`sigmoid_mul`, `mul`, `copy_rows`, `causal_conv_step`, `causal_conv_prefill`,
`mamba1_dt_bc`, `mamba1_scan_step`, `mamba1_scan_prefill`, `moe_route`, `moe_experts`, `mla_cache_write`,
`mla_decode`, `linear_heads`; the token choice `argmax_rows`,
`sample_rows`) runs the C kernel when the library is available and the inputs are CPU tensors of the
supported dtypes and layouts (fp32 activations and states, int64 indices, fp32 or 16-bit KV pools), else
its `*_reference` twin with the same signature.
`Kernels` binds one built library (tests also bind a second, scalar-fallback build). `record()` captures
a sequence of kernel calls on static buffers as a `KernelPlan` that replays them with one C call.

This module is the one import point (`from blazr.kernels import ops; ops.linear(...)`). It defines the
linear, embedding, elementwise, norm, RoPE, KV-write / attention and token-choice ops; the others live by
family and are re-exported here: `ops_recurrent.py` (Mamba2, DeltaNet, KDA, causal conv, Mamba1) and
`ops_moe_mla.py` (MoE router and experts, MLA cache write and decode, per-head linear). The library state
and the dispatch (`kernels()`, `reset()`, `cpu_f32`, `_dispatch`, `record()`) live in `dispatch.py`.

Shapes: M rows (tokens), K in features, N out features (SwiGLU: N = 2·I rows [gate; up] → I outputs);
T tokens, H query heads, Hkv kv heads, G = H / Hkv, Dh / D / Dv head dims, R rotary dims, P table rows;
B sequences, S cache slots, Lmax kv_indices width; E experts, k chosen per token, I expert width; MLA: Dn /
R / Dv head dims, L latent rank.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from blazr.kernels.bindings import Kernels
from blazr.kernels.calls import KernelPlan, UnsupportedInput
from blazr.kernels.dispatch import _dispatch, cpu_f32, kernels, record, reset
from blazr.kernels.ops_moe_mla import linear_heads, mla_cache_write, mla_decode, moe_experts, moe_route
from blazr.kernels.ops_recurrent import (
    causal_conv_prefill,
    causal_conv_step,
    deltanet_prefill,
    deltanet_step,
    kda_prefill,
    kda_step,
    mamba1_dt_bc,
    mamba1_scan_prefill,
    mamba1_scan_step,
    mamba2_prefill,
    mamba2_step,
)
from blazr.kernels.quant import QuantizedWeight
from blazr.kernels.reference import (
    activation_reference,
    add_reference,
    embedding_reference,
    embedding_rows_reference,
    gated_rms_norm_reference,
    int8_dot_reference,
    kv_write_reference,
    linear_reference,
    paged_attention_decode_reference,
    quantize_act_reference,
    rms_norm_reference,
    rope_neox_reference,
    softcap_reference,
)
from blazr.kernels.reference_attention import attention_prefill_reference
from blazr.kernels.reference_conv import causal_conv_prefill_reference, causal_conv_step_reference
from blazr.kernels.reference_deltanet import (
    copy_rows_reference,
    deltanet_prefill_reference,
    deltanet_step_reference,
    head_rms_norm_reference,
    mul_reference,
    sigmoid_mul_reference,
)
from blazr.kernels.reference_kda import kda_prefill_reference, kda_step_reference
from blazr.kernels.reference_mamba1 import (
    mamba1_dt_bc_reference,
    mamba1_scan_prefill_reference,
    mamba1_scan_step_reference,
)
from blazr.kernels.reference_mamba2 import (
    mamba2_prefill_reference,
    mamba2_step_reference,
    ssd_step_reference,
)
from blazr.kernels.reference_moe_mla import (
    linear_heads_reference,
    mla_cache_write_reference,
    mla_decode_reference,
    moe_experts_reference,
    moe_route_reference,
    stacked_slice,
)
from blazr.kernels.reference_sample import argmax_rows_reference, filtered_distribution, sample_rows_reference
from blazr.kernels.row_table import RowTable

__all__ = [
    "KernelPlan",
    "Kernels",
    "UnsupportedInput",
    "activation",
    "activation_reference",
    "add",
    "add_reference",
    "argmax_rows",
    "argmax_rows_reference",
    "attention_prefill",
    "attention_prefill_reference",
    "causal_conv_prefill",
    "causal_conv_prefill_reference",
    "causal_conv_step",
    "causal_conv_step_reference",
    "copy_rows",
    "copy_rows_reference",
    "cpu_f32",
    "deltanet_prefill",
    "deltanet_prefill_reference",
    "deltanet_step",
    "deltanet_step_reference",
    "embedding",
    "embedding_reference",
    "embedding_rows",
    "embedding_rows_reference",
    "filtered_distribution",
    "gated_rms_norm",
    "gated_rms_norm_reference",
    "head_rms_norm",
    "head_rms_norm_reference",
    "int8_dot_reference",
    "kda_prefill",
    "kda_prefill_reference",
    "kda_step",
    "kda_step_reference",
    "kernels",
    "kv_write",
    "kv_write_reference",
    "linear",
    "linear_heads",
    "linear_heads_reference",
    "linear_reference",
    "mamba1_dt_bc",
    "mamba1_dt_bc_reference",
    "mamba1_scan_prefill",
    "mamba1_scan_prefill_reference",
    "mamba1_scan_step",
    "mamba1_scan_step_reference",
    "mamba2_prefill",
    "mamba2_prefill_reference",
    "mamba2_step",
    "mamba2_step_reference",
    "mla_cache_write",
    "mla_cache_write_reference",
    "mla_decode",
    "mla_decode_reference",
    "moe_experts",
    "moe_experts_reference",
    "moe_route",
    "moe_route_reference",
    "mul",
    "mul_reference",
    "paged_attention_decode",
    "paged_attention_decode_reference",
    "quantize_act_reference",
    "record",
    "reset",
    "rms_norm",
    "rms_norm_reference",
    "rope_neox",
    "rope_neox_reference",
    "sample_rows",
    "sample_rows_reference",
    "sigmoid_mul",
    "sigmoid_mul_reference",
    "softcap",
    "softcap_reference",
    "ssd_step_reference",
    "stacked_slice",
]


def kv_write(
    k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor
) -> None:
    """Store new keys/values k [T, Hkv, D], v [T, Hkv, Dv] (rows may be strided views into a fused qkv
    output) into cache slots slot_mapping [T] of k_pool [S, Hkv, D] / v_pool [S, Hkv, Dv] (fp32 or bf16)."""
    return _dispatch("kv_write", kv_write_reference, k, v, slot_mapping, k_pool, v_pool)


def linear(
    x: torch.Tensor,
    qw: QuantizedWeight,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    *,
    swiglu: bool = False,
    out: torch.Tensor | None = None,
    prefill: bool = False,
    exact_x: bool = False,
) -> torch.Tensor:
    """y = x · Wᵀ (+ bias), then SwiGLU (silu(gate) · up over the [gate; up] halves) or + residual; out may
    be residual itself (in-place residual add). x [..., K] → [..., N] (SwiGLU: [..., N/2]).
    Block kinds quantize x to 8 bits per block of 32 in the C kernel (error ≤ amax_block/254 per element);
    `exact_x` (kinds whose format has `exact_x`: Q8_0 as stored) keeps x fp32 and widens each weight exactly
    instead (csrc/linear_q8xf.c: an output head's logits as the float model's, up to fp32 rounding).
    `prefill`: f32 weights may run many rows through the panel GEMM (gemm_float.c, AVX2 hosts); without it
    their rows take the decode path at any M, whose result for a row never depends on the others."""
    kw = {"swiglu": swiglu, "out": out, "prefill": prefill, "exact_x": exact_x}
    return _dispatch("linear", linear_reference, x, qw, bias, residual, **kw)


def embedding(
    ids: torch.Tensor, table: torch.Tensor, scale: float = 1.0, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Rows `ids` [T] (int64) of table [V, D], times `scale` → [T, D] (an id outside [0, V) is an error)."""
    return _dispatch("embedding", embedding_reference, ids, table, scale, out)


def embedding_rows(
    ids: torch.Tensor, table: RowTable, scale: float = 1.0, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Rows `ids` [T] (int64) of a table kept in a GGUF's row layout, dequantized, times `scale` → [T, D]
    float32; only those rows are read (an id outside [0, V) is an error)."""
    return _dispatch("embedding_rows", embedding_rows_reference, ids, table, scale, out)


def activation(x: torch.Tensor, kind: str, gated: bool = False) -> torch.Tensor:
    """An MLP activation (`silu`, `gelu` (tanh), `gelu_erf` (exact), `relu2`) of x [..., N]; gated:
    act(first half) · second half → [..., N/2] (see activation_reference)."""
    return _dispatch("activation", activation_reference, x, kind, gated)


def add(
    x: torch.Tensor,
    y: torch.Tensor | None,
    alpha: float = 1.0,
    beta: float = 1.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """alpha · x + beta · y elementwise (y None: alpha · x), contiguous tensors of one shape; out may be x
    or y. The residual add `x + r · mixer(x)` is add(x, y, beta=r)."""
    return _dispatch("add", add_reference, x, y, alpha, beta, out)


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """x ← cap · tanh(x / cap) in place, x contiguous (Gemma 2's final logits; the C kernel's tanh is within
    ~1e-7 · cap of torch's, see blz_softcap1). Returns x."""
    return _dispatch("softcap", softcap_reference, x, cap)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None
) -> torch.Tensor:
    """out = weight · x / sqrt(mean(x²) + eps) over the last dim, x [..., D] (out may be x)."""
    return _dispatch("rms_norm", rms_norm_reference, x, weight, eps, out)


def gated_rms_norm(
    y: torch.Tensor,
    z: torch.Tensor,
    weight: torch.Tensor | None,
    group_size: int,
    eps: float,
    norm_before_gate: bool,
) -> torch.Tensor:
    """Mamba2's gated RMSNorm (see gated_rms_norm_reference): y [M, D] contiguous, z [M, D] (rows may be
    strided: a view into the in_proj output), weight [D]; normalised in groups of `group_size`. weight
    None: the gate alone, y · silu(z)."""
    return _dispatch(
        "gated_rms_norm", gated_rms_norm_reference, y, z, weight, group_size, eps, norm_before_gate
    )


def rope_neox(
    x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot_dim: int
) -> torch.Tensor:
    """Rotate x [T, H, Dh] in place (NeoX half-split over the first rot_dim features) by the angles of
    rows `positions` [T] of the cos/sin tables [P, rot_dim/2]; returns x. x may be a token-strided view
    (e.g. the q and k heads of a fused qkv output: `qkv[:, :(H + Hkv) * Dh].view(T, H + Hkv, Dh)`), or
    head-strided: each head's part of a wider head (MLA's q_rope, `q.view(T, H, Dn + R)[..., Dn:]`)."""
    return _dispatch("rope_neox", rope_neox_reference, x, positions, cos, sin, rot_dim)


def paged_attention_decode(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    kv_indices: torch.Tensor,
    seq_lens: torch.Tensor | Sequence[int],
    scale: float,
    *,
    window: int | None = None,
    out: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Decode attention, one query per sequence: q [B, H, D] against the keys/values of slots
    kv_indices[b, :seq_lens[b]] in k_pool [S, Hkv, D] / v_pool [S, Hkv, Dv] (GQA: head h reads kv head
    h // (H/Hkv)); the last `window` keys only with a sliding window; `sinks` [H] float32: each head's
    logit joins the softmax's denominator (no value); `softcap` c: each score s becomes c · tanh(s / c) before
    the softmax (Gemma 2). Returns [B, H, Dv] fp32. q may be a row-strided view
    (the q heads of a fused qkv output); the pools may be fp32 or bf16 (computed in fp32)."""
    return _dispatch(
        "paged_attention_decode",
        paged_attention_decode_reference,
        q,
        k_pool,
        v_pool,
        kv_indices,
        seq_lens,
        scale,
        window=window,
        out=out,
        sinks=sinks,
        softcap=softcap,
    )


def attention_prefill(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    kv_slots: torch.Tensor,
    ctx: int,
    scale: float,
    *,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
    softcap: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Prefill attention of one sequence's chunk: q [n, H, D] (a row-strided view allowed) at positions
    ctx .. ctx + n − 1, causal over the keys / values at slots kv_slots[: ctx + n] of k_pool [S, Hkv, D] /
    v_pool [S, Hkv, Dv] (the chunk's own already written; fp32 or 16-bit pools, widened exactly); the last
    `window` keys of each row with a sliding window; `softcap` and `sinks` as `paged_attention_decode`.
    Returns [n, H, Dv] fp32 (into `out`, which may be a row-strided view). A row's result does not depend on
    the chunk it is in (see csrc/attention_prefill.c)."""
    kw = {"window": window, "sinks": sinks, "softcap": softcap, "out": out}
    return _dispatch(
        "attention_prefill", attention_prefill_reference, q, k_pool, v_pool, kv_slots, ctx, scale, **kw
    )


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """Greedy choice: the first index of each row's largest logit (NaN counts as −inf). [B, V] → [B] int64."""
    return _dispatch("argmax_rows", argmax_rows_reference, logits)


def sample_rows(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    min_p: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    u: torch.Tensor,
) -> torch.Tensor:
    """One draw per row from softmax(logits / temperature) after min-p, top-k (0: off) and top-p, by inverse
    CDF at the row's uniform u in [0, 1) (see sample_rows_reference). logits [B, V]; temperature, min_p,
    top_p, u [B] fp32; top_k [B] int64 → [B] int64."""
    return _dispatch("sample_rows", sample_rows_reference, logits, temperature, min_p, top_k, top_p, u)


def head_rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None
) -> torch.Tensor:
    """RMSNorm of each [D] group of x [T, H, D] (weight [D]): q or k heads of a fused projection's output
    (row-strided views, a token's heads back to back), or whole rows as one group (H = 1); in place, or
    into `out` [T, H, D] (its rows may be strided too) leaving x as it is. Returns what it wrote."""
    return _dispatch("head_rms_norm", head_rms_norm_reference, x, weight, eps, out)


def sigmoid_mul(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x [M, N] ← x · sigmoid(gate) in place, gate [M, N] (rows may be strided: a view into a projection's
    output) or [M, 1] (one per row). Returns x."""
    return _dispatch("sigmoid_mul", sigmoid_mul_reference, x, gate)


def mul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x [M, N] ← x · y in place, y [M, N] (rows may be strided: a view into a wider tensor) or [M, 1] (one
    per row). Returns x."""
    return _dispatch("mul", mul_reference, x, y)


def copy_rows(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out [M, N] ← x [M, N] bit for bit, either's rows may be strided (views into wider tensors: Zamba2's
    residual and token embeddings into the halves of one row). Returns out."""
    return _dispatch("copy_rows", copy_rows_reference, x, out)
