"""Mamba2ForCausalLM parity with transformers: pure Mamba2 stacks (16 heads × 16, state 16, chunk 8) with
n_groups 1, and with n_groups 2 plus in/out projection biases and tied embeddings; detection without
config.json (sizes from shapes) and from legacy config spellings."""

from __future__ import annotations

import math

import pytest

from blazr.config import Mamba2Config
from tests.hf_parity import check_batched_equals_alone, check_cache_invariants, check_greedy, check_logits
from tests.ssm_fixtures import (
    check_state_bytes,
    check_without_config_json,
    detect_with,
    layer_kinds,
    load_pair,
    single_thread,
)

ARCH = "Mamba2ForCausalLM"
MAMBA = dict(num_heads=16, head_dim=16, state_size=16, chunk_size=8, expand=2, num_hidden_layers=2)
VARIANTS = {
    "g1": dict(MAMBA, n_groups=1),
    "g2-bias-tied": dict(MAMBA, n_groups=2, use_bias=True, tie_word_embeddings=True),
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory):
    return load_pair(tmp_path_factory.mktemp(request.param), request.param, ARCH, **VARIANTS[request.param])


def test_detected_config(pair):
    cfg, c = pair.llm.config, pair.hf.config
    assert layer_kinds(cfg) == ["mamba2", "mamba2"]
    m = cfg.layers[0].mixer(Mamba2Config)
    assert (m.num_heads, m.head_dim, m.state_size, m.n_groups) == (16, 16, 16, c.n_groups)
    assert m.norm_group_size == m.d_inner // c.n_groups
    assert m.has_in_proj_bias == m.has_out_proj_bias == c.use_bias
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
    check_state_bytes(pair, c.num_heads, c.head_dim, c.state_size, c.n_groups, c.conv_kernel, 2)


def test_without_config_json(pair, tmp_path):
    """Every size comes from the shapes; n_groups (1 or 2, state 16) from the rule "the default 8, halved
    until the state size is a multiple of 16"."""
    check_without_config_json(pair, tmp_path)


def test_legacy_config_spellings(pair, tmp_path):
    """transformers v4 wrote the infinite dt limit as a bare `Infinity`; a config.json without
    `architectures` is recognised by model_type; a dt limit is read as given."""

    def edit(raw):
        raw["time_step_limit"] = [0.0, math.inf]  # json.dumps writes Infinity
        del raw["architectures"]

    assert detect_with(pair.path, tmp_path / "v4", edit) == pair.llm.config
    limited = detect_with(pair.path, tmp_path / "dt", lambda raw: raw.update(time_step_limit=[0.01, 0.5]))
    assert {(m.dt_min, m.dt_max) for layer in limited.layers for m in layer.mixers} == {(0.01, 0.5)}
