"""Q4_K / Q5_K / Q6_K re-laid in 16-row groups (kinds q4_kx / q5_kx / q6_kx: kernels/kquant_packed.py,
csrc/linear_kx.c).

The layout only moves bytes: the C pack equals the torch reference, unpacking gives ggml's rows back, and the
values (`dequantize`) are the stored kind's. The kernel gives the stored kind's bits — every row count (one
row, the register tiles up to 23 rows, linear_k_groups.c's tiles from 24), bias, residual and SwiGLU
epilogues, one-row calls at every weight-stream count, on every ISA build (VNNI's vpdpbusd groups, AVX2's
vpmaddubsw runs in int16; the scalar build unpacks and runs the stored kernel). The loader re-lays K-quant
linears where the kernels have a group path that gains (`packs_on`), from a view or a row table of the file,
and leaves the rest as stored; a whole Q4_K_M GGUF gives the same logits and tokens either way
(tests/test_kquant.py).
"""

from __future__ import annotations

import pytest
import torch

from blazr.kernels import kquant_packed, ops, tuning
from blazr.kernels.kquant import random_kquant
from blazr.kernels.mapped import MappedWeight
from blazr.kernels.quant import QuantizedWeight, dequantize, quantize
from blazr.kernels.reference import linear_reference
from tests.kernel_checks import _knob_values
from tests.test_kquant import _acts, _weight
from tests.threads import intra_op_threads

KINDS = ["q4_k", "q5_k", "q6_k"]


@pytest.mark.parametrize("kind", KINDS)
def test_pack_moves_the_bytes(native: ops.Kernels, kind: str) -> None:
    qw = _weight(kind, 48, 768, seed=3)
    want = kquant_packed.pack_reference(kind, qw.data, 48, 768)
    rows = qw.data.data_ptr() + qw.data.shape[1] * torch.arange(48, dtype=torch.int64)
    assert torch.equal(native.pack_kx(kind, rows, 48, 768), want)
    packed = kquant_packed.pack(qw)
    assert packed.kind == kquant_packed.KX_OF[kind] and torch.equal(packed.data, want)
    assert torch.equal(packed.data.view(-1).sort().values, qw.data.view(-1).sort().values)  # a permutation
    assert torch.equal(packed.ggml_blocks(), qw.data)
    assert torch.equal(dequantize(packed), dequantize(qw))
    group = 16 * qw.data.shape[1]  # the first group's bytes are the first 16 rows' bytes, moved
    assert torch.equal(want.view(-1)[:group].sort().values, qw.data[:16].reshape(-1).sort().values)


@pytest.mark.parametrize("kind", KINDS)
# one row; a full 4-row tile and one past it; the tiles' last row count; the groups' first, and several tiles
@pytest.mark.parametrize("M", [1, 4, 5, 23, 24, 61])
def test_packed_kernel_gives_the_stored_bits(lib: ops.Kernels, kind: str, M: int) -> None:
    g = torch.Generator().manual_seed(M)
    qw = _weight(kind, 64, 512, seed=M + 1)
    packed = kquant_packed.pack(qw)
    x = _acts(M, 512, g)
    bias, residual = torch.randn(64, generator=g), torch.randn(M, 64, generator=g)
    for kw in ({}, {"bias": bias}, {"residual": residual}, {"bias": bias, "swiglu": True}):
        got, want = lib.linear(x, packed, **kw), lib.linear(x, qw, **kw)
        assert torch.equal(got, want), (M, kw.keys())
    assert torch.equal(linear_reference(x, packed), linear_reference(x, qw))  # the reference sees its values


@pytest.mark.parametrize("kind", KINDS)
def test_one_row_in_streams_gives_the_tiles_bits(lib: ops.Kernels, kind: str) -> None:
    """A one-row call (AVX2: linear_kx.c's kx_streams, the groups of a thread's block walked S at a time,
    balanced) gives the bits the same row gets in a batch, at every stream count this build takes (knob
    streams_kx), one thread and two, at group counts that leave streams short or empty — bias + residual and
    SwiGLU too."""
    g = torch.Generator().manual_seed(11)
    x = _acts(3, 512, g)
    assert "streams_kx" in {k.name for k in tuning.KNOBS}
    for n in (32, 96, 224):
        packed = kquant_packed.pack(_weight(kind, n, 512, seed=n))
        bias, residual = torch.randn(n, generator=g), torch.randn(3, n, generator=g)
        batch = lib.linear(x, packed, bias, residual.clone())
        swiglu = lib.linear(x, packed, swiglu=True)
        for streams in _knob_values(lib, "streams_kx"):
            for threads in (1, 2):
                with lib.tuned(streams_kx=streams), intra_op_threads(threads):
                    for i in range(3):
                        one = lib.linear(x[i : i + 1], packed, bias, residual[i : i + 1].clone())
                        assert torch.equal(one, batch[i : i + 1]), (n, streams, threads, i)
                        got = lib.linear(x[i : i + 1], packed, swiglu=True)
                        assert torch.equal(got, swiglu[i : i + 1]), (n, streams, threads, i, "swiglu")


def test_packed_kernel_batch_rows_are_independent(lib: ops.Kernels) -> None:
    """A batched call equals one call per row wherever the row falls: the 4-row tiles, the groups' tiles."""
    g = torch.Generator().manual_seed(5)
    x = _acts(37, 256, g)
    for kind in KINDS:
        packed = kquant_packed.pack(_weight(kind, 32, 256, seed=9))
        rows = torch.cat([lib.linear(x[i : i + 1], packed) for i in range(len(x))])
        for lo, hi in ((0, 37), (5, 12), (3, 26), (13, 37)):
            assert torch.equal(lib.linear(x[lo:hi], packed), rows[lo:hi]), (kind, lo, hi)


def test_a_kmix_weights_k_quant_segments_re_laid_give_the_stored_bits(
    lib: ops.Kernels, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kmix weight (Q4_K_M's q|k in Q4_K beside a Q6_K v; here a Q8_0 segment and a K-quant one of 24 rows
    too) with its K-quant segments of whole 16-row groups re-laid, the others kept: csrc/linear_mix.c, running
    it segment by segment, gives the stored kmix's bits at every row count — bias, residual, and a SwiGLU
    whose halves differ in kind — on every build. The loader's rule packs exactly those segments where this
    host packs their kinds."""
    from blazr.kernels import tuning

    g = torch.Generator().manual_seed(21)
    q8 = quantize(torch.randn(16, 512, generator=g), "q8_0g")
    parts = [_weight("q4_k", 32, 512, 1), _weight("q6_k", 16, 512, 2), q8, _weight("q5_k", 24, 512, 3)]
    mixed = QuantizedWeight.from_parts(parts)
    packs = [p.kind in kquant_packed.KX_OF and p.out_features % 16 == 0 for p in parts]
    relaid = QuantizedWeight.from_parts(
        [kquant_packed.pack(p) if packs[i] else p for i, p in enumerate(parts)]
    )
    assert [p.kind for p in relaid.parts()] == ["q4_kx", "q6_kx", "q8_0g", "q5_k"]
    assert torch.equal(dequantize(relaid), dequantize(mixed))
    for M in (1, 5, 30):
        x = _acts(M, 512, g)
        bias, residual = torch.randn(88, generator=g), torch.randn(M, 88, generator=g)
        for kw in ({}, {"bias": bias}, {"residual": residual}):
            assert torch.equal(lib.linear(x, relaid, **kw), lib.linear(x, mixed, **kw)), (M, kw.keys())
    gate_up = QuantizedWeight.from_parts([_weight("q4_k", 32, 512, 4), _weight("q6_k", 32, 512, 5)])
    relaid_gate_up = QuantizedWeight.from_parts([kquant_packed.pack(p) for p in gate_up.parts()])
    for M in (1, 3, 26):
        x = _acts(M, 512, g)
        want = lib.linear(x, gate_up, swiglu=True)
        assert torch.equal(lib.linear(x, relaid_gate_up, swiglu=True), want), M
    monkeypatch.setattr(tuning, "CHOICES", {"kpack_q4_k": "groups", "kpack_q6_k": "groups"})
    features = ops.kernels().features
    here = {kind: kquant_packed.packs_on(kind, features) for kind in KINDS}
    assert kquant_packed.packed_kind(mixed) == ("kmix" if here["q4_k"] or here["q6_k"] else None)
    kinds = [p.kind for p in kquant_packed.pack(mixed).parts()]
    q4, q6 = ("q4_kx" if here["q4_k"] else "q4_k"), ("q6_kx" if here["q6_k"] else "q6_k")
    assert kinds == [q4, q6, "q8_0g", "q5_k"]
    if all(here.values()):
        assert torch.equal(kquant_packed.pack(mixed).data, relaid.data)
    monkeypatch.setattr(tuning, "CHOICES", {"kpack_q4_k": "stored", "kpack_q6_k": "groups"})
    kinds = [p.kind for p in kquant_packed.pack(mixed).parts()]  # the Q4_K and Q5_K segments kept as stored
    assert kinds == ["q4_k", q6, "q8_0g", "q5_k"]


def test_packed_kinds_check_their_shapes(native: ops.Kernels) -> None:
    qw = random_kquant("q4_k", 40, 256, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="multiple of 16"):
        kquant_packed.pack(qw)
    with pytest.raises(ValueError, match="out_features of 16"):
        QuantizedWeight("q6_kx", torch.zeros(3, 16 * 210, dtype=torch.uint8), 40, 256)
    odd_halves = kquant_packed.pack(random_kquant("q4_k", 48, 256, torch.Generator().manual_seed(1)))
    with pytest.raises(ValueError, match="do not fill 16-row groups"):  # SwiGLU halves of 24 rows
        native.linear(torch.randn(2, 256), odd_halves, swiglu=True)


def test_loader_packs_where_the_kernels_run_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """`packed_kind`, the loader's rule: a K-quant weight of whole 32-row groups (in a stack, each weight's
    rows; a row table into the file's map too) is re-laid where the build's group path runs its kind (VNNI:
    every kind; AVX2 without it: Q4_K and Q5_K), anything else kept as stored; host tuning's choice decides
    each kind (q5_k following q4_k), BLAZR_KPACK=0 / 1 over it, and the scalar build never packs. A row table
    packs to the gathered rows' groups."""
    g = torch.Generator().manual_seed(2)
    qw = random_kquant("q6_k", 64, 256, g)
    features = ops.kernels().features
    vnni = "avx512_vnni" in features
    avx2 = "avx2" in features
    assert kquant_packed.packs_on("q4_k", features) == kquant_packed.packs_on("q5_k", features) == avx2
    assert not any(kquant_packed.packs_on(kind, []) for kind in KINDS)  # the scalar build
    assert [kquant_packed.packs_on(kind, ["avx2"]) for kind in KINDS] == [True, True, False]
    monkeypatch.setattr(tuning, "CHOICES", {"kpack_q4_k": "groups", "kpack_q6_k": "groups"})
    rule = kquant_packed.packed_kind
    assert rule(qw) == ("q6_kx" if vnni else None)
    holder = qw.data.clone()
    order = torch.arange(64).flip(0)  # rows in reverse order, read where they lie
    mapped = MappedWeight("q6_k", holder.data_ptr() + holder.shape[1] * order, holder, 64, 256)
    assert rule(mapped) == rule(qw)
    want = kquant_packed.pack(QuantizedWeight("q6_k", holder[order].contiguous(), 64, 256)).data
    assert torch.equal(kquant_packed.pack(mapped).data, want)
    stack = random_kquant("q4_k", 96, 256, g)  # 3 stacked weights of 32 rows: packs; 2 of 48 do not
    assert rule(stack, 3) == ("q4_kx" if avx2 else None) and rule(stack, 2) is None
    for other in (random_kquant("q4_k", 48, 256, g), quantize(torch.randn(64, 256, generator=g), "q8_0g")):
        assert rule(other) is None
    q5 = random_kquant("q5_k", 32, 256, g)
    for q4_choice, q6_choice in (
        ("stored", "groups"),
        ("groups", "stored"),
    ):  # host tuning's choice, per kind
        monkeypatch.setattr(tuning, "CHOICES", {"kpack_q4_k": q4_choice, "kpack_q6_k": q6_choice})
        assert (rule(qw) == "q6_kx") == (vnni and q6_choice == "groups")
        assert (rule(q5) == "q5_kx") == (avx2 and q4_choice == "groups")
        monkeypatch.setenv("BLAZR_KPACK", "1")  # over the choice, where the kernels have the path
        assert (rule(qw) == "q6_kx") == vnni and (rule(q5) == "q5_kx") == avx2
        monkeypatch.setenv("BLAZR_KPACK", "0")
        assert rule(qw) is None
        monkeypatch.delenv("BLAZR_KPACK")
