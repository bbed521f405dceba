"""The `q5_0` weight kind (kernels/q5_0.py, csrc/linear_b32.c) and fused weights whose parts mix kinds run as
stored (kmix, csrc/linear_mix.c), against their references, on every ISA build this CPU runs
(tests/conftest.py's `lib`):

- its values are gguf-py's (`gguf.quants` Q5_0: d·((q | h << 4) − 16)), in torch, in C (csrc/dequantize.c)
  and in a token table's row lookups; gguf-py's quantizer reproduced byte for byte;
- the linear kernel equals the exact emulation of its integer algorithm (`int8_dot_reference`) to fp32
  rounding, and the float reference within the 8-bit activation rounding bound of kernel_checks.py — decode
  tiles and the packed prefill path, epilogues, a row table —, the same bits on every build, and a row's
  bits never depending on its batch;
- a fused weight of Q5_0, Q8_0 (q8_0g) and K-quant parts gives each part's rows exactly as that part alone
  (plus the epilogue), SwiGLU too;
- a tiny llama GGUF of Q5_0 matrices with Q8_0 attn_v (Gemma 3's Q4_K_M mix) loads every linear and the
  token table as stored, and its logits and greedy tokens match the same file dequantized to float32 within
  the activation rounding.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from blazr import LLM
from blazr.kernels import ops, q5_0
from blazr.kernels.kquant import random_kquant
from blazr.kernels.quant import QuantizedWeight, dequantize, quantize, row_bytes
from blazr.kernels.row_table import RowTable
from blazr.loading.gguf import dequantize as gguf_dequantize
from blazr.model.qlinear import QuantizedLinear
from tests.block32_checks import (
    check_batch_rows,
    check_linear,
    check_one_row,
    check_row_table,
    check_same_bits,
)
from tests.drive import assert_greedy_diverges_only_at_ties, assert_quantized_logits, full_logits
from tests.gguf_fixtures import hf_to_gguf_name, llama_metadata, permute_qk, write_gguf
from tests.hf_parity import prompts
from tests.test_gguf import TINY, tiny_state_dict


def _weight(n: int, k: int, seed: int) -> QuantizedWeight:
    return QuantizedWeight.from_blocks(
        "q5_0", q5_0.random_blocks(n, k, torch.Generator().manual_seed(seed)), n, k
    )


def _gguf_values(raw: torch.Tensor, n: int, k: int) -> torch.Tensor:
    out = gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType.Q5_0)
    return torch.from_numpy(np.ascontiguousarray(out)).reshape(n, k)


def test_values_equal_gguf_py(lib: ops.Kernels) -> None:
    """Every bit pattern of qh and the nibbles, in torch, in C, through the GGUF loader's dequantizer and a
    token table's row lookups."""
    raw = q5_0.random_blocks(96, 128, torch.Generator().manual_seed(0))
    want = _gguf_values(raw, 96, 128)
    assert torch.equal(q5_0.dequantize_blocks(raw).reshape(96, 128), want)
    assert torch.equal(lib.dequantize_blocks("q5_0", raw, 96, 128), want)
    assert torch.equal(dequantize(QuantizedWeight.from_blocks("q5_0", raw, 96, 128)), want)
    assert torch.equal(gguf_dequantize(raw.reshape(-1), "Q5_0", (96, 128)), want)
    values = q5_0.values(raw.view(96, 4, 22))
    assert int(values.min()) == -16 and int(values.max()) == 15
    ids = torch.tensor([5, 0, 95, 5])
    assert torch.equal(lib.embedding_rows(ids, RowTable("q5_0", raw, 96, 128), 2.0), 2.0 * want[ids])


def test_quantize_equals_gguf_py() -> None:
    g = torch.Generator().manual_seed(1)
    w = torch.randn(40, 96, generator=g) * torch.logspace(-3, 2, 96)
    w[0, :32] = 0  # a zero block
    w[1, 32:64] = torch.linspace(-1, 1, 32)  # ties of |x| at ±amax: the first wins
    want = gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q5_0)
    got = quantize(w, "q5_0")
    assert got.kind == "q5_0" and torch.equal(got.data, torch.from_numpy(np.ascontiguousarray(want)))


def test_weight_is_ggml_bytes() -> None:
    """A q5_0 weight keeps the bytes it is given ([N, K/32 · 22], a view): 5.5 bits a value."""
    raw = q5_0.random_blocks(37, 640, torch.Generator().manual_seed(3))
    qw = QuantizedWeight.from_ggml("Q5_0", raw.reshape(-1), 37, 640)
    assert qw.kind == "q5_0" and qw.data.data_ptr() == raw.data_ptr() and qw.ggml_blocks() is qw.data
    assert row_bytes("q5_0", 640) == 20 * 22 and qw.nbytes * 8 / (37 * 640) == 5.5


@pytest.mark.parametrize("M", [1, 3, 16, 40])
@pytest.mark.parametrize(("N", "K"), [(67, 640), (130, 896), (6, 96)])
def test_linear_q5_0(lib: ops.Kernels, M: int, N: int, K: int) -> None:
    """The kernel against its exact emulation and the float reference, each epilogue (block32_checks)."""
    check_linear(lib, _weight(N, K, seed=N), M, torch.Generator().manual_seed(M * 1000 + N))


def test_same_bits_on_every_build(native: ops.Kernels, other_build: ops.Kernels) -> None:
    """VNNI, AVX2 and scalar builds agree bit for bit (block32_checks.check_same_bits)."""
    check_same_bits(native, other_build, _weight(53, 640, seed=4), torch.Generator().manual_seed(7))


def test_batch_rows_are_independent(lib: ops.Kernels) -> None:
    """A batched call equals one call per row, bit for bit (block32_checks.check_batch_rows)."""
    check_batch_rows(lib, _weight(45, 640, seed=5), torch.Generator().manual_seed(11))


def test_one_row_path_equals_tiles_and_groups(lib: ops.Kernels) -> None:
    """The one-row decode path gives the bits of the tiled and packed paths, every stream count, one thread
    and two, every epilogue (block32_checks.check_one_row)."""
    check_one_row(lib, _weight(83, 640, seed=8), torch.Generator().manual_seed(13))


def test_row_table_reads_rows_where_they_lie(native: ops.Kernels) -> None:
    """Rows read through a row table give the bits of those rows gathered (block32_checks.check_row_table)."""
    check_row_table(native, _weight(40, 256, seed=6))


def test_mixed_kinds_fused_weight(lib: ops.Kernels) -> None:
    """A fused weight of parts in different kinds run as stored (Gemma 3's q|k in Q5_0 and v in Q8_0; a
    K-quant beside 32-block kinds) gives each part's rows exactly as that part alone, then the epilogue —
    bias, residual, SwiGLU over gate and up of different kinds — and its reference within the bound."""
    g = torch.Generator().manual_seed(13)
    parts = [_weight(21, 512, 1), _weight(11, 512, 2), quantize(torch.randn(13, 512, generator=g), "q8_0g")]
    parts.append(random_kquant("q4_k", 7, 512, g))
    mixed = QuantizedWeight.from_parts(parts)
    assert mixed.kind == "kmix" and [(p.kind, p.out_features) for p in mixed.parts()] == [
        ("q5_0", 32), ("q8_0g", 13), ("q4_k", 7)]  # fmt: skip
    assert not mixed.is_kquant and torch.equal(dequantize(mixed), torch.cat([dequantize(p) for p in parts]))
    for M in (1, 5, 29):
        x = torch.randn(M, 512, generator=g)
        bias, residual = torch.randn(52, generator=g), torch.randn(M, 52, generator=g)
        want = torch.cat([lib.linear(x, p) for p in parts], -1)
        assert torch.equal(lib.linear(x, mixed), want), M
        assert torch.equal(lib.linear(x, mixed, bias), want + bias), M
        assert torch.equal(lib.linear(x, mixed, None, residual), want + residual), M
        ref = ops.linear_reference(x, mixed, bias)
        torch.testing.assert_close(want + bias, ref, rtol=0, atol=0.02 * ref.abs().max().item())
    gate_up = QuantizedWeight.from_parts(
        [_weight(19, 640, 5), quantize(torch.randn(19, 640, generator=g), "q8_0g")]
    )
    for M in (1, 3, 20):
        x = torch.randn(M, 640, generator=g)
        gate, up = (lib.linear(x, p) for p in gate_up.parts())
        y = lib.linear(x, gate_up, swiglu=True)
        torch.testing.assert_close(y, torch.nn.functional.silu(gate) * up, rtol=1e-6, atol=1e-6)
        rows = torch.cat([lib.linear(x[i : i + 1], gate_up, swiglu=True) for i in range(M)])
        assert torch.equal(y, rows), M
    with pytest.raises(ValueError, match="of one in_features expected"):
        QuantizedWeight.from_parts([_weight(4, 640, 1), _weight(4, 512, 1)])


def _write_gemma_like(path: Path) -> Path:
    """The tiny llama of tests/test_gguf.py as llama.cpp's Q4_K_M writes one of rows of no multiple of 256:
    every matrix and the token table Q5_0, attn_v Q8_0 (q|k|v then fuse Q5_0 with Q8_0)."""
    state = tiny_state_dict(seed=9)
    tensors = {}
    for hf_name, value in state.items():
        array = value.float().numpy()
        if ".q_proj." in hf_name:
            array = permute_qk(array, TINY["num_attention_heads"])
        elif ".k_proj." in hf_name:
            array = permute_qk(array, TINY["num_key_value_heads"])
        qtype = "F32" if array.ndim < 2 else "Q8_0" if ".v_proj." in hf_name else "Q5_0"
        tensors[hf_to_gguf_name(hf_name, TINY["num_hidden_layers"])] = (array, qtype)
    vocab = [f"t{i}" for i in range(TINY["vocab_size"])]
    meta = {**llama_metadata(TINY, vocab), "tokenizer.ggml.merges": ["t 0"]}  # a minimal BPE the loader takes
    return write_gguf(path, tensors, meta)


def test_q5_0_gguf_runs_as_stored(tmp_path: Path) -> None:
    """Every linear as stored — q|k|v a kmix of Q5_0 and Q8_0, gate|up and o / down q5_0, the token table a
    q5_0 row table —, and logits within the activation rounding of the file dequantized to float32, a
    different top-1 only at near-ties of the float values."""
    path = _write_gemma_like(tmp_path / "q5_0.gguf")
    ours = LLM(path, cpu=True, dtype="float32", max_num_seqs=2)
    plain = LLM(path, cpu=True, dtype="float32", max_num_seqs=2, quantize="none")
    layers = {n: m.kind for n, m in ours.model.named_modules() if isinstance(m, QuantizedLinear)}
    assert "f32" not in layers.values(), layers
    for i in range(TINY["num_hidden_layers"]):
        assert layers[f"layers.{i}.attn.qkv_proj"] == "kmix"
        qkv = ours.model.get_submodule(f"layers.{i}.attn.qkv_proj").qweight
        assert [p.kind for p in qkv.parts()] == ["q5_0", "q8_0g"]
        assert layers[f"layers.{i}.mlp.gate_up_proj"] == layers[f"layers.{i}.mlp.down_proj"] == "q5_0"
        assert layers[f"layers.{i}.attn.o_proj"] == "q5_0"
    assert ours.model.embed_tokens.table.kind == "q5_0"
    for name in layers:  # the same values as the dequantized model's float weight
        assert torch.equal(ours.model.get_submodule(name).weight, plain.model.get_submodule(name).weight), (
            name
        )
    batch = prompts([7, 30], seed=5, vocab=ours.config.vocab_size)
    for got, want in zip(full_logits(ours.runner, batch), full_logits(plain.runner, batch), strict=True):
        # 8-bit activations per 32 in every layer of a random tiny model: the same file all in Q8_0 (q8_0g,
        # the same activation rounding) measured 2.9 % and 23 % of the largest logit, this one 6.1 % and 9.3 %
        assert assert_quantized_logits(got, want, 0.15) > 0
    assert_greedy_diverges_only_at_ties(ours, plain, batch[1])
