"""GraniteMoeHybrid (Granite 4.0-H) parity with transformers: Mamba2 and attention layers with softmax-top-k
experts plus the shared MLP, µP scalars (embedding / residual / logits multipliers, attention multiplier as
the softmax scale), RoPE or NoPE, a dense variant (no experts: the shared MLP alone) with biases and tied
embeddings; legacy ("mamba"/"attention") and v5 layer-type names; detection without config.json."""

from __future__ import annotations

import dataclasses

import pytest

from blazr.config import AttentionConfig, ModelConfig
from tests.hf_parity import check_batched_equals_alone, check_cache_invariants, check_greedy, check_logits
from tests.ssm_fixtures import (
    HEADS,
    check_state_bytes,
    check_without_config_json,
    detect_with,
    layer_kinds,
    load_pair,
    map_layers,
    single_thread,
)

ARCH = "GraniteMoeHybridForCausalLM"
MAMBA = dict(mamba_n_heads=8, mamba_d_head=32, mamba_d_state=16, mamba_chunk_size=8, mamba_expand=2)
VARIANTS = {
    "moe-rope-mup": dict(
        MAMBA,
        **HEADS,
        num_hidden_layers=3,
        layer_types=["linear_attention", "full_attention", "linear_attention"],
        mamba_n_groups=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        intermediate_size=64,
        shared_intermediate_size=96,
        position_embedding_type="rope",
        embedding_multiplier=2.0,
        residual_multiplier=0.5,
        attention_multiplier=0.05,
        logits_scaling=2.0,
    ),
    "dense-nope-bias-tied": dict(
        MAMBA,
        **HEADS,
        layer_types=["mamba", "attention"],  # legacy names: transformers remaps them
        mamba_n_groups=1,
        num_local_experts=0,
        shared_intermediate_size=96,
        attention_bias=True,
        mamba_proj_bias=True,
        tie_word_embeddings=True,
    ),
}
KINDS = {
    "moe-rope-mup": ["mamba2+moe", "attention+moe", "mamba2+moe"],
    "dense-nope-bias-tied": ["mamba2+mlp", "attention+mlp"],
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory):
    return load_pair(tmp_path_factory.mktemp(request.param), request.param, ARCH, **VARIANTS[request.param])


def test_detected_config(pair):
    cfg = pair.llm.config
    assert layer_kinds(cfg) == KINDS[pair.name]
    c = pair.hf.config
    assert (cfg.embedding_multiplier, cfg.residual_multiplier) == (
        c.embedding_multiplier,
        c.residual_multiplier,
    )
    assert cfg.logits_scale == 1 / c.logits_scaling
    attn = next(a for layer in cfg.layers if (a := layer.mixer(AttentionConfig)))
    assert attn.softmax_scale == c.attention_multiplier
    assert (attn.rope is None) == (c.position_embedding_type != "rope")
    assert cfg.tie_word_embeddings == c.tie_word_embeddings


def test_logits_match_transformers(pair):
    check_logits(pair.hf, pair.llm)


def test_greedy_tokens_match_transformers_with_cache(pair):
    check_greedy(pair.hf, pair.llm)


def test_cache_invariants(pair):
    check_cache_invariants(pair.llm)


def test_batched_generation_equals_each_alone(pair):
    check_batched_equals_alone(pair.llm)


def test_state_bytes_per_sequence(pair):
    c = pair.hf.config
    num_mamba = c.layer_types.count("linear_attention")
    check_state_bytes(
        pair, c.mamba_n_heads, c.mamba_d_head, c.mamba_d_state, c.mamba_n_groups, c.mamba_d_conv, num_mamba
    )


def _not_inferable(cfg: ModelConfig) -> ModelConfig:
    """What the moe-rope-mup config.json says and no shape carries, replaced by what detection assumes:
    NoPE, µP multipliers 1, softmax scale 1 (transformers' defaults), and n_groups: shapes give only
    n_groups × state = 32, read as 1 group of 32 (Granite's default n_groups)."""
    cfg = map_layers(
        cfg,
        attention=lambda a: dataclasses.replace(a, rope=None, softmax_scale=1.0),
        mamba2=lambda m: dataclasses.replace(m, n_groups=1, state_size=32, norm_group_size=m.d_inner),
    )
    return dataclasses.replace(cfg, embedding_multiplier=1.0, residual_multiplier=1.0, logits_scale=1.0)


def test_without_config_json(pair, tmp_path):
    expected = _not_inferable if pair.name == "moe-rope-mup" else (lambda c: c)
    check_without_config_json(pair, tmp_path, expected)


@pytest.mark.parametrize("key", ["layer_types", "layers_block_type"])
def test_legacy_layer_type_names_and_model_type(pair, tmp_path, key):
    """Hub checkpoints name layers "mamba" / "attention" (under either key); a config.json without
    `architectures` is recognised by its model_type."""
    legacy = {"linear_attention": "mamba", "full_attention": "attention"}

    def edit(raw):
        raw[key] = [legacy[t] for t in raw.pop("layer_types")]
        del raw["architectures"]

    assert detect_with(pair.path, tmp_path, edit) == pair.llm.config
