"""GLM-4.5 / GLM-4.6 (`Glm4MoeForCausalLM`) parity with transformers on tiny random checkpoints: GQA with
q/k/v biases, the partial rope (half of each head, half-split), per-head q/k norm on (GLM-4.5 355B) and off
(GLM-4.5-Air), dense first layers (`first_k_dense_replace` 1 and 2), sigmoid routing with a non-zero
selection bias, grouped top-k (top-2-sum groups), renormalised or not, scaled, shared experts (1 and 2);
logits, greedy tokens, the cache invariants and batched == alone; the MTP block GLM's checkpoints carry
after the decoder left unread without a warning; detection without config.json, from v4-style keys, and
from transformers' fused expert tensors."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from blazr import LLM
from blazr.config import AttentionConfig, ModelConfig
from blazr.detect import inspect_checkpoint
from tests.drive import full_logits
from tests.hf_parity import ParityTests, prompts
from tests.ssm_fixtures import Pair, randomise, single_thread
from tests.tiny import build

ARCH = "Glm4MoeForCausalLM"
SIZES: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    moe_intermediate_size=32,
    n_routed_experts=8,
    num_experts_per_tok=2,
    attention_bias=True,
)
VARIANTS: dict[str, dict[str, Any]] = {
    # GLM-4.5 (355B) shape: q/k norm, one dense layer, one shared expert, 4 groups keep 2, scaled
    "glm45-qk-norm": dict(
        SIZES, num_hidden_layers=3, first_k_dense_replace=1, use_qk_norm=True, n_shared_experts=1,
        n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5,
    ),
    # GLM-4.5-Air shape: no q/k norm, two dense layers, two shared experts, not renormalised, rope θ 1e6
    "glm45-air": dict(
        SIZES, num_hidden_layers=4, first_k_dense_replace=2, use_qk_norm=False, n_shared_experts=2,
        n_group=2, topk_group=1, norm_topk_prob=False, routed_scaling_factor=1.5, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="default", rope_theta=1e6, partial_rotary_factor=0.5),
    ),
}  # fmt: skip
KINDS = {
    "glm45-qk-norm": ["attention+mlp"] + ["attention+moe"] * 2,
    "glm45-air": ["attention+mlp"] * 2 + ["attention+moe"] * 2,
}


def make(root: Path, name: str, **extra: Any) -> torch.nn.Module:
    """The tiny model of variant `name` (random norms and biases, a selection bias large enough to change
    the routing), saved under `root` with an MTP block after its decoder as GLM's checkpoints hold one."""
    overrides = {**VARIANTS[name], **extra}
    hf = build(ARCH, root, **overrides)
    randomise(hf, 1)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for layer in hf.model.layers[overrides["first_k_dense_replace"] :]:
            bias = layer.mlp.gate.e_score_correction_bias
            bias.copy_(0.5 * torch.randn(bias.shape, generator=gen))
    hf.save_pretrained(root)
    add_mtp_block(root, hf.config.num_hidden_layers)
    return hf


def add_mtp_block(root: Path, num_layers: int) -> None:
    """GLM's MTP block, `model.layers.{num_layers}.*`: a copy of the last decoder layer plus `eh_proj`
    [D, 2D], `enorm`, `hnorm` and `shared_head.norm` (random values: used, they would change the logits)."""
    path = root / "model.safetensors"
    tensors = load_file(path)
    last, mtp = f"model.layers.{num_layers - 1}.", f"model.layers.{num_layers}."
    hidden = tensors["model.embed_tokens.weight"].shape[1]
    block = {mtp + n[len(last) :]: t.clone() for n, t in tensors.items() if n.startswith(last)}
    block[mtp + "eh_proj.weight"] = torch.randn(hidden, 2 * hidden)
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        block[f"{mtp}{norm}.weight"] = torch.randn(hidden)
    save_file({**tensors, **block}, path, metadata={"format": "pt"})


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory) -> Pair:
    root = tmp_path_factory.mktemp(request.param)
    hf = make(root, request.param)
    return Pair(hf, LLM(root, cpu=True, dtype="float32", max_num_seqs=8), root, request.param)


class TestParity(ParityTests):
    """Logits, greedy tokens, cache invariants and batched == alone against transformers."""


def test_detected_config(pair):
    cfg = pair.llm.config
    overrides = VARIANTS[pair.name]
    assert cfg.architecture == ARCH
    assert [layer.kind for layer in cfg.layers] == KINDS[pair.name]  # the MTP block is not a layer
    attn = {layer.mixer(AttentionConfig) for layer in cfg.layers}
    assert len(attn) == 1
    (a,) = attn
    assert (a.num_heads, a.num_kv_heads, a.head_dim, a.rope.dim) == (4, 2, 32, 16)
    assert a.has_qkv_bias and not a.has_o_bias
    assert (a.qk_norm is not None) == overrides["use_qk_norm"]
    moe = cfg.layers[-1].moe
    assert (moe.num_experts, moe.top_k, moe.expert.intermediate_size) == (8, 2, 32)
    assert (moe.scoring, moe.group_score, moe.has_correction_bias) == ("sigmoid", "top2_sum", True)
    assert (moe.num_groups, moe.topk_groups) == (overrides["n_group"], overrides["topk_group"])
    assert moe.is_renormalized == overrides["norm_topk_prob"]
    assert moe.routed_scaling_factor == overrides["routed_scaling_factor"]
    assert moe.shared is not None and moe.shared.intermediate_size == 32 * overrides["n_shared_experts"]
    assert cfg.layers[0].mlp.intermediate_size == 96
    assert cfg.tie_word_embeddings == overrides.get("tie_word_embeddings", False)


def test_mtp_block_is_left_unread_without_a_warning(pair, caplog):
    """The checkpoint holds `model.layers.{N}.*` (the MTP block): loading neither fails nor reports it."""
    names = load_file(pair.path / "model.safetensors").keys()
    n = len(KINDS[pair.name])
    assert f"model.layers.{n}.eh_proj.weight" in names
    with caplog.at_level(logging.WARNING, logger="blazr"):
        llm = LLM(pair.path, cpu=True, dtype="float32", max_num_seqs=2)
    assert not [r for r in caplog.records if "ignored" in r.getMessage()], caplog.text
    assert llm.config.num_layers == n


def _shape_free(cfg: ModelConfig) -> ModelConfig:
    """`cfg` with what no tensor shape carries fixed: the context limit, rope θ, and the routing's k,
    renormalisation, scale and groups."""
    layers = []
    for layer in cfg.layers:
        (a,) = layer.mixers
        a = dataclasses.replace(a, rope=dataclasses.replace(a.rope, theta=0.0))
        moe = layer.moe and dataclasses.replace(
            layer.moe, top_k=1, is_renormalized=False, routed_scaling_factor=1.0, num_groups=1, topk_groups=1
        )
        layers.append(dataclasses.replace(layer, mixers=(a,), moe=moe))
    return dataclasses.replace(cfg, layers=tuple(layers), max_position_embeddings=0)


@pytest.mark.parametrize("pair", ["glm45-qk-norm"], indirect=True)
def test_without_config_json(pair, tmp_path):
    """The names say GLM-4.5 (GQA + a router with a selection bias), shapes give every size — the head size
    from q_norm's width (without q/k norm it is a guess, as for Llama), the MTP block (it holds `eh_proj`)
    is not a decoder layer, dense layers lack a router; the rest takes transformers' defaults."""
    shutil.copy(pair.path / "model.safetensors", tmp_path / "model.safetensors")
    inferred = inspect_checkpoint(tmp_path).config
    assert _shape_free(inferred) == _shape_free(pair.llm.config)


@pytest.mark.parametrize("pair", ["glm45-qk-norm"], indirect=True)
def test_v4_config_keys_give_the_same_config(pair, tmp_path):
    """GLM's published config.json (transformers v4): `rope_theta` and `partial_rotary_factor` at the top
    level instead of v5's `rope_parameters`."""
    raw = json.loads((pair.path / "config.json").read_text())
    params = raw.pop("rope_parameters")
    raw["rope_theta"], raw["partial_rotary_factor"] = params["rope_theta"], params["partial_rotary_factor"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    shutil.copy(pair.path / "model.safetensors", tmp_path / "model.safetensors")
    assert inspect_checkpoint(tmp_path).config == pair.llm.config


def test_partial_rotary_factor_is_read(tmp_path):
    """A quarter of each head rotated (rope dim 8 of 32): still transformers' logits."""
    rope = dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25)
    hf = make(tmp_path, "glm45-qk-norm", rope_parameters=rope)
    llm = LLM(tmp_path, cpu=True, dtype="float32", max_num_seqs=2)
    assert llm.config.layers[0].mixer(AttentionConfig).rope.dim == 8
    from tests.hf_parity import check_logits

    check_logits(hf, llm)


@pytest.mark.parametrize("pair", ["glm45-qk-norm"], indirect=True)
def test_fused_expert_tensors(pair, tmp_path):
    """transformers' own names (`save_original_format=False`): the experts as fused 3-D tensors load to the
    same model."""
    pair.hf.save_pretrained(tmp_path, save_original_format=False)
    names = load_file(tmp_path / "model.safetensors").keys()
    assert "model.layers.1.mlp.experts.gate_up_proj" in names
    llm = LLM(tmp_path, cpu=True, dtype="float32", max_num_seqs=2)
    batch = prompts([20], seed=9, vocab=llm.config.vocab_size)
    assert torch.equal(full_logits(llm.runner, batch)[0], full_logits(pair.llm.runner, batch)[0])
