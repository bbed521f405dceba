"""The elementwise kernels (embedding from a float table and from a GGUF row table, scaled add, MLP
activations) against their torch references, on every ISA build (`lib`, tests/conftest.py); GELU's bits
the same on every build. Moved out of tests/test_kernels.py."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from blazr.kernels import coded, ops
from blazr.kernels.kquant import random_kquant
from blazr.kernels.quant import BLOCK_KINDS, FLOAT_KINDS, K_KINDS, dequantize, quantize
from blazr.kernels.row_table import ROW_KINDS, RowTable
from tests.threads import intra_op_threads


def test_embedding(lib: ops.Kernels) -> None:
    """Rows gathered bit for bit (times a scale, as torch multiplies); an id out of range is an error."""
    g = torch.Generator().manual_seed(0)
    table, ids = torch.randn(50, 96, generator=g), torch.tensor([3, 0, 49, 3])
    for scale in (1.0, 2.5):
        assert torch.equal(lib.embedding(ids, table, scale), ops.embedding_reference(ids, table, scale))
    with pytest.raises(RuntimeError, match="out of range"):
        lib.embedding(torch.tensor([50]), table)


@pytest.mark.parametrize("kind", ROW_KINDS)
def test_embedding_rows(lib: ops.Kernels, kind: str) -> None:
    """A table kept in a GGUF's row layout: the looked-up rows dequantized bit for bit as dequantizing the
    whole table would (gguf.quants' values), times a scale; only rows in range. Coded rows (a tied head's,
    kernels/coded.py) decode to their bf16 / f32 values the same way."""
    g = torch.Generator().manual_seed(2)
    V, D = 37, 512
    if kind in K_KINDS:
        data = random_kquant(kind, V, D, g).data
    elif kind in (*BLOCK_KINDS, "q5_0"):
        data = quantize(torch.randn(V, D, generator=g), kind).ggml_blocks()
    elif kind in coded.BASE_OF:
        data = coded.pack_reference(torch.randn(V, D, generator=g).to(FLOAT_KINDS[coded.BASE_OF[kind]]))
    else:
        data = torch.randn(V, D, generator=g).to(FLOAT_KINDS[kind]).view(torch.uint8)
    table = RowTable(kind, data.contiguous(), V, D)
    whole = dequantize(table.rows(torch.arange(V)))
    if (
        kind not in FLOAT_KINDS and kind not in coded.BASE_OF
    ):  # the file's values, as gguf-py dequantizes them
        ggml_type = gguf.GGMLQuantizationType[kind.upper()]
        assert np.array_equal(whole.numpy(), gguf.quants.dequantize(data.numpy(), ggml_type))
    ids = torch.tensor([3, 0, 36, 3])
    for scale in (1.0, 2.5):
        got = lib.embedding_rows(ids, table, scale)
        assert torch.equal(got, ops.embedding_rows_reference(ids, table, scale))
        assert torch.equal(got, ops.embedding_reference(ids, whole, scale))
    with pytest.raises(RuntimeError, match="out of range"):
        lib.embedding_rows(torch.tensor([V]), table)


def test_add(lib: ops.Kernels) -> None:
    """alpha·x + beta·y with each product rounded before the sum, as torch: the same bits; in place too."""
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(3, 77, generator=g), torch.randn(3, 77, generator=g)
    for alpha, beta in [(1.0, 1.0), (1.0, 0.5), (2.0, -3.0)]:
        assert torch.equal(lib.add(x, y, alpha, beta), ops.add_reference(x, y, alpha, beta))
    assert torch.equal(lib.add(x, None, 0.25), x * 0.25)
    out = x.clone()
    assert lib.add(out, y, beta=0.5, out=out) is out and torch.equal(out, x + y * 0.5)


@pytest.mark.parametrize("kind", ["silu", "gelu", "relu2", "gelu_erf"])
@pytest.mark.parametrize("gated", [False, True])
def test_activation(lib: ops.Kernels, kind: str, gated: bool) -> None:
    """The MLP activations against torch's (relu² the same bits; SiLU / GELU to fp32 rounding)."""
    x = torch.randn(3, 2 * 80, generator=torch.Generator().manual_seed(2)) * 4
    got, want = lib.activation(x, kind, gated), ops.activation_reference(x, kind, gated)
    assert got.shape == want.shape == (3, 80 if gated else 160)
    if kind == "relu2":
        assert torch.equal(got, want)
    torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)


def _same_bits_everywhere(native: ops.Kernels, other: ops.Kernels, x: torch.Tensor, kind: str, gated: bool):
    """The activation of x on every build, both ends of a row, one thread or two: the same bits."""
    with intra_op_threads(1):
        one = native.activation(x, kind, gated)
    with intra_op_threads(2):
        assert torch.equal(native.activation(x, kind, gated), one)
    assert torch.equal(other.activation(x, kind, gated), one)
    if not gated:  # each value's bits wherever it falls: the row shifted by one lane
        assert torch.equal(native.activation(x[:, 1:].contiguous(), kind, gated), one[:, 1:])
    return one


@pytest.mark.parametrize("gated", [False, True])
def test_silu_same_bits_everywhere(native: ops.Kernels, other_build: ops.Kernels, gated: bool) -> None:
    """SiLU runs 8 lanes a step with a scalar tail (csrc/elementwise.c act_row): the same bits everywhere,
    past exp's clamps too."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(37, 2 * 1003, generator=g) * torch.logspace(-3, 2.8, 2 * 1003)
    x[0, :6] = torch.tensor([0.0, -0.0, 500.0, -500.0, 1e-30, -1e-30])
    _same_bits_everywhere(native, other_build, x, "silu", gated)


@pytest.mark.parametrize("gated", [False, True])
def test_gelu_same_bits_everywhere(native: ops.Kernels, other_build: ops.Kernels, gated: bool) -> None:
    """GELU (tanh) runs 8 lanes a step with a scalar tail (csrc/elementwise.c gelu256 / gelu_tanh): every
    build, both ends of a row, one thread or two give the same bits — signed zeros, tiny values and values
    past exp's clamps (|x| ≥ 60) included — and they stay within fp32 rounding of the exact value (the
    torch reference's tanh form loses it to cancellation where x < 0)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(37, 2 * 1003, generator=g) * torch.logspace(-3, 2, 2 * 1003)
    x[0, :8] = torch.tensor([0.0, -0.0, 100.0, -100.0, 1e-30, -1e-30, 9.0, -9.0])
    one = _same_bits_everywhere(native, other_build, x, "gelu", gated)
    # against the exact value in float64 (as x·sigmoid(2u): the tanh form cancels to 0 in float64 too
    # where x < 0): a few ulp of the fp32 exponent z = −2u carried through e^z (relative (1 + |z|)·2^−21),
    # and exp's clamp (|x|·e^−88.3 where the true value is smaller still)
    h, up = x.double().chunk(2, dim=-1) if gated else (x.double(), 1.0)
    z = 2 * 0.7978845608028654 * (h + 0.044715 * h**3)
    exact = h * torch.sigmoid(z) * up
    assert ((one.double() - exact).abs() <= (1 + z.abs()) * 2**-21 * exact.abs() + 1e-35).all()
