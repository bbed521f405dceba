"""FalconH1ForCausalLM parity with transformers: attention (RoPE) and Mamba2 in parallel in every layer,
then a SwiGLU; every µP multiplier non-trivial (embedding, lm_head, attention in/out, key, SSM in/out, the
five-segment `ssm_multipliers` on in_proj, MLP gate/down), folded into weights at load; the Mamba2 inner
width apart from expand·hidden (`mamba_d_ssm`); the gated RMSNorm before or after the gate (n_groups 2) or
absent (y·silu(z)); every bias, with multipliers on it; tied embeddings; detection without config.json."""

from __future__ import annotations

import dataclasses

import pytest

from blazr.config import Mamba2Config, ModelConfig
from blazr.detect.falcon_h1 import FalconH1ModelConfig, FalconH1Multipliers
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

ARCH = "FalconH1ForCausalLM"
MAMBA = dict(mamba_n_heads=8, mamba_d_state=16, mamba_chunk_size=8, mamba_expand=2, num_hidden_layers=2)
MUP = dict(
    embedding_multiplier=1.5,
    lm_head_multiplier=0.7,
    attention_in_multiplier=0.8,
    attention_out_multiplier=1.3,
    key_multiplier=0.6,
    ssm_in_multiplier=1.2,
    ssm_out_multiplier=0.9,
    ssm_multipliers=[0.5, 1.5, 0.8, 1.2, 0.7],
    mlp_multipliers=[1.3, 0.6],
)
VARIANTS = {
    "norm-before-gate-mup": dict(
        MAMBA,
        **HEADS,
        **MUP,
        mamba_d_ssm=192,
        mamba_n_groups=2,
        mamba_rms_norm=True,
        mamba_norm_before_gate=True,
    ),
    "no-norm-bias-mup-tied": dict(
        MAMBA,
        **HEADS,
        **MUP,
        mamba_d_ssm=256,
        mamba_n_groups=1,
        mamba_rms_norm=False,
        attention_bias=True,
        mlp_bias=True,
        mamba_proj_bias=True,
        projectors_bias=True,
        tie_word_embeddings=True,
    ),
    "norm-after-gate": dict(
        MAMBA, **HEADS, mamba_d_ssm=256, mamba_n_groups=1, mamba_rms_norm=True, mamba_norm_before_gate=False
    ),
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory):
    return load_pair(tmp_path_factory.mktemp(request.param), request.param, ARCH, **VARIANTS[request.param])


def test_detected_config(pair):
    cfg, c = pair.llm.config, pair.hf.config
    assert layer_kinds(cfg) == ["attention+mamba2+mlp"] * 2
    m = cfg.layers[0].mixer(Mamba2Config)
    assert (m.d_inner, m.n_groups, m.has_gated_norm) == (c.mamba_d_ssm, c.mamba_n_groups, c.mamba_rms_norm)
    assert m.is_norm_before_gate == c.mamba_norm_before_gate
    assert (cfg.embedding_multiplier, cfg.logits_scale) == (c.embedding_multiplier, c.lm_head_multiplier)
    assert cfg.multipliers.ssm == tuple(c.ssm_multipliers)
    assert (cfg.multipliers.mlp_gate, cfg.multipliers.mlp_down) == tuple(c.mlp_multipliers)


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
    check_state_bytes(
        pair, c.mamba_n_heads, c.mamba_d_head, c.mamba_d_state, c.mamba_n_groups, c.mamba_d_conv, 2
    )


def _not_inferable(cfg: ModelConfig) -> ModelConfig:
    """No shape carries the multipliers (→ 1), whether the gated norm runs before the gate (→ transformers'
    default, before), or the G/N split (2 × 16 → FalconH1's default 1 group of 32)."""
    assert isinstance(cfg, FalconH1ModelConfig)

    def mamba(m):
        if m.n_groups != 1:
            m = dataclasses.replace(
                m, n_groups=1, state_size=m.n_groups * m.state_size, norm_group_size=m.d_inner
            )
        return dataclasses.replace(m, is_norm_before_gate=True)

    cfg = map_layers(cfg, mamba2=mamba)
    return dataclasses.replace(
        cfg, embedding_multiplier=1.0, logits_scale=1.0, multipliers=FalconH1Multipliers()
    )


def test_without_config_json(pair, tmp_path):
    check_without_config_json(pair, tmp_path, _not_inferable)


def test_v4_rope_keys_and_model_type(pair, tmp_path):
    """v4-style `rope_theta` at the top level instead of `rope_parameters`; no `architectures`."""

    def edit(raw):
        raw["rope_theta"] = raw.pop("rope_parameters")["rope_theta"]
        del raw["architectures"]

    assert detect_with(pair.path, tmp_path, edit) == pair.llm.config
