"""Gemma 2 parity with transformers on tiny random checkpoints: sandwich (1 + w) norms, sqrt(hidden)-scaled
embeddings, query_pre_attn_scalar, alternating sliding-window / full layers, attention scores soft-capped
(the torch attention path in prefill, the C decode attention in decode steps) and final logits soft-capped
(the softcap kernel) — caps small enough here that tanh bends the scores and logits; the decode step
recorded as one plan; detection without config.json."""

from __future__ import annotations

import pytest

from blazr.config import AttentionConfig
from tests.hf_parity import ParityTests, check_greedy
from tests.ssm_fixtures import detect_with, load_pair, single_thread

SIZES = dict(
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    query_pre_attn_scalar=24,
    num_hidden_layers=2,
    sliding_window=24,
    attn_logit_softcapping=2.0,
    final_logit_softcapping=3.0,
)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return load_pair(tmp_path_factory.mktemp("gemma2"), "gemma2", "Gemma2ForCausalLM", **SIZES)


class TestParity(ParityTests):
    """Logits, greedy tokens, cache invariants and batched == alone against transformers."""


def test_detected_config(pair):
    cfg = pair.llm.config
    attn = [layer.mixer(AttentionConfig) for layer in cfg.layers]
    assert [a.sliding_window for a in attn] == [24, None]
    assert all(a.qk_norm is None and a.logit_softcap == 2.0 and a.softmax_scale == 24**-0.5 for a in attn)
    assert cfg.final_logit_softcap == 3.0 and cfg.tie_word_embeddings


def test_decode_plan_records_the_soft_caps(pair):
    """The CPU decode step — scores soft-capped in the C decode attention, the final logits by the softcap
    kernel — is recorded as one plan (no eager fallback), and the tokens it gives are transformers'."""
    plan = pair.llm.runner.decode_plan
    assert plan is not None
    before = plan.num_runs
    check_greedy(pair.hf, pair.llm, n=8)
    assert plan.num_runs >= before + 7  # every decode step after the prefill's token


def test_without_config_json(tmp_path):
    """The names say Gemma 2 (no q_norm); shapes and transformers' defaults (caps 50 / 30, window 4096,
    every other layer sliding, θ 10000) give the same model; the head size 16 is not one the shapes can
    tell (64 is assumed), so the fixture's heads are 64 wide here."""
    pair = load_pair(
        tmp_path / "with", "defaults", "Gemma2ForCausalLM",
        **dict(SIZES, hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
               query_pre_attn_scalar=64, sliding_window=4096, attn_logit_softcapping=50.0,
               final_logit_softcapping=30.0, max_position_embeddings=8192),
    )  # fmt: skip
    assert detect_with(pair.path, tmp_path / "without", None) == pair.llm.config
