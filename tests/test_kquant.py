"""GGUF K-quant weights (Q4_K, Q5_K, Q6_K) run as stored: the format (`dequantize` equal to gguf-py's), the
Q8_K activation rounding (C equal to the torch reference), the C kernel against an exact emulation of its
integer algorithm and against dequantize-then-matmul, the same bits from the AVX2 and the portable scalar
builds, batch invariance, epilogues, bad shapes; and a GGUF made by llama.cpp's own Q4_K_M quantizer loaded
with its K-quant tensors kept as stored, against the same file dequantized and against llama.cpp.

Tolerances, derived (u = 2⁻²⁴, γ_n = n·u/(1 − n·u)):
- the kernel computes Σ_b fl(fl(d·dx)·sumi) (− fl(dmin·dx)·summ) with exact integers sumi / summ and fp32
  fmas in a fixed order: within γ_{2·nb+8}·Σ_b |terms| of the exact value of that expression (nb = K/256);
- against x̂·Wᵀ in exact arithmetic (x̂ = dx·q, ggml's Q8_K rounding of x, and W dequantized exactly):
  γ_{K+2·nb+16}·Σ|x̂|·(|d·sc·q| + |dmin·m|) — the fp32 rounding of W, x̂ and the sums on either side;
- against the unrounded x: + Σ_blocks |dx|·(½ + 2⁻¹⁴)·Σ_block |w| (`quantize_q8_k`'s bound).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from blazr import LLM, SamplingParams
from blazr.kernels import kquant_packed, ops
from blazr.kernels.kquant import quantize_q8_k, random_kquant
from blazr.kernels.kquant_fields import kquant_fields
from blazr.kernels.quant import (
    K_KINDS,
    QK_K,
    QuantizedWeight,
    dequantize,
    quantize,
)
from blazr.loading import quant_cache
from blazr.model.qlinear import QuantizedLinear
from tests.drive import assert_greedy_diverges_only_at_ties, assert_quantized_logits, full_logits
from tests.hf_parity import prompts
from tests.kernel_checks import _check_linear, _epilogue, gamma

GGML = {"q4_k": gguf.GGMLQuantizationType.Q4_K, "q5_k": gguf.GGMLQuantizationType.Q5_K,
        "q6_k": gguf.GGMLQuantizationType.Q6_K}  # fmt: skip


# The libraries under test (`native`, `other_build`: each build of other paths, `lib`: each build) are
# conftest.py's.


def _weight(kind: str, n: int, k: int, seed: int) -> QuantizedWeight:
    """Random bytes (every quant, scale and min over its range) with a few extreme super-blocks: all quants
    and scales at their maximum, and for Q6_K the most negative scale with q − 32 = −32 — the first two
    super-blocks of rows 0 and 1, so that `_acts`' full-scale super-block of constant sign meets them (the
    integer sums' extreme: the AVX2 kernels hold runs of them in int16)."""
    qw = random_kquant(kind, n, k, torch.Generator().manual_seed(seed), d=1e-3)
    blocks = qw.data.view(n, k // QK_K, -1)
    first = slice(0, 2)
    if kind == "q6_k":
        blocks[0, first, :192] = 0xFF  # q = 63
        blocks[0, first, 192:208] = 0x7F  # scales 127
        blocks[1 % n, first, :192] = 0  # q − 32 = −32
        blocks[1 % n, first, 192:208] = 0x80  # scales −128
    else:
        blocks[0, first, 4:] = 0xFF  # scales and mins 63, quants 15 (31 for Q5_K)
    return qw


def _acts(m: int, k: int, g: torch.Generator) -> torch.Tensor:
    """Activations over 5 decades, with a zero super-block, one of constant sign at full scale (every q8 at
    ±127, the integer sums' extreme) and ties for the largest |x| (the first one's sign sets the scale's)."""
    x = torch.randn(m, k, generator=g) * torch.logspace(-2, 3, k)
    x[0, :QK_K] = 0
    if k > QK_K:
        x[-1, QK_K : 2 * QK_K] = 5.0
    x[-1, :QK_K] = torch.tensor([-2.0, 2.0] * (QK_K // 2))
    return x


def _q8k(lib: ops.Kernels, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The C library's Q8_K rounding (blz_quantize_q8k): q [M, K] int8, d [M, K/256], bsums [M, K/16]."""
    M, K = x.shape
    q, d = torch.empty(M, K, dtype=torch.int8), torch.empty(M, K // QK_K)
    bsums = torch.empty(M, K // 16, dtype=torch.int16)
    fn = lib.lib.blz_quantize_q8k
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64] + [ctypes.c_void_p] * 3
    fn.restype = ctypes.c_int
    assert fn(x.data_ptr(), M, K, q.data_ptr(), d.data_ptr(), bsums.data_ptr()) == 0
    return q, d, bsums.int()


def _emulate(x: torch.Tensor, qw: QuantizedWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's algorithm in exact arithmetic: (y [M, N] float64, mag = Σ_b |terms|) with the per
    super-block scale products rounded to fp32 as the kernel rounds them."""
    M, K = x.shape
    nb = K // QK_K
    qx, dx, _ = quantize_q8_k(x)
    qx = qx.double().reshape(M, nb, QK_K)
    q, sc, d, mins = kquant_fields(qw)
    per = QK_K // sc.shape[-1]
    wq = q.double() * sc.double().repeat_interleave(per, -1)  # [N, nb, 256] exact integers
    sumi = torch.einsum("mbk,nbk->mnb", qx, wq)
    terms = sumi * (d.unsqueeze(0) * dx.unsqueeze(1)).double()  # fp32 product, as the kernel
    y, mag = terms.sum(-1), terms.abs().sum(-1)
    if mins is not None:
        mn, dmin = mins
        xs = qx.reshape(M, nb, 8, 32).sum(-1)
        mscale = (dmin.unsqueeze(0) * dx.unsqueeze(1)).double()  # fp32 product, as the kernel
        mterms = torch.einsum("mbj,nbj->mnb", xs, mn.double()) * mscale
        y, mag = y - mterms.sum(-1), mag + mterms.abs().sum(-1)
    return y, mag


def _exact_weight(qw: QuantizedWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """(W exactly, in float64 [N, K]; |d·sc·q| + |dmin·m| per element, the magnitude its rounding scales)."""
    q, sc, d, mins = kquant_fields(qw)
    n = q.shape[0]
    per = QK_K // sc.shape[-1]
    big = q.double() * (d.double().unsqueeze(-1) * sc.double()).repeat_interleave(per, -1)
    w, size = big, big.abs()
    if mins is not None:
        mn, dmin = mins
        off = (dmin.double().unsqueeze(-1) * mn.double()).repeat_interleave(32, -1)
        w, size = w - off, size + off.abs()
    return w.reshape(n, -1), size.reshape(n, -1)


# ---------------------------------------------------------------- format


@pytest.mark.parametrize("kind", K_KINDS)
def test_dequantize_matches_gguf(kind: str) -> None:
    qw = _weight(kind, 37, 512, seed=1)
    ref = gguf.quants.dequantize(qw.data.numpy(), GGML[kind])
    assert np.array_equal(dequantize(qw).numpy(), ref)
    assert torch.equal(_exact_weight(qw)[0].float(), dequantize(qw))  # the float64 oracle, rounded once
    raw = qw.data.clone().flatten()  # a GGUF tensor's bytes: kept as they are, no copy
    again = QuantizedWeight.from_ggml(kind.upper(), raw, 37, 512)
    assert again.data.data_ptr() == raw.data_ptr() and again.ggml_blocks() is again.data


def test_kquant_weight_checks_shapes() -> None:
    with pytest.raises(ValueError, match="multiple of 256"):
        QuantizedWeight("q4_k", torch.zeros(2, 144, dtype=torch.uint8), 2, 128)
    with pytest.raises(ValueError, match=r"expected torch\.uint8 \[2, 420\]"):
        QuantizedWeight("q6_k", torch.zeros(2, 210, dtype=torch.uint8), 2, 512)
    with pytest.raises(ValueError, match="expected 352 uint8 bytes"):
        QuantizedWeight.from_blocks("q5_k", torch.zeros(351, dtype=torch.uint8), 2, 256)
    with pytest.raises(ValueError, match="K-quant weights come from GGUF"):
        quantize(torch.randn(4, 256), "q4_k")


def test_q8k_activation_rounding_is_exact(lib: ops.Kernels) -> None:
    """C and torch round activations identically (ggml's quantize_row_q8_K_ref), zero blocks and ties
    included, and x ≈ d·q within the stated bound."""
    g = torch.Generator().manual_seed(3)
    x = _acts(4, 1024, g)
    x[1, 256:512] = (torch.arange(256) - 127.5) / 8  # many exact .5 ties after scaling
    got, want = _q8k(lib, x), quantize_q8_k(x)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    q, d, _ = want
    err = (x - (q.float().reshape(4, 4, QK_K) * d.unsqueeze(-1)).reshape(4, -1)).abs()
    assert (err <= (d.abs() * (0.5 + 2.0**-14)).repeat_interleave(QK_K, -1)).all()
    assert d[-1, 0] > 0 and q[-1, 0] == -127  # the first of the ties (−2) sets the scale's sign


# ---------------------------------------------------------------- linear


@pytest.mark.parametrize("kind", K_KINDS)
@pytest.mark.parametrize("M", [1, 3, 8, 19, 30])  # 30: the 16-row groups of AVX-512 VNNI builds (from 24)
@pytest.mark.parametrize(("N", "K"), [(37, 512), (64, 768), (5, 256)])
def test_linear_kquant(lib: ops.Kernels, kind: str, M: int, N: int, K: int) -> None:
    g = torch.Generator().manual_seed(M * 1000 + N + K)
    qw = _weight(kind, N, K, seed=N + K)
    x = _acts(M, K, g)
    emul, mag = _emulate(x, qw)
    w_exact, w_size = _exact_weight(qw)
    qx, dx, _ = quantize_q8_k(x)
    xr = (qx.double().reshape(M, -1, QK_K) * dx.double().unsqueeze(-1)).reshape(M, K)  # x̂, exactly
    exact = xr @ w_exact.T
    round_err = gamma(K + 2 * (K // QK_K) + 16) * (xr.abs() @ w_size.T)
    act = (dx.double().abs() * (0.5 + 2.0**-14)).repeat_interleave(QK_K, -1)  # bound on |x − x̂|
    act_err = act @ w_exact.abs().T
    for name in ("plain", "bias+residual", "swiglu"):
        if name != "plain" and M not in (3, 8, 30):
            continue
        rows = N - N % 2 if name == "swiglu" else N
        qn = qw if rows == N else QuantizedWeight(kind, qw.data[:rows].contiguous(), rows, K)
        bias, residual, swiglu = _epilogue(name, M, rows, g)
        out = residual.clone() if residual is not None else None
        y = lib.linear(x, qn, bias, out, swiglu=swiglu, out=out)
        e, fe = emul[:, :rows], gamma(2 * (K // QK_K) + 8) * mag[:, :rows]
        _check_linear(y, e, fe, bias, residual, swiglu)  # the exact integer algorithm, fp32 rounding
        _check_linear(y, exact[:, :rows], round_err[:, :rows], bias, residual, swiglu)  # x̂ · W
        full = x.double() @ w_exact[:rows].T  # the unrounded x
        _check_linear(y, full, round_err[:, :rows] + act_err[:, :rows], bias, residual, swiglu)
        if name == "plain":  # the torch reference (dequantize, x rounded the same way) within the same bound
            ref = ops.linear_reference(x, qn)
            _check_linear(ref, exact, round_err, None, None, False)


@pytest.mark.parametrize("kind", K_KINDS)
def test_scalar_and_simd_builds_give_the_same_bits(
    native: ops.Kernels, other_build: ops.Kernels, kind: str
) -> None:
    """Exact integer dots, then the same fp32 operations in the same order in every build."""
    g = torch.Generator().manual_seed(7)
    qw = _weight(kind, 53, 768, seed=2)
    bias = torch.randn(53, generator=g)
    for M in (1, 5, 9, 17, 40):
        x = _acts(M, 768, g)
        assert torch.equal(native.linear(x, qw, bias), other_build.linear(x, qw, bias)), M
    gate_up = QuantizedWeight(kind, qw.data[:52].contiguous(), 52, 768)
    for M in (3, 30):
        x = _acts(M, 768, g)
        want = other_build.linear(x, gate_up, swiglu=True)
        assert torch.equal(native.linear(x, gate_up, swiglu=True), want), M


def test_batch_rows_are_independent(lib: ops.Kernels) -> None:
    """A batched call equals one call per row (the one-row path, tile1_avx2), bit for bit, wherever the row
    falls in the 8-row tiles (up to 23 rows) or the 16-row weight groups re-laid for vpdpbusd (24 rows and
    more on AVX-512 VNNI builds: 37, 30, 24)."""
    g = torch.Generator().manual_seed(11)
    x = _acts(37, 512, g)
    for kind in K_KINDS:
        qw = _weight(kind, 21, 512, seed=5)
        rows = torch.cat([lib.linear(x[i : i + 1], qw) for i in range(len(x))])
        assert torch.equal(lib.linear(x, qw), rows), kind
        for lo, hi in ((5, 12), (3, 15), (0, 16), (0, 17), (30, 37), (5, 35), (13, 37)):
            assert torch.equal(lib.linear(x[lo:hi], qw), rows[lo:hi]), (kind, lo, hi)
        gate_up = QuantizedWeight(kind, qw.data[:20].contiguous(), 20, 512)  # one row: its own decode path
        rows = torch.cat([lib.linear(x[i : i + 1], gate_up, swiglu=True) for i in range(len(x))])
        assert torch.equal(lib.linear(x, gate_up, swiglu=True), rows), kind


def test_mixed_kinds_fused_weight(lib: ops.Kernels) -> None:
    """A fused weight whose parts are different K-quant kinds (kmix: Q4_K_M's q|k in Q4_K, v in Q6_K) gives
    each part's rows exactly as that part alone — segment boundaries off the 8-row tiles included, and a
    SwiGLU whose gate and up halves differ in kind — and matches the reference within its bound."""
    g = torch.Generator().manual_seed(13)
    parts = [_weight("q4_k", 21, 512, 1), _weight("q4_k", 11, 512, 2), _weight("q6_k", 13, 512, 3)]
    parts.append(_weight("q5_k", 7, 512, 4))
    mixed = QuantizedWeight.from_parts(parts)
    assert mixed.kind == "kmix" and [(p.kind, p.out_features) for p in mixed.parts()] == [
        ("q4_k", 32), ("q6_k", 13), ("q5_k", 7)]  # fmt: skip
    assert torch.equal(dequantize(mixed), torch.cat([dequantize(p) for p in parts]))
    for M in (1, 5, 12, 29):  # 29: 16-row groups cut at the segment boundaries
        x = _acts(M, 512, g)
        bias = torch.randn(52, generator=g)
        want = torch.cat([lib.linear(x, p) for p in parts], -1) + bias
        assert torch.equal(lib.linear(x, mixed, bias), want), M
    gate_up = QuantizedWeight.from_parts([_weight("q4_k", 19, 512, 5), _weight("q6_k", 19, 512, 6)])
    for M in (1, 3):  # one row: gate and up tiles of different kinds read as streams side by side
        x = _acts(M, 512, g)
        y = lib.linear(x, gate_up, swiglu=True)
        gate, up = (lib.linear(x, p) for p in gate_up.parts())  # silu(gate) · up by the activation kernel
        assert torch.equal(y, lib.activation(torch.cat([gate, up], -1), "silu", gated=True)), M
    ref = ops.linear_reference(x, gate_up, swiglu=True)
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())
    x = _acts(26, 512, g)  # 16-row groups of different kinds for gate and up: each row's own bits
    rows = torch.cat([lib.linear(x[i : i + 1], gate_up, swiglu=True) for i in range(len(x))])
    assert torch.equal(lib.linear(x, gate_up, swiglu=True), rows)
    assert QuantizedWeight.from_parts(parts[:2]).kind == "q4_k"  # one kind: a plain weight
    bad = mixed.data.clone()
    bad[0] = 9  # 9 segments in the table
    with pytest.raises(ValueError, match="bad segment table"):
        QuantizedWeight("kmix", bad, 52, 512)


def test_linear_rejects_bad_inputs(native: ops.Kernels) -> None:
    qw = _weight("q4_k", 8, 512, seed=0)
    with pytest.raises(ValueError, match="x has 256 features, the weight 512"):
        native.linear(torch.randn(2, 256), qw)
    with pytest.raises(ValueError, match="residual"):
        native.linear(torch.randn(2, 512), qw, residual=torch.randn(2, 7))
    with pytest.raises(ValueError, match="SwiGLU"):
        native.linear(torch.randn(2, 512), _weight("q6_k", 7, 512, seed=0), swiglu=True)
    with pytest.raises(ValueError, match="bias has 3 elements"):
        native.linear(torch.randn(2, 512), qw, torch.randn(3))


def test_llama_cpp_q4_k_tensor(native: ops.Kernels, q4_k_m: Path) -> None:
    """Tensors of llama.cpp's own quantizer, used as stored, against the dequantized reference."""
    reader = gguf.GGUFReader(q4_k_m)
    kinds = set()
    for t in reader.tensors:
        if t.tensor_type.name not in ("Q4_K", "Q5_K", "Q6_K"):
            continue
        n, k = int(t.shape[1]), int(t.shape[0])
        raw = torch.from_numpy(np.array(t.data)).flatten()
        qw = QuantizedWeight.from_ggml(t.tensor_type.name, raw, n, k)
        assert np.array_equal(dequantize(qw).numpy(), gguf.quants.dequantize(np.array(t.data), t.tensor_type))
        x = torch.randn(3, k)
        emul, mag = _emulate(x, qw)
        _check_linear(native.linear(x, qw), emul, gamma(2 * (k // QK_K) + 8) * mag, None, None, False)
        kinds.add(qw.kind)
    assert {"q4_k", "q6_k"} <= kinds, kinds


# ---------------------------------------------------------------- a Q4_K_M GGUF from llama.cpp


@pytest.fixture(scope="module")
def f32_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama (hidden 256, so every matrix's K is a whole number of super-blocks; tied embeddings)
    converted by llama.cpp's converter to an F32 GGUF."""
    from tests.llama_cpp_convert import VOCAB, convert, export_tokenizer
    from tests.tiny import build as build_hf

    root = tmp_path_factory.mktemp("k_quants")
    tokenizer = export_tokenizer(root / "tokenizer")
    sizes = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)
    build_hf("LlamaForCausalLM", root / "hf", seed=3, vocab_size=VOCAB, tie_word_embeddings=True, **sizes)
    return convert(root / "hf", tokenizer, root / "f32.gguf", "f32")


@pytest.fixture(scope="module")
def q4_k_m(f32_llama: Path) -> Path:
    """`f32_llama` quantized by llama.cpp's llama_model_quantize to Q4_K_M."""
    from tests.llama_cpp_convert import quantize as llama_quantize

    return llama_quantize(f32_llama, f32_llama.parent / "q4_k_m.gguf", "Q4_K_M")


def _kernel_layers(llm: LLM, stored: bool = True) -> dict[str, str]:
    """The layers kept in a K-quant / block kind, by name; `stored`: a kind re-laid in 16-row groups by its
    stored kind (kernels/kquant_packed.py: where the kernels have the VNNI path)."""
    layers = llm.model.named_modules()
    kinds = {n: m.kind for n, m in layers if isinstance(m, QuantizedLinear) and m.kind != "f32"}
    return {n: kquant_packed.BASE_OF.get(k, k) for n, k in kinds.items()} if stored else kinds


def _kernel_logits(llm: LLM, batch: list[list[int]]) -> list[torch.Tensor]:
    """Logits with every quantized layer on its kernel, prompt rows too (no float copies for prefill GEMMs
    are kept: those are made on request only, BLAZR_PREFILL_DENSE)."""
    assert all(
        m.dense is None for m in llm.model.modules() if isinstance(m, QuantizedLinear) and m.kind != "f32"
    )
    return full_logits(llm.runner, batch)


def test_q4_k_m_gguf_runs_as_stored(q4_k_m: Path) -> None:
    """llama.cpp's Q4_K_M file: its K-quant linears stay as stored (the tied Q6_K embedding becomes a Q6_K
    head, no float copy), and its logits on the kernels stay within the activation rounding's error of the
    same file dequantized to float32 — measured 5.0% and 5.4% of the largest logit: 8 bits per 256
    activations in every layer, the same mean error llama.cpp's own Q8_K path has against these float values
    (next test) — and a different top-1 only at near-ties of the float values."""
    ours = LLM(q4_k_m, cpu=True, dtype="float32", max_num_seqs=2)
    plain = LLM(q4_k_m, cpu=True, dtype="float32", max_num_seqs=2, quantize="none")
    kinds = _kernel_layers(ours)
    assert kinds["lm_head"] == "q6_k" and ours.model.get_submodule("lm_head").dense is None
    assert {"q4_k", "q6_k"} <= set(kinds.values()), kinds
    file_types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(q4_k_m).tensors}
    assert kinds["layers.0.mlp.gate_up_proj"] == file_types["blk.0.ffn_gate.weight"].lower()
    assert kinds["layers.1.mlp.down_proj"] == file_types["blk.1.ffn_down.weight"].lower()
    for i in range(2):  # q|k|v fused: one kind, or kmix where llama.cpp gave attn_v more bits
        qkv = {file_types[f"blk.{i}.attn_{p}.weight"].lower() for p in "qkv"}
        assert kinds[f"layers.{i}.attn.qkv_proj"] == (qkv.pop() if len(qkv) == 1 else "kmix")
    assert "kmix" in kinds.values()  # this file's layer 1 has a Q6_K attn_v
    for name in kinds:
        if name != "lm_head":  # the same values as the dequantized model's float weight
            assert torch.equal(ours.model.get_submodule(name).weight, plain.model.get_submodule(name).weight)
    batch = prompts([7, 30], seed=5, vocab=ours.config.vocab_size)
    for got, want in zip(_kernel_logits(ours, batch), full_logits(plain.runner, batch), strict=True):
        assert_quantized_logits(got, want, 0.08)
    assert_greedy_diverges_only_at_ties(ours, plain, batch[1])


@pytest.mark.parametrize("ftype", ["Q4_K_M", "Q5_K_M"])
def test_k_quant_gguf_packed_layout_changes_no_bit(
    f32_llama: Path, ftype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama.cpp's Q4_K_M / Q5_K_M file: its K-quant linears — and a mixed q|k|v's segments — re-laid in
    16-row groups where the kernels have a group path for their kind (`packs_on`: VNNI every kind, AVX2 Q4_K
    and Q5_K; BLAZR_KPACK=1 over host tuning's choice), against the same file with every K-quant kept as
    stored (BLAZR_KPACK=0): the same logits, bit for bit, at prefill and decode, the same greedy tokens."""
    from tests.llama_cpp_convert import quantize as llama_quantize

    path = f32_llama.parent / f"{ftype.lower()}.gguf"
    if not path.exists():
        llama_quantize(f32_llama, path, ftype)
    monkeypatch.setenv("BLAZR_KPACK", "1")  # the groups whatever host tuning chose for this host
    packed = LLM(path, cpu=True, dtype="float32", max_num_seqs=2)
    monkeypatch.setenv("BLAZR_KPACK", "0")
    stored = LLM(path, cpu=True, dtype="float32", max_num_seqs=2)
    kinds = set(_kernel_layers(packed, stored=False).values())
    mixed = [m.qweight for m in packed.model.modules() if isinstance(m, QuantizedLinear) and m.kind == "kmix"]
    features = ops.kernels().features
    base = "q4_k" if ftype == "Q4_K_M" else "q5_k"
    here = {kind for kind in (base, "q6_k") if kquant_packed.packs_on(kind, features)}
    want = {kquant_packed.KX_OF[kind] for kind in here}  # VNNI: both kinds; AVX2: Q4_K / Q5_K; scalar: none
    assert want <= kinds and not kinds & (set(kquant_packed.BASE_OF) - want), kinds
    assert _kernel_layers(packed)["lm_head"] == "q6_k"
    # q|k|v of a layer whose attn_v llama.cpp kept in Q6_K: each segment re-laid where its kind packs here
    assert mixed
    for part in (p for w in mixed for p in w.parts()) if here else ():
        assert (part.kind in kquant_packed.BASE_OF) or part.kind not in here, part.kind
    assert _kernel_layers(packed) == _kernel_layers(stored, stored=False)
    batch = prompts([7, 30], seed=8, vocab=packed.config.vocab_size)
    for got, want in zip(_kernel_logits(packed, batch), _kernel_logits(stored, batch), strict=True):
        assert torch.equal(got, want)
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    tokens = [out.outputs[0].token_ids for llm in (packed, stored) for out in llm.generate([batch[1]], sp)]
    assert tokens[0] == tokens[1] and len(tokens[0]) == 12


def test_a_cached_kmix_follows_the_layout_chosen_now(
    q4_k_m: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kmix weight (Q4_K_M's q|k beside a Q6_K v) cached when host tuning re-laid Q6_K alone is re-laid
    again once both kinds are chosen — not taken from the cache with its old segments (a suite run caught it:
    an earlier test's load had cached the q4_k segments as stored) — with the same logits."""
    monkeypatch.setenv("BLAZR_QUANT_CACHE", str(tmp_path / "qcache"))
    monkeypatch.setattr(kquant_packed, "wanted", lambda kind: kind == "q6_k")
    first = LLM(q4_k_m, cpu=True, dtype="float32", max_num_seqs=2)
    quant_cache.wait()
    monkeypatch.setattr(kquant_packed, "wanted", lambda kind: True)
    second = LLM(q4_k_m, cpu=True, dtype="float32", max_num_seqs=2)

    def segments(llm: LLM) -> set[tuple[str, ...]]:
        mods = llm.model.modules()
        return {tuple(p.kind for p in m.qweight.parts()) for m in mods if isinstance(m, QuantizedLinear)
                and m.kind == "kmix"}  # fmt: skip

    assert segments(first) and all("q6_kx" in s and "q4_k" in s for s in segments(first)), segments(first)
    assert all(set(s) <= {"q4_kx", "q6_kx"} for s in segments(second)), segments(second)
    batch = prompts([20, 7], seed=3, vocab=first.config.vocab_size)
    for a, b in zip(full_logits(first.runner, batch), full_logits(second.runner, batch), strict=True):
        assert torch.equal(a, b)


def test_q4_k_m_gguf_agrees_with_llama_cpp(q4_k_m: Path) -> None:
    """llama.cpp on the same file (its own Q8_K activations and K-quant dots): blazr is at least as close
    to llama.cpp as llama.cpp is to the file's float values."""
    from llama_cpp import Llama

    ours = LLM(q4_k_m, cpu=True, dtype="float32", max_num_seqs=2)
    plain = LLM(q4_k_m, cpu=True, dtype="float32", max_num_seqs=2, quantize="none")
    ids = prompts([40], seed=6, vocab=ours.config.vocab_size)[0]
    ref = Llama(str(q4_k_m), logits_all=True, n_ctx=128, n_batch=128, n_threads=1, verbose=False)
    ref.eval(ids)
    theirs = torch.tensor(np.array(ref.scores[: len(ids)]))
    got, exact = _kernel_logits(ours, [ids])[0], full_logits(plain.runner, [ids])[0]
    assert (got - theirs).abs().mean() <= (theirs - exact).abs().mean() + 1e-3
    assert (got.argmax(-1) == theirs.argmax(-1)).float().mean() >= 0.8


@pytest.fixture(scope="module")
def q4_k_m_moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3-MoE (hidden and expert widths 256: every expert matrix's K whole super-blocks) converted
    by llama.cpp's converter and quantized by its quantizer to Q4_K_M: the routed experts stacked in Q4_K,
    their down projections Q4_K or Q6_K."""
    from tests.llama_cpp_convert import VOCAB, convert, export_tokenizer
    from tests.llama_cpp_convert import quantize as llama_quantize
    from tests.tiny import build as build_hf

    root = tmp_path_factory.mktemp("k_quant_moe")
    tokenizer = export_tokenizer(root / "tokenizer")
    sizes = dict(
        hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64
    )
    experts = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=256, norm_topk_prob=True)
    build_hf(
        "Qwen3MoeForCausalLM", root / "hf", seed=5, vocab_size=VOCAB, num_hidden_layers=2, **sizes, **experts
    )
    f32 = convert(root / "hf", tokenizer, root / "f32.gguf", "f32")
    return llama_quantize(f32, root / "q4_k_m.gguf", "Q4_K_M")


def test_k_quant_moe_experts_packed_change_no_bit(q4_k_m_moe: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The routed experts of a Q4_K_M MoE, stacked, are re-laid in 16-row groups expert by expert where the
    kernels have a group path for their kind (BLAZR_KPACK=1; csrc/moe.c runs each expert's rows through the
    same linear kernels), and kept as stored elsewhere or with BLAZR_KPACK=0: the same logits bit for bit —
    prefill (several tokens an expert) and decode —, and the same greedy tokens for two sequences decoded
    together; a later load maps the re-laid stacks from the quantization cache."""
    from blazr.model.moe import Experts

    def stacks(llm: LLM) -> list[tuple[str, str]]:
        found = [m for m in llm.model.modules() if isinstance(m, Experts)]
        assert found and all(e.w_up is not None and e.w_down is not None for e in found)
        return [(e.w_up.kind, e.w_down.kind) for e in found]  # type: ignore[union-attr]

    monkeypatch.setenv("BLAZR_KPACK", "1")  # the groups whatever host tuning chose for this host
    packed = LLM(q4_k_m_moe, cpu=True, dtype="float32", max_num_seqs=2)
    monkeypatch.setenv("BLAZR_KPACK", "0")
    stored = LLM(q4_k_m_moe, cpu=True, dtype="float32", max_num_seqs=2)
    kinds, base = stacks(packed), stacks(stored)
    assert {k for pair in base for k in pair} <= {"q4_k", "q6_k"} and ("q4_k", "q4_k") in base, base
    features = ops.kernels().features

    def here(kind: str) -> str:  # VNNI: every kind re-laid; AVX2: Q4_K; scalar: none
        return kquant_packed.KX_OF[kind] if kquant_packed.packs_on(kind, features) else kind

    assert kinds == [(here(u), here(d)) for u, d in base], kinds
    batch = prompts([9, 33], seed=4, vocab=packed.config.vocab_size)
    for got, want in zip(_kernel_logits(packed, batch), _kernel_logits(stored, batch), strict=True):
        assert torch.equal(got, want)
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    tokens = [[o.outputs[0].token_ids for o in llm.generate(batch, sp)] for llm in (packed, stored)]
    assert tokens[0] == tokens[1] and all(len(t) == 10 for t in tokens[0])
    if kinds == base:
        return
    # a later load maps the re-laid stacks from the quantization cache (loading/quant_cache.py): no pack run
    quant_cache.wait()
    monkeypatch.setenv("BLAZR_KPACK", "1")
    monkeypatch.setattr(kquant_packed, "pack", None)
    again = LLM(q4_k_m_moe, cpu=True, dtype="float32", max_num_seqs=2)
    assert stacks(again) == kinds
    for got, want in zip(_kernel_logits(again, batch), _kernel_logits(packed, batch), strict=True):
        assert torch.equal(got, want)
