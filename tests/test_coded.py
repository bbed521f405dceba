"""Float weights with their top byte coded in 4 bits (kinds bf16z, f32z: kernels/coded.py,
csrc/linear_coded.c).

The coding is lossless: the C pack equals the torch reference byte for byte, decoding gives every bit back
(zeros of both signs, subnormals, infinities, NaNs and the rare top bytes kept as escapes included), and a row
of more rare top bytes than its escape slots is refused, not approximated. The kernel gives the stored kind's
kernel's bits on the same weight — every row count (the decode streams up to 8 rows, the panel GEMM past
them), bias, residual and SwiGLU epilogues, escapes anywhere in a block or a row — on every ISA build. The
loader codes the bf16 linears and expert stacks of `--quantize bf16` and of a BF16 GGUF, an F16 GGUF's
linears where bf16 holds every value (as bf16z), and the float32 linears of a float32 checkpoint, where the
library decodes them: the logits bit for bit those of the stored weights, and a later load maps the coded
bf16 weights from the quantization cache. A float32 checkpoint (or F32 GGUF) of bf16 values is coded as
bf16z: `--quantize bf16`'s bytes and logits, transformers' logits to fp32 rounding.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from blazr import LLM
from blazr.kernels import coded, ops
from blazr.kernels.quant import QuantizedWeight, dequantize
from blazr.loading import quant_cache
from blazr.loading.quantize import kernel_prefill_f32
from blazr.model.moe import Experts
from blazr.model.qlinear import QuantizedLinear
from tests.drive import full_logits, stepwise_logits
from tests.hf_parity import prompts
from tests.test_quantize import mapped_file, quantized_layers

SPECIAL = [0.0, -0.0, 1e-40, -3e-39, float("inf"), float("-inf"), float("nan"), 3.0e38, 1e-30, -(2.0**-60)]
DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}


def _weight(
    n: int, k: int, seed: int, rare: bool = True, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """[n, k] ~ N(0, 0.02²); with `rare`, values no row table holds (escapes) at a row's first and last
    column, two in one block, in a later block, and zeros, subnormals, infinities and a NaN among them."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.02
    if rare:
        w[0, 0], w[0, k - 1] = SPECIAL[0], SPECIAL[8]
        w[1, 3:7] = torch.tensor(SPECIAL[2:6])
        w[2, 5], w[2, 6], w[2, k // 2 + 1] = SPECIAL[6], SPECIAL[7], SPECIAL[9]
        w[n - 1, 63] = SPECIAL[1]
        cols = torch.linspace(0, k - 1, 8).long()  # eight exponents once each along a row, its ends included
        w[3, cols] = torch.tensor([2.0 ** (-100 + i) for i in range(8)])
    return w.to(dtype)


def _load(path: Path, quantize: str) -> LLM:
    """A float32 load of the checkpoint at `path`, its quantization cache written before it returns."""
    llm = LLM(path, cpu=True, dtype="float32", kv_cache_dtype="float32", quantize=quantize)
    quant_cache.wait()
    return llm


def _mixtral(path: Path) -> Path:
    """A tiny Mixtral whose expert rows are wide enough to code (K = 512), 4 experts, 2 a token."""
    from tests.tiny import build

    build("MixtralForCausalLM", path, hidden_size=512, intermediate_size=512, num_local_experts=4,
          num_experts_per_tok=2, vocab_size=64, initializer_range=0.02)  # fmt: skip
    return path


def _experts(llm: LLM) -> list[Experts]:
    return [m for m in llm.model.modules() if isinstance(m, Experts)]


def _same_logits(
    made: LLM, plain: LLM, batch: list[list[int]], plan: list[list[int]], whole: bool = False, label: str = ""
) -> None:
    """`made` gives `plain`'s logits bit for bit at each step of `plan` (chunks, then decode steps) and, with
    `whole`, at whole prefills."""
    for a, b in zip(stepwise_logits(made, batch, plan), stepwise_logits(plain, batch, plan), strict=True):
        assert torch.equal(a, b), label
    if whole:
        for a, b in zip(full_logits(made.runner, batch), full_logits(plain.runner, batch), strict=True):
            assert torch.equal(a, b), label


def _linears(llm: LLM) -> dict[str, QuantizedLinear]:
    """Every layer on the kernels, f32 ones included."""
    return {n: m for n, m in llm.model.named_modules() if isinstance(m, QuantizedLinear)}


def _no_pack(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here, coding a weight fails the test (the quantization cache must hold every one)."""
    monkeypatch.setattr(coded, "pack", lambda *a, **kw: pytest.fail("coded although the cache held it"))


def _bf16_valued(arch: str, path: Path, **cfg: object) -> torch.nn.Module:
    """transformers' `arch` at `cfg` (random weights) saved float32 at `path` with every value a bf16, as a
    float32 copy of a published bf16 checkpoint is; the model returned."""
    from tests.tiny import build

    hf = build(arch, path, initializer_range=0.02, **cfg)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    hf.save_pretrained(path)
    return hf


def _bits(w: torch.Tensor) -> torch.Tensor:
    return w.contiguous().view(torch.int16 if w.dtype == torch.bfloat16 else torch.int32)


@pytest.mark.parametrize("base", ["bf16", "f32"])
@pytest.mark.parametrize(("n", "k"), [(48, 64), (40, 128), (33, 960), (20, 2048)])
def test_pack_keeps_every_bit(native: ops.Kernels, base: str, n: int, k: int) -> None:
    w, kind = _weight(n, k, seed=k, dtype=DTYPES[base]), coded.KIND_OF[base]
    want = coded.pack_reference(w)
    assert want is not None and want.shape == (n, coded.row_bytes(k, kind))
    assert torch.equal(native.pack_coded(w), want)
    made = coded.pack(QuantizedWeight(base, w, n, k))
    assert made is not None and made.kind == kind and torch.equal(made.data, want)
    assert torch.equal(_bits(coded.unpack(kind, want, n, k)), _bits(w))  # NaN's bits too
    assert bool((dequantize(made).nan_to_num() == w.float().nan_to_num()).all())
    # a row's escapes are its weights of a non-zero top byte outside its table (read from the bytes)
    escapes = want[:, 32 : 32 + 4 * coded.cap(k)].contiguous().view(torch.int16).view(n, -1, 2)
    used = (escapes[..., 0] != -1).sum(1)
    table = want[:, :16].long()  # [N, 16] top bytes
    top = (w.float().contiguous().view(torch.int32).long() >> 24) & 0xFF
    outside = (top != 0) & ~(top.unsqueeze(-1) == table.unsqueeze(1)).any(-1)
    assert torch.equal(used, outside.sum(1)) and (k < 960 or int(used[3]) > 0)  # short rows fit them all


@pytest.mark.parametrize("base", ["bf16", "f32"])
def test_a_row_of_too_many_rare_exponents_is_refused(native: ops.Kernels, base: str) -> None:
    """Every exponent from 2⁻⁹⁰ to 2⁹⁰ in one row: more escapes than its slots hold — not codable."""
    w = _weight(16, 256, seed=1, rare=False, dtype=DTYPES[base])
    w[5] = torch.logspace(-90, 90, 256, base=2).to(w.dtype)
    assert coded.pack_reference(w) is None and native.pack_coded(w) is None
    assert coded.pack(QuantizedWeight(base, w, 16, 256)) is None
    w[5, :] = w[4, :]  # the same weight with an ordinary row is codable
    assert coded.pack(QuantizedWeight(base, w, 16, 256)) is not None


def test_shapes_the_layout_cannot_hold() -> None:
    assert not coded.codable_shape(96) and not coded.codable_shape(65536)
    assert coded.codable_shape(64) and not coded.worth(64) and coded.worth(512)
    assert not coded.worth(128, "f32z") and coded.worth(512, "f32z")
    assert coded.pack(QuantizedWeight("bf16", _weight(4, 96, 0, rare=False), 4, 96)) is None
    assert coded.pack(QuantizedWeight("q8_0", torch.zeros(1, 16 * 34, dtype=torch.uint8), 4, 32)) is None
    with pytest.raises(ValueError, match="coded"):
        coded.pack_reference(torch.zeros(4, 96, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="bf16z weight data"):
        QuantizedWeight("bf16z", torch.zeros(4, 100, dtype=torch.uint8), 4, 128)


# one row (streams of 1-4 rows), 2-4 rows (2 streams), 5-8 (two passes), the panel GEMM from 9 (AVX-512: the
# lanes form at 13-16, f32 from 9, rows decoded a block at a time)
@pytest.mark.parametrize("base", ["bf16", "f32"])
@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 8, 9, 13, 16, 40])
@pytest.mark.parametrize(("n", "k"), [(50, 576), (64, 2048)])  # rows past a last block; a 64-column step
def test_kernel_gives_the_stored_bits(lib: ops.Kernels, base: str, M: int, n: int, k: int) -> None:
    """The stored kind's kernel's bits: bf16's at every row count; f32's decode tiles up to 8 rows and its
    prefill GEMM past them (the coded kernel's prefill path)."""
    g = torch.Generator().manual_seed(M * 7 + n)
    w = _weight(n, k, seed=M, dtype=DTYPES[base]).nan_to_num(0.0, 0.0, 0.0)  # outputs compare as numbers
    stored = QuantizedWeight(base, w, n, k)
    made = coded.pack(stored)
    assert made is not None
    x = torch.randn(M, k, generator=g)
    bias, residual = torch.randn(n, generator=g), torch.randn(M, n, generator=g)
    cases: list[dict] = [{}, {"bias": bias}, {"residual": residual}]
    if n % 2 == 0:
        cases.append({"bias": bias, "swiglu": True})
    for kw in cases:
        got, want = lib.linear(x, made, **kw), lib.linear(x, stored, prefill=M > 8, **kw)
        assert torch.equal(got, want), (M, kw.keys())
    torch.testing.assert_close(lib.linear(x, made), x @ w.float().T, rtol=1e-4, atol=1e-4)


def test_loader_codes_bf16_linears_with_the_same_logits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--quantize bf16` and a BF16 GGUF kept as stored: each linear of rows worth coding (K ≥ 512) runs
    coded where the library has its vector decode (AVX2, AVX-512), with the logits of the bf16 weights bit
    for bit under whole prefill and decode steps; `BLAZR_CODED=0` keeps them bf16. A second load maps every
    coded weight from the quantization cache (no coding run) with the same bytes."""
    from tests.gguf_fixtures import write_tiny_llama_gguf
    from tests.test_gguf import TINY, tiny_state_dict

    cache = tmp_path / "qcache"
    monkeypatch.setenv("BLAZR_QUANT_CACHE", str(cache))
    cfg = {**TINY, "hidden_size": 512, "intermediate_size": 1024, "vocab_size": 64}
    gguf = write_tiny_llama_gguf(tmp_path / "m.gguf", tiny_state_dict(seed=3, cfg=cfg), cfg, "BF16")
    decodes = coded.decodes(ops.kernels())
    batch = prompts([21, 9], seed=5, vocab=cfg["vocab_size"])
    plan = [[len(p) - 4] + [1] * 4 for p in batch]

    for mode in ("auto", "bf16"):
        monkeypatch.setenv("BLAZR_CODED", "0")
        plain = _load(gguf, mode)
        assert {m.kind for m in quantized_layers(plain).values()} == {"bf16"}
        monkeypatch.setenv("BLAZR_CODED", "1")  # coded whatever host tuning chose
        made_llm = _load(gguf, mode)
        kinds = {name: m.kind for name, m in quantized_layers(made_llm).items()}
        want = "bf16z" if decodes else "bf16"
        assert set(kinds.values()) == {want}, kinds  # every K here is 512 or 1024: worth coding
        _same_logits(made_llm, plain, batch, plan, whole=True, label=mode)
        if not decodes:
            continue
        made = {name: m.qweight.data for name, m in quantized_layers(made_llm).items()}
        _no_pack(monkeypatch)
        again = _load(gguf, mode)
        files = sorted(cache.glob(f"*-{mode}-*.blzq"))
        assert len(files) == 1, list(cache.iterdir())
        for name, m in quantized_layers(again).items():
            assert m.kind == "bf16z" and mapped_file(m.qweight.data.data_ptr()) == str(files[0]), name
            assert torch.equal(m.qweight.data, made[name]), name
        monkeypatch.undo()
        monkeypatch.setenv("BLAZR_QUANT_CACHE", str(cache))


@pytest.mark.parametrize("base", ["f16", "f32"])
def test_float_held_by_bf16_is_coded_as_bf16(
    native: ops.Kernels, monkeypatch: pytest.MonkeyPatch, base: str
) -> None:
    """`as_bf16`: an f16 or f32 weight whose values bf16 holds comes back as those bf16 values (an f16
    MappedWeight's rows in its row order; subnormals, infinities and −0 included; checked a few rows at a
    time); one value bf16 does not hold — in the first row, a middle one or the last — and it is refused: an
    f16 weight stays f16, an f32 one is coded as f32z. `pack` codes the held one as bf16z, the same bytes as
    its bf16 values, or as f32z when only that kind is asked for."""
    from blazr.kernels.mapped import MAPPED_KINDS, MappedWeight

    monkeypatch.setattr(coded, "_CHECK_ELEMENTS", 2 * 512)  # two rows a check: the last row's is its own
    dtype = {"f16": torch.float16, "f32": torch.float32}[base]
    n, k = 7, 512
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    w[1, :4] = torch.tensor([2.0**-20, -(2.0**-24), float("inf"), -0.0])  # f16 subnormals, ±inf, -0
    stored = w.to(dtype)
    assert torch.equal(stored.float(), w.float())
    got = coded.as_bf16(QuantizedWeight(base, stored, n, k))
    assert got is not None and got.kind == "bf16" and torch.equal(_bits(got.data), _bits(w))
    if base in MAPPED_KINDS:
        order = torch.tensor([3, 0, 5, 1, 6, 4, 2])
        rows = stored.data_ptr() + order * stored.element_size() * k
        table = MappedWeight(base, rows, stored, n, k)
        mapped = coded.as_bf16(table)
        assert mapped is not None and torch.equal(_bits(mapped.data), _bits(w[order]))
        assert table._gathered is None  # read where the rows lie
    low = 2.0**-10 if base == "f16" else 2.0**-23  # the stored kind's lowest mantissa bit: not a bf16
    for row in (0, 3, n - 1):
        off = stored.clone()
        off[row, 7] = torch.tensor(1.0 + low, dtype=dtype)
        assert coded.as_bf16(QuantizedWeight(base, off, n, k)) is None, row
        refused = coded.pack(QuantizedWeight(base, off, n, k))
        if base == "f16":
            assert refused is None, row
        else:
            assert refused is not None and refused.kind == "f32z", row
            assert torch.equal(_bits(coded.unpack("f32z", refused.data, n, k)), _bits(off)), row
    made = coded.pack(QuantizedWeight(base, stored, n, k))
    assert made is not None and made.kind == "bf16z"
    assert torch.equal(made.data, native.pack_coded(w))
    if base == "f32":
        only = coded.pack(QuantizedWeight(base, stored, n, k), ["f32z"])
        assert only is not None and only.kind == "f32z"
        assert torch.equal(only.data, native.pack_coded(stored))
    else:
        assert coded.pack(QuantizedWeight(base, stored, n, k), ["f32z"]) is None


def test_loader_codes_an_f16_gguf_of_bf16_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An F16 GGUF converted from bf16 weights (every value a bf16) runs its linears as bf16z under `auto`
    where the library decodes them, with the F16 weights' logits bit for bit (whole prefill and decode
    steps); the F16 GGUF of the same float32 weights stays f16; a later load maps the coded weights from the
    quantization cache."""
    from tests.gguf_fixtures import write_tiny_llama_gguf
    from tests.test_gguf import TINY, tiny_state_dict

    cache = tmp_path / "qcache"
    monkeypatch.setenv("BLAZR_QUANT_CACHE", str(cache))
    cfg = {**TINY, "hidden_size": 512, "intermediate_size": 1024, "vocab_size": 64}
    weights = tiny_state_dict(seed=3, cfg=cfg)
    held = {name: w.to(torch.bfloat16).float() for name, w in weights.items()}
    gguf = write_tiny_llama_gguf(tmp_path / "bf16-values.gguf", held, cfg, "F16")
    decodes = coded.decodes(ops.kernels())
    batch = prompts([21, 9], seed=5, vocab=cfg["vocab_size"])
    plan = [[len(p) - 4] + [1] * 4 for p in batch]

    monkeypatch.setenv("BLAZR_CODED", "0")
    plain = _load(gguf, "auto")
    assert {m.kind for m in quantized_layers(plain).values()} == {"f16"}
    monkeypatch.setenv("BLAZR_CODED", "1")  # coded whatever host tuning chose
    made = _load(gguf, "auto")
    kinds = {name: m.kind for name, m in quantized_layers(made).items()}
    assert set(kinds.values()) == {"bf16z" if decodes else "f16"}, kinds
    _same_logits(made, plain, batch, plan, whole=True)
    f32_values = write_tiny_llama_gguf(tmp_path / "f32-values.gguf", weights, cfg, "F16")
    assert {m.kind for m in quantized_layers(_load(f32_values, "auto")).values()} == {"f16"}
    if decodes:
        _no_pack(monkeypatch)
        again = _load(gguf, "auto")
        assert {m.kind for m in quantized_layers(again).values()} == {"bf16z"}


def test_moe_experts_coded_with_the_same_logits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Mixtral's stacked experts under `--quantize bf16` are coded too (csrc/moe.c runs an expert's rows
    through the linear kernels by weight code): the logits of the bf16 experts bit for bit, prefill and decode
    steps, and the second load takes the coded stacks from the quantization cache."""
    monkeypatch.setenv("BLAZR_QUANT_CACHE", str(tmp_path / "qcache"))
    path = _mixtral(tmp_path / "mixtral")
    batch = prompts([19, 7], seed=2, vocab=64)
    plan = [[len(p) - 3] + [1] * 3 for p in batch]
    monkeypatch.setenv("BLAZR_CODED", "0")
    plain = _load(path, "bf16")
    monkeypatch.setenv("BLAZR_CODED", "1")  # coded whatever host tuning chose
    made = _load(path, "bf16")
    want = "bf16z" if coded.decodes(ops.kernels()) else "bf16"
    assert {e.w_up.kind for e in _experts(made)} == {e.w_down.kind for e in _experts(made)} == {want}
    assert {e.w_up.kind for e in _experts(plain)} == {"bf16"}
    _same_logits(made, plain, batch, plan)
    _no_pack(monkeypatch)
    again = _load(path, "bf16")
    for a, b in zip(_experts(again), _experts(made), strict=True):
        assert a.w_up.kind == want and torch.equal(a.w_up.data, b.w_up.data)
        assert torch.equal(a.w_down.data, b.w_down.data)


def test_float32_moe_experts_coded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under `auto` a float32 Mixtral's expert stacks are coded too (f32z, by weight code through csrc/moe.c):
    with at most 8 tokens an expert (chunks of 2 tokens of 2 sequences, then decode steps) the logits are
    bit for bit those of the same float32 stacks on the f32 kernel; a whole prefill (an expert's rows on the
    panel GEMM) agrees with the float model (torch's GEMMs) to fp32 rounding, greedy tokens alike; the float
    parameters are dropped and a later load maps the coded stacks from the quantization cache."""
    from tests.drive import assert_logits_close

    monkeypatch.setenv("BLAZR_QUANT_CACHE", str(tmp_path / "qcache"))
    path = _mixtral(tmp_path / "mixtral")
    batch = prompts([13, 9], seed=3, vocab=64)
    # chunks of ≤ 2 tokens (≤ 8 of a step's 2 × 2 × 2 expert slots an expert), the last two as decode steps
    plan = [[2] * ((len(p) - 2) // 2) + [1] * ((len(p) - 2) % 2) + [1, 1] for p in batch]
    monkeypatch.setattr("blazr.loading.quantize.kernel_prefill_f32", lambda: True)  # whatever tuning chose
    monkeypatch.setenv("BLAZR_CODED", "0")
    plain = _load(path, "auto")
    assert all(e.w_up is None for e in _experts(plain))
    want = full_logits(plain.runner, batch)
    monkeypatch.setenv("BLAZR_CODED", "1")
    made = _load(path, "auto")
    if not coded.decodes(ops.kernels()):
        assert all(e.w_up is None for e in _experts(made))  # no coded decode in this build: nothing coded
        return
    for e in _experts(made):
        assert e.w_up.kind == e.w_down.kind == "f32z" and not hasattr(e, "down_proj")
    for e in _experts(plain):  # the same float32 stacks on the f32 kernel, prefill included
        e.set_stacked(*e.stacked())
    _same_logits(made, plain, batch, plan)
    for got, ref in zip(full_logits(made.runner, batch), want, strict=True):
        assert_logits_close(got, ref)
        assert torch.equal(got.argmax(-1), ref.argmax(-1))
    _no_pack(monkeypatch)
    again = _load(path, "auto")
    for a, b in zip(_experts(again), _experts(made), strict=True):
        assert a.w_up.kind == "f32z" and torch.equal(a.w_up.data, b.w_up.data)
        assert torch.equal(a.w_down.data, b.w_down.data)


@pytest.mark.parametrize(("mode", "tied"), [("auto", False), ("none", False), ("auto", True)])
def test_loader_codes_float32_linears_with_the_same_logits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, tied: bool
) -> None:
    """Under `auto` a float32 checkpoint's linears run coded (f32z) where the host decodes them and its
    float32 prefill runs the kernel's panel GEMM: the logits bit for bit those of the f32 weights (decode
    steps, and a prefill's panel GEMM on the decoded rows); a tied head's table then looks its rows up in the
    head's coded bytes (no float32 table kept); a later load maps them from the quantization cache. `none`
    and `BLAZR_CODED=0` keep them f32 views of the loaded tensors."""
    from blazr.model.embedding import QuantizedEmbedding
    from tests.tiny import build

    monkeypatch.setenv("BLAZR_QUANT_CACHE", str(tmp_path / "qcache"))
    path = tmp_path / "llama"
    build("LlamaForCausalLM", path, hidden_size=512, intermediate_size=1024, vocab_size=64,
          tie_word_embeddings=tied, initializer_range=0.02)  # fmt: skip
    batch = prompts([23, 9], seed=4, vocab=64)
    plan = [[len(p) - 4] + [1] * 4 for p in batch]

    monkeypatch.setenv("BLAZR_CODED", "0")
    plain = _load(path, mode)
    assert {m.kind for m in _linears(plain).values()} == {"f32"}
    monkeypatch.setenv("BLAZR_CODED", "1")  # coded whatever host tuning chose
    made = _load(path, mode)
    codes = coded.decodes(ops.kernels()) and kernel_prefill_f32() and mode == "auto"
    assert {m.kind for m in _linears(made).values()} == {"f32z" if codes else "f32"}
    _same_logits(made, plain, batch, plan)
    for name, m in _linears(made).items():
        assert torch.equal(m.weight, _linears(plain)[name].weight), name
    table = made.model.embed_tokens
    if tied and codes:
        head = _linears(made)["lm_head"].qweight
        assert isinstance(table, QuantizedEmbedding) and table.table.data.data_ptr() == head.data.data_ptr()
        assert torch.equal(table.weight, plain.model.embed_tokens.weight)
    else:
        assert not isinstance(table, QuantizedEmbedding)
    if codes:
        _no_pack(monkeypatch)
        again = _load(path, mode)
        files = list((tmp_path / "qcache").glob("*.blzq"))
        assert len(files) == 1
        for name, m in _linears(again).items():
            assert m.kind == "f32z" and mapped_file(m.qweight.data.data_ptr()) == str(files[0]), name


@pytest.mark.parametrize("codes", ["1", "0"])
@pytest.mark.parametrize("tied", [False, True])
def test_float32_of_bf16_values_run_as_bf16(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tied: bool, codes: str
) -> None:
    """A float32 checkpoint saved from bf16 weights (every value a bf16; an F32 GGUF of a published model is
    one) runs its linears as bf16 under `auto` where float32 prefill runs the panel GEMM: coded (bf16z)
    where the library decodes that (`BLAZR_CODED=1`), else the bf16 values stored (`0`) — the very bytes
    `--quantize bf16` makes of the same checkpoint, so its logits bit for bit; transformers' fp32 logits on
    the same weights to fp32 rounding, greedy tokens alike, as `none` (the f32 tensors as loaded) gives
    them; a tied head's table looks its rows up in the head's bytes; the F32 GGUF of the same weights runs
    alike; a later load maps coded weights from the quantization cache."""
    from blazr.model.embedding import QuantizedEmbedding
    from tests.drive import assert_logits_close
    from tests.gguf_fixtures import write_tiny_llama_gguf
    from tests.tiny import hf_logits

    monkeypatch.setenv("BLAZR_QUANT_CACHE", str(tmp_path / "qcache"))
    monkeypatch.setattr("blazr.loading.quantize.kernel_prefill_f32", lambda: True)  # whatever tuning chose
    monkeypatch.setenv("BLAZR_CODED", codes)  # coded or not whatever host tuning chose
    path = tmp_path / "llama"
    cfg = {"hidden_size": 512, "intermediate_size": 1024, "vocab_size": 64, "tie_word_embeddings": tied}
    hf = _bf16_valued("LlamaForCausalLM", path, **cfg)
    batch = prompts([23, 9], seed=6, vocab=64)
    plan = [[len(p) - 4] + [1] * 4 for p in batch]
    want = "bf16z" if codes == "1" and coded.decodes(ops.kernels()) else "bf16"

    reference = _load(path, "none")
    assert {m.kind for m in _linears(reference).values()} == {"f32"}
    made = _load(path, "auto")
    layers = _linears(made)
    assert {m.kind for m in layers.values()} == {want}, {n: m.kind for n, m in layers.items()}
    twin = _load(path, "bf16")
    for name, m in _linears(twin).items():
        assert m.kind == want and torch.equal(m.qweight.data, layers[name].qweight.data), name
    _same_logits(made, twin, batch, plan, whole=True)
    for got, ref, ids in zip(
        full_logits(made.runner, batch), full_logits(reference.runner, batch), batch, strict=True
    ):
        expected = hf_logits(hf, ids)
        assert_logits_close(got, expected)
        assert_logits_close(ref, expected)
        assert torch.equal(got.argmax(-1), expected.argmax(-1))
    table = made.model.embed_tokens
    if tied:
        assert isinstance(table, QuantizedEmbedding) and table.table.kind == want
        assert table.table.data.data_ptr() == layers["lm_head"].qweight.data.data_ptr()
        assert torch.equal(table.weight, reference.model.embed_tokens.weight)
    gguf = write_tiny_llama_gguf(tmp_path / "bf16-values-f32.gguf", hf.state_dict(), hf.config, "F32")
    assert {m.kind for m in _linears(_load(gguf, "auto")).values()} == {want}
    if want == "bf16z":
        _no_pack(monkeypatch)
        again = _load(path, "auto")
        for name, m in _linears(again).items():
            assert m.kind == "bf16z" and torch.equal(m.qweight.data, layers[name].qweight.data), name


@pytest.mark.parametrize("codes", ["1", "0"])
def test_float32_moe_experts_of_bf16_values_run_as_bf16(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, codes: str
) -> None:
    """A float32 Mixtral of bf16 values: under `auto` its expert stacks run as bf16 too — coded (bf16z) where
    the library decodes that, else the bf16 values stored —, the bytes `--quantize bf16` stacks, with its
    logits bit for bit at chunks and decode steps."""
    monkeypatch.setattr("blazr.loading.quantize.kernel_prefill_f32", lambda: True)  # whatever tuning chose
    monkeypatch.setenv("BLAZR_CODED", codes)
    path = tmp_path / "mixtral"
    _bf16_valued("MixtralForCausalLM", path, hidden_size=512, intermediate_size=512, num_local_experts=4,
                 num_experts_per_tok=2, vocab_size=64)  # fmt: skip
    want = "bf16z" if codes == "1" and coded.decodes(ops.kernels()) else "bf16"
    made, twin = _load(path, "auto"), _load(path, "bf16")
    for a, b in zip(_experts(made), _experts(twin), strict=True):
        assert a.w_up.kind == a.w_down.kind == b.w_up.kind == want
        assert torch.equal(a.w_up.data, b.w_up.data) and torch.equal(a.w_down.data, b.w_down.data)
    batch = prompts([13, 9], seed=3, vocab=64)
    plan = [[len(p) - 3] + [1] * 3 for p in batch]
    _same_logits(made, twin, batch, plan)


def test_a_cached_f32z_copy_of_bf16_values_is_made_again_as_bf16z(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The quantization cache is asked for the best coded kind only: a float32 checkpoint of bf16 values
    whose cached copy is f32z (made while bf16z was not wanted, as a version before bf16z coding of float32
    weights made it) is coded again as bf16z, and the load after that maps the bf16z copy."""
    monkeypatch.setenv("BLAZR_QUANT_CACHE", str(tmp_path / "qcache"))
    monkeypatch.setattr("blazr.loading.quantize.kernel_prefill_f32", lambda: True)  # whatever tuning chose
    path = tmp_path / "llama"
    _bf16_valued("LlamaForCausalLM", path, hidden_size=512, intermediate_size=1024, vocab_size=64)
    with monkeypatch.context() as m:
        m.setattr(coded, "wanted", lambda kind, k: kind == "f32")
        assert {x.kind for x in _linears(_load(path, "auto")).values()} == {"f32z"}
    monkeypatch.setattr(coded, "wanted", lambda kind, k: True)
    made = _load(path, "auto")
    assert {x.kind for x in _linears(made).values()} == {"bf16z"}
    _no_pack(monkeypatch)
    again = _load(path, "auto")
    for name, x in _linears(again).items():
        assert x.kind == "bf16z" and torch.equal(x.qweight.data, _linears(made)[name].qweight.data), name
