"""MambaForCausalLM and FalconMambaForCausalLM parity with transformers: Mamba1 stacks (inner 256, state 16,
dt rank 8, kernel 4), one with projection biases, no conv bias, state 20 and untied embeddings, and
Falcon-Mamba with its weightless dt / B / C norms; the state bytes per sequence; detection without
config.json (every size from the shapes)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from blazr.config import Mamba1Config
from tests.hf_parity import check_batched_equals_alone, check_cache_invariants, check_greedy, check_logits
from tests.ssm_fixtures import check_without_config_json, layer_kinds, load_pair, map_layers, single_thread

MAMBA = dict(num_hidden_layers=2, state_size=16, time_step_rank=8, conv_kernel=4, expand=2)
VARIANTS = {
    "mamba": ("MambaForCausalLM", MAMBA),
    "mamba-bias-untied": (
        "MambaForCausalLM",
        dict(
            MAMBA, use_bias=True, use_conv_bias=False, state_size=20, conv_kernel=3, tie_word_embeddings=False
        ),
    ),
    "falcon-mamba": ("FalconMambaForCausalLM", dict(MAMBA, mixer_rms_eps=1e-5)),
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory):
    arch, overrides = VARIANTS[request.param]
    return load_pair(tmp_path_factory.mktemp(request.param), request.param, arch, **overrides)


def test_detected_config(pair):
    cfg, c = pair.llm.config, pair.hf.config
    assert layer_kinds(cfg) == ["mamba1", "mamba1"]
    m = cfg.layers[0].mixer(Mamba1Config)
    assert (m.d_inner, m.state_size, m.dt_rank, m.conv_kernel) == (
        c.intermediate_size, c.state_size, c.time_step_rank, c.conv_kernel,
    )  # fmt: skip
    assert (m.has_proj_bias, m.has_conv_bias) == (c.use_bias, c.use_conv_bias)
    assert m.has_dt_bc_norm == (pair.name == "falcon-mamba") and not m.has_norm_weights
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
    """Per sequence and layer: the conv's last K − 1 inputs (Di channels, the model dtype) and the SSM state
    [Di, N] in float32 — what `blazr info` reports and what the engine allocated per state slot."""
    from blazr.info import describe

    c = pair.hf.config
    for dtype, size in ((torch.float32, 4), (torch.bfloat16, 2)):
        info = describe(pair.llm.checkpoint, dtype)
        per_layer = (c.conv_kernel - 1) * c.intermediate_size * size + c.intermediate_size * c.state_size * 4
        assert info["cache"]["state_bytes_per_sequence"] == 2 * per_layer
    per_slot = sum(t[0].numel() * t.element_size() for t in pair.llm.runner.cache.state)
    assert per_slot == 2 * ((c.conv_kernel - 1) + c.state_size) * c.intermediate_size * 4


def test_without_config_json(pair, tmp_path):
    """Every size from the shapes; Falcon-Mamba's weightless norms show in none, so without config.json it
    is detected as plain Mamba."""

    def expected(cfg):
        if pair.name != "falcon-mamba":
            return cfg
        plain = map_layers(cfg, mamba1=lambda m: dataclasses.replace(m, has_dt_bc_norm=False, norm_eps=1e-6))
        return plain.with_(architecture="MambaForCausalLM")

    check_without_config_json(pair, tmp_path, expected)
