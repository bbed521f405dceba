"""Mamba2: the chunked SSD scan against the sequential recurrence, the mixer against HF's mixers (Mamba2,
Bamba, GraniteMoeHybrid; torch fallback path) on the same weights, and the cache invariants (prefill + N
steps == full forward, chunked prefill == whole, batched decode == each alone, stale slots ignored, decode
state O(1) in the context length).

Shapes: B batch, L length, H heads, P head dim, G groups, N state, T flat tokens, D hidden.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from blazr.config import Mamba2Config
from blazr.kernels.ops import ssd_step_reference
from blazr.model import ssd
from blazr.model.mamba2 import SSM_STATE_DTYPE, Mamba2
from blazr.model.ssd import ssd_chunked, ssd_reference
from blazr.state.batch import ForwardBatch
from blazr.state.kv_cache import LayerCache

HIDDEN = 64

# oxidizr's mixer options (spec §0/§5.2): biases everywhere, dt clamped, full-width gated norm, eps 1e-6.
OX_CFG = Mamba2Config(
    num_heads=8,
    head_dim=16,
    state_size=16,
    n_groups=1,
    conv_kernel=4,
    chunk_size=8,
    has_in_proj_bias=True,
    has_out_proj_bias=True,
    dt_min=0.001,
    dt_max=0.1,
    norm_eps=1e-6,
)
# Two groups, grouped norm (Bamba/Granite style), no dt clamp: larger dt makes state decay visible.
GROUPED_CFG = Mamba2Config(
    num_heads=8, head_dim=16, state_size=16, n_groups=2, conv_kernel=4, chunk_size=8, norm_group_size=64
)
CONFIGS = pytest.mark.parametrize("cfg", [OX_CFG, GROUPED_CFG], ids=["oxidizr", "grouped"])


# --- helpers ---------------------------------------------------------------------------------------------


def _ssd_inputs(Bsz: int, L: int, H: int, G: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    P, N = 8, 16
    x = torch.randn(Bsz, L, H, P, generator=g)
    dt = torch.rand(Bsz, L, H, generator=g) * 0.5 + 0.01
    A = -torch.rand(H, generator=g) * 2 - 0.1
    B = torch.randn(Bsz, L, G, N, generator=g)
    C = torch.randn(Bsz, L, G, N, generator=g)
    h0 = torch.randn(Bsz, H, P, N, generator=g)
    return x, dt, A, B, C, h0


def _randomize(module: nn.Module, seed: int = 0) -> None:
    """Random weights of sensible scale (HF's init leaves D = 1, norm = 1, zero biases: too easy)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=g) * 2.5)  # A in -[1, 12]
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=g) - 2.0)
            elif name.endswith("norm.weight") or name.endswith("D"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1] if p.dim() > 1 else 16
                p.copy_(torch.randn(p.shape, generator=g) / fan_in**0.5)


def _mixer(cfg: Mamba2Config, seed: int = 0) -> Mamba2:
    m = Mamba2(cfg, HIDDEN).eval()
    _randomize(m, seed)
    return m


def _cache(cfg: Mamba2Config, num_slots: int = 4, dtype: torch.dtype = torch.float32) -> LayerCache:
    """One layer's state pools, allocated like `kv_cache.ModelCache`."""
    return LayerCache(
        conv=torch.zeros(num_slots, cfg.conv_dim, cfg.conv_kernel - 1, dtype=dtype),
        ssm=torch.zeros(num_slots, cfg.num_heads, cfg.head_dim, cfg.state_size, dtype=SSM_STATE_DTYPE),
    )


def _batch(
    query_lens: list[int], context_lens: list[int], slots: list[int], num_decodes: int = 0
) -> ForwardBatch:
    positions = torch.cat([torch.arange(c, c + q) for q, c in zip(query_lens, context_lens, strict=True)])
    return ForwardBatch(
        positions=positions,
        query_lens=tuple(query_lens),
        context_lens=tuple(context_lens),
        num_decodes=num_decodes,
        logits_indices=torch.arange(positions.shape[0]),
        state_slots=torch.tensor(slots),
    )


def _full(m: Mamba2, x: torch.Tensor) -> torch.Tensor:
    """Reference: one whole sequence, no cache."""
    return m(x, ForwardBatch.prefill([x.shape[0]]), None)


# --- SSD scan --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("G", [1, 2])
@pytest.mark.parametrize("L", [1, 8, 29, 64])
@pytest.mark.parametrize("has_init", [False, True])
def test_ssd_chunked_matches_reference(G: int, L: int, has_init: bool) -> None:
    x, dt, A, B, C, h0 = _ssd_inputs(2, L, 4, G)
    init = h0 if has_init else None
    y, final = ssd_chunked(x, dt, A, B, C, chunk_size=8, initial_state=init)
    y_ref, final_ref = ssd_reference(x, dt, A, B, C, 8, init)
    assert y.shape == (2, L, 4, 8) and final.shape == (2, 4, 8, 16)
    assert y.dtype == final.dtype == torch.float32
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(final, final_ref, atol=1e-5, rtol=1e-5)


def test_ssd_chunked_blocks_and_chunk_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The result does not depend on the chunk size or on how chunks are grouped into memory blocks."""
    x, dt, A, B, C, h0 = _ssd_inputs(1, 45, 4, 2, seed=1)
    y_ref, final_ref = ssd_reference(x, dt, A, B, C, 0, h0)
    for Q in (1, 4, 16, 64):
        y, final = ssd_chunked(x, dt, A, B, C, Q, h0)
        torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(final, final_ref, atol=1e-5, rtol=1e-5)
    monkeypatch.setattr(ssd, "QUAD_BUDGET", 1)  # one chunk per block
    y, final = ssd_chunked(x, dt, A, B, C, 8, h0)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(final, final_ref, atol=1e-5, rtol=1e-5)


def test_ssd_chunked_strong_decay() -> None:
    """Decays far below exp(-87) (slow CPU exp; the scan floors them) still match the recurrence."""
    x, dt, A, B, C, h0 = _ssd_inputs(1, 40, 4, 2, seed=4)
    dt = dt * 4  # up to ~2
    A = -torch.tensor([1.0, 10.0, 40.0, 100.0])  # per-token log-decay down to ~-200
    y_ref, final_ref = ssd_reference(x, dt, A, B, C, 0, h0)
    y, final = ssd_chunked(x, dt, A, B, C, 16, h0)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(final, final_ref, atol=1e-5, rtol=1e-5)


def test_ssd_chunked_splits_like_a_recurrence() -> None:
    """Scanning [0, L) == [0, k) then [k, L) from the carried state (what chunked prefill relies on)."""
    x, dt, A, B, C, _ = _ssd_inputs(1, 40, 4, 1, seed=2)
    y, final = ssd_chunked(x, dt, A, B, C, 8)
    y1, mid = ssd_chunked(x[:, :13], dt[:, :13], A, B[:, :13], C[:, :13], 8)
    y2, final2 = ssd_chunked(x[:, 13:], dt[:, 13:], A, B[:, 13:], C[:, 13:], 8, mid)
    torch.testing.assert_close(torch.cat([y1, y2], dim=1), y, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(final2, final, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("G", [1, 2])
def test_ssd_step_matches_reference(G: int) -> None:
    x, dt, A, B, C, h0 = _ssd_inputs(3, 6, 4, G, seed=3)
    y_ref, final_ref = ssd_reference(x, dt, A, B, C, 0, h0)
    state = h0.clone()
    for t in range(6):
        y_t, state = ssd_step_reference(state, x[:, t], dt[:, t], A, B[:, t], C[:, t])
        torch.testing.assert_close(y_t, y_ref[:, t], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state, final_ref, atol=1e-5, rtol=1e-5)


# --- against HF ------------------------------------------------------------------------------------------

SEQ_LENS = [5, 17, 1, 24]  # flat: 47 tokens, crossing chunk boundaries (Q = 8) at different offsets


def _compare_with_hf(ours: Mamba2, hf: nn.Module) -> None:
    """Copy HF's weights into ours (names must match 1:1) and compare on a flat batch of sequences."""
    _randomize(hf, seed=7)
    ours.load_state_dict(hf.state_dict(), strict=True)
    x = torch.randn(sum(SEQ_LENS), HIDDEN, generator=torch.Generator().manual_seed(8))
    batch = ForwardBatch.prefill(SEQ_LENS)
    with torch.no_grad():
        out = ours(x, batch, None)
        ref = torch.cat(
            [hf(x[s : s + n][None])[0] for s, n in zip(batch.query_starts, SEQ_LENS, strict=True)]
        )
    assert out.shape == ref.shape == (sum(SEQ_LENS), HIDDEN)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("n_groups", [1, 2])
@pytest.mark.parametrize("style", ["default", "oxidizr"])
def test_mixer_matches_hf_mamba2(n_groups: int, style: str) -> None:
    from transformers import Mamba2Config as HFMamba2Config
    from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer

    ox = style == "oxidizr"
    hf_cfg = HFMamba2Config(
        hidden_size=HIDDEN,
        num_heads=8,
        head_dim=16,
        state_size=16,
        n_groups=n_groups,
        chunk_size=8,
        expand=2,
        conv_kernel=4,
        num_hidden_layers=1,
        use_bias=ox,
        use_conv_bias=True,
        time_step_limit=(0.001, 0.1) if ox else (0.0, float("inf")),
        layer_norm_epsilon=1e-6 if ox else 1e-5,
    )
    hf = Mamba2Mixer(hf_cfg, layer_idx=0).eval()
    assert hf.norm.group_size == 128 // n_groups  # HF's Mamba2 normalises per group, too
    cfg = Mamba2Config(
        num_heads=8,
        head_dim=16,
        state_size=16,
        n_groups=n_groups,
        conv_kernel=4,
        chunk_size=8,
        has_in_proj_bias=ox,
        has_out_proj_bias=ox,
        dt_min=hf_cfg.time_step_limit[0],
        dt_max=hf_cfg.time_step_limit[1],
        norm_group_size=128 // n_groups,
        norm_eps=hf_cfg.layer_norm_epsilon,
    )
    _compare_with_hf(Mamba2(cfg, HIDDEN).eval(), hf)


def test_mixer_matches_hf_bamba_grouped_norm() -> None:
    from transformers import BambaConfig
    from transformers.models.bamba.modeling_bamba import BambaMixer

    hf_cfg = BambaConfig(
        hidden_size=HIDDEN,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        mamba_n_heads=8,
        mamba_d_head=16,
        mamba_n_groups=2,
        mamba_d_state=16,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_chunk_size=8,
        rms_norm_eps=1e-5,
    )
    hf = BambaMixer(hf_cfg, layer_idx=0).eval()
    assert hf.norm.group_size == 64  # d_inner / n_groups
    _compare_with_hf(Mamba2(GROUPED_CFG, HIDDEN).eval(), hf)


def test_mixer_matches_hf_granitemoehybrid_grouped_norm() -> None:
    from transformers import GraniteMoeHybridConfig
    from transformers.models.granitemoehybrid.modeling_granitemoehybrid import GraniteMoeHybridMambaLayer

    hf_cfg = GraniteMoeHybridConfig(
        hidden_size=HIDDEN,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        layer_types=["mamba"],
        mamba_n_heads=8,
        mamba_d_head=16,
        mamba_n_groups=2,
        mamba_d_state=16,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_chunk_size=8,
        mamba_proj_bias=True,
        rms_norm_eps=1e-6,
    )
    hf = GraniteMoeHybridMambaLayer(hf_cfg, layer_idx=0).eval()
    assert hf.norm.group_size == 64
    cfg = dataclasses.replace(GROUPED_CFG, has_in_proj_bias=True, has_out_proj_bias=True, norm_eps=1e-6)
    _compare_with_hf(Mamba2(cfg, HIDDEN).eval(), hf)


@pytest.mark.parametrize("has_norm", [True, False], ids=["norm_before_gate", "no_norm"])
def test_mixer_matches_hf_falcon_h1(has_norm: bool) -> None:
    """FalconH1's mixer covers the other norm options: RMSNorm(y)·silu(z) per group, or plain y·silu(z)."""
    from transformers import FalconH1Config
    from transformers.models.falcon_h1.modeling_falcon_h1 import FalconH1Mixer

    hf_cfg = FalconH1Config(
        hidden_size=HIDDEN,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        mamba_d_ssm=128,
        mamba_n_heads=8,
        mamba_d_head=16,
        mamba_n_groups=2,
        mamba_d_state=16,
        mamba_d_conv=4,
        mamba_chunk_size=8,
        mamba_rms_norm=has_norm,
        mamba_norm_before_gate=True,
    )
    hf = FalconH1Mixer(hf_cfg, layer_idx=0).eval()
    hf.register_buffer("mup_vector", torch.ones(1, 1, 2 * 128 + 2 * 2 * 16 + 8), persistent=False)  # µP off
    cfg = dataclasses.replace(GROUPED_CFG, has_gated_norm=has_norm, is_norm_before_gate=True)
    _compare_with_hf(Mamba2(cfg, HIDDEN).eval(), hf)


# --- cache invariants ------------------------------------------------------------------------------------


@CONFIGS
@torch.no_grad()
def test_prefill_then_decode_equals_full_forward(cfg: Mamba2Config) -> None:
    m, cache = _mixer(cfg), _cache(cfg)
    x = torch.randn(30, HIDDEN, generator=torch.Generator().manual_seed(1))
    full = _full(m, x)
    outs = [m(x[:20], _batch([20], [0], [2]), cache)]
    for t in range(20, 30):
        outs.append(m(x[t : t + 1], _batch([1], [t], [2], num_decodes=1), cache))
    torch.testing.assert_close(torch.cat(outs), full, atol=1e-5, rtol=1e-4)


@CONFIGS
@torch.no_grad()
def test_chunked_prefill_equals_whole(cfg: Mamba2Config) -> None:
    m = _mixer(cfg)
    x = torch.randn(30, HIDDEN, generator=torch.Generator().manual_seed(2))
    whole_cache, chunked_cache = _cache(cfg), _cache(cfg)
    whole = m(x, _batch([30], [0], [1]), whole_cache)
    outs = [m(x[s : s + 7], _batch([min(7, 30 - s)], [s], [1]), chunked_cache) for s in range(0, 30, 7)]
    torch.testing.assert_close(torch.cat(outs), whole, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(whole, _full(m, x), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(chunked_cache.conv, whole_cache.conv, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(chunked_cache.ssm, whole_cache.ssm, atol=1e-5, rtol=1e-4)


@CONFIGS
@torch.no_grad()
def test_batched_decode_equals_each_alone(cfg: Mamba2Config) -> None:
    """Three sequences of different lengths, prefilled together, then decoding together (num_decodes=3)."""
    m, cache = _mixer(cfg), _cache(cfg, num_slots=5)
    lens, slots, steps = [3, 11, 20], [4, 0, 2], 6
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(n + steps, HIDDEN, generator=g) for n in lens]
    m(torch.cat([x[:n] for x, n in zip(xs, lens, strict=True)]), _batch(lens, [0, 0, 0], slots), cache)
    outs: list[list[torch.Tensor]] = [[], [], []]
    for k in range(steps):
        step_x = torch.stack([x[n + k] for x, n in zip(xs, lens, strict=True)])
        out = m(step_x, _batch([1, 1, 1], [n + k for n in lens], slots, num_decodes=3), cache)
        for b in range(3):
            outs[b].append(out[b : b + 1])
    for b in range(3):
        alone = _full(m, xs[b])[lens[b] :]
        torch.testing.assert_close(torch.cat(outs[b]), alone, atol=1e-5, rtol=1e-4)


@CONFIGS
@torch.no_grad()
def test_mixed_step_decodes_and_prefill_chunk(cfg: Mamba2Config) -> None:
    """One step holding 2 decodes, a continuing prefill chunk and a fresh prefill == each run alone;
    slots not in the batch are untouched."""
    m, cache = _mixer(cfg), _cache(cfg, num_slots=6)
    g = torch.Generator().manual_seed(4)
    a, b, c, d = (torch.randn(n, HIDDEN, generator=g) for n in (9, 5, 15, 6))
    m(torch.cat([a[:8], b[:4], c[:10]]), _batch([8, 4, 10], [0, 0, 0], [0, 1, 2]), cache)
    cache.conv[5].normal_()
    cache.ssm[5].normal_()
    untouched = cache.conv[5].clone(), cache.ssm[5].clone()
    out = m(torch.cat([a[8:], b[4:], c[10:], d]), _batch([1, 1, 5, 6], [8, 4, 10, 0], [0, 1, 2, 3], 2), cache)
    expected = torch.cat([_full(m, a)[8:], _full(m, b)[4:], _full(m, c)[10:], _full(m, d)])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    assert torch.equal(cache.conv[5], untouched[0]) and torch.equal(cache.ssm[5], untouched[1])


@CONFIGS
@torch.no_grad()
def test_fresh_prefill_ignores_stale_slot(cfg: Mamba2Config) -> None:
    m, cache = _mixer(cfg), _cache(cfg)
    cache.conv.normal_()
    cache.ssm.normal_()
    x = torch.randn(12, HIDDEN, generator=torch.Generator().manual_seed(5))
    outs = [m(x[:10], _batch([10], [0], [3]), cache)]  # fresh: context_len 0 on a garbage slot
    outs += [m(x[t : t + 1], _batch([1], [t], [3], 1), cache) for t in (10, 11)]
    out = torch.cat(outs)
    torch.testing.assert_close(out, _full(m, x), atol=1e-5, rtol=1e-4)


class _OpRecorder(TorchFunctionMode):
    """Records (op, output shapes) of every torch call made under it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, tuple]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, tuple | list) else (out,)
        shapes = tuple(tuple(o.shape) for o in outs if isinstance(o, torch.Tensor))
        self.ops.append((getattr(func, "__name__", str(func)), shapes))
        return out


@torch.no_grad()
def test_decode_state_is_constant_in_context() -> None:
    """A decode step does the same ops on the same shapes at context 4 and at context 60: its cost and the
    state it touches do not grow with the context (no timing assert)."""
    cfg = GROUPED_CFG
    m = _mixer(cfg)
    x = torch.randn(61, HIDDEN, generator=torch.Generator().manual_seed(6))
    recorded = []
    for ctx in (4, 60):
        cache = _cache(cfg, num_slots=2)
        m(x[:ctx], _batch([ctx], [0], [1]), cache)
        shapes = (tuple(cache.conv.shape), tuple(cache.ssm.shape))
        rec = _OpRecorder()
        with rec:
            m(x[ctx : ctx + 1], _batch([1], [ctx], [1], num_decodes=1), cache)
        assert (tuple(cache.conv.shape), tuple(cache.ssm.shape)) == shapes
        recorded.append(rec.ops)
    assert recorded[0] == recorded[1]
    # Nothing larger than the preallocated pool appears (index_copy_ returns the pool itself).
    largest = max(math.prod(s) for _, shapes in recorded[0] for s in shapes)
    assert largest <= cache.ssm.numel()


@torch.no_grad()
def test_bfloat16_prefill_and_decode_close_to_float32() -> None:
    cfg = OX_CFG
    m32 = _mixer(cfg)
    m16 = _mixer(cfg).to(torch.bfloat16)
    x = torch.randn(20, HIDDEN, generator=torch.Generator().manual_seed(9))
    ref = _full(m32, x)
    cache = _cache(cfg, dtype=torch.bfloat16)
    xb = x.to(torch.bfloat16)
    out = [m16(xb[:16], _batch([16], [0], [0]), cache)]
    out += [m16(xb[t : t + 1], _batch([1], [t], [0], 1), cache) for t in range(16, 20)]
    out16 = torch.cat(out)
    assert out16.dtype == torch.bfloat16 and cache.ssm.dtype == torch.float32
    torch.testing.assert_close(out16.float(), ref, atol=5e-2, rtol=5e-2)
