"""bf16 weights with their exponents coded in 4 bits (kind bf16z: kernels/bf16_coded.py, csrc/linear_bf16z.c).

The coding is lossless: the C pack equals the torch reference byte for byte, decoding gives every bf16 bit
back (zeros of both signs, subnormals, infinities, NaNs and the rare exponents kept as escapes included), and
a row of more rare exponents than its escape slots is refused, not approximated. The kernel gives the bf16
kernel's bits on the same weight — every row count (the decode streams up to 8 rows, the panel GEMM past
them), bias, residual and SwiGLU epilogues, escapes anywhere in a block or a row — on every ISA build. The
loader codes the bf16 linears of `--quantize bf16` and of a BF16 GGUF where the library decodes them, the
logits bit for bit those of the bf16 weights, and a later load maps the coded weights from the quantization
cache.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from blazr import LLM
from blazr.kernels import bf16_coded, ops
from blazr.kernels.quant import QuantizedWeight, dequantize
from blazr.loading import quant_cache
from tests.drive import full_logits, stepwise_logits
from tests.hf_parity import prompts
from tests.test_quantize import mapped_file, quantized_layers

SPECIAL = [0.0, -0.0, 1e-40, -3e-39, float("inf"), float("-inf"), float("nan"), 3.0e38, 1e-30, -(2.0**-60)]


def _weight(n: int, k: int, seed: int, rare: bool = True) -> torch.Tensor:
    """bf16 [n, k] ~ N(0, 0.02²); with `rare`, values no row table holds (escapes) at a row's first and last
    column, two in one block, in a later block, and zeros, subnormals, infinities and a NaN among them."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.02
    if rare:
        w[0, 0], w[0, k - 1] = SPECIAL[0], SPECIAL[8]  # +0 is code 0 (not an escape); 1e-30 escapes
        w[1, 3:7] = torch.tensor(SPECIAL[2:6])
        w[2, 5], w[2, 6], w[2, k // 2 + 1] = SPECIAL[6], SPECIAL[7], SPECIAL[9]
        w[n - 1, 63] = SPECIAL[1]
        cols = torch.linspace(0, k - 1, 8).long()  # eight exponents once each along a row, its ends included
        w[3, cols] = torch.tensor([2.0 ** (-100 + i) for i in range(8)])
    return w.to(torch.bfloat16)


def _bits(w: torch.Tensor) -> torch.Tensor:
    return w.contiguous().view(torch.int16)


@pytest.mark.parametrize(("n", "k"), [(48, 64), (40, 128), (33, 960), (20, 2048)])
def test_pack_keeps_every_bit(native: ops.Kernels, n: int, k: int) -> None:
    w = _weight(n, k, seed=k)
    want = bf16_coded.pack_reference(w)
    assert want is not None and want.shape == (n, bf16_coded.row_bytes(k))
    assert torch.equal(native.pack_bf16z(w), want)
    coded = bf16_coded.pack(QuantizedWeight("bf16", w, n, k))
    assert coded is not None and coded.kind == "bf16z" and torch.equal(coded.data, want)
    assert torch.equal(_bits(bf16_coded.unpack(want, n, k)), _bits(w))  # NaN's bits too
    same = dequantize(coded).nan_to_num() == w.float().nan_to_num()
    assert bool(same.all())
    # a row's escapes are its weights of a non-zero exponent outside its table (read from the bytes)
    escapes = want[:, 32 : 32 + 4 * bf16_coded.cap(k)].contiguous().view(torch.int16).view(n, -1, 2)
    used = (escapes[..., 0] != -1).sum(1)
    table = (want[:, :16].long() << 1) | (want[:, 16:32].long() >> 7)  # [N, 16] exponents
    exp = (_bits(w).long() >> 7) & 0xFF
    outside = (exp != 0) & ~(exp.unsqueeze(-1) == table.unsqueeze(1)).any(-1)
    assert torch.equal(used, outside.sum(1)) and (k < 960 or int(used[3]) > 0)  # short rows fit them all


def test_a_row_of_too_many_rare_exponents_is_refused(native: ops.Kernels) -> None:
    """Every exponent from 2⁻⁹⁰ to 2⁹⁰ in one row: more escapes than its slots hold — not codable."""
    w = _weight(16, 256, seed=1, rare=False)
    w[5] = torch.logspace(-90, 90, 256, base=2).to(torch.bfloat16)
    assert bf16_coded.pack_reference(w) is None and native.pack_bf16z(w) is None
    assert bf16_coded.pack(QuantizedWeight("bf16", w, 16, 256)) is None
    w[5, :] = w[4, :]  # the same weight with an ordinary row is codable
    assert bf16_coded.pack(QuantizedWeight("bf16", w, 16, 256)) is not None


def test_shapes_the_layout_cannot_hold() -> None:
    assert not bf16_coded.codable_shape(96) and not bf16_coded.codable_shape(65536)
    assert bf16_coded.codable_shape(64) and not bf16_coded.worth(64) and bf16_coded.worth(512)
    assert bf16_coded.pack(QuantizedWeight("bf16", _weight(4, 96, 0, rare=False), 4, 96)) is None
    with pytest.raises(ValueError, match="bf16z"):
        bf16_coded.pack_reference(torch.zeros(4, 96, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="bf16z weight data"):
        QuantizedWeight("bf16z", torch.zeros(4, 100, dtype=torch.uint8), 4, 128)


# one row (streams of 1-4 rows), 2-4 rows (2 streams), 5-8 (two passes), the panel GEMM from 9
@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 8, 9, 14, 40])
@pytest.mark.parametrize(("n", "k"), [(37, 512), (64, 2048)])
def test_kernel_gives_the_bf16_bits(lib: ops.Kernels, M: int, n: int, k: int) -> None:
    g = torch.Generator().manual_seed(M * 7 + n)
    w = _weight(n, k, seed=M).nan_to_num(0.0, 0.0, 0.0)  # no inf / NaN: the outputs compare as numbers
    bf, coded = QuantizedWeight("bf16", w, n, k), bf16_coded.pack(QuantizedWeight("bf16", w, n, k))
    assert coded is not None
    x = torch.randn(M, k, generator=g)
    bias, residual = torch.randn(n, generator=g), torch.randn(M, n, generator=g)
    cases: list[dict] = [{}, {"bias": bias}, {"residual": residual}]
    if n % 2 == 0:
        cases.append({"bias": bias, "swiglu": True})
    for kw in cases:
        got, want = lib.linear(x, coded, **kw), lib.linear(x, bf, **kw)
        assert torch.equal(got, want), (M, kw.keys())
    torch.testing.assert_close(lib.linear(x, coded), x @ w.float().T, rtol=1e-4, atol=1e-4)


def test_loader_codes_bf16_linears_with_the_same_logits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--quantize bf16` and a BF16 GGUF kept as stored: each linear of rows worth coding (K ≥ 512) runs
    coded where the library has its AVX-512 decode, with the logits of the bf16 weights bit for bit under
    whole prefill and decode steps; `BLAZR_BF16Z=0` keeps them bf16. A second load maps every coded weight
    from the quantization cache (no coding run) with the same bytes."""
    from tests.gguf_fixtures import write_tiny_llama_gguf
    from tests.test_gguf import TINY, tiny_state_dict

    cache = tmp_path / "qcache"
    monkeypatch.setenv("BLAZR_QUANT_CACHE", str(cache))
    cfg = {**TINY, "hidden_size": 512, "intermediate_size": 1024, "vocab_size": 64}
    gguf = write_tiny_llama_gguf(tmp_path / "m.gguf", tiny_state_dict(seed=3, cfg=cfg), cfg, "BF16")
    decodes = "avx512" in ops.kernels().features
    batch = prompts([21, 9], seed=5, vocab=cfg["vocab_size"])
    plan = [[len(p) - 4] + [1] * 4 for p in batch]

    def load(mode: str) -> LLM:
        llm = LLM(gguf, cpu=True, dtype="float32", kv_cache_dtype="float32", quantize=mode)
        quant_cache.wait()
        return llm

    for mode in ("auto", "bf16"):
        monkeypatch.setenv("BLAZR_BF16Z", "0")
        plain = load(mode)
        assert {m.kind for m in quantized_layers(plain).values()} == {"bf16"}
        monkeypatch.delenv("BLAZR_BF16Z")
        coded = load(mode)
        kinds = {name: m.kind for name, m in quantized_layers(coded).items()}
        want = "bf16z" if decodes else "bf16"
        assert set(kinds.values()) == {want}, kinds  # every K here is 512 or 1024: worth coding
        for a, b in zip(
            stepwise_logits(coded, batch, plan), stepwise_logits(plain, batch, plan), strict=True
        ):
            assert torch.equal(a, b), mode
        for a, b in zip(full_logits(coded.runner, batch), full_logits(plain.runner, batch), strict=True):
            assert torch.equal(a, b), mode
        if not decodes:
            continue
        made = {name: m.qweight.data for name, m in quantized_layers(coded).items()}
        monkeypatch.setattr(bf16_coded, "pack", lambda qw: pytest.fail("coded although the cache held it"))
        again = load(mode)
        files = sorted(cache.glob(f"*-{mode}-*.blzq"))
        assert len(files) == 1, list(cache.iterdir())
        for name, m in quantized_layers(again).items():
            assert m.kind == "bf16z" and mapped_file(m.qweight.data.data_ptr()) == str(files[0]), name
            assert torch.equal(m.qweight.data, made[name]), name
        monkeypatch.undo()
        monkeypatch.setenv("BLAZR_QUANT_CACHE", str(cache))


def test_moe_experts_coded_with_the_same_logits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Mixtral's stacked experts under `--quantize bf16` are coded too (csrc/moe.c runs an expert's rows
    through the linear kernels by weight code): the logits of the bf16 experts bit for bit, prefill and decode
    steps, and the second load takes the coded stacks from the quantization cache."""
    from blazr.model.moe import Experts
    from tests.tiny import build

    monkeypatch.setenv("BLAZR_QUANT_CACHE", str(tmp_path / "qcache"))
    path = tmp_path / "mixtral"
    build("MixtralForCausalLM", path, hidden_size=512, intermediate_size=512, num_local_experts=4,
          num_experts_per_tok=2, vocab_size=64, initializer_range=0.02)  # fmt: skip
    batch = prompts([19, 7], seed=2, vocab=64)
    plan = [[len(p) - 3] + [1] * 3 for p in batch]

    def load() -> LLM:
        llm = LLM(path, cpu=True, dtype="float32", kv_cache_dtype="float32", quantize="bf16")
        quant_cache.wait()
        return llm

    def experts(llm: LLM) -> list[Experts]:
        return [m for m in llm.model.modules() if isinstance(m, Experts)]

    monkeypatch.setenv("BLAZR_BF16Z", "0")
    plain = load()
    monkeypatch.delenv("BLAZR_BF16Z")
    coded = load()
    want = "bf16z" if "avx512" in ops.kernels().features else "bf16"
    assert {e.w_up.kind for e in experts(coded)} == {e.w_down.kind for e in experts(coded)} == {want}
    assert {e.w_up.kind for e in experts(plain)} == {"bf16"}
    for a, b in zip(stepwise_logits(coded, batch, plan), stepwise_logits(plain, batch, plan), strict=True):
        assert torch.equal(a, b)
    monkeypatch.setattr(bf16_coded, "pack", lambda qw: pytest.fail("coded although the cache held it"))
    again = load()
    for a, b in zip(experts(again), experts(coded), strict=True):
        assert a.w_up.kind == want and torch.equal(a.w_up.data, b.w_up.data)
        assert torch.equal(a.w_down.data, b.w_down.data)
