"""The gated delta rule of gated DeltaNet and of Kimi Delta Attention: a chunked (WY) form for prefill and the
plain sequential recurrence that ties it in tests (the one-token decode steps are the kernel ops
`deltanet_step` / `kda_step`, their torch references in blazr.kernels.reference_deltanet / reference_kda; the
C prefill kernel computes the chunked form below).

The recurrence, per value head h with state S [Dk, Dv] (q, k already L2-normed, q scaled by Dk^-½):

    S ← exp(g_t) · S                                   decay: g_t one per head (gated DeltaNet) or, channel-
                                                       wise, one per key channel (KDA: diag(exp(g_t)) · S)
    S ← S + k_t ⊗ β_t (v_t − Sᵀ k_t)                   delta rule: write the part of v_t S does not predict
    o_t = Sᵀ q_t                                       o_t [Dv]

`delta_rule_step` is one token for a batch of independent states (the decode step's reference);
`delta_rule_chunked` computes the same function in chunks of C tokens (Yang et al., "Gated Delta Networks";
the WY / UT-transform form of transformers' `torch_chunk_gated_delta_rule`): with G the cumulative log-decay
from the chunk's start and Γ_ij = exp(G_i − G_j) (j ≤ i), the chunk's C delta-rule writes collapse into one
unit lower-triangular solve, (I + L) [U | W] = [β v | β e^G k] with L_ij = β_i (k_i·k_j) Γ_ij (j < i); then
v_new = U − W S (what the entering state S does not predict), o = (q e^G) S + (q kᵀ ∘ Γ) v_new, and S leaves
as e^{G_last} S + Σ_j e^{G_last − G_j} k_j v_newⱼᵀ. The state is read twice per chunk, not per token.
Channel-wise (KDA), G is per key channel and every product through Γ weighs each channel by its own decay:
L_ij = β_i Σ_c k_ic k_jc e^{G_ic − G_jc}, (q kᵀ ∘ Γ)_ij = Σ_c q_ic k_jc e^{G_ic − G_jc}, e^G and e^{G_last}
scale S's rows (Γ is then [n, n, Dk]: the reference's memory, not the kernel's).

All math is float32 (inputs of other dtypes are upcast). Shapes: L tokens, H value heads (q and k already
given per value head), Dk key / query dim, Dv value dim, C chunk size, n ≤ C tokens of one chunk.
"""

from __future__ import annotations

import torch

# Log-decays are floored here before exp (exp(-80) = 1.8e-35; as blazr.model.ssd: no subnormal slow paths)
LOG_FLOOR = -80.0


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> None:
    L, H, Dk = k.shape
    assert q.shape == k.shape, f"q {tuple(q.shape)} vs k {tuple(k.shape)}"
    assert v.shape[:2] == (L, H), f"v {tuple(v.shape)} vs k {tuple(k.shape)}"
    assert beta.shape == (L, H) and g.shape in ((L, H), (L, H, Dk)), (
        f"g {tuple(g.shape)}, beta {tuple(beta.shape)}, expected ({L}, {H}[, {Dk}])"
    )


def _state(initial_state: torch.Tensor | None, H: int, Dk: int, Dv: int, like: torch.Tensor) -> torch.Tensor:
    if initial_state is None:
        return like.new_zeros(H, Dk, Dv, dtype=torch.float32)
    return initial_state.to(torch.float32).clone()


def delta_rule_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    S: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the recurrence for B independent states (the decode step's reference, one op per term
    for the whole batch): q, k [B, H, Dk]; v [B, H, Dv]; g (log-decay, ≤ 0) [B, H] or channel-wise
    [B, H, Dk]; beta [B, H]; S [B, H, Dk, Dv] float32. Returns o [B, H, Dv] and the new S, float32."""
    decay = torch.exp(g.clamp(min=LOG_FLOOR))  # [B, H] or [B, H, Dk]
    S = S * (decay[..., None, None] if decay.dim() == 2 else decay[..., None])
    kv = torch.einsum("bhkv,bhk->bhv", S, k)  # what the state predicts for k
    delta = (v - kv) * beta[..., None]
    S = S + k[..., None] * delta[..., None, :]
    return torch.einsum("bhkv,bhk->bhv", S, q), S


def delta_rule_sequential(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain recurrence, one token at a time (the reference). q, k [L, H, Dk]; v [L, H, Dv]; g (log-decay,
    ≤ 0) [L, H] or channel-wise [L, H, Dk]; beta [L, H]; initial_state [H, Dk, Dv] or None (zeros). Returns
    o [L, H, Dv] and the final state [H, Dk, Dv], float32."""
    _check(q, k, v, g, beta)
    L, H, Dk = k.shape
    Dv = v.shape[-1]
    q, k, v, g, beta = (t.to(torch.float32) for t in (q, k, v, g, beta))
    S = _state(initial_state, H, Dk, Dv, v)[None]  # [1, H, Dk, Dv]: one state, as a batch of one
    o = v.new_empty(L, H, Dv, dtype=torch.float32)
    for t in range(L):
        rows = slice(t, t + 1)
        o[rows], S = delta_rule_step(q[rows], k[rows], v[rows], g[rows], beta[rows], S)
    return o, S[0]


def delta_rule_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk_size: int = 64,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked (WY) form: the same signature and results as `delta_rule_sequential` (to fp32 rounding),
    in chunks of `chunk_size` tokens (the last one shorter; nothing is padded)."""
    _check(q, k, v, g, beta)
    L, H, Dk = k.shape
    Dv = v.shape[-1]
    f32 = torch.float32
    S = _state(initial_state, H, Dk, Dv, v)
    o = v.new_empty(L, H, Dv, dtype=f32)
    for c0 in range(0, L, chunk_size):
        rows = slice(c0, min(L, c0 + chunk_size))
        # per head: [H, n, D]
        qc, kc, vc = (t[rows].to(f32).transpose(0, 1) for t in (q, k, v))
        gc, bc = g[rows].to(f32).transpose(0, 1), beta[rows].to(f32).t()  # [H, n(, Dk)], [H, n]
        o[rows], S = _chunk(qc, kc, vc, gc, bc, S)
    return o, S


def _chunk(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, S: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of n tokens: q, k [H, n, Dk]; v [H, n, Dv]; g [H, n] or channel-wise [H, n, Dk]; beta
    [H, n]; S [H, Dk, Dv] entering it. Returns o [n, H, Dv] and the state leaving it."""
    n = k.shape[1]
    is_channel = g.dim() == 3
    G = torch.cumsum(g, dim=1)  # [H, n(, Dk)]: log-decay from the chunk's start through token i
    causal = torch.ones(n, n, dtype=torch.bool, device=k.device).tril()  # [i, j]: j ≤ i
    if is_channel:
        causal = causal[:, :, None]  # [i, j, 1] over the key channels
    gamma = (G[:, :, None] - G[:, None, :]).masked_fill(~causal, float("-inf"))
    gamma = gamma.clamp(min=LOG_FLOOR).masked_fill(~causal, float("-inf")).exp()  # Γ_ij [H, n, n(, Dk)]
    eG = torch.exp(G.clamp(min=LOG_FLOOR))
    eG = eG if is_channel else eG[..., None]  # [H, n, Dk or 1]
    kb = k * beta[..., None]
    if is_channel:  # Σ_c a_ic b_jc Γ_ijc
        Lm = torch.einsum("hic,hjc,hijc->hij", kb, k, gamma)
        qk = torch.einsum("hic,hjc,hijc->hij", q, k, gamma)
    else:
        Lm = (kb @ k.transpose(-1, -2)) * gamma  # [H, n, n]; its strictly lower part is L (diagonal unused)
        qk = (q @ k.transpose(-1, -2)) * gamma
    rhs = torch.cat([v * beta[..., None], kb * eG], dim=-1)  # [H, n, Dv + Dk]
    UW = torch.linalg.solve_triangular(Lm, rhs, upper=False, unitriangular=True)  # (I + L)⁻¹ rhs
    U, W = UW.split([v.shape[-1], k.shape[-1]], dim=-1)
    v_new = U - W @ S  # [H, n, Dv]
    o = (q * eG) @ S + qk @ v_new
    last = G[:, -1:]  # [H, 1(, Dk)]
    to_end = torch.exp((last - G).clamp(min=LOG_FLOOR))
    k_out = k * (to_end if is_channel else to_end[..., None])  # [H, n, Dk]
    e_last = torch.exp(last.clamp(min=LOG_FLOOR))  # [H, 1(, Dk)]
    S = S * (e_last.transpose(1, 2) if is_channel else e_last[..., None]) + k_out.transpose(-1, -2) @ v_new
    return o.transpose(0, 1), S
