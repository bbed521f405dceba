"""MLA's per-head decode weights made at load (loading/absorb.py): the kind each mode picks, values kept
exact under `auto` and written back into kv_b_proj under the rounding modes, and a decode step on the kernel
ops (`MLA._decode`: linear_heads → mla_decode → linear_heads) equal to the torch absorbed form on the same
weights, for every kind.

Shapes: D hidden, H heads, L latent rank, Dn / R / Dv head dims.
"""

from __future__ import annotations

import pytest
import torch

from blazr.config import MLAConfig, RopeConfig
from blazr.kernels.quant import dequantize, quantize
from blazr.loading.absorb import absorb_mla
from blazr.model.mla import MLA
from blazr.model.rope import RotaryEmbedding
from tests.test_mla import Pool

D, H, L, DN, R, DV = 64, 4, 64, 32, 8, 32  # block kinds fit: Dn, L multiples of 32, 16-row groups per head


def _mla(seed: int = 0) -> MLA:
    cfg = MLAConfig(H, None, L, DN, R, DV, RopeConfig(dim=R), (DN + R) ** -0.5)
    torch.manual_seed(seed)
    mla = MLA(cfg, D, RotaryEmbedding(cfg.rope, 128)).eval()
    with torch.no_grad():
        for p in mla.parameters():
            p.normal_(0.0, 0.2)
    return mla


def _kinds(mla: MLA) -> tuple[str, str]:
    assert mla.absorbed is not None
    return mla.absorbed[0].kind, mla.absorbed[1].kind


@pytest.mark.parametrize(
    "mode, kind", [("none", "f32"), ("int8", "q8_0g"), ("int4", "q4_1"), ("bf16", "bf16"), ("auto", "f32")]
)
def test_the_kind_each_mode_makes(mode: str, kind: str) -> None:
    mla = _mla()
    assert absorb_mla(mla, mode) == {kind: 1}
    w_uk_t, w_uv = mla.absorbed
    assert (w_uk_t.out_features, w_uk_t.in_features) == (H * L, DN)
    assert (w_uv.out_features, w_uv.in_features) == (H * DV, L)


@pytest.mark.parametrize("kind", ["q8_0g", "f16", "bf16"])
def test_auto_takes_the_smallest_kind_that_holds_the_weights_exactly(kind: str) -> None:
    """A kv_b_proj whose halves are exact Q8_0 (as a Q8_0 GGUF's attn_k_b / attn_v_b: blocks along Dn and
    L) becomes Q8_0, exact f16 values f16, exact bf16 values bf16 (that f16 cannot hold); the weight itself
    is left as it is."""
    mla = _mla()
    w = mla.kv_b_proj.weight.detach().view(H, DN + DV, L)
    with torch.no_grad():
        if kind == "q8_0g":
            w_uk = dequantize(quantize(w[:, :DN].transpose(1, 2).reshape(H * L, DN), "q8_0"))
            w[:, :DN] = w_uk.view(H, L, DN).transpose(1, 2)
            w[:, DN:] = dequantize(quantize(w[:, DN:].reshape(H * DV, L), "q8_0")).view(H, DV, L)
        elif kind == "f16":
            w.copy_(w.half().float())
        else:  # exact bf16 beyond f16's range (bf16 values of f16's range are f16 too: f16 is taken first)
            w.copy_((w * 2.0**20).bfloat16().float())
    before = mla.kv_b_proj.weight.detach().clone()
    absorb_mla(mla, "auto")
    assert _kinds(mla) == (kind, kind)
    assert torch.equal(mla.kv_b_proj.weight, before)
    assert torch.equal(dequantize(mla.absorbed[1]), before.view(H, DN + DV, L)[:, DN:].reshape(H * DV, L))


def test_rounding_modes_write_the_rounded_values_back() -> None:
    mla = _mla()
    before = mla.kv_b_proj.weight.detach().clone()
    absorb_mla(mla, "int8")
    w = mla.kv_b_proj.weight.detach().view(H, DN + DV, L)
    w_uk_t, w_uv = mla.absorbed
    assert torch.equal(w[:, :DN], dequantize(w_uk_t).view(H, L, DN).transpose(1, 2))
    assert torch.equal(w[:, DN:], dequantize(w_uv).view(H, DV, L))
    assert not torch.equal(mla.kv_b_proj.weight, before)
    torch.testing.assert_close(mla.kv_b_proj.weight, before, rtol=0, atol=0.2 * 4 / 127)  # |w| ≲ 4σ


def test_shapes_a_block_kind_cannot_hold_stay_float32() -> None:
    """Dv = 24: 24 rows a head are not whole 16-row groups of Q4_1's packed layout, so int4 keeps both
    halves float32 (Q8_0, in ggml's rows, splits anywhere); Dn = 16 is no whole block of 32 for either."""
    cfg = MLAConfig(H, None, L, DN, R, 24, RopeConfig(dim=R), 0.1)
    mla = MLA(cfg, D, RotaryEmbedding(cfg.rope, 128)).eval()
    assert absorb_mla(mla, "int4") == {"f32": 1}
    assert absorb_mla(mla, "int8") == {"q8_0g": 1}
    cfg = MLAConfig(H, None, L, 16, R, DV, RopeConfig(dim=R), 0.1)
    assert absorb_mla(MLA(cfg, D, RotaryEmbedding(cfg.rope, 128)).eval(), "int8") == {"f32": 1}


@pytest.mark.parametrize("mode", ["none", "int8", "int4", "bf16"])
@torch.no_grad()
def test_kernel_decode_equals_the_torch_absorbed_form(mode: str) -> None:
    """Two sequences prefilled, then 5 decode-only steps: on the kernel ops (absorbed weights made) and in
    torch (`absorbed` unset: the bmm form over kv_b_proj) — the same weights, since the rounding modes wrote
    their values back into kv_b_proj: equal to fp32 rounding for float32, and up to the kernels' own rounding
    of the activations (bf16, 8 bits per block of 32) for the others (a wrong head or layout would be
    off by the outputs' whole size, ~1)."""
    kernels = _mla(seed=3)
    absorb_mla(kernels, mode)
    torch_form = _mla(seed=3)
    torch_form.kv_b_proj.weight.copy_(kernels.kv_b_proj.weight)
    assert torch_form.absorbed is None
    x = torch.randn(2, 20, D)
    outs = []
    for mla in (kernels, torch_form):
        pool = Pool(2, width=L + R)
        mla(torch.cat([x[0, :12], x[1, :9]]), pool.batch([(0, 0, 12), (1, 0, 9)]), pool.cache)
        steps = [mla(torch.stack([x[0, 12 + t], x[1, 9 + t]]), pool.batch([(0, 12 + t, 1), (1, 9 + t, 1)]),
                     pool.cache) for t in range(5)]  # fmt: skip
        outs.append(torch.stack(steps))
    tol = 1e-5 if mode == "none" else 1e-2
    torch.testing.assert_close(outs[0], outs[1], rtol=tol, atol=tol)
    assert outs[1].abs().max() > 0.3
