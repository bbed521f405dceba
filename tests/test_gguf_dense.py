"""GGUF files of llama.cpp's dense and MoE architectures — `qwen2`, `qwen3`, `qwen3moe`, `olmo2` (OLMo 3 with
its sliding-window layers), `granite` and `granitemoe` (Granite 3 with µP scalars; MoE with a shared MLP),
`smollm3` (NoPE every 4th layer) and Mixtral (which its converter writes as `llama` with a router and
stacked experts) — made by llama.cpp's own converter from tiny transformers checkpoints, loaded by blazr and
checked against transformers on the original:
- F32: the detected config is the safetensors one (but the context limit); logits within 1e-4 of the logit
  scale, greedy tokens identical;
- Q8_0 (llama.cpp's quantizer): the linear layers stay Q8_0 as stored, experts included, and the logits
  stay within activation-quantization error of the same file dequantized; llama.cpp itself on that file
  agrees with blazr as closely as it agrees with the float values.

Fixtures follow what llama.cpp runs: OLMo 3's sliding and full layers share one rope θ, as published
(llama.cpp's graph rotates both with `rope.freq_base`; blazr reads `rope.freq_base_swa` for the sliding
ones, as transformers); Qwen3-MoE renormalises its top-k (llama.cpp's only qwen3moe routing) and has no
dense layers (`mlp_only_layers`: the converter cannot name their tensors). The files carry SmolLM2's
tokenizer (the converter needs one it knows); the `qwen2` pre-tokenizer is checked on a real Qwen2
vocabulary in test_gguf_vocab_files.py.
"""

from __future__ import annotations

import dataclasses
import json
from concurrent.futures import ThreadPoolExecutor
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
from tests.llama_cpp_convert import VOCAB, convert, export_tokenizer, quantize
from tests.ssm_fixtures import randomise, single_thread
from tests.test_hf_granite3 import MUP as GRANITE_MUP
from tests.test_hf_smollm3 import SIZES as SMOLLM3_SIZES
from tests.tiny import build

# widths multiples of 32, so every linear's rows are whole Q8_0 blocks
SIZES = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2)
EXPERTS = dict(num_experts_per_tok=2, moe_intermediate_size=64)
# name → (transformers architecture, config overrides)
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen2": ("Qwen2ForCausalLM", dict(SIZES)),
    "qwen3": ("Qwen3ForCausalLM", dict(SIZES, head_dim=32, tie_word_embeddings=True)),
    "qwen3moe": (
        "Qwen3MoeForCausalLM",
        dict(SIZES, **EXPERTS, head_dim=32, num_experts=4, norm_topk_prob=True),
    ),
    "mixtral-as-llama": (
        "MixtralForCausalLM",
        dict(SIZES, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2),
    ),
    "olmo3-window": ("Olmo3ForCausalLM", dict(SIZES, num_hidden_layers=4, sliding_window=24)),
    "granite": ("GraniteForCausalLM", dict(SIZES, **GRANITE_MUP)),
    "smollm3": ("SmolLM3ForCausalLM", dict(SMOLLM3_SIZES, num_hidden_layers=4)),
    "granitemoeshared": (
        "GraniteMoeSharedForCausalLM",
        dict(SIZES, **GRANITE_MUP, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2,
             shared_intermediate_size=32),
    ),
}  # fmt: skip
GGUF_ARCH = {"qwen2": "qwen2", "qwen3": "qwen3", "qwen3moe": "qwen3moe", "mixtral-as-llama": "llama",
             "olmo3-window": "olmo2", "granite": "granite", "granitemoeshared": "granitemoe",
             "smollm3": "smollm3"}  # fmt: skip


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
    """The checkpoint; Qwen's config.json without its model_type, which would make the converter's
    AutoTokenizer swap in transformers' Qwen2 tokenizer class, whose pre-tokenizer it does not know."""
    arch, overrides = VARIANTS[name]
    hf = build(arch, hf_dir, vocab_size=VOCAB, **overrides)
    randomise(hf, 1)
    hf.save_pretrained(hf_dir)
    if name.startswith("qwen"):
        raw = json.loads((hf_dir / "config.json").read_text())
        del raw["model_type"]
        (hf_dir / "config.json").write_text(json.dumps(raw))
    return hf


def _convert(hf_dir: Path, tokenizer_dir: Path) -> tuple[Path, Path]:
    f32 = convert(hf_dir, tokenizer_dir, hf_dir.parent / "f32.gguf", "f32")
    return f32, quantize(f32, hf_dir.parent / "q8_0.gguf", "Q8_0")


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Made]:
    """Every variant built (seeded), then converted two at a time (a converter process each)."""
    tokenizer_dir = export_tokenizer(tmp_path_factory.mktemp("smollm2-tokenizer"))
    dirs = {name: tmp_path_factory.mktemp(name) / "hf" for name in VARIANTS}
    models = {name: _build(name, d) for name, d in dirs.items()}
    with ThreadPoolExecutor(2) as pool:
        files = {name: pool.submit(_convert, d, tokenizer_dir) for name, d in dirs.items()}
        return {
            name: Made(name, models[name], inspect_checkpoint(dirs[name]).config, *files[name].result())
            for name in VARIANTS
        }


def _llm(path: Path, **kw: Any) -> LLM:
    return LLM(path, cpu=True, dtype="float32", max_num_seqs=2, **kw)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_f32_gguf_matches_transformers(made, name):
    made = made[name]
    llm = _llm(made.f32)
    assert llm.checkpoint.format == "gguf"
    assert llm.checkpoint.gguf.metadata["general.architecture"] == GGUF_ARCH[name]
    assert dataclasses.replace(llm.config, max_position_embeddings=0) == dataclasses.replace(
        made.config, max_position_embeddings=0
    )
    check_logits(made.hf, llm)
    check_greedy(made.hf, llm, n=16)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_q8_0_gguf_stays_quantized_and_matches_its_float_values(made, name):
    made = made[name]
    ours, dequantized = _llm(made.q8_0), _llm(made.q8_0, quantize="none")
    first = ours.model.layers[0]
    assert any(isinstance(m, QuantizedLinear) and m.kind == q8_packed.runs_as() for m in first.modules())
    assert not any(isinstance(m, QuantizedLinear) and m.kind == "f32" for m in first.modules())
    experts = [m for m in ours.model.modules() if isinstance(m, Experts)]
    assert bool(experts) == (name in ("qwen3moe", "mixtral-as-llama", "granitemoeshared"))
    assert all(e.w_up is not None and e.w_up.kind == "q8_0g" for e in experts)
    batch = prompts([7, 30], seed=5, vocab=VOCAB)
    # 8-bit activations, as llama.cpp's: measured mean errors 0.2–0.4% of the logit scale (1.1% on a Qwen3-MoE
    # prompt where a routing near-tie flips), rows' largest 2–3%; a different top-1 (0–3 rows in 30) only
    # where the float values have a near-tie that error can flip (measured margins ≤ 0.51 of it)
    pairs = zip(full_logits(ours.runner, batch), full_logits(dequantized.runner, batch), strict=True)
    for got, want in pairs:
        scale = want.abs().max().item()
        assert (got - want).abs().mean().item() <= 0.02 * scale
        row_error = (got - want).abs().amax(-1)
        margin = want.amax(-1) - want.gather(-1, got.argmax(-1, keepdim=True)).squeeze(-1)
        assert (margin <= 2 * row_error).all(), (margin, row_error)
    _check_llama_cpp(made.q8_0, ours, dequantized)


def _check_llama_cpp(path: Path, ours: LLM, dequantized: LLM, vocab: int = VOCAB) -> None:
    """llama.cpp on the same file: blazr is as close to it as it is to the file's float values, and its
    top-1 agrees with the float values' as often as llama.cpp's does (5 % of the rows of slack: near-ties
    that another host's kernels may flip either way) — the quantized path judged against the float model,
    not against another quantized engine's near-ties (Gemma 4's MoE fixture: llama.cpp's top-1 agrees with
    the float values on 34 of 40 rows, ours 38)."""
    from llama_cpp import Llama

    ids = prompts([40], seed=6, vocab=vocab)[0]
    ref = Llama(str(path), logits_all=True, n_ctx=128, n_batch=128, n_threads=1, verbose=False)
    ref.eval(ids)
    theirs = torch.tensor(np.array(ref.scores[: len(ids)]))
    got = full_logits(ours.runner, [ids])[0]
    exact = full_logits(dequantized.runner, [ids])[0]
    assert (got - theirs).abs().mean() <= 1.5 * (theirs - exact).abs().mean() + 1e-3
    ours_top1 = (got.argmax(-1) == exact.argmax(-1)).sum().item()
    theirs_top1 = (theirs.argmax(-1) == exact.argmax(-1)).sum().item()
    assert ours_top1 >= theirs_top1 - max(1, len(ids) // 20), (ours_top1, theirs_top1, len(ids))
