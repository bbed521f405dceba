"""MappedWeight (kernels/mapped.py): a weight whose rows stay where a checkpoint's map holds them, run by
the kernels through a row table (BLZ_ROWS). Every result must be bit for bit the result on the same rows
gathered into one tensor — decode and prefill paths, SwiGLU, bias and residual, a recorded plan — and the
GGUF loader must use it for fused weights whose parts lie apart instead of copying them."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from blazr import LLM
from blazr.kernels import mxfp4, ops, q5_0
from blazr.kernels.kquant import random_kquant
from blazr.kernels.mapped import MAPPED_KINDS, MappedWeight
from blazr.kernels.quant import QuantizedWeight, dequantize, quantize, row_bytes
from blazr.loading.loader import weight_bytes
from blazr.loading.stored import runs
from blazr.model.qlinear import QuantizedLinear
from tests.drive import full_logits
from tests.test_gguf import TINY, tiny_state_dict


def _plain(kind: str, n: int, k: int, seed: int) -> QuantizedWeight:
    g = torch.Generator().manual_seed(seed)
    if kind in ("q4_k", "q5_k", "q6_k"):
        return random_kquant(kind, n, k, g, d=1e-3)
    if kind in ("f16", "bf16"):
        w = torch.randn(n, k, generator=g) * 0.05
        return QuantizedWeight(kind, w.half() if kind == "f16" else w.bfloat16(), n, k)
    if kind == "mxfp4":
        return QuantizedWeight(kind, mxfp4.random_blocks(n, k, g, 112, 124), n, k)
    if kind == "q5_0":
        return QuantizedWeight(kind, q5_0.random_blocks(n, k, g), n, k)
    return QuantizedWeight(
        "q8_0g", quantize(torch.randn(n, k, generator=g) * 0.05, "q8_0").ggml_blocks(), n, k
    )


def _scatter(qw: QuantizedWeight, seed: int) -> MappedWeight:
    """qw's rows copied into a larger buffer in shuffled order with gaps between them, as a map holds a
    fused weight's parts apart; the MappedWeight lists where each row went."""
    n, step = qw.out_features, row_bytes(qw.kind, qw.in_features)
    src = qw.data.view(torch.uint8).reshape(n, step)
    slots = torch.randperm(2 * n + 3, generator=torch.Generator().manual_seed(seed))[:n]
    buf = torch.full(((2 * n + 3) * step + 64,), 0xA5, dtype=torch.uint8)  # junk between the rows
    at = slots * step + 64
    for i in range(n):
        buf[at[i] : at[i] + step] = src[i]
    return MappedWeight(qw.kind, buf.data_ptr() + at, buf, n, qw.in_features)


@pytest.mark.parametrize("kind", MAPPED_KINDS)
def test_mapped_rows_give_the_gathered_weights_bits(lib: ops.Kernels, kind: str) -> None:
    n, k = 38, 512
    plain = _plain(kind, n, k, seed=1)
    mapped = _scatter(plain, seed=2)
    g = torch.Generator().manual_seed(3)
    bias, res = torch.randn(n, generator=g), torch.randn(30, n, generator=g)
    for M in (1, 2, 3, 5, 14, 17, 19, 30):  # decode and prefill paths (f16 panels from 9 rows, x rows in
        # lanes at 13-16 on AVX-512, q8 transposed from 4, K-quant 16-row groups from 24)
        x = torch.randn(M, k, generator=g)
        assert torch.equal(lib.linear(x, mapped), lib.linear(x, plain)), (kind, M)
        assert torch.equal(lib.linear(x, mapped, swiglu=True), lib.linear(x, plain, swiglu=True)), (kind, M)
        want = lib.linear(x, plain, bias, res[:M].clone())
        assert torch.equal(lib.linear(x, mapped, bias, res[:M].clone()), want), (kind, M)
    assert torch.equal(mapped.data.view(torch.uint8), plain.data.view(torch.uint8))  # gathered on demand
    assert torch.equal(dequantize(mapped), dequantize(plain))
    assert mapped.nbytes == plain.nbytes and repr(mapped) == f"MappedWeight({kind}, [{n}, {k}])"


def test_mapped_bytes_gather_without_the_kernel_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """`data` gathers the rows in torch when the library is off (BLAZR_KERNELS=0 after loading)."""
    for kind in ("q8_0g", "f16"):
        plain = _plain(kind, 21, 256, seed=7)
        mapped = _scatter(plain, seed=8)
        monkeypatch.setattr(ops, "kernels", lambda: None)
        assert torch.equal(mapped.data.view(torch.uint8), plain.data.view(torch.uint8)), kind
        monkeypatch.undo()


def test_a_recorded_plan_replays_mapped_weights(native: ops.Kernels) -> None:
    plain = _plain("q8_0g", 24, 256, seed=4)
    mapped = _scatter(plain, seed=5)
    x, out = torch.randn(1, 256), torch.empty(1, 24)
    with native.record() as plan:
        native.linear(x, mapped, out=out)
    del mapped  # the plan keeps the row table and the map alive
    x.copy_(torch.randn(1, 256))
    plan.run()
    assert torch.equal(out, native.linear(x, plain))


def test_mapped_weights_check_their_rows() -> None:
    plain = _plain("q8_0g", 8, 64, seed=6)
    buf = plain.data.reshape(-1)
    rows = buf.data_ptr() + torch.arange(8, dtype=torch.int64) * row_bytes("q8_0g", 64)
    MappedWeight("q8_0g", rows, buf, 8, 64)
    with pytest.raises(ValueError, match="outside the mapped tensor"):
        MappedWeight("q8_0g", rows + 1, buf, 8, 64)
    with pytest.raises(ValueError, match="row addresses"):
        MappedWeight("q8_0g", rows[:7], buf, 8, 64)
    with pytest.raises(ValueError, match="expected one of"):
        MappedWeight("q4_0", rows, buf, 8, 64)


def test_row_tables_are_refused_where_rows_are_packed(native: ops.Kernels) -> None:
    """BLZ_ROWS with a row-packed kind (q4_0: 16-row groups) or a kmix weight is an error, not a misread."""
    x, out, rows = torch.randn(1, 256), torch.empty(1, 16), torch.zeros(16, dtype=torch.int64)
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    for code in (0, 6):  # BLZ_Q4_0, BLZ_KMIX
        k = 64 if code == 0 else 256
        args = (p(x.data_ptr()), i64(1), i64(k), p(rows.data_ptr()), i64(16), None, None, p(out.data_ptr()))
        rc = native.lib.blz_linear_q(ctypes.c_int(code | 0x100), *args, 0, 1)
        assert rc == -1, code


_CFG = {**TINY, "hidden_size": 256, "intermediate_size": 512, "vocab_size": 64}  # K-quants: K % 256 == 0


@pytest.mark.parametrize("qtype", ["Q8_0", "F16", "Q4_K"])
def test_gguf_fused_parts_stay_in_the_map(tmp_path, monkeypatch: pytest.MonkeyPatch, qtype: str) -> None:
    """A llama GGUF written as llama.cpp's converter writes one (tensors sorted by name, so ffn_gate and
    ffn_up lie apart; q / k rows permuted): its gate|up is a MappedWeight over the file's map — nothing
    gathered —, q|k|v (rows out of order) gathered, and the logits equal those with every fused weight
    gathered into one tensor. Q4_K and Q8_0 kept as stored for this (BLAZR_KPACK=0, BLAZR_Q8PACK=0); where the
    kernels re-lay them (Q4_K in 16-row groups, Q8_0 in the row-packed layout), from the same row tables,
    the logits are the same."""
    monkeypatch.setenv("BLAZR_KPACK", "0")
    monkeypatch.setenv("BLAZR_Q8PACK", "0")
    from tests.gguf_fixtures import hf_to_gguf_name, write_random_block_llama_gguf, write_tiny_llama_gguf

    state = tiny_state_dict(cfg=_CFG)
    state = dict(sorted(state.items(), key=lambda item: hf_to_gguf_name(item[0], 2)))
    if qtype == "Q4_K":  # gguf's Python has no K-quant encoder: random super-blocks (finite scales)
        path = write_random_block_llama_gguf(tmp_path / "m.gguf", state, _CFG, qtype)
    else:
        path = write_tiny_llama_gguf(tmp_path / "m.gguf", state, _CFG, qtype)
    llm = LLM(path, vocab="cl100k_base", cpu=True, dtype="float32", max_model_len=64)
    model = llm.runner.model
    layers = {n: m.qweight for n, m in model.named_modules() if isinstance(m, QuantizedLinear)}
    fused = {n: w for n, w in layers.items() if n.endswith(("qkv_proj", "gate_up_proj"))}
    mapped = {n: w for n, w in fused.items() if isinstance(w, MappedWeight)}
    # gate|up (two runs) stays in the map; q|k|v, its q / k rows un-permuted one by one, is gathered
    assert sorted(mapped) == [f"layers.{i}.mlp.gate_up_proj" for i in range(2)], fused
    assert all(w._gathered is None for w in mapped.values())  # type: ignore[attr-defined]
    assert weight_bytes(model) >= sum(w.nbytes for w in fused.values())
    assert runs(torch.tensor([0, 8, 16, 100, 108]), 8) == 2 and runs(torch.tensor([8, 0]), 8) == 2
    prompts = [[1, 5, 9, 42, 7, 3], [2, 8, 13, 21, 34, 55, 6, 10, 11, 12, 4]]  # 17 rows: every path
    logits = full_logits(llm.runner, prompts)
    for name, w in fused.items():  # the same bytes gathered into one tensor: the reference
        module = model.get_submodule(name)
        module.qweight = QuantizedWeight(w.kind, w.data, w.out_features, w.in_features)
    for got, want in zip(logits, full_logits(llm.runner, prompts), strict=True):
        assert torch.equal(got, want)
        assert np.isfinite(got.numpy()).all()
    relays = {"Q4_K": ("avx512_vnni", "BLAZR_KPACK", "q4_kx"), "Q8_0": ("avx2", "BLAZR_Q8PACK", "q8_0")}
    if qtype in relays and relays[qtype][0] in ops.kernels().features:
        _, env, kind = relays[qtype]
        monkeypatch.setenv(env, "1")  # re-laid whatever host tuning chose for this host
        packed = LLM(path, vocab="cl100k_base", cpu=True, dtype="float32", max_model_len=64)
        kinds = {n: m.kind for n, m in packed.runner.model.named_modules() if n in fused}
        assert set(kinds.values()) == {kind}, kinds  # gate|up packed from its row table, q|k|v gathered
        for got, want in zip(full_logits(packed.runner, prompts), logits, strict=True):
            assert torch.equal(got, want)
