"""Quantized linear weights: GGUF block tensors kept as stored (byte for byte, fused and un-permuted
correctly), in-situ quantization of float checkpoints (`quantize="int8" | "int4"`) with its accuracy cost
measured against the float model, the kernel and dense paths of QuantizedLinear against the dequantized
fp32 reference, and the engine invariants on a quantized model."""

from __future__ import annotations

from collections import Counter
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from blazr import LLM, SamplingParams
from blazr.errors import BlazrError, UnsupportedError
from blazr.kernels import q8_packed
from blazr.kernels.mapped import MappedWeight
from blazr.kernels.quant import dequantize, quantize
from blazr.loading import quant_cache
from blazr.loading.gguf import GGUFFile
from blazr.loading.loader import prefill_dtype
from blazr.loading.quantize import kernel_prefill_f32
from blazr.model.embedding import QuantizedEmbedding
from blazr.model.moe import Experts
from blazr.model.qlinear import QuantizedLinear
from tests.drive import assert_logits_close, chunked, full_logits, stepwise_logits
from tests.gguf_fixtures import write_tiny_llama_gguf
from tests.hf_parity import prompts
from tests.test_gguf import TINY, tiny_state_dict
from tests.test_hf_deepseek import MLA_SIZES, MOE_SIZES
from tests.tiny import build


def mapped_file(address: int) -> str | None:
    """The file mapped at `address` in this process (/proc/self/maps), or None for anonymous memory."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        if lo <= address < hi:
            return fields[5] if len(fields) == 6 and fields[5].startswith("/") else None
    return None


def quantized_layers(llm: LLM) -> dict[str, QuantizedLinear]:
    """The layers whose weights are stored in a kernel format other than the float32 they load in."""
    return {n: m for n, m in llm.model.named_modules() if isinstance(m, QuantizedLinear) and m.kind != "f32"}


# ------------------------------------------------------------------------------------------ GGUF blocks


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
def test_gguf_blocks_kept_as_stored(qtype: str, tmp_path: Path) -> None:
    state = tiny_state_dict(seed=3)
    del state["lm_head.weight"]  # tied: the lm_head is the (quantized) embedding
    path = write_tiny_llama_gguf(tmp_path / "m.gguf", state, {**TINY, "tie_word_embeddings": True}, qtype)
    kept = LLM(path, vocab="cl100k_base", cpu=True, dtype="float32")
    plain = LLM(path, vocab="cl100k_base", cpu=True, dtype="float32", quantize="none")
    layers = quantized_layers(kept)
    want = {f"layers.{i}.{m}" for i in range(2) for m in ("attn.qkv_proj", "attn.o_proj")}
    want |= {f"layers.{i}.mlp.{m}" for i in range(2) for m in ("gate_up_proj", "down_proj")}
    assert set(layers) == want | {"lm_head"}
    assert not quantized_layers(plain)
    for (
        name,
        layer,
    ) in layers.items():  # Q8_0 runs as stored, its linears re-laid where this host runs that faster
        q8 = "q8_0g" if name == "lm_head" else q8_packed.runs_as()
        assert layer.kind == (q8 if qtype == "Q8_0" else qtype.lower())
        ref = plain.model.embed_tokens.weight if name == "lm_head" else plain.model.get_submodule(name).weight
        assert torch.equal(dequantize(layer.qweight), ref), name  # fusion + q/k un-permutation exact
    # an unfused, unpermuted tensor keeps the file's bytes
    raw = GGUFFile(path).raw("blk.1.attn_output.weight")
    assert torch.equal(layers["layers.1.attn.o_proj"].qweight.ggml_blocks(), raw)


def test_gguf_q8_0_runs_as_stored_with_the_packed_logits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Q8_0 GGUF's linears (the tied head too) run as the file stores them (q8_0g) where the host does not
    re-lay them (`BLAZR_Q8PACK=0`): unfused tensors and the head are views of the file's map, no repack; and
    its logits — prompt rows on the kernels and cached decode steps — equal bit for bit those of the same file
    loaded the way it was before, repacked to q8_0, the head on 8-bit x as packed q8_0's
    (`head_precision="int8"`; fp32 x is test_head_precision's), and those of the load that re-lays its
    linears in the row-packed layout (`BLAZR_Q8PACK=1`, kernels/q8_packed.py: every linear but the head q8_0,
    the head still the file's q8_0g bytes) — a fresh load and one that maps the re-laid copy from the
    quantization cache alike."""
    state = tiny_state_dict(seed=5)
    del state["lm_head.weight"]
    path = write_tiny_llama_gguf(tmp_path / "m.gguf", state, {**TINY, "tie_word_embeddings": True}, "Q8_0")
    kw = dict(vocab="cl100k_base", cpu=True, dtype="float32", max_num_seqs=2, head_precision="int8")
    monkeypatch.setenv("BLAZR_QUANT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("BLAZR_Q8PACK", "0")
    stored = LLM(path, **kw)
    layers = quantized_layers(stored)
    assert {m.kind for m in layers.values()} == {"q8_0g"}
    where = str(path.resolve())
    for name in ("lm_head", "layers.0.attn.o_proj", "layers.1.mlp.down_proj"):
        assert mapped_file(layers[name].qweight.data.data_ptr()) == where, name
    with monkeypatch.context() as m:  # the repacking load: Q8_0 kept as its value kind, packed
        m.setattr("blazr.kernels.quant.AS_STORED", {})
        m.setattr("blazr.loading.stored.AS_STORED", {})
        packed = LLM(path, vocab="cl100k_base", cpu=True, dtype="float32", max_num_seqs=2)
    assert {m.kind for m in quantized_layers(packed).values()} == {"q8_0"}
    monkeypatch.setenv("BLAZR_Q8PACK", "1")
    relaid = [LLM(path, **kw)]
    quant_cache.wait()
    with monkeypatch.context() as m:  # the second load maps what the first handed to the cache: no packing
        m.setattr(q8_packed, "pack", lambda qw: pytest.fail("re-laid again, not mapped from the cache"))
        relaid.append(LLM(path, **kw))
    for i, llm in enumerate(relaid):
        layers = quantized_layers(llm)
        kinds = {name: m.kind for name, m in layers.items()}
        assert kinds.pop("lm_head") == "q8_0g" and set(kinds.values()) == {"q8_0"}, kinds
        where = mapped_file(layers["layers.1.mlp.down_proj"].qweight.data.data_ptr()) or ""
        assert where.startswith(str(tmp_path / "cache")) == (i == 1), where
    batch = prompts([5, 12], seed=3, vocab=stored.config.vocab_size)
    chunks = [[1] * 5, [4] + [1] * 8]
    want = full_logits(stored.runner, batch), stepwise_logits(stored, batch, chunks)
    for other in (packed, *relaid):
        for a, b in zip(want[0], full_logits(other.runner, batch), strict=True):
            assert torch.equal(a, b)
        for a, b in zip(want[1], stepwise_logits(other, batch, chunks), strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("qtype", ["F16", "BF16"])
def test_gguf_16bit_tensors_kept_16bit(qtype: str, tmp_path: Path) -> None:
    """`auto` keeps a GGUF's F16 / BF16 matrices as stored: every target linear runs the 16-bit kernel on the
    file's values (fused and un-permuted exactly; an unfused tensor is a view of the file's map, not a
    copy) and the embedding table stays 16-bit too; `none` still loads every weight float32. With a float32
    cache, whole prefill, chunked prefill and cached decode of F16 agree with the float32 model (the same
    values, widened exactly; x stays fp32) within fp32 rounding and give its greedy tokens — the linears sum
    a row the same way in any batch; attention over a cached prefix rounds apart, as the float32 model's
    own schedules do. BF16 the same (its values widened exactly as F16's, kernels/csrc/linear_16bit.c), and
    `--quantize bf16` of those weights gives the kept file's logits bit for bit under every schedule."""
    path = write_tiny_llama_gguf(tmp_path / "m.gguf", tiny_state_dict(seed=6), TINY, qtype)
    kept = LLM(path, vocab="cl100k_base", cpu=True, dtype="float32", kv_cache_dtype="float32")
    plain = LLM(path, vocab="cl100k_base", cpu=True, dtype="float32", quantize="none")
    layers, kind = quantized_layers(kept), qtype.lower()
    assert len(layers) == 2 * 4 + 1 and {m.kind for m in layers.values()} == {kind}
    assert not quantized_layers(plain)
    for name, layer in layers.items():
        assert torch.equal(layer.weight, plain.model.get_submodule(name).weight), name
    table = kept.model.embed_tokens
    assert isinstance(table, QuantizedEmbedding) and table.table.kind == kind
    assert torch.equal(table.weight, plain.model.embed_tokens.weight)

    def in_file(t: torch.Tensor) -> bool:
        return mapped_file(t.data_ptr()) == str(path.resolve())

    assert in_file(layers["layers.1.attn.o_proj"].qweight.data) and in_file(table.table.data)  # in place
    assert not in_file(layers["layers.1.attn.qkv_proj"].qweight.data)  # fused: its rows copied
    batch = prompts([40, 17, 9], seed=7, vocab=kept.config.vocab_size)
    schedules = {
        "whole": [[len(p)] for p in batch],
        "chunks of 5": [chunked(len(p), 5) for p in batch],
        "6 decode steps": [[len(p) - 6] + [1] * 6 for p in batch],
    }
    runs = {name: stepwise_logits(kept, batch, plan) for name, plan in schedules.items()}
    if qtype == "BF16":
        requantized = LLM(path, vocab="cl100k_base", cpu=True, dtype="float32", kv_cache_dtype="float32",
                          quantize="bf16")  # fmt: skip
        for name, plan in schedules.items():
            for got, want in zip(runs[name], stepwise_logits(requantized, batch, plan), strict=True):
                assert torch.equal(got, want), name
    for run in runs.values():
        for got, want in zip(run, full_logits(plain.runner, batch), strict=True):
            assert_logits_close(got, want)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    for p in batch:
        assert (
            kept.generate([p], params)[0].outputs[0].token_ids
            == plain.generate([p], params)[0].outputs[0].token_ids
        )


def test_float_linears_decode_on_the_f32_kernel_without_a_copy(tmp_path: Path) -> None:
    """A float32 model on the CPU: every target linear (and the tied lm_head) becomes an f32 QuantizedLinear
    over the very tensor it loaded — no second copy — whose decode tokens run the C kernel (a row's bits
    whatever else shares the step) and prefill the kernel's panel GEMM on AVX2 hosts, elsewhere torch's
    GEMM on that same tensor; both agree with the plain layer to fp32 rounding."""
    state = tiny_state_dict(seed=5)
    del state["lm_head.weight"]
    path = write_tiny_llama_gguf(tmp_path / "m.gguf", state, {**TINY, "tie_word_embeddings": True}, "F32")
    llm = LLM(path, vocab="cl100k_base", cpu=True, dtype="float32")
    wrapped = {n: m for n, m in llm.model.named_modules() if isinstance(m, QuantizedLinear)}
    assert len(wrapped) == 2 * 4 + 1 and all(m.kind == "f32" for m in wrapped.values())
    lm_head = wrapped.pop("lm_head")
    assert (
        lm_head.qweight.data.data_ptr() == llm.model.embed_tokens.weight.data_ptr() and lm_head.dense is None
    )
    on_panel = kernel_prefill_f32()
    for layer in wrapped.values():
        assert layer.dense is (None if on_panel else layer.qweight.data)
    layer = wrapped["layers.0.mlp.down_proj"]
    x = torch.randn(20, layer.in_features)
    want = x.double() @ layer.qweight.data.double().T
    decoded = layer(x, decode=True)
    assert torch.equal(decoded, torch.cat([layer(x[i : i + 1], decode=True) for i in range(len(x))]))
    torch.testing.assert_close(decoded.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer(x, decode=False).double(), want, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------- QuantizedLinear


@pytest.mark.parametrize("kind", ["q4_0", "q4_1", "q8_0"])
def test_quantized_linear_paths_match_dequantized_reference(kind: str) -> None:
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(96, 128, generator=g) * 0.1, torch.randn(96, generator=g)
    qw = quantize(w, kind)
    ref_w = dequantize(qw)
    layer = QuantizedLinear(qw, b, dense=ref_w.clone())
    x = torch.randn(5, 128, generator=g)
    ref = F.linear(x, ref_w, b)
    torch.testing.assert_close(layer(x, decode=False), ref, rtol=1e-5, atol=1e-5)  # dense fp32 GEMM
    got = layer(x, decode=True)
    # the kernel quantizes activations to 8 bits per block of 32: |Δx| ≤ amax_block / 254 per element
    bound = (x.reshape(5, -1, 32).abs().amax(-1) / 254).repeat_interleave(32, -1) @ ref_w.abs().T
    assert ((got - ref).abs() <= bound + 1e-4).all()
    assert not torch.equal(got, ref)  # really the kernel path
    no_dense = QuantizedLinear(qw, b)  # without a dense copy the kernel always runs
    torch.testing.assert_close(no_dense(x, decode=False), got, rtol=0, atol=0)


@pytest.mark.parametrize("dense_dtype", [torch.float32, torch.bfloat16])
def test_dense_prefill_rows_do_not_depend_on_the_call(dense_dtype: torch.dtype) -> None:
    """The dense GEMM path gives every row the same bits whatever else shares the call — 1 row or 300, at
    any offset — so a prompt's prefill does not depend on the batch it is scheduled in."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(200, 256, generator=g) * 0.1
    qw = quantize(w, "q8_0")
    layer = QuantizedLinear(qw, torch.randn(200, generator=g), dense=dequantize(qw).to(dense_dtype))
    x = torch.randn(300, 256, generator=g)
    whole = layer(x, decode=False)
    for lo, hi in [(0, 1), (5, 6), (3, 7), (10, 21), (0, 16), (17, 150), (200, 300)]:
        assert torch.equal(layer(x[lo:hi], decode=False), whole[lo:hi]), (lo, hi)


# --------------------------------------------------------------------------------- in-situ quantization


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("isq")
    build("LlamaForCausalLM", path, seed=5, tie_word_embeddings=False)
    return path


def _agreement_and_kl(ours: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    top1 = float((ours.argmax(-1) == ref.argmax(-1)).float().mean())
    kl = F.kl_div(ours.log_softmax(-1), ref.log_softmax(-1), log_target=True, reduction="batchmean")
    return top1, float(kl)


def test_int8_linears_follow_the_q8_0_layout_and_change_no_bit(
    tiny_llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--quantize int8` makes its linears in the layout a GGUF's Q8_0 runs as on this host
    (`q8_packed.runs_as`: BLAZR_Q8PACK=1 the row-packed q8_0, =0 ggml's q8_0g), the head q8_0g (its fp32-x
    form); the two layouts give the same logits bit for bit — whole prefill and cached decode — and a load
    whose cache holds the other layout quantizes again rather than map it."""
    monkeypatch.setenv("BLAZR_QUANT_CACHE", str(tmp_path / "cache"))
    kw = dict(cpu=True, dtype="float32", quantize="int8", max_num_seqs=2)
    made = {}
    for form in ("1", "0"):
        monkeypatch.setenv("BLAZR_Q8PACK", form)
        made[form] = LLM(tiny_llama, **kw)
        quant_cache.wait()
        kinds = {name: m.kind for name, m in quantized_layers(made[form]).items()}
        assert kinds.pop("lm_head") == "q8_0g" and set(kinds.values()) == {"q8_0" if form == "1" else "q8_0g"}
    batch = prompts([5, 12], seed=3, vocab=made["1"].config.vocab_size)
    chunks = [[1] * 5, [4] + [1] * 8]
    for a, b in zip(full_logits(made["1"].runner, batch), full_logits(made["0"].runner, batch), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(
        stepwise_logits(made["1"], batch, chunks), stepwise_logits(made["0"], batch, chunks), strict=True
    ):
        assert torch.equal(a, b)


def test_in_situ_quantization_accuracy(tiny_llama: Path) -> None:
    """Random tiny weights are the worst case (no outliers, many near-ties); the real-model numbers are in
    test_smollm2.py. Here: int8 ≈ float, int4 visibly worse but still correlated, both really quantized."""
    ref_llm = LLM(tiny_llama, cpu=True, dtype="float32", quantize="none")
    batch = prompts([40, 64, 25], seed=6, vocab=ref_llm.config.vocab_size)
    ref = torch.cat(full_logits(ref_llm.runner, batch))
    measured = {}
    for mode, kinds in (("int8", {"q8_0g", q8_packed.runs_as()}), ("int4", {"q4_1"})):
        q_llm = LLM(tiny_llama, cpu=True, dtype="float32", quantize=mode)
        layers = quantized_layers(q_llm)  # int8: the head q8_0g, the rest as a GGUF's Q8_0 runs here
        assert len(layers) == 2 * 4 + 1 and {m.kind for m in layers.values()} == kinds
        measured[mode] = _agreement_and_kl(torch.cat(full_logits(q_llm.runner, batch)), ref)
    (top1_8, kl_8), (top1_4, kl_4) = measured["int8"], measured["int4"]
    assert top1_8 >= 0.9 and 0 < kl_8 <= 2e-3, measured
    assert top1_4 >= 0.35 and kl_8 * 10 < kl_4 <= 0.2, measured


@pytest.mark.parametrize("tied", [False, True])
def test_in_situ_quantization_keeps_no_float_table(tied: bool, tmp_path: Path) -> None:
    """`--quantize int8 / int4 / bf16` keeps no float32 token table: a QuantizedEmbedding of Q8_0 rows (in
    the 4-bit mode too) — the quantizer's bytes of the float table, in ggml's row order — or of the bf16
    values; a tied head is still the table quantized to the mode's kind, whatever the table's kind (under
    `int8` the table's own bytes)."""
    build("LlamaForCausalLM", tmp_path, seed=8, tie_word_embeddings=tied)
    float_table = LLM(tmp_path, cpu=True, dtype="float32", quantize="none").model.embed_tokens.weight
    for mode, head in (("int8", "q8_0g"), ("int4", "q4_1"), ("bf16", "bf16")):
        llm = LLM(tmp_path, cpu=True, dtype="float32", quantize=mode)
        table = llm.model.embed_tokens
        assert isinstance(table, QuantizedEmbedding), mode
        if mode == "bf16":
            assert table.table.kind == "bf16" and torch.equal(table.weight, float_table.bfloat16().float())
        else:
            assert table.table.kind == "q8_0"
            assert torch.equal(table.table.data, quantize(float_table, "q8_0").ggml_blocks())
        lm_head = llm.model.lm_head
        assert isinstance(lm_head, QuantizedLinear) and lm_head.kind == head
        if tied:
            assert torch.equal(lm_head.qweight.data, quantize(float_table, head).data), mode
            # int8's q8_0g head is the table's own Q8_0 rows (one copy, as a Q8_0 GGUF's tied head)
            shares = lm_head.qweight.data.data_ptr() == table.table.data.data_ptr()
            assert shares == (mode == "int8"), mode


def test_bf16_checkpoint_runs_as_stored(tmp_path: Path) -> None:
    """`--quantize bf16` on a checkpoint stored bf16 reads no weight into a tensor of its own: gate|up
    (HF stores gate_proj and up_proj back to back) and the single-tensor weights are views of the file's
    map, q|k|v (stored apart) a MappedWeight — its rows read where the map has them, through a row table —
    with the same values, and the same logits (decode, the row walk, the tiles and the GEMM), as the float32
    copy of the checkpoint rounded to bf16 at load."""
    model = build("LlamaForCausalLM", tmp_path / "f32", seed=9)
    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    llm = LLM(tmp_path / "bf16", cpu=True, dtype="float32", quantize="bf16")
    layers = quantized_layers(llm)
    hf = model.model.layers
    for i in range(len(hf)):
        att, mlp = hf[i].self_attn, hf[i].mlp
        qkv = layers[f"layers.{i}.attn.qkv_proj"].qweight
        assert isinstance(qkv, MappedWeight) and qkv._gathered is None  # type: ignore[attr-defined]
        gate_up = layers[f"layers.{i}.mlp.gate_up_proj"].qweight.data
        down = layers[f"layers.{i}.mlp.down_proj"].qweight.data
        in_map = [mapped_file(a) for a in (int(qkv.rows.min()), gate_up.data_ptr(), down.data_ptr())]
        assert all(f and f.endswith("model.safetensors") for f in in_map), in_map
        assert torch.equal(qkv.data, torch.cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight]))
        assert torch.equal(gate_up, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
    ref = LLM(tmp_path / "f32", cpu=True, dtype="float32", quantize="bf16")
    batch = prompts([9, 30], seed=2, vocab=llm.config.vocab_size)
    for got, want in zip(full_logits(llm.runner, batch), full_logits(ref.runner, batch), strict=True):
        assert torch.equal(got, want)
    for n in (1, 3, 10):  # token by token: one decode row (streams), the row walk, the tiles
        batch = prompts([5] * n, seed=3, vocab=llm.config.vocab_size)
        steps = [[1] * 5] * n
        want = stepwise_logits(ref, batch, steps)
        for got, w in zip(stepwise_logits(llm, batch, steps), want, strict=True):
            assert torch.equal(got, w)


def _record_call(calls: list, module: torch.nn.Module, args: tuple, out: torch.Tensor) -> None:
    calls.append((args[0].detach().clone(), out.detach()))


def test_head_precision(tmp_path: Path) -> None:
    """A Q8_0 GGUF's tied head on fp32 x gives the float product of its (exactly widened) weights with the
    hidden states, where the 8-bit form is further; `auto` takes fp32 only where a head call holds at most
    two rows (one sequence, or two; not with speculative drafts), and a head of another format stays as it
    is; the fp32 head's decode steps give the whole prefill's bits (one form for every batch)."""
    state = tiny_state_dict(seed=6)
    del state["lm_head.weight"]
    path = write_tiny_llama_gguf(tmp_path / "m.gguf", state, {**TINY, "tie_word_embeddings": True}, "Q8_0")
    kw = {"vocab": "cl100k_base", "cpu": True, "dtype": "float32"}
    assert LLM(path, **kw, max_num_seqs=1).model.lm_head.exact_x
    assert LLM(path, **kw, max_num_seqs=2).model.lm_head.exact_x
    assert not LLM(path, **kw, max_num_seqs=3).model.lm_head.exact_x
    assert not LLM(path, **kw, max_num_seqs=1, speculative="ngram").model.lm_head.exact_x
    assert LLM(path, **kw, max_num_seqs=16, head_precision="fp32").model.lm_head.exact_x
    four = write_tiny_llama_gguf(tmp_path / "q4.gguf", state, {**TINY, "tie_word_embeddings": True}, "Q4_0")
    assert not LLM(four, **kw, max_num_seqs=1).model.lm_head.exact_x  # q4_0 has no fp32-x form
    batch = prompts([9, 14], seed=2, vocab=TINY["vocab_size"])
    errors = {}
    for mode in ("fp32", "int8"):
        llm = LLM(path, **kw, max_num_seqs=2, head_precision=mode)
        head, seen = llm.model.lm_head, []
        hook = head.register_forward_hook(partial(_record_call, seen))
        full_logits(llm.runner, batch)
        hook.remove()
        w = dequantize(head.qweight).double()
        errors[mode] = max(float((y.double() - x.double() @ w.T).abs().max()) for x, y in seen)
        if mode == "fp32":
            whole = stepwise_logits(llm, batch, [[len(p)] for p in batch])
            steps = stepwise_logits(llm, batch, [[len(p) - 4] + [1] * 4 for p in batch])
            for a, b in zip(steps, whole, strict=True):
                assert torch.equal(a, b)
    assert errors["fp32"] < 1e-4 < errors["int8"], errors


def test_in_situ_quantization_invariants(tiny_llama: Path) -> None:
    """Where prefill runs the quantized kernels (no dense copy: CPUs with AVX512-VNNI but no AMX), prefill
    and decode share one integer algorithm and every kernel computes a row independently of its batch, so
    with a float32 cache chunked prefill (7, 64), whole prefill and cached decode give the cacheless
    forward's logits bit for bit. A float16 cache (the default with quantized weights) stores K/V rounded:
    every cached schedule still agrees with every other exactly, and with the cacheless forward (which
    attends to unrounded K/V) within fp16 rounding amplified by the 8-bit activations (~0.1 of this random
    model's logit scale). With a bf16 dense
    prefill copy (AMX CPUs) chunked == whole holds to bf16 precision and decode (8-bit activations on the
    kernels) to ~0.1 of this random model's logit scale."""
    for kv in ("float32", "float16"):
        llm = LLM(tiny_llama, cpu=True, dtype="float32", quantize="int4", kv_cache_dtype=kv)
        assert llm.runner.cache.layer(0).k.dtype == getattr(torch, kv)
        batch = prompts([70, 33, 12], seed=4, vocab=llm.config.vocab_size)
        ref = full_logits(llm.runner, batch)
        schedules = {
            "whole": [[len(p)] for p in batch],
            "chunks of 7": [chunked(len(p), 7) for p in batch],
            "chunks of 64": [chunked(len(p), 64) for p in batch],
            "8 decode steps": [[len(p) - 8] + [1] * 8 for p in batch],
        }
        runs = {name: stepwise_logits(llm, batch, plan) for name, plan in schedules.items()}
        if llm.model.layers[0].attn.qkv_proj.dense is None:
            for name, run in runs.items():
                for got, whole in zip(run, runs["whole"], strict=True):
                    assert torch.equal(got, whole), (kv, name)
            for got, want in zip(runs["whole"], ref, strict=True):
                if kv == "float32":
                    assert torch.equal(got, want)
                else:  # measured 0.10: fp16 rounding of K/V flips some 8-bit activation roundings
                    assert_logits_close(got, want, 0.2)
        else:
            for name, run in runs.items():
                for got, want in zip(run, ref, strict=True):
                    assert_logits_close(got, want, 0.2 if "decode" in name else 5e-2)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    alone = [llm.generate([p], params)[0].outputs[0].token_ids for p in batch]
    assert [r.outputs[0].token_ids for r in llm.generate(batch, params)] == alone


def test_dense_prefill_copies(tiny_llama: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With dense copies for prefill GEMMs (`BLAZR_PREFILL_DENSE=bfloat16`), every quantized layer gets one
    except the lm_head, whose logits must stay fp32: the prompt's logits equal the kernel path's."""
    plain = LLM(tiny_llama, cpu=True, dtype="float32", quantize="int8")
    monkeypatch.setenv("BLAZR_PREFILL_DENSE", "bfloat16")
    dense = LLM(tiny_llama, cpu=True, dtype="float32", quantize="int8")
    layers = quantized_layers(dense)
    assert layers["lm_head"].dense is None
    assert all(
        m.dense is not None and m.dense.dtype == torch.bfloat16 for n, m in layers.items() if n != "lm_head"
    )
    hidden = torch.randn(3, dense.config.hidden_size)
    torch.testing.assert_close(
        dense.model.compute_logits(hidden, decode=False),
        plain.model.compute_logits(hidden, decode=False),
        rtol=0,
        atol=0,
    )


@pytest.mark.parametrize(
    "env, dtype",
    [("", None), ("none", None), ("bfloat16", torch.bfloat16), (" Float32 ", torch.float32)],
)
def test_prefill_dtype_is_opt_in(env: str, dtype: torch.dtype | None, monkeypatch) -> None:
    """No dense prefill tensor unless asked for, AMX CPUs included (issue 14: RSS near the file, load without
    a float pass; a bf16 GEMM's outputs are bf16); a wrong value is a clear error."""
    monkeypatch.setenv("BLAZR_PREFILL_DENSE", env)
    assert prefill_dtype() == dtype
    monkeypatch.setenv("BLAZR_PREFILL_DENSE", "bf16")
    with pytest.raises(UnsupportedError, match="expected none, float32 or bfloat16"):
        prefill_dtype()


def test_default_load_has_no_dense_tensors(tiny_llama: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """By default no layer holds a dense prefill tensor: int8 layers prefill on their kernels, bf16 layers
    on the bf16 kernel (fp32 outputs, as decode's). Opted in to bf16, a bf16 layer's dense tensor is its
    own weight (no second copy)."""
    monkeypatch.delenv("BLAZR_PREFILL_DENSE", raising=False)
    for mode in ("int8", "bf16"):
        layers = quantized_layers(LLM(tiny_llama, cpu=True, dtype="float32", quantize=mode))
        assert layers and all(m.dense is None for m in layers.values()), mode
    monkeypatch.setenv("BLAZR_PREFILL_DENSE", "bfloat16")
    bf16 = quantized_layers(LLM(tiny_llama, cpu=True, dtype="float32", quantize="bf16"))
    others = [m for n, m in bf16.items() if n != "lm_head"]
    assert bf16["lm_head"].dense is None
    assert others and all(m.kind == "bf16" and m.dense is m.qweight.data for m in others)


@pytest.mark.parametrize(
    "arch, overrides",
    [
        ("MixtralForCausalLM", dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=64)),
        ("DeepseekV3ForCausalLM", dict(MLA_SIZES, **MOE_SIZES, q_lora_rank=48, n_group=2, topk_group=1)),
    ],
    ids=["mixtral", "deepseek-v3"],
)
def test_in_situ_quantized_experts(
    tmp_path: Path, arch: str, overrides: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--quantize int8` stacks every layer's routed experts in Q8_0 (their shared experts are quantized
    linears) and drops the float copies: decode runs the chosen experts' quantized rows in the recorded
    plan; the logits are as close to the float model's as those of the same model with only its dense
    layers quantized (tiny random MoE models flip routing at near-ties, so that is the yardstick, measured:
    KL 0.023 vs 0.027 on the DeepSeek one); batched greedy decoding equals each sequence alone."""
    import blazr.loading.loader as loader

    build(arch, tmp_path, seed=3, **overrides)
    ref_llm = LLM(tmp_path, cpu=True, dtype="float32", quantize="none")
    llm = LLM(tmp_path, cpu=True, dtype="float32", quantize="int8")
    experts = [m for m in llm.model.modules() if isinstance(m, Experts)]
    assert experts and all(e.w_up is not None and e.w_up.kind == "q8_0g" for e in experts)
    assert all(not hasattr(e, "down_proj") for e in experts)  # the float copies are gone
    assert llm.runner.decode_plan is not None
    monkeypatch.setattr(loader, "stack_experts", lambda *args: Counter())
    dense_only = LLM(tmp_path, cpu=True, dtype="float32", quantize="int8")
    assert all(e.w_up is None for e in dense_only.model.modules() if isinstance(e, Experts))
    batch = prompts([40, 25], seed=6, vocab=llm.config.vocab_size)
    want = torch.cat(full_logits(ref_llm.runner, batch))
    top1, kl = _agreement_and_kl(torch.cat(full_logits(llm.runner, batch)), want)
    top1_dense, kl_dense = _agreement_and_kl(torch.cat(full_logits(dense_only.runner, batch)), want)
    assert top1 >= top1_dense - 0.05 and kl <= 1.5 * kl_dense + 1e-3, (top1, kl, top1_dense, kl_dense)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    alone = [llm.generate([p], params)[0].outputs[0].token_ids for p in batch]
    assert [r.outputs[0].token_ids for r in llm.generate(batch, params)] == alone


def test_quantize_needs_cpu_float32(tiny_llama: Path) -> None:
    with pytest.raises(UnsupportedError, match="--quantize int8 runs on blazr's CPU kernels"):
        LLM(tiny_llama, cpu=True, dtype="bfloat16", quantize="int8")
    with pytest.raises(BlazrError, match="unknown quantize mode 'int3'; expected auto, none, int8, int4"):
        LLM(tiny_llama, cpu=True, quantize="int3")


def test_in_situ_int8_of_deepseek_reorders_the_rope_rows_by_address(tmp_path: Path) -> None:
    """DeepSeek's q and kv_a rows have their rope rows reordered at load (`RowOrder`): under `--quantize int8`
    the C quantizer reads them in that order straight from the file's map, and the bytes are Q8_0 of the
    reordered float weight — the same as quantizing the float model's own (reordered) weight."""
    from blazr.model.mla import MLA

    build("DeepseekV2ForCausalLM", tmp_path, seed=4, **dict(MLA_SIZES, **MOE_SIZES, q_lora_rank=None))
    plain = LLM(tmp_path, cpu=True, dtype="float32", quantize="none")
    ours = LLM(tmp_path, cpu=True, dtype="float32", quantize="int8")
    pairs = [
        (a, b) for a, b in zip(ours.model.modules(), plain.model.modules(), strict=True) if isinstance(a, MLA)
    ]
    assert pairs
    for a, b in pairs:
        for name in ("q_proj", "kv_a_proj"):
            got, float_weight = getattr(a, name), getattr(b, name).weight.detach()
            assert isinstance(got, QuantizedLinear) and got.kind == q8_packed.runs_as(), name
            assert torch.equal(got.qweight.ggml_blocks(), quantize(float_weight, "q8_0g").ggml_blocks()), name
