"""GGUF files of llama.cpp's short-conv and Mamba1 architectures — lfm2, lfm2moe, mamba (Mamba and
Falcon-Mamba) and jamba — made by llama.cpp's own converter from tiny transformers checkpoints, loaded by
blazr and checked against transformers running the original checkpoint, as test_gguf_hybrid.py does for the
Mamba2 hybrids:
- F32: the detected config is the safetensors one (up to the context limit, which the mamba file does not
  carry); logits match transformers within 1e-4 of the logit scale; greedy tokens are identical.
- Q8_0 (llama.cpp's quantizer): the linear layers stay quantized as stored (a dt_proj whose rank is no
  multiple of 32 is F16 in the file, and runs so), the routed experts stacked as stored; logits within
  activation-quantization error of the same file dequantized; llama.cpp itself on the same file: blazr is as
  close to it as it is to the float values.

Jamba's converter takes only a Llama-style tokenizer: its checkpoint gets a small SentencePiece BPE model
(byte fallback) trained here on random words, which the converter pads to the model's vocabulary.
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
from blazr.model.moe import Experts
from blazr.model.qlinear import QuantizedLinear
from tests.hf_parity import check_greedy, check_logits
from tests.llama_cpp_convert import VOCAB, convert, export_tokenizer, quantize, spm_tokenizer
from tests.ssm_fixtures import HEADS, randomise, single_thread
from tests.test_gguf_hybrid import _check_llama_cpp, _logits
from tests.tiny import build

# name → (transformers architecture, config overrides); the converter's GGUF architecture in the comment
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "lfm2": (
        "Lfm2ForCausalLM",
        dict(HEADS, num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"]),
    ),
    "lfm2moe": (
        "Lfm2MoeForCausalLM",
        dict(
            HEADS,
            num_hidden_layers=3,
            layer_types=["conv", "full_attention", "conv"],
            num_dense_layers=1,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
        ),
    ),
    "mamba": ("MambaForCausalLM", dict(num_hidden_layers=2, state_size=16, time_step_rank=32)),
    "falcon-mamba": ("FalconMambaForCausalLM", dict(num_hidden_layers=2, state_size=16, time_step_rank=8)),
    "jamba": (
        "JambaForCausalLM",
        dict(
            HEADS,
            num_hidden_layers=4,
            attn_layer_period=4,
            attn_layer_offset=1,
            num_experts=4,
            intermediate_size=96,
            mamba_dt_rank=8,
        ),
    ),
}


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


def _build(name: str, hf_dir: Path) -> torch.nn.Module:
    arch, overrides = VARIANTS[name]
    hf = build(arch, hf_dir, vocab_size=VOCAB, **overrides)
    randomise(hf, 1)
    if name == "lfm2moe":  # its expert bias is a buffer (zeros from transformers)
        with torch.no_grad():
            for n, b in hf.named_buffers():
                if n.endswith("expert_bias"):
                    b.copy_(0.3 * torch.randn(b.shape, generator=torch.Generator().manual_seed(5)))
    hf.save_pretrained(hf_dir)
    return hf


def _convert(name: str, hf_dir: Path, tokenizer_dir: Path) -> tuple[Path, Path]:
    f32 = convert(hf_dir, tokenizer_dir, hf_dir.parent / "f32.gguf", "f32")
    return f32, quantize(f32, hf_dir.parent / "q8_0.gguf", "Q8_0")


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Made]:
    """Every variant, made once for the module (the converter, a Python process each, two at a time)."""
    gpt2 = export_tokenizer(tmp_path_factory.mktemp("smollm2-tokenizer"))
    spm = spm_tokenizer(tmp_path_factory.mktemp("spm-tokenizer"))
    dirs = {name: tmp_path_factory.mktemp(name) / "hf" for name in VARIANTS}
    models = {name: _build(name, d) for name, d in dirs.items()}
    with ThreadPoolExecutor(2) as pool:
        files = {n: pool.submit(_convert, n, d, spm if n == "jamba" else gpt2) for n, d in dirs.items()}
        return {
            n: Made(n, models[n], inspect_checkpoint(dirs[n]).config, *files[n].result()) for n in VARIANTS
        }


def _llm(path: Path, **kw: Any) -> LLM:
    return LLM(path, cpu=True, dtype="float32", max_num_seqs=2, **kw)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_f32_gguf_matches_transformers(made, name):
    made = made[name]
    llm = _llm(made.f32)
    assert llm.checkpoint.format == "gguf"
    assert llm.config.with_(max_position_embeddings=0) == made.config.with_(max_position_embeddings=0)
    check_logits(made.hf, llm)
    check_greedy(made.hf, llm, n=16)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_q8_0_gguf_stays_quantized_and_matches_its_float_values(made, name):
    made = made[name]
    dequantized, ours = _llm(made.q8_0, quantize="none"), _llm(made.q8_0)
    leaves = ("in_proj", "out_proj", "x_proj", "dt_proj")
    mixer_linears = [
        (n, m)
        for n, m in ours.model.named_modules()
        if n.split(".")[2:] in ([p, x] for p in ("conv", "mamba1") for x in leaves)
    ]
    assert mixer_linears
    for n, m in mixer_linears:  # as stored: Q8_0, or F16 (llama.cpp's fallback) where rows split in no blocks
        assert isinstance(m, QuantizedLinear) and m.kind == (
            q8_packed.runs_as() if m.in_features % 32 == 0 else "f16"
        ), n
    for e in (m for m in ours.model.modules() if isinstance(m, Experts)):
        assert e.w_up is not None and e.w_up.kind == "q8_0g"
    assert ours.runner.decode_plan is not None
    for got, want in zip(_logits(ours), _logits(dequantized), strict=True):
        scale = want.abs().max().item()
        assert (got - want).abs().mean().item() <= 0.02 * scale
    _check_llama_cpp(made.q8_0, ours, dequantized)
