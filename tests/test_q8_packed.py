"""A GGUF's Q8_0 linears re-laid in the row-packed layout (kernels/q8_packed.py): the packed weight computes
the stored one's bits at every row count on every build, a MappedWeight's rows are packed in their row
order without keeping a gathered copy, and the loader's rule — which weights, on which hosts, by host
tuning's choice or `BLAZR_Q8PACK` — holds. The loads themselves: tests/test_quantize.py
`test_gguf_q8_0_runs_as_stored_with_the_packed_logits` (logits bit for bit, the quantization cache)."""

from __future__ import annotations

import pytest
import torch

from blazr.kernels import ops, q8_packed, tuning
from blazr.kernels.mapped import MappedWeight
from blazr.kernels.quant import QuantizedWeight, quantize, row_bytes


def _stored(n: int, k: int, seed: int) -> QuantizedWeight:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    w[0, :32] = 0.0  # an all-zero block: d = 0
    return QuantizedWeight("q8_0g", quantize(w, "q8_0").ggml_blocks(), n, k)


@pytest.mark.parametrize("n, k", [(40, 256), (72, 512), (200, 96)])
def test_packed_q8_0_computes_the_stored_bits(lib: ops.Kernels, n: int, k: int) -> None:
    """Every row count a call meets — one row (decode, the host-tuned streams at each stream count), a few
    (batched decode and verification), a prompt chunk past the stored kind's packing threshold — with bias
    + residual and as SwiGLU (gate|up halves of N/2 rows: 36 and 100 are not whole groups of 16): the packed
    weight's outputs equal the stored weight's bit for bit."""
    stored = _stored(n, k, seed=n)
    packed = q8_packed.pack(stored)
    assert packed.kind == "q8_0" and (packed.out_features, packed.in_features) == (n, k)
    assert torch.equal(packed.ggml_blocks(), stored.data)  # the same values, moved
    g = torch.Generator().manual_seed(k)
    bias = torch.randn(n, generator=g)
    streams = [1, 2, 4] if "avx2" in lib.features else [1]
    for m in (1, 2, 5, 16, 17, 40, 64):
        x = torch.randn(m, k, generator=g)
        residual = torch.randn(m, n, generator=g)
        for s in streams if m == 1 else [None]:
            knobs = {} if s is None else {"streams_q": s}
            with lib.tuned(**knobs):
                got = [
                    lib.linear(x, packed),
                    lib.linear(x, packed, bias, residual.clone()),
                    lib.linear(x, packed, swiglu=True),
                ]
            want = [
                lib.linear(x, stored),
                lib.linear(x, stored, bias, residual.clone()),
                lib.linear(x, stored, swiglu=True),
            ]
            for i, (a, b) in enumerate(zip(got, want, strict=True)):
                assert torch.equal(a, b), (m, s, i)


def test_mapped_rows_are_packed_in_row_order_and_not_kept() -> None:
    """A MappedWeight (a fused weight's rows apart in the file's map) is packed from its rows in table order
    — the same bytes as packing the gathered rows — and the gathered copy is not kept on the weight."""
    stored = _stored(48, 128, seed=3)
    step = row_bytes("q8_0g", 128)
    buf = torch.zeros(2 * 48 * step, dtype=torch.uint8)
    order = torch.randperm(48, generator=torch.Generator().manual_seed(1))
    for i, j in enumerate(order.tolist()):  # row i of the weight at slot 2·j of the buffer
        buf[2 * j * step : (2 * j + 1) * step] = stored.data[i]
    rows = buf.data_ptr() + 2 * step * order.to(torch.int64)
    mapped = MappedWeight("q8_0g", rows, buf, 48, 128)
    packed = q8_packed.pack(mapped)
    assert torch.equal(packed.data, q8_packed.pack(stored).data)
    assert mapped._gathered is None
    with pytest.raises(ValueError, match="q8_0g weight expected, found q4_0"):
        q8_packed.pack(quantize(torch.randn(16, 64), "q4_0"))


def test_which_weights_the_loader_packs(monkeypatch: pytest.MonkeyPatch) -> None:
    """`packs`: a q8_0g linear on the CPU — not the output head (its fp32-x form is q8_0g's), not an expert
    stack, no other kind — on a host that packs (`wanted`: the library's AVX2 path, then `BLAZR_Q8PACK`, then
    host tuning's `q8pack_q8_0g`, the stored layout where tuning chose nothing); `runs_as` names the kind."""
    k = ops.kernels()
    assert k is not None
    vector = "avx2" in k.features
    stored = _stored(32, 64, seed=2)
    monkeypatch.setenv("BLAZR_Q8PACK", "1")
    assert q8_packed.packs(stored) == vector and q8_packed.runs_as() == ("q8_0" if vector else "q8_0g")
    assert not q8_packed.packs(stored, head=True)
    assert not q8_packed.packs(stored, num_stacked=2)
    assert not q8_packed.packs(quantize(torch.randn(32, 64), "q4_0"))
    monkeypatch.setenv("BLAZR_Q8PACK", "0")
    assert not q8_packed.packs(stored) and q8_packed.runs_as() == "q8_0g"
    monkeypatch.delenv("BLAZR_Q8PACK")
    monkeypatch.setattr(tuning, "CHOICES", {})
    assert not q8_packed.packs(stored)  # untuned: as stored, what the loader did before
    monkeypatch.setattr(tuning, "CHOICES", {"q8pack_q8_0g": "packed"})
    assert q8_packed.packs(stored) == vector
    monkeypatch.setattr(tuning, "CHOICES", {"q8pack_q8_0g": "stored"})
    assert not q8_packed.packs(stored)
