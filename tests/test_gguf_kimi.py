"""Kimi-Linear from GGUF (llama.cpp's `kimi-linear`), files made by llama.cpp's own converter from a tiny
transformers checkpoint saved as moonshotai publishes theirs (config.json's `linear_attn_config`, the dense
MLP under `mlp.`): the F32 file is detected as the same model and gives transformers' logits and greedy
tokens; llama.cpp agrees on the same file; a Q8_0 file (llama.cpp's quantizer) runs its linears as stored,
close to its float values."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from blazr import LLM
from blazr.kernels import q8_packed
from blazr.model.qlinear import QuantizedLinear
from tests.drive import full_logits
from tests.hf_parity import check_greedy, check_logits, prompts
from tests.llama_cpp_convert import (
    VOCAB,
    convert,
    export_tokenizer,
    kimi_as_published,
    kimi_weights_as_published,
    quantize,
)
from tests.ssm_fixtures import randomise, single_thread
from tests.test_hf_kimi_linear import SIZES
from tests.tiny import build

# llama.cpp's kimi-linear reads the KDA heads from the MLA's head count: 4 of each here
OVERRIDES = dict(SIZES, vocab_size=VOCAB, linear_num_heads=4)


@dataclasses.dataclass
class Made:
    hf: torch.nn.Module
    hf_dir: Path
    f32: Path
    q8_0: Path


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Made:
    root = tmp_path_factory.mktemp("kimi-gguf")
    hf_dir = root / "hf"
    hf = build("KimiLinearForCausalLM", hf_dir, **OVERRIDES)
    randomise(hf, 1)
    hf.save_pretrained(hf_dir)
    kimi_weights_as_published(hf_dir)
    raw: dict[str, Any] = json.loads((hf_dir / "config.json").read_text())
    kimi_as_published(raw)
    (hf_dir / "config.json").write_text(json.dumps(raw))
    f32 = convert(hf_dir, export_tokenizer(root / "tokenizer"), root / "f32.gguf", "f32")
    return Made(hf, hf_dir, f32, quantize(f32, root / "q8_0.gguf", "Q8_0"))


def _llm(path: Path, **kw: Any) -> LLM:
    return LLM(path, cpu=True, dtype="float32", max_num_seqs=2, **kw)


def test_f32_gguf_matches_transformers(made):
    llm = _llm(made.f32)
    assert llm.checkpoint.format == "gguf"
    published = _llm(made.hf_dir)  # the safetensors as published (moonshotai's config and names)
    assert llm.config.with_(max_position_embeddings=0) == published.config.with_(max_position_embeddings=0)
    check_logits(made.hf, llm)
    check_greedy(made.hf, llm, n=16)


def test_llama_cpp_agrees_on_the_same_file(made):
    """llama.cpp's own logits on the F32 file: measured 0.45% of the logit scale at most, the same top-1."""
    from llama_cpp import Llama

    ids = prompts([40], seed=6, vocab=VOCAB)[0]
    ref = Llama(str(made.f32), logits_all=True, n_ctx=128, n_batch=128, n_threads=1, verbose=False)
    ref.eval(ids)
    theirs = torch.tensor(np.array(ref.scores[: len(ids)]))
    ours = full_logits(_llm(made.f32).runner, [ids])[0]
    assert (ours - theirs).abs().max() <= 0.01 * theirs.abs().max()
    assert (ours.argmax(-1) == theirs.argmax(-1)).float().mean() >= 0.95


def test_q8_0_gguf_runs_as_stored(made):
    ours, dequantized = _llm(made.q8_0), _llm(made.q8_0, quantize="none")
    kda = ours.model.layers[0].kda
    assert isinstance(kda.qkv_proj, QuantizedLinear) and kda.qkv_proj.kind == q8_packed.runs_as()
    batch = prompts([7, 30], seed=5, vocab=VOCAB)
    for got, want in zip(
        full_logits(ours.runner, batch), full_logits(dequantized.runner, batch), strict=True
    ):
        scale = want.abs().max()
        assert (got - want).abs().mean() <= 0.02 * scale  # 8-bit activations per block, as llama.cpp
