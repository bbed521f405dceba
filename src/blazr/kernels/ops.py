"""The kernel operations: dispatch between the C kernels (`bindings.py`) and their plain-torch references
(`reference.py`, `reference_conv.py`, `reference_deltanet.py`, `reference_kda.py`, `reference_mamba1.py`,
`reference_mamba2.py`, `reference_moe_mla.py`, `reference_sample.py`); both are re-exported
here, so every `op` has its `op_reference` beside it.

Each public op (`embedding`, `embedding_rows`, `add`, `activation`, `softcap`, `linear`, `rms_norm`,
`gated_rms_norm`, `rope_neox`, `kv_write`, `paged_attention_decode`, `mamba2_step`, `mamba2_prefill`,
`deltanet_step`, `deltanet_prefill`, `kda_step`, `kda_prefill`, `head_rms_norm`, `sigmoid_mul`, `mul`,
`copy_rows`, `causal_conv_step`, `causal_conv_prefill`,
`mamba1_dt_bc`, `mamba1_scan_step`, `mamba1_scan_prefill`, `moe_route`, `moe_experts`, `mla_cache_write`,
`mla_decode`, `linear_heads`; the token choice `argmax_rows`,
`sample_rows`) runs the C kernel when the library is available and the inputs are CPU tensors of the
supported dtypes and layouts (fp32 activations and states, int64 indices, fp32 or 16-bit KV pools), else
its `*_reference` twin with the same signature.
`Kernels` binds one built library (tests also bind a second, scalar-fallback build). `record()` captures
a sequence of kernel calls on static buffers as a `KernelPlan` that replays them with one C call.

Shapes: M rows (tokens), K in features, N out features (SwiGLU: N = 2·I rows [gate; up] → I outputs);
T tokens, H query heads, Hkv kv heads, G = H / Hkv, Dh / D / Dv head dims, R rotary dims, P table rows;
B sequences, S cache slots, Lmax kv_indices width; E experts, k chosen per token, I expert width; MLA: Dn /
R / Dv head dims, L latent rank.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from blazr.kernels import build
from blazr.kernels.bindings import Kernels
from blazr.kernels.calls import KernelPlan, UnsupportedInput
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

_default: list[Kernels | None] = []


def kernels() -> Kernels | None:
    """The bound default library, or None when unavailable / disabled (`BLAZR_KERNELS=0`); its host-tuning
    knobs set at first use (kernels/tuning.py: read from the cache, measured once per host and build)."""
    if not _default:
        from blazr.kernels import tuning

        lib = build.load()
        k = Kernels(lib) if lib is not None else None
        _default.append(k)  # first: the measurement's own weights are made by kernels (no recursion)
        if k is not None:
            tuning.apply(k)
    return _default[0]


def reset() -> None:
    """Forget the default library so the next call re-reads `BLAZR_KERNELS` (for tests)."""
    build.reset()
    _default.clear()


# ---------------------------------------------------------------- dispatch


def cpu_f32(x: torch.Tensor) -> bool:
    """x is a float32 CPU tensor: the activations the layers route through these ops (a recordable
    decode step); other dtypes and devices keep the layers' torch code."""
    return x.dtype is torch.float32 and x.is_cpu


def _dispatch(op: str, reference: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run kernel `op` when the library takes these inputs, else `reference` (same signature). While a
    plan is being recorded an unsupported input is an error (the reference would run only once)."""
    k = _default[0] if _default else kernels()
    if k is not None:
        try:
            return getattr(k, op)(*args, **kwargs)
        except UnsupportedInput:
            if k.is_recording():
                raise
    return reference(*args, **kwargs)


@contextlib.contextmanager
def record() -> Iterator[KernelPlan]:
    """Record the kernel calls made on this thread (through the functions below) into a KernelPlan for
    one-call replay; needs the C library (RuntimeError without it). See KernelPlan for the rules."""
    k = kernels()
    if k is None:
        raise RuntimeError("kernel recording needs the C kernel library (unavailable or BLAZR_KERNELS=0)")
    with k.record() as plan:
        yield plan


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
) -> torch.Tensor:
    """y = x · Wᵀ (+ bias), then SwiGLU (silu(gate) · up over the [gate; up] halves) or + residual; out may
    be residual itself (in-place residual add). x [..., K] → [..., N] (SwiGLU: [..., N/2]).
    Block kinds quantize x to 8 bits per block of 32 in the C kernel (error ≤ amax_block/254 per element).
    `prefill`: f32 weights may run many rows through the panel GEMM (gemm_float.c, AVX2 hosts); without it
    their rows take the decode path at any M, whose result for a row never depends on the others."""
    kw = {"swiglu": swiglu, "out": out, "prefill": prefill}
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


def mamba2_step(
    xbc: torch.Tensor,
    dt_raw: torch.Tensor,
    slots: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    dt_bias: torch.Tensor,
    A_log: torch.Tensor,
    D: torch.Tensor,
    ssm_state: torch.Tensor,
    n_groups: int,
    dt_min: float,
    dt_max: float,
) -> torch.Tensor:
    """One Mamba2 decode token for B sequences: conv step + SiLU, dt, the SSD state update and the D skip,
    with conv_state [S, Cd, K-1] and ssm_state [S, H, P, N] advanced in place at `slots` [B] — rows that
    share a slot in row order (a sequence's consecutive tokens). xbc [B, Cd] and dt_raw [B, H] (column views
    of the in_proj output); conv_weight [Cd, K]; dt_bias, A_log, D [H]. Returns y [B, H, P] float32 (see
    mamba2_step_reference)."""
    return _dispatch(
        "mamba2_step",
        mamba2_step_reference,
        xbc,
        dt_raw,
        slots,
        conv_weight,
        conv_bias,
        conv_state,
        dt_bias,
        A_log,
        D,
        ssm_state,
        n_groups,
        dt_min,
        dt_max,
    )


def mamba2_prefill(
    xbc: torch.Tensor,
    dt_raw: torch.Tensor,
    query_lens: Sequence[int],
    slots: torch.Tensor,
    fresh: Sequence[bool],
    conv_weight: torch.Tensor,
    conv_bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    dt_bias: torch.Tensor,
    A_log: torch.Tensor,
    D: torch.Tensor,
    ssm_state: torch.Tensor,
    n_groups: int,
    dt_min: float,
    dt_max: float,
) -> torch.Tensor:
    """The prefill of one Mamba2 layer for B sequences laid out one after another (query_lens [B] rows
    each): conv + SiLU, dt, the SSD scan and the D skip, starting from zero states where fresh[b] (else
    from slot slots[b]'s) and leaving each sequence's final conv [Cd, K-1] / SSM [H, P, N] states at its
    slot. xbc [T, Cd], dt_raw [T, H] (column views of the in_proj output), the rest as mamba2_step.
    Returns y [T, H, P] float32. The C kernel runs the recurrence token by token; the reference is the
    chunked SSD scan — the same function, equal to fp32 rounding (see mamba2_prefill_reference)."""
    return _dispatch(
        "mamba2_prefill",
        mamba2_prefill_reference,
        xbc,
        dt_raw,
        query_lens,
        slots,
        fresh,
        conv_weight,
        conv_bias,
        conv_state,
        dt_bias,
        A_log,
        D,
        ssm_state,
        n_groups,
        dt_min,
        dt_max,
    )


def moe_route(
    logits: torch.Tensor,
    bias: torch.Tensor | None,
    sigmoid: bool,
    num_groups: int,
    topk_groups: int,
    group_top2: bool,
    top_k: int,
    renorm: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The MoE router's choice: logits [T, E] (fp32) → (weights [T, k] fp32, ids [T, k] int64); see
    moe_route_reference for the rule (softmax / sigmoid, bias for selection, group-limited top-k)."""
    return _dispatch(
        "moe_route", moe_route_reference, logits, bias, sigmoid, num_groups, topk_groups, group_top2, top_k,
        renorm, scale,
    )  # fmt: skip


def moe_experts(
    x: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    w_up: QuantizedWeight,
    w_down: QuantizedWeight,
    num_experts: int,
    activation: str,
    gated: bool,
    *,
    up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
    swiglu_alpha: float = 1.702,
    swiglu_limit: float = 7.0,
) -> torch.Tensor:
    """Σ_j weights[t, j] · expert_{ids[t, j]}(x[t]) → [T, D] fp32, running only the chosen experts' rows of
    the stacked weights w_up [E·N, D] (N = 2I gated, [gate; up], else I) and w_down [E·D, I] in any kernel
    weight format; tokens routed to one expert share one read of its weights. Optional float32 biases
    up_bias [E, N], down_bias [E, D]; `swiglu_alpha` / `swiglu_limit`: the swiglu_oai activation's."""
    return _dispatch(
        "moe_experts", moe_experts_reference, x, ids, weights, w_up, w_down, num_experts, activation, gated,
        up_bias=up_bias, down_bias=down_bias, swiglu_alpha=swiglu_alpha, swiglu_limit=swiglu_limit,
    )  # fmt: skip


def mla_cache_write(
    kv: torch.Tensor,
    norm_weight: torch.Tensor | None,
    eps: float,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slots: torch.Tensor,
    pool: torch.Tensor,
) -> None:
    """MLA's cache rows of the new tokens: kv [T, L + R] (the kv_a projection) → pool[slots] = [RMSNorm(c_kv)
    | rotated k_rope] (pool [S, L + R], fp32 or 16-bit)."""
    return _dispatch(
        "mla_cache_write", mla_cache_write_reference, kv, norm_weight, eps, positions, cos, sin, slots, pool
    )


def mla_decode(
    q_lat: torch.Tensor,
    q_rope: torch.Tensor,
    pool: torch.Tensor,
    kv_indices: torch.Tensor,
    seq_lens: torch.Tensor | Sequence[int],
    scale: float,
) -> torch.Tensor:
    """Absorbed MLA decode attention over the latent pool, one query per sequence: q_lat [B, H, L] (q_nope ·
    W_UK, `linear_heads`) and rotated q_rope [B, H, R] (strided views allowed) → the latent-space output
    [B, H, L] fp32 (W_UV applied after, `linear_heads`); see mla_decode_reference."""
    return _dispatch("mla_decode", mla_decode_reference, q_lat, q_rope, pool, kv_indices, seq_lens, scale)


def linear_heads(x: torch.Tensor, w: QuantizedWeight) -> torch.Tensor:
    """Per-head projections: x [B, H, K] (a strided view allowed) and w stacking H weights [N, K] in any
    kernel format → [B, H, N], out[b, h] = x[b, h] · W_hᵀ; each head's weight read once for the batch."""
    return _dispatch("linear_heads", linear_heads_reference, x, w)


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


def deltanet_step(
    qkvz: torch.Tensor,
    ba: torch.Tensor,
    slots: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_state: torch.Tensor,
    dt_bias: torch.Tensor,
    A_log: torch.Tensor,
    norm_weight: torch.Tensor,
    state: torch.Tensor,
    num_k_heads: int,
    is_v_tiled: bool,
    beta_scale: float,
    eps: float,
) -> torch.Tensor:
    """One gated-DeltaNet decode token for B sequences: conv step + SiLU, q/k L2 norms, gates, the delta-rule
    update of state [S, Hv, Dk, Dv] and conv_state [S, C, K-1] in place at `slots` [B], and the gated norm.
    qkvz [B, C + Hv·Dv] (in_proj_qkvz's output: [q | k | v | z]), ba [B, 2·Hv] ([b | a]); conv_weight
    [C, K]; dt_bias, A_log [Hv]; norm_weight [Dv]. Returns y [B, Hv·Dv] (out_proj's input; see
    deltanet_step_reference)."""
    return _dispatch(
        "deltanet_step", deltanet_step_reference, qkvz, ba, slots, conv_weight, conv_state, dt_bias, A_log,
        norm_weight, state, num_k_heads, is_v_tiled, beta_scale, eps,
    )  # fmt: skip


def deltanet_prefill(
    qkvz: torch.Tensor,
    ba: torch.Tensor,
    query_lens: Sequence[int],
    slots: torch.Tensor,
    fresh: Sequence[bool],
    saves: Sequence[tuple[int, int, int]],
    conv_weight: torch.Tensor,
    conv_state: torch.Tensor,
    dt_bias: torch.Tensor,
    A_log: torch.Tensor,
    norm_weight: torch.Tensor,
    state: torch.Tensor,
    num_k_heads: int,
    is_v_tiled: bool,
    beta_scale: float,
    eps: float,
    chunk_size: int,
) -> torch.Tensor:
    """The prefill of one gated-DeltaNet layer for B sequences laid out one after another (query_lens [B]
    rows each of qkvz [T, C + Hv·Dv] and ba [T, 2·Hv]), from zero states where fresh[b] (else from slot
    slots[b]'s), leaving the final states at the slots and, for each (b, k, dst) of `saves`, sequence b's
    states after its first k tokens at slot dst (prefix-cache snapshots). Returns y [T, Hv·Dv]. The C kernel
    and the reference both run the chunked (WY) delta rule in chunks of `chunk_size`, cut at the saves."""
    return _dispatch(
        "deltanet_prefill", deltanet_prefill_reference, qkvz, ba, query_lens, slots, fresh, saves,
        conv_weight, conv_state, dt_bias, A_log, norm_weight, state, num_k_heads, is_v_tiled, beta_scale, eps,
        chunk_size,
    )  # fmt: skip


def kda_step(
    qkv: torch.Tensor,
    f: torch.Tensor,
    b: torch.Tensor,
    gate: torch.Tensor,
    slots: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_state: torch.Tensor,
    dt_bias: torch.Tensor,
    A_log: torch.Tensor,
    norm_weight: torch.Tensor,
    state: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """One Kimi Delta Attention decode token for B sequences: conv step + SiLU, q/k L2 norms, the channel-wise
    decay and β, the delta-rule update of state [S, H, D, D] and conv_state [S, 3·W, K-1] in place at `slots`
    [B], and the sigmoid-gated norm. qkv [B, 3·W], f, gate [B, W], b [B, H]; conv_weight [3·W, K]; dt_bias
    [W], A_log [H]; norm_weight [D]. Returns y [B, W] (o_proj's input; see kda_step_reference)."""
    return _dispatch(
        "kda_step", kda_step_reference, qkv, f, b, gate, slots, conv_weight, conv_state, dt_bias, A_log,
        norm_weight, state, eps,
    )  # fmt: skip


def kda_prefill(
    qkv: torch.Tensor,
    f: torch.Tensor,
    b: torch.Tensor,
    gate: torch.Tensor,
    query_lens: Sequence[int],
    slots: torch.Tensor,
    fresh: Sequence[bool],
    saves: Sequence[tuple[int, int, int]],
    conv_weight: torch.Tensor,
    conv_state: torch.Tensor,
    dt_bias: torch.Tensor,
    A_log: torch.Tensor,
    norm_weight: torch.Tensor,
    state: torch.Tensor,
    eps: float,
    chunk_size: int,
) -> torch.Tensor:
    """The prefill of one Kimi Delta Attention layer for B sequences laid out one after another (query_lens
    [B] rows each), from zero states where fresh[b] (else from slot slots[b]'s), leaving the final states at
    the slots and, for each (b, k, dst) of `saves`, sequence b's states after its first k tokens at slot dst.
    Returns y [T, W]. The chunked delta rule with channel-wise decay, chunks of `chunk_size`, cut at the
    saves (see kda_prefill_reference)."""
    return _dispatch(
        "kda_prefill", kda_prefill_reference, qkv, f, b, gate, query_lens, slots, fresh, saves, conv_weight,
        conv_state, dt_bias, A_log, norm_weight, state, eps, chunk_size,
    )  # fmt: skip


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


def causal_conv_step(
    x: torch.Tensor,
    gin: torch.Tensor | None,
    gout: torch.Tensor | None,
    slots: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    state: torch.Tensor,
    silu: bool,
) -> torch.Tensor:
    """One causal depthwise conv row for each of B sequences: y = gout · act(bias + Σ_k weight[:, k] ·
    window_k) over the window (the K−1 inputs u = gin · x held at state slot slots[b], then this row's u), the
    state shifted in place. x, gin, gout [B, C] (rows of one stride: column views of an in_proj output; gin /
    gout None: no gate); weight [C, K]; state [S, K−1, C]; act SiLU when `silu`. Returns y [B, C] (see
    causal_conv_step_reference). LFM2's short conv: gin = B, gout = C; Mamba1's: neither, SiLU."""
    return _dispatch(
        "causal_conv_step", causal_conv_step_reference, x, gin, gout, slots, weight, bias, state, silu
    )


def causal_conv_prefill(
    x: torch.Tensor,
    gin: torch.Tensor | None,
    gout: torch.Tensor | None,
    query_lens: Sequence[int],
    slots: torch.Tensor,
    fresh: Sequence[bool],
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    state: torch.Tensor,
    silu: bool,
) -> torch.Tensor:
    """The conv of causal_conv_step over B sequences laid out one after another (query_lens [B] rows each),
    starting from a zero state where fresh[b] (else slot slots[b]'s) and leaving each sequence's last K−1
    inputs at its slot. Returns y [T, C] (see causal_conv_prefill_reference)."""
    return _dispatch(
        "causal_conv_prefill", causal_conv_prefill_reference, x, gin, gout, query_lens, slots, fresh, weight,
        bias, state, silu,
    )  # fmt: skip


def mamba1_dt_bc(
    dbc: torch.Tensor,
    dt_rank: int,
    state_size: int,
    w_dt: torch.Tensor | None,
    w_b: torch.Tensor | None,
    w_c: torch.Tensor | None,
    is_normed: bool,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mamba1's x_proj output dbc [T, R + 2N] = [dt | B | C] → (dt [T, R], [B | C] [T, 2N]), contiguous, each
    part RMS-normed when `is_normed` (Falcon-Mamba: weights None; Jamba: w_dt [R], w_b / w_c [N])."""
    return _dispatch(
        "mamba1_dt_bc", mamba1_dt_bc_reference, dbc, dt_rank, state_size, w_dt, w_b, w_c, is_normed, eps
    )


def mamba1_scan_step(
    xc: torch.Tensor,
    dt_raw: torch.Tensor,
    bc: torch.Tensor,
    z: torch.Tensor,
    slots: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor,
    ssm: torch.Tensor,
) -> torch.Tensor:
    """One Mamba1 selective-scan row for each of B sequences, ssm [S, Di, N] advanced in place at slots [B]:
    dt = softplus(dt_raw); state = exp(dt·A)·state + (dt·x)·B; y = (state·C + D·x)·silu(z). xc, dt_raw [B,
    Di]; bc [B, 2N]; z [B, Di] (a column view of in_proj's output); A [Di, N] (= −exp(A_log)); D [Di]. Returns
    y [B, Di] (see mamba1_scan_step_reference)."""
    return _dispatch("mamba1_scan_step", mamba1_scan_step_reference, xc, dt_raw, bc, z, slots, A, D, ssm)


def mamba1_scan_prefill(
    xc: torch.Tensor,
    dt_raw: torch.Tensor,
    bc: torch.Tensor,
    z: torch.Tensor,
    query_lens: Sequence[int],
    slots: torch.Tensor,
    fresh: Sequence[bool],
    A: torch.Tensor,
    D: torch.Tensor,
    ssm: torch.Tensor,
) -> torch.Tensor:
    """The scan of mamba1_scan_step over B sequences laid out one after another (query_lens [B] rows each),
    from a zero state where fresh[b] (else slot slots[b]'s), each final state left at its slot. Returns
    y [T, Di] (see mamba1_scan_prefill_reference)."""
    return _dispatch(
        "mamba1_scan_prefill", mamba1_scan_prefill_reference, xc, dt_raw, bc, z, query_lens, slots, fresh, A,
        D, ssm,
    )  # fmt: skip
