"""DeepSeek-V2 / V3 parity with transformers on tiny random checkpoints: MLA (interleaved rope rows permuted
at load, q_lora_rank set or None, YaRN with mscale), dense first layers, routed + shared experts (V2 softmax
with group-limited greedy top-k and scaling; V3 sigmoid + a non-zero correction bias + top-2-sum groups +
renormalise + scale), the cache invariants, detection without config.json and from v4-style keys, and the
cache / parameter numbers `blazr info` reports.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from blazr import LLM
from blazr.config import MLAConfig, ModelConfig, RopeConfig
from blazr.detect import inspect_checkpoint
from blazr.detect.raw import yarn_mscale
from blazr.errors import UnsupportedError
from blazr.info import describe
from tests import hf_parity
from tests.tiny import build

V2, V3 = "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"
MLA_SIZES: dict[str, Any] = dict(
    num_attention_heads=4,
    # HF's eager attention repeats MLA keys by H / kv_heads (breaks unless equal, as in DeepSeek's configs)
    num_key_value_heads=4,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=24,
)
MOE_SIZES: dict[str, Any] = dict(
    num_hidden_layers=3,
    first_k_dense_replace=1,
    n_routed_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=64,
    n_shared_experts=2,
)
YARN = dict(
    rope_type="yarn",
    rope_theta=10000.0,
    factor=4.0,
    original_max_position_embeddings=128,
    beta_fast=32.0,
    beta_slow=1.0,
    mscale=1.0,
    mscale_all_dim=0.8,  # ≠ mscale: the cos/sin factor and the softmax scale both differ from 1
)
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "v2-lite-groups": (
        V2,
        dict(
            q_lora_rank=None,
            topk_method="group_limited_greedy",
            n_group=4,
            topk_group=2,
            routed_scaling_factor=1.5,
            norm_topk_prob=False,
        ),
    ),
    "v3": (V3, dict(q_lora_rank=48, n_group=2, topk_group=1)),
    "v3-yarn": (V3, dict(q_lora_rank=48, n_group=2, topk_group=1, rope_parameters=YARN)),
}


def _build(name: str, path: Path) -> torch.nn.Module:
    arch, overrides = VARIANTS[name]
    hf = build(arch, path, **{**MLA_SIZES, **MOE_SIZES, **overrides})
    if arch == V3:  # a non-zero selection bias, so routing depends on it; saved again (float32)
        gen = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for layer in hf.model.layers[MOE_SIZES["first_k_dense_replace"] :]:
                layer.mlp.gate.e_score_correction_bias.copy_(0.5 * torch.randn(8, generator=gen))
        hf.save_pretrained(path)
    return hf


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Each variant built, saved and loaded once, on first use."""
    loaded: dict[str, tuple[torch.nn.Module, LLM, Path]] = {}

    def get(name: str) -> tuple[torch.nn.Module, LLM, Path]:
        if name not in loaded:
            path = tmp_path_factory.mktemp(name)
            hf = _build(name, path)
            loaded[name] = hf, LLM(path, cpu=True, dtype="float32", max_num_seqs=8), path
        return loaded[name]

    return get


@pytest.fixture(params=list(VARIANTS))
def pair(request, models):
    return models(request.param)


def test_logits_match_transformers(pair):
    hf, llm, _ = pair
    hf_parity.check_logits(hf, llm)


def test_greedy_tokens_match_transformers_with_cache(pair):
    hf, llm, _ = pair
    hf_parity.check_greedy(hf, llm)


def test_cache_invariants(pair):
    _, llm, _ = pair
    hf_parity.check_cache_invariants(llm)


def test_batched_generation_equals_each_alone(pair):
    _, llm, _ = pair
    hf_parity.check_batched_equals_alone(llm)


def test_detected_structure(models):
    """Dense first layer, MLA everywhere, the routing rule of each version, YaRN's softmax scale."""
    _, v2, _ = models("v2-lite-groups")
    _, v3, _ = models("v3")
    _, yarn, _ = models("v3-yarn")
    for llm in (v2, v3, yarn):
        assert [layer.kind for layer in llm.config.layers] == ["mla+mlp", "mla+moe", "mla+moe"]
    moe2, moe3 = v2.config.layers[1].moe, v3.config.layers[1].moe
    routing = lambda m: (m.scoring, m.num_groups, m.topk_groups, m.group_score)
    weighting = lambda m: (m.is_renormalized, m.routed_scaling_factor, m.has_correction_bias)
    assert (routing(moe2), weighting(moe2)) == (("softmax", 4, 2, "max"), (False, 1.5, False))
    assert (routing(moe3), weighting(moe3)) == (("sigmoid", 2, 1, "top2_sum"), (True, 2.5, True))
    assert moe3.shared is not None and moe3.shared.intermediate_size == 2 * 64
    assert v2.config.layers[0].mixer(MLAConfig).q_lora_rank is None
    assert v3.config.layers[0].mixer(MLAConfig).q_lora_rank == 48
    mla = yarn.config.layers[0].mixer(MLAConfig)
    base = (16 + 8) ** -0.5
    assert mla.softmax_scale == pytest.approx(base * yarn_mscale(4.0, 0.8) ** 2)
    assert mla.rope.attention_factor == pytest.approx(yarn_mscale(4.0, 1.0) / yarn_mscale(4.0, 0.8))
    assert v3.config.layers[0].mixer(MLAConfig).softmax_scale == pytest.approx(base)


def _shape_free(cfg: ModelConfig) -> ModelConfig:
    """`cfg` with the fields no tensor shape carries set to fixed values: max positions, the rope (θ,
    scaling; only its dim is a shape), the softmax scale (YaRN mscale), and the routing hyper-parameters
    (k, scaling factor, renormalisation, groups)."""
    layers = []
    for layer in cfg.layers:
        (mla,) = layer.mixers
        mla = dataclasses.replace(mla, rope=RopeConfig(dim=mla.rope.dim), softmax_scale=0.0)
        moe = layer.moe and dataclasses.replace(
            layer.moe,
            top_k=1,
            routed_scaling_factor=1.0,
            is_renormalized=False,
            num_groups=1,
            topk_groups=1,
        )
        layers.append(dataclasses.replace(layer, mixers=(mla,), moe=moe))
    return dataclasses.replace(cfg, layers=tuple(layers), max_position_embeddings=0)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_config_without_config_json(models, name, tmp_path):
    """The architecture from tensor names (V3: the correction bias), every size from shapes, the same config
    up to the fields no shape carries (see `_shape_free`)."""
    _, llm, path = models(name)
    shutil.copy(path / "model.safetensors", tmp_path / "model.safetensors")
    inferred = inspect_checkpoint(tmp_path).config
    assert inferred.architecture == VARIANTS[name][0]
    assert _shape_free(inferred) == _shape_free(llm.config)


def test_v4_config_keys_give_the_same_config(models, tmp_path):
    """transformers v4 checkpoints carry rope_theta + rope_scaling ("type": "yarn") instead of v5's
    rope_parameters."""
    _, llm, path = models("v3-yarn")
    cfg = json.loads((path / "config.json").read_text())
    params = dict(cfg.pop("rope_parameters"))
    cfg["rope_theta"] = params.pop("rope_theta")
    params["type"] = params.pop("rope_type")
    cfg["rope_scaling"] = params
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    shutil.copy(path / "model.safetensors", tmp_path / "model.safetensors")
    assert inspect_checkpoint(tmp_path).config == llm.config


def test_half_split_rope_checkpoints(tmp_path):
    """V3 with rope_interleave=false stores half-split rope rows: loaded without the permutation."""
    arch, overrides = VARIANTS["v3"]
    hf = build(arch, tmp_path, **{**MLA_SIZES, **MOE_SIZES, **overrides, "rope_interleave": False})
    llm = LLM(tmp_path, cpu=True, dtype="float32")
    assert not llm.config.layers[0].mixer(MLAConfig).is_rope_interleaved
    hf_parity.check_logits(hf, llm)


def test_fp8_block_quantized_checkpoints_are_refused(models, tmp_path):
    """DeepSeek-V3 as released stores FP8 weights + `weight_scale_inv`; detection says so in one line."""
    _, _, path = models("v3")
    tensors = load_file(path / "model.safetensors")
    name = "model.layers.0.self_attn.o_proj.weight_scale_inv"
    save_file({**tensors, name: torch.ones(1, 1)}, tmp_path / "model.safetensors")
    with pytest.raises(UnsupportedError, match=r"weight_scale_inv: FP8"):
        inspect_checkpoint(tmp_path)


def test_v2_norm_topk_prob_follows_deepseeks_gate(models, tmp_path):
    """DeepSeek-V2's gate renormalises the k weights instead of scaling them (HF v5 ignores the key)."""
    _, _, path = models("v2-lite-groups")
    cfg = json.loads((path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "norm_topk_prob": True}))
    shutil.copy(path / "model.safetensors", tmp_path / "model.safetensors")
    moe = inspect_checkpoint(tmp_path).config.layers[1].moe
    assert (moe.is_renormalized, moe.routed_scaling_factor) == (True, 1.0)


@pytest.mark.parametrize("name", ["v2-lite-groups", "v3"])
def test_info_reports_latent_bytes_and_active_parameters(models, name):
    _, llm, _ = models(name)
    info = describe(llm.checkpoint)
    num_mla = len(llm.config.layer_indices("mla"))
    assert num_mla == 3
    assert info["cache"]["kv_bytes_per_token"] == (32 + 8) * 4 * num_mla
    allocated = sum(t[0].numel() * t.element_size() for t in llm.runner.cache.paged)  # the latents
    assert allocated == info["cache"]["kv_bytes_per_token"]
    params = info["parameters"]
    assert params["active_per_token"] < params["total"]
    # total = every tensor of the checkpoint; routed experts count k of E as active
    hf_total = sum(t.numel() for t in models(name)[0].state_dict().values())
    assert params["total"] == hf_total
    routed = 2 * 3 * 64 * 128 * 8  # MoE layers × (gate, up, down) × I × D × E
    assert params["total"] - params["active_per_token"] == routed * (8 - 2) // 8


def test_correction_bias_stays_float32_in_bfloat16(models):
    """V3 keeps `e_score_correction_bias` in float32 (HF: `_keep_in_fp32_modules_strict`); so does blazr's
    loader in a bfloat16 model, so expert selection does not move with the compute dtype."""
    hf, _, path = models("v3")
    llm = LLM(path, cpu=True, dtype="bfloat16", max_num_seqs=1)
    bias = llm.model.layers[1].moe.router.correction_bias
    assert bias.dtype == torch.float32
    assert torch.equal(bias, hf.model.layers[1].mlp.gate.e_score_correction_bias)
    assert llm.model.layers[1].moe.router.weight.dtype == torch.bfloat16
