"""Granite 3 dense, MoE and MoE-with-shared-MLP parity with transformers on tiny random checkpoints, every µP
scalar away from 1 (embedding, residual and attention multipliers, logits scaling)."""

from __future__ import annotations

import pytest

from blazr.config import AttentionConfig
from tests.hf_parity import ParityTests
from tests.ssm_fixtures import load_pair, single_thread

MUP = dict(embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.09, logits_scaling=2.5)
SIZES = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, **MUP)
EXPERTS = dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=48)
VARIANTS = {
    "granite": ("GraniteForCausalLM", dict(SIZES, tie_word_embeddings=True)),
    "granitemoe": ("GraniteMoeForCausalLM", dict(SIZES, **EXPERTS)),
    "granitemoeshared": ("GraniteMoeSharedForCausalLM", dict(SIZES, **EXPERTS, shared_intermediate_size=32)),
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory):
    arch, overrides = VARIANTS[request.param]
    return load_pair(tmp_path_factory.mktemp(request.param), request.param, arch, **overrides)


class TestParity(ParityTests):
    """Logits, greedy tokens, cache invariants and batched == alone against transformers."""


def test_detected_config(pair):
    cfg = pair.llm.config
    assert (cfg.embedding_multiplier, cfg.residual_multiplier, cfg.logits_scale) == (3.0, 0.5, 0.4)
    assert cfg.layers[0].mixer(AttentionConfig).softmax_scale == 0.09
    moe = cfg.layers[0].moe
    if pair.name == "granite":
        assert moe is None and cfg.layers[0].mlp.intermediate_size == 96
    else:
        assert (moe.num_experts, moe.top_k, moe.expert.intermediate_size) == (4, 2, 48)
        assert (moe.shared is not None) == (pair.name == "granitemoeshared")
