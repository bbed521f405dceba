"""GGUF `gemma2` and `gemma3` files made by llama.cpp's own converter from tiny transformers checkpoints,
loaded by blazr and checked against transformers on the original (as test_gguf_dense.py does for the other
dense families):
- F32: the detected config is the safetensors one (but the context limit); logits within 1e-4 of the logit
  scale, greedy tokens identical;
- Q8_0 (llama.cpp's quantizer): the linear layers stay Q8_0 as stored; llama.cpp itself on that file agrees
  with blazr as closely as it agrees with the file's float values.

Fixtures follow what llama.cpp runs: the query scalar is the head size (llama.cpp's rule but for the 27B
models); Gemma 3 has 6 layers, so llama.cpp's fixed 5 sliding : 1 full pattern holds a full layer, the
sliding ones with their own rope θ, the full one's linearly scaled; Gemma 2's caps are small enough that tanh
bends the scores and logits. Gemma 3 carries SmolLM2's tokenizer (its converter takes a GPT-2 style one);
Gemma 2's converter wants a SentencePiece tokenizer.model: a small one trained here.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from blazr import LLM
from blazr.config import ModelConfig
from blazr.detect import inspect_checkpoint
from blazr.kernels import q8_packed
from blazr.model.qlinear import QuantizedLinear
from tests.hf_parity import check_greedy, check_logits
from tests.llama_cpp_convert import VOCAB, convert, export_tokenizer, quantize, spm_tokenizer
from tests.ssm_fixtures import randomise, single_thread
from tests.test_gguf_dense import _check_llama_cpp
from tests.tiny import build

SIZES = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
             query_pre_attn_scalar=32, sliding_window=24)  # fmt: skip
SPM_VOCAB = 600
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "gemma3": (
        "Gemma3ForCausalLM",
        dict(SIZES, vocab_size=VOCAB, num_hidden_layers=6, rope_parameters=dict(
            sliding_attention=dict(rope_type="default", rope_theta=10000.0),
            full_attention=dict(rope_type="linear", factor=2.0, rope_theta=1000000.0))),
    ),
    "gemma2": (
        "Gemma2ForCausalLM",
        dict(SIZES, vocab_size=SPM_VOCAB, num_hidden_layers=2, attn_logit_softcapping=2.0,
             final_logit_softcapping=3.0),
    ),
}  # fmt: skip


@dataclasses.dataclass
class Made:
    hf: torch.nn.Module
    config: ModelConfig  # detected from the safetensors checkpoint
    f32: Path
    q8_0: Path


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


def _build(name: str, root: Path) -> tuple[torch.nn.Module, Path]:
    """The checkpoint (built in the main thread: transformers' lazy imports are not thread-safe) and
    its tokenizer."""
    arch, overrides = VARIANTS[name]
    hf = build(arch, root / "hf", **overrides)
    randomise(hf, 1)
    hf.save_pretrained(root / "hf")
    tok = export_tokenizer(root / "tok") if name == "gemma3" else spm_tokenizer(root / "tok", SPM_VOCAB)
    return hf, tok


def _convert(root: Path, tok: Path) -> tuple[Path, Path]:
    f32 = convert(root / "hf", tok, root / "f32.gguf", "f32")
    return f32, quantize(f32, root / "q8_0.gguf", "Q8_0")


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Made]:
    """Every variant built, then converted two at a time (a converter process each)."""
    roots = {name: tmp_path_factory.mktemp(name) for name in VARIANTS}
    built = {name: _build(name, root) for name, root in roots.items()}
    with ThreadPoolExecutor(2) as pool:
        files = {name: pool.submit(_convert, roots[name], built[name][1]) for name in VARIANTS}
        return {
            name: Made(built[name][0], inspect_checkpoint(roots[name] / "hf").config, *files[name].result())
            for name in VARIANTS
        }


def _llm(path: Path, **kw: Any) -> LLM:
    return LLM(path, cpu=True, dtype="float32", max_num_seqs=2, **kw)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_f32_gguf_matches_transformers(made, name):
    m = made[name]
    llm = _llm(m.f32)
    assert llm.checkpoint.gguf.metadata["general.architecture"] == name
    assert dataclasses.replace(llm.config, max_position_embeddings=0) == dataclasses.replace(
        m.config, max_position_embeddings=0
    )
    check_logits(m.hf, llm)
    check_greedy(m.hf, llm, n=16)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_q8_0_gguf_stays_quantized_and_agrees_with_llama_cpp(made, name):
    m = made[name]
    ours, dequantized = _llm(m.q8_0), _llm(m.q8_0, quantize="none")
    first = ours.model.layers[0]
    assert any(isinstance(q, QuantizedLinear) and q.kind == q8_packed.runs_as() for q in first.modules())
    assert not any(isinstance(q, QuantizedLinear) and q.kind == "f32" for q in first.modules())
    _check_llama_cpp(m.q8_0, ours, dequantized, vocab=ours.config.vocab_size)
