"""GLM-4.5 / GLM-4.6 from GGUF (llama.cpp's `glm4moe`), files made by llama.cpp's own converter from the tiny
transformers checkpoints of test_hf_glm4_moe.py (q/k norm on and off, dense first layers, grouped sigmoid
routing with a selection bias, shared experts) with their MTP block, which the converter writes as
`blk.{N}.*` + `blk.{N}.nextn.*` and counts in `block_count`:
- F32: detected as the safetensors model (but the context limit), the MTP block left unread without a
  warning; transformers' logits within 1e-4 of the logit scale and its greedy tokens; llama.cpp's own logits
  on the file agree;
- Q8_0 (llama.cpp's quantizer): the linear layers and the experts stay Q8_0 as stored, the logits within
  activation-quantization error of the same file dequantized, and llama.cpp on that file agrees with blazr
  as closely as with the float values.

The files carry SmolLM2's tokenizer with GLM's special tokens added (the converter looks them up by name:
tests/llama_cpp_convert.glm_tokenizer).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from blazr import LLM
from blazr.config import ModelConfig
from blazr.detect import inspect_checkpoint
from blazr.kernels import q8_packed
from blazr.model.moe import Experts
from blazr.model.qlinear import QuantizedLinear
from tests.drive import full_logits
from tests.hf_parity import check_greedy, check_logits, prompts
from tests.llama_cpp_convert import GLM_SPECIAL, VOCAB, convert, glm_tokenizer, quantize
from tests.ssm_fixtures import single_thread
from tests.test_gguf_dense import _check_llama_cpp
from tests.test_hf_glm4_moe import KINDS, VARIANTS, make

GLM_VOCAB = VOCAB + len(GLM_SPECIAL)


@dataclasses.dataclass
class Made:
    name: str
    hf: torch.nn.Module
    config: ModelConfig  # detected from the safetensors checkpoint
    f32: Path
    q8_0: Path


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Made]:
    tokenizer_dir = glm_tokenizer(tmp_path_factory.mktemp("glm-tokenizer"))
    out: dict[str, Made] = {}
    for name in VARIANTS:
        root = tmp_path_factory.mktemp(name)
        hf = make(root / "hf", name, vocab_size=GLM_VOCAB)
        f32 = convert(root / "hf", tokenizer_dir, root / "f32.gguf", "f32")
        q8_0 = quantize(f32, root / "q8_0.gguf", "Q8_0")
        out[name] = Made(name, hf, inspect_checkpoint(root / "hf").config, f32, q8_0)
    return out


def _llm(path: Path, **kw: Any) -> LLM:
    return LLM(path, cpu=True, dtype="float32", max_num_seqs=2, **kw)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_f32_gguf_matches_transformers(made, name, caplog):
    made = made[name]
    n = len(KINDS[name])
    with caplog.at_level(logging.WARNING, logger="blazr"):
        llm = _llm(made.f32)
    assert not [r for r in caplog.records if "ignored" in r.getMessage()], caplog.text
    meta = llm.checkpoint.gguf.metadata
    assert meta["general.architecture"] == "glm4moe"
    assert (meta["glm4moe.block_count"], meta["glm4moe.nextn_predict_layers"]) == (n + 1, 1)
    assert f"blk.{n}.nextn.eh_proj.weight" in llm.checkpoint.gguf.tensor_names
    assert dataclasses.replace(llm.config, max_position_embeddings=0) == dataclasses.replace(
        made.config, max_position_embeddings=0
    )
    check_logits(made.hf, llm)
    check_greedy(made.hf, llm, n=16)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_llama_cpp_agrees_on_the_f32_file(made, name):
    """llama.cpp's logits on the F32 file: within 0.1% of the logit scale, the same top-1."""
    from llama_cpp import Llama

    made = made[name]
    ids = prompts([40], seed=6, vocab=GLM_VOCAB)[0]
    ref = Llama(str(made.f32), logits_all=True, n_ctx=128, n_batch=128, n_threads=1, verbose=False)
    ref.eval(ids)
    theirs = torch.tensor(np.array(ref.scores[: len(ids)]))
    got = full_logits(_llm(made.f32).runner, [ids])[0]
    assert (got - theirs).abs().max() <= 1e-3 * got.abs().max()
    assert torch.equal(got.argmax(-1), theirs.argmax(-1))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_q8_0_gguf_stays_quantized_and_matches_its_float_values(made, name):
    made = made[name]
    ours, dequantized = _llm(made.q8_0), _llm(made.q8_0, quantize="none")
    for layer in (ours.model.layers[0], ours.model.layers[-1]):
        assert any(isinstance(m, QuantizedLinear) and m.kind == q8_packed.runs_as() for m in layer.modules())
        assert not any(isinstance(m, QuantizedLinear) and m.kind == "f32" for m in layer.modules())
    experts = [m for m in ours.model.modules() if isinstance(m, Experts)]
    assert len(experts) == KINDS[name].count("attention+moe")
    assert all(e.w_up is not None and e.w_up.kind == "q8_0g" for e in experts)
    batch = prompts([7, 30], seed=5, vocab=GLM_VOCAB)
    # 8-bit activations, as llama.cpp's: a different top-1 only where the float values have a near-tie
    pairs = zip(full_logits(ours.runner, batch), full_logits(dequantized.runner, batch), strict=True)
    for got, want in pairs:
        scale = want.abs().max().item()
        assert (got - want).abs().mean().item() <= 0.02 * scale
        row_error = (got - want).abs().amax(-1)
        margin = want.amax(-1) - want.gather(-1, got.argmax(-1, keepdim=True)).squeeze(-1)
        assert (margin <= 2 * row_error).all(), (margin, row_error)
    _check_llama_cpp(made.q8_0, ours, dequantized, vocab=GLM_VOCAB)
