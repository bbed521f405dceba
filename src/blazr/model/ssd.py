"""The SSD scan of Mamba2 (state-space duality): a chunked form for prefill and the plain sequential
recurrence that ties it in tests (the one-token decode step is the kernel op `mamba2_step`, with its torch
reference `ssd_step_reference` in blazr.kernels.reference).

The recurrence, per head h (head h reads group g = h // (H / G) of B and C):

    h_t = exp(dt_t · A) · h_{t-1} + dt_t · B_t ⊗ x_t          state h_t [P, N]
    y_t = h_t · C_t                                             y_t [P]

`ssd_chunked` computes the same function in chunks of Q tokens (Mamba2 paper, "minimal SSD"): inside a chunk
the output is a masked quadratic form (C·Bᵀ ∘ decay) · X; across chunks only the [H, P, N] state is carried.
Chunks are processed in blocks whose quadratic pieces stay under a fixed element budget, and the state is
passed from chunk to chunk sequentially, so memory is O(budget + L·H·P) for any L — never O(L²) or
O(num_chunks²). The D skip, conv, gate and norm belong to the mixer (`mamba2.py`), not here.

All math is float32; inputs of other dtypes are upcast. Outputs: y float32, states float32.
Shapes: B batch, L length, H heads, P head dim, G groups (R = H / G heads per group), N state size,
Q chunk size, c chunk index.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Elements of one [B, H, c, Q, Q] quadratic piece a block of chunks may hold (64 MiB in float32).
QUAD_BUDGET = 1 << 24
# Log-decays are floored here before exp (exp(-80) = 1.8e-35; see `_exp_decay`).
LOG_FLOOR = -80.0


def _check(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor) -> None:
    Bsz, L, H, _ = x.shape
    G = B.shape[2]
    assert dt.shape == (Bsz, L, H), f"dt {tuple(dt.shape)} vs x {tuple(x.shape)}"
    assert A.shape == (H,), f"A {tuple(A.shape)}, expected ({H},)"
    assert B.shape == C.shape and B.shape[:2] == (Bsz, L), f"B {tuple(B.shape)} C {tuple(C.shape)}"
    assert H % G == 0, f"{H} heads do not split into {G} groups"


def _exp_decay(t: torch.Tensor) -> torch.Tensor:
    """exp(max(t, LOG_FLOOR)) for log-decays t ≤ 0: a decay never drops below exp(−80) = 1.8e-35.

    On x86 CPUs torch.exp takes a slow path for inputs below ≈ −87.3 (subnormal or underflowing results, up
    to ~80× slower) and for −inf (~10×); strongly decaying heads fill SSD decay matrices with such entries.
    The floor changes a weight by < 1.8e-35, invisible in any float32 output of practical size (as a
    GPU's flush-to-zero is). Causality never relies on it: masked entries are zeroed separately."""
    return torch.exp(t.clamp(min=LOG_FLOOR))


def decay_matrix_t(a: torch.Tensor) -> torch.Tensor:
    """a [..., Q] (per-token log-decays) → the transposed intra-chunk decay matrix [..., Q(s), Q(l)]:
    out[..., s, l] = exp(Σ_{k=s+1..l} a_k) for s ≤ l, and 1 (not 0) for s > l — the caller masks those.

    The sums are a masked cumsum (no subtraction of large prefix sums, so exact to rounding however strong
    the decay), laid out [s, l] so the cumsum runs over the contiguous last dim (~2.5× faster on CPU)."""
    Q = a.shape[-1]
    a = a.contiguous()  # a permuted `a` would make the broadcast below (and the cumsum) strided
    after = torch.triu(torch.ones(Q, Q, dtype=a.dtype, device=a.device), diagonal=1)  # [s, k]: 1 if k > s
    seg = torch.cumsum(a[..., None, :] * after, dim=-1)  # [..., s, l] = Σ_{s<k≤l} a_k (a is finite)
    return seg.clamp_(min=LOG_FLOOR).exp_()  # in place: the largest tensor of the scan


def ssd_chunked(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked causal SSD scan.

    x [B, L, H, P]; dt [B, L, H] (already softplus'ed and clamped); A [H] (negative); B, C [B, L, G, N];
    initial_state [B, H, P, N] or None (zeros). Any L (padded to the chunk grid internally; padding has
    dt = 0, so it neither decays nor feeds the state). Returns y [B, L, H, P] and the state after the last
    token, final_state [B, H, P, N], both float32.
    """
    _check(x, dt, A, B, C)
    Bsz, L, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    R, Q = H // G, chunk_size
    f32 = torch.float32
    if initial_state is None:
        initial_state = x.new_zeros(Bsz, H, P, N, dtype=f32)
    state = initial_state.to(f32).reshape(Bsz, G, R, P, N)
    if L == 0:
        return x.new_zeros(Bsz, 0, H, P, dtype=f32), state.reshape(Bsz, H, P, N)

    pad = (Q - L % Q) % Q
    nc = (L + pad) // Q
    dt = F.pad(dt.to(f32), (0, 0, 0, pad))  # [B, Lp, H]
    X = F.pad(x.to(f32), (0, 0, 0, 0, 0, pad)) * dt[..., None]  # dt-scaled input [B, Lp, H, P]
    # Head-major chunked layouts; heads split as (G, R) so C·Bᵀ is formed once per group.
    X = X.view(Bsz, nc, Q, G, R, P).permute(0, 3, 4, 1, 2, 5).contiguous()  # [B, G, R, c, Q, P]
    a = (dt * A.to(f32)).view(Bsz, nc, Q, G, R).permute(0, 3, 4, 1, 2).contiguous()  # log-decays [B,G,R,c,Q]
    # B, C: [B, Lp, G, N] → [B, G, c, Q, N]
    Bm = F.pad(B.to(f32), (0, 0, 0, 0, 0, pad)).view(Bsz, nc, Q, G, N).permute(0, 3, 1, 2, 4).contiguous()
    Cm = F.pad(C.to(f32), (0, 0, 0, 0, 0, pad)).view(Bsz, nc, Q, G, N).permute(0, 3, 1, 2, 4).contiguous()

    chunks_per_block = max(1, QUAD_BUDGET // (Bsz * H * Q * Q))
    ys = []
    for c0 in range(0, nc, chunks_per_block):
        blk = slice(c0, min(c0 + chunks_per_block, nc))
        y_blk, state = _ssd_block(X[:, :, :, blk], a[:, :, :, blk], Bm[:, :, blk], Cm[:, :, blk], state)
        ys.append(y_blk)
    y = torch.cat(ys, dim=3) if len(ys) > 1 else ys[0]  # [B, G, R, c, Q, P]
    y = y.permute(0, 3, 4, 1, 2, 5).reshape(Bsz, nc * Q, H, P)[:, :L]
    return y, state.reshape(Bsz, H, P, N)


def _ssd_block(
    X: torch.Tensor, a: torch.Tensor, Bm: torch.Tensor, Cm: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One block of c chunks. X [B, G, R, c, Q, P] (dt-scaled); a [B, G, R, c, Q]; Bm, Cm [B, G, c, Q, N];
    state [B, G, R, P, N] entering the block. Returns y [B, G, R, c, Q, P] and the state leaving it."""
    Q = a.shape[-1]
    decay_t = decay_matrix_t(a)  # [B, G, R, c, Q(s), Q(l)]
    a_cum = torch.cumsum(a, dim=-1)  # [B, G, R, c, Q]: log-decay from the chunk start through position l

    # 1. State each chunk adds by its end: Σ_s exp(a_{s+1..Q-1}) B_s ⊗ X_s (the decay matrix's last column).
    X_dec = X * decay_t[..., -1, None]  # [B, G, R, c, Q(s), P]
    chunk_states = torch.einsum("bgrcsp,bgcsn->bgrcpn", X_dec, Bm)  # [B, G, R, c, P, N]

    # 2. Intra-chunk (diagonal blocks): y_l = Σ_{s≤l} (C_l·B_s) exp(a_{s+1..l}) X_s.
    CB_t = Bm @ Cm.transpose(-1, -2)  # [B, G, c, Q(s), Q(l)] = B_s · C_l
    CB_t.masked_fill_(torch.tril(torch.ones(Q, Q, dtype=torch.bool, device=a.device), diagonal=-1), 0.0)
    M_t = decay_t.mul_(CB_t[:, :, None])  # causal weights, in place [B, G, R, c, Q(s), Q(l)]
    y = M_t.transpose(-1, -2) @ X  # [B, G, R, c, Q(l), P]

    # 3. Inter-chunk state passing, one chunk at a time (c small steps on a [H, P, N] state).
    chunk_decay = _exp_decay(a_cum[..., -1])[..., None, None]  # [B, G, R, c, 1, 1]
    start_states = []
    for c in range(a.shape[3]):
        start_states.append(state)
        state = chunk_decay[:, :, :, c] * state + chunk_states[:, :, :, c]
    starts = torch.stack(start_states, dim=3)  # [B, G, R, c, P, N]: the state entering each chunk

    # 4. Off-diagonal blocks: the entering state read out by C_l, decayed through position l.
    y_off = torch.einsum("bgcln,bgrcpn->bgrclp", Cm, starts)
    y += y_off * _exp_decay(a_cum)[..., None]
    return y, state


def ssd_reference(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int = 0,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain sequential recurrence, one token at a time (tests only). Same signature and results as
    `ssd_chunked`; `chunk_size` is ignored. Written independently of `ssd_step` so a test ties both."""
    _check(x, dt, A, B, C)
    Bsz, L, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    f32 = torch.float32
    x, dt, A = x.to(f32), dt.to(f32), A.to(f32)
    Bh = B.to(f32).repeat_interleave(H // G, dim=2)  # [B, L, H, N]: head h reads group h // (H / G)
    Ch = C.to(f32).repeat_interleave(H // G, dim=2)
    h = x.new_zeros(Bsz, H, P, N, dtype=f32) if initial_state is None else initial_state.to(f32)
    y = x.new_zeros(Bsz, L, H, P, dtype=f32)
    for t in range(L):
        decay = torch.exp(dt[:, t] * A)[:, :, None, None]  # [B, H, 1, 1]
        h = decay * h + (dt[:, t, :, None] * x[:, t])[..., None] * Bh[:, t, :, None, :]
        y[:, t] = torch.einsum("bhpn,bhn->bhp", h, Ch[:, t])
    return y, h
