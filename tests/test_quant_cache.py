"""The quantization cache (loading/quant_cache.py): the first `--quantize int8 / int4 / bf16` load of a float
checkpoint writes its quantized weights to a file; every later load maps that file — the same bytes, no
checkpoint weight read, no quantizer run —; a changed checkpoint, kernel library or kind is a new key or a
miss; a damaged file is a warning and is rewritten; the dir stays under its cap and a write leaves the disk
its free floor; `off` writes nothing."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import blazr.loading.quantize as quantize_mod
from blazr import LLM, SamplingParams
from blazr.kernels import build as kernel_build
from blazr.kernels.quant import QuantizedWeight, quantize
from blazr.loading import quant_cache
from blazr.loading.quant_cache import QuantCache
from blazr.model.embedding import QuantizedEmbedding
from blazr.model.moe import Experts
from tests.drive import full_logits
from tests.hf_parity import prompts
from tests.test_quantize import mapped_file, quantized_layers
from tests.tiny import build


@pytest.fixture()
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "qcache"
    monkeypatch.setenv("BLAZR_QUANT_CACHE", str(path))
    return path


def _weights(llm: LLM) -> dict[str, torch.Tensor]:
    """Every weight made at load in a kernel format, by module name: quantized linears, the token table,
    stacked experts."""
    found = {name: m.qweight.data for name, m in quantized_layers(llm).items()}
    for name, m in llm.model.named_modules():
        if isinstance(m, QuantizedEmbedding):
            found[name] = m.table.data
        elif isinstance(m, Experts) and m.w_up is not None:
            found[f"{name}.up"], found[f"{name}.down"] = m.w_up.data, m.w_down.data
    return found


def _load(path: Path, mode: str) -> LLM:
    llm = LLM(path, cpu=True, dtype="float32", quantize=mode)
    quant_cache.wait()
    return llm


def _no_quantizing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any quantization at load fail: a load that passes took every weight from the cache."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a weight was quantized although the cache held it")

    monkeypatch.setattr(quantize_mod, "quantized_in_place", refuse)
    monkeypatch.setattr(quantize_mod, "quantize", refuse)
    monkeypatch.setattr(quantize_mod, "bf16_as_stored", refuse)


@pytest.mark.parametrize("mode", ["int8", "int4", "bf16"])
@pytest.mark.parametrize("tied", [False, True])
def test_a_second_load_maps_the_first_loads_weights(
    mode: str, tied: bool, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first load writes one file; the second takes every weight the first made from it (a view of the
    file's map, no quantizer run), the same bytes, and the same logits and greedy tokens. bf16 of a
    float32 checkpoint is a conversion, so it is cached too; `int8`'s tied head still shares the table."""
    build("LlamaForCausalLM", tmp_path / "ckpt", seed=11, tie_word_embeddings=tied)
    first = _load(tmp_path / "ckpt", mode)
    files = list(cache_dir.glob("*.blzq"))
    assert len(files) == 1 and mode in files[0].name
    _no_quantizing(monkeypatch)
    second = _load(tmp_path / "ckpt", mode)
    made, mapped = _weights(first), _weights(second)
    assert made.keys() == mapped.keys() and len(made) == 2 * 4 + 2
    for name, data in mapped.items():
        assert mapped_file(data.data_ptr()) == str(files[0]), name
        assert torch.equal(data, made[name]), name
        assert mapped_file(made[name].data_ptr()) is None, name  # the first load's: fresh memory
    if tied and mode == "int8":
        assert second.model.lm_head.qweight.data.data_ptr() == second.model.embed_tokens.table.data.data_ptr()
    batch = prompts([30, 17], seed=4, vocab=first.config.vocab_size)
    for a, b in zip(full_logits(first.runner, batch), full_logits(second.runner, batch), strict=True):
        assert torch.equal(a, b)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    assert [r.outputs[0].token_ids for r in second.generate(batch, params)] == [
        r.outputs[0].token_ids for r in first.generate(batch, params)
    ]
    assert list(cache_dir.glob("*.blzq")) == files  # nothing new to write


def test_stacked_experts_come_from_the_cache(tmp_path: Path, cache_dir: Path, monkeypatch) -> None:
    """A MoE checkpoint's routed experts, quantized and stacked per layer, are cached like any linear."""
    build("MixtralForCausalLM", tmp_path / "ckpt", seed=3, num_local_experts=8, num_experts_per_tok=2,
          intermediate_size=64)  # fmt: skip
    first = _load(tmp_path / "ckpt", "int8")
    _no_quantizing(monkeypatch)
    second = _load(tmp_path / "ckpt", "int8")
    made, mapped = _weights(first), _weights(second)
    assert sum(".up" in n for n in mapped) == 2 and made.keys() == mapped.keys()
    assert all(torch.equal(made[n], mapped[n]) for n in made)
    batch = prompts([21], seed=2, vocab=first.config.vocab_size)
    assert torch.equal(full_logits(first.runner, batch)[0], full_logits(second.runner, batch)[0])


def test_a_ggufs_k_quants_re_laid_at_load_come_from_the_cache(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under `auto`, the K-quants a load re-lays in 16-row groups (kernels/kquant_packed.py, BLAZR_KPACK=1
    over host tuning's choice) are cached as quantized weights are: the second load maps every one from the
    file (no pack run, nothing else cached), the same bytes and logits. Where the library has no group path
    for Q4_K (the scalar build) nothing is re-laid and nothing written."""
    from blazr.kernels import kquant_packed, ops
    from tests.gguf_fixtures import hf_to_gguf_name, write_random_block_llama_gguf
    from tests.test_gguf import TINY, tiny_state_dict

    monkeypatch.setenv("BLAZR_KPACK", "1")
    cfg = {**TINY, "hidden_size": 256, "intermediate_size": 512, "vocab_size": 64}  # K % 256 == 0
    state = dict(sorted(tiny_state_dict(cfg=cfg).items(), key=lambda item: hf_to_gguf_name(item[0], 2)))
    path = write_random_block_llama_gguf(tmp_path / "m.gguf", state, cfg, "Q4_K")
    first = _load(path, "auto")
    files = list(cache_dir.glob("*.blzq"))
    made = _weights(first)
    relaid = {n for n, m in quantized_layers(first).items() if m.kind in kquant_packed.BASE_OF}
    if not kquant_packed.packs_on("q4_k", ops.kernels().features):  # the scalar build
        assert not relaid and files == []
        return
    # q|k|v, o, gate|up (packed from its row table), down, and the tied head: every linear
    assert len(relaid) == 4 * 2 + 1 and len(files) == 1 and "-auto-" in files[0].name, (relaid, files)

    def refuse(*args: object) -> None:
        raise AssertionError("a weight was re-laid although the cache held it")

    monkeypatch.setattr(kquant_packed, "pack", refuse)
    second = _load(path, "auto")
    mapped = _weights(second)
    for name in relaid:
        assert mapped_file(mapped[name].data_ptr()) == str(files[0]), name
        assert torch.equal(mapped[name], made[name]), name
    assert all(mapped_file(mapped[n].data_ptr()) != str(files[0]) for n in mapped.keys() - relaid)
    batch = prompts([30, 17], seed=4, vocab=cfg["vocab_size"])
    for a, b in zip(full_logits(first.runner, batch), full_logits(second.runner, batch), strict=True):
        assert torch.equal(a, b)
    assert list(cache_dir.glob("*.blzq")) == files  # nothing new to write


def test_a_changed_checkpoint_is_a_new_key(tmp_path: Path, cache_dir: Path, monkeypatch) -> None:
    """Rewriting the checkpoint (same names, same shapes, other values) changes the key: the load quantizes
    the new weights — equal to a load with the cache off — and a second file appears."""
    ckpt = tmp_path / "ckpt"
    build("LlamaForCausalLM", ckpt, seed=1)
    _load(ckpt, "int8")
    build("LlamaForCausalLM", ckpt, seed=2)
    new = _weights(_load(ckpt, "int8"))
    assert len(list(cache_dir.glob("*.blzq"))) == 2
    monkeypatch.setenv("BLAZR_QUANT_CACHE", "off")
    plain = _weights(LLM(ckpt, cpu=True, dtype="float32", quantize="int8"))
    assert all(torch.equal(new[n], plain[n]) for n in plain)


def test_the_key_covers_mode_library_and_contents(tmp_path: Path, monkeypatch) -> None:
    build("LlamaForCausalLM", tmp_path, seed=1)
    files = [tmp_path / "model.safetensors"]
    key = quant_cache.cache_key(files, "int8")
    assert quant_cache.cache_key(files, "int8") == key
    assert quant_cache.cache_key(files, "int4") != key
    monkeypatch.setattr(kernel_build, "loaded_name", lambda: "kernels-0000000000000000.so")
    assert quant_cache.cache_key(files, "int8") != key
    monkeypatch.undo()
    stat = files[0].stat()
    data = bytearray(files[0].read_bytes())
    data[len(data) // 2] ^= 1  # one bit of the weights, the size and mtime kept
    files[0].write_bytes(bytes(data))
    os.utime(files[0], ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert quant_cache.cache_key(files, "int8") != key


@pytest.mark.parametrize("damage", ["truncated", "magic", "index", "empty"])
def test_a_damaged_file_is_a_warning_then_rewritten(
    damage: str, tmp_path: Path, cache_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = tmp_path / "ckpt"
    build("LlamaForCausalLM", ckpt, seed=6)
    want = _weights(_load(ckpt, "int8"))
    (path,) = cache_dir.glob("*.blzq")
    data = path.read_bytes()
    broken = {
        "truncated": data[: len(data) // 2],
        "magic": b"NOTBLZQ!" + data[8:],
        "index": data[:-40] + b"}" * 40,
        "empty": b"",
    }[damage]
    path.write_bytes(broken)
    with caplog.at_level(logging.WARNING, logger="blazr"):
        got = _weights(_load(ckpt, "int8"))
    assert "quantization cache" in caplog.text and ("damaged" in caplog.text or "unreadable" in caplog.text)
    assert all(torch.equal(got[n], want[n]) for n in want)
    assert path.read_bytes() == data  # rewritten whole
    hit = _weights(_load(ckpt, "int8"))
    assert all(mapped_file(t.data_ptr()) == str(path) for t in hit.values())


def test_off_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLAZR_QUANT_CACHE", "off")
    monkeypatch.setattr(kernel_build, "cache_dir", lambda: tmp_path / "default")
    build("LlamaForCausalLM", tmp_path / "ckpt", seed=6)
    llm = _load(tmp_path / "ckpt", "int8")
    assert QuantCache.open([tmp_path / "ckpt" / "model.safetensors"], "int8") is None
    assert not (tmp_path / "default").exists() and not list(tmp_path.rglob("*.blzq"))
    assert all(mapped_file(t.data_ptr()) is None for t in _weights(llm).values())


def test_a_load_with_nothing_to_cache_makes_no_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Under `auto` a GGUF whose tensors all run as stored (Q8_0, not re-laid: `BLAZR_Q8PACK=0`) leaves the
    cache nothing to write: its dir is not made (the first write makes it), and where it could not be made
    nothing warns."""
    monkeypatch.setenv("BLAZR_Q8PACK", "0")
    from tests.gguf_fixtures import write_tiny_llama_gguf
    from tests.test_gguf import TINY, tiny_state_dict

    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("BLAZR_QUANT_CACHE", str(tmp_path / "a-file" / "cache"))  # cannot be made
    path = write_tiny_llama_gguf(tmp_path / "m.gguf", tiny_state_dict(), TINY, "Q8_0")
    with caplog.at_level(logging.INFO, logger="blazr.loading"):
        llm = _load(path, "auto")
    assert llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2))[0].outputs[0].token_ids
    assert not [r for r in caplog.records if "quantization cache" in r.getMessage()], caplog.records
    monkeypatch.setenv("BLAZR_QUANT_CACHE", str(tmp_path / "cache"))
    _load(path, "auto")
    assert not (tmp_path / "cache").exists()


def test_the_dir_stays_under_its_cap(tmp_path: Path, cache_dir: Path, monkeypatch) -> None:
    """Least recently used files go first; a file bigger than the cap is not written."""
    for seed in (1, 2):
        build("LlamaForCausalLM", tmp_path / f"c{seed}", seed=seed)
        _load(tmp_path / f"c{seed}", "int8")
    (one,), (two,) = cache_dir.glob("c1-*.blzq"), cache_dir.glob("c2-*.blzq")
    size = one.stat().st_size
    os.utime(two, ns=(1, 1))  # c2's file is now the least recently used
    monkeypatch.setenv("BLAZR_QUANT_CACHE_GB", str(2.5 * size / 2**30))
    build("LlamaForCausalLM", tmp_path / "c3", seed=3)
    _load(tmp_path / "c3", "int8")
    names = sorted(p.name[:2] for p in cache_dir.glob("*.blzq"))
    assert names == ["c1", "c3"]
    monkeypatch.setenv("BLAZR_QUANT_CACHE_GB", str(0.5 * size / 2**30))
    build("LlamaForCausalLM", tmp_path / "c4", seed=4)
    _load(tmp_path / "c4", "int8")
    assert sorted(p.name[:2] for p in cache_dir.glob("*.blzq")) == ["c1", "c3"]


def test_a_write_leaves_the_disk_its_free_floor(tmp_path: Path, cache_dir: Path, monkeypatch) -> None:
    """A write that would leave less than the floor free on the disk is skipped (the default floor is
    max(2 GiB, 5 % of the disk); `$BLAZR_QUANT_CACHE_MIN_FREE_GB` sets it); with room it is written."""
    disk = 100 << 30
    monkeypatch.delenv("BLAZR_QUANT_CACHE_MIN_FREE_GB", raising=False)
    usage = SimpleNamespace(total=disk, used=disk - (4 << 30), free=4 << 30)
    monkeypatch.setattr(quant_cache.shutil, "disk_usage", lambda _: usage)
    build("LlamaForCausalLM", tmp_path / "ckpt", seed=5)
    _load(tmp_path / "ckpt", "int8")  # 4 GiB free < 5 GiB (5 % of 100)
    assert not list(cache_dir.glob("*.blzq"))
    monkeypatch.setenv("BLAZR_QUANT_CACHE_MIN_FREE_GB", "3")
    _load(tmp_path / "ckpt", "int8")
    assert len(list(cache_dir.glob("*.blzq"))) == 1


def test_get_matches_kind_and_shape(tmp_path: Path) -> None:
    """An entry is returned only for the kind and shape asked; another kind is a miss (quantized again and
    the file rewritten with it)."""
    path = tmp_path / "x.blzq"
    w = torch.randn(48, 64)
    made = {f"{kind}.weight": quantize(w, kind) for kind in ("q8_0g", "q4_1", "bf16")}
    cache = QuantCache(path, "k" * 64)
    for name, qw in made.items():
        cache.put(name, qw)
    thread = cache.save()
    assert thread is not None
    thread.join()
    again = QuantCache(path, "k" * 64)
    for name, qw in made.items():
        got = again.get(name, qw.kind, 48, 64)
        assert isinstance(got, QuantizedWeight) and torch.equal(got.data, qw.data), name
    assert again.get("q8_0g.weight", "q4_1", 48, 64) is None
    assert again.get("q8_0g.weight", "q8_0g", 48, 32) is None
    assert again.get("z.weight", "q8_0g", 48, 64) is None
    assert QuantCache(path, "j" * 64).get("q8_0g.weight", "q8_0g", 48, 64) is None  # another key: damaged


def test_generate_twice_from_the_command_line(tmp_path: Path) -> None:
    """`blazr generate --quantize int8` as a user runs it: the first process writes the file before it
    exits, the second maps it (its log says so) and prints the same text."""
    build("LlamaForCausalLM", tmp_path / "ckpt", vocab_size=100288, seed=4)
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "BLAZR_QUANT_CACHE": str(tmp_path / "qc")}
    args = [sys.executable, "-m", "blazr", "generate", "--model", str(tmp_path / "ckpt"), "--prompt", "Hi",
            "--max-tokens", "6", "--temperature", "0", "--ignore-eos", "--quantize", "int8",
            "--log-level", "info"]  # fmt: skip
    runs = [subprocess.run(args, capture_output=True, text=True, env=env, timeout=300) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr + runs[1].stderr
    assert "writing" in runs[0].stderr and "mapped from" not in runs[0].stderr
    assert "mapped from" in runs[1].stderr and "writing" not in runs[1].stderr
    assert runs[0].stdout == runs[1].stdout and runs[0].stdout.strip()
