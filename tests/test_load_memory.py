"""Loading without extra copies and cache pools without zero-fill (issue 14): quantized GGUF tensors go from
the file's bytes to the kernel layout without ever being dequantized, float32 safetensors weights are views
of the file's memory map that outlive the checkpoint object, pools allocated uninitialised (here: filled
with NaN) give the same logits bit for bit, and the cache memory budget sizes the pools, refuses a
max-model-len it cannot hold in one line, and is shown by `blazr info`."""

from __future__ import annotations

import ctypes
import gc
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import blazr.loading.gguf as gguf_mod
from blazr import LLM
from blazr.cli import main
from blazr.errors import BlazrError
from blazr.kernels import q8_packed
from blazr.loading.safetensors import SafetensorsCheckpoint
from blazr.model.embedding import QuantizedEmbedding
from tests.drive import chunked, stepwise_logits
from tests.gguf_fixtures import write_tiny_llama_gguf
from tests.hf_parity import prompts
from tests.test_gguf import TINY, tiny_state_dict
from tests.test_quantize import mapped_file, quantized_layers
from tests.tiny import build


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    build("LlamaForCausalLM", path, seed=2, tie_word_embeddings=False)
    return path


# ----------------------------------------------------------------------------------------- weights


@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0"])
def test_gguf_blocks_are_never_dequantized(
    qtype: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the float tensors (norms) pass through GGUF dequantization; every block tensor of a linear
    reaches its QuantizedLinear as bytes, the embedding table stays as stored (a QuantizedEmbedding whose
    rows are a view of the file), and the weights equal the dequantized model's."""
    path = write_tiny_llama_gguf(tmp_path / "m.gguf", tiny_state_dict(seed=4), TINY, qtype)
    plain = LLM(path, vocab="cl100k_base", cpu=True, dtype="float32", quantize="none")
    seen: list[tuple[str, tuple[int, ...]]] = []
    real = gguf_mod.dequantize

    def spy(raw: torch.Tensor, ggml_type: str, shape: tuple[int, ...]) -> torch.Tensor:
        seen.append((ggml_type, tuple(shape)))
        return real(raw, ggml_type, shape)

    monkeypatch.setattr(gguf_mod, "dequantize", spy)
    kept = LLM(path, vocab="cl100k_base", cpu=True, dtype="float32")
    layers = quantized_layers(kept)
    # Q8_0 runs as stored (its linears re-laid where this host runs that faster, not the head), Q4_0 packed
    kind = q8_packed.runs_as() if qtype == "Q8_0" else qtype.lower()
    assert len(layers) == 2 * 4 + 1
    assert {m.kind for n, m in layers.items() if n != "lm_head"} == {kind}
    assert layers["lm_head"].kind == ("q8_0g" if qtype == "Q8_0" else kind)
    assert not [shape for t, shape in seen if t == qtype]  # not even the lookup table
    table = kept.model.embed_tokens
    assert isinstance(table, QuantizedEmbedding) and table.table.kind == qtype.lower()
    assert mapped_file(table.table.data.data_ptr()) == str(path.resolve())
    assert torch.equal(table.weight, plain.model.embed_tokens.weight)
    for name, layer in layers.items():
        assert torch.equal(layer.weight, plain.model.get_submodule(name).weight), name
    if qtype == "Q8_0":  # unfused tensors and the head: views of the file's map, never repacked (as stored)
        unfused = ("layers.0.attn.o_proj", "layers.1.mlp.down_proj") if kind == "q8_0g" else ()
        for name in ("lm_head", *unfused):
            assert mapped_file(layers[name].qweight.data.data_ptr()) == str(path.resolve()), name


def test_float32_safetensors_alias_the_file(tiny_llama: Path) -> None:
    """A float32 tensor loaded as float32 is a view of the file's private map: no copy; it stays valid
    after the checkpoint object is closed and collected, and writing to it never reaches the file."""
    files = [tiny_llama / "model.safetensors"]
    ckpt = SafetensorsCheckpoint(files)
    name = "model.embed_tokens.weight"
    alias = ckpt.load(name, torch.float32, alias=True)
    copy = ckpt.load(name, torch.float32)
    assert mapped_file(alias.data_ptr()) == str(files[0].resolve())
    assert mapped_file(copy.data_ptr()) != str(files[0].resolve())
    ckpt.close()
    del ckpt
    gc.collect()
    assert torch.equal(alias, copy)
    alias[0, 0] = 123.0  # copy-on-write: this process's page only
    assert SafetensorsCheckpoint(files).load(name)[0, 0] == copy[0, 0]


def test_loaded_model_keeps_its_mapped_weights(tiny_llama: Path) -> None:
    """The loaded float32 model's weights live in the file's map (the loader's source is gone by then) and
    give the same logits as a second load."""
    llm = LLM(tiny_llama, cpu=True, dtype="float32", quantize="none")
    gc.collect()
    file = str((tiny_llama / "model.safetensors").resolve())
    assert mapped_file(llm.model.embed_tokens.weight.data_ptr()) == file
    batch = [[3, 1, 4, 1, 5, 9, 2, 6]]
    first = stepwise_logits(llm, batch, [[8]])[0]
    again = LLM(tiny_llama, cpu=True, dtype="float32", quantize="none")
    assert torch.equal(first, stepwise_logits(again, batch, [[8]])[0])


def test_row_addresses_and_release(tmp_path: Path) -> None:
    """`row_addresses` points at each row of a tensor in the file's map (what the C quantizer reads in
    place); `release` drops the tensor's pages from this process's resident set (and they read back the
    same), leaving a neighbouring tensor's alone."""
    g = torch.Generator().manual_seed(0)
    tensors = {"a": torch.randn(512, 1024, generator=g).bfloat16(), "b": torch.randn(64, 256, generator=g)}
    save_file(tensors, tmp_path / "m.safetensors")
    ckpt = SafetensorsCheckpoint([tmp_path / "m.safetensors"])
    dtype_name, rows = ckpt.row_addresses("a")
    assert dtype_name == "BF16" and rows.shape == (512,)
    for i in (0, 1, 511):
        row = ctypes.string_at(int(rows[i]), 1024 * 2)
        assert torch.equal(torch.frombuffer(bytearray(row), dtype=torch.bfloat16), tensors["a"][i])
    view = ckpt.load("a", torch.bfloat16, alias=True)
    assert view.data_ptr() == int(rows[0])
    assert torch.equal(view, tensors["a"])  # every page of "a" is now resident in this process
    before = _resident_kib(int(rows[0]))
    ckpt.release("a")
    after = _resident_kib(int(rows[0]))
    assert before - after >= 512 * 1024 * 2 // 1024 - 8  # the whole pages of its 1 MiB (KiB)
    assert torch.equal(view, tensors["a"]) and torch.equal(ckpt.load("b"), tensors["b"])


def _resident_kib(address: int) -> int:
    """Rss (KiB) of the mapping at `address` in this process (/proc/self/smaps)."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(lines):
        fields = line.split()
        if "-" in fields[0] and len(fields[0].split("-")) == 2 and ":" not in fields[0]:
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                for entry in lines[i + 1 :]:
                    if entry.startswith("Rss:"):
                        return int(entry.split()[1])
    raise AssertionError(f"no mapping at {address:#x}")


# ------------------------------------------------------------------------------------------- pools


def _nan_fill(llm: LLM) -> None:
    for t in llm.runner.cache.paged + llm.runner.cache.state:
        t.fill_(float("nan"))


SCHEDULES = {
    "whole": lambda n: [n],
    "chunks of 5": lambda n: chunked(n, 5),
    "6 decode steps": lambda n: [n - 6] + [1] * 6,
}


def _check_nan_pools(make: callable, vocab: int) -> None:
    """Every schedule (prefill, chunked prefill, decode steps mixed with prefills) on NaN-filled pools
    gives the logits of zero-filled pools, bit for bit."""
    batch = prompts([23, 11, 17], seed=3, vocab=vocab)
    zero, nan = make(), make()
    for t in zero.runner.cache.paged + zero.runner.cache.state:
        t.zero_()
    _nan_fill(nan)
    for name, schedule in SCHEDULES.items():
        plan = [schedule(len(p)) for p in batch]
        plan[1] = [len(batch[1])]  # one whole prompt beside the others' decode steps
        want = stepwise_logits(zero, batch, plan)
        got = stepwise_logits(nan, batch, plan)
        for g, w in zip(got, want, strict=True):
            assert not g.isnan().any(), name
            assert torch.equal(g, w), name


def test_cpu_pools_are_not_zero_filled(tiny_llama: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from blazr.detect import inspect_checkpoint
    from blazr.model.mixers import cache_layout
    from blazr.state.kv_cache import ModelCache

    layout = cache_layout(inspect_checkpoint(tiny_llama).config)

    def no_zeros(*args: object, **kwargs: object) -> torch.Tensor:
        raise AssertionError("a CPU cache pool was zero-filled")

    monkeypatch.setattr(torch, "zeros", no_zeros)
    cache = ModelCache(layout, 4096, 2, torch.float32, "cpu")
    assert cache.nbytes() == 2 * 2 * 4096 * 2 * 32 * 4


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_nan_filled_pools_give_identical_logits(tiny_llama: Path, dtype: str) -> None:
    """float32: the kernel decode path; bfloat16: torch attention over padded, masked kv_indices."""
    _check_nan_pools(lambda: LLM(tiny_llama, cpu=True, dtype=dtype, max_num_seqs=4), 1024)


def test_nan_filled_state_slots_give_identical_logits(tmp_path: Path) -> None:
    """A hybrid (Mamba2 + attention): recurrent-state slots start from garbage too."""
    from tests.test_hf_bamba import ARCH, VARIANTS

    build(ARCH, tmp_path, seed=1, **VARIANTS["mamba-attn-mamba"])
    _check_nan_pools(lambda: LLM(tmp_path, cpu=True, dtype="float32", max_num_seqs=4), 1024)


# ------------------------------------------------------------------------------------------ budget


def test_budget_sizes_the_pools(tiny_llama: Path) -> None:
    from blazr.model.mixers import cache_layout

    llm = LLM(tiny_llama, cpu=True, dtype="float32", max_model_len=256, max_num_seqs=8, cache_memory=0.001)
    per_token = cache_layout(llm.config).bytes_per_token(torch.float32, llm.kv_dtype)
    plan = llm.runner.cache_plan
    assert plan.budget == int(0.001 * 2**30) and not plan.is_auto_budget
    # fewer than all at full length; one block more is reserved for graph padding
    assert plan.num_tokens == (plan.budget // (per_token * 16) - 1) * 16 < 8 * 256
    assert llm.runner.cache.nbytes() == plan.bytes <= plan.budget
    assert "of a 0.00 GiB budget (--cache-memory)" in plan.describe()
    roomy = LLM(tiny_llama, cpu=True, dtype="float32", max_model_len=256, max_num_seqs=8)
    assert roomy.runner.cache_plan.is_auto_budget and roomy.runner.cache_plan.num_tokens == 8 * 256


def test_budget_too_small_for_one_sequence(tiny_llama: Path) -> None:
    with pytest.raises(
        BlazrError,
        match=r"cache memory budget 0\.00 GiB cannot hold one sequence of --max-model-len 512 .*"
        r"lower --max-model-len or raise --cache-memory",
    ):
        LLM(tiny_llama, cpu=True, dtype="float32", max_model_len=512, cache_memory=1e-5)


def test_info_shows_the_budget(tiny_llama: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "--model", str(tiny_llama), "--cache-memory", "2", "--max-model-len", "128"]) == 0
    budget = json.loads(capsys.readouterr().out)["cache"]["budget"]
    per_token = 2 * 2 * 2 * 32 * 4  # layers × (K, V) × kv heads × head dim × fp32
    assert budget == {
        "memory_gib": 2.0,
        "source": "--cache-memory",
        "max_model_len": 128,
        "max_num_seqs": 16,
        "tokens": 2 * 2**30 // per_token,
        "full_length_sequences": 2 * 2**30 // (per_token * 128),
    }
    assert main(["info", "--model", str(tiny_llama)]) == 0
    auto = json.loads(capsys.readouterr().out)["cache"]["budget"]
    assert auto["source"] == "0.5 of available" and auto["memory_gib"] > 0
