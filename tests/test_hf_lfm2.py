"""Lfm2ForCausalLM and Lfm2MoeForCausalLM parity with transformers: short-conv layers around GQA attention
with q / k norms (kernel 3, tied; kernel 4 with conv biases, untied, attention first), and LFM2-MoE (a dense
first layer, then sigmoid-routed experts with an expert bias); detection from legacy config spellings and
without config.json, and bad checkpoints refused in one line."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from blazr.config import AttentionConfig, NormConfig, ShortConvConfig
from blazr.detect import inspect_checkpoint
from blazr.errors import CheckpointError
from tests.hf_parity import check_batched_equals_alone, check_cache_invariants, check_greedy, check_logits
from tests.ssm_fixtures import HEADS, Pair, detect_with, layer_kinds, load_pair, single_thread

VARIANTS = {
    "k3-tied": (
        "Lfm2ForCausalLM",
        dict(HEADS, num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"]),
    ),
    "k4-bias-untied": (
        "Lfm2ForCausalLM",
        dict(
            HEADS,
            num_hidden_layers=3,
            layer_types=["full_attention", "conv", "conv"],
            conv_L_cache=4,
            conv_bias=True,
            tie_word_embeddings=False,
        ),
    ),
    "moe": (
        "Lfm2MoeForCausalLM",
        dict(
            num_hidden_layers=3,
            layer_types=["conv", "full_attention", "conv"],
            num_dense_layers=1,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            routed_scaling_factor=1.5,
        ),
    ),
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


def load_lfm2(root, name: str, arch: str, seed: int = 0, **overrides) -> Pair:
    """`load_pair`, with LFM2-MoE's expert bias (a buffer transformers initialises to zeros) made random."""
    if arch != "Lfm2MoeForCausalLM":
        return load_pair(root, name, arch, seed, **overrides)
    pair = load_pair(root, name, arch, seed, **overrides)
    g = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for n, b in pair.hf.named_buffers():
            if n.endswith("expert_bias"):
                b.copy_(0.3 * torch.randn(b.shape, generator=g))
    pair.hf.save_pretrained(root)
    return load_pair_again(pair)


def load_pair_again(pair: Pair) -> Pair:
    from blazr import LLM

    return Pair(pair.hf, LLM(pair.path, cpu=True, dtype="float32", max_num_seqs=8), pair.path, pair.name)


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory):
    arch, overrides = VARIANTS[request.param]
    return load_lfm2(tmp_path_factory.mktemp(request.param), request.param, arch, **overrides)


def test_detected_config(pair):
    cfg, c = pair.llm.config, pair.hf.config
    kinds = ["short_conv+mlp" if t == "conv" else "attention+mlp" for t in c.layer_types]
    if pair.name == "moe":
        kinds = [k if i < c.num_dense_layers else k.replace("mlp", "moe") for i, k in enumerate(kinds)]
    assert layer_kinds(cfg) == kinds
    conv = next(m for layer in cfg.layers for m in layer.mixers if isinstance(m, ShortConvConfig))
    assert (conv.width, conv.conv_kernel, conv.has_bias) == (c.hidden_size, c.conv_L_cache, c.conv_bias)
    attn = next(m for layer in cfg.layers for m in layer.mixers if isinstance(m, AttentionConfig))
    assert (
        attn.qk_norm == NormConfig(eps=c.norm_eps)
        and attn.is_qk_norm_per_head
        and attn.rope.theta == c.rope_parameters["rope_theta"]
    )
    assert cfg.tie_word_embeddings == c.tie_word_embeddings
    if pair.name == "moe":
        moe = cfg.layers[-1].moe
        assert (moe.scoring, moe.has_correction_bias, moe.top_k, moe.routed_scaling_factor) == (
            "sigmoid",
            True,
            2,
            1.5,
        )


def test_logits_match_transformers(pair):
    check_logits(pair.hf, pair.llm)


def test_greedy_tokens_match_transformers_with_cache(pair):
    check_greedy(pair.hf, pair.llm)


def test_cache_invariants(pair):
    check_cache_invariants(pair.llm)


def test_batched_generation_equals_each_alone(pair):
    check_batched_equals_alone(pair.llm)


def test_state_bytes_per_sequence(pair):
    """Per sequence, each short-conv layer keeps its last L − 1 inputs of `hidden` channels (float32 here)."""
    c = pair.hf.config
    num_conv = c.layer_types.count("conv")
    per_slot = sum(t[0].numel() * t.element_size() for t in pair.llm.runner.cache.state)
    assert per_slot == num_conv * (c.conv_L_cache - 1) * c.hidden_size * 4


def test_legacy_spellings_and_no_config_json(pair, tmp_path):
    """`full_attn_idxs` / `tie_embedding` / `block_norm_eps` (the published LFM2 config.json) and no
    model_type or architectures give the same model; so does no config.json at all, except what no shape
    carries (rope θ and eps take transformers' defaults, and they equal these)."""
    c = pair.hf.config

    def legacy(raw):
        raw["full_attn_idxs"] = [i for i, t in enumerate(raw.pop("layer_types")) if t != "conv"]
        raw["tie_embedding"] = raw.pop("tie_word_embeddings", c.tie_word_embeddings)
        raw["block_norm_eps"] = raw.pop("norm_eps")
        del raw["architectures"]

    assert detect_with(pair.path, tmp_path / "legacy", legacy) == pair.llm.config
    if pair.name != "moe":  # the router's top-k is in no shape
        inferred = detect_with(pair.path, tmp_path / "none", None)
        assert inferred.with_(max_position_embeddings=0) == pair.llm.config.with_(max_position_embeddings=0)


def test_bad_checkpoint_names_the_tensor(pair, tmp_path):
    from safetensors.torch import load_file, save_file

    dst = tmp_path / "bad"
    shutil.copytree(pair.path, dst)
    state = load_file(dst / "model.safetensors")
    name = next(n for n in state if n.endswith("conv.in_proj.weight"))
    state[name] = state[name][:-1]
    save_file(state, dst / "model.safetensors")
    from blazr import LLM

    with pytest.raises(
        CheckpointError, match=rf"{name}.*expected shape \[{3 * pair.hf.config.hidden_size}, "
    ):
        LLM(dst, cpu=True, dtype="float32")
    raw = json.loads((pair.path / "config.json").read_text())
    raw["layer_types"] = ["conv", "sliding", *raw["layer_types"][2:]]
    (dst / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="layer_types: 'sliding'"):
        inspect_checkpoint(dst)
