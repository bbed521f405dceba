"""JambaForCausalLM parity with transformers: Mamba1 layers (weighted dt / B / C norms) with NoPE attention
every 4th layer and a softmax top-2 MoE (weights not renormalised) every 2nd; a variant with attention first,
experts on the other layers, conv and projection biases; the layer pattern from `layers_block_type` too,
and the state bytes per sequence."""

from __future__ import annotations

import pytest
import torch

from blazr.config import AttentionConfig, Mamba1Config
from tests.hf_parity import check_batched_equals_alone, check_cache_invariants, check_greedy, check_logits
from tests.ssm_fixtures import detect_with, layer_kinds, load_pair, single_thread

JAMBA = dict(
    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
    intermediate_size=96, mamba_d_state=16, mamba_dt_rank=8, mamba_expand=2, mamba_d_conv=4,
)  # fmt: skip
VARIANTS = {
    "jamba": dict(
        JAMBA, attn_layer_period=4, attn_layer_offset=2, expert_layer_period=2, expert_layer_offset=1
    ),
    "attn-first-bias": dict(
        JAMBA,
        attn_layer_period=4,
        attn_layer_offset=0,
        expert_layer_period=2,
        expert_layer_offset=0,
        mamba_proj_bias=True,
        mamba_conv_bias=False,
        mamba_d_conv=3,
        tie_word_embeddings=True,
    ),
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory):
    return load_pair(
        tmp_path_factory.mktemp(request.param), request.param, "JambaForCausalLM", **VARIANTS[request.param]
    )


def test_detected_config(pair):
    cfg, c = pair.llm.config, pair.hf.config
    want = [
        ("attention" if t == "attention" else "mamba1")
        + ("+moe" if (i - c.expert_layer_offset) % 2 == 0 else "+mlp")
        for i, t in enumerate(c.layers_block_type)
    ]
    assert layer_kinds(cfg) == want
    m = next(layer.mixer(Mamba1Config) for layer in cfg.layers if layer.mixer(Mamba1Config))
    assert (m.d_inner, m.state_size, m.dt_rank, m.conv_kernel) == (
        c.mamba_expand * c.hidden_size, c.mamba_d_state, c.mamba_dt_rank, c.mamba_d_conv,
    )  # fmt: skip
    assert m.has_dt_bc_norm and m.has_norm_weights and m.norm_eps == c.rms_norm_eps
    assert (m.has_proj_bias, m.has_conv_bias) == (c.mamba_proj_bias, c.mamba_conv_bias)
    a = next(layer.mixer(AttentionConfig) for layer in cfg.layers if layer.mixer(AttentionConfig))
    assert a.rope is None
    moe = next(layer.moe for layer in cfg.layers if layer.moe)
    assert (moe.scoring, moe.is_renormalized, moe.top_k, moe.num_experts) == ("softmax", False, 2, 4)


def test_logits_match_transformers(pair):
    check_logits(pair.hf, pair.llm)


def test_greedy_tokens_match_transformers_with_cache(pair):
    check_greedy(pair.hf, pair.llm)


def test_cache_invariants(pair):
    check_cache_invariants(pair.llm)


def test_batched_generation_equals_each_alone(pair):
    check_batched_equals_alone(pair.llm)


def test_layer_pattern_from_layers_block_type(pair, tmp_path):
    """A config.json that lists the layer kinds instead of their period and offset gives the same model."""

    def listed(raw):
        period, offset = raw.pop("attn_layer_period"), raw.pop("attn_layer_offset")
        raw["layers_block_type"] = [
            "attention" if i % period == offset else "mamba" for i in range(raw["num_hidden_layers"])
        ]

    assert detect_with(pair.path, tmp_path, listed) == pair.llm.config


def test_state_bytes_per_sequence(pair):
    c = pair.hf.config
    Di, num_mamba = c.mamba_expand * c.hidden_size, c.layers_block_type.count("mamba")
    per_slot = sum(t[0].numel() * t.element_size() for t in pair.llm.runner.cache.state)
    assert per_slot == num_mamba * ((c.mamba_d_conv - 1) * Di + Di * c.mamba_d_state) * 4
    assert pair.llm.runner.cache.paged[0].dtype == torch.float32
