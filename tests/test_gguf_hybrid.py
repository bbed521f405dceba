"""GGUF files of llama.cpp's hybrid and MLA architectures — mamba2, granitehybrid (dense and MoE),
nemotron_h, nemotron_h_moe (and its latent MoE), falcon-h1, deepseek2 (V2 and V3 routing), qwen35,
qwen35moe, qwen3next — made by llama.cpp's own converter from tiny transformers checkpoints, loaded by
blazr and checked against transformers running the original checkpoint:
- F32: the detected config is the safetensors one (up to what no GGUF carries: the SSD chunk size, the
  context limit, and Falcon-H1's µP multipliers, which the converter folds into the weights); logits match
  transformers within 1e-4 of the logit scale; greedy tokens are identical.
- Q8_0 (the converter's) and Q4_0 (llama.cpp's quantizer): the linear layers stay quantized as stored, and
  their logits stay within activation-quantization error of the same file dequantized to float32
  (whose math the F32 test ties to transformers).
- llama.cpp itself on the same Q8_0 file, where it loads: blazr is as close to llama.cpp as llama.cpp is to
  the float model.

Fixture configs follow the published checkpoints where llama.cpp's conversion depends on it: Granite-4.0-H
is NoPE (llama.cpp has no RoPE for hybrid Granite) and its dense FFN width equals the shared MLP's;
Falcon-H1's Mamba norm follows the gate; Nemotron-H's config.json is the remote-code one (no `model_type`:
the converter then reads it as published, dense); DeepSeek-V3 names its sigmoid scoring.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
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
from blazr.loading import gguf as gguf_mod
from blazr.model.mla import MLA as MLALayer
from blazr.model.moe import Experts
from blazr.model.qlinear import QuantizedLinear
from tests.drive import full_logits
from tests.hf_parity import check_greedy, check_logits, prompts
from tests.llama_cpp_convert import (
    VOCAB,
    convert,
    export_tokenizer,
    granite_as_published,
    nemotron_as_published,
    quantize,
)
from tests.ssm_fixtures import HEADS, map_layers, randomise, single_thread
from tests.test_hf_deepseek import MLA_SIZES, MOE_SIZES
from tests.test_hf_falcon_h1 import MAMBA as FALCON_MAMBA
from tests.test_hf_falcon_h1 import MUP
from tests.test_hf_granite import MAMBA as GRANITE_MAMBA
from tests.test_hf_qwen3_next import EXPERTS as QWEN_EXPERTS
from tests.test_hf_qwen3_next import SIZES as QWEN_SIZES
from tests.tiny import build

Edit = Callable[[dict[str, Any]], None]
# the sizes of the safetensors parity tests of each family
NEMOTRON = dict(
    **HEADS, head_dim=64, mamba_num_heads=8, mamba_head_dim=32, ssm_state_size=16, chunk_size=8, n_groups=2
)
MLA = dict(MLA_SIZES, **MOE_SIZES)
QWEN = dict(QWEN_SIZES, linear_value_head_dim=16)


def _dense_nemotron(raw: dict[str, Any]) -> None:
    nemotron_as_published(raw, "M*M-")


def _v3_scoring(raw: dict[str, Any]) -> None:
    raw["scoring_func"], raw["topk_method"] = "sigmoid", "noaux_tc"


def _no_model_type(raw: dict[str, Any]) -> None:
    """Without model_type the converter reads tokenizer.json as is (with qwen3_5_moe_text, transformers'
    AutoTokenizer swaps in its Qwen3.5 tokenizer class, whose pre-tokenizer the converter does not know)."""
    del raw["model_type"]


# name → (transformers architecture, config overrides, config.json edit before converting, llama.cpp loads it)
# Q4_0 (the same pass-through as Q8_0) for one file of each Mamba2 family's layout.
VARIANTS: dict[str, tuple[str, dict[str, Any], Edit | None, bool]] = {
    "mamba2": (
        "Mamba2ForCausalLM",
        dict(
            num_heads=16, head_dim=16, state_size=16, chunk_size=8, expand=2, num_hidden_layers=2, n_groups=2
        ),
        None,
        True,
    ),
    "granitehybrid-moe-mup": (
        "GraniteMoeHybridForCausalLM",
        dict(
            GRANITE_MAMBA,
            **HEADS,
            num_hidden_layers=3,
            layer_types=["mamba", "attention", "mamba"],
            mamba_n_groups=2,
            num_local_experts=4,
            num_experts_per_tok=2,
            intermediate_size=64,
            shared_intermediate_size=96,
            embedding_multiplier=2.0,
            residual_multiplier=0.5,
            attention_multiplier=0.05,
            logits_scaling=2.0,
        ),
        granite_as_published,
        True,
    ),
    "granitehybrid-dense-tied": (
        "GraniteMoeHybridForCausalLM",
        dict(
            GRANITE_MAMBA,
            **HEADS,
            layer_types=["mamba", "attention"],
            num_local_experts=0,
            num_experts_per_tok=0,
            intermediate_size=96,
            shared_intermediate_size=96,
            tie_word_embeddings=True,
        ),
        granite_as_published,
        True,
    ),
    "nemotron_h": (
        "NemotronHForCausalLM",
        dict(NEMOTRON, hybrid_override_pattern="M*M-"),
        _dense_nemotron,
        True,
    ),
    "nemotron_h_moe": (
        "NemotronHForCausalLM",
        dict(
            NEMOTRON,
            hybrid_override_pattern="M*ME",
            moe_intermediate_size=64,
            moe_shared_expert_intermediate_size=32,
            num_experts_per_tok=2,
            n_routed_experts=8,
            n_group=2,
            topk_group=1,
            routed_scaling_factor=2.0,
        ),
        None,
        True,
    ),
    # Nemotron 3 Super's latent MoE (ffn_latent_down / ffn_latent_up around the experts)
    "nemotron_h_moe-latent": (
        "NemotronHForCausalLM",
        dict(
            NEMOTRON,
            hybrid_override_pattern="ME*E",
            moe_intermediate_size=64,
            moe_shared_expert_intermediate_size=32,
            num_experts_per_tok=2,
            n_routed_experts=8,
            moe_latent_size=64,
        ),
        None,
        True,
    ),
    "falcon-h1-mup": (
        "FalconH1ForCausalLM",
        dict(
            FALCON_MAMBA,
            **HEADS,
            head_dim=64,
            mamba_d_ssm=192,
            mamba_n_groups=2,
            mamba_rms_norm=True,
            mamba_norm_before_gate=False,
            **MUP,
        ),
        None,
        True,
    ),
    "deepseek2-v2-lite": (
        "DeepseekV2ForCausalLM",
        dict(
            MLA,
            q_lora_rank=None,
            topk_method="group_limited_greedy",
            n_group=4,
            topk_group=2,
            routed_scaling_factor=1.5,
            norm_topk_prob=False,
        ),
        None,
        False,  # llama.cpp requires deepseek2.attention.q_lora_rank, which its converter omits here
    ),
    "deepseek2-v3": (
        "DeepseekV3ForCausalLM",
        dict(MLA, q_lora_rank=48, n_group=2, topk_group=1),
        _v3_scoring,
        True,
    ),
    # gated DeltaNet (4 value heads over 2 key heads: the converter reorders Qwen3.5's to llama.cpp's tiled
    # order) + gated attention, dense and MoE (llama.cpp's qwen3next has no dense layers: all MoE; its
    # DeltaNet value heads have the key heads' size, as every published one)
    "qwen35": ("Qwen3_5ForCausalLM", dict(QWEN, num_hidden_layers=4), None, True),
    "qwen35moe": (
        "Qwen3_5MoeForCausalLM",
        dict(QWEN, **QWEN_EXPERTS, num_hidden_layers=4),
        _no_model_type,
        True,
    ),
    "qwen3next": ("Qwen3NextForCausalLM", dict(QWEN, **QWEN_EXPERTS, num_hidden_layers=4), None, True),
}


Q4_0 = ("mamba2", "granitehybrid-moe-mup", "nemotron_h_moe", "qwen35")
# (mean error, share of rows within 5% of the scale) a quantized file's logits keep against its float values.
# The tiny DeltaNet MoE models turn 8-bit activations into larger changes (their DeltaNet layers amplify
# rounding, and routing flips): measured mean errors of 1.0–2.1% of the scale, 20–71% of rows within 5% —
# llama.cpp's on the same Q8_0 files the same, blazr within 0.1% of the scale of llama.cpp's own logits
# (top-1 97–100%; `_check_llama_cpp` below holds it to that).
TOLERANCE = {"qwen35moe": (0.03, 0.15), "qwen3next": (0.03, 0.15)}


@dataclasses.dataclass
class Made:
    name: str
    hf: torch.nn.Module
    config: ModelConfig  # detected from the safetensors checkpoint
    f32: Path
    q8_0: Path
    q4_0: Path | None


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


def _build(name: str, hf_dir: Path) -> torch.nn.Module:
    arch, overrides, edit, _ = VARIANTS[name]
    hf = build(arch, hf_dir, vocab_size=VOCAB, **overrides)
    randomise(hf, 1)
    hf.save_pretrained(hf_dir)
    if edit is not None:
        raw = json.loads((hf_dir / "config.json").read_text())
        edit(raw)
        (hf_dir / "config.json").write_text(json.dumps(raw))
    return hf


def _convert(name: str, hf_dir: Path, tokenizer_dir: Path) -> tuple[Path, Path, Path | None]:
    root = hf_dir.parent
    f32 = convert(hf_dir, tokenizer_dir, root / "f32.gguf", "f32")
    if VARIANTS[name][3]:  # llama.cpp's quantizer (fast); else the converter's own Q8_0
        q8_0 = quantize(f32, root / "q8_0.gguf", "Q8_0")
    else:
        q8_0 = convert(hf_dir, tokenizer_dir, root / "q8_0.gguf", "q8_0")
    q4_0 = quantize(f32, root / "q4_0.gguf", "Q4_0") if name in Q4_0 else None
    return f32, q8_0, q4_0


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Made]:
    """Every variant, made once for the module: checkpoints built one after another (seeded), then the
    converter (a Python process each, most of the cost) run two at a time."""
    tokenizer_dir = export_tokenizer(tmp_path_factory.mktemp("smollm2-tokenizer"))
    dirs = {name: tmp_path_factory.mktemp(name) / "hf" for name in VARIANTS}
    models = {name: _build(name, hf_dir) for name, hf_dir in dirs.items()}
    with ThreadPoolExecutor(2) as pool:
        files = {name: pool.submit(_convert, name, d, tokenizer_dir) for name, d in dirs.items()}
        return {
            name: Made(name, models[name], inspect_checkpoint(dirs[name]).config, *files[name].result())
            for name in VARIANTS
        }


def _comparable(cfg: ModelConfig) -> ModelConfig:
    """What a GGUF carries of a config: not the SSD chunk size or the context limit; Falcon-H1's µP
    multipliers are folded into its weights; Qwen3.5's value heads are in another order (the same math)."""
    cfg = map_layers(
        cfg,
        mamba2=lambda m: dataclasses.replace(m, chunk_size=0),
        deltanet=lambda d: dataclasses.replace(d, is_v_tiled=False),  # the converter's value-head order
    )
    cfg = dataclasses.replace(cfg, max_position_embeddings=0)
    if hasattr(cfg, "multipliers"):
        cfg = dataclasses.replace(
            cfg, multipliers=type(cfg.multipliers)(), embedding_multiplier=1.0, logits_scale=1.0
        )
    return cfg


def _llm(path: Path, **kw: Any) -> LLM:
    return LLM(path, cpu=True, dtype="float32", max_num_seqs=2, **kw)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_f32_gguf_matches_transformers(made, name):
    made = made[name]
    llm = _llm(made.f32)
    assert llm.checkpoint.format == "gguf"
    assert _comparable(llm.config) == _comparable(made.config)
    check_logits(made.hf, llm)
    check_greedy(made.hf, llm, n=16)


def _linear_kinds(llm: LLM) -> set[str]:
    return {m.kind for m in llm.model.modules() if isinstance(m, QuantizedLinear)}


def _logits(llm: LLM) -> list[torch.Tensor]:
    return full_logits(llm.runner, prompts([7, 30], seed=5, vocab=llm.config.vocab_size))


QUANTIZED = [(n, "q8_0") for n in VARIANTS] + [(n, "q4_0") for n in Q4_0]


@pytest.mark.parametrize("name, kind", QUANTIZED)
def test_quantized_gguf_stays_quantized_and_matches_its_float_values(made, name, kind, monkeypatch):
    made = made[name]
    path = getattr(made, kind)
    dequantized = _llm(path, quantize="none")
    seen: list[tuple[str, tuple[int, ...]]] = []  # what GGUF dequantization sees while `ours` loads
    real = gguf_mod.dequantize
    monkeypatch.setattr(
        gguf_mod, "dequantize", lambda raw, t, shape: seen.append((t, tuple(shape))) or real(raw, t, shape)
    )
    ours = _llm(path)
    monkeypatch.undo()
    # Q8_0 runs as the file stores it, its linears re-laid where this host runs that faster (not the experts)
    stored = q8_packed.runs_as() if kind == "q8_0" else kind
    assert stored in _linear_kinds(ours), _linear_kinds(ours)
    first = ours.model.layers[0]  # the first block's projections are block-quantized as stored
    assert any(isinstance(m, QuantizedLinear) and m.kind == stored for m in first.modules())
    experts = [m for m in ours.model.modules() if isinstance(m, Experts)]
    # The converter's Q8_0 quantizes the routed experts too: kept as stored, stacked, no float copy
    # (Granite's gate and up experts, stored apart, joined per expert as whole rows).
    if experts and kind == "q8_0":
        assert all(e.w_up is not None and e.w_up.kind == "q8_0g" for e in experts)
        E, I, D = experts[0].num_experts, experts[0].cfg.intermediate_size, ours.config.hidden_size
        assert not {(E, I, D), (E, D, I)} & {shape for _, shape in seen}  # no expert stack went via float
    if kind == "q8_0":  # DeepSeek's q and kv_a rows, their rope rows reordered at load, move as stored
        for mla in (m for m in ours.model.modules() if isinstance(m, MLALayer)):  # (Q8_0, or F16 where the
            q = mla.q_proj if mla.cfg.q_lora_rank is None else mla.q_b_proj  # rows do not split in blocks)
            for linear in (q, mla.kv_a_proj):
                want = stored if linear.in_features % 32 == 0 else "f16"
                assert isinstance(linear, QuantizedLinear) and linear.kind == want, linear
    # Every quantized layer — prefill included, now that no dense float copy is kept — rounds its
    # activations to 8 bits per block, as llama.cpp does: measured row errors of 1.5–2.5% of the logit scale
    # (nemotron_h_moe's ReLU² experts: median 2.0% Q8_0 / 2.1% Q4_0 for blazr, 1.7% / 2.5% for llama.cpp on
    # the same file, equal mean errors). A rounding may also flip a near-tie of a router or of the
    # following layers, which changes that position's logits wholesale (measured: up to 5 rows in 30 of
    # the tiny DeepSeek-V3, 1 in 7 of the tiny Granite); llama.cpp flips the same way. So: the mean error
    # within 2% of the scale, three rows in four within 5%, and those rows' top-1 changed only at near-ties.
    # The sharper check is llama.cpp's own on the same file (below).
    mean_error, share = TOLERANCE.get(made.name, (0.02, 0.75))
    for got, want in zip(_logits(ours), _logits(dequantized), strict=True):
        scale = want.abs().max().item()
        assert (got - want).abs().mean().item() <= mean_error * scale
        row_error = (got - want).abs().amax(-1)
        assert (row_error <= 0.05 * scale).float().mean() >= share, row_error / scale
        error = row_error[row_error <= 0.05 * scale].max().item()
        # a different top-1 only where the float values have a near-tie the error can flip
        rows = torch.arange(len(want))[(got - want).abs().amax(-1) <= error]
        margin = want[rows, want[rows].argmax(-1)] - want[rows, got[rows].argmax(-1)]
        assert margin.max().item() <= 2 * error
    if kind == "q8_0" and VARIANTS[made.name][3]:
        _check_llama_cpp(path, ours, dequantized)


def _check_llama_cpp(path: Path, ours: LLM, dequantized: LLM) -> None:
    """llama.cpp on the same file: blazr is as close to it as it is to the file's float values."""
    from llama_cpp import Llama

    ids = prompts([40], seed=6, vocab=VOCAB)[0]
    ref = Llama(str(path), logits_all=True, n_ctx=128, n_batch=128, n_threads=1, verbose=False)
    ref.eval(ids)
    theirs = torch.tensor(np.array(ref.scores[: len(ids)]))
    got = full_logits(ours.runner, [ids])[0]
    exact = full_logits(dequantized.runner, [ids])[0]
    assert (got - theirs).abs().mean() <= 1.5 * (theirs - exact).abs().mean() + 1e-3
    assert (got.argmax(-1) == theirs.argmax(-1)).float().mean() >= 0.8
