"""The kernel ops of the recurrent mixers: the Mamba2 decode step and prefill scan (`mamba2_step`,
`mamba2_prefill`), gated DeltaNet's (`deltanet_step`, `deltanet_prefill`), Kimi Delta Attention's
(`kda_step`, `kda_prefill`), the causal depthwise conv (`causal_conv_step`, `causal_conv_prefill`) and
Mamba1's (`mamba1_dt_bc`, `mamba1_scan_step`, `mamba1_scan_prefill`). Each runs its C kernel through
`dispatch._dispatch` when the library takes the inputs, else its torch reference (`reference_mamba2.py`,
`reference_deltanet.py`, `reference_kda.py`, `reference_conv.py`, `reference_mamba1.py`) with the same
signature — but `mamba1_scan_prefill`, whose fallback is its log-depth form (`parallel_scan.py`). Moved
out of `ops.py`, which re-exports every op here with its reference — call them as `ops.mamba2_step(...)`.
Shapes as in `ops.py`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from blazr.kernels.dispatch import _dispatch
from blazr.kernels.parallel_scan import mamba1_scan_prefill_parallel
from blazr.kernels.reference_conv import causal_conv_prefill_reference, causal_conv_step_reference
from blazr.kernels.reference_deltanet import deltanet_prefill_reference, deltanet_step_reference
from blazr.kernels.reference_kda import kda_prefill_reference, kda_step_reference
from blazr.kernels.reference_mamba1 import mamba1_dt_bc_reference, mamba1_scan_step_reference
from blazr.kernels.reference_mamba2 import mamba2_prefill_reference, mamba2_step_reference


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
    y [T, Di] (see mamba1_scan_prefill_reference). Without the C kernel (a GPU, other dtypes) the log-depth
    form runs (kernels/parallel_scan.py), not the reference's step per token."""
    return _dispatch(
        "mamba1_scan_prefill", mamba1_scan_prefill_parallel, xc, dt_raw, bc, z, query_lens, slots, fresh, A,
        D, ssm,
    )  # fmt: skip
